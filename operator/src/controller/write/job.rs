//! Writes to the TrainingJob itself: its status, its Events, and its deletion after its TTL.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};

use crate::api::{TrainingJob, TrainingJobStatus};
use crate::controller::context::Context;
use crate::controller::decide::status::{self, Observed, State};
use crate::controller::desired::children::Owner;
use crate::controller::error::{Result, is_status};
use crate::controller::names::MANAGER;
use crate::controller::telemetry::metrics::phase_name;

#[allow(clippy::too_many_arguments)]
pub(crate) async fn write_status(
    ctx: &Context,
    job: &TrainingJob,
    owner: &Owner<'_>,
    old: &TrainingJobStatus,
    observed: &Observed,
    state: &State,
    now: &Time,
) -> Result<TrainingJobStatus> {
    let new = status::next_status(old, observed, state, now);
    if &new != old {
        let api: Api<TrainingJob> = Api::namespaced(ctx.client.clone(), &owner.namespace);
        let patch = status_patch(job, &new);
        api.patch_status(&owner.name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(patch)).await?;
    }
    if let Some(t) = status::transition(old, state) {
        tracing::info!(phase = phase_name(t.phase), reason = %t.reason, message = %t.message, "transition");
        let type_ = if t.is_warning() { EventType::Warning } else { EventType::Normal };
        publish(ctx, job, type_, &t.reason, phase_name(t.phase), &t.message).await;
    }
    if let Some(message) = status::ps_restart_event(old, &new) {
        tracing::warn!(%message, "parameter server restarted");
        publish(ctx, job, EventType::Warning, status::PS_RESTARTED, "WatchParameterServer", &message).await;
    }
    Ok(new)
}

/// The server-side apply of `status`, conditional on the job's resourceVersion: a reconcile
/// that started from an older copy of the job (the watch had not yet brought this operator's
/// own last write) gets a conflict and runs again, instead of writing older progress over
/// newer (seen on the real node: step 1536, then 1320 again, then 1536).
pub(crate) fn status_patch(job: &TrainingJob, status: &TrainingJobStatus) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": TrainingJob::api_version(&()),
        "kind": TrainingJob::kind(&()),
        "metadata": {"resourceVersion": job.metadata.resource_version},
        "status": status,
    })
}

/// Records an Event about the job (a failure to record is logged, not fatal).
pub(crate) async fn publish(
    ctx: &Context,
    job: &TrainingJob,
    type_: EventType,
    reason: &str,
    action: &str,
    message: &str,
) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(message.chars().take(1000).collect()),
        action: action.into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &job.object_ref(&())).await {
        tracing::warn!(error = %e, "could not record the event");
    }
}

/// `ttlSecondsAfterFinished`: deletes the job (and, through the garbage collector, everything
/// it owns) that long after it finished.
pub(crate) async fn expire(
    ctx: &Context,
    job: &TrainingJob,
    owner: &Owner<'_>,
    status: &TrainingJobStatus,
) -> Result<Action> {
    let (Some(ttl), Some(done)) = (job.spec.run_policy.ttl_seconds_after_finished, &status.completion_time)
    else {
        return Ok(Action::await_change());
    };
    let left = ttl as f64 - Timestamp::now().duration_since(done.0).as_secs_f64();
    if left > 0.0 {
        return Ok(Action::requeue(Duration::from_secs_f64(left)));
    }
    let api: Api<TrainingJob> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    // By UID: a job deleted and made again under the same name since this one finished is
    // another job, and is refused (409) rather than deleted.
    let params = DeleteParams {
        preconditions: Some(Preconditions { uid: Some(owner.uid().to_string()), resource_version: None }),
        ..DeleteParams::background()
    };
    match api.delete(&owner.name, &params).await {
        Ok(_) => tracing::info!(ttl, "deleted the finished job (ttlSecondsAfterFinished)"),
        Err(e) if is_status(&e, 404) || is_status(&e, 409) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(Action::await_change())
}
