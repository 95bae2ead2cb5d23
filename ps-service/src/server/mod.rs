//! The HTTP/2 service: routes, auth, limits, metrics, checkpoints and serving.
//!
//! Handlers parse, call the store, and map errors to responses in one place ([`ApiError`]);
//! shared state lives behind one `Arc<AppState>`.

mod admission;
mod auth;
mod body;
mod credential;
mod error;
mod guarded_body;
mod handlers;
mod liveness;
pub mod metrics;
mod open_request;
mod peers;
mod presence;
mod replicas;
mod serve;
mod snapshots;
mod streamed_pull;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::watch;

use crate::optimizer::Hyper;
use crate::pace::{LocalStepsPolicy, Pace, PaceReport};
use crate::store::checkpoint::{self, CheckpointDir, CheckpointError};
use crate::store::journal::{Entry, Start};
use crate::store::{CheckpointData, Push, Store};
use crate::wire::buffers::Buffers;
use crate::wire::final_model::FinalModel;
use crate::wire::protocol::{PullDtype, Report};
use crate::wire::{Layout, shards};

pub use admission::{cgroup_memory_limit, check_memory_limit};
pub use error::ApiError;
pub use handlers::router;
pub use serve::{ConnectionLimits, Listener, TlsFiles, serve};
pub use snapshots::{SNAPSHOT_INDEX, SnapshotPolicy, SnapshotRecord};

/// Everything the PS is configured with (the binary fills it from flags and environment).
#[derive(Clone, Debug)]
pub struct PsConfig {
    pub hyper: Hyper,
    pub workers: usize,
    /// Bearer token for `/v1/*`; `None` only when the operator of the PS said so explicitly.
    pub token: Option<String>,
    /// The job's control token: when set, only it may finalize or rescale the job
    /// ([`auth::CONTROL_ROUTES`]); it is accepted on every other route too.
    pub control_token: Option<String>,
    pub body_limit: usize,
    /// A request body that sends nothing for this long is refused (408) and its buffer freed.
    pub body_idle_timeout: Duration,
    /// Bytes a second a request body must average over each idle period while it is read; one
    /// below it is refused (408 `body_too_slow`). 0: no minimum.
    pub body_min_rate: u64,
    pub checkpoint_dir: Option<PathBuf>,
    pub checkpoint_interval: Option<Duration>,
    pub keep_checkpoints: usize,
    /// Where `POST /v1/finalize` writes `model-final.safetensors` (default: the checkpoint dir).
    pub output_dir: Option<PathBuf>,
    /// Model snapshots every N updates, for learning curves (`None`: none).
    pub snapshots: Option<SnapshotPolicy>,
    pub job: String,
    pub namespace: String,
    /// Upper bound on a pull's `wait_ms`.
    pub max_long_poll: Duration,
    /// `sync`: a round that has waited this long since its last gradient closes with the ones
    /// it has (a dead worker never holds the job up for longer).
    pub sync_round_timeout: Duration,
    /// A worker not heard (no pull, push, join, leave or report) for this long is marked
    /// silent: `sync` rounds stop waiting for it until it is heard again.
    pub worker_silence_timeout: Duration,
    /// After the model was seeded from a worker's copy (the PS had lost it), pushes wait this
    /// long at most for the other workers to offer fresher copies.
    pub reseed_hold: Duration,
    /// The process's memory limit in bytes (`None`: unlimited): with the model's size it sets
    /// how many push bodies are buffered at once ([`admission::push_slots`]).
    pub memory_limit: Option<u64>,
    /// That count set explicitly instead.
    pub push_slots: Option<usize>,
    /// What the workers pull the model as: bf16 and int8 bodies are encoded per pull, and
    /// with int8 the PS keeps a copy of the model per worker ([`replicas`]); the memory limit's
    /// plan counts both.
    pub pulled_as: PullDtype,
    /// Shard 0 of a sharded PS: the other shards' URLs, in shard order. Its finalize finalizes
    /// them too and writes the whole model's final file from every shard's slice.
    pub peers: Vec<String>,
    /// The roots trusted for https:// peers.
    pub peer_tls: Option<peers::ClientTls>,
    /// This process's shard of a sharded PS (0 when unsharded): the `shard` label of its series.
    pub shard: usize,
    /// `optimizer.adaptiveLocalSteps`: the PS advises each worker its local steps ([`crate::pace`]).
    pub local_steps: Option<LocalStepsPolicy>,
    /// The update journal in the checkpoint directory ([`crate::journal`]; none without one).
    pub journal: crate::journal::Mode,
    /// Its size before it is rotated.
    pub journal_max_bytes: u64,
    /// `/healthz` fails when pushes have waited in the store this long with no update finishing.
    pub store_stuck_after: Duration,
}

impl PsConfig {
    /// What this PS sends to its peer shards (it finalizes and rescales them).
    fn peer_token(&self) -> Option<String> {
        self.control_token.clone().or_else(|| self.token.clone())
    }

    pub fn new(hyper: Hyper, workers: usize) -> Self {
        Self {
            hyper,
            workers,
            token: None,
            control_token: None,
            body_limit: 1 << 30,
            body_idle_timeout: Duration::from_secs(30),
            body_min_rate: 64 << 10,
            checkpoint_dir: None,
            checkpoint_interval: None,
            keep_checkpoints: 3,
            output_dir: None,
            snapshots: None,
            job: "local".into(),
            namespace: "default".into(),
            max_long_poll: Duration::from_secs(60),
            sync_round_timeout: Duration::from_secs(120),
            worker_silence_timeout: Duration::from_secs(120),
            reseed_hold: Duration::from_secs(10),
            memory_limit: None,
            push_slots: None,
            pulled_as: PullDtype::F32,
            peers: Vec::new(),
            peer_tls: None,
            shard: 0,
            local_steps: None,
            journal: crate::journal::Mode::default(),
            journal_max_bytes: 64 << 20,
            store_stuck_after: Duration::from_secs(60),
        }
    }
}

pub use crate::store::MAX_WORKERS;
use crate::wire::protocol::reason;

/// Shared state of the running PS.
pub struct AppState {
    pub config: PsConfig,
    store: OnceLock<Arc<Store>>,
    pub metrics: metrics::Metrics,
    version_tx: watch::Sender<u64>,
    reports: Mutex<Vec<Option<Report>>>,
    /// Each worker's pace, from its pushes: what the local steps advised are chosen from.
    pace: Mutex<Pace>,
    presence: presence::Presences,
    checkpoints: Option<CheckpointDir>,
    last_checkpoint: Mutex<Instant>,
    /// One checkpoint write at a time (periodic, shutdown and finalize may race).
    checkpoint_lock: tokio::sync::Mutex<()>,
    /// The final model once written: the last worker's leave and the operator's finalize may
    /// race, and both get this one answer.
    final_model: tokio::sync::OnceCell<FinalModel>,
    /// One registration (or re-seeding offer) read and built at a time: in a registration storm
    /// (every worker uploading at start, or after the PS lost its model) the first installs the
    /// model and the others are answered without buffering their bodies or building a store of
    /// their own (a model-sized body and about five model-sized copies each).
    registering: tokio::sync::Mutex<()>,
    bodies: crate::pool::Pool<u8>,
    grads: crate::pool::Pool<f32>,
    /// Bodies of pulls encoded per request (bf16, int8 differences), lent to hyper while sent.
    pull_bodies: Arc<crate::pool::Pool<u8>>,
    /// One encoded pull body per worker at a time ([`admission::PullGates`]).
    pub(crate) pull_gates: admission::PullGates,
    /// Admission control of push bodies, sized once the model is known.
    push_slots: OnceLock<admission::PushSlots>,
    seeding: Mutex<Seeding>,
    /// The job's worker count M: `--workers` at start, then whatever `PUT /v1/workers` set.
    workers: std::sync::atomic::AtomicUsize,
    /// The copies workers pulling int8 hold, to send each only its difference.
    replicas: replicas::Replicas,
    /// Which process this is and how it began: the operator compares `incarnation` between
    /// reads of `/v1/status` to see a restart (a crashed container or a replaced pod alike).
    pub process: ProcessInfo,
    /// The newest version this process's model shares with an earlier process's history (the
    /// checkpoint it restored, the worker's copy it was seeded with): up to it, a version names
    /// the same model in both; past it, different ones. `None`: nothing shared (a first
    /// registration).
    shared_up_to: Mutex<Option<u64>>,
    /// The last leave's buffers (`wire::buffers`), written into the final model; kept in the
    /// checkpoint directory too, so that a restarted PS still has them.
    buffers: Mutex<Buffers>,
    /// One leave at a time from its leaving to its buffers kept: the leave that finalizes the
    /// job is the one whose buffers the final model holds.
    leaving: tokio::sync::Mutex<()>,
    journal: Option<crate::journal::Writer>,
    /// What each join hands its worker, and the check of what later calls carry.
    credentials: credential::Credentials,
    /// Pushes inside the store, for `/healthz` ([`liveness`]).
    pub(crate) store_watch: liveness::StoreWatch,
}

/// The buffers' file in the checkpoint directory.
const BUFFERS_FILE: &str = "buffers.safetensors";

/// This PS process, as `/v1/status` reports it under `process`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ProcessInfo {
    /// Random, new in every process.
    pub incarnation: String,
    /// Unix time in milliseconds.
    pub started_at_ms: u64,
    /// The version of the checkpoint it restored at start; `None`: it started without a model.
    pub restored_version: Option<u64>,
}

/// Whether the PS is collecting the workers' copies of a model it lost. A process loses its
/// model at most once (it starts without one), so the hold happens at most once.
enum Seeding {
    /// No copy newer than the initial model has been offered.
    Idle,
    /// Pushes wait (503 `seeding`) until every worker has offered its copy (the freshest one
    /// wins) or `until` has passed.
    Holding {
        until: Instant,
        offered: Vec<bool>,
    },
    Over,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("invalid hyperparameters: {0}")]
    Hyper(#[from] crate::optimizer::HyperError),
    #[error("checkpoint directory: {0}")]
    Checkpoint(#[from] CheckpointError),
    #[error("the job needs at least one worker")]
    NoWorkers,
    #[error("backupWorkers ({backup}) must be fewer than the workers ({workers})")]
    TooManyBackups { backup: usize, workers: usize },
}

/// The worker count to start with: the checkpoint's (the job may have been scaled since the
/// command line was written; the operator tells a restarted PS any later change) unless it is
/// unknown or does not fit the configured backup workers.
fn restored_membership(config: &PsConfig, restored: Option<&CheckpointData>) -> usize {
    let Some(saved) = restored.map(|d| d.workers).filter(|&n| n > config.hyper.backup_workers) else {
        return config.workers;
    };
    if saved != config.workers {
        tracing::info!(
            checkpoint = saved,
            command_line = config.workers,
            "the worker count comes from the checkpoint"
        );
    }
    saved
}

impl AppState {
    /// Builds the state and restores the newest valid checkpoint, if there is one.
    pub fn new(config: PsConfig) -> Result<Arc<Self>, StartError> {
        config.hyper.validate()?;
        if config.workers == 0 {
            return Err(StartError::NoWorkers);
        }
        if config.hyper.backup_workers >= config.workers {
            let (backup, workers) = (config.hyper.backup_workers, config.workers);
            return Err(StartError::TooManyBackups { backup, workers });
        }
        let checkpoints = match &config.checkpoint_dir {
            Some(d) => Some(CheckpointDir::new(d, config.keep_checkpoints)?),
            None => None,
        };
        let journal = match &checkpoints {
            Some(dir) => crate::journal::Writer::open(
                dir.path(),
                config.shard,
                config.journal,
                config.journal_max_bytes,
            )
            .map_err(|source| CheckpointError::Io { path: dir.path().to_path_buf(), source })?,
            None => None,
        };
        let restoring = Instant::now();
        let restored = match &checkpoints {
            Some(dir) => dir.load_newest()?,
            None => None,
        };
        let workers = restored_membership(&config, restored.as_ref().map(|(_, _, data, _)| data));
        let metrics = metrics::Metrics::new(&config.job, &config.namespace, config.shard);
        metrics.max_staleness.set(config.hyper.max_staleness.map_or(0, |b| b as i64));
        metrics.workers_expected.set(workers as i64);
        let (version_tx, _) = watch::channel(0);
        let restored_version = restored.as_ref().map(|(_, _, data, _)| data.version);
        let incarnation = rand::random::<u64>();
        let credentials = credential::Credentials::new(config.control_token.as_deref(), config.shard);
        let state = Arc::new(Self {
            config,
            store: OnceLock::new(),
            metrics,
            version_tx,
            reports: Mutex::new(vec![None; workers]),
            pace: Mutex::new(Pace::default()),
            presence: presence::Presences::new(workers),
            checkpoints,
            last_checkpoint: Mutex::new(Instant::now()),
            checkpoint_lock: tokio::sync::Mutex::new(()),
            final_model: tokio::sync::OnceCell::new(),
            registering: tokio::sync::Mutex::new(()),
            bodies: crate::pool::Pool::new(8),
            grads: crate::pool::Pool::new(8),
            pull_bodies: Arc::new(crate::pool::Pool::new(8)),
            pull_gates: Default::default(),
            push_slots: OnceLock::new(),
            seeding: Mutex::new(Seeding::Idle),
            workers: std::sync::atomic::AtomicUsize::new(workers),
            replicas: replicas::Replicas::new(incarnation),
            process: ProcessInfo {
                incarnation: format!("{incarnation:016x}"),
                started_at_ms: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64),
                restored_version,
            },
            shared_up_to: Mutex::new(restored_version),
            buffers: Mutex::new(Buffers::default()),
            leaving: tokio::sync::Mutex::new(()),
            journal,
            credentials,
            store_watch: liveness::StoreWatch::default(),
        });
        if let Some((path, layout, data, saved)) = restored {
            if saved.algorithm != state.config.hyper.algorithm {
                tracing::warn!(saved = %saved.algorithm, configured = %state.config.hyper.algorithm,
                    "checkpoint was written by another algorithm; continuing with the configured one");
            }
            let version = data.version;
            *state.buffers.lock() = state.restored_buffers(&layout);
            let store = Store::restore(layout, data, state.config.hyper.clone(), workers);
            state.install(store, Start::Restored);
            let seconds = restoring.elapsed().as_secs_f64();
            tracing::info!(path = %path.display(), version, seconds, "restored checkpoint");
        }
        Ok(state)
    }

    /// K for [`admission`]: set explicitly, or from the memory limit and the model's size (for
    /// the worker count of this moment; `None`: unbounded).
    /// The memory plan for the job's worker count now ([`admission::MemoryPlan`]).
    fn memory_plan(&self, store: &Store) -> admission::MemoryPlan {
        let state = crate::optimizer::OptimizerState::new(store.hyper(), 1);
        let workers = self.workers();
        // The body each worker may be sent at once when pulls are encoded per request (bf16: half
        // a copy, int8: a quarter), and with int8 each worker's copy.
        let pull_copies = match self.config.pulled_as {
            PullDtype::F32 => 0,
            PullDtype::Bf16 => workers.div_ceil(2),
            PullDtype::Int8 => workers + workers.div_ceil(4),
        };
        admission::MemoryPlan {
            model_bytes: 4 * store.layout().len() as u64,
            workers,
            state_copies: state.copies() + pull_copies,
            checkpoint_copies: 1 + state.copies(),
        }
    }

    fn push_slot_count(&self, store: &Store) -> Option<usize> {
        let (plan, limit) = (self.memory_plan(store), self.config.memory_limit);
        let count = self.config.push_slots.or_else(|| plan.push_slots(limit));
        let planned_peak = count.map(|k| plan.peak_bytes(k));
        tracing::info!(
            ?count,
            memory_limit = limit,
            model_bytes = plan.model_bytes,
            planned_peak,
            "push slots"
        );
        count
    }

    /// `/v1/status`'s `memory`: the limit, the push slots and the peak they plan for.
    pub(crate) fn memory_status(&self) -> serde_json::Value {
        let (Some(store), Some(slots)) = (self.store(), self.push_slots.get()) else {
            return serde_json::Value::Null;
        };
        let plan = self.memory_plan(store);
        let count = slots.count();
        serde_json::json!({
            "limit_bytes": self.config.memory_limit,
            "push_slots": count,
            "model_bytes": plan.model_bytes,
            "resident_bytes": plan.resident_bytes(),
            "planned_peak_bytes": count.map(|k| plan.peak_bytes(k)),
        })
    }

    /// A slot for a push body ([`admission`]). The slots are sized just after the store becomes
    /// visible: a push in that instant goes unbounded rather than waiting for them.
    pub(crate) async fn admit_push(&self) -> Result<Option<tokio::sync::OwnedSemaphorePermit>, ApiError> {
        match self.push_slots.get() {
            Some(slots) => slots.admit().await.map(Some),
            None => Ok(None),
        }
    }

    /// The registered model, if any.
    pub fn store(&self) -> Option<&Arc<Store>> {
        self.store.get()
    }

    /// Makes `store` the model (which came as `how` says); false when one was registered first.
    fn install(self: &Arc<Self>, mut store: Store, how: Start) -> bool {
        let tx = self.version_tx.clone();
        let version = store.version();
        if let Some(journal) = &self.journal {
            if let Err(error) = journal.begin(&store, how) {
                tracing::error!(%error, "the journal's initial model could not be written: it cannot be replayed");
            }
            store.set_journal(journal.sink());
        }
        store.set_listener(Box::new(move |v| {
            tx.send_if_modified(|cur| {
                let newer = v > *cur;
                if newer {
                    *cur = v;
                }
                newer
            });
        }));
        let ok = self.store.set(Arc::new(store)).is_ok();
        if let Some(store) = self.store() {
            // Built for the count at start; the job may have been scaled since (read after the
            // store is visible, so a concurrent `set_workers` is never missed).
            store.set_workers(self.workers());
            let slots =
                self.push_slots.get_or_init(|| admission::PushSlots::new(self.push_slot_count(store)));
            self.metrics.push_slots.set(slots.count().map_or(0, |k| k as i64));
        }
        if ok {
            self.version_tx.send_replace(version);
            self.metrics.model_version.set(version as i64);
        }
        ok
    }

    /// A model arrives (`PUT /v1/model`): the first becomes the model; while no update has been
    /// applied since, a fresher one replaces it. Returns whether it was taken. An offer (a
    /// worker's copy, the request names the `worker`) means the PS lost its model, so pushes
    /// are held until every worker has offered or the hold has passed.
    fn offer(self: &Arc<Self>, store: Store, worker: Option<usize>) -> bool {
        let version = store.version();
        let taken = match self.store() {
            None => self.install(store, if worker.is_some() { Start::Seeded } else { Start::Registered }),
            Some(current) => {
                let values = store.snapshot_now();
                current.reseed(values.params(), version)
            }
        };
        // An offer names its worker; a job's first registration does not. Any offer, even of
        // the initial model (a worker that had pulled nothing newer), means the PS lost its
        // model: hold for the others' copies, or training could go on from an old one.
        if worker.is_some() && taken {
            *self.shared_up_to.lock() = Some(version);
            self.metrics.reseeds.inc();
            tracing::info!(version, worker, "model seeded from a worker's copy");
            let mut seeding = self.seeding.lock();
            if matches!(*seeding, Seeding::Idle) {
                let until = Instant::now() + self.config.reseed_hold;
                *seeding = Seeding::Holding { until, offered: vec![false; self.workers()] };
            }
        }
        self.offered(worker);
        if taken {
            self.metrics.model_version.set(version as i64);
        }
        taken
    }

    /// Refuses a gradient computed on `version` as served by another PS process
    /// (`incarnation`, from the pull) unless that version is one this process shares with it:
    /// after a restart versions past the restored or seeded one name other models, and under
    /// `asgd` and `sync` such a gradient would otherwise pass as fresh.
    pub fn check_lineage(&self, incarnation: &str, version: u64) -> Result<(), ApiError> {
        let here = &self.process.incarnation;
        let shared = *self.shared_up_to.lock();
        if incarnation == here || shared.is_some_and(|v| version <= v) {
            return Ok(());
        }
        Err(ApiError::new(
            axum::http::StatusCode::CONFLICT,
            reason::PULL_REQUIRED,
            format!(
                "version {version} was served by an earlier parameter-server process ({incarnation}); \
                 this one ({here}) shares {} with it: pull the model again",
                shared.map_or("no version".to_string(), |v| format!("versions up to {v}"))
            ),
        ))
    }

    /// Notes that `worker` has offered its copy, whether or not it was taken: the hold waits
    /// for every worker's offer, not for every worker's copy to win.
    pub(crate) fn offered(&self, worker: Option<usize>) {
        if let (Seeding::Holding { offered, .. }, Some(w)) = (&mut *self.seeding.lock(), worker)
            && let Some(o) = offered.get_mut(w)
        {
            *o = true;
        }
    }

    /// Whether `worker` must offer its copy (or join) before it may pull or push: the PS is
    /// holding for the workers' copies and has not heard from this one. Were it to pull first,
    /// the seeded, possibly older model would replace the fresher copy it holds.
    pub(crate) fn must_offer(&self, worker: usize) -> bool {
        // A worker added while the PS holds was not asked for a copy.
        matches!(&*self.seeding.lock(), Seeding::Holding { offered, .. } if offered.get(worker) == Some(&false))
    }

    /// Whether pushes must still wait for the workers' copies (see [`AppState::offer`]).
    fn seeding(&self) -> bool {
        let mut seeding = self.seeding.lock();
        if let Seeding::Holding { until, offered } = &*seeding
            && (Instant::now() >= *until || offered.iter().all(|o| *o))
        {
            *seeding = Seeding::Over;
        }
        matches!(*seeding, Seeding::Holding { .. })
    }

    /// Closes a `sync` round that has had no new gradient for `sync_round_timeout`, until the
    /// process ends.
    pub fn spawn_round_watch(self: &Arc<Self>) {
        if self.config.hyper.algorithm != crate::optimizer::Algorithm::Sync {
            return;
        }
        let state = self.clone();
        let timeout = self.config.sync_round_timeout;
        tokio::spawn(async move {
            let mut seen: Option<((u64, usize), Instant)> = None;
            let mut tick =
                tokio::time::interval((timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(1)));
            loop {
                tick.tick().await;
                let Some(round) = state.store().and_then(|s| s.sync_round()) else { continue };
                match seen {
                    Some((r, since)) if r == round => {
                        if round.1 > 0
                            && since.elapsed() >= timeout
                            && !state.round_waits_for_a_live_worker(timeout)
                        {
                            // Applying a round is whole-model work: off the runtime's threads,
                            // which serve every connection (`/healthz` included).
                            let closing = state.clone();
                            let _ =
                                tokio::task::spawn_blocking(move || closing.close_round_short(round.0)).await;
                            seen = None;
                        }
                    }
                    _ => seen = Some((round, Instant::now())),
                }
            }
        });
    }

    /// Whether a worker the `sync` round still waits for was heard within `timeout` (its
    /// heartbeats during a block of local steps): the round then waits on, where it used to
    /// close without that worker's pseudo-gradient and throw a whole block away.
    fn round_waits_for_a_live_worker(&self, timeout: Duration) -> bool {
        let Some(store) = self.store() else { return false };
        store.round_waits_for().into_iter().any(|w| self.presence.beat_within(w, timeout))
    }

    fn close_round_short(&self, version: u64) {
        let Some(store) = self.store() else { return };
        if let Some(o) = store.close_round(version) {
            tracing::warn!(
                version,
                new_version = o.version,
                "sync round closed without every worker's gradient"
            );
            self.count_round_closed(o.version);
        }
    }

    /// A `sync` round applied outside a push (its timeout, or a leave): the push path counts
    /// the others.
    pub(crate) fn count_round_closed(&self, version: u64) {
        self.metrics.updates.inc();
        self.metrics.model_version.set(version as i64);
    }

    /// The job's worker count M now.
    pub fn workers(&self) -> usize {
        // Acquire: whoever sees the new count also sees the tables grown for it.
        self.workers.load(std::sync::atomic::Ordering::Acquire)
    }

    /// `PUT /v1/workers`: the job now has `n` workers. Shard 0 of a sharded PS tells the other
    /// shards first (a count they refuse is refused here too, before anything changed; the
    /// caller retries a failure, and telling a shard again is harmless).
    pub async fn scale(&self, n: usize) -> Result<(), ApiError> {
        self.check_worker_count(n)?;
        peers::scale(&self.config, n).await?;
        self.set_workers(n)
    }

    fn check_worker_count(&self, n: usize) -> Result<(), ApiError> {
        if n == 0 || n > MAX_WORKERS {
            return Err(ApiError::bad_request(format!("count must be in 1..={MAX_WORKERS}, got {n}")));
        }
        let backup = self.config.hyper.backup_workers;
        if backup >= n {
            return Err(ApiError::bad_request(format!(
                "count {n} must be above the job's backupWorkers ({backup})"
            )));
        }
        Ok(())
    }

    /// This PS alone now expects `n` workers: the tables grow before the new count is visible,
    /// so a new index is never looked up in a table too short for it.
    pub fn set_workers(&self, n: usize) -> Result<(), ApiError> {
        self.check_worker_count(n)?;
        let mut reports = self.reports.lock();
        if reports.len() < n {
            reports.resize(n, None);
        }
        drop(reports);
        self.presence.grow(n);
        if let Some(store) = self.store() {
            store.set_workers(n);
        }
        let old = self.workers.swap(n, std::sync::atomic::Ordering::AcqRel);
        self.metrics.workers_expected.set(n as i64);
        // More workers, more resident copies: fewer push bodies fit under the same limit.
        if let (Some(store), Some(slots)) = (self.store(), self.push_slots.get())
            && self.config.push_slots.is_none()
        {
            let count = self.memory_plan(store).push_slots(self.config.memory_limit);
            slots.resize(count);
            self.metrics.push_slots.set(count.map_or(0, |k| k as i64));
        }
        // A worker scaled away no longer sets the others' rounds, nor holds a copy here.
        self.pace.lock().retain_below(n);
        self.replicas.retain_below(n);
        for gone in n..old {
            let _ = self.metrics.local_steps.remove_label_values(&[&gone.to_string()]);
        }
        if old != n {
            tracing::info!(from = old, to = n, "the job's worker count changed");
        }
        Ok(())
    }

    /// `worker` finished or fell silent: its pace no longer counts in the others' rounds.
    /// A worker that finished its steps sets no more rounds.
    fn forget_pace(&self, worker: usize) {
        self.pace.lock().forget(worker);
    }

    /// A worker gone silent sets no more rounds, and its copy is freed (if it comes back, its
    /// next int8 pull is the whole model).
    fn forget_worker(&self, worker: usize) {
        self.forget_pace(worker);
        self.replicas.forget(worker);
    }

    /// Folds the pace an accepted push reported into what the PS knows of `worker`, and answers
    /// the local steps it should train next when the job lets the PS choose them. The
    /// `foresight_ps_local_steps` gauge shows that advice, or else the steps the push covered.
    fn pace_push(&self, worker: usize, report: Option<PaceReport>) -> Option<u64> {
        let mut pace = self.pace.lock();
        if let Some(r) = report {
            pace.record_at(worker, r, Instant::now());
        }
        let advice = self.config.local_steps.as_ref().map(|policy| pace.advise(worker, policy));
        if let Some(h) = advice.or(report.map(|r| r.steps)) {
            self.metrics.local_steps.with_label_values(&[&worker.to_string()]).set(h as i64);
        }
        advice
    }

    /// How often a worker between exchanges should say it is alive: a quarter of the shorter of
    /// the silence and round timeouts, so that three lost heartbeats in a row still do not
    /// make it silent.
    pub fn heartbeat_every(&self) -> Duration {
        (self.config.worker_silence_timeout.min(self.config.sync_round_timeout) / 4)
            .max(Duration::from_millis(50))
    }

    /// A heartbeat from `worker`: as [`Self::saw`], and a `sync` round waiting for it is not
    /// closed short while its heartbeats come.
    pub async fn heard_beat(&self, worker: usize) {
        self.presence.beat(worker);
        self.saw(worker).await;
    }

    /// A request from `worker` that may stay open for long (a pull's long poll, a model-sized
    /// upload or download): as [`Self::saw`], and the worker is not marked silent while the
    /// guard lives. A worker waiting for its `sync` round to close has sent its gradient, and one
    /// moving a 1B-parameter model over a slow link is busy for minutes: marking either silent
    /// would shrink a round's quorum (closing it without a worker still training) and free the
    /// worker's int8 copy and pace.
    pub(crate) async fn saw_open(self: &Arc<Self>, worker: usize) -> open_request::OpenRequest {
        self.saw(worker).await;
        open_request::OpenRequest::begin(self.clone(), worker)
    }

    /// A request from `worker`: it counts in `sync` rounds again if it had fallen silent.
    async fn saw(&self, worker: usize) {
        if self.presence.heard(worker) {
            tracing::info!(worker, "a silent worker was heard again");
            if let Some(store) = self.store().cloned() {
                // The round's lock may be held by a round being applied: wait off the runtime.
                let _ = tokio::task::spawn_blocking(move || store.set_silent(worker, false)).await;
            }
        }
        self.metrics.workers.set(self.presence.heard_within(Duration::from_secs(60)) as i64);
    }

    /// Marks the workers not heard for `worker_silence_timeout` silent, until the process ends:
    /// a `sync` round then closes as soon as every worker that can still send a gradient has.
    pub fn spawn_presence_watch(self: &Arc<Self>) {
        let state = self.clone();
        let timeout = self.config.worker_silence_timeout;
        tokio::spawn(async move {
            let mut tick =
                tokio::time::interval((timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(1)));
            loop {
                tick.tick().await;
                let Some(store) = state.store().cloned() else { continue };
                let silent = state.presence.newly_silent(state.workers(), timeout);
                if silent.is_empty() {
                    continue;
                }
                // A silence may close the round, whole-model work: off the runtime's threads.
                let marking = state.clone();
                let _ =
                    tokio::task::spawn_blocking(move || marking.mark_silent(&store, silent, timeout)).await;
                state.metrics.workers.set(state.presence.heard_within(Duration::from_secs(60)) as i64);
            }
        });
    }

    /// The workers just found silent: `sync` rounds stop waiting for them.
    fn mark_silent(&self, store: &Store, silent: Vec<usize>, timeout: Duration) {
        for worker in silent {
            tracing::info!(worker, silent_for = ?timeout, "nothing heard from a worker: rounds stop waiting for it");
            self.forget_worker(worker);
            if let Some(o) = store.set_silent(worker, true) {
                tracing::warn!(
                    version = o.version,
                    worker,
                    "sync round closed without a silent worker's gradient"
                );
                self.count_round_closed(o.version);
            }
            // Heard in the meantime: `saw` may have cleared the store's mark before it was set.
            if !self.presence.is_silent(worker) {
                store.set_silent(worker, false);
            }
        }
    }

    /// Writes a checkpoint now, if a directory is configured and a model registered.
    pub async fn checkpoint(self: &Arc<Self>) -> Result<Option<PathBuf>, CheckpointError> {
        let (Some(store), Some(_)) = (self.store().cloned(), &self.checkpoints) else {
            return Ok(None);
        };
        let _guard = self.checkpoint_lock.lock().await;
        let state = self.clone();
        let path = tokio::task::spawn_blocking(move || {
            let data = store.checkpoint();
            state.write_checkpoint(&store, &data)
        })
        .await
        .expect("checkpoint task panicked")?;
        Ok(Some(path))
    }

    /// A push the server refused before the store saw it (another process's model, a model
    /// lost, re-seeding), into the journal as the store's own refusals go.
    pub(crate) fn journal_refusal(&self, store: &Store, p: &Push, reason: &str) {
        if let Some(journal) = &self.journal {
            let (worker, generation, seq, computed_on) = (p.worker, p.generation, p.seq, p.version);
            let at_version = store.version();
            journal.record(
                Entry::Refused { worker, generation, seq, computed_on, at_version, reason: reason.into() },
                None,
            );
        }
    }

    fn write_checkpoint(&self, store: &Store, data: &CheckpointData) -> Result<PathBuf, CheckpointError> {
        let dir = self.checkpoints.as_ref().expect("caller checked");
        let started = Instant::now();
        // The journal holds every update the checkpoint does before the checkpoint exists. One it
        // cannot write (its writer logged why, and marks the gap) never holds the checkpoint up.
        if let Some(journal) = &self.journal
            && let Err(error) = journal.sync()
        {
            tracing::warn!(%error, "the journal is behind this checkpoint");
        }
        let path = dir.write(store.layout(), store.hyper(), data)?;
        *self.last_checkpoint.lock() = Instant::now();
        let seconds = started.elapsed().as_secs_f64();
        tracing::info!(path = %path.display(), version = data.version, seconds, "checkpoint written");
        Ok(path)
    }

    /// The buffers an earlier process of this job kept next to its checkpoints (none when it
    /// kept none, or when they do not fit the restored model: logged).
    fn restored_buffers(&self, layout: &Layout) -> Buffers {
        let Some(dir) = &self.checkpoints else { return Buffers::default() };
        let path = dir.path().join(BUFFERS_FILE);
        let read = match std::fs::read(&path) {
            Ok(bytes) => Buffers::decode(&bytes, layout).map_err(|e| e.to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Buffers::default(),
            Err(e) => Err(e.to_string()),
        };
        read.unwrap_or_else(|error| {
            tracing::error!(path = %path.display(), %error, "the kept buffers cannot be read: the final model will lack them unless a worker leaves again");
            Buffers::default()
        })
    }

    /// Keeps a leaving worker's buffers for the final model (in the checkpoint directory too;
    /// a failure to write there is logged, the buffers stay in memory).
    pub fn keep_buffers(&self, worker: usize, buffers: Buffers) {
        if let Some(dir) = &self.checkpoints {
            let path = dir.path().join(BUFFERS_FILE);
            let body = buffers.encode();
            if let Err(error) = checkpoint::write_atomic(&path, |f| std::io::Write::write_all(f, &body)) {
                tracing::error!(%error, "could not keep the buffers next to the checkpoints");
            }
        }
        tracing::info!(
            worker,
            tensors = buffers.names().count(),
            bytes = buffers.bytes(),
            "kept the leaving worker's buffers for the final model"
        );
        *self.buffers.lock() = buffers;
    }

    /// The lock a leave holds from leaving to keeping its buffers.
    pub async fn leaving(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.leaving.lock().await
    }

    /// Finalizes: the model becomes read-only, a last checkpoint and the final model are written.
    /// Shard 0 of a sharded PS finalizes the other shards first and writes the whole model,
    /// merged from every shard's slice, at the lowest of their versions. Done once: later calls
    /// (and calls racing the first) get the first one's answer; a failed try is tried again.
    pub async fn finalize(self: &Arc<Self>) -> Result<FinalModel, ApiError> {
        self.final_model.get_or_try_init(|| self.write_final_model()).await.cloned()
    }

    async fn write_final_model(self: &Arc<Self>) -> Result<FinalModel, ApiError> {
        let store = self.store().cloned().ok_or_else(ApiError::not_registered)?;
        let _guard = self.checkpoint_lock.lock().await;
        let peers = peers::finalize(&self.config).await?;
        let state = self.clone();
        tokio::task::spawn_blocking(move || {
            // A PS that restored a finalized job wrote the file there itself: only a first
            // finalize finds another run's model in its place.
            let first = !store.is_finalized();
            let data = store.finalize();
            if state.checkpoints.is_some() {
                state.write_checkpoint(&store, &data).map_err(internal)?;
            }
            let dir = state.config.output_dir.as_ref().or(state.config.checkpoint_dir.as_ref());
            let Some(dir) = dir else {
                return Ok(FinalModel { version: data.version, path: None, earlier: None });
            };
            std::fs::create_dir_all(dir).map_err(internal)?;
            let path = dir.join(checkpoint::FINAL_MODEL_FILE);
            let earlier = if first { checkpoint::keep_earlier_final_model(dir).map_err(internal)? } else { None };
            if let Some(kept) = &earlier {
                tracing::warn!(kept = %kept.display(), "an earlier run's final model was in the output directory: kept under that name");
            }
            let (layout, model) = if peers.is_empty() {
                (store.layout().clone(), CheckpointData { state: Default::default(), ..data })
            } else {
                let version = peers.iter().map(|p| p.version).fold(data.version, u64::min);
                let mut slices = vec![(store.layout().clone(), data.params)];
                slices.extend(peers.into_iter().map(|p| (p.layout, p.values)));
                let (layout, params) = shards::merge(&slices).map_err(internal)?;
                (layout, CheckpointData { version, params, state: Default::default(), ..data })
            };
            let buffers = state.buffers.lock().clone();
            let buffers = match buffers.check(&layout) {
                Ok(()) => buffers,
                Err(error) => {
                    tracing::error!(%error, "the last worker's buffers do not fit the whole model: the final model is written without them");
                    Buffers::default()
                }
            };
            checkpoint::write_atomic(&path, |f| {
                checkpoint::encode_with_buffers(f, &layout, store.hyper(), &model, &buffers)
            })
            .map_err(internal)?;
            tracing::info!(path = %path.display(), version = model.version, shards = 1 + state.config.peers.len(), "final model written");
            let earlier = earlier.map(|p| p.display().to_string());
            Ok(FinalModel { version: model.version, path: Some(path.display().to_string()), earlier })
        })
        .await
        .expect("finalize task panicked")
    }

    /// Runs periodic checkpoints until the process ends.
    pub fn spawn_checkpointer(self: &Arc<Self>) {
        let Some(every) = self.config.checkpoint_interval.filter(|_| self.checkpoints.is_some()) else {
            return;
        };
        let state = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.tick().await;
            let mut written = None;
            loop {
                tick.tick().await;
                let version = state.store().map(|s| s.version());
                if version.is_none() || version == written || state.store().is_some_and(|s| s.is_finalized())
                {
                    continue;
                }
                match state.checkpoint().await {
                    Ok(_) => written = version,
                    Err(e) => tracing::error!(error = %e, "periodic checkpoint failed"),
                }
            }
        });
    }
}

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(axum::http::StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
}
