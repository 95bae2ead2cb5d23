//! What subnormal numbers cost dc-asgd-a: parameters whose gradient is exactly 0 decay their
//! MeanSquare by μ every update, into the subnormal range, where x86 arithmetic takes microcode
//! assists. The kernel flushes a MeanSquare below 1e-30 to 0 (far below ε, so λ does not change);
//! this measures a pass over such parameters against a pass over ordinary ones, interleaved in
//! the same run, and prints the median ratio (target ≤ 1.5; about 1 when the flush works).
//!
//! `cargo bench -p foresight-ps --bench numerics` (without `--bench`, one round as a smoke test).

use std::hint::black_box;
use std::time::Instant;

use foresight_ps::optimizer::{Algorithm, Hyper, OptimizerState, Step, apply};

const N: usize = 1 << 16;
const LR: f32 = 1e-3;

/// Times `PASSES` dc-asgd-a passes in a row over parameters with gradient `g`, MeanSquare
/// starting at 1e-6: with g = 0 it decays by μ = 0.95 a pass and, unflushed, is subnormal from
/// pass ~1350 to ~1660 (then it underflows to 0).
fn passes(h: &Hyper, g: f32) -> f64 {
    const PASSES: usize = 2000;
    let mut w: Vec<f32> = (0..N).map(|i| (i as f32 * 0.01).sin()).collect();
    let bak = w.clone();
    let grad = vec![g; N];
    let mut st = OptimizerState::new(h, N);
    st.mean_square.fill(1e-6);
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

fn main() {
    let benching = std::env::args().any(|a| a == "--bench");
    let h = Hyper::new(Algorithm::DcAsgdA, 1e-3);
    let rounds = if benching { 11 } else { 1 };
    let mut ratios: Vec<f64> = (0..rounds)
        .map(|_| {
            let idle = passes(&h, black_box(0.0));
            // A gradient of 1e-3 keeps MeanSquare near 1e-6, far from the subnormals.
            let busy = passes(&h, black_box(1e-3));
            idle / busy
        })
        .collect();
    ratios.sort_by(f64::total_cmp);
    println!(
        "dc-asgd-a pass, idle parameters (g = 0, MeanSquare subnormal) / ordinary ones: median {:.2} (target ≤ 1.5; {rounds} rounds of 2000 passes over {N} elements)",
        ratios[ratios.len() / 2]
    );
}
