//! The operator's own metrics (`/metrics`, `/healthz`, `/readyz`) and its count of API calls.

pub mod api_calls;
pub mod metrics;
