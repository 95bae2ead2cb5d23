//! Hyperparameters of an update rule and their validation.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The update rule a job trains with (`spec.optimizer.algorithm`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Algorithm {
    /// One gradient per worker for the same version, combined and applied once.
    #[serde(rename = "sync")]
    Sync,
    /// Plain asynchronous SGD: w ← w − η·g.
    #[serde(rename = "asgd")]
    Asgd,
    /// DC-ASGD with a constant λ.
    #[serde(rename = "dc-asgd-c")]
    DcAsgdC,
    /// DC-ASGD with the adaptive λ_t = λ0/√(MeanSquare+ε).
    #[serde(rename = "dc-asgd-a")]
    DcAsgdA,
}

impl Algorithm {
    pub const ALL: [Algorithm; 4] = [Self::Sync, Self::Asgd, Self::DcAsgdC, Self::DcAsgdA];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sync => "sync",
            Self::Asgd => "asgd",
            Self::DcAsgdC => "dc-asgd-c",
            Self::DcAsgdA => "dc-asgd-a",
        }
    }

    /// Whether the rule needs the model each worker last pulled (w_bak(m)).
    pub fn is_delay_compensated(self) -> bool {
        matches!(self, Self::DcAsgdC | Self::DcAsgdA)
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Algorithm {
    type Err = HyperError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL.into_iter().find(|a| a.as_str() == s).ok_or_else(|| {
            HyperError(format!("unknown algorithm {s:?}: expected one of sync, asgd, dc-asgd-c, dc-asgd-a"))
        })
    }
}

/// How `sync` combines the M gradients of one round.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Combine {
    #[default]
    Mean,
    Sum,
}

impl FromStr for Combine {
    type Err = HyperError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "mean" => Ok(Self::Mean),
            "sum" => Ok(Self::Sum),
            _ => Err(HyperError(format!("unknown combine {s:?}: expected mean or sum"))),
        }
    }
}

/// Step decay after a linear warm-up: η(epoch) = η0 · factor^(milestones ≤ epoch) · w(epoch),
/// w rising linearly from 0.1 at epoch 0 to 1 at `warmup` epochs (1 throughout without one).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LrSchedule {
    pub base: f32,
    pub factor: f32,
    /// Epochs at which the rate is multiplied by `factor`, ascending.
    pub milestones: Vec<f64>,
    /// Epochs of linear warm-up (0: none). Asynchronous training applies the first M gradients,
    /// all computed on the initial model, one after another: an M-fold first step that the
    /// warm-up keeps small (docs/convergence.md: a LeNet-5 at M = 16 that collapsed without it).
    #[serde(default)]
    pub warmup: f64,
}

impl LrSchedule {
    pub fn constant(base: f32) -> Self {
        Self { base, factor: 1.0, milestones: Vec::new(), warmup: 0.0 }
    }

    pub fn at(&self, epoch: f64) -> f32 {
        let passed = self.milestones.iter().filter(|&&m| m <= epoch).count();
        let decayed = self.base * self.factor.powi(passed as i32);
        if self.warmup > 0.0 && epoch < self.warmup {
            decayed * (0.1 + 0.9 * (epoch.max(0.0) / self.warmup)) as f32
        } else {
            decayed
        }
    }
}

/// Numerical safeguards of the delay-compensated rules, on by default. Not part of the
/// TrainingJob API: `foresight-worker simulate` turns them off to measure what they do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Safeguards {
    /// Clamp each element's compensation gain λ·g² at (1 − momentum)/η.
    pub gain_clamp: bool,
    /// Divide dc-asgd-a's MeanSquare by 1 − μ^t (it starts at 0).
    pub bias_correction: bool,
}

impl Default for Safeguards {
    fn default() -> Self {
        Self { gain_clamp: true, bias_correction: true }
    }
}

/// Everything that parameterises an update rule. Validated once at start-up.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Hyper {
    pub algorithm: Algorithm,
    pub lr: LrSchedule,
    /// λ0: the constant λ of dc-asgd-c, the scale of λ_t for dc-asgd-a.
    pub lambda0: f32,
    /// μ in MeanSquare ← μ·MeanSquare + (1−μ)·g² (dc-asgd-a).
    pub mean_square_decay: f32,
    pub epsilon: f32,
    /// Coupled L2 weight decay: the gradient becomes g + wd·w.
    pub weight_decay: f32,
    /// Heavy-ball momentum; 0 disables it (and its state).
    pub momentum: f32,
    /// Nesterov's momentum instead of heavy ball: the step is d + μ·m (m ← μ·m + d) instead
    /// of m. DiLoCo's outer optimizer (Douillard et al. 2023) is this with μ = 0.9.
    #[serde(default)]
    pub nesterov: bool,
    /// Delayed Nesterov (Liu et al. 2024, for asynchronous outer steps): the momentum takes one
    /// step per `momentum_delay` updates, on their mean, while each update applies its own share
    /// at once ([`crate::optimizer::apply_delayed`]). 1: the momentum steps with every update.
    #[serde(default = "every_update")]
    pub momentum_delay: u32,
    /// Refuse gradients staler than this many versions.
    pub max_staleness: Option<u64>,
    pub combine: Combine,
    /// `sync` with backup workers: a round closes with the first M − b gradients and the late
    /// ones are dropped (Chen et al., "Revisiting Distributed Synchronous SGD", 2016).
    #[serde(default)]
    pub backup_workers: usize,
    #[serde(default)]
    pub safeguards: Safeguards,
    /// Per-tensor weight decay and learning-rate scale (`optimizer.parameterGroups`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parameter_groups: Vec<super::ParameterGroup>,
}

impl Hyper {
    /// Defaults from the paper's CIFAR-10 settings for the given rule.
    pub fn new(algorithm: Algorithm, lr: f32) -> Self {
        Self {
            algorithm,
            lr: LrSchedule::constant(lr),
            lambda0: match algorithm {
                Algorithm::DcAsgdC => 0.04,
                Algorithm::DcAsgdA => 2.0,
                _ => 0.0,
            },
            mean_square_decay: 0.95,
            epsilon: 1e-7,
            weight_decay: 0.0,
            momentum: 0.0,
            nesterov: false,
            momentum_delay: 1,
            max_staleness: None,
            combine: Combine::Mean,
            backup_workers: 0,
            safeguards: Safeguards::default(),
            parameter_groups: Vec::new(),
        }
    }

    pub fn validate(&self) -> Result<(), HyperError> {
        let lr = &self.lr;
        check(lr.base.is_finite() && lr.base > 0.0, || {
            format!("learning rate must be > 0, got {}", lr.base)
        })?;
        check(lr.factor.is_finite() && lr.factor > 0.0 && lr.factor <= 1.0, || {
            format!("learning-rate decay factor must be in (0, 1], got {}", lr.factor)
        })?;
        check(lr.milestones.iter().all(|m| m.is_finite() && *m >= 0.0), || {
            "learning-rate milestones must be finite epochs ≥ 0".to_string()
        })?;
        check(lr.milestones.windows(2).all(|w| w[0] < w[1]), || {
            "learning-rate milestones must be strictly ascending".to_string()
        })?;
        check(lr.warmup.is_finite() && lr.warmup >= 0.0, || {
            format!("learning-rate warm-up must be epochs ≥ 0, got {}", lr.warmup)
        })?;
        check(self.lambda0.is_finite() && self.lambda0 >= 0.0, || {
            format!("lambda0 must be ≥ 0, got {}", self.lambda0)
        })?;
        check(self.lambda0 == 0.0 || self.algorithm.is_delay_compensated(), || {
            format!("lambda0 only applies to dc-asgd-c and dc-asgd-a, not {}", self.algorithm)
        })?;
        check((0.0..1.0).contains(&self.mean_square_decay), || {
            format!("meanSquareDecay must be in [0, 1), got {}", self.mean_square_decay)
        })?;
        check(self.epsilon.is_finite() && self.epsilon > 0.0, || {
            format!("epsilon must be > 0, got {}", self.epsilon)
        })?;
        check(self.weight_decay.is_finite() && self.weight_decay >= 0.0, || {
            format!("weight decay must be ≥ 0, got {}", self.weight_decay)
        })?;
        check((0.0..1.0).contains(&self.momentum), || {
            format!("momentum must be in [0, 1), got {}", self.momentum)
        })?;
        check(!self.nesterov || self.momentum > 0.0, || "nesterov needs a momentum > 0".to_string())?;
        check(self.momentum_delay >= 1, || "momentum delay must be at least 1 update".to_string())?;
        check(self.momentum_delay == 1 || self.momentum > 0.0, || {
            format!("a momentum delay of {} updates needs a momentum > 0", self.momentum_delay)
        })?;
        // A sync round already averages the workers' gradients into one update.
        check(self.momentum_delay == 1 || self.algorithm != Algorithm::Sync, || {
            "a momentum delay only applies to the asynchronous rules, not sync".to_string()
        })?;
        check(self.backup_workers == 0 || self.algorithm == Algorithm::Sync, || {
            format!("backupWorkers only applies to sync, not {}", self.algorithm)
        })?;
        super::groups::validate(&self.parameter_groups)
    }
}

fn every_update() -> u32 {
    1
}

fn check(ok: bool, msg: impl FnOnce() -> String) -> Result<(), HyperError> {
    if ok { Ok(()) } else { Err(HyperError(msg())) }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct HyperError(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn algorithm_names_round_trip() {
        for a in Algorithm::ALL {
            assert_eq!(a.as_str().parse::<Algorithm>().unwrap(), a);
        }
        assert!("dcasgd".parse::<Algorithm>().is_err());
    }

    #[test]
    fn step_decay_divides_at_each_milestone() {
        let s = LrSchedule { base: 0.5, factor: 0.1, milestones: vec![80.0, 120.0], warmup: 0.0 };
        assert_eq!(s.at(0.0), 0.5);
        assert_eq!(s.at(79.9), 0.5);
        assert!((s.at(80.0) - 0.05).abs() < 1e-7);
        assert!((s.at(150.0) - 0.005).abs() < 1e-8);
    }

    #[test]
    fn warm_up_rises_linearly_from_a_tenth_then_decays_as_before() {
        let s = LrSchedule { base: 1.0, factor: 0.1, milestones: vec![10.0], warmup: 2.0 };
        assert!((s.at(0.0) - 0.1).abs() < 1e-7);
        assert!((s.at(1.0) - 0.55).abs() < 1e-6);
        assert_eq!(s.at(2.0), 1.0);
        assert_eq!(s.at(5.0), 1.0);
        assert!((s.at(10.0) - 0.1).abs() < 1e-7);
        let mut h = Hyper::new(Algorithm::Asgd, 0.1);
        h.lr.warmup = f64::NAN;
        assert!(h.validate().unwrap_err().0.contains("warm-up"));
    }

    #[test]
    fn validation_names_the_bad_field() {
        let mut h = Hyper::new(Algorithm::Asgd, 0.1);
        h.validate().unwrap();
        h.lambda0 = 0.5;
        assert!(h.validate().unwrap_err().0.contains("lambda0 only applies"));
        let mut h = Hyper::new(Algorithm::DcAsgdA, 0.1);
        h.mean_square_decay = 1.0;
        assert!(h.validate().unwrap_err().0.contains("meanSquareDecay"));
        let mut h = Hyper::new(Algorithm::DcAsgdA, 0.0);
        assert!(h.validate().unwrap_err().0.contains("learning rate"));
        h.lr.base = f32::NAN;
        assert!(h.validate().is_err());
    }

    #[test]
    fn a_momentum_delay_needs_momentum_and_an_asynchronous_rule() {
        let mut h = Hyper::new(Algorithm::Asgd, 0.5);
        h.momentum_delay = 4;
        assert!(h.validate().unwrap_err().0.contains("needs a momentum > 0"));
        h.momentum = 0.9;
        h.validate().unwrap();
        h.momentum_delay = 0;
        assert!(h.validate().unwrap_err().0.contains("at least 1"));
        let mut h = Hyper::new(Algorithm::Sync, 0.7);
        (h.momentum, h.momentum_delay) = (0.9, 4);
        assert!(h.validate().unwrap_err().0.contains("not sync"));
        // Checkpoints written before the field existed decode as "every update".
        let mut json: serde_json::Value = serde_json::to_value(Hyper::new(Algorithm::Asgd, 0.1)).unwrap();
        json.as_object_mut().unwrap().remove("momentum_delay");
        assert_eq!(serde_json::from_value::<Hyper>(json).unwrap().momentum_delay, 1);
    }
}
