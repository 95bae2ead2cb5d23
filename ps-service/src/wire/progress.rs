//! What a worker prints on stdout, one JSON object per line (`{"event": "progress", ...}`), for
//! whoever runs it: `foresight run` reads these lines for its progress bar and summary.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum WorkerEvent {
    /// Every few steps: the last local batch's loss and the worker's throughput.
    Progress {
        worker: usize,
        epoch: f64,
        step: u64,
        loss: f64,
        samples_per_second: f64,
        staleness: Option<u64>,
    },
    /// At the end of each epoch: held-out loss and accuracy of the worker's current model.
    Eval { worker: usize, epoch: usize, loss: f64, accuracy: f64 },
    /// At the end: the PS's final model evaluated on the held-out set.
    Done {
        worker: usize,
        steps: u64,
        pushes: u64,
        discarded: u64,
        /// Absent when the worker did not evaluate it (a Python worker's `finish()` without
        /// `evaluate`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        test_loss: Option<f64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        test_accuracy: Option<f64>,
        seconds: f64,
    },
}
