//! A worker's step-by-step exchange with the parameter server, whatever computes the gradients
//! (the Rust worker's libtorch models, or a user's PyTorch loop through the Python package):
//!
//! - before a step, [`Exchange::pull_if_due`] hands over the model to train on when a pull is
//!   due: at the first step, every `pull_every` steps, after a gradient was dropped, and while a
//!   `sync` round holds this worker's gradient (it waits for the round to close);
//! - the step adds its gradient into [`Exchange::grad_mut`];
//! - [`Exchange::end_step`] counts the step and, every `push_every` steps, pushes the mean of the
//!   gradients accumulated since the last push, computed on the version last pulled.
//!
//! With local steps ([`Cadence::local_steps`], DiLoCo-style training) the worker trains `h` steps
//! with its own inner optimizer between exchanges; at the `h`-th it puts its pseudo-gradient
//! θ_pulled − θ_local in [`Exchange::grad_mut`], which is pushed as it is (not averaged), and
//! the PS applies its outer step to it.
//!
//! Steps left over at the end (fewer than `push_every`, or than `h`, since the last push) are
//! pushed by [`Exchange::finish`] (their mean, or the pseudo-gradient the worker put in
//! [`Exchange::grad_mut`]): the last steps of a job are never trained for nothing.

use std::time::{Duration, Instant};

use super::session::{Pushed, Session};
use super::{ClientError, GradDtype, Joined, Model, PullDtype};
use crate::pace::PaceReport;
use crate::wire::Layout;
use crate::wire::final_model::{FinalModel, termination_message_file};
use crate::wire::protocol::Report;

/// How often a worker talks to the PS. Build it with [`Cadence::new`], which refuses the
/// combinations that would mislabel a gradient.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cadence {
    pull_every: u64,
    push_every: u64,
    dtype: GradDtype,
    /// The type the model is pulled in.
    pull_dtype: PullDtype,
    /// What is pushed: the mean of the steps' gradients, or a pseudo-gradient as it is.
    kind: Pushes,
}

/// What a push carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pushes {
    /// The mean of the gradients accumulated since the last push.
    MeanGradient,
    /// The pseudo-gradient θ_pulled − θ_local after the worker's local steps, as it is.
    PseudoGradient,
}

impl Cadence {
    pub fn new(pull_every: u64, push_every: u64, dtype: GradDtype) -> Result<Self, ClientError> {
        cadence_problem(pull_every, push_every, false).map_or(Ok(()), |p| Err(ClientError::Config(p)))?;
        Ok(Self { pull_every, push_every, dtype, pull_dtype: PullDtype::F32, kind: Pushes::MeanGradient })
    }

    /// `h` local steps per exchange: pull before the first, push the pseudo-gradient the
    /// worker puts in [`Exchange::grad_mut`] at the `h`-th, unscaled.
    pub fn local_steps(h: u64, dtype: GradDtype) -> Result<Self, ClientError> {
        if h == 0 {
            return Err(ClientError::Config("localSteps must be at least 1".into()));
        }
        Ok(Self {
            pull_every: h,
            push_every: h,
            dtype,
            pull_dtype: PullDtype::F32,
            kind: Pushes::PseudoGradient,
        })
    }

    /// A job's cadence from its settings: `local_steps > 1` trains that many local steps per
    /// exchange and replaces `pull_every`/`push_every`, which must then be left at 1.
    pub fn for_job(
        pull_every: u64,
        push_every: u64,
        local_steps: u64,
        dtype: GradDtype,
    ) -> Result<Self, ClientError> {
        if local_steps <= 1 {
            return Self::new(pull_every, push_every, dtype);
        }
        if (pull_every, push_every) != (1, 1) {
            return Err(ClientError::Config(
                "localSteps replaces pullEvery and pushEvery: leave them at 1".into(),
            ));
        }
        Self::local_steps(local_steps, dtype)
    }

    /// Every step, F32 gradients.
    pub fn every_step() -> Self {
        Self {
            pull_every: 1,
            push_every: 1,
            dtype: GradDtype::F32,
            pull_dtype: PullDtype::F32,
            kind: Pushes::MeanGradient,
        }
    }

    /// The same cadence, pulling the model in `dtype`.
    pub fn pulling(self, dtype: PullDtype) -> Self {
        Self { pull_dtype: dtype, ..self }
    }

    /// The local steps between exchanges; `None` when every step's gradient is pushed.
    pub fn local(&self) -> Option<u64> {
        (self.kind == Pushes::PseudoGradient).then_some(self.push_every)
    }
}

/// What is wrong with pulling every `pull_every` and pushing every `push_every` steps, if
/// anything. A pushed gradient is labelled with the last pulled version: that is where the PS
/// measures its staleness, finds the backup delay compensation uses and applies `maxStaleness`.
/// So the steps accumulated into one push must all be computed on that one pulled model: a pull
/// may only come right after a push (`pull_every` a multiple of `push_every`). Under `sync` a
/// worker must also pull the round's model before its next gradient, or the round it pushes to
/// has closed (`pull_every == push_every`).
pub fn cadence_problem(pull_every: u64, push_every: u64, sync: bool) -> Option<String> {
    if pull_every == 0 || push_every == 0 {
        return Some("pullEvery and pushEvery must be at least 1".into());
    }
    if sync && pull_every != push_every {
        return Some(format!(
            "under sync pullEvery must equal pushEvery (got {pull_every} and {push_every}): \
             each round's model is pulled before the next gradient is computed"
        ));
    }
    if !pull_every.is_multiple_of(push_every) {
        return Some(format!(
            "pullEvery ({pull_every}) must be a multiple of pushEvery ({push_every}): the steps \
             accumulated into one push must all be computed on the model pulled before them"
        ));
    }
    None
}

/// How long a `sync` worker waits for its round before pushing its gradient for it again (the
/// round may have been lost with a restarted PS; a PS that still holds it answers a replay).
const ROUND_WAIT: Duration = Duration::from_secs(10);

/// A `sync` gradient waiting in its round, kept to push again if the round is lost.
struct InRound {
    version: u64,
    step: u64,
    epoch: Option<f64>,
    grad: Vec<f32>,
}

/// What this worker's pushes came to so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PushStats {
    /// Gradients the PS took (applied, or into a `sync` round).
    pub pushes: u64,
    /// Gradients the PS refused as stale or for a model it no longer has.
    pub discarded: u64,
    /// The staleness of the last gradient applied.
    pub last_staleness: Option<u64>,
}

/// How a step ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepEnd {
    /// Train the next step.
    Continue,
    /// The job was finalized: the model is read-only, stop training.
    Finalized,
}

pub struct Exchange {
    session: Session,
    cadence: Cadence,
    /// Steps of this worker in the model: the resume step, then one more per [`Self::end_step`].
    step: u64,
    /// The version the local model holds; `None` when a pull is needed before the next step.
    version: Option<u64>,
    in_round: Option<InRound>,
    /// The gradients accumulated since the last push, summed.
    grad: Vec<f32>,
    /// Steps ended since the last push: their gradients are in `grad`, not in the model.
    unsent: u64,
    /// The epoch the last step reached.
    epoch: Option<f64>,
    stats: PushStats,
    /// Where the PS wrote the final model, once [`Self::finish`] learnt it (this was the job's
    /// last worker).
    final_model: Option<FinalModel>,
    /// A pulled model's values the caller gave back ([`Self::recycle`]): the next pull's copy.
    recycled: Vec<f32>,
    /// With local steps: how many to train before the next exchange. The job's `localSteps`,
    /// or what the PS advised in its answer to the last push (`adaptiveLocalSteps`).
    local_steps: u64,
    /// What the next push reports of this worker's pace.
    clock: PaceClock,
    /// The PS's update rule, as its join answer said (`None` from an older PS).
    rule: Option<crate::optimizer::Algorithm>,
}

/// Times this worker's steps and exchanges for the pace its pushes report.
#[derive(Debug, Default)]
struct PaceClock {
    /// When the steps since the last exchange began (the end of the last pull or push).
    steps_began: Option<Instant>,
    /// The last push's wall time, until the pull after it completes the exchange.
    push: Option<Duration>,
    /// The last whole exchange: a push and the pull after it, less the time the PS held the
    /// pull waiting for a `sync` round. An exchange in which a call failed and was retried is
    /// not measured (the previous one stands): it timed a PS restarting or a refused connection,
    /// and a restarted PS, which starts its pace afresh, would set every worker's round by it.
    exchange: Option<Duration>,
}

impl PaceClock {
    fn pace(&self, steps: u64) -> Option<PaceReport> {
        let began = self.steps_began?;
        let steps = steps.max(1);
        Some(PaceReport {
            steps,
            step_seconds: began.elapsed().as_secs_f64() / steps as f64,
            exchange_seconds: self.exchange.map(|c| c.as_secs_f64()),
        })
    }

    /// A push took `took`; `retried`: some call failed and was retried meanwhile.
    fn pushed(&mut self, took: Duration, retried: bool) {
        self.push = (!retried).then_some(took);
        self.steps_began = Some(Instant::now());
    }

    /// The pull after a push took `took`, `held` of it waiting for a round.
    fn pulled(&mut self, took: Duration, held: Duration, retried: bool) {
        if let Some(push) = self.push.take()
            && !retried
        {
            self.exchange = Some(push + took.saturating_sub(held));
        }
        self.steps_began = Some(Instant::now());
    }
}

impl Exchange {
    /// Starts after `joined.resume_step` steps (those already in the model).
    pub fn new(mut session: Session, joined: &Joined, cadence: Cadence) -> Self {
        let grad = vec![0.0; session.layout().len()];
        session.pull_as(cadence.pull_dtype);
        Self {
            session,
            cadence,
            step: joined.resume_step,
            version: None,
            in_round: None,
            grad,
            unsent: 0,
            epoch: None,
            stats: PushStats::default(),
            final_model: None,
            recycled: Vec::new(),
            local_steps: cadence.push_every,
            clock: PaceClock::default(),
            rule: joined.algorithm,
        }
    }

    /// With local steps, how many the worker trains before its next exchange (the job's
    /// `localSteps`, or what the PS advised); `None` when every step's gradient is pushed.
    pub fn local_steps(&self) -> Option<u64> {
        self.cadence.local().map(|_| self.local_steps)
    }

    /// Steps of this worker in the model so far (the resume step included).
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The layout of this worker's model.
    pub fn layout(&self) -> &Layout {
        self.session.layout()
    }

    pub fn stats(&self) -> PushStats {
        self.stats
    }

    /// The final model, when [`Self::finish`] found this worker to be the job's last.
    pub fn final_model(&self) -> Option<&FinalModel> {
        self.final_model.as_ref()
    }

    /// Whether the step in progress ends with a push.
    pub fn push_due_next(&self) -> bool {
        self.push_due_after(self.step + 1, self.unsent + 1)
    }

    /// Whether a push is due once `step` has ended, `unsent` steps after the last push. Local
    /// steps count from the last exchange (their number may change from one to the next);
    /// pushes of gradients fall on multiples of `push_every`.
    fn push_due_after(&self, step: u64, unsent: u64) -> bool {
        match self.cadence.kind {
            Pushes::PseudoGradient => unsent >= self.local_steps,
            Pushes::MeanGradient => step.is_multiple_of(self.cadence.push_every),
        }
    }

    /// From now on the worker overlaps its exchange with its next step: it pulls while it
    /// computes on the model it loaded before, and says when it loads a pulled one
    /// ([`Self::loaded`]); its gradients name the model they were computed on, which a
    /// delay-compensated PS keeps for it. Refused under `sync` (a round takes gradients of its
    /// own version only) and with local steps (a block's pseudo-gradient is taken against the
    /// model pulled at its start).
    pub fn overlap(&mut self, sync: bool) -> Result<(), ClientError> {
        // The PS's own word on the rule, as the worker's environment may not carry it.
        let sync = sync || self.rule == Some(crate::optimizer::Algorithm::Sync);
        if sync || self.cadence.kind == Pushes::PseudoGradient {
            return Err(ClientError::Config(
                "an overlapped exchange needs an asynchronous rule and a gradient every step: not with \
                 optimizer.algorithm sync or optimizer.localSteps above 1"
                    .into(),
            ));
        }
        self.session.overlap();
        Ok(())
    }

    /// An overlapping worker loaded the model it pulled last into the parameters it computes on.
    pub fn loaded(&mut self) {
        self.session.loaded();
    }

    /// The next step's gradient is added into this (flat, in layout order).
    pub fn grad_mut(&mut self) -> &mut [f32] {
        &mut self.grad
    }

    fn pull_due(&self) -> bool {
        let cadence_says = match self.cadence.kind {
            Pushes::PseudoGradient => self.unsent == 0,
            Pushes::MeanGradient => self.step.is_multiple_of(self.cadence.pull_every),
        };
        self.version.is_none() || cadence_says || self.in_round.is_some()
    }

    /// The model to train the next step on, when a pull is due; `None` to keep the local one.
    /// Its values are a buffer given back by [`Self::recycle`] when there is one.
    pub fn pull_if_due(&mut self) -> Result<Option<Model>, ClientError> {
        if !self.pull_due() {
            return Ok(None);
        }
        let mut values = self.buffer();
        let version = self.pull_after_round(&mut values)?;
        Ok(Some(self.model(version, values)))
    }

    /// [`Self::pull_if_due`] into the caller's `out` (the model's length, flat in layout order):
    /// the pulled version, or `None` when the local model is to be kept (`out` untouched).
    pub fn pull_if_due_into(&mut self, out: &mut [f32]) -> Result<Option<u64>, ClientError> {
        if !self.pull_due() {
            return Ok(None);
        }
        self.pull_after_round(out).map(Some)
    }

    /// The recycled buffer, or a new one, of the model's length.
    fn buffer(&mut self) -> Vec<f32> {
        match std::mem::take(&mut self.recycled) {
            v if v.len() == self.grad.len() => v,
            _ => vec![0.0; self.grad.len()],
        }
    }

    fn model(&self, version: u64, values: Vec<f32>) -> Model {
        // Made from every shard's slice: no one PS process served it.
        Model {
            version,
            incarnation: None,
            layout: self.session.layout().clone(),
            values,
            held: Duration::ZERO,
            copy: None,
        }
    }

    /// Pulls the model into `out` and answers its version. Under `sync`, first waits for the
    /// round holding this worker's gradient to close, pushing that gradient again whenever the
    /// wait runs out (a restarted PS lost the round; one that still holds it answers a replay).
    fn pull_after_round(&mut self, out: &mut [f32]) -> Result<u64, ClientError> {
        loop {
            let after_round = self.in_round.is_some();
            let (pulling, retries) = (Instant::now(), self.session.retries());
            if let Some(p) = self.session.pull_into(self.step, after_round, ROUND_WAIT, out)? {
                let retried = self.session.retries() != retries;
                self.clock.pulled(pulling.elapsed(), p.held, retried);
                self.in_round = None;
                self.version = Some(p.version);
                return Ok(p.version);
            }
            let Some(r) = &self.in_round else { continue };
            // The same push again: its pace was reported the first time.
            match self.session.push(r.step, r.epoch, &r.grad, None, self.cadence.dtype, None)? {
                Pushed::InRound { .. } => {
                    tracing::info!(version = r.version, "still waiting for the sync round")
                }
                Pushed::Applied(_) | Pushed::Dropped(_) | Pushed::Finalized => self.in_round = None,
            }
        }
    }

    /// Ends a step whose gradient is in [`Self::grad_mut`]; `epoch` is the fractional epoch
    /// reached (it drives the PS's learning-rate schedule).
    pub fn end_step(&mut self, epoch: Option<f64>) -> Result<StepEnd, ClientError> {
        self.step += 1;
        self.unsent += 1;
        self.epoch = epoch;
        if !self.push_due_after(self.step, self.unsent) {
            if self.cadence.kind == Pushes::PseudoGradient {
                self.session.heartbeat_if_due();
            }
            return Ok(StepEnd::Continue);
        }
        self.push_unsent()
    }

    /// Steps ended since the last push (their gradients, or their local progress, are not in the
    /// model yet). With local steps and some left at the end, the worker puts their
    /// pseudo-gradient in [`Self::grad_mut`] before [`Self::finish`].
    pub fn steps_unsent(&self) -> u64 {
        self.unsent
    }

    /// Pushes what the unsent steps accumulated: the mean of their gradients (a window cut short
    /// by a resume or by the end counts only its own steps), or the pseudo-gradient as it is.
    fn push_unsent(&mut self) -> Result<StepEnd, ClientError> {
        if self.unsent > 1 && self.cadence.kind == Pushes::MeanGradient {
            let k = self.unsent as f32;
            self.grad.iter_mut().for_each(|g| *g /= k);
        }
        let mut accumulated = std::mem::take(&mut self.grad);
        let end = self.push(&accumulated, None, self.epoch);
        accumulated.fill(0.0);
        self.grad = accumulated;
        self.unsent = 0;
        end
    }

    /// [`Self::end_step`] for a step whose gradient (or, with local steps, pseudo-gradient) is
    /// `grad`, the caller's buffer. When it is the whole push — a push is due after it and
    /// nothing is accumulated — it is pushed from `grad` as it is: the accumulator is neither
    /// written nor zeroed, so its pages are never touched (4 bytes per parameter of resident
    /// memory and two model-sized passes per step less for the Python package's every-step
    /// worker). Otherwise it is added to the accumulator. `lent`, when the caller lends it
    /// ([`super::LentFloats`]), is `grad`'s bytes: a float32 push sends them as they are, with no
    /// model-sized body of its own.
    pub fn end_step_with(
        &mut self,
        grad: &[f32],
        lent: Option<&bytes::Bytes>,
        epoch: Option<f64>,
    ) -> Result<StepEnd, ClientError> {
        assert_eq!(grad.len(), self.grad.len(), "a gradient of the layout's length");
        let whole = self.push_due_after(self.step + 1, self.unsent + 1)
            && (self.cadence.kind == Pushes::PseudoGradient || self.unsent == 0);
        if !whole {
            self.grad.iter_mut().zip(grad).for_each(|(acc, g)| *acc += g);
            return self.end_step(epoch);
        }
        self.step += 1;
        self.unsent += 1;
        self.epoch = epoch;
        let end = self.push(grad, lent, epoch);
        self.unsent = 0;
        end
    }

    fn push(
        &mut self,
        grad: &[f32],
        lent: Option<&bytes::Bytes>,
        epoch: Option<f64>,
    ) -> Result<StepEnd, ClientError> {
        if self.version.is_none() {
            return Err(ClientError::NotPulled);
        }
        let pace = self.clock.pace(self.unsent);
        let (pushing, retries) = (Instant::now(), self.session.retries());
        let pushed = self.session.push(self.step, epoch, grad, lent, self.cadence.dtype, pace)?;
        self.clock.pushed(pushing.elapsed(), self.session.retries() != retries);
        if let (Some(_), Some(h)) = (self.cadence.local(), self.session.advised_local_steps()) {
            if h != self.local_steps {
                tracing::info!(
                    from = self.local_steps,
                    to = h,
                    "the parameter server changed this worker's local steps"
                );
            }
            self.local_steps = h;
        }
        match pushed {
            Pushed::Applied(reply) => {
                self.stats.pushes += 1;
                self.stats.last_staleness = Some(reply.staleness);
            }
            Pushed::InRound { version } => {
                self.stats.pushes += 1;
                self.stats.last_staleness = Some(0);
                let grad = grad.to_vec();
                self.in_round = Some(InRound { version, step: self.step, epoch, grad });
            }
            Pushed::Dropped(reason) => {
                self.stats.discarded += 1;
                tracing::info!(reason, "gradient discarded; pulling again");
                self.version = None;
            }
            Pushed::Finalized => {
                tracing::info!("the job was finalized; stopping");
                return Ok(StepEnd::Finalized);
            }
        }
        Ok(StepEnd::Continue)
    }

    /// Ends this worker's training: pushes the steps left over since the last push (their
    /// gradients' mean, or with local steps the pseudo-gradient in [`Self::grad_mut`]), tells the
    /// PS it trained all its steps (so `sync` rounds stop
    /// waiting for it; a PS that cannot be told is only logged: the training is done either
    /// way), then pulls the PS's model, the final word. The job's last worker learns where the
    /// PS wrote the final model and records it as its container's termination message, which
    /// the operator reads (`final_model::termination_message_file`). `buffers`, a
    /// `wire::buffers` body, are the model's untrained `state_dict` entries (BatchNorm
    /// statistics, frozen and tied parameters): the last worker's go into the final model.
    pub fn finish(&mut self, buffers: Option<Vec<u8>>) -> Result<Model, ClientError> {
        if self.unsent > 0 && self.version.is_some() {
            let steps = self.unsent;
            match self.push_unsent() {
                Ok(StepEnd::Continue) => {
                    tracing::info!(steps, "pushed the last steps, fewer than a whole push's")
                }
                Ok(StepEnd::Finalized) => {}
                Err(e) => tracing::warn!(error = %e, steps, "could not push the last steps"),
            }
        }
        match self.session.leave(buffers.map(Into::into)) {
            Ok(Some(last)) => {
                record_final_model(&last);
                self.final_model = Some(last);
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "could not tell the parameter server this worker finished"),
        }
        self.pull_now()
    }

    /// The PS's model now, whatever the cadence.
    pub fn pull_now(&mut self) -> Result<Model, ClientError> {
        let mut values = self.buffer();
        let pulled = self.session.pull_into(self.step, false, Duration::ZERO, &mut values)?;
        Ok(self.model(pulled.ok_or(ClientError::MissingVersion)?.version, values))
    }

    /// Gives back a pulled model's values once the caller has loaded them: the next pull is
    /// copied into them instead of a fresh model-sized buffer (400 MB of pages zeroed and
    /// faulted in per pull at 100M parameters). Values of another length are dropped.
    pub fn recycle(&mut self, values: Vec<f32>) {
        if values.len() == self.grad.len() {
            self.recycled = values;
        }
    }

    pub fn report(&mut self, report: &Report) -> Result<(), ClientError> {
        self.session.report(report)
    }

    /// A report tried once, given up after `within` (telemetry: a step does not wait for it).
    pub fn report_once(&mut self, report: &Report, within: Duration) -> Result<(), ClientError> {
        self.session.report_once(report, within)
    }
}

fn record_final_model(m: &FinalModel) {
    tracing::info!(version = m.version, path = ?m.path, "this was the job's last worker: the final model is written");
    let Some(file) = termination_message_file() else { return };
    if let Err(e) = m.record(&file) {
        tracing::warn!(error = %e, file = ?file, "could not record the final model in the termination message");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jobs_local_steps_replace_its_pull_and_push_cadence() {
        let every = Cadence::for_job(2, 1, 1, GradDtype::F32).unwrap();
        assert_eq!(every, Cadence::new(2, 1, GradDtype::F32).unwrap());
        assert_eq!(every.local(), None);
        let local = Cadence::for_job(1, 1, 8, GradDtype::Bf16).unwrap();
        assert_eq!(local.local(), Some(8));
        let err = Cadence::for_job(2, 1, 8, GradDtype::F32).unwrap_err().to_string();
        assert!(err.contains("localSteps replaces pullEvery and pushEvery"), "{err}");
        assert!(Cadence::for_job(3, 2, 1, GradDtype::F32).is_err(), "the every-step rules still hold");
    }
}
