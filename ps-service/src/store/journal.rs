//! The update journal's entries: what the store did with every contribution, in model order.
//!
//! The store hands each entry to a [`JournalSink`] as it decides it (under the lock that orders
//! it), so the entries of updates come in version order. Writing them down is the server's
//! business (`crate::journal`); this module has no I/O.

use serde::{Deserialize, Serialize};

use super::BackupAs;

fn is_f32(b: &BackupAs) -> bool {
    *b == BackupAs::F32
}

/// Receives each entry and, for the entries a replay needs it for, the gradient (or model) the
/// entry applied: `Applied` and `Contributed` give the decoded f32 gradient, `Reseeded` the
/// worker's copy it installed.
pub type JournalSink = Box<dyn Fn(Entry, Option<&[f32]>) + Send + Sync>;

/// How a push arrived on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct BodyInfo {
    /// Bytes of the body as received.
    pub bytes: u64,
    /// Bytes per parameter (4: f32, about 2: bf16/f16, about 1: int8).
    pub bytes_per_param: f32,
}

/// How a parameter-server process got its model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Start {
    /// Built by the PS from its initial values or registered by a worker: the journal's origin.
    Registered,
    /// Restored from its newest checkpoint: every update past that version was lost.
    Restored,
    /// Seeded from a worker's copy (the PS had lost its state).
    Seeded,
}

/// One decision of the store.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Entry {
    /// A process took the model at `version`.
    Started { version: u64, how: Start },
    /// An asynchronous rule applied a gradient, making model `version`.
    Applied {
        version: u64,
        worker: usize,
        generation: Option<u64>,
        seq: u64,
        /// The model version the gradient was computed on (the backup of the delay-compensated
        /// rules).
        computed_on: u64,
        staleness: u64,
        /// The learning rate η of this update.
        lr: f32,
        /// dc-asgd-a's MeanSquare count t (bias correction).
        mean_square_step: u64,
        /// The delayed momentum stepped with this update (`momentumDelay` > 1).
        momentum_step: bool,
        /// How the worker received the model it computed on (the delay-compensated rules'
        /// backup is the model rounded to bf16 when it pulled bf16); absent: f32.
        #[serde(default, skip_serializing_if = "is_f32")]
        backup_as: BackupAs,
        epoch: Option<f64>,
        body: Option<BodyInfo>,
        /// Offset of the gradient in the payload file, when payloads are captured.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        payload: Option<u64>,
    },
    /// A `sync` contribution joined the round for model `round`.
    Contributed {
        round: u64,
        worker: usize,
        generation: Option<u64>,
        seq: u64,
        epoch: Option<f64>,
        body: Option<BodyInfo>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        payload: Option<u64>,
    },
    /// A `sync` round was applied, making model `version` from the contributions of `workers`
    /// (by index; they were summed in the order of their `Contributed` entries).
    Round {
        version: u64,
        workers: Vec<usize>,
        lr: f32,
        momentum_step: bool,
        /// Fewer contributions than workers still training (timeout, silence).
        short: bool,
        /// What the round's sum was divided by (`Combine::Mean`): its whole size, M − b, when
        /// it closed with fewer ([`crate::optimizer::mean_over`]). Absent in journals written
        /// before it was recorded, which divided by the contributions.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mean_over: Option<usize>,
    },
    /// A push refused: nothing changed.
    Refused {
        worker: usize,
        generation: Option<u64>,
        seq: u64,
        computed_on: u64,
        /// The model version when it was refused.
        at_version: u64,
        reason: String,
    },
    /// Nothing was heard from `worker` for the silence timeout (`silent`), or it was heard
    /// again: `sync` rounds stop or start waiting for it.
    Silence { worker: usize, silent: bool },
    /// The writer could not write `entries` entries (a full disk): they are missing before this.
    Gap { entries: u64 },
    /// A worker's copy of version `version` replaced the model.
    Reseeded {
        version: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        payload: Option<u64>,
    },
}

impl Entry {
    /// The model version this entry leaves the model at, for the entries that set one.
    pub fn version_after(&self) -> Option<u64> {
        match self {
            Self::Started { version, .. }
            | Self::Applied { version, .. }
            | Self::Round { version, .. }
            | Self::Reseeded { version, .. } => Some(*version),
            Self::Contributed { .. } | Self::Refused { .. } | Self::Silence { .. } | Self::Gap { .. } => None,
        }
    }

    /// Where its payload lies, once written.
    pub fn payload_mut(&mut self) -> Option<&mut Option<u64>> {
        match self {
            Self::Applied { payload, .. }
            | Self::Contributed { payload, .. }
            | Self::Reseeded { payload, .. } => Some(payload),
            _ => None,
        }
    }

    /// The worker whose push this entry is about.
    pub fn worker(&self) -> Option<usize> {
        match self {
            Self::Applied { worker, .. }
            | Self::Contributed { worker, .. }
            | Self::Refused { worker, .. }
            | Self::Silence { worker, .. } => Some(*worker),
            _ => None,
        }
    }
}
