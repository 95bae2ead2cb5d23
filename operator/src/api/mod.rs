//! The `TrainingJob` resource (`foresight.dev/v1alpha1`): spec, status, validation, and the
//! environment a job's parameter server and workers receive — the same for the operator's pods
//! and for `foresight run`'s local processes.

mod algorithm;
mod env;
mod pod;
mod transitions;
mod validate;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration, Volume};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use algorithm::Algorithm;
pub use env::{ps_env, worker_env};
pub use pod::{
    PodSettings, RESERVED_CONTAINERS, RESERVED_ENV_PREFIX, RESERVED_LABELS, RESERVED_PATHS, RESERVED_VOLUMES,
    reserved,
};
pub(crate) use validate::is_dns_name;
pub use validate::{ValidationError, validate, validate_name, validate_update};

/// The worker's exit status for a failure no retry can fix (bad configuration or data, a wrong
/// token, a model the PS does not hold): the worker Job's podFailurePolicy fails the job at once,
/// and so does `foresight run`.
pub const WORKER_EXIT_PERMANENT: i32 = 3;

/// `runPolicy.backoffLimit` when the spec leaves it out: Kubernetes' default for a Job, which
/// `foresight run` applies to its processes too.
pub const DEFAULT_BACKOFF_LIMIT: u32 = 6;

/// The CustomResourceDefinition of `TrainingJob`, as `foresight crd` prints it and
/// `crds/trainingjob.yaml` holds it.
///
/// It is kube's derived CRD with `nullable` removed everywhere: an optional field is either
/// set or absent. The API server then prunes an explicit `null` instead of storing it, so a
/// `lambda0: null` neither trips the CEL rules (`has(self.lambda0)` is false) nor defeats the
/// defaults (`training: null` becomes the default training block), exactly as serde reads it.
pub fn crd() -> CustomResourceDefinition {
    // `nullable` and null enum values come from `Option` fields, which are simply absent here.
    // `format: uint32`/`uint64` (unsigned Rust integers) are not formats Kubernetes knows: the
    // API server warns "unrecognized format" on every apply. The schema keeps the bound they
    // stand for as `minimum: 0`.
    fn clean(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(map) => {
                map.remove("nullable");
                if let Some(serde_json::Value::Array(values)) = map.get_mut("enum") {
                    values.retain(|v| !v.is_null());
                }
                if map.get("format").and_then(|f| f.as_str()).is_some_and(|f| f.starts_with("uint")) {
                    map.remove("format");
                    map.entry("minimum").or_insert(0.into());
                }
                map.values_mut().for_each(clean);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(clean),
            _ => {}
        }
    }
    let mut value = serde_json::to_value(TrainingJob::crd()).expect("the CRD serializes");
    clean(&mut value);
    let spec =
        &mut value["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    for role in ["parameterServer", "workers"] {
        pod::trim_schema(&mut spec[role]["properties"]["pod"]["properties"]);
    }
    serde_json::from_value(value).expect("the CRD deserializes")
}

/// `crd()` as YAML: the text of `crds/trainingjob.yaml`.
pub fn crd_yaml() -> String {
    serde_yaml::to_string(&crd()).expect("the CRD serializes")
}

/// The job's name becomes part of its children's: a Service `<name>-ps-<shard>` must be a DNS
/// label (a letter first), and an Indexed Job's pods get the host name `<name>-workers-<index>`,
/// at most 63 characters with an index up to 1023.
pub const MAX_NAME_LEN: usize = 50;
const NAME_RULE: &str =
    "self.metadata.name.size() <= 50 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')";
pub(crate) const NAME_MESSAGE: &str = "metadata.name must be at most 50 characters of lowercase letters, digits and '-', starting with a letter and ending with a letter or digit (the names of the job's Services and pods are made from it)";

/// A distributed training job: a parameter server and `workers.replicas` workers training
/// `model` on `dataset` with the update rule of `optimizer`.
///
/// Validation (the API server's schema and CEL rules; `api::validate` applies the same rules):
/// see each field. `model` and `optimizer.algorithm` cannot change after creation.
#[derive(CustomResource, KubeSchema, Clone, Debug, Deserialize, Serialize, PartialEq)]
#[kube(
    group = "foresight.dev",
    version = "v1alpha1",
    kind = "TrainingJob",
    namespaced,
    shortname = "tj",
    category = "foresight",
    status = "TrainingJobStatus",
    doc = "A distributed training job: a parameter server and its workers, trained with synchronous SGD, ASGD or delay-compensated ASGD (DC-ASGD).",
    printcolumn = r#"{"name":"Phase","type":"string","description":"Created, Queued, Running, Restarting, Succeeded, Failed or Suspended.","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Workers","type":"integer","description":"Requested workers (spec.workers.replicas).","jsonPath":".spec.workers.replicas"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","description":"Worker pods running and ready.","jsonPath":".status.workers.ready"}"#,
    printcolumn = r#"{"name":"Step","type":"integer","description":"Updates applied by the parameter server.","jsonPath":".status.progress.step"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","description":"Why the job is in its phase (the reason of the phase's condition).","jsonPath":".status.reason"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Algorithm","type":"string","description":"The update rule the running parameter server applies.","jsonPath":".status.parameterServer.algorithm","priority":1}"#,
    printcolumn = r#"{"name":"Staleness p99","type":"number","description":"99th percentile of gradient staleness, in model versions.","jsonPath":".status.progress.stalenessP99","priority":1}"#,
    printcolumn = r#"{"name":"Epoch","type":"integer","description":"The epoch the slowest worker is in.","jsonPath":".status.progress.epoch","priority":1}"#,
    printcolumn = r#"{"name":"Loss","type":"number","description":"Latest training loss the workers reported.","jsonPath":".status.progress.loss","priority":1}"#,
    scale(
        spec_replicas_path = ".spec.workers.replicas",
        status_replicas_path = ".status.workers.active",
        label_selector_path = ".status.workers.selector"
    ),
    validation = Rule::new(NAME_RULE).message(NAME_MESSAGE)
)]
#[x_kube(validation = Rule::new("has(self.workers.command) ? (!has(self.model) || (!has(self.model.name) && !has(self.model.torchscript))) : (has(self.model) && has(self.model.name) != has(self.model.torchscript))").message(MODEL_RULE).field_path(".model"))]
#[x_kube(validation = Rule::new("has(self.workers.command) || self.dataset.format != 'files'").message("dataset.format files needs workers.command: the built-in worker reads mnist, cifar10 or csv").field_path(".dataset.format"))]
#[x_kube(validation = Rule::new("has(self.workers.command) || !has(self.workers.args)").message("workers.args needs workers.command (the built-in worker takes its settings from the job)").field_path(".workers.args"))]
#[x_kube(validation = Rule::new("!has(self.optimizer.backupWorkers) || self.optimizer.backupWorkers < self.workers.replicas").message("optimizer.backupWorkers must be fewer than workers.replicas").field_path(".optimizer.backupWorkers"))]
#[x_kube(validation = Rule::new("!has(self.workers.minReplicas) || self.workers.minReplicas <= self.workers.replicas").message("workers.minReplicas must be at most workers.replicas").field_path(".workers.minReplicas"))]
#[x_kube(validation = Rule::new("!has(self.workers.minReplicas) || !has(self.optimizer) || !has(self.optimizer.algorithm) || self.optimizer.algorithm != 'sync'").message("workers.minReplicas needs an asynchronous algorithm: every sync round waits for every worker").field_path(".workers.minReplicas"))]
#[x_kube(validation = Rule::new("!has(self.parameterServer) || !has(self.parameterServer.replicas) || self.parameterServer.replicas <= 1 || !has(self.optimizer) || !has(self.optimizer.algorithm) || self.optimizer.algorithm != 'sync'").message(validate::SHARDED_SYNC).field_path(".optimizer.algorithm"))]
#[x_kube(validation = Rule::new("!has(self.parameterServer) || !has(self.parameterServer.replicas) || self.parameterServer.replicas <= 1 || !has(self.optimizer) || !has(self.optimizer.maxStaleness) || self.optimizer.maxStaleness == 0").message(validate::SHARDED_MAX_STALENESS).field_path(".optimizer.maxStaleness"))]
#[x_kube(validation = Rule::new(transitions::unchanged(&["training.batchSize", "training.seed"])).message("training.batchSize and training.seed cannot change after the job is created (a worker resumes at a batch of its seeded shard); create a new TrainingJob").field_path(".training"))]
#[x_kube(validation = Rule::new(transitions::unchanged(&["parameterServer.replicas"])).message("parameterServer.replicas cannot change after the job is created (the model is split by it; each shard's checkpoints hold its slice); create a new TrainingJob").field_path(".parameterServer"))]
#[x_kube(validation = Rule::new(transitions::unchanged(&["output"])).message("output cannot change after the job is created (the final model's claim is made or checked once: a resized claim that cannot be applied held the job before it could end); create a new TrainingJob").field_path(".output"))]
#[x_kube(validation = Rule::new(transitions::unchanged(&["parameterServer.checkpoint.storage"])).message("parameterServer.checkpoint.storage cannot change after the job is created (adding it restarts a parameter server whose memory holds the model, removing it drops the checkpoints); create a new TrainingJob").field_path(".parameterServer"))]
#[x_kube(validation = Rule::new("!has(self.dataset.volume) || !has(self.workers.pod) || !has(self.workers.pod.volumeMounts) || self.workers.pod.volumeMounts.all(m, m.mountPath != self.dataset.path)").message("the dataset's volume is mounted at dataset.path").field_path(".workers.pod.volumeMounts"))]
#[x_kube(validation = Rule::new(transitions::unless_suspended(&transitions::WORKER_TEMPLATE_FIELDS)).message("workers.image, command, args, gpus, gpuResource, resources, nodeSelector, tolerations, training.epochs, optimizer.pullEvery, pushEvery, localSteps and innerOptimizer change only with runPolicy.suspend: true (a running worker Job's pod template is immutable; the operator recreates the suspended workers with the new one)").field_path(".workers"))]
#[x_kube(validation = Rule::new(transitions::unless_suspended(&transitions::WORKER_POD_FIELDS)).message("workers.pod labels, annotations, nodeSelector, tolerations, priorityClassName, serviceAccountName, automountServiceAccountToken, imagePullSecrets and env change only with runPolicy.suspend: true (a running worker Job's pod template is immutable; the operator recreates the suspended workers with the new one)").field_path(".workers.pod"))]
#[serde(rename_all = "camelCase")]
pub struct TrainingJobSpec {
    /// The model to train: a built-in `name` or a `torchscript` module, exactly one; none when
    /// the workers run the user's own program (`workers.command`). Cannot change after the job
    /// is created.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self == oldSelf").message("model cannot change after the job is created (the parameter server's weights and checkpoints belong to it); create a new TrainingJob"))]
    pub model: ModelSpec,
    /// Where the training data is and how it is stored. Cannot change after the job is
    /// created.
    #[x_kube(validation = Rule::new("self == oldSelf").message("dataset cannot change after the job is created (a worker resumes at a batch of its shard); create a new TrainingJob"))]
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
    /// Where the final model is kept after the job (and its parameter server) are gone.
    /// Absent: the final model is written next to the checkpoints, and goes with them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<OutputSpec>,
}

/// A claim that outlives the job, for the final model: an existing one (`claimName`, never
/// created or deleted by the operator) or one the operator creates for the job and keeps
/// (`storage`: a claim named `<job>-output` with no owner, so deleting the job leaves it).
#[derive(Clone, Debug, Default, Deserialize, Serialize, KubeSchema, PartialEq)]
#[x_kube(validation = Rule::new("has(self.claimName) != has(self.storage)").message("set exactly one of output.claimName (an existing claim) and output.storage (a claim the job creates and keeps)"))]
#[serde(rename_all = "camelCase")]
pub struct OutputSpec {
    /// An existing PersistentVolumeClaim in the job's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$')").message("must be a PersistentVolumeClaim name (lowercase letters, digits, '-' and '.')"))]
    pub claim_name: Option<String>,
    /// Size of a claim the job creates (`<job>-output`) and keeps, a quantity > 0 (e.g. 1Gi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("isQuantity(self) && quantity(self).isGreaterThan(quantity('0'))").message("must be a quantity > 0, e.g. 1Gi"))]
    pub storage: Option<String>,
    /// Directory inside the claim (default: the job's name), relative, without `..`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 200))]
    #[x_kube(validation = Rule::new("!self.startsWith('/') && !self.matches('(^|/)[.][.](/|$)')").message("must be a relative path without '..'"))]
    pub path: Option<String>,
}

/// What `model` must hold, whether the workers run the built-in worker or `workers.command`.
pub const MODEL_RULE: &str = "set exactly one of model.name (mlp, lenet5, resnet20) and model.torchscript.path, or neither when workers.command runs your own program (it trains its own model)";

/// A built-in model by `name`, or a TorchScript module by `torchscript.path`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, KubeSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ModelSpec {
    /// Built-in model: mlp, lenet5 or resnet20.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<BuiltinModel>,
    /// A user's PyTorch model saved with `torch.jit.script(model).save(path)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torchscript: Option<TorchScriptModel>,
}

/// Built-in model: mlp, lenet5 or resnet20.
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

/// A TorchScript module saved by `torch.jit.script(model).save(path)`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, KubeSchema, PartialEq)]
pub struct TorchScriptModel {
    /// Path of the saved module, as the workers see it (inside the dataset volume in a cluster).
    /// Must not be empty.
    #[x_kube(validation = Rule::new("self.trim() != ''").message("must not be empty"))]
    pub path: String,
}

/// The training data: its format, where it is, and the volume that holds it in a cluster.
#[derive(Clone, Debug, Default, Deserialize, Serialize, KubeSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DatasetSpec {
    /// mnist (idx files), cifar10 (binary batches), csv (pixels then label), or files (read by the
    /// workers' own program as it likes; only with `workers.command`).
    pub format: DatasetFormat,
    /// Directory holding the files, as the workers see it. Must not be empty; at most 4096 bytes.
    #[schemars(length(max = 4096))]
    #[x_kube(validation = Rule::new("self.trim() != ''").message("must not be empty"))]
    pub path: String,
    /// The volume mounted at `path` in every worker (cluster only; `foresight run` reads `path`
    /// from the local filesystem).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<Volume>,
    /// Fraction of the examples held out for evaluation when the format has no test split (csv),
    /// in (0, 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self > 0.0 && self < 1.0").message("must be in (0, 1)"))]
    pub holdout: Option<f64>,
}

/// mnist (idx files), cifar10 (binary batches), csv (pixels then label), or files (read by the
/// workers' own program, `workers.command`, as it likes).
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DatasetFormat {
    #[default]
    Mnist,
    Cifar10,
    Csv,
    Files,
}

impl DatasetFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mnist => "mnist",
            Self::Cifar10 => "cifar10",
            Self::Csv => "csv",
            Self::Files => "files",
        }
    }
}

/// How long and how fast to train.
#[derive(Clone, Debug, Deserialize, Serialize, KubeSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TrainingSpec {
    /// Passes over each worker's shard, ≥ 1.
    #[serde(default = "defaults::epochs")]
    #[schemars(range(min = 1))]
    pub epochs: u32,
    /// Examples per local step, ≥ 1.
    #[serde(default = "defaults::batch_size")]
    #[schemars(range(min = 1))]
    pub batch_size: u32,
    /// η, applied by the parameter server, > 0.
    #[serde(default = "defaults::learning_rate")]
    #[x_kube(validation = Rule::new("self > 0.0").message("must be > 0"))]
    pub learning_rate: f64,
    /// Step decay of the learning rate: multiply it by `factor` at each milestone epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr_decay: Option<LrDecay>,
    /// Epochs of linear learning-rate warm-up, ≥ 0: the rate rises from a tenth of η at epoch 0
    /// to η. With M asynchronous workers the first M gradients are all computed on the initial
    /// model; a warm-up keeps that M-fold first step small.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0.0").message("must be ≥ 0"))]
    pub lr_warmup_epochs: Option<f64>,
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
            lr_warmup_epochs: None,
            seed: defaults::seed(),
        }
    }
}

/// Step decay of the learning rate.
#[derive(Clone, Debug, Deserialize, Serialize, KubeSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LrDecay {
    /// Multiply the learning rate by this at each milestone, in (0, 1].
    #[x_kube(validation = Rule::new("self > 0.0 && self <= 1.0").message("must be in (0, 1]"))]
    pub factor: f64,
    /// Epochs at which the rate decays: at most 64, each ≥ 0, strictly ascending.
    #[schemars(length(max = 64))]
    #[x_kube(validation = Rule::new("self.all(m, m >= 0.0) && self.isSorted() && self.all(m, self.indexOf(m) == self.lastIndexOf(m))").message("must be epochs ≥ 0 in strictly ascending order"))]
    pub milestones: Vec<f64>,
}

/// The optimizer that trains a worker's local steps (`optimizer.localSteps`).
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum InnerAlgorithm {
    #[serde(rename = "sgd")]
    Sgd,
    #[default]
    #[serde(rename = "adamw")]
    AdamW,
}

impl InnerAlgorithm {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sgd => "sgd",
            Self::AdamW => "adamw",
        }
    }
}

/// The type workers send gradients (or, with local steps, pseudo-gradients) in.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum GradientDtype {
    #[default]
    F32,
    Bf16,
    Int8,
}

impl GradientDtype {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
            Self::Int8 => "int8",
        }
    }
}

/// The type workers pull the model in.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum PullDtype {
    #[default]
    F32,
    Bf16,
    Int8,
}

impl PullDtype {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
            Self::Int8 => "int8",
        }
    }
}

/// The built-in worker's inner optimizer for local steps, and the Python package's when the
/// script passes none of its own (`Optimizer(model, inner=...)` overrides it).
#[derive(Clone, Debug, Deserialize, Serialize, KubeSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct InnerOptimizerSpec {
    /// sgd or adamw (the default, as DiLoCo).
    #[serde(default)]
    pub algorithm: InnerAlgorithm,
    /// > 0 (default 0.001).
    #[serde(default = "defaults::inner_learning_rate")]
    #[x_kube(validation = Rule::new("self > 0.0").message("must be > 0"))]
    pub learning_rate: f64,
    /// Decoupled weight decay (adamw) or L2 (sgd), ≥ 0 (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0.0").message("must be ≥ 0"))]
    pub weight_decay: Option<f64>,
}

/// Tensors chosen by name, and the weight decay and learning rate the parameter server updates
/// them with.
#[derive(Clone, Debug, Deserialize, Serialize, KubeSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ParameterGroupSpec {
    /// Regular expressions (Rust's `regex` syntax: as Python's `re` without look-around or
    /// back-references), each searched anywhere in a tensor's name as `re.search` does (the
    /// names of the model's `named_parameters()`): `bias$` matches `fc.bias`. 1 to 16, each 1
    /// to 256 characters.
    #[schemars(length(min = 1, max = 16))]
    #[x_kube(validation = Rule::new("self.all(p, size(p) >= 1 && size(p) <= 256)").message("each pattern is 1 to 256 characters"))]
    pub names: Vec<String>,
    /// The group's weight decay in place of optimizer.weightDecay, ≥ 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0.0").message("must be ≥ 0"))]
    pub weight_decay: Option<f64>,
    /// The group's learning rate is training.learningRate (with its schedule) times this, > 0
    /// (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self > 0.0").message("must be > 0"))]
    pub learning_rate_scale: Option<f64>,
}

/// The parameter server chooses each worker's local steps between exchanges, within bounds:
/// every round lasts long enough that the slowest worker's exchange (a push and a pull) takes
/// at most `communicationFraction` of it, and each worker fills the round with as many steps
/// as its own speed allows (a worker 3× slower trains a third of the steps).
#[derive(Clone, Debug, Deserialize, Serialize, KubeSchema, PartialEq)]
#[x_kube(validation = Rule::new("self.min <= self.max").message("min must not exceed max").field_path(".min"))]
#[serde(rename_all = "camelCase")]
pub struct AdaptiveLocalStepsSpec {
    /// The fewest local steps a worker is told to train, ≥ 2 (default 2).
    #[serde(default = "defaults::two")]
    #[schemars(range(min = 2))]
    pub min: u32,
    /// The most, ≥ localSteps (which is where every worker starts).
    #[schemars(range(min = 2))]
    pub max: u32,
    /// The share of a worker's time its exchanges may take, in (0, 1] (default 0.1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self > 0.0 && self <= 1.0").message("must be in (0, 1]"))]
    pub communication_fraction: Option<f64>,
}

/// The update rule the parameter server applies, and how often workers talk to it.
#[derive(Clone, Debug, Deserialize, Serialize, KubeSchema, PartialEq)]
#[x_kube(validation = Rule::new("!has(self.adaptiveLocalSteps) || (has(self.localSteps) && self.adaptiveLocalSteps.min <= self.localSteps && self.localSteps <= self.adaptiveLocalSteps.max)").message("adaptiveLocalSteps needs localSteps (where workers start) within [min, max]").field_path(".adaptiveLocalSteps"))]
#[x_kube(validation = Rule::new(format!("!has(self.lambda0) || {}", algorithm::cel_in(&["dc-asgd-c", "dc-asgd-a"]))).message("lambda0 only applies to dc-asgd-c and dc-asgd-a (with localSteps above 1 the default algorithm is asgd)").field_path(".lambda0"))]
#[x_kube(validation = Rule::new(format!("!has(self.meanSquareDecay) || {}", algorithm::cel_in(&["dc-asgd-a"]))).message("meanSquareDecay only applies to dc-asgd-a (with localSteps above 1 the default algorithm is asgd)").field_path(".meanSquareDecay"))]
#[x_kube(validation = Rule::new("!has(self.backupWorkers) || (has(self.algorithm) && self.algorithm == 'sync')").message("backupWorkers only applies to sync").field_path(".backupWorkers"))]
#[x_kube(validation = Rule::new("!has(self.syncRoundTimeoutSeconds) || (has(self.algorithm) && self.algorithm == 'sync')").message("syncRoundTimeoutSeconds only applies to sync").field_path(".syncRoundTimeoutSeconds"))]
#[x_kube(validation = Rule::new("self.pushEvery < 1 || self.pullEvery % self.pushEvery == 0").message("pullEvery must be a multiple of pushEvery: the steps accumulated into one push must all be computed on the model pulled before them").field_path(".pullEvery"))]
#[x_kube(validation = Rule::new("!has(self.algorithm) || self.algorithm != 'sync' || self.pullEvery == self.pushEvery").message("under sync pullEvery must equal pushEvery: each round's model is pulled before the next gradient is computed").field_path(".pullEvery"))]
#[x_kube(validation = Rule::new("!has(self.nesterov) || !self.nesterov || (has(self.momentum) && self.momentum > 0.0)").message("nesterov needs a momentum > 0").field_path(".nesterov"))]
#[x_kube(validation = Rule::new("!has(self.momentumDelay) || self.momentumDelay == 1 || (has(self.momentum) && self.momentum > 0.0)").message("momentumDelay needs a momentum > 0").field_path(".momentumDelay"))]
#[x_kube(validation = Rule::new("!has(self.momentumDelay) || self.momentumDelay == 1 || !has(self.algorithm) || self.algorithm != 'sync'").message("momentumDelay only applies to the asynchronous rules: a sync round already averages the workers' updates").field_path(".momentumDelay"))]
#[x_kube(validation = Rule::new("!has(self.innerOptimizer) || (has(self.localSteps) && self.localSteps > 1)").message("innerOptimizer trains local steps: it needs localSteps above 1").field_path(".innerOptimizer"))]
#[x_kube(validation = Rule::new("!has(self.localSteps) || self.localSteps == 1 || !has(self.algorithm) || self.algorithm != 'dc-asgd-c'").message(validate::LOCAL_STEPS_DC_ASGD_C).field_path(".algorithm"))]
#[x_kube(validation = Rule::new(format!("{} == {}", algorithm::cel_effective("self"), algorithm::cel_effective("oldSelf"))).message(validate::ALGORITHM_FROZEN).field_path(".algorithm"))]
#[x_kube(validation = Rule::new("!has(self.localSteps) || self.localSteps == 1 || (self.pullEvery == 1 && self.pushEvery == 1)").message("localSteps replaces pullEvery and pushEvery (a worker pulls and pushes once per localSteps steps): leave them at 1").field_path(".localSteps"))]
#[serde(rename_all = "camelCase")]
pub struct OptimizerSpec {
    /// sync (synchronous SGD), asgd, dc-asgd-c (DC-ASGD, constant λ) or dc-asgd-a (DC-ASGD,
    /// adaptive λ_t). Absent: dc-asgd-a, or asgd with localSteps above 1 (the compensation
    /// buys nothing measurable on pseudo-gradients, docs/convergence.md; sync is DiLoCo's
    /// outer step when the workers are alike). dc-asgd-c is refused with localSteps. The rule
    /// cannot change after the job is created, whether named or resolved from localSteps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<Algorithm>,
    /// λ0, ≥ 0, dc-asgd-c and dc-asgd-a only: the constant λ of dc-asgd-c (default 0.04), the
    /// scale of λ_t for dc-asgd-a (default 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0.0").message("must be ≥ 0"))]
    pub lambda0: Option<f64>,
    /// μ in MeanSquare ← μ·MeanSquare + (1−μ)·g², in [0, 1), dc-asgd-a only (default 0.95).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0.0 && self < 1.0").message("must be in [0, 1)"))]
    pub mean_square_decay: Option<f64>,
    /// Refuse gradients staler than this many model versions; 0 or absent: no bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_staleness: Option<u64>,
    /// Workers pull the model every this many steps, ≥ 1.
    #[serde(default = "defaults::one")]
    #[schemars(range(min = 1))]
    pub pull_every: u32,
    /// Workers push their accumulated gradient every this many steps, ≥ 1.
    #[serde(default = "defaults::one")]
    #[schemars(range(min = 1))]
    pub push_every: u32,
    /// Heavy-ball momentum on the parameter server, in [0, 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0.0 && self < 1.0").message("must be in [0, 1)"))]
    pub momentum: Option<f64>,
    /// Nesterov momentum instead of heavy ball (needs momentum > 0). With localSteps, DiLoCo's
    /// outer optimizer is momentum 0.9 with nesterov and a learningRate of 0.7.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nesterov: Option<bool>,
    /// Delayed Nesterov for an asynchronous outer step (Liu et al. 2024): the momentum steps
    /// once per this many updates, on their mean, while each update applies its own share at
    /// once, so stale pseudo-gradients are not compounded through the momentum. The number of
    /// workers is the usual choice; 1 or absent: the momentum steps with every update. Needs
    /// momentum > 0; not sync.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub momentum_delay: Option<u32>,
    /// Low-communication training (DiLoCo): each worker trains this many steps with its own
    /// inner optimizer between exchanges, then pushes its pseudo-gradient θ_pulled − θ_local
    /// once; the parameter server applies the rule to it as the outer step (so
    /// training.learningRate is the outer learning rate). 1 or absent: every step's gradient is
    /// pushed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub local_steps: Option<u32>,
    /// Let the parameter server choose each worker's local steps from its measured pace,
    /// starting at localSteps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive_local_steps: Option<AdaptiveLocalStepsSpec>,
    /// The optimizer of the local steps (default: adamw, learning rate 0.001); localSteps above
    /// 1 only. A Python worker that passes its own (`inner=`) uses that instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inner_optimizer: Option<InnerOptimizerSpec>,
    /// The type workers send gradients in (with localSteps, their pseudo-gradients): f32 (the
    /// default), bf16 (half the bytes) or int8 (a quarter: a scale per 1,024 values, each push
    /// carrying the rounding error of the ones before). The parameter server keeps float32.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gradient_dtype: Option<GradientDtype>,
    /// The type workers pull the model in: f32 (the default), bf16 (half the bytes of every
    /// pull; workers compute on the model rounded to bf16, as mixed-precision training computes
    /// on a bf16 copy of float32 master weights) or int8 (a quarter: the difference from each
    /// worker's copy, which the parameter server keeps, one model-sized copy per worker; the
    /// rounding of one pull goes into the next). The parameter server keeps float32.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_dtype: Option<PullDtype>,
    /// L2 weight decay, ≥ 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0.0").message("must be ≥ 0"))]
    pub weight_decay: Option<f64>,
    /// Per-tensor weight decay and learning rate, as a PyTorch optimizer's param groups: the
    /// first group one of whose `names` patterns matches a tensor's name gives its rates (at
    /// most 16 groups). The usual one keeps weight decay off biases and norms:
    /// `[{names: ["bias$", "norm"], weightDecay: 0}]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub parameter_groups: Option<Vec<ParameterGroupSpec>>,
    /// sync only: each round closes with the first replicas − backupWorkers gradients and the
    /// late ones are dropped (backup workers, Chen et al. 2016); fewer than the replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_workers: Option<u32>,
    /// sync only: a round that has had no new gradient for this many seconds closes with the
    /// ones it has, so that a dead or stuck worker never stops the job (default 120), ≥ 1. A
    /// round closed with fewer than replicas − backupWorkers gradients steps that much less.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub sync_round_timeout_seconds: Option<u32>,
}

impl OptimizerSpec {
    /// The rule the parameter server applies: the one named, or the default for `localSteps`.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm.unwrap_or_else(|| Algorithm::default_for(self.local_steps))
    }
}

impl Default for OptimizerSpec {
    fn default() -> Self {
        Self {
            algorithm: None,
            lambda0: None,
            mean_square_decay: None,
            max_staleness: None,
            pull_every: 1,
            push_every: 1,
            momentum: None,
            nesterov: None,
            momentum_delay: None,
            local_steps: None,
            adaptive_local_steps: None,
            inner_optimizer: None,
            gradient_dtype: None,
            pull_dtype: None,
            backup_workers: None,
            sync_round_timeout_seconds: None,
            weight_decay: None,
            parameter_groups: None,
        }
    }
}

/// The parameter server's pod.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ParameterServerSpec {
    /// Parameter-server shards, 1 to 64 (default 1): the model is split over this many PS
    /// processes by contiguous ranges balanced to one parameter (docs/protocol.md, "A sharded
    /// parameter server"), each with its own checkpoints. Fixed for the life of the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 64))]
    pub replicas: Option<u32>,
    /// Image of the parameter server (default: the operator's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// CPU and memory requests and limits of the parameter server's container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Periodic checkpoints of the model and the optimizer state (absent: only the final one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<CheckpointSpec>,
    /// What the parameter server's pod gets besides what the operator sets: placement
    /// (nodeSelector, tolerations, affinity), priority, identity, variables, volumes, labels
    /// (cluster only; `foresight run` ignores it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodSettings>,
    /// A PodDisruptionBudget that lets no eviction (a node drain, the cluster autoscaler) take a
    /// ready parameter server while the job runs (maxUnavailable 0 over every shard's pod; an
    /// unready one may still be evicted). A drain then waits for the job to end. Off by default:
    /// the job survives the eviction anyway (a checkpoint, or the workers' copies), at the cost
    /// of a restore. Cluster only; it may change while the job runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disruption_budget: Option<bool>,
}

impl ParameterServerSpec {
    /// The number of PS shards (processes the model is split over).
    pub fn shards(&self) -> usize {
        self.replicas.unwrap_or(1) as usize
    }
}

/// Periodic checkpoints of the parameter server.
#[derive(Clone, Debug, Default, Deserialize, Serialize, KubeSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointSpec {
    /// Seconds between periodic checkpoints, ≥ 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub interval_seconds: Option<u64>,
    /// Size of the PersistentVolumeClaim for checkpoints and the final model, a quantity > 0
    /// (e.g. 1Gi); absent: an emptyDir, lost with the parameter server's pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("isQuantity(self) && quantity(self).isGreaterThan(quantity('0'))").message("must be a quantity > 0, e.g. 1Gi"))]
    pub storage: Option<String>,
}

/// The workers' pods.
#[derive(Clone, Debug, Default, Deserialize, Serialize, KubeSchema, PartialEq)]
#[x_kube(validation = Rule::new("!has(self.nodeSelector) || !has(self.pod) || !has(self.pod.nodeSelector)").message("set workers.nodeSelector or workers.pod.nodeSelector, not both").field_path(".nodeSelector"))]
#[x_kube(validation = Rule::new("!has(self.tolerations) || !has(self.pod) || !has(self.pod.tolerations)").message("set workers.tolerations or workers.pod.tolerations, not both").field_path(".tolerations"))]
#[serde(rename_all = "camelCase")]
pub struct WorkersSpec {
    /// Number of workers, 1 to 1024. It can change while the job runs: the worker Job's
    /// completions and parallelism follow (scale-down removes the highest indices) and the
    /// parameter server is told the new count without a restart.
    #[schemars(range(min = 1, max = 1024))]
    pub replicas: u32,
    /// With an asynchronous algorithm, the job is Running once this many workers are ready
    /// (the others join when they come); absent: all of them. At most `replicas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1024))]
    pub min_replicas: Option<u32>,
    /// Image of the workers (default: the operator's worker image).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The user's own training program instead of the built-in worker, e.g. `[python,
    /// /scripts/train.py]` with the `foresight` Python package (a PyTorch loop with
    /// `foresight.torch.Optimizer`): it gets the same environment (`FORESIGHT_*`) and trains
    /// its own model, so `model` stays empty. `foresight run` runs it as a local process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub command: Option<Vec<String>>,
    /// Arguments after `command`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub args: Option<Vec<String>>,
    /// GPUs per worker, as `gpuResource` (absent or 0: CPU only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u32>,
    /// The extended resource `gpus` counts (default nvidia.com/gpu; e.g. amd.com/gpu,
    /// gpu.intel.com/i915).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$') && !self.startsWith('kubernetes.io/')").message("must be an extended resource name with a domain, e.g. nvidia.com/gpu"))]
    pub gpu_resource: Option<String>,
    /// CPU and memory requests and limits of each worker's container (GPUs: use `gpus`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Node labels a worker's node must have.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Taints the workers tolerate (e.g. those of GPU nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,
    /// What each worker's pod gets besides what the operator sets: placement (nodeSelector,
    /// tolerations: here or above, not both; affinity), priority, identity, variables, volumes,
    /// labels (cluster only; `foresight run` ignores it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodSettings>,
}

/// Retries, deadlines, clean-up and suspension.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RunPolicy {
    /// Failed worker pods allowed before the job fails (default 6), and restarts of a parameter
    /// server's container (a crash or OOM loop): one more than this fails the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_limit: Option<u32>,
    /// Fail the job (reason DeadlineExceeded) once it has been active this many seconds, ≥ 1:
    /// counted from its start or its latest resumption (after a suspension or Kueue's
    /// admission), waiting for the parameter server and writing the final model included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
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
    /// Created, Queued, Running, Restarting, Succeeded, Failed or Suspended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// Why the job is in its phase: the reason of the phase's condition (Completed,
    /// BackoffLimitExceeded, Unschedulable, WorkersRunning, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The latest observations of the job's state, one per type (Created, Queued, Running,
    /// Restarting, Succeeded and Complete, Failed and Stalled, Suspended, Reconciling, and
    /// SpecApplied, ParameterServerRestarted, PodsFailing, ReconcileFailed), with reason,
    /// message and lastTransitionTime. `Complete` is `Succeeded` under the name batch Jobs use,
    /// so that `kubectl wait --for=condition=Complete` works as it does for a Job; `Stalled`
    /// (failed) and `Reconciling` (True while Created, Queued or Restarting) are kstatus's, which
    /// Flux and `kstatus`-based tools read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Worker pods by state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers: Option<WorkersStatus>,
    /// The parameter server's state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameter_server: Option<ParameterServerStatus>,
    /// Training progress, read from the parameter server while the job runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
    /// Where the final model was written, once it was, when that place is a claim (an emptyDir
    /// goes with the parameter server: the Succeeded condition says so instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_model: Option<FinalModelStatus>,
    /// When the operator started the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the job succeeded or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// The operator's default images when it first handled the job, used for each role whose
    /// spec names no image: an operator upgraded with new defaults never restarts the pods of a
    /// job it already runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_images: Option<DefaultImages>,
    /// The LocalQueue the operator put the job in because it had no `kueue.x-k8s.io/queue-name`
    /// label (its namespace's LocalQueue `default`, as Kueue does for its own jobs). A replace
    /// of the job without the label (`kubectl replace`, a GitOps tool's replace) may drop the
    /// label the author never wrote: the operator puts it back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defaulted_queue: Option<String>,
}

/// Images for the roles whose spec names none.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DefaultImages {
    /// The parameter server's.
    pub parameter_server: String,
    /// The workers'.
    pub worker: String,
    /// Whether the workers reach the PS over TLS with certificates the operator issued (the
    /// operator's `--ps-tls` when the job started); absent for a job started before it, which
    /// keeps h2c.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameter_server_tls: Option<bool>,
    /// The end of the names of the job's token and TLS Secrets (`<job>-token-<suffix>`,
    /// `<job>-ps-tls-<suffix>`), derived from the operator's token key and the job's UID: nobody
    /// without the key can make a Secret of that name before the job's first reconcile. Absent
    /// for a job started before it, whose Secrets end with the first 8 characters of its UID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_suffix: Option<String>,
}

/// The phase of a TrainingJob.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum Phase {
    Created,
    /// Waiting for Kueue to admit it (labelled `kueue.x-k8s.io/queue-name`).
    Queued,
    Running,
    Restarting,
    Succeeded,
    Failed,
    Suspended,
}

/// Worker pods by state.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WorkersStatus {
    /// Workers the spec asks for now (`workers.replicas`).
    #[serde(default)]
    pub desired: u32,
    /// Worker pods running and ready.
    #[serde(default)]
    pub ready: u32,
    /// Worker pods pending or running.
    #[serde(default)]
    pub active: u32,
    /// Workers that finished their epochs.
    #[serde(default)]
    pub succeeded: u32,
    /// Worker pods that failed.
    #[serde(default)]
    pub failed: u32,
    /// Worker pods that failed in this job's earlier worker Jobs (recreated to apply a template
    /// change): they count against `runPolicy.backoffLimit` too.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failed_earlier: u32,
    /// The label selector of the worker pods, for the scale subresource (`kubectl scale tj`,
    /// the HorizontalPodAutoscaler, KEDA).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub selector: String,
}

/// The parameter server's state.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ParameterServerStatus {
    /// Whether the parameter server's pod is ready.
    #[serde(default)]
    pub ready: bool,
    /// How many times the parameter server was seen to start again while the job ran (a
    /// crashed container or a replaced pod): each is also a `ParameterServerRestarted`
    /// condition and Warning event saying what the new process started from.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restarts: u32,
    /// The running parameter server process (random, new in every process, from its
    /// `/v1/status`): a different value means it restarted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incarnation: Option<String>,
    /// When the running parameter server process started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// The update rule the running parameter server applies (`optimizer.algorithm`, or the
    /// default for `optimizer.localSteps` when the spec names none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<String>,
    /// A sharded parameter server's shards (`parameterServer.replicas`; absent when it is one
    /// process). `ready` is true when every shard's pod is; `restarts` and `incarnation` are
    /// shard 0's, the shard the operator talks to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards: Option<u32>,
    /// How many of the shards have a ready pod (absent when unsharded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_shards: Option<u32>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Where the final model was written (only once it was).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FinalModelStatus {
    /// Updates the final model contains.
    pub version: u64,
    /// The claim holding it; absent: the parameter server's emptyDir, deleted with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_name: Option<String>,
    /// The file, relative to the claim's root.
    pub path: String,
    /// Whether the claim outlives the job (spec.output) or goes with it (checkpoint storage).
    pub kept: bool,
}

/// Training progress, read from the parameter server's `/v1/status`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    /// Updates the parameter server applied (its model version).
    #[serde(default)]
    pub step: u64,
    /// The epoch the slowest worker is in.
    #[serde(default)]
    pub epoch: u32,
    /// Latest training loss reported by the workers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<f64>,
    /// Latest held-out accuracy, in [0, 1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<f64>,
    /// Median staleness of the applied gradients, in model versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staleness_p50: Option<f64>,
    /// 99th percentile staleness of the applied gradients, in model versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staleness_p99: Option<f64>,
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
    pub fn two() -> u32 {
        2
    }
    pub fn inner_learning_rate() -> f64 {
        0.001
    }
}

#[cfg(test)]
mod tests;
