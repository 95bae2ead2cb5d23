//! Decide: pure functions of what was observed (no client, no I/O; the time is passed in). The
//! job's state machine and the classification of pods that cannot start or keep failing.

pub mod status;
pub mod trouble;
