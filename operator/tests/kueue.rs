//! Kueue admission on the real control plane with Kueue's own manager (v0.17, built from Go
//! modules): a ClusterQueue of 4 GPUs, jobs of 2 workers × 2 GPUs each. One runs; the others wait
//! `Queued` with their pods stopped until its quota comes back, and then the one whose
//! PriorityClass is higher goes first; a suspended job gives its quota back.

mod support;

use serde_json::{Value, json};
use support::kueue::Kueue;
use support::operator::*;
use support::{ControlPlane, control_plane, free_port, wait_for};

fn apply_job(cp: &ControlPlane, ns: &str, name: &str, priority: Option<&str>) {
    let mut pod = json!({});
    if let Some(p) = priority {
        pod["priorityClassName"] = json!(p);
    }
    apply_workers(cp, ns, name, json!({"replicas": 2, "gpus": 2, "pod": pod}));
}

fn apply_workers(cp: &ControlPlane, ns: &str, name: &str, workers: Value) {
    let mut job: Value = serde_json::from_str(&job(name, json!({"workers": workers}))).unwrap();
    job["metadata"]["labels"] = json!({"kueue.x-k8s.io/queue-name": "team"});
    cp.kubectl_ok(&["apply", "-n", ns, "-f", "-"], Some(&job.to_string()));
}

/// The job's Workload as Kueue reports it.
fn workload(cp: &ControlPlane, ns: &str, job: &str) -> Option<Value> {
    cp.get_json(ns, &format!("workloads.kueue.x-k8s.io/trainingjob-{job}"))
}

fn is_true(v: &Value, type_: &str) -> bool {
    condition(&v["status"], type_)["status"] == "True"
}

/// Whether the job's worker Job exists and is suspended. Absent counts as not suspended (not yet
/// a match for the waits): the operator replaces the worker Job when its template changes, and a
/// read in between found none (a CI run failed here, unwrapping it).
fn worker_job_suspended(cp: &ControlPlane, ns: &str, job: &str) -> bool {
    cp.get_json(ns, &format!("job/{job}-workers")).is_some_and(|j| j["spec"]["suspend"] == true)
}

fn ps_replicas(cp: &ControlPlane, ns: &str, job: &str) -> Value {
    cp.get_json(ns, &format!("deployment/{job}-ps")).unwrap()["spec"]["replicas"].clone()
}

/// Waits until `job` is Queued and checks that nothing of it runs meanwhile.
fn assert_queued(cp: &ControlPlane, ns: &str, job: &str) -> Value {
    let st = wait_phase(cp, ns, job, "Queued");
    assert_eq!(condition(&st, "Queued")["status"], "True", "{st:#}");
    assert!(worker_job_suspended(cp, ns, job), "{job}'s workers wait suspended");
    assert_eq!(ps_replicas(cp, ns, job), 0, "{job}'s parameter server waits too (it holds no model yet)");
    worker_pods(cp, ns, job, 0);
    st
}

#[test]
fn kueue_admits_a_job_as_one_unit_by_priority_when_quota_comes_back() {
    let cp = control_plane();
    let _kueue = Kueue::start(cp);
    let ns = cp.namespace("kueue");
    cp.kubectl_ok(
        &["apply", "-f", "-"],
        Some(
            r#"
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: training-low}
value: 100
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: training-high}
value: 1000
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {name: default-flavor}
spec:
  nodeLabels: {kubernetes.io/os: linux}
  tolerations: [{key: example.com/pool, operator: Exists, effect: NoSchedule}]
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: gpus}
spec:
  namespaceSelector: {}
  resourceGroups:
  - coveredResources: [cpu, memory, nvidia.com/gpu]
    flavors:
    - name: default-flavor
      resources:
      - {name: cpu, nominalQuota: 32}
      - {name: memory, nominalQuota: 128Gi}
      - {name: nvidia.com/gpu, nominalQuota: 4}
"#,
        ),
    );
    cp.kubectl_ok(
        &["apply", "-n", &ns, "-f", "-"],
        Some("{\"apiVersion\": \"kueue.x-k8s.io/v1beta2\", \"kind\": \"LocalQueue\", \"metadata\": {\"name\": \"team\"}, \"spec\": {\"clusterQueue\": \"gpus\"}}"),
    );
    let ps_port = free_port();
    let op = Operator::start(
        cp,
        &ns,
        &["--leader-elect=false", "--kueue", "--ps-url", &format!("http://127.0.0.1:{ps_port}")],
    );

    // The first job takes the queue's 4 GPUs: admitted as one Workload, PS and workers together.
    apply_job(cp, &ns, "first", None);
    let w = wait_for("first's Workload to be admitted", LONG, || {
        workload(cp, &ns, "first").filter(|w| is_true(w, "Admitted"))
    });
    let sets: Vec<(String, i64)> = w["spec"]["podSets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["name"].as_str().unwrap().to_string(), p["count"].as_i64().unwrap()))
        .collect();
    assert_eq!(sets, [("ps".to_string(), 1), ("workers".to_string(), 2)]);
    let usage = &w["status"]["admission"]["podSetAssignments"][1]["resourceUsage"];
    assert_eq!(usage["nvidia.com/gpu"], "4", "Kueue counts 2 workers × 2 GPUs: {w:#}");
    assert_eq!(w["metadata"]["ownerReferences"][0]["kind"], "TrainingJob");
    let first_workers = worker_pods(cp, &ns, "first", 2);
    assert_eq!(ps_replicas(cp, &ns, "first"), 1);
    // Placed where the flavor Kueue assigned says, as Kueue's own integrations place pods. (The
    // PS requests no resource here, so Kueue assigns its pod set no flavor.)
    for pod in &first_workers {
        let spec = &cp.get_json(&ns, &format!("pod/{pod}")).unwrap()["spec"];
        assert_eq!(spec["nodeSelector"]["kubernetes.io/os"], "linux", "{pod}: {spec:#}");
        let tolerations = spec["tolerations"].as_array().unwrap();
        assert!(tolerations.iter().any(|t| t["key"] == "example.com/pool"), "{pod}: {spec:#}");
    }

    // Two more jobs of 4 GPUs each, the lower priority one first: both wait with nothing running,
    // saying why in Kueue's words.
    apply_job(cp, &ns, "low", Some("training-low"));
    apply_job(cp, &ns, "high", Some("training-high"));
    for job in ["low", "high"] {
        assert_queued(cp, &ns, job);
        // First "creating its Workload", then Kueue's reason once it has looked at it.
        wait_for(&format!("Kueue's reason in {job}'s Queued condition"), LONG, || {
            let message = condition(&status(cp, &ns, job), "Queued")["message"].as_str()?.to_string();
            (message.contains("LocalQueue team") && message.contains("insufficient unused quota"))
                .then_some(())
        });
    }
    assert_eq!(workload(cp, &ns, "high").unwrap()["spec"]["priority"], 1000);
    // One Workload per job: Kueue's batch/v1 integration (on in this manager) leaves the worker
    // Jobs alone, and nobody but the operator sets their suspend.
    let workloads = cp.names(&ns, "workloads.kueue.x-k8s.io", "");
    assert_eq!(workloads, ["trainingjob-first", "trainingjob-high", "trainingjob-low"]);
    let worker_job = cp.get_json(&ns, "job/low-workers").unwrap();
    assert!(worker_job["metadata"]["labels"].get("kueue.x-k8s.io/queue-name").is_none());
    let table = cp.kubectl_ok(&["get", "tj", "-n", &ns], None);
    assert!(table.contains("Queued"), "{table}");
    wait_for("the Queued jobs in the operator's metrics", LONG, || {
        (sample(&op.metrics_text(), "foresight_operator_jobs{phase=\"Queued\"}") == Some(2.0)).then_some(())
    });

    // A queued job moved to another LocalQueue (one that does not exist) is queued there, with
    // Kueue's word for it, and back.
    let relabel = |queue: &str| {
        let label = format!("kueue.x-k8s.io/queue-name={queue}");
        cp.kubectl_ok(&["label", "-n", &ns, "tj", "low", &label, "--overwrite"], None);
    };
    relabel("elsewhere");
    wait_for("low's Workload in LocalQueue elsewhere", LONG, || {
        workload(cp, &ns, "low").filter(|w| w["spec"]["queueName"] == "elsewhere")
    });
    wait_for("Kueue's reason for elsewhere in low's Queued condition", LONG, || {
        let message = condition(&status(cp, &ns, "low"), "Queued")["message"].as_str()?.to_string();
        message.contains("LocalQueue elsewhere doesn't exist").then_some(())
    });
    relabel("team");
    wait_for("low's Workload back in LocalQueue team", LONG, || {
        workload(cp, &ns, "low").filter(|w| w["spec"]["queueName"] == "team")
    });
    let moved = events(cp, &ns, "low").into_iter().find(|e| e.1 == "QueueChanged");
    assert!(moved.as_ref().is_some_and(|e| e.2.contains("changed from team")), "{moved:?}");
    assert_queued(cp, &ns, "low");

    // The first job finishes (a real PS writes the final model): its Workload is Finished, the
    // quota comes back, and the higher priority job runs while the other still waits.
    let ps = Ps::start(cp, &ns, "first", ps_port, 2);
    ps.train_one_step();
    cp.set_pod_phase(&ns, &ps_pod(cp, &ns, "first"), "Running");
    for p in &first_workers {
        cp.set_pod_phase(&ns, p, "Succeeded");
    }
    wait_phase(cp, &ns, "first", "Succeeded");
    let finished = wait_for("first's Workload to be Finished", LONG, || {
        workload(cp, &ns, "first").filter(|w| is_true(w, "Finished"))
    });
    assert_eq!(condition(&finished["status"], "Finished")["reason"], "Succeeded");
    wait_for("high's Workload to be admitted", LONG, || {
        workload(cp, &ns, "high").filter(|w| is_true(w, "Admitted"))
    });
    worker_pods(cp, &ns, "high", 2);
    assert!(!worker_job_suspended(cp, &ns, "high"));
    let st = wait_for("high to leave Queued", LONG, || {
        let s = status(cp, &ns, "high");
        (s["phase"] != "Queued").then_some(s)
    });
    assert_eq!(condition(&st, "Queued")["status"], "False", "{st:#}");
    assert_queued(cp, &ns, "low");
    assert!(!is_true(&workload(cp, &ns, "low").unwrap(), "Admitted"));

    // Suspending the running job gives its quota back once its workers are gone: its Workload is
    // deleted and the waiting job is admitted.
    patch_job(cp, &ns, "high", r#"{"spec":{"runPolicy":{"suspend":true}}}"#);
    wait_for("high's workers to be suspended", LONG, || worker_job_suspended(cp, &ns, "high").then_some(()));
    // Play the kubelet: the stopped pods go.
    remove_worker_pods(cp, &ns, "high");
    wait_phase(cp, &ns, "high", "Suspended");
    wait_for("high's Workload to go", LONG, || workload(cp, &ns, "high").is_none().then_some(()));
    // Its PS goes too (it holds no model yet): with the quota given back it would run outside
    // it (issue #48: it stayed at 1 replica).
    let ps_replicas =
        |job: &str| cp.get_json(&ns, &format!("deployment/{job}-ps")).map(|d| d["spec"]["replicas"].clone());
    wait_for("high's PS stopped", LONG, || (ps_replicas("high") == Some(json!(0))).then_some(()));
    wait_for("low's Workload to be admitted", LONG, || {
        workload(cp, &ns, "low").filter(|w| is_true(w, "Admitted"))
    });
    let low_uid = workload(cp, &ns, "low").unwrap()["metadata"]["uid"].clone();
    let low_workers = worker_pods(cp, &ns, "low", 2);
    for p in &low_workers {
        cp.set_pod_phase(&ns, p, "Running");
    }

    // With preemption allowed, resuming the higher priority job evicts the running one: its
    // workers stop first, then its quota is given back (its Workload kept, as Kueue's own
    // integrations do) and it waits Queued again while the higher priority job runs.
    cp.kubectl_ok(
        &[
            "patch",
            "clusterqueue",
            "gpus",
            "--type=merge",
            "-p",
            r#"{"spec":{"preemption":{"withinClusterQueue":"LowerPriority"}}}"#,
        ],
        None,
    );
    patch_job(cp, &ns, "high", r#"{"spec":{"runPolicy":{"suspend":false}}}"#);
    wait_for("low's Workload to be evicted", LONG, || {
        workload(cp, &ns, "low").filter(|w| is_true(w, "Evicted"))
    });
    wait_for("low's workers to be suspended", LONG, || worker_job_suspended(cp, &ns, "low").then_some(()));
    // Its pods still terminate (no kubelet here to stop them): not Queued yet.
    let st = wait_for("low's Requeuing reason", LONG, || {
        let s = status(cp, &ns, "low");
        (s["reason"] == "Requeuing").then_some(s)
    });
    assert_ne!(st["phase"], "Queued", "{st:#}");
    remove_worker_pods(cp, &ns, "low");
    assert_queued(cp, &ns, "low");
    wait_for("high's new Workload to be admitted", LONG, || {
        workload(cp, &ns, "high").filter(|w| is_true(w, "Admitted"))
    });
    worker_pods(cp, &ns, "high", 2);
    let evicted = events(cp, &ns, "low").into_iter().find(|e| e.1 == "Evicted");
    assert!(evicted.as_ref().is_some_and(|e| e.2.contains("evicted by Kueue (Preempted)")), "{evicted:?}");
    let w = workload(cp, &ns, "low").unwrap();
    assert_eq!(
        w["metadata"]["uid"], low_uid,
        "low's Workload is the one Kueue evicted, not a new one: {w:#}"
    );
    assert!(w["status"].get("admission").is_none() && !is_true(&w, "QuotaReserved"), "{w:#}");
    assert!(is_true(&w, "Requeued"), "a preempted Workload queues again at once: {w:#}");

    // Resizing an admitted job re-admits it at its new size: Kueue's pod sets cannot change, so
    // the workers stop, the Workload is replaced with the new count and admitted again.
    cp.kubectl_ok(&["delete", "tj", "low", "-n", &ns, "--wait=true"], None);
    let old_uid = workload(cp, &ns, "high").unwrap()["metadata"]["uid"].clone();
    patch_job(cp, &ns, "high", r#"{"spec":{"workers":{"replicas":1}}}"#);
    wait_for("high's workers to stop for the new size", LONG, || {
        worker_job_suspended(cp, &ns, "high").then_some(())
    });
    remove_worker_pods(cp, &ns, "high");
    let w = wait_for("high's Workload of 1 worker to be admitted", LONG, || {
        workload(cp, &ns, "high").filter(|w| w["metadata"]["uid"] != old_uid && is_true(w, "Admitted"))
    });
    assert_eq!(w["spec"]["podSets"][1]["count"], 1, "{w:#}");
    assert_eq!(w["status"]["admission"]["podSetAssignments"][1]["resourceUsage"]["nvidia.com/gpu"], "2");
    worker_pods(cp, &ns, "high", 1);
    assert!(!worker_job_suspended(cp, &ns, "high"));

    // workers.minReplicas is Kueue's partial admission: a job of 4 one-GPU workers that may train
    // on 2 starts on the 2 GPUs left, 2 workers at a time (the other indices run as those finish).
    apply_workers(cp, &ns, "partial", json!({"replicas": 4, "minReplicas": 2, "gpus": 1}));
    let w = wait_for("partial's Workload to be admitted", LONG, || {
        workload(cp, &ns, "partial").filter(|w| is_true(w, "Admitted"))
    });
    assert_eq!(
        (&w["spec"]["podSets"][1]["count"], &w["spec"]["podSets"][1]["minCount"]),
        (&json!(4), &json!(2))
    );
    assert_eq!(w["status"]["admission"]["podSetAssignments"][1]["count"], 2, "{w:#}");
    let pods = worker_pods(cp, &ns, "partial", 2);
    let spec = &cp.get_json(&ns, "job/partial-workers").unwrap()["spec"];
    assert_eq!((&spec["parallelism"], &spec["completions"]), (&json!(2), &json!(4)));
    for p in &pods {
        cp.set_pod_phase(&ns, p, "Running");
    }
    cp.set_pod_phase(&ns, &ps_pod(cp, &ns, "partial"), "Running");
    let st = wait_phase(cp, &ns, "partial", "Running");
    assert_eq!(st["workers"]["desired"], 4, "{st:#}");

    // An admin deactivates the Workload (spec.active: false): Kueue evicts it, the workers
    // stop, the quota goes back, and the job waits while the Workload stays inactive — it is
    // not replaced by an active one, which would run the job again behind the admin's back.
    let uid = workload(cp, &ns, "partial").unwrap()["metadata"]["uid"].clone();
    let deactivate = |active: bool| {
        let patch = json!({"spec": {"active": active}}).to_string();
        let name = format!("trainingjob-{}", "partial");
        cp.kubectl_ok(&["patch", "workload", &name, "-n", &ns, "--type=merge", "-p", &patch], None);
    };
    deactivate(false);
    wait_for("partial's workers to stop", LONG, || worker_job_suspended(cp, &ns, "partial").then_some(()));
    remove_worker_pods(cp, &ns, "partial");
    // (Its PS keeps running: it holds the only copy of the model, as under suspend.)
    let st = wait_phase(cp, &ns, "partial", "Queued");
    let queued = condition(&st, "Queued")["message"].as_str().unwrap_or_default().to_string();
    assert!(queued.contains("evicted by Kueue (Deactivated)"), "{st:#}");
    worker_pods(cp, &ns, "partial", 0);
    wait_for("partial's quota given back", LONG, || {
        workload(cp, &ns, "partial")
            .filter(|w| !is_true(w, "QuotaReserved") && w["status"].get("admission").is_none())
    });
    // Several reconciles later (the job's status and events change meanwhile), still the same
    // inactive Workload, not admitted, the workers still stopped.
    std::thread::sleep(std::time::Duration::from_secs(5));
    let w = workload(cp, &ns, "partial").unwrap();
    assert_eq!((&w["metadata"]["uid"], &w["spec"]["active"]), (&uid, &json!(false)), "{w:#}");
    assert!(!is_true(&w, "Admitted") && worker_job_suspended(cp, &ns, "partial"), "{w:#}");
    // Reactivated: Kueue admits it again and the workers start.
    deactivate(true);
    wait_for("partial admitted again", LONG, || {
        workload(cp, &ns, "partial").filter(|w| is_true(w, "Admitted") && w["metadata"]["uid"] == uid)
    });
    wait_for("partial's workers to start again", LONG, || {
        (!worker_job_suspended(cp, &ns, "partial")).then_some(())
    });

    // A labelled job created suspended: no Workload and no pod, its PS's neither (issue #48: its
    // PS ran at once, outside the quota).
    let mut asleep: Value = serde_json::from_str(&job(
        "asleep",
        json!({"workers": {"replicas": 1}, "runPolicy": {"suspend": true}}),
    ))
    .unwrap();
    asleep["metadata"]["labels"] = json!({"kueue.x-k8s.io/queue-name": "team"});
    cp.kubectl_ok(&["apply", "-n", &ns, "-f", "-"], Some(&asleep.to_string()));
    wait_phase(cp, &ns, "asleep", "Suspended");
    let d = wait_for("asleep's PS Deployment", LONG, || cp.get_json(&ns, "deployment/asleep-ps"));
    assert_eq!(d["spec"]["replicas"], 0, "{d:#}");
    assert!(workload(cp, &ns, "asleep").is_none());

    // A PS without checkpoint storage keeps its settings when they change (a restart would lose
    // the model it holds): Kueue keeps counting it at the size it runs (issue #48: a job that
    // shrank parameterServer.resources after admission was re-admitted small while the large PS
    // kept running).
    let ps_cpu = |cpu: &str| json!({"workers": {"replicas": 1}, "parameterServer": {"resources": {"requests": {"cpu": cpu}}}});
    let mut big: Value = serde_json::from_str(&job("big", ps_cpu("2"))).unwrap();
    big["metadata"]["labels"] = json!({"kueue.x-k8s.io/queue-name": "team"});
    cp.kubectl_ok(&["apply", "-n", &ns, "-f", "-"], Some(&big.to_string()));
    let counted = |w: &Value| {
        w["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"].clone()
    };
    let w = wait_for("big's Workload to be admitted", LONG, || {
        workload(cp, &ns, "big").filter(|w| is_true(w, "Admitted"))
    });
    assert_eq!(counted(&w), "2", "{w:#}");
    wait_for("big's PS to run", LONG, || (ps_replicas("big") == Some(json!(1))).then_some(()));
    let mut smaller = big.clone();
    smaller["spec"]["parameterServer"] = ps_cpu("500m")["parameterServer"].clone();
    cp.kubectl_ok(&["apply", "-n", &ns, "-f", "-"], Some(&smaller.to_string()));
    wait_for("big's PS change to wait", LONG, || {
        (condition(&status(cp, &ns, "big"), "SpecApplied")["reason"] == "ChangeDeferred").then_some(())
    });
    std::thread::sleep(std::time::Duration::from_secs(2));
    let now = workload(cp, &ns, "big").unwrap();
    assert_eq!(now["metadata"]["uid"], w["metadata"]["uid"], "not requeued: {now:#}");
    assert_eq!(counted(&now), "2", "counted at the size that runs: {now:#}");
    assert!(is_true(&now, "Admitted"), "{now:#}");
    let st = status(cp, &ns, "big");
    assert!(
        !worker_job_suspended(cp, &ns, "big") && st["phase"] != "Queued",
        "not stopped to be resized: {st:#}"
    );
    let d = cp.get_json(&ns, "deployment/big-ps").unwrap();
    assert_eq!(d["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"], "2");

    // A namespace's LocalQueue `default` (Kueue's LocalQueueDefaulting): a job made without the
    // queue label before it existed runs outside Kueue and keeps doing so; one made after gets
    // the label and queues there.
    let unlabelled = |name: &str| {
        cp.kubectl_ok(
            &["apply", "-n", &ns, "-f", "-"],
            Some(&job(name, json!({"workers": {"replicas": 1}}))),
        );
    };
    unlabelled("early");
    worker_pods(cp, &ns, "early", 1);
    let default_queue = json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                               "metadata": {"name": "default"}, "spec": {"clusterQueue": "gpus"}});
    cp.kubectl_ok(&["apply", "-n", &ns, "-f", "-"], Some(&default_queue.to_string()));
    unlabelled("late");
    let label = |name: &str| {
        cp.get_json(&ns, &format!("tj/{name}")).unwrap()["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
            .clone()
    };
    wait_for("late labelled for the default queue", LONG, || (label("late") == "default").then_some(()));
    let w = wait_for("late's Workload", LONG, || workload(cp, &ns, "late"));
    assert_eq!(w["spec"]["queueName"], "default", "{w:#}");
    let defaulted = events(cp, &ns, "late").into_iter().find(|e| e.1 == "QueueDefaulted");
    assert!(defaulted.as_ref().is_some_and(|e| e.2.contains("LocalQueue default")), "{defaulted:?}");
    assert_eq!(status(cp, &ns, "late")["defaultedQueue"], "default");
    // The author's manifest, replaced as it is (`kubectl replace`, a GitOps replace), drops the
    // label it never had: the operator puts it back, and the job stays in its Workload (P8).
    cp.kubectl_ok(
        &["replace", "-n", &ns, "-f", "-"],
        Some(&job("late", json!({"workers": {"replicas": 1}}))),
    );
    wait_for("late's label put back", LONG, || (label("late") == "default").then_some(()));
    let restored = events(cp, &ns, "late").into_iter().find(|e| e.1 == "QueueLabelRestored");
    assert!(restored.as_ref().is_some_and(|e| e.2.contains("LocalQueue default")), "{restored:?}");
    assert_eq!(
        workload(cp, &ns, "late").unwrap()["metadata"]["uid"],
        w["metadata"]["uid"],
        "the same Workload"
    );
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert_eq!(label("early"), Value::Null, "a running job is not moved into the queue");
    assert!(!worker_job_suspended(cp, &ns, "early"));
    assert!(workload(cp, &ns, "early").is_none());

    // A Workload of the job's name, labelled like the operator's, that is not the job's (anyone
    // who may create Workloads can make one) does not hold the running unlabelled job (review C8: it was taken for the job's
    // own, waiting for admission, and the job's workers were suspended).
    let planted = json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {"name": "trainingjob-early", "labels": {"app.kubernetes.io/managed-by": "foresight-operator"}},
        "spec": {"queueName": "no-such-queue", "podSets": [{"name": "main", "count": 1,
            "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}}]}});
    cp.kubectl_ok(&["apply", "-n", &ns, "-f", "-"], Some(&planted.to_string()));
    // A pod's change brings the job to a reconcile (an annotation would not: same generation).
    for p in worker_pods(cp, &ns, "early", 1) {
        cp.set_pod_phase(&ns, &p, "Running");
    }
    std::thread::sleep(std::time::Duration::from_secs(3));
    let st = status(cp, &ns, "early");
    assert!(!worker_job_suspended(cp, &ns, "early") && st["phase"] != "Queued", "{st:#}");
    assert_ne!(st["reason"], "Requeuing", "{st:#}");

    // With --kueue-required (the chart's kueue.required, Kueue's manageJobsWithoutQueueName): in
    // a namespace without a LocalQueue `default`, a job without the queue label waits, saying
    // why, with nothing of it running; labelled, it is queued in Kueue like any other.
    let strict = cp.namespace("kueue-required");
    let team = json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                      "metadata": {"name": "team"}, "spec": {"clusterQueue": "gpus"}});
    cp.kubectl_ok(&["apply", "-n", &strict, "-f", "-"], Some(&team.to_string()));
    let _strict_op = Operator::start(
        cp,
        &strict,
        &[
            "--leader-elect=false",
            "--kueue",
            "--kueue-required",
            "--ps-url",
            &format!("http://127.0.0.1:{ps_port}"),
        ],
    );
    cp.kubectl_ok(
        &["apply", "-n", &strict, "-f", "-"],
        Some(&job("loose", json!({"workers": {"replicas": 1}}))),
    );
    assert_queued(cp, &strict, "loose");
    // A later reconcile (woken by an edit) still says why: the Queued condition this rule wrote
    // is not a label removed while the job waited (it read so before, at the next reconcile).
    cp.kubectl_ok(&["annotate", "-n", &strict, "tj", "loose", "example.com/touched=1"], None);
    std::thread::sleep(std::time::Duration::from_secs(2));
    let st = status(cp, &strict, "loose");
    let message = condition(&st, "Queued")["message"].as_str().unwrap_or_default().to_string();
    assert!(
        message.contains("no kueue.x-k8s.io/queue-name label") && message.contains("--kueue-required"),
        "{st:#}"
    );
    assert!(workload(cp, &strict, "loose").is_none(), "not in any queue yet");
    cp.kubectl_ok(&["label", "-n", &strict, "tj", "loose", "kueue.x-k8s.io/queue-name=team"], None);
    let w = wait_for("loose's Workload once labelled", LONG, || workload(cp, &strict, "loose"));
    assert_eq!(w["spec"]["queueName"], "team", "{w:#}");
}
