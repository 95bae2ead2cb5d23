//! The update journal on disk: every decision of the store ([`crate::store::journal::Entry`]),
//! one JSON line each, next to the checkpoints.
//!
//! - `journal.jsonl`: the entries in model order, appended; rotated by size into
//!   `journal.jsonl.1`, `.2`, … (oldest highest) unless payloads are captured.
//! - With `--journal capture`: `journal-payloads.bin`, the f32 gradient of every applied or
//!   contributed push (and every worker's copy that re-seeded the model), which the entries
//!   point into, and `journal-initial.safetensors`, the model the journal starts from. From
//!   these [`replay`] rebuilds each update and must arrive at the checkpoint's model bit for bit.
//!
//! Crash safety: an entry is one `write` of a whole line, payload before line; the journal is
//! flushed after every batch and fsynced before each checkpoint is written ([`Writer::sync`]),
//! so a checkpoint never holds an update the journal lacks. A line cut short by a crash is
//! dropped when the journal is next opened.

mod query;
mod replay;
mod writer;

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::store::journal::Entry;

pub use query::{Filter, Summary, summarize};
pub use replay::{ReplayError, Replayed, replay};
pub use writer::Writer;

pub const JOURNAL_FILE: &str = "journal.jsonl";
pub const PAYLOADS_FILE: &str = "journal-payloads.bin";
pub const INITIAL_FILE: &str = "journal-initial.safetensors";

/// What the parameter server keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    Off,
    /// The entries only (a few hundred bytes per update).
    #[default]
    On,
    /// The entries and every gradient applied: a model-sized write per push, for tests and
    /// debugging; what [`replay`] needs. Never rotated.
    Capture,
}

/// One line of the journal.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Line {
    /// Unix time in milliseconds when the writer took it.
    pub t_ms: u64,
    /// The PS shard that wrote it.
    pub shard: usize,
    #[serde(flatten)]
    pub entry: Entry,
}

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}:{line}: not a journal entry: {why}")]
    Parse { path: PathBuf, line: usize, why: String },
    #[error("{0}: no journal here (the PS writes journal.jsonl into its checkpoint directory)")]
    Missing(PathBuf),
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> JournalError + '_ {
    move |source| JournalError::Io { path: path.to_path_buf(), source }
}

/// The journal's files in `dir`, oldest first (`journal.jsonl.N`, …, `.1`, `journal.jsonl`).
fn files(dir: &Path) -> Result<Vec<PathBuf>, JournalError> {
    let mut rotated = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_error(dir))? {
        let name = entry.map_err(io_error(dir))?.file_name().to_string_lossy().into_owned();
        if let Some(n) = name.strip_prefix(JOURNAL_FILE).and_then(|s| s.strip_prefix('.'))
            && let Ok(n) = n.parse::<u32>()
        {
            rotated.push(n);
        }
    }
    rotated.sort_unstable_by(|a, b| b.cmp(a));
    let mut out: Vec<PathBuf> =
        rotated.into_iter().map(|n| dir.join(format!("{JOURNAL_FILE}.{n}"))).collect();
    let current = dir.join(JOURNAL_FILE);
    if current.exists() {
        out.push(current);
    }
    if out.is_empty() {
        return Err(JournalError::Missing(dir.to_path_buf()));
    }
    Ok(out)
}

/// Every entry in `dir`'s journal, oldest first. A last line without its newline (a crash while
/// it was written) is skipped.
pub fn read(dir: &Path) -> Result<Vec<Line>, JournalError> {
    let mut lines = Vec::new();
    for path in files(dir)? {
        let file = fs::File::open(&path).map_err(io_error(&path))?;
        let mut reader = BufReader::new(file);
        let mut buf = String::new();
        let mut n = 0;
        loop {
            buf.clear();
            if reader.read_line(&mut buf).map_err(io_error(&path))? == 0 {
                break;
            }
            n += 1;
            if !buf.ends_with('\n') {
                break;
            }
            let line = serde_json::from_str(buf.trim_end()).map_err(|e| JournalError::Parse {
                path: path.clone(),
                line: n,
                why: e.to_string(),
            })?;
            lines.push(line);
        }
    }
    Ok(lines)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests;
