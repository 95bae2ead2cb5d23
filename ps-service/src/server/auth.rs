//! Bearer-token checks for `/v1/*`: the workers' token, and the control token that alone may
//! end or rescale the job (a worker's token is in every worker pod; the control token only in
//! the PS's and the operator's hands).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use ring::digest::{SHA256, digest};
use subtle::ConstantTimeEq;

use super::{ApiError, AppState};
use crate::wire::protocol::{reason, route};

/// Routes that need the control token when one is configured.
pub const CONTROL_ROUTES: [&str; 2] = [route::FINALIZE, route::WORKERS];

/// Whether `given` is `expected`, in time that depends on neither (both are hashed first, so
/// not even the expected token's length shows).
pub(super) fn same(given: &[u8], expected: Option<&String>) -> bool {
    expected.is_some_and(|e| {
        bool::from(digest(&SHA256, given).as_ref().ct_eq(digest(&SHA256, e.as_bytes()).as_ref()))
    })
}

/// The bearer token a request carries ("" without one).
pub(super) fn bearer(headers: &HeaderMap) -> &[u8] {
    headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("")
        .as_bytes()
}

pub async fn require_token(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let config = &state.config;
    let given = bearer(req.headers());
    let control = same(given, config.control_token.as_ref());
    let worker = config.token.is_none() || same(given, config.token.as_ref());
    let path = req.uri().path();
    let allowed = match &config.control_token {
        Some(_) if CONTROL_ROUTES.contains(&path) => control,
        _ => worker || control,
    };
    if allowed {
        return next.run(req).await;
    }
    if path == route::GRADIENTS {
        state.metrics.reject(reason::UNAUTHORIZED);
    }
    if worker {
        tracing::warn!(path, "refused a control call made with the workers' token");
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "this call needs the job's control token: a worker's token may not finalize or rescale the job",
        )
        .into_response();
    }
    tracing::warn!(path, "refused a request without a valid token");
    ApiError::unauthorized().into_response()
}
