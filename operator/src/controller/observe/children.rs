//! What the running children say: the worker Job's state, and the images and TLS the running
//! children use (a job keeps them when the operator's defaults change).

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::PodSpec;

use crate::api::TrainingJobStatus;
use crate::controller::context::Context;
use crate::controller::decide::status::WorkerJob;
use crate::controller::desired::children::{self, ChildDefaults, Owner};
use crate::controller::names::{self};

/// The images for the roles whose spec names none: those recorded in the job's status when the
/// operator first handled it, so that new operator defaults (a chart upgrade) never roll a
/// running job's pods. A job an operator before that record started keeps the images its
/// children run (read from the caches, and only from children that are the job's); a new job
/// takes the operator's defaults. The same for TLS between workers and PS: a running PS keeps
/// the transport it has, and the names of its Secrets.
pub(crate) fn job_defaults(ctx: &Context, owner: &Owner<'_>, old: &TrainingJobStatus) -> ChildDefaults {
    if let Some(d) = &old.default_images {
        return d.into();
    }
    let mut defaults = ctx.settings.defaults.clone();
    let image = |spec: Option<PodSpec>| spec?.containers.into_iter().next()?.image;
    let spec = &owner.job.spec;

    let running_ps = ctx
        .caches
        .deployment(&owner.namespace, &names::ps_name(&owner.name))
        .filter(|d| crate::controller::observe::ours(d, owner.mark()).is_ok())
        .and_then(|d| d.spec.template.spec);
    // A new job's Secrets are named so that nobody can have made them before; a running PS
    // keeps the Secrets it names.
    defaults.secret_suffix = Some(ctx.settings.token_key.secret_suffix(owner.uid()));
    if let Some(pod) = &running_ps {
        let env = pod.containers.first().and_then(|c| c.env.as_ref());
        defaults.ps_tls = env.is_some_and(|env| env.iter().any(|e| e.name == "FORESIGHT_TLS_CERT"));
        let token = env.and_then(|env| env.iter().find(|e| e.name == "FORESIGHT_TOKEN"));
        let secret = token.and_then(|e| Some(e.value_from.as_ref()?.secret_key_ref.as_ref()?.name.clone()));
        let prefix = names::secret_name(&owner.name, "");
        defaults.secret_suffix = secret.and_then(|s| s.strip_prefix(&prefix).map(String::from));
    }
    if spec.parameter_server.image.is_none()
        && let Some(i) = image(running_ps)
    {
        defaults.ps_image = i;
    }
    if spec.workers.image.is_none() {
        let running = ctx.caches.job(&owner.namespace, &names::workers_name(&owner.name));
        if let Some(i) = image(
            running
                .filter(|j| crate::controller::observe::ours(j, owner.mark()).is_ok())
                .and_then(|j| j.spec?.template.spec),
        ) {
            defaults.worker_image = i;
        }
    }
    defaults
}

pub(crate) fn worker_state(job: &Job) -> WorkerJob {
    let s = job.status.clone().unwrap_or_default();
    let count = |n: Option<i32>| n.and_then(|n| u32::try_from(n).ok()).unwrap_or(0);
    let conditions = s.conditions.unwrap_or_default();
    let is_true = |c: &&k8s_openapi::api::batch::v1::JobCondition| c.status == "True";
    WorkerJob {
        active: count(s.active),
        ready: count(s.ready),
        succeeded: count(s.succeeded),
        failed: count(s.failed),
        failed_earlier: 0,
        stopped: children::is_idle_suspended(job),
        // SuccessCriteriaMet and FailureTarget come first; Complete and Failed follow once every
        // pod has terminated, which can take a node's grace period. The outcome is decided at
        // the first.
        complete: conditions
            .iter()
            .filter(is_true)
            .any(|c| c.type_ == "Complete" || c.type_ == "SuccessCriteriaMet"),
        failed_condition: conditions
            .iter()
            .filter(is_true)
            .find(|c| c.type_ == "Failed" || c.type_ == "FailureTarget")
            .map(|c| {
                (c.reason.clone().unwrap_or_else(|| "Failed".into()), c.message.clone().unwrap_or_default())
            }),
        last_failure: None,
    }
}
