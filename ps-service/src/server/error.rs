//! One error type for every refused request, rendered as `{"error": ..., "reason": ...}`.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::store::StoreError;
use crate::wire::WireError;
use crate::wire::protocol::reason;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    /// A bounded label: the JSON `reason` and the metrics' `reason`.
    pub reason: &'static str,
    pub message: String,
    /// Seconds, sent as `Retry-After` (overload refusals).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, reason: &'static str, message: impl Into<String>) -> Self {
        Self { status, reason, message: message.into(), retry_after: None }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub fn unauthorized() -> Self {
        Self::new(StatusCode::UNAUTHORIZED, reason::UNAUTHORIZED, "missing or invalid bearer token")
    }

    pub fn not_registered() -> Self {
        Self::new(
            StatusCode::CONFLICT,
            reason::NOT_REGISTERED,
            "no model is registered yet: the first worker registers it with PUT /v1/model",
        )
    }

    /// The PS lost its model and holds for the workers' copies; this worker has not offered
    /// its own yet. Same reason as before any registration: the worker's answer is the same.
    pub fn lost_model() -> Self {
        Self::new(
            StatusCode::CONFLICT,
            reason::NOT_REGISTERED,
            "the parameter server lost its model: offer your copy with PUT /v1/model?version=V&worker=M, then join",
        )
    }

    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("request body exceeds the limit of {limit} bytes"),
        )
    }
}

impl From<WireError> for ApiError {
    fn from(e: WireError) -> Self {
        let status = match e {
            WireError::Malformed(_) => StatusCode::BAD_REQUEST,
            _ => StatusCode::UNPROCESSABLE_ENTITY,
        };
        Self::new(status, e.reason(), e.to_string())
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        let status = match e {
            StoreError::UnknownWorker { .. } | StoreError::FutureVersion { .. } => StatusCode::BAD_REQUEST,
            _ => StatusCode::CONFLICT,
        };
        Self::new(status, e.reason(), e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": self.message, "reason": self.reason });
        let mut response = (self.status, Json(body)).into_response();
        if let Some(seconds) = self.retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}
