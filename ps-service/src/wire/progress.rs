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
        /// Where the worker's time went, from its first step to its last (absent from workers
        /// that do not measure it; the Python package's counts its script's own time between
        /// steps, data loading included, as `compute`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        phases: Option<PhaseSeconds>,
        /// This worker's leave was the job's last: the PS wrote the final model, with this
        /// worker's buffers, and `test_*` are the evaluation of exactly that model. Another
        /// worker that finished earlier pulled a model others were still training.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        last: bool,
    },
}

/// Where a worker's training time went, in seconds summed over its steps. The phases follow one
/// another and cover the whole loop, so their sum is the training's wall time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PhaseSeconds {
    /// Drawing the next batch from the data set and moving it to the device.
    pub batch: f64,
    /// Pulling the model when a pull was due: the request, the transfer and the decode.
    pub pull: f64,
    /// Copying the pulled model into the framework's parameters.
    pub load: f64,
    /// Forward and backward (and, with local steps, the inner optimizer's step).
    pub compute: f64,
    /// Copying the gradient (or pseudo-gradient) out of the framework into the push buffer.
    pub gather: f64,
    /// Ending the step: when due, the push (encode, request, transfer; under `sync`, the wait
    /// for the round).
    pub push: f64,
    /// Progress reports to the PS every few steps.
    pub report: f64,
    /// The held-out evaluation after each epoch.
    pub evaluate: f64,
    /// A straggler's sleep (`--slowdown`, for experiments).
    pub slowdown: f64,
}
