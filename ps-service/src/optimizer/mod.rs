//! Update rules: pure functions over `&mut [f32]`, no I/O. This is where the maths lives.
//!
//! | rule        | on a push of gradient g from worker m                              |
//! |-------------|--------------------------------------------------------------------|
//! | `sync`      | combine one gradient per worker (mean or sum), then w ← w − η·g     |
//! | `asgd`      | w ← w − η·g                                                          |
//! | `dc-asgd-c` | w ← w − η·(g + λ0·g⊙g⊙(w − w_bak(m)))                               |
//! | `dc-asgd-a` | same with λ_t = λ0/√(MeanSquare+ε), MeanSquare ← μ·MeanSquare+(1−μ)·g² |
//!
//! Weight decay adds wd·w to the step, momentum folds the step through a heavy-ball buffer.

mod hyper;
pub(crate) mod kernels;

pub use hyper::{Algorithm, Combine, Hyper, HyperError, LrSchedule};

use kernels::{Pass, Scalars};

/// Optimizer state for a slice of parameters: empty vectors for state a rule does not use.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OptimizerState {
    pub mean_square: Vec<f32>,
    pub momentum: Vec<f32>,
}

impl OptimizerState {
    pub fn new(hyper: &Hyper, len: usize) -> Self {
        Self {
            mean_square: if hyper.algorithm == Algorithm::DcAsgdA { vec![0.0; len] } else { Vec::new() },
            momentum: if hyper.momentum > 0.0 { vec![0.0; len] } else { Vec::new() },
        }
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
    pub elements: u64,
}

impl UpdateStats {
    pub fn merge(&mut self, o: UpdateStats) {
        self.grad_sq += o.grad_sq;
        self.compensation_sq += o.compensation_sq;
        self.lambda_sum += o.lambda_sum;
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

/// Applies one gradient to `w` under `hyper` at learning rate `lr`.
///
/// `backup` is w_bak(m), the model the pushing worker last pulled; the delay-compensated rules
/// require it, the others ignore it. `state` must come from [`OptimizerState::new`] for the
/// same length (or be a same-length slice of one).
pub fn apply(
    hyper: &Hyper,
    lr: f32,
    w: &mut [f32],
    g: &[f32],
    backup: Option<&[f32]>,
    mean_square: &mut [f32],
    momentum: &mut [f32],
) -> UpdateStats {
    let s = Scalars {
        lr,
        weight_decay: hyper.weight_decay,
        momentum: hyper.momentum,
        lambda0: hyper.lambda0,
        decay: hyper.mean_square_decay,
        epsilon: hyper.epsilon,
    };
    let need_backup = || backup.expect("delay-compensated rules need the worker's backup");
    let pass = match hyper.algorithm {
        Algorithm::Sync | Algorithm::Asgd => Pass::Sgd,
        Algorithm::DcAsgdC => Pass::DcConstant { bak: need_backup() },
        Algorithm::DcAsgdA => Pass::DcAdaptive { bak: need_backup(), mean_square },
    };
    let mom = if hyper.momentum > 0.0 { Some(momentum) } else { None };
    kernels::run(s, w, g, pass, mom)
}

/// Turns the sum of a `sync` round's `contributions` gradients into the gradient to apply.
pub fn finish_combined(hyper: &Hyper, sum: &mut [f32], contributions: usize) {
    if hyper.combine == Combine::Mean && contributions > 1 {
        kernels::divide(sum, contributions as f32);
    }
}

/// Adds one worker's gradient to a `sync` round's running sum.
pub fn accumulate(sum: &mut [f32], g: &[f32]) {
    kernels::accumulate(sum, g);
}

#[cfg(test)]
mod tests;
