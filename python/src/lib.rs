//! `foresight._native`: the Python package's bridge to the Rust client, so that a Python worker
//! speaks to the parameter server through the same code as the Rust worker (the HTTP/2
//! transport, safetensors bodies, join / generation / seq / resume, re-seeding a PS that lost
//! its model, `sync` rounds, retries).
//!
//! Private to the package: `foresight/torch.py` hands over tensors it owns as (address, length)
//! of contiguous float32 CPU memory, because the buffer protocol is not in the limited API of
//! Python 3.10, which this abi3 module supports. The network waits run without the GIL.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, sync_channel};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use foresight_ps::client::{
    Cadence, ClientError, ClientTls, Exchange, GradDtype, LentFloats, PsClient, PullDtype, Retry, Session,
    StepEnd, shard,
};
use foresight_ps::wire::buffers::{self, Buffers};
use foresight_ps::wire::protocol::Report;
use foresight_ps::wire::{Layout, TensorSpec};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

mod logs;

/// How often a thread waiting on the network wakes to run Python's signal handlers (Ctrl-C,
/// the package's SIGTERM handler) and deliver the client's log records.
const TICK: Duration = Duration::from_millis(100);
/// A progress report is given up after this long: it is telemetry, not training.
const REPORT_WITHIN: Duration = Duration::from_secs(2);

/// An exception of `foresight.errors` named `class`, with the PS's reason and status.
fn exception(
    py: Python<'_>,
    class: &str,
    message: String,
    reason: Option<&str>,
    status: Option<u16>,
    permanent: bool,
) -> PyErr {
    let made = py.import("foresight.errors").and_then(|m| {
        let kwargs = PyDict::new(py);
        kwargs.set_item("reason", reason)?;
        kwargs.set_item("status", status)?;
        kwargs.set_item("permanent", permanent)?;
        m.getattr(class)?.call((message,), Some(&kwargs))
    });
    match made {
        Ok(exc) => PyErr::from_value(exc),
        Err(import_failed) => import_failed,
    }
}

/// The job's configuration cannot work: `foresight.ConfigError`, which ends the worker with
/// exit status 3 (the job fails at once instead of restarting it into the same error).
fn config_error(py: Python<'_>, message: String) -> PyErr {
    exception(py, "ConfigError", message, Some("config"), None, true)
}

/// The error as an exception of `foresight.errors`, with the PS's reason and status.
fn to_py(py: Python<'_>, e: ClientError) -> PyErr {
    let (class, status) = match &e {
        ClientError::Refused { status, .. } => ("RefusedError", Some(status.as_u16())),
        ClientError::Transport(_) | ClientError::TimedOut { .. } => ("UnreachableError", None),
        ClientError::Config(_) => ("ConfigError", None),
        _ => ("ForesightError", None),
    };
    let reason = match &e {
        ClientError::OtherModel(_) => Some("other_model"),
        ClientError::Config(_) => Some("config"),
        _ => e.reason(),
    };
    exception(py, class, e.to_string(), reason, status, e.is_permanent())
}

/// Runs `call` on a thread of its own while this (Python) thread waits without the GIL, waking
/// every [`TICK`] to deliver the client's log records and run Python's signal handlers: Ctrl-C
/// or SIGTERM raises here within a tick instead of after the network gave up (up to the retry
/// deadline). An interrupted call's thread finishes on its own; what it writes lies in the
/// Optimizer's buffers, which the job keeps for the life of the process.
fn wait<T: Send + 'static>(py: Python<'_>, call: impl FnOnce() -> T + Send + 'static) -> PyResult<T> {
    wait_for(py, &mut spawn(call)?)
}

/// Starts `call` on a thread of its own; its result arrives on the receiver.
fn spawn<T: Send + 'static>(call: impl FnOnce() -> T + Send + 'static) -> PyResult<Receiver<T>> {
    let (tx, rx) = sync_channel(1);
    std::thread::Builder::new()
        .name("foresight-call".into())
        .spawn(move || {
            let _ = tx.send(call());
        })
        .map_err(|e| PyRuntimeError::new_err(format!("starting the client's call: {e}")))?;
    Ok(rx)
}

/// Waits for a call [`spawn`] started, as [`wait`] says; an interrupted wait leaves the call
/// running and its receiver with the caller, who may wait again.
fn wait_for<T: Send>(py: Python<'_>, rx: &mut Receiver<T>) -> PyResult<T> {
    loop {
        // The receiver goes into the GIL-free closure as `&mut` (it is Send, not Sync).
        let r = &mut *rx;
        let got = py.detach(move || r.recv_timeout(TICK));
        match got {
            Ok(done) => {
                logs::deliver_then_raise(py);
                return Ok(done);
            }
            Err(RecvTimeoutError::Timeout) => {
                logs::deliver(py)?;
                py.check_signals()?
            }
            Err(RecvTimeoutError::Disconnected) => {
                logs::deliver_then_raise(py);
                return Err(PyRuntimeError::new_err("the client's call panicked (its message is on stderr)"));
            }
        }
    }
}

/// # Safety
/// `addr` must point at `len` float32 values that stay alive and unaliased for `'a` (the Python
/// wrapper passes tensors it owns and does not touch during the call).
unsafe fn floats<'a>(addr: usize, len: usize) -> &'a mut [f32] {
    unsafe { std::slice::from_raw_parts_mut(addr as *mut f32, len) }
}

/// The gradient at `addr`, and when `owner` (the tensor whose storage it is) is given, its
/// bytes lent to the push ([`LentFloats`]): the tensor stays alive for as long as the HTTP
/// client holds them.
///
/// # Safety
/// As [`floats`]; `owner`, when given, owns the memory at `addr`.
unsafe fn gradient<'a>(addr: usize, len: usize, owner: Option<Py<PyAny>>) -> (&'a [f32], Option<LentFloats>) {
    let grad: &[f32] = unsafe { floats(addr, len) };
    let lent = owner.map(|o| unsafe { LentFloats::new(o, grad.as_ptr(), len) });
    (grad, lent)
}

/// How long a call that lent a buffer (a push's gradient, the join's initial model) waits for
/// the HTTP client to drop its bytes (it does so at once, or on a refused stream's reset a
/// moment later): the script writes that buffer again (its next backward, the first pull).
const LENT_RELEASED_WITHIN: Duration = Duration::from_secs(1);

fn give_back(lent: Option<LentFloats>) {
    if let Some(l) = lent
        && !l.release(LENT_RELEASED_WITHIN)
    {
        tracing::warn!(
            seconds = LENT_RELEASED_WITHIN.as_secs_f64(),
            "the HTTP client still holds the bytes a finished call lent it (a push's gradient, the join's \
             model): a stream it abandoned may read what the script writes next (harmless: nobody takes \
             that stream's body)"
        );
    }
}

/// The model's layout, checked as the PS will check it (reserved names, sizes): a model the PS
/// cannot take is a configuration error here, not a refusal after the job started.
fn layout(names: Vec<String>, shapes: Vec<Vec<usize>>) -> Result<Layout, String> {
    if names.len() != shapes.len() {
        return Err("names and shapes differ in length".into());
    }
    let specs = names.into_iter().zip(shapes).map(|(name, shape)| TensorSpec { name, shape }).collect();
    Layout::model(specs).map_err(|e| format!("the model cannot be sent: {e}"))
}

/// What the calls share: the exchange, behind a lock so that a second Python thread (a metrics
/// thread reading `step` during a push) waits its turn instead of failing.
struct Shared {
    exchange: Exchange,
    worker: usize,
}

/// What an overlapped exchange came to: whether the job was finalized, and the version of the
/// model it pulled into the flat buffer (`None`: no pull was due).
type Exchanged = Result<(bool, Option<u64>), ClientError>;

/// One worker process's connection to the job: joined at construction.
#[pyclass(module = "foresight._native")]
struct Worker {
    shared: Arc<Mutex<Shared>>,
    /// Steps of this worker in the model so far, as the exchange counts them (one per
    /// `end_step`, `end_local_step` or `begin_exchange`): read without waiting for an exchange
    /// in flight, which a script's `foresight.job().step` between two steps would otherwise do.
    steps: AtomicU64,
    /// The overlapped exchange in flight ([`Worker::begin_exchange`]), until
    /// [`Worker::end_exchange`] takes its result.
    in_flight: Mutex<Option<Receiver<Exchanged>>>,
    workers: usize,
    resume_step: u64,
    generation: u64,
    /// Runs the client's I/O; declared last so it outlives the exchange's handle to it.
    _runtime: tokio::runtime::Runtime,
}

#[pymethods]
impl Worker {
    /// Registers the model from the `init_addr` values (when this worker is the first) and joins.
    #[new]
    #[pyo3(signature = (ps_url, token, worker, names, shapes, init_addr, init_owner, pull_every, push_every, grad_dtype, deadline_seconds, seed, local_steps=1, ps_ca_file=None, pull_dtype="f32", overlap=false, sync=false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        ps_url: &str,
        token: Option<String>,
        worker: usize,
        names: Vec<String>,
        shapes: Vec<Vec<usize>>,
        init_addr: usize,
        init_owner: Py<PyAny>,
        pull_every: u64,
        push_every: u64,
        grad_dtype: &str,
        deadline_seconds: f64,
        seed: u64,
        local_steps: u64,
        ps_ca_file: Option<std::path::PathBuf>,
        pull_dtype: &str,
        overlap: bool,
        sync: bool,
    ) -> PyResult<Self> {
        let dtype = match grad_dtype {
            "f32" => GradDtype::F32,
            "bf16" => GradDtype::Bf16,
            "int8" => GradDtype::Int8,
            other => {
                return Err(config_error(py, format!("grad_dtype {other:?}: expected f32, bf16 or int8")));
            }
        };
        let pulls: PullDtype =
            pull_dtype.parse().map_err(|e: ClientError| config_error(py, e.to_string()))?;
        let cadence = Cadence::for_job(pull_every, push_every, local_steps, dtype)
            .map_err(|e| config_error(py, e.to_string()))?
            .pulling(pulls);
        if !(deadline_seconds.is_finite() && deadline_seconds >= 0.0) {
            return Err(config_error(py, "deadline_seconds must be a non-negative number".into()));
        }
        let layout = layout(names, shapes).map_err(|e| config_error(py, e))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("foresight-io")
            .enable_all()
            .build()
            .map_err(|e| PyRuntimeError::new_err(format!("starting the I/O thread: {e}")))?;
        let tls = match ps_ca_file {
            Some(path) => Some(ClientTls::from_pem_file(&path).map_err(|e| to_py(py, e))?),
            None => None,
        };
        let clients = PsClient::for_shards(ps_url, token, tls.as_ref()).map_err(|e| to_py(py, e))?;
        let retry = Retry::new(Duration::from_secs_f64(deadline_seconds), seed ^ worker as u64);
        let handle = runtime.handle().clone();
        // The wrapper's flat copy of the model, lent to the registration: the call, which may
        // outlive an interrupted wait, keeps the tensor alive, and nothing writes it until the
        // first pull (after the join).
        // SAFETY: `init_owner` owns the `layout.len()` floats at `init_addr`.
        let init = unsafe { LentFloats::new(init_owner, init_addr as *const f32, layout.len()) };
        let join = move || {
            let values: &[f32] = bytemuck::cast_slice(init.bytes());
            let started =
                Session::start_lent(clients, handle, worker, layout, values, Some(init.bytes()), retry);
            give_back(Some(init));
            started
        };
        let started = match wait(py, join) {
            Ok(started) => started,
            Err(interrupted) => {
                // Ctrl-C during the join, whose call is still waiting on the network: dropping the
                // runtime would wait for that call's tasks, holding the GIL, so the exception
                // would not end the process until the PS answered or the deadline passed.
                runtime.shutdown_background();
                return Err(interrupted);
            }
        };
        let (session, joined) = started.map_err(|e| to_py(py, e))?;
        let mut exchange = Exchange::new(session, &joined, cadence);
        if overlap {
            exchange.overlap(sync).map_err(|e| config_error(py, e.to_string()))?;
        }
        Ok(Self {
            shared: Arc::new(Mutex::new(Shared { exchange, worker })),
            in_flight: Mutex::new(None),
            steps: AtomicU64::new(joined.resume_step),
            workers: joined.workers,
            resume_step: joined.resume_step,
            generation: joined.generation,
            _runtime: runtime,
        })
    }

    /// The job's worker count when this process joined.
    #[getter]
    fn workers(&self) -> usize {
        self.workers
    }

    /// Steps of this worker already in the model when this process joined.
    #[getter]
    fn resume_step(&self) -> u64 {
        self.resume_step
    }

    /// This process's generation (its pushes carry it; an older process's are refused).
    #[getter]
    fn generation(&self) -> u64 {
        self.generation
    }

    /// Steps of this worker in the model so far.
    #[getter]
    fn step(&self) -> u64 {
        self.steps.load(Ordering::Acquire)
    }

    /// Steps ended since the last push (`finish` pushes them).
    #[getter]
    fn steps_unsent(&self, py: Python<'_>) -> u64 {
        self.read(py, |s| s.exchange.steps_unsent())
    }

    /// Whether the step in progress ends with an exchange (with local steps: its
    /// pseudo-gradient goes through `end_step`).
    #[getter]
    fn push_due_next(&self, py: Python<'_>) -> bool {
        self.read(py, |s| s.exchange.push_due_next())
    }

    /// With local steps, how many this worker trains before its next exchange: the job's
    /// `localSteps`, or what the parameter server advised (`adaptiveLocalSteps`). `None` when
    /// every step's gradient is pushed.
    #[getter]
    fn local_steps(&self, py: Python<'_>) -> Option<u64> {
        self.read(py, |s| s.exchange.local_steps())
    }

    /// Whether this worker's leave was the job's last: the PS wrote the final model (with this
    /// worker's buffers) when it finished.
    #[getter]
    fn was_last(&self, py: Python<'_>) -> bool {
        self.read(py, |s| s.exchange.final_model().is_some())
    }

    /// (gradients taken, gradients discarded as stale, staleness of the last one applied).
    #[getter]
    fn push_stats(&self, py: Python<'_>) -> (u64, u64, Option<u64>) {
        self.read(py, |s| {
            let st = s.exchange.stats();
            (st.pushes, st.discarded, st.last_staleness)
        })
    }

    /// When a pull is due, writes the PS's model into the `len` floats at `addr` and returns its
    /// version; `None` when the local model is to be kept.
    fn pull_if_due(&self, py: Python<'_>, addr: usize, len: usize) -> PyResult<Option<u64>> {
        self.check_len(py, len)?;
        // SAFETY: the wrapper's flat model buffer, `len` values (checked against the layout).
        self.call(py, move |s| s.exchange.pull_if_due_into(unsafe { floats(addr, len) }))
    }

    /// Ends this worker's training (the steps left over since the last push are pushed, with
    /// local steps the pseudo-gradient at `pseudo_addr`; the PS is told it trained all its
    /// steps, with `buffers`, the model's untrained `state_dict` entries as (name, safetensors
    /// dtype, shape, bytes), and `aliases`, tied names to the trained tensor's), then the PS's
    /// model into the `len` floats at `addr`.
    #[pyo3(signature = (addr, len, pseudo_addr=None, buffers=Vec::new(), aliases=BTreeMap::new()))]
    fn finish(
        &self,
        py: Python<'_>,
        addr: usize,
        len: usize,
        pseudo_addr: Option<usize>,
        buffers: Vec<(String, String, Vec<usize>, Vec<u8>)>,
        aliases: BTreeMap<String, String>,
    ) -> PyResult<u64> {
        self.check_len(py, len)?;
        let body = match buffers.is_empty() && aliases.is_empty() {
            true => None,
            false => Some(self.buffers_body(py, &buffers, &aliases)?),
        };
        self.call(py, move |s| {
            if let Some(p) = pseudo_addr {
                // SAFETY: the wrapper's flat gradient buffer, `len` values (checked against the layout).
                s.exchange.grad_mut().copy_from_slice(unsafe { floats(p, len) });
            }
            let m = s.exchange.finish(body)?;
            // SAFETY: as in `pull_if_due`.
            unsafe { floats(addr, len) }.copy_from_slice(&m.values);
            Ok(m.version)
        })
    }

    /// Ends a step whose gradient is the `len` floats at `addr`: adds it to what is accumulated
    /// and pushes when a push is due. True when the job was finalized (stop training). `owner`,
    /// the tensor whose storage they are, lends them to a float32 push as they are (no copy).
    #[pyo3(signature = (addr, len, epoch=None, owner=None))]
    fn end_step(
        &self,
        py: Python<'_>,
        addr: usize,
        len: usize,
        epoch: Option<f64>,
        owner: Option<Py<PyAny>>,
    ) -> PyResult<bool> {
        self.check_len(py, len)?;
        self.steps.fetch_add(1, Ordering::AcqRel); // the step ends whatever the push comes to
        self.call(py, move |s| {
            // SAFETY: the wrapper's flat gradient buffer, `len` values (checked against the layout),
            // `owner`'s storage when it is given.
            let (grad, lent) = unsafe { gradient(addr, len, owner) };
            let end = s.exchange.end_step_with(grad, lent.as_ref().map(LentFloats::bytes), epoch);
            give_back(lent);
            Ok(end? == StepEnd::Finalized)
        })
    }

    /// Starts an overlapped exchange and returns at once: the step whose gradient is the `len`
    /// floats at `grad_addr` ends (its gradient pushed when a push is due, named as computed on
    /// the model loaded before `loaded`), then, if `loaded`, the model pulled by the exchange
    /// before counts as the one the next gradients are computed on, and the PS's model is pulled
    /// into the floats at `flat_addr` when a pull is due. Neither buffer may be touched until
    /// [`Self::end_exchange`] returned.
    #[pyo3(signature = (grad_addr, flat_addr, len, loaded, epoch=None, owner=None))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments, not a Rust API
    fn begin_exchange(
        &self,
        py: Python<'_>,
        grad_addr: usize,
        flat_addr: usize,
        len: usize,
        loaded: bool,
        epoch: Option<f64>,
        owner: Option<Py<PyAny>>,
    ) -> PyResult<()> {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        if in_flight.is_some() {
            return Err(PyRuntimeError::new_err("an exchange is in flight: end_exchange first"));
        }
        self.check_len(py, len)?;
        let shared = self.shared.clone();
        self.steps.fetch_add(1, Ordering::AcqRel);
        *in_flight = Some(spawn(move || -> Exchanged {
            let s = &mut Self::lock(&shared);
            // SAFETY: the wrapper's gradient and flat model buffers, `len` values each (checked
            // against the layout), which it neither reads nor writes until end_exchange; the
            // gradient's is `owner`'s storage when it is given.
            let ((grad, lent), flat) = unsafe { (gradient(grad_addr, len, owner), floats(flat_addr, len)) };
            let end = s.exchange.end_step_with(grad, lent.as_ref().map(LentFloats::bytes), epoch);
            give_back(lent);
            if end? == StepEnd::Finalized {
                return Ok((true, None));
            }
            if loaded {
                s.exchange.loaded();
            }
            Ok((false, s.exchange.pull_if_due_into(flat)?))
        })?);
        Ok(())
    }

    /// The model last pulled into the flat buffer is in the parameters now: with an overlapped
    /// exchange, the next gradients are computed on it (the first pull, before any step).
    fn mark_loaded(&self, py: Python<'_>) {
        py.detach(|| Self::lock(&self.shared).exchange.loaded());
    }

    /// Waits for the exchange [`Self::begin_exchange`] started (Ctrl-C and SIGTERM act within a
    /// tick; the exchange stays in flight and a later call waits for it again): (finalized,
    /// version pulled into the flat buffer), or `None` when none is in flight.
    fn end_exchange(&self, py: Python<'_>) -> PyResult<Option<(bool, Option<u64>)>> {
        let taken = self.in_flight.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(mut rx) = taken else { return Ok(None) };
        match wait_for(py, &mut rx) {
            Ok(done) => done.map(Some).map_err(|e| to_py(py, e)),
            Err(interrupted) => {
                *self.in_flight.lock().unwrap_or_else(|e| e.into_inner()) = Some(rx);
                Err(interrupted)
            }
        }
    }

    /// Ends one of the local steps between exchanges: counts it, sends nothing. Refused at the
    /// step that ends the local steps (its pseudo-gradient goes through `end_step`).
    #[pyo3(signature = (epoch=None))]
    fn end_local_step(&self, py: Python<'_>, epoch: Option<f64>) -> PyResult<()> {
        let (due, step) = self.read(py, |s| (s.exchange.push_due_next(), s.exchange.step()));
        if due {
            return Err(PyValueError::new_err(format!(
                "step {} ends the local steps: its pseudo-gradient goes through end_step",
                step + 1
            )));
        }
        self.steps.fetch_add(1, Ordering::AcqRel);
        self.call(py, move |s| s.exchange.end_step(epoch).map(|_| ()))
    }

    /// Reports progress (loss, accuracy, samples/s) to the PS, where `foresight run`, `kubectl
    /// get tj` and the dashboard read it: one try, given up after two seconds (telemetry).
    #[pyo3(signature = (epoch, loss, accuracy=None, samples_per_second=None))]
    fn report(
        &self,
        py: Python<'_>,
        epoch: f64,
        loss: f64,
        accuracy: Option<f64>,
        samples_per_second: Option<f64>,
    ) -> PyResult<()> {
        self.call(py, move |s| {
            let report = Report {
                worker: s.worker,
                step: s.exchange.step(),
                epoch,
                loss,
                accuracy,
                samples_per_second,
            };
            s.exchange.report_once(&report, REPORT_WITHIN)
        })
    }
}

impl Worker {
    fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
        // A call that panicked left nothing half-done that a later call relies on.
        shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `f` of the shared state, waiting (without the GIL) for a call in flight to end.
    fn read<T: Send>(&self, py: Python<'_>, f: impl FnOnce(&Shared) -> T + Send) -> T {
        py.detach(|| f(&Self::lock(&self.shared)))
    }

    /// `f` on the call's thread ([`wait`]), its error as a `foresight` exception.
    fn call<T: Send + 'static>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut Shared) -> Result<T, ClientError> + Send + 'static,
    ) -> PyResult<T> {
        let shared = self.shared.clone();
        wait(py, move || f(&mut Self::lock(&shared)))?.map_err(|e| to_py(py, e))
    }

    fn check_len(&self, py: Python<'_>, len: usize) -> PyResult<()> {
        let want = self.read(py, |s| s.exchange.layout().len());
        if len != want {
            return Err(PyValueError::new_err(format!("a buffer of {len} floats for a model of {want}")));
        }
        Ok(())
    }

    /// The leave's buffers body, checked as the PS will check it.
    fn buffers_body(
        &self,
        py: Python<'_>,
        tensors: &[(String, String, Vec<usize>, Vec<u8>)],
        aliases: &BTreeMap<String, String>,
    ) -> PyResult<Vec<u8>> {
        let body = buffers::body(tensors, aliases);
        let checked = self.read(py, |s| {
            Buffers::decode(&body, s.exchange.layout()).and_then(|b| b.check(s.exchange.layout()))
        });
        checked.map_err(|e| {
            exception(
                py,
                "ForesightError",
                format!("the model's buffers cannot go into the final model: {e}"),
                Some(e.reason()),
                None,
                true,
            )
        })?;
        Ok(body)
    }
}

/// The job's worker count M now, from the first shard's `/v1/status` (`workers_expected`),
/// retried until `deadline_seconds`: what a script that shards its data before its Optimizer
/// joins shards by.
#[pyfunction]
#[pyo3(signature = (ps_url, token, deadline_seconds, ps_ca_file=None))]
fn job_workers(
    py: Python<'_>,
    ps_url: &str,
    token: Option<String>,
    deadline_seconds: f64,
    ps_ca_file: Option<std::path::PathBuf>,
) -> PyResult<usize> {
    let tls = match ps_ca_file {
        Some(path) => Some(ClientTls::from_pem_file(&path).map_err(|e| to_py(py, e))?),
        None => None,
    };
    let first = PsClient::for_shards(ps_url, token, tls.as_ref()).map_err(|e| to_py(py, e))?.swap_remove(0);
    let deadline = Duration::from_secs_f64(deadline_seconds.max(0.0));
    let asked = wait(py, move || -> Result<usize, ClientError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| ClientError::Config(e.to_string()))?;
        let mut retry = Retry::new(deadline, 0);
        let status = rt.block_on(retry.run(
            &first,
            "reading the job's worker count",
            ClientError::is_transient,
            |c| async move { c.status().await },
        ))?;
        status["workers_expected"].as_u64().map(|n| n as usize).ok_or_else(|| {
            ClientError::Config("the parameter server's status names no workers_expected".into())
        })
    })?;
    asked.map_err(|e| to_py(py, e))
}

/// Worker `index`'s examples out of `n` (the Rust worker's rule: disjoint shards, seeded).
#[pyfunction]
fn shard_indices(n: usize, index: usize, count: usize, seed: u64) -> PyResult<Vec<usize>> {
    if count == 0 || index >= count {
        return Err(PyValueError::new_err(format!("worker {index} of {count}")));
    }
    Ok(shard::indices(n, index, count, seed))
}

/// (training, held-out) indices of `n` examples, `holdout` of them held out (the Rust worker's
/// split of a CSV dataset).
#[pyfunction]
fn holdout_split(n: usize, holdout: f64, seed: u64) -> PyResult<(Vec<usize>, Vec<usize>)> {
    if n < 2 || !(holdout > 0.0 && holdout < 1.0) {
        return Err(PyValueError::new_err(format!("holding out {holdout} of {n} examples")));
    }
    Ok(shard::holdout(n, holdout, seed))
}

/// Steps per epoch of every worker: the smallest shard's examples in batches of `batch`.
#[pyfunction]
fn steps_per_epoch(n: usize, count: usize, batch: usize) -> PyResult<u64> {
    if count == 0 || batch == 0 {
        return Err(PyValueError::new_err("count and batch must be at least 1"));
    }
    Ok(shard::steps_per_epoch(n, count, batch))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    logs::install();
    m.add_class::<Worker>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(shard_indices, m)?)?;
    m.add_function(wrap_pyfunction!(steps_per_epoch, m)?)?;
    m.add_function(wrap_pyfunction!(holdout_split, m)?)?;
    m.add_function(wrap_pyfunction!(job_workers, m)?)?;
    Ok(())
}
