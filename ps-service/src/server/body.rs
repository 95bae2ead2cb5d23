//! Reading request bodies under a size limit into reused buffers.
//!
//! Gradients are tens to hundreds of MB; a fresh buffer per push page-faults on every page.
//! Buffers go back to a small pool when a request is done.

use axum::body::Body;
use axum::http::HeaderMap;
use http_body_util::BodyExt;
use parking_lot::Mutex;

use super::error::ApiError;

/// A bounded stack of reusable vectors.
pub struct Pool<T> {
    items: Mutex<Vec<Vec<T>>>,
    cap: usize,
}

impl<T> Pool<T> {
    pub fn new(cap: usize) -> Self {
        Self { items: Mutex::new(Vec::new()), cap }
    }

    pub fn take(&self) -> Vec<T> {
        self.items.lock().pop().unwrap_or_default()
    }

    pub fn give(&self, mut v: Vec<T>) {
        v.clear();
        let mut items = self.items.lock();
        if items.len() < self.cap {
            items.push(v);
        }
    }
}

/// Collects `body` into `buf`, refusing it as soon as it exceeds `limit` bytes.
pub async fn read_limited(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    buf: &mut Vec<u8>,
) -> Result<(), ApiError> {
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if let Some(n) = declared {
        if n > limit {
            return Err(ApiError::too_large(limit));
        }
        buf.reserve(n);
    }
    let mut body = body;
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|e| ApiError::bad_request(format!("failed to read the request body: {e}")))?;
        if let Ok(chunk) = frame.into_data() {
            if buf.len() + chunk.len() > limit {
                return Err(ApiError::too_large(limit));
            }
            buf.extend_from_slice(&chunk);
        }
    }
    Ok(())
}
