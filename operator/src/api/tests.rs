use super::*;

fn example() -> TrainingJob {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/mnist-dcasgd.yaml"))
        .unwrap();
    serde_yaml::from_str(&text).unwrap()
}

#[test]
fn the_cluster_example_parses_and_validates() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/mnist-dcasgd-cluster.yaml"
    ))
    .unwrap();
    let jobs: Vec<TrainingJob> = serde_yaml::Deserializer::from_str(&text)
        .map(|doc| serde_yaml::Value::deserialize(doc).unwrap())
        .filter(|v| v["kind"] == "TrainingJob")
        .map(|v| serde_yaml::from_value(v).unwrap())
        .collect();
    assert_eq!(jobs.len(), 1);
    let spec = &jobs[0].spec;
    validate(spec).unwrap();
    assert_eq!(spec.dataset.path, "/data/mnist5k");
    assert!(spec.dataset.volume.is_some());
    assert_eq!(spec.workers.gpus, Some(1));
    // The same training as the local example: only where things live differs.
    assert_eq!(spec.training, example().spec.training);
    assert_eq!(spec.optimizer, example().spec.optimizer);
}

#[test]
fn the_example_parses_and_validates() {
    let job = example();
    assert_eq!(job.metadata.name.as_deref(), Some("mnist-dcasgd"));
    assert_eq!(job.spec.optimizer.algorithm(), Algorithm::DcAsgdA);
    assert_eq!(job.spec.workers.replicas, 4);
    validate(&job.spec).unwrap();
}

/// A gradient accumulated over pushEvery steps on one pulled model: pulls only after pushes.
#[test]
fn pull_and_push_cadences_that_label_gradients_truly_are_accepted() {
    for (algorithm, pull, push) in [
        (Algorithm::DcAsgdA, 4, 2),
        (Algorithm::Asgd, 2, 2),
        (Algorithm::Asgd, 5, 1),
        (Algorithm::Sync, 3, 3),
    ] {
        let mut spec = example().spec;
        spec.optimizer = OptimizerSpec {
            algorithm: Some(algorithm),
            pull_every: pull,
            push_every: push,
            ..Default::default()
        };
        validate(&spec).unwrap_or_else(|e| panic!("{algorithm:?} pull {pull} push {push}: {e:?}"));
    }
}

#[test]
fn defaults_fill_what_is_left_out() {
    let job: TrainingJob = serde_yaml::from_str(
        "apiVersion: foresight.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: x}\n\
         spec: {model: {name: lenet5}, dataset: {format: mnist, path: /data}, workers: {replicas: 2}}",
    )
    .unwrap();
    let s = &job.spec;
    assert_eq!((s.training.epochs, s.training.batch_size, s.training.seed), (10, 64, 1));
    assert_eq!((s.optimizer.algorithm, s.optimizer.algorithm()), (None, Algorithm::DcAsgdA));
    assert_eq!((s.optimizer.pull_every, s.optimizer.push_every), (1, 1));
    validate(s).unwrap();
}

/// Each rule refuses what it should, naming the field.
#[test]
fn every_rule_names_its_field() {
    type Mutate = fn(&mut TrainingJobSpec);
    let cases: &[(&str, Mutate)] = &[
        ("model", |s| s.model.torchscript = Some(TorchScriptModel { path: "m.pt".into() })),
        ("model", |s| s.model.name = None),
        ("model.torchscript.path", |s| {
            s.model = ModelSpec { name: None, torchscript: Some(TorchScriptModel { path: " ".into() }) }
        }),
        ("dataset.path", |s| s.dataset.path.clear()),
        ("dataset.holdout", |s| s.dataset.holdout = Some(1.0)),
        ("training.epochs", |s| s.training.epochs = 0),
        ("training.batchSize", |s| s.training.batch_size = 0),
        ("training.learningRate", |s| s.training.learning_rate = 0.0),
        ("training.learningRate", |s| s.training.learning_rate = f64::NAN),
        ("training.lrDecay.factor", |s| {
            s.training.lr_decay = Some(LrDecay { factor: 1.5, milestones: vec![] })
        }),
        ("training.lrDecay.milestones", |s| {
            s.training.lr_decay = Some(LrDecay { factor: 0.1, milestones: vec![20.0, 10.0] })
        }),
        ("training.lrWarmupEpochs", |s| s.training.lr_warmup_epochs = Some(-1.0)),
        ("optimizer.lambda0", |s| {
            s.optimizer.algorithm = Some(Algorithm::Asgd);
            s.optimizer.mean_square_decay = None;
        }),
        ("optimizer.lambda0", |s| s.optimizer.lambda0 = Some(-1.0)),
        // Unnamed, the rule of local steps is asgd, which takes no λ0.
        ("optimizer.lambda0", |s| {
            (s.optimizer.algorithm, s.optimizer.mean_square_decay) = (None, None);
            s.optimizer.local_steps = Some(10);
        }),
        ("optimizer.meanSquareDecay", |s| s.optimizer.mean_square_decay = Some(1.0)),
        ("optimizer.meanSquareDecay", |s| {
            s.optimizer.algorithm = Some(Algorithm::DcAsgdC);
        }),
        ("optimizer.pullEvery", |s| s.optimizer.pull_every = 0),
        ("optimizer.pushEvery", |s| s.optimizer.push_every = 0),
        ("optimizer.pullEvery", |s| (s.optimizer.pull_every, s.optimizer.push_every) = (3, 2)),
        ("optimizer.pullEvery", |s| (s.optimizer.pull_every, s.optimizer.push_every) = (1, 4)),
        ("optimizer.pullEvery", |s| {
            s.optimizer =
                OptimizerSpec { algorithm: Some(Algorithm::Sync), pull_every: 2, ..Default::default() }
        }),
        ("optimizer.momentum", |s| s.optimizer.momentum = Some(1.0)),
        ("optimizer.nesterov", |s| s.optimizer.nesterov = Some(true)),
        ("optimizer.momentumDelay", |s| s.optimizer.momentum_delay = Some(0)),
        ("optimizer.momentumDelay", |s| s.optimizer.momentum_delay = Some(4)),
        ("optimizer.momentumDelay", |s| {
            s.optimizer = OptimizerSpec {
                algorithm: Some(Algorithm::Sync),
                momentum: Some(0.9),
                momentum_delay: Some(4),
                ..Default::default()
            }
        }),
        ("optimizer.localSteps", |s| s.optimizer.local_steps = Some(0)),
        ("optimizer.innerOptimizer", |s| s.optimizer.inner_optimizer = Some(inner(0.001))),
        ("optimizer.innerOptimizer.learningRate", |s| {
            (s.optimizer.local_steps, s.optimizer.inner_optimizer) = (Some(10), Some(inner(0.0)))
        }),
        ("optimizer.localSteps", |s| {
            (s.optimizer.local_steps, s.optimizer.pull_every, s.optimizer.push_every) = (Some(10), 2, 2)
        }),
        ("optimizer.adaptiveLocalSteps", |s| s.optimizer.adaptive_local_steps = Some(adaptive(2, 100, None))),
        ("optimizer.adaptiveLocalSteps", |s| {
            (s.optimizer.local_steps, s.optimizer.adaptive_local_steps) =
                (Some(10), Some(adaptive(20, 100, None)))
        }),
        ("optimizer.adaptiveLocalSteps", |s| {
            (s.optimizer.local_steps, s.optimizer.adaptive_local_steps) =
                (Some(200), Some(adaptive(2, 100, None)))
        }),
        ("optimizer.adaptiveLocalSteps.min", |s| {
            (s.optimizer.local_steps, s.optimizer.adaptive_local_steps) =
                (Some(10), Some(adaptive(1, 100, None)))
        }),
        ("optimizer.adaptiveLocalSteps.communicationFraction", |s| {
            (s.optimizer.local_steps, s.optimizer.adaptive_local_steps) =
                (Some(10), Some(adaptive(2, 100, Some(0.0))))
        }),
        ("optimizer.adaptiveLocalSteps.communicationFraction", |s| {
            (s.optimizer.local_steps, s.optimizer.adaptive_local_steps) =
                (Some(10), Some(adaptive(2, 100, Some(1.5))))
        }),
        ("optimizer.weightDecay", |s| s.optimizer.weight_decay = Some(-0.1)),
        ("optimizer.parameterGroups", |s| s.optimizer.parameter_groups = Some(vec![group(&["(bias"])])),
        ("optimizer.parameterGroups", |s| {
            s.optimizer.parameter_groups =
                Some(vec![ParameterGroupSpec { learning_rate_scale: Some(0.0), ..group(&["x"]) }])
        }),
        ("optimizer.backupWorkers", |s| s.optimizer.backup_workers = Some(1)),
        ("optimizer.backupWorkers", |s| {
            s.optimizer = OptimizerSpec {
                algorithm: Some(Algorithm::Sync),
                backup_workers: Some(4),
                ..Default::default()
            };
            s.workers.replicas = 4;
        }),
        ("optimizer.syncRoundTimeoutSeconds", |s| s.optimizer.sync_round_timeout_seconds = Some(30)),
        ("optimizer.syncRoundTimeoutSeconds", |s| {
            s.optimizer = OptimizerSpec { algorithm: Some(Algorithm::Sync), ..Default::default() };
            s.optimizer.sync_round_timeout_seconds = Some(0);
        }),
        ("workers.replicas", |s| s.workers.replicas = 0),
        ("workers.replicas", |s| s.workers.replicas = 1025),
        ("parameterServer.checkpoint.storage", |s| {
            s.parameter_server.checkpoint =
                Some(CheckpointSpec { interval_seconds: None, storage: Some("1 Gi".into()) })
        }),
        ("parameterServer.checkpoint.storage", |s| {
            s.parameter_server.checkpoint =
                Some(CheckpointSpec { interval_seconds: None, storage: Some("0.0".into()) })
        }),
        ("parameterServer.checkpoint.intervalSeconds", |s| {
            s.parameter_server.checkpoint = Some(CheckpointSpec { interval_seconds: Some(0), storage: None })
        }),
        ("runPolicy.activeDeadlineSeconds", |s| s.run_policy.active_deadline_seconds = Some(0)),
        ("output", |s| s.output = Some(OutputSpec::default())),
        ("workers.minReplicas", |s| s.workers.min_replicas = Some(5)),
        ("optimizer.algorithm", |s| {
            s.optimizer = OptimizerSpec { algorithm: Some(Algorithm::Sync), ..Default::default() };
            s.parameter_server.replicas = Some(2);
        }),
        ("optimizer.maxStaleness", |s| {
            s.optimizer = OptimizerSpec { max_staleness: Some(4), ..Default::default() };
            s.parameter_server.replicas = Some(3);
        }),
        ("workers.minReplicas", |s| {
            s.optimizer = OptimizerSpec { algorithm: Some(Algorithm::Sync), ..Default::default() };
            s.workers.min_replicas = Some(2);
        }),
        ("output.claimName", |s| {
            s.output = Some(OutputSpec { claim_name: Some("-models".into()), ..Default::default() })
        }),
        ("parameterServer.resources", |s| {
            let q = k8s_openapi::apimachinery::pkg::api::resource::Quantity("1".into());
            s.parameter_server.resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
                limits: Some([("memory".into(), q.clone()), ("nvidia.com/gpu".into(), q)].into()),
                ..Default::default()
            });
        }),
        ("output.storage", |s| {
            s.output = Some(OutputSpec { storage: Some("1 Gi".into()), ..Default::default() })
        }),
        ("output.path", |s| {
            s.output = Some(OutputSpec {
                claim_name: Some("models".into()),
                path: Some("/abs".into()),
                ..Default::default()
            })
        }),
    ];
    for (field, mutate) in cases {
        let mut spec = example().spec;
        mutate(&mut spec);
        let errs = validate(&spec).expect_err(field);
        assert!(errs.iter().any(|e| e.field == *field), "{field}: {errs:?}");
        assert!(errs.iter().all(|e| !e.message.is_empty()));
    }
}

fn adaptive(min: u32, max: u32, communication_fraction: Option<f64>) -> AdaptiveLocalStepsSpec {
    AdaptiveLocalStepsSpec { min, max, communication_fraction }
}

/// The PS is told the bounds; the workers' environment is the same with or without them (they
/// learn their steps from the PS), so adding them does not change the worker template.
#[test]
fn adaptive_local_steps_reach_the_ps_only() {
    let mut spec = example().spec;
    spec.optimizer.local_steps = Some(50);
    let workers_before = worker_env(&spec, "j", "ns", "http://ps");
    spec.optimizer.adaptive_local_steps = Some(adaptive(5, 500, Some(0.05)));
    validate(&spec).unwrap();
    assert_eq!(worker_env(&spec, "j", "ns", "http://ps"), workers_before);
    let ps: std::collections::HashMap<_, _> = ps_env(&spec, "j", "ns").into_iter().collect();
    let got = ["FORESIGHT_LOCAL_STEPS", "FORESIGHT_LOCAL_STEPS_MIN", "FORESIGHT_LOCAL_STEPS_MAX"]
        .map(|k| ps[k].as_str());
    assert_eq!(got, ["50", "5", "500"]);
    assert_eq!(ps["FORESIGHT_COMMUNICATION_FRACTION"], "0.05");
    spec.optimizer.adaptive_local_steps = None;
    assert!(ps_env(&spec, "j", "ns").iter().all(|(k, _)| !k.starts_with("FORESIGHT_LOCAL_STEPS")));
}

fn inner(learning_rate: f64) -> InnerOptimizerSpec {
    InnerOptimizerSpec { algorithm: InnerAlgorithm::AdamW, learning_rate, weight_decay: None }
}

fn group(names: &[&str]) -> ParameterGroupSpec {
    ParameterGroupSpec {
        names: names.iter().map(|n| n.to_string()).collect(),
        weight_decay: Some(0.0),
        learning_rate_scale: None,
    }
}

#[test]
fn environment_carries_the_job() {
    let mut spec = example().spec;
    spec.training.lr_decay = Some(LrDecay { factor: 0.1, milestones: vec![80.0, 120.0] });
    spec.training.lr_warmup_epochs = Some(1.5);
    spec.optimizer.max_staleness = Some(8);
    let ps: std::collections::HashMap<_, _> = ps_env(&spec, "j", "ns").into_iter().collect();
    assert_eq!(ps["FORESIGHT_ALGORITHM"], "dc-asgd-a");
    assert_eq!(ps["FORESIGHT_WORKERS"], "4");
    let mut local = spec.clone();
    (local.optimizer.algorithm, local.optimizer.local_steps) = (None, Some(10));
    let ps_local: std::collections::HashMap<_, _> = ps_env(&local, "j", "ns").into_iter().collect();
    assert_eq!(ps_local["FORESIGHT_ALGORITHM"], "asgd", "the default rule of local steps");
    let mut grouped = spec.clone();
    grouped.optimizer.parameter_groups = Some(vec![group(&["bias$", "norm"])]);
    let ps_grouped: std::collections::HashMap<_, _> = ps_env(&grouped, "j", "ns").into_iter().collect();
    assert_eq!(ps_grouped["FORESIGHT_PARAMETER_GROUPS"], r#"[{"names":["bias$","norm"],"weightDecay":0.0}]"#);
    assert!(!ps.contains_key("FORESIGHT_PARAMETER_GROUPS"), "none without groups");
    assert_eq!(ps["FORESIGHT_LAMBDA0"], "2");
    assert_eq!(ps["FORESIGHT_LR_MILESTONES"], "80,120");
    assert_eq!(ps["FORESIGHT_LR_WARMUP_EPOCHS"], "1.5");
    assert_eq!(ps["FORESIGHT_MAX_STALENESS"], "8");
    assert_eq!(ps["FORESIGHT_JOB_NAME"], "j");
    let w: std::collections::HashMap<_, _> =
        worker_env(&spec, "j", "ns", "http://ps:8080").into_iter().collect();
    assert_eq!(w["FORESIGHT_PS_URL"], "http://ps:8080");
    assert_eq!(w["FORESIGHT_MODEL"], "lenet5");
    assert_eq!(w["FORESIGHT_DATASET_FORMAT"], "csv");
    assert_eq!(w["FORESIGHT_EPOCHS"], "12");
    assert!(!w.contains_key("FORESIGHT_WORKERS"), "a worker learns the count from the PS");
    assert!(!w.contains_key("FORESIGHT_LOCAL_STEPS") && !ps.contains_key("FORESIGHT_NESTEROV"));
    assert!(!w.contains_key("FORESIGHT_GRAD_DTYPE"), "absent: the worker's default, f32");
    assert!(!w.contains_key("FORESIGHT_PULL_DTYPE"), "absent: the worker's default, f32");
    (spec.optimizer.local_steps, spec.optimizer.momentum, spec.optimizer.nesterov) =
        (Some(50), Some(0.9), Some(true));
    spec.optimizer.gradient_dtype = serde_json::from_value(serde_json::json!("int8")).unwrap();
    spec.optimizer.pull_dtype = serde_json::from_value(serde_json::json!("bf16")).unwrap();
    let w: std::collections::HashMap<_, _> = worker_env(&spec, "j", "ns", "http://ps").into_iter().collect();
    let ps: std::collections::HashMap<_, _> = ps_env(&spec, "j", "ns").into_iter().collect();
    assert_eq!((w["FORESIGHT_LOCAL_STEPS"].as_str(), ps["FORESIGHT_NESTEROV"].as_str()), ("50", "true"));
    assert!(!ps.contains_key("FORESIGHT_MOMENTUM_DELAY"));
    spec.optimizer.momentum_delay = Some(4);
    let ps: std::collections::HashMap<_, _> = ps_env(&spec, "j", "ns").into_iter().collect();
    assert_eq!(ps["FORESIGHT_MOMENTUM_DELAY"], "4");
    assert_eq!((w["FORESIGHT_GRAD_DTYPE"].as_str(), w["FORESIGHT_PULL_DTYPE"].as_str()), ("int8", "bf16"));
    assert_eq!(ps["FORESIGHT_PULL_DTYPE"], "bf16", "the PS plans a body per pull in flight");
    spec.optimizer.pull_dtype = serde_json::from_value(serde_json::json!("int8")).unwrap();
    let ps: std::collections::HashMap<_, _> = ps_env(&spec, "j", "ns").into_iter().collect();
    assert_eq!(ps["FORESIGHT_PULL_DTYPE"], "int8", "the PS plans a copy per worker");
    assert!(!w.contains_key("FORESIGHT_WORKER_INDEX"), "the index comes from the pod or the runner");
}

#[test]
fn the_crd_describes_the_resource() {
    use kube::CustomResourceExt;
    let crd = TrainingJob::crd();
    assert_eq!(crd.spec.group, "foresight.dev");
    assert_eq!(crd.spec.names.kind, "TrainingJob");
    assert_eq!(crd.spec.names.short_names.as_deref(), Some(&["tj".to_string()][..]));
    assert_eq!(crd.spec.versions[0].name, "v1alpha1");
}

/// `crds/trainingjob.yaml` is what the code generates.
#[test]
fn the_committed_crd_is_what_the_code_generates() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../crds/trainingjob.yaml");
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        committed == crd_yaml(),
        "crds/trainingjob.yaml differs from the CRD the code generates; regenerate it with\n  \
         cargo run -q -p foresight-operator --bin foresight -- crd > crds/trainingjob.yaml"
    );
}

/// Every property of the spec and status schemas has a description (`kubectl explain`), and
/// no property is `nullable` (an explicit null is pruned like an absent field).
#[test]
fn every_field_is_described() {
    fn walk(path: &str, schema: &serde_json::Value, missing: &mut Vec<String>) {
        assert!(schema.get("nullable").is_none(), "{path} is nullable");
        if let Some(props) = schema.get("properties").and_then(|p| p.as_object()) {
            for (name, prop) in props {
                let p = format!("{path}.{name}");
                if prop.get("description").and_then(|d| d.as_str()).is_none_or(str::is_empty) {
                    missing.push(p.clone());
                }
                walk(&p, prop, missing);
            }
        }
        if let Some(items) = schema.get("items") {
            walk(&format!("{path}[]"), items, missing);
        }
    }
    let crd = serde_json::to_value(crd()).unwrap();
    let root = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    let mut missing = Vec::new();
    walk("spec", &root["properties"]["spec"], &mut missing);
    walk("status", &root["properties"]["status"], &mut missing);
    // k8s-openapi's own types (Volume, ResourceRequirements, …) carry upstream's descriptions,
    // except a few leaves upstream leaves undocumented; ours must all be described.
    // Inside the `pod` blocks the upstream types carry none (`pod::trim_schema`).
    let mut upstream: Vec<String> = [
        "spec.dataset.volume.",
        "spec.parameterServer.resources.",
        "spec.workers.resources.",
        "spec.workers.tolerations[].",
    ]
    .map(String::from)
    .into();
    for role in ["parameterServer", "workers"] {
        for field in pod::UPSTREAM_FIELDS {
            upstream.push(format!("spec.{role}.pod.{field}."));
            upstream.push(format!("spec.{role}.pod.{field}[]"));
        }
    }
    let ours: Vec<_> =
        missing.iter().filter(|p| !upstream.iter().any(|prefix| p.starts_with(prefix))).collect();
    assert!(ours.is_empty(), "fields without a description: {ours:?}");
    let columns: Vec<_> = crd["spec"]["versions"][0]["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        columns,
        ["Phase", "Workers", "Ready", "Step", "Reason", "Age", "Algorithm", "Staleness p99", "Epoch", "Loss"]
    );
    assert_eq!(crd["spec"]["versions"][0]["subresources"]["status"], serde_json::json!({}));
    assert_eq!(crd["spec"]["names"]["categories"], serde_json::json!(["foresight"]));
}

#[test]
fn what_a_worker_resumes_from_never_changes_and_its_pod_template_only_while_suspended() {
    let old = example().spec;
    let fields = |new: &TrainingJobSpec| -> Vec<String> {
        validate_update(&old, new).err().unwrap_or_default().into_iter().map(|e| e.field).collect()
    };
    let mut new = old.clone();
    new.workers.replicas = 8;
    new.training.learning_rate *= 2.0;
    new.run_policy.active_deadline_seconds = Some(600);
    assert_eq!(fields(&new), [] as [&str; 0], "scaling and the parameter server's settings may change");

    let mut algo = old.clone();
    algo.optimizer.algorithm = Some(Algorithm::DcAsgdC);
    algo.optimizer.mean_square_decay = None;
    assert_eq!(fields(&algo), ["optimizer.algorithm"]);
    let mut model = old.clone();
    model.model.name = Some(BuiltinModel::Resnet20);
    assert_eq!(fields(&model), ["model"]);
    let mut data = old.clone();
    data.dataset.path = "/elsewhere".into();
    assert_eq!(fields(&data), ["dataset"]);
    let mut seed = old.clone();
    seed.training.seed += 1;
    assert_eq!(fields(&seed), ["training"]);
    let mut storage = old.clone();
    storage.parameter_server.checkpoint =
        Some(CheckpointSpec { interval_seconds: None, storage: Some("1Gi".into()) });
    assert_eq!(fields(&storage), ["parameterServer"]);
    // Suspending does not unfreeze those.
    seed.run_policy.suspend = Some(true);
    assert_eq!(fields(&seed), ["training"]);

    // Without a named rule, localSteps chooses it: crossing 1 would change the running PS's
    // rule, unless the job names the one it has.
    let unnamed = TrainingJobSpec {
        optimizer: OptimizerSpec {
            algorithm: None,
            lambda0: None,
            mean_square_decay: None,
            ..old.optimizer.clone()
        },
        ..old.clone()
    };
    let mut local = unnamed.clone();
    (local.optimizer.local_steps, local.run_policy.suspend) = (Some(10), Some(true));
    let fields_from = |old: &TrainingJobSpec, new: &TrainingJobSpec| -> Vec<String> {
        validate_update(old, new).err().unwrap_or_default().into_iter().map(|e| e.field).collect()
    };
    assert_eq!(fields_from(&unnamed, &local), ["optimizer.algorithm"]);
    local.optimizer.algorithm = Some(Algorithm::DcAsgdA);
    assert_eq!(fields_from(&unnamed, &local), [] as [&str; 0]);
    local.optimizer.local_steps = Some(1);
    assert_eq!(fields_from(&unnamed, &local), [] as [&str; 0], "naming the default changes nothing");

    // The workers' pod template: refused while running, allowed while suspended.
    let changes: [fn(&mut TrainingJobSpec); 6] = [
        |s| s.workers.image = Some("worker:2".into()),
        |s| s.workers.gpus = Some(s.workers.gpus.unwrap_or(0) + 1),
        |s| s.workers.node_selector = Some([("pool".to_string(), "gpu".to_string())].into()),
        |s| s.training.epochs += 10,
        |s| s.optimizer.pull_every += 1,
        |s| (s.optimizer.pull_every, s.optimizer.push_every) = (2, 2),
    ];
    for change in changes {
        let mut new = old.clone();
        change(&mut new);
        assert_eq!(fields(&new), ["workers"], "{new:?}");
        new.run_policy.suspend = Some(true);
        assert_eq!(fields(&new), [] as [&str; 0], "{new:?}");
    }
    let mut pod = old.clone();
    pod.workers.pod = Some(PodSettings { priority_class_name: Some("high".into()), ..Default::default() });
    assert_eq!(fields(&pod), ["workers.pod"]);
    pod.run_policy.suspend = Some(true);
    assert_eq!(fields(&pod), [] as [&str; 0]);
    // Volumes are past what a CEL rule may compare: the operator holds such a change back.
    let mut volumes = old.clone();
    let cache: Volume = serde_json::from_value(serde_json::json!({"name": "cache", "emptyDir": {}})).unwrap();
    volumes.workers.pod = Some(PodSettings { volumes: Some(vec![cache]), ..Default::default() });
    assert_eq!(fields(&volumes), [] as [&str; 0]);
}

#[test]
fn checkpoint_storage_takes_kubernetes_quantities() {
    for good in ["1Gi", "500M", "1.5Ti", "2e9", "0.5", "+3k", "1E3"] {
        let mut spec = example().spec;
        spec.parameter_server.checkpoint =
            Some(CheckpointSpec { interval_seconds: None, storage: Some(good.into()) });
        assert!(validate(&spec).is_ok(), "{good} is a quantity");
    }
}

/// What the TorchScript example's docstring tells users to write is a model the API takes.
#[test]
fn the_torchscript_example_names_the_model_as_the_api_spells_it() {
    let script = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/torchscript/export_model.py"
    ))
    .unwrap();
    let line = script.lines().find(|l| l.trim_start().starts_with("model:")).expect("a model: line");
    let model: serde_yaml::Value = serde_yaml::from_str(line.trim()).unwrap();
    let spec: ModelSpec = serde_yaml::from_value(model["model"].clone()).unwrap();
    assert_eq!(spec.torchscript.map(|t| t.path), Some("/models/out.pt".into()));
}

#[test]
fn a_python_job_runs_its_command_and_names_no_model() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/python/mnist.yaml"))
        .unwrap();
    let job: TrainingJob = serde_yaml::from_str(&text).unwrap();
    validate(&job.spec).unwrap();
    assert_eq!(job.spec.model, ModelSpec::default());
    let env = worker_env(&job.spec, "j", "ns", "http://ps");
    assert!(env.iter().all(|(k, _)| k != "FORESIGHT_MODEL"), "{env:?}");

    let field_of = |spec: &TrainingJobSpec| -> Vec<String> {
        validate(spec).unwrap_err().into_iter().map(|e| e.field).collect()
    };
    let mut with_builtin = job.spec.clone();
    with_builtin.model.name = Some(BuiltinModel::Lenet5);
    assert_eq!(field_of(&with_builtin), ["model"]);
    let mut without_command = job.spec.clone();
    without_command.workers.command = None;
    assert_eq!(field_of(&without_command), ["model"]);
    let mut args_alone = example().spec;
    args_alone.workers.args = Some(vec!["--x".into()]);
    assert_eq!(field_of(&args_alone), ["workers.args"]);
    let mut empty = job.spec.clone();
    empty.workers.command = Some(vec![" ".into()]);
    assert_eq!(field_of(&empty), ["workers.command"]);
}

#[test]
fn the_python_cluster_example_is_the_local_one_with_its_script_mounted() {
    let read = |file: &str| -> TrainingJob {
        let path = format!("{}/../examples/python/{file}", env!("CARGO_MANIFEST_DIR"));
        serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    };
    let (local, cluster) = (read("mnist.yaml"), read("mnist-cluster.yaml"));
    validate(&cluster.spec).unwrap();
    assert_eq!(cluster.spec.training, local.spec.training);
    assert_eq!(cluster.spec.optimizer, local.spec.optimizer);
    assert_eq!(cluster.spec.workers.replicas, local.spec.workers.replicas);
    // The script is the ConfigMap's file, where the pod mounts it.
    let command = cluster.spec.workers.command.clone().unwrap();
    assert_eq!(command, ["python", "/app/mnist.py"]);
    let pod = cluster.spec.workers.pod.clone().unwrap();
    let mount = &pod.volume_mounts.unwrap()[0];
    let volume = pod.volumes.unwrap().into_iter().find(|v| v.name == mount.name).unwrap();
    assert_eq!(
        (mount.mount_path.as_str(), volume.config_map.unwrap().name.as_str()),
        ("/app", "mnist-python")
    );
}

#[test]
fn init_containers_mount_only_volumes_their_roles_pods_have() {
    let mounting = |volume: &str| {
        let c: k8s_openapi::api::core::v1::Container = serde_json::from_value(serde_json::json!({
            "name": "fetch", "image": "busybox", "volumeMounts": [{"name": volume, "mountPath": "/v"}]
        }))
        .unwrap();
        Some(PodSettings { init_containers: Some(vec![c]), ..Default::default() })
    };
    let fields = |spec: &TrainingJobSpec| -> Vec<String> {
        validate(spec).err().unwrap_or_default().into_iter().map(|e| e.field).collect()
    };
    let mut s = example().spec;
    s.workers.pod = mounting("tmp");
    s.parameter_server.pod = mounting("checkpoints");
    assert_eq!(fields(&s), Vec::<String>::new());
    // The workers have no checkpoints, nor a dataset volume unless the job names one; the PS's
    // output volume is its first shard's only.
    s.workers.pod = mounting("checkpoints");
    s.parameter_server.pod = mounting("output");
    assert_eq!(fields(&s), ["workers.pod.initContainers", "parameterServer.pod.initContainers"]);
    s.parameter_server.pod = None;
    s.workers.pod = mounting("dataset");
    assert_eq!(fields(&s), ["workers.pod.initContainers"]);
    s.dataset.volume =
        Some(serde_json::from_value(serde_json::json!({"name": "d", "emptyDir": {}})).unwrap());
    assert_eq!(fields(&s), Vec::<String>::new());
}
