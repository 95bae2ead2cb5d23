//! Foresight's operator crate: the `TrainingJob` resource (`api`), its Kubernetes controller
//! (`controller`, run by `foresight operator`) and `foresight run` (`local`).

pub mod api;
pub mod controller;
pub mod local;
