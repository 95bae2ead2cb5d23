//! What the job's pods say, read from the caches (and, for the worker Job's pod creation, its
//! Events): whether the scheduler placed them, and whether they fail to start or keep failing
//! (`trouble` decides which).

use std::sync::Arc;
use std::time::Duration;

use foresight_ps::wire::final_model::FinalModel;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event as CoreEvent, PersistentVolumeClaim, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use crate::api::TrainingJobStatus;
use crate::controller::context::Context;
use crate::controller::decide::status::{self, Placement};
use crate::controller::decide::trouble::{self, Role, Trouble};
use crate::controller::desired::children::Owner;
use crate::controller::error::Result;

/// The job's pods, each counted as the job's only when its controller is one of the job's own
/// children: the worker Job (by UID), or a ReplicaSet of one of the job's PS Deployments (named
/// `<deployment>-<pod-template-hash>` by the Deployment controller). The job label alone would
/// let a co-tenant's pod, labelled as another job's PS and stuck, fail that job after the
/// stuck-pods bound (review C9); a forged owner reference needs the owner's UID, and the garbage
/// collector deletes a pod whose owner does not exist.
#[derive(Default)]
pub(crate) struct JobPods {
    pub(crate) ps: Vec<Arc<Pod>>,
    pub(crate) workers: Vec<Arc<Pod>>,
}

impl JobPods {
    pub(crate) fn of(ctx: &Context, owner: &Owner<'_>, ps: &[Deployment], workers: &Job) -> Self {
        Self::sorted(ctx.caches.pods(&owner.namespace, &owner.name), ps, workers)
    }

    fn sorted(pods: Vec<Arc<Pod>>, ps: &[Deployment], workers: &Job) -> Self {
        let job_uid = workers.metadata.uid.as_deref();
        let deployments: Vec<&str> = ps.iter().filter_map(|d| d.metadata.name.as_deref()).collect();
        let mut sorted = Self::default();
        for pod in pods {
            let Some(c) = pod.owner_references().iter().find(|r| r.controller == Some(true)) else {
                continue;
            };
            if c.kind == "Job" && job_uid == Some(c.uid.as_str()) {
                sorted.workers.push(pod);
            } else if c.kind == "ReplicaSet" && of_deployment(&c.name, &pod, &deployments) {
                sorted.ps.push(pod);
            }
        }
        sorted
    }

    fn refs(pods: &[Arc<Pod>]) -> Vec<&Pod> {
        pods.iter().map(AsRef::as_ref).collect()
    }
}

/// Whether ReplicaSet `replica_set`, the controller of `pod`, is one of `deployments`'.
fn of_deployment(replica_set: &str, pod: &Pod, deployments: &[&str]) -> bool {
    let Some(hash) = pod.labels().get("pod-template-hash") else { return false };
    deployments.iter().any(|d| replica_set.strip_prefix(d).and_then(|r| r.strip_prefix('-')) == Some(hash))
}

/// The job's pods that cannot start or keep failing (`trouble`): the parameter server's first,
/// since workers fail for want of it.
pub(crate) async fn trouble(
    ctx: &Context,
    owner: &Owner<'_>,
    pods: &JobPods,
    ps: &[Deployment],
    workers: &Job,
) -> Result<Option<Trouble>> {
    if let Some(t) = ps.iter().find_map(trouble::deployment_trouble) {
        return Ok(Some(t));
    }
    if let Some(t) = pods.ps.iter().find_map(|p| trouble::pod_trouble(Role::ParameterServer, p)) {
        return Ok(Some(t));
    }
    if let Some(t) = worker_creation_trouble(ctx, owner, workers).await? {
        return Ok(Some(t));
    }
    Ok(pods.workers.iter().find_map(|p| trouble::pod_trouble(Role::Workers, p)))
}

/// The parameter server's pods whose containers restarted more often than `limit`
/// (`trouble::ps_restarts_exhausted`).
pub(crate) fn ps_restarts_exhausted(pods: &JobPods, limit: u32) -> Option<Trouble> {
    trouble::ps_restarts_exhausted(&JobPods::refs(&pods.ps), limit)
}

/// How the latest failed worker pod of the job ended (`trouble::last_worker_failure`).
pub(crate) fn last_worker_failure(pods: &JobPods) -> Option<String> {
    trouble::last_worker_failure(&JobPods::refs(&pods.workers))
}

/// How long ago a `FailedCreate` event still tells about the worker Job's pods now.
const RECENT_EVENT: Duration = Duration::from_secs(300);

/// The Job controller's recent `FailedCreate` events for the worker Job, asked for only while
/// the Job has fewer pods than it runs at once.
async fn worker_creation_trouble(ctx: &Context, owner: &Owner<'_>, workers: &Job) -> Result<Option<Trouble>> {
    let (Some(spec), Some(uid)) = (&workers.spec, &workers.metadata.uid) else { return Ok(None) };
    let s = workers.status.clone().unwrap_or_default();
    let has = s.active.unwrap_or(0) + s.succeeded.unwrap_or(0);
    if spec.suspend == Some(true) || has >= spec.parallelism.unwrap_or(1) {
        return Ok(None);
    }
    let api: Api<CoreEvent> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let params = ListParams::default().fields(&format!("involvedObject.uid={uid},reason=FailedCreate"));
    let now = Timestamp::now();
    let seen = |e: &CoreEvent| e.last_timestamp.as_ref().or(e.first_timestamp.as_ref()).map(|t| t.0);
    let mut recent: Vec<_> = api
        .list(&params)
        .await?
        .items
        .into_iter()
        .filter_map(|e| {
            seen(&e)
                .filter(|t| now.duration_since(*t).as_secs_f64() < RECENT_EVENT.as_secs_f64())
                .map(|t| (t, e))
        })
        .collect();
    recent.sort_by_key(|(t, _)| std::cmp::Reverse(*t));
    let messages: Vec<String> = recent.into_iter().filter_map(|(_, e)| e.message).collect();
    Ok(trouble::worker_creation_trouble(&messages))
}

/// Whether the pods have been failing (condition `PodsFailing` True) for longer than `bound`.
pub(crate) fn trouble_older_than(old: &TrainingJobStatus, bound: Duration) -> bool {
    old.conditions.iter().any(|c| {
        c.type_ == status::PODS_FAILING
            && c.status == "True"
            && Timestamp::now().duration_since(c.last_transition_time.0).as_secs_f64() >= bound.as_secs_f64()
    })
}

/// Whether the scheduler placed the job's pods (`status::unschedulable_pod` says what an
/// unschedulable one means).
pub(crate) async fn placement(ctx: &Context, owner: &Owner<'_>, pods: &JobPods) -> Result<Placement> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let mut waiting = None;
    let roles =
        pods.ps.iter().map(|p| (p, "parameter server")).chain(pods.workers.iter().map(|p| (p, "worker")));
    for (pod, who) in roles {
        let Some(message) = unschedulable_condition(pod) else { continue };
        let mut unbound = Vec::new();
        for name in claim_names(pod) {
            let bound = claims.get_opt(name).await?.and_then(|c| c.status?.phase).as_deref() == Some("Bound");
            if !bound {
                unbound.push(name);
            }
        }
        match status::unschedulable_pod(&format!("{who} pod {}", pod.name_any()), &message, &unbound) {
            Placement::WaitingForClaims(why) => {
                waiting.get_or_insert(why);
            }
            other => return Ok(other),
        }
    }
    Ok(waiting.map_or(Placement::Scheduled, Placement::WaitingForClaims))
}

/// The scheduler's message for a pending pod it could not place.
fn unschedulable_condition(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    if status.phase.as_deref() != Some("Pending") {
        return None;
    }
    let c = status.conditions.as_ref()?.iter().find(|c| {
        c.type_ == "PodScheduled" && c.status == "False" && c.reason.as_deref() == Some("Unschedulable")
    })?;
    Some(c.message.clone().unwrap_or_default())
}

/// The claims a pod mounts.
fn claim_names(pod: &Pod) -> impl Iterator<Item = &str> {
    let volumes = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten());
    volumes.filter_map(|v| v.persistent_volume_claim.as_ref()).map(|c| c.claim_name.as_str())
}

/// The final model the job's last worker recorded in its termination message (the PS told it
/// where it wrote the model when it left): proof of the model that needs no connection to the
/// PS. Only pods of this worker Job (`job_uid`) count.
pub(crate) fn final_model_reported(ctx: &Context, owner: &Owner<'_>, workers: &Job) -> Option<FinalModel> {
    let uid = workers.metadata.uid.as_deref()?;
    final_model_in(&ctx.caches.pods(&owner.namespace, &owner.name), uid)
}

fn final_model_in(pods: &[Arc<Pod>], job_uid: &str) -> Option<FinalModel> {
    let of_job =
        |p: &&Arc<Pod>| p.owner_references().iter().any(|r| r.controller == Some(true) && r.uid == job_uid);
    let recorded = |p: &Arc<Pod>| -> Option<FinalModel> {
        let statuses = p.status.as_ref()?.container_statuses.as_ref()?;
        statuses.iter().find_map(|c| {
            let message = c.state.as_ref()?.terminated.as_ref()?.message.as_deref()?;
            FinalModel::from_termination_message(message)
        })
    };
    pods.iter().filter(of_job).filter_map(recorded).max_by_key(|m| m.version)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStateTerminated, ContainerStatus, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    use super::*;

    fn pod(owner_uid: &str, controller: bool, message: Option<&str>) -> Arc<Pod> {
        let mut p = Pod::default();
        p.metadata.owner_references = Some(vec![OwnerReference {
            uid: owner_uid.into(),
            controller: Some(controller),
            ..Default::default()
        }]);
        let terminated =
            ContainerStateTerminated { message: message.map(String::from), ..Default::default() };
        p.status = Some(PodStatus {
            container_statuses: Some(vec![ContainerStatus {
                state: Some(ContainerState { terminated: Some(terminated), ..Default::default() }),
                ..Default::default()
            }]),
            ..Default::default()
        });
        Arc::new(p)
    }

    fn owned(kind: &str, name: &str, uid: &str, hash: Option<&str>) -> Arc<Pod> {
        let mut p = Pod::default();
        p.metadata.name = Some(format!("{name}-pod"));
        p.metadata.owner_references = Some(vec![OwnerReference {
            kind: kind.into(),
            name: name.into(),
            uid: uid.into(),
            controller: Some(true),
            ..Default::default()
        }]);
        p.metadata.labels = hash.map(|h| [("pod-template-hash".to_string(), h.to_string())].into());
        Arc::new(p)
    }

    #[test]
    fn a_pod_is_the_jobs_only_when_one_of_its_children_controls_it() {
        let mut workers = Job::default();
        workers.metadata.uid = Some("job-uid".into());
        let mut ps = Deployment::default();
        ps.metadata.name = Some("j-ps".into());
        let pods = vec![
            owned("Job", "j-workers", "job-uid", None),
            owned("ReplicaSet", "j-ps-5d8f", "rs-uid", Some("5d8f")),
            // Labelled as the job's (the cache's index), controlled by something else:
            owned("Job", "j-workers", "another-job", None),
            owned("ReplicaSet", "j-ps-other-5d8f", "rs2", Some("5d8f")),
            owned("ReplicaSet", "j-ps-5d8f", "rs-uid", Some("0000")),
            owned("ReplicaSet", "j-ps-5d8f", "rs-uid", None),
            owned("StatefulSet", "j-ps", "ss", Some("5d8f")),
            Arc::new(Pod::default()),
        ];
        let sorted = JobPods::sorted(pods, &[ps], &workers);
        let names = |p: &[Arc<Pod>]| p.iter().map(|p| p.name_any()).collect::<Vec<_>>();
        assert_eq!(names(&sorted.workers), ["j-workers-pod"]);
        assert_eq!(sorted.workers[0].owner_references()[0].uid, "job-uid");
        assert_eq!(names(&sorted.ps), ["j-ps-5d8f-pod"]);
        assert_eq!(sorted.ps[0].labels()["pod-template-hash"], "5d8f");
        // Before the worker Job exists, no pod is a worker.
        let none = JobPods::sorted(vec![owned("Job", "j-workers", "job-uid", None)], &[], &Job::default());
        assert!(none.workers.is_empty() && none.ps.is_empty());
    }

    #[test]
    fn only_a_record_in_a_pod_of_this_worker_job_counts() {
        let record = |v: u64| {
            format!(r#"{{"finalModel":{{"version":{v},"path":"/models/j/model-final.safetensors"}}}}"#)
        };
        let (r7, r9) = (record(7), record(9));
        let pods = [pod("job", true, None), pod("job", true, Some("exit 0")), pod("job", true, Some(&r7))];
        let found = final_model_in(&pods, "job").expect("the last worker's record");
        assert_eq!(found.version, 7);
        assert_eq!(found.path.as_deref(), Some("/models/j/model-final.safetensors"));
        // An earlier worker Job's pod, or a pod that only refers to the Job, proves nothing.
        assert_eq!(final_model_in(&[pod("old-job", true, Some(&r9))], "job"), None);
        assert_eq!(final_model_in(&[pod("job", false, Some(&r9))], "job"), None);
        assert_eq!(final_model_in(&[pod("job", true, None), pod("job", true, Some("{}"))], "job"), None);
    }
}
