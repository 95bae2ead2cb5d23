//! Reading request bodies under a size limit into reused buffers.
//!
//! Gradients are tens to hundreds of MB; a fresh buffer per push page-faults on every page.
//! Buffers go back to a small pool ([`crate::pool`]) when a request is done.

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode};
use http_body_util::BodyExt;

use super::error::ApiError;
use super::guarded_body::{BodyStalled, stalled};
use crate::wire;
use crate::wire::in_place::{Expected, InPlace};
use crate::wire::protocol::reason;

/// A failed body read: a stalled upload is a 408 (the client may retry), anything else a 400.
fn body_error(e: axum::Error) -> ApiError {
    match stalled(&e) {
        Some(s @ BodyStalled::Idle(_)) => {
            ApiError::new(StatusCode::REQUEST_TIMEOUT, reason::BODY_STALLED, s.to_string())
        }
        Some(s @ BodyStalled::TooSlow { .. }) => {
            ApiError::new(StatusCode::REQUEST_TIMEOUT, reason::BODY_TOO_SLOW, s.to_string())
        }
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
    /// are in the gradient buffer and `first_unusable` is the flat index of the first element
    /// that is not [`wire::usable_gradient`] (NaN, ±Inf, beyond ±1e12), if any.
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

    use super::{Gradient, read_gradient};
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
}
