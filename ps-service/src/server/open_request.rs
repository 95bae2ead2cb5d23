//! A worker's request that stays open for long: a pull's long poll and its model-sized answer,
//! a push's wait for a slot and its upload. While one is open the worker is on the other end of
//! a live connection and is never marked silent ([`super::AppState::saw_open`]); the request's
//! end, answered or its connection gone (a stopped client is cut off by the HTTP/2 keep-alive,
//! a stalled upload by the body guard), counts as heard.

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
        Body::new(WhileSent { body, _open: self })
    }
}

impl Drop for OpenRequest {
    fn drop(&mut self) {
        self.state.presence.end_wait(self.worker);
    }
}

struct WhileSent {
    body: Body,
    _open: OpenRequest,
}

impl hyper::body::Body for WhileSent {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
