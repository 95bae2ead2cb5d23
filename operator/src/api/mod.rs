//! The `TrainingJob` resource (`foresight.dev/v1alpha1`): spec, status, validation, and the
//! environment a job's parameter server and workers receive — the same for the operator's pods
//! and for `foresight run`'s local processes.

mod env;
mod validate;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration, Volume};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use env::{ps_env, worker_env};
pub use validate::{ValidationError, validate};

/// A distributed training job: a parameter server and `workers.replicas` workers training
/// `model` on `dataset` with the update rule of `optimizer`.
#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(
    group = "foresight.dev",
    version = "v1alpha1",
    kind = "TrainingJob",
    namespaced,
    shortname = "tj",
    category = "foresight",
    status = "TrainingJobStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct TrainingJobSpec {
    /// The model to train.
    pub model: ModelSpec,
    /// Where the training data is and how it is stored.
    pub dataset: DatasetSpec,
    /// Epochs, batch size, learning rate and its schedule, seed.
    #[serde(default)]
    pub training: TrainingSpec,
    /// The update rule the parameter server applies, and how often workers talk to it.
    #[serde(default)]
    pub optimizer: OptimizerSpec,
    /// The parameter server's image, resources and checkpoints.
    #[serde(default)]
    pub parameter_server: ParameterServerSpec,
    /// The workers: how many, on what, with which resources.
    pub workers: WorkersSpec,
    /// Retries, deadlines, clean-up and suspension.
    #[serde(default)]
    pub run_policy: RunPolicy,
}

/// A built-in model by `name`, or a TorchScript module by `torchscript.path`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ModelSpec {
    /// Built-in model: mlp, lenet5 or resnet20.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<BuiltinModel>,
    /// A user's PyTorch model saved with `torch.jit.script(model).save(path)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torchscript: Option<TorchScriptModel>,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum BuiltinModel {
    Mlp,
    Lenet5,
    Resnet20,
}

impl BuiltinModel {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mlp => "mlp",
            Self::Lenet5 => "lenet5",
            Self::Resnet20 => "resnet20",
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
pub struct TorchScriptModel {
    /// Path of the saved module, as the workers see it (inside the dataset volume in a cluster).
    pub path: String,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DatasetSpec {
    /// mnist (idx files), cifar10 (binary batches) or csv (pixels then label).
    pub format: DatasetFormat,
    /// Directory holding the files, as the workers see it.
    pub path: String,
    /// The volume mounted at `path` in every worker (cluster only; `foresight run` reads `path`
    /// from the local filesystem).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<Volume>,
    /// Fraction of the examples held out for evaluation when the format has no test split (csv).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holdout: Option<f64>,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DatasetFormat {
    #[default]
    Mnist,
    Cifar10,
    Csv,
}

impl DatasetFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mnist => "mnist",
            Self::Cifar10 => "cifar10",
            Self::Csv => "csv",
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TrainingSpec {
    /// Passes over each worker's shard.
    #[serde(default = "defaults::epochs")]
    pub epochs: u32,
    /// Examples per local step.
    #[serde(default = "defaults::batch_size")]
    pub batch_size: u32,
    /// η, applied by the parameter server.
    #[serde(default = "defaults::learning_rate")]
    pub learning_rate: f64,
    /// Step decay of the learning rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr_decay: Option<LrDecay>,
    /// Seed of the initial weights, the shuffling and the sharding.
    #[serde(default = "defaults::seed")]
    pub seed: u64,
}

impl Default for TrainingSpec {
    fn default() -> Self {
        Self {
            epochs: defaults::epochs(),
            batch_size: defaults::batch_size(),
            learning_rate: defaults::learning_rate(),
            lr_decay: None,
            seed: defaults::seed(),
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LrDecay {
    /// Multiply the learning rate by this at each milestone, in (0, 1].
    pub factor: f64,
    /// Epochs at which the rate decays, ascending.
    pub milestones: Vec<f64>,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum Algorithm {
    #[serde(rename = "sync")]
    Sync,
    #[serde(rename = "asgd")]
    Asgd,
    #[serde(rename = "dc-asgd-c")]
    DcAsgdC,
    #[default]
    #[serde(rename = "dc-asgd-a")]
    DcAsgdA,
}

impl Algorithm {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sync => "sync",
            Self::Asgd => "asgd",
            Self::DcAsgdC => "dc-asgd-c",
            Self::DcAsgdA => "dc-asgd-a",
        }
    }

    pub fn is_delay_compensated(self) -> bool {
        matches!(self, Self::DcAsgdC | Self::DcAsgdA)
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct OptimizerSpec {
    /// sync, asgd, dc-asgd-c or dc-asgd-a.
    #[serde(default)]
    pub algorithm: Algorithm,
    /// λ0: the constant λ of dc-asgd-c (default 0.04), the scale of λ_t for dc-asgd-a (default 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lambda0: Option<f64>,
    /// μ in MeanSquare ← μ·MeanSquare + (1−μ)·g² (dc-asgd-a), in [0, 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_square_decay: Option<f64>,
    /// Refuse gradients staler than this many model versions; 0 or absent: no bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_staleness: Option<u64>,
    /// Workers pull the model every this many steps.
    #[serde(default = "defaults::one")]
    pub pull_every: u32,
    /// Workers push their accumulated gradient every this many steps.
    #[serde(default = "defaults::one")]
    pub push_every: u32,
    /// Heavy-ball momentum on the parameter server, in [0, 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub momentum: Option<f64>,
    /// L2 weight decay, ≥ 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_decay: Option<f64>,
}

impl Default for OptimizerSpec {
    fn default() -> Self {
        Self {
            algorithm: Algorithm::default(),
            lambda0: None,
            mean_square_decay: None,
            max_staleness: None,
            pull_every: 1,
            push_every: 1,
            momentum: None,
            weight_decay: None,
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ParameterServerSpec {
    /// Image of the parameter server (default: the operator's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<CheckpointSpec>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointSpec {
    /// Seconds between periodic checkpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval_seconds: Option<u64>,
    /// Size of the PersistentVolumeClaim for checkpoints (e.g. 1Gi); absent: an emptyDir.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WorkersSpec {
    /// Number of workers, ≥ 1.
    pub replicas: u32,
    /// Image of the workers (default: the operator's worker image).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// nvidia.com/gpu per worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RunPolicy {
    /// Pod re-creations (and container restarts) allowed before the job fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_limit: Option<u32>,
    /// Fail the job after this many seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_deadline_seconds: Option<u64>,
    /// Delete the job this long after it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds_after_finished: Option<u64>,
    /// Stop the workers and keep the parameter server's checkpoint; resume by setting false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<bool>,
}

/// Observed state (written by the operator).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TrainingJobStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

mod defaults {
    pub fn epochs() -> u32 {
        10
    }
    pub fn batch_size() -> u32 {
        64
    }
    pub fn learning_rate() -> f64 {
        0.05
    }
    pub fn seed() -> u64 {
        1
    }
    pub fn one() -> u32 {
        1
    }
}

#[cfg(test)]
mod tests;
