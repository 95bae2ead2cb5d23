//! The controller (`foresight operator`, the real binary) against a real control plane: etcd,
//! kube-apiserver, kube-controller-manager (Job, Deployment, ReplicaSet, garbage collector) and
//! kube-scheduler with one simulated node. The tests play the kubelet, moving pods through
//! their phases; everything else — the Job controller counting failures and deadlines, the
//! scheduler refusing pods, the garbage collector — is Kubernetes' own code. One operator per
//! test, watching the test's namespace only.

mod support;

use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};
use support::operator::*;
use support::{control_plane, free_port, wait_for};

/// `kubectl apply` of a TrainingJob named `name` with `spec` over the defaults of `job`.
fn apply_job(cp: &support::ControlPlane, ns: &str, name: &str, spec: Value) {
    cp.kubectl_ok(&["apply", "-n", ns, "-f", "-"], Some(&job(name, spec)));
}

#[test]
fn a_job_runs_reports_progress_succeeds_and_its_parameter_server_is_removed() {
    let cp = control_plane();
    let ns = cp.namespace("lifecycle");
    let ps_port = free_port();
    let op = Operator::start(
        cp,
        &ns,
        &["--leader-elect=false", "--ps-url", &format!("http://127.0.0.1:{ps_port}")],
    );
    apply_job(
        cp,
        &ns,
        "mnist",
        json!({"workers": {"replicas": 2, "gpus": 1}, "runPolicy": {"backoffLimit": 3}}),
    );
    let tj = cp.get_json(&ns, "tj/mnist").unwrap();
    let uid = tj["metadata"]["uid"].as_str().unwrap();

    // Exactly the expected children, each owned by the TrainingJob.
    let owned_by_job = |v: &Value| {
        let refs = v["metadata"]["ownerReferences"].as_array().cloned().unwrap_or_default();
        refs.len() == 1
            && refs[0]["uid"] == uid
            && refs[0]["controller"] == true
            && refs[0]["kind"] == "TrainingJob"
    };
    let selector = "foresight.dev/job=mnist";
    let deploy = wait_for("the PS Deployment", LONG, || cp.get_json(&ns, "deployment/mnist-ps"));
    let workers = wait_for("the worker Job", LONG, || cp.get_json(&ns, "job/mnist-workers"));
    assert_eq!(cp.names(&ns, "deployments", selector), ["mnist-ps"]);
    assert_eq!(cp.names(&ns, "services", selector), ["mnist-ps"]);
    let secret = token_secret(cp, &ns, "mnist");
    assert_eq!(cp.names(&ns, "secrets", selector), [&secret["secret/".len()..]]);
    assert_eq!(cp.names(&ns, "jobs", selector), ["mnist-workers"]);
    assert!(cp.names(&ns, "pvc", selector).is_empty(), "no checkpoint storage asked for");
    for what in ["deployment/mnist-ps", "service/mnist-ps", &secret, "job/mnist-workers"] {
        assert!(owned_by_job(&cp.get_json(&ns, what).unwrap()), "{what} is not owned by the job");
    }
    let js = &workers["spec"];
    assert_eq!(js["completionMode"], "Indexed");
    assert_eq!((js["completions"].as_i64(), js["parallelism"].as_i64()), (Some(2), Some(2)));
    assert_eq!(js["backoffLimit"], 3);
    let pod = &js["template"]["spec"];
    assert_eq!(pod["restartPolicy"], "Never");
    let c = &pod["containers"][0];
    assert_eq!(c["resources"]["limits"]["nvidia.com/gpu"], "1");
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    let env = |c: &Value, k: &str| c["env"].as_array().unwrap().iter().find(|e| e["name"] == k).cloned();
    assert_eq!(env(c, "FORESIGHT_PS_URL").unwrap()["value"], format!("http://mnist-ps.{ns}.svc:8080"));
    assert_eq!(
        env(c, "FORESIGHT_TOKEN").unwrap()["valueFrom"]["secretKeyRef"]["name"],
        &secret["secret/".len()..]
    );
    assert!(
        env(c, "FORESIGHT_WORKER_INDEX").unwrap()["valueFrom"]["fieldRef"]["fieldPath"]
            .as_str()
            .unwrap()
            .contains("job-completion-index")
    );
    let psc = &deploy["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(deploy["spec"]["replicas"], 1);
    assert_eq!(env(psc, "FORESIGHT_ALGORITHM").unwrap()["value"], "dc-asgd-a");
    assert_eq!(env(psc, "FORESIGHT_WORKERS").unwrap()["value"], "2");
    assert_eq!(psc["readinessProbe"]["httpGet"]["path"], "/readyz");

    let st = wait_phase(cp, &ns, "mnist", "Created");
    assert_eq!(condition(&st, "Created")["status"], "True", "{st:#}");
    assert_eq!(condition(&st, "Running")["status"], "False", "{st:#}");

    // The PS runs (a real one on loopback, the pod marked ready), then the workers.
    let mut ps = Ps::start(cp, &ns, "mnist", ps_port, 2);
    assert_eq!(ps.token.len(), 64, "a 64-hex-digit token");
    ps.train_one_step();
    cp.set_pod_phase(&ns, &ps_pod(cp, &ns, "mnist"), "Running");
    for p in worker_pods(cp, &ns, "mnist", 2) {
        cp.set_pod_phase(&ns, &p, "Running");
    }
    let st = wait_for("progress from the PS", LONG, || {
        let s = status(cp, &ns, "mnist");
        (s["phase"] == "Running" && s["progress"]["step"] == 1).then_some(s)
    });
    assert_eq!(condition(&st, "Running")["status"], "True", "{st:#}");
    assert_eq!(st["parameterServer"]["ready"], true);
    assert_eq!(st["workers"]["active"], 2);
    assert_eq!(st["observedGeneration"], tj["metadata"]["generation"]);
    assert!(st["startTime"].is_string());
    // While the model moves, progress is read every --progress-seconds (1 here), and writing it
    // wakes the controller once, not in a loop.
    let reconciles =
        || sample(&op.metrics_text(), "foresight_operator_reconciles_total{result=\"success\"}").unwrap();
    // Requests to the API server, watches aside (each reconcile's cost).
    let requests = || {
        let m = op.metrics_text();
        let verbs = ["get", "post", "patch", "put", "delete"];
        verbs
            .iter()
            .map(|v| sample(&m, &format!("foresight_operator_api_requests_total{{verb=\"{v}\"}}")).unwrap())
            .sum::<f64>()
    };
    let (before, requests_before) = (reconciles(), requests());
    let pushes = ps.push_for(Duration::from_secs(4));
    let during = reconciles() - before;
    let per_reconcile = (requests() - requests_before) / during;
    let st = status(cp, &ns, "mnist");
    eprintln!(
        "{pushes} pushes in 4 s: {during} reconciles, {per_reconcile:.1} API requests each; step now {}",
        st["progress"]["step"]
    );
    // 7.5 when the children were read from the API server on every reconcile; 4–4.5 from the
    // caches, every child applied again each time; 0.5 once an apply that would change nothing is
    // skipped (each progress read writes the status, which wakes one more reconcile that writes
    // nothing).
    assert!(per_reconcile <= 1.0, "{per_reconcile:.1} API requests per reconcile of a running job");
    assert!(st["progress"]["step"].as_u64().unwrap() > 1, "progress follows the PS: {st:#}");
    assert!(during <= 14.0, "{during} reconciles in 4 s: a status write must not set off a reconcile loop");
    let table = cp.kubectl_ok(&["get", "tj", "-n", &ns], None);
    assert!(table.contains("Running"), "{table}");
    // Skipping those applies does not leave a child changed by hand: the edit gives it a new
    // resourceVersion, and the next reconcile applies the operator's intent again.
    let app_protocol = || {
        cp.kubectl_ok(
            &["get", "svc", "mnist-ps", "-n", &ns, "-o", "jsonpath={.spec.ports[0].appProtocol}"],
            None,
        )
    };
    let edit = r#"[{"op":"replace","path":"/spec/ports/0/appProtocol","value":"http"}]"#;
    cp.kubectl_ok(&["patch", "svc", "mnist-ps", "-n", &ns, "--type=json", "-p", edit], None);
    wait_for("the Service's port taken back", LONG, || (app_protocol() == "kubernetes.io/h2c").then_some(()));

    // The PS process restarts (SIGTERM: it leaves a checkpoint, which the new one restores):
    // the status counts it once, with a condition and a Warning event saying what it restored.
    let first =
        st["parameterServer"]["incarnation"].as_str().expect("the PS process is recorded").to_string();
    assert_eq!(st["parameterServer"].get("restarts"), None, "no restart yet: {st:#}");
    let version = ps.status()["version"].as_u64().unwrap();
    ps.restart("TERM");
    let st = wait_for("the PS restart in the status", LONG, || {
        let s = status(cp, &ns, "mnist");
        (s["parameterServer"]["restarts"] == 1).then_some(s)
    });
    assert_ne!(st["parameterServer"]["incarnation"], first.as_str());
    let restarted = condition(&st, "ParameterServerRestarted");
    assert_eq!((&restarted["status"], &restarted["reason"]), (&json!("True"), &json!("RestoredCheckpoint")));
    assert!(restarted["message"].as_str().unwrap().contains(&format!("version {version}")), "{st:#}");
    wait_for("the ParameterServerRestarted event", LONG, || {
        events(cp, &ns, "mnist").iter().any(|e| e.1 == "ParameterServerRestarted").then_some(())
    });
    assert_eq!(ps.status()["version"], version, "the new process holds the model where the old one left it");

    // The workers finish: the operator finalizes the model, then removes the PS.
    for p in worker_pods(cp, &ns, "mnist", 2) {
        cp.set_pod_phase(&ns, &p, "Succeeded");
    }
    let st = wait_phase(cp, &ns, "mnist", "Succeeded");
    assert_eq!(condition(&st, "Succeeded")["reason"], "Completed", "{st:#}");
    assert_eq!(condition(&st, "Complete")["status"], "True", "the batch-Job name too: {st:#}");
    assert_eq!(st["reason"], "Completed", "{st:#}");
    assert_eq!(condition(&st, "Running")["status"], "False", "{st:#}");
    // What `kubectl get tj` shows, from the CRD's printer columns.
    let table = cp.kubectl_ok(&["-n", &ns, "get", "tj", "mnist"], None);
    let (header, row) = table.trim().split_once('\n').expect("a header and a row");
    let cols: Vec<&str> = header.split_whitespace().collect();
    let reason = cols.iter().position(|&c| c == "REASON").expect("a REASON column");
    assert!(
        cols.contains(&"STEP") && !cols.contains(&"LOSS"),
        "the training figures are in -o wide: {header}"
    );
    // Columns left of REASON may be empty: count from the right.
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[cells.len() - (cols.len() - reason)], "Completed", "{table}");
    assert!(st["completionTime"].is_string());
    assert_eq!(ps.status()["finalized"], true, "the operator called /v1/finalize");
    wait_for("the PS Deployment and Service to go", LONG, || {
        (cp.get_json(&ns, "deployment/mnist-ps").is_none() && cp.get_json(&ns, "service/mnist-ps").is_none())
            .then_some(())
    });
    let reasons: Vec<String> = wait_for("the events", LONG, || {
        let ev = events(cp, &ns, "mnist");
        ev.iter().any(|e| e.1 == "Completed").then_some(ev.into_iter().map(|e| e.1).collect())
    });
    for r in ["Starting", "WorkersRunning", "Completed"] {
        assert!(reasons.iter().any(|x| x == r), "no {r} event in {reasons:?}");
    }

    let m = op.metrics_text();
    assert!(sample(&m, "foresight_operator_reconciles_total{result=\"success\"}").unwrap() > 3.0, "{m}");
    assert_eq!(sample(&m, "foresight_operator_jobs{phase=\"Succeeded\"}"), Some(1.0), "{m}");
    assert_eq!(sample(&m, "foresight_operator_jobs{phase=\"Running\"}"), Some(0.0), "{m}");
    assert_eq!(
        sample(&m, "foresight_trainingjob_duration_seconds_count{phase=\"Succeeded\"}"),
        Some(1.0),
        "{m}"
    );
    assert_eq!(http_get(op.metrics, "/readyz").unwrap().0, 200);
}

/// A job sharded over two parameter servers: a Deployment and a Service per shard (shard 0
/// under the unsharded names), the workers told both; the PS counts as ready only once every
/// shard is; the operator talks to shard 0 alone, which passes scaling and the finalize on; at
/// the end every shard is finalized and removed.
#[test]
fn a_sharded_job_runs_a_parameter_server_per_shard_and_ends_them_all() {
    let cp = control_plane();
    let ns = cp.namespace("sharded");
    let (port0, port1) = (free_port(), free_port());
    let _op =
        Operator::start(cp, &ns, &["--leader-elect=false", "--ps-url", &format!("http://127.0.0.1:{port0}")]);
    apply_job(cp, &ns, "big", json!({"workers": {"replicas": 2}, "parameterServer": {"replicas": 2}}));
    let selector = "foresight.dev/job=big";
    wait_for("both shards' Deployments", LONG, || cp.get_json(&ns, "deployment/big-ps-1"));
    assert_eq!(cp.names(&ns, "deployments", selector), ["big-ps", "big-ps-1"]);
    assert_eq!(cp.names(&ns, "services", selector), ["big-ps", "big-ps-1"]);
    let workers = wait_for("the worker Job", LONG, || cp.get_json(&ns, "job/big-workers"));
    let env = |c: &Value, k: &str| c["env"].as_array().unwrap().iter().find(|e| e["name"] == k).cloned();
    let c = &workers["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        env(c, "FORESIGHT_PS_URL").unwrap()["value"],
        format!("http://big-ps.{ns}.svc:8080,http://big-ps-1.{ns}.svc:8080")
    );

    // Real shards on loopback, shard 0 told where shard 1 is (as FORESIGHT_PS_PEERS tells it in
    // its pod); a worker's own client registers a model over both and trains one step.
    let ps1 = Ps::start(cp, &ns, "big", port1, 2);
    let ps0 = Ps::start_with(cp, &ns, "big", port0, 2, &["--peers", &format!("http://127.0.0.1:{port1}")]);
    {
        use foresight_ps::client::{Cadence, Exchange, PsClient, Retry, Session};
        use foresight_ps::wire::{Layout, TensorSpec};
        // (Multi-threaded: the client blocks on its handle from this thread, as in a worker.)
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let urls = format!("http://127.0.0.1:{port0},http://127.0.0.1:{port1}");
        let clients = PsClient::for_shards(&urls, Some(ps0.token.clone()), None).unwrap();
        let layout = Layout::new(vec![TensorSpec { name: "w".into(), shape: vec![8] }]).unwrap();
        let retry = Retry::new(Duration::from_secs(10), 0);
        let (session, joined) =
            Session::start(clients, rt.handle().clone(), 0, layout, &[0.0; 8], retry).unwrap();
        let mut w = Exchange::new(session, &joined, Cadence::every_step());
        w.pull_if_due().unwrap();
        w.grad_mut().fill(1.0);
        w.end_step(Some(0.5)).unwrap();
    }
    let shard_pod = |i: usize| {
        wait_for(&format!("shard {i}'s pod"), LONG, || {
            cp.names(&ns, "pods", &format!("{selector},foresight.dev/ps-shard={i}")).into_iter().next()
        })
    };
    cp.set_pod_phase(&ns, &shard_pod(0), "Running");
    for p in worker_pods(cp, &ns, "big", 2) {
        cp.set_pod_phase(&ns, &p, "Running");
    }
    let st = wait_for("the status with shard 0 ready", LONG, || {
        let s = status(cp, &ns, "big");
        (s["workers"]["active"] == 2 && s["parameterServer"]["readyShards"] == 1).then_some(s)
    });
    assert_eq!(st["parameterServer"]["shards"], 2, "{st:#}");
    assert_eq!(st["parameterServer"]["ready"], false, "shard 1 is not ready yet: {st:#}");
    cp.set_pod_phase(&ns, &shard_pod(1), "Running");
    wait_for("every shard ready", LONG, || {
        let ps = &status(cp, &ns, "big")["parameterServer"];
        (ps["ready"] == true && ps["readyShards"] == 2).then_some(())
    });

    // Scaling reaches every shard through shard 0.
    patch_job(cp, &ns, "big", r#"{"spec":{"workers":{"replicas":3}}}"#);
    wait_for("shard 1 told of 3 workers", LONG, || (ps1.status()["workers_expected"] == 3).then_some(()));
    assert_eq!(ps0.status()["workers_expected"], 3);

    for p in worker_pods(cp, &ns, "big", 3) {
        cp.set_pod_phase(&ns, &p, "Succeeded");
    }
    wait_phase(cp, &ns, "big", "Succeeded");
    assert_eq!(
        (ps0.status()["finalized"].clone(), ps1.status()["finalized"].clone()),
        (json!(true), json!(true))
    );
    wait_for("every shard's Deployment and Service to go", LONG, || {
        (cp.names(&ns, "deployments", selector).is_empty() && cp.names(&ns, "services", selector).is_empty())
            .then_some(())
    });
}

#[test]
fn failed_worker_pods_count_against_the_backoff_limit_and_the_job_fails() {
    let cp = control_plane();
    let ns = cp.namespace("backoff");
    let _op = Operator::start(cp, &ns, &["--leader-elect=false"]);
    apply_job(cp, &ns, "flaky", json!({"workers": {"replicas": 1}, "runPolicy": {"backoffLimit": 1}}));
    cp.set_pod_phase(&ns, &ps_pod(cp, &ns, "flaky"), "Running");
    let first = worker_pods(cp, &ns, "flaky", 1).remove(0);
    cp.set_pod_phase(&ns, &first, "Running");
    wait_phase(cp, &ns, "flaky", "Running");

    // The pod fails: the Job controller replaces it (a new pod, counted), the job is Restarting.
    cp.set_pod_phase(&ns, &first, "Failed");
    let st = wait_phase(cp, &ns, "flaky", "Restarting");
    assert_eq!(condition(&st, "Restarting")["reason"], "WorkerFailed", "{st:#}");
    assert_eq!(st["workers"]["failed"], 1);
    let second = wait_for("a replacement pod", LONG, || {
        worker_pods(cp, &ns, "flaky", 1).into_iter().find(|p| *p != first)
    });
    cp.set_pod_phase(&ns, &second, "Failed");
    let st = wait_phase(cp, &ns, "flaky", "Failed");
    assert_eq!(condition(&st, "Failed")["reason"], "BackoffLimitExceeded", "{st:#}");
    assert!(st["completionTime"].is_string());
    wait_for("the PS Deployment to go", LONG, || {
        cp.get_json(&ns, "deployment/flaky-ps").is_none().then_some(())
    });
    assert!(events(cp, &ns, "flaky").iter().any(|e| e.0 == "Warning" && e.1 == "BackoffLimitExceeded"));
}

/// The worker Job's podFailurePolicy, applied by the real Job controller: a preempted pod is
/// replaced without spending `backoffLimit` (0 here), and a worker that exits 3 (a failure no
/// retry fixes) fails the job at once.
#[test]
fn a_disruption_is_not_charged_and_a_permanent_failure_fails_at_once() {
    let cp = control_plane();
    let ns = cp.namespace("disruption");
    let _op = Operator::start(cp, &ns, &["--leader-elect=false"]);
    apply_job(cp, &ns, "preempted", json!({"workers": {"replicas": 1}, "runPolicy": {"backoffLimit": 0}}));
    cp.set_pod_phase(&ns, &ps_pod(cp, &ns, "preempted"), "Running");
    let first = worker_pods(cp, &ns, "preempted", 1).remove(0);
    cp.set_pod_phase(&ns, &first, "Running");
    wait_phase(cp, &ns, "preempted", "Running");

    cp.fail_pod(&ns, &first, 137, Some("PreemptionByScheduler"));
    let second = wait_for("a replacement pod", LONG, || {
        worker_pods(cp, &ns, "preempted", 1).into_iter().find(|p| *p != first)
    });
    let job = cp.get_json(&ns, "job/preempted-workers").unwrap();
    assert!(job["status"]["failed"].as_i64().unwrap_or(0) == 0, "not counted: {:#}", job["status"]);
    assert_ne!(status(cp, &ns, "preempted")["phase"], "Failed");

    cp.set_pod_phase(&ns, &second, "Running");
    cp.fail_pod(&ns, &second, 3, None);
    let st = wait_phase(cp, &ns, "preempted", "Failed");
    let failed = condition(&st, "Failed");
    assert_eq!(failed["reason"], "PodFailurePolicy", "{st:#}");
    assert!(failed["message"].as_str().unwrap().contains("exit code 3"), "{st:#}");
}

#[test]
fn the_active_deadline_fails_the_job() {
    let cp = control_plane();
    let ns = cp.namespace("deadline");
    let _op = Operator::start(cp, &ns, &["--leader-elect=false"]);
    apply_job(
        cp,
        &ns,
        "slow",
        json!({"workers": {"replicas": 1}, "runPolicy": {"activeDeadlineSeconds": 2}}),
    );
    let st = wait_phase(cp, &ns, "slow", "Failed");
    assert_eq!(condition(&st, "Failed")["reason"], "DeadlineExceeded", "{st:#}");
    wait_for("the PS Deployment to go", LONG, || {
        cp.get_json(&ns, "deployment/slow-ps").is_none().then_some(())
    });

    // The deadline bounds the TrainingJob, not only its worker Job: here the workers finish in
    // time (their Job completes), but the final model cannot be written (no PS answers) and the
    // job would wait --finalize-grace-seconds (300 s) for it.
    apply_job(
        cp,
        &ns,
        "late",
        json!({"workers": {"replicas": 1}, "runPolicy": {"activeDeadlineSeconds": 8}}),
    );
    cp.set_pod_phase(&ns, &ps_pod(cp, &ns, "late"), "Running");
    let pod = worker_pods(cp, &ns, "late", 1).remove(0);
    cp.set_pod_phase(&ns, &pod, "Succeeded");
    let st = wait_for("Finalizing", LONG, || {
        let s = status(cp, &ns, "late");
        (s["reason"] == "Finalizing").then_some(s)
    });
    assert_eq!(st["phase"], "Running", "{st:#}");
    let st = wait_phase(cp, &ns, "late", "Failed");
    let failed = condition(&st, "Failed");
    assert_eq!(failed["reason"], "DeadlineExceeded", "{st:#}");
    assert!(failed["message"].as_str().unwrap().contains("finalizing included"), "{failed}");
    let job = cp.get_json(&ns, "job/late-workers");
    assert!(
        job.is_none_or(|j| j["status"]["conditions"].to_string().contains("Complete")),
        "the worker Job itself completed"
    );
}

#[test]
fn pods_that_cannot_be_scheduled_show_in_the_status_not_as_running() {
    let cp = control_plane();
    let ns = cp.namespace("unschedulable");
    let _op = Operator::start(cp, &ns, &["--leader-elect=false"]);
    // node-1 has 4 GPUs; each worker asks for 8.
    apply_job(cp, &ns, "big", json!({"workers": {"replicas": 2, "gpus": 8}}));
    cp.set_pod_phase(&ns, &ps_pod(cp, &ns, "big"), "Running");
    let st = wait_for("the Unschedulable reason", LONG, || {
        let s = status(cp, &ns, "big");
        (condition(&s, "Running")["reason"] == "Unschedulable").then_some(s)
    });
    assert_eq!(st["phase"], "Created", "{st:#}");
    let msg = condition(&st, "Running")["message"].as_str().unwrap();
    assert!(msg.contains("Insufficient nvidia.com/gpu"), "{msg}");
    assert!(events(cp, &ns, "big").iter().any(|e| e.0 == "Warning" && e.1 == "Unschedulable"));

    // Fewer GPUs would fit. A started Job's pod template cannot change, so the API server
    // refuses the edit of a running job; with a suspension it is applied, by a new worker Job.
    let patch = |p: &str| cp.kubectl(&["patch", "-n", &ns, "tj", "big", "--type=merge", "-p", p], None);
    let out = patch(r#"{"spec":{"workers":{"gpus":1}}}"#);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("change only with runPolicy.suspend: true"), "{stderr}");
    let old_uid = cp.get_json(&ns, "job/big-workers").unwrap()["metadata"]["uid"].clone();
    assert!(patch(r#"{"spec":{"workers":{"gpus":1},"runPolicy":{"suspend":true}}}"#).status.success());
    let note = wait_for("the WorkersRecreated event", LONG, || {
        events(cp, &ns, "big").into_iter().find(|e| e.1 == "WorkersRecreated").map(|e| (e.0, e.2))
    });
    assert_eq!(note.0, "Normal", "{note:?}");
    let job = cp.get_json(&ns, "job/big-workers").unwrap();
    assert_ne!(job["metadata"]["uid"], old_uid, "a new worker Job");
    assert_eq!(
        job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"],
        "1"
    );
    assert_eq!(wait_phase(cp, &ns, "big", "Suspended")["reason"], "Suspended");
    assert!(patch(r#"{"spec":{"runPolicy":{"suspend":false}}}"#).status.success());
    worker_pods(cp, &ns, "big", 2);
    wait_for("the scheduler to place both workers", LONG, || {
        let pods = cp.get_json(&ns, "pods").unwrap();
        let placed = pods["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["metadata"]["labels"]["app.kubernetes.io/component"] == "worker")
            .filter(|p| p["spec"]["nodeName"].is_string())
            .count();
        (placed == 2).then_some(())
    });
    assert!(
        !events(cp, &ns, "big").iter().any(|e| e.1 == "SpecChangeNotApplied" && e.2.contains("worker Job")),
        "the change was applied, never refused"
    );

    // A new learning rate would restart the PS, whose memory (no checkpoint storage) is the only
    // copy of the model: it keeps running as it is, and an event says so.
    let env_before = cp.get_json(&ns, "deployment/big-ps").unwrap()["spec"]["template"]["spec"]["containers"]
        [0]["env"]
        .clone();
    cp.kubectl_ok(
        &[
            "patch",
            "-n",
            &ns,
            "tj",
            "big",
            "--type=merge",
            "-p",
            r#"{"spec":{"training":{"learningRate":0.01}}}"#,
        ],
        None,
    );
    wait_for("the PS's SpecChangeNotApplied event", LONG, || {
        events(cp, &ns, "big")
            .into_iter()
            .find(|e| e.1 == "SpecChangeNotApplied" && e.2.contains("parameter server"))
    });
    let env_after = cp.get_json(&ns, "deployment/big-ps").unwrap()["spec"]["template"]["spec"]["containers"]
        [0]["env"]
        .clone();
    assert_eq!(env_before, env_after, "the PS Deployment is unchanged");
    // The status says so: the generation is seen, not applied.
    let st = wait_for("SpecApplied False", LONG, || {
        let s = status(cp, &ns, "big");
        (condition(&s, "SpecApplied")["status"] == "False").then_some(s)
    });
    let c = condition(&st, "SpecApplied");
    assert_eq!(c["reason"], "ChangeDeferred", "{st:#}");
    assert!(c["message"].as_str().unwrap().contains("parameter server"), "{c}");
    let generation = cp.get_json(&ns, "tj/big").unwrap()["metadata"]["generation"].clone();
    assert_eq!(c["observedGeneration"], generation, "{st:#}");
}

/// A second simulated node, labelled `pool=<pool>` and tainted `dedicated=training:NoSchedule`
/// (as a cluster whose training nodes take nothing else), with 2 `amd.com/gpu`.
fn tainted_node(cp: &support::ControlPlane, pool: &str) -> String {
    let name = format!("tainted-{pool}");
    let node = json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "pool": pool}},
        "spec": {"taints": [{"key": "dedicated", "value": "training", "effect": "NoSchedule"}]}});
    cp.kubectl_ok(&["apply", "-f", "-"], Some(&node.to_string()));
    let resources = json!({"cpu": "8", "memory": "32Gi", "pods": "20", "amd.com/gpu": "2"});
    let status = json!({"status": {"capacity": resources, "allocatable": resources,
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "simulated"}]}});
    cp.kubectl_ok(
        &["patch", "node", &name, "--subresource=status", "--type=merge", "-p", &status.to_string()],
        None,
    );
    cp.kubectl_ok(&["taint", "node", &name, "node.kubernetes.io/not-ready:NoSchedule-"], None);
    name
}

#[test]
fn each_roles_pod_settings_reach_the_pods_and_place_them_on_a_tainted_pool() {
    let cp = control_plane();
    let ns = cp.namespace("podsettings");
    let node = tainted_node(cp, &ns);
    let class = format!("{ns}-high");
    let pc = json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                    "metadata": {"name": class}, "value": 1000});
    cp.kubectl_ok(&["apply", "-f", "-"], Some(&pc.to_string()));
    cp.kubectl_ok(&["create", "serviceaccount", "-n", &ns, "data-reader"], None);
    let _op = Operator::start(cp, &ns, &["--leader-elect=false"]);
    let pod = json!({
        "nodeSelector": {"pool": ns},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "training", "effect": "NoSchedule"}],
        "priorityClassName": class,
        "serviceAccountName": "data-reader",
        "automountServiceAccountToken": true,
        "labels": {"team": "ml"},
        "annotations": {"example.com/owner": "ml"},
        "env": [{"name": "DATA_BUCKET", "value": "s3://bucket"}],
        "volumes": [{"name": "cache", "emptyDir": {}}],
        "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
    });
    apply_job(
        cp,
        &ns,
        "placed",
        json!({"parameterServer": {"pod": pod},
               "workers": {"replicas": 2, "gpus": 1, "gpuResource": "amd.com/gpu", "pod": pod}}),
    );
    // Both roles land on the tainted node (node-1, untainted, lacks the label): the scheduler
    // honoured the selector and the toleration. The admission plugins resolved the priority
    // class and the service account, so both exist as named.
    let placed = |component: &str, n: usize| -> Vec<Value> {
        wait_for(&format!("{n} {component} pod(s) on {node}"), LONG, || {
            let pods = cp.get_json(&ns, "pods").unwrap()["items"].as_array().unwrap().clone();
            let ours: Vec<Value> = pods
                .into_iter()
                .filter(|p| p["metadata"]["labels"]["app.kubernetes.io/component"] == component)
                .filter(|p| p["spec"]["nodeName"] == node.as_str())
                .collect();
            (ours.len() == n).then_some(ours)
        })
    };
    let mut pods = placed("parameter-server", 1);
    pods.extend(placed("worker", 2));
    for p in &pods {
        let spec = &p["spec"];
        assert_eq!(spec["priorityClassName"], class.as_str());
        assert_eq!(spec["priority"], 1000, "the PriorityClass admission resolved it");
        assert_eq!(spec["serviceAccountName"], "data-reader");
        assert_eq!(spec["automountServiceAccountToken"], true);
        assert_eq!(p["metadata"]["labels"]["team"], "ml");
        assert_eq!(p["metadata"]["annotations"]["example.com/owner"], "ml");
        let c = &spec["containers"][0];
        let env: Vec<&str> =
            c["env"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
        assert!(env.contains(&"DATA_BUCKET") && env.contains(&"FORESIGHT_JOB_NAME"), "{env:?}");
        assert!(c["volumeMounts"].as_array().unwrap().iter().any(|m| m["mountPath"] == "/cache"));
    }
    let worker =
        pods.iter().find(|p| p["metadata"]["labels"]["app.kubernetes.io/component"] == "worker").unwrap();
    assert_eq!(worker["spec"]["containers"][0]["resources"]["limits"]["amd.com/gpu"], "1");
    cp.set_pod_phase(&ns, &ps_pod(cp, &ns, "placed"), "Running");
    let st = status(cp, &ns, "placed");
    assert_ne!(condition(&st, "Running")["reason"], "Unschedulable", "{st:#}");
    cp.kubectl_ok(&["delete", "tj", "-n", &ns, "placed", "--wait=false"], None);
    cp.kubectl_ok(
        &["delete", &format!("node/{node}"), &format!("priorityclass/{class}"), "--wait=false"],
        None,
    );
}

#[test]
fn a_pod_waiting_for_its_claim_to_bind_is_not_unschedulable() {
    let cp = control_plane();
    let ns = cp.namespace("claim-binding");
    let _op = Operator::start(cp, &ns, &["--leader-elect=false"]);
    // No StorageClass or volume yet: the checkpoint claim stays Pending and the scheduler marks
    // the PS pod Unschedulable ("pod has unbound immediate PersistentVolumeClaims").
    apply_job(cp, &ns, "claims", json!({"parameterServer": {"checkpoint": {"storage": "1Gi"}}}));
    let st = wait_for("the WaitingForVolumes reason", LONG, || {
        let s = status(cp, &ns, "claims");
        (condition(&s, "Running")["reason"] == "WaitingForVolumes").then_some(s)
    });
    assert_eq!(st["phase"], "Created", "{st:#}");
    let msg = condition(&st, "Running")["message"].as_str().unwrap();
    assert!(msg.contains("parameter server pod") && msg.contains("claims-ps-checkpoints"), "{msg}");

    // A volume appears (as a provisioner would make one): the claim binds, the pod is placed.
    // Made for this claim (claimRef): the tests share one control plane, and another test's
    // pending claim of the same size could otherwise take it first (seen once in make test).
    let pv = format!(
        r#"{{"apiVersion":"v1","kind":"PersistentVolume","metadata":{{"name":"{ns}-pv"}},
            "spec":{{"capacity":{{"storage":"1Gi"}},"accessModes":["ReadWriteOnce"],
                     "hostPath":{{"path":"/tmp/{ns}-pv"}},"storageClassName":"",
                     "claimRef":{{"namespace":"{ns}","name":"claims-ps-checkpoints"}}}}}}"#
    );
    cp.kubectl_ok(&["apply", "-f", "-"], Some(&pv));
    let st = wait_for("the claim bound and the reason moved on", LONG, || {
        let s = status(cp, &ns, "claims");
        (condition(&s, "Running")["reason"] != "WaitingForVolumes").then_some(s)
    });
    assert_ne!(condition(&st, "Running")["reason"], "Unschedulable", "{st:#}");
    assert!(
        events(cp, &ns, "claims").iter().all(|e| e.0 != "Warning"),
        "no Warning while the claim was binding: {:?}",
        events(cp, &ns, "claims")
    );
    cp.kubectl_ok(&["delete", "pv", &format!("{ns}-pv"), "--wait=false"], None);
}

/// A reconcile the API server refuses (a quota that allows no claims) shows as a Warning event
/// and the ReconcileFailed condition with the server's reason, and is retried (with growing
/// delays) until it succeeds: then the claim exists and the condition turns False.
#[test]
fn a_refused_reconcile_is_visible_and_retried_until_it_succeeds() {
    let cp = control_plane();
    let ns = cp.namespace("quota");
    cp.kubectl_ok(&["create", "quota", "no-claims", "-n", &ns, "--hard=persistentvolumeclaims=0"], None);
    wait_for("the quota's status", LONG, || {
        cp.get_json(&ns, "quota/no-claims")?["status"]["hard"].is_object().then_some(())
    });
    let op = Operator::start(cp, &ns, &["--leader-elect=false"]);
    apply_job(cp, &ns, "blocked", json!({"parameterServer": {"checkpoint": {"storage": "1Gi"}}}));
    let st = wait_for("the ReconcileFailed condition", LONG, || {
        let s = status(cp, &ns, "blocked");
        (condition(&s, "ReconcileFailed")["status"] == "True").then_some(s)
    });
    let c = condition(&st, "ReconcileFailed");
    assert_eq!(c["reason"], "Forbidden", "{st:#}");
    assert!(c["message"].as_str().unwrap().contains("exceeded quota"), "{c}");
    let warned = wait_for("the ReconcileFailed event", LONG, || {
        events(cp, &ns, "blocked").into_iter().find(|e| e.0 == "Warning" && e.1 == "ReconcileFailed")
    });
    assert!(warned.2.contains("exceeded quota"), "{warned:?}");
    assert!(cp.get_json(&ns, "pvc/blocked-ps-checkpoints").is_none());
    let errors =
        |m: &str| sample(m, "foresight_operator_reconcile_errors_total{reason=\"kube_api\"}").unwrap_or(0.0);
    assert!(errors(&op.metrics_text()) >= 1.0);

    cp.kubectl_ok(&["delete", "quota", "no-claims", "-n", &ns], None);
    let st = wait_for("a retry that succeeds", Duration::from_secs(120), || {
        let s = status(cp, &ns, "blocked");
        (condition(&s, "ReconcileFailed")["status"] == "False").then_some(s)
    });
    assert_eq!(condition(&st, "ReconcileFailed")["reason"], "Reconciled", "{st:#}");
    assert!(cp.get_json(&ns, "pvc/blocked-ps-checkpoints").is_some(), "the claim was made");
    assert_eq!(condition(&st, "Created")["status"], "True", "{st:#}");
}

/// A TrainingJob's author is an untrusted tenant, and the children's names come from the job's:
/// objects that were there before the job, under those names, are never written, adopted or
/// deleted. (Before: a job named `github` overwrote and adopted a Secret `github-token`, and
/// the ending of a job named `victim` deleted a Service `victim-ps` it never made.) The job
/// waits with a `NameConflict` and goes on once the object is gone.
#[test]
fn a_job_never_writes_adopts_or_deletes_an_object_it_did_not_make() {
    let cp = control_plane();
    let ns = cp.namespace("deputy");
    cp.kubectl_ok(
        &["create", "secret", "generic", "-n", &ns, "github-token", "--from-literal=token=precious"],
        None,
    );
    cp.kubectl_ok(&["create", "service", "clusterip", "-n", &ns, "victim-ps", "--tcp=5432:5432"], None);
    // The operator's labels can be written by anyone who may create the object: not enough.
    cp.kubectl_ok(&["create", "service", "clusterip", "-n", &ns, "forged-ps", "--tcp=5432:5432"], None);
    cp.kubectl_ok(
        &[
            "label",
            "service",
            "-n",
            &ns,
            "forged-ps",
            "app.kubernetes.io/managed-by=foresight-operator",
            "foresight.dev/job=forged",
        ],
        None,
    );
    let claim = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "claimer-output"},
                       "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}});
    cp.kubectl_ok(&["apply", "-n", &ns, "-f", "-"], Some(&claim.to_string()));
    let before = |what: &str| cp.get_json(&ns, what).unwrap();
    let (secret, victim, forged, output) = (
        before("secret/github-token"),
        before("service/victim-ps"),
        before("service/forged-ps"),
        before("pvc/claimer-output"),
    );

    let op = Operator::start(cp, &ns, &["--leader-elect=false"]);
    apply_job(cp, &ns, "github", json!({"workers": {"replicas": 1}}));
    apply_job(cp, &ns, "victim", json!({"workers": {"replicas": 1}}));
    apply_job(cp, &ns, "forged", json!({"workers": {"replicas": 1}}));
    apply_job(cp, &ns, "claimer", json!({"workers": {"replicas": 1}, "output": {"storage": "1Gi"}}));
    for (job, kind, name) in [
        ("victim", "Service", "victim-ps"),
        ("forged", "Service", "forged-ps"),
        ("claimer", "PersistentVolumeClaim", "claimer-output"),
    ] {
        let st = wait_for(&format!("{job}'s NameConflict"), LONG, || {
            let s = status(cp, &ns, job);
            (condition(&s, "ReconcileFailed")["reason"] == "NameConflict").then_some(s)
        });
        let message = condition(&st, "ReconcileFailed")["message"].as_str().unwrap().to_string();
        assert!(message.contains(&format!("{kind} {name} exists and is not this job's")), "{message}");
        assert_ne!(st["phase"], "Running", "{st:#}");
        let warned = events(cp, &ns, job).into_iter().any(|e| e.0 == "Warning" && e.2.contains(name));
        assert!(warned, "a Warning event names {name}: {:?}", events(cp, &ns, job));
        // Nothing the job would have owned was made after the conflict.
        assert!(cp.get_json(&ns, &format!("job/{job}-workers")).is_none(), "{job} started workers");
    }
    // The job named after the Secret runs with a Secret of its own.
    wait_for("github's worker Job", LONG, || cp.get_json(&ns, "job/github-workers"));
    let ours = token_secret(cp, &ns, "github");
    assert!(cp.get_json(&ns, &ours).is_some());
    let m = op.metrics_text();
    assert!(
        sample(&m, "foresight_operator_reconcile_errors_total{reason=\"name_conflict\"}").unwrap() >= 3.0,
        "{m}"
    );

    // A job that ends (here: marked Failed by an admin) removes its parameter server: only what
    // is its own.
    cp.kubectl_ok(
        &[
            "patch",
            "tj",
            "victim",
            "-n",
            &ns,
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"phase":"Failed"}}"#,
        ],
        None,
    );
    cp.kubectl_ok(&["annotate", "-n", &ns, "tj", "victim", "example.com/touched=1"], None);
    let reconciled =
        sample(&op.metrics_text(), "foresight_operator_reconciles_total{result=\"success\"}").unwrap();
    wait_for("another reconcile", LONG, || {
        (sample(&op.metrics_text(), "foresight_operator_reconciles_total{result=\"success\"}")? > reconciled)
            .then_some(())
    });
    // Deleting the jobs leaves every object that was there before them as it was.
    for job in ["github", "victim", "forged", "claimer"] {
        cp.kubectl_ok(&["delete", "tj", job, "-n", &ns, "--wait=true"], None);
    }
    wait_for("github's own Secret to be collected", LONG, || cp.get_json(&ns, &ours).is_none().then_some(()));
    let unchanged = |what: &str, was: &Value| {
        let now = cp.get_json(&ns, what).unwrap_or_else(|| panic!("{what} was deleted"));
        for field in ["uid", "labels", "ownerReferences"] {
            assert_eq!(now["metadata"][field], was["metadata"][field], "{what}'s {field}");
        }
        assert_eq!(now["data"], was["data"], "{what}'s data");
        assert_eq!(now["spec"], was["spec"], "{what}'s spec");
    };
    unchanged("secret/github-token", &secret);
    unchanged("service/victim-ps", &victim);
    unchanged("service/forged-ps", &forged);
    unchanged("pvc/claimer-output", &output);
}

/// Once the object in the way is gone, the job goes on: its own children are made and it runs.
#[test]
fn a_job_waiting_on_a_name_conflict_starts_once_the_object_is_gone() {
    let cp = control_plane();
    let ns = cp.namespace("conflict-gone");
    cp.kubectl_ok(&["create", "service", "clusterip", "-n", &ns, "late-ps", "--tcp=5432:5432"], None);
    let _op = Operator::start(cp, &ns, &["--leader-elect=false"]);
    apply_job(cp, &ns, "late", json!({"workers": {"replicas": 1}}));
    wait_for("the NameConflict", LONG, || {
        (condition(&status(cp, &ns, "late"), "ReconcileFailed")["reason"] == "NameConflict").then_some(())
    });
    cp.kubectl_ok(&["delete", "service", "late-ps", "-n", &ns], None);
    // The retry (after a growing delay) or any change of the job reconciles it again.
    cp.kubectl_ok(&["annotate", "-n", &ns, "tj", "late", "example.com/touched=1"], None);
    let st = wait_for("the conflict to clear", LONG, || {
        let s = status(cp, &ns, "late");
        (condition(&s, "ReconcileFailed")["status"] == "False").then_some(s)
    });
    assert_eq!(condition(&st, "Created")["status"], "True", "{st:#}");
    let uid = cp.get_json(&ns, "tj/late").unwrap()["metadata"]["uid"].clone();
    let service = cp.get_json(&ns, "service/late-ps").unwrap();
    assert_eq!(service["metadata"]["ownerReferences"][0]["uid"], uid, "{service:#}");
    cp.set_pod_phase(&ns, &ps_pod(cp, &ns, "late"), "Running");
    let pod = worker_pods(cp, &ns, "late", 1).remove(0);
    cp.set_pod_phase(&ns, &pod, "Running");
    wait_phase(cp, &ns, "late", "Running");
}

/// Pods that cannot start reach the job: a parameter server whose image cannot be pulled (the
/// test plays the kubelet's report), and workers the Job controller cannot create (a
/// ServiceAccount that does not exist, refused by the API server's admission): each as the
/// phase's reason, a `PodsFailing` condition and a Warning, blamed on its role; past the
/// operator's bound the job fails with that reason. (Before: `Starting` forever, no Warning.)
#[test]
fn pods_that_cannot_start_are_reported_and_fail_the_job_after_the_bound() {
    let cp = control_plane();
    let ns = cp.namespace("stuck");
    let _op = Operator::start(cp, &ns, &["--leader-elect=false", "--stuck-pods-timeout-seconds", "6"]);
    apply_job(cp, &ns, "pull", json!({"workers": {"replicas": 1}}));
    apply_job(cp, &ns, "nosa", json!({"workers": {"replicas": 1, "pod": {"serviceAccountName": "missing"}}}));

    let pod = ps_pod(cp, &ns, "pull");
    let container = cp.get_json(&ns, &format!("pod/{pod}")).unwrap()["spec"]["containers"][0]["name"].clone();
    let waiting = json!({"status": {"phase": "Pending", "containerStatuses": [{
        "name": container, "ready": false, "restartCount": 0, "image": "example.com/ps:gone", "imageID": "",
        "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image \"example.com/ps:gone\""}}}]}});
    cp.kubectl_ok(
        &[
            "patch",
            "-n",
            &ns,
            "pod",
            &pod,
            "--subresource=status",
            "--type=merge",
            "-p",
            &waiting.to_string(),
        ],
        None,
    );
    let st = wait_for("the PS's ImagePullBackOff in the status", LONG, || {
        let s = status(cp, &ns, "pull");
        (s["reason"] == "ImagePullBackOff").then_some(s)
    });
    assert_eq!(st["phase"], "Created", "{st:#}");
    let c = condition(&st, "PodsFailing");
    assert_eq!(c["status"], "True", "{st:#}");
    let message = c["message"].as_str().unwrap();
    assert!(
        message.starts_with("parameter server: pod ") && message.contains("example.com/ps:gone"),
        "{message}"
    );
    let warned = wait_for("a Warning event", LONG, || {
        events(cp, &ns, "pull").into_iter().find(|e| e.0 == "Warning" && e.1 == "ImagePullBackOff")
    });
    assert!(warned.2.contains("example.com/ps:gone"), "{warned:?}");
    let st = wait_phase(cp, &ns, "pull", "Failed");
    assert_eq!(st["reason"], "ImagePullBackOff", "{st:#}");
    let failed = condition(&st, "Failed");
    assert!(failed["message"].as_str().unwrap().contains("--stuck-pods-timeout-seconds"), "{failed}");

    // The workers the Job controller cannot create: reported from its FailedCreate events.
    let st = wait_for("the workers' FailedCreate in the status", LONG, || {
        let s = status(cp, &ns, "nosa");
        (s["reason"] == "FailedCreate").then_some(s)
    });
    let message = condition(&st, "PodsFailing")["message"].as_str().unwrap().to_string();
    assert!(
        message.starts_with("workers: the worker Job cannot create pods") && message.contains("missing"),
        "{message}"
    );
    let st = wait_phase(cp, &ns, "nosa", "Failed");
    assert_eq!(st["reason"], "FailedCreate", "{st:#}");
}

/// A quota that refuses the parameter server's pod: the Deployment's `ReplicaFailure`, named as
/// the parameter server's.
#[test]
fn a_parameter_server_a_quota_refuses_is_reported_as_such() {
    let cp = control_plane();
    let ns = cp.namespace("pods-quota");
    cp.kubectl_ok(&["create", "quota", "no-pods", "-n", &ns, "--hard=pods=0"], None);
    wait_for("the quota's status", LONG, || {
        cp.get_json(&ns, "quota/no-pods")?["status"]["hard"].is_object().then_some(())
    });
    let _op = Operator::start(cp, &ns, &["--leader-elect=false"]);
    apply_job(cp, &ns, "capped", json!({"workers": {"replicas": 1}}));
    // The quota refuses the workers' pods too, and the Job controller's event can come before
    // the Deployment's ReplicaFailure: the status names the workers first, then the parameter
    // server (its trouble comes first once both are known, since workers fail for want of it).
    let st = wait_for("the parameter server's FailedCreate in the status", LONG, || {
        let s = status(cp, &ns, "capped");
        let names_ps = condition(&s, "PodsFailing")["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("parameter server"));
        (s["reason"] == "FailedCreate" && names_ps).then_some(s)
    });
    let message = condition(&st, "PodsFailing")["message"].as_str().unwrap().to_string();
    assert!(
        message.starts_with("parameter server: cannot create its pod") && message.contains("exceeded quota"),
        "{message}"
    );
    assert_eq!(st["phase"], "Created", "the bound (600 s by default) has not passed: {st:#}");
    cp.kubectl_ok(&["delete", "quota", "no-pods", "-n", &ns], None);
}

/// New default images (an operator upgraded by its chart) reach new jobs only: a running job
/// keeps the images recorded in its status when it started, and one started before that record
/// existed keeps the images its children run.
/// New default images, and TLS turned on (`--ps-tls`, the chart's default), reach new jobs only:
/// a running job keeps its images and its h2c, so its PS is not restarted by an upgrade.
#[test]
fn new_default_images_never_roll_a_running_job() {
    let cp = control_plane();
    let ns = cp.namespace("upgrade-images");
    let images = |v: &str| {
        let (ps, w) = (format!("example.com/ps:{v}"), format!("example.com/worker:{v}"));
        let mut flags =
            ["--leader-elect=false", "--ps-image", &ps, "--worker-image", &w].map(String::from).to_vec();
        flags.extend((v != "1").then(|| "--ps-tls".to_string()));
        flags
    };
    let start = |v: &str| {
        let flags = images(v);
        Operator::start(cp, &ns, &flags.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let ps_env = |job: &str, name: &str| {
        let d = cp.get_json(&ns, &format!("deployment/{job}-ps"))?;
        let env = d["spec"]["template"]["spec"]["containers"][0]["env"].as_array()?.clone();
        env.into_iter().find(|e| e["name"] == name).map(|e| e["value"].clone())
    };
    let tls_secret = |job: &str| {
        let suffix = secret_suffix(cp, &ns, job);
        cp.get_json(&ns, &format!("secret/{job}-ps-tls-{suffix}"))
    };
    let ps_image = |job: &str| {
        cp.get_json(&ns, &format!("deployment/{job}-ps"))
            .map(|d| d["spec"]["template"]["spec"]["containers"][0]["image"].clone())
    };
    let worker_image = |job: &str| {
        cp.get_json(&ns, &format!("job/{job}-workers"))
            .map(|j| j["spec"]["template"]["spec"]["containers"][0]["image"].clone())
    };
    let reconciled = |op: &Operator, n: f64| {
        wait_for("reconciles by the new operator", LONG, || {
            (sample(&op.metrics_text(), "foresight_operator_reconciles_total{result=\"success\"}")? >= n)
                .then_some(())
        })
    };

    let op = start("1");
    apply_job(cp, &ns, "old", json!({"workers": {"replicas": 1}}));
    let st = wait_for("the recorded defaults", LONG, || {
        let s = status(cp, &ns, "old");
        s["defaultImages"].is_object().then_some(s)
    });
    let suffix = st["defaultImages"]["secretSuffix"].as_str().unwrap_or_default().to_string();
    assert_eq!(suffix.len(), 16, "{st:#}");
    assert_eq!(
        st["defaultImages"],
        json!({"parameterServer": "example.com/ps:1", "worker": "example.com/worker:1", "parameterServerTls": false,
               "secretSuffix": suffix})
    );
    drop(op);

    let op = start("2");
    apply_job(cp, &ns, "new", json!({"workers": {"replicas": 1}}));
    wait_for("the new job's PS", LONG, || ps_image("new"));
    reconciled(&op, 3.0);
    assert_eq!(ps_image("old"), Some(json!("example.com/ps:1")), "the running job's PS is not rolled");
    assert_eq!(worker_image("old"), Some(json!("example.com/worker:1")));
    assert_eq!(ps_image("new"), Some(json!("example.com/ps:2")), "a new job takes the new defaults");
    assert_eq!(worker_image("new"), Some(json!("example.com/worker:2")));
    // TLS: the old job keeps h2c, the new one gets its certificates.
    assert_eq!(ps_env("old", "FORESIGHT_TLS_CERT"), None, "the running job's PS is not moved to TLS");
    assert!(tls_secret("old").is_none());
    assert_eq!(ps_env("new", "FORESIGHT_TLS_CERT"), Some(json!("/etc/foresight/tls/tls.crt")));
    assert_eq!(status(cp, &ns, "new")["defaultImages"]["parameterServerTls"], true);
    let secret = wait_for("the new job's TLS Secret", LONG, || tls_secret("new"));
    assert_eq!(secret["type"], "kubernetes.io/tls");
    check_certificate(&secret, &format!("new-ps.{ns}.svc"));
    drop(op);

    // A job without the record (started by an operator that did not keep it): the images its
    // children run are kept, and recorded.
    cp.kubectl_ok(
        &[
            "patch",
            "-n",
            &ns,
            "tj",
            "old",
            "--subresource=status",
            "--type=json",
            "-p",
            r#"[{"op": "remove", "path": "/status/defaultImages"}]"#,
        ],
        None,
    );
    let op = start("3");
    reconciled(&op, 2.0);
    let st = wait_for("the record again", LONG, || {
        let s = status(cp, &ns, "old");
        s["defaultImages"].is_object().then_some(s)
    });
    assert_eq!(st["defaultImages"]["parameterServer"], "example.com/ps:1", "{st:#}");
    assert_eq!(st["defaultImages"]["parameterServerTls"], false, "{st:#}");
    assert_eq!(ps_image("old"), Some(json!("example.com/ps:1")));
    assert_eq!(worker_image("old"), Some(json!("example.com/worker:1")));
    assert_eq!(ps_env("old", "FORESIGHT_TLS_CERT"), None);
    assert_eq!(st["defaultImages"]["secretSuffix"], suffix, "the running PS keeps its Secrets: {st:#}");
}

#[test]
fn suspend_stops_the_workers_and_the_ps_keeps_its_checkpoint_then_resume_continues() {
    let cp = control_plane();
    let ns = cp.namespace("suspend");
    let _op = Operator::start(cp, &ns, &["--leader-elect=false"]);
    let spec = json!({"workers": {"replicas": 2}, "parameterServer": {"checkpoint": {"storage": "1Gi"}}});
    apply_job(cp, &ns, "pausable", spec);
    let pvc = wait_for("the checkpoint PVC", LONG, || cp.get_json(&ns, "pvc/pausable-ps-checkpoints"));
    assert_eq!(pvc["spec"]["resources"]["requests"]["storage"], "1Gi");
    worker_pods(cp, &ns, "pausable", 2);

    cp.kubectl_ok(
        &[
            "patch",
            "-n",
            &ns,
            "tj",
            "pausable",
            "--type=merge",
            "-p",
            r#"{"spec":{"runPolicy":{"suspend":true}}}"#,
        ],
        None,
    );
    wait_for("the worker Job to be suspended", LONG, || {
        (cp.get_json(&ns, "job/pausable-workers").unwrap()["spec"]["suspend"] == true).then_some(())
    });
    worker_pods(cp, &ns, "pausable", 0);
    // The pods are terminating, not gone (no kubelet here to stop them): not Suspended yet.
    let st = wait_for("the Suspending reason", LONG, || {
        let s = status(cp, &ns, "pausable");
        (s["reason"] == "Suspending").then_some(s)
    });
    assert_ne!(st["phase"], "Suspended", "{st:#}");
    // Play the kubelet: the deleted pods' containers stop and the pods go. (With a
    // podFailurePolicy the Job controller replaces a pod only once it is gone or terminal.)
    let selector = "foresight.dev/job=pausable,app.kubernetes.io/component=worker";
    cp.kubectl_ok(&["delete", "pods", "-n", &ns, "-l", selector, "--grace-period=0", "--force"], None);
    let st = wait_phase(cp, &ns, "pausable", "Suspended");
    assert_eq!(condition(&st, "Suspended")["status"], "True", "{st:#}");
    assert_eq!(cp.get_json(&ns, "deployment/pausable-ps").unwrap()["spec"]["replicas"], 0);
    assert!(cp.get_json(&ns, "pvc/pausable-ps-checkpoints").is_some(), "the checkpoint stays");

    cp.kubectl_ok(
        &[
            "patch",
            "-n",
            &ns,
            "tj",
            "pausable",
            "--type=merge",
            "-p",
            r#"{"spec":{"runPolicy":{"suspend":false}}}"#,
        ],
        None,
    );
    worker_pods(cp, &ns, "pausable", 2);
    assert_eq!(cp.get_json(&ns, "deployment/pausable-ps").unwrap()["spec"]["replicas"], 1);
    let st = wait_for("the job to leave Suspended", LONG, || {
        let s = status(cp, &ns, "pausable");
        (s["phase"] != "Suspended").then_some(s)
    });
    assert_eq!(condition(&st, "Suspended")["status"], "False", "{st:#}");
}

#[test]
fn a_job_labelled_for_kueue_waits_queued_when_the_operator_runs_without_kueue() {
    let cp = control_plane();
    let ns = cp.namespace("nokueue");
    let _op = Operator::start(cp, &ns, &["--leader-elect=false"]);
    let mut tj: Value = serde_json::from_str(&job("queued", json!({}))).unwrap();
    tj["metadata"]["labels"] = json!({"kueue.x-k8s.io/queue-name": "team"});
    cp.kubectl_ok(&["apply", "-n", &ns, "-f", "-"], Some(&tj.to_string()));
    let st = wait_phase(cp, &ns, "queued", "Queued");
    let message = condition(&st, "Queued")["message"].as_str().unwrap().to_string();
    assert!(message.contains("without --kueue"), "{st:#}");
    // Nothing runs outside the quota: workers suspended, no PS pod.
    assert_eq!(cp.get_json(&ns, "job/queued-workers").unwrap()["spec"]["suspend"], true);
    assert_eq!(cp.get_json(&ns, "deployment/queued-ps").unwrap()["spec"]["replicas"], 0);
    // The label removed from the waiting job: it keeps waiting (before, it started at once,
    // outside any quota).
    cp.kubectl_ok(&["label", "-n", &ns, "tj", "queued", "kueue.x-k8s.io/queue-name-"], None);
    let st = wait_for("the job to say why it still waits", LONG, || {
        let s = status(cp, &ns, "queued");
        condition(&s, "Queued")["message"].as_str()?.contains("label was removed").then_some(s)
    });
    assert_eq!(st["phase"], "Queued", "{st:#}");
    assert_eq!(cp.get_json(&ns, "job/queued-workers").unwrap()["spec"]["suspend"], true);
    assert_eq!(cp.get_json(&ns, "deployment/queued-ps").unwrap()["spec"]["replicas"], 0);
    // Made again without the label, it runs.
    cp.kubectl_ok(&["delete", "-n", &ns, "tj", "queued", "--wait=true"], None);
    wait_for("the old children to go", LONG, || {
        cp.get_json(&ns, "job/queued-workers").is_none().then_some(())
    });
    apply_job(cp, &ns, "queued", json!({}));
    worker_pods(cp, &ns, "queued", 2);
    assert_eq!(cp.get_json(&ns, "deployment/queued-ps").unwrap()["spec"]["replicas"], 1);
}

#[test]
fn deleting_the_job_removes_every_child_and_ttl_deletes_a_finished_job() {
    let cp = control_plane();
    let ns = cp.namespace("cleanup");
    // No PS answers here: the operator gives up finalizing at once.
    let _op = Operator::start(cp, &ns, &["--leader-elect=false", "--finalize-grace-seconds", "0"]);
    apply_job(
        cp,
        &ns,
        "doomed",
        json!({"parameterServer": {"checkpoint": {"storage": "1Gi"}}, "output": {"storage": "1Gi"}}),
    );
    wait_for("the worker Job", LONG, || cp.get_json(&ns, "job/doomed-workers"));
    worker_pods(cp, &ns, "doomed", 2);
    let pvcs = cp.names(&ns, "pvc", "foresight.dev/job=doomed");
    assert_eq!(pvcs, ["doomed-output", "doomed-ps-checkpoints"]);
    let output = cp.get_json(&ns, "pvc/doomed-output").unwrap();
    assert!(output["metadata"]["ownerReferences"].is_null(), "the output claim has no owner: {output:#}");
    cp.kubectl_ok(&["delete", "-n", &ns, "tj", "doomed", "--wait=false"], None);
    wait_for("the garbage collector to remove every child", LONG, || {
        let left: Vec<String> = ["deployments", "replicasets", "services", "secrets", "jobs"]
            .iter()
            .flat_map(|k| cp.names(&ns, k, "foresight.dev/job=doomed"))
            .collect();
        // Pods on a node wait for its kubelet (none here) to confirm: being deleted is enough.
        let pods = cp.get_json(&ns, "pods").unwrap();
        let live = pods["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .count();
        (left.is_empty() && live == 0).then_some(())
    });
    // The checkpoints go with the job (once no pod uses them); the output claim stays.
    wait_for("the checkpoint claim to be deleted", LONG, || {
        let ckpt = cp.get_json(&ns, "pvc/doomed-ps-checkpoints");
        ckpt.is_none_or(|c| c["metadata"]["deletionTimestamp"].is_string()).then_some(())
    });
    let output = cp.get_json(&ns, "pvc/doomed-output").expect("the output claim outlives the job");
    assert!(output["metadata"]["deletionTimestamp"].is_null(), "{output:#}");

    apply_job(
        cp,
        &ns,
        "brief",
        json!({"workers": {"replicas": 1}, "runPolicy": {"ttlSecondsAfterFinished": 2}}),
    );
    let pod = worker_pods(cp, &ns, "brief", 1).remove(0);
    cp.set_pod_phase(&ns, &pod, "Succeeded");
    // Workers done, no PS to write the model and no worker that recorded it: not a success.
    let st = wait_phase(cp, &ns, "brief", "Failed");
    assert_eq!(condition(&st, "Failed")["reason"], "FinalModelNotWritten", "{st:#}");
    assert!(st["finalModel"].is_null(), "{st:#}");
    wait_for("ttlSecondsAfterFinished to delete the job", LONG, || {
        cp.get_json(&ns, "tj/brief").is_none().then_some(())
    });
}

#[test]
fn a_final_model_recorded_by_the_last_worker_completes_a_job_whose_ps_cannot_be_reached() {
    let cp = control_plane();
    let ns = cp.namespace("recorded");
    // No PS answers here (as under a default-deny NetworkPolicy): the worker's record decides.
    let _op = Operator::start(cp, &ns, &["--leader-elect=false", "--finalize-grace-seconds", "0"]);
    apply_job(cp, &ns, "recorded", json!({"workers": {"replicas": 2}}));
    let pods = worker_pods(cp, &ns, "recorded", 2);
    let container =
        &cp.get_json(&ns, "job/recorded-workers").unwrap()["spec"]["template"]["spec"]["containers"][0];
    // Where the worker writes its record: the path the API server gives every container.
    let path = foresight_ps::wire::final_model::DEFAULT_TERMINATION_MESSAGE;
    assert_eq!(container["terminationMessagePath"], path, "{container:#}");
    cp.set_pod_phase(&ns, &pods[0], "Succeeded");
    let record =
        r#"{"finalModel":{"version":412,"path":"/models/default/recorded/model-final.safetensors"}}"#;
    cp.succeed_pod_with_message(&ns, &pods[1], record);
    let st = wait_phase(cp, &ns, "recorded", "Succeeded");
    assert_eq!(condition(&st, "Succeeded")["reason"], "Completed", "{st:#}");
    let message = condition(&st, "Succeeded")["message"].as_str().unwrap().to_string();
    assert!(message.contains("412"), "{message}");
}

#[test]
fn a_running_job_scales_up_and_down_without_restarting_its_parameter_server() {
    let cp = control_plane();
    let ns = cp.namespace("elastic");
    let ps_port = free_port();
    let _op = Operator::start(
        cp,
        &ns,
        &["--leader-elect=false", "--ps-url", &format!("http://127.0.0.1:{ps_port}")],
    );
    apply_job(cp, &ns, "grow", json!({"workers": {"replicas": 2, "minReplicas": 1}}));
    let ps = Ps::start(cp, &ns, "grow", ps_port, 2);
    ps.train_one_step();
    cp.set_pod_phase(&ns, &ps_pod(cp, &ns, "grow"), "Running");
    let pods = worker_pods(cp, &ns, "grow", 2);
    // minReplicas: one ready worker is enough to call the job Running.
    cp.set_pod_phase(&ns, &pods[0], "Running");
    let st = wait_phase(cp, &ns, "grow", "Running");
    assert_eq!((&st["workers"]["ready"], &st["workers"]["desired"]), (&json!(1), &json!(2)), "{st:#}");
    let ps_template = |cp: &support::ControlPlane| {
        let d = cp.get_json(&ns, "deployment/grow-ps").unwrap();
        (
            d["metadata"]["annotations"]["foresight.dev/ps-template-hash"].clone(),
            d["metadata"]["generation"].clone(),
        )
    };
    let before = ps_template(cp);

    let st = status(cp, &ns, "grow");
    assert_eq!(
        st["workers"]["selector"], "foresight.dev/job=grow,app.kubernetes.io/component=worker",
        "{st:#}"
    );
    for (replicas, pods_after) in [(3, 3), (1, 1)] {
        if replicas == 3 {
            // Up through the scale subresource (`kubectl scale`, an autoscaler), down by an edit.
            cp.kubectl_ok(&["scale", "tj", "grow", "-n", &ns, "--replicas=3"], None);
        } else {
            apply_job(cp, &ns, "grow", json!({"workers": {"replicas": replicas, "minReplicas": 1}}));
        }
        let spec = wait_for(&format!("the worker Job at {replicas}"), LONG, || {
            let j = cp.get_json(&ns, "job/grow-workers")?;
            (j["spec"]["completions"] == replicas && j["spec"]["parallelism"] == replicas).then_some(j)
        });
        assert!(
            spec["spec"]["template"]["spec"]["containers"][0]["env"]
                .as_array()
                .unwrap()
                .iter()
                .all(|e| e["name"] != "FORESIGHT_WORKERS"),
            "workers learn the count from the PS"
        );
        wait_for(&format!("the PS to expect {replicas} workers"), LONG, || {
            (ps.status()["workers_expected"] == replicas).then_some(())
        });
        let st = wait_for("the status to follow", LONG, || {
            let s = status(cp, &ns, "grow");
            (s["workers"]["desired"] == replicas).then_some(s)
        });
        assert_eq!(st["phase"], "Running", "{st:#}");
        // The Job controller adds or removes the highest indices; the PS is never rolled.
        let live = wait_for(&format!("{pods_after} worker pods"), LONG, || {
            let pods = cp.get_json(&ns, "pods")?;
            let indices: Vec<String> = pods["items"]
                .as_array()?
                .iter()
                .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
                .filter(|p| p["metadata"]["labels"]["app.kubernetes.io/component"] == "worker")
                .map(|p| p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"].to_string())
                .collect();
            (indices.len() == pods_after).then_some(indices)
        });
        eprintln!("scaled to {replicas}: worker indices {live:?}");
        assert_eq!(ps_template(cp), before, "the PS Deployment was not changed");
    }
    assert!(events(cp, &ns, "grow").iter().any(|e| e.1 == "WorkersScaled"));
}

/// An operator killed mid-job (SIGKILL) and started again takes the job over: no duplicate
/// child, the same Job, token and pods, and no child written again (review M6).
#[test]
fn an_operator_restarted_mid_job_converges_without_duplicates() {
    let cp = control_plane();
    let ns = cp.namespace("restart");
    let op = Operator::start(cp, &ns, &["--leader-elect=false"]);
    apply_job(cp, &ns, "steady", json!({}));
    let pods = worker_pods(cp, &ns, "steady", 2);
    let secret_name = token_secret(cp, &ns, "steady");
    let secret = wait_for("the Secret", LONG, || cp.get_json(&ns, &secret_name));
    let job_uid = cp.get_json(&ns, "job/steady-workers").unwrap()["metadata"]["uid"].clone();
    Command::new("kill").args(["-9", &op.pid().to_string()]).status().unwrap();
    drop(op);

    let op = Operator::start(cp, &ns, &["--leader-elect=false"]);
    // Its first reconcile, then a second one woken by a change to the job (not by a timer, so
    // however slow the machine).
    let reconciles = |n: f64| {
        wait_for(&format!("{n} reconciles by the new operator"), LONG, || {
            (sample(&op.metrics_text(), "foresight_operator_reconciles_total{result=\"success\"}")? >= n)
                .then_some(())
        })
    };
    reconciles(1.0);
    cp.kubectl_ok(&["annotate", "-n", &ns, "tj", "steady", "example.com/touched=1"], None);
    reconciles(2.0);
    // Every child carries the intent it was written with, which the new process's is: it writes
    // none of them again (before, one server-side apply per child on a restart or a failover).
    let patches = sample(&op.metrics_text(), "foresight_operator_api_requests_total{verb=\"patch\"}");
    assert_eq!(patches, Some(0.0), "the new operator applied children that held its intent already");
    let selector = "foresight.dev/job=steady";
    for kind in ["deployments", "services", "secrets", "jobs"] {
        assert_eq!(cp.names(&ns, kind, selector).len(), 1, "one {kind}");
    }
    assert_eq!(cp.get_json(&ns, "job/steady-workers").unwrap()["metadata"]["uid"], job_uid, "the same Job");
    assert_eq!(cp.get_json(&ns, &secret_name).unwrap()["data"], secret["data"], "the same token");
    assert_eq!(worker_pods(cp, &ns, "steady", 2), pods, "the same pods");
    cp.set_pod_phase(&ns, &ps_pod(cp, &ns, "steady"), "Running");
    for p in &pods {
        cp.set_pod_phase(&ns, p, "Running");
    }
    wait_phase(cp, &ns, "steady", "Running");
}

#[test]
fn two_operators_elect_one_leader_and_the_standby_takes_over() {
    let cp = control_plane();
    let ns = cp.namespace("leader");
    let lease = ["--leader-elect=true", "--lease-duration-seconds", "3"];
    let a = Operator::start(cp, &ns, &[&lease[..], &["--identity", "op-a"]].concat());
    let holder = || {
        cp.get_json(&ns, "lease/foresight-operator")
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(String::from))
    };
    wait_for("op-a to lead", LONG, || (holder()? == "op-a").then_some(()));
    let b = Operator::start(cp, &ns, &[&lease[..], &["--identity", "op-b"]].concat());
    wait_for("op-b to be ready as a standby", LONG, || {
        (http_get(b.metrics, "/readyz")?.0 == 200).then_some(())
    });

    apply_job(cp, &ns, "first", json!({}));
    wait_for("the leader to reconcile", LONG, || cp.get_json(&ns, "job/first-workers"));
    // While the leader renews its lease (watched twice, however long a renewal takes), the
    // standby stays out.
    let renewed = || cp.get_json(&ns, "lease/foresight-operator").map(|l| l["spec"]["renewTime"].clone());
    for _ in 0..2 {
        let before = renewed();
        wait_for("the leader to renew its lease", LONG, || (renewed() != before).then_some(()));
    }
    assert_eq!(holder().as_deref(), Some("op-a"));
    assert_eq!(
        sample(&b.metrics_text(), "foresight_operator_reconciles_total{result=\"success\"}"),
        Some(0.0),
        "the standby reconciles nothing"
    );

    // The leader dies without releasing the lease: the standby takes over after it expires.
    Command::new("kill").args(["-9", &a.pid().to_string()]).status().unwrap();
    drop(a);
    wait_for("op-b to lead", LONG, || (holder()? == "op-b").then_some(()));
    apply_job(cp, &ns, "second", json!({}));
    wait_for("the new leader to reconcile", LONG, || cp.get_json(&ns, "job/second-workers"));
    // A reconcile that made the worker Job may still end in a conflict (its status write raced
    // the job's own update) and be retried: seen once, 2.4 s later.
    wait_for("a successful reconcile by the new leader", LONG, || {
        (sample(&b.metrics_text(), "foresight_operator_reconciles_total{result=\"success\"}")? > 0.0)
            .then_some(())
    });
}

/// A leader whose API calls hang (a stuck connection: the proxy in front of the API server
/// stops moving bytes) gives up leading within its renew deadline, instead of reconciling on
/// for as long as the client's own timeouts allow; the standby takes over.
#[test]
fn a_leader_whose_api_calls_hang_stops_within_the_renew_deadline() {
    use support::proxy::{FreezableProxy, server_port};
    let cp = control_plane();
    let ns = cp.namespace("leader-hang");
    let dir = tempfile::tempdir().unwrap();
    let proxy = FreezableProxy::start(server_port(&cp.kubeconfig));
    let via_proxy = proxy.kubeconfig(&cp.kubeconfig, dir.path());
    // Lease 3 s: renew deadline 2 s, retry period 0.6 s.
    let lease = ["--leader-elect=true", "--lease-duration-seconds", "3"];
    let mut a =
        Operator::start_with(&via_proxy, Some(&ns), &ns, &[&lease[..], &["--identity", "op-a"]].concat());
    let holder = || {
        cp.get_json(&ns, "lease/foresight-operator")
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(String::from))
    };
    wait_for("op-a to lead", LONG, || (holder()? == "op-a").then_some(()));
    let _b = Operator::start(cp, &ns, &[&lease[..], &["--identity", "op-b"]].concat());

    proxy.freeze();
    let frozen = std::time::Instant::now();
    let status = wait_for("op-a to stop", LONG, || a.exited());
    let took = frozen.elapsed();
    assert!(!status.success(), "it stops as a failure: {status:?}");
    assert!(a.log().contains("lost leadership"), "{}", a.log());
    // Renew deadline 2 s after its last renewal (≤ 0.6 s before the freeze), plus exiting.
    // Without the deadline it would hang until the client's own timeout (minutes).
    assert!(took < Duration::from_secs(15), "op-a went on for {took:?} with no answer from the API server");
    wait_for("op-b to lead", LONG, || (holder()? == "op-b").then_some(()));
}

/// A holder whose clock is an hour behind keeps renewing: its renewTime reads an hour old, but
/// the record changes, so a standby that measures expiry on its own clock from when it saw the
/// record change never takes the lease, and takes it once the renewals stop.
#[test]
fn a_standby_never_takes_a_renewed_lease_whatever_the_holders_clock_says() {
    let cp = control_plane();
    let ns = cp.namespace("leader-skew");
    let skewed = |offset_ms: u64| {
        let t = std::time::SystemTime::now() - Duration::from_secs(3600) + Duration::from_millis(offset_ms);
        let t = k8s_openapi::jiff::Timestamp::try_from(t).unwrap();
        format!("{}", t.strftime("%Y-%m-%dT%H:%M:%S%.6fZ"))
    };
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "foresight-operator", "namespace": ns},
        "spec": {"holderIdentity": "skewed-leader", "leaseDurationSeconds": 3,
                 "acquireTime": skewed(0), "renewTime": skewed(0), "leaseTransitions": 0}
    });
    cp.kubectl_ok(&["apply", "-f", "-"], Some(&lease.to_string()));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let renewer = {
        let (stop, ns) = (stop.clone(), ns.clone());
        std::thread::spawn(move || {
            let mut k = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                k += 1;
                let patch = json!({"spec": {"renewTime": skewed(500 * k)}}).to_string();
                let _ = cp.kubectl(
                    &["-n", &ns, "patch", "lease", "foresight-operator", "--type", "merge", "-p", &patch],
                    None,
                );
                std::thread::sleep(Duration::from_millis(500));
            }
        })
    };
    let lease_args = ["--leader-elect=true", "--lease-duration-seconds", "3", "--identity", "op-b"];
    let b = Operator::start(cp, &ns, &lease_args);
    apply_job(cp, &ns, "first", json!({}));
    let holder = || {
        cp.get_json(&ns, "lease/foresight-operator")
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(String::from))
    };
    // Three lease durations of renewals: the standby stays out.
    std::thread::sleep(Duration::from_secs(9));
    assert_eq!(holder().as_deref(), Some("skewed-leader"));
    assert!(cp.get_json(&ns, "job/first-workers").is_none(), "the standby reconciled");
    assert_eq!(
        sample(&b.metrics_text(), "foresight_operator_reconciles_total{result=\"success\"}"),
        Some(0.0)
    );
    // The renewals stop: the lease expires on the standby's clock and it takes over.
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    renewer.join().unwrap();
    wait_for("op-b to lead", LONG, || (holder()? == "op-b").then_some(()));
    wait_for("op-b to reconcile", LONG, || cp.get_json(&ns, "job/first-workers"));
}

/// --token-key-secret (the chart's default): the first operator creates the key Secret; a
/// restarted one reads the same key, so the tokens of running jobs do not change. A key Secret
/// holding a short key stops the start with the reason.
#[test]
fn the_token_key_secret_is_created_once_and_kept_across_restarts() {
    let cp = control_plane();
    let ns = cp.namespace("token-key");
    let flags = ["--leader-elect=false", "--token-key-secret", "op-key"];
    let op = Operator::start(cp, &ns, &flags);
    let key = wait_for("the key Secret", LONG, || cp.get_json(&ns, "secret/op-key"));
    assert_eq!(key["metadata"]["labels"]["app.kubernetes.io/managed-by"], "foresight-operator");
    assert_eq!(key["data"]["key"].as_str().unwrap().len(), 88, "64 hex digits, base64: {key}");
    apply_job(cp, &ns, "keyed", json!({"workers": {"replicas": 1}}));
    let token_secret = token_secret(cp, &ns, "keyed");
    let token = wait_for("the job's token Secret", LONG, || cp.get_json(&ns, &token_secret))["data"].clone();
    drop(op);

    let op = Operator::start(cp, &ns, &flags);
    wait_for("a reconcile by the new operator", LONG, || {
        op.metrics_text().contains("foresight_operator_reconciles_total{result=\"success\"}").then_some(())
    });
    assert_eq!(cp.get_json(&ns, "secret/op-key").unwrap()["data"], key["data"], "the same key");
    assert_eq!(cp.get_json(&ns, &token_secret).unwrap()["data"], token, "the same job token");
    drop(op);

    cp.kubectl_ok(&["create", "secret", "generic", "-n", &ns, "short-key", "--from-literal=key=abc"], None);
    let out = Command::new(env!("CARGO_BIN_EXE_foresight"))
        .args(["operator", "--kubeconfig", cp.kubeconfig.to_str().unwrap(), "--leader-elect=false"])
        .args(["--lease-namespace", &ns, "--namespace", &ns, "--token-key-secret", "short-key"])
        .env_remove("FORESIGHT_TOKEN_KEY")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least 32 bytes"), "{out:?}");
}

#[test]
fn the_operator_refuses_to_start_without_a_token_key_or_with_a_bad_flag() {
    let out = Command::new(env!("CARGO_BIN_EXE_foresight"))
        .args(["operator", "--kubeconfig", "/nonexistent"])
        .env_remove("FORESIGHT_TOKEN_KEY")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("FORESIGHT_TOKEN_KEY"), "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_foresight"))
        .args(["operator", "--kubeconfig", "/nonexistent", "--token-key", "short"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least 32 bytes"));
    let out = Command::new(env!("CARGO_BIN_EXE_foresight"))
        .args([
            "operator",
            "--kubeconfig",
            "/nonexistent",
            "--token-key",
            KEY,
            "--ps-url",
            "no scheme {name}",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--ps-url") && err.contains("does not make"), "{err}");

    // --kueue where Kueue is not installed (this control plane has no Kueue): it says so and
    // exits, rather than wait forever for a watch of a kind that does not exist.
    let cp = control_plane();
    let out = Command::new(env!("CARGO_BIN_EXE_foresight"))
        .args(["operator", "--kubeconfig", cp.kubeconfig.to_str().unwrap(), "--token-key", KEY])
        .args(["--kueue", "--leader-elect=false", "--metrics-addr", "127.0.0.1:0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--kueue: Kueue's Workload API (kueue.x-k8s.io/v1beta2) is not served"), "{err}");
}

/// The operator's token key is rotated while a job runs: the new operator derives other
/// tokens, but the job's pods and PS hold the old ones (its Secret is written once). Given the
/// previous key, the operator still reads progress and finalizes with the old control token.
#[test]
fn after_a_token_key_rotation_a_running_job_is_still_observed_and_finalized() {
    let cp = control_plane();
    let ns = cp.namespace("rotation");
    let ps_port = free_port();
    let url = format!("http://127.0.0.1:{ps_port}");
    let op = Operator::start(cp, &ns, &["--leader-elect=false", "--ps-url", &url]);
    apply_job(cp, &ns, "rotated", json!({"workers": {"replicas": 1}}));
    let ps = Ps::start(cp, &ns, "rotated", ps_port, 1);
    ps.train_one_step();
    cp.set_pod_phase(&ns, &ps_pod(cp, &ns, "rotated"), "Running");
    let worker = worker_pods(cp, &ns, "rotated", 1).remove(0);
    cp.set_pod_phase(&ns, &worker, "Running");
    wait_for("progress read with the first key's token", LONG, || {
        (status(cp, &ns, "rotated")["progress"]["step"] == 1).then_some(())
    });
    drop(op);

    let dir = tempfile::tempdir().unwrap();
    let previous = dir.path().join("previous-key");
    std::fs::write(&previous, KEY).unwrap();
    let new_key = "f".repeat(64);
    let args = ["--leader-elect=false", "--ps-url", &url, "--token-key", &new_key];
    let _op = Operator::start(
        cp,
        &ns,
        &[&args[..], &["--previous-token-key-file", previous.to_str().unwrap()]].concat(),
    );
    ps.push_for(Duration::from_millis(300));
    let version = ps.status()["version"].clone();
    assert!(version.as_u64().unwrap() > 1);
    wait_for("progress read with the previous key's token", LONG, || {
        (status(cp, &ns, "rotated")["progress"]["step"] == version).then_some(())
    });
    cp.set_pod_phase(&ns, &worker, "Succeeded");
    let st = wait_phase(cp, &ns, "rotated", "Succeeded");
    assert_eq!(condition(&st, "Succeeded")["reason"], "Completed", "{st:#}");
    assert_eq!(ps.status()["finalized"], true, "finalized with the previous key's control token");
}

/// A worker pod fails, then a template change (with a suspension) replaces the worker Job: the
/// new Job starts counting failures from 0, so its backoffLimit is what the job has left, and
/// the status keeps the earlier failure.
#[test]
fn failures_of_a_replaced_worker_job_still_count_against_the_backoff_limit() {
    let cp = control_plane();
    let ns = cp.namespace("backoff-carried");
    let _op = Operator::start(cp, &ns, &["--leader-elect=false"]);
    // 8 GPUs a worker: the pods stay unscheduled, so a suspension removes them at once (no
    // kubelet here to confirm a scheduled pod's end).
    let spec = json!({"workers": {"replicas": 1, "gpus": 8}, "runPolicy": {"backoffLimit": 3}});
    apply_job(cp, &ns, "carried", spec);
    let first = worker_pods(cp, &ns, "carried", 1).remove(0);
    cp.set_pod_phase(&ns, &first, "Failed");
    wait_for("the failure counted", LONG, || {
        (status(cp, &ns, "carried")["workers"]["failed"] == 1).then_some(())
    });
    let old = cp.get_json(&ns, "job/carried-workers").unwrap();
    assert_eq!(old["spec"]["backoffLimit"], 3);
    let patch = r#"{"spec":{"workers":{"image":"example.com/worker:2"},"runPolicy":{"suspend":true}}}"#;
    cp.kubectl_ok(&["patch", "-n", &ns, "tj", "carried", "--type=merge", "-p", patch], None);
    let new = wait_for("a new worker Job with what is left of the backoff limit", LONG, || {
        cp.get_json(&ns, "job/carried-workers")
            .filter(|j| j["metadata"]["uid"] != old["metadata"]["uid"] && j["spec"]["backoffLimit"] == 2)
    });
    assert_eq!(new["spec"]["template"]["spec"]["containers"][0]["image"], "example.com/worker:2");
    let st = status(cp, &ns, "carried");
    assert_eq!(
        (st["workers"]["failed"].clone(), st["workers"]["failedEarlier"].clone()),
        (json!(0), json!(1)),
        "{st:#}"
    );
}

/// `--ps-network-policy`: each job gets a NetworkPolicy that admits only its own workers, its own
/// PS pods (shard 0 calls the others) and the given peers to its parameter servers (every shard),
/// on the PS port; one of that name made by
/// someone else is left alone and the job waits, saying why. (Whether the network enforces it
/// is the CNI's part: the bridge plugin of the real node here does not.)
#[test]
fn with_a_ps_network_policy_only_the_jobs_workers_and_the_given_peers_reach_its_parameter_server() {
    let cp = control_plane();
    let ns = cp.namespace("netpol");
    let operator_pods = json!({
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "foresight-system"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "foresight"}}
    });
    let peers = json!([operator_pods]).to_string();
    let theirs = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: taken-ps}\n\
                  spec: {podSelector: {}, policyTypes: [Ingress]}\n";
    cp.kubectl_ok(&["apply", "-n", &ns, "-f", "-"], Some(theirs));
    let taken = cp.get_json(&ns, "networkpolicy/taken-ps").unwrap();
    let _op = Operator::start(cp, &ns, &["--leader-elect=false", "--ps-network-policy", &peers]);
    apply_job(cp, &ns, "sharded", json!({"workers": {"replicas": 2}, "parameterServer": {"replicas": 2}}));
    apply_job(cp, &ns, "taken", json!({"workers": {"replicas": 1}}));

    let policy = wait_for("the job's NetworkPolicy", LONG, || cp.get_json(&ns, "networkpolicy/sharded-ps"));
    let uid = cp.get_json(&ns, "tj/sharded").unwrap()["metadata"]["uid"].clone();
    assert_eq!(policy["metadata"]["ownerReferences"][0]["uid"], uid, "the job's: {policy:#}");
    let spec = &policy["spec"];
    let ps = json!({"foresight.dev/job": "sharded", "app.kubernetes.io/component": "parameter-server"});
    assert_eq!(spec["podSelector"]["matchLabels"], ps, "every shard's PS pods: {spec:#}");
    assert_eq!(spec["policyTypes"], json!(["Ingress"]));
    let rules = spec["ingress"].as_array().unwrap();
    assert_eq!(rules.len(), 1, "{spec:#}");
    let workers = json!({"foresight.dev/job": "sharded", "app.kubernetes.io/component": "worker"});
    // Its own PS pods too: shard 0 calls the other shards (finalize, pulls, rescaling).
    assert_eq!(
        rules[0]["from"],
        json!([{"podSelector": {"matchLabels": workers}}, {"podSelector": {"matchLabels": ps}}, operator_pods])
    );
    assert_eq!(rules[0]["ports"], json!([{"port": 8080, "protocol": "TCP"}]));
    // The selectors match the pods the operator made: both shards' PS pods and the workers'.
    for (component, selector) in [("parameter-server", &ps), ("worker", &workers)] {
        let labels = if component == "worker" {
            cp.get_json(&ns, "job/sharded-workers").unwrap()["spec"]["template"]["metadata"]["labels"].clone()
        } else {
            cp.get_json(&ns, "deployment/sharded-ps-1").unwrap()["spec"]["template"]["metadata"]["labels"]
                .clone()
        };
        for (k, v) in selector.as_object().unwrap() {
            assert_eq!(&labels[k], v, "{component} pods' label {k}: {labels:#}");
        }
    }

    // A policy edited by hand is put back.
    let open = r#"[{"op":"replace","path":"/spec/ingress","value":[{}]}]"#;
    cp.kubectl_ok(&["patch", "networkpolicy", "sharded-ps", "-n", &ns, "--type=json", "-p", open], None);
    wait_for("the policy put back", LONG, || {
        let p = cp.get_json(&ns, "networkpolicy/sharded-ps")?;
        (p["spec"]["ingress"][0]["from"].as_array().map(Vec::len) == Some(3)).then_some(())
    });

    // Someone else's policy of that name: untouched, and the job says why it waits.
    let st = wait_for("the NameConflict", LONG, || {
        let s = status(cp, &ns, "taken");
        (condition(&s, "ReconcileFailed")["reason"] == "NameConflict").then_some(s)
    });
    let message = condition(&st, "ReconcileFailed")["message"].as_str().unwrap().to_string();
    assert!(message.contains("NetworkPolicy taken-ps"), "{message}");
    let now = cp.get_json(&ns, "networkpolicy/taken-ps").unwrap();
    assert_eq!(now["metadata"]["ownerReferences"], taken["metadata"]["ownerReferences"]);
    assert_eq!(now["spec"], taken["spec"]);
}

/// `parameterServer.disruptionBudget`: a PodDisruptionBudget over the job's PS pods. The real
/// eviction API (with kube-controller-manager's disruption controller counting the pods) refuses
/// to evict the ready PS while it is on; turned off while the job runs, it is deleted and the
/// same eviction goes through.
#[test]
fn a_disruption_budget_keeps_evictions_from_the_ready_parameter_server_until_turned_off() {
    let cp = control_plane();
    let ns = cp.namespace("pdb");
    let _op = Operator::start(cp, &ns, &["--leader-elect=false"]);
    apply_job(
        cp,
        &ns,
        "guarded",
        json!({"workers": {"replicas": 1}, "parameterServer": {"disruptionBudget": true}}),
    );
    let pdb = wait_for("the job's PodDisruptionBudget", LONG, || cp.get_json(&ns, "pdb/guarded-ps"));
    let uid = cp.get_json(&ns, "tj/guarded").unwrap()["metadata"]["uid"].clone();
    assert_eq!(pdb["metadata"]["ownerReferences"][0]["uid"], uid, "the job's: {pdb:#}");
    let spec = &pdb["spec"];
    assert_eq!(spec["maxUnavailable"], 0, "{spec:#}");
    assert_eq!(spec["unhealthyPodEvictionPolicy"], "AlwaysAllow", "{spec:#}");
    assert_eq!(
        spec["selector"]["matchLabels"],
        json!({"foresight.dev/job": "guarded", "app.kubernetes.io/component": "parameter-server"})
    );
    let pod = ps_pod(cp, &ns, "guarded");
    cp.set_pod_phase(&ns, &pod, "Running");
    wait_for("the budget counting the ready PS", LONG, || {
        let s = cp.get_json(&ns, "pdb/guarded-ps")?["status"].clone();
        (s["currentHealthy"] == 1 && s["disruptionsAllowed"] == 0).then_some(())
    });
    let evict = || {
        let body = json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": ns}});
        let path = format!("/api/v1/namespaces/{ns}/pods/{pod}/eviction");
        cp.kubectl(&["create", "--raw", &path, "-f", "-"], Some(&body.to_string()))
    };
    let refused = evict();
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && err.contains("disruption budget"), "{err}");
    assert!(cp.get_json(&ns, &format!("pod/{pod}")).is_some(), "the PS pod is still there");

    patch_job(cp, &ns, "guarded", r#"{"spec":{"parameterServer":{"disruptionBudget":false}}}"#);
    wait_for("the budget deleted", LONG, || cp.get_json(&ns, "pdb/guarded-ps").is_none().then_some(()));
    let allowed = evict();
    assert!(allowed.status.success(), "{}", String::from_utf8_lossy(&allowed.stderr));
}

/// The job's TLS Secret holds a certificate its CA signed for `host` (openssl's check).
fn check_certificate(secret: &Value, host: &str) {
    let dir = tempfile::tempdir().unwrap();
    for key in ["ca.crt", "tls.crt", "tls.key"] {
        let pem = support::base64_decode(secret["data"][key].as_str().unwrap_or_else(|| panic!("no {key}")));
        std::fs::write(dir.path().join(key), pem).unwrap();
    }
    let verify = |host: &str| {
        Command::new("openssl")
            .current_dir(dir.path())
            .args(["verify", "-CAfile", "ca.crt", "-verify_hostname", host, "tls.crt"])
            .output()
            .expect("openssl")
    };
    let ok = verify(host);
    assert!(
        ok.status.success(),
        "{}{}",
        String::from_utf8_lossy(&ok.stdout),
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(!verify("another-ps.elsewhere.svc").status.success(), "the certificate holds another name");
}

/// A Secret planted before the job's first reconcile is never taken for the job's (issue #48):
/// the operator may create Secrets but not read them, so it used to take a 409 on
/// `<job>-token-<first 8 of the UID>` (known as soon as the job exists) as its own, and the job
/// ran with tokens (or, for the TLS Secret, a CA and key) its author chose. The names now end
/// with 16 hex digits derived from the operator's key, recorded in the job's status.
#[test]
fn a_secret_planted_under_the_jobs_uid_is_never_the_jobs() {
    let cp = control_plane();
    let ns = cp.namespace("planted");
    apply_job(cp, &ns, "target", json!({"workers": {"replicas": 1}}));
    let uid = cp.get_json(&ns, "tj/target").unwrap()["metadata"]["uid"].as_str().unwrap().to_string();
    let planted = |kind: &str| format!("target-{kind}-{}", &uid[..8]);
    for (kind, data) in [("token", "token=known,control-token=known"), ("ps-tls", "ca.crt=mine")] {
        let mut args = vec![
            "create".to_string(),
            "secret".into(),
            "generic".into(),
            planted(kind),
            "-n".into(),
            ns.clone(),
        ];
        args.extend(data.split(',').map(|kv| format!("--from-literal={kv}")));
        cp.kubectl_ok(&args.iter().map(String::as_str).collect::<Vec<_>>(), None);
    }
    let _op = Operator::start(cp, &ns, &["--leader-elect=false", "--ps-tls"]);
    let deploy = wait_for("the PS Deployment", LONG, || cp.get_json(&ns, "deployment/target-ps"));
    let pod = &deploy["spec"]["template"]["spec"];
    let env = pod["containers"][0]["env"].as_array().unwrap().clone();
    let token_ref = env.iter().find(|e| e["name"] == "FORESIGHT_TOKEN").unwrap()["valueFrom"]["secretKeyRef"]
        ["name"]
        .clone();
    let secret = token_secret(cp, &ns, "target");
    assert_eq!(token_ref, &secret["secret/".len()..], "the PS reads the operator's Secret");
    assert_ne!(token_ref, planted("token").as_str());
    let tls = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "ps-tls").unwrap()["secret"]["secretName"].clone();
    assert_eq!(tls, format!("target-ps-tls-{}", secret_suffix(cp, &ns, "target")));
    let made = wait_for("the job's Secret", LONG, || cp.get_json(&ns, &secret));
    assert_eq!(made["metadata"]["ownerReferences"][0]["uid"], uid.as_str());
    assert_ne!(support::base64_decode(made["data"]["token"].as_str().unwrap()), "known");
    // The planted ones are left as they were: not the job's, not the operator's to delete.
    let left = cp.get_json(&ns, &format!("secret/{}", planted("token"))).unwrap();
    assert_eq!(support::base64_decode(left["data"]["token"].as_str().unwrap()), "known");
    assert!(left["metadata"]["ownerReferences"].is_null());
}
