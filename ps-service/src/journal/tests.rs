use std::path::Path;

use super::*;
use crate::optimizer::{Algorithm, Hyper};
use crate::store::checkpoint::CheckpointDir;
use crate::store::journal::{Entry, Start};
use crate::store::{BackupAs, Push, Store};
use crate::wire::{Layout, TensorSpec};

/// Three shards of the store's default length and a bit.
const N: usize = 3 * crate::store::DEFAULT_SHARD_LEN + 17;

fn layout() -> Layout {
    let spec = |name: &str, n: usize| TensorSpec { name: name.into(), shape: vec![n] };
    Layout::new(vec![spec("conv.weight", N - 17), spec("fc.bias", 17)]).unwrap()
}

fn gradient(seed: u64) -> Vec<f32> {
    (0..N).map(|i| (((i as u64 * 2654435761 + seed * 97) % 1000) as f32 - 500.0) * 1e-3).collect()
}

/// A push of `worker`'s current incarnation.
fn push(store: &Store, worker: usize, version: u64, seq: u64) -> Push {
    let generation = Some(store.status().workers[worker].generation);
    Push { worker, generation, version, seq, epoch: Some(seq as f64 * 0.1), body: None }
}

/// A store as the server builds one, journaled into `dir`.
fn journaled(dir: &Path, hyper: &Hyper, workers: usize, how: Start) -> (Store, Writer) {
    let writer = Writer::open(dir, 0, Mode::Capture, u64::MAX).unwrap().unwrap();
    let init: Vec<f32> = (0..N).map(|i| (i % 7) as f32 * 0.01).collect();
    let mut store = match how {
        Start::Restored => {
            let (_, layout, data, _) = CheckpointDir::new(dir, 3).unwrap().load_newest().unwrap().unwrap();
            Store::restore(layout, data, hyper.clone(), workers)
        }
        _ => Store::new(layout(), init, hyper.clone(), workers),
    };
    writer.begin(&store, how).unwrap();
    store.set_journal(writer.sink());
    for w in 0..workers {
        store.join(w, None).unwrap();
    }
    (store, writer)
}

fn checkpoint(dir: &Path, store: &Store, writer: &Writer) {
    writer.sync().unwrap();
    CheckpointDir::new(dir, 3).unwrap().write(store.layout(), store.hyper(), &store.checkpoint()).unwrap();
}

/// Three workers pushing on stale pulls, one push refused: what the DC rules see in a job.
/// Worker 2 pulls bf16, so its backups are the rounded model (journaled, and replayed so).
fn train_async(store: &Store, seqs: std::ops::Range<u64>) {
    for seq in seqs {
        for w in 0..3 {
            if (seq + w as u64).is_multiple_of(2) {
                let pulled_as = if w == 2 { BackupAs::Bf16 } else { BackupAs::F32 };
                store.pull_as(w, pulled_as).unwrap();
            }
            let pulled = store.status().workers[w].pulled_version.unwrap_or(0);
            store.push(push(store, w, pulled, seq), &gradient(seq * 3 + w as u64)).unwrap();
        }
    }
    // A replayed seq is answered, a stale one refused: neither changes the model.
    assert!(store.push(push(store, 0, 0, 1), &gradient(0)).is_err());
}

fn dc_hyper() -> Hyper {
    let mut hyper = Hyper::new(Algorithm::DcAsgdA, 0.05);
    hyper.momentum = 0.9;
    hyper.weight_decay = 1e-4;
    hyper
}

#[test]
fn a_captured_dc_asgd_journal_replays_to_the_checkpoint_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let (store, writer) = journaled(dir.path(), &dc_hyper(), 3, Start::Registered);
    for w in 0..3 {
        store.pull(w).unwrap();
    }
    train_async(&store, 1..8);
    checkpoint(dir.path(), &store, &writer);

    let r = replay(dir.path()).unwrap();
    assert_eq!((r.updates, r.version, r.lost), (21, 21, 0));
    assert!(r.reproduces(), "{r:?}");

    let lines = read(dir.path()).unwrap();
    let refused: Vec<_> = lines.iter().filter(|l| matches!(l.entry, Entry::Refused { .. })).collect();
    assert_eq!(refused.len(), 1, "the stale push is journaled as refused");
    let summary = summarize(&lines);
    assert_eq!(summary.workers[&0].refused["stale_seq"], 1);
    assert_eq!(summary.workers.values().map(|w| w.applied).sum::<u64>(), 21);
    assert!(summary.workers.values().any(|w| w.max_staleness >= 2), "{summary:?}");
}

#[test]
fn a_replay_names_the_first_parameter_that_differs() {
    let dir = tempfile::tempdir().unwrap();
    let (store, writer) = journaled(dir.path(), &dc_hyper(), 3, Start::Registered);
    train_async(&store, 1..4);
    checkpoint(dir.path(), &store, &writer);
    // One captured gradient altered: the replay must notice it.
    let payloads = dir.path().join(PAYLOADS_FILE);
    let mut bytes = std::fs::read(&payloads).unwrap();
    let at = 4 * (N - 3); // fc.bias[14] of the first payload
    bytes[at + 2] ^= 0x40;
    std::fs::write(&payloads, bytes).unwrap();
    let r = replay(dir.path()).unwrap();
    assert!(!r.reproduces());
    let diff = r.first_difference.unwrap();
    assert!(diff.starts_with("fc.bias[14]"), "{diff}");
}

#[test]
fn a_restart_from_an_older_checkpoint_is_replayed_and_its_lost_updates_counted() {
    let dir = tempfile::tempdir().unwrap();
    let hyper = dc_hyper();
    {
        let (store, writer) = journaled(dir.path(), &hyper, 3, Start::Registered);
        train_async(&store, 1..3);
        checkpoint(dir.path(), &store, &writer);
        train_async(&store, 3..5); // applied, journaled, lost with the process
        writer.sync().unwrap();
    }
    let (store, writer) = journaled(dir.path(), &hyper, 3, Start::Restored);
    for w in 0..3 {
        store.pull(w).unwrap();
    }
    train_async(&store, 5..7);
    checkpoint(dir.path(), &store, &writer);
    let r = replay(dir.path()).unwrap();
    assert_eq!(r.lost, 6);
    assert_eq!(r.version, 12);
    assert!(r.reproduces(), "{r:?}");
}

#[test]
fn sync_rounds_replay_from_their_contributions_in_arrival_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut hyper = Hyper::new(Algorithm::Sync, 0.1);
    hyper.backup_workers = 1;
    hyper.momentum = 0.9;
    let (store, writer) = journaled(dir.path(), &hyper, 3, Start::Registered);
    for round in 1..6u64 {
        let v = store.version();
        // Arrival order changes from round to round; the third is a backup worker's, refused.
        let order = if round % 2 == 0 { [2, 0, 1] } else { [1, 2, 0] };
        for (i, w) in order.into_iter().enumerate() {
            let outcome = store.push(push(&store, w, v, round), &gradient(round * 5 + w as u64));
            assert_eq!(outcome.is_ok(), i < 2, "round {round}, arrival {i}: {outcome:?}");
        }
    }
    // Closed short by its timeout, with one gradient of a whole round's two: replayed with the
    // divisor it was applied with, which the journal records.
    let v = store.version();
    store.push(push(&store, 0, v, 6), &gradient(99)).unwrap();
    store.close_round(v).expect("closed");
    checkpoint(dir.path(), &store, &writer);
    let last = read(dir.path()).unwrap().into_iter().last().unwrap();
    assert!(matches!(last.entry, Entry::Round { mean_over: Some(2), .. }), "{:?}", last.entry);
    let r = replay(dir.path()).unwrap();
    assert_eq!(r.updates, 6);
    assert!(r.reproduces(), "{r:?}");
    let lines = read(dir.path()).unwrap();
    let closed = lines
        .iter()
        .filter(|l| matches!(&l.entry, Entry::Refused { reason, .. } if reason == "round_closed"));
    assert_eq!(closed.count(), 5);
}

#[test]
fn a_line_cut_short_by_a_crash_is_dropped_and_the_journal_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let entry = |version| Entry::Started { version, how: Start::Registered };
    {
        let w = Writer::open(dir.path(), 2, Mode::On, u64::MAX).unwrap().unwrap();
        w.record(entry(1), None);
        w.sync().unwrap();
    }
    let path = dir.path().join(JOURNAL_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.extend_from_slice(br#"{"t_ms":1,"shard":2,"kind":"sta"#);
    std::fs::write(&path, bytes).unwrap();
    let w = Writer::open(dir.path(), 2, Mode::On, u64::MAX).unwrap().unwrap();
    w.record(entry(2), None);
    w.sync().unwrap();
    let versions: Vec<_> = read(dir.path()).unwrap().iter().map(|l| l.entry.version_after()).collect();
    assert_eq!(versions, [Some(1), Some(2)]);
}

#[test]
fn the_journal_is_rotated_by_size_and_read_back_oldest_first() {
    let dir = tempfile::tempdir().unwrap();
    let w = Writer::open(dir.path(), 0, Mode::On, 300).unwrap().unwrap();
    // One batch each (a batch is written whole, into one file).
    for version in 0..40 {
        w.record(Entry::Started { version, how: Start::Restored }, None);
        w.sync().unwrap();
    }
    let kept: Vec<u64> = read(dir.path()).unwrap().iter().filter_map(|l| l.entry.version_after()).collect();
    assert!(dir.path().join(format!("{JOURNAL_FILE}.4")).exists());
    assert!(!dir.path().join(format!("{JOURNAL_FILE}.5")).exists());
    assert!(kept.len() < 40 && kept.len() > 10, "{kept:?}");
    assert!(kept.windows(2).all(|p| p[1] == p[0] + 1), "in order: {kept:?}");
    assert_eq!(kept.last(), Some(&39));
}

#[test]
fn journal_filters_select_by_worker_generation_staleness_and_versions() {
    let dir = tempfile::tempdir().unwrap();
    let (store, writer) = journaled(dir.path(), &Hyper::new(Algorithm::Asgd, 0.1), 3, Start::Registered);
    train_async(&store, 1..4);
    writer.sync().unwrap();
    // A silence is journaled when it begins and ends, not while it lasts.
    for silent in [true, true, false] {
        store.set_silent(2, silent);
    }
    writer.sync().unwrap();
    let lines = read(dir.path()).unwrap();
    assert_eq!(summarize(&lines).workers[&2].silences, 1);
    let count = |f: Filter| lines.iter().filter(|l| f.matches(l)).count();
    assert_eq!(count(Filter { kind: Some("silence".into()), ..Filter::default() }), 2);
    // A worker that finished is not expected to talk: never marked silent.
    store.leave(1, 1).unwrap();
    store.set_silent(1, true);
    assert!(!store.status().workers[1].silent);
    assert_eq!(count(Filter { worker: Some(1), ..Filter::default() }), 3);
    assert_eq!(count(Filter { worker: Some(2), ..Filter::default() }), 5);
    assert_eq!(count(Filter { worker: Some(1), generation: Some(2), ..Filter::default() }), 0);
    assert_eq!(count(Filter { kind: Some("refused".into()), ..Filter::default() }), 1);
    assert_eq!(
        count(Filter { versions: Some((2, 4)), kind: Some("applied".into()), ..Filter::default() }),
        3
    );
    let stale = count(Filter { min_staleness: Some(1), ..Filter::default() });
    assert!(stale > 0 && stale < 9, "{stale}");
}
