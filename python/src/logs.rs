//! The Rust client's `tracing` events, delivered to Python's `logging` under the `foresight`
//! logger: its retries, dropped gradients and "could not push the last steps" are what a user
//! reads when a worker misbehaves, and without a subscriber they were dropped.
//!
//! Events are queued here by whichever thread emits them (the call's thread, the I/O thread) and
//! handed to `logging` by the Python thread waiting on the call, which holds the GIL anyway:
//! no Rust thread ever waits for the GIL, so none can deadlock with a Python thread that holds it
//! while it waits for that Rust thread.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::Mutex;

use pyo3::exceptions::{PyException, PyKeyboardInterrupt};
use pyo3::prelude::*;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Registry};

/// Events held at most between two deliveries; older ones are dropped and counted.
const QUEUE: usize = 1024;

struct Queue {
    records: VecDeque<(u32, String)>,
    dropped: u64,
}

static QUEUED: Mutex<Queue> = Mutex::new(Queue { records: VecDeque::new(), dropped: 0 });

/// `logging`'s level number for a `tracing` level.
fn python_level(level: &Level) -> u32 {
    match *level {
        Level::ERROR => 40,
        Level::WARN => 30,
        Level::INFO => 20,
        Level::DEBUG => 10,
        Level::TRACE => 5,
    }
}

/// The event's message, then its fields as `key=value`, as the binaries' text logs print them.
#[derive(Default)]
struct Line {
    message: String,
    fields: String,
}

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={value}", field.name());
        }
    }
}

struct Queuing;

impl<S: Subscriber> Layer<S> for Queuing {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut line = Line::default();
        event.record(&mut line);
        let mut q = QUEUED.lock().unwrap_or_else(|e| e.into_inner());
        if q.records.len() == QUEUE {
            q.records.pop_front();
            q.dropped += 1;
        }
        q.records.push_back((python_level(event.metadata().level()), line.message + &line.fields));
    }
}

/// Installs the queue as the process's `tracing` subscriber: the client's events at `info` and
/// above, or what `$FORESIGHT_LOG` says (an `EnvFilter`, as `RUST_LOG` takes). Once per process;
/// a subscriber installed already (another extension's) is left in place.
pub fn install() {
    let filter =
        EnvFilter::try_from_env("FORESIGHT_LOG").unwrap_or_else(|_| EnvFilter::new("foresight_ps=info"));
    let _ = Registry::default().with(filter).with(Queuing).try_init();
}

/// Hands the queued events to `logging.getLogger("foresight")`, oldest first. Python runs a
/// pending signal's handler between the bytecodes of those calls, so Ctrl-C's
/// `KeyboardInterrupt` (or the package's SIGTERM handler's `SystemExit`) may be raised inside
/// them: that is returned, to end the wait, never printed and dropped (the signal would be
/// lost, and the worker would wait out the network's deadline). A logging handler's own error is
/// printed, and the training goes on.
pub fn deliver(py: Python<'_>) -> PyResult<()> {
    let (records, dropped) = {
        let mut q = QUEUED.lock().unwrap_or_else(|e| e.into_inner());
        if q.records.is_empty() && q.dropped == 0 {
            return Ok(());
        }
        (std::mem::take(&mut q.records), std::mem::take(&mut q.dropped))
    };
    let logged = (|| -> PyResult<()> {
        let logger = py.import("logging")?.call_method1("getLogger", ("foresight",))?;
        if dropped > 0 {
            let text = format!(
                "{dropped} earlier log records of the client were dropped (more than {QUEUE} at once)"
            );
            logger.call_method1("log", (30, text))?;
        }
        for (level, text) in records {
            logger.call_method1("log", (level, text))?;
        }
        Ok(())
    })();
    match logged {
        Err(e) if !e.is_instance_of::<PyException>(py) => Err(e),
        // A logging handler that raises is the script's to fix; the training goes on.
        Err(e) => {
            e.print(py);
            Ok(())
        }
        Ok(()) => Ok(()),
    }
}

/// [`deliver`] where the call's result is in hand and must be returned: a signal's exception
/// raised while delivering is raised again as the signal itself, which Python handles as soon
/// as the result is back in its hands.
pub fn deliver_then_raise(py: Python<'_>) {
    let Err(e) = deliver(py) else { return };
    let signal = if e.is_instance_of::<PyKeyboardInterrupt>(py) { libc::SIGINT } else { libc::SIGTERM };
    // SAFETY: a plain C call; it only marks the signal as pending.
    unsafe { pyo3::ffi::PyErr_SetInterruptEx(signal) };
}
