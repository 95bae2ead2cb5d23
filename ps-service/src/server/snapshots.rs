//! Model snapshots at fixed update counts (`--snapshot-every N`): the PS's own model, written as
//! `snapshot-<version>.safetensors` with a line in `snapshots.jsonl` saying when, so that a
//! learning curve is the PS model's held-out error (`foresight-worker evaluate --snapshot-dir`)
//! at known update counts, not whichever worker's copy happened to be evaluated.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::AppState;
use crate::store::checkpoint::{self, CheckpointError};
use crate::store::{CheckpointData, Store};

/// Where and how often to write snapshots.
#[derive(Clone, Debug)]
pub struct SnapshotPolicy {
    pub dir: PathBuf,
    /// Updates (model versions) between snapshots; at least 1.
    pub every: u64,
}

/// One line of `snapshots.jsonl`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    /// The model version the file holds: the first version at or after a multiple of `every`
    /// the writer saw (a few updates may land between the multiple and the copy).
    pub version: u64,
    /// The PS's epoch when it was taken.
    pub epoch: f64,
    /// Unix time in milliseconds when it was taken.
    pub unix_ms: u64,
    /// The file's name in the snapshot directory.
    pub file: String,
}

/// The index file in a snapshot directory.
pub const SNAPSHOT_INDEX: &str = "snapshots.jsonl";

/// The version to snapshot next, after one was taken at `taken`: the next multiple of `every`.
pub fn next_target(taken: u64, every: u64) -> u64 {
    (taken / every + 1) * every
}

impl AppState {
    /// Writes a snapshot whenever the model reaches the next multiple of the policy's interval
    /// (and one of the model as first registered or restored), until the process ends. A failed
    /// write is logged and skipped: snapshots are for curves, never a reason to stop training.
    pub fn spawn_snapshotter(self: &Arc<Self>) {
        let Some(policy) = self.config.snapshots.clone() else {
            return;
        };
        let state = self.clone();
        let mut versions = self.version_tx.subscribe();
        tokio::spawn(async move {
            let mut next = 0;
            loop {
                if let Some(store) = state.store().cloned().filter(|s| s.version() >= next) {
                    let to = policy.clone();
                    let written = tokio::task::spawn_blocking(move || write_snapshot(&store, &to))
                        .await
                        .expect("snapshot task panicked");
                    match written {
                        Ok(record) => next = next_target(record.version, policy.every),
                        Err(e) => {
                            tracing::error!(error = %e, "snapshot failed");
                            next = next_target(next, policy.every);
                        }
                    }
                    continue;
                }
                if versions.changed().await.is_err() {
                    return;
                }
            }
        });
    }
}

/// Copies the model now, writes it, then appends its record (so a record always has its file).
fn write_snapshot(store: &Store, policy: &SnapshotPolicy) -> Result<SnapshotRecord, CheckpointError> {
    let snap = store.snapshot_now();
    let epoch = store.status().epoch;
    let unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let file = format!("snapshot-{:012}.safetensors", snap.version());
    let data = CheckpointData {
        version: snap.version(),
        epoch,
        params: snap.params().to_vec(),
        ..Default::default()
    };
    checkpoint::write_atomic(&policy.dir.join(&file), |f| {
        checkpoint::encode_to(f, store.layout(), store.hyper(), &data)
    })?;
    let record = SnapshotRecord { version: snap.version(), epoch, unix_ms, file };
    append_record(&policy.dir, &record)?;
    Ok(record)
}

fn append_record(dir: &Path, record: &SnapshotRecord) -> Result<(), CheckpointError> {
    let path = dir.join(SNAPSHOT_INDEX);
    let line = serde_json::to_string(record).expect("a record serializes");
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| writeln!(f, "{line}"))
        .map_err(|source| CheckpointError::Io { path, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_target_is_the_next_multiple() {
        assert_eq!(next_target(0, 100), 100);
        assert_eq!(next_target(99, 100), 100);
        assert_eq!(next_target(100, 100), 200);
        assert_eq!(next_target(103, 100), 200, "a late copy does not shift the grid");
        assert_eq!(next_target(5, 1), 6);
    }
}
