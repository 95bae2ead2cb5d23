//! The environment a job's processes receive. The operator puts it in the pod specs;
//! `foresight run` passes it to local processes — the same variables either way.

use super::TrainingJobSpec;

type Env = Vec<(String, String)>;

fn push(env: &mut Env, k: &str, v: impl ToString) {
    env.push((k.to_string(), v.to_string()));
}

/// The parameter server's settings (its `FORESIGHT_*` flags' environment variables).
pub fn ps_env(spec: &TrainingJobSpec, job: &str, namespace: &str) -> Env {
    let mut env = Env::new();
    let o = &spec.optimizer;
    push(&mut env, "FORESIGHT_JOB_NAME", job);
    push(&mut env, "FORESIGHT_NAMESPACE", namespace);
    push(&mut env, "FORESIGHT_WORKERS", spec.workers.replicas);
    push(&mut env, "FORESIGHT_ALGORITHM", o.algorithm().as_str());
    push(&mut env, "FORESIGHT_LEARNING_RATE", spec.training.learning_rate);
    if let Some(d) = &spec.training.lr_decay {
        push(&mut env, "FORESIGHT_LR_DECAY_FACTOR", d.factor);
        let ms: Vec<String> = d.milestones.iter().map(f64::to_string).collect();
        // No milestones, no decay: the PS takes no empty list.
        if !ms.is_empty() {
            push(&mut env, "FORESIGHT_LR_MILESTONES", ms.join(","));
        }
    }
    if let Some(w) = spec.training.lr_warmup_epochs {
        push(&mut env, "FORESIGHT_LR_WARMUP_EPOCHS", w);
    }
    if let Some(l) = o.lambda0 {
        push(&mut env, "FORESIGHT_LAMBDA0", l);
    }
    if let Some(m) = o.mean_square_decay {
        push(&mut env, "FORESIGHT_MEAN_SQUARE_DECAY", m);
    }
    if let Some(s) = o.max_staleness.filter(|&s| s > 0) {
        push(&mut env, "FORESIGHT_MAX_STALENESS", s);
    }
    if let Some(m) = o.momentum {
        push(&mut env, "FORESIGHT_MOMENTUM", m);
    }
    if o.nesterov == Some(true) {
        push(&mut env, "FORESIGHT_NESTEROV", true);
    }
    if let Some(n) = o.momentum_delay.filter(|&n| n > 1) {
        push(&mut env, "FORESIGHT_MOMENTUM_DELAY", n);
    }
    // bf16 and int8 pulls cost the PS a body encoded per pull, int8 also a copy of the model per
    // worker: its memory plan counts them.
    if let Some(d) = o.pull_dtype.filter(|d| *d != super::PullDtype::F32) {
        push(&mut env, "FORESIGHT_PULL_DTYPE", d.as_str());
    }
    if let Some(w) = o.weight_decay {
        push(&mut env, "FORESIGHT_WEIGHT_DECAY", w);
    }
    // The PS reads the same JSON (`foresight-ps --parameter-groups`).
    if let Some(g) = o.parameter_groups.as_ref().filter(|g| !g.is_empty()) {
        push(&mut env, "FORESIGHT_PARAMETER_GROUPS", serde_json::to_string(g).expect("plain data"));
    }
    if let Some(b) = o.backup_workers {
        push(&mut env, "FORESIGHT_BACKUP_WORKERS", b);
    }
    if let Some(t) = o.sync_round_timeout_seconds {
        push(&mut env, "FORESIGHT_SYNC_ROUND_TIMEOUT", t);
    }
    if let (Some(a), Some(h)) = (&o.adaptive_local_steps, o.local_steps) {
        push(&mut env, "FORESIGHT_LOCAL_STEPS", h);
        push(&mut env, "FORESIGHT_LOCAL_STEPS_MIN", a.min);
        push(&mut env, "FORESIGHT_LOCAL_STEPS_MAX", a.max);
        if let Some(f) = a.communication_fraction {
            push(&mut env, "FORESIGHT_COMMUNICATION_FRACTION", f);
        }
    }
    if let Some(i) = spec.parameter_server.checkpoint.as_ref().and_then(|c| c.interval_seconds) {
        push(&mut env, "FORESIGHT_CHECKPOINT_INTERVAL", i);
    }
    env
}

/// A worker's settings, except its index (`FORESIGHT_WORKER_INDEX`: the Indexed Job's
/// completion index in a cluster, set by the caller locally) and the token.
pub fn worker_env(spec: &TrainingJobSpec, job: &str, namespace: &str, ps_url: &str) -> Env {
    let mut env = Env::new();
    let t = &spec.training;
    push(&mut env, "FORESIGHT_PS_URL", ps_url);
    push(&mut env, "FORESIGHT_JOB_NAME", job);
    push(&mut env, "FORESIGHT_NAMESPACE", namespace);
    // No worker count: a worker learns it from the PS when it joins, so that scaling the job
    // changes the Job's completions and parallelism but never its pod template.
    match (&spec.model.name, &spec.model.torchscript) {
        (Some(name), _) => push(&mut env, "FORESIGHT_MODEL", name.as_str()),
        (None, Some(ts)) => {
            push(&mut env, "FORESIGHT_MODEL", "torchscript");
            push(&mut env, "FORESIGHT_MODEL_PATH", &ts.path);
        }
        (None, None) => {}
    }
    push(&mut env, "FORESIGHT_DATASET_FORMAT", spec.dataset.format.as_str());
    push(&mut env, "FORESIGHT_DATASET_PATH", &spec.dataset.path);
    if let Some(h) = spec.dataset.holdout {
        push(&mut env, "FORESIGHT_HOLDOUT", h);
    }
    push(&mut env, "FORESIGHT_EPOCHS", t.epochs);
    push(&mut env, "FORESIGHT_BATCH_SIZE", t.batch_size);
    push(&mut env, "FORESIGHT_SEED", t.seed);
    push(&mut env, "FORESIGHT_PULL_EVERY", spec.optimizer.pull_every);
    push(&mut env, "FORESIGHT_PUSH_EVERY", spec.optimizer.push_every);
    if let Some(h) = spec.optimizer.local_steps.filter(|&h| h > 1) {
        push(&mut env, "FORESIGHT_LOCAL_STEPS", h);
    }
    // Only when set: the worker template of a job that leaves it out stays as it was.
    if let Some(d) = spec.optimizer.gradient_dtype {
        push(&mut env, "FORESIGHT_GRAD_DTYPE", d.as_str());
    }
    if let Some(d) = spec.optimizer.pull_dtype {
        push(&mut env, "FORESIGHT_PULL_DTYPE", d.as_str());
    }
    if let Some(inner) = &spec.optimizer.inner_optimizer {
        push(&mut env, "FORESIGHT_INNER_OPTIMIZER", inner.algorithm.as_str());
        push(&mut env, "FORESIGHT_INNER_LEARNING_RATE", inner.learning_rate);
        if let Some(wd) = inner.weight_decay {
            push(&mut env, "FORESIGHT_INNER_WEIGHT_DECAY", wd);
        }
    }
    env
}
