use super::*;
use crate::api::{TrainingJob, TrainingJobStatus};
use crate::controller::names::LABEL_JOB;
use std::collections::BTreeSet;

fn job(yaml: &str) -> TrainingJob {
    let mut j: TrainingJob = serde_yaml::from_str(yaml).unwrap();
    j.metadata.namespace = Some("team-a".into());
    j.metadata.uid = Some("uid-1".into());
    j
}

const BASE: &str = r#"
apiVersion: foresight.dev/v1alpha1
kind: TrainingJob
metadata: {name: mnist}
spec:
  model: {name: lenet5}
  dataset:
    format: mnist
    path: /data/mnist
    volume: {name: ignored, persistentVolumeClaim: {claimName: mnist-data}}
  workers: {replicas: 3, gpus: 2, nodeSelector: {gpu: a100}}
  runPolicy: {backoffLimit: 5, activeDeadlineSeconds: 3600}
"#;

fn defaults() -> ChildDefaults {
    ChildDefaults {
        ps_image: "ps:1".into(),
        worker_image: "worker:1".into(),
        ps_tls: false,
        secret_suffix: None,
    }
}

fn env<'a>(c: &'a Container, name: &str) -> &'a EnvVar {
    c.env.as_ref().unwrap().iter().find(|e| e.name == name).unwrap_or_else(|| panic!("no {name}"))
}

#[test]
fn every_child_is_owned_by_the_job_and_labelled() {
    let j = job(BASE);
    let o = Owner::new(&j).unwrap();
    let metas = [
        o.secret(&defaults(), "t", "c").metadata,
        o.ps_service(0, false).metadata,
        o.ps_deployment(&defaults(), 3, 0).metadata,
        o.worker_job(&defaults()).metadata,
    ];
    for m in metas {
        assert_eq!(m.namespace.as_deref(), Some("team-a"));
        let r = &m.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (r.kind.as_str(), r.name.as_str(), r.uid.as_str(), r.controller),
            ("TrainingJob", "mnist", "uid-1", Some(true))
        );
        assert_eq!(m.labels.as_ref().unwrap()[LABEL_JOB], "mnist");
    }
    assert!(o.pvcs().is_empty());
}

#[test]
fn the_worker_job_is_indexed_with_gpus_index_token_and_data() {
    let j = job(BASE);
    let w = Owner::new(&j).unwrap().worker_job(&defaults());
    let s = w.spec.unwrap();
    assert_eq!(s.completion_mode.as_deref(), Some("Indexed"));
    assert_eq!((s.completions, s.parallelism, s.backoff_limit), (Some(3), Some(3), Some(5)));
    assert_eq!((s.active_deadline_seconds, s.suspend), (Some(3600), Some(false)));
    let pod = s.template.spec.unwrap();
    assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
    assert_eq!(pod.node_selector.unwrap()["gpu"], "a100");
    let c = &pod.containers[0];
    assert_eq!(c.image.as_deref(), Some("worker:1"));
    assert_eq!(
        c.resources.as_ref().unwrap().limits.as_ref().unwrap()["nvidia.com/gpu"],
        Quantity("2".into())
    );
    assert_eq!(env(c, "FORESIGHT_PS_URL").value.as_deref(), Some("http://mnist-ps.team-a.svc:8080"));
    assert_eq!(env(c, "FORESIGHT_MODEL").value.as_deref(), Some("lenet5"));
    let token = env(c, "FORESIGHT_TOKEN").value_from.as_ref().unwrap().secret_key_ref.as_ref().unwrap();
    assert_eq!((token.name.as_str(), token.key.as_str()), ("mnist-token-uid-1", "token"));
    assert!(
        !c.env.as_ref().unwrap().iter().any(|e| e.name == "FORESIGHT_CONTROL_TOKEN"),
        "a worker never holds the control token"
    );
    assert!(env(c, "FORESIGHT_WORKER_INDEX").value_from.as_ref().unwrap().field_ref.is_some());
    // The dataset volume is mounted read-only at dataset.path, under a fixed name.
    let data = pod.volumes.unwrap().into_iter().find(|v| v.name == "dataset").unwrap();
    assert_eq!(data.persistent_volume_claim.unwrap().claim_name, "mnist-data");
    let m = c.volume_mounts.as_ref().unwrap().iter().find(|m| m.name == "dataset").unwrap();
    assert_eq!((m.mount_path.as_str(), m.read_only), ("/data/mnist", Some(true)));
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!((sc.read_only_root_filesystem, sc.allow_privilege_escalation), (Some(true), Some(false)));
}

#[test]
fn scaling_changes_completions_and_parallelism_but_no_pod_template() {
    let template = |yaml: &str| {
        let j = job(yaml);
        let o = Owner::new(&j).unwrap();
        let s = o.worker_job(&defaults()).spec.unwrap();
        let ps = o.ps_deployment(&defaults(), 3, 0);
        ((s.completions, s.parallelism), s.template, ps.spec.template)
    };
    let (three, workers3, ps3) = template(BASE);
    let (five, workers5, ps5) = template(&BASE.replace("replicas: 3", "replicas: 5"));
    assert_eq!((three, five), ((Some(3), Some(3)), (Some(5), Some(5))));
    assert_eq!(workers3, workers5, "the workers learn the count from the PS, not from their pod");
    assert_eq!(ps3, ps5, "the PS keeps the count it started with (it is told the new one)");
    let c = &workers3.spec.unwrap().containers[0];
    assert!(c.env.as_ref().unwrap().iter().all(|e| e.name != "FORESIGHT_WORKERS"));
    let j = job(BASE);
    let d = Owner::new(&j).unwrap().ps_deployment(&defaults(), 7, 0);
    assert_eq!(ps_workers_of(&d), Some(7));
}

#[test]
fn no_gpus_means_no_gpu_limit_and_no_resources_block() {
    let j = job(&BASE.replace("gpus: 2", "gpus: 0"));
    let w = Owner::new(&j).unwrap().worker_job(&defaults());
    assert!(w.spec.unwrap().template.spec.unwrap().containers[0].resources.is_none());
}

#[test]
fn the_parameter_server_gets_its_settings_and_a_pvc_only_when_asked() {
    let j = job(&format!(
        "{BASE}  parameterServer: {{image: my/ps:2, checkpoint: {{intervalSeconds: 30, storage: 2Gi}}}}\n"
    ));
    let o = Owner::new(&j).unwrap();
    let d = o.ps_deployment(&defaults(), 3, 0);
    let pod = d.spec.template.spec.unwrap();
    let c = &pod.containers[0];
    assert_eq!(c.image.as_deref(), Some("my/ps:2"));
    for (var, key) in [("FORESIGHT_TOKEN", "token"), ("FORESIGHT_CONTROL_TOKEN", "control-token")] {
        let from = env(c, var).value_from.as_ref().unwrap().secret_key_ref.as_ref().unwrap();
        assert_eq!((from.name.as_str(), from.key.as_str()), ("mnist-token-uid-1", key));
    }
    // A job started since the keyed suffix: its Secrets' names end with it, everywhere.
    let keyed = ChildDefaults { secret_suffix: Some("0123456789abcdef".into()), ..defaults() };
    let name = o.secret(&keyed, "t", "c").metadata.name.unwrap();
    assert_eq!(name, "mnist-token-0123456789abcdef");
    let ps = o.ps_deployment(&keyed, 3, 0).spec.template.spec.unwrap();
    let workers = o.worker_job(&keyed).spec.unwrap().template.spec.unwrap();
    for c in [&ps.containers[0], &workers.containers[0]] {
        let from = env(c, "FORESIGHT_TOKEN").value_from.as_ref().unwrap().secret_key_ref.as_ref().unwrap();
        assert_eq!(from.name, name);
    }
    let secret = o.secret(&defaults(), "t", "c").data.unwrap();
    assert_eq!((secret["token"].0.as_slice(), secret["control-token"].0.as_slice()), (&b"t"[..], &b"c"[..]));
    assert_eq!(env(c, "FORESIGHT_WORKERS").value.as_deref(), Some("3"));
    assert_eq!(env(c, "FORESIGHT_CHECKPOINT_INTERVAL").value.as_deref(), Some("30"));
    assert_eq!(env(c, "FORESIGHT_CHECKPOINT_DIR").value.as_deref(), Some(CHECKPOINT_DIR));
    let ckpt = pod.volumes.unwrap().into_iter().find(|v| v.name == "checkpoints").unwrap();
    assert_eq!(ckpt.persistent_volume_claim.unwrap().claim_name, "mnist-ps-checkpoints");
    assert_eq!(
        o.pvcs()[0].spec.clone().unwrap().resources.unwrap().requests.unwrap()["storage"],
        Quantity("2Gi".into())
    );
    assert_eq!(d.spec.strategy.unwrap().type_.as_deref(), Some("Recreate"));
    // A long restore (before the PS listens) is not killed: liveness waits for the startup probe,
    // which allows an hour; the liveness probe alone allows a minute.
    let budget = |p: &Probe| p.failure_threshold.unwrap_or(3) * p.period_seconds.unwrap_or(10);
    let startup = c.startup_probe.as_ref().expect("a startup probe");
    assert_eq!(startup.http_get.as_ref().unwrap().path.as_deref(), Some("/healthz"));
    assert_eq!(budget(startup), PS_STARTUP_SECONDS);
    assert!(budget(c.liveness_probe.as_ref().unwrap()) <= 60);
}

#[test]
fn suspending_stops_the_ps_only_when_a_pvc_keeps_its_checkpoint() {
    let suspended = BASE.replace("backoffLimit: 5", "backoffLimit: 5, suspend: true");
    let j = job(&suspended);
    assert_eq!(Owner::new(&j).unwrap().ps_replicas(), 1, "emptyDir: the PS holds the only copy");
    assert_eq!(Owner::new(&j).unwrap().worker_job(&defaults()).spec.unwrap().suspend, Some(true));
    let j = job(&format!("{suspended}  parameterServer: {{checkpoint: {{storage: 1Gi}}}}\n"));
    assert_eq!(Owner::new(&j).unwrap().ps_replicas(), 0);
    // Labelled for a queue and suspended: no PS before it holds a model (it would run outside
    // the quota); one that holds the only copy keeps running (its Workload is kept).
    let mut j = job(&suspended);
    let queued = |j: &TrainingJob| Owner::new(j).unwrap().with_admission(Admission::Suspended).ps_replicas();
    assert_eq!(queued(&j), 0);
    j.status = Some(TrainingJobStatus { progress: Some(Default::default()), ..Default::default() });
    assert_eq!(queued(&j), 1);
    assert!(Owner::new(&j).unwrap().ps_holds_model());
}

#[test]
fn the_ps_template_hash_follows_the_pod_template_only() {
    let hash = |yaml: &str| {
        let j = job(yaml);
        let d = Owner::new(&j).unwrap().ps_deployment(&defaults(), 3, 0);
        d.metadata.annotations.unwrap()[PS_TEMPLATE_HASH].clone()
    };
    let base = hash(BASE);
    assert_eq!(base.len(), 16);
    assert_eq!(base, hash(BASE), "deterministic");
    // Settings the PS reads change it; worker-only settings and suspension do not.
    assert_ne!(base, hash(&format!("{BASE}  training: {{learningRate: 0.01}}\n")));
    assert_eq!(base, hash(&BASE.replace("gpus: 2", "gpus: 1")));
    assert_eq!(base, hash(&BASE.replace("backoffLimit: 5", "backoffLimit: 5, suspend: true")));
}

#[test]
fn disruptions_are_not_charged_and_a_permanent_failure_fails_the_job() {
    let j = job(BASE);
    let spec = Owner::new(&j).unwrap().worker_job(&defaults()).spec.unwrap();
    let rules = spec.pod_failure_policy.expect("a podFailurePolicy").rules;
    assert_eq!(rules.len(), 2);
    assert_eq!(rules[0].action, "Ignore");
    assert_eq!(rules[0].on_pod_conditions.as_ref().unwrap()[0].type_, "DisruptionTarget");
    assert_eq!(rules[1].action, "FailJob");
    let codes = rules[1].on_exit_codes.as_ref().unwrap();
    assert_eq!((codes.container_name.as_deref(), codes.values.as_slice()), (Some("worker"), &[3][..]));
    // The policy needs restartPolicy Never, which also makes every failure a new pod.
    assert_eq!(spec.template.spec.unwrap().restart_policy.as_deref(), Some("Never"));
}

#[test]
fn the_final_model_goes_to_the_output_claim_which_no_one_owns() {
    let ps_of = |yaml: &str| {
        let j = job(yaml);
        let o = Owner::new(&j).unwrap();
        let d = o.ps_deployment(&defaults(), 3, 0);
        (o.output_pvc(), d.spec.template.spec.unwrap())
    };
    let output_dir = |p: &PodSpec| env(&p.containers[0], "FORESIGHT_OUTPUT_DIR").value.clone().unwrap();
    let claim_of = |p: &PodSpec, volume: &str| {
        let v = p.volumes.as_ref().unwrap().iter().find(|v| v.name == volume);
        v.and_then(|v| v.persistent_volume_claim.as_ref()).map(|c| c.claim_name.clone())
    };

    // A claim the job creates: named after the job, labelled, but with no owner.
    let (pvc, pod) = ps_of(&format!("{BASE}  output: {{storage: 2Gi}}\n"));
    let pvc = pvc.expect("output.storage creates a claim");
    assert_eq!(pvc.metadata.name.as_deref(), Some("mnist-output"));
    assert_eq!(pvc.metadata.owner_references, None, "deleting the job must leave it");
    assert_eq!(pvc.metadata.labels.unwrap()[LABEL_JOB], "mnist");
    assert_eq!(claim_of(&pod, "output").as_deref(), Some("mnist-output"));
    assert_eq!(output_dir(&pod), "/output/mnist");
    let mounts = pod.containers[0].volume_mounts.clone().unwrap();
    assert!(
        mounts.iter().any(|m| m.name == "output" && m.mount_path == OUTPUT_DIR && m.read_only != Some(true))
    );

    // An existing claim: used, never created.
    let (pvc, pod) = ps_of(&format!("{BASE}  output: {{claimName: models, path: team/run-7}}\n"));
    assert!(pvc.is_none());
    assert_eq!(claim_of(&pod, "output").as_deref(), Some("models"));
    assert_eq!(output_dir(&pod), "/output/team/run-7");

    // No output: next to the checkpoints, as before.
    let (pvc, pod) = ps_of(BASE);
    assert!(pvc.is_none() && claim_of(&pod, "output").is_none());
    assert_eq!(output_dir(&pod), CHECKPOINT_DIR);
}

const WITH_POD_SETTINGS: &str = r#"
apiVersion: foresight.dev/v1alpha1
kind: TrainingJob
metadata: {name: mnist}
spec:
  model: {name: lenet5}
  dataset: {format: mnist, path: /data/mnist}
  parameterServer:
    pod:
      nodeSelector: {pool: cpu}
      tolerations: [{key: dedicated, operator: Equal, value: training, effect: NoSchedule}]
      priorityClassName: training-high
      labels: {team: ml}
      annotations: {example.com/owner: ml}
      tmpSizeLimit: 512Mi
  workers:
    replicas: 2
    gpus: 1
    gpuResource: amd.com/gpu
    pod:
      tolerations: [{key: amd.com/gpu, operator: Exists}]
      affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: gpu, operator: In, values: [mi300]}]}]}}}
      serviceAccountName: data-reader
      automountServiceAccountToken: true
      imagePullSecrets: [{name: registry}]
      env: [{name: DATA_BUCKET, value: "s3://b"}]
      envFrom: [{secretRef: {name: bucket-credentials}}]
      volumes: [{name: cache, emptyDir: {}}]
      volumeMounts: [{name: cache, mountPath: /cache}]
      topologySpreadConstraints: [{maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule}]
      runtimeClassName: nvidia
      schedulerName: volcano
      securityContext: {runAsUser: 2000, supplementalGroups: [5000]}
      tmpSizeLimit: 2Gi
      initContainers:
      - {name: fetch, image: busybox, command: [sh, -c, "cp -r /seed /tmp"], volumeMounts: [{name: tmp, mountPath: /tmp}]}
      - {name: shipper, image: fluent-bit, restartPolicy: Always, securityContext: {readOnlyRootFilesystem: false}}
"#;

#[test]
fn each_roles_pod_settings_are_added_to_what_the_operator_sets() {
    let j = job(WITH_POD_SETTINGS);
    let o = Owner::new(&j).unwrap();
    let ps = o.ps_deployment(&defaults(), 2, 0).spec.template;
    let ps_labels = ps.metadata.as_ref().unwrap().labels.as_ref().unwrap();
    assert_eq!((ps_labels["team"].as_str(), ps_labels[LABEL_JOB].as_str()), ("ml", "mnist"));
    assert_eq!(ps.metadata.as_ref().unwrap().annotations.as_ref().unwrap()["example.com/owner"], "ml");
    let p = ps.spec.unwrap();
    assert_eq!(p.node_selector.unwrap()["pool"], "cpu");
    assert_eq!(p.tolerations.unwrap()[0].key.as_deref(), Some("dedicated"));
    assert_eq!(p.priority_class_name.as_deref(), Some("training-high"));
    assert_eq!(p.automount_service_account_token, Some(false), "no token unless asked");
    assert!(p.service_account_name.is_none());
    let tmp = |volumes: &Option<Vec<k8s_openapi::api::core::v1::Volume>>| {
        let tmp = volumes.iter().flatten().find(|v| v.name == "tmp").unwrap();
        tmp.empty_dir.as_ref().unwrap().size_limit.clone()
    };
    assert_eq!(tmp(&p.volumes), Some(Quantity("512Mi".into())));
    let ps_security = p.security_context.unwrap();
    assert_eq!((ps_security.run_as_user, ps_security.supplemental_groups), (Some(10001), None));
    assert!(
        p.runtime_class_name.is_none()
            && p.scheduler_name.is_none()
            && p.topology_spread_constraints.is_none()
    );

    let w = o.worker_job(&defaults()).spec.unwrap().template.spec.unwrap();
    let c = &w.containers[0];
    assert_eq!(c.resources.as_ref().unwrap().limits.as_ref().unwrap()["amd.com/gpu"], Quantity("1".into()));
    assert!(!c.resources.as_ref().unwrap().limits.as_ref().unwrap().contains_key(DEFAULT_GPU_RESOURCE));
    assert_eq!(w.service_account_name.as_deref(), Some("data-reader"));
    assert_eq!(w.automount_service_account_token, Some(true));
    assert_eq!(w.image_pull_secrets.unwrap()[0].name, "registry");
    assert!(w.affinity.unwrap().node_affinity.is_some());
    assert_eq!(w.tolerations.unwrap()[0].key.as_deref(), Some("amd.com/gpu"));
    // The user's variable and mount come after the operator's, which all stay.
    assert_eq!(env(c, "DATA_BUCKET").value.as_deref(), Some("s3://b"));
    assert!(env(c, "FORESIGHT_PS_URL").value.is_some());
    assert_eq!(c.env_from.as_ref().unwrap()[0].secret_ref.as_ref().unwrap().name, "bucket-credentials");
    let mounts: Vec<&str> = c.volume_mounts.as_ref().unwrap().iter().map(|m| m.mount_path.as_str()).collect();
    assert_eq!(mounts, ["/tmp", "/cache"]);
    let volumes: Vec<&str> = w.volumes.as_ref().unwrap().iter().map(|v| v.name.as_str()).collect();
    assert_eq!(volumes, ["tmp", "cache"]);
    assert_eq!(tmp(&w.volumes), Some(Quantity("2Gi".into())));
    assert_eq!(w.topology_spread_constraints.as_ref().unwrap()[0].topology_key, "kubernetes.io/hostname");
    assert_eq!(
        (w.runtime_class_name.as_deref(), w.scheduler_name.as_deref()),
        (Some("nvidia"), Some("volcano"))
    );
    // The user and groups are the job's; the rest of the security context stays the operator's.
    let s = w.security_context.as_ref().unwrap();
    assert_eq!((s.run_as_user, s.run_as_group, s.fs_group), (Some(2000), Some(10001), Some(10001)));
    assert_eq!((s.supplemental_groups.clone(), s.run_as_non_root), (Some(vec![5000]), Some(true)));
    assert_eq!(c.security_context.as_ref().unwrap().read_only_root_filesystem, Some(true));
    // Init containers and sidecars run before and beside the operator's one container, which
    // stays the only regular container (the Job completes when it does); one without a
    // security context gets the operator's, one with its own keeps it.
    assert_eq!(w.containers.len(), 1);
    let inits = w.init_containers.as_ref().unwrap();
    let names: Vec<&str> = inits.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["fetch", "shipper"]);
    assert_eq!(inits[0].security_context, c.security_context);
    assert_eq!(inits[1].restart_policy.as_deref(), Some("Always"));
    assert_eq!(inits[1].security_context.as_ref().unwrap().read_only_root_filesystem, Some(false));
    assert!(p.init_containers.is_none(), "the PS block sets none");
    let annotations =
        |t: &PodTemplateSpec| t.metadata.as_ref().unwrap().annotations.clone().unwrap_or_default();
    let worker_template = o.worker_job(&defaults()).spec.unwrap().template;
    assert_eq!(annotations(&worker_template)["kubectl.kubernetes.io/default-container"], "worker");
    let ps_annotations = ps.metadata.as_ref().unwrap().annotations.as_ref().unwrap();
    assert!(!ps_annotations.contains_key("kubectl.kubernetes.io/default-container"));
}

#[test]
fn pod_settings_change_the_template_digests_and_their_absence_does_not() {
    let plain = job(BASE);
    let mut set = job(BASE);
    set.spec.workers.pod = Some(crate::api::PodSettings::default());
    let digest = |j: &TrainingJob| {
        let o = Owner::new(j).unwrap();
        o.worker_job(&defaults()).metadata.annotations.unwrap()[WORKER_TEMPLATE_HASH].clone()
    };
    assert_eq!(digest(&plain), digest(&set), "an empty pod block changes nothing");
    set.spec.workers.pod.as_mut().unwrap().priority_class_name = Some("high".into());
    assert_ne!(digest(&plain), digest(&set));
}

#[test]
fn the_names_the_api_reserves_are_the_ones_the_operator_uses() {
    let j = job(BASE);
    let o = Owner::new(&j).unwrap();
    let mut j2 = job(BASE);
    j2.spec.output = Some(crate::api::OutputSpec { claim_name: Some("m".into()), ..Default::default() });
    j2.spec.parameter_server.replicas = Some(2);
    let o2 = Owner::new(&j2).unwrap();
    // With TLS, which adds the certificate's volumes, and a shard, which adds its label.
    let tls = ChildDefaults { ps_tls: true, ..defaults() };
    let ps_template = o2.ps_deployment(&tls, 3, 0).spec.template;
    let shard_labels = ps_template.metadata.and_then(|m| m.labels).unwrap_or_default();
    let keys: BTreeSet<String> =
        labels("mnist", COMPONENT_WORKER).into_keys().chain(shard_labels.into_keys()).collect();
    let reserved: BTreeSet<String> = crate::api::RESERVED_LABELS.iter().map(|k| k.to_string()).collect();
    assert_eq!(keys, reserved);
    let ps = ps_template.spec.unwrap();
    let w = o.worker_job(&tls).spec.unwrap().template.spec.unwrap();
    let mut names: Vec<String> = ps
        .volumes
        .iter()
        .chain(&w.volumes)
        .flatten()
        .map(|v| v.name.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    names.sort();
    let mut reserved_volumes: Vec<String> =
        crate::api::RESERVED_VOLUMES.iter().map(|v| v.to_string()).collect();
    reserved_volumes.sort();
    assert_eq!(names, reserved_volumes);
    let paths: BTreeSet<String> = [&ps.containers[0], &w.containers[0]]
        .into_iter()
        .flat_map(|c| c.volume_mounts.iter().flatten())
        .map(|m| m.mount_path.clone())
        .filter(|p| p != &j.spec.dataset.path)
        .collect();
    let reserved_paths: BTreeSet<String> = crate::api::RESERVED_PATHS.iter().map(|p| p.to_string()).collect();
    assert_eq!(paths, reserved_paths);
}

#[test]
fn a_job_of_its_own_program_runs_it_in_the_workers_with_the_same_environment() {
    let yaml = BASE.replace("  model: {name: lenet5}\n", "").replace(
        "workers: {replicas: 3,",
        "workers: {replicas: 3, command: [python, /scripts/train.py], args: [--fast],",
    );
    let j = job(&yaml);
    let w = Owner::new(&j).unwrap().worker_job(&defaults());
    let pod = w.spec.unwrap().template.spec.unwrap();
    let c = &pod.containers[0];
    assert_eq!(c.command.as_deref(), Some(&["python".to_string(), "/scripts/train.py".to_string()][..]));
    assert_eq!(c.args.as_deref(), Some(&["--fast".to_string()][..]));
    assert_eq!(env(c, "FORESIGHT_DATASET_PATH").value.as_deref(), Some("/data/mnist"));
    assert!(c.env.as_ref().unwrap().iter().all(|e| e.name != "FORESIGHT_MODEL"));
    let builtin = Owner::new(&job(BASE)).unwrap().worker_job(&defaults());
    let c = &builtin.spec.unwrap().template.spec.unwrap().containers[0];
    assert_eq!((c.command.as_ref(), c.args.as_ref()), (None, None), "the image's entrypoint");
}

/// Two shards: a Deployment, a Service and a checkpoint claim each, shard 0 under the unsharded
/// names; each Service selects its own shard's pod; shard 0 alone writes the model (and mounts
/// the output claim) and knows the other shard; the workers get both URLs in shard order.
#[test]
fn a_sharded_parameter_server_is_one_deployment_service_and_claim_per_shard() {
    let yaml = BASE.replace(
        "  workers:",
        "  parameterServer: {replicas: 2, checkpoint: {storage: 1Gi}}\n  output: {storage: 1Gi}\n  workers:",
    );
    let j = job(&yaml);
    let o = Owner::new(&j).unwrap();
    let names = |v: Vec<Option<String>>| v.into_iter().map(Option::unwrap).collect::<Vec<_>>();
    let deployments: Vec<Deployment> = (0..2).map(|i| o.ps_deployment(&defaults(), 3, i)).collect();
    assert_eq!(
        names(deployments.iter().map(|d| d.metadata.name.clone()).collect()),
        ["mnist-ps", "mnist-ps-1"]
    );
    assert_eq!(
        names(o.pvcs().into_iter().map(|c| c.metadata.name).collect()),
        ["mnist-ps-checkpoints", "mnist-ps-1-checkpoints"]
    );
    for (i, d) in deployments.iter().enumerate() {
        let pod_labels = d.spec.template.metadata.as_ref().unwrap().labels.clone().unwrap();
        assert_eq!(pod_labels[LABEL_PS_SHARD], i.to_string());
        assert_eq!(d.spec.selector.match_labels.as_ref(), Some(&pod_labels));
        let service = o.ps_service(i, false);
        assert_eq!(service.metadata.name, d.metadata.name);
        assert_eq!(service.spec.unwrap().selector.as_ref(), Some(&pod_labels), "shard {i}'s pod alone");
        let pod = d.spec.template.spec.as_ref().unwrap();
        let claims: Vec<_> =
            pod.volumes.iter().flatten().filter_map(|v| v.persistent_volume_claim.as_ref()).collect();
        let claims: Vec<&str> = claims.iter().map(|c| c.claim_name.as_str()).collect();
        let c = &pod.containers[0];
        let has = |name: &str| c.env.iter().flatten().any(|e| e.name == name);
        assert_eq!(env(c, "FORESIGHT_PS_SHARD").value, Some(i.to_string()), "the shard label of its series");
        match i {
            0 => {
                assert_eq!(claims, ["mnist-ps-checkpoints", "mnist-output"]);
                assert_eq!(env(c, "FORESIGHT_OUTPUT_DIR").value.as_deref(), Some("/output/mnist"));
                assert_eq!(
                    env(c, "FORESIGHT_PS_PEERS").value.as_deref(),
                    Some("http://mnist-ps-1.team-a.svc:8080")
                );
            }
            _ => {
                assert_eq!(claims, ["mnist-ps-1-checkpoints"], "only shard 0 mounts the output claim");
                assert_eq!(env(c, "FORESIGHT_OUTPUT_DIR").value.as_deref(), Some(CHECKPOINT_DIR));
                assert!(!has("FORESIGHT_PS_PEERS"));
            }
        }
    }
    let w = o.worker_job(&defaults()).spec.unwrap().template.spec.unwrap();
    assert_eq!(
        env(&w.containers[0], "FORESIGHT_PS_URL").value.as_deref(),
        Some("http://mnist-ps.team-a.svc:8080,http://mnist-ps-1.team-a.svc:8080")
    );
    // Unsharded, nothing of this: no shard label, the selector it always had.
    let one = job(BASE);
    let d = Owner::new(&one).unwrap().ps_deployment(&defaults(), 3, 0);
    assert!(!d.spec.selector.match_labels.unwrap().contains_key(LABEL_PS_SHARD));
    let c = &d.spec.template.spec.as_ref().unwrap().containers[0];
    assert!(
        !c.env.iter().flatten().any(|e| e.name == "FORESIGHT_PS_SHARD"),
        "an unsharded PS's template is as earlier operators made it"
    );
}

/// With TLS the PS serves its job's certificate, the workers hold the CA alone and are told
/// https://, and the probes and the Service speak HTTPS on the port named `https`.
#[test]
fn with_tls_the_ps_mounts_its_certificate_and_the_workers_only_the_ca() {
    let j = job(&BASE.replace("  workers:", "  parameterServer: {replicas: 2}\n  workers:"));
    let o = Owner::new(&j).unwrap();
    let tls = ChildDefaults { ps_tls: true, ..defaults() };
    let certs = JobCertificates { ca: "ca".into(), cert: "cert".into(), key: "key".into() };
    let secret = o.tls_secret(&tls, &certs);
    assert_eq!(secret.metadata.name.as_deref(), Some("mnist-ps-tls-uid-1"));
    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
    let keys: Vec<&String> = secret.data.as_ref().unwrap().keys().collect();
    assert_eq!(keys, ["ca.crt", "tls.crt", "tls.key"]);

    let ps = o.ps_deployment(&tls, 3, 0).spec.template.spec.unwrap();
    let c = &ps.containers[0];
    assert_eq!(env(c, "FORESIGHT_TLS_CERT").value.as_deref(), Some("/etc/foresight/tls/tls.crt"));
    assert_eq!(env(c, "FORESIGHT_TLS_KEY").value.as_deref(), Some("/etc/foresight/tls/tls.key"));
    assert_eq!(env(c, "FORESIGHT_PS_CA_FILE").value.as_deref(), Some("/etc/foresight/tls/ca.crt"));
    assert_eq!(env(c, "FORESIGHT_PS_PEERS").value.as_deref(), Some("https://mnist-ps-1.team-a.svc:8080"));
    let v = ps.volumes.as_ref().unwrap().iter().find(|v| v.name == "ps-tls").unwrap();
    let source = v.secret.as_ref().unwrap();
    assert_eq!((source.secret_name.as_deref(), source.items.as_ref()), (Some("mnist-ps-tls-uid-1"), None));
    assert_eq!(c.ports.as_ref().unwrap()[0].name.as_deref(), Some("https"));
    for probe in [&c.readiness_probe, &c.liveness_probe, &c.startup_probe] {
        let get = probe.as_ref().unwrap().http_get.as_ref().unwrap();
        assert_eq!((get.scheme.as_deref(), &get.port), (Some("HTTPS"), &IntOrString::String("https".into())));
    }
    let svc = o.ps_service(1, true).spec.unwrap().ports.unwrap().remove(0);
    assert_eq!((svc.name.as_deref(), svc.app_protocol.as_deref()), (Some("https"), Some("https")));
    assert_eq!(svc.target_port, Some(IntOrString::String("https".into())));

    let w = o.worker_job(&tls).spec.unwrap().template.spec.unwrap();
    let c = &w.containers[0];
    assert_eq!(
        env(c, "FORESIGHT_PS_URL").value.as_deref(),
        Some("https://mnist-ps.team-a.svc:8080,https://mnist-ps-1.team-a.svc:8080")
    );
    assert_eq!(env(c, "FORESIGHT_PS_CA_FILE").value.as_deref(), Some("/etc/foresight/ps-ca/ca.crt"));
    let v = w.volumes.as_ref().unwrap().iter().find(|v| v.name == "ps-ca").unwrap();
    let items = v.secret.as_ref().unwrap().items.as_ref().unwrap();
    assert_eq!(
        items.iter().map(|i| i.key.as_str()).collect::<Vec<_>>(),
        ["ca.crt"],
        "a worker holds the CA alone"
    );
    assert!(!w.volumes.as_ref().unwrap().iter().any(|v| v.name == "ps-tls"));

    // Without TLS nothing of it.
    let plain = o.ps_deployment(&defaults(), 3, 0).spec.template.spec.unwrap();
    assert!(plain.containers[0].env.as_ref().unwrap().iter().all(|e| !e.name.starts_with("FORESIGHT_TLS")));
    assert!(plain.volumes.as_ref().unwrap().iter().all(|v| v.name != "ps-tls"));
}
