//! The TrainingJob's state machine: from what the reconciler observed (the worker Job, the
//! parameter server, pending pods, the final model) to the phase, the conditions and the
//! transitions to report as Events. Pure: no I/O, tested with plain values.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::trouble::{Trouble, is_trouble_reason};
use crate::api::{
    DefaultImages, FinalModelStatus, ParameterServerStatus, Phase, Progress, TrainingJobStatus, WorkersStatus,
};
use crate::controller::kueue::Admission;
use crate::controller::names::ModelPlace;

/// The worker Job as the Job controller reports it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorkerJob {
    pub active: u32,
    pub ready: u32,
    pub succeeded: u32,
    pub failed: u32,
    /// Pods that failed in the job's earlier worker Jobs (replaced to apply a template change).
    pub failed_earlier: u32,
    /// The Job is suspended and no pod of it runs or terminates.
    pub stopped: bool,
    /// The Job's `Complete` condition is true: every index succeeded.
    pub complete: bool,
    /// The Job's `Failed` condition (reason, message): backoff limit or deadline.
    pub failed_condition: Option<(String, String)>,
    /// How the latest failed worker pod ended (`trouble::last_worker_failure`).
    pub last_failure: Option<String>,
}

impl WorkerJob {
    /// "; the last failed worker: pod P, container C: OOMKilled (exit code 137)", or nothing.
    fn last_failure_note(&self) -> String {
        self.last_failure.as_ref().map_or(String::new(), |f| format!("; the last failed worker: {f}"))
    }
}

/// Where the final model stands once the workers are done.
#[derive(Clone, Debug, PartialEq)]
pub enum Finalize {
    /// Not attempted (workers still running).
    NotYet,
    /// `/v1/finalize` answered: the final model is written, at `path` in the PS's filesystem;
    /// `earlier`: where an earlier run's model found in its place was kept.
    Done { version: u64, path: Option<String>, earlier: Option<String> },
    /// It failed (the PS unreachable, a write error); the reconciler retries.
    Failed(String),
    /// The reconciler gave up retrying and no worker recorded the model: the job fails.
    GaveUp(String),
}

/// A sharded parameter server's pods: how many shards there are, and how many are ready.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ShardsReady {
    pub count: u32,
    pub ready: u32,
}

/// Everything the phase depends on.
#[derive(Clone, Debug, PartialEq)]
pub struct Observed {
    pub generation: Option<i64>,
    pub replicas: u32,
    /// The label selector of the worker pods (the scale subresource's).
    pub worker_selector: String,
    /// `workers.minReplicas`: ready workers enough to call the job Running (asynchronous rules).
    pub min_replicas: Option<u32>,
    pub backoff_limit: Option<u32>,
    pub suspend: bool,
    /// Kueue's say (`NotQueued` for a job not labelled for a queue).
    pub admission: Admission,
    /// The worker Job; `None` before it exists.
    pub workers: Option<WorkerJob>,
    pub ps_ready: bool,
    /// Shards with a ready pod, of how many (`None` for an unsharded parameter server).
    pub ps_shards: Option<ShardsReady>,
    /// Whether the scheduler placed the job's pods.
    pub placement: Placement,
    /// Pods that cannot start or keep failing, the parameter server's first.
    pub trouble: Option<Trouble>,
    /// Whether that has outlasted what the job allows.
    pub trouble_bound: TroubleBound,
    /// Spec changes the children do not have (yet), each saying why.
    pub deferred: Vec<String>,
    /// `runPolicy.activeDeadlineSeconds` when the job has been active longer (`active_since`).
    pub deadline_exceeded: Option<u64>,
    pub finalize: Finalize,
    /// Where the final model goes.
    pub model_place: ModelPlace,
    /// The default images this reconcile used (`None`: it built no children; keep the record).
    pub default_images: Option<DefaultImages>,
    /// Fresh progress from the PS (`None`: keep the last one).
    pub progress: Option<Progress>,
    /// The PS process that answered that read (`None`: not read this time).
    pub ps_process: Option<PsProcess>,
    /// The job was Running or Restarting at the last reconcile: it has started, and never goes
    /// back to Created (a worker pod that finished, or was replaced, is briefly not ready before
    /// the Job counts it).
    pub has_run: bool,
}

/// Whether pods' trouble has outlasted what the job allows: then it fails the job.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TroubleBound {
    #[default]
    Within,
    /// Failing longer than the operator's bound (`--stuck-pods-timeout-seconds`).
    TimedOut,
    /// The parameter server restarted more often than `runPolicy.backoffLimit` (its message says so).
    RestartsExhausted,
}

/// What the scheduler did with the job's pods.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Placement {
    /// Every pod is placed, or the scheduler has not looked at it yet.
    #[default]
    Scheduled,
    /// A pod waits for a claim it mounts to be bound (the scheduler calls this Unschedulable too,
    /// but a provisioner usually binds the claim within seconds): which pod and claims.
    WaitingForClaims(String),
    /// The scheduler's message for a worker or PS pod it cannot place.
    Unschedulable(String),
}

/// What the scheduler's Unschedulable verdict on `pod` (its message) means, given the claims it
/// mounts that are not bound yet. A pod turned away only because a claim is still being
/// provisioned waits for its claims; so does one turned away for "unbound immediate" claims that
/// are bound by now — the verdict predates the binding, and the scheduler tries the pod again on
/// it (seen on the real node: the output claim bound a moment after the PS pod's first attempt,
/// and the job was reported Unschedulable). Anything else makes the job Unschedulable.
pub fn unschedulable_pod(pod: &str, message: &str, unbound: &[&str]) -> Placement {
    const UNBOUND_IMMEDIATE: &str = "pod has unbound immediate PersistentVolumeClaims";
    match unbound {
        [] if message.contains(UNBOUND_IMMEDIATE) => Placement::WaitingForClaims(format!(
            "{pod} waits for the scheduler to try again now that its claims are bound"
        )),
        [] => Placement::Unschedulable(format!("{pod}: {message}")),
        claims => {
            Placement::WaitingForClaims(format!("{pod} waits for claim(s) {} to be bound", claims.join(", ")))
        }
    }
}

/// The parameter server process that answered `/v1/status`.
#[derive(Clone, Debug, PartialEq)]
pub struct PsProcess {
    /// Random, new in every process.
    pub incarnation: String,
    pub started_at: Time,
    /// The checkpoint version it restored at start; `None`: it started without a model.
    pub restored_version: Option<u64>,
    /// The update rule it applies.
    pub algorithm: Option<String>,
}

impl PsProcess {
    /// The `ParameterServerRestarted` condition's reason and message for this process.
    fn restart(&self) -> (&'static str, String) {
        match self.restored_version {
            Some(v) => (
                "RestoredCheckpoint",
                format!("the parameter server restarted and restored its newest checkpoint (version {v}); workers continue from it"),
            ),
            None => (
                "StartedWithoutCheckpoint",
                "the parameter server restarted without a checkpoint (none kept: no checkpoint.storage, or none written yet); the workers re-seed it from their copies of the model".into(),
            ),
        }
    }
}

/// A phase with the reason and message that explain it.
#[derive(Clone, Debug, PartialEq)]
pub struct State {
    pub phase: Phase,
    pub reason: String,
    pub message: String,
}

impl State {
    fn new(phase: Phase, reason: &str, message: impl Into<String>) -> Self {
        Self { phase, reason: reason.into(), message: message.into() }
    }

    /// Phases after which nothing runs again.
    pub fn is_finished(&self) -> bool {
        matches!(self.phase, Phase::Succeeded | Phase::Failed)
    }

    /// Whether a user should look at it (Event type Warning).
    pub fn is_warning(&self) -> bool {
        matches!(self.phase, Phase::Failed | Phase::Restarting)
            || self.reason == "Unschedulable"
            || is_trouble_reason(&self.reason)
    }
}

/// The phase the observations call for.
pub fn decide(o: &Observed) -> State {
    let Some(w) = &o.workers else {
        return State::new(Phase::Created, "Creating", "creating the parameter server and the workers");
    };
    if let Some((reason, message)) = &w.failed_condition {
        return State::new(
            Phase::Failed,
            reason,
            format!("the worker Job failed: {message}{}", w.last_failure_note()),
        );
    }
    let ended = w.complete && matches!(o.finalize, Finalize::Done { .. } | Finalize::GaveUp(_));
    if let Some(seconds) = o.deadline_exceeded.filter(|_| !ended) {
        let message = format!(
            "the job was active longer than runPolicy.activeDeadlineSeconds ({seconds} s), counted from its start or its latest resumption, waiting for the parameter server and finalizing included"
        );
        return State::new(Phase::Failed, "DeadlineExceeded", message);
    }
    if w.complete {
        return match &o.finalize {
            Finalize::Done { version, path, earlier } => State::new(
                Phase::Succeeded,
                "Completed",
                format!(
                    "{} workers finished; {}{}",
                    o.replicas,
                    where_the_model_is(*version, path, &o.model_place),
                    earlier_model(earlier, &o.model_place),
                ),
            ),
            // A pipeline waiting for Complete must not take a job without its model.
            Finalize::GaveUp(e) => State::new(
                Phase::Failed,
                "FinalModelNotWritten",
                format!(
                    "{} workers finished, but no worker recorded the final model and the parameter server could not be asked to write it: {e}",
                    o.replicas
                ),
            ),
            Finalize::Failed(e) => State::new(
                Phase::Running,
                "Finalizing",
                format!("workers finished; writing the final model failed, retrying: {e}"),
            ),
            Finalize::NotYet => {
                State::new(Phase::Running, "Finalizing", "workers finished; writing the final model")
            }
        };
    }
    if let Admission::Pending(why) = &o.admission {
        // Queued only once no worker runs: an evicted job stops its pods first.
        return if w.stopped {
            State::new(Phase::Queued, "Queued", why.clone())
        } else {
            State::new(if o.has_run { Phase::Running } else { Phase::Created }, "Requeuing", why.clone())
        };
    }
    if o.suspend {
        // Suspended only once it is true of the pods, not when the spec asks for it.
        return if w.stopped {
            State::new(
                Phase::Suspended,
                "Suspended",
                "runPolicy.suspend is true: workers stopped, the parameter server's checkpoint kept",
            )
        } else {
            State::new(
                if o.has_run { Phase::Running } else { Phase::Created },
                "Suspending",
                "runPolicy.suspend is true: stopping the worker pods",
            )
        };
    }
    // A PS restarting more often than backoffLimit fails the job whatever else holds: it runs
    // (and may turn ready) between crashes, and workers waiting for a node do not save it.
    if let (Some(t), TroubleBound::RestartsExhausted) = (&o.trouble, o.trouble_bound) {
        return State::new(Phase::Failed, &t.reason, t.message.clone());
    }
    match &o.placement {
        Placement::Unschedulable(msg) => {
            return State::new(Phase::Created, "Unschedulable", format!("pods cannot be scheduled: {msg}"));
        }
        // Once it has run, the phase says what is missing (the PS or workers not ready).
        Placement::WaitingForClaims(msg) if !o.has_run => {
            return State::new(Phase::Created, "WaitingForVolumes", msg.clone());
        }
        Placement::WaitingForClaims(_) | Placement::Scheduled => {}
    }
    let remaining = o.replicas.saturating_sub(w.succeeded);
    // Workers that must be ready for the job to train: all that have not finished, or
    // minReplicas of them (an asynchronous job trains on the ones it has).
    let needed = o.min_replicas.map_or(remaining, |m| m.min(remaining));
    let training = w.ready >= needed && o.ps_ready;
    // Pods that cannot start or keep failing, unless the job trains without them; named before
    // the workers' failures, which a parameter server that cannot run causes.
    if let Some(t) = o.trouble.as_ref().filter(|_| !training) {
        if o.trouble_bound == TroubleBound::TimedOut {
            let message = format!(
                "{}; failing for longer than the operator allows (--stuck-pods-timeout-seconds)",
                t.message
            );
            return State::new(Phase::Failed, &t.reason, message);
        }
        return State::new(
            if o.has_run { Phase::Restarting } else { Phase::Created },
            &t.reason,
            t.message.clone(),
        );
    }
    if w.failed > 0 && w.ready < needed {
        let limit = o.backoff_limit.map_or("6 (the default)".to_string(), |b| b.to_string());
        let failed = w.failed + w.failed_earlier;
        return State::new(
            Phase::Restarting,
            "WorkerFailed",
            format!(
                "{failed} worker pod(s) failed so far, replacing them; backoffLimit {limit}{}",
                w.last_failure_note()
            ),
        );
    }
    if w.ready >= needed && !o.ps_ready {
        return State::new(
            if o.has_run { Phase::Restarting } else { Phase::Created },
            "ParameterServerNotReady",
            "waiting for the parameter server to become ready",
        );
    }
    if w.ready >= needed {
        return State::new(
            Phase::Running,
            "WorkersRunning",
            format!("{} of {} workers running, {} finished", w.ready, o.replicas, w.succeeded),
        );
    }
    let ps = if o.ps_ready { "ready" } else { "not ready" };
    if o.has_run {
        return State::new(
            Phase::Running,
            "WorkersNotAllReady",
            format!(
                "{} of {remaining} workers ready, {} finished; parameter server {ps}",
                w.ready, w.succeeded
            ),
        );
    }
    State::new(
        Phase::Created,
        "Starting",
        format!("{} of {remaining} workers ready; parameter server {ps}", w.ready),
    )
}

/// What the Succeeded condition says about the final model: only what was done.
fn where_the_model_is(version: u64, path: &Option<String>, place: &ModelPlace) -> String {
    let located = path.as_deref().and_then(|p| place.locate(p));
    match (place, located) {
        (ModelPlace::Output { .. }, Some((claim, file))) => {
            format!(
                "final model (version {version}) written to claim {claim} at {file}; the claim outlives the job"
            )
        }
        (ModelPlace::CheckpointClaim { .. }, Some((claim, file))) => format!(
            "final model (version {version}) written to the checkpoint claim {claim} at {file}, which is deleted with the job: set spec.output to keep the model"
        ),
        _ => format!(
            "final model (version {version}) written to the parameter server's emptyDir, which is removed with it: set spec.output to keep the model"
        ),
    }
}

/// What the status says of an earlier run's final model found where this one was written.
fn earlier_model(earlier: &Option<String>, place: &ModelPlace) -> String {
    match earlier.as_deref().map(|p| place.locate(p).map_or_else(|| p.to_string(), |(_, file)| file)) {
        Some(file) => format!("; an earlier run's model-final.safetensors was there and is kept as {file}"),
        None => String::new(),
    }
}

/// Each condition type and the phase it is true in. `Complete` is `Succeeded` under the name a
/// batch Job's terminal condition has; `Stalled` is `Failed` under the name kstatus (Flux,
/// `kubectl wait`'s and Argo CD's conventions) reads as a resource that failed: without it a
/// failed job counted as reconciled ("Current").
const CONDITION_TYPES: [(Phase, &str); 9] = [
    (Phase::Created, "Created"),
    (Phase::Queued, "Queued"),
    (Phase::Running, "Running"),
    (Phase::Restarting, "Restarting"),
    (Phase::Succeeded, "Succeeded"),
    (Phase::Succeeded, "Complete"),
    (Phase::Failed, "Failed"),
    (Phase::Failed, "Stalled"),
    (Phase::Suspended, "Suspended"),
];

/// kstatus's condition of a resource still on its way (its phase is Created, Queued or
/// Restarting): True there, False once the job runs, is suspended or has ended.
const RECONCILING: &str = "Reconciling";

/// The next status: `state` as phase and conditions (a condition's lastTransitionTime changes
/// only when its status does), counts, progress, start and completion time.
pub fn next_status(old: &TrainingJobStatus, o: &Observed, state: &State, now: &Time) -> TrainingJobStatus {
    let created = o.workers.is_some();
    let mut conditions = Vec::new();
    for (phase, type_) in CONDITION_TYPES {
        let previous = old.conditions.iter().find(|c| c.type_ == type_);
        let (status, reason, message) = match phase {
            Phase::Created if created => {
                ("True", "ChildrenCreated", "parameter server and worker Job created".into())
            }
            Phase::Created => ("False", state.reason.as_str(), state.message.clone()),
            p if p == state.phase => ("True", state.reason.as_str(), state.message.clone()),
            // Running is always shown; the others only once they have been true.
            Phase::Running => ("False", state.reason.as_str(), state.message.clone()),
            _ if previous.is_some() => ("False", state.reason.as_str(), state.message.clone()),
            _ => continue,
        };
        conditions.push(condition(old, type_, status, reason, message, now, o.generation));
    }
    let (parameter_server, restarted) = next_ps_status(old.parameter_server.as_ref(), o);
    if let Some(process) = restarted {
        let (reason, message) = process.restart();
        conditions.push(Condition {
            type_: PS_RESTARTED.into(),
            status: "True".into(),
            reason: reason.into(),
            message,
            last_transition_time: now.clone(),
            observed_generation: o.generation,
        });
    } else if let Some(c) = old.conditions.iter().find(|c| c.type_ == PS_RESTARTED) {
        conditions.push(c.clone());
    }
    let on_its_way = matches!(state.phase, Phase::Created | Phase::Queued | Phase::Restarting);
    let reconciling = if on_its_way { "True" } else { "False" };
    conditions.push(condition(
        old,
        RECONCILING,
        reconciling,
        &state.reason,
        state.message.clone(),
        now,
        o.generation,
    ));
    conditions.extend(spec_applied(old, o, created, now));
    conditions.extend(pods_failing(old, o, state, now));
    // This reconcile got this far: a failure the condition reported is over.
    if let Some(c) = old.conditions.iter().find(|c| c.type_ == RECONCILE_FAILED) {
        conditions.push(match c.status.as_str() {
            "True" => Condition {
                type_: RECONCILE_FAILED.into(),
                status: "False".into(),
                reason: "Reconciled".into(),
                message: format!("reconciled again after: {}", c.message),
                last_transition_time: now.clone(),
                observed_generation: o.generation,
            },
            _ => c.clone(),
        });
    }
    let w = o.workers.clone().unwrap_or_default();
    let mut progress = o.progress.clone().or_else(|| old.progress.clone());
    // Progress is read at most once per period while training; the final model's version is
    // the last word on how far it went (seen on the real node: step 588 shown, 640 final).
    let mut final_model = old.final_model.clone();
    if let Finalize::Done { version, path, .. } = &o.finalize {
        progress.get_or_insert_default().step = *version;
        if let Some((claim, file)) = path.as_deref().and_then(|p| o.model_place.locate(p)) {
            let kept = matches!(o.model_place, ModelPlace::Output { .. });
            final_model =
                Some(FinalModelStatus { version: *version, claim_name: Some(claim), path: file, kept });
        }
    }
    TrainingJobStatus {
        phase: Some(state.phase),
        reason: Some(state.reason.clone()),
        conditions,
        observed_generation: o.generation,
        workers: Some(WorkersStatus {
            desired: o.replicas,
            ready: w.ready,
            active: w.active,
            succeeded: w.succeeded,
            failed: w.failed,
            failed_earlier: w.failed_earlier,
            selector: o.worker_selector.clone(),
        }),
        parameter_server: Some(parameter_server),
        progress,
        final_model,
        start_time: old.start_time.clone().or_else(|| created.then(|| now.clone())),
        completion_time: old.completion_time.clone().or_else(|| state.is_finished().then(|| now.clone())),
        default_images: o.default_images.clone().or_else(|| old.default_images.clone()),
        defaulted_queue: old.defaulted_queue.clone(),
    }
}

/// When the job last became active: its start, or the end of its latest suspension or wait for
/// Kueue, whichever is later (so a resumed job's deadline counts from the resumption, as a batch
/// Job's does); `None` before it started and while it is suspended or queued.
pub fn active_since(old: &TrainingJobStatus) -> Option<Time> {
    let mut since = old.start_time.clone()?;
    for c in old.conditions.iter().filter(|c| c.type_ == "Suspended" || c.type_ == "Queued") {
        if c.status == "True" {
            return None;
        }
        if c.last_transition_time.0 > since.0 {
            since = c.last_transition_time.clone();
        }
    }
    Some(since)
}

/// Condition `type_` as it is now, with the lastTransitionTime it had in `old` while its status
/// stays the same.
fn condition(
    old: &TrainingJobStatus,
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
    now: &Time,
    generation: Option<i64>,
) -> Condition {
    let last_transition_time = match old.conditions.iter().find(|c| c.type_ == type_) {
        Some(p) if p.status == status => p.last_transition_time.clone(),
        _ => now.clone(),
    };
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        last_transition_time,
        observed_generation: generation,
    }
}

/// Whether the children have this generation's spec (`observedGeneration` says only that the
/// operator has seen it); none before there are children.
fn spec_applied(old: &TrainingJobStatus, o: &Observed, created: bool, now: &Time) -> Option<Condition> {
    if !created {
        return None;
    }
    let (status, reason, message) = match o.deferred.as_slice() {
        [] => (
            "True",
            "Applied",
            format!("the children have generation {} of the spec", o.generation.unwrap_or(0)),
        ),
        waiting => ("False", "ChangeDeferred", waiting.join("; ")),
    };
    Some(condition(old, SPEC_APPLIED, status, reason, message, now, o.generation))
}

/// Whether pods fail to start or keep failing (the trouble that decided `state`); its
/// lastTransitionTime tells since when. Shown once it has been true.
fn pods_failing(old: &TrainingJobStatus, o: &Observed, state: &State, now: &Time) -> Option<Condition> {
    let failing = o.trouble.as_ref().filter(|t| t.reason == state.reason);
    let (status, reason, message) = match failing {
        Some(t) => ("True", t.reason.as_str(), t.message.clone()),
        None if old.conditions.iter().any(|c| c.type_ == PODS_FAILING) => {
            ("False", "PodsRunning", "no pod of the job is failing to start".to_string())
        }
        None => return None,
    };
    Some(condition(old, PODS_FAILING, status, reason, message, now, o.generation))
}

/// The condition that says whether the children have the spec's current generation.
pub const SPEC_APPLIED: &str = "SpecApplied";

/// The condition that says pods cannot start or keep failing (`trouble`), and since when.
pub const PODS_FAILING: &str = "PodsFailing";

/// The condition that says the parameter server restarted (the latest restart).
pub const PS_RESTARTED: &str = "ParameterServerRestarted";

/// The PS's status, and the process that answered if it is a new one (a restart). The first
/// process ever seen is a restart only if it restored a checkpoint: the checkpoint claim is the
/// job's own, so a predecessor wrote it — one that died before any operator recorded it (the
/// operator itself may have been replaced in the meantime).
fn next_ps_status<'a>(
    old: Option<&ParameterServerStatus>,
    o: &'a Observed,
) -> (ParameterServerStatus, Option<&'a PsProcess>) {
    let old = old.cloned().unwrap_or_default();
    let mut new = ParameterServerStatus {
        ready: o.ps_ready,
        shards: o.ps_shards.map(|s| s.count),
        ready_shards: o.ps_shards.map(|s| s.ready),
        ..old.clone()
    };
    let Some(p) = &o.ps_process else {
        return (new, None);
    };
    let restarted = match &old.incarnation {
        Some(seen) => *seen != p.incarnation,
        None => p.restored_version.is_some(),
    };
    new.incarnation = Some(p.incarnation.clone());
    new.started_at = Some(p.started_at.clone());
    new.algorithm = p.algorithm.clone();
    if restarted {
        new.restarts += 1;
    }
    (new, restarted.then_some(p))
}

/// The condition that says the last reconcile failed, and why (False once one succeeds again).
pub const RECONCILE_FAILED: &str = "ReconcileFailed";

/// `old` with the `ReconcileFailed` condition True for this failure (its lastTransitionTime
/// kept while it stays True, so a retry failing the same way changes nothing).
pub fn with_reconcile_failure(
    old: &TrainingJobStatus,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) -> TrainingJobStatus {
    let mut new = old.clone();
    let previous = old.conditions.iter().find(|c| c.type_ == RECONCILE_FAILED);
    let since = previous.filter(|c| c.status == "True").map_or(now, |c| &c.last_transition_time).clone();
    new.conditions.retain(|c| c.type_ != RECONCILE_FAILED);
    new.conditions.push(Condition {
        type_: RECONCILE_FAILED.into(),
        status: "True".into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: since,
        observed_generation: generation,
    });
    new
}

/// The Warning to record when the status shows a parameter server restart it did not before.
pub fn ps_restart_event(old: &TrainingJobStatus, new: &TrainingJobStatus) -> Option<String> {
    let count = |s: &TrainingJobStatus| s.parameter_server.as_ref().map_or(0, |p| p.restarts);
    if count(new) <= count(old) {
        return None;
    }
    new.conditions.iter().find(|c| c.type_ == PS_RESTARTED).map(|c| c.message.clone())
}

/// The transition to report as an Event: the phase or its reason changed. (The Running
/// condition, always present, carries the reason of the current state, true or false.)
pub fn transition(old: &TrainingJobStatus, state: &State) -> Option<State> {
    let old_reason = old.conditions.iter().find(|c| c.type_ == "Running").map(|c| c.reason.as_str());
    (old.phase != Some(state.phase) || old_reason != Some(state.reason.as_str())).then(|| state.clone())
}

#[cfg(test)]
mod tests;
