//! One parameter-server shard's side of a worker's session: its connection, this process's
//! generation there, and the slice of the model last pulled from it. Every shard is an ordinary
//! PS for its slice, so this is the whole single-PS protocol (join, re-seed, rejoin, drop);
//! [`super::Session`] runs one link per shard side by side.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::session::{Pushed, Retry};
use super::{
    Base, ClientError, ExpectedModel, GradDtype, Joined, Model, PsClient, PullDtype, PullHead, PushId,
    Upload, encode_gradient_into,
};
use crate::pace::PaceReport;
use crate::pool::{Pool, lend};
use crate::wire::final_model::FinalModel;
use crate::wire::protocol::{Report, reason};
use crate::wire::{self, Layout, WireDtype};

/// Refusals after which a gradient is dropped and the model pulled again.
const DROPPED: [&str; 4] =
    [reason::PULL_REQUIRED, reason::TOO_STALE, reason::ROUND_CLOSED, reason::FUTURE_VERSION];

pub(super) struct Link {
    client: PsClient,
    retry: Retry,
    worker: usize,
    /// This shard's slice of the model.
    slice: ExpectedModel,
    generation: u64,
    /// The last slice pulled and kept: what this worker offers a shard that lost its model,
    /// and the base of an int8 pull. Pulls are read into the caller's buffer, and copied here
    /// once they are whole, so that a pull cut short never spoils it.
    copy: Option<Model>,
    /// The `sync` round this worker's last gradient is in, until a pull after it.
    round: Option<u64>,
    /// The slice the next gradient is computed on, as (version, PS process): the one kept last,
    /// or for a worker that overlaps its exchange with its next step, the one it loaded last
    /// ([`Self::loaded`]), pulled one exchange before.
    computed_on: Option<(u64, Option<u64>)>,
    /// Int8 pushes: what rounding left out, carried into the next push.
    feedback: ErrorFeedback,
    /// The local steps the shard advised in its last answer to a push (adaptive local steps).
    advised: Option<u64>,
    /// F32 and BF16 push bodies, back here once sent: the next push is encoded into the last.
    bodies: Arc<Pool<u8>>,
}

/// Error feedback for int8 pushes (Seide et al. 2014; Karimireddy et al. 2019): each push sends
/// its gradient plus what the rounding of the pushes the PS took left out, so that over many
/// pushes the model receives the gradients' sum, not their rounded sum.
#[derive(Default)]
pub struct ErrorFeedback {
    /// Left out of the pushes taken so far.
    residual: Vec<f32>,
    /// Left out of the last body encoded, carried over once the PS takes it.
    pending: Vec<f32>,
    /// The step and body encoded last: a push of the same step again (a `sync` worker's
    /// re-push of its round) sends the same bytes and carries nothing twice.
    last: Option<(u64, bytes::Bytes)>,
    /// Bodies once sent, for the next step's to be encoded into.
    bodies: Arc<Pool<u8>>,
}

impl ErrorFeedback {
    /// The int8 body of `step`'s gradient plus what earlier pushes left out.
    pub fn encode(&mut self, layout: &Layout, step: u64, grad: &[f32]) -> bytes::Bytes {
        if let Some((s, body)) = &self.last
            && *s == step
        {
            return body.clone();
        }
        self.residual.resize(grad.len(), 0.0);
        self.pending.clear();
        self.pending.extend(grad.iter().zip(&self.residual).map(|(g, r)| g + r));
        // The last step's body back in the pool first (once the request has let go of it).
        self.last = None;
        let out = self.bodies.take_as_is();
        let body = lend(&self.bodies, wire::int8::encode_into(layout, &mut self.pending, out));
        self.last = Some((step, body.clone()));
        body
    }

    /// The PS took the body of `step`: what its rounding left out goes into the next push.
    /// (A dropped push applied nothing; its leftover is dropped with it.)
    pub fn taken(&mut self, step: u64) {
        if self.last.as_ref().is_some_and(|(s, _)| *s == step) && !self.pending.is_empty() {
            std::mem::swap(&mut self.residual, &mut self.pending);
            self.pending.clear();
        }
    }
}

impl Link {
    /// Failed calls this link retried.
    pub(super) fn retries(&self) -> u64 {
        self.retry.retried()
    }

    pub(super) fn new(client: PsClient, retry: Retry, worker: usize, layout: Layout) -> Self {
        Self {
            client,
            retry,
            worker,
            slice: ExpectedModel::new(layout),
            generation: 0,
            copy: None,
            round: None,
            computed_on: None,
            feedback: ErrorFeedback::default(),
            advised: None,
            bodies: Arc::default(),
        }
    }

    /// Pulls from now on in `dtype`.
    pub(super) fn pull_as(&mut self, dtype: PullDtype) {
        let slice = ExpectedModel::pulled_as(self.slice.layout.clone(), dtype);
        self.slice = if self.overlaps() { slice.overlapping() } else { slice };
    }

    /// From now on this worker overlaps its exchange with its next step: a gradient is computed
    /// on the slice it loaded last ([`Self::loaded`]), not on the one it pulled last.
    pub(super) fn overlap(&mut self) {
        self.slice = self.slice.clone().overlapping();
    }

    fn overlaps(&self) -> bool {
        self.slice.overlaps
    }

    /// An overlapping worker loaded the slice it pulled last: its next gradient is computed on
    /// that one.
    pub(super) fn loaded(&mut self) {
        self.computed_on = self.copy.as_ref().map(|c| (c.version, c.incarnation));
    }

    pub(super) fn generation(&self) -> u64 {
        self.generation
    }

    pub(super) fn advised(&self) -> Option<u64> {
        self.advised
    }

    /// Registers this worker's initial slice; false when another worker's came first.
    /// Registers this shard's slice `init` of the initial model (`lent`: its bytes, lent by the
    /// caller and sent as they are); whether this worker's was taken (the first).
    pub(super) async fn register(
        &mut self,
        init: &[f32],
        lent: Option<bytes::Bytes>,
    ) -> Result<bool, ClientError> {
        let layout = self.slice.layout.clone();
        self.retry("registering the model", |c| {
            let (l, lent) = (layout.clone(), lent.clone());
            async move {
                match lent {
                    Some(bytes) => c.register_lent(&l, bytes).await,
                    None => c.register(&l, init).await,
                }
            }
        })
        .await
    }

    pub(super) async fn join(&mut self, step: Option<u64>) -> Result<Joined, ClientError> {
        let worker = self.worker;
        // `unknown_worker` at join: the job was scaled up and the Job started this pod before
        // the operator told the PS the new count; it is told within seconds.
        let scaling = |e: &ClientError| e.is_transient() || e.reason() == Some(reason::UNKNOWN_WORKER);
        let joined = self
            .retry
            .run(&self.client, "joining", scaling, |c| async move { c.join(worker, step).await })
            .await?;
        self.generation = joined.generation;
        Ok(joined)
    }

    /// The shard lost its model: offer this worker's copy (the freshest offered wins) and join
    /// again, keeping this worker's own position.
    async fn reseed(&mut self, step: u64) -> Result<(), ClientError> {
        let worker = self.worker;
        match self.copy.clone() {
            Some(copy) => {
                let layout = self.slice.layout.clone();
                let taken = self
                    .retry("offering this worker's copy of the model", |c| {
                        let (l, v) = (layout.clone(), copy.values.clone());
                        async move { c.offer(worker, copy.version, &l, &v).await }
                    })
                    .await?;
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
        self.join(Some(step)).await?;
        Ok(())
    }

    /// Pulls the slice into `out` (its length); after a `sync` push (`after_round`), waits up to
    /// `wait` for that round to close and answers `None` when it has not. The slice is not kept
    /// until [`Self::keep`].
    pub(super) async fn pull(
        &mut self,
        step: u64,
        after_round: bool,
        wait: Duration,
        out: &mut [f32],
    ) -> Result<Option<PullHead>, ClientError> {
        let (worker, min_version) = (self.worker, self.round.filter(|_| after_round).map(|v| v + 1));
        let mut rejoined = false;
        loop {
            // The fields borrowed apart: the slice is read while the retry state changes. Each
            // try in turn takes `out` and puts it back for the next.
            let (slice, out) = (&self.slice, Cell::new(Some(&mut *out)));
            // An int8 pull is the difference from the copy kept last, when the PS still tracks it.
            let base = self.copy.as_ref().and_then(|c| c.copy.map(|tag| Base { tag, values: &c.values }));
            let pulled = self
                .retry
                .run(&self.client, "pulling the model", ClientError::is_transient, |c| {
                    let out = &out;
                    async move {
                        let buffer = out.take().expect("the buffer is put back after each try");
                        let pulled = c.pull_into(worker, min_version, wait, slice, base, buffer).await;
                        out.set(Some(buffer));
                        pulled
                    }
                })
                .await;
            match pulled {
                Ok(Some(head)) if self.went_back(&head) => {
                    // Offered once: whether taken or not, this copy is not offered again.
                    self.reseed(step).await?;
                    self.copy = None;
                }
                Ok(head) => return Ok(head),
                Err(e) if e.reason() == Some(reason::NOT_REGISTERED) => self.reseed(step).await?,
                // The shard no longer takes this process's credential (it restarted with another
                // control token): a join answers a new one, once.
                Err(e) if e.reason() == Some(reason::CREDENTIAL_REFUSED) && !rejoined => {
                    rejoined = true;
                    self.join(Some(step)).await?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Whether `pulled` comes from another PS process than this worker's copy and is older:
    /// the PS lost the model and another worker registered its initial weights before this one
    /// could offer its copy (a registered model takes a fresher copy, updates or not).
    fn went_back(&self, pulled: &PullHead) -> bool {
        self.copy.as_ref().is_some_and(|copy| {
            let other_process = copy.incarnation.is_some() && pulled.incarnation != copy.incarnation;
            other_process && pulled.version < copy.version
        })
    }

    /// Keeps a pulled slice, `values`: the next gradient is computed on it. It is copied into
    /// the copy kept before, whose buffer it reuses.
    pub(super) fn keep(&mut self, head: &PullHead, values: &[f32]) {
        self.round = None;
        if !self.overlaps() {
            self.computed_on = Some((head.version, head.incarnation));
        }
        let (version, incarnation, held, copy) = (head.version, head.incarnation, head.held, head.copy);
        match &mut self.copy {
            Some(kept) if kept.values.len() == values.len() => {
                kept.values.copy_from_slice(values);
                (kept.version, kept.incarnation, kept.held, kept.copy) = (version, incarnation, held, copy);
            }
            _ => {
                let (layout, values) = (self.slice.layout.clone(), values.to_vec());
                self.copy = Some(Model { version, incarnation, layout, values, held, copy });
            }
        }
    }

    /// Pushes this shard's slice of the gradient of `step`, computed on the slice kept last.
    /// `lent`, when the caller lends it, is `grad`'s bytes: a float32 push sends them as they
    /// are, after the header, instead of a copy.
    pub(super) async fn push(
        &mut self,
        step: u64,
        epoch: Option<f64>,
        grad: &[f32],
        lent: Option<bytes::Bytes>,
        dtype: GradDtype,
        pace: Option<PaceReport>,
    ) -> Result<Pushed, ClientError> {
        let (version, incarnation) = self.computed_on.ok_or(ClientError::NotPulled)?;
        let id = PushId {
            worker: self.worker,
            generation: Some(self.generation),
            version,
            incarnation,
            seq: step,
        };
        // Encoded once: every retry sends the same bytes.
        let body: Upload = match (dtype, lent) {
            (GradDtype::F32, Some(data)) => {
                let head = wire::header(&self.slice.layout, WireDtype::F32, &BTreeMap::new());
                Upload::Lent { head: head.into(), data }
            }
            (GradDtype::Int8, _) => self.feedback.encode(&self.slice.layout, step, grad).into(),
            (d, _) => lend(
                &self.bodies,
                encode_gradient_into(&self.slice.layout, grad, d, self.bodies.take_as_is()),
            )
            .into(),
        };
        let sent = self
            .retry("pushing a gradient", |c| {
                let b = body.clone();
                async move { c.push_paced(id, epoch, pace, b).await }
            })
            .await;
        if let Ok(reply) = &sent {
            self.advised = reply.local_steps;
        }
        let pushed = match sent {
            Ok(reply) if reply.applied => Pushed::Applied(reply),
            Ok(reply) => Pushed::InRound { version: reply.version },
            Err(e) => match e.reason() {
                Some(r) if DROPPED.contains(&r) => Pushed::Dropped(r.to_string()),
                // A round of this version holds this worker's gradient already (a retry of a
                // push whose answer was lost, after a restart of this process).
                Some(reason::ALREADY_CONTRIBUTED) => Pushed::InRound { version },
                Some(reason::FINALIZED) => Pushed::Finalized,
                Some(reason::NOT_REGISTERED) => {
                    self.reseed(step).await?;
                    Pushed::Dropped(reason::NOT_REGISTERED.into())
                }
                // `credential_refused`: as in a pull.
                Some(r @ (reason::REJOIN_REQUIRED | reason::STALE_SEQ | reason::CREDENTIAL_REFUSED)) => {
                    let r = r.to_string();
                    self.join(Some(step)).await?;
                    Pushed::Dropped(r)
                }
                _ => return Err(e),
            },
        };
        if let Pushed::InRound { version } = pushed {
            self.round = Some(version);
        }
        if let Pushed::Applied(_) | Pushed::InRound { .. } = pushed {
            self.feedback.taken(step);
        }
        Ok(pushed)
    }

    /// Tells the shard this worker trained all its steps, with the model's buffers for the final
    /// model; the final model when it was the last.
    pub(super) async fn leave(
        &mut self,
        buffers: Option<bytes::Bytes>,
    ) -> Result<Option<FinalModel>, ClientError> {
        let (worker, generation) = (self.worker, self.generation);
        self.retry("leaving", |c| {
            let buffers = buffers.clone();
            async move { c.leave(worker, generation, buffers).await }
        })
        .await
    }

    /// One heartbeat, sent in the background: a lost one is made up for by the next.
    pub(super) fn heartbeat(&self, rt: &tokio::runtime::Handle) {
        let (client, worker) = (self.client.clone(), self.worker);
        rt.spawn(async move {
            if let Err(error) = client.heartbeat(worker).await {
                tracing::debug!(%error, "a heartbeat was not delivered");
            }
        });
    }

    /// One try at a report, no retry.
    pub(super) fn report_once(
        &self,
        report: &Report,
    ) -> impl std::future::Future<Output = Result<(), ClientError>> {
        let (client, report) = (self.client.clone(), report.clone());
        async move { client.report(&report).await }
    }

    pub(super) async fn report(&mut self, report: &Report) -> Result<(), ClientError> {
        self.retry("reporting", |c| {
            let r = report.clone();
            async move { c.report(&r).await }
        })
        .await
    }

    /// The shard's `/v1/status`.
    pub(super) async fn status(&mut self) -> Result<serde_json::Value, ClientError> {
        self.retry("reading the status", |c| async move { c.status().await }).await
    }

    async fn retry<T, F, Fut>(&mut self, what: &str, f: F) -> Result<T, ClientError>
    where
        F: FnMut(PsClient) -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        self.retry.run(&self.client, what, ClientError::is_transient, f).await
    }
}
