//! Bearer-token check for `/v1/*`, in constant time.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use super::{ApiError, AppState};

pub async fn require_token(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let Some(expected) = &state.config.token else {
        return next.run(req).await;
    };
    let given = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    // ct_eq on slices of different lengths is false without looking at the contents.
    if bool::from(given.as_bytes().ct_eq(expected.as_bytes())) {
        return next.run(req).await;
    }
    if req.uri().path() == "/v1/gradients" {
        state.metrics.reject("unauthorized");
    }
    tracing::warn!(path = req.uri().path(), "refused a request without a valid token");
    ApiError::unauthorized().into_response()
}
