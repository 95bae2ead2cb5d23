//! `foresight-loadgen`: M simulated workers training a synthetic model against a running PS.
//!
//! The objective is a noisy quadratic f(w) = ½·Σ h_i (w_i − w*_i)², with curvatures h_i in
//! [0.5, 2]: cheap enough to run thousands of steps per second on any size of model, with a
//! loss that shows whether staleness and delay compensation help or hurt. Each worker pulls,
//! computes a gradient at the model it pulled, and pushes it, as a real worker would.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, ValueEnum};
use foresight_ps::client::{GradDtype, PsClient, PushId};
use foresight_ps::server::Report;
use foresight_ps::wire::{Layout, TensorSpec};
use rand::{Rng, SeedableRng};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Drive a Foresight parameter server with simulated workers on a synthetic quadratic model.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// PS base URL (h2c).
    #[arg(long, env = "FORESIGHT_PS_URL", default_value = "http://127.0.0.1:8080")]
    ps: String,
    /// Bearer token.
    #[arg(long, env = "FORESIGHT_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Simulated workers (ids 0..workers), each a concurrent task.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Model size in f32 parameters.
    #[arg(long, default_value_t = 1_000_000)]
    params: usize,
    /// Pushes per worker.
    #[arg(long, default_value_t = 200)]
    steps: u64,
    /// Standard deviation of the gradient noise.
    #[arg(long, default_value_t = 0.1)]
    noise: f32,
    /// Gradient wire type.
    #[arg(long, value_enum, default_value_t = Dtype::F32)]
    dtype: Dtype,
    /// Call /v1/finalize at the end.
    #[arg(long)]
    finalize: bool,
    /// Long-poll wait for `sync` rounds, in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    wait_ms: u64,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Dtype {
    F32,
    Bf16,
}

struct Problem {
    curvature: Vec<f32>,
    optimum: Vec<f32>,
}

impl Problem {
    fn new(n: usize) -> Self {
        Self {
            curvature: (0..n).map(|i| 0.5 + 1.5 * ((i * 7919) % 1000) as f32 / 1000.0).collect(),
            optimum: (0..n).map(|i| (i as f32 * 0.001).sin()).collect(),
        }
    }

    fn loss(&self, w: &[f32]) -> f64 {
        let s: f64 = w
            .iter()
            .zip(&self.optimum)
            .zip(&self.curvature)
            .map(|((w, o), h)| f64::from(h * (w - o) * (w - o)))
            .sum();
        0.5 * s / w.len() as f64
    }

    fn gradient(&self, w: &[f32], noise: f32, rng: &mut impl Rng, out: &mut [f32]) {
        for i in 0..w.len() {
            let n: f32 = if noise > 0.0 { rng.random_range(-noise..noise) } else { 0.0 };
            out[i] = self.curvature[i] * (w[i] - self.optimum[i]) + n;
        }
    }
}

#[derive(Default)]
struct WorkerStats {
    /// Pushes answered `503 busy` (and retried).
    busy: u64,
    latencies: Vec<Duration>,
    pulls: Vec<Duration>,
    staleness: Vec<u64>,
    last_loss: f64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.workers > 0 && args.params > 0 && args.steps > 0,
        "workers, params and steps must be > 0"
    );
    let client = PsClient::new(&args.ps, args.token.clone())?;
    let layout = Layout::new(vec![TensorSpec { name: "quadratic.weight".into(), shape: vec![args.params] }])?;
    let registering = Instant::now();
    let registered =
        client.register(&layout, &vec![0.0; args.params]).await.context("registering the model")?;
    println!(
        "model {} ({} parameters) in {:.3}s",
        if registered { "registered" } else { "already registered" },
        args.params,
        registering.elapsed().as_secs_f64()
    );
    let problem = Arc::new(Problem::new(args.params));
    let dtype = match args.dtype {
        Dtype::F32 => GradDtype::F32,
        Dtype::Bf16 => GradDtype::Bf16,
    };
    let started = Instant::now();
    let tasks: Vec<_> = (0..args.workers)
        .map(|m| {
            let (client, problem, layout) = (client.clone(), problem.clone(), layout.clone());
            let (steps, noise, wait) = (args.steps, args.noise, Duration::from_millis(args.wait_ms));
            tokio::spawn(
                async move { run_worker(m, client, problem, layout, steps, noise, dtype, wait).await },
            )
        })
        .collect();
    let mut all = WorkerStats::default();
    for t in tasks {
        let s = t.await??;
        all.busy += s.busy;
        all.latencies.extend(s.latencies);
        all.pulls.extend(s.pulls);
        all.staleness.extend(s.staleness);
        all.last_loss = all.last_loss.max(s.last_loss);
    }
    let elapsed = started.elapsed();
    all.latencies.sort();
    all.pulls.sort();
    all.staleness.sort();
    let pct = |v: &[Duration], q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    let n = all.latencies.len();
    println!(
        "pushes {n} in {:.2}s: {:.1} pushes/s, push latency p50 {:.2} ms p99 {:.2} ms",
        elapsed.as_secs_f64(),
        n as f64 / elapsed.as_secs_f64(),
        pct(&all.latencies, 0.5).as_secs_f64() * 1e3,
        pct(&all.latencies, 0.99).as_secs_f64() * 1e3
    );
    println!("pushes refused busy and retried: {}", all.busy);
    println!(
        "pull latency p50 {:.2} ms p99 {:.2} ms",
        pct(&all.pulls, 0.5).as_secs_f64() * 1e3,
        pct(&all.pulls, 0.99).as_secs_f64() * 1e3
    );
    println!(
        "staleness p50 {} p99 {} max {}",
        all.staleness[(n - 1) / 2],
        all.staleness[((n - 1) as f64 * 0.99) as usize],
        all.staleness[n - 1]
    );
    let status = client.status().await?;
    println!("ps status: version {} staleness {}", status["version"], status["staleness"]);
    let model = client.pull(0, None, Duration::ZERO).await?.context("pull returned nothing")?;
    println!(
        "final loss {:.6} (initial {:.6})",
        problem.loss(&model.values),
        problem.loss(&vec![0.0; args.params])
    );
    if args.finalize {
        println!("finalized: {}", client.finalize().await?);
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn run_worker(
    m: usize,
    client: PsClient,
    problem: Arc<Problem>,
    layout: Layout,
    steps: u64,
    noise: f32,
    dtype: GradDtype,
    wait: Duration,
) -> anyhow::Result<WorkerStats> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(m as u64);
    let mut grad = vec![0.0; layout.len()];
    let mut stats = WorkerStats::default();
    let mut min_version = None;
    for seq in 1..=steps {
        let pulling = Instant::now();
        let model = loop {
            // Under `sync` the next version exists only once every worker has pushed: long-poll.
            if let Some(model) = client.pull(m, min_version, wait).await? {
                break model;
            }
        };
        stats.pulls.push(pulling.elapsed());
        let w = model.values;
        problem.gradient(&w, noise, &mut rng, &mut grad);
        let t = Instant::now();
        let id = PushId::unjoined(m, model.version, seq);
        let reply = loop {
            match client.push(id, None, &layout, &grad, dtype).await {
                // A PS at its push slots (its memory limit) says when to come back.
                Err(e) if e.reason() == Some("busy") => {
                    stats.busy += 1;
                    tokio::time::sleep(e.retry_after().unwrap_or(Duration::from_secs(1))).await;
                }
                other => break other?,
            }
        };
        stats.latencies.push(t.elapsed());
        stats.staleness.push(reply.staleness);
        min_version = Some(if reply.applied { reply.version } else { reply.version + 1 });
        if seq % 20 == 0 || seq == steps {
            stats.last_loss = problem.loss(&w);
            let report = Report {
                worker: m,
                step: seq,
                epoch: seq as f64 / steps as f64,
                loss: stats.last_loss,
                accuracy: None,
                samples_per_second: None,
            };
            client.report(&report).await?;
        }
    }
    Ok(stats)
}
