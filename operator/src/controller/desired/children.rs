//! The objects a TrainingJob owns, built from its spec alone (no I/O): the token Secret, the
//! parameter server's Deployment, Service and optional checkpoint PVC (one of each per shard),
//! and the workers' Indexed Job. The reconciler applies them with server-side apply; tests check them field by field.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy};
use k8s_openapi::api::batch::v1::{
    Job, JobSpec, PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement,
    PodFailurePolicyOnPodConditionsPattern, PodFailurePolicyRule,
};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource, HTTPGetAction,
    KeyToPath, ObjectFieldSelector, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeClaimVolumeSource, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
    ResourceRequirements, SeccompProfile, Secret, SecretKeySelector, SecretVolumeSource, SecurityContext,
    Service, ServicePort, ServiceSpec, Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;

use super::ownership::Mark;
use super::ps_tls::{CA_KEY, CERT_KEY, JobCertificates, PRIVATE_KEY_KEY};
use crate::api::{
    DEFAULT_BACKOFF_LIMIT, DefaultImages, PodSettings, TrainingJob, WORKER_EXIT_PERMANENT, ps_env, worker_env,
};
use crate::controller::kueue::{Admission, Admitted, FlavorPlacement};
use crate::controller::names::{
    CHECKPOINT_DIR, COMPONENT_PS, COMPONENT_WORKER, CONTROL_TOKEN_KEY, DEFAULT_GPU_RESOURCE, LABEL_PS_SHARD,
    ModelPlace, OUTPUT_DIR, PS_CA_DIR, PS_PORT, PS_STARTUP_SECONDS, PS_TEMPLATE_HASH, PS_WORKERS_ENV,
    TLS_DIR, TOKEN_KEY, WORKER_METRICS_PORT, WORKER_TEMPLATE_HASH, digest, labels, output_pvc_name,
    ps_cluster_urls, ps_shard_name, ps_shard_pvc_name, pvc_name, secret_name, tls_secret_name, workers_name,
};

mod guards;
mod update;
pub use update::{WorkerJobUpdate, is_idle_suspended, worker_job_update};

/// The worker count a PS Deployment was made with.
pub fn ps_workers_of(d: &Deployment) -> Option<u32> {
    let spec = d.spec.template.spec.as_ref()?;
    let env = spec.containers.first()?.env.as_ref()?;
    env.iter().find(|e| e.name == PS_WORKERS_ENV)?.value.as_ref()?.parse().ok()
}

/// A short digest of a pod template (SHA-256 of its JSON, 16 hex digits).
fn template_hash(t: &PodTemplateSpec) -> String {
    digest(&serde_json::to_vec(t).expect("a pod template serializes"))
}

/// Cluster-wide settings of the operator that shape the children.
#[derive(Clone, Debug)]
pub struct ChildDefaults {
    /// Image of the parameter server when the job names none.
    pub ps_image: String,
    /// Image of the workers when the job names none.
    pub worker_image: String,
    /// Whether workers reach the PS over TLS with certificates the operator issues
    /// ([`super::ps_tls`]).
    pub ps_tls: bool,
    /// The end of the job's Secrets' names ([`crate::api::DefaultImages::secret_suffix`]);
    /// `None`: the start of its UID (a job started before the suffix, and the operator-wide
    /// default, which [`crate::controller::observe::children::job_defaults`] fills in per job).
    pub secret_suffix: Option<String>,
}

impl From<&DefaultImages> for ChildDefaults {
    fn from(d: &DefaultImages) -> Self {
        Self {
            ps_image: d.parameter_server.clone(),
            worker_image: d.worker.clone(),
            // A job started by an operator before TLS keeps h2c: turning it on would restart its PS.
            ps_tls: d.parameter_server_tls.unwrap_or(false),
            secret_suffix: d.secret_suffix.clone(),
        }
    }
}

impl From<&ChildDefaults> for DefaultImages {
    fn from(d: &ChildDefaults) -> Self {
        Self {
            parameter_server: d.ps_image.clone(),
            worker: d.worker_image.clone(),
            parameter_server_tls: Some(d.ps_tls),
            secret_suffix: d.secret_suffix.clone(),
        }
    }
}

/// The PS container port's name: `https` when it serves TLS, so that a scrape (the chart's
/// PodMonitor) can tell which scheme a PS speaks.
fn ps_port_name(tls: bool) -> &'static str {
    if tls { "https" } else { "http" }
}
/// Everything a child needs from its TrainingJob: name, namespace, owner reference.
pub struct Owner<'a> {
    pub job: &'a TrainingJob,
    pub name: String,
    pub namespace: String,
    owner_ref: OwnerReference,
    /// Kueue's say: the pods held stopped while it has not admitted the job, placed and counted
    /// as it admitted them.
    admission: Admission,
}

impl<'a> Owner<'a> {
    /// `None` when the job has no namespace or UID yet (never for an object read from the API).
    pub fn new(job: &'a TrainingJob) -> Option<Self> {
        Some(Self {
            name: job.metadata.name.clone()?,
            namespace: job.metadata.namespace.clone()?,
            owner_ref: job.controller_owner_ref(&())?,
            job,
            admission: Admission::NotQueued,
        })
    }

    fn meta(&self, name: String, component: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name),
            namespace: Some(self.namespace.clone()),
            labels: Some(labels(&self.name, component)),
            owner_references: Some(vec![self.owner_ref.clone()]),
            ..Default::default()
        }
    }

    pub fn suspended(&self) -> bool {
        self.job.spec.run_policy.suspend == Some(true)
    }

    /// The reference that makes an object the job's (the garbage collector removes it with the job).
    pub fn owner_reference(&self) -> OwnerReference {
        self.owner_ref.clone()
    }

    /// The job's UID.
    pub fn uid(&self) -> &str {
        &self.owner_ref.uid
    }

    /// What makes a child the job's: its controller reference to the job's UID.
    pub fn mark(&self) -> Mark<'_> {
        Mark::Controller { uid: self.uid() }
    }

    /// The name of the job's token Secret.
    pub fn secret_name(&self, defaults: &ChildDefaults) -> String {
        secret_name(&self.name, &self.secret_suffix(defaults))
    }

    /// The name of the job's TLS Secret.
    pub fn tls_secret_name(&self, defaults: &ChildDefaults) -> String {
        tls_secret_name(&self.name, &self.secret_suffix(defaults))
    }

    fn secret_suffix(&self, defaults: &ChildDefaults) -> String {
        match &defaults.secret_suffix {
            Some(s) => s.clone(),
            None => self.uid().chars().take(8).collect(),
        }
    }

    /// The Services whose names the PS's certificate holds: one per shard.
    pub fn ps_service_names(&self) -> Vec<String> {
        self.ps_shards().map(|i| ps_shard_name(&self.name, i)).collect()
    }

    /// The Secret holding the job's CA and the PS's certificate and key.
    pub fn tls_secret(&self, defaults: &ChildDefaults, certs: &JobCertificates) -> Secret {
        let data = [(CA_KEY, &certs.ca), (CERT_KEY, &certs.cert), (PRIVATE_KEY_KEY, &certs.key)]
            .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())));
        Secret {
            metadata: self.meta(self.tls_secret_name(defaults), COMPONENT_PS),
            type_: Some("kubernetes.io/tls".into()),
            data: Some(BTreeMap::from(data)),
            ..Default::default()
        }
    }

    /// The same owner under Kueue's `admission`.
    pub fn with_admission(self, admission: Admission) -> Self {
        Self { admission, ..self }
    }

    pub fn admission(&self) -> &Admission {
        &self.admission
    }

    /// Whether the workers are to be stopped: suspended by the user or not admitted by Kueue.
    pub fn stopped(&self) -> bool {
        self.suspended() || self.admission.holds()
    }

    /// What Kueue admitted, once it has.
    fn admitted(&self) -> Option<&Admitted> {
        match &self.admission {
            Admission::Admitted(a) => Some(a),
            _ => None,
        }
    }

    /// The parameter server's shards.
    pub fn ps_shards(&self) -> std::ops::Range<usize> {
        0..self.job.spec.parameter_server.shards()
    }

    /// The labels of shard `shard`'s pods: [`LABEL_PS_SHARD`] too when there are several.
    fn ps_pod_labels(&self, shard: usize) -> BTreeMap<String, String> {
        let mut l = labels(&self.name, COMPONENT_PS);
        if self.ps_shards().len() > 1 {
            l.insert(LABEL_PS_SHARD.into(), shard.to_string());
        }
        l
    }

    pub fn checkpoint_storage(&self) -> Option<&str> {
        self.job.spec.parameter_server.checkpoint.as_ref()?.storage.as_deref()
    }

    pub fn model_place(&self) -> ModelPlace {
        match &self.job.spec.output {
            Some(o) => ModelPlace::Output {
                claim: o.claim_name.clone().unwrap_or_else(|| output_pvc_name(&self.name)),
                dir: o.path.clone().unwrap_or_else(|| self.name.clone()),
            },
            None if self.checkpoint_storage().is_some() => {
                ModelPlace::CheckpointClaim { claim: pvc_name(&self.name) }
            }
            None => ModelPlace::EmptyDir,
        }
    }

    /// The claim `output.storage` asks for: labelled as the job's, but with no owner, so that
    /// deleting the job (or its TTL) leaves the model.
    pub fn output_pvc(&self) -> Option<PersistentVolumeClaim> {
        let size = self.job.spec.output.as_ref()?.storage.as_deref()?;
        let mut pvc = claim(self.meta(output_pvc_name(&self.name), COMPONENT_PS), size);
        pvc.metadata.owner_references = None;
        Some(pvc)
    }

    /// The Secret holding the job's tokens: the workers' and the control token.
    pub fn secret(&self, defaults: &ChildDefaults, token: &str, control: &str) -> Secret {
        let data = [(TOKEN_KEY, token), (CONTROL_TOKEN_KEY, control)]
            .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())));
        Secret {
            metadata: self.meta(self.secret_name(defaults), COMPONENT_PS),
            type_: Some("Opaque".into()),
            data: Some(BTreeMap::from(data)),
            ..Default::default()
        }
    }

    /// The checkpoint PVCs, one per shard, when `parameterServer.checkpoint.storage` asks for them.
    pub fn pvcs(&self) -> Vec<PersistentVolumeClaim> {
        let Some(size) = self.checkpoint_storage() else { return Vec::new() };
        self.ps_shards()
            .map(|i| claim(self.meta(ps_shard_pvc_name(&self.name, i), COMPONENT_PS), size))
            .collect()
    }

    /// Replicas of the parameter server: 1, or 0 while the job is stopped *and* a PVC keeps the
    /// checkpoint (with an emptyDir, stopping the PS would lose the model, so it stays up), and
    /// 0 while Kueue has not admitted a job that holds no model yet.
    pub fn ps_replicas(&self) -> i32 {
        let no_model_yet = self.job.status.as_ref().is_none_or(|s| s.progress.is_none());
        let keeps_checkpoint = self.checkpoint_storage().is_some();
        if (self.stopped() && keeps_checkpoint) || (self.admission.holds() && no_model_yet) { 0 } else { 1 }
    }

    /// Whether the job's PS is the only place its model lives: it has trained, and no
    /// checkpoint claim keeps the model (stopping that PS would lose it).
    pub fn ps_holds_model(&self) -> bool {
        let trained = self.job.status.as_ref().is_some_and(|s| s.progress.is_some());
        trained && self.checkpoint_storage().is_none()
    }

    /// Whether a PS Deployment's change from `running` to `desired` waits: without
    /// `checkpoint.storage` the running PS's memory holds the only copy of the model, and a new
    /// pod template (a learning rate, image or resources) would roll it and lose that. A
    /// Deployment scaled to 0 (a job Kueue has not admitted yet) has no model to lose.
    pub fn ps_change_waits(&self, running: &Deployment, desired: &Deployment) -> bool {
        let hash = |d: &Deployment| d.metadata.annotations.as_ref()?.get(PS_TEMPLATE_HASH).cloned();
        self.checkpoint_storage().is_none()
            && hash(running) != hash(desired)
            && running.spec.replicas != Some(0)
    }

    /// The desired PS Deployment of `shard` next to the `running` one, if any: started with the
    /// running one's worker count (see [`Self::ps_deployment`]).
    pub fn ps_deployment_beside(
        &self,
        defaults: &ChildDefaults,
        running: Option<&Deployment>,
        shard: usize,
    ) -> Deployment {
        let workers = running.and_then(ps_workers_of).unwrap_or(self.job.spec.workers.replicas);
        self.ps_deployment(defaults, workers, shard)
    }

    /// The PS Deployment; its pod starts with `workers` as the job's worker count. That is the
    /// count the running Deployment was made with, not today's `workers.replicas`: scaling the
    /// job must not roll the PS (it is told the new count over HTTP instead).
    ///
    /// Shard 0 of a sharded PS writes the final model and is told the other shards' URLs
    /// (`FORESIGHT_PS_PEERS`); each shard has its own checkpoint claim.
    pub fn ps_deployment(&self, defaults: &ChildDefaults, workers: u32, shard: usize) -> Deployment {
        let spec = &self.job.spec;
        let pod_labels = self.ps_pod_labels(shard);
        let mut ps_settings = ps_env(spec, &self.name, &self.namespace);
        for (k, v) in &mut ps_settings {
            if k == PS_WORKERS_ENV {
                *v = workers.to_string();
            }
        }
        let mut env = vars(ps_settings);
        env.push(token_var(&self.secret_name(defaults), "FORESIGHT_TOKEN", TOKEN_KEY));
        env.push(token_var(&self.secret_name(defaults), "FORESIGHT_CONTROL_TOKEN", CONTROL_TOKEN_KEY));
        // Only shard 0 writes the model: the others' final slices stay beside their checkpoints.
        let output_dir = if shard == 0 { self.model_place().ps_dir() } else { CHECKPOINT_DIR.to_string() };
        env.extend(vars([
            ("FORESIGHT_CHECKPOINT_DIR", CHECKPOINT_DIR.to_string()),
            ("FORESIGHT_OUTPUT_DIR", output_dir),
            ("FORESIGHT_PS_LISTEN", format!("0.0.0.0:{PS_PORT}")),
            ("FORESIGHT_LOG_FORMAT", "json".to_string()),
        ]));
        let shards = self.ps_shards();
        // Only a sharded PS is told its shard (the `shard` label of its series; 0 otherwise), so
        // that an unsharded job's Deployment stays as earlier operators made it: a changed
        // template would restart its PS at an operator upgrade.
        if shards.len() > 1 {
            env.extend(vars([("FORESIGHT_PS_SHARD", shard.to_string())]));
        }
        if shard == 0 && shards.len() > 1 {
            let peers = ps_cluster_urls(&self.name, &self.namespace, 1..shards.end, defaults.ps_tls);
            env.extend(vars([("FORESIGHT_PS_PEERS", peers)]));
        }
        if defaults.ps_tls {
            // Its certificate and key; the CA for its calls to the other shards.
            env.extend(vars([
                ("FORESIGHT_TLS_CERT", format!("{TLS_DIR}/{CERT_KEY}")),
                ("FORESIGHT_TLS_KEY", format!("{TLS_DIR}/{PRIVATE_KEY_KEY}")),
                ("FORESIGHT_PS_CA_FILE", format!("{TLS_DIR}/{CA_KEY}")),
            ]));
        }
        let checkpoints = match self.checkpoint_storage() {
            Some(_) => Volume {
                name: "checkpoints".into(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: ps_shard_pvc_name(&self.name, shard),
                    read_only: None,
                }),
                ..Default::default()
            },
            None => empty_dir("checkpoints"),
        };
        let mut volumes = vec![checkpoints, empty_dir("tmp")];
        let mut mounts = vec![mount("checkpoints", CHECKPOINT_DIR, false), mount("tmp", "/tmp", false)];
        if defaults.ps_tls {
            volumes.push(secret_volume("ps-tls", &self.tls_secret_name(defaults), None));
            mounts.push(mount("ps-tls", TLS_DIR, true));
        }
        if let (0, ModelPlace::Output { claim, .. }) = (shard, self.model_place()) {
            volumes.push(Volume {
                name: "output".into(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: claim,
                    read_only: None,
                }),
                ..Default::default()
            });
            mounts.push(mount("output", OUTPUT_DIR, false));
        }
        let port = ps_port_name(defaults.ps_tls);
        let probe = |path: &str, period: i32| Probe {
            http_get: Some(HTTPGetAction {
                path: Some(path.into()),
                port: IntOrString::String(port.into()),
                // The kubelet does not check the certificate of an HTTPS probe.
                scheme: defaults.ps_tls.then(|| "HTTPS".into()),
                ..Default::default()
            }),
            period_seconds: Some(period),
            ..Default::default()
        };
        let container = Container {
            name: "parameter-server".into(),
            image: Some(spec.parameter_server.image.clone().unwrap_or_else(|| defaults.ps_image.clone())),
            env: Some(env),
            ports: Some(vec![ContainerPort {
                name: Some(port.into()),
                container_port: PS_PORT,
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            readiness_probe: Some(probe("/readyz", 5)),
            liveness_probe: Some(Probe { failure_threshold: Some(6), ..probe("/healthz", 10) }),
            // The PS restores its newest checkpoint before it listens: at 10^8-10^9 parameters
            // that takes minutes, and the liveness probe alone (a minute) killed every restore.
            // Liveness starts once /healthz answers, within PS_STARTUP_SECONDS.
            startup_probe: Some(Probe {
                failure_threshold: Some(PS_STARTUP_SECONDS / 5),
                ..probe("/healthz", 5)
            }),
            resources: spec.parameter_server.resources.clone(),
            security_context: Some(container_security()),
            volume_mounts: Some(mounts),
            ..Default::default()
        };
        let mut template = PodTemplateSpec {
            metadata: Some(ObjectMeta { labels: Some(pod_labels.clone()), ..Default::default() }),
            spec: Some(PodSpec {
                containers: vec![container],
                security_context: Some(pod_security()),
                automount_service_account_token: Some(false),
                // Time for the checkpoint it writes on SIGTERM.
                termination_grace_period_seconds: Some(60),
                volumes: Some(volumes),
                ..Default::default()
            }),
        };
        with_pod_settings(&mut template, spec.parameter_server.pod.as_ref());
        if let Some(a) = self.admitted() {
            with_flavor(&mut template, &a.ps);
        }
        let mut metadata = self.meta(ps_shard_name(&self.name, shard), COMPONENT_PS);
        metadata.annotations = Some(BTreeMap::from([(PS_TEMPLATE_HASH.into(), template_hash(&template))]));
        Deployment {
            metadata,
            spec: DeploymentSpec {
                replicas: Some(self.ps_replicas()),
                selector: LabelSelector { match_labels: Some(pod_labels), ..Default::default() },
                // Never two parameter servers at once: each would hold its own model.
                strategy: Some(DeploymentStrategy { type_: Some("Recreate".into()), ..Default::default() }),
                template,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    pub fn ps_service(&self, shard: usize, tls: bool) -> Service {
        let port = ps_port_name(tls);
        Service {
            metadata: self.meta(ps_shard_name(&self.name, shard), COMPONENT_PS),
            spec: Some(ServiceSpec {
                selector: Some(self.ps_pod_labels(shard)),
                ports: Some(vec![ServicePort {
                    name: Some(port.into()),
                    port: PS_PORT,
                    target_port: Some(IntOrString::String(port.into())),
                    protocol: Some("TCP".into()),
                    app_protocol: Some(if tls { "https" } else { "kubernetes.io/h2c" }.into()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// Worker pods that failed in the job's earlier worker Jobs, as its status last recorded.
    pub fn failed_earlier(&self) -> u32 {
        self.job.status.as_ref().and_then(|s| s.workers.as_ref()).map_or(0, |w| w.failed_earlier)
    }

    /// The worker Job's `backoffLimit`: the job's, less the pods that failed in its earlier
    /// worker Jobs (a Job recreated for a template change starts counting from 0). Unset while
    /// nothing failed earlier, as the spec has it (the Job's default is 6).
    fn backoff_limit_left(&self) -> Option<i32> {
        let earlier = self.failed_earlier();
        let limit = self.job.spec.run_policy.backoff_limit;
        if earlier == 0 {
            return limit.map(|b| i32::try_from(b).unwrap_or(i32::MAX));
        }
        let left = limit.unwrap_or(DEFAULT_BACKOFF_LIMIT).saturating_sub(earlier);
        Some(i32::try_from(left).unwrap_or(i32::MAX))
    }

    /// The workers: an Indexed Job, one completion per worker, each worker's index its
    /// completion index. Pods never restart in place (`restartPolicy: Never`), so every failure
    /// is a new pod and counts against `backoffLimit` (with the earlier worker Jobs' failures).
    pub fn worker_job(&self, defaults: &ChildDefaults) -> Job {
        let spec = &self.job.spec;
        let w = &spec.workers;
        let pod_labels = labels(&self.name, COMPONENT_WORKER);
        let mut env = vars(worker_env(
            spec,
            &self.name,
            &self.namespace,
            &ps_cluster_urls(&self.name, &self.namespace, self.ps_shards(), defaults.ps_tls),
        ));
        env.push(EnvVar {
            name: "FORESIGHT_WORKER_INDEX".into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "metadata.annotations['batch.kubernetes.io/job-completion-index']".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        env.push(token_var(&self.secret_name(defaults), "FORESIGHT_TOKEN", TOKEN_KEY));
        if defaults.ps_tls {
            env.extend(vars([("FORESIGHT_PS_CA_FILE", format!("{PS_CA_DIR}/{CA_KEY}"))]));
        }
        env.extend(vars([
            ("FORESIGHT_METRICS_ADDR", format!("0.0.0.0:{WORKER_METRICS_PORT}")),
            ("FORESIGHT_LOG_FORMAT", "json".to_string()),
        ]));
        let mut resources = w.resources.clone().unwrap_or_default();
        if let Some(gpus) = w.gpus.filter(|&g| g > 0) {
            let q = Quantity(gpus.to_string());
            let name = w.gpu_resource.clone().unwrap_or_else(|| DEFAULT_GPU_RESOURCE.into());
            resources.limits.get_or_insert_default().insert(name, q);
        }
        let mut volumes = vec![empty_dir("tmp")];
        let mut mounts = vec![mount("tmp", "/tmp", false)];
        if let Some(v) = &spec.dataset.volume {
            volumes.push(Volume { name: "dataset".into(), ..v.clone() });
            mounts.push(mount("dataset", &spec.dataset.path, true));
        }
        if defaults.ps_tls {
            // The CA alone: a worker pod never holds the PS's key.
            volumes.push(secret_volume("ps-ca", &self.tls_secret_name(defaults), Some(CA_KEY)));
            mounts.push(mount("ps-ca", PS_CA_DIR, true));
        }
        let container = Container {
            name: "worker".into(),
            image: Some(w.image.clone().unwrap_or_else(|| defaults.worker_image.clone())),
            // The user's own program (the Python package's worker) replaces the image's entrypoint.
            command: w.command.clone(),
            args: w.args.clone(),
            env: Some(env),
            ports: Some(vec![ContainerPort {
                name: Some("metrics".into()),
                container_port: WORKER_METRICS_PORT,
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            resources: (resources != ResourceRequirements::default()).then_some(resources),
            security_context: Some(container_security()),
            volume_mounts: Some(mounts),
            ..Default::default()
        };
        let replicas = i32::try_from(w.replicas).unwrap_or(i32::MAX);
        let mut template = PodTemplateSpec {
            metadata: Some(ObjectMeta { labels: Some(pod_labels), ..Default::default() }),
            spec: Some(PodSpec {
                restart_policy: Some("Never".into()),
                containers: vec![container],
                security_context: Some(pod_security()),
                automount_service_account_token: Some(false),
                node_selector: w.node_selector.clone(),
                tolerations: w.tolerations.clone(),
                volumes: Some(volumes),
                ..Default::default()
            }),
        };
        with_pod_settings(&mut template, w.pod.as_ref());
        if let Some(a) = self.admitted() {
            with_flavor(&mut template, &a.workers);
        }
        let mut metadata = self.meta(workers_name(&self.name), COMPONENT_WORKER);
        metadata.annotations =
            Some(BTreeMap::from([(WORKER_TEMPLATE_HASH.into(), template_hash(&template))]));
        Job {
            metadata,
            spec: Some(JobSpec {
                completion_mode: Some("Indexed".into()),
                completions: Some(replicas),
                // Partially admitted by Kueue: as many at once as admitted; the other indices
                // run as those finish.
                parallelism: Some(
                    self.admitted().and_then(|a| a.worker_count).map_or(replicas, |n| replicas.min(n as i32)),
                ),
                backoff_limit: self.backoff_limit_left(),
                pod_failure_policy: Some(worker_failure_policy()),
                active_deadline_seconds: spec.run_policy.active_deadline_seconds.map(|s| s as i64),
                suspend: Some(self.stopped()),
                template,
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

/// What a worker pod's failure means for the job. A disruption (preemption, eviction, a node
/// drained or lost: the pod's `DisruptionTarget` condition) is not the job's fault: the pod is
/// replaced without spending `backoffLimit`, and its replacement resumes where it stopped. A
/// worker that exits with [`WORKER_EXIT_PERMANENT`] met a problem retrying cannot fix: the job
/// fails at once, with the exit code in its reason. Everything else counts against the limit.
fn worker_failure_policy() -> PodFailurePolicy {
    PodFailurePolicy {
        rules: vec![
            PodFailurePolicyRule {
                action: "Ignore".into(),
                on_pod_conditions: Some(vec![PodFailurePolicyOnPodConditionsPattern {
                    type_: "DisruptionTarget".into(),
                    status: Some("True".into()),
                }]),
                ..Default::default()
            },
            PodFailurePolicyRule {
                action: "FailJob".into(),
                on_exit_codes: Some(PodFailurePolicyOnExitCodesRequirement {
                    container_name: Some("worker".into()),
                    operator: "In".into(),
                    values: vec![WORKER_EXIT_PERMANENT],
                }),
                ..Default::default()
            },
        ],
    }
}

/// Adds a role's `pod` settings to the pod template the operator built: labels and annotations
/// beside its own, placement, priority and identity, and variables, volumes and mounts after
/// its own. The CRD refuses the operator's label keys, `FORESIGHT_` variables and its volume
/// names and paths, so nothing of the operator's is replaced.
fn with_pod_settings(template: &mut PodTemplateSpec, settings: Option<&PodSettings>) {
    let Some(p) = settings else { return };
    let meta = template.metadata.get_or_insert_default();
    for (k, v) in p.labels.iter().flatten() {
        meta.labels.get_or_insert_default().entry(k.clone()).or_insert_with(|| v.clone());
    }
    if let Some(a) = &p.annotations {
        meta.annotations.get_or_insert_default().extend(a.clone());
    }
    let spec = template.spec.get_or_insert_default();
    fn set<T: Clone>(ours: &mut Option<T>, theirs: &Option<T>) {
        if theirs.is_some() {
            ours.clone_from(theirs);
        }
    }
    set(&mut spec.node_selector, &p.node_selector);
    set(&mut spec.tolerations, &p.tolerations);
    spec.affinity.clone_from(&p.affinity);
    spec.priority_class_name.clone_from(&p.priority_class_name);
    spec.service_account_name.clone_from(&p.service_account_name);
    set(&mut spec.automount_service_account_token, &p.automount_service_account_token);
    spec.image_pull_secrets.clone_from(&p.image_pull_secrets);
    spec.volumes.get_or_insert_default().extend(p.volumes.iter().flatten().cloned());
    set(&mut spec.topology_spread_constraints, &p.topology_spread_constraints);
    set(&mut spec.runtime_class_name, &p.runtime_class_name);
    set(&mut spec.scheduler_name, &p.scheduler_name);
    if let Some(id) = &p.security_context {
        let sc = spec.security_context.get_or_insert_with(pod_security);
        set(&mut sc.run_as_user, &id.run_as_user);
        set(&mut sc.run_as_group, &id.run_as_group);
        set(&mut sc.fs_group, &id.fs_group);
        set(&mut sc.supplemental_groups, &id.supplemental_groups);
    }
    if let Some(limit) = &p.tmp_size_limit {
        let tmp = spec.volumes.iter_mut().flatten().filter(|v| v.name == "tmp");
        for dir in tmp.filter_map(|v| v.empty_dir.as_mut()) {
            dir.size_limit = Some(Quantity(limit.clone()));
        }
    }
    if let Some(inits) = p.init_containers.as_ref().filter(|c| !c.is_empty()) {
        let secured = inits.iter().cloned().map(|mut c| {
            c.security_context.get_or_insert_with(container_security);
            c
        });
        spec.init_containers.get_or_insert_default().extend(secured);
        // `kubectl logs` and `exec` then reach the operator's container without `-c`.
        let ours = spec.containers[0].name.clone();
        let annotations = template.metadata.get_or_insert_default().annotations.get_or_insert_default();
        annotations.insert("kubectl.kubernetes.io/default-container".into(), ours);
    }
    let container = &mut spec.containers[0];
    container.env.get_or_insert_default().extend(p.env.iter().flatten().cloned());
    container.env_from.clone_from(&p.env_from);
    container.volume_mounts.get_or_insert_default().extend(p.volume_mounts.iter().flatten().cloned());
}

/// Adds the placement of the flavors Kueue assigned to the role's own.
fn with_flavor(template: &mut PodTemplateSpec, flavor: &FlavorPlacement) {
    let spec = template.spec.get_or_insert_default();
    if !flavor.node_selector.is_empty() {
        spec.node_selector.get_or_insert_default().extend(flavor.node_selector.clone());
    }
    if !flavor.tolerations.is_empty() {
        spec.tolerations.get_or_insert_default().extend(flavor.tolerations.iter().cloned());
    }
}

fn vars<K: Into<String>>(env: impl IntoIterator<Item = (K, String)>) -> Vec<EnvVar> {
    env.into_iter().map(|(k, v)| EnvVar { name: k.into(), value: Some(v), ..Default::default() }).collect()
}

/// `name` from the job's Secret `secret`'s `key`.
fn token_var(secret: &str, name: &str, key: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.into(),
                key: key.into(),
                optional: Some(false),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A ReadWriteOnce claim of `size`.
fn claim(metadata: ObjectMeta, size: &str) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata,
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".into(), Quantity(size.into()))])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn empty_dir(name: &str) -> Volume {
    Volume { name: name.into(), empty_dir: Some(EmptyDirVolumeSource::default()), ..Default::default() }
}

/// Secret `secret` as volume `name`: every key, or `only` that one.
fn secret_volume(name: &str, secret: &str, only: Option<&str>) -> Volume {
    Volume {
        name: name.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.into()),
            items: only.map(|k| vec![KeyToPath { key: k.into(), path: k.into(), ..Default::default() }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..Default::default()
    }
}

/// Non-root (the images' user 10001), no privilege escalation, no capabilities, the runtime's
/// seccomp profile; the root filesystem is read-only and /tmp an emptyDir.
fn container_security() -> SecurityContext {
    SecurityContext {
        run_as_non_root: Some(true),
        read_only_root_filesystem: Some(true),
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), add: None }),
        ..Default::default()
    }
}

fn pod_security() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(10001),
        run_as_group: Some(10001),
        fs_group: Some(10001),
        seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), localhost_profile: None }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;
