//! How the worker Job the spec asks for reaches the one that runs. Kubernetes refuses any change
//! of a started Job's pod template (422), and a refused apply would also drop the changes that
//! are allowed (`suspend`, `parallelism`, `completions`): so the template is applied only to a
//! new Job, a running Job keeps its own, and a changed template is applied by recreating the
//! Job once it is suspended and no worker pod is left. Workers lose nothing by that: each one
//! resumes at the step the parameter server recorded for it.

use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;

use crate::controller::names::WORKER_TEMPLATE_HASH;

/// What to do with the worker Job this reconcile.
#[derive(Clone, Debug, PartialEq)]
pub enum WorkerJobUpdate {
    /// Apply this Job: it does not exist yet, or its template is the running one.
    Apply(Job),
    /// The template changed (or, for a Job made before the digest, may have) and the Job is
    /// suspended with no pod left: delete it and create the new one (suspended or not, as
    /// desired: resuming an idle Job loses nothing either, which is how the placement of a job
    /// Kueue has just admitted reaches it).
    Recreate(Job),
    /// The template changed while worker pods run or stop: apply this Job, which carries the
    /// running template (so that suspend and scaling still reach it); the new template waits
    /// for the Job to be suspended and idle.
    Deferred(Job),
}

/// Decides how `desired` (built by `Owner::worker_job`) reaches `running`.
pub fn worker_job_update(mut desired: Job, running: Option<&Job>) -> WorkerJobUpdate {
    let Some(running) = running else {
        return WorkerJobUpdate::Apply(desired);
    };
    let digest = |j: &Job| j.annotations().get(WORKER_TEMPLATE_HASH).cloned();
    let changed = digest(running).is_some_and(|d| Some(d) != digest(&desired));
    // A Job from an operator before the digest may or may not differ: once it is suspended and
    // idle it is recreated (and so gets a digest), so that no change made while suspended is
    // silently left out; while it runs its template is taken as the desired one.
    let unknown = digest(running).is_none();
    if (changed || unknown) && is_idle_suspended(running) {
        return WorkerJobUpdate::Recreate(desired);
    }
    if let (Some(spec), Some(running_spec)) = (desired.spec.as_mut(), running.spec.as_ref()) {
        spec.template = running_spec.template.clone();
    }
    let annotations = desired.metadata.annotations.get_or_insert_default();
    match digest(running) {
        Some(d) => annotations.insert(WORKER_TEMPLATE_HASH.into(), d),
        None => annotations.remove(WORKER_TEMPLATE_HASH),
    };
    if changed { WorkerJobUpdate::Deferred(desired) } else { WorkerJobUpdate::Apply(desired) }
}

fn is_suspended(job: &Job) -> bool {
    job.spec.as_ref().and_then(|s| s.suspend) == Some(true)
}

/// Suspended, and the Job controller counts no pod running or terminating.
pub fn is_idle_suspended(job: &Job) -> bool {
    let status = job.status.clone().unwrap_or_default();
    is_suspended(job) && status.active.unwrap_or(0) == 0 && status.terminating.unwrap_or(0) == 0
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::batch::v1::{JobSpec, JobStatus};
    use k8s_openapi::api::core::v1::PodTemplateSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn job(digest: Option<&str>, image: &str, suspend: bool, active: i32, terminating: i32) -> Job {
        let template: PodTemplateSpec = serde_json::from_value(serde_json::json!({
            "spec": {"containers": [{"name": "worker", "image": image}]}
        }))
        .unwrap();
        Job {
            metadata: ObjectMeta {
                name: Some("j-workers".into()),
                annotations: digest.map(|d| [(WORKER_TEMPLATE_HASH.to_string(), d.to_string())].into()),
                ..Default::default()
            },
            spec: Some(JobSpec {
                suspend: Some(suspend),
                parallelism: Some(2),
                template,
                ..Default::default()
            }),
            status: Some(JobStatus {
                active: Some(active),
                terminating: Some(terminating),
                ..Default::default()
            }),
        }
    }

    fn image(j: &Job) -> &str {
        j.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0].image.as_deref().unwrap()
    }

    #[test]
    fn a_new_job_or_an_unchanged_template_is_applied_as_built() {
        let desired = job(Some("a"), "w:1", false, 0, 0);
        assert_eq!(worker_job_update(desired.clone(), None), WorkerJobUpdate::Apply(desired.clone()));
        let running = job(Some("a"), "w:1", false, 2, 0);
        let WorkerJobUpdate::Apply(j) = worker_job_update(desired.clone(), Some(&running)) else { panic!() };
        assert_eq!(j.spec, desired.spec);
    }

    #[test]
    fn a_changed_template_waits_but_suspend_and_scaling_still_reach_the_job() {
        let running = job(Some("a"), "w:1", false, 2, 0);
        let mut desired = job(Some("b"), "w:2", true, 0, 0);
        desired.spec.as_mut().unwrap().parallelism = Some(4);
        let WorkerJobUpdate::Deferred(j) = worker_job_update(desired, Some(&running)) else { panic!() };
        assert_eq!(image(&j), "w:1", "the running template is kept");
        assert_eq!(j.annotations()[WORKER_TEMPLATE_HASH], "a", "and so is its digest");
        let spec = j.spec.unwrap();
        assert_eq!((spec.suspend, spec.parallelism), (Some(true), Some(4)));
    }

    #[test]
    fn a_changed_template_is_applied_by_recreating_only_a_suspended_idle_job() {
        let desired = job(Some("b"), "w:2", true, 0, 0);
        for (suspended, active, terminating) in [(false, 0, 0), (true, 1, 0), (true, 0, 1)] {
            let running = job(Some("a"), "w:1", suspended, active, terminating);
            let got = worker_job_update(desired.clone(), Some(&running));
            assert!(
                matches!(got, WorkerJobUpdate::Deferred(_)),
                "{suspended} {active} {terminating}: {got:?}"
            );
        }
        let idle = job(Some("a"), "w:1", true, 0, 0);
        assert_eq!(
            worker_job_update(desired.clone(), Some(&idle)),
            WorkerJobUpdate::Recreate(desired.clone())
        );
        // Resumed (by the user, or by Kueue's admission) before it was recreated: still idle, so
        // recreated, and started with the new template.
        let resumed = job(Some("b"), "w:2", false, 0, 0);
        assert_eq!(worker_job_update(resumed.clone(), Some(&idle)), WorkerJobUpdate::Recreate(resumed));
    }

    #[test]
    fn a_job_without_a_digest_keeps_its_template_while_it_runs_and_is_recreated_once_suspended() {
        let running = job(None, "w:1", false, 2, 0);
        let desired = job(Some("b"), "w:2", false, 0, 0);
        let WorkerJobUpdate::Apply(j) = worker_job_update(desired, Some(&running)) else { panic!() };
        assert_eq!(image(&j), "w:1");
        assert!(!j.annotations().contains_key(WORKER_TEMPLATE_HASH));
        let idle = job(None, "w:1", true, 0, 0);
        let desired = job(Some("b"), "w:2", true, 0, 0);
        assert_eq!(worker_job_update(desired.clone(), Some(&idle)), WorkerJobUpdate::Recreate(desired));
    }
}
