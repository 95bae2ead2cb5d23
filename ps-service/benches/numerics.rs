//! What subnormal numbers cost the update kernels. State that a parameter with gradient 0 keeps
//! decays geometrically, into the subnormal range, where x86 arithmetic takes microcode assists:
//! dc-asgd-a's MeanSquare (by μ every update) and the momentum buffer (by the momentum). The
//! kernels flush both to 0 below 1e-30 (far below ε and any step that moves an f32 weight); this
//! measures passes over such parameters against passes over ordinary ones, interleaved in the
//! same run, and prints the median ratio of each (target ≤ 1.5; about 1 when the flush works).
//!
//! `cargo bench -p foresight-ps --bench numerics` (without `--bench`, one round as a smoke test).

use std::hint::black_box;
use std::time::Instant;

use foresight_ps::optimizer::{Algorithm, Hyper, OptimizerState, Step, apply};

const N: usize = 1 << 16;
const LR: f32 = 1e-3;
const PASSES: usize = 2000;

/// Times `PASSES` passes in a row over parameters with gradient `g`, the state set by `init`.
fn passes(h: &Hyper, g: f32, init: fn(&mut OptimizerState)) -> f64 {
    let mut w: Vec<f32> = (0..N).map(|i| (i as f32 * 0.01).sin()).collect();
    let bak = w.clone();
    let grad = vec![g; N];
    let mut st = OptimizerState::new(h, N);
    init(&mut st);
    let t = Instant::now();
    for _ in 0..PASSES {
        black_box(apply(
            h,
            Step::at(LR, 1000),
            &mut w,
            black_box(&grad),
            Some(&bak),
            &mut st.mean_square,
            &mut st.momentum,
        ));
    }
    t.elapsed().as_secs_f64()
}

/// Median over `rounds` of (idle passes / busy passes).
fn median_ratio(rounds: usize, h: &Hyper, init: fn(&mut OptimizerState)) -> f64 {
    let mut ratios: Vec<f64> = (0..rounds)
        .map(|_| {
            let idle = passes(h, black_box(0.0), init);
            // A gradient of 1e-3 keeps the state near 1e-6 (MeanSquare) or 1e-3 (momentum).
            let busy = passes(h, black_box(1e-3), init);
            idle / busy
        })
        .collect();
    ratios.sort_by(f64::total_cmp);
    ratios[ratios.len() / 2]
}

fn main() {
    let benching = std::env::args().any(|a| a == "--bench");
    let rounds = if benching { 11 } else { 1 };
    // MeanSquare from 1e-6, decaying by μ = 0.95: unflushed, subnormal from pass ~1350 to ~1660.
    let dc = Hyper::new(Algorithm::DcAsgdA, LR);
    let ms = median_ratio(rounds, &dc, |st| st.mean_square.fill(1e-6));
    println!(
        "dc-asgd-a pass, idle parameters (g = 0, MeanSquare decaying) / ordinary ones: median {ms:.2} (target ≤ 1.5; {rounds} rounds of {PASSES} passes over {N} elements)"
    );
    // Momentum 0.99 from 1e-35: unflushed, subnormal from pass ~700 to past the last one.
    let mut mom = Hyper::new(Algorithm::Asgd, LR);
    mom.momentum = 0.99;
    let m = median_ratio(rounds, &mom, |st| st.momentum.fill(1e-35));
    println!(
        "asgd pass with momentum 0.99, idle parameters (g = 0, buffer decaying) / ordinary ones: median {m:.2} (target ≤ 1.5; {rounds} rounds of {PASSES} passes over {N} elements)"
    );
}
