//! The API calls of Kueue admission (`kueue` decides): the job's Workload made, replaced,
//! given back its quota after an eviction, released and marked finished, and the priority it
//! carries.

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

use super::{self as kueue, Admission, FlavorPlacement, Plan, Workload, WorkloadSpec};
use crate::api::TrainingJob;
use crate::controller::context::Context;
use crate::controller::desired::children::{self, ChildDefaults, Owner};
use crate::controller::error::{Result, is_status};
use crate::controller::names::{self, MANAGER};
use crate::controller::write::job::{publish, status_patch};
use crate::controller::write::writes;

/// The name of a job's Workload.
pub fn workload_name(job: &str) -> String {
    format!("trainingjob-{job}")
}

/// Kueue's say on the job: makes its Workload, or replaces or releases it as `kueue::plan`
/// decides; once it is admitted, where its flavors place the pods and how many workers run.
pub(crate) async fn admit(
    ctx: &Context,
    job: &TrainingJob,
    owner: &Owner<'_>,
    defaults: &ChildDefaults,
) -> Result<Admission> {
    let Some(queue) = job.labels().get(kueue::QUEUE_LABEL) else {
        return Ok(unlabelled(ctx, job, owner));
    };
    if !ctx.settings.kueue {
        let waiting = Admission::Pending(format!(
            "labelled for Kueue's LocalQueue {queue}, but this operator runs without --kueue \
             (the chart's kueue.enabled): it waits rather than run outside the quota"
        ));
        return Ok(waiting);
    }
    let ns = &owner.namespace;
    let name = workload_name(&owner.name);
    let stopped =
        ctx.caches.job(ns, &names::workers_name(&owner.name)).is_none_or(|j| children::is_idle_suspended(&j));
    let existing = ctx.caches.workload(ns, &name);
    if let Some(w) = &existing {
        crate::controller::observe::ours(w, owner.mark())?;
    }
    let sets = kueue::pod_sets(
        counted_ps_template(ctx, owner, defaults),
        owner.ps_shards().len(),
        owner.worker_job(defaults).spec.unwrap_or_default().template,
        job.spec.workers.replicas,
        job.spec.workers.min_replicas,
    );
    let hash = kueue::podsets_hash(&sets);
    let holds_model = owner.ps_holds_model();
    let (plan, mut admission) =
        kueue::plan(queue, existing.as_ref(), &hash, !owner.suspended(), stopped, holds_model);
    let api: Api<Workload> = Api::namespaced(ctx.client.clone(), ns);
    match plan {
        Plan::Keep => {}
        Plan::Create => create(ctx, owner, &api, queue, sets, hash).await?,
        Plan::Requeue(why) => {
            delete(ctx, owner, existing.as_ref()).await?;
            let message = format!("{why}: its Workload was replaced, and the job queued again in {queue}");
            publish(ctx, job, EventType::Normal, why.reason(), "Requeue", &message).await;
        }
        Plan::Unreserve(why) => {
            if let Some(w) = &existing {
                unreserve(&api, w, &why).await?;
            }
            let message = format!(
                "{why}: its workers stopped and its quota was given back; the job waits in {queue} until Kueue admits it again"
            );
            publish(ctx, job, EventType::Normal, "Evicted", "Requeue", &message).await;
        }
        Plan::Release => delete(ctx, owner, existing.as_ref()).await?,
    }
    if let (Admission::Admitted(a), Some(w)) = (&mut admission, &existing) {
        a.ps = placement(ctx, w, kueue::PODSET_PS).await?;
        a.workers = placement(ctx, w, kueue::PODSET_WORKERS).await?;
    }
    Ok(admission)
}

/// The PS pod template Kueue is to count: the desired one, with the containers of the running
/// one while a change of them waits (`Owner::ps_change_waits`: a PS without checkpoint storage
/// keeps its settings): a job that shrinks `parameterServer.resources` after admission is then
/// not re-admitted small while the large PS keeps running. Only the containers are taken: the
/// running pod's placement comes from its admission, which the desired template has not had yet.
fn counted_ps_template(ctx: &Context, owner: &Owner<'_>, defaults: &ChildDefaults) -> PodTemplateSpec {
    let running = ctx.caches.deployment(&owner.namespace, &names::ps_shard_name(&owner.name, 0));
    let desired = owner.ps_deployment_beside(defaults, running.as_ref(), 0);
    let running = running.filter(|r| owner.ps_change_waits(r, &desired));
    let mut template = desired.spec.template;
    if let Some(running) = running
        && let (Some(pod), Some(runs)) = (template.spec.as_mut(), running.spec.template.spec)
    {
        (pod.containers, pod.init_containers) = (runs.containers, runs.init_containers);
    }
    template
}

/// The LocalQueue a job without the queue label goes to when its namespace has one of this
/// name (Kueue's `LocalQueueDefaulting`).
pub const DEFAULT_QUEUE: &str = "default";

/// With `--kueue`, a new job without the queue label in a namespace that has a LocalQueue named
/// `default` gets the label, as Kueue's own webhook gives it to the jobs of its integrations
/// (`LocalQueueDefaulting`): on the job's first reconcile only, before any of its pods exist, so
/// that a default queue made later never stops a job already running. The status records it
/// (`defaultedQueue`), first: a replace of the job without the label (which the chart's policy
/// lets through for that label alone) gets it back. Returns whether it labelled the job (the
/// watch then brings the labelled job back).
pub(crate) async fn default_queue(ctx: &Context, job: &TrainingJob, owner: &Owner<'_>) -> Result<bool> {
    if !ctx.settings.kueue || job.labels().contains_key(kueue::QUEUE_LABEL) {
        return Ok(false);
    }
    let api = Api::<TrainingJob>::namespaced(ctx.client.clone(), &owner.namespace);
    let defaulted = job.status.as_ref().and_then(|s| s.defaulted_queue.clone());
    let put_back = defaulted.is_some();
    let (labelled, queue) = match defaulted {
        Some(queue) => (job.clone(), queue),
        None if job.status.as_ref().and_then(|s| s.phase).is_none()
            && has_default_queue(ctx, owner).await? =>
        {
            let mut status = job.status.clone().unwrap_or_default();
            status.defaulted_queue = Some(DEFAULT_QUEUE.into());
            let patch = Patch::Apply(status_patch(job, &status));
            (
                api.patch_status(&owner.name, &PatchParams::apply(MANAGER).force(), &patch).await?,
                DEFAULT_QUEUE.into(),
            )
        }
        None => return Ok(false),
    };
    // Conditional on the job as read: a label the author set meanwhile is not written over.
    let patch = serde_json::json!({"metadata": {
        "resourceVersion": labelled.resource_version(),
        "labels": {kueue::QUEUE_LABEL: queue},
    }});
    let params = PatchParams { field_manager: Some(MANAGER.into()), ..Default::default() };
    api.patch(&owner.name, &params, &Patch::Merge(patch)).await?;
    // Two reasons: the events recorder counts a repeated reason into the first event's series.
    let (reason, message) = if put_back {
        let why = "the job was written again without the label the operator gave it: put back";
        ("QueueLabelRestored", format!("{why} (LocalQueue {queue})"))
    } else {
        let why = "queued in the namespace's LocalQueue";
        (
            "QueueDefaulted",
            format!("no {} label: {why} {queue}, as Kueue does for its own jobs", kueue::QUEUE_LABEL),
        )
    };
    publish(ctx, job, EventType::Normal, reason, "Admit", &message).await;
    Ok(true)
}

/// Whether the job's namespace has a LocalQueue named `default`.
async fn has_default_queue(ctx: &Context, owner: &Owner<'_>) -> Result<bool> {
    let gvk = kube::core::GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta2", "LocalQueue");
    let queues: Api<kube::core::DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &owner.namespace, &kube::core::ApiResource::from_gvk(&gvk));
    Ok(queues.get_opt(DEFAULT_QUEUE).await?.is_some())
}

/// A job without the queue label runs at once, unless it was queued and Kueue has not admitted
/// it: removing the label from a waiting job would start it outside the quota, so it keeps
/// waiting (a job Kueue admitted keeps running; the label cannot move it out of the quota it
/// holds). The author can put the label back, or delete the job and make it again. With
/// `--kueue-required` no unlabelled job starts; one that ran before it was turned on keeps
/// running.
fn unlabelled(ctx: &Context, job: &TrainingJob, owner: &Owner<'_>) -> Admission {
    // First: the job's own `Queued` condition, written by this rule, would otherwise read as a
    // label removed while the job waited, at its next reconcile.
    let running = ctx
        .caches
        .job(&owner.namespace, &names::workers_name(&owner.name))
        .is_some_and(|j| !children::is_idle_suspended(&j));
    if ctx.settings.kueue_required && !running {
        return Admission::Pending(format!(
            "no {} label, and this operator runs only jobs queued in Kueue (--kueue-required, the chart's \
             kueue.required): label the job with a LocalQueue of namespace {}",
            kueue::QUEUE_LABEL,
            owner.namespace
        ));
    }
    let was_queued =
        job.status.iter().flat_map(|s| &s.conditions).any(|c| c.type_ == "Queued" && c.status == "True");
    // Only the job's own Workload counts: a tenant's Workload of that name (any who may create
    // Workloads can label one `managed-by`) would otherwise hold a running job (review C8).
    let workload = ctx
        .caches
        .workload(&owner.namespace, &workload_name(&owner.name))
        .filter(|w| crate::controller::observe::ours(w, owner.mark()).is_ok());
    let admitted = workload.as_ref().is_some_and(Workload::is_admitted);
    if (was_queued || workload.is_some()) && !admitted {
        return Admission::Pending(format!(
            "the {} label was removed while the job waited for Kueue: it keeps waiting rather than run outside the quota; put the label back, or delete the TrainingJob and create it again",
            kueue::QUEUE_LABEL
        ));
    }
    Admission::NotQueued
}

/// Where the flavors Kueue assigned to pod set `name` place its pods.
async fn placement(ctx: &Context, workload: &Workload, name: &str) -> Result<FlavorPlacement> {
    let mut specs = Vec::new();
    for flavor in workload.flavors_of(name) {
        specs.push(ctx.flavors.spec(&ctx.client, &flavor).await?);
    }
    Ok(kueue::placement(&specs))
}

async fn create(
    ctx: &Context,
    owner: &Owner<'_>,
    api: &Api<Workload>,
    queue: &str,
    pod_sets: Vec<kueue::PodSet>,
    hash: String,
) -> Result<()> {
    let (priority_class_ref, priority) = match priority_class(owner) {
        Some(class) => {
            let classes: Api<PriorityClass> = Api::all(ctx.client.clone());
            (Some(kueue::priority_ref(class)), classes.get(class).await?.value)
        }
        None => (None, None),
    };
    let mut workload = Workload::new(
        &workload_name(&owner.name),
        WorkloadSpec { queue_name: queue.into(), pod_sets, priority_class_ref, priority, active: None },
    );
    workload.metadata.namespace = Some(owner.namespace.clone());
    workload.metadata.labels = Some(names::labels(&owner.name, "workload"));
    workload.metadata.annotations = Some([(kueue::PODSETS_HASH.to_string(), hash)].into());
    workload.metadata.owner_references = Some(vec![owner.owner_reference()]);
    match api
        .create(&PostParams { field_manager: Some(MANAGER.into()), ..Default::default() }, &workload)
        .await
    {
        // Made by a reconcile whose write the cache had not seen yet, or by someone else.
        Err(e) if is_status(&e, 409) => {
            crate::controller::observe::ours(&api.get(&workload.name_any()).await?, owner.mark()).map(|_| ())
        }
        r => r.map(|_| ()).map_err(Into::into),
    }
}

/// The PriorityClass Kueue orders the job by: the workers' (they hold the GPUs), else the
/// parameter server's.
fn priority_class<'a>(owner: &'a Owner<'_>) -> Option<&'a str> {
    let spec = &owner.job.spec;
    let of = |pod: Option<&'a crate::api::PodSettings>| pod?.priority_class_name.as_deref();
    of(spec.workers.pod.as_ref()).or_else(|| of(spec.parameter_server.pod.as_ref()))
}

/// Deletes the job's Workload as the cache saw it (`plan` asks for it only when there is one).
async fn delete(ctx: &Context, owner: &Owner<'_>, workload: Option<&Workload>) -> Result<()> {
    match workload {
        Some(w) => writes::delete(ctx, w, owner.mark()).await,
        None => Ok(()),
    }
}

/// Gives evicted Workload `w`'s quota back (`kueue::unreserved_status`). A merge patch, since
/// Kueue owns those fields; conditional on the resourceVersion the cache saw, so that a status
/// Kueue changed since is not written over (the conflict makes the reconcile run again).
async fn unreserve(api: &Api<Workload>, w: &Workload, why: &kueue::Eviction) -> Result<()> {
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": w.resource_version()},
        "status": kueue::unreserved_status(w, why, &Time(Timestamp::now())),
    });
    let params = PatchParams { field_manager: Some(MANAGER.into()), ..Default::default() };
    api.patch_status(&w.name_any(), &params, &Patch::Merge(patch)).await?;
    Ok(())
}

/// Marks the ended job's Workload `Finished`, which gives its quota back.
pub(crate) async fn finish(ctx: &Context, owner: &Owner<'_>, succeeded: bool, message: &str) -> Result<()> {
    if !ctx.settings.kueue {
        return Ok(());
    }
    let name = workload_name(&owner.name);
    let Some(workload) = ctx.caches.workload(&owner.namespace, &name) else { return Ok(()) };
    if crate::controller::observe::ours(&workload, owner.mark()).is_err() {
        return Ok(());
    }
    if workload.status.iter().flat_map(|s| &s.conditions).any(|c| c.type_ == "Finished" && c.status == "True")
    {
        return Ok(());
    }
    let patch = serde_json::json!({
        "apiVersion": Workload::api_version(&()),
        "kind": Workload::kind(&()),
        "status": {"conditions": [{
            "type": "Finished",
            "status": "True",
            "reason": if succeeded { "Succeeded" } else { "Failed" },
            "message": if message.is_empty() { "the TrainingJob ended" } else { message },
            "lastTransitionTime": Time(Timestamp::now()),
        }]},
    });
    let api: Api<Workload> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    api.patch_status(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(patch)).await?;
    Ok(())
}
