//! `foresight journal`: the entries a user asks for, and a summary per worker.

use std::collections::BTreeMap;

use super::Line;
use crate::store::journal::{Entry, Start};

/// Which entries to show; every condition set must hold.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct Filter {
    /// Only this worker's pushes.
    #[arg(long)]
    pub worker: Option<usize>,
    /// Only this incarnation of the worker (1: its first process, 2: after its first restart…).
    #[arg(long)]
    pub generation: Option<u64>,
    /// Only updates with staleness τ at least this.
    #[arg(long)]
    pub min_staleness: Option<u64>,
    /// Only entries of this kind (started, applied, contributed, round, refused, reseeded, silence, gap).
    #[arg(long)]
    pub kind: Option<String>,
    /// Only updates making a version in this range, as FROM..TO (inclusive).
    #[arg(long, value_parser = parse_range)]
    pub versions: Option<(u64, u64)>,
}

fn parse_range(s: &str) -> Result<(u64, u64), String> {
    let (a, b) = s.split_once("..").ok_or("expected FROM..TO")?;
    let a = a.parse().map_err(|_| format!("{a:?} is not a version"))?;
    let b = b.parse().map_err(|_| format!("{b:?} is not a version"))?;
    if a > b {
        return Err(format!("{a}..{b} is empty"));
    }
    Ok((a, b))
}

impl Filter {
    pub fn matches(&self, line: &Line) -> bool {
        let e = &line.entry;
        let generation = match e {
            Entry::Applied { generation, .. }
            | Entry::Contributed { generation, .. }
            | Entry::Refused { generation, .. } => *generation,
            _ => None,
        };
        let staleness = match e {
            Entry::Applied { staleness, .. } => Some(*staleness),
            _ => None,
        };
        self.worker.is_none_or(|w| e.worker() == Some(w))
            && self.generation.is_none_or(|g| generation == Some(g))
            && self.min_staleness.is_none_or(|t| staleness.is_some_and(|s| s >= t))
            && self.kind.as_deref().is_none_or(|k| kind(e) == k)
            && self.versions.is_none_or(|(a, b)| e.version_after().is_some_and(|v| (a..=b).contains(&v)))
    }
}

pub fn kind(e: &Entry) -> &'static str {
    match e {
        Entry::Started { .. } => "started",
        Entry::Applied { .. } => "applied",
        Entry::Contributed { .. } => "contributed",
        Entry::Round { .. } => "round",
        Entry::Refused { .. } => "refused",
        Entry::Reseeded { .. } => "reseeded",
        Entry::Silence { .. } => "silence",
        Entry::Gap { .. } => "gap",
    }
}

/// One worker's record.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct WorkerSummary {
    pub applied: u64,
    pub contributed: u64,
    pub refused: BTreeMap<String, u64>,
    pub max_staleness: u64,
    pub mean_staleness: f64,
    /// Times the PS marked it silent.
    pub silences: u64,
    pub generations: Vec<u64>,
}

/// The journal at a glance.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Summary {
    pub entries: u64,
    pub updates: u64,
    pub rounds: u64,
    pub rounds_short: u64,
    pub restarts: u64,
    pub reseeds: u64,
    /// Entries the writer could not write (a full disk).
    pub missing: u64,
    pub last_version: u64,
    pub workers: BTreeMap<usize, WorkerSummary>,
}

pub fn summarize(lines: &[Line]) -> Summary {
    let mut s = Summary::default();
    let mut staleness_sum: BTreeMap<usize, u64> = BTreeMap::new();
    for line in lines {
        s.entries += 1;
        let e = &line.entry;
        if let Some(v) = e.version_after() {
            s.last_version = v;
        }
        match e {
            Entry::Started { how: Start::Restored | Start::Seeded, .. } => s.restarts += 1,
            Entry::Started { .. } => {}
            Entry::Reseeded { .. } => s.reseeds += 1,
            Entry::Gap { entries } => s.missing += entries,
            Entry::Silence { worker, silent } => {
                s.workers.entry(*worker).or_default().silences += u64::from(*silent);
            }
            Entry::Round { short, .. } => {
                s.updates += 1;
                s.rounds += 1;
                s.rounds_short += u64::from(*short);
            }
            Entry::Applied { worker, generation, staleness, .. } => {
                s.updates += 1;
                let w = s.workers.entry(*worker).or_default();
                w.applied += 1;
                w.max_staleness = w.max_staleness.max(*staleness);
                *staleness_sum.entry(*worker).or_default() += staleness;
                note_generation(w, *generation);
            }
            Entry::Contributed { worker, generation, .. } => {
                let w = s.workers.entry(*worker).or_default();
                w.contributed += 1;
                note_generation(w, *generation);
            }
            Entry::Refused { worker, generation, reason, .. } => {
                let w = s.workers.entry(*worker).or_default();
                *w.refused.entry(reason.clone()).or_default() += 1;
                note_generation(w, *generation);
            }
        }
    }
    for (worker, sum) in staleness_sum {
        let w = s.workers.get_mut(&worker).expect("counted above");
        w.mean_staleness = sum as f64 / w.applied.max(1) as f64;
    }
    s
}

fn note_generation(w: &mut WorkerSummary, generation: Option<u64>) {
    if let Some(g) = generation
        && !w.generations.contains(&g)
    {
        w.generations.push(g);
    }
}
