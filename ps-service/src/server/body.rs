//! Reading request bodies under a size limit into reused buffers.
//!
//! Gradients are tens to hundreds of MB; a fresh buffer per push page-faults on every page.
//! Buffers go back to a small pool when a request is done.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode};
use http_body_util::BodyExt;
use parking_lot::Mutex;

use super::error::ApiError;
use super::guarded_body::stalled;
use crate::wire;
use crate::wire::in_place::{Expected, InPlace};

/// A bounded stack of reusable vectors.
pub struct Pool<T> {
    items: Mutex<Vec<Vec<T>>>,
    cap: usize,
}

impl<T> Pool<T> {
    pub fn new(cap: usize) -> Self {
        Self { items: Mutex::new(Vec::new()), cap }
    }

    /// An empty vector, with the capacity of an earlier one where the pool has one.
    pub fn take(&self) -> Vec<T> {
        let mut v = self.items.lock().pop().unwrap_or_default();
        v.clear();
        v
    }

    /// A vector as it was given back, for a caller that sizes it and overwrites every element
    /// itself (a bf16 pull body of the length of the one before it is not cleared first).
    pub fn take_as_is(&self) -> Vec<T> {
        self.items.lock().pop().unwrap_or_default()
    }

    /// A vector of exactly `n` elements for a caller that writes every element before it reads
    /// any (a gradient body is refused unless it covers every tensor): a recycled one of that
    /// length keeps its old contents, so a model-sized buffer is not zero-filled on every push.
    pub fn take_len(&self, n: usize) -> Vec<T>
    where
        T: Clone + Default,
    {
        let mut v = self.items.lock().pop().unwrap_or_default();
        if v.len() != n {
            v.clear();
            v.resize(n, T::default());
        }
        v
    }

    pub fn give(&self, v: Vec<T>) {
        let mut items = self.items.lock();
        if items.len() < self.cap {
            items.push(v);
        }
    }
}

/// A pooled buffer lent out as a response body ([`bytes::Bytes::from_owner`]): back in its pool
/// once hyper has sent (or dropped) the response. A pull encoded per request (bf16, int8) then
/// writes into pages that are already mapped instead of faulting in a fresh body-sized buffer.
pub fn lend(pool: &Arc<Pool<u8>>, buf: Vec<u8>) -> bytes::Bytes {
    bytes::Bytes::from_owner(Lent { buf, pool: pool.clone() })
}

struct Lent {
    buf: Vec<u8>,
    pool: Arc<Pool<u8>>,
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.pool.give(std::mem::take(&mut self.buf));
    }
}

/// A failed body read: a stalled upload is a 408 (the client may retry), anything else a 400.
fn body_error(e: axum::Error) -> ApiError {
    match stalled(&e) {
        Some(s) => ApiError::new(StatusCode::REQUEST_TIMEOUT, "body_stalled", s.to_string()),
        None => ApiError::bad_request(format!("failed to read the request body: {e}")),
    }
}

/// The body's declared length, refused at once when over `limit`.
fn declared_length(headers: &HeaderMap, limit: usize) -> Result<Option<usize>, ApiError> {
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    match declared {
        Some(n) if n > limit => Err(ApiError::too_large(limit)),
        d => Ok(d),
    }
}

/// Collects `body` into `buf`, refusing it as soon as it exceeds `limit` bytes.
pub async fn read_limited(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    buf: &mut Vec<u8>,
) -> Result<(), ApiError> {
    if let Some(n) = declared_length(headers, limit)? {
        buf.reserve(n);
    }
    let mut body = body;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(body_error)?;
        if let Ok(chunk) = frame.into_data() {
            if buf.len() + chunk.len() > limit {
                return Err(ApiError::too_large(limit));
            }
            buf.extend_from_slice(&chunk);
        }
    }
    Ok(())
}

/// How a gradient body arrived.
pub enum Gradient {
    /// The body was the layout's own encoding in F32, BF16 or F16; its values, widened to f32,
    /// are in the gradient buffer and
    /// `first_unusable` is the flat index of the first element that is not
    /// [`wire::usable_gradient`] (NaN, ±Inf, beyond ±1e12), if any.
    Direct { first_unusable: Option<usize> },
    /// Anything else (int8, other tensor order, metadata…): the whole body is in `buf` for the
    /// decoder.
    Collected,
}

/// Reads a push body. When it starts with one of the `expected` headers — the layout's own, in
/// F32, BF16 or F16, which is what Foresight's client sends — the tensor values are widened into
/// `grad` and checked as they arrive ([`wire::in_place`]), so decoding overlaps the transfer
/// instead of following it. Otherwise the body is collected into `buf`. Either way nothing is
/// applied until the caller has the whole body.
pub async fn read_gradient(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    expected: &[Expected<'_>],
    grad: &mut [f32],
    buf: &mut Vec<u8>,
) -> Result<(Gradient, usize), ApiError> {
    declared_length(headers, limit)?;
    let mut reader = InPlace::new(expected, grad, buf);
    let (mut total, mut bad) = (0usize, None);
    let mut body = body;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(body_error)?;
        let Ok(chunk) = frame.into_data() else { continue };
        total += chunk.len();
        if total > limit {
            return Err(ApiError::too_large(limit));
        }
        let found = reader.feed_checked(&chunk, wire::first_unusable);
        bad = bad.or(found);
    }
    let how = if reader.finish() { Gradient::Direct { first_unusable: bad } } else { Gradient::Collected };
    Ok((how, total))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::{Gradient, Pool, read_gradient};
    use crate::wire::{self, Layout, TensorSpec, WireDtype, in_place::Expected};

    #[tokio::test]
    async fn a_gradient_in_the_layouts_f32_bf16_or_f16_encoding_lands_in_place_and_int8_is_collected() {
        let spec = |name: &str, shape: Vec<usize>| TensorSpec { name: name.into(), shape };
        let l = Layout::new(vec![spec("w", vec![40, 30]), spec("b", vec![30])]).unwrap();
        let values: Vec<f32> = (0..l.len()).map(|i| (i % 64) as f32 * 0.125 - 4.0).collect();
        let heads = [WireDtype::F32, WireDtype::Bf16, WireDtype::F16]
            .map(|d| (wire::header(&l, d, &BTreeMap::new()), d));
        let expected = heads.each_ref().map(|(h, d)| Expected { header: h, dtype: *d });
        let mut f16 = heads[2].0.clone();
        f16.extend(values.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()));
        let bodies = [
            ("f32", wire::encode_f32(&l, &values, &BTreeMap::new()), true),
            ("bf16", wire::encode_bf16(&l, &values), true),
            ("f16", f16, true),
            ("int8", wire::int8::encode(&l, &mut values.clone()), false),
        ];
        for (what, body, in_place) in bodies {
            let n = body.len();
            let (mut grad, mut buf) = (vec![0f32; l.len()], Vec::new());
            let headers = axum::http::HeaderMap::new();
            let read = read_gradient(&headers, body.into(), 1 << 20, &expected, &mut grad, &mut buf).await;
            let (how, total) = read.unwrap();
            assert_eq!(total, n, "{what}");
            match how {
                Gradient::Direct { first_unusable } => {
                    assert!(in_place, "{what} was read in place");
                    assert_eq!((first_unusable, &grad), (None, &values), "{what}");
                    assert!(buf.is_empty(), "{what}: nothing collected");
                }
                Gradient::Collected => assert!(!in_place && buf.len() == n, "{what} was collected"),
            }
        }
    }

    #[test]
    fn a_lent_body_comes_back_to_its_pool_when_its_last_holder_drops_it() {
        let pool = std::sync::Arc::new(Pool::<u8>::new(2));
        let mut buf = pool.take();
        buf.extend_from_slice(&[1, 2, 3]);
        let at = buf.as_ptr();
        let body = super::lend(&pool, buf);
        let part = body.slice(1..);
        drop(body);
        assert_eq!(&part[..], [2, 3]);
        assert_eq!(pool.items.lock().len(), 0, "still held by a slice of the body");
        drop(part);
        let back = pool.take();
        assert_eq!((back.as_ptr(), back.len(), back.capacity() >= 3), (at, 0, true));
    }

    #[test]
    fn buffers_come_back_without_a_fill_only_at_the_length_asked() {
        let pool = Pool::new(1);
        let mut v = pool.take_len(4);
        assert_eq!(v, [0.0f32; 4]);
        v.copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
        let at = v.as_ptr();
        pool.give(v);
        // The same allocation, as it was: its user overwrites every element.
        let v = pool.take_len(4);
        assert_eq!((v.as_ptr(), &v[..]), (at, &[1.0, 2.0, 3.0, 4.0][..]));
        pool.give(v);
        // Another length: nothing of the old contents.
        assert_eq!(pool.take_len(6), [0.0f32; 6]);
        pool.give(vec![9.0f32; 3]);
        assert!(pool.take().is_empty(), "take hands out an empty vector");
    }
}
