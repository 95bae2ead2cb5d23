//! Update rules: pure functions over `&mut [f32]`, no I/O. This is where the maths lives.
//!
//! | rule        | on a push of gradient g from worker m                              |
//! |-------------|--------------------------------------------------------------------|
//! | `sync`      | combine one gradient per worker (mean or sum), then w ← w − η·g     |
//! | `asgd`      | w ← w − η·g                                                          |
//! | `dc-asgd-c` | w ← w − η·(g + λ0·g⊙g⊙(w − w_bak(m)))                               |
//! | `dc-asgd-a` | same with λ_t = λ0/√(MeanSquare+ε), MeanSquare ← μ·MeanSquare+(1−μ)·g² |
//!
//! Weight decay adds wd·w to the step (a parameter group's own wd, and η times its scale:
//! [`Rates`]), momentum folds the step through a heavy-ball buffer
//! (or Nesterov's), at every update or, with a momentum delay, once per N ([`apply_delayed`]).
//!
//! Numerical safeguards of the delay-compensated rules ([`Safeguards`], docs/convergence.md):
//! the per-element gain λ·g² is clamped at (1 − momentum)/η, so the compensation never moves a
//! parameter past its backup, with momentum's build-up too; dc-asgd-a's MeanSquare, which starts
//! at 0, is bias-corrected like Adam's second moment (÷ (1 − μ^t)); MeanSquare, momentum and
//! compensation below 1e-30 are flushed to 0 and gradients below 1e-15 count g² = 0 (no
//! subnormals).

mod groups;
mod hyper;
pub(crate) mod kernels;

pub use groups::{ParameterGroup, Rates, Segments, validate as validate_parameter_groups};
pub use hyper::{Algorithm, Combine, Hyper, HyperError, LrSchedule, Safeguards};

use kernels::{Pass, Scalars};

/// Optimizer state for a slice of parameters: empty vectors for state a rule does not use.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OptimizerState {
    pub mean_square: Vec<f32>,
    pub momentum: Vec<f32>,
    /// Delayed Nesterov's sum of the gradients since the momentum last stepped
    /// ([`apply_delayed`]; `momentum_delay` > 1 only).
    pub pending: Vec<f32>,
}

impl OptimizerState {
    pub fn new(hyper: &Hyper, len: usize) -> Self {
        let when = |used: bool| if used { vec![0.0; len] } else { Vec::new() };
        Self {
            mean_square: when(hyper.algorithm == Algorithm::DcAsgdA),
            momentum: when(hyper.momentum > 0.0),
            pending: when(hyper.momentum_delay > 1),
        }
    }

    /// Model-sized vectors held (for a memory plan).
    pub fn copies(&self) -> usize {
        [&self.mean_square, &self.momentum, &self.pending].iter().filter(|v| !v.is_empty()).count()
    }
}

/// What one update did, summed so that several shards' stats add up.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct UpdateStats {
    /// Σ g²
    pub grad_sq: f64,
    /// Σ (λ·g²·(w − w_bak))²
    pub compensation_sq: f64,
    /// Σ λ over the elements (0 for rules without compensation)
    pub lambda_sum: f64,
    /// Elements whose compensation gain λ·g² was clamped at (1 − momentum)/η.
    pub clamped: u64,
    pub elements: u64,
}

impl UpdateStats {
    pub fn merge(&mut self, o: UpdateStats) {
        self.grad_sq += o.grad_sq;
        self.compensation_sq += o.compensation_sq;
        self.lambda_sum += o.lambda_sum;
        self.clamped += o.clamped;
        self.elements += o.elements;
    }

    /// |λ·g⊙g⊙Δw| / |g|: how large the delay compensation was against the gradient.
    pub fn compensation_ratio(&self) -> f64 {
        if self.grad_sq > 0.0 { (self.compensation_sq / self.grad_sq).sqrt() } else { 0.0 }
    }

    /// Mean λ over the elements updated.
    pub fn mean_lambda(&self) -> f64 {
        if self.elements > 0 { self.lambda_sum / self.elements as f64 } else { 0.0 }
    }
}

/// What the store tells a rule about one update (and the range of elements it applies).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Step {
    pub lr: f32,
    /// MeanSquare updates since it was last zero, this one included (t in dc-asgd-a's bias
    /// correction; ignored by the other rules).
    pub mean_square_updates: u64,
    /// A parameter group's rates for these elements; `None`: the job's own.
    pub rates: Option<Rates>,
}

impl Step {
    pub fn at(lr: f32, mean_square_updates: u64) -> Self {
        Self { lr, mean_square_updates, rates: None }
    }

    /// This step on elements of a group with `rates`.
    pub fn with_rates(self, rates: Rates) -> Self {
        Self { rates: Some(rates), ..self }
    }

    fn rates(&self, hyper: &Hyper) -> Rates {
        self.rates.unwrap_or(Rates::plain(hyper.weight_decay))
    }
}

/// Applies one gradient to `w` under `hyper` at `step`'s learning rate.
///
/// `backup` is w_bak(m), the model the pushing worker last pulled; the delay-compensated rules
/// require it, the others ignore it. `state` must come from [`OptimizerState::new`] for the
/// same length (or be a same-length slice of one).
pub fn apply(
    hyper: &Hyper,
    step: Step,
    w: &mut [f32],
    g: &[f32],
    backup: Option<&[f32]>,
    mean_square: &mut [f32],
    momentum: &mut [f32],
) -> UpdateStats {
    let rates = step.rates(hyper);
    let s = scalars(hyper, step, rates, step.lr * rates.lr_scale, hyper.momentum);
    let mom = if hyper.momentum > 0.0 { Some(momentum) } else { None };
    kernels::run(s, w, g, pass(hyper, backup, mean_square), mom)
}

/// Delayed Nesterov's state, and where an update stands in it.
pub struct Delayed<'a> {
    pub momentum: &'a mut [f32],
    /// Σ of the gradients applied since the momentum last stepped (as long as `w`).
    pub pending: &'a mut [f32],
    /// This update is the `momentum_delay`-th since the momentum last stepped: it steps now.
    pub milestone: bool,
}

/// Applies one gradient under Delayed Nesterov (Liu et al. 2024, "Asynchronous Local-SGD
/// Training for Language Modeling"), for `hyper.momentum_delay` = N > 1.
///
/// Momentum applied at every asynchronous update compounds stale pseudo-gradients (each one
/// keeps pushing through the buffer long after it was computed). Here each update moves `w` by
/// its own share, η·d/N with d the rule's step (delay compensation and weight decay included),
/// and adds g to `pending`; every N-th update the momentum steps once on the mean of the N,
/// m ← μ·m + Σg/N, and `w` takes the momentum's part of the step: η·μ·m (Nesterov) or η·μ·m_old
/// (heavy ball). N updates at a constant η thus move `w` as one synchronous step on their mean.
pub fn apply_delayed(
    hyper: &Hyper,
    step: Step,
    w: &mut [f32],
    g: &[f32],
    backup: Option<&[f32]>,
    mean_square: &mut [f32],
    delayed: Delayed<'_>,
) -> UpdateStats {
    let n = hyper.momentum_delay as f32;
    let rates = step.rates(hyper);
    let lr = step.lr * rates.lr_scale;
    let s = scalars(hyper, step, rates, lr / n, 0.0);
    let stats = kernels::run(s, w, g, pass(hyper, backup, mean_square), None);
    kernels::accumulate(delayed.pending, g);
    if delayed.milestone {
        kernels::delayed_momentum(
            w,
            delayed.momentum,
            delayed.pending,
            lr,
            hyper.momentum,
            n,
            hyper.nesterov,
        );
    }
    stats
}

/// The kernel's scalars for `hyper` at `step` with `rates`' weight decay, stepping by `lr`
/// with momentum `momentum`.
fn scalars(hyper: &Hyper, step: Step, rates: Rates, lr: f32, momentum: f32) -> Scalars {
    let guard = hyper.safeguards;
    // The bias correction λ0/√(ms/b + ε) with b = 1 − μ^t, computed as λ0·√b / √(ms + ε·b): the
    // kernel's per-element work stays what it is without it (b = 1 gives the same bits).
    let b = match hyper.algorithm {
        Algorithm::DcAsgdA if guard.bias_correction => {
            let t = step.mean_square_updates.clamp(1, i32::MAX as u64) as i32;
            1.0 - f64::from(hyper.mean_square_decay).powi(t)
        }
        _ => 1.0,
    };
    Scalars {
        lr,
        weight_decay: rates.weight_decay,
        momentum,
        nesterov: hyper.nesterov,
        lambda0: (f64::from(hyper.lambda0) * b.sqrt()) as f32,
        decay: hyper.mean_square_decay,
        epsilon: (f64::from(hyper.epsilon) * b) as f32,
        // With momentum μ a constant compensation builds up to 1/(1 − μ) times itself in the
        // buffer: (1 − μ)/η bounds the step it makes, not only its first term.
        max_gain: if guard.gain_clamp { (1.0 - momentum) / lr } else { f32::INFINITY },
    }
}

/// Which kernel pass `hyper`'s rule takes.
fn pass<'a>(hyper: &Hyper, backup: Option<&'a [f32]>, mean_square: &'a mut [f32]) -> Pass<'a> {
    let need_backup = || backup.expect("delay-compensated rules need the worker's backup");
    match hyper.algorithm {
        Algorithm::Sync | Algorithm::Asgd => Pass::Sgd,
        Algorithm::DcAsgdC => Pass::DcConstant { bak: need_backup() },
        Algorithm::DcAsgdA => Pass::DcAdaptive { bak: need_backup(), mean_square },
    }
}

/// Turns the sum of a `sync` round's gradients into the gradient to apply: under
/// [`Combine::Mean`], the sum divided by `mean_over` ([`mean_over`]).
pub fn finish_combined(hyper: &Hyper, sum: &mut [f32], mean_over: usize) {
    if hyper.combine == Combine::Mean && mean_over > 1 {
        kernels::divide(sum, mean_over as f32);
    }
}

/// What a `sync` round of `contributions` gradients, `full` in a whole round, divides its sum by:
/// a round closed short (a round timeout, a silent or finished worker) counts the gradients it
/// lacks as zero, so its step is contributions/full of a whole round's. Its gradient averages
/// fewer examples and is that much noisier; the step shrinks with the batch it stands for (the
/// linear scaling rule, Goyal et al. 2017). Dividing by the contributions instead gave a lone
/// last worker's rounds three times the step of a whole round of three: in the matrix, one
/// such round took the final model from 0.93 to 0.71 held-out accuracy.
pub fn mean_over(contributions: usize, full: usize) -> usize {
    contributions.max(full)
}

/// Adds one worker's gradient to a `sync` round's running sum.
pub fn accumulate(sum: &mut [f32], g: &[f32]) {
    kernels::accumulate(sum, g);
}

#[cfg(test)]
mod tests;
