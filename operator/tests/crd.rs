//! The TrainingJob CRD against a real kube-apiserver (v1.37, with etcd) and the real kubectl:
//! it installs, `kubectl get tj` shows the printer columns, `kubectl explain` shows the
//! descriptions, the server applies the defaults, each CEL rule and bound refuses a bad object
//! naming the field (and `api::validate` refuses the same object for the same field), and the
//! transition rules hold (`api::validate_update` agreeing): what a worker resumes from never
//! changes, the workers' pod template only with a suspension.

mod support;

use foresight_operator::api::{TrainingJob, validate, validate_update};
use serde_json::{Value, json};
use support::control_plane;

/// The smallest valid TrainingJob.
fn minimal(name: &str) -> Value {
    json!({
        "apiVersion": "foresight.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "lenet5"},
            "dataset": {"format": "mnist", "path": "/data/mnist"},
            "workers": {"replicas": 2}
        }
    })
}

fn yaml(v: &Value) -> String {
    serde_yaml::to_string(v).unwrap()
}

/// Sets `value` at the dotted `path` below the object, creating objects on the way;
/// `Value::Null` removes the field.
fn set(obj: &mut Value, path: &str, value: Value) {
    let mut parts: Vec<&str> = path.split('.').collect();
    let last = parts.pop().unwrap();
    let mut cur = obj;
    for p in parts {
        cur = cur.as_object_mut().unwrap().entry(p).or_insert_with(|| json!({}));
    }
    if value.is_null() {
        cur.as_object_mut().unwrap().remove(last);
    } else {
        cur[last] = value;
    }
}

/// The children's names are made from the job's: a name they cannot carry is refused by the API
/// server (and by `validate_name`, which the operator applies when a CRD lacks the rule).
#[test]
fn a_name_the_childrens_names_cannot_be_made_from_is_refused() {
    let cp = control_plane();
    let ns = cp.namespace("names");
    let longest = format!("a{}", "b".repeat(49));
    for (name, ok) in [
        ("exp.v2", false),
        ("9lives", false),
        ("ends-", false),
        (&*format!("{longest}c"), false),
        (&*longest, true),
        ("exp-v2", true),
    ] {
        let out =
            cp.kubectl(&["create", "--dry-run=server", "-n", &ns, "-f", "-"], Some(&yaml(&minimal(name))));
        let stderr = String::from_utf8_lossy(&out.stderr);
        if ok {
            assert!(out.status.success(), "{name}: {stderr}");
        } else {
            assert!(
                !out.status.success() && stderr.contains("metadata.name must be at most 50 characters"),
                "{name}: {stderr}"
            );
        }
        assert_eq!(foresight_operator::api::validate_name(name).is_ok(), ok, "validate_name({name:?})");
    }
}

#[test]
fn the_example_applies_and_get_shows_the_printer_columns() {
    let cp = control_plane();
    // The CRD itself is created without warnings (no formats the API server does not know). A
    // copy under another group, so that the server validates it as new.
    let crd = std::fs::read_to_string(support::repo_root().join("crds/trainingjob.yaml")).unwrap();
    let copy = crd
        .replace("name: trainingjobs.foresight.dev", "name: trainingjobs.warnings.foresight.dev")
        .replace("group: foresight.dev", "group: warnings.foresight.dev");
    let out = cp.kubectl(&["create", "--dry-run=server", "-f", "-"], Some(&copy));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !stderr.contains("Warning"), "{stderr}");
    let ns = cp.namespace("example");
    let example = support::repo_root().join("examples/mnist-dcasgd.yaml");
    cp.kubectl_ok(&["apply", "-n", &ns, "-f", example.to_str().unwrap()], None);
    // The cluster example (a claim for the data, the job) passes the API server's validation too
    // (in a namespace of its own: over the job above, of the same name, it would be an update
    // changing the dataset, which the transition rules refuse).
    let cluster = support::repo_root().join("examples/mnist-dcasgd-cluster.yaml");
    let cluster_ns = cp.namespace("example-cluster");
    let out = cp
        .kubectl_ok(&["apply", "--dry-run=server", "-n", &cluster_ns, "-f", cluster.to_str().unwrap()], None);
    assert!(out.contains("persistentvolumeclaim/mnist5k created (server dry run)"), "{out}");
    // A job whose workers run the user's Python script names no model.
    let python = support::repo_root().join("examples/python/mnist.yaml");
    let out = cp.kubectl_ok(&["apply", "--dry-run=server", "-n", &ns, "-f", python.to_str().unwrap()], None);
    assert!(out.contains("trainingjob.foresight.dev/mnist-python created (server dry run)"), "{out}");
    // ... and in a cluster, its script from a ConfigMap mounted through workers.pod.
    let python = support::repo_root().join("examples/python/mnist-cluster.yaml");
    let out = cp
        .kubectl_ok(&["apply", "--dry-run=server", "-n", &cluster_ns, "-f", python.to_str().unwrap()], None);
    assert!(out.contains("trainingjob.foresight.dev/mnist-python created (server dry run)"), "{out}");

    // `kubectl get tj` fits a terminal; `-o wide` adds the training figures.
    let header = |args: &[&str]| -> Vec<String> {
        let mut all = vec!["get", "tj", "-n", &ns];
        all.extend_from_slice(args);
        let table = cp.kubectl_ok(&all, None);
        table.lines().next().unwrap().split_whitespace().map(String::from).collect()
    };
    assert_eq!(header(&[]), ["NAME", "PHASE", "WORKERS", "READY", "STEP", "REASON", "AGE"]);
    assert_eq!(
        header(&["-o", "wide"]),
        [
            "NAME",
            "PHASE",
            "WORKERS",
            "READY",
            "STEP",
            "REASON",
            "AGE",
            "ALGORITHM",
            "STALENESS",
            "P99",
            "EPOCH",
            "LOSS"
        ]
    );
    let table = cp.kubectl_ok(&["get", "tj", "-n", &ns, "-o", "wide"], None);
    let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(row[..2], ["mnist-dcasgd", "4"], "no phase yet: {table}");
    assert!(!table.contains("dc-asgd-a"), "the rule shows once the running PS says it: {table}");

    // The status subresource takes what the operator will write, and the columns show it.
    let selector = "foresight.dev/job=mnist-dcasgd,app.kubernetes.io/component=worker";
    let status = json!({"status": {
        "phase": "Running",
        "reason": "WorkersRunning",
        "observedGeneration": 1,
        "conditions": [{"type": "Running", "status": "True", "reason": "WorkersRunning",
                        "message": "4 of 4 workers running", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
        "workers": {"desired": 4, "ready": 3, "active": 4, "succeeded": 0, "failed": 0, "selector": selector},
        "parameterServer": {"ready": true, "algorithm": "dc-asgd-a"},
        "progress": {"step": 1234, "epoch": 2, "loss": 0.31, "accuracy": 0.91,
                     "stalenessP50": 3.0, "stalenessP99": 7.5},
        "startTime": "2026-01-01T00:00:00Z"
    }});
    cp.kubectl_ok(
        &[
            "patch",
            "tj",
            "mnist-dcasgd",
            "-n",
            &ns,
            "--subresource=status",
            "--type=merge",
            "-p",
            &status.to_string(),
        ],
        None,
    );
    let table = cp.kubectl_ok(&["get", "tj", "-n", &ns, "--no-headers", "-o", "wide"], None);
    let row: Vec<&str> = table.split_whitespace().collect();
    assert_eq!(row[..6], ["mnist-dcasgd", "Running", "4", "3", "1234", "WorkersRunning"], "{table}");
    assert_eq!(row[7..10], ["dc-asgd-a", "7.5", "2"], "{table}");

    // The scale subresource: workers.replicas, the active worker pods and their selector, for
    // `kubectl scale` and the HorizontalPodAutoscaler; the schema's bounds hold through it.
    let path = format!("/apis/foresight.dev/v1alpha1/namespaces/{ns}/trainingjobs/mnist-dcasgd/scale");
    let scale: Value = serde_json::from_str(&cp.kubectl_ok(&["get", "--raw", &path], None)).unwrap();
    assert_eq!(scale["spec"]["replicas"], 4, "{scale:#}");
    assert_eq!(scale["status"]["replicas"], 4, "{scale:#}");
    assert_eq!(scale["status"]["selector"], selector, "{scale:#}");
    cp.kubectl_ok(&["scale", "tj", "mnist-dcasgd", "-n", &ns, "--replicas=6"], None);
    let job = cp.get_json(&ns, "tj/mnist-dcasgd").unwrap();
    assert_eq!(job["spec"]["workers"]["replicas"], 6);
    let out = cp.kubectl(&["scale", "tj", "mnist-dcasgd", "-n", &ns, "--replicas=0"], None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("spec.workers.replicas"), "{stderr}");
    assert_eq!(cp.get_json(&ns, "tj/mnist-dcasgd").unwrap()["spec"]["workers"]["replicas"], 6);

    // What the server stored reads back as the Rust type.
    let stored: TrainingJob =
        serde_json::from_str(&cp.kubectl_ok(&["get", "tj", "mnist-dcasgd", "-n", &ns, "-o", "json"], None))
            .unwrap();
    let st = stored.status.expect("status stored");
    assert_eq!(st.progress.unwrap().step, 1234);
    assert_eq!(st.conditions[0].reason, "WorkersRunning");
    assert!(st.parameter_server.unwrap().ready);
}

/// `kubectl explain`, retried for a while: the API server rebuilds its OpenAPI document when
/// CRDs or their status change, and a request in between can fail (seen once in ~10 runs).
fn explain(cp: &support::ControlPlane, what: &str) -> String {
    let out =
        support::wait_for(&format!("kubectl explain {what}"), std::time::Duration::from_secs(20), || {
            let out = cp.kubectl(&["explain", what], None);
            out.status.success().then_some(out)
        });
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn kubectl_explain_describes_the_optimizer() {
    let cp = control_plane();
    let out = explain(cp, "trainingjob.spec.optimizer");
    for text in [
        "The update rule the parameter server applies",
        "algorithm",
        "dc-asgd-a",
        "asgd with localSteps above 1",
        "whether named or resolved from",
        "lambda0",
        "meanSquareDecay",
        "in [0, 1), dc-asgd-a only",
        "pullEvery",
        "Workers pull the model every this many steps",
        "momentum",
        "weightDecay",
        "maxStaleness",
    ] {
        assert!(out.contains(text), "`kubectl explain trainingjob.spec.optimizer` lacks {text:?}:\n{out}");
    }
    let out = explain(cp, "tj.status.progress");
    assert!(out.contains("stalenessP99") && out.contains("99th percentile"), "{out}");
}

#[test]
fn the_server_applies_the_defaults() {
    let cp = control_plane();
    let ns = cp.namespace("defaults");
    let mut obj = minimal("defaults");
    // An explicit null is pruned like an absent field (the schema has no `nullable`).
    set(&mut obj, "spec.optimizer", json!({"algorithm": "asgd", "lambda0": null}));
    cp.kubectl_ok(&["create", "-n", &ns, "-f", "-"], Some(&yaml(&obj)));
    let got: Value =
        serde_json::from_str(&cp.kubectl_ok(&["get", "tj", "defaults", "-n", &ns, "-o", "json"], None))
            .unwrap();
    let spec = &got["spec"];
    assert_eq!(spec["training"], json!({"epochs": 10, "batchSize": 64, "learningRate": 0.05, "seed": 1}));
    assert_eq!(spec["optimizer"], json!({"algorithm": "asgd", "pullEvery": 1, "pushEvery": 1}));
    assert_eq!(spec["parameterServer"], json!({}));
    assert_eq!(spec["runPolicy"], json!({}));
    // The same defaults as serde's.
    let job: TrainingJob = serde_json::from_value(got).unwrap();
    let local: TrainingJob = serde_json::from_value(obj).unwrap();
    assert_eq!(job.spec, local.spec);
}

/// Every rule of the schema, each with an object that breaks only it: the API server refuses
/// the object naming the field and the problem, and `api::validate` refuses it for the same
/// field. (Creations go through `kubectl create --dry-run=server`: validated, never stored.)
#[test]
fn each_rule_refuses_a_bad_object_naming_the_field() {
    let cp = control_plane();
    let ns = cp.namespace("rules");
    // (what to change, the field validate() names, what the API server's message contains)
    type Changes<'a> = &'a [(&'a str, Value)];
    let cases: &[(Changes, &str, &str)] = &[
        (
            &[("spec.output", json!({"claimName": "models", "storage": "1Gi"}))],
            "output",
            "set exactly one of output.claimName",
        ),
        (&[("spec.output", json!({}))], "output", "set exactly one of output.claimName"),
        (
            &[("spec.workers", json!({"replicas": 2, "minReplicas": 3}))],
            "workers.minReplicas",
            "spec.workers.minReplicas: Invalid value: |workers.minReplicas must be at most workers.replicas",
        ),
        (
            &[
                ("spec.workers", json!({"replicas": 2, "minReplicas": 1})),
                ("spec.optimizer", json!({"algorithm": "sync"})),
            ],
            "workers.minReplicas",
            "spec.workers.minReplicas: Invalid value: |needs an asynchronous algorithm",
        ),
        (
            &[
                ("spec.parameterServer", json!({"replicas": 3})),
                ("spec.optimizer", json!({"algorithm": "sync"})),
            ],
            "optimizer.algorithm",
            "spec.optimizer.algorithm: Invalid value: |sync needs parameterServer.replicas: 1",
        ),
        (
            &[("spec.optimizer", json!({"algorithm": "dc-asgd-c", "localSteps": 8}))],
            "optimizer.algorithm",
            "spec.optimizer.algorithm: Invalid value: |dc-asgd-c does not take localSteps",
        ),
        (
            &[
                ("spec.parameterServer", json!({"replicas": 2})),
                ("spec.optimizer", json!({"maxStaleness": 4})),
            ],
            "optimizer.maxStaleness",
            "spec.optimizer.maxStaleness: Invalid value: |maxStaleness needs parameterServer.replicas: 1",
        ),
        (
            &[("spec.output", json!({"claimName": "Models_1"}))],
            "output.claimName",
            "spec.output.claimName: Invalid value: |must be a PersistentVolumeClaim name",
        ),
        (
            &[("spec.output", json!({"storage": "0"}))],
            "output.storage",
            "spec.output.storage: Invalid value: |must be a quantity > 0",
        ),
        (
            &[("spec.output", json!({"claimName": "models", "path": "runs/../../etc"}))],
            "output.path",
            "spec.output.path: Invalid value: |must be a relative path without '..'",
        ),
        (&[("spec.model.torchscript", json!({"path": "m.pt"}))], "model", "set exactly one of model.name"),
        (&[("spec.model.name", Value::Null)], "model", "set exactly one of model.name"),
        (
            &[("spec.model.name", Value::Null), ("spec.model.torchscript", json!({"path": "  "}))],
            "model.torchscript.path",
            "spec.model.torchscript.path: Invalid value: |must not be empty",
        ),
        (&[("spec.model.name", json!("vgg"))], "", "spec.model.name: Unsupported value: \"vgg\""),
        (
            &[("spec.model", Value::Null)],
            "model",
            "spec.model: Invalid value: |set exactly one of model.name",
        ),
        (
            &[("spec.workers.command", json!(["python", "train.py"]))],
            "model",
            "spec.model: Invalid value: |or neither when workers.command runs your own program",
        ),
        (
            &[("spec.workers.args", json!(["--lr", "0.1"]))],
            "workers.args",
            "spec.workers.args: Invalid value: |workers.args needs workers.command",
        ),
        (&[("spec.workers.command", json!([]))], "workers.command", "spec.workers.command: Invalid value"),
        (
            &[("spec.dataset.format", json!("files"))],
            "dataset.format",
            "spec.dataset.format: Invalid value: |files needs workers.command",
        ),
        (
            &[("spec.dataset.path", json!(""))],
            "dataset.path",
            "spec.dataset.path: Invalid value: |must not be empty",
        ),
        (
            &[("spec.dataset.holdout", json!(1.0))],
            "dataset.holdout",
            "spec.dataset.holdout: Invalid value: |must be in (0, 1)",
        ),
        (
            &[("spec.dataset.holdout", json!(0))],
            "dataset.holdout",
            "spec.dataset.holdout: Invalid value: |must be in (0, 1)",
        ),
        (
            &[("spec.training.epochs", json!(0))],
            "training.epochs",
            "spec.training.epochs in body should be greater than or equal to 1",
        ),
        (
            &[("spec.training.batchSize", json!(0))],
            "training.batchSize",
            "spec.training.batchSize in body should be greater than or equal to 1",
        ),
        (
            &[("spec.parameterServer.replicas", json!(65))],
            "parameterServer.replicas",
            "spec.parameterServer.replicas in body should be less than or equal to 64",
        ),
        (
            &[("spec.training.learningRate", json!(0))],
            "training.learningRate",
            "spec.training.learningRate: Invalid value: |must be > 0",
        ),
        (
            &[("spec.training.learningRate", json!(-0.1))],
            "training.learningRate",
            "spec.training.learningRate: Invalid value: |must be > 0",
        ),
        (
            &[("spec.training.lrDecay", json!({"factor": 1.5, "milestones": [10]}))],
            "training.lrDecay.factor",
            "spec.training.lrDecay.factor: Invalid value: |must be in (0, 1]",
        ),
        (
            &[("spec.training.lrDecay", json!({"factor": 0, "milestones": [10]}))],
            "training.lrDecay.factor",
            "spec.training.lrDecay.factor: Invalid value: |must be in (0, 1]",
        ),
        (
            &[("spec.training.lrDecay", json!({"factor": 0.1, "milestones": [20, 10]}))],
            "training.lrDecay.milestones",
            "spec.training.lrDecay.milestones: Invalid value: |must be epochs ≥ 0 in strictly ascending order",
        ),
        (
            &[("spec.training.lrDecay", json!({"factor": 0.1, "milestones": [10, 10]}))],
            "training.lrDecay.milestones",
            "strictly ascending",
        ),
        (
            &[("spec.training.lrDecay", json!({"factor": 0.1, "milestones": [-1, 10]}))],
            "training.lrDecay.milestones",
            "strictly ascending",
        ),
        (
            &[("spec.training.lrWarmupEpochs", json!(-0.5))],
            "training.lrWarmupEpochs",
            "spec.training.lrWarmupEpochs: Invalid value: |must be ≥ 0",
        ),
        (
            &[("spec.optimizer", json!({"algorithm": "asgd", "lambda0": 0.04}))],
            "optimizer.lambda0",
            "spec.optimizer.lambda0: Invalid value: |lambda0 only applies to dc-asgd-c and dc-asgd-a",
        ),
        (
            &[("spec.optimizer", json!({"algorithm": "sync", "lambda0": 0.04}))],
            "optimizer.lambda0",
            "lambda0 only applies to dc-asgd-c and dc-asgd-a",
        ),
        (
            &[("spec.optimizer", json!({"algorithm": "asgd", "backupWorkers": 1}))],
            "optimizer.backupWorkers",
            "spec.optimizer.backupWorkers: Invalid value: |backupWorkers only applies to sync",
        ),
        (
            &[
                ("spec.optimizer", json!({"algorithm": "sync", "backupWorkers": 4})),
                ("spec.workers.replicas", json!(4)),
            ],
            "optimizer.backupWorkers",
            "spec.optimizer.backupWorkers: Invalid value: |must be fewer than workers.replicas",
        ),
        (
            &[("spec.optimizer", json!({"algorithm": "dc-asgd-a", "syncRoundTimeoutSeconds": 30}))],
            "optimizer.syncRoundTimeoutSeconds",
            "syncRoundTimeoutSeconds only applies to sync",
        ),
        (
            &[("spec.optimizer.lambda0", json!(-1))],
            "optimizer.lambda0",
            "spec.optimizer.lambda0: Invalid value: |must be ≥ 0",
        ),
        (
            &[("spec.optimizer", json!({"algorithm": "dc-asgd-c", "meanSquareDecay": 0.95}))],
            "optimizer.meanSquareDecay",
            "spec.optimizer.meanSquareDecay: Invalid value: |meanSquareDecay only applies to dc-asgd-a",
        ),
        (
            &[("spec.optimizer.meanSquareDecay", json!(1))],
            "optimizer.meanSquareDecay",
            "spec.optimizer.meanSquareDecay: Invalid value: |must be in [0, 1)",
        ),
        (
            &[("spec.optimizer.algorithm", json!("adam"))],
            "",
            "spec.optimizer.algorithm: Unsupported value: \"adam\"",
        ),
        (
            &[("spec.optimizer", json!({"algorithm": "dc-asgd-a", "pullEvery": 3, "pushEvery": 2}))],
            "optimizer.pullEvery",
            "spec.optimizer.pullEvery: Invalid value: |pullEvery must be a multiple of pushEvery",
        ),
        (
            &[("spec.optimizer", json!({"algorithm": "sync", "pullEvery": 2, "pushEvery": 1}))],
            "optimizer.pullEvery",
            "spec.optimizer.pullEvery: Invalid value: |under sync pullEvery must equal pushEvery",
        ),
        (
            &[("spec.optimizer.pullEvery", json!(0))],
            "optimizer.pullEvery",
            "spec.optimizer.pullEvery in body should be greater than or equal to 1",
        ),
        (
            &[("spec.optimizer.pushEvery", json!(0))],
            "optimizer.pushEvery",
            "spec.optimizer.pushEvery in body should be greater than or equal to 1",
        ),
        (
            &[("spec.optimizer", json!({"algorithm": "sync", "nesterov": true}))],
            "optimizer.nesterov",
            "spec.optimizer.nesterov: Invalid value: |nesterov needs a momentum > 0",
        ),
        (
            &[("spec.optimizer", json!({"algorithm": "asgd", "momentumDelay": 4}))],
            "optimizer.momentumDelay",
            "spec.optimizer.momentumDelay: Invalid value: |momentumDelay needs a momentum > 0",
        ),
        (
            &[("spec.optimizer", json!({"algorithm": "sync", "momentum": 0.9, "momentumDelay": 4}))],
            "optimizer.momentumDelay",
            "spec.optimizer.momentumDelay: Invalid value: |momentumDelay only applies to the asynchronous rules",
        ),
        (
            &[(
                "spec.optimizer",
                json!({"algorithm": "sync", "localSteps": 10, "pullEvery": 2, "pushEvery": 2}),
            )],
            "optimizer.localSteps",
            "spec.optimizer.localSteps: Invalid value: |localSteps replaces pullEvery and pushEvery",
        ),
        (
            &[("spec.optimizer", json!({"algorithm": "sync", "innerOptimizer": {"algorithm": "sgd"}}))],
            "optimizer.innerOptimizer",
            "spec.optimizer.innerOptimizer: Invalid value: |innerOptimizer trains local steps: it needs localSteps above 1",
        ),
        (
            &[(
                "spec.optimizer",
                json!({"algorithm": "sync", "localSteps": 5, "innerOptimizer": {"learningRate": 0}}),
            )],
            "optimizer.innerOptimizer.learningRate",
            "spec.optimizer.innerOptimizer.learningRate: Invalid value: |must be > 0",
        ),
        (
            &[("spec.optimizer", json!({"algorithm": "sync", "adaptiveLocalSteps": {"max": 100}}))],
            "optimizer.adaptiveLocalSteps",
            "spec.optimizer.adaptiveLocalSteps: Invalid value: |adaptiveLocalSteps needs localSteps (where workers start) within [min, max]",
        ),
        (
            &[(
                "spec.optimizer",
                json!({"algorithm": "sync", "localSteps": 10, "adaptiveLocalSteps": {"min": 1, "max": 100}}),
            )],
            "optimizer.adaptiveLocalSteps.min",
            "spec.optimizer.adaptiveLocalSteps.min in body should be greater than or equal to 2",
        ),
        (
            &[(
                "spec.optimizer",
                json!({"algorithm": "sync", "localSteps": 10,
                       "adaptiveLocalSteps": {"max": 100, "communicationFraction": 0.0}}),
            )],
            "optimizer.adaptiveLocalSteps.communicationFraction",
            "spec.optimizer.adaptiveLocalSteps.communicationFraction: Invalid value: |must be in (0, 1]",
        ),
        (
            &[("spec.optimizer.localSteps", json!(0))],
            "optimizer.localSteps",
            "spec.optimizer.localSteps in body should be greater than or equal to 1",
        ),
        (
            &[("spec.optimizer.momentum", json!(1.0))],
            "optimizer.momentum",
            "spec.optimizer.momentum: Invalid value: |must be in [0, 1)",
        ),
        (&[("spec.optimizer.momentum", json!(-0.5))], "optimizer.momentum", "must be in [0, 1)"),
        (
            &[("spec.optimizer.weightDecay", json!(-0.1))],
            "optimizer.weightDecay",
            "spec.optimizer.weightDecay: Invalid value: |must be ≥ 0",
        ),
        (
            &[("spec.optimizer.parameterGroups", json!([{"names": ["bias$"], "learningRateScale": 0}]))],
            "optimizer.parameterGroups",
            "spec.optimizer.parameterGroups[0].learningRateScale: Invalid value: |must be > 0",
        ),
        (
            &[("spec.optimizer.parameterGroups", json!([{"names": [], "weightDecay": 0}]))],
            "optimizer.parameterGroups",
            "spec.optimizer.parameterGroups[0].names: Invalid value: |should have at least 1 items",
        ),
        (
            &[("spec.workers.replicas", json!(0))],
            "workers.replicas",
            "spec.workers.replicas in body should be greater than or equal to 1",
        ),
        (
            &[("spec.workers.replicas", json!(1025))],
            "workers.replicas",
            "spec.workers.replicas in body should be less than or equal to 1024",
        ),
        (
            &[("spec.parameterServer.checkpoint.intervalSeconds", json!(0))],
            "parameterServer.checkpoint.intervalSeconds",
            "spec.parameterServer.checkpoint.intervalSeconds in body should be greater than or equal to 1",
        ),
        (
            &[("spec.parameterServer.checkpoint.storage", json!("lots"))],
            "parameterServer.checkpoint.storage",
            "spec.parameterServer.checkpoint.storage: Invalid value: |must be a quantity > 0",
        ),
        (
            &[("spec.parameterServer.checkpoint.storage", json!("0Gi"))],
            "parameterServer.checkpoint.storage",
            "must be a quantity > 0",
        ),
        (
            &[("spec.runPolicy.activeDeadlineSeconds", json!(0))],
            "runPolicy.activeDeadlineSeconds",
            "spec.runPolicy.activeDeadlineSeconds in body should be greater than or equal to 1",
        ),
        (&[("spec.workers", Value::Null)], "", "spec.workers: Required value"),
        (
            &[("spec.workers.pod.env", json!([{"name": "FORESIGHT_PS_URL", "value": "http://elsewhere"}]))],
            "workers.pod.env",
            "spec.workers.pod.env: Invalid value: |names starting with FORESIGHT_ are set by the operator",
        ),
        (
            &[("spec.parameterServer.pod.labels", json!({"foresight.dev/job": "other"}))],
            "parameterServer.pod.labels",
            "spec.parameterServer.pod.labels: Invalid value: |are set by the operator",
        ),
        (
            &[("spec.workers.pod.volumes", json!([{"name": "checkpoints", "emptyDir": {}}]))],
            "workers.pod.volumes",
            "spec.workers.pod.volumes: Invalid value: |the operator's volume names",
        ),
        // The TLS volumes and the shard label: the API server used to take these, and the
        // operator then failed the job as InvalidSpec.
        (
            &[("spec.workers.pod.volumes", json!([{"name": "ps-ca", "emptyDir": {}}]))],
            "workers.pod.volumes",
            "spec.workers.pod.volumes: Invalid value: |ps-tls, ps-ca are the operator's volume names",
        ),
        (
            &[
                ("spec.workers.pod.volumes", json!([{"name": "certs", "emptyDir": {}}])),
                (
                    "spec.workers.pod.volumeMounts",
                    json!([{"name": "certs", "mountPath": "/etc/foresight/tls"}]),
                ),
            ],
            "workers.pod.volumeMounts",
            "/etc/foresight/tls, /etc/foresight/ps-ca are mounted by the operator",
        ),
        (
            &[("spec.workers.pod.labels", json!({"foresight.dev/ps-shard": "0"}))],
            "workers.pod.labels",
            "spec.workers.pod.labels: Invalid value: |foresight.dev/ps-shard are set by the operator",
        ),
        (
            &[("spec.workers.pod.volumeMounts", json!([{"name": "cache", "mountPath": "/cache"}]))],
            "workers.pod.volumeMounts",
            "spec.workers.pod.volumeMounts: Invalid value: |must name a volume of this pod block's volumes",
        ),
        (
            &[
                ("spec.parameterServer.pod.volumes", json!([{"name": "scratch", "emptyDir": {}}])),
                (
                    "spec.parameterServer.pod.volumeMounts",
                    json!([{"name": "scratch", "mountPath": "/checkpoints"}]),
                ),
            ],
            "parameterServer.pod.volumeMounts",
            "/tmp, /checkpoints, /output, /etc/foresight/tls, /etc/foresight/ps-ca are mounted by the operator",
        ),
        (
            &[
                ("spec.dataset.volume", json!({"name": "d", "persistentVolumeClaim": {"claimName": "data"}})),
                ("spec.workers.pod.volumes", json!([{"name": "cache", "emptyDir": {}}])),
                ("spec.workers.pod.volumeMounts", json!([{"name": "cache", "mountPath": "/data/mnist"}])),
            ],
            "workers.pod.volumeMounts",
            "spec.workers.pod.volumeMounts: Invalid value: |the dataset's volume is mounted at dataset.path",
        ),
        (
            &[("spec.workers.pod.serviceAccountName", json!("Data_Reader"))],
            "workers.pod.serviceAccountName",
            "spec.workers.pod.serviceAccountName: Invalid value: |must be a ServiceAccount name",
        ),
        (
            &[("spec.workers.pod.runtimeClassName", json!("Kata_QEMU"))],
            "workers.pod.runtimeClassName",
            "spec.workers.pod.runtimeClassName: Invalid value: |must be a RuntimeClass name",
        ),
        (
            &[("spec.parameterServer.pod.schedulerName", json!("-volcano"))],
            "parameterServer.pod.schedulerName",
            "spec.parameterServer.pod.schedulerName: Invalid value: |must be a scheduler name",
        ),
        (
            &[("spec.workers.pod.securityContext", json!({"runAsUser": 0}))],
            "workers.pod.securityContext",
            "spec.workers.pod.securityContext.runAsUser in body should be greater than or equal to 1",
        ),
        (
            &[("spec.workers.pod.securityContext", json!({"supplementalGroups": [5000, 0]}))],
            "workers.pod.securityContext",
            "spec.workers.pod.securityContext.supplementalGroups: Invalid value: |never root's",
        ),
        (
            &[("spec.parameterServer.pod.tmpSizeLimit", json!("big"))],
            "parameterServer.pod.tmpSizeLimit",
            "spec.parameterServer.pod.tmpSizeLimit: Invalid value: |must be a quantity > 0",
        ),
        (
            &[("spec.workers.pod.initContainers", json!([{"name": "worker", "image": "busybox"}]))],
            "workers.pod.initContainers",
            "spec.workers.pod.initContainers: Invalid value: |the operator's container names",
        ),
        (
            &[("spec.parameterServer.pod.initContainers", json!([{"name": "fetch"}]))],
            "parameterServer.pod.initContainers",
            "spec.parameterServer.pod.initContainers: Invalid value: |needs an image",
        ),
        (
            &[(
                "spec.workers.pod.initContainers",
                json!([{"name": "shipper", "image": "fluent-bit", "restartPolicy": "OnFailure"}]),
            )],
            "workers.pod.initContainers",
            "spec.workers.pod.initContainers: Invalid value: |may only be Always",
        ),
        (
            &[(
                "spec.workers.pod.initContainers",
                json!([{"name": "fetch", "image": "a"}, {"name": "fetch", "image": "b"}]),
            )],
            "workers.pod.initContainers",
            "spec.workers.pod.initContainers[1]: Duplicate value",
        ),
        (
            &[("spec.workers.gpuResource", json!("gpu"))],
            "workers.gpuResource",
            "spec.workers.gpuResource: Invalid value: |must be an extended resource name with a domain",
        ),
        (
            &[
                ("spec.workers.nodeSelector", json!({"a": "b"})),
                ("spec.workers.pod.nodeSelector", json!({"c": "d"})),
            ],
            "workers.nodeSelector",
            "spec.workers.nodeSelector: Invalid value: |not both",
        ),
    ];
    let mut failures = Vec::new();
    for (i, (changes, field, message)) in cases.iter().enumerate() {
        let mut obj = minimal(&format!("bad-{i}"));
        for (path, value) in changes.iter() {
            set(&mut obj, path, value.clone());
        }
        let out = cp.kubectl(&["create", "--dry-run=server", "-n", &ns, "-f", "-"], Some(&yaml(&obj)));
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() || !message.split('|').all(|m| stderr.contains(m)) {
            failures.push(format!(
                "{changes:?}: expected a refusal containing {message:?}, got {}: {stderr}",
                out.status
            ));
        }
        // The Rust rules agree (an empty field: serde itself refuses the object).
        match serde_json::from_value::<TrainingJob>(obj) {
            Ok(job) => {
                let errs = validate(&job.spec).err().unwrap_or_default();
                if field.is_empty() || !errs.iter().any(|e| e.field == *field) {
                    failures.push(format!("{changes:?}: validate() should name {field:?}, got {errs:?}"));
                }
            }
            Err(e) if !field.is_empty() => failures.push(format!("{changes:?}: serde refused it: {e}")),
            Err(_) => {}
        }
    }
    // And a valid object with every optional field set is accepted by both.
    let mut full = minimal("full");
    set(&mut full, "spec.dataset.holdout", json!(0.2));
    set(&mut full, "spec.training.lrDecay", json!({"factor": 0.1, "milestones": [0, 80, 120.5]}));
    set(
        &mut full,
        "spec.optimizer",
        json!({"algorithm": "dc-asgd-a", "lambda0": 0, "meanSquareDecay": 0, "maxStaleness": 0,
               "momentum": 0, "weightDecay": 0, "pullEvery": 6, "pushEvery": 3,
               "parameterGroups": [{"names": ["bias$", "norm"], "weightDecay": 0},
                                   {"names": ["^embed\\."], "learningRateScale": 0.1}]}),
    );
    set(&mut full, "spec.parameterServer.checkpoint", json!({"intervalSeconds": 1, "storage": "1Gi"}));
    set(&mut full, "spec.runPolicy", json!({"backoffLimit": 0, "activeDeadlineSeconds": 1, "suspend": true}));
    set(&mut full, "spec.workers", json!({"replicas": 1024, "minReplicas": 512, "gpus": 0}));
    set(&mut full, "spec.output", json!({"claimName": "models.v1", "path": "mnist/run-1"}));
    let pod = json!({
        "labels": {"team": "ml"}, "annotations": {"example.com/owner": "ml"},
        "nodeSelector": {"pool": "training"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "training", "effect": "NoSchedule"}],
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1,
            "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                "labelSelector": {"matchLabels": {"team": "ml"}}}}]}},
        "priorityClassName": "training-high", "serviceAccountName": "data-reader",
        "automountServiceAccountToken": true, "imagePullSecrets": [{"name": "registry"}],
        "env": [{"name": "BUCKET", "value": "s3://b"}], "envFrom": [{"secretRef": {"name": "creds"}}],
        "volumes": [{"name": "cache", "emptyDir": {}}], "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                       "whenUnsatisfiable": "ScheduleAnyway",
                                       "labelSelector": {"matchLabels": {"team": "ml"}}}],
        "runtimeClassName": "nvidia", "schedulerName": "volcano", "tmpSizeLimit": "2Gi",
        "securityContext": {"runAsUser": 2000, "runAsGroup": 2000, "fsGroup": 3000, "supplementalGroups": [5000]},
        "initContainers": [
            {"name": "fetch", "image": "busybox", "command": ["sh", "-c", "true"],
             "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]},
            {"name": "shipper", "image": "fluent-bit", "restartPolicy": "Always",
             "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]}
        ]
    });
    set(&mut full, "spec.parameterServer.pod", pod.clone());
    set(&mut full, "spec.workers.pod", pod);
    set(&mut full, "spec.workers.gpuResource", json!("amd.com/gpu"));
    let out = cp.kubectl(&["create", "--dry-run=server", "-n", &ns, "-f", "-"], Some(&yaml(&full)));
    if !out.status.success() {
        failures.push(format!("the full object was refused: {}", String::from_utf8_lossy(&out.stderr)));
    }
    validate(&serde_json::from_value::<TrainingJob>(full).unwrap().spec).unwrap();
    println!("{} bad objects, each refused by both", cases.len());
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn what_a_running_job_depends_on_cannot_change_and_its_workers_template_only_while_suspended() {
    let cp = control_plane();
    let ns = cp.namespace("immutable");
    let mut obj = minimal("fixed");
    set(&mut obj, "spec.optimizer", json!({"algorithm": "dc-asgd-a", "lambda0": 2}));
    cp.kubectl_ok(&["apply", "-n", &ns, "-f", "-"], Some(&yaml(&obj)));
    let old: TrainingJob = serde_json::from_value(obj.clone()).unwrap();
    let apply = |changed: &Value| {
        let out = cp.kubectl(&["apply", "-n", &ns, "-f", "-"], Some(&yaml(changed)));
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };

    let template = "change only with runPolicy.suspend: true";
    let refusals: &[(&str, Value, &str)] = &[
        (
            "spec.optimizer",
            json!({"algorithm": "asgd"}),
            "spec.optimizer.algorithm: Invalid value: |algorithm cannot change after the job is created",
        ),
        (
            "spec.model",
            json!({"name": "resnet20"}),
            "spec.model: Invalid value: |model cannot change after the job is created",
        ),
        (
            "spec.model",
            json!({"torchscript": {"path": "/data/m.pt"}}),
            "model cannot change after the job is created",
        ),
        ("spec.dataset.path", json!("/data/other"), "spec.dataset: Invalid value: |dataset cannot change"),
        (
            "spec.training.batchSize",
            json!(128),
            "spec.training: Invalid value: |training.batchSize and training.seed",
        ),
        ("spec.training.seed", json!(7), "training.batchSize and training.seed cannot change"),
        (
            "spec.parameterServer.checkpoint.storage",
            json!("1Gi"),
            "spec.parameterServer: Invalid value: |checkpoint.storage cannot change",
        ),
        (
            "spec.parameterServer.replicas",
            json!(2),
            "spec.parameterServer: Invalid value: |parameterServer.replicas cannot change",
        ),
        ("spec.output", json!({"storage": "1Gi"}), "spec.output: Invalid value: |output cannot change"),
        ("spec.workers.image", json!("worker:2"), template),
        ("spec.workers.gpus", json!(1), template),
        ("spec.workers.nodeSelector", json!({"pool": "gpu"}), template),
        ("spec.workers.tolerations", json!([{"key": "gpu", "operator": "Exists"}]), template),
        ("spec.workers.resources", json!({"limits": {"cpu": "2"}}), template),
        ("spec.training.epochs", json!(20), template),
        ("spec.optimizer.pushEvery", json!(2), template),
    ];
    for (path, value, message) in refusals {
        let mut changed = obj.clone();
        set(&mut changed, path, value.clone());
        let (ok, stderr) = apply(&changed);
        assert!(!ok && message.split('|').all(|m| stderr.contains(m)), "{path}={value}: {stderr}");
        let new: TrainingJob = serde_json::from_value(changed).unwrap();
        let errs = validate_update(&old.spec, &new.spec).unwrap_err();
        // The template rule names `workers` for all its fields, as the CRD's rule does.
        let field = if *message == template { "workers" } else { path.trim_start_matches("spec.") };
        assert!(
            errs.iter().any(|e| field.starts_with(&e.field) || e.field.starts_with(field)),
            "{path}: {errs:?}"
        );
    }
    // Scaling and the parameter server's settings change at any time.
    let mut changed = obj.clone();
    set(&mut changed, "spec.optimizer.lambda0", json!(1));
    set(&mut changed, "spec.training.learningRate", json!(0.05));
    set(&mut changed, "spec.workers.replicas", json!(8));
    let (ok, stderr) = apply(&changed);
    assert!(ok, "{stderr}");
    validate_update(&old.spec, &serde_json::from_value::<TrainingJob>(changed.clone()).unwrap().spec)
        .unwrap();
    // The workers' template changes with the suspension, and stays while resuming.
    set(&mut changed, "spec.runPolicy.suspend", json!(true));
    set(&mut changed, "spec.workers.image", json!("worker:2"));
    set(&mut changed, "spec.training.epochs", json!(20));
    let (ok, stderr) = apply(&changed);
    assert!(ok, "{stderr}");
    validate_update(&old.spec, &serde_json::from_value::<TrainingJob>(changed.clone()).unwrap().spec)
        .unwrap();
    set(&mut changed, "spec.runPolicy.suspend", json!(false));
    let (ok, stderr) = apply(&changed);
    assert!(ok, "{stderr}");
    let got = cp.kubectl_ok(
        &["get", "tj", "fixed", "-n", &ns, "-o", "jsonpath={.spec.training.epochs} {.spec.workers.image}"],
        None,
    );
    assert_eq!(got, "20 worker:2");
}

/// A job that names no rule gets dc-asgd-a, or asgd with local steps (the server stores no
/// default: it depends on `localSteps`), and its rule stays frozen however it was chosen.
#[test]
fn an_unnamed_rule_follows_local_steps_and_never_changes() {
    let cp = control_plane();
    let ns = cp.namespace("unnamed-rule");
    let obj = minimal("unnamed");
    cp.kubectl_ok(&["apply", "-n", &ns, "-f", "-"], Some(&yaml(&obj)));
    let stored =
        cp.kubectl_ok(&["get", "tj", "unnamed", "-n", &ns, "-o", "jsonpath={.spec.optimizer}"], None);
    assert_eq!(serde_json::from_str::<Value>(&stored).unwrap(), json!({"pullEvery": 1, "pushEvery": 1}));
    let apply = |changed: &Value| {
        let out = cp.kubectl(&["apply", "-n", &ns, "-f", "-"], Some(&yaml(changed)));
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };

    // Local steps would turn the running dc-asgd-a into asgd: refused, by both checks.
    let mut local = obj.clone();
    set(&mut local, "spec.runPolicy.suspend", json!(true));
    set(&mut local, "spec.optimizer.localSteps", json!(10));
    let (ok, stderr) = apply(&local);
    assert!(!ok && stderr.contains("spec.optimizer.algorithm: Invalid value"), "{stderr}");
    assert!(stderr.contains("name the job's algorithm to change localSteps across 1"), "{stderr}");
    let old: TrainingJob = serde_json::from_value(obj.clone()).unwrap();
    let new: TrainingJob = serde_json::from_value(local.clone()).unwrap();
    let errs = validate_update(&old.spec, &new.spec).unwrap_err();
    assert_eq!(errs.iter().map(|e| e.field.as_str()).collect::<Vec<_>>(), ["optimizer.algorithm"]);
    // Naming the rule it has keeps it.
    set(&mut local, "spec.optimizer.algorithm", json!("dc-asgd-a"));
    let (ok, stderr) = apply(&local);
    assert!(ok, "{stderr}");

    // A λ0 for local steps without a named rule: asgd takes none.
    let mut lambda = minimal("unnamed-lambda");
    set(&mut lambda, "spec.optimizer", json!({"localSteps": 10, "lambda0": 2}));
    let out = cp.kubectl(&["create", "--dry-run=server", "-n", &ns, "-f", "-"], Some(&yaml(&lambda)));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("spec.optimizer.lambda0: Invalid value"), "{stderr}");
    let job: TrainingJob = serde_json::from_value(lambda).unwrap();
    assert!(validate(&job.spec).unwrap_err().iter().any(|e| e.field == "optimizer.lambda0"));
}
