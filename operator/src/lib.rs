//! Foresight's operator crate: the `TrainingJob` resource (`api`) and `foresight run` (`local`).
//! The Kubernetes controller arrives with the operator issue.

pub mod api;
pub mod local;
