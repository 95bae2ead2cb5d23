//! A checkpoint file's bytes, read as a restarting PS reads them: `store::checkpoint::decode`
//! (what `CheckpointDir::load_newest` calls on each file), then, when it decodes, the restore
//! (`Store::restore`, with the worker count `AppState::new` would pick) and the PS's next
//! checkpoint of it (`Store::checkpoint`, `checkpoint::encode_to`).
//!
//! Checked: no panic; the restored model is the file's, bit for bit, at its version, epoch and
//! finalized flag; the checkpoint the PS writes next decodes to exactly what it wrote.
#![no_main]

use foresight_fuzz::{LAYOUTS, bits, values, write_seeds_if_asked};
use foresight_ps::optimizer::{Algorithm, Hyper, OptimizerState};
use foresight_ps::store::Store;
use foresight_ps::store::checkpoint::{self, CheckpointData};
use libfuzzer_sys::fuzz_target;

/// The PS's configuration: dc-asgd-a with momentum, so both kinds of optimizer state exist.
fn configured() -> Hyper {
    let mut h = Hyper::new(Algorithm::DcAsgdA, 0.1);
    h.momentum = 0.9;
    h
}
const CONFIGURED_WORKERS: usize = 4;

/// Whether `encode_to` can name the optimizer state of `layout` (what it `expect`s).
fn prefixed_names_fit(layout: &foresight_ps::wire::Layout) -> bool {
    let mut specs = layout.tensors().to_vec();
    for prefix in ["optimizer.mean_square.", "optimizer.momentum."] {
        specs.extend(layout.tensors().iter().map(|t| foresight_ps::wire::TensorSpec {
            name: format!("{prefix}{}", t.name),
            shape: t.shape.clone(),
        }));
    }
    foresight_ps::wire::Layout::new(specs).is_ok()
}

fn same_epoch(a: f64, b: f64) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

fn encode(layout: &foresight_ps::wire::Layout, hyper: &Hyper, data: &CheckpointData) -> Vec<u8> {
    let mut out = Vec::new();
    checkpoint::encode_to(&mut out, layout, hyper, data).expect("writing to a Vec");
    out
}

fn seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for (i, layout) in LAYOUTS.iter().enumerate() {
        let n = layout.len();
        for (algorithm, momentum) in
            [(Algorithm::DcAsgdA, 0.9), (Algorithm::Asgd, 0.0), (Algorithm::Sync, 0.5)]
        {
            let mut hyper = Hyper::new(algorithm, 0.05);
            hyper.momentum = momentum;
            let mut state = OptimizerState::new(&hyper, n);
            state.mean_square.iter_mut().for_each(|x| *x = 0.25);
            let data = CheckpointData {
                version: 40 + i as u64,
                epoch: 1.5,
                params: values(n, i),
                state,
                finalized: i % 2 == 1,
                worker_seqs: vec![Some(3), None, Some(9)],
                worker_generations: vec![1, 0, 2],
                workers: 3,
            };
            out.push(encode(layout, &hyper, &data));
        }
    }
    // A checkpoint written before `workers`, `worker_seqs` and the others existed.
    let layout = &LAYOUTS[1];
    let data = CheckpointData { version: 1, epoch: 0.0, params: vec![0.5], ..Default::default() };
    out.push(encode(layout, &Hyper::new(Algorithm::Asgd, 0.1), &data));
    out
}

fuzz_target!(init: write_seeds_if_asked(seeds), |data: &[u8]| {
    let Ok((layout, saved, _saved_hyper)) = checkpoint::decode(data) else { return };
    // The PS refuses model layouts whose optimizer state could not be named in a checkpoint
    // (found by this target: `encode_to` panicked on them).
    assert!(prefixed_names_fit(&layout), "a layout whose state names do not fit was accepted");
    let n = layout.len();
    assert_eq!(saved.params.len(), n);
    assert!(saved.state.mean_square.is_empty() || saved.state.mean_square.len() == n);
    assert!(saved.state.momentum.is_empty() || saved.state.momentum.len() == n);
    // AppState::new's restored_membership: the checkpoint's count when known (backup_workers = 0).
    let workers = if saved.workers > 0 { saved.workers } else { CONFIGURED_WORKERS };
    let hyper = configured();
    let store = Store::restore(layout.clone(), saved.clone(), hyper.clone(), workers);
    let _ = store.status();
    let _ = store.snapshot_now();
    let next = store.checkpoint();
    assert_eq!(bits(&next.params), bits(&saved.params));
    assert_eq!((next.version, next.finalized, next.workers), (saved.version, saved.finalized, workers));
    assert!(same_epoch(next.epoch, saved.epoch), "{} vs {}", next.epoch, saved.epoch);
    if saved.state.mean_square.len() == n {
        assert_eq!(bits(&next.state.mean_square), bits(&saved.state.mean_square));
    }
    let written = encode(&layout, &hyper, &next);
    let (l2, mut again, h2) = checkpoint::decode(&written).expect("a checkpoint the PS wrote decodes");
    assert_eq!((l2, &h2), (layout, &hyper));
    assert!(same_epoch(again.epoch, next.epoch));
    again.epoch = next.epoch;
    assert!(again.params.iter().zip(&next.params).all(|(a, b)| a.to_bits() == b.to_bits()));
    let (mut a, mut b) = (again, next);
    a.params.clear();
    b.params.clear();
    if b.epoch.is_nan() {
        (a.epoch, b.epoch) = (0.0, 0.0);
    }
    assert_eq!(a, b, "the checkpoint the PS wrote decodes to something else");
});
