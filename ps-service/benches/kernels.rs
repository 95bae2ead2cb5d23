//! Update-kernel throughput against the memory-streaming limit measured in the same run.
//!
//! `cargo bench -p foresight-ps --bench kernels`
//!
//! For 64Ki (one store shard, in L2), 1M and 25M f32 parameters this measures, through the
//! public `foresight_ps::optimizer::apply`, one update pass of each rule (`asgd`, `dc-asgd-c`,
//! `dc-asgd-a`; `sync` applies its combined gradient with the same SGD pass as `asgd`), and a
//! plain streaming pass over exactly the arrays each rule reads and writes (trivial arithmetic,
//! same build flags: AVX2 when the CPU has it, like the kernels). Criterion reports throughput
//! in elements/s. A second, interleaved pass then times every variant round-robin and prints
//! the medians of the per-round ratios, so the ratios are immune to the machine's drift:
//!
//! - `dc-asgd-a / streaming limit` (target ≥ 0.7)
//! - `dc-asgd-{c,a} time / asgd time` (target ≤ 1.5)
//!
//! Without `--bench` (e.g. `cargo test --benches`) every benchmark runs once and the ratio pass
//! is skipped.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput};
use foresight_ps::optimizer::{Algorithm, Hyper, OptimizerState, Step, apply};

const RULES: [Algorithm; 3] = [Algorithm::Asgd, Algorithm::DcAsgdC, Algorithm::DcAsgdA];
const LR: f32 = 1e-4;

/// The arrays one pass touches, filled with well-scaled values (no denormals, no overflow over
/// thousands of passes).
struct Arrays {
    w: Vec<f32>,
    g: Vec<f32>,
    bak: Vec<f32>,
    state: OptimizerState,
}

impl Arrays {
    fn new(hyper: &Hyper, n: usize) -> Self {
        let w: Vec<f32> = (0..n).map(|i| ((i % 4096) as f32 * 0.01).sin()).collect();
        let g = (0..n).map(|i| 0.1 + ((i * 7919) % 1000) as f32 / 1111.0).collect();
        let bak = w.iter().enumerate().map(|(i, x)| x - 0.01 * ((i % 7) as f32 - 3.0)).collect();
        let mut state = OptimizerState::new(hyper, n);
        state.mean_square.iter_mut().for_each(|m| *m = 0.25);
        Self { w, g, bak, state }
    }
}

/// One variant under test: a rule's update pass, or the streaming pass over the same arrays.
#[derive(Clone, Copy, PartialEq)]
enum Variant {
    Rule(Algorithm),
    Stream(Algorithm),
}

impl Variant {
    const ALL: [Variant; 6] = [
        Variant::Rule(Algorithm::Asgd),
        Variant::Rule(Algorithm::DcAsgdC),
        Variant::Rule(Algorithm::DcAsgdA),
        Variant::Stream(Algorithm::Asgd),
        Variant::Stream(Algorithm::DcAsgdC),
        Variant::Stream(Algorithm::DcAsgdA),
    ];

    fn name(self) -> String {
        match self {
            Variant::Rule(a) => a.as_str().to_string(),
            Variant::Stream(a) => format!("stream[{}]", pattern(a)),
        }
    }
}

/// The memory pattern of a rule: arrays read (r) and written (w) per element.
fn pattern(a: Algorithm) -> &'static str {
    match a {
        Algorithm::Sync | Algorithm::Asgd => "w,g -> w",
        Algorithm::DcAsgdC => "w,g,bak -> w",
        Algorithm::DcAsgdA => "w,g,bak,ms -> w,ms",
    }
}

/// Bytes a pass moves per element (reads + writes, f32), for a GB/s figure.
fn bytes_per_elem(a: Algorithm) -> usize {
    match a {
        Algorithm::Sync | Algorithm::Asgd => 12,
        Algorithm::DcAsgdC => 16,
        Algorithm::DcAsgdA => 24,
    }
}

/// Everything one size needs: a hyper and arrays per rule.
struct Workload {
    n: usize,
    sets: Vec<(Hyper, Arrays)>,
}

impl Workload {
    fn new(n: usize) -> Self {
        let sets = RULES
            .iter()
            .map(|&a| {
                let h = Hyper::new(a, LR);
                let arrays = Arrays::new(&h, n);
                (h, arrays)
            })
            .collect();
        Self { n, sets }
    }

    fn set(&mut self, a: Algorithm) -> &mut (Hyper, Arrays) {
        let i = RULES.iter().position(|&r| r == a).expect("benchmarked rule");
        &mut self.sets[i]
    }

    /// Runs one pass of `v`.
    fn run(&mut self, v: Variant) {
        match v {
            Variant::Rule(a) => {
                let (h, x) = self.set(a);
                let bak = if a.is_delay_compensated() { Some(x.bak.as_slice()) } else { None };
                let stats = apply(
                    h,
                    black_box(Step::at(LR, 1000)),
                    black_box(&mut x.w),
                    black_box(&x.g),
                    bak,
                    &mut x.state.mean_square,
                    &mut x.state.momentum,
                );
                black_box(stats);
            }
            Variant::Stream(a) => {
                let (_, x) = self.set(a);
                let ms = &mut x.state.mean_square;
                stream(a, black_box(&mut x.w), black_box(&x.g), black_box(&x.bak), black_box(ms));
                black_box(&mut x.w);
            }
        }
    }
}

/// The streaming limit: the same arrays read and written as rule `a`, trivial arithmetic.
fn stream(a: Algorithm, w: &mut [f32], g: &[f32], bak: &[f32], ms: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked just above.
        return unsafe { stream_avx2(a, w, g, bak, ms) };
    }
    stream_body(a, w, g, bak, ms)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn stream_avx2(a: Algorithm, w: &mut [f32], g: &[f32], bak: &[f32], ms: &mut [f32]) {
    stream_body(a, w, g, bak, ms)
}

#[inline(always)]
fn stream_body(a: Algorithm, w: &mut [f32], g: &[f32], bak: &[f32], ms: &mut [f32]) {
    let s = black_box(LR);
    match a {
        Algorithm::Sync | Algorithm::Asgd => {
            for (w, g) in w.iter_mut().zip(g) {
                *w -= s * g;
            }
        }
        Algorithm::DcAsgdC => {
            for ((w, g), b) in w.iter_mut().zip(g).zip(bak) {
                *w -= s * (g + b);
            }
        }
        Algorithm::DcAsgdA => {
            for (((w, g), b), m) in w.iter_mut().zip(g).zip(bak).zip(ms.iter_mut()) {
                *m = 0.5 * *m + g;
                *w -= s * (g + b);
            }
        }
    }
}

/// λ = λ0/√(ms+ε) alone over an in-L1 array: the sqrt + division throughput of this core.
fn sqrt_div(ms: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked just above.
        return unsafe { sqrt_div_avx2(ms, out) };
    }
    sqrt_div_body(ms, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn sqrt_div_avx2(ms: &[f32], out: &mut [f32]) {
    sqrt_div_body(ms, out)
}

#[inline(always)]
fn sqrt_div_body(ms: &[f32], out: &mut [f32]) {
    let (l0, eps) = (black_box(2.0f32), black_box(1e-7f32));
    for (o, m) in out.iter_mut().zip(ms) {
        *o = l0 / (m + eps).sqrt();
    }
}

fn label(n: usize) -> String {
    match n {
        n if n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n % 1024 == 0 => format!("{}Ki", n / 1024),
        n => n.to_string(),
    }
}

const SIZES: [usize; 3] = [1 << 16, 1_000_000, 25_000_000];

fn criterion_benches(c: &mut Criterion) {
    for n in SIZES {
        let mut wl = Workload::new(n);
        let mut group = c.benchmark_group(format!("update/{}", label(n)));
        group.throughput(Throughput::Elements(n as u64)).sample_size(10);
        if n >= 10_000_000 {
            // ~50-100 ms a pass: equal-length samples instead of criterion's linear ramp.
            group
                .sampling_mode(SamplingMode::Flat)
                .warm_up_time(Duration::from_millis(500))
                .measurement_time(Duration::from_secs(3));
        } else {
            group.warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_millis(1500));
        }
        for v in Variant::ALL {
            group.bench_function(BenchmarkId::from_parameter(v.name()), |b| b.iter(|| wl.run(v)));
        }
        group.finish();
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// Times every variant round-robin (rotating the order each round) and prints throughputs and
/// the medians of the per-round ratios.
fn ratios() {
    println!();
    println!("== interleaved ratios (median over rounds; [p25, p75]) ==");
    let mut ms = vec![0.25f32; 4096];
    ms.iter_mut().enumerate().for_each(|(i, m)| *m += i as f32 * 1e-4);
    let mut out = vec![0f32; 4096];
    let mut sd = Vec::new();
    for _ in 0..2000 {
        let t = Instant::now();
        sqrt_div(black_box(&ms), black_box(&mut out));
        sd.push(t.elapsed().as_secs_f64());
    }
    let sd = ms.len() as f64 / median(&mut sd) / 1e6;
    println!("sqrt+div alone (λ0/√(ms+ε), 4Ki in L1): {sd:.0} M elem/s");
    for n in SIZES {
        let mut wl = Workload::new(n);
        // Enough timed work per size for ~3-6 s of rounds; small sizes repeat the pass per sample.
        let (rounds, reps) = match n {
            n if n <= 1 << 16 => (300, 50),
            n if n <= 1_000_000 => (150, 4),
            _ => (16, 1),
        };
        let mut times = vec![Vec::with_capacity(rounds); Variant::ALL.len()];
        for v in Variant::ALL {
            wl.run(v); // warm: page in, caches
        }
        for r in 0..rounds {
            for k in 0..Variant::ALL.len() {
                let i = (k + r) % Variant::ALL.len();
                let t = Instant::now();
                for _ in 0..reps {
                    wl.run(Variant::ALL[i]);
                }
                times[i].push(t.elapsed().as_secs_f64() / reps as f64);
            }
        }
        let idx = |v: Variant| Variant::ALL.iter().position(|&x| x == v).unwrap();
        println!("-- {} parameters ({} rounds x {} passes) --", label(n), rounds, reps);
        for v in Variant::ALL {
            let a = match v {
                Variant::Rule(a) | Variant::Stream(a) => a,
            };
            let t = median(&mut times[idx(v)].clone());
            println!(
                "  {:<28} {:>8.3} ms  {:>7.0} M elem/s  {:>6.2} GB/s",
                v.name(),
                t * 1e3,
                wl.n as f64 / t / 1e6,
                (wl.n * bytes_per_elem(a)) as f64 / t / 1e9
            );
        }
        let ratio = |num: Variant, den: Variant| {
            let mut r: Vec<f64> = times[idx(num)].iter().zip(&times[idx(den)]).map(|(a, b)| a / b).collect();
            (median(&mut r), quantile(&mut r, 0.25), quantile(&mut r, 0.75))
        };
        // Throughput ratio = limit time / kernel time.
        for a in RULES {
            let (m, lo, hi) = ratio(Variant::Stream(a), Variant::Rule(a));
            let target = if a == Algorithm::DcAsgdA { "   (target >= 0.7)" } else { "" };
            println!(
                "  {:<10} / streaming limit [{}]: {m:.3} [{lo:.3}, {hi:.3}]{target}",
                a.as_str(),
                pattern(a)
            );
        }
        for a in [Algorithm::DcAsgdC, Algorithm::DcAsgdA] {
            let (m, lo, hi) = ratio(Variant::Rule(a), Variant::Rule(Algorithm::Asgd));
            println!("  {:<10} time / asgd time: {m:.3} [{lo:.3}, {hi:.3}]   (target <= 1.5)", a.as_str());
        }
        let (m, lo, hi) = ratio(Variant::Stream(Algorithm::DcAsgdA), Variant::Stream(Algorithm::Asgd));
        println!("  (for scale) stream[dc-asgd-a] time / stream[asgd] time: {m:.3} [{lo:.3}, {hi:.3}]");
    }
}

fn main() {
    let bench_mode = std::env::args().any(|a| a == "--bench");
    let mut c = Criterion::default().configure_from_args();
    criterion_benches(&mut c);
    c.final_summary();
    if bench_mode {
        ratios();
    }
}
