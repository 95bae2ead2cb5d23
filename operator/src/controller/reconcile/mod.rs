//! One job, once: the only code that sees observe, decide and write together. `reconcile_job`
//! is the spine: apply the children, read back what runs, move the state machine, write the
//! status and the Events, finalize, remove the PS after the end.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use crate::api::{DEFAULT_BACKOFF_LIMIT, Phase, Progress, TrainingJob, TrainingJobStatus};
use crate::controller::context::Context;
use crate::controller::decide::status::{
    self, Finalize, Observed, Placement, PsProcess, ShardsReady, State, TroubleBound, WorkerJob,
};
use crate::controller::desired::children::{ChildDefaults, Owner};
use crate::controller::error::{Error, Result};
use crate::controller::kueue::{Admission, admission};
use crate::controller::names::{self, MANAGER};
use crate::controller::observe::children::{job_defaults, worker_state};
use crate::controller::observe::pods;
use crate::controller::observe::ps::{
    PsAddr, accepted_control_token, progress_of, ps_process_of, read_ps_status,
};
use crate::controller::telemetry::metrics::phase_name;
use crate::controller::write::children::{PodChildren, apply_pod_children, apply_stable_children, remove_ps};
use crate::controller::write::job::{expire, publish, status_patch, write_status};
use crate::controller::write::ps::{finalize, tell_ps_workers};

pub(crate) mod backoff;

pub(crate) fn error_policy(job: Arc<TrainingJob>, error: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx.backoffs.next(job.metadata.uid.as_deref().unwrap_or_default());
    tracing::warn!(job = %job.name_any(), namespace = ?job.namespace(), %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

#[tracing::instrument(skip_all, fields(job = %job.name_any(), namespace = job.namespace().unwrap_or_default()))]
pub(crate) async fn reconcile(job: Arc<TrainingJob>, ctx: Arc<Context>) -> Result<Action> {
    if let Some(lease) = job.metadata.namespace.as_deref().and_then(|ns| ctx.yields.holder(ns)) {
        // Another operator handles this namespace's jobs; look again after the next survey.
        tracing::debug!(job = %job.name_any(), %lease, "left to another operator");
        let every = ctx.settings.lease.as_ref().map_or(Duration::from_secs(60), |l| {
            crate::controller::leadership::survey_every(l.lease_duration)
        });
        return Ok(Action::requeue(every));
    }
    let timer = ctx.metrics.reconcile_seconds.with_label_values(&[] as &[&str]).start_timer();
    let result = reconcile_job(&job, &ctx).await;
    timer.observe_duration();
    let outcome = if result.is_ok() { "success" } else { "error" };
    ctx.metrics.reconciles.with_label_values(&[outcome]).inc();
    match &result {
        Ok(_) => ctx.backoffs.reset(job.metadata.uid.as_deref().unwrap_or_default()),
        Err(e) => {
            ctx.metrics.reconcile_errors.with_label_values(&[e.metric_reason()]).inc();
            // A conflict is optimistic concurrency doing its job: the retry reads anew.
            if !e.is_conflict() {
                report_failure(&job, &ctx, e).await;
            }
        }
    }
    result
}

/// Tells the user why the job is stuck: a Warning event and the `ReconcileFailed` condition
/// (the phase stays what was last reached). Best effort: the failure may be one that stops
/// these writes too.
pub(crate) async fn report_failure(job: &TrainingJob, ctx: &Context, error: &Error) {
    let (Some(name), Some(namespace)) = (job.metadata.name.as_deref(), job.metadata.namespace.as_deref())
    else {
        return;
    };
    let old = job.status.clone().unwrap_or_default();
    let reason = error.condition_reason();
    let message = error.to_string();
    let new = status::with_reconcile_failure(
        &old,
        &reason,
        &message,
        job.metadata.generation,
        &Time(Timestamp::now()),
    );
    if new == old {
        return; // reported already: the same failure again
    }
    publish(ctx, job, EventType::Warning, status::RECONCILE_FAILED, "Reconcile", &message).await;
    let api: Api<TrainingJob> = Api::namespaced(ctx.client.clone(), namespace);
    let patch = status_patch(job, &new);
    if let Err(e) = api.patch_status(name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(patch)).await {
        tracing::warn!(error = %e, "could not record the failure in the status");
    }
}

/// The spine of a reconcile: write the children, observe what runs, decide the job's state,
/// write the status; after the end, remove what the job no longer needs.
pub(crate) async fn reconcile_job(job: &TrainingJob, ctx: &Context) -> Result<Action> {
    if job.metadata.deletion_timestamp.is_some() {
        // The garbage collector removes the children (owner references).
        return Ok(Action::await_change());
    }
    let owner = Owner::new(job).ok_or(Error::Incomplete)?;
    ctx.caches.ready().await;
    let old = job.status.clone().unwrap_or_default();
    if matches!(old.phase, Some(Phase::Succeeded | Phase::Failed)) {
        return after_the_end(ctx, job, &owner, &old).await;
    }
    let now = Time(Timestamp::now());
    if let Some(message) = invalid_spec(job, &owner) {
        // The CRD's rules refuse such a job; this catches a CRD older than the operator.
        let state = State { phase: Phase::Failed, reason: "InvalidSpec".into(), message };
        write_status(ctx, job, &owner, &old, &observed_nothing(job), &state, &now).await?;
        return Ok(Action::await_change());
    }
    if admission::default_queue(ctx, job, &owner).await? {
        return Ok(Action::await_change());
    }

    let defaults = job_defaults(ctx, &owner, &old);
    let token = apply_stable_children(ctx, &owner, &defaults).await?;
    let admitted = admission::admit(ctx, job, &owner, &defaults).await?;
    let owner = owner.with_admission(admitted);
    let children = apply_pod_children(ctx, job, &owner, &defaults).await?;
    let seen = observe(ctx, job, &owner, &old, &defaults, token, children, &now).await?;

    let state = status::decide(&seen.observed);
    let new = write_status(ctx, job, &owner, &old, &seen.observed, &state, &now).await?;
    if state.is_finished() {
        return finished(ctx, job, &owner, &state, &new).await;
    }
    Ok(Action::requeue(next_look(ctx, state.phase, &seen)))
}

/// A job that has ended: its PS removed, its Workload marked finished, itself deleted after
/// its TTL.
async fn after_the_end(
    ctx: &Context,
    job: &TrainingJob,
    owner: &Owner<'_>,
    old: &TrainingJobStatus,
) -> Result<Action> {
    remove_ps(ctx, owner).await?;
    let reason = old.reason.clone().unwrap_or_default();
    admission::finish(ctx, owner, old.phase == Some(Phase::Succeeded), &reason).await?;
    expire(ctx, job, owner, old).await
}

/// What the operator's own validation says against the spec and the name, if anything.
fn invalid_spec(job: &TrainingJob, owner: &Owner<'_>) -> Option<String> {
    let mut invalid: Vec<String> =
        crate::api::validate(&job.spec).err().unwrap_or_default().iter().map(ToString::to_string).collect();
    invalid.extend(crate::api::validate_name(&owner.name).err().map(String::from));
    (!invalid.is_empty()).then(|| invalid.join("; "))
}

/// What a reconcile saw, for `decide` and for when to look again.
struct Seen {
    observed: Observed,
    /// Seconds left before runPolicy.activeDeadlineSeconds (negative: past it).
    deadline_left: Option<f64>,
}

/// Reads back what runs: the worker Job, the pods (placement, trouble), the PS (progress, its
/// process; the control token it takes) and, once the workers are done, the final model, which
/// asks the PS to finalize if no worker reported it.
#[allow(clippy::too_many_arguments)]
async fn observe(
    ctx: &Context,
    job: &TrainingJob,
    owner: &Owner<'_>,
    old: &TrainingJobStatus,
    defaults: &ChildDefaults,
    token: String,
    children: PodChildren,
    now: &Time,
) -> Result<Seen> {
    let PodChildren { ps: ps_deployments, ready_shards, workers, failed_earlier, deferred } = children;
    let shards = job.spec.parameter_server.shards() as u32;
    let ps_ready = ready_shards == shards;
    let pods = pods::JobPods::of(ctx, owner, &ps_deployments, &workers);
    let mut worker_job = WorkerJob { failed_earlier, ..worker_state(&workers) };
    if worker_job.failed > 0 {
        worker_job.last_failure = pods::last_worker_failure(&pods);
    }
    let placement = pods::placement(ctx, owner, &pods).await?;
    let backoff_limit = job.spec.run_policy.backoff_limit.unwrap_or(DEFAULT_BACKOFF_LIMIT);
    let (trouble, trouble_bound) = match pods::ps_restarts_exhausted(&pods, backoff_limit) {
        Some(t) => (Some(t), TroubleBound::RestartsExhausted),
        None => {
            let t = pods::trouble(ctx, owner, &pods, &ps_deployments, &workers).await?;
            let timed_out = t.is_some() && pods::trouble_older_than(old, ctx.settings.stuck_pods_timeout);
            (t, if timed_out { TroubleBound::TimedOut } else { TroubleBound::Within })
        }
    };
    let deadline = job.spec.run_policy.active_deadline_seconds;
    let deadline_left = deadline.and_then(|d| {
        let since = status::active_since(old)?;
        Some(d as f64 - now.0.duration_since(since.0).as_secs_f64())
    });
    let ps = ctx.ps_addr(owner, defaults.ps_tls);
    // Only when a call to the PS is due: a PS not ready (scaled to 0 by Kueue, starting) would
    // cost a request, up to its timeout, on every reconcile.
    let token = if ps_ready || worker_job.complete {
        accepted_control_token(ctx, &ps, owner.uid(), token).await
    } else {
        token
    };
    let (progress, ps_process) =
        if ps_ready { observe_ps(ctx, job, old, &ps, &token).await } else { (None, None) };
    let finalize = if worker_job.complete {
        match pods::final_model_reported(ctx, owner, &workers) {
            Some(m) => Finalize::Done { version: m.version, path: m.path, earlier: m.earlier },
            None => finalize(&ps, &token, &workers, ctx.settings.finalize_grace).await,
        }
    } else {
        Finalize::NotYet
    };
    let observed = Observed {
        generation: job.metadata.generation,
        replicas: job.spec.workers.replicas,
        worker_selector: names::worker_selector(&owner.name),
        min_replicas: job.spec.workers.min_replicas,
        backoff_limit: job.spec.run_policy.backoff_limit,
        suspend: job.spec.run_policy.suspend == Some(true),
        admission: owner.admission().clone(),
        workers: Some(worker_job),
        ps_ready,
        ps_shards: (shards > 1).then_some(ShardsReady { count: shards, ready: ready_shards }),
        placement,
        trouble,
        trouble_bound,
        deferred,
        deadline_exceeded: deadline.filter(|_| deadline_left.is_some_and(|l| l <= 0.0)),
        finalize,
        model_place: owner.model_place(),
        default_images: Some(defaults.into()),
        progress,
        ps_process,
        has_run: matches!(old.phase, Some(Phase::Running | Phase::Restarting)),
    };
    Ok(Seen { observed, deadline_left })
}

/// The job has just ended: its Workload finished, its PS removed, its duration counted, and
/// itself deleted after its TTL.
async fn finished(
    ctx: &Context,
    job: &TrainingJob,
    owner: &Owner<'_>,
    state: &State,
    new: &TrainingJobStatus,
) -> Result<Action> {
    ctx.forget_progress(owner.uid());
    admission::finish(ctx, owner, state.phase == Phase::Succeeded, &state.message).await?;
    remove_ps(ctx, owner).await?;
    if let (Some(start), Some(end)) = (&new.start_time, &new.completion_time) {
        let seconds = end.0.duration_since(start.0).as_secs_f64().max(0.0);
        ctx.metrics.job_duration.with_label_values(&[phase_name(state.phase)]).observe(seconds);
    }
    expire(ctx, job, owner, new).await
}

/// When to reconcile a running job again if nothing changes before.
fn next_look(ctx: &Context, phase: Phase, seen: &Seen) -> Duration {
    let next = match (phase, &seen.observed.finalize) {
        (_, Finalize::Failed(_)) => Duration::from_secs(5),
        // Failing pods fail the job once the bound has passed: look again by then.
        _ if seen.observed.trouble.is_some() => ctx.settings.stuck_pods_timeout.min(Duration::from_secs(60)),
        (Phase::Running, _) => ctx.settings.progress_every,
        // Watches bring every change of the children; this only bounds a missed one.
        _ => Duration::from_secs(60),
    };
    // And at the deadline.
    seen.deadline_left.filter(|l| *l > 0.0).map_or(next, |l| next.min(Duration::from_secs_f64(l + 0.5)))
}

pub(crate) fn observed_nothing(job: &TrainingJob) -> Observed {
    Observed {
        generation: job.metadata.generation,
        replicas: job.spec.workers.replicas,
        worker_selector: names::worker_selector(&job.name_any()),
        min_replicas: job.spec.workers.min_replicas,
        backoff_limit: job.spec.run_policy.backoff_limit,
        suspend: false,
        admission: Admission::NotQueued,
        workers: None,
        ps_ready: false,
        ps_shards: None,
        placement: Placement::Scheduled,
        trouble: None,
        trouble_bound: TroubleBound::Within,
        deferred: Vec::new(),
        deadline_exceeded: None,
        finalize: Finalize::NotYet,
        model_place: names::ModelPlace::EmptyDir,
        default_images: None,
        progress: None,
        ps_process: None,
        has_run: false,
    }
}

/// Reads the ready PS's `/v1/status` when it is due, and tells it the worker count if it has
/// another: the progress and the PS process, or `None`s (not due, or no answer: the last
/// progress stays in the status).
pub(crate) async fn observe_ps(
    ctx: &Context,
    job: &TrainingJob,
    old: &TrainingJobStatus,
    ps: &PsAddr,
    token: &str,
) -> (Option<Progress>, Option<PsProcess>) {
    let uid = job.metadata.uid.as_deref().unwrap_or_default();
    // A spec change (a new workers.replicas among others) reaches the PS at once; otherwise the
    // count it reports is checked with each periodic read (a restarted PS starts with the count
    // its Deployment was made with). A PS that has just become ready may be a new process: it is
    // read at once, so that its restart is seen even when the job ends before the next read.
    let spec_changed = job.metadata.generation != old.observed_generation;
    let came_up = !old.parameter_server.as_ref().is_some_and(|p| p.ready);
    if !(ctx.progress_due(uid) || spec_changed || came_up) {
        return (None, None);
    }
    let Some(status) = read_ps_status(ps, token).await else { return (None, None) };
    tell_ps_workers(ctx, job, ps, token, &status).await;
    (Some(progress_of(&status)), ps_process_of(&status))
}
