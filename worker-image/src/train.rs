//! The training loop: pull every `pullEvery` steps, forward/backward on a local batch, push the
//! accumulated gradient every `pushEvery` steps, report, evaluate at each epoch's end.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use foresight_ps::client::{ClientError, GradDtype, PsClient};
use foresight_ps::server::Report;
use foresight_ps::wire::progress::WorkerEvent as Event;
use foresight_ps::wire::{Layout, TensorSpec};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tch::{Device, Kind, Tensor};

use crate::data::{Dataset, Examples, Format};
use crate::metrics::WorkerMetrics;
use crate::model::{Model, ModelSpec};

#[derive(Clone, Debug)]
pub struct TrainConfig {
    pub ps_url: String,
    pub token: Option<String>,
    pub worker: usize,
    pub workers: usize,
    pub model: ModelSpec,
    pub format: Format,
    pub data_dir: PathBuf,
    pub holdout: f64,
    pub epochs: usize,
    pub batch_size: usize,
    pub seed: u64,
    pub pull_every: u64,
    pub push_every: u64,
    pub grad_dtype: GradDtype,
    /// Give up when the PS has been unreachable this long.
    pub ps_deadline: Duration,
    pub report_every: u64,
    /// Sleep (factor − 1) × step time after each step: a straggler for experiments.
    pub slowdown: f64,
}

fn emit(e: &Event) {
    println!("{}", serde_json::to_string(e).expect("plain data"));
}

/// Retries transient failures with exponential backoff and jitter until `deadline` has passed
/// since the last success.
struct Retry {
    deadline: Duration,
    rng: rand::rngs::StdRng,
}

impl Retry {
    fn run<T, F, Fut>(&mut self, rt: &tokio::runtime::Runtime, what: &str, mut f: F) -> Result<T, ClientError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        let started = Instant::now();
        let mut backoff = Duration::from_millis(100);
        loop {
            match rt.block_on(f()) {
                Ok(v) => return Ok(v),
                Err(e) if retryable(&e) && started.elapsed() < self.deadline => {
                    let jitter = self.rng.random_range(0.5..1.5);
                    let wait = backoff.mul_f64(jitter);
                    tracing::warn!(error = %e, retry_in_ms = wait.as_millis() as u64, "{what} failed; retrying");
                    std::thread::sleep(wait);
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                Err(e) => {
                    if retryable(&e) {
                        tracing::error!(error = %e, "{what}: giving up after {}s without success", self.deadline.as_secs());
                    }
                    return Err(e);
                }
            }
        }
    }
}

/// Transient errors, plus `not_registered`: a worker may start before the first one registered.
fn retryable(e: &ClientError) -> bool {
    e.is_transient() || e.reason() == Some("not_registered")
}

struct Batches<'a> {
    data: &'a Examples,
    order: Vec<usize>,
    batch: usize,
    pos: usize,
}

impl Iterator for Batches<'_> {
    type Item = (Tensor, Tensor);
    fn next(&mut self) -> Option<Self::Item> {
        if self.pos >= self.order.len() {
            return None;
        }
        let idx = &self.order[self.pos..(self.pos + self.batch).min(self.order.len())];
        self.pos += idx.len();
        Some(to_tensors(&self.data.select(idx)))
    }
}

fn to_tensors(ex: &Examples) -> (Tensor, Tensor) {
    let [c, h, w] = ex.shape.map(|d| d as i64);
    let xs = Tensor::from_slice(&ex.pixels).view([ex.len() as i64, c, h, w]);
    let ys = Tensor::from_slice(&ex.labels);
    (xs, ys)
}

/// Held-out loss and accuracy, in eval mode, without gradients.
pub fn evaluate(model: &mut Model, test: &Examples, device: Device) -> anyhow::Result<(f64, f64)> {
    let _guard = tch::no_grad_guard();
    let (mut loss, mut correct, n) = (0f64, 0f64, test.len());
    let order: Vec<usize> = (0..n).collect();
    for idx in order.chunks(1000) {
        let (xs, ys) = to_tensors(&test.select(idx));
        let (xs, ys) = (xs.to_device(device), ys.to_device(device));
        let logits = model.forward(&xs, false)?;
        loss += logits.cross_entropy_for_logits(&ys).double_value(&[]) * idx.len() as f64;
        correct +=
            logits.argmax(-1, false).eq_tensor(&ys).to_kind(Kind::Float).sum(Kind::Float).double_value(&[]);
    }
    Ok((loss / n as f64, correct / n as f64))
}

/// Flattens the gradients of `params` into `out` (adding), in layout order.
fn add_grads(params: &[(String, Tensor)], out: &mut [f32]) -> anyhow::Result<()> {
    let mut off = 0;
    for (name, p) in params {
        let g = p.grad();
        let n = p.numel();
        let target = &mut out[off..off + n];
        if g.defined() {
            let host: Vec<f32> = Vec::try_from(g.to_device(Device::Cpu).to_kind(Kind::Float).flatten(0, -1))
                .with_context(|| format!("reading the gradient of {name}"))?;
            for (t, v) in target.iter_mut().zip(host) {
                *t += v;
            }
        }
        off += n;
    }
    Ok(())
}

/// Copies the flat model `values` into `params`.
fn load_params(params: &[(String, Tensor)], values: &[f32]) {
    let _guard = tch::no_grad_guard();
    let mut off = 0;
    for (_, p) in params {
        let n = p.numel();
        let src = Tensor::from_slice(&values[off..off + n]).view_as(p).to_device(p.device());
        p.shallow_clone().copy_(&src);
        off += n;
    }
}

fn flat_params(params: &[(String, Tensor)]) -> anyhow::Result<Vec<f32>> {
    let mut out = Vec::new();
    for (name, p) in params {
        let v: Vec<f32> =
            Vec::try_from(p.detach().to_device(Device::Cpu).to_kind(Kind::Float).flatten(0, -1))
                .with_context(|| format!("reading parameter {name}"))?;
        out.extend(v);
    }
    Ok(out)
}

fn layout_of(params: &[(String, Tensor)]) -> anyhow::Result<Layout> {
    let specs = params
        .iter()
        .map(|(name, p)| TensorSpec {
            name: name.clone(),
            shape: p.size().iter().map(|&d| d as usize).collect(),
        })
        .collect();
    Ok(Layout::new(specs)?)
}

pub fn run(cfg: &TrainConfig, rt: &tokio::runtime::Runtime, metrics: &WorkerMetrics) -> anyhow::Result<()> {
    let started = Instant::now();
    let ds = Dataset::load(cfg.format, &cfg.data_dir, cfg.seed, cfg.holdout)?;
    let shard = ds.shard(cfg.worker, cfg.workers, cfg.seed);
    anyhow::ensure!(
        !shard.is_empty(),
        "worker {}'s shard of {} examples is empty",
        cfg.worker,
        ds.train.len()
    );
    let device = Device::cuda_if_available();
    tracing::info!(
        worker = cfg.worker, device = ?device, train = shard.len(), test = ds.test.len(),
        shape = ?shard.shape, "data loaded"
    );
    // Same seed on every worker: whichever registers first, the initial weights are the same.
    tch::manual_seed(cfg.seed as i64);
    let mut model = Model::build(&cfg.model, shard.shape, ds.classes, device)?;
    let params = model.parameters()?;
    let layout = layout_of(&params)?;
    let client = PsClient::new(&cfg.ps_url, cfg.token.clone())?;
    let mut retry = Retry {
        deadline: cfg.ps_deadline,
        rng: rand::rngs::StdRng::seed_from_u64(cfg.seed ^ cfg.worker as u64),
    };
    let init = flat_params(&params)?;
    let registered = retry.run(rt, "registering the model", || client.register(&layout, &init))?;
    tracing::info!(worker = cfg.worker, registered, parameters = layout.len(), "model layout ready");

    let mut grad = vec![0f32; layout.len()];
    let (mut step, mut pushes, mut discarded) = (0u64, 0u64, 0u64);
    let mut version: Option<u64> = None; // the version the local model holds
    let mut wait_for: Option<u64> = None; // sync: the version the next pull must reach
    let mut last_staleness = None;
    let mut rng = rand::rngs::StdRng::seed_from_u64(cfg.seed.wrapping_add(cfg.worker as u64 * 7919));
    let per_worker = ds.train.len() / cfg.workers;
    let steps_per_epoch = per_worker.div_ceil(cfg.batch_size) as f64;
    let mut window = (Instant::now(), 0usize);
    'epochs: for epoch in 0..cfg.epochs {
        let mut order: Vec<usize> = (0..shard.len()).collect();
        order.shuffle(&mut rng);
        // Every worker takes the same number of steps per epoch (the smallest shard's), so
        // `sync` rounds always find all M workers; the few extra examples of larger shards
        // are simply visited in other epochs.
        order.truncate(per_worker);
        let batches = Batches { data: &shard, order, batch: cfg.batch_size, pos: 0 };
        for (i, (xs, ys)) in batches.enumerate() {
            let t0 = Instant::now();
            if version.is_none() || step % cfg.pull_every == 0 || wait_for.is_some() {
                let min = wait_for.take();
                let model_now = retry.run(rt, "pulling the model", || async {
                    loop {
                        if let Some(m) = client.pull(cfg.worker, min, Duration::from_secs(30)).await? {
                            return Ok(m);
                        }
                    }
                })?;
                anyhow::ensure!(
                    model_now.layout == layout,
                    "the parameter server holds a model whose layout differs from this worker's model \
                     (restored from another job's checkpoint?)"
                );
                load_params(&params, &model_now.values);
                version = Some(model_now.version);
            }
            let (xs, ys) = (xs.to_device(device), ys.to_device(device));
            for (_, p) in &params {
                let mut g = p.grad();
                if g.defined() {
                    let _ = g.zero_();
                }
            }
            let loss = model.forward(&xs, true)?.cross_entropy_for_logits(&ys);
            loss.backward();
            add_grads(&params, &mut grad)?;
            let loss = loss.double_value(&[]);
            step += 1;
            if step % cfg.push_every == 0 {
                if cfg.push_every > 1 {
                    let k = cfg.push_every as f32;
                    grad.iter_mut().for_each(|g| *g /= k);
                }
                let v = version.expect("pulled before the first step");
                let at = epoch as f64 + (i + 1) as f64 / steps_per_epoch;
                let sent = retry.run(rt, "pushing a gradient", || {
                    client.push(cfg.worker, v, step, Some(at), &layout, &grad, cfg.grad_dtype)
                });
                grad.fill(0.0);
                match sent {
                    Ok(reply) => {
                        pushes += 1;
                        last_staleness = Some(reply.staleness);
                        if !reply.applied {
                            wait_for = Some(reply.version + 1);
                        }
                    }
                    Err(e)
                        if matches!(e.reason(), Some("pull_required" | "too_stale" | "future_version")) =>
                    {
                        discarded += 1;
                        tracing::info!(reason = e.reason(), "gradient discarded; pulling again");
                        version = None;
                    }
                    Err(e) if e.reason() == Some("already_contributed") => wait_for = Some(v + 1),
                    Err(e) if e.reason() == Some("finalized") => {
                        tracing::info!("the job was finalized; stopping");
                        break 'epochs;
                    }
                    Err(e) => return Err(e).context(format!("pushing the gradient of step {step}")),
                }
            }
            let dt = t0.elapsed();
            if cfg.slowdown > 1.0 {
                std::thread::sleep(dt.mul_f64(cfg.slowdown - 1.0));
            }
            metrics.step(dt.as_secs_f64() * cfg.slowdown.max(1.0), xs.size()[0] as u64, loss);
            window.1 += xs.size()[0] as usize;
            if step % cfg.report_every == 0 {
                let sps = window.1 as f64 / window.0.elapsed().as_secs_f64();
                window = (Instant::now(), 0);
                let at = epoch as f64 + (i + 1) as f64 / steps_per_epoch;
                emit(&Event::Progress {
                    worker: cfg.worker,
                    epoch: at,
                    step,
                    loss,
                    samples_per_second: sps,
                    staleness: last_staleness,
                });
                let report = Report {
                    worker: cfg.worker,
                    step,
                    epoch: at,
                    loss,
                    accuracy: None,
                    samples_per_second: Some(sps),
                };
                retry.run(rt, "reporting", || client.report(&report))?;
            }
        }
        let (loss, accuracy) = evaluate(&mut model, &ds.test, device)?;
        metrics.accuracy.set(accuracy);
        emit(&Event::Eval { worker: cfg.worker, epoch: epoch + 1, loss, accuracy });
        let report = Report {
            worker: cfg.worker,
            step,
            epoch: (epoch + 1) as f64,
            loss,
            accuracy: Some(accuracy),
            samples_per_second: None,
        };
        retry.run(rt, "reporting", || client.report(&report))?;
    }
    // The final word is the PS's model, evaluated here.
    let final_model = retry.run(rt, "pulling the final model", || async {
        client.pull(cfg.worker, None, Duration::ZERO).await?.ok_or(ClientError::MissingVersion)
    })?;
    load_params(&params, &final_model.values);
    let (test_loss, test_accuracy) = evaluate(&mut model, &ds.test, device)?;
    metrics.accuracy.set(test_accuracy);
    emit(&Event::Done {
        worker: cfg.worker,
        steps: step,
        pushes,
        discarded,
        test_loss,
        test_accuracy,
        seconds: started.elapsed().as_secs_f64(),
    });
    Ok(())
}
