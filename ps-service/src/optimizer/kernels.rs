//! The update kernels: one pass over a slice of parameters.
//!
//! Each kernel is written once as an `#[inline(always)]` per-element body over 8-lane chunks
//! with per-lane accumulators (the baseline build), and once more with AVX2 intrinsics doing
//! the same operations in the same order, picked at run time. The compiler alone left the
//! delay-compensated loops scalar (their bodies are too large for it to keep the lanes in
//! registers), which made dc-asgd-a 5–20× slower than asgd. Neither build contracts to FMA, and
//! sqrt and division are exact in IEEE arithmetic, so both give bit-identical results (a test
//! checks this).

use super::UpdateStats;

pub(crate) const LANES: usize = 8;

/// MeanSquare, momentum and compensation values below this (in magnitude) are flushed to 0:
/// state a parameter with gradient 0 keeps would otherwise decay geometrically through the
/// subnormal range, where x86 arithmetic is slow, and stay there for every later update. It is
/// far below any ε (λ = λ0/√(MeanSquare+ε) is the same f32 either way) and any step that moves
/// an f32 weight of a trained model.
pub(crate) const FLUSH_FLOOR: f32 = 1e-30;

/// A gradient element below this (in magnitude) counts g² = 0: g², (1−μ)·g² and λ·g² would be
/// subnormal or close to it (√[`FLUSH_FLOOR`]).
pub(crate) const SQUARE_FLOOR: f32 = 1e-15;

/// Scalars for one pass of a rule.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Scalars {
    pub lr: f32,
    pub weight_decay: f32,
    pub momentum: f32,
    /// With momentum: step by d + μ·m (Nesterov) instead of m (heavy ball).
    pub nesterov: bool,
    pub lambda0: f32,
    pub decay: f32,
    pub epsilon: f32,
    /// The largest per-element compensation gain λ·g² allowed (1/η: the compensation never
    /// moves a parameter past its backup); +∞ turns the clamp off.
    pub max_gain: f32,
}

/// Which rule a pass computes; `bak` and the state slices must be as long as `w` when used.
pub(crate) enum Pass<'a> {
    /// d = g + wd·w
    Sgd,
    /// d = g + min(λ0·g², max_gain)⊙(w − bak) + wd·w
    DcConstant { bak: &'a [f32] },
    /// ms ← μ·ms + (1−μ)·g² (flushed to 0 below the floor); λ = λ0/√(ms+ε);
    /// d = g + min(λ·g², max_gain)⊙(w − bak) + wd·w
    DcAdaptive { bak: &'a [f32], mean_square: &'a mut [f32] },
}

/// Applies `pass` to `w` with gradient `g`; with `momentum` (a state slice), heavy-ball momentum.
pub(crate) fn run(
    s: Scalars,
    w: &mut [f32],
    g: &[f32],
    pass: Pass<'_>,
    momentum: Option<&mut [f32]>,
) -> UpdateStats {
    assert_eq!(w.len(), g.len(), "gradient and parameters differ in length");
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked just above.
        return unsafe { run_avx2(s, w, g, pass, momentum) };
    }
    run_baseline(s, w, g, pass, momentum)
}

/// The build for CPUs without AVX2.
pub(crate) fn run_baseline(
    s: Scalars,
    w: &mut [f32],
    g: &[f32],
    pass: Pass<'_>,
    m: Option<&mut [f32]>,
) -> UpdateStats {
    dispatch(s, w, g, pass, m)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn run_avx2(
    s: Scalars,
    w: &mut [f32],
    g: &[f32],
    pass: Pass<'_>,
    m: Option<&mut [f32]>,
) -> UpdateStats {
    select_kernel!(kernel_avx2, s, w, g, pass, m)
}

/// `kernel` with the 8-lane chunks written in AVX2 intrinsics: the same operations in the same
/// order as `element` (separate mul and add, IEEE sqrt and division), so bit-identical to the
/// baseline build, but with the accumulators in registers whatever the rule.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn kernel_avx2<const KIND: u8, const MOM: bool>(
    s: Scalars,
    w: &mut [f32],
    g: &[f32],
    bak: &[f32],
    ms: &mut [f32],
    mom: &mut [f32],
) -> UpdateStats {
    use std::arch::x86_64::*;
    let n = w.len();
    check_lengths::<KIND, MOM>(n, g, bak, ms, mom);
    let body = n - n % LANES;
    let (lr, wd, mu) = (_mm256_set1_ps(s.lr), _mm256_set1_ps(s.weight_decay), _mm256_set1_ps(s.momentum));
    let (l0, decay, keep, eps) = (
        _mm256_set1_ps(s.lambda0),
        _mm256_set1_ps(s.decay),
        _mm256_set1_ps(1.0 - s.decay),
        _mm256_set1_ps(s.epsilon),
    );
    let (floor, max_gain, one) =
        (_mm256_set1_ps(FLUSH_FLOOR), _mm256_set1_ps(s.max_gain), _mm256_set1_ps(1.0));
    let square_floor = _mm256_set1_ps(SQUARE_FLOOR);
    let sign = _mm256_set1_ps(-0.0);
    // x with the elements whose magnitude is below `below` set to 0.
    let flush = |x: __m256, below: __m256| {
        let small = _mm256_cmp_ps::<_CMP_LT_OQ>(_mm256_andnot_ps(sign, x), below);
        _mm256_andnot_ps(small, x)
    };
    let (mut gs, mut cs, mut ls) = (_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps());
    let mut clamped = _mm256_setzero_ps();
    for c in (0..body).step_by(LANES) {
        // SAFETY: c + LANES <= body <= n, and every slice used is n long (asserted above).
        unsafe {
            let gv = _mm256_loadu_ps(g.as_ptr().add(c));
            let wv = _mm256_loadu_ps(w.as_ptr().add(c));
            let g2 = _mm256_mul_ps(flush(gv, square_floor), gv);
            gs = _mm256_add_ps(gs, g2);
            let mut d = _mm256_add_ps(gv, _mm256_mul_ps(wd, wv));
            if KIND != SGD {
                let lambda = if KIND == DC_ADAPTIVE {
                    let m = _mm256_loadu_ps(ms.as_ptr().add(c));
                    let m = _mm256_add_ps(_mm256_mul_ps(decay, m), _mm256_mul_ps(keep, g2));
                    let m = flush(m, floor);
                    _mm256_storeu_ps(ms.as_mut_ptr().add(c), m);
                    _mm256_div_ps(l0, _mm256_sqrt_ps(_mm256_add_ps(m, eps)))
                } else {
                    l0
                };
                let bv = _mm256_loadu_ps(bak.as_ptr().add(c));
                let gain = _mm256_mul_ps(lambda, g2);
                let over = _mm256_cmp_ps::<_CMP_GT_OQ>(gain, max_gain);
                clamped = _mm256_add_ps(clamped, _mm256_and_ps(over, one));
                let gain = _mm256_min_ps(gain, max_gain);
                let comp = flush(_mm256_mul_ps(gain, _mm256_sub_ps(wv, bv)), floor);
                cs = _mm256_add_ps(cs, _mm256_mul_ps(comp, comp));
                ls = _mm256_add_ps(ls, lambda);
                d = _mm256_add_ps(d, comp);
            }
            if MOM {
                let m = _mm256_loadu_ps(mom.as_ptr().add(c));
                let m = flush(_mm256_add_ps(_mm256_mul_ps(mu, m), d), floor);
                _mm256_storeu_ps(mom.as_mut_ptr().add(c), m);
                // A loop-invariant branch: predicted, and heavy ball's bits stay as they were.
                d = if s.nesterov { _mm256_add_ps(d, _mm256_mul_ps(mu, m)) } else { m };
            }
            _mm256_storeu_ps(w.as_mut_ptr().add(c), _mm256_sub_ps(wv, _mm256_mul_ps(lr, d)));
        }
    }
    let mut acc = Acc::default();
    // SAFETY: each array is LANES f32 long.
    unsafe {
        _mm256_storeu_ps(acc.grad_sq.as_mut_ptr(), gs);
        _mm256_storeu_ps(acc.comp_sq.as_mut_ptr(), cs);
        _mm256_storeu_ps(acc.lambda.as_mut_ptr(), ls);
        _mm256_storeu_ps(acc.clamped.as_mut_ptr(), clamped);
    }
    remainder::<KIND, MOM>(&s, acc, w, g, bak, ms, mom, body)
}

const SGD: u8 = 0;
const DC_CONSTANT: u8 = 1;
const DC_ADAPTIVE: u8 = 2;

/// Calls the monomorphised `$kernel` (`kernel` or `kernel_avx2`) for a pass and momentum.
macro_rules! select_kernel {
    ($kernel:ident, $s:expr, $w:expr, $g:expr, $pass:expr, $m:expr) => {
        match ($pass, $m) {
            (Pass::Sgd, None) => $kernel::<SGD, false>($s, $w, $g, &[], &mut [], &mut []),
            (Pass::Sgd, Some(m)) => $kernel::<SGD, true>($s, $w, $g, &[], &mut [], m),
            (Pass::DcConstant { bak }, None) => {
                $kernel::<DC_CONSTANT, false>($s, $w, $g, bak, &mut [], &mut [])
            }
            (Pass::DcConstant { bak }, Some(m)) => $kernel::<DC_CONSTANT, true>($s, $w, $g, bak, &mut [], m),
            (Pass::DcAdaptive { bak, mean_square }, None) => {
                $kernel::<DC_ADAPTIVE, false>($s, $w, $g, bak, mean_square, &mut [])
            }
            (Pass::DcAdaptive { bak, mean_square }, Some(m)) => {
                $kernel::<DC_ADAPTIVE, true>($s, $w, $g, bak, mean_square, m)
            }
        }
    };
}
use select_kernel;

#[inline(always)]
fn dispatch(s: Scalars, w: &mut [f32], g: &[f32], pass: Pass<'_>, m: Option<&mut [f32]>) -> UpdateStats {
    select_kernel!(kernel, s, w, g, pass, m)
}

/// Running sums of one pass, kept per lane so the loop vectorises.
#[derive(Default)]
struct Acc {
    grad_sq: [f32; LANES],
    comp_sq: [f32; LANES],
    lambda: [f32; LANES],
    /// Elements whose gain was clamped (exact: a lane counts at most a shard's 8192 elements).
    clamped: [f32; LANES],
}

/// One element of rule `KIND`; `ms` and `mom` are ignored unless the rule/momentum uses them.
// The hot loop's body: inlined into `kernel`, so its arguments cost nothing.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn element<const KIND: u8, const MOM: bool>(
    s: &Scalars,
    acc: &mut Acc,
    lane: usize,
    w: &mut f32,
    g: f32,
    bak: f32,
    ms: &mut f32,
    mom: &mut f32,
) {
    let g2 = flush(g, SQUARE_FLOOR) * g;
    acc.grad_sq[lane] += g2;
    let mut d = g + s.weight_decay * *w;
    if KIND != SGD {
        let lambda = if KIND == DC_ADAPTIVE {
            let m = s.decay * *ms + (1.0 - s.decay) * g2;
            *ms = flush(m, FLUSH_FLOOR);
            s.lambda0 / (*ms + s.epsilon).sqrt()
        } else {
            s.lambda0
        };
        let gain = lambda * g2;
        let over = gain > s.max_gain;
        acc.clamped[lane] += if over { 1.0 } else { 0.0 };
        let comp = flush(if over { s.max_gain } else { gain } * (*w - bak), FLUSH_FLOOR);
        acc.comp_sq[lane] += comp * comp;
        acc.lambda[lane] += lambda;
        d += comp;
    }
    if MOM {
        *mom = flush(s.momentum * *mom + d, FLUSH_FLOOR);
        d = if s.nesterov { d + s.momentum * *mom } else { *mom };
    }
    *w -= s.lr * d;
}

/// `x`, or 0 when its magnitude is below `below` (as the AVX2 build's `flush`).
#[inline(always)]
fn flush(x: f32, below: f32) -> f32 {
    if x.abs() < below { 0.0 } else { x }
}

#[inline(always)]
fn kernel<const KIND: u8, const MOM: bool>(
    s: Scalars,
    w: &mut [f32],
    g: &[f32],
    bak: &[f32],
    ms: &mut [f32],
    mom: &mut [f32],
) -> UpdateStats {
    let n = w.len();
    check_lengths::<KIND, MOM>(n, g, bak, ms, mom);
    let mut acc = Acc::default();
    let (mut ms_dummy, mut mom_dummy) = ([0f32; LANES], [0f32; LANES]);
    let bak_dummy = [0f32; LANES];
    let body = n - n % LANES;
    for c in (0..body).step_by(LANES) {
        let r = c..c + LANES;
        let wv: &mut [f32; LANES] = (&mut w[r.clone()]).try_into().unwrap();
        let gv: &[f32; LANES] = g[r.clone()].try_into().unwrap();
        let bv: &[f32; LANES] = if KIND != SGD { bak[r.clone()].try_into().unwrap() } else { &bak_dummy };
        let msv: &mut [f32; LANES] =
            if KIND == DC_ADAPTIVE { (&mut ms[r.clone()]).try_into().unwrap() } else { &mut ms_dummy };
        let mv: &mut [f32; LANES] = if MOM { (&mut mom[r]).try_into().unwrap() } else { &mut mom_dummy };
        for l in 0..LANES {
            element::<KIND, MOM>(&s, &mut acc, l, &mut wv[l], gv[l], bv[l], &mut msv[l], &mut mv[l]);
        }
    }
    remainder::<KIND, MOM>(&s, acc, w, g, bak, ms, mom, body)
}

/// The slices a rule reads must be as long as the parameters (the vector loops rely on it).
#[inline(always)]
fn check_lengths<const KIND: u8, const MOM: bool>(n: usize, g: &[f32], bak: &[f32], ms: &[f32], mom: &[f32]) {
    assert_eq!(g.len(), n, "gradient and parameters differ in length");
    if KIND != SGD {
        assert_eq!(bak.len(), n, "backup and parameters differ in length");
    }
    if KIND == DC_ADAPTIVE {
        assert_eq!(ms.len(), n, "MeanSquare and parameters differ in length");
    }
    if MOM {
        assert_eq!(mom.len(), n, "momentum and parameters differ in length");
    }
}

/// The elements after the last full chunk, then the per-lane sums folded into the stats.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn remainder<const KIND: u8, const MOM: bool>(
    s: &Scalars,
    mut acc: Acc,
    w: &mut [f32],
    g: &[f32],
    bak: &[f32],
    ms: &mut [f32],
    mom: &mut [f32],
    body: usize,
) -> UpdateStats {
    let n = w.len();
    for i in body..n {
        let (mut msd, mut md) = (0f32, 0f32);
        let b = if KIND != SGD { bak[i] } else { 0.0 };
        let msi = if KIND == DC_ADAPTIVE { &mut ms[i] } else { &mut msd };
        let mi = if MOM { &mut mom[i] } else { &mut md };
        element::<KIND, MOM>(s, &mut acc, i - body, &mut w[i], g[i], b, msi, mi);
    }
    let fold = |a: [f32; LANES]| a.iter().map(|&x| f64::from(x)).sum::<f64>();
    UpdateStats {
        grad_sq: fold(acc.grad_sq),
        compensation_sq: fold(acc.comp_sq),
        lambda_sum: fold(acc.lambda),
        clamped: fold(acc.clamped) as u64,
        elements: n as u64,
    }
}

/// Delayed Nesterov's momentum step ([`super::apply_delayed`]), once per `n` updates:
/// m ← μ·m + pending/n; w ← w − η·μ·m (Nesterov) or w − η·μ·m_old (heavy ball); pending ← 0.
/// Not a hot loop (one update in n), so written plainly.
pub(crate) fn delayed_momentum(
    w: &mut [f32],
    m: &mut [f32],
    pending: &mut [f32],
    lr: f32,
    mu: f32,
    n: f32,
    nesterov: bool,
) {
    assert!(w.len() == m.len() && w.len() == pending.len(), "momentum state and parameters differ in length");
    for ((w, m), p) in w.iter_mut().zip(m.iter_mut()).zip(pending.iter_mut()) {
        let old = *m;
        *m = flush(mu * old + *p / n, FLUSH_FLOOR);
        *w -= lr * mu * if nesterov { *m } else { old };
        *p = 0.0;
    }
}

/// Adds `g` into `acc` (the `sync` round's running sum).
pub(crate) fn accumulate(acc: &mut [f32], g: &[f32]) {
    assert_eq!(acc.len(), g.len());
    for (a, x) in acc.iter_mut().zip(g) {
        *a += x;
    }
}

/// Divides `v` by `k` in place (a division, not a multiply by 1/k, so the mean is exact).
pub(crate) fn divide(v: &mut [f32], k: f32) {
    for x in v {
        *x /= k;
    }
}
