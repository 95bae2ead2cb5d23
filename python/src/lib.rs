//! `foresight._native`: the Python package's bridge to the Rust client, so that a Python worker
//! speaks to the parameter server through the same code as the Rust worker (the HTTP/2
//! transport, safetensors bodies, join / generation / seq / resume, re-seeding a PS that lost
//! its model, `sync` rounds, retries).
//!
//! Private to the package: `foresight/torch.py` hands over tensors it owns as (address, length)
//! of contiguous float32 CPU memory, because the buffer protocol is not in the limited API of
//! Python 3.10, which this abi3 module supports. The network waits run without the GIL.

use std::time::Duration;

use foresight_ps::client::{
    Cadence, ClientError, ClientTls, Exchange, GradDtype, Joined, PsClient, PullDtype, Retry, Session,
    StepEnd, shard,
};
use foresight_ps::server::Report;
use foresight_ps::wire::{Layout, TensorSpec};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// The error as an exception of `foresight.errors`, with the PS's reason and status.
fn to_py(py: Python<'_>, e: ClientError) -> PyErr {
    let (class, status) = match &e {
        ClientError::Refused { status, .. } => ("RefusedError", Some(status.as_u16())),
        ClientError::Transport(_) => ("UnreachableError", None),
        _ => ("ForesightError", None),
    };
    let reason = match &e {
        ClientError::OtherModel => Some("other_model"),
        _ => e.reason(),
    };
    let made = py.import("foresight.errors").and_then(|m| {
        let kwargs = PyDict::new(py);
        kwargs.set_item("reason", reason)?;
        kwargs.set_item("status", status)?;
        kwargs.set_item("permanent", e.is_permanent())?;
        m.getattr(class)?.call((e.to_string(),), Some(&kwargs))
    });
    match made {
        Ok(exc) => PyErr::from_value(exc),
        Err(import_failed) => import_failed,
    }
}

/// # Safety
/// `addr` must point at `len` float32 values that stay alive and unaliased for `'a` (the Python
/// wrapper passes tensors it owns and does not touch during the call).
unsafe fn floats<'a>(addr: usize, len: usize) -> &'a mut [f32] {
    unsafe { std::slice::from_raw_parts_mut(addr as *mut f32, len) }
}

fn layout(names: Vec<String>, shapes: Vec<Vec<usize>>) -> PyResult<Layout> {
    if names.len() != shapes.len() {
        return Err(PyValueError::new_err("names and shapes differ in length"));
    }
    let specs = names.into_iter().zip(shapes).map(|(name, shape)| TensorSpec { name, shape }).collect();
    Layout::new(specs).map_err(|e| PyValueError::new_err(format!("the model cannot be sent: {e}")))
}

/// One worker process's connection to the job: joined at construction.
#[pyclass(module = "foresight._native")]
struct Worker {
    exchange: Exchange,
    joined: Joined,
    worker: usize,
    /// Runs the client's I/O; declared last so it outlives the exchange's handle to it.
    _runtime: tokio::runtime::Runtime,
}

#[pymethods]
impl Worker {
    /// Registers the model from the `init_addr` values (when this worker is the first) and joins.
    #[new]
    #[pyo3(signature = (ps_url, token, worker, names, shapes, init_addr, pull_every, push_every, grad_dtype, deadline_seconds, seed, local_steps=1, ps_ca_file=None, pull_dtype="f32"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        ps_url: &str,
        token: Option<String>,
        worker: usize,
        names: Vec<String>,
        shapes: Vec<Vec<usize>>,
        init_addr: usize,
        pull_every: u64,
        push_every: u64,
        grad_dtype: &str,
        deadline_seconds: f64,
        seed: u64,
        local_steps: u64,
        ps_ca_file: Option<std::path::PathBuf>,
        pull_dtype: &str,
    ) -> PyResult<Self> {
        let dtype = match grad_dtype {
            "f32" => GradDtype::F32,
            "bf16" => GradDtype::Bf16,
            "int8" => GradDtype::Int8,
            other => {
                return Err(PyValueError::new_err(format!(
                    "grad_dtype {other:?}: expected f32, bf16 or int8"
                )));
            }
        };
        let pulls: PullDtype =
            pull_dtype.parse().map_err(|e: ClientError| PyValueError::new_err(e.to_string()))?;
        let cadence = Cadence::for_job(pull_every, push_every, local_steps, dtype)
            .map_err(|e| PyValueError::new_err(e.to_string()))?
            .pulling(pulls);
        if !(deadline_seconds.is_finite() && deadline_seconds >= 0.0) {
            return Err(PyValueError::new_err("deadline_seconds must be a non-negative number"));
        }
        let layout = layout(names, shapes)?;
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
        // SAFETY: the wrapper's flat copy of the model, `layout.len()` values, alive for the call.
        let init: &[f32] = unsafe { floats(init_addr, layout.len()) };
        let started = py.detach(|| Session::start(clients, handle, worker, layout, init, retry));
        let (session, joined) = started.map_err(|e| to_py(py, e))?;
        let exchange = Exchange::new(session, &joined, cadence);
        Ok(Self { exchange, joined, worker, _runtime: runtime })
    }

    /// The job's worker count when this process joined.
    #[getter]
    fn workers(&self) -> usize {
        self.joined.workers
    }

    /// Steps of this worker already in the model when this process joined.
    #[getter]
    fn resume_step(&self) -> u64 {
        self.joined.resume_step
    }

    /// This process's generation (its pushes carry it; an older process's are refused).
    #[getter]
    fn generation(&self) -> u64 {
        self.joined.generation
    }

    /// Steps of this worker in the model so far.
    #[getter]
    fn step(&self) -> u64 {
        self.exchange.step()
    }

    /// Steps ended since the last push (`finish` pushes them).
    #[getter]
    fn steps_unsent(&self) -> u64 {
        self.exchange.steps_unsent()
    }

    /// Whether the step in progress ends with an exchange (with local steps: its
    /// pseudo-gradient goes through `end_step`).
    #[getter]
    fn push_due_next(&self) -> bool {
        self.exchange.push_due_next()
    }

    /// With local steps, how many this worker trains before its next exchange: the job's
    /// `localSteps`, or what the parameter server advised (`adaptiveLocalSteps`). `None` when
    /// every step's gradient is pushed.
    #[getter]
    fn local_steps(&self) -> Option<u64> {
        self.exchange.local_steps()
    }

    /// (gradients taken, gradients discarded as stale, staleness of the last one applied).
    #[getter]
    fn push_stats(&self) -> (u64, u64, Option<u64>) {
        let s = self.exchange.stats();
        (s.pushes, s.discarded, s.last_staleness)
    }

    /// When a pull is due, writes the PS's model into the `len` floats at `addr` and returns its
    /// version; `None` when the local model is to be kept.
    fn pull_if_due(&mut self, py: Python<'_>, addr: usize, len: usize) -> PyResult<Option<u64>> {
        self.check_len(len)?;
        let exchange = &mut self.exchange;
        // SAFETY: the wrapper's flat model buffer, `len` values (checked against the layout).
        let out = unsafe { floats(addr, len) };
        py.detach(|| exchange.pull_if_due_into(out)).map_err(|e| to_py(py, e))
    }

    /// Ends this worker's training (the steps left over since the last push are pushed, with
    /// local steps the pseudo-gradient at `pseudo_addr`; the PS is told it trained all its
    /// steps), then the PS's model into the `len` floats at `addr`.
    #[pyo3(signature = (addr, len, pseudo_addr=None))]
    fn finish(
        &mut self,
        py: Python<'_>,
        addr: usize,
        len: usize,
        pseudo_addr: Option<usize>,
    ) -> PyResult<u64> {
        self.check_len(len)?;
        if let Some(p) = pseudo_addr {
            // SAFETY: the wrapper's flat gradient buffer, `len` values (checked against the layout).
            self.exchange.grad_mut().copy_from_slice(unsafe { floats(p, len) });
        }
        let exchange = &mut self.exchange;
        let m = py.detach(|| exchange.finish()).map_err(|e| to_py(py, e))?;
        // SAFETY: as in `pull_if_due`.
        unsafe { floats(addr, len) }.copy_from_slice(&m.values);
        Ok(m.version)
    }

    /// Ends a step whose gradient is the `len` floats at `addr`: adds it to what is accumulated
    /// and pushes when a push is due. True when the job was finalized (stop training).
    #[pyo3(signature = (addr, len, epoch=None))]
    fn end_step(&mut self, py: Python<'_>, addr: usize, len: usize, epoch: Option<f64>) -> PyResult<bool> {
        self.check_len(len)?;
        let exchange = &mut self.exchange;
        // SAFETY: the wrapper's flat gradient buffer, `len` values (checked against the layout).
        let grad: &[f32] = unsafe { floats(addr, len) };
        let end = py.detach(|| {
            exchange.grad_mut().iter_mut().zip(grad).for_each(|(acc, g)| *acc += g);
            exchange.end_step(epoch)
        });
        Ok(end.map_err(|e| to_py(py, e))? == StepEnd::Finalized)
    }

    /// Ends one of the local steps between exchanges: counts it, sends nothing. Refused at the
    /// step that ends the local steps (its pseudo-gradient goes through `end_step`).
    #[pyo3(signature = (epoch=None))]
    fn end_local_step(&mut self, py: Python<'_>, epoch: Option<f64>) -> PyResult<()> {
        if self.exchange.push_due_next() {
            return Err(PyValueError::new_err(format!(
                "step {} ends the local steps: its pseudo-gradient goes through end_step",
                self.exchange.step() + 1
            )));
        }
        let exchange = &mut self.exchange;
        py.detach(|| exchange.end_step(epoch)).map_err(|e| to_py(py, e))?;
        Ok(())
    }

    /// Reports progress (loss, accuracy, samples/s) to the PS, where `foresight run`, `kubectl
    /// get tj` and the dashboard read it.
    #[pyo3(signature = (epoch, loss, accuracy=None, samples_per_second=None))]
    fn report(
        &mut self,
        py: Python<'_>,
        epoch: f64,
        loss: f64,
        accuracy: Option<f64>,
        samples_per_second: Option<f64>,
    ) -> PyResult<()> {
        let report = Report {
            worker: self.worker,
            step: self.exchange.step(),
            epoch,
            loss,
            accuracy,
            samples_per_second,
        };
        let exchange = &mut self.exchange;
        py.detach(|| exchange.report(&report)).map_err(|e| to_py(py, e))
    }
}

impl Worker {
    fn check_len(&self, len: usize) -> PyResult<()> {
        let want = self.exchange.layout().len();
        if len != want {
            return Err(PyValueError::new_err(format!("a buffer of {len} floats for a model of {want}")));
        }
        Ok(())
    }
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
    m.add_class::<Worker>()?;
    m.add_function(wrap_pyfunction!(shard_indices, m)?)?;
    m.add_function(wrap_pyfunction!(steps_per_epoch, m)?)?;
    m.add_function(wrap_pyfunction!(holdout_split, m)?)?;
    Ok(())
}
