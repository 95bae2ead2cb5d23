//! Pods that cannot start or keep failing, told from what the API server holds: a container
//! waiting for a reason no wait cures (an image that cannot be pulled, a missing ConfigMap or
//! Secret key, a crash loop, an OOM kill), a PS Deployment whose ReplicaSet cannot create its pod
//! (a quota, PodSecurity, a missing ServiceAccount or PriorityClass), the worker Job's
//! `FailedCreate` events. Before, such a job stayed `Starting` forever without a Warning, or
//! blamed the workers for the PS's OOM kills. Pure: no I/O.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

/// Whose pods are in trouble.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    ParameterServer,
    Workers,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::ParameterServer => "parameter server",
            Role::Workers => "workers",
        }
    }
}

/// Why a role's pods do not run: the reason is Kubernetes' own (ImagePullBackOff, OOMKilled,
/// FailedCreate, ...), the message says where.
#[derive(Clone, Debug, PartialEq)]
pub struct Trouble {
    pub role: Role,
    pub reason: String,
    pub message: String,
}

impl Trouble {
    fn new(role: Role, reason: &str, message: String) -> Self {
        Self { role, reason: reason.into(), message: format!("{}: {message}", role.name()) }
    }
}

/// Reasons a container waits with that waiting does not cure.
const STUCK: [&str; 7] = [
    "ImagePullBackOff",
    "ErrImagePull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
    "CrashLoopBackOff",
];

/// Every reason a [`Trouble`] can carry (the phase's reason while it lasts: a Warning).
pub fn is_trouble_reason(reason: &str) -> bool {
    STUCK.contains(&reason) || reason == "OOMKilled" || reason == "FailedCreate"
}

/// The trouble of one pod of `role`, if any: a container stuck waiting, or one that was OOM
/// killed and has not come back. A pod that has ended is none: the worker Job counts its failed
/// pods against `backoffLimit` and replaces them.
pub fn pod_trouble(role: Role, pod: &Pod) -> Option<Trouble> {
    let status = pod.status.as_ref()?;
    if matches!(status.phase.as_deref(), Some("Failed" | "Succeeded")) {
        return None;
    }
    let containers = status.init_container_statuses.iter().chain(&status.container_statuses).flatten();
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    containers.filter_map(|c| container_trouble(c).map(|(r, m)| (r, m, &c.name))).next().map(
        |(reason, message, container)| {
            Trouble::new(role, reason, format!("pod {name}, container {container}: {message}"))
        },
    )
}

fn container_trouble(c: &ContainerStatus) -> Option<(&'static str, String)> {
    let oom = |s: &Option<k8s_openapi::api::core::v1::ContainerState>| {
        s.as_ref()?.terminated.as_ref().filter(|t| t.reason.as_deref() == Some("OOMKilled")).map(|_| ())
    };
    let waiting = c.state.as_ref().and_then(|s| s.waiting.as_ref());
    let waiting_reason = waiting.and_then(|w| w.reason.as_deref());
    let back_off = waiting_reason == Some("CrashLoopBackOff");
    if oom(&c.state).is_some() || (back_off && oom(&c.last_state).is_some()) {
        let restarts = c.restart_count;
        return Some((
            "OOMKilled",
            format!("killed for exceeding its memory limit (OOMKilled), {restarts} restart(s)"),
        ));
    }
    let reason = STUCK.into_iter().find(|r| Some(*r) == waiting_reason)?;
    let message = waiting.and_then(|w| w.message.clone()).unwrap_or_default();
    Some((reason, if message.is_empty() { reason.to_string() } else { format!("{reason}: {message}") }))
}

/// A parameter server whose container has restarted more often than the job allows
/// (`runPolicy.backoffLimit`, `limit`, the bound the workers' failed pods have): a crash or OOM
/// loop, which the kubelet repeats for ever. Counted from the containers' restart counts, since
/// a PS restarts in place and briefly runs (even turns ready) between crashes: each such moment
/// ended the `PodsFailing` condition, so its stuck-pods clock never reached its bound and the
/// job stayed `Restarting` for good. The reason is the last termination's (OOMKilled, Error).
pub fn ps_restarts_exhausted(pods: &[&Pod], limit: u32) -> Option<Trouble> {
    let (pod, c) = pods
        .iter()
        .filter_map(|p| Some((*p, p.status.as_ref()?)))
        .flat_map(|(p, s)| {
            s.init_container_statuses.iter().chain(&s.container_statuses).flatten().map(move |c| (p, c))
        })
        .max_by_key(|(_, c)| c.restart_count)?;
    let restarts = u32::try_from(c.restart_count).unwrap_or(0);
    if restarts <= limit {
        return None;
    }
    let last = c.last_state.as_ref().and_then(|s| s.terminated.as_ref());
    let reason = last.and_then(|t| t.reason.as_deref()).unwrap_or("Error");
    let how = last.map_or(String::new(), |t| format!(": {reason} (exit code {})", t.exit_code));
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    Some(Trouble::new(
        Role::ParameterServer,
        reason,
        format!(
            "pod {name}, container {} restarted {restarts} times, more than runPolicy.backoffLimit ({limit}); the last time{how}",
            c.name
        ),
    ))
}

/// How the latest failed worker pod of `pods` ended: "pod P, container C: OOMKilled (exit code
/// 137)". The worker Job only says that pods failed (`BackoffLimitExceeded`); this is why (review
/// C10: an OOM-killed worker was never named).
pub fn last_worker_failure(pods: &[&Pod]) -> Option<String> {
    pods.iter()
        .filter_map(|p| {
            let s = p.status.as_ref().filter(|s| s.phase.as_deref() == Some("Failed"))?;
            let (c, t) = s
                .container_statuses
                .iter()
                .flatten()
                .filter_map(|c| {
                    Some((c, c.state.as_ref()?.terminated.as_ref().filter(|t| t.exit_code != 0)?))
                })
                .next()?;
            Some((t.finished_at.clone(), p.metadata.name.clone().unwrap_or_default(), c.name.clone(), t))
        })
        .max_by(|a, b| a.0.as_ref().map(|t| t.0).cmp(&b.0.as_ref().map(|t| t.0)))
        .map(|(_, pod, container, t)| {
            let reason = t.reason.as_deref().unwrap_or("Error");
            format!("pod {pod}, container {container}: {reason} (exit code {})", t.exit_code)
        })
}

/// A Deployment whose ReplicaSet cannot create its pod (condition `ReplicaFailure`).
pub fn deployment_trouble(d: &Deployment) -> Option<Trouble> {
    let c = d
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_.as_deref() == Some("ReplicaFailure") && c.status.as_deref() == Some("True"))?;
    let message = c.message.clone().unwrap_or_default();
    Some(Trouble::new(Role::ParameterServer, "FailedCreate", format!("cannot create its pod: {message}")))
}

/// The worker Job's most recent `FailedCreate` event message, given those events' messages
/// newest first: the Job controller reports pods it cannot create only that way.
pub fn worker_creation_trouble(newest_first: &[String]) -> Option<Trouble> {
    let message = newest_first.first()?;
    Some(Trouble::new(Role::Workers, "FailedCreate", format!("the worker Job cannot create pods: {message}")))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::DeploymentCondition;
    use k8s_openapi::api::apps::v1::DeploymentStatus;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStateWaiting, PodStatus,
    };

    use super::*;

    fn pod(state: ContainerState, last: Option<ContainerState>) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("job-ps-1".into());
        p.status = Some(PodStatus {
            container_statuses: Some(vec![ContainerStatus {
                name: "ps".into(),
                state: Some(state),
                last_state: last,
                restart_count: 3,
                ..Default::default()
            }]),
            ..Default::default()
        });
        p
    }

    fn waiting(reason: &str, message: &str) -> ContainerState {
        let w = ContainerStateWaiting { reason: Some(reason.into()), message: Some(message.into()) };
        ContainerState { waiting: Some(w), ..Default::default() }
    }

    fn terminated(reason: &str) -> ContainerState {
        let t =
            ContainerStateTerminated { reason: Some(reason.into()), exit_code: 137, ..Default::default() };
        ContainerState { terminated: Some(t), ..Default::default() }
    }

    #[test]
    fn the_latest_failed_worker_is_named_with_its_reason_and_exit_code() {
        let failed = |name: &str, reason: &str, code: i32, at: &str| {
            let mut p = Pod::default();
            p.metadata.name = Some(name.into());
            let t = ContainerStateTerminated {
                reason: Some(reason.into()),
                exit_code: code,
                finished_at: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at.parse().unwrap())),
                ..Default::default()
            };
            let state = ContainerState { terminated: Some(t), ..Default::default() };
            let c = ContainerStatus { name: "worker".into(), state: Some(state), ..Default::default() };
            p.status = Some(PodStatus {
                phase: Some("Failed".into()),
                container_statuses: Some(vec![c]),
                ..Default::default()
            });
            p
        };
        let early = failed("job-workers-0-a", "Error", 1, "2026-01-01T00:00:00Z");
        let late = failed("job-workers-1-b", "OOMKilled", 137, "2026-01-01T00:05:00Z");
        let running = pod(ContainerState::default(), None);
        assert_eq!(
            last_worker_failure(&[&early, &late, &running]).as_deref(),
            Some("pod job-workers-1-b, container worker: OOMKilled (exit code 137)")
        );
        assert_eq!(last_worker_failure(&[&running]), None, "no failed pod, nothing to name");
    }

    #[test]
    fn a_container_waiting_for_what_time_does_not_cure_is_trouble() {
        let t = pod_trouble(
            Role::ParameterServer,
            &pod(waiting("ImagePullBackOff", "Back-off pulling image \"x\""), None),
        )
        .unwrap();
        assert_eq!(t.reason, "ImagePullBackOff");
        assert_eq!(
            t.message,
            "parameter server: pod job-ps-1, container ps: ImagePullBackOff: Back-off pulling image \"x\""
        );
        // Waiting while the image is pulled or the container created is normal.
        assert_eq!(pod_trouble(Role::Workers, &pod(waiting("ContainerCreating", ""), None)), None);
        assert_eq!(pod_trouble(Role::Workers, &pod(ContainerState::default(), None)), None);
    }

    #[test]
    fn a_ps_restarting_more_often_than_the_backoff_limit_has_exhausted_it_even_while_running() {
        // Running again between two OOM kills (the moment that reset the stuck-pods clock).
        let running = ContainerState { running: Some(Default::default()), ..Default::default() };
        let looping = pod(running, Some(terminated("OOMKilled")));
        assert_eq!(pod_trouble(Role::ParameterServer, &looping), None, "running: no trouble of the moment");
        assert_eq!(ps_restarts_exhausted(&[&looping], 3), None, "3 restarts, backoffLimit 3");
        let t = ps_restarts_exhausted(&[&looping], 2).unwrap();
        assert_eq!((t.role, t.reason.as_str()), (Role::ParameterServer, "OOMKilled"));
        assert_eq!(
            t.message,
            "parameter server: pod job-ps-1, container ps restarted 3 times, more than runPolicy.backoffLimit (2); the last time: OOMKilled (exit code 137)"
        );
        // The shard that restarted most speaks; no status yet is no trouble.
        let fresh = pod(waiting("ContainerCreating", ""), None);
        let mut calm = fresh.clone();
        calm.status.as_mut().unwrap().container_statuses.as_mut().unwrap()[0].restart_count = 0;
        assert_eq!(ps_restarts_exhausted(&[&calm, &looping], 2).unwrap().reason, "OOMKilled");
        assert_eq!(ps_restarts_exhausted(&[&Pod::default()], 0), None);
    }

    #[test]
    fn an_oom_kill_is_named_as_such_not_as_the_crash_loop_it_causes() {
        let t = pod_trouble(
            Role::ParameterServer,
            &pod(waiting("CrashLoopBackOff", "back-off 40s"), Some(terminated("OOMKilled"))),
        )
        .unwrap();
        assert_eq!(t.reason, "OOMKilled");
        assert!(t.message.contains("3 restart(s)"), "{}", t.message);
        // Killed a moment ago, before the back-off.
        assert_eq!(
            pod_trouble(Role::Workers, &pod(terminated("OOMKilled"), None)).unwrap().reason,
            "OOMKilled"
        );
        // A pod that has ended (a worker's, restartPolicy Never) is the Job's to count and replace.
        let mut failed = pod(terminated("OOMKilled"), None);
        failed.status.as_mut().unwrap().phase = Some("Failed".into());
        assert_eq!(pod_trouble(Role::Workers, &failed), None);
        // A crash loop for another cause, or a worker that failed with an error: not an OOM kill.
        let other = pod_trouble(
            Role::ParameterServer,
            &pod(waiting("CrashLoopBackOff", ""), Some(terminated("Error"))),
        );
        assert_eq!(other.unwrap().reason, "CrashLoopBackOff");
        assert_eq!(pod_trouble(Role::Workers, &pod(terminated("Error"), None)), None);
    }

    #[test]
    fn a_deployment_that_cannot_create_its_pod_is_trouble() {
        let mut d = Deployment::default();
        assert_eq!(deployment_trouble(&d), None);
        d.status = Some(DeploymentStatus {
            conditions: Some(vec![DeploymentCondition {
                type_: Some("ReplicaFailure".into()),
                status: Some("True".into()),
                reason: Some("FailedCreate".into()),
                message: Some("pods \"p\" is forbidden: exceeded quota: none".into()),
                ..Default::default()
            }]),
            ..Default::default()
        });
        let t = deployment_trouble(&d).unwrap();
        assert_eq!((t.role, t.reason.as_str()), (Role::ParameterServer, "FailedCreate"));
        assert!(t.message.ends_with("exceeded quota: none"), "{}", t.message);
        assert!(is_trouble_reason(&t.reason));
    }
}
