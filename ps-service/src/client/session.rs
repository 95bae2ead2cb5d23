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
//! Transient failures (PS unreachable, 5xx, `in_flight`, `seeding`) are retried with backoff
//! until the PS has been unreachable for `deadline`.

use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use tokio::runtime::Handle;

use super::{ClientError, GradDtype, Joined, Model, PsClient, PushId, PushReply};
use crate::server::Report;
use crate::wire::Layout;

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

/// Refusals after which a gradient is dropped and the model pulled again.
const DROPPED: [&str; 4] = ["pull_required", "too_stale", "round_closed", "future_version"];

pub struct Session {
    client: PsClient,
    /// Blocks on the client's futures: the caller's thread is not a runtime thread.
    rt: Handle,
    retry: Retry,
    worker: usize,
    layout: Layout,
    generation: u64,
    /// The last model pulled: what this worker offers a PS that lost its model.
    copy: Option<Model>,
}

impl Session {
    /// Registers `init` (when this worker is first), joins, and returns where to resume.
    pub fn start(
        client: PsClient,
        rt: Handle,
        worker: usize,
        layout: Layout,
        init: &[f32],
        retry: Retry,
    ) -> Result<(Self, Joined), ClientError> {
        let mut s = Self { client, rt, retry, worker, layout: layout.clone(), generation: 0, copy: None };
        let registered = s.retry("registering the model", |c| {
            let l = layout.clone();
            async move { c.register(&l, init).await }
        })?;
        let joined = s.join(None)?;
        tracing::info!(
            worker,
            registered,
            generation = joined.generation,
            resume_step = joined.resume_step,
            parameters = s.layout.len(),
            "joined the job"
        );
        Ok((s, joined))
    }

    /// The layout of this worker's model.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    fn join(&mut self, step: Option<u64>) -> Result<Joined, ClientError> {
        let worker = self.worker;
        // `unknown_worker` at join: the job was scaled up and the Job started this pod before
        // the operator told the PS the new count; it is told within seconds.
        let scaling = |e: &ClientError| e.is_transient() || e.reason() == Some("unknown_worker");
        let joined = self
            .retry
            .run(&self.rt, &self.client, "joining", scaling, |c| async move { c.join(worker, step).await })?;
        self.generation = joined.generation;
        Ok(joined)
    }

    /// The PS lost its model: offer this worker's copy (the freshest offered wins) and join
    /// again, keeping this worker's own position.
    fn reseed(&mut self, step: u64) -> Result<(), ClientError> {
        let worker = self.worker;
        match self.copy.clone() {
            Some(copy) => {
                let layout = self.layout.clone();
                let taken = self.retry("offering this worker's copy of the model", |c| {
                    let (l, v) = (layout.clone(), copy.values.clone());
                    async move { c.offer(worker, copy.version, &l, &v).await }
                })?;
                tracing::warn!(
                    worker,
                    version = copy.version,
                    taken,
                    "the parameter server had lost the model; offered this worker's copy"
                );
            }
            None => tracing::warn!(
                worker,
                "the parameter server had lost the model; this worker holds no copy yet"
            ),
        }
        self.join(Some(step))?;
        Ok(())
    }

    /// Pulls the model; with `min_version` (a `sync` round), waits up to `wait` for it and
    /// answers `None` when it has not come.
    pub fn pull(
        &mut self,
        step: u64,
        min_version: Option<u64>,
        wait: Duration,
    ) -> Result<Option<Model>, ClientError> {
        let worker = self.worker;
        loop {
            let pulled =
                self.retry("pulling the model", |c| async move { c.pull(worker, min_version, wait).await });
            match pulled {
                Ok(Some(m)) => {
                    self.copy = Some(m.clone());
                    return Ok(Some(m));
                }
                Ok(None) => return Ok(None),
                Err(e) if e.reason() == Some("not_registered") => self.reseed(step)?,
                Err(e) => return Err(e),
            }
        }
    }

    /// Pushes the gradient of `step`, computed on `version`.
    pub fn push(
        &mut self,
        version: u64,
        step: u64,
        epoch: Option<f64>,
        grad: &[f32],
        dtype: GradDtype,
    ) -> Result<Pushed, ClientError> {
        let id = PushId { worker: self.worker, generation: Some(self.generation), version, seq: step };
        let layout = self.layout.clone();
        let sent = self.retry("pushing a gradient", |c| {
            let l = layout.clone();
            async move { c.push(id, epoch, &l, grad, dtype).await }
        });
        match sent {
            Ok(reply) if reply.applied => Ok(Pushed::Applied(reply)),
            Ok(reply) => Ok(Pushed::InRound { version: reply.version }),
            Err(e) => match e.reason() {
                Some(r) if DROPPED.contains(&r) => Ok(Pushed::Dropped(r.to_string())),
                // A round of this version holds this worker's gradient already (a retry of a
                // push whose answer was lost, after a restart of this process).
                Some("already_contributed") => Ok(Pushed::InRound { version }),
                Some("finalized") => Ok(Pushed::Finalized),
                Some("not_registered") => {
                    self.reseed(step)?;
                    Ok(Pushed::Dropped("not_registered".into()))
                }
                Some(r @ ("rejoin_required" | "stale_seq")) => {
                    let r = r.to_string();
                    self.join(Some(step))?;
                    Ok(Pushed::Dropped(r))
                }
                _ => Err(e),
            },
        }
    }

    pub fn report(&mut self, report: &Report) -> Result<(), ClientError> {
        self.retry("reporting", |c| {
            let r = report.clone();
            async move { c.report(&r).await }
        })
    }

    fn retry<T, F, Fut>(&mut self, what: &str, f: F) -> Result<T, ClientError>
    where
        F: FnMut(PsClient) -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        self.retry.run(&self.rt, &self.client, what, ClientError::is_transient, f)
    }
}

/// Retries failures that may pass (`retryable`: transient ones, by default) with exponential
/// backoff and jitter until `deadline` has passed since the first failure of the call.
pub struct Retry {
    deadline: Duration,
    rng: rand::rngs::StdRng,
}

impl Retry {
    pub fn new(deadline: Duration, seed: u64) -> Self {
        Self { deadline, rng: rand::rngs::StdRng::seed_from_u64(seed) }
    }

    fn run<T, F, Fut>(
        &mut self,
        rt: &Handle,
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
            match rt.block_on(f(client.clone())) {
                Ok(v) => return Ok(v),
                Err(e) if retryable(&e) && started.elapsed() < self.deadline => {
                    // Not sooner than the PS asked (an overloaded PS's `Retry-After`).
                    let jittered = backoff.mul_f64(self.rng.random_range(0.5..1.5));
                    let wait = e.retry_after().map_or(jittered, |asked| jittered.max(asked));
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
