//! `POST /v1/gradients` through the PS's real router (`server::router`): the body streamed in
//! frames of the length the second byte gives (0: one frame), against a model of the layout the
//! first byte picks, registered with `PUT /v1/model` on a fresh PS. This reaches the streaming
//! reader (`server/body.rs` `read_gradient`: its direct path, which decodes the layout's own F32
//! encoding as it arrives, and its hand-over to `wire::decode_gradient`).
//!
//! Checked: never a 5xx or a panic; the PS accepts the body exactly when `wire::decode_gradient`
//! does; and the answer (status and reason) does not depend on how the body was framed.
#![no_main]

use std::sync::LazyLock;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use bytes::Bytes;
use foresight_fuzz::{gradient_seeds, pick_layout, values, write_seeds_if_asked};
use foresight_ps::optimizer::{Algorithm, Hyper};
use foresight_ps::server::{AppState, PsConfig, router};
use foresight_ps::wire::{self, Layout};
use libfuzzer_sys::fuzz_target;
use tower::ServiceExt;

static RT: LazyLock<tokio::runtime::Runtime> =
    LazyLock::new(|| tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime"));

/// (status, reason) of a push of `body` in frames of `frame` bytes (0: one) to a fresh PS.
async fn push(layout: &Layout, body: &[u8], frame: usize) -> (StatusCode, String) {
    let state = AppState::new(PsConfig::new(Hyper::new(Algorithm::DcAsgdA, 0.1), 2)).expect("a PS");
    let app = router(state);
    let model = wire::encode_f32(layout, &values(layout.len(), 5), &Default::default());
    let put = Request::put("/v1/model").body(Body::from(model)).expect("request");
    let status = app.clone().oneshot(put).await.expect("infallible").status();
    assert!(status.is_success(), "registering the model: {status}");
    let frames: Vec<Result<Bytes, std::io::Error>> = if frame == 0 {
        vec![Ok(Bytes::copy_from_slice(body))]
    } else {
        body.chunks(frame).map(|c| Ok(Bytes::copy_from_slice(c))).collect()
    };
    let req = Request::post("/v1/gradients?worker=0&version=0&seq=1")
        .body(Body::from_stream(futures_util::stream::iter(frames)))
        .expect("request");
    let resp = app.oneshot(req).await.expect("infallible");
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.expect("the answer");
    let json: serde_json::Value = serde_json::from_slice(&bytes).expect("a JSON answer");
    let reason = json.get("reason").and_then(|r| r.as_str()).unwrap_or("").to_string();
    (status, reason)
}

fuzz_target!(init: write_seeds_if_asked(|| {
    // Each gradient seed framed three ways: one frame, 1-byte frames, 13-byte frames.
    let seeds = gradient_seeds();
    seeds.iter().flat_map(|s| [0u8, 1, 13].map(|f| [&s[..1], &[f][..], &s[1..]].concat())).collect()
}), |data: &[u8]| {
    let Some((_, layout, rest)) = pick_layout(data) else { return };
    let Some((&frame, body)) = rest.split_first() else { return };
    let frame = frame as usize;
    let (framed, single) = RT.block_on(async {
        let framed = push(layout, body, frame).await;
        // One frame either way: the same request, no second PS needed.
        let single = if frame == 0 || frame >= body.len() { framed.clone() } else { push(layout, body, 0).await };
        (framed, single)
    });
    assert!(!framed.0.is_server_error(), "{framed:?}");
    assert_eq!(framed, single, "the answer depends on the framing");
    let mut g = vec![0.0f32; layout.len()];
    let decoded = wire::decode_gradient(body, layout, &mut g);
    assert_eq!(framed.0.is_success(), decoded.is_ok(), "PS {framed:?}, decoder {decoded:?}");
    if let Err(e) = decoded {
        let refused = [StatusCode::BAD_REQUEST, StatusCode::UNPROCESSABLE_ENTITY];
        assert!(refused.contains(&framed.0), "{framed:?} for {e}");
    }
});
