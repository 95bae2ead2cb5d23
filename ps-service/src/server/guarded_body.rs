//! Every request body is guarded twice, whatever the handler does with it:
//!
//! - **Stalled uploads end.** A body that sends nothing for [`BodyGuard::idle`] ends with
//!   [`BodyStalled`], so a worker paused mid-push (or a slowloris client) does not pin a
//!   model-sized buffer forever: the handler answers 408 and its buffer goes back to the pool.
//!   So does one that trickles: each period of `idle` that the body is read must bring at least
//!   [`BodyGuard::min_rate`] bytes a second (a frame every 29 s under a 30 s idle limit held a
//!   push slot for ever, and K such clients every slot).
//! - **A refusal reaches the client.** A handler that answers before reading the whole body
//!   (a 401, a bad query, a known answer) drops the body; h2 then sends the complete response
//!   and RST_STREAM(NO_ERROR), which RFC 9113 §8.1 allows but clients such as curl 7.88 report as
//!   a transport error instead of the answer. So the rest of a refused body is read and discarded
//!   in the background, up to [`DRAIN_BYTES`] within [`DRAIN_TIME`]: a small upload then ends
//!   normally after the response, a larger one still gets the RFC's reset.

use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use http_body_util::BodyExt;
use hyper::body::{Body as _, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

/// The most of a refused body read and thrown away so the client sees the answer.
pub const DRAIN_BYTES: usize = 8 << 20;
/// How long a refused body is drained at most.
pub const DRAIN_TIME: Duration = Duration::from_secs(5);

/// What the middleware needs: the limits on request bodies.
#[derive(Clone, Copy, Debug)]
pub struct BodyGuard {
    pub idle: Duration,
    /// Bytes a second a body must average over each `idle` period it is read (0: no minimum).
    pub min_rate: u64,
}

/// The request body sent nothing for the guard's idle time, or too little.
#[derive(Debug, thiserror::Error)]
pub enum BodyStalled {
    #[error("the request body stalled: no data for {} s", .0.as_secs_f64())]
    Idle(Duration),
    #[error("the request body trickled: {bytes} bytes in {} s, below the minimum of {min_rate} bytes/s", .period.as_secs_f64())]
    TooSlow { bytes: u64, period: Duration, min_rate: u64 },
}

/// Middleware: wraps the request body in a [`Guarded`] one.
pub async fn guard_request_body(State(guard): State<BodyGuard>, req: Request, next: Next) -> Response {
    next.run(req.map(|inner| Body::new(Guarded::new(inner, guard)))).await
}

struct Guarded {
    inner: Body,
    guard: BodyGuard,
    /// When a frame last arrived. The timer is moved up to `last_frame + idle` only when it
    /// fires: resetting it on every frame (thousands per 100 MB body) cost the receive loop a
    /// trip through the timer wheel each.
    last_frame: Instant,
    /// The rate's period: when it began and the bytes since. The first begins when the handler
    /// first reads (a push waits for a slot before it does, with its client held by flow control).
    period_start: Option<Instant>,
    period_bytes: u64,
    deadline: Pin<Box<Sleep>>,
}

impl Guarded {
    fn new(inner: Body, guard: BodyGuard) -> Self {
        let now = Instant::now();
        let deadline = Box::pin(tokio::time::sleep_until(now + guard.idle));
        Self { inner, guard, last_frame: now, period_start: None, period_bytes: 0, deadline }
    }

    /// At a timer's firing: the error when the body stalled or trickled, else the next firing.
    fn check(&mut self, now: Instant) -> Result<Instant, BodyStalled> {
        let (idle, min_rate) = (self.guard.idle, self.guard.min_rate);
        if now >= self.last_frame + idle {
            return Err(BodyStalled::Idle(idle));
        }
        let start = *self.period_start.get_or_insert(now);
        if min_rate > 0 && now >= start + idle {
            let period = now - start;
            if (self.period_bytes as f64) < min_rate as f64 * period.as_secs_f64() {
                return Err(BodyStalled::TooSlow { bytes: self.period_bytes, period, min_rate });
            }
            (self.period_start, self.period_bytes) = (Some(now), 0);
        }
        let next_period =
            self.period_start.filter(|_| min_rate > 0).map_or(self.last_frame + idle, |s| s + idle);
        Ok((self.last_frame + idle).min(next_period))
    }
}

impl hyper::body::Body for Guarded {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        this.period_start.get_or_insert_with(Instant::now);
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            this.last_frame = Instant::now();
            if let Some(Ok(f)) = &frame {
                this.period_bytes += f.data_ref().map_or(0, |d| d.len() as u64);
            }
            return Poll::Ready(frame);
        }
        loop {
            ready!(this.deadline.as_mut().poll(cx));
            match this.check(Instant::now()) {
                Err(e) => return Poll::Ready(Some(Err(axum::Error::new(e)))),
                // Frames came since the timer was set: wait for the next check.
                Ok(next) => this.deadline.as_mut().reset(next),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        if self.inner.is_end_stream() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let rest = std::mem::take(&mut self.inner);
        runtime.spawn(drain(rest));
    }
}

/// Reads and discards what is left of a body, within the drain bounds.
async fn drain(mut rest: Body) {
    let mut read = 0usize;
    let until = Instant::now() + DRAIN_TIME;
    while read <= DRAIN_BYTES {
        match tokio::time::timeout_at(until, rest.frame()).await {
            Ok(Some(Ok(frame))) => read += frame.data_ref().map_or(0, Bytes::len),
            Ok(Some(Err(_)) | None) | Err(_) => return,
        }
    }
}

/// Whether a body read failed because the body stalled (axum wraps the error once per layer).
pub fn stalled(e: &axum::Error) -> Option<&BodyStalled> {
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        if let Some(s) = c.downcast_ref::<BodyStalled>() {
            return Some(s);
        }
        cause = c.source();
    }
    None
}
