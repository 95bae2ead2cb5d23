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
use crate::controller::names::{self, COMPONENT_PS};

/// The job's pods that cannot start or keep failing (`trouble`): the parameter server's first,
/// since workers fail for want of it.
pub(crate) async fn trouble(
    ctx: &Context,
    owner: &Owner<'_>,
    ps: &[Deployment],
    workers: &Job,
) -> Result<Option<Trouble>> {
    if let Some(t) = ps.iter().find_map(trouble::deployment_trouble) {
        return Ok(Some(t));
    }
    let pods = ctx.caches.pods(&owner.namespace, &owner.name);
    let role = |p: &Pod| match p.labels().get(names::LABEL_COMPONENT).map(String::as_str) {
        Some(COMPONENT_PS) => Role::ParameterServer,
        _ => Role::Workers,
    };
    let of = |r: Role| pods.iter().filter(|p| role(p) == r).find_map(|p| trouble::pod_trouble(r, p));
    if let Some(t) = of(Role::ParameterServer) {
        return Ok(Some(t));
    }
    if let Some(t) = worker_creation_trouble(ctx, owner, workers).await? {
        return Ok(Some(t));
    }
    Ok(of(Role::Workers))
}

/// The parameter server's pods whose containers restarted more often than `limit`
/// (`trouble::ps_restarts_exhausted`).
pub(crate) fn ps_restarts_exhausted(ctx: &Context, owner: &Owner<'_>, limit: u32) -> Option<Trouble> {
    let pods = ctx.caches.pods(&owner.namespace, &owner.name);
    let ps: Vec<&Pod> = pods
        .iter()
        .filter(|p| p.labels().get(names::LABEL_COMPONENT).map(String::as_str) == Some(COMPONENT_PS))
        .map(|p| p.as_ref())
        .collect();
    trouble::ps_restarts_exhausted(&ps, limit)
}

/// How the latest failed worker pod of the job ended (`trouble::last_worker_failure`).
pub(crate) fn last_worker_failure(ctx: &Context, owner: &Owner<'_>) -> Option<String> {
    let pods = ctx.caches.pods(&owner.namespace, &owner.name);
    let workers: Vec<&Pod> = pods
        .iter()
        .filter(|p| p.labels().get(names::LABEL_COMPONENT).map(String::as_str) != Some(COMPONENT_PS))
        .map(|p| p.as_ref())
        .collect();
    trouble::last_worker_failure(&workers)
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
pub(crate) async fn placement(ctx: &Context, owner: &Owner<'_>) -> Result<Placement> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let mut waiting = None;
    for pod in ctx.caches.pods(&owner.namespace, &owner.name) {
        let Some(message) = unschedulable_condition(&pod) else { continue };
        let who = if pod.labels().get(names::LABEL_COMPONENT).map(String::as_str) == Some(COMPONENT_PS) {
            "parameter server"
        } else {
            "worker"
        };
        let mut unbound = Vec::new();
        for name in claim_names(&pod) {
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
