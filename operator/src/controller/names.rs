//! The names that are the job's contract with the cluster: its children's names and labels,
//! annotations, ports and paths, the operator's field manager. A leaf: every other part of the
//! controller may use it, and it uses none of them.

use std::collections::BTreeMap;

/// The field manager of everything the operator applies.
pub const MANAGER: &str = "foresight-operator";

/// Selects the objects this operator created.
pub(crate) const MANAGED: &str = "app.kubernetes.io/managed-by=foresight-operator";

/// The parameter server's port: its API and `/metrics`.
pub const PS_PORT: i32 = 8080;
/// How long a PS may take to start (restore its checkpoint) before the kubelet restarts it.
pub const PS_STARTUP_SECONDS: i32 = 3600;
/// The workers' `/metrics` port.
pub const WORKER_METRICS_PORT: i32 = 9090;
/// Key of the workers' token in the job's Secret.
pub const TOKEN_KEY: &str = "token";
/// Key of the control token (finalize, rescale) in the job's Secret: only the PS's pod reads it.
pub const CONTROL_TOKEN_KEY: &str = "control-token";
/// Where the parameter server keeps its checkpoints and writes the final model.
pub const CHECKPOINT_DIR: &str = "/checkpoints";
/// The PS's start-up worker count (see [`Owner::ps_deployment`]).
pub const PS_WORKERS_ENV: &str = "FORESIGHT_WORKERS";

/// Where `spec.output`'s claim is mounted in the PS pod.
pub const OUTPUT_DIR: &str = "/output";

/// The resource `workers.gpus` counts when the job names no `gpuResource`.
pub const DEFAULT_GPU_RESOURCE: &str = "nvidia.com/gpu";

/// Label keys shared with the Helm chart's PodMonitor and the dashboards.
pub const LABEL_JOB: &str = "foresight.dev/job";
pub const LABEL_COMPONENT: &str = "app.kubernetes.io/component";
pub const COMPONENT_PS: &str = "parameter-server";
pub const COMPONENT_WORKER: &str = "worker";

/// Annotation of the PS Deployment: a digest of the pod template the operator built. A change
/// of it means the PS would restart with new settings (see `reconcile`).
pub const PS_TEMPLATE_HASH: &str = "foresight.dev/ps-template-hash";

/// Annotation of the worker Job: a digest of the pod template the operator built it with. A
/// started Job's template never changes, so a new digest is a change that waits for a
/// suspension (see [`worker_job_update`]).
pub const WORKER_TEMPLATE_HASH: &str = "foresight.dev/worker-template-hash";

/// Annotation of every child the operator applies: a digest of what it wrote, so that a new
/// operator process leaves a child that already holds its intent alone (see `write::applied`).
pub const INTENT: &str = "foresight.dev/intent";

/// A short digest (16 hex digits of SHA-256) for an annotation.
pub fn digest(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes).as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Names of a job's children. The token Secret's ends with `suffix`: the operator may create
/// Secrets but not read them, so it cannot tell a Secret of its own from one that was there
/// before the job; a name nobody without the operator's key can know settles it
/// ([`crate::controller::desired::token::TokenKey::secret_suffix`]).
pub fn secret_name(job: &str, suffix: &str) -> String {
    format!("{job}-token-{suffix}")
}
/// The job's TLS Secret (its CA, the PS's certificate and key), named like the token Secret.
pub fn tls_secret_name(job: &str, suffix: &str) -> String {
    format!("{job}-ps-tls-{suffix}")
}
pub fn ps_name(job: &str) -> String {
    format!("{job}-ps")
}
pub fn pvc_name(job: &str) -> String {
    format!("{job}-ps-checkpoints")
}
/// Shard `i`'s Deployment and Service. Shard 0 keeps the unsharded names, so that an unsharded
/// job's objects, and the operator's way to its PS (`--ps-url`), are the same with or without
/// shards: shard 0 is the one the operator talks to (it passes scaling and finalize on).
pub fn ps_shard_name(job: &str, shard: usize) -> String {
    match shard {
        0 => ps_name(job),
        i => format!("{job}-ps-{i}"),
    }
}
/// Shard `i`'s checkpoint claim (shard 0's is the unsharded one).
pub fn ps_shard_pvc_name(job: &str, shard: usize) -> String {
    match shard {
        0 => pvc_name(job),
        i => format!("{job}-ps-{i}-checkpoints"),
    }
}
/// The claim a job with `output.storage` creates and keeps.
pub fn output_pvc_name(job: &str) -> String {
    format!("{job}-output")
}

/// Where a job's final model goes, as the PS pod sees it and as the status reports it.
#[derive(Clone, Debug, PartialEq)]
pub enum ModelPlace {
    /// `spec.output`: a claim that outlives the job, mounted at [`OUTPUT_DIR`].
    Output { claim: String, dir: String },
    /// Next to the checkpoints on the job's own claim, deleted with the job.
    CheckpointClaim { claim: String },
    /// The PS pod's emptyDir, deleted with the PS.
    EmptyDir,
}

impl ModelPlace {
    /// The directory the PS writes `model-final.safetensors` into.
    pub fn ps_dir(&self) -> String {
        match self {
            Self::Output { dir, .. } => format!("{OUTPUT_DIR}/{dir}"),
            _ => CHECKPOINT_DIR.to_string(),
        }
    }

    /// The claim and the file's path inside it, for a file the PS wrote at `ps_path`.
    pub fn locate(&self, ps_path: &str) -> Option<(String, String)> {
        let (claim, mount) = match self {
            Self::Output { claim, .. } => (claim, OUTPUT_DIR),
            Self::CheckpointClaim { claim } => (claim, CHECKPOINT_DIR),
            Self::EmptyDir => return None,
        };
        let relative = ps_path.strip_prefix(mount)?.trim_start_matches('/');
        Some((claim.clone(), relative.to_string()))
    }
}

pub fn workers_name(job: &str) -> String {
    format!("{job}-workers")
}

/// The URL shard `shard` of the parameter server is reached at: its Service's cluster DNS name,
/// `https://` when it serves TLS.
pub fn ps_cluster_url(job: &str, namespace: &str, shard: usize, tls: bool) -> String {
    let scheme = if tls { "https" } else { "http" };
    format!("{scheme}://{}.{namespace}.svc:{PS_PORT}", ps_shard_name(job, shard))
}

/// The workers' `FORESIGHT_PS_URL`: every shard's URL, in shard order, separated by commas.
pub fn ps_cluster_urls(job: &str, namespace: &str, shards: std::ops::Range<usize>, tls: bool) -> String {
    shards.map(|i| ps_cluster_url(job, namespace, i, tls)).collect::<Vec<_>>().join(",")
}

/// Where the job's TLS Secret is mounted: the whole Secret in the PS's pods, the CA alone in the
/// workers'.
pub const TLS_DIR: &str = "/etc/foresight/tls";
pub const PS_CA_DIR: &str = "/etc/foresight/ps-ca";

/// Label of a sharded parameter server's pods (and its Services' selectors): which shard. An
/// unsharded PS's pods have none, so that its Deployment's selector is the one it always had.
pub const LABEL_PS_SHARD: &str = "foresight.dev/ps-shard";

/// The labels of every child and its pods; `component` tells the PS from the workers.
pub fn labels(job: &str, component: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".into(), "foresight".into()),
        ("app.kubernetes.io/managed-by".into(), "foresight-operator".into()),
        ("app.kubernetes.io/instance".into(), job.into()),
        (LABEL_COMPONENT.into(), component.into()),
        (LABEL_JOB.into(), job.into()),
    ])
}

/// The label selector of job `job`'s worker pods.
pub fn worker_selector(job: &str) -> String {
    format!("{LABEL_JOB}={job},{LABEL_COMPONENT}={COMPONENT_WORKER}")
}
