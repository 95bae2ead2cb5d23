//! The training loop: pull every `pullEvery` steps, forward/backward on a local batch, push the
//! accumulated gradient every `pushEvery` steps, report, evaluate at the end of every M-th epoch
//! (one worker per epoch of data, in turn). With `localSteps` the worker's own optimizer trains
//! between exchanges and the pseudo-gradient θ_pulled − θ_local is pushed. Each phase's time is
//! kept (`crate::clock`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use foresight_ps::client::{
    Cadence, ClientError, ClientTls, Exchange, Joined, PsClient, Retry, Session, StepEnd, shard,
};
use foresight_ps::wire::progress::WorkerEvent as Event;
use foresight_ps::wire::protocol::Report;
use foresight_ps::wire::{Layout, TensorSpec, buffers};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use tch::{Device, Kind, Tensor};

use crate::clock::{Phase, PhaseClock};
use crate::data::{Dataset, Examples, Format};
use crate::exit::permanent;
use crate::inner::{Inner, InnerConfig};
use crate::metrics::WorkerMetrics;
use crate::model::{Model, ModelSpec};
use crate::slowdown::Slowdown;

#[derive(Clone, Debug)]
pub struct TrainConfig {
    pub ps_url: String,
    /// The roots trusted for an https:// `ps_url`.
    pub ps_tls: Option<ClientTls>,
    pub token: Option<String>,
    pub worker: usize,
    pub model: ModelSpec,
    pub format: Format,
    pub data_dir: PathBuf,
    pub holdout: f64,
    pub epochs: usize,
    pub batch_size: usize,
    pub seed: u64,
    pub cadence: Cadence,
    /// With local steps (`cadence.local()`): the optimizer that trains them.
    pub inner: Option<InnerConfig>,
    /// Give up when the PS has been unreachable this long.
    pub ps_deadline: Duration,
    pub report_every: u64,
    /// A device this many times slower: a straggler for experiments ([`Slowdown`]).
    pub slowdown: f64,
}

fn emit(e: &Event) {
    println!("{}", serde_json::to_string(e).expect("plain data"));
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

pub(crate) fn to_tensors(ex: &Examples) -> (Tensor, Tensor) {
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

/// `values` as a flat CPU tensor over the same memory: no copy. The tensor must not outlive the
/// borrow, so the callers drop it in the statement that made it.
fn over(values: &[f32]) -> Tensor {
    // SAFETY: only read (a copy's source) while the shared borrow keeps `values` alive.
    unsafe { blob(values.as_ptr().cast_mut(), values.len()) }
}

/// [`over`], for writing into `values`.
fn over_mut(values: &mut [f32]) -> Tensor {
    // SAFETY: the exclusive borrow keeps `values` alive and unaliased while the tensor lives.
    unsafe { blob(values.as_mut_ptr(), values.len()) }
}

/// # Safety
/// `ptr` must point to `len` floats that stay alive, and that nothing else writes, for as long
/// as the returned tensor lives (libtorch never frees memory it did not allocate).
unsafe fn blob(ptr: *mut f32, len: usize) -> Tensor {
    unsafe { Tensor::from_blob(ptr.cast::<u8>().cast_const(), &[len as i64], &[1], Kind::Float, Device::Cpu) }
}

/// Adds the gradients of `params` into `out` (flat, in layout order): one pass over each
/// gradient, straight into the push buffer.
fn add_grads(params: &[(String, Tensor)], out: &mut [f32]) -> anyhow::Result<()> {
    let mut off = 0;
    for (name, p) in params {
        let g = p.grad();
        let n = p.numel();
        if g.defined() {
            let g = g.to_device(Device::Cpu).to_kind(Kind::Float).flatten(0, -1);
            // (`add_` returns the view it wrote into: nothing more to keep.)
            let _ = over_mut(&mut out[off..off + n])
                .f_add_(&g)
                .with_context(|| format!("adding the gradient of {name}"))?;
        }
        off += n;
    }
    Ok(())
}

/// The model's buffers (BatchNorm statistics) as a leave's body, for the final model; `None`
/// for a model without any.
fn buffers_body(model: &Model) -> anyhow::Result<Option<Vec<u8>>> {
    let mut tensors = Vec::new();
    for (name, t) in model.buffers() {
        let values: Vec<f32> =
            Vec::try_from(t.detach().to_device(Device::Cpu).to_kind(Kind::Float).flatten(0, -1))
                .with_context(|| format!("reading buffer {name}"))?;
        let shape = t.size().iter().map(|&d| d as usize).collect();
        tensors.push((name, "F32".to_string(), shape, values.iter().flat_map(|v| v.to_le_bytes()).collect()));
    }
    Ok((!tensors.is_empty()).then(|| buffers::body(&tensors, &Default::default())))
}

/// Copies the flat model `values` into `params`: one copy each, straight from `values`.
pub(crate) fn load_params(params: &[(String, Tensor)], values: &[f32]) {
    let _guard = tch::no_grad_guard();
    let mut off = 0;
    for (_, p) in params {
        let n = p.numel();
        p.shallow_clone().copy_(&over(&values[off..off + n]).view_as(p));
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

pub(crate) fn layout_of(params: &[(String, Tensor)]) -> anyhow::Result<Layout> {
    let specs = params
        .iter()
        .map(|(name, p)| TensorSpec {
            name: name.clone(),
            shape: p.size().iter().map(|&d| d as usize).collect(),
        })
        .collect();
    Ok(Layout::new(specs)?)
}

/// Where a worker is in its data: steps are numbered from 1 across epochs, and every epoch has
/// the same number of steps, so a step number alone says which epoch and batch come next.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Position {
    steps_per_epoch: u64,
}

impl Position {
    /// (epoch, batch within it) of the step after `done` steps.
    fn after(&self, done: u64) -> (u64, u64) {
        (done / self.steps_per_epoch, done % self.steps_per_epoch)
    }

    /// The fractional epoch reached at the end of step `step` (drives the LR schedule).
    fn epoch_at(&self, step: u64) -> f64 {
        step as f64 / self.steps_per_epoch as f64
    }
}

/// Samples trained since the last progress report, and when that window began.
struct Window {
    since: Instant,
    samples: usize,
}

pub fn run(cfg: &TrainConfig, rt: &tokio::runtime::Runtime, metrics: &WorkerMetrics) -> anyhow::Result<()> {
    let started = Instant::now();
    let ds = Dataset::load(cfg.format, &cfg.data_dir, cfg.seed, cfg.holdout).map_err(permanent)?;
    let device = Device::cuda_if_available();
    // Same seed on every worker: whichever registers first, the initial weights are the same.
    tch::manual_seed(cfg.seed as i64);
    let mut model = Model::build(&cfg.model, ds.train.shape, ds.classes, device).map_err(permanent)?;
    let params = model.parameters().map_err(permanent)?;
    let layout = layout_of(&params).map_err(permanent)?;
    let clients = PsClient::for_shards(&cfg.ps_url, cfg.token.clone(), cfg.ps_tls.as_ref())?;
    let retry = Retry::new(cfg.ps_deadline, cfg.seed ^ cfg.worker as u64);
    let init = flat_params(&params)?;
    let (session, joined) = Session::start(clients, rt.handle().clone(), cfg.worker, layout, &init, retry)?;
    // The job's worker count as the PS has it now (the job may have been scaled since it
    // started): this process's shard is taken by it, and kept until the process ends.
    let workers = joined.workers;
    // (The PS refuses the join of an index beyond its count, so `worker < workers` here.)
    if workers == 0 {
        return Err(permanent(anyhow::anyhow!(
            "the parameter server did not say how many workers the job has (a PS older than this worker?)"
        )));
    }
    let shard = ds.shard(cfg.worker, workers, cfg.seed);
    if shard.is_empty() {
        let why = format!("worker {}'s shard of {} examples is empty", cfg.worker, ds.train.len());
        return Err(permanent(anyhow::anyhow!(why)));
    }
    tracing::info!(
        worker = cfg.worker, workers, device = ?device, train = shard.len(), test = ds.test.len(),
        shape = ?shard.shape, "data loaded"
    );

    let per_worker = shard::per_worker(ds.train.len(), workers);
    let pos = Position { steps_per_epoch: shard::steps_per_epoch(ds.train.len(), workers, cfg.batch_size) };
    let total = pos.steps_per_epoch * cfg.epochs as u64;
    let joined = Joined { resume_step: joined.resume_step.min(total), ..joined };
    let (first_epoch, first_batch) = pos.after(joined.resume_step);
    if joined.resume_step > 0 {
        tracing::info!(
            worker = cfg.worker,
            step = joined.resume_step,
            epoch = first_epoch,
            batch = first_batch,
            "resuming where this worker's earlier process left off"
        );
    }
    let mut ps = Exchange::new(session, &joined, cfg.cadence);
    let mut local = cfg.inner.map(|c| LocalSteps { inner: Inner::new(c), pulled: Vec::new() });
    let mut window = Window { since: Instant::now(), samples: 0 };
    let mut rng = rand::rngs::StdRng::seed_from_u64(cfg.seed.wrapping_add(cfg.worker as u64 * 7919));
    let mut clock = PhaseClock::start(metrics);
    let mut slowdown = Slowdown::new(cfg.slowdown);
    'epochs: for epoch in 0..cfg.epochs as u64 {
        // Every epoch's order is drawn, resumed ones included, so that the generator is where
        // the earlier process had it.
        let mut order: Vec<usize> = (0..shard.len()).collect();
        order.shuffle(&mut rng);
        if epoch < first_epoch {
            continue;
        }
        order.truncate(per_worker);
        let skip = if epoch == first_epoch { first_batch as usize } else { 0 };
        let batches = Batches { data: &shard, order, batch: cfg.batch_size, pos: skip * cfg.batch_size };
        for (xs, ys) in batches {
            let (xs, ys) = (xs.to_device(device), ys.to_device(device));
            clock.end(Phase::Batch);
            let pulled = ps.pull_if_due().map_err(pull_error)?;
            // A straggler is a slower device, not a slower link or a longer wait for a round:
            // the slowdown stretches only the step's own work, the exchange's time stays.
            let mut network = clock.end(Phase::Pull);
            if let Some(m) = pulled {
                load_params(&params, &m.values);
                // The values no longer needed go back for the next pull to be copied into.
                let spent = match &mut local {
                    Some(l) => std::mem::replace(&mut l.pulled, m.values),
                    None => m.values,
                };
                ps.recycle(spent);
            }
            let mut work = clock.end(Phase::Load);
            let loss = backward(&mut model, &params, &xs, &ys)?;
            if let Some(l) = &mut local {
                l.inner.step(&params);
            }
            work += clock.end(Phase::Compute);
            match &local {
                None => add_grads(&params, ps.grad_mut())?,
                Some(l) if ps.push_due_next() => l.pseudo_gradient(&params, ps.grad_mut())?,
                Some(_) => {}
            }
            work += clock.end(Phase::Gather);
            let at = pos.epoch_at(ps.step() + 1);
            let end = ps
                .end_step(Some(at))
                .with_context(|| format!("pushing the gradient of step {}", ps.step()))?;
            network += clock.end(Phase::Push);
            if end == StepEnd::Finalized {
                break 'epochs;
            }
            let mut step_time = network + work;
            if let Some(slow) = &mut slowdown {
                let extra = slow.extra(work);
                std::thread::sleep(extra);
                clock.end(Phase::Slowdown);
                step_time += extra;
            }
            let step_time = step_time.as_secs_f64();
            metrics.step(step_time, xs.size()[0] as u64, loss);
            window.samples += xs.size()[0] as usize;
            if ps.step().is_multiple_of(cfg.report_every) {
                let at = pos.epoch_at(ps.step());
                report_progress(&mut ps, &mut window, cfg.worker, at, loss)?;
            }
            clock.end(Phase::Report);
        }
        if evaluates_after(epoch, cfg.worker, workers) {
            let (loss, accuracy) = evaluate(&mut model, &ds.test, device)?;
            metrics.accuracy.set(accuracy);
            emit(&Event::Eval { worker: cfg.worker, epoch: (epoch + 1) as usize, loss, accuracy });
            let report = Report {
                worker: cfg.worker,
                step: ps.step(),
                epoch: (epoch + 1) as f64,
                loss,
                accuracy: Some(accuracy),
                samples_per_second: None,
            };
            ps.report(&report)?;
        }
        clock.end(Phase::Evaluate);
    }
    // Local steps left over since the last exchange go with finish(), as a pseudo-gradient.
    if let Some(l) = local.as_ref().filter(|_| ps.steps_unsent() > 0) {
        l.pseudo_gradient(&params, ps.grad_mut())?;
    }
    // The final word is the PS's model, evaluated here.
    let final_model = ps.finish(buffers_body(&model)?)?;
    load_params(&params, &final_model.values);
    let (test_loss, test_accuracy) = evaluate(&mut model, &ds.test, device)?;
    metrics.accuracy.set(test_accuracy);
    let stats = ps.stats();
    emit(&Event::Done {
        worker: cfg.worker,
        steps: ps.step(),
        pushes: stats.pushes,
        discarded: stats.discarded,
        test_loss: Some(test_loss),
        test_accuracy: Some(test_accuracy),
        seconds: started.elapsed().as_secs_f64(),
        phases: Some(clock.totals()),
        last: ps.final_model().is_some(),
    });
    Ok(())
}

/// Whether this worker evaluates its copy on the held-out set at the end of its `epoch`: one
/// worker per epoch of data, in turn (worker w after its epochs w, w + M, …). Each of the M
/// workers' epochs is 1/M of an epoch of data, so if every worker evaluated after each of its
/// own the job would evaluate M times as often as one process training alone, and at M = 8
/// that took half of every worker's time (docs/comparison.md).
fn evaluates_after(epoch: u64, worker: usize, workers: usize) -> bool {
    epoch % workers as u64 == (worker % workers) as u64
}

/// A model of another layout at the PS is the job's configuration's fault: no retry helps.
fn pull_error(e: ClientError) -> anyhow::Error {
    if matches!(e, ClientError::OtherModel(_)) { permanent(e) } else { e.into() }
}

/// A worker's local steps between exchanges: the inner optimizer and the model pulled last.
struct LocalSteps {
    inner: Inner,
    pulled: Vec<f32>,
}

impl LocalSteps {
    /// θ_pulled − θ_local into `out`: what the exchange pushes after the local steps.
    fn pseudo_gradient(&self, params: &[(String, Tensor)], out: &mut [f32]) -> anyhow::Result<()> {
        let now = flat_params(params)?;
        for ((o, p), x) in out.iter_mut().zip(&self.pulled).zip(now) {
            *o = p - x;
        }
        Ok(())
    }
}

/// Forward and backward on one batch (the gradients stay on the parameters); returns the loss.
fn backward(model: &mut Model, params: &[(String, Tensor)], xs: &Tensor, ys: &Tensor) -> anyhow::Result<f64> {
    for (_, p) in params {
        let mut g = p.grad();
        if g.defined() {
            let _ = g.zero_();
        }
    }
    let loss = model.forward(xs, true)?.cross_entropy_for_logits(ys);
    loss.backward();
    Ok(loss.double_value(&[]))
}

fn report_progress(
    ps: &mut Exchange,
    window: &mut Window,
    worker: usize,
    epoch: f64,
    loss: f64,
) -> anyhow::Result<()> {
    let sps = window.samples as f64 / window.since.elapsed().as_secs_f64();
    *window = Window { since: Instant::now(), samples: 0 };
    let step = ps.step();
    let staleness = ps.stats().last_staleness;
    emit(&Event::Progress { worker, epoch, step, loss, samples_per_second: sps, staleness });
    let report = Report { worker, step, epoch, loss, accuracy: None, samples_per_second: Some(sps) };
    Ok(ps.report(&report)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gradients_are_added_into_the_buffer_and_a_model_loads_straight_from_its_values() {
        let vs = tch::nn::VarStore::new(Device::Cpu);
        let w = vs.root().var("w", &[2, 3], tch::nn::Init::Const(0.0));
        let b = vs.root().var("b", &[2], tch::nn::Init::Const(0.0));
        let params = vec![("w".to_string(), w.shallow_clone()), ("b".to_string(), b.shallow_clone())];
        let values: Vec<f32> = (1..=8).map(|v| v as f32).collect();
        load_params(&params, &values);
        assert_eq!(flat_params(&params).unwrap(), values);
        assert_eq!(Vec::<f32>::try_from(w.get(1)).unwrap(), [4.0, 5.0, 6.0]);

        // loss = Σ w·x + 10 Σ b: dL/dw = x, dL/db = 10.
        let x = Tensor::from_slice(&[1.0f32, -2.0, 0.5]);
        let loss = (w.matmul(&x)).sum(Kind::Float) + b.sum(Kind::Float) * 10.0;
        loss.backward();
        let mut buf = vec![1.0f32; 8];
        add_grads(&params, &mut buf).unwrap();
        add_grads(&params, &mut buf).unwrap();
        assert_eq!(buf, [3.0, -3.0, 2.0, 3.0, -3.0, 2.0, 21.0, 21.0]);
        assert_eq!(flat_params(&params).unwrap(), values, "the parameters are untouched");
    }

    #[test]
    fn one_worker_evaluates_each_epoch_of_data_in_turn() {
        let who = |epoch| (0..8).filter(|&w| evaluates_after(epoch, w, 8)).collect::<Vec<_>>();
        assert_eq!((who(0), who(7), who(8), who(11)), (vec![0], vec![7], vec![0], vec![3]));
        assert!((0..5).all(|e| evaluates_after(e, 0, 1)), "alone, a worker evaluates every epoch");
    }

    #[test]
    fn a_step_number_says_which_epoch_and_batch_come_next() {
        let pos = Position { steps_per_epoch: 40 };
        assert_eq!(pos.after(0), (0, 0));
        assert_eq!(pos.after(39), (0, 39));
        assert_eq!(pos.after(40), (1, 0));
        assert_eq!(pos.after(85), (2, 5));
        assert_eq!(pos.epoch_at(60), 1.5);
    }
}
