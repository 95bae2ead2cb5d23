//! Every request body is guarded twice, whatever the handler does with it:
//!
//! - **Stalled uploads end.** A body that sends nothing for [`BodyGuard::idle`] ends with
//!   [`BodyStalled`], so a worker paused mid-push (or a slowloris client) does not pin a
//!   model-sized buffer forever: the handler answers 408 and its buffer goes back to the pool.
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

/// What the middleware needs: the idle limit for request bodies.
#[derive(Clone, Copy, Debug)]
pub struct BodyGuard {
    pub idle: Duration,
}

/// The request body sent nothing for the guard's idle time.
#[derive(Debug, thiserror::Error)]
#[error("the request body stalled: no data for {} s", .0.as_secs_f64())]
pub struct BodyStalled(pub Duration);

/// Middleware: wraps the request body in a [`Guarded`] one.
pub async fn guard_request_body(State(guard): State<BodyGuard>, req: Request, next: Next) -> Response {
    next.run(req.map(|inner| Body::new(Guarded::new(inner, guard.idle)))).await
}

struct Guarded {
    inner: Body,
    idle: Duration,
    /// When a frame last arrived. The timer is moved up to `last_frame + idle` only when it
    /// fires: resetting it on every frame (thousands per 100 MB body) cost the receive loop a
    /// trip through the timer wheel each.
    last_frame: Instant,
    deadline: Pin<Box<Sleep>>,
}

impl Guarded {
    fn new(inner: Body, idle: Duration) -> Self {
        let now = Instant::now();
        Self { inner, idle, last_frame: now, deadline: Box::pin(tokio::time::sleep_until(now + idle)) }
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
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            this.last_frame = Instant::now();
            return Poll::Ready(frame);
        }
        loop {
            ready!(this.deadline.as_mut().poll(cx));
            let due = this.last_frame + this.idle;
            if Instant::now() >= due {
                return Poll::Ready(Some(Err(axum::Error::new(BodyStalled(this.idle)))));
            }
            // Frames came since the timer was set: wait out the rest of the idle time.
            this.deadline.as_mut().reset(due);
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
