//! The update rules against hand-computed vectors, and their algebraic properties.

use proptest::prelude::*;

use super::*;

fn hyper(algorithm: Algorithm, lr: f32) -> Hyper {
    Hyper::new(algorithm, lr)
}

fn close(a: &[f32], b: &[f32], tol: f32) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol * (1.0 + y.abs()))
}

/// Runs one rule on fresh state and returns the new weights and stats.
fn step(
    h: &Hyper,
    w: &[f32],
    g: &[f32],
    bak: Option<&[f32]>,
    st: &mut OptimizerState,
) -> (Vec<f32>, UpdateStats) {
    let mut w = w.to_vec();
    // Many updates in: MeanSquare's bias correction is 1 to f32 precision.
    let stats = apply(h, Step::at(h.lr.base, 1000), &mut w, g, bak, &mut st.mean_square, &mut st.momentum);
    (w, stats)
}

#[test]
fn asgd_hand_computed() {
    let h = hyper(Algorithm::Asgd, 0.1);
    let mut st = OptimizerState::new(&h, 2);
    let (w, stats) = step(&h, &[1.0, 2.0], &[0.5, -1.0], None, &mut st);
    assert!(close(&w, &[0.95, 2.1], 1e-7), "{w:?}");
    assert_eq!(stats.compensation_ratio(), 0.0);
    assert!((stats.grad_sq - 1.25).abs() < 1e-9);
}

#[test]
fn dc_asgd_c_hand_computed() {
    let mut h = hyper(Algorithm::DcAsgdC, 0.1);
    h.lambda0 = 0.5;
    let mut st = OptimizerState::new(&h, 2);
    // comp = λ·g²·(w − bak) = 0.5·4·0.5 = 1 and 0.5·1·(−1) = −0.5
    let (w, stats) = step(&h, &[1.0, 2.0], &[2.0, -1.0], Some(&[0.5, 3.0]), &mut st);
    assert!(close(&w, &[0.7, 2.15], 1e-7), "{w:?}");
    assert!((stats.mean_lambda() - 0.5).abs() < 1e-9);
    // |comp| / |g| = √(1 + 0.25) / √5 = 0.5
    assert!((stats.compensation_ratio() - 0.5).abs() < 1e-7);
}

#[test]
fn dc_asgd_a_hand_computed_with_lambda_t() {
    let mut h = hyper(Algorithm::DcAsgdA, 0.1);
    h.mean_square_decay = 0.5;
    let mut st = OptimizerState::new(&h, 2);
    // MeanSquare = 0.5·g² = [2, 0.5]; λ_t = 2/√MS = [√2, 2√2]
    let (w, stats) = step(&h, &[1.0, 2.0], &[2.0, -1.0], Some(&[0.5, 3.0]), &mut st);
    let (l1, l2) = (2f32.sqrt(), 2.0 * 2f32.sqrt());
    assert!(close(&st.mean_square, &[2.0, 0.5], 1e-7));
    let expect = [1.0 - 0.1 * (2.0 + l1 * 4.0 * 0.5), 2.0 - 0.1 * (-1.0 - l2)];
    assert!(close(&w, &expect, 1e-6), "{w:?} vs {expect:?}");
    assert!((stats.mean_lambda() - f64::from(l1 + l2) / 2.0).abs() < 1e-5);
    // A second push decays MeanSquare: 0.5·2 + 0.5·0 = 1 for a zero gradient.
    let (_, _) = step(&h, &w, &[0.0, 0.0], Some(&w), &mut st);
    assert!(close(&st.mean_square, &[1.0, 0.25], 1e-7));
}

#[test]
fn weight_decay_and_momentum() {
    let mut h = hyper(Algorithm::Asgd, 0.5);
    h.weight_decay = 0.1;
    let mut st = OptimizerState::new(&h, 1);
    assert!(st.momentum.is_empty());
    let (w, _) = step(&h, &[1.0], &[0.0], None, &mut st);
    assert!(close(&w, &[0.95], 1e-7));

    let mut h = hyper(Algorithm::Asgd, 0.1);
    h.momentum = 0.9;
    let mut st = OptimizerState::new(&h, 1);
    let (w, _) = step(&h, &[0.0], &[1.0], None, &mut st);
    assert!(close(&w, &[-0.1], 1e-7));
    let (w, _) = step(&h, &w, &[1.0], None, &mut st);
    assert!(close(&w, &[-0.29], 1e-6), "{w:?}");
    assert!(close(&st.momentum, &[1.9], 1e-7));
}

/// The paper's synchronous fix on two workers: round 1 applies g1 and h1 combined, round 2
/// g2 and h2 — the mean by default, or the sum.
#[test]
fn two_worker_sync_example() {
    let (g1, h1, g2, h2) = ([1.0, 2.0], [3.0, -2.0], [0.0, 1.0], [2.0, 1.0]);
    for (combine, expect) in [(Combine::Mean, [-1.5, -0.5]), (Combine::Sum, [-3.0, -1.0])] {
        let mut h = hyper(Algorithm::Sync, 0.5);
        h.combine = combine;
        let mut st = OptimizerState::new(&h, 2);
        let mut w = vec![0.0, 0.0];
        for (a, b) in [(g1, h1), (g2, h2)] {
            let mut sum = vec![0.0; 2];
            accumulate(&mut sum, &a);
            accumulate(&mut sum, &b);
            finish_combined(&h, &mut sum, 2);
            apply(&h, Step::at(0.5, 0), &mut w, &sum, None, &mut st.mean_square, &mut st.momentum);
        }
        assert_eq!(w, expect, "{combine:?}");
    }
}

/// A straightforward per-element implementation of every rule, to check the vectorised kernels
/// on lengths that are not a multiple of the lane count.
fn reference(h: &Hyper, w: &mut [f32], g: &[f32], bak: &[f32], st: &mut OptimizerState) {
    for i in 0..w.len() {
        let mut d = g[i] + h.weight_decay * w[i];
        if h.algorithm.is_delay_compensated() {
            let lambda = if h.algorithm == Algorithm::DcAsgdA {
                let ms = &mut st.mean_square[i];
                *ms = h.mean_square_decay * *ms + (1.0 - h.mean_square_decay) * g[i] * g[i];
                if *ms < 1e-30 {
                    *ms = 0.0;
                }
                h.lambda0 / (*ms + h.epsilon).sqrt()
            } else {
                h.lambda0
            };
            let gain = (lambda * g[i] * g[i]).min((1.0 - h.momentum) / h.lr.base);
            d += gain * (w[i] - bak[i]);
        }
        if h.momentum > 0.0 {
            st.momentum[i] = h.momentum * st.momentum[i] + d;
            d = st.momentum[i];
        }
        w[i] -= h.lr.base * d;
    }
}

fn vec_of(len: usize) -> impl Strategy<Value = Vec<f32>> {
    proptest::collection::vec(-4.0f32..4.0, len)
}

proptest! {
    #[test]
    fn kernels_match_the_reference(
        (w, g, bak) in (1usize..40).prop_flat_map(|n| (vec_of(n), vec_of(n), vec_of(n))),
        algo in prop::sample::select(Algorithm::ALL.to_vec()),
        momentum in prop::sample::select(vec![0.0f32, 0.9]),
        wd in prop::sample::select(vec![0.0f32, 1e-3]),
    ) {
        let mut h = hyper(algo, 0.05);
        h.momentum = momentum;
        h.weight_decay = wd;
        let mut st = OptimizerState::new(&h, w.len());
        let mut st_ref = st.clone();
        let mut w_ref = w.clone();
        for _ in 0..3 {
            let (w2, _) = step(&h, &w_ref, &g, Some(&bak), &mut st);
            reference(&h, &mut w_ref, &g, &bak, &mut st_ref);
            prop_assert!(close(&w2, &w_ref, 1e-5), "{:?} vs {:?}", w2, w_ref);
        }
    }

    /// DC-ASGD with λ = 0 is ASGD, bit for bit.
    #[test]
    fn dc_asgd_with_zero_lambda_is_asgd(
        (w, g, bak) in (1usize..40).prop_flat_map(|n| (vec_of(n), vec_of(n), vec_of(n))),
        adaptive in any::<bool>(),
    ) {
        let mut dc = hyper(if adaptive { Algorithm::DcAsgdA } else { Algorithm::DcAsgdC }, 0.1);
        dc.lambda0 = 0.0;
        let asgd = hyper(Algorithm::Asgd, 0.1);
        let (a, _) = step(&dc, &w, &g, Some(&bak), &mut OptimizerState::new(&dc, w.len()));
        let (b, _) = step(&asgd, &w, &g, None, &mut OptimizerState::new(&asgd, w.len()));
        prop_assert_eq!(a, b);
    }

    /// When the worker's backup is the current model (τ = 0), the compensation vanishes.
    #[test]
    fn dc_asgd_without_delay_is_asgd(
        (w, g) in (1usize..40).prop_flat_map(|n| (vec_of(n), vec_of(n))),
        adaptive in any::<bool>(),
    ) {
        let dc = hyper(if adaptive { Algorithm::DcAsgdA } else { Algorithm::DcAsgdC }, 0.1);
        let asgd = hyper(Algorithm::Asgd, 0.1);
        let (a, stats) = step(&dc, &w, &g, Some(&w), &mut OptimizerState::new(&dc, w.len()));
        let (b, _) = step(&asgd, &w, &g, None, &mut OptimizerState::new(&asgd, w.len()));
        prop_assert_eq!(a, b);
        prop_assert_eq!(stats.compensation_sq, 0.0);
    }
}

/// Nesterov (Sutskever et al. 2013, PyTorch's `nesterov=True`): m ← μ·m + g, w ← w − η·(g + μ·m);
/// heavy ball: w ← w − η·m. Two steps by hand.
#[test]
fn nesterov_and_heavy_ball_momentum_hand_computed() {
    let mut h = hyper(Algorithm::Asgd, 0.5);
    h.momentum = 0.5;
    for nesterov in [false, true] {
        h.nesterov = nesterov;
        let mut st = OptimizerState::new(&h, 1);
        let (w, _) = step(&h, &[1.0], &[2.0], None, &mut st); // m = 2
        let want = if nesterov { 1.0 - 0.5 * (2.0 + 0.5 * 2.0) } else { 1.0 - 0.5 * 2.0 };
        assert_eq!((w[0], st.momentum[0]), (want, 2.0), "nesterov {nesterov}, step 1");
        let (w, _) = step(&h, &w, &[-1.0], None, &mut st); // m = 0.5·2 − 1 = 0
        let want2 = if nesterov { want - 0.5 * (-1.0 + 0.0) } else { want };
        assert_eq!((w[0], st.momentum[0]), (want2, 0.0), "nesterov {nesterov}, step 2");
    }
    h.momentum = 0.0;
    assert!(h.validate().is_err(), "nesterov without momentum is refused");
}

#[cfg(target_arch = "x86_64")]
#[test]
fn avx2_and_baseline_builds_agree_bit_for_bit() {
    for nesterov in [false, true] {
        avx2_and_baseline_agree(nesterov);
    }
}

#[cfg(target_arch = "x86_64")]
fn avx2_and_baseline_agree(nesterov: bool) {
    use kernels::{Pass, Scalars};
    let n = 1003;
    let w0: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
    let g: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
    let bak: Vec<f32> = (0..n).map(|i| (i as f32 * 0.05).sin()).collect();
    // Gains clamped on some elements (max_gain 3), MeanSquare flushed on some.
    let s = Scalars {
        lr: 0.1,
        weight_decay: 1e-4,
        momentum: 0.9,
        nesterov,
        lambda0: 2.0,
        decay: 0.95,
        epsilon: 1e-7,
        max_gain: 3.0,
    };
    let (mut w1, mut w2) = (w0.clone(), w0.clone());
    let ms0: Vec<f32> = (0..n).map(|i| if i % 5 == 0 { 0.0 } else { 0.1 }).collect();
    let (mut ms1, mut ms2) = (ms0.clone(), ms0.clone());
    let (mut m1, mut m2) = (vec![0.0; n], vec![0.0; n]);
    let a =
        kernels::run(s, &mut w1, &g, Pass::DcAdaptive { bak: &bak, mean_square: &mut ms1 }, Some(&mut m1));
    let b = kernels::run_baseline(
        s,
        &mut w2,
        &g,
        Pass::DcAdaptive { bak: &bak, mean_square: &mut ms2 },
        Some(&mut m2),
    );
    assert_eq!(w1, w2);
    assert_eq!(ms1, ms2);
    assert_eq!(a, b);
    assert_ne!(w1, w0);
    assert!(a.clamped > 0 && a.clamped < n as u64, "{} of {n} clamped", a.clamped);
}

/// The compensation's per-element gain λ·g² is clamped at 1/η: a huge λ·g² moves the parameter
/// at most back to its backup, not past it.
#[test]
fn the_gain_clamp_stops_at_the_backup() {
    for algo in [Algorithm::DcAsgdC, Algorithm::DcAsgdA] {
        let mut h = hyper(algo, 0.1);
        h.lambda0 = 1e8;
        let mut st = OptimizerState::new(&h, 2);
        // g = 0.001 on the first element makes the plain gradient step tiny; the compensation's
        // gain (1e8·1e-6 = 100 for dc-asgd-c, larger for dc-asgd-a) is clamped to 1/η = 10.
        let (w, stats) = step(&h, &[1.0, 1.0], &[1e-3, 0.0], Some(&[0.0, 0.0]), &mut st);
        assert!((w[0] - (1.0 - 0.1 * 1e-3 - 1.0)).abs() < 1e-6, "{algo}: {w:?}");
        assert!(w[0] > -1e-3, "{algo}: not past the backup: {w:?}");
        assert_eq!(w[1], 1.0, "a zero gradient has no compensation");
        assert_eq!(stats.clamped, 1, "{algo}");
        h.safeguards.gain_clamp = false;
        let mut st = OptimizerState::new(&h, 2);
        let (w, _) = step(&h, &[1.0, 1.0], &[1e-3, 0.0], Some(&[0.0, 0.0]), &mut st);
        assert!(w[0] < -8.0, "{algo}: unclamped, the step overshoots the backup: {w:?}");
    }
}

/// MeanSquare starts at 0; with the bias correction the first update's λ is λ0/|g| (MeanSquare
/// estimates g²), not λ0/(√(1−μ)·|g|), 4.5× larger at μ = 0.95.
#[test]
fn mean_square_is_bias_corrected() {
    let mut h = hyper(Algorithm::DcAsgdA, 0.01);
    h.lambda0 = 0.1;
    let lambda = |h: &Hyper, t: u64| {
        let mut st = OptimizerState::new(h, 1);
        let mut w = vec![1.0];
        let stats =
            apply(h, Step::at(0.01, t), &mut w, &[2.0], Some(&[0.5]), &mut st.mean_square, &mut st.momentum);
        stats.mean_lambda()
    };
    assert!((lambda(&h, 1) - 0.1 / 2.0).abs() < 1e-6, "{}", lambda(&h, 1));
    h.safeguards.bias_correction = false;
    let raw = lambda(&h, 1);
    assert!((raw - 0.1 / (0.05f64.sqrt() * 2.0)).abs() < 1e-5, "{raw}");
    assert!(raw / (0.1 / 2.0) > 4.4);
}

/// A parameter whose gradient stays 0 ends with MeanSquare exactly 0, never subnormal, and its
/// λ is the same f32 as without the flush.
#[test]
fn idle_parameters_never_leave_mean_square_subnormal() {
    let h = hyper(Algorithm::DcAsgdA, 0.1);
    let mut st = OptimizerState::new(&h, 9);
    st.mean_square.fill(1e-6);
    let mut w = vec![0.5; 9];
    for t in 0..3000 {
        let stats = apply(
            &h,
            Step::at(0.1, t + 10),
            &mut w,
            &[0.0; 9],
            Some(&[0.4; 9]),
            &mut st.mean_square,
            &mut st.momentum,
        );
        assert!(st.mean_square.iter().all(|m| *m == 0.0 || m.is_normal()), "step {t}: {:?}", st.mean_square);
        assert!((stats.mean_lambda() - f64::from(2.0 / (1e-7f32).sqrt())).abs() < 1.0 || t < 400);
    }
    assert_eq!(st.mean_square, vec![0.0; 9]);
    assert_eq!(w, vec![0.5; 9], "no gradient, no compensation");
}

/// With momentum μ, a compensation that recurs every update (a worker that always pushes
/// against a stale backup) builds up to 1/(1 − μ) times itself in the buffer: the clamp at
/// (1 − μ)/η keeps the step within w − w_bak (it was 10× past at μ = 0.9 with the clamp at 1/η).
#[test]
fn the_gain_clamp_bounds_the_step_with_momentum_too() {
    for algo in [Algorithm::DcAsgdC, Algorithm::DcAsgdA] {
        let mut h = hyper(algo, 0.1);
        h.lambda0 = 1e8;
        h.momentum = 0.9;
        let mut st = OptimizerState::new(&h, 1);
        let mut w = vec![1.0f32];
        let mut clamped = 0;
        for t in 0..100 {
            // Every push comes from a worker whose backup is 1 behind the model.
            let bak = [w[0] - 1.0];
            let before = w[0];
            let stats = apply(
                &h,
                Step::at(0.1, t + 1),
                &mut w,
                &[1e-3],
                Some(&bak),
                &mut st.mean_square,
                &mut st.momentum,
            );
            clamped += stats.clamped;
            let gradient_part = 0.1 * 1e-3 / (1.0 - 0.9);
            assert!(
                (before - w[0]).abs() <= 1.0 + gradient_part + 1e-4,
                "{algo}, update {t}: moved {} past a backup 1 away",
                before - w[0]
            );
        }
        assert_eq!(clamped, 100, "{algo}: every update clamped");
    }
}

/// A parameter whose gradient turns 0 ends with momentum exactly 0: the buffer decays by μ per
/// update and would otherwise sit in the subnormal range (μ = 0.5: from about update 126 on).
#[test]
fn momentum_of_idle_parameters_never_goes_subnormal() {
    let mut h = hyper(Algorithm::Asgd, 0.1);
    h.momentum = 0.5;
    let mut st = OptimizerState::new(&h, 9);
    let mut w = vec![0.5; 9];
    apply(&h, Step::at(0.1, 1), &mut w, &[1.0; 9], None, &mut st.mean_square, &mut st.momentum);
    for t in 0..300 {
        apply(&h, Step::at(0.1, t + 2), &mut w, &[0.0; 9], None, &mut st.mean_square, &mut st.momentum);
        assert!(st.momentum.iter().all(|m| *m == 0.0 || m.is_normal()), "update {t}: {:?}", st.momentum);
    }
    assert_eq!(st.momentum, vec![0.0; 9]);
}

/// Gradients so small their squares would be subnormal count g² = 0 and leave MeanSquare and
/// the compensation 0; the plain gradient step is kept.
#[test]
fn tiny_gradients_leave_no_subnormal_state() {
    let mut h = hyper(Algorithm::DcAsgdA, 0.1);
    h.momentum = 0.9;
    let mut st = OptimizerState::new(&h, 9);
    let mut w = vec![0.5; 9];
    let stats = apply(
        &h,
        Step::at(0.1, 1),
        &mut w,
        &[1e-20; 9],
        Some(&[0.4; 9]),
        &mut st.mean_square,
        &mut st.momentum,
    );
    assert_eq!(st.mean_square, vec![0.0; 9]);
    assert_eq!((stats.grad_sq, stats.compensation_sq), (0.0, 0.0));
    assert!(st.momentum.iter().all(|m| *m == 0.0 || m.is_normal()), "{:?}", st.momentum);
}

/// Delayed Nesterov: the N updates of one cycle, each with its own gradient.
fn delayed_cycle(h: &Hyper, w: &mut [f32], grads: &[Vec<f32>], momentum: &mut [f32]) {
    let mut pending = vec![0.0; w.len()];
    for (i, g) in grads.iter().enumerate() {
        let milestone = i + 1 == grads.len();
        let d = Delayed { momentum: &mut *momentum, pending: &mut pending, milestone };
        apply_delayed(h, Step::at(h.lr.base, 1), w, g, None, &mut [], d);
    }
    assert!(pending.iter().all(|&p| p == 0.0), "the milestone empties the pending sum");
}

#[test]
fn delayed_nesterov_hand_computed() {
    let mut h = hyper(Algorithm::Asgd, 0.5);
    (h.momentum, h.nesterov, h.momentum_delay) = (0.5, true, 2);
    let (mut w, mut m) = (vec![1.0f32], vec![2.0f32]);
    let mut pending = vec![0.0f32];
    // First update of the cycle: w − η·g/2 = 1 − 0.5·4/2; momentum untouched.
    let d = Delayed { momentum: &mut m, pending: &mut pending, milestone: false };
    apply_delayed(&h, Step::at(0.5, 1), &mut w, &[4.0], None, &mut [], d);
    assert_eq!((w[0], m[0], pending[0]), (0.0, 2.0, 4.0));
    // Second: w − 0.5·2/2 = −0.5; m = 0.5·2 + (4 + 2)/2 = 4; w − η·μ·m = −0.5 − 1 = −1.5.
    let d = Delayed { momentum: &mut m, pending: &mut pending, milestone: true };
    apply_delayed(&h, Step::at(0.5, 1), &mut w, &[2.0], None, &mut [], d);
    assert_eq!((w[0], m[0], pending[0]), (-1.5, 4.0, 0.0));
}

proptest! {
    /// N updates of a cycle at a constant η move w as one momentum step on their mean (what a
    /// synchronous round of the same N gradients does), for Nesterov and heavy ball alike.
    #[test]
    fn a_delayed_cycle_is_one_synchronous_step_on_the_mean(
        w0 in prop::collection::vec(-2.0f32..2.0, 1..20),
        seed in prop::collection::vec(-1.0f32..1.0, 4 * 20),
        m0 in -1.0f32..1.0,
        nesterov: bool,
        n in 2usize..=4,
    ) {
        let len = w0.len();
        let grads: Vec<Vec<f32>> = (0..n).map(|i| seed[i * len..(i + 1) * len].to_vec()).collect();
        let mut h = hyper(Algorithm::Asgd, 0.3);
        (h.momentum, h.nesterov, h.momentum_delay) = (0.9, nesterov, n as u32);
        let (mut w, mut m) = (w0.clone(), vec![m0; len]);
        delayed_cycle(&h, &mut w, &grads, &mut m);

        let mut mean: Vec<f32> = vec![0.0; len];
        grads.iter().for_each(|g| accumulate(&mut mean, g));
        mean.iter_mut().for_each(|x| *x /= n as f32);
        let mut every = h.clone();
        every.momentum_delay = 1;
        let (mut expect, mut expect_m) = (w0.clone(), vec![m0; len]);
        apply(&every, Step::at(0.3, 1), &mut expect, &mean, None, &mut [], &mut expect_m);
        prop_assert!(close(&w, &expect, 1e-5), "{w:?} vs {expect:?}");
        prop_assert!(close(&m, &expect_m, 1e-5), "{m:?} vs {expect_m:?}");
    }
}

/// The delay compensation still corrects each update's own step: dc-asgd-a under a momentum
/// delay moves w by its compensated gradient's share, and the momentum sees the raw gradient.
#[test]
fn delayed_nesterov_keeps_the_compensation_in_each_updates_own_step() {
    let mut h = hyper(Algorithm::DcAsgdC, 0.1);
    (h.lambda0, h.momentum, h.nesterov, h.momentum_delay) = (0.5, 0.9, true, 2);
    let (mut w, mut m, mut pending) = (vec![1.0f32, 2.0], vec![0.0f32; 2], vec![0.0f32; 2]);
    let d = Delayed { momentum: &mut m, pending: &mut pending, milestone: false };
    apply_delayed(&h, Step::at(0.1, 1), &mut w, &[2.0, -1.0], Some(&[0.5, 3.0]), &mut [], d);
    // dc_asgd_c_hand_computed's step (0.3, −0.15 at η = 0.1) at η/2.
    assert!(close(&w, &[0.85, 2.075], 1e-7), "{w:?}");
    assert_eq!((m, pending), (vec![0.0, 0.0], vec![2.0, -1.0]));
}

/// What a memory plan counts: one model-sized vector per piece of state the rule keeps.
#[test]
fn the_state_a_rule_keeps_is_counted_in_model_copies() {
    let mut h = Hyper::new(Algorithm::DcAsgdA, 0.1);
    assert_eq!(OptimizerState::new(&h, 5).copies(), 1, "MeanSquare");
    h.momentum = 0.9;
    assert_eq!(OptimizerState::new(&h, 5).copies(), 2, "and momentum");
    h.momentum_delay = 4;
    let st = OptimizerState::new(&h, 5);
    assert_eq!((st.copies(), st.pending.len()), (3, 5), "and Delayed Nesterov's pending sum");
    assert_eq!(OptimizerState::new(&Hyper::new(Algorithm::Asgd, 0.1), 5).copies(), 0);
}
