//! The rules a TrainingJob must satisfy, checked before anything starts. `foresight run` and the
//! operator apply the same function. The CRD (`super::crd`) carries the same rules for the API
//! server, as OpenAPI bounds and CEL rules (`x-kubernetes-validations`) on the field named here;
//! `validate_update` adds the transition rules (what cannot change after creation).

use foresight_ps::client::cadence_problem;
use foresight_ps::wire::shards::MAX_SHARDS;

use super::{
    Algorithm, PodSettings, RESERVED_CONTAINERS, RESERVED_ENV_PREFIX, RESERVED_LABELS, RESERVED_PATHS,
    RESERVED_VOLUMES, TrainingJobSpec, reserved,
};

/// Why `sync` needs one shard (the conformance matrix found the tear: `make matrix`).
pub const SHARDED_SYNC: &str = "sync needs parameterServer.replicas: 1: each shard closes its rounds on its own (arrival order with backupWorkers, its own timeouts and silences), so one worker's step could be averaged into some slices of the model and dropped from others";
/// Why `dc-asgd-c` does not take local steps.
pub const LOCAL_STEPS_DC_ASGD_C: &str = "dc-asgd-c does not take localSteps: its constant λ0 is scaled for one gradient, and a pseudo-gradient of H inner steps is about η_in·H times one, so the compensation would be off by that factor; use asgd (docs/convergence.md finds it the safer asynchronous outer step), sync or dc-asgd-a";
/// Why the rule is frozen, and how a job without `optimizer.algorithm` keeps it.
pub const ALGORITHM_FROZEN: &str = "algorithm cannot change after the job is created (the parameter server's state and checkpoints belong to it): without optimizer.algorithm, localSteps above 1 means asgd and otherwise dc-asgd-a, so name the job's algorithm to change localSteps across 1; or create a new TrainingJob";
/// Why `maxStaleness` needs one shard.
pub const SHARDED_MAX_STALENESS: &str = "maxStaleness needs parameterServer.replicas: 1: each shard judges a push's staleness by its own version, so one shard could refuse a step the others apply";

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("spec.{field}: {message}")]
pub struct ValidationError {
    /// Dotted path below `spec`, e.g. `optimizer.lambda0`.
    pub field: String,
    pub message: String,
}

/// Every problem with `spec`, or `Ok` when there is none.
pub fn validate(spec: &TrainingJobSpec) -> Result<(), Vec<ValidationError>> {
    let mut errs = Vec::new();
    let mut check = |ok: bool, field: &str, message: String| {
        if !ok {
            errs.push(ValidationError { field: field.into(), message });
        }
    };
    let m = &spec.model;
    let w = &spec.workers;
    let own_program = w.command.is_some();
    let model_ok = if own_program {
        m.name.is_none() && m.torchscript.is_none()
    } else {
        m.name.is_some() != m.torchscript.is_some()
    };
    check(model_ok, "model", super::MODEL_RULE.into());
    if let Some(c) = &w.command {
        check(!c.is_empty() && c.len() <= 64, "workers.command", "must hold 1 to 64 strings".into());
        check(
            !c.first().is_some_and(|p| p.trim().is_empty()),
            "workers.command",
            "the program must not be empty".into(),
        );
    }
    check(
        own_program || spec.dataset.format != super::DatasetFormat::Files,
        "dataset.format",
        "files needs workers.command: the built-in worker reads mnist, cifar10 or csv".into(),
    );
    if let Some(a) = &w.args {
        check(
            own_program,
            "workers.args",
            "needs workers.command (the built-in worker takes its settings from the job)".into(),
        );
        check(a.len() <= 256, "workers.args", "must hold at most 256 strings".into());
    }
    if let Some(ts) = &m.torchscript {
        check(!ts.path.trim().is_empty(), "model.torchscript.path", "must not be empty".into());
    }
    if let Some(n) = spec.parameter_server.replicas {
        check(
            (1..=MAX_SHARDS as u32).contains(&n),
            "parameterServer.replicas",
            format!("must be 1 to {MAX_SHARDS}, got {n}"),
        );
    }
    let d = &spec.dataset;
    check(!d.path.trim().is_empty(), "dataset.path", "must not be empty".into());
    check(d.path.len() <= 4096, "dataset.path", "must be at most 4096 bytes".into());
    if let Some(h) = d.holdout {
        check(h > 0.0 && h < 1.0, "dataset.holdout", format!("must be in (0, 1), got {h}"));
    }
    let t = &spec.training;
    check(t.epochs >= 1, "training.epochs", "must be at least 1".into());
    check(t.batch_size >= 1, "training.batchSize", "must be at least 1".into());
    check(
        t.learning_rate.is_finite() && t.learning_rate > 0.0,
        "training.learningRate",
        format!("must be > 0, got {}", t.learning_rate),
    );
    if let Some(lr) = &t.lr_decay {
        check(
            lr.factor > 0.0 && lr.factor <= 1.0,
            "training.lrDecay.factor",
            format!("must be in (0, 1], got {}", lr.factor),
        );
        check(
            lr.milestones.iter().all(|m| m.is_finite() && *m >= 0.0)
                && lr.milestones.windows(2).all(|w| w[0] < w[1]),
            "training.lrDecay.milestones",
            "must be epochs ≥ 0 in strictly ascending order".into(),
        );
    }
    if let Some(w) = t.lr_warmup_epochs {
        check(w.is_finite() && w >= 0.0, "training.lrWarmupEpochs", format!("must be ≥ 0, got {w}"));
    }
    let o = &spec.optimizer;
    if let Some(l) = o.lambda0 {
        check(
            o.algorithm().is_delay_compensated(),
            "optimizer.lambda0",
            format!("only applies to dc-asgd-c and dc-asgd-a, not {}", o.algorithm().as_str()),
        );
        check(l.is_finite() && l >= 0.0, "optimizer.lambda0", format!("must be ≥ 0, got {l}"));
    }
    if let Some(msd) = o.mean_square_decay {
        check(
            o.algorithm() == Algorithm::DcAsgdA,
            "optimizer.meanSquareDecay",
            format!("only applies to dc-asgd-a, not {}", o.algorithm().as_str()),
        );
        check(
            (0.0..1.0).contains(&msd),
            "optimizer.meanSquareDecay",
            format!("must be in [0, 1), got {msd}"),
        );
    }
    if let Some(problem) = o.parameter_groups.as_deref().and_then(parameter_groups_problem) {
        check(false, "optimizer.parameterGroups", problem);
    }
    check(o.pull_every >= 1, "optimizer.pullEvery", "must be at least 1".into());
    check(o.push_every >= 1, "optimizer.pushEvery", "must be at least 1".into());
    if o.pull_every >= 1 && o.push_every >= 1 {
        let problem =
            cadence_problem(o.pull_every.into(), o.push_every.into(), o.algorithm() == Algorithm::Sync);
        check(problem.is_none(), "optimizer.pullEvery", problem.unwrap_or_default());
    }
    if let Some(mom) = o.momentum {
        check((0.0..1.0).contains(&mom), "optimizer.momentum", format!("must be in [0, 1), got {mom}"));
    }
    if o.nesterov == Some(true) {
        check(o.momentum.is_some_and(|m| m > 0.0), "optimizer.nesterov", "needs a momentum > 0".into());
    }
    if let Some(n) = o.momentum_delay {
        check(n >= 1, "optimizer.momentumDelay", "must be at least 1".into());
        if n > 1 {
            check(
                o.momentum.is_some_and(|m| m > 0.0),
                "optimizer.momentumDelay",
                "needs a momentum > 0".into(),
            );
            check(
                o.algorithm() != Algorithm::Sync,
                "optimizer.momentumDelay",
                "only applies to the asynchronous rules: a sync round already averages the workers' updates"
                    .into(),
            );
        }
    }
    if let Some(h) = o.local_steps {
        check(h >= 1, "optimizer.localSteps", "must be at least 1".into());
        check(
            h <= 1 || o.algorithm() != Algorithm::DcAsgdC,
            "optimizer.algorithm",
            LOCAL_STEPS_DC_ASGD_C.into(),
        );
        check(
            h <= 1 || (o.pull_every == 1 && o.push_every == 1),
            "optimizer.localSteps",
            "replaces pullEvery and pushEvery (a worker pulls and pushes once per localSteps steps): \
             leave them at 1"
                .into(),
        );
    }
    if let Some(a) = &o.adaptive_local_steps {
        let start = o.local_steps.unwrap_or(1);
        check(a.min >= 2, "optimizer.adaptiveLocalSteps.min", format!("must be at least 2, got {}", a.min));
        check(
            a.min <= start && start <= a.max,
            "optimizer.adaptiveLocalSteps",
            format!(
                "needs localSteps (where workers start) within [min, max]: {} ≤ {start} ≤ {} does not hold",
                a.min, a.max
            ),
        );
        if let Some(f) = a.communication_fraction {
            check(
                f > 0.0 && f <= 1.0,
                "optimizer.adaptiveLocalSteps.communicationFraction",
                format!("must be in (0, 1], got {f}"),
            );
        }
    }
    if let Some(inner) = &o.inner_optimizer {
        check(
            o.local_steps.is_some_and(|h| h > 1),
            "optimizer.innerOptimizer",
            "trains local steps: it needs localSteps above 1".into(),
        );
        let lr = inner.learning_rate;
        check(
            lr.is_finite() && lr > 0.0,
            "optimizer.innerOptimizer.learningRate",
            format!("must be > 0, got {lr}"),
        );
        if let Some(wd) = inner.weight_decay {
            check(
                wd.is_finite() && wd >= 0.0,
                "optimizer.innerOptimizer.weightDecay",
                format!("must be ≥ 0, got {wd}"),
            );
        }
    }
    if let Some(wd) = o.weight_decay {
        check(wd.is_finite() && wd >= 0.0, "optimizer.weightDecay", format!("must be ≥ 0, got {wd}"));
    }
    for (field, set) in [
        ("optimizer.backupWorkers", o.backup_workers.is_some()),
        ("optimizer.syncRoundTimeoutSeconds", o.sync_round_timeout_seconds.is_some()),
    ] {
        if set {
            let why = format!("only applies to sync, not {}", o.algorithm().as_str());
            check(o.algorithm() == Algorithm::Sync, field, why);
        }
    }
    if let Some(b) = o.backup_workers {
        check(
            b < spec.workers.replicas,
            "optimizer.backupWorkers",
            format!("must be fewer than workers.replicas ({}), got {b}", spec.workers.replicas),
        );
    }
    if let Some(t) = o.sync_round_timeout_seconds {
        check(t >= 1, "optimizer.syncRoundTimeoutSeconds", "must be at least 1".into());
    }
    let shards = spec.parameter_server.replicas.unwrap_or(1);
    check(
        o.algorithm() != Algorithm::Sync || shards <= 1,
        "optimizer.algorithm",
        format!("{SHARDED_SYNC} (parameterServer.replicas is {shards})"),
    );
    check(
        o.max_staleness.unwrap_or(0) == 0 || shards <= 1,
        "optimizer.maxStaleness",
        format!("{SHARDED_MAX_STALENESS} (parameterServer.replicas is {shards})"),
    );
    let w = &spec.workers;
    check(
        (1..=1024).contains(&w.replicas),
        "workers.replicas",
        format!("must be in 1..=1024, got {}", w.replicas),
    );
    // The parameter server uses no device: a GPU (or any extended resource) asked for it would
    // be held, outside the job's use, for the job's whole life (and, under Kueue, counted to
    // the job while a suspended job's PS kept it).
    if let Some(r) = &spec.parameter_server.resources {
        let asked = r.limits.iter().chain(&r.requests).flat_map(|m| m.keys());
        let device = asked.filter(|k| !is_ps_resource(k)).cloned().collect::<Vec<_>>();
        check(
            device.is_empty(),
            "parameterServer.resources",
            format!(
                "may ask only for cpu, memory, ephemeral-storage and hugepages-*: the parameter server uses no device (got {})",
                device.join(", ")
            ),
        );
    }
    if let Some(ckpt) = &spec.parameter_server.checkpoint {
        check(
            ckpt.interval_seconds != Some(0),
            "parameterServer.checkpoint.intervalSeconds",
            "must be at least 1".into(),
        );
        if let Some(size) = &ckpt.storage {
            check(
                is_positive_quantity(size),
                "parameterServer.checkpoint.storage",
                format!("must be a quantity > 0, e.g. 1Gi, got {size:?}"),
            );
        }
    }
    if let Some(min) = spec.workers.min_replicas {
        check(
            min >= 1 && min <= spec.workers.replicas,
            "workers.minReplicas",
            format!("must be in 1..=workers.replicas ({}), got {min}", spec.workers.replicas),
        );
        check(
            spec.optimizer.algorithm() != Algorithm::Sync,
            "workers.minReplicas",
            "workers.minReplicas needs an asynchronous algorithm: every sync round waits for every worker"
                .into(),
        );
    }
    if let Some(o) = &spec.output {
        check(
            o.claim_name.is_some() != o.storage.is_some(),
            "output",
            "set exactly one of output.claimName (an existing claim) and output.storage (a claim the job creates and keeps)"
                .into(),
        );
        if let Some(c) = &o.claim_name {
            check(is_name(c), "output.claimName", format!("must be a PersistentVolumeClaim name, got {c:?}"));
        }
        if let Some(size) = &o.storage {
            check(
                is_positive_quantity(size),
                "output.storage",
                format!("must be a quantity > 0, e.g. 1Gi, got {size:?}"),
            );
        }
        if let Some(p) = &o.path {
            let ok = !p.starts_with('/') && p.split('/').all(|part| part != "..") && p.len() <= 200;
            check(ok, "output.path", format!("must be a relative path without '..', got {p:?}"));
        }
    }
    check(
        spec.run_policy.active_deadline_seconds != Some(0),
        "runPolicy.activeDeadlineSeconds",
        "must be at least 1".into(),
    );
    if let Some(r) = &w.gpu_resource {
        let ok = r.split_once('/').is_some_and(|(domain, name)| {
            is_name(domain)
                && !name.is_empty()
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
                && name.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
                && name.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
        }) && !r.starts_with("kubernetes.io/")
            && r.len() <= 253;
        check(
            ok,
            "workers.gpuResource",
            format!("must be an extended resource name with a domain, e.g. nvidia.com/gpu, got {r:?}"),
        );
    }
    if let Some(p) = &w.pod {
        check(
            w.node_selector.is_none() || p.node_selector.is_none(),
            "workers.nodeSelector",
            "set workers.nodeSelector or workers.pod.nodeSelector, not both".into(),
        );
        check(
            w.tolerations.is_none() || p.tolerations.is_none(),
            "workers.tolerations",
            "set workers.tolerations or workers.pod.tolerations, not both".into(),
        );
        let mounts = p.volume_mounts.as_deref().unwrap_or_default();
        check(
            spec.dataset.volume.is_none() || mounts.iter().all(|m| m.mount_path != spec.dataset.path),
            "workers.pod.volumeMounts",
            "the dataset's volume is mounted at dataset.path".into(),
        );
        let ours: &[&str] = if spec.dataset.volume.is_some() { &["tmp", "dataset"] } else { &["tmp"] };
        validate_pod(p, "workers.pod", ours, &mut errs);
    }
    if let Some(p) = &spec.parameter_server.pod {
        // Not `output`: only the first shard's pod has it.
        validate_pod(p, "parameterServer.pod", &["tmp", "checkpoints"], &mut errs);
    }
    if errs.is_empty() { Ok(()) } else { Err(errs) }
}

/// The rules of a role's `pod` block (`field`: `workers.pod` or `parameterServer.pod`), as the
/// CRD's rules on `PodSettings` state them, and the mounts of its init containers, which may
/// also name `ours`, the operator's volumes in that role's pods (only here: the CRD's rules
/// cannot see the rest of the spec).
fn validate_pod(p: &PodSettings, field: &str, ours: &[&str], errs: &mut Vec<ValidationError>) {
    let mut check = |ok: bool, sub: &str, message: &str| {
        if !ok {
            errs.push(ValidationError { field: format!("{field}.{sub}"), message: message.into() });
        }
    };
    let env = p.env.as_deref().unwrap_or_default();
    check(
        env.iter().all(|e| !e.name.starts_with(RESERVED_ENV_PREFIX)),
        "env",
        "names starting with FORESIGHT_ are set by the operator",
    );
    let labels = p.labels.clone().unwrap_or_default();
    check(RESERVED_LABELS.iter().all(|k| !labels.contains_key(*k)), "labels", &reserved::LABELS);
    let volumes = p.volumes.as_deref().unwrap_or_default();
    check(
        volumes.iter().all(|v| !RESERVED_VOLUMES.contains(&v.name.as_str())),
        "volumes",
        &reserved::VOLUMES,
    );
    check(volumes.iter().all(|v| v.name.len() <= 63), "volumes", "a volume name is at most 63 bytes");
    let mounts = p.volume_mounts.as_deref().unwrap_or_default();
    check(
        mounts.iter().all(|m| m.name.len() <= 63 && m.mount_path.len() <= 4096),
        "volumeMounts",
        "a mount's name is at most 63 bytes, its path 4096",
    );
    check(
        mounts.iter().all(|m| volumes.iter().any(|v| v.name == m.name)),
        "volumeMounts",
        "each volume mount must name a volume of this pod block's volumes",
    );
    check(
        mounts.iter().all(|m| !RESERVED_PATHS.contains(&m.mount_path.as_str())),
        "volumeMounts",
        &reserved::PATHS,
    );
    for (sub, name) in [
        ("priorityClassName", &p.priority_class_name),
        ("serviceAccountName", &p.service_account_name),
        ("runtimeClassName", &p.runtime_class_name),
        ("schedulerName", &p.scheduler_name),
    ] {
        if let Some(n) = name {
            check(is_name(n), sub, "must be an object name (lowercase letters, digits, '-' and '.')");
        }
    }
    if let Some(limit) = &p.tmp_size_limit {
        check(is_positive_quantity(limit), "tmpSizeLimit", "must be a quantity > 0, e.g. 2Gi");
    }
    let inits = p.init_containers.as_deref().unwrap_or_default();
    check(inits.len() <= 8, "initContainers", "at most 8");
    check(
        inits
            .iter()
            .all(|c| is_dns_name(&c.name, 63, false) && !RESERVED_CONTAINERS.contains(&c.name.as_str())),
        "initContainers",
        &format!("each name must be a DNS label; {}", *reserved::CONTAINERS),
    );
    check(
        inits.iter().enumerate().all(|(i, c)| inits[..i].iter().all(|d| d.name != c.name)),
        "initContainers",
        "init container names must be unique",
    );
    check(
        inits.iter().all(|c| c.image.as_deref().is_some_and(|i| !i.is_empty())),
        "initContainers",
        "each init container needs an image",
    );
    check(
        inits.iter().all(|c| c.restart_policy.as_deref().is_none_or(|r| r == "Always")),
        "initContainers",
        "an init container's restartPolicy may only be Always (a sidecar)",
    );
    let mounted = inits.iter().flat_map(|c| c.volume_mounts.iter().flatten());
    let message = format!("each mount must name a volume of this pod block's volumes or {}", ours.join(", "));
    check(
        { mounted }.all(|m| ours.contains(&m.name.as_str()) || volumes.iter().any(|v| v.name == m.name)),
        "initContainers",
        &message,
    );
    check(
        p.topology_spread_constraints.as_ref().is_none_or(|t| t.len() <= 16),
        "topologySpreadConstraints",
        "at most 16",
    );
    if let Some(id) = &p.security_context {
        let ids = [id.run_as_user, id.run_as_group, id.fs_group].into_iter().flatten();
        let groups = id.supplemental_groups.iter().flatten().copied();
        check(
            ids.chain(groups).all(|n| (1..=i64::from(i32::MAX)).contains(&n)),
            "securityContext",
            "user and group ids must be in 1..2147483647 (never root's)",
        );
        check(
            id.supplemental_groups.as_ref().is_none_or(|g| g.len() <= 32),
            "securityContext.supplementalGroups",
            "at most 32",
        );
    }
}

/// A DNS-subdomain object name: lowercase letters, digits, '-' and '.', alphanumeric at both
/// ends, at most 253 bytes.
fn is_name(s: &str) -> bool {
    is_dns_name(s, 253, true)
}

/// A TrainingJob's `metadata.name` (the CRD's root rule says the same): a DNS label of at most
/// [`super::MAX_NAME_LEN`] characters that starts with a letter, since the job's Services and
/// pods are named after it. The error is the rule's message.
/// A resource the parameter server's container may ask for.
fn is_ps_resource(name: &str) -> bool {
    matches!(name, "cpu" | "memory" | "ephemeral-storage") || name.starts_with("hugepages-")
}

pub fn validate_name(name: &str) -> Result<(), &'static str> {
    let ok =
        is_dns_name(name, super::MAX_NAME_LEN, false) && name.starts_with(|c: char| c.is_ascii_lowercase());
    if ok { Ok(()) } else { Err(super::NAME_MESSAGE) }
}

/// Lowercase letters, digits and '-' (and '.' with `dots`), alphanumeric at both ends, at most
/// `max` bytes: a DNS label (63, no dots, e.g. a namespace) or subdomain (253, dots).
pub(crate) fn is_dns_name(s: &str, max: usize, dots: bool) -> bool {
    s.len() <= max
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || (dots && b == b'.'))
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
}

/// A Kubernetes quantity (`<number><suffix>`: 1Gi, 500M, 1.5e3, 0.5) greater than zero.
fn is_positive_quantity(q: &str) -> bool {
    const SUFFIXES: [&str; 15] =
        ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P", "E"];
    let (number, exponent) = match q.find(['e', 'E']) {
        Some(i) => (&q[..i], Some(&q[i + 1..])),
        None => (SUFFIXES.iter().find_map(|s| q.strip_suffix(s)).unwrap_or(q), None),
    };
    let digits = number.strip_prefix('+').unwrap_or(number);
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    let well_formed = !(int.is_empty() && frac.is_empty())
        && int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit())
        && exponent.is_none_or(|e| {
            let e = e.strip_prefix(['+', '-']).unwrap_or(e);
            !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit())
        });
    well_formed && int.bytes().chain(frac.bytes()).any(|b| b != b'0')
}

/// What the parameter server would refuse in `groups` (a pattern that is not a regular
/// expression, or the bounds the CRD also checks), as it would say it.
fn parameter_groups_problem(groups: &[super::ParameterGroupSpec]) -> Option<String> {
    let as_ps: Vec<foresight_ps::optimizer::ParameterGroup> =
        serde_json::to_value(groups).and_then(serde_json::from_value).ok()?;
    foresight_ps::optimizer::validate_parameter_groups(&as_ps).err().map(|e| e.0)
}

/// Every problem with changing a job's spec from `old` to `new`: `validate(new)` and the CRD's
/// transition rules. What a worker resumes from (model, algorithm, dataset, batch size, seed,
/// the checkpoint claim) never changes; the workers' pod template changes only while the job is
/// suspended (`transitions::WORKER_TEMPLATE_FIELDS`).
pub fn validate_update(old: &TrainingJobSpec, new: &TrainingJobSpec) -> Result<(), Vec<ValidationError>> {
    let mut errs = validate(new).err().unwrap_or_default();
    let mut frozen = |same: bool, field: &str, message: &str| {
        if !same {
            errs.push(ValidationError { field: field.into(), message: message.into() });
        }
    };
    frozen(old.model == new.model, "model", "model cannot change after the job is created");
    frozen(old.optimizer.algorithm() == new.optimizer.algorithm(), "optimizer.algorithm", ALGORITHM_FROZEN);
    frozen(old.dataset == new.dataset, "dataset", "dataset cannot change after the job is created");
    let (t, u) = (&old.training, &new.training);
    frozen(
        t.batch_size == u.batch_size && t.seed == u.seed,
        "training",
        "training.batchSize and training.seed cannot change after the job is created",
    );
    let storage =
        |s: &TrainingJobSpec| s.parameter_server.checkpoint.as_ref().and_then(|c| c.storage.clone());
    frozen(
        storage(old) == storage(new),
        "parameterServer",
        "parameterServer.checkpoint.storage cannot change after the job is created",
    );
    frozen(old.output == new.output, "output", "output cannot change after the job is created");
    frozen(
        old.parameter_server.shards() == new.parameter_server.shards(),
        "parameterServer",
        "parameterServer.replicas cannot change after the job is created",
    );
    let suspended = new.run_policy.suspend == Some(true);
    let template = |s: &TrainingJobSpec| {
        let w = &s.workers;
        (
            (w.image.clone(), w.gpus, w.gpu_resource.clone(), w.resources.clone()),
            (w.command.clone(), w.args.clone()),
            (w.node_selector.clone(), w.tolerations.clone()),
            (s.training.epochs, s.optimizer.pull_every, s.optimizer.push_every, s.optimizer.local_steps),
            s.optimizer.inner_optimizer.clone(),
        )
    };
    frozen(
        suspended || template(old) == template(new),
        "workers",
        "workers.image, command, args, gpus, gpuResource, resources, nodeSelector, tolerations, training.epochs, \
         optimizer.pullEvery, pushEvery, localSteps and innerOptimizer change only with runPolicy.suspend: true",
    );
    // Not volumes, volumeMounts, affinity or envFrom: see `transitions::WORKER_POD_FIELDS`.
    let pod = |s: &TrainingJobSpec| {
        let p = s.workers.pod.clone().unwrap_or_default();
        (
            (p.labels, p.annotations, p.node_selector, p.tolerations),
            (p.priority_class_name, p.service_account_name, p.automount_service_account_token),
            (p.image_pull_secrets, p.env),
        )
    };
    frozen(
        suspended || pod(old) == pod(new),
        "workers.pod",
        "workers.pod labels, annotations, nodeSelector, tolerations, priorityClassName, serviceAccountName, \
         automountServiceAccountToken, imagePullSecrets and env change only with runPolicy.suspend: true",
    );
    if errs.is_empty() { Ok(()) } else { Err(errs) }
}
