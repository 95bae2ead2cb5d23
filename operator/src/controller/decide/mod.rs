//! Decide: pure functions of what was observed (no client, no I/O; the time is passed in). The
//! job's state machine and the classification of pods that cannot start or keep failing.

#[cfg(test)]
mod argocd_health;
pub mod status;
pub mod trouble;
