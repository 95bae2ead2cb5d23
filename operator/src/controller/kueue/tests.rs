use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::PodTemplateSpec;
use serde_json::json;

use super::*;

fn template(resources: serde_json::Value) -> PodTemplateSpec {
    serde_json::from_value(json!({"spec": {"containers": [{"name": "c", "resources": resources}]}})).unwrap()
}

fn sets(replicas: u32, gpus: u32) -> Vec<PodSet> {
    pod_sets(
        template(json!({"requests": {"cpu": "1"}})),
        1,
        template(json!({"limits": {"nvidia.com/gpu": gpus.to_string()}})),
        replicas,
        None,
    )
}

/// A Workload made with `hash`, with the given conditions (type, status, reason, message).
fn workload(hash: &str, conditions: &[(&str, &str, &str, &str)]) -> Workload {
    let spec = WorkloadSpec { queue_name: "team".into(), ..Default::default() };
    let mut w = Workload::new("trainingjob-a", spec);
    w.metadata.annotations = Some([(PODSETS_HASH.to_string(), hash.to_string())].into());
    w.status = Some(WorkloadStatus {
        conditions: conditions
            .iter()
            .map(|(t, s, r, m)| WorkloadCondition {
                type_: t.to_string(),
                status: s.to_string(),
                reason: r.to_string(),
                message: m.to_string(),
                rest: Default::default(),
            })
            .collect(),
        admission: None,
    });
    w
}

const ADMITTED: [(&str, &str, &str, &str); 2] =
    [("QuotaReserved", "True", "QuotaReserved", "reserved"), ("Admitted", "True", "Admitted", "admitted")];

#[test]
fn the_pod_sets_count_the_ps_and_every_worker_with_limits_as_requests() {
    let s = sets(2, 4);
    assert_eq!(s.iter().map(|p| (p.name.as_str(), p.count)).collect::<Vec<_>>(), [("ps", 1), ("workers", 2)]);
    let worker = &s[1].template.spec.as_ref().unwrap().containers[0];
    let requests = worker.resources.as_ref().unwrap().requests.as_ref().unwrap();
    assert_eq!(requests["nvidia.com/gpu"].0, "4", "a Workload's template gets no API-server defaulting");
    let ps = &s[0].template.spec.as_ref().unwrap().containers[0];
    assert_eq!(ps.resources.as_ref().unwrap().requests.as_ref().unwrap()["cpu"].0, "1");
}

#[test]
fn min_replicas_below_replicas_lets_kueue_admit_part_of_the_workers() {
    let count =
        |min| pod_sets(PodTemplateSpec::default(), 1, PodTemplateSpec::default(), 4, min)[1].min_count;
    assert_eq!(count(Some(2)), Some(2));
    assert_eq!(count(Some(4)), None, "all of them: nothing partial");
    assert_eq!(count(None), None);
    let mut w = workload("h", &ADMITTED);
    w.status.as_mut().unwrap().admission =
        serde_json::from_value(json!({"podSetAssignments": [{"name": "workers", "count": 2}]})).unwrap();
    assert_eq!((w.admitted_count("workers"), w.admitted_count("ps")), (Some(2), None));
}

#[test]
fn the_digest_follows_what_kueue_counts_and_nothing_else() {
    let base = podsets_hash(&sets(2, 4));
    assert_eq!(base, podsets_hash(&sets(2, 4)));
    assert_ne!(base, podsets_hash(&sets(3, 4)), "a new worker count");
    assert_ne!(base, podsets_hash(&sets(2, 1)), "new resources");
    let partial = pod_sets(PodTemplateSpec::default(), 1, PodTemplateSpec::default(), 2, Some(1));
    assert_ne!(
        podsets_hash(&partial),
        podsets_hash(&pod_sets(Default::default(), 1, Default::default(), 2, None))
    );
    let mut env_changed = sets(2, 4);
    env_changed[0].template.spec.as_mut().unwrap().containers[0].env =
        Some(vec![serde_json::from_value(json!({"name": "LR", "value": "0.1"})).unwrap()]);
    assert_eq!(base, podsets_hash(&env_changed), "a setting Kueue does not count");
}

#[test]
fn a_job_without_a_workload_makes_one_and_waits() {
    let (plan, admission) = plan("team", None, "h", true, true, false);
    assert_eq!(plan, Plan::Create);
    assert!(matches!(&admission, Admission::Pending(m) if m.contains("LocalQueue team")), "{admission:?}");
    assert!(admission.holds());
}

#[test]
fn a_pending_workload_passes_on_kueues_reason() {
    let w = workload(
        "h",
        &[("QuotaReserved", "False", "Pending", "insufficient unused quota for nvidia.com/gpu")],
    );
    let (plan, admission) = plan("team", Some(&w), "h", true, true, false);
    assert_eq!(plan, Plan::Keep);
    assert_eq!(
        admission,
        Admission::Pending("queued in LocalQueue team: insufficient unused quota for nvidia.com/gpu".into())
    );
}

#[test]
fn an_admitted_workload_lets_the_job_run() {
    let (plan, admission) = plan("team", Some(&workload("h", &ADMITTED)), "h", true, false, false);
    assert_eq!((plan, admission.holds()), (Plan::Keep, false));
    assert_eq!(admission, Admission::Admitted(Admitted::default()));
}

#[test]
fn an_evicted_job_stops_its_workers_then_gives_its_quota_back_and_keeps_its_workload() {
    let mut conditions = ADMITTED.to_vec();
    conditions.push(("Evicted", "True", "Preempted", "preempted by a higher priority workload"));
    let w = workload("h", &conditions);
    let (plan_running, admission) = plan("team", Some(&w), "h", true, false, false);
    assert_eq!(plan_running, Plan::Keep, "pods still run: quota stays reserved meanwhile");
    assert!(admission.holds(), "and they are being stopped");
    let (plan_stopped, admission) = plan("team", Some(&w), "h", true, true, false);
    let Plan::Unreserve(why) = plan_stopped else { panic!("{plan_stopped:?}") };
    assert_eq!(why.to_string(), "evicted by Kueue (Preempted): preempted by a higher priority workload");
    assert!(admission.holds());
    // Once the quota is given back, the Workload is left to Kueue: nothing more to do, and the
    // job waits (it is not made again, which would undo a deactivation or a backoff).
    let given_back = workload(
        "h",
        &[
            ("QuotaReserved", "False", "Pending", "preempted"),
            ("Admitted", "False", "NoReservation", ""),
            ("Evicted", "True", "Deactivated", "The workload is deactivated"),
        ],
    );
    for stopped in [true, false] {
        let (plan, admission) = plan("team", Some(&given_back), "h", true, stopped, false);
        assert_eq!(plan, Plan::Keep);
        let Admission::Pending(why) = admission else { panic!("{admission:?}") };
        assert!(
            why.contains("evicted by Kueue (Deactivated)") && why.contains("queued again in LocalQueue team"),
            "{why}"
        );
    }
}

#[test]
fn giving_an_evicted_workloads_quota_back_is_what_kueues_integrations_write() {
    let now = Time(k8s_openapi::jiff::Timestamp::from_second(2_000_000_000).unwrap());
    let then = json!("2026-01-01T00:00:00Z");
    let mut w = workload("h", &ADMITTED);
    w.metadata.generation = Some(3);
    let status = w.status.as_mut().unwrap();
    status.conditions.push(WorkloadCondition {
        type_: "Evicted".into(),
        status: "True".into(),
        reason: "Preempted".into(),
        message: "preempted by high".into(),
        rest: [("lastTransitionTime".to_string(), then.clone())].into(),
    });
    status.admission = Some(WorkloadAdmission::default());
    let by = |reason: &str| Eviction { reason: reason.into(), message: "preempted by high".into() };
    let patch = unreserved_status(&w, &by("Preempted"), &now);
    assert_eq!(patch["admission"], serde_json::Value::Null, "a merge patch's null removes it");
    let conditions: Vec<WorkloadCondition> = serde_json::from_value(patch["conditions"].clone()).unwrap();
    let find = |t: &str| conditions.iter().find(|c| c.type_ == t).unwrap_or_else(|| panic!("no {t}"));
    let stamp = serde_json::to_value(&now).unwrap();
    for (t, status, reason) in [
        ("QuotaReserved", "False", "Pending"),
        ("Admitted", "False", "NoReservation"),
        ("Requeued", "True", "Preempted"),
    ] {
        let c = find(t);
        assert_eq!((c.status.as_str(), c.reason.as_str()), (status, reason), "{t}");
        assert_eq!(c.rest["lastTransitionTime"], stamp, "{t} changed status now");
        assert_eq!(c.rest["observedGeneration"], 3, "{t}");
    }
    assert_eq!(find("QuotaReserved").message, "preempted by high");
    // The eviction itself stays as Kueue wrote it, transition time included.
    assert_eq!(
        (find("Evicted").status.as_str(), &find("Evicted").rest["lastTransitionTime"]),
        ("True", &then)
    );
    assert_eq!(conditions.len(), 4);
    // Deactivated: not requeued until Kueue sees the Workload active again.
    let patch = unreserved_status(&w, &by("Deactivated"), &now);
    let requeued = patch["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Requeued").cloned();
    assert_eq!(
        requeued.map(|c| (c["status"].clone(), c["reason"].clone())),
        Some((json!("False"), json!("Deactivated")))
    );
}

#[test]
fn a_deactivated_workload_is_not_replaced_by_an_active_one() {
    // An admin set spec.active: false, Kueue evicted it and its quota was given back; then the
    // job is resized (or moved to another queue): it waits, the Workload kept, until reactivated.
    let mut w =
        workload("old", &[("QuotaReserved", "False", "Pending", ""), ("Evicted", "True", "Deactivated", "")]);
    w.spec.active = Some(false);
    for (queue, hash) in [("team", "new"), ("other", "old")] {
        let (plan, admission) = plan(queue, Some(&w), hash, true, true, false);
        assert_eq!(plan, Plan::Keep, "{queue} {hash}");
        let Admission::Pending(why) = admission else { panic!("{admission:?}") };
        assert!(why.contains("deactivated (spec.active: false)"), "{why}");
    }
    w.spec.active = Some(true);
    assert_eq!(
        plan("team", Some(&w), "new", true, true, false).0,
        Plan::Requeue(Requeue::Resized),
        "active again"
    );
}

#[test]
fn a_resized_job_is_queued_again_with_its_new_size() {
    let admitted = workload("old", &ADMITTED);
    assert_eq!(plan("team", Some(&admitted), "new", true, false, false).0, Plan::Keep, "running: stop first");
    assert!(plan("team", Some(&admitted), "new", true, false, false).1.holds());
    assert_eq!(plan("team", Some(&admitted), "new", true, true, false).0, Plan::Requeue(Requeue::Resized));
    let pending = workload("old", &[("QuotaReserved", "False", "Pending", "no quota")]);
    assert!(
        matches!(plan("team", Some(&pending), "new", true, false, false).0, Plan::Requeue(_)),
        "holds no quota"
    );
}

#[test]
fn a_suspended_job_releases_its_quota_once_its_workers_are_gone() {
    let w = workload("h", &ADMITTED);
    assert_eq!(plan("team", Some(&w), "h", false, false, false), (Plan::Keep, Admission::Suspended));
    assert_eq!(plan("team", Some(&w), "h", false, true, false), (Plan::Release, Admission::Suspended));
    // Created suspended: no Workload, and its pods (the PS's too) held (issue #48: its PS ran
    // at once, outside the quota).
    let (p, a) = plan("team", None, "h", false, true, false);
    assert_eq!((p, a.holds()), (Plan::Keep, true), "and makes none");
    // A PS that is the only place the model lives keeps running, so its Workload keeps the
    // quota (issue #48: the Workload went, the PS ran on outside it).
    assert_eq!(plan("team", Some(&w), "h", false, true, true), (Plan::Keep, Admission::Suspended));
}

#[test]
fn the_assigned_flavors_place_the_pods() {
    let mut w = workload("h", &ADMITTED);
    w.status.as_mut().unwrap().admission = serde_json::from_value(json!({"podSetAssignments": [
        {"name": "ps", "flavors": {"cpu": "cpu-pool"}},
        {"name": "workers", "flavors": {"cpu": "a100", "nvidia.com/gpu": "a100"}},
    ]}))
    .unwrap();
    assert_eq!(w.flavors_of("workers"), BTreeSet::from(["a100".to_string()]));
    assert_eq!(w.flavors_of("ps"), BTreeSet::from(["cpu-pool".to_string()]));
    assert!(w.flavors_of("other").is_empty());
    let flavor: ResourceFlavorSpec = serde_json::from_value(json!({
        "nodeLabels": {"gpu": "a100"},
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "nodeTaints": [{"key": "gpu", "value": "a100", "effect": "NoSchedule"}],
    }))
    .unwrap();
    let p = placement([&flavor, &flavor]);
    assert_eq!(p.node_selector, BTreeMap::from([("gpu".to_string(), "a100".to_string())]));
    assert_eq!(p.tolerations.len(), 1, "one toleration, however many resources share the flavor");
    assert_eq!(placement([]), Default::default());
}

#[test]
fn a_job_moved_to_another_queue_is_queued_there() {
    let pending = workload("h", &[("QuotaReserved", "False", "Pending", "no quota")]);
    let (plan_pending, admission) = plan("other", Some(&pending), "h", true, false, false);
    assert!(
        matches!(&plan_pending, Plan::Requeue(r @ Requeue::QueueChanged { .. }) if r.to_string().contains("from team")),
        "{plan_pending:?}"
    );
    assert!(matches!(&admission, Admission::Pending(m) if m.contains("LocalQueue other")), "{admission:?}");
    // Admitted and running: the workers stop first, as for a resize.
    let admitted = workload("h", &ADMITTED);
    assert_eq!(plan("other", Some(&admitted), "h", true, false, false).0, Plan::Keep);
    assert!(matches!(plan("other", Some(&admitted), "h", true, true, false).0, Plan::Requeue(_)));
}
