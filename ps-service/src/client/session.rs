//! The worker's conversation with the parameter server, and how it survives either side
//! restarting:
//!
//! - a new process of worker m *joins*: it gets a generation for its pushes (the old process's
//!   late pushes are refused, the new one's seqs start afresh) and the step to resume from;
//! - a PS that lost its model (restarted without a checkpoint) answers `not_registered`: the
//!   worker offers its own copy, the last model it pulled, and joins again with its own step;
//! - a PS restored from an older checkpoint does not know this generation (`rejoin_required`):
//!   the worker joins again;
//! - a gradient the PS refuses for being stale is dropped and the model pulled again.
//!
//! A model sharded over N PS processes ([`ShardMap`]) is N such conversations side by side, one
//! [`Link`] per shard, each over its own HTTP/2 connection: a pull is N pulls, a step's push is
//! N pushes of the same step (seq), and each shard keeps its own versions, generations and
//! backups, so a shard that restarts is re-seeded or rejoined alone.
//!
//! Transient failures (PS unreachable, 5xx, `in_flight`, `busy`) are retried with backoff
//! until the PS has been unreachable for `deadline`.

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use rand::{Rng, SeedableRng};
use tokio::runtime::Handle;

use super::link::Link;
use super::{ClientError, GradDtype, Joined, PsClient, PullDtype, PushReply};
use crate::pace::PaceReport;
use crate::wire::Layout;
use crate::wire::final_model::FinalModel;
use crate::wire::protocol::Report;
use crate::wire::shards::ShardMap;

/// What became of a pushed gradient.
#[derive(Debug)]
pub enum Pushed {
    /// Applied to the model.
    Applied(PushReply),
    /// (`sync`) In the round for `version`, which has not closed yet.
    InRound { version: u64 },
    /// Refused for being stale or for a model this worker no longer has (the reason): pull
    /// and go on.
    Dropped(String),
    /// The job is over: the model is read-only.
    Finalized,
}

impl Pushed {
    /// One step's outcome from its shards' (in shard order): the job's end first, then a round
    /// still open (wait for it), then a drop (pull again); applied when every shard applied it.
    fn combine(all: Vec<Pushed>) -> Pushed {
        let mut rounds = all.iter().filter_map(|p| match p {
            Pushed::InRound { version } => Some(*version),
            _ => None,
        });
        if all.iter().any(|p| matches!(p, Pushed::Finalized)) {
            return Pushed::Finalized;
        }
        if let Some(first) = rounds.next() {
            return Pushed::InRound { version: rounds.fold(first, u64::min) };
        }
        let mut replies = Vec::with_capacity(all.len());
        for p in all {
            match p {
                Pushed::Applied(r) => replies.push(r),
                dropped => return dropped,
            }
        }
        let mut reply = replies.swap_remove(0);
        for r in replies {
            reply.version = reply.version.min(r.version);
            reply.staleness = reply.staleness.max(r.staleness);
            reply.replayed &= r.replayed;
        }
        Pushed::Applied(reply)
    }
}

/// A pull of the whole model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pulled {
    /// The lowest of the shards' versions.
    pub version: u64,
    /// The longest any shard held it waiting for a `sync` round.
    pub held: Duration,
}

pub struct Session {
    /// Blocks on the links' futures: the caller's thread is not a runtime thread.
    rt: Handle,
    layout: Layout,
    map: ShardMap,
    links: Vec<Link>,
    /// How often the PS wants to hear from a worker between exchanges, and when it last did.
    heartbeat: Option<(Duration, Instant)>,
}

impl Session {
    /// Registers `init` (when this worker is first) with every shard, joins them, and returns
    /// where to resume. `clients` are the shards', in shard order (one for an unsharded PS).
    pub fn start(
        clients: Vec<PsClient>,
        rt: Handle,
        worker: usize,
        layout: Layout,
        init: &[f32],
        retry: Retry,
    ) -> Result<(Self, Joined), ClientError> {
        Self::start_lent(clients, rt, worker, layout, init, None, retry)
    }

    /// [`Self::start`] with `init`'s bytes lent by the caller ([`super::LentFloats`]): the
    /// registration sends them as they are after the header, with no model-sized body of its own
    /// (every joining worker sends the model; the first one's is taken).
    pub fn start_lent(
        clients: Vec<PsClient>,
        rt: Handle,
        worker: usize,
        layout: Layout,
        init: &[f32],
        lent: Option<&bytes::Bytes>,
        retry: Retry,
    ) -> Result<(Self, Joined), ClientError> {
        let n = clients.len();
        let map = ShardMap::new(&layout, n).map_err(|e| {
            ClientError::Config(format!("sharding the model over {n} parameter servers: {e}"))
        })?;
        let links = clients
            .into_iter()
            .enumerate()
            .map(|(i, c)| Link::new(c, retry.for_shard(i), worker, map.layout(i).clone()))
            .collect();
        let mut s = Self { rt, layout, map, links, heartbeat: None };
        let map = &s.map;
        let registered = s.rt.block_on(join_all(s.links.iter_mut().enumerate().map(|(i, l)| {
            let r = map.range(i);
            l.register(&init[r.clone()], lent.map(|b| b.slice(4 * r.start..4 * r.end)))
        })));
        let registered = registered.into_iter().collect::<Result<Vec<_>, _>>()?;
        let joined = s.join()?;
        s.groups_match_some_tensor()?;
        tracing::info!(
            worker,
            registered = registered.iter().any(|&r| r),
            shards = s.links.len(),
            generation = joined.generation,
            resume_step = joined.resume_step,
            parameters = s.layout.len(),
            "joined the job"
        );
        Ok((s, joined))
    }

    /// On a sharded PS, refuses a job one of whose `optimizer.parameterGroups` matches no
    /// tensor of the model: each shard sees only its slice, so none can tell (an unsharded PS
    /// refuses such a registration itself), while this worker holds the whole layout and adds
    /// up what the group took on every shard (`/v1/status`). A mistyped pattern would otherwise
    /// leave every tensor at the job's rates, silently.
    fn groups_match_some_tensor(&mut self) -> Result<(), ClientError> {
        if self.links.len() < 2 {
            return Ok(());
        }
        let statuses = self.rt.block_on(join_all(self.links.iter_mut().map(Link::status)));
        let statuses = statuses.into_iter().collect::<Result<Vec<_>, _>>()?;
        let no_groups = Vec::new();
        let groups = statuses[0]["parameter_groups"].as_array().unwrap_or(&no_groups);
        for (i, group) in groups.iter().enumerate() {
            let taken: u64 =
                statuses.iter().map(|s| s["parameter_groups"][i]["parameters"].as_u64().unwrap_or(0)).sum();
            if taken == 0 {
                let names: Vec<&str> =
                    self.layout.tensors().iter().take(8).map(|t| t.name.as_str()).collect();
                return Err(ClientError::Config(format!(
                    "parameter group {i} (names {}) matches no tensor of the model on any of the {} parameter \
                     servers: the job's optimizer.parameterGroups and the model disagree (its tensors begin {})",
                    group["names"],
                    self.links.len(),
                    names.join(", ")
                )));
            }
        }
        Ok(())
    }

    /// Joins every shard. Shards that disagree on this worker's position (one restored from an
    /// older checkpoint) are joined again at the furthest: the steps one shard lost are lost
    /// to that slice alone, as with an unsharded PS restored from a checkpoint.
    fn join(&mut self) -> Result<Joined, ClientError> {
        let all = self.rt.block_on(join_all(self.links.iter_mut().map(|l| l.join(None))));
        let all = all.into_iter().collect::<Result<Vec<_>, _>>()?;
        let resume_step = all.iter().map(|j| j.resume_step).max().unwrap_or(0);
        let behind = self.links.iter_mut().zip(&all).filter(|(_, j)| j.resume_step < resume_step);
        let again = self.rt.block_on(join_all(behind.map(|(l, _)| l.join(Some(resume_step)))));
        again.into_iter().collect::<Result<Vec<_>, _>>()?;
        let heartbeat_ms = all.iter().filter_map(|j| j.heartbeat_ms).min();
        self.heartbeat = heartbeat_ms.map(|ms| (Duration::from_millis(ms), Instant::now()));
        Ok(Joined {
            generation: self.links[0].generation(),
            resume_step,
            version: all.iter().map(|j| j.version).min().unwrap_or(0),
            workers: all.iter().map(|j| j.workers).max().unwrap_or(0),
            heartbeat_ms,
            algorithm: all.first().and_then(|j| j.algorithm),
        })
    }

    /// Between exchanges (a local step), tells every shard this worker is alive once the
    /// interval the PS asked for has passed, in the background: a block of local steps longer
    /// than the PS's silence timeout no longer marks a training worker silent (every shard hears
    /// it, not only the first, which reports reach). Sent from the training loop, so a worker
    /// whose loop is stuck stays silent.
    pub fn heartbeat_if_due(&mut self) {
        let Some((every, last)) = &mut self.heartbeat else { return };
        if last.elapsed() < *every {
            return;
        }
        *last = Instant::now();
        for link in &self.links {
            link.heartbeat(&self.rt);
        }
    }

    /// The layout of this worker's model.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// From now on this worker overlaps its exchange with its next step: each gradient is
    /// computed on the model it loaded last ([`Self::loaded`]), pulled one exchange before the
    /// one it pulls meanwhile; its pulls tell every shard so.
    pub fn overlap(&mut self) {
        for l in &mut self.links {
            l.overlap();
        }
    }

    /// An overlapping worker loaded the model it pulled last: its next gradient is computed on it.
    pub fn loaded(&mut self) {
        for l in &mut self.links {
            l.loaded();
        }
    }

    /// Pulls the model from every shard in `dtype` from now on.
    pub fn pull_as(&mut self, dtype: PullDtype) {
        for l in &mut self.links {
            l.pull_as(dtype);
        }
    }

    /// Pulls the model from every shard into `out` (the layout's length). After a `sync` push
    /// (`after_round`), waits up to `wait` for the rounds to close and answers `None` (keeping
    /// nothing) when one has not.
    ///
    /// Each shard's slice is read straight into `out` (the caller's buffer: the Python package's
    /// flat model), then copied into the link's kept slice (a shard that loses its model is
    /// offered it): one model-sized buffer of the client's own, not one more to read into. `out`
    /// holds the model only when this answers `Some`.
    pub fn pull_into(
        &mut self,
        step: u64,
        after_round: bool,
        wait: Duration,
        out: &mut [f32],
    ) -> Result<Option<Pulled>, ClientError> {
        assert_eq!(out.len(), self.layout.len(), "a buffer of the model's length");
        let slices = self.map.split_mut(out);
        let pulls = self.links.iter_mut().zip(slices).map(|(l, s)| async move {
            let head = l.pull(step, after_round, wait, s).await?;
            Ok::<_, ClientError>(head.map(|h| (h, s)))
        });
        let all = self.rt.block_on(join_all(pulls));
        let Some(pulled) = all.into_iter().collect::<Result<Option<Vec<_>>, _>>()? else {
            return Ok(None);
        };
        let version = pulled.iter().map(|(h, _)| h.version).min().unwrap_or(0);
        let held = pulled.iter().map(|(h, _)| h.held).max().unwrap_or_default();
        for (l, (h, s)) in self.links.iter_mut().zip(pulled) {
            l.keep(&h, s);
        }
        Ok(Some(Pulled { version, held }))
    }

    /// Pushes the gradient of `step` to every shard, each slice computed on the slice last
    /// pulled from it, with the worker's `pace`; `Pushed::combine` says what the step came to.
    /// `lent`, when the caller lends it ([`super::LentFloats`]), is `grad`'s bytes, which a
    /// float32 push sends as they are.
    pub fn push(
        &mut self,
        step: u64,
        epoch: Option<f64>,
        grad: &[f32],
        lent: Option<&bytes::Bytes>,
        dtype: GradDtype,
        pace: Option<PaceReport>,
    ) -> Result<Pushed, ClientError> {
        let map = &self.map;
        if let Some(b) = lent {
            assert_eq!(b.len(), 4 * grad.len(), "the lent bytes are the gradient's");
        }
        let all = self.rt.block_on(join_all(self.links.iter_mut().enumerate().map(|(i, l)| {
            let r = map.range(i);
            let slice = lent.map(|b| b.slice(4 * r.start..4 * r.end));
            l.push(step, epoch, &grad[r], slice, dtype, pace)
        })));
        Ok(Pushed::combine(all.into_iter().collect::<Result<_, _>>()?))
    }

    /// Failed calls retried so far, over every shard: an exchange during which this grew timed
    /// the failure (a PS restarting, a refused connection), not the link.
    pub fn retries(&self) -> u64 {
        self.links.iter().map(Link::retries).sum()
    }

    /// The local steps the PS advised in its last answer to a push (`optimizer.adaptiveLocalSteps`;
    /// the first shard's: every shard chooses from the same reports).
    pub fn advised_local_steps(&self) -> Option<u64> {
        self.links[0].advised()
    }

    /// Tells every shard this worker trained all its steps (its `sync` rounds stop waiting for
    /// it). When it was the job's last, the first shard answers with the whole model's final
    /// file (the others' answers name only their slices). `buffers` (the model's untrained
    /// `state_dict` entries) go to the first shard, which writes the final model.
    pub fn leave(&mut self, buffers: Option<bytes::Bytes>) -> Result<Option<FinalModel>, ClientError> {
        let mut buffers = buffers;
        let leaves = self.links.iter_mut().map(|link| link.leave(buffers.take()));
        let all = self.rt.block_on(join_all(leaves));
        let mut answers = all.into_iter().collect::<Result<Vec<_>, _>>()?;
        Ok(answers.swap_remove(0))
    }

    /// Reports progress to the first shard, whose status the operator and `foresight run` read.
    pub fn report(&mut self, report: &Report) -> Result<(), ClientError> {
        self.rt.block_on(self.links[0].report(report))
    }

    /// [`Self::report`] tried once and given up after `within`: a report is telemetry, and a
    /// training step must not wait out the retry deadline for one.
    pub fn report_once(&mut self, report: &Report, within: Duration) -> Result<(), ClientError> {
        let sent = self.links[0].report_once(report);
        match self.rt.block_on(async move { tokio::time::timeout(within, sent).await }) {
            Ok(answer) => answer,
            Err(_) => Err(ClientError::TimedOut { what: "a progress report", seconds: within.as_secs_f64() }),
        }
    }
}

/// Retries failures that may pass (`retryable`: transient ones, by default) with exponential
/// backoff and jitter until `deadline` has passed since the first failure of the call.
pub struct Retry {
    deadline: Duration,
    seed: u64,
    rng: rand::rngs::StdRng,
    /// Failed attempts retried so far.
    retried: u64,
}

impl Retry {
    pub fn new(deadline: Duration, seed: u64) -> Self {
        Self { deadline, seed, rng: rand::rngs::StdRng::seed_from_u64(seed), retried: 0 }
    }

    /// Failed attempts this policy retried.
    pub(super) fn retried(&self) -> u64 {
        self.retried
    }

    /// The same policy for shard `i`'s link, with jitter of its own.
    fn for_shard(&self, i: usize) -> Self {
        Self::new(self.deadline, self.seed.wrapping_add(i as u64))
    }

    pub async fn run<T, F, Fut>(
        &mut self,
        client: &PsClient,
        what: &str,
        retryable: impl Fn(&ClientError) -> bool,
        mut f: F,
    ) -> Result<T, ClientError>
    where
        F: FnMut(PsClient) -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        let started = Instant::now();
        let mut backoff = Duration::from_millis(100);
        loop {
            match f(client.clone()).await {
                Ok(v) => return Ok(v),
                Err(e) if retryable(&e) && started.elapsed() < self.deadline => {
                    // Not sooner than the PS asked (an overloaded PS's `Retry-After`).
                    let jittered = backoff.mul_f64(self.rng.random_range(0.5..1.5));
                    let wait = e.retry_after().map_or(jittered, |asked| jittered.max(asked));
                    tracing::warn!(error = %e, retry_in_ms = wait.as_millis() as u64, "{what} failed; retrying");
                    self.retried += 1;
                    tokio::time::sleep(wait).await;
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
