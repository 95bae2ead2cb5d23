//! Admission by Kueue (sigs.k8s.io/kueue): a TrainingJob labelled `kueue.x-k8s.io/queue-name`
//! runs only while Kueue admits it as one unit. The operator makes one `Workload` per job (pod
//! sets `ps` × 1 and `workers` × replicas, their resources and GPUs counted together), keeps
//! the job's pods stopped until Kueue admits it, marks it `Finished` when the job ends, and
//! requeues it (deletes the Workload once its pods are stopped, then makes a new one) when Kueue
//! evicts it or the job's size changes. Kueue never touches the TrainingJob or its children:
//! the worker Job carries no queue label, so Kueue's batch/v1 integration leaves it alone and
//! nobody else writes its `suspend`.
//!
//! The decisions are pure (`plan`, `pod_sets`, `placement`); `admission.rs` makes the API calls.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{PodTemplateSpec, ResourceRequirements, Toleration};
use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// The label that names the job's LocalQueue (the one Kueue's own integrations use).
pub const QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";
/// The digest of the pod sets a Workload was made with: a job whose pod sets no longer match
/// its Workload is queued again with the new ones (Kueue's pod sets are immutable once admitted).
pub const PODSETS_HASH: &str = "foresight.dev/podsets-hash";
pub const PODSET_PS: &str = "ps";
pub const PODSET_WORKERS: &str = "workers";

/// The part of Kueue's Workload (`kueue.x-k8s.io/v1beta2`) the operator writes and reads.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[kube(
    group = "kueue.x-k8s.io",
    version = "v1beta2",
    kind = "Workload",
    namespaced,
    status = "WorkloadStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadSpec {
    pub queue_name: String,
    pub pod_sets: Vec<PodSet>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_ref: Option<PriorityClassRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodSet {
    pub name: String,
    pub count: i32,
    /// With partial admission: the fewest pods Kueue may admit the set with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_count: Option<i32>,
    pub template: PodTemplateSpec,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct PriorityClassRef {
    pub group: String,
    pub kind: String,
    pub name: String,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct WorkloadStatus {
    #[serde(default)]
    pub conditions: Vec<WorkloadCondition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<WorkloadAdmission>,
}

/// The quota Kueue reserved: for each pod set, the flavor of each resource.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadAdmission {
    #[serde(default)]
    pub pod_set_assignments: Vec<PodSetAssignment>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct PodSetAssignment {
    pub name: String,
    #[serde(default)]
    pub flavors: BTreeMap<String, String>,
    /// The pods admitted (fewer than the pod set's count with partial admission).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<i32>,
}

/// The part of Kueue's ResourceFlavor that places pods.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[kube(group = "kueue.x-k8s.io", version = "v1beta2", kind = "ResourceFlavor", schema = "disabled")]
#[serde(rename_all = "camelCase")]
pub struct ResourceFlavorSpec {
    #[serde(default)]
    pub node_labels: BTreeMap<String, String>,
    #[serde(default)]
    pub tolerations: Vec<Toleration>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct WorkloadCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
}

impl Workload {
    /// Whether Kueue admitted it (quota reserved and every check passed).
    pub fn is_admitted(&self) -> bool {
        self.condition("Admitted").is_some()
    }

    fn condition(&self, type_: &str) -> Option<&WorkloadCondition> {
        self.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_ && c.status == "True")
    }

    fn pending_message(&self) -> Option<&str> {
        let s = self.status.as_ref()?;
        let c = s.conditions.iter().find(|c| c.type_ == "QuotaReserved" && c.status == "False")?;
        Some(c.message.as_str()).filter(|m| !m.is_empty())
    }

    fn podsets_hash(&self) -> Option<&str> {
        self.metadata.annotations.as_ref()?.get(PODSETS_HASH).map(String::as_str)
    }

    fn assignment(&self, name: &str) -> Option<&PodSetAssignment> {
        self.status.as_ref()?.admission.as_ref()?.pod_set_assignments.iter().find(|a| a.name == name)
    }

    /// The flavors Kueue assigned to pod set `name` (one per resource; often one in all).
    pub fn flavors_of(&self, name: &str) -> BTreeSet<String> {
        self.assignment(name).iter().flat_map(|a| a.flavors.values().cloned()).collect()
    }

    /// The pods Kueue admitted of pod set `name`.
    pub fn admitted_count(&self, name: &str) -> Option<u32> {
        self.assignment(name)?.count.and_then(|c| u32::try_from(c).ok())
    }
}

/// Where Kueue's admission puts a role's pods: the `nodeLabels` (as a nodeSelector) and
/// `tolerations` of the ResourceFlavors it assigned, as Kueue's own integrations inject them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FlavorPlacement {
    pub node_selector: BTreeMap<String, String>,
    pub tolerations: Vec<Toleration>,
}

/// What Kueue admitted: the placement of each role by the flavors it assigned, and the number
/// of workers when it admitted fewer than `workers.replicas` (partial admission, down to
/// `workers.minReplicas`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Admitted {
    pub ps: FlavorPlacement,
    pub workers: FlavorPlacement,
    pub worker_count: Option<u32>,
}

/// A role's placement from the flavors it was assigned.
pub fn placement<'a>(flavors: impl IntoIterator<Item = &'a ResourceFlavorSpec>) -> FlavorPlacement {
    let mut p = FlavorPlacement::default();
    for f in flavors {
        p.node_selector.extend(f.node_labels.clone());
        for t in &f.tolerations {
            if !p.tolerations.contains(t) {
                p.tolerations.push(t.clone());
            }
        }
    }
    p
}

/// Whether the job may run, as far as Kueue is concerned.
#[derive(Clone, Debug, PartialEq)]
pub enum Admission {
    /// Not labelled for a queue: Kueue has no say.
    NotQueued,
    /// Waiting for Kueue (the reason, for the status).
    Pending(String),
    /// Admitted: the flavors' placement (filled in by `admission.rs`, which reads them) and the
    /// worker count.
    Admitted(Admitted),
}

impl Admission {
    /// Whether the job's pods must stay stopped.
    pub fn holds(&self) -> bool {
        matches!(self, Admission::Pending(_))
    }
}

/// What to do with the job's Workload.
#[derive(Clone, Debug, PartialEq)]
pub enum Plan {
    /// No Workload yet: make it.
    Create,
    /// Delete it: it was evicted, or it no longer matches the job, and the job's pods are
    /// stopped. The next reconcile makes a new one, which queues again.
    Requeue(Requeue),
    /// Delete it without making another: the job is suspended and its pods are stopped, so its
    /// quota goes back to the queue.
    Release,
    Keep,
}

/// Why a job queues again; each cause is its own Event reason (Events with one reason are
/// aggregated into one, keeping the first message).
#[derive(Clone, Debug, PartialEq)]
pub enum Requeue {
    /// Kueue evicted it (preemption, a stopped queue...): its condition's reason and message.
    Evicted { reason: String, message: String },
    /// The job's `kueue.x-k8s.io/queue-name` now names another LocalQueue.
    QueueChanged { from: String },
    /// What Kueue counts (worker count, resources, placement) changed.
    Resized,
}

impl Requeue {
    /// The Event reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Requeue::Evicted { .. } => "Evicted",
            Requeue::QueueChanged { .. } => "QueueChanged",
            Requeue::Resized => "Resized",
        }
    }
}

impl std::fmt::Display for Requeue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Requeue::Evicted { reason, message } => write!(f, "evicted by Kueue ({reason}): {message}"),
            Requeue::QueueChanged { from } => write!(f, "the job's queue label changed from {from}"),
            Requeue::Resized => write!(f, "the job's size or resources changed since its Workload was made"),
        }
    }
}

/// What a job of queue `queue` does with its Workload `existing`: `desired_hash` is the digest
/// of the pod sets it would make now, `wanted` false while the user suspends the job,
/// `stopped` whether no worker pod runs or terminates. Returns the plan and what it means for
/// the job's pods.
pub fn plan(
    queue: &str,
    existing: Option<&Workload>,
    desired_hash: &str,
    wanted: bool,
    stopped: bool,
) -> (Plan, Admission) {
    let waiting = |why: String| Admission::Pending(why);
    let Some(w) = existing else {
        return if wanted {
            (Plan::Create, waiting(format!("queued in LocalQueue {queue}: creating its Workload")))
        } else {
            (Plan::Keep, Admission::NotQueued)
        };
    };
    if !wanted {
        // A suspended job gives its quota back once its pods are gone.
        return (if stopped { Plan::Release } else { Plan::Keep }, Admission::NotQueued);
    }
    let requeue = match (w.condition("Evicted"), w.podsets_hash()) {
        (Some(e), _) => Some(Requeue::Evicted { reason: e.reason.clone(), message: e.message.clone() }),
        (None, _) if w.spec.queue_name != queue => {
            Some(Requeue::QueueChanged { from: w.spec.queue_name.clone() })
        }
        (None, hash) if hash != Some(desired_hash) => Some(Requeue::Resized),
        _ => None,
    };
    if let Some(why) = requeue {
        let admitted = w.condition("QuotaReserved").is_some();
        return if stopped || !admitted {
            let waiting = waiting(format!("{why}; queued again in LocalQueue {queue}"));
            (Plan::Requeue(why), waiting)
        } else {
            (Plan::Keep, waiting(format!("{why}; stopping the workers before queueing again")))
        };
    }
    if w.condition("Admitted").is_some() {
        let worker_count = w.admitted_count(PODSET_WORKERS);
        return (Plan::Keep, Admission::Admitted(Admitted { worker_count, ..Default::default() }));
    }
    let why = w.pending_message().unwrap_or("waiting for Kueue to admit it");
    (Plan::Keep, waiting(format!("queued in LocalQueue {queue}: {why}")))
}

/// The pod sets Kueue counts: the PS's pod and the workers' pods, each with requests where only
/// limits are given (what the API server does to a pod; a Workload's template is not one). With
/// `min_replicas` below `replicas` (an asynchronous job that trains on the workers it has), Kueue
/// may admit the workers partially, down to that many.
pub fn pod_sets(
    ps: PodTemplateSpec,
    ps_shards: usize,
    workers: PodTemplateSpec,
    replicas: u32,
    min_replicas: Option<u32>,
) -> Vec<PodSet> {
    let count = |n: u32| i32::try_from(n).unwrap_or(i32::MAX);
    // (The shards' pods differ only in their environment and claims, not in what they request.)
    let ps_count = i32::try_from(ps_shards).unwrap_or(i32::MAX);
    vec![
        PodSet { name: PODSET_PS.into(), count: ps_count, min_count: None, template: with_requests(ps) },
        PodSet {
            name: PODSET_WORKERS.into(),
            count: count(replicas),
            min_count: min_replicas.filter(|&m| m < replicas).map(count),
            template: with_requests(workers),
        },
    ]
}

fn with_requests(mut t: PodTemplateSpec) -> PodTemplateSpec {
    for c in t.spec.iter_mut().flat_map(|s| s.containers.iter_mut()) {
        let r = c.resources.get_or_insert_with(ResourceRequirements::default);
        let limits = r.limits.clone().unwrap_or_default();
        let requests = r.requests.get_or_insert_with(BTreeMap::new);
        for (k, v) in limits {
            requests.entry(k).or_insert(v);
        }
    }
    t
}

/// The digest of what Kueue admits: each pod set's count, resources and placement. Settings
/// that change nothing Kueue counts (a learning rate in an environment variable) leave it alone.
pub fn podsets_hash(sets: &[PodSet]) -> String {
    let admitted: Vec<_> = sets
        .iter()
        .map(|s| {
            let spec = s.template.spec.clone().unwrap_or_default();
            let resources: Vec<_> = spec.containers.iter().map(|c| c.resources.clone()).collect();
            serde_json::json!({
                "name": s.name, "count": s.count, "minCount": s.min_count, "resources": resources,
                "nodeSelector": spec.node_selector, "tolerations": spec.tolerations,
                "affinity": spec.affinity, "priorityClassName": spec.priority_class_name,
            })
        })
        .collect();
    super::children::digest(&serde_json::to_vec(&admitted).expect("JSON values serialize"))
}

/// The priority of a PriorityClass, as a Workload records it.
pub fn priority_ref(name: &str) -> PriorityClassRef {
    PriorityClassRef { group: "scheduling.k8s.io".into(), kind: "PriorityClass".into(), name: name.into() }
}

#[cfg(test)]
mod tests;
