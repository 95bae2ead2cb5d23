use super::*;

fn example() -> TrainingJob {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/mnist-dcasgd.yaml"))
        .unwrap();
    serde_yaml::from_str(&text).unwrap()
}

#[test]
fn the_example_parses_and_validates() {
    let job = example();
    assert_eq!(job.metadata.name.as_deref(), Some("mnist-dcasgd"));
    assert_eq!(job.spec.optimizer.algorithm, Algorithm::DcAsgdA);
    assert_eq!(job.spec.workers.replicas, 4);
    validate(&job.spec).unwrap();
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
    assert_eq!(s.optimizer.algorithm, Algorithm::DcAsgdA);
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
        ("optimizer.lambda0", |s| {
            s.optimizer.algorithm = Algorithm::Asgd;
            s.optimizer.mean_square_decay = None;
        }),
        ("optimizer.lambda0", |s| s.optimizer.lambda0 = Some(-1.0)),
        ("optimizer.meanSquareDecay", |s| s.optimizer.mean_square_decay = Some(1.0)),
        ("optimizer.meanSquareDecay", |s| {
            s.optimizer.algorithm = Algorithm::DcAsgdC;
        }),
        ("optimizer.pullEvery", |s| s.optimizer.pull_every = 0),
        ("optimizer.pushEvery", |s| s.optimizer.push_every = 0),
        ("optimizer.momentum", |s| s.optimizer.momentum = Some(1.0)),
        ("optimizer.weightDecay", |s| s.optimizer.weight_decay = Some(-0.1)),
        ("workers.replicas", |s| s.workers.replicas = 0),
    ];
    for (field, mutate) in cases {
        let mut spec = example().spec;
        mutate(&mut spec);
        let errs = validate(&spec).expect_err(field);
        assert!(errs.iter().any(|e| e.field == *field), "{field}: {errs:?}");
        assert!(errs.iter().all(|e| !e.message.is_empty()));
    }
}

#[test]
fn environment_carries_the_job() {
    let mut spec = example().spec;
    spec.training.lr_decay = Some(LrDecay { factor: 0.1, milestones: vec![80.0, 120.0] });
    spec.optimizer.max_staleness = Some(8);
    let ps: std::collections::HashMap<_, _> = ps_env(&spec, "j", "ns").into_iter().collect();
    assert_eq!(ps["FORESIGHT_ALGORITHM"], "dc-asgd-a");
    assert_eq!(ps["FORESIGHT_WORKERS"], "4");
    assert_eq!(ps["FORESIGHT_LAMBDA0"], "2");
    assert_eq!(ps["FORESIGHT_LR_MILESTONES"], "80,120");
    assert_eq!(ps["FORESIGHT_MAX_STALENESS"], "8");
    assert_eq!(ps["FORESIGHT_JOB_NAME"], "j");
    let w: std::collections::HashMap<_, _> =
        worker_env(&spec, "j", "ns", "http://ps:8080").into_iter().collect();
    assert_eq!(w["FORESIGHT_PS_URL"], "http://ps:8080");
    assert_eq!(w["FORESIGHT_MODEL"], "mlp");
    assert_eq!(w["FORESIGHT_DATASET_FORMAT"], "csv");
    assert_eq!(w["FORESIGHT_EPOCHS"], "5");
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
