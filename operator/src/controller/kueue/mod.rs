//! Admission by Kueue (sigs.k8s.io/kueue): a TrainingJob labelled `kueue.x-k8s.io/queue-name`
//! runs only while Kueue admits it as one unit. The operator makes one `Workload` per job (pod
//! sets `ps` × 1 and `workers` × replicas, their resources and GPUs counted together), keeps
//! the job's pods stopped until Kueue admits it, marks it `Finished` when the job ends, gives
//! its quota back when Kueue evicts it (once its pods are stopped, as Kueue's own integrations
//! do), and replaces it (deletes it once the pods are stopped, then makes a new one) when the
//! job's queue or size changes. Kueue never touches the TrainingJob or its children:
//! the worker Job carries no queue label, so Kueue's batch/v1 integration leaves it alone and
//! nobody else writes its `suspend`.
//!
//! The decisions are pure (`plan`, `pod_sets`, `placement`); `admission.rs` makes the API calls.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{PodTemplateSpec, ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

pub mod admission;
pub mod flavors;

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
    /// `false`: an admin deactivated it; Kueue admits it only once it is active again. The
    /// operator never sets it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active: Option<bool>,
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
    /// The rest (`lastTransitionTime`, `observedGeneration`), kept as Kueue wrote it: the
    /// operator writes the whole list back when it gives an evicted Workload's quota back.
    #[serde(flatten)]
    pub rest: BTreeMap<String, serde_json::Value>,
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
    /// Labelled for a queue, and suspended by its user: it holds no quota, so no pod of it runs
    /// but a parameter server that is the only place its model lives (whose Workload is kept).
    Suspended,
}

impl Admission {
    /// Whether the job's pods must stay stopped (a PS that holds a model excepted).
    pub fn holds(&self) -> bool {
        matches!(self, Admission::Pending(_) | Admission::Suspended)
    }
}

/// What to do with the job's Workload.
#[derive(Clone, Debug, PartialEq)]
pub enum Plan {
    /// No Workload yet: make it.
    Create,
    /// Delete it: it no longer matches the job, and the job's pods are stopped. The next
    /// reconcile makes a new one, which queues again.
    Requeue(Requeue),
    /// Give its quota back and leave it queued (`unreserved`): Kueue evicted it and the job's
    /// pods are stopped. What Kueue's own integrations do, so that what Kueue and the admins
    /// set on the Workload (`spec.active: false`, a requeue backoff) holds; deleting it and
    /// making another, as the operator did before, undid them.
    Unreserve(Eviction),
    /// Delete it without making another: the job is suspended and its pods are stopped, so its
    /// quota goes back to the queue.
    Release,
    Keep,
}

/// Why a job's Workload is replaced; each cause is its own Event reason (Events with one reason
/// are aggregated into one, keeping the first message).
#[derive(Clone, Debug, PartialEq)]
pub enum Requeue {
    /// The job's `kueue.x-k8s.io/queue-name` now names another LocalQueue.
    QueueChanged { from: String },
    /// What Kueue counts (worker count, resources, placement) changed.
    Resized,
}

impl Requeue {
    /// The Event reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Requeue::QueueChanged { .. } => "QueueChanged",
            Requeue::Resized => "Resized",
        }
    }
}

impl std::fmt::Display for Requeue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Requeue::QueueChanged { from } => write!(f, "the job's queue label changed from {from}"),
            Requeue::Resized => write!(f, "the job's size or resources changed since its Workload was made"),
        }
    }
}

/// Kueue evicted the Workload (preemption, deactivation, a stopped queue...): its `Evicted`
/// condition's reason and message.
#[derive(Clone, Debug, PartialEq)]
pub struct Eviction {
    pub reason: String,
    pub message: String,
}

impl Eviction {
    /// Whether Kueue may admit the Workload again at once: after a preemption or a node failure.
    /// After any other eviction (deactivation, a pods-ready timeout) Kueue itself marks it
    /// requeued once it may (reactivated, backoff over).
    fn requeued(&self) -> bool {
        matches!(self.reason.as_str(), "Preempted" | "NodeFailures")
    }
}

impl std::fmt::Display for Eviction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "evicted by Kueue ({}): {}", self.reason, self.message)
    }
}

/// What a job of queue `queue` does with its Workload `existing`: `desired_hash` is the digest
/// of the pod sets it would make now, `wanted` false while the user suspends the job,
/// `stopped` whether no worker pod runs or terminates, `ps_holds_model` whether its PS is the
/// only place its model lives (trained, no checkpoint storage: that PS keeps running). Returns
/// the plan and what it means for the job's pods.
pub fn plan(
    queue: &str,
    existing: Option<&Workload>,
    desired_hash: &str,
    wanted: bool,
    stopped: bool,
    ps_holds_model: bool,
) -> (Plan, Admission) {
    let waiting = |why: String| Admission::Pending(why);
    let Some(w) = existing else {
        // Created suspended: no Workload, and so no pod (its PS too) until it is resumed and
        // admitted. Before, its PS ran at once, outside the quota.
        return if wanted {
            (Plan::Create, waiting(format!("queued in LocalQueue {queue}: creating its Workload")))
        } else {
            (Plan::Keep, Admission::Suspended)
        };
    };
    if !wanted {
        // A suspended job gives its quota back once its pods are gone, but never while its PS
        // runs because it holds the model: that PS stays counted. Before, the Workload went and
        // the PS ran on outside the quota.
        let release = stopped && !ps_holds_model;
        return (if release { Plan::Release } else { Plan::Keep }, Admission::Suspended);
    }
    let reserved = w.condition("QuotaReserved").is_some();
    let requeue = match w.podsets_hash() {
        _ if w.spec.queue_name != queue => Some(Requeue::QueueChanged { from: w.spec.queue_name.clone() }),
        hash if hash != Some(desired_hash) => Some(Requeue::Resized),
        _ => None,
    };
    if let Some(why) = requeue {
        if w.spec.active == Some(false) {
            // A new Workload would be active: replacing it now would undo the admin's choice.
            let held = format!(
                "{why}; its Workload is deactivated (spec.active: false), so the job waits for it to be active again before queueing anew in LocalQueue {queue}"
            );
            return (Plan::Keep, waiting(held));
        }
        return if stopped || !reserved {
            let waiting = waiting(format!("{why}; queued again in LocalQueue {queue}"));
            (Plan::Requeue(why), waiting)
        } else {
            (Plan::Keep, waiting(format!("{why}; stopping the workers before queueing again")))
        };
    }
    if let Some(e) = w.condition("Evicted") {
        let why = Eviction { reason: e.reason.clone(), message: e.message.clone() };
        return match (reserved, stopped) {
            (true, false) => {
                (Plan::Keep, waiting(format!("{why}; stopping the workers before queueing again")))
            }
            (true, true) => {
                let waiting = waiting(format!("{why}; queued again in LocalQueue {queue}"));
                (Plan::Unreserve(why), waiting)
            }
            // Given back already: Kueue admits it again when it may.
            (false, _) => (Plan::Keep, waiting(format!("{why}; queued again in LocalQueue {queue}"))),
        };
    }
    if w.condition("Admitted").is_some() {
        let worker_count = w.admitted_count(PODSET_WORKERS);
        return (Plan::Keep, Admission::Admitted(Admitted { worker_count, ..Default::default() }));
    }
    let why = w.pending_message().unwrap_or("waiting for Kueue to admit it");
    (Plan::Keep, waiting(format!("queued in LocalQueue {queue}: {why}")))
}

/// The status that gives evicted Workload `w`'s quota back (a merge patch of `status`), as
/// Kueue's job framework does once the job's pods are stopped: no `admission`, `QuotaReserved`
/// False (`Pending`, the eviction's message), `Admitted` False (`NoReservation`) and
/// `Requeued` True after a preemption or a node failure, False (the eviction's reason)
/// otherwise, which Kueue turns True when the Workload may queue again. `now` stamps the
/// conditions whose status changes; the others keep their transition time.
pub fn unreserved_status(w: &Workload, eviction: &Eviction, now: &Time) -> serde_json::Value {
    let mut conditions = w.status.clone().unwrap_or_default().conditions;
    let generation = w.metadata.generation;
    let requeued = if eviction.requeued() { "True" } else { "False" };
    let set = [
        ("QuotaReserved", "False", "Pending", eviction.message.as_str()),
        ("Admitted", "False", "NoReservation", "The workload has no reservation"),
        ("Requeued", requeued, eviction.reason.as_str(), eviction.message.as_str()),
    ];
    for (type_, status, reason, message) in set {
        let at = conditions.iter().position(|c| c.type_ == type_);
        let mut c = at.map_or_else(WorkloadCondition::default, |i| conditions[i].clone());
        if c.status != status || !c.rest.contains_key("lastTransitionTime") {
            c.rest.insert("lastTransitionTime".into(), serde_json::to_value(now).expect("times serialize"));
        }
        if let Some(g) = generation {
            c.rest.insert("observedGeneration".into(), g.into());
        }
        (c.type_, c.status, c.reason, c.message) =
            (type_.into(), status.into(), reason.into(), message.into());
        match at {
            Some(i) => conditions[i] = c,
            None => conditions.push(c),
        }
    }
    serde_json::json!({"admission": null, "conditions": conditions})
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
    crate::controller::names::digest(&serde_json::to_vec(&admitted).expect("JSON values serialize"))
}

/// The priority of a PriorityClass, as a Workload records it.
pub fn priority_ref(name: &str) -> PriorityClassRef {
    PriorityClassRef { group: "scheduling.k8s.io".into(), kind: "PriorityClass".into(), name: name.into() }
}

#[cfg(test)]
mod tests;
