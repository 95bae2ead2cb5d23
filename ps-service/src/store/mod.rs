//! Parameter storage: the model, its version, per-worker backups and the `sync` round.
//!
//! # Concurrency
//! The flat parameter vector is cut into shards, each behind its own lock. Every operation
//! that touches the whole model (a push's update, a pull's snapshot, a checkpoint's copy)
//! takes a ticket from the sequencer and then walks the shards in order, entering each shard
//! only when the previous ticket has left it. Updates from different workers therefore run
//! concurrently on disjoint shards (push k+1 works on shard 3 while push k is on shard 4),
//! every shard sees them in ticket order, each update is atomic per shard, and a snapshot
//! taken at version v holds exactly the first v updates. Tickets are taken only after every
//! check has passed, so a refused request never holds up or changes anything.
//!
//! # Memory
//! A pull returns an `Arc<Snapshot>` whose buffer is the encoded safetensors body. Workers
//! that pull the same version share it, and under the delay-compensated rules the same Arc is
//! w_bak(m): M workers hold at most as many model copies as distinct versions they pulled.
//! A snapshot's buffer, once no one holds it, goes back to the store ([`SnapshotBuffers`]) for a
//! later version: a pull of a new version then writes into memory already mapped instead of
//! faulting in (and, with the allocator's slack, keeping) a fresh model-sized allocation.

pub mod checkpoint;
pub mod journal;
mod snapshot;
mod staleness;

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::{Condvar, Mutex};

use crate::optimizer::{self, Algorithm, Hyper, OptimizerState, Segments, Step, UpdateStats};
use crate::wire::in_place::Expected;
use crate::wire::{self, Layout, WireDtype};

use crate::wire::protocol::reason;
pub use checkpoint::CheckpointData;
use journal::{BodyInfo, Entry, JournalSink};
use snapshot::SnapshotBuffers;
pub use snapshot::{SPARE_SNAPSHOTS, Snapshot};
pub use staleness::{StalenessCounts, StalenessSummary};

/// Elements per shard: 256 KiB of f32, so a shard's slices stay in L2 while a kernel runs.
pub const DEFAULT_SHARD_LEN: usize = 1 << 16;

/// The most workers a job may have (the TrainingJob CRD's bound).
pub const MAX_WORKERS: usize = 1024;

/// The largest version a model can have: versions stay exact as JSON numbers (doubles) for any
/// client, and counting up from it can never wrap. A registration or offer above it is refused.
pub const MAX_VERSION: u64 = (1 << 53) - 1;
/// Largest epoch a push (and so a checkpoint) may carry: the learning-rate schedule is a
/// function of it.
pub const MAX_EPOCH: f64 = 1e9;

/// A push, after its body has been decoded and validated against the layout.
#[derive(Clone, Copy, Debug)]
pub struct Push {
    pub worker: usize,
    /// The incarnation of the worker that computed it ([`Store::join`]); `None` for a client
    /// that never joins, whose pushes count as the current incarnation's.
    pub generation: Option<u64>,
    /// The model version the gradient was computed on.
    pub version: u64,
    pub seq: u64,
    /// The worker's epoch (fractional), which drives the learning-rate schedule.
    pub epoch: Option<f64>,
    /// How it arrived (for the journal); `None` when not from the wire.
    pub body: Option<BodyInfo>,
}

/// What a push did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PushOutcome {
    /// Model version after this push (for a `sync` contribution still waiting, the current one).
    pub version: u64,
    /// τ = version at apply − version the gradient was computed on.
    pub staleness: u64,
    /// False for a `sync` contribution that waits for the rest of its round.
    pub applied: bool,
    /// True when this answers a retry of an already-applied (worker, seq).
    pub replayed: bool,
    pub stats: UpdateStats,
    pub lr: f32,
}

/// Why a push or pull was refused. Nothing changed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StoreError {
    #[error("worker {worker} is out of range: this job has {workers} workers (0..{workers})")]
    UnknownWorker { worker: usize, workers: usize },
    #[error("the job is finalized; the model is read-only")]
    Finalized,
    #[error("seq {seq} is older than worker {worker}'s last applied seq {last}")]
    StaleSeq { worker: usize, seq: u64, last: u64 },
    #[error(
        "generation {got} of worker {worker} was replaced by generation {current}: this process is no longer worker {worker}"
    )]
    Superseded { worker: usize, got: u64, current: u64 },
    #[error(
        "worker {worker} has no generation {got} here (the parameter server knows {current}): join again"
    )]
    RejoinRequired { worker: usize, got: u64, current: u64 },
    #[error("worker {worker} already has a push in flight; retry when it has been answered")]
    InFlight { worker: usize },
    #[error("version {got} is from the future: the model is at version {current}")]
    FutureVersion { got: u64, current: u64 },
    #[error("gradient staleness {staleness} exceeds maxStaleness {max}; pull the model again")]
    TooStale { staleness: u64, max: u64 },
    #[error("worker {worker} pushed a gradient for version {got} but {}; pull the model again", pulled_text(*pulled))]
    PullRequired { worker: usize, got: u64, pulled: Option<u64> },
    #[error("the sync round for version {got} is closed: the model is at version {current}; pull it")]
    RoundClosed { got: u64, current: u64 },
    #[error("worker {worker} already contributed to the sync round for version {version}")]
    AlreadyContributed { worker: usize, version: u64 },
}

fn pulled_text(pulled: Option<u64>) -> String {
    match pulled {
        Some(v) => format!("last pulled version {v}"),
        None => "has not pulled since the PS started".into(),
    }
}

impl StoreError {
    /// Bounded label for metrics and the JSON error's `reason`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::UnknownWorker { .. } => reason::UNKNOWN_WORKER,
            Self::Finalized => reason::FINALIZED,
            Self::StaleSeq { .. } => reason::STALE_SEQ,
            Self::InFlight { .. } => reason::IN_FLIGHT,
            Self::FutureVersion { .. } => reason::FUTURE_VERSION,
            Self::Superseded { .. } => "superseded",
            Self::RejoinRequired { .. } => reason::REJOIN_REQUIRED,
            Self::TooStale { .. } => reason::TOO_STALE,
            Self::RoundClosed { .. } => reason::ROUND_CLOSED,
            Self::PullRequired { .. } => reason::PULL_REQUIRED,
            Self::AlreadyContributed { .. } => reason::ALREADY_CONTRIBUTED,
        }
    }
}

/// Per-worker bookkeeping, visible in `/v1/status`.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct WorkerStatus {
    /// The current incarnation: how many times a process joined as this worker (0: never).
    pub generation: u64,
    pub pulled_version: Option<u64>,
    pub pushes: u64,
    pub last_staleness: Option<u64>,
    pub mean_staleness: f64,
    #[serde(skip)]
    staleness_sum: u64,
    #[serde(skip)]
    last: Option<(u64, PushOutcome)>,
    #[serde(skip)]
    in_flight: bool,
    /// Seq of this worker's newest update that has a place in the model's order (see `admit`):
    /// where a new incarnation of the worker resumes.
    #[serde(rename = "resume_step")]
    durable_seq: Option<u64>,
    /// The worker has trained all its steps ([`Store::leave`]): `sync` rounds stop waiting for
    /// it. A new process joining as this worker clears it.
    pub finished: bool,
    /// Nothing was heard from the worker for the PS's silence timeout ([`Store::set_silent`]):
    /// `sync` rounds stop waiting for it until it is heard again.
    pub silent: bool,
    /// The worker's last pull said it overlaps its exchange with its next step
    /// ([`Store::overlaps`]): a delay-compensated rule keeps its previous backup too.
    #[serde(skip)]
    overlaps: bool,
}

/// What [`Store::join`] hands a new incarnation of a worker.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Joined {
    /// Goes with every push of this incarnation; an older one's pushes are refused from now on.
    pub generation: u64,
    /// Steps of this worker already in the model: the new incarnation starts after them.
    pub resume_step: u64,
    /// The model version now.
    pub version: u64,
    /// The job's worker count M now: a worker takes its shard of the data by it.
    pub workers: usize,
}

/// A consistent view for `/v1/status`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct StoreStatus {
    pub algorithm: Algorithm,
    pub parameters: usize,
    pub version: u64,
    pub epoch: f64,
    pub learning_rate: f32,
    pub finalized: bool,
    pub staleness: StalenessSummary,
    pub workers: Vec<WorkerStatus>,
}

struct ShardData {
    next_op: u64,
    w: Vec<f32>,
    state: OptimizerState,
}

struct Shard {
    range: Range<usize>,
    data: Mutex<ShardData>,
    turn: Condvar,
}

type PendingSnapshot = Arc<OnceLock<Arc<Snapshot>>>;

/// Runs `f` on `shard` as operation `op`, once every earlier operation has been through it.
///
/// The turn passes on even when `f` panics (the panic then goes on up): otherwise every later
/// push, pull and checkpoint of the shard waited for ever behind it, where the panic fails one
/// request. The slice `f` was writing may then be half updated, as a push that the shard took
/// only in part (a bug's cost, once), instead of a parameter server that never answers again.
fn enter(shard: &Shard, op: u64, mut f: impl FnMut(&Shard, &mut ShardData)) {
    let mut d = shard.data.lock();
    while d.next_op != op {
        shard.turn.wait(&mut d);
    }
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(shard, &mut d)));
    d.next_op += 1;
    drop(d);
    shard.turn.notify_all();
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// The copy of the model into a snapshot, as the ticket `op` it took ([`Store::pull_copying`]).
pub struct SnapshotCopy<'a> {
    store: &'a Store,
    op: u64,
    /// `None` once run.
    snap: Option<Arc<Snapshot>>,
}

impl SnapshotCopy<'_> {
    /// Copies every shard in its turn (the groups side by side), publishing each as it lands and
    /// calling `copied` after it (and once more when the snapshot is complete).
    pub fn run(mut self, copied: &(dyn Fn() + Sync)) {
        self.copy(copied);
    }

    fn copy(&mut self, copied: &(dyn Fn() + Sync)) {
        let Some(snap) = self.snap.take() else { return };
        let store = self.store;
        store.walk_grouped(self.op, (0..store.groups.len()).collect(), |&mut part, shard, d| {
            // SAFETY: this is the snapshot's one copy, and each shard is one range written once.
            unsafe { snap.write(part, shard.range.clone()) }.copy_from_slice(&d.w);
            snap.publish(part, shard.range.end);
            copied();
        });
        snap.finish();
        copied();
    }
}

impl Drop for SnapshotCopy<'_> {
    /// A copy dropped unrun still runs: later operations wait for its ticket.
    fn drop(&mut self) {
        self.copy(&|| ());
    }
}

/// `shards` shard indices cut into at most `threads` contiguous groups, never fewer than one.
fn walk_groups(shards: usize, threads: usize) -> Vec<Range<usize>> {
    let g = threads.min(shards).max(1);
    (0..g).map(|i| i * shards / g..(i + 1) * shards / g).collect()
}

struct Sequencer {
    next_op: u64,
    /// Updates issued so far: the version every later operation sees.
    version: u64,
    epoch: f64,
    finalized: bool,
    cached: Option<Arc<Snapshot>>,
    pending: Option<(u64, PendingSnapshot)>,
    /// w_bak(m), kept only by the delay-compensated rules.
    backups: Vec<Backups>,
    workers: Vec<WorkerStatus>,
    staleness: StalenessCounts,
    /// The version the model was seeded or restored at, while no update has been applied
    /// since: a fresher copy may still replace it ([`Store::reseed`]).
    seeded_at: Option<u64>,
    /// The version at which MeanSquare was last all zero (dc-asgd-a's bias correction counts
    /// updates from there).
    mean_square_origin: u64,
    /// What a worker's copy of the model may replace ([`Store::takes_copy`]).
    origin: Origin,
    /// Versions below this were served before a worker's copy replaced the model: a gradient
    /// computed on one is refused (`pull_required`), whatever the rule.
    lineage_from: u64,
}

/// Where the model came from, which decides what a worker's copy of it may replace.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Origin {
    /// Registered in this process from a worker's initial weights. Should a worker hold a copy
    /// of a later version, the PS had lost the job's model and a new worker registered first: the
    /// copy replaces it, updates applied since or not (they trained from the initial weights).
    Registered,
    /// Restored from a checkpoint or seeded from a worker's copy: a fresher copy replaces it only
    /// while no update has been applied (`seeded_at`).
    Kept,
}

/// The `sync` rule's round: one gradient per worker for `version`.
struct SyncRound {
    version: u64,
    sum: Vec<f32>,
    /// Each worker's contributing seq, if it has contributed.
    contributed: Vec<Option<u64>>,
    count: usize,
    /// The worker count M when the round got its first gradient: a scale-up counts from the
    /// next round (a scale-down at once: removed workers cannot contribute). `None`: empty.
    members: Option<usize>,
}

/// Called with the new model version after each update completes.
pub type VersionListener = Box<dyn Fn(u64) + Send + Sync>;

pub struct Store {
    layout: Layout,
    hyper: Hyper,
    /// Each element range's weight decay and learning-rate scale (`hyper.parameter_groups`).
    rates: Segments,
    /// The job's current worker count M (it changes when the job is scaled: [`Store::set_workers`]).
    /// The per-worker tables may be longer: a scale-down keeps the removed workers' entries.
    workers: AtomicUsize,
    header: Vec<u8>,
    /// The layout's headers in BF16 and F16, which a push's body may begin with too.
    half_headers: [(Vec<u8>, WireDtype); 2],
    shards: Vec<Shard>,
    /// Contiguous groups of shard indices that [`Store::walk_grouped`] walks side by side.
    groups: Vec<Range<usize>>,
    seq: Mutex<Sequencer>,
    round: Mutex<SyncRound>,
    listener: Option<VersionListener>,
    /// Where every decision goes, in model order ([`journal`]).
    journal: Option<JournalSink>,
    /// `sync` rounds applied without the gradient of every worker that could contribute.
    rounds_closed_short: std::sync::atomic::AtomicU64,
    snapshot_buffers: Arc<SnapshotBuffers>,
}

impl Store {
    /// A new model at version 0 with the given initial values; w_bak(m) = w_0 for every m.
    pub fn new(layout: Layout, init: Vec<f32>, hyper: Hyper, workers: usize) -> Self {
        Self::with_shard_len(layout, init, hyper, workers, DEFAULT_SHARD_LEN)
    }

    /// A model restored from a checkpoint. Backups are not checkpointed: each worker's first
    /// push after a restart is refused with `pull_required` until it has pulled.
    pub fn restore(layout: Layout, mut data: CheckpointData, hyper: Hyper, workers: usize) -> Self {
        let fresh = OptimizerState::new(&hyper, layout.len());
        // A checkpointed MeanSquare has been accumulating since version 0 (or since a re-seed,
        // which this cannot tell: then the correction is slightly too small for ~50 updates).
        let kept_mean_square = data.state.mean_square.len() == fresh.mean_square.len();
        // State the configured rule needs but the checkpoint lacks starts from zero.
        if !kept_mean_square {
            data.state.mean_square = fresh.mean_square;
        }
        if data.state.momentum.len() != fresh.momentum.len() {
            data.state.momentum = fresh.momentum;
        }
        if data.state.pending.len() != fresh.pending.len() {
            data.state.pending = fresh.pending;
        }
        let (finalized, seqs) = (data.finalized, std::mem::take(&mut data.worker_seqs));
        let generations = std::mem::take(&mut data.worker_generations);
        let (version, epoch) = (data.version, data.epoch);
        // A job scaled up before the checkpoint keeps its later workers' seqs and generations.
        let tables = workers.max(seqs.len()).max(generations.len());
        let store = Self::build(layout, hyper, tables, DEFAULT_SHARD_LEN, data);
        store.workers.store(workers, Ordering::Release);
        {
            let mut seq = store.seq.lock();
            seq.finalized = finalized;
            if kept_mean_square {
                seq.mean_square_origin = 0;
            }
            let lr = store.hyper.lr.at(epoch);
            for (w, s) in seq.workers.iter_mut().zip(seqs) {
                // A retry of this seq was applied before the restart: answer it as a replay.
                let outcome = PushOutcome {
                    version,
                    staleness: 0,
                    applied: true,
                    replayed: false,
                    stats: UpdateStats::default(),
                    lr,
                };
                w.last = s.map(|s| (s, outcome));
                w.durable_seq = s;
            }
            for (w, g) in seq.workers.iter_mut().zip(generations) {
                w.generation = g;
            }
        }
        store
    }

    /// Like [`Store::new`] with a chosen shard length (tests use small shards to exercise the
    /// pipeline).
    pub fn with_shard_len(
        layout: Layout,
        init: Vec<f32>,
        hyper: Hyper,
        workers: usize,
        shard_len: usize,
    ) -> Self {
        Self::seeded_with_shard_len(layout, init, 0, hyper, workers, shard_len)
    }

    /// A model seeded with a worker's copy of version `version` (a parameter server that lost
    /// its state continues from what the workers hold). Version 0 is the initial model, which
    /// every worker built alike, so it is each worker's w_bak; a later copy is one worker's
    /// only, so under the delay-compensated rules each worker pulls before its next push.
    pub fn seeded(layout: Layout, values: Vec<f32>, version: u64, hyper: Hyper, workers: usize) -> Self {
        Self::seeded_with_shard_len(layout, values, version, hyper, workers, DEFAULT_SHARD_LEN)
    }

    /// A job's model registered from a worker's initial weights (see [`Origin::Registered`]).
    pub fn registered(layout: Layout, values: Vec<f32>, version: u64, hyper: Hyper, workers: usize) -> Self {
        let store = Self::seeded(layout, values, version, hyper, workers);
        store.seq.lock().origin = Origin::Registered;
        store
    }

    fn seeded_with_shard_len(
        layout: Layout,
        values: Vec<f32>,
        version: u64,
        hyper: Hyper,
        workers: usize,
        shard_len: usize,
    ) -> Self {
        let state = OptimizerState::new(&hyper, layout.len());
        let data = CheckpointData { version, epoch: 0.0, params: values, state, ..CheckpointData::default() };
        let store = Self::build(layout, hyper, workers, shard_len, data);
        if version == 0 && store.hyper.algorithm.is_delay_compensated() {
            let w0 = store.snapshot_now();
            let first = Backups::of(Backup { snap: w0, pulled_as: BackupAs::F32 });
            store.seq.lock().backups.fill(first);
        }
        store
    }

    fn build(layout: Layout, hyper: Hyper, workers: usize, shard_len: usize, data: CheckpointData) -> Self {
        assert_eq!(data.params.len(), layout.len(), "initial values do not match the layout");
        assert!(workers > 0 && shard_len > 0);
        let n = layout.len();
        let shards = (0..n)
            .step_by(shard_len)
            .map(|start| {
                let range = start..(start + shard_len).min(n);
                let slice = |v: &Vec<f32>| if v.is_empty() { Vec::new() } else { v[range.clone()].to_vec() };
                let state = OptimizerState {
                    mean_square: slice(&data.state.mean_square),
                    momentum: slice(&data.state.momentum),
                    pending: slice(&data.state.pending),
                };
                let w = data.params[range.clone()].to_vec();
                let data = ShardData { next_op: 0, w, state };
                Shard { range, data: Mutex::new(data), turn: Condvar::new() }
            })
            .collect::<Vec<_>>();
        let groups = walk_groups(shards.len(), crate::cores::threads_for(n));
        let header = wire::header(&layout, WireDtype::F32, &BTreeMap::new());
        let half_headers =
            [WireDtype::Bf16, WireDtype::F16].map(|d| (wire::header(&layout, d, &BTreeMap::new()), d));
        let round = SyncRound {
            version: data.version,
            sum: if hyper.algorithm == Algorithm::Sync { vec![0.0; n] } else { Vec::new() },
            contributed: vec![None; workers],
            count: 0,
            members: None,
        };
        let seq = Sequencer {
            next_op: 0,
            version: data.version,
            epoch: data.epoch,
            finalized: false,
            cached: None,
            pending: None,
            backups: vec![Backups::default(); workers],
            workers: vec![WorkerStatus::default(); workers],
            staleness: StalenessCounts::default(),
            seeded_at: Some(data.version),
            mean_square_origin: data.version,
            origin: Origin::Kept,
            lineage_from: 0,
        };
        let names = layout.iter().map(|(t, r)| (wire::shards::tensor_name(&t.name), r));
        let rates = Segments::resolve(&hyper.parameter_groups, hyper.weight_decay, names);
        Self {
            layout,
            hyper,
            rates,
            workers: AtomicUsize::new(workers),
            header,
            half_headers,
            shards,
            groups,
            seq: Mutex::new(seq),
            round: Mutex::new(round),
            listener: None,
            journal: None,
            rounds_closed_short: Default::default(),
            snapshot_buffers: Arc::default(),
        }
    }

    /// The parameters of this store's model each parameter group took, in group order.
    pub fn group_parameters(&self) -> &[usize] {
        self.rates.matched()
    }

    /// Registers a callback for completed updates (the server wakes long-polling pulls with it).
    pub fn set_listener(&mut self, listener: VersionListener) {
        self.listener = Some(listener);
    }

    /// Sends every later decision to `sink` ([`journal`]).
    pub fn set_journal(&mut self, sink: JournalSink) {
        self.journal = Some(sink);
    }

    fn record(&self, entry: impl FnOnce() -> Entry, payload: Option<&[f32]>) {
        if let Some(sink) = &self.journal {
            sink(entry(), payload);
        }
    }

    /// A push refused, into the journal (at the version `seq` saw).
    fn record_refusal(&self, p: &Push, e: &StoreError, at_version: u64) {
        self.record(
            || Entry::Refused {
                worker: p.worker,
                generation: p.generation,
                seq: p.seq,
                computed_on: p.version,
                at_version,
                reason: e.reason().into(),
            },
            None,
        );
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The bodies a push is read in place from: this layout's tensors in order, no metadata, in
    /// F32, BF16 or F16 (what Foresight's client sends for each `gradientDtype` but int8). The
    /// F32 header is also the exact prefix of a pull's body.
    pub fn gradient_encodings(&self) -> [Expected<'_>; 3] {
        let [(bf16, b), (f16, f)] = &self.half_headers;
        [
            Expected { header: &self.header, dtype: WireDtype::F32 },
            Expected { header: bf16, dtype: *b },
            Expected { header: f16, dtype: *f },
        ]
    }

    pub fn hyper(&self) -> &Hyper {
        &self.hyper
    }

    pub fn workers(&self) -> usize {
        // Acquire: whoever sees the new count also sees the tables grown for it.
        self.workers.load(Ordering::Acquire)
    }

    /// The job now has `n` workers: indices below `n` may pull and push, the `sync` quorum is
    /// `n` minus the backup workers from the next round on (a round in progress closes with
    /// what it has at the latest when its timeout passes). New workers get fresh entries; the
    /// entries of removed ones are kept, so a worker scaled away and back resumes as a new
    /// generation of itself — but not their backups, each possibly a model copy of its own: a
    /// worker that comes back pulls before its first push (`pull_required` otherwise).
    pub fn set_workers(&self, n: usize) {
        assert!(n > 0, "a job has at least one worker");
        {
            let mut seq = self.seq.lock();
            if seq.workers.len() < n {
                seq.workers.resize(n, WorkerStatus::default());
                seq.backups.resize(n, Backups::default());
            }
            seq.backups[n..].fill(Backups::default());
        }
        {
            let mut round = self.round.lock();
            if round.contributed.len() < n {
                round.contributed.resize(n, None);
            }
        }
        self.workers.store(n, Ordering::Release);
    }

    pub fn version(&self) -> u64 {
        self.seq.lock().version
    }

    /// Every one of the job's M workers has trained all its steps (`leave`) and none has joined
    /// again since.
    pub fn all_finished(&self) -> bool {
        let m = self.workers();
        let seq = self.seq.lock();
        seq.workers.len() >= m && seq.workers[..m].iter().all(|w| w.finished)
    }

    pub fn is_finalized(&self) -> bool {
        self.seq.lock().finalized
    }

    fn check_worker(&self, worker: usize) -> Result<(), StoreError> {
        let workers = self.workers();
        if worker < workers { Ok(()) } else { Err(StoreError::UnknownWorker { worker, workers }) }
    }

    /// Pull: the current model, recorded as w_bak(worker).
    /// Whether `worker` overlaps its exchange with its next step, as its pulls say: its next
    /// gradient is computed on the model it pulled before the one it pulls now, so a
    /// delay-compensated rule keeps that backup too (the gradient names its version).
    pub fn overlaps(&self, worker: usize, overlaps: bool) -> Result<(), StoreError> {
        self.check_worker(worker)?;
        self.seq.lock().workers[worker].overlaps = overlaps;
        Ok(())
    }

    pub fn pull(&self, worker: usize) -> Result<Arc<Snapshot>, StoreError> {
        self.pull_as(worker, BackupAs::F32)
    }

    /// A pull that the worker receives `as_` (bf16: the model rounded; its backup is then what
    /// it trained on, the snapshot rounded the same way when an update uses it).
    pub fn pull_as(&self, worker: usize, as_: BackupAs) -> Result<Arc<Snapshot>, StoreError> {
        let (snap, copy) = self.pull_copying_as(Some(worker), as_)?;
        if let Some(copy) = copy {
            copy.run(&|| ());
        }
        Ok(snap)
    }

    /// The current model without recording a backup (status readers, finalize, tests).
    pub fn snapshot_now(&self) -> Arc<Snapshot> {
        let (snap, copy) = self.current_snapshot();
        if let Some(copy) = copy {
            copy.run(&|| ());
        }
        snap
    }

    /// Like [`Store::pull`] (or, for no worker, [`Store::snapshot_now`]), but the snapshot comes
    /// back before its parameters are copied, with the copy to run when this call is the one that
    /// must make it: a server sends [`Snapshot::ready_len`] bytes while [`SnapshotCopy::run`]
    /// goes on. The copy holds a ticket that every later update waits for: it runs even if the
    /// caller drops it unrun.
    pub fn pull_copying(
        &self,
        worker: Option<usize>,
    ) -> Result<(Arc<Snapshot>, Option<SnapshotCopy<'_>>), StoreError> {
        self.pull_copying_as(worker, BackupAs::F32)
    }

    fn pull_copying_as(
        &self,
        worker: Option<usize>,
        pulled_as: BackupAs,
    ) -> Result<(Arc<Snapshot>, Option<SnapshotCopy<'_>>), StoreError> {
        if let Some(w) = worker {
            self.check_worker(w)?;
        }
        let (snap, copy) = self.current_snapshot();
        if let Some(w) = worker {
            let mut seq = self.seq.lock();
            if self.hyper.algorithm.is_delay_compensated() {
                let keep_previous = seq.workers[w].overlaps;
                seq.backups[w].record(Backup { snap: snap.clone(), pulled_as }, keep_previous);
            }
            seq.workers[w].pulled_version = Some(snap.version());
        }
        Ok((snap, copy))
    }

    fn current_snapshot(&self) -> (Arc<Snapshot>, Option<SnapshotCopy<'_>>) {
        enum Role {
            Ready(Arc<Snapshot>),
            Wait(PendingSnapshot),
            Take(u64, u64, PendingSnapshot),
        }
        let role = {
            let mut seq = self.seq.lock();
            let version = seq.version;
            match (&seq.cached, &seq.pending) {
                (Some(s), _) if s.version() == version => Role::Ready(s.clone()),
                (_, Some((v, p))) if *v == version => Role::Wait(p.clone()),
                _ => {
                    let op = seq.next_op;
                    seq.next_op += 1;
                    let p: PendingSnapshot = Arc::default();
                    seq.pending = Some((version, p.clone()));
                    Role::Take(op, version, p)
                }
            }
        };
        match role {
            Role::Ready(s) => (s, None),
            // Only until the taker has its buffer: the snapshot is shared while it is copied.
            Role::Wait(p) => (p.wait().clone(), None),
            Role::Take(op, version, pending) => {
                // The header is written now, every parameter by the copy.
                let buf = self.snapshot_buffers.take(self.header.len() / 4 + self.layout.len());
                let parts = self.groups.iter().map(|g| self.group_range(g));
                let recycle = Arc::downgrade(&self.snapshot_buffers);
                let snap = Arc::new(Snapshot::filling(version, buf, &self.header, parts, recycle));
                let _ = pending.set(snap.clone());
                let mut seq = self.seq.lock();
                if seq.pending.as_ref().is_some_and(|(v, _)| *v == version) {
                    seq.pending = None;
                }
                if seq.cached.as_ref().is_none_or(|c| c.version() < version) {
                    seq.cached = Some(snap.clone());
                }
                (snap.clone(), Some(SnapshotCopy { store: self, op, snap: Some(snap) }))
            }
        }
    }

    /// Runs `f` on every shard in order as operation `op`.
    fn walk(&self, op: u64, mut f: impl FnMut(&Shard, &mut ShardData)) {
        for shard in &self.shards {
            enter(shard, op, &mut f);
        }
    }

    /// Like [`Store::walk`], with the shards cut into `self.groups` walked side by side, each
    /// group on its own thread with its own state (`states[i]` for group i, returned in that
    /// order): a large model's apply or copy uses every core the process has instead of one.
    /// Every shard still sees the operations in ticket order, so the bits are those of one walk.
    /// The threads are scoped and started per call, never a pool's: a pool's threads blocked on
    /// one operation's turn could starve the earlier operation they wait for.
    fn walk_grouped<S: Send>(
        &self,
        op: u64,
        states: Vec<S>,
        f: impl Fn(&mut S, &Shard, &mut ShardData) + Sync,
    ) -> Vec<S> {
        assert_eq!(states.len(), self.groups.len(), "one state per group");
        let walk_group = |group: Range<usize>, mut state: S| {
            for shard in &self.shards[group] {
                enter(shard, op, |shard, d| f(&mut state, shard, d));
            }
            state
        };
        let paired: Vec<_> = self.groups.iter().cloned().zip(states).collect();
        let runs = crate::cores::in_runs(
            paired,
            self.groups.len(),
            |_| 1,
            |run| run.into_iter().map(|(group, state)| walk_group(group, state)).collect::<Vec<_>>(),
        );
        runs.into_iter().flatten().collect()
    }

    /// The flat parameter range the shards of `group` cover.
    fn group_range(&self, group: &Range<usize>) -> Range<usize> {
        match (self.shards.get(group.start), group.end.checked_sub(1).and_then(|i| self.shards.get(i))) {
            (Some(first), Some(last)) if !group.is_empty() => first.range.start..last.range.end,
            _ => 0..0,
        }
    }

    /// A new incarnation of `worker` (a new process) joins: it gets the next generation, so that
    /// the old incarnation's late pushes are refused and the new one's seqs start afresh, and
    /// the step to resume from: the newest of the worker's steps in the model, or `offered` when
    /// the worker itself is further along (a parameter server that lost its state).
    pub fn join(&self, worker: usize, offered: Option<u64>) -> Result<Joined, StoreError> {
        self.check_worker(worker)?;
        let mut seq = self.seq.lock();
        let version = seq.version;
        let w = &mut seq.workers[worker];
        w.generation += 1;
        w.last = None;
        w.finished = false;
        w.durable_seq = w.durable_seq.max(offered);
        let workers = self.workers();
        Ok(Joined { generation: w.generation, resume_step: w.durable_seq.unwrap_or(0), version, workers })
    }

    /// Whether a copy of `version` would replace the model ([`Store::reseed`]).
    pub fn takes_copy(&self, version: u64) -> bool {
        Self::copy_replaces(&self.seq.lock(), version)
    }

    fn copy_replaces(seq: &Sequencer, version: u64) -> bool {
        let fresher = match seq.origin {
            Origin::Registered => version > seq.version,
            Origin::Kept => seq.seeded_at.is_some_and(|at| version > at),
        };
        fresher && !seq.finalized
    }

    /// Replaces the model with a worker's fresher copy (`version` newer than the seed's, while no
    /// update has touched it; or newer than a registered model's version, see
    /// [`Origin::Registered`]). False, and nothing changed, otherwise. Gradients computed on the
    /// versions before are refused from now on.
    pub fn reseed(&self, values: &[f32], version: u64) -> bool {
        assert_eq!(values.len(), self.layout.len(), "copy decoded against another layout");
        let mut round = self.round.lock();
        let op = {
            let mut seq = self.seq.lock();
            if !Self::copy_replaces(&seq, version) {
                return false;
            }
            let op = seq.next_op;
            seq.next_op += 1;
            (seq.version, seq.seeded_at) = (version, Some(version));
            (seq.origin, seq.lineage_from) = (Origin::Kept, version);
            seq.mean_square_origin = version;
            seq.cached = None;
            seq.backups.fill(Backups::default());
            self.record(|| Entry::Reseeded { version, payload: None }, Some(values));
            op
        };
        self.walk(op, |shard, d| {
            d.w.copy_from_slice(&values[shard.range.clone()]);
            d.state.mean_square.fill(0.0);
            d.state.momentum.fill(0.0);
            d.state.pending.fill(0.0);
        });
        round.version = version;
        round.sum.fill(0.0);
        round.contributed.fill(None);
        round.count = 0;
        round.members = None;
        drop(round);
        self.notify(version);
        true
    }

    /// Applies (or, under `sync`, contributes) one decoded gradient.
    pub fn push(&self, p: Push, grad: &[f32]) -> Result<PushOutcome, StoreError> {
        assert_eq!(grad.len(), self.layout.len(), "gradient decoded against another layout");
        if let Err(e) = self.check_worker(p.worker) {
            self.record_refusal(&p, &e, self.version());
            return Err(e);
        }
        let result = if self.hyper.algorithm == Algorithm::Sync {
            // The round lock is held from the checks to the contribution, so the round cannot
            // complete in between (lock order: round, then sequencer).
            let mut round = self.round.lock();
            if let Admission::Replay(outcome) = self.admit(p, Some(&round), grad)? {
                return Ok(outcome);
            }
            Ok(self.contribute(p, grad, &mut round))
        } else {
            match self.admit(p, None, grad)? {
                Admission::Replay(outcome) => return Ok(outcome),
                Admission::Ticket(t) => {
                    let backup = t.backup.as_ref().map(|b| (b.snap.params(), b.pulled_as));
                    let stats = self.apply_op(t.op, t.version, t.step, grad, backup);
                    self.notify(t.version);
                    Ok(PushOutcome {
                        version: t.version,
                        staleness: t.staleness,
                        applied: true,
                        replayed: false,
                        stats,
                        lr: t.step.lr,
                    })
                }
                Admission::Contribution => unreachable!("only sync contributes"),
            }
        };
        let mut seq = self.seq.lock();
        let seq = &mut *seq;
        let w = &mut seq.workers[p.worker];
        w.in_flight = false;
        if let Ok(o) = &result {
            w.last = Some((p.seq, *o));
            w.pushes += 1;
            w.last_staleness = Some(o.staleness);
            w.staleness_sum += o.staleness;
            w.mean_staleness = w.staleness_sum as f64 / w.pushes as f64;
            seq.staleness.record(o.staleness);
        }
        result
    }

    /// The answer to a push that does not depend on its gradient, when there is one now: a
    /// replay or a refusal. `None`: the gradient is needed. Changes nothing, so that a server can
    /// answer before it reads (and buffers) a body; [`Store::push`] checks everything again.
    pub fn answer_before_body(&self, p: Push) -> Option<Result<PushOutcome, StoreError>> {
        if let Err(e) = self.check_worker(p.worker) {
            return Some(Err(e));
        }
        // Lock order: round, then sequencer.
        let round = (self.hyper.algorithm == Algorithm::Sync).then(|| self.round.lock());
        let seq = self.seq.lock();
        match self.judge(&seq, &p, round.as_deref()) {
            Ok(Judged::Replay(outcome)) => Some(Ok(outcome)),
            Ok(Judged::Accept { .. }) => None,
            Err(e) => {
                self.record_refusal(&p, &e, seq.version);
                Some(Err(e))
            }
        }
    }

    /// Every check that can refuse a push, made under the sequencer lock; on success the
    /// worker's push is marked in flight and, for the asynchronous rules, a ticket issued.
    /// `grad` goes to the journal with the update it makes.
    fn admit(&self, p: Push, round: Option<&SyncRound>, grad: &[f32]) -> Result<Admission, StoreError> {
        let mut seq = self.seq.lock();
        let (staleness, backup) = match self.judge(&seq, &p, round) {
            Ok(Judged::Replay(outcome)) => return Ok(Admission::Replay(outcome)),
            Ok(Judged::Accept { staleness, backup }) => (staleness, backup),
            Err(e) => {
                self.record_refusal(&p, &e, seq.version);
                return Err(e);
            }
        };
        // Past this point the push is accepted.
        if let Some(e) = p.epoch {
            seq.epoch = seq.epoch.max(e);
        }
        seq.workers[p.worker].in_flight = true;
        if round.is_some() {
            return Ok(Admission::Contribution);
        }
        let (op, version) = issue_update(&mut seq);
        // Tickets are issued in model order: once this one is, the update is in every later
        // snapshot and checkpoint, so its seq is what a restored PS must remember.
        seq.workers[p.worker].durable_seq = Some(p.seq);
        let step = Step::at(self.hyper.lr.at(seq.epoch), version - seq.mean_square_origin);
        // Under the sequencer lock: the journal gets the updates in version order.
        self.record(
            || Entry::Applied {
                version,
                worker: p.worker,
                generation: p.generation,
                seq: p.seq,
                computed_on: p.version,
                staleness,
                lr: step.lr,
                mean_square_step: step.mean_square_updates,
                momentum_step: self.momentum_steps_at(version),
                backup_as: backup.as_ref().map_or(BackupAs::F32, |b| b.pulled_as),
                epoch: p.epoch,
                body: p.body,
                payload: None,
            },
            Some(grad),
        );
        Ok(Admission::Ticket(Ticket { op, version, step, backup, staleness }))
    }

    /// What the checks of [`Store::admit`] make of `p` in the state `seq` (and `round`, under
    /// `sync`), without changing anything.
    fn judge(&self, seq: &Sequencer, p: &Push, round: Option<&SyncRound>) -> Result<Judged, StoreError> {
        let w = &seq.workers[p.worker];
        match p.generation {
            Some(got) if got < w.generation => {
                return Err(StoreError::Superseded { worker: p.worker, got, current: w.generation });
            }
            Some(got) if got > w.generation => {
                return Err(StoreError::RejoinRequired { worker: p.worker, got, current: w.generation });
            }
            _ => {}
        }
        if w.in_flight {
            return Err(StoreError::InFlight { worker: p.worker });
        }
        if let Some((last, outcome)) = w.last {
            // A `sync` contribution in a round that finalize left open will never be applied:
            // the worker re-pushing it while it waits must learn that the job ended.
            if p.seq == last && seq.finalized && !outcome.applied {
                return Err(StoreError::Finalized);
            }
            if p.seq == last {
                return Ok(Judged::Replay(PushOutcome { replayed: true, ..outcome }));
            }
            if p.seq < last {
                return Err(StoreError::StaleSeq { worker: p.worker, seq: p.seq, last });
            }
        }
        if seq.finalized {
            return Err(StoreError::Finalized);
        }
        if p.version > seq.version {
            return Err(StoreError::FutureVersion { got: p.version, current: seq.version });
        }
        if p.version < seq.lineage_from {
            let pulled = seq.workers[p.worker].pulled_version;
            return Err(StoreError::PullRequired { worker: p.worker, got: p.version, pulled });
        }
        let staleness = seq.version - p.version;
        if let Some(round) = round {
            if staleness > 0 {
                return Err(StoreError::RoundClosed { got: p.version, current: seq.version });
            }
            if round.contributed[p.worker].is_some() {
                return Err(StoreError::AlreadyContributed { worker: p.worker, version: p.version });
            }
        } else if let Some(max) = self.hyper.max_staleness.filter(|&m| staleness > m) {
            return Err(StoreError::TooStale { staleness, max });
        }
        let backup = if self.hyper.algorithm.is_delay_compensated() {
            match seq.backups[p.worker].computed_on(p.version) {
                Some(b) => Some(b.clone()),
                None => {
                    let pulled = seq.backups[p.worker].latest.as_ref().map(|b| b.snap.version());
                    return Err(StoreError::PullRequired { worker: p.worker, got: p.version, pulled });
                }
            }
        } else {
            None
        };
        Ok(Judged::Accept { staleness, backup })
    }

    /// Adds a gradient to the `sync` round, with the round lock held and after `admit` has
    /// accepted it; the last of the M contributions applies the round.
    fn contribute(&self, p: Push, grad: &[f32], round: &mut SyncRound) -> PushOutcome {
        debug_assert_eq!(round.version, p.version, "admit() lets only current-version pushes through");
        optimizer::accumulate(&mut round.sum, grad);
        // Under the round lock: the journal gets the contributions in the order they were summed.
        self.record(
            || Entry::Contributed {
                round: round.version,
                worker: p.worker,
                generation: p.generation,
                seq: p.seq,
                epoch: p.epoch,
                body: p.body,
                payload: None,
            },
            Some(grad),
        );
        round.contributed[p.worker] = Some(p.seq);
        round.members.get_or_insert(self.workers());
        round.count += 1;
        if round.count < self.round_quorum(round) {
            let lr = self.hyper.lr.at(self.seq.lock().epoch);
            let stats = UpdateStats::default();
            return PushOutcome {
                version: p.version,
                staleness: 0,
                applied: false,
                replayed: false,
                stats,
                lr,
            };
        }
        self.apply_round(round)
    }

    /// `sync` rounds applied without the gradient of every worker that could contribute, so far.
    pub fn rounds_closed_short(&self) -> u64 {
        self.rounds_closed_short.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Gradients that close a `sync` round: a whole round's, but no more than the workers that
    /// can still contribute to it, at least one.
    fn round_quorum(&self, round: &SyncRound) -> usize {
        self.whole_round(round).min(self.round_contributors(round)).max(1)
    }

    /// The gradients of a whole round: M minus the backup workers, at least one.
    fn whole_round(&self, round: &SyncRound) -> usize {
        self.round_members(round).saturating_sub(self.hyper.backup_workers).max(1)
    }

    /// The workers the round counts: M when it got its first gradient, or fewer since.
    fn round_members(&self, round: &SyncRound) -> usize {
        let m = self.workers();
        round.members.map_or(m, |at_start| at_start.min(m))
    }

    /// Workers that have contributed to `round` or still can: all but those that finished their
    /// steps or fell silent without a gradient in it (a worker's last gradient counts though it
    /// left since).
    fn round_contributors(&self, round: &SyncRound) -> usize {
        self.round_workers(round, |w| !(w.finished || w.silent))
    }

    /// Workers of `round` still training, silent or not: a round applied with fewer gradients
    /// is closed short.
    fn round_trainers(&self, round: &SyncRound) -> usize {
        self.round_workers(round, |w| !w.finished)
    }

    /// The round's members that have contributed or pass `counts`.
    fn round_workers(&self, round: &SyncRound, counts: impl Fn(&WorkerStatus) -> bool) -> usize {
        let m = self.round_members(round);
        let seq = self.seq.lock();
        let contributed = |i: usize| round.contributed.get(i).is_some_and(Option::is_some);
        seq.workers[..m.min(seq.workers.len())]
            .iter()
            .enumerate()
            .filter(|(i, w)| counts(w) || contributed(*i))
            .count()
    }

    /// The PS has heard nothing from `worker` for its silence timeout (`silent`), or hears it
    /// again. Under `sync`, a round that now holds the gradient of every worker that can still
    /// send one closes at once (its outcome is returned): a dead or stopped worker then costs
    /// one silence timeout, not every later round's timeout. A worker heard again counts from
    /// the round in progress on.
    pub fn set_silent(&self, worker: usize, silent: bool) -> Option<PushOutcome> {
        self.check_worker(worker).ok()?;
        // Lock order: round, then sequencer.
        let mut round = self.round.lock();
        let mut seq = self.seq.lock();
        // A worker that finished its steps is not expected to talk: it is not silent.
        let silent = silent && !seq.workers[worker].finished;
        let was = std::mem::replace(&mut seq.workers[worker].silent, silent);
        drop(seq);
        if was != silent {
            self.record(|| Entry::Silence { worker, silent }, None);
        }
        (silent && self.round_is_due(&round)).then(|| self.apply_round(&mut round))
    }

    /// Whether the `sync` round holds enough gradients to close now that fewer workers can
    /// contribute to it (one left or fell silent). Never after finalize.
    fn round_is_due(&self, round: &SyncRound) -> bool {
        self.hyper.algorithm == Algorithm::Sync
            && round.count > 0
            && round.count >= self.round_quorum(round)
            && !self.is_finalized()
    }

    /// Worker `worker` (this incarnation, `generation`) has trained all its steps. Under `sync`,
    /// a round that now holds the gradients of every worker still training closes at once
    /// (its outcome is returned): without this, once some workers finished, the quorum of
    /// M − backupWorkers could never fill again and each round waited for the round timeout.
    pub fn leave(&self, worker: usize, generation: u64) -> Result<Option<PushOutcome>, StoreError> {
        self.check_worker(worker)?;
        // Lock order: round, then sequencer.
        let mut round = self.round.lock();
        {
            let mut seq = self.seq.lock();
            let w = &mut seq.workers[worker];
            if generation < w.generation {
                return Err(StoreError::Superseded { worker, got: generation, current: w.generation });
            }
            if generation > w.generation {
                return Err(StoreError::RejoinRequired { worker, got: generation, current: w.generation });
            }
            w.finished = true;
        }
        Ok(self.round_is_due(&round).then(|| self.apply_round(&mut round)))
    }

    /// The workers the `sync` round in progress still waits for: its members that have not
    /// contributed to it and have neither finished nor fallen silent.
    pub fn round_waits_for(&self) -> Vec<usize> {
        let round = self.round.lock();
        let m = self.round_members(&round);
        let seq = self.seq.lock();
        let contributed = |i: usize| round.contributed.get(i).is_some_and(Option::is_some);
        (0..m.min(seq.workers.len()))
            .filter(|&i| !contributed(i) && !seq.workers[i].finished && !seq.workers[i].silent)
            .collect()
    }

    /// The `sync` round in progress: (its version, contributions so far); `None` for the
    /// asynchronous rules.
    pub fn sync_round(&self) -> Option<(u64, usize)> {
        (self.hyper.algorithm == Algorithm::Sync).then(|| {
            let round = self.round.lock();
            (round.version, round.count)
        })
    }

    /// Closes the `sync` round for `version` with the gradients it has, when it is still open
    /// and has at least one: a round never waits forever for a worker that is gone. The
    /// missing workers' gradients for it are refused when they come (`round_closed`). Never
    /// after finalize: the final model is the last version.
    pub fn close_round(&self, version: u64) -> Option<PushOutcome> {
        let mut round = self.round.lock();
        let open = self.hyper.algorithm == Algorithm::Sync && round.version == version && round.count > 0;
        (open && !self.is_finalized()).then(|| self.apply_round(&mut round))
    }

    /// Applies a round with the round lock held: the next round's contributions need the
    /// version this produces, so nobody else can use the lock now.
    fn apply_round(&self, round: &mut SyncRound) -> PushOutcome {
        let short = round.count < self.round_trainers(round);
        if short {
            self.rounds_closed_short.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let mean_over = optimizer::mean_over(round.count, self.whole_round(round));
        optimizer::finish_combined(&self.hyper, &mut round.sum, mean_over);
        let (op, version, lr) = {
            let mut seq = self.seq.lock();
            let (op, version) = issue_update(&mut seq);
            for (w, contributed) in seq.workers.iter_mut().zip(&round.contributed) {
                if contributed.is_some() {
                    w.durable_seq = *contributed;
                }
            }
            let lr = self.hyper.lr.at(seq.epoch);
            let workers = round.contributed.iter().enumerate().filter(|(_, c)| c.is_some()).map(|(i, _)| i);
            let momentum_step = self.momentum_steps_at(version);
            self.record(
                || Entry::Round {
                    version,
                    workers: workers.collect(),
                    lr,
                    momentum_step,
                    short,
                    mean_over: Some(mean_over),
                },
                None,
            );
            (op, version, lr)
        };
        // sync keeps no MeanSquare.
        let stats = self.apply_op(op, version, Step::at(lr, 0), &round.sum, None);
        round.sum.fill(0.0);
        round.contributed.fill(None);
        round.count = 0;
        round.members = None;
        round.version = version;
        self.notify(version);
        PushOutcome { version, staleness: 0, applied: true, replayed: false, stats, lr }
    }

    /// Whether the delayed momentum steps with the update that makes `version`.
    fn momentum_steps_at(&self, version: u64) -> bool {
        let delay = u64::from(self.hyper.momentum_delay);
        delay > 1 && version.is_multiple_of(delay)
    }

    /// Re-applies a journal's asynchronous update (`foresight replay`): `step`, `grad` and
    /// `backup` as recorded, making model `version`, which must be the next one.
    pub fn apply_recorded(
        &self,
        version: u64,
        step: Step,
        grad: &[f32],
        backup: Option<(&[f32], BackupAs)>,
    ) -> Result<(), u64> {
        let op = self.next_update(version)?;
        self.apply_op(op, version, step, grad, backup);
        Ok(())
    }

    /// Re-applies a journal's `sync` round: `sum` holds its contributions summed in the
    /// journal's order (it is combined in place, divided by `mean_over`).
    pub fn apply_recorded_round(
        &self,
        version: u64,
        lr: f32,
        sum: &mut [f32],
        mean_over: usize,
    ) -> Result<(), u64> {
        optimizer::finish_combined(&self.hyper, sum, mean_over);
        let op = self.next_update(version)?;
        self.apply_op(op, version, Step::at(lr, 0), sum, None);
        Ok(())
    }

    /// The ticket of the update that makes `version`; `Err(current)` unless it is the next one.
    fn next_update(&self, version: u64) -> Result<u64, u64> {
        let mut seq = self.seq.lock();
        if version != seq.version + 1 {
            return Err(seq.version);
        }
        Ok(issue_update(&mut seq).0)
    }

    /// Applies update `op`, which makes model `version`, shard group by shard group.
    fn apply_op(
        &self,
        op: u64,
        version: u64,
        step: Step,
        grad: &[f32],
        backup: Option<(&[f32], BackupAs)>,
    ) -> UpdateStats {
        let delay = u64::from(self.hyper.momentum_delay);
        let states = vec![UpdateStats::default(); self.groups.len()];
        let per_group = self.walk_grouped(op, states, |stats, shard, d| {
            let r = shard.range.clone();
            let st = &mut d.state;
            let grad = &grad[r.clone()];
            with_backup(backup, r.clone(), |bak| {
                // Each part of the chunk with its group's rates (one part without groups).
                for (p, rates) in self.rates.within(r) {
                    let step = step.with_rates(rates);
                    let (w, g, bak) = (&mut d.w[p.clone()], &grad[p.clone()], bak.map(|b| &b[p.clone()]));
                    let s = if delay > 1 {
                        // Versions count updates, so every shard (and a restored PS) agrees on the cycle.
                        let milestone = version.is_multiple_of(delay);
                        let ms = part(&mut st.mean_square, &p);
                        let delayed = optimizer::Delayed {
                            momentum: part(&mut st.momentum, &p),
                            pending: part(&mut st.pending, &p),
                            milestone,
                        };
                        optimizer::apply_delayed(&self.hyper, step, w, g, bak, ms, delayed)
                    } else {
                        let ms = part(&mut st.mean_square, &p);
                        optimizer::apply(&self.hyper, step, w, g, bak, ms, part(&mut st.momentum, &p))
                    };
                    stats.merge(s);
                }
            });
        });
        per_group.into_iter().fold(UpdateStats::default(), |mut all, s| {
            all.merge(s);
            all
        })
    }

    fn notify(&self, version: u64) {
        if let Some(l) = &self.listener {
            l(version);
        }
    }

    /// A consistent copy of the model and optimizer state at the current version.
    pub fn checkpoint(&self) -> CheckpointData {
        let n = self.layout.len();
        let (op, mut data) = {
            let mut seq = self.seq.lock();
            let op = seq.next_op;
            seq.next_op += 1;
            let data = CheckpointData {
                version: seq.version,
                epoch: seq.epoch,
                params: vec![0.0; n],
                state: OptimizerState::new(&self.hyper, n),
                finalized: seq.finalized,
                worker_seqs: seq.workers.iter().map(|w| w.durable_seq).collect(),
                worker_generations: seq.workers.iter().map(|w| w.generation).collect(),
                workers: self.workers(),
            };
            (op, data)
        };
        self.walk(op, |shard, d| {
            let r = shard.range.clone();
            data.params[r.clone()].copy_from_slice(&d.w);
            if !d.state.mean_square.is_empty() {
                data.state.mean_square[r.clone()].copy_from_slice(&d.state.mean_square);
            }
            if !d.state.momentum.is_empty() {
                data.state.momentum[r.clone()].copy_from_slice(&d.state.momentum);
            }
            if !d.state.pending.is_empty() {
                data.state.pending[r].copy_from_slice(&d.state.pending);
            }
        });
        data
    }

    /// Makes the model read-only and returns its final state. Idempotent.
    pub fn finalize(&self) -> CheckpointData {
        self.seq.lock().finalized = true;
        self.checkpoint()
    }

    pub fn status(&self) -> StoreStatus {
        let seq = self.seq.lock();
        StoreStatus {
            algorithm: self.hyper.algorithm,
            parameters: self.layout.len(),
            version: seq.version,
            epoch: seq.epoch,
            learning_rate: self.hyper.lr.at(seq.epoch),
            finalized: seq.finalized,
            staleness: seq.staleness.summary(self.hyper.max_staleness),
            workers: seq.workers[..self.workers().min(seq.workers.len())].to_vec(),
        }
    }

    /// Snapshot buffers kept for later versions (at most [`SPARE_SNAPSHOTS`]).
    pub fn spare_snapshots(&self) -> usize {
        self.snapshot_buffers.spare.lock().len()
    }

    /// Distinct model copies held for backups and the pull cache (for memory accounting).
    pub fn snapshots_held(&self) -> usize {
        let seq = self.seq.lock();
        let mut seen: Vec<*const Snapshot> =
            seq.backups.iter().flat_map(Backups::all).map(|b| Arc::as_ptr(&b.snap)).collect();
        seen.extend(seq.cached.iter().map(Arc::as_ptr));
        seen.sort();
        seen.dedup();
        seen.len()
    }
}

/// What the checks make of a push.
enum Judged {
    Replay(PushOutcome),
    Accept { staleness: u64, backup: Option<Backup> },
}

enum Admission {
    Replay(PushOutcome),
    Ticket(Ticket),
    /// A `sync` contribution, which takes its ticket when its round completes.
    Contribution,
}

struct Ticket {
    op: u64,
    version: u64,
    step: Step,
    backup: Option<Backup>,
    staleness: u64,
}

/// How a worker received the model it computed on, which the delay-compensated rules' w_bak
/// must be: the snapshot itself, or the snapshot rounded to bf16 (an int8 pull's copy is the
/// snapshot up to the rounding of the last difference, error fed back: taken as the snapshot).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackupAs {
    #[default]
    F32,
    Bf16,
}

/// Calls `f` with the shard `range` of `backup` as the worker received it. A bf16 puller trained
/// on the rounded model: its shard is rounded here, into a buffer each thread reuses, rather than
/// kept as a model-sized copy per worker.
fn with_backup<R>(
    backup: Option<(&[f32], BackupAs)>,
    range: Range<usize>,
    f: impl FnOnce(Option<&[f32]>) -> R,
) -> R {
    thread_local! {
        static ROUNDED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    match backup {
        None => f(None),
        Some((b, BackupAs::F32)) => f(Some(&b[range])),
        Some((b, BackupAs::Bf16)) => ROUNDED.with_borrow_mut(|rounded| {
            rounded.clear();
            rounded.extend(b[range].iter().map(|&v| wire::bf16_round_trip(v)));
            f(Some(&rounded[..]))
        }),
    }
}

/// Range `p` of optimizer state `v`, or `v` itself when the rule keeps none (empty).
fn part<'a>(v: &'a mut [f32], p: &Range<usize>) -> &'a mut [f32] {
    if v.is_empty() { v } else { &mut v[p.clone()] }
}

/// w_bak(m): the snapshot worker m pulled, and how it received it.
#[derive(Clone)]
struct Backup {
    snap: Arc<Snapshot>,
    pulled_as: BackupAs,
}

/// A worker's backups: the model it pulled last and, when it overlaps its exchange with its
/// next step ([`Store::overlaps`]), the one it pulled before, which its next gradient is
/// computed on (it pulls the newer one while it computes). Two per worker at most: the memory
/// plan counts a backup and a snapshot being sent per worker, which they are.
#[derive(Clone, Default)]
struct Backups {
    latest: Option<Backup>,
    previous: Option<Backup>,
}

impl Backups {
    fn of(b: Backup) -> Self {
        Self { latest: Some(b), previous: None }
    }

    /// A pull recorded `b`; the one before stays only for a worker that overlaps.
    fn record(&mut self, b: Backup, keep_previous: bool) {
        let before = self.latest.replace(b);
        self.previous = before.filter(|_| keep_previous);
    }

    /// The backup of `version`, the model a pushed gradient says it was computed on.
    fn computed_on(&self, version: u64) -> Option<&Backup> {
        self.all().find(|b| b.snap.version() == version)
    }

    fn all(&self) -> impl Iterator<Item = &Backup> {
        self.latest.iter().chain(&self.previous)
    }
}

/// Takes the next operation number for an update and advances the version.
fn issue_update(seq: &mut Sequencer) -> (u64, u64) {
    let op = seq.next_op;
    seq.next_op += 1;
    seq.version += 1;
    seq.seeded_at = None;
    (op, seq.version)
}

#[cfg(test)]
mod tests;
