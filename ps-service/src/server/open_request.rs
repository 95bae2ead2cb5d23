//! A worker's request that stays open for long: a pull's long poll and its model-sized answer,
//! a push's wait for a slot and its upload. While one is open the worker is on the other end of
//! a live connection and is never marked silent ([`super::AppState::saw_open`]); the request's
//! end, answered or its connection gone (a stopped client is cut off by the HTTP/2 keep-alive,
//! a stalled upload by the body guard), counts as heard.
//!
//! An answer's body is handed to HTTP/2 in pieces of at most [`PIECE`] bytes. hyper takes the
//! next piece only once the stream has room for it, so the request stays open until about one
//! piece and the peer's flow-control window are left to send. Handed over whole (a ready
//! snapshot, an encoded pull), a model-sized body was buffered at once and the request counted
//! as ended while the worker was still downloading it for minutes.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use hyper::body::{Frame, SizeHint};

use super::AppState;

/// Held for as long as the request is open.
pub(crate) struct OpenRequest {
    state: Arc<AppState>,
    worker: usize,
}

impl OpenRequest {
    pub(super) fn begin(state: Arc<AppState>, worker: usize) -> Self {
        state.presence.begin_wait(worker);
        Self { state, worker }
    }

    /// The answer's body, holding the request open until it is sent or dropped.
    pub(crate) fn until_sent(self, body: Body) -> Body {
        Body::new(WhileSent { body, rest: Bytes::new(), _open: self })
    }
}

impl Drop for OpenRequest {
    fn drop(&mut self) {
        self.state.presence.end_wait(self.worker);
    }
}

/// The largest piece of an answer handed to HTTP/2 at once.
const PIECE: usize = 1 << 20;

struct WhileSent {
    body: Body,
    /// What is left of the inner body's last data frame, not handed over yet.
    rest: Bytes,
    _open: OpenRequest,
}

impl WhileSent {
    /// The next piece of `rest` (the pieces share its memory).
    fn next_piece(&mut self) -> Frame<Bytes> {
        let n = self.rest.len().min(PIECE);
        Frame::data(self.rest.split_to(n))
    }
}

impl hyper::body::Body for WhileSent {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        if self.rest.is_empty() {
            match std::task::ready!(Pin::new(&mut self.body).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => self.rest = data,
                    Err(trailers) => return Poll::Ready(Some(Ok(trailers))),
                },
                other => return Poll::Ready(other),
            }
        }
        Poll::Ready(Some(Ok(self.next_piece())))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.body.size_hint();
        let rest = self.rest.len() as u64;
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower() + rest);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + rest);
        }
        hint
    }
}
