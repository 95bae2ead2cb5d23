//! `foresight-worker simulate`: M virtual workers in one process against the parameter server's
//! own store and update rules, with the staleness chosen by a delay model instead of by the
//! machine. Same arguments, same seed → bit-identical model (the outcome's `digest`).
//!
//! Every gradient comes from one seeded stream of shuffled batches of the training set (an epoch
//! is one pass); the delay model decides only which model version each is computed on
//! ([`schedule::Plan`]). `sync` runs rounds of M gradients on the same version instead. Accuracy
//! and loss are the parameter server's model's, on the held-out split, at fixed update counts.

pub mod cli;
pub mod local;
pub mod mlp;
pub mod pulls;
pub mod pushes;
pub mod schedule;

use foresight_ps::client::{GradDtype, PullDtype};
use foresight_ps::optimizer::{Algorithm, Hyper};
use foresight_ps::store::{Push, StalenessSummary, Store, StoreError};
use foresight_ps::wire::{Layout, TensorSpec};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde::Serialize;

use local::{Inner, LocalSteps};
use mlp::{Mlp, Score};
use pulls::Puller;
use pushes::Pusher;
use schedule::{Delay, Plan};

/// Training and held-out examples as flat rows of `inputs` values.
pub struct SimData {
    pub inputs: usize,
    pub classes: usize,
    pub train_x: Vec<f32>,
    pub train_y: Vec<i64>,
    pub test_x: Vec<f32>,
    pub test_y: Vec<i64>,
}

/// One simulated run.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// The rule and its settings, as the parameter server takes them; the learning-rate
    /// milestones are in epochs.
    pub hyper: Hyper,
    /// The staleness of the asynchronous rules; `sync` uses only its worker count.
    pub delay: Delay,
    pub epochs: f64,
    pub batch: usize,
    pub hidden: usize,
    pub seed: u64,
    /// Points on the accuracy curve (evaluations of the PS model at evenly spaced updates).
    pub evals: usize,
    /// `Some`: each push is the pseudo-gradient of this many inner steps, not one gradient.
    pub local: Option<LocalSteps>,
    /// The type the workers pull the model in.
    pub pulls: PullDtype,
    /// The type the workers push in, and whether int8 pushes carry their rounding error into
    /// the next (error feedback, what a worker does).
    pub pushes: GradDtype,
    pub error_feedback: bool,
}

/// The PS model's held-out score after `updates` updates.
#[derive(Clone, Debug, Serialize)]
pub struct CurvePoint {
    pub updates: u64,
    pub epoch: f64,
    /// When that update was applied, in batch steps of a worker at full speed (a push of H
    /// local steps takes H), for the timed delay models (round-robin, straggler); computing is
    /// all the time there is here: pushes and pulls cost none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time: Option<f64>,
    pub loss: f64,
    pub accuracy: f64,
}

/// What a run did. Everything but `seconds` is a function of the configuration alone.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    pub algorithm: String,
    pub delay: String,
    pub seed: u64,
    /// Virtual workers (gradients in flight at once at most).
    pub workers: usize,
    /// Steps each push stands for (1: every step).
    pub local_steps: u64,
    pub updates: u64,
    pub gradients: u64,
    pub loss: f64,
    pub accuracy: f64,
    pub staleness: StalenessSummary,
    /// Mean λ_t over the updates' elements (dc-asgd rules; 0 otherwise).
    pub mean_lambda: f64,
    /// Share of the updated elements whose compensation gain λ·g² was clamped at 1/η.
    pub clamped_fraction: f64,
    /// The rule's base learning rate and momentum (the outer step's, with local steps).
    pub learning_rate: f32,
    pub momentum: f32,
    pub nesterov: bool,
    pub momentum_delay: u32,
    /// The type the workers pulled the model in, and the bytes of every pull's body.
    pub pull_dtype: String,
    pub pulled_bytes: u64,
    /// The type the workers pushed in, with or without error feedback (int8), and the bytes of
    /// every push's body.
    pub push_dtype: String,
    pub error_feedback: bool,
    pub pushed_bytes: u64,
    /// The safeguards the run had on ([`Hyper::safeguards`]).
    pub gain_clamp: bool,
    pub bias_correction: bool,
    pub curve: Vec<CurvePoint>,
    /// FNV-1a of the final parameters' bits: equal digests, bit-identical models.
    pub digest: String,
}

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("{0}")]
    Config(String),
    #[error("the store refused a planned push: {0}")]
    Store(#[from] StoreError),
}

/// How the run's gradients reach the store.
enum Schedule {
    /// `sync`: rounds of one gradient per worker, all computed on the same version; a round
    /// takes as long as its slowest worker.
    Rounds { workers: usize, ticks: u64 },
    /// The asynchronous rules: the delay model's plan.
    Planned(Plan),
}

/// A seeded endless stream of training batches, reshuffled every epoch.
struct Batches {
    order: Vec<usize>,
    pos: usize,
    batch: usize,
    rng: StdRng,
    served: u64,
}

impl Batches {
    fn new(n: usize, batch: usize, seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed ^ 0xba7c4);
        let mut order: Vec<usize> = (0..n).collect();
        order.shuffle(&mut rng);
        Batches { order, pos: 0, batch, rng, served: 0 }
    }

    /// The next batch's example indices (a batch never spans two epochs).
    fn next(&mut self) -> Vec<usize> {
        if self.pos >= self.order.len() {
            self.order.shuffle(&mut self.rng);
            self.pos = 0;
        }
        let end = (self.pos + self.batch).min(self.order.len());
        let b = self.order[self.pos..end].to_vec();
        self.served += b.len() as u64;
        self.pos = end;
        b
    }

    /// Epochs served so far, fractional.
    fn epoch(&self) -> f64 {
        self.served as f64 / self.order.len() as f64
    }
}

/// The run's model, data and the parameter server's store.
struct Run<'a> {
    data: &'a SimData,
    net: Mlp,
    store: Store,
    batches: Batches,
    seqs: Vec<u64>,
    local: Option<LocalSteps>,
    /// Each slot's inner optimizer (local steps).
    inner: Vec<Inner>,
    /// What each slot holds after a pull.
    puller: Puller,
    /// What the PS receives from each slot's pushes.
    pusher: Pusher,
    mean_lambda_sum: f64,
    clamped: u64,
    elements: u64,
}

impl Run<'_> {
    /// Pulls for `slot` and computes what it pushes: the gradient of the next batch, or with
    /// local steps the pseudo-gradient of the next H. (version, gradient, epoch).
    fn compute(&mut self, slot: usize) -> Result<(u64, Vec<f32>, f64), SimError> {
        let snap = self.store.pull(slot)?;
        let held = self.puller.pull(slot, self.store.layout(), snap.params());
        let mut grad = vec![0.0; self.net.len()];
        let (x, y) = (&self.data.train_x, &self.data.train_y);
        let Some(local) = self.local else {
            self.net.gradient(&held, x, y, &self.batches.next(), &mut grad);
            return Ok((snap.version(), grad, self.batches.epoch()));
        };
        let mut w = held.clone();
        for _ in 0..local.steps {
            self.net.gradient(&w, x, y, &self.batches.next(), &mut grad);
            self.inner[slot].step(local.rule, local.lr, &mut w, &grad);
        }
        let pseudo = held.iter().zip(&w).map(|(pulled, trained)| pulled - trained).collect();
        Ok((snap.version(), pseudo, self.batches.epoch()))
    }

    fn push(&mut self, slot: usize, version: u64, grad: &[f32], epoch: f64) -> Result<bool, SimError> {
        self.seqs[slot] += 1;
        let p = Push {
            worker: slot,
            generation: None,
            version,
            seq: self.seqs[slot],
            epoch: Some(epoch),
            body: None,
        };
        let received = self.pusher.send(slot, p.seq, self.store.layout(), grad);
        let o = self.store.push(p, &received)?;
        self.pusher.taken(slot, p.seq);
        self.mean_lambda_sum += o.stats.mean_lambda();
        (self.clamped, self.elements) = (self.clamped + o.stats.clamped, self.elements + o.stats.elements);
        Ok(o.applied)
    }

    fn score(&self) -> Score {
        let snap = self.store.snapshot_now();
        self.net.evaluate(snap.params(), &self.data.test_x, &self.data.test_y)
    }
}

/// Runs one configuration to the end of its epochs.
pub fn simulate(cfg: &SimConfig, data: &SimData) -> Result<Outcome, SimError> {
    cfg.hyper.validate().map_err(|e| SimError::Config(e.0))?;
    cfg.delay.validate().map_err(SimError::Config)?;
    if cfg.batch == 0 || !(cfg.epochs.is_finite() && cfg.epochs > 0.0) || data.train_y.is_empty() {
        return Err(SimError::Config("batch size, epochs and the training set must be non-empty".into()));
    }
    let net = Mlp { inputs: data.inputs, hidden: cfg.hidden, classes: data.classes };
    let batches_per_epoch = data.train_y.len().div_ceil(cfg.batch) as f64;
    let local_steps = cfg.local.map_or(1, |l| l.steps.max(1));
    // Pushes: each of H batches with local steps.
    let gradients = (cfg.epochs * batches_per_epoch / local_steps as f64).ceil() as u64;
    let schedule = match (cfg.hyper.algorithm, &cfg.delay) {
        (Algorithm::Sync, Delay::RoundRobin { workers }) => {
            Schedule::Rounds { workers: *workers, ticks: schedule::TICKS_PER_STEP }
        }
        (Algorithm::Sync, Delay::Straggler { workers, factor }) => {
            Schedule::Rounds { workers: *workers, ticks: schedule::step_ticks(*factor) }
        }
        (Algorithm::Sync, d) => {
            return Err(SimError::Config(format!(
                "sync takes round-robin:M or straggler:M:F (its round), not {}",
                d.label()
            )));
        }
        _ => Schedule::Planned(Plan::new(&cfg.delay, gradients, cfg.seed)),
    };
    let (workers, updates) = match &schedule {
        Schedule::Rounds { workers, .. } => (*workers, gradients.div_ceil(*workers as u64)),
        Schedule::Planned(plan) => (plan.slots, gradients),
    };
    // When update v (from 0) is applied, in batch steps at full speed.
    let step = local_steps as f64 / schedule::TICKS_PER_STEP as f64;
    let time_of = |v: u64| -> Option<f64> {
        match &schedule {
            Schedule::Rounds { ticks, .. } => Some((v + 1) as f64 * *ticks as f64 * step),
            Schedule::Planned(plan) => plan.ends.as_ref().map(|e| e[v as usize] as f64 * step),
        }
    };
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let specs = net.tensors().into_iter().map(|(name, shape)| TensorSpec { name, shape }).collect();
    let layout = Layout::new(specs).map_err(|e| SimError::Config(e.to_string()))?;
    let store = Store::new(layout, net.init(&mut rng), cfg.hyper.clone(), workers);
    let mut run = Run {
        data,
        net,
        store,
        batches: Batches::new(data.train_y.len(), cfg.batch, cfg.seed),
        seqs: vec![0; workers],
        local: cfg.local,
        inner: vec![Inner::default(); workers],
        puller: Puller::new(cfg.pulls, workers),
        pusher: Pusher::new(cfg.pushes, cfg.error_feedback, workers),
        mean_lambda_sum: 0.0,
        clamped: 0,
        elements: 0,
    };
    let marks: Vec<u64> = (1..=cfg.evals as u64).map(|k| k * updates / cfg.evals.max(1) as u64).collect();
    let mut curve = Vec::new();
    let mut record = |run: &Run, done: u64| {
        if marks.contains(&done) {
            let s = run.score();
            curve.push(CurvePoint {
                updates: done,
                epoch: run.batches.epoch(),
                time: time_of(done - 1),
                loss: s.loss,
                accuracy: s.accuracy,
            });
        }
    };
    match &schedule {
        &Schedule::Rounds { workers: m, .. } => {
            for round in 0..updates {
                let mut grads = Vec::with_capacity(m);
                for slot in 0..m {
                    grads.push(run.compute(slot)?);
                }
                for (slot, (version, grad, epoch)) in grads.into_iter().enumerate() {
                    run.push(slot, version, &grad, epoch)?;
                }
                record(&run, round + 1);
            }
        }
        Schedule::Planned(plan) => run_plan(&mut run, plan, &mut record)?,
    }
    let last = run.score();
    let params = run.store.snapshot_now();
    let status = run.store.status();
    Ok(Outcome {
        algorithm: cfg.hyper.algorithm.to_string(),
        delay: cfg.delay.label(),
        seed: cfg.seed,
        workers,
        local_steps,
        updates: status.version,
        gradients,
        loss: last.loss,
        accuracy: last.accuracy,
        staleness: status.staleness,
        mean_lambda: run.mean_lambda_sum / status.version.max(1) as f64,
        clamped_fraction: run.clamped as f64 / run.elements.max(1) as f64,
        learning_rate: cfg.hyper.lr.base,
        momentum: cfg.hyper.momentum,
        nesterov: cfg.hyper.nesterov,
        momentum_delay: cfg.hyper.momentum_delay,
        pull_dtype: cfg.pulls.as_str().into(),
        pulled_bytes: run.puller.bytes,
        push_dtype: push_name(cfg.pushes).into(),
        error_feedback: cfg.error_feedback && cfg.pushes == GradDtype::Int8,
        pushed_bytes: run.pusher.bytes,
        gain_clamp: cfg.hyper.safeguards.gain_clamp,
        bias_correction: cfg.hyper.safeguards.bias_correction,
        curve,
        digest: digest(params.params()),
    })
}

/// The asynchronous rules: at each version, the planned pulls (each computes its gradient at
/// once, on the model it pulled), then the update that version's plan applies.
fn run_plan(run: &mut Run, plan: &Plan, record: &mut impl FnMut(&Run, u64)) -> Result<(), SimError> {
    let n = plan.steps.len();
    let mut by_pull: Vec<usize> = (0..n).collect();
    by_pull.sort_by_key(|&s| (plan.steps[s].pull_at, s));
    let mut held: Vec<Option<(u64, Vec<f32>, f64)>> = vec![None; n];
    let mut next = 0;
    for v in 0..n {
        while next < n && plan.steps[by_pull[next]].pull_at == v as u64 {
            let s = by_pull[next];
            held[s] = Some(run.compute(plan.steps[s].slot)?);
            next += 1;
        }
        let (version, grad, epoch) =
            held[v].take().expect("a step's gradient is computed before it is applied");
        run.push(plan.steps[v].slot, version, &grad, epoch)?;
        record(run, v as u64 + 1);
    }
    Ok(())
}

/// FNV-1a over the parameters' bit patterns.
fn push_name(dtype: GradDtype) -> &'static str {
    match dtype {
        GradDtype::F32 => "f32",
        GradDtype::Bf16 => "bf16",
        GradDtype::Int8 => "int8",
    }
}

fn digest(w: &[f32]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for x in w {
        for b in x.to_bits().to_le_bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

#[cfg(test)]
mod tests;
