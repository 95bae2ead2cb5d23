//! `foresight replay`: every update of a captured journal applied again from its initial model,
//! compared bit for bit with the newest checkpoint the PS wrote.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::{INITIAL_FILE, JournalError, PAYLOADS_FILE, read};
use crate::optimizer::{Hyper, Step, accumulate};
use crate::store::checkpoint::{self, CheckpointData, CheckpointDir};
use crate::store::journal::{Entry, Start};
use crate::store::{MAX_WORKERS, Store};
use crate::wire::Layout;

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error("{0}: {1}")]
    File(PathBuf, String),
    #[error(
        "the journal in {0} holds no payloads: replay needs a PS run with --journal capture (FORESIGHT_JOURNAL=capture)"
    )]
    NotCaptured(PathBuf),
    #[error("journal line {line}: {why}")]
    Broken { line: usize, why: String },
}

/// What a replay found.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Replayed {
    /// Updates applied (asynchronous updates and `sync` rounds).
    pub updates: u64,
    /// The model version the replay ended at.
    pub version: u64,
    /// Updates a PS process applied and lost when it restarted from an older checkpoint.
    pub lost: u64,
    /// The newest checkpoint's version, if there is one.
    pub checkpoint_version: Option<u64>,
    /// The first parameter (or optimizer state) that differs from the checkpoint's:
    /// `None` when every bit agrees.
    pub first_difference: Option<String>,
}

impl Replayed {
    /// The replay reached the checkpoint's version and agrees with it bit for bit.
    pub fn reproduces(&self) -> bool {
        self.checkpoint_version == Some(self.version) && self.first_difference.is_none()
    }
}

/// Replays the journal in `dir` (a PS shard's checkpoint directory).
pub fn replay(dir: &Path) -> Result<Replayed, ReplayError> {
    let initial = dir.join(INITIAL_FILE);
    let bytes = std::fs::read(&initial).map_err(|_| ReplayError::NotCaptured(dir.to_path_buf()))?;
    let (layout, data, hyper) =
        checkpoint::decode(&bytes).map_err(|why| ReplayError::File(initial.clone(), why))?;
    let mut lines = read(dir)?;
    // An earlier run in the same directory: the replay begins at the last registration, where
    // the initial model was written.
    let origin = lines.iter().rposition(|l| matches!(l.entry, Entry::Started { how: Start::Registered, .. }));
    lines.drain(..origin.unwrap_or(0));
    let payloads = Payloads::open(&dir.join(PAYLOADS_FILE), layout.len());
    let mut replay = Replaying::new(layout, hyper, data, &lines.iter().map(|l| &l.entry).collect::<Vec<_>>());
    for (i, line) in lines.iter().enumerate() {
        replay.step(&line.entry, &payloads).map_err(|why| ReplayError::Broken { line: i + 1, why })?;
    }
    let newest = CheckpointDir::new(dir, usize::MAX)
        .and_then(|d| d.load_newest())
        .map_err(|e| ReplayError::File(dir.to_path_buf(), e.to_string()))?;
    let at = replay.store.checkpoint();
    let first_difference = match &newest {
        Some((_, layout, saved, _)) if saved.version == at.version => first_difference(layout, saved, &at),
        Some(_) => Some("the journal and the checkpoint end at different versions".into()),
        None => None,
    };
    Ok(Replayed {
        updates: replay.updates,
        version: at.version,
        lost: replay.lost,
        checkpoint_version: newest.map(|(_, _, d, _)| d.version),
        first_difference,
    })
}

/// The model, rebuilt entry by entry.
struct Replaying {
    layout: Layout,
    hyper: Hyper,
    store: Store,
    /// Model versions a later entry needs (the delay-compensated rules' backups), with the
    /// number of entries still to use each.
    wanted: HashMap<u64, usize>,
    kept: HashMap<u64, Vec<f32>>,
    /// The states restarts went back to, kept when the replay passed them.
    restore_points: HashMap<u64, Option<CheckpointData>>,
    round: (Vec<f32>, usize),
    updates: u64,
    lost: u64,
}

impl Replaying {
    fn new(layout: Layout, hyper: Hyper, data: CheckpointData, entries: &[&Entry]) -> Self {
        let mut wanted = HashMap::new();
        let mut restore_points = HashMap::new();
        for e in entries {
            match e {
                Entry::Applied { computed_on, .. } if hyper.algorithm.is_delay_compensated() => {
                    *wanted.entry(*computed_on).or_insert(0) += 1;
                }
                Entry::Started { version, how: Start::Restored } => {
                    restore_points.insert(*version, None);
                }
                _ => {}
            }
        }
        let n = layout.len();
        let store = Store::restore(layout.clone(), data, hyper.clone(), MAX_WORKERS);
        let mut replay = Self {
            layout,
            hyper,
            store,
            wanted,
            kept: HashMap::new(),
            restore_points,
            round: (vec![0.0; n], 0),
            updates: 0,
            lost: 0,
        };
        replay.keep_if_wanted();
        replay
    }

    fn step(&mut self, entry: &Entry, payloads: &Payloads) -> Result<(), String> {
        let version = self.store.version();
        match entry {
            Entry::Started { version: v, how: Start::Restored } => self.restart(*v)?,
            Entry::Started { version: v, how: Start::Registered } if *v != version => {
                return Err(format!("a process registered version {v} while the replay is at {version}"));
            }
            Entry::Started { .. } | Entry::Refused { .. } | Entry::Silence { .. } => {}
            Entry::Gap { entries } => {
                return Err(format!(
                    "{entries} entries are missing here (the disk was full): no replay past them"
                ));
            }
            Entry::Applied { version: v, computed_on, lr, mean_square_step, backup_as, payload, .. } => {
                let grad = payloads.read(*payload)?;
                let backup = if self.hyper.algorithm.is_delay_compensated() {
                    Some(self.backup(*computed_on)?)
                } else {
                    None
                };
                let step = Step::at(*lr, *mean_square_step);
                let backup = backup.as_deref().map(|b| (b, *backup_as));
                self.store.apply_recorded(*v, step, &grad, backup).map_err(|at| gap(*v, at))?;
                self.updates += 1;
            }
            Entry::Contributed { round, payload, .. } => {
                if *round != version {
                    return Err(format!("a contribution to round {round} while the model is at {version}"));
                }
                accumulate(&mut self.round.0, &payloads.read(*payload)?);
                self.round.1 += 1;
            }
            Entry::Round { version: v, lr, mean_over, .. } => {
                let (sum, count) = &mut self.round;
                let mean_over = mean_over.unwrap_or(*count);
                self.store.apply_recorded_round(*v, *lr, sum, mean_over).map_err(|at| gap(*v, at))?;
                sum.fill(0.0);
                *count = 0;
                self.updates += 1;
            }
            Entry::Reseeded { version: v, payload } => {
                let values = payloads.read(*payload)?;
                self.store = Store::seeded(self.layout.clone(), values, *v, self.hyper.clone(), MAX_WORKERS);
                self.round.0.fill(0.0);
                self.round.1 = 0;
            }
        }
        self.keep_if_wanted();
        Ok(())
    }

    /// A PS process restored its checkpoint at `version`: what it had applied past it is gone.
    fn restart(&mut self, version: u64) -> Result<(), String> {
        let data =
            self.restore_points.get(&version).cloned().flatten().ok_or_else(|| {
                format!("a restart restored version {version}, which the replay never reached")
            })?;
        self.lost += self.store.version().saturating_sub(version);
        self.store = Store::restore(self.layout.clone(), data, self.hyper.clone(), MAX_WORKERS);
        // Versions past the restored one name other models from now on.
        self.kept.retain(|&v, _| v <= version);
        self.round.0.fill(0.0);
        self.round.1 = 0;
        Ok(())
    }

    fn keep_if_wanted(&mut self) {
        let version = self.store.version();
        if self.wanted.contains_key(&version) {
            self.kept.insert(version, self.store.snapshot_now().params().to_vec());
        }
        if let Some(point) = self.restore_points.get_mut(&version) {
            *point = Some(self.store.checkpoint());
        }
    }

    /// The model at `version` for a delay-compensated update, dropped after its last use.
    fn backup(&mut self, version: u64) -> Result<Vec<f32>, String> {
        let left = self.wanted.get_mut(&version).ok_or("a backup nobody wanted")?;
        *left -= 1;
        let last = *left == 0;
        let found = if last { self.kept.remove(&version) } else { self.kept.get(&version).cloned() };
        found.ok_or_else(|| {
            format!("the update was computed on version {version}, which the replay never held")
        })
    }
}

fn gap(want: u64, at: u64) -> String {
    format!("the journal jumps to version {want} from {at}")
}

/// The captured payloads, read by offset.
struct Payloads {
    file: Option<File>,
    path: PathBuf,
    len: usize,
}

impl Payloads {
    /// Missing payloads are found when an entry needs one.
    fn open(path: &Path, len: usize) -> Self {
        Self { file: File::open(path).ok(), path: path.to_path_buf(), len }
    }

    fn read(&self, at: Option<u64>) -> Result<Vec<f32>, String> {
        let (Some(file), Some(at)) = (&self.file, at) else {
            return Err("an entry without its payload: the journal was not captured throughout".into());
        };
        let mut values = vec![0f32; self.len];
        file.read_exact_at(bytemuck::cast_slice_mut(&mut values), at)
            .map_err(|e| format!("{}: payload at {at}: {e}", self.path.display()))?;
        Ok(values)
    }
}

/// The first element where `b` differs from `a` in any bit, named by tensor and index.
fn first_difference(layout: &Layout, a: &CheckpointData, b: &CheckpointData) -> Option<String> {
    let vectors = [
        ("", &a.params, &b.params),
        ("optimizer.mean_square.", &a.state.mean_square, &b.state.mean_square),
        ("optimizer.momentum.", &a.state.momentum, &b.state.momentum),
        ("optimizer.pending.", &a.state.pending, &b.state.pending),
    ];
    for (prefix, x, y) in vectors {
        if x.len() != y.len() {
            return Some(format!("{prefix}: {} elements here, {} replayed", x.len(), y.len()));
        }
        if let Some(i) = x.iter().zip(y.iter()).position(|(p, q)| p.to_bits() != q.to_bits()) {
            return Some(format!("{prefix}{} (checkpoint {}, replayed {})", name_at(layout, i), x[i], y[i]));
        }
    }
    None
}

fn name_at(layout: &Layout, mut i: usize) -> String {
    for t in layout.tensors() {
        let n: usize = t.shape.iter().product();
        if i < n {
            return format!("{}[{i}]", t.name);
        }
        i -= n;
    }
    format!("[{i}]")
}
