//! The job's children written: the stable ones (Secrets, Service, claims, guards) and those
//! that carry pod templates (the PS Deployments, the worker Job), and the PS removed after the end.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;
use kube::runtime::events::EventType;

use crate::api::TrainingJob;
use crate::controller::context::Context;
use crate::controller::desired::children::{self, ChildDefaults, Owner, WorkerJobUpdate};
use crate::controller::desired::ownership::Mark;
use crate::controller::desired::ps_tls::{self, created_s};
use crate::controller::error::Result;
use crate::controller::names::{self};
use crate::controller::observe::children::worker_state;
use crate::controller::write::job::publish;
use crate::controller::write::writes;

/// The children that do not wait for admission: the token Secret, the claims, the PS's
/// Services and what guards the PS (its NetworkPolicy and PodDisruptionBudget, when asked
/// for). Returns the control token, the operator's credential for its own calls to the PS
/// (status, rescale, finalize).
pub(crate) async fn apply_stable_children(
    ctx: &Context,
    owner: &Owner<'_>,
    defaults: &ChildDefaults,
) -> Result<String> {
    let (workers_token, token) =
        (ctx.settings.token_key.job_token(owner.uid()), ctx.settings.token_key.control_token(owner.uid()));
    let ns = &owner.namespace;
    writes::create_once(ctx, ns, &owner.secret_name(defaults), || {
        Ok(owner.secret(defaults, &workers_token, &token))
    })
    .await?;
    if defaults.ps_tls {
        writes::create_once(ctx, ns, &owner.tls_secret_name(defaults), || {
            let names = ps_tls::server_names(owner.ps_service_names(), ns);
            let certs = ps_tls::issue(&ctx.settings.token_key, owner.uid(), created_s(owner.job), names)?;
            Ok(owner.tls_secret(defaults, &certs))
        })
        .await?;
    }
    let own = owner.mark();
    for pvc in owner.pvcs() {
        let seen = ctx.caches.claim(&owner.namespace, &pvc.name_any());
        writes::apply(ctx, pvc, seen, own).await?;
    }
    if let Some(pvc) = owner.output_pvc() {
        let seen = ctx.caches.claim(&owner.namespace, &pvc.name_any());
        writes::apply(ctx, pvc, seen, Mark::Labels { job: &owner.name }).await?;
    }
    for shard in owner.ps_shards() {
        let service = owner.ps_service(shard, defaults.ps_tls);
        let seen = ctx.caches.service(&owner.namespace, &service.name_any());
        writes::apply(ctx, service, seen, own).await?;
    }
    if let Some(peers) = &ctx.settings.ps_ingress_from {
        let policy = owner.ps_network_policy(peers);
        let seen = ctx.caches.network_policy(&owner.namespace, &policy.name_any());
        writes::apply(ctx, policy, seen, own).await?;
    }
    let budget = owner.ps_disruption_budget();
    let seen = ctx.caches.disruption_budget(&owner.namespace, &budget.name_any());
    match (owner.job.spec.parameter_server.disruption_budget == Some(true), seen) {
        (true, seen) => {
            writes::apply(ctx, budget, seen, own).await?;
        }
        // Turned off while the job runs: the drains it held back may go on.
        (false, Some(seen)) => writes::delete(ctx, &seen, own).await?,
        (false, None) => {}
    }
    Ok(token)
}

/// The children that run pods, as the API server has them after this reconcile's writes.
pub(crate) struct PodChildren {
    /// Each shard's Deployment.
    pub(crate) ps: Vec<Deployment>,
    /// Shards with a ready pod.
    pub(crate) ready_shards: u32,
    pub(crate) workers: Job,
    /// Worker pods that failed in earlier worker Jobs (the status's count, plus the Job this
    /// reconcile replaced).
    pub(crate) failed_earlier: u32,
    /// Spec changes the children do not have yet, and why.
    pub(crate) deferred: Vec<String>,
}

/// The PS Deployments and the worker Job, shaped by Kueue's admission (`owner`).
pub(crate) async fn apply_pod_children(
    ctx: &Context,
    job: &TrainingJob,
    owner: &Owner<'_>,
    defaults: &ChildDefaults,
) -> Result<PodChildren> {
    let mut deferred = Vec::new();
    let mut ps = Vec::new();
    for shard in owner.ps_shards() {
        ps.push(apply_ps_deployment(ctx, job, owner, defaults, shard, &mut deferred).await?);
    }
    let ready = |d: &Deployment| d.status.as_ref().and_then(|s| s.ready_replicas).is_some_and(|r| r >= 1);
    let ready_shards = ps.iter().filter(|d| ready(d)).count() as u32;
    let (workers, replaced_failures) = apply_worker_job(ctx, job, owner, defaults, &mut deferred).await?;
    let failed_earlier = owner.failed_earlier() + replaced_failures;
    Ok(PodChildren { ps, ready_shards, workers, failed_earlier, deferred })
}

/// Applies the Deployment of PS shard `shard`, except when that would restart a PS whose memory holds the only
/// copy of the model: a changed pod template (a new learning rate, image or resources) rolls the
/// Deployment, and without `checkpoint.storage` the new pod would start from scratch. Then the
/// running PS keeps its settings, a Warning event says why, and so does `deferred` (for the
/// `SpecApplied` condition). Returns the Deployment as the API server has it (status included).
pub(crate) async fn apply_ps_deployment(
    ctx: &Context,
    job: &TrainingJob,
    owner: &Owner<'_>,
    defaults: &ChildDefaults,
    shard: usize,
    deferred: &mut Vec<String>,
) -> Result<Deployment> {
    let running = ctx.caches.deployment(&owner.namespace, &names::ps_shard_name(&owner.name, shard));
    if let Some(d) = &running {
        crate::controller::observe::ours(d, owner.mark())?;
    }
    // The worker count the PS started with stays in its template (scaling tells the PS over
    // HTTP, see `tell_ps_workers`), so that a change of workers.replicas never rolls it.
    let desired = owner.ps_deployment_beside(defaults, running.as_ref(), shard);
    if let Some(running) = &running
        && owner.ps_change_waits(running, &desired)
    {
        let message = "the parameter server's settings changed, but it keeps them: without \
                       parameterServer.checkpoint.storage its memory holds the only copy of the model, \
                       and a restart would lose it";
        publish(ctx, job, EventType::Warning, "SpecChangeNotApplied", "UpdateParameterServer", message).await;
        deferred.push(message.into());
        return Ok(running.clone());
    }
    writes::apply(ctx, desired, running, owner.mark()).await
}

/// Applies the worker Job as `children::worker_job_update` decides: a changed pod template
/// reaches the workers only through a suspension, and says so while it waits (an event, and
/// `deferred`). Returns the Job as the API server has it, and the failed pods of a Job it
/// replaced (they still count against `backoffLimit`).
pub(crate) async fn apply_worker_job(
    ctx: &Context,
    job: &TrainingJob,
    owner: &Owner<'_>,
    defaults: &ChildDefaults,
    deferred: &mut Vec<String>,
) -> Result<(Job, u32)> {
    let running = ctx.caches.job(&owner.namespace, &names::workers_name(&owner.name));
    if let Some(j) = &running {
        crate::controller::observe::ours(j, owner.mark())?;
    }
    match children::worker_job_update(owner.worker_job(defaults), running.as_ref()) {
        WorkerJobUpdate::Apply(desired) => Ok((writes::apply(ctx, desired, running, owner.mark()).await?, 0)),
        WorkerJobUpdate::Recreate(desired) => {
            let replaced = running.as_ref().map_or(0, |j| worker_state(j).failed);
            // No pod is left, so nothing goes with the Job; each worker of the new one resumes
            // at the step the parameter server recorded for it.
            if let Some(j) = &running {
                writes::delete(ctx, j, owner.mark()).await?;
            }
            let message = if owner.suspended() {
                "the workers' pod template changed while the job was suspended: the worker Job was \
                 recreated with it; on resume each worker continues where it stopped"
            } else {
                "the workers' pod template changed while they were stopped (the placement of the \
                 flavors Kueue admitted the job to): the worker Job was recreated with it; each worker \
                 continues where it stopped"
            };
            publish(ctx, job, EventType::Normal, "WorkersRecreated", "UpdateWorkers", message).await;
            Ok((writes::apply(ctx, desired, None, owner.mark()).await?, replaced))
        }
        WorkerJobUpdate::Deferred(desired) => {
            if !owner.stopped() {
                let message = "the running worker Job keeps its pod template: set runPolicy.suspend: true \
                               to apply the change (the workers are recreated with it, and resume where they stopped)";
                publish(ctx, job, EventType::Warning, "SpecChangeNotApplied", "UpdateWorkers", message).await;
                deferred.push(message.into());
            }
            Ok((writes::apply(ctx, desired, running, owner.mark()).await?, 0))
        }
    }
}

/// Removes the parameter server (each shard's Deployment and Service) once the job has ended:
/// deleting a Deployment stops the pod with SIGTERM, on which the PS writes its last checkpoint.
pub(crate) async fn remove_ps(ctx: &Context, owner: &Owner<'_>) -> Result<()> {
    for shard in owner.ps_shards() {
        let name = names::ps_shard_name(&owner.name, shard);
        if let Some(d) = ctx.caches.deployment(&owner.namespace, &name) {
            writes::delete(ctx, &d, owner.mark()).await?;
            tracing::info!(%name, "removed the parameter server");
        }
        if let Some(s) = ctx.caches.service(&owner.namespace, &name) {
            writes::delete(ctx, &s, owner.mark()).await?;
        }
    }
    Ok(())
}
