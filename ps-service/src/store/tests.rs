use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::optimizer::Combine;
use crate::wire::TensorSpec;

fn layout(n: usize) -> Layout {
    Layout::new(vec![TensorSpec { name: "w".into(), shape: vec![n] }]).unwrap()
}

fn store(algo: Algorithm, lr: f32, init: Vec<f32>, workers: usize, shard: usize) -> Store {
    Store::with_shard_len(layout(init.len()), init, Hyper::new(algo, lr), workers, shard)
}

fn push(worker: usize, version: u64, seq: u64) -> Push {
    Push { worker, generation: None, version, seq, epoch: None, body: None }
}

#[test]
fn staleness_follows_a_scripted_interleaving() {
    let s = store(Algorithm::Asgd, 0.1, vec![0.0; 10], 3, 4);
    let g = vec![1.0; 10];
    assert_eq!(s.pull(0).unwrap().version(), 0);
    assert_eq!(s.pull(1).unwrap().version(), 0);
    let o = s.push(push(0, 0, 1), &g).unwrap();
    assert_eq!((o.version, o.staleness), (1, 0));
    let o = s.push(push(1, 0, 1), &g).unwrap();
    assert_eq!((o.version, o.staleness), (2, 1));
    assert_eq!(s.pull(2).unwrap().version(), 2);
    let o = s.push(push(0, 0, 2), &g).unwrap(); // worker 0 never re-pulled
    assert_eq!((o.version, o.staleness), (3, 2));
    let o = s.push(push(2, 2, 1), &g).unwrap();
    assert_eq!((o.version, o.staleness), (4, 1));
    let st = s.status();
    assert_eq!(st.version, 4);
    assert_eq!((st.staleness.count, st.staleness.max, st.staleness.p50), (4, 2, 1));
    assert_eq!(st.workers[0].pushes, 2);
    assert_eq!(st.workers[0].mean_staleness, 1.0);
    assert_eq!(st.workers[2].pulled_version, Some(2));
    assert!(s.snapshot_now().params().iter().all(|&x| (x + 0.4).abs() < 1e-6));
}

/// w_bak(m) is the model worker m pulled — not the previous server weight, not zero.
#[test]
fn dc_asgd_compensates_against_the_model_the_worker_pulled() {
    let mut hyper = Hyper::new(Algorithm::DcAsgdC, 0.1);
    hyper.lambda0 = 0.5;
    let s = Store::with_shard_len(layout(3), vec![1.0, 2.0, 3.0], hyper.clone(), 2, 2);
    let w_pulled_by_1 = s.pull(1).unwrap().params().to_vec();
    // Worker 0 moves the model twice.
    for (seq, g) in [(1, [0.5, -0.5, 1.0]), (2, [1.0, 1.0, -1.0])] {
        let v = s.pull(0).unwrap().version();
        s.push(push(0, v, seq), &g).unwrap();
    }
    let w_now = s.snapshot_now().params().to_vec();
    let g1 = [2.0, -1.0, 0.5];
    let o = s.push(push(1, 0, 1), &g1).unwrap();
    assert_eq!(o.staleness, 2);
    let mut expect = w_now.clone();
    for i in 0..3 {
        expect[i] -= 0.1 * (g1[i] + 0.5 * g1[i] * g1[i] * (w_now[i] - w_pulled_by_1[i]));
    }
    let got = s.snapshot_now().params().to_vec();
    for i in 0..3 {
        assert!((got[i] - expect[i]).abs() < 1e-6, "{got:?} vs {expect:?}");
    }
    assert!(o.stats.compensation_ratio() > 0.0);
}

/// Parameter groups: each tensor is updated with its group's weight decay and learning-rate
/// scale, also where a tensor is cut by the store's chunks (3 elements here) or is a sharded
/// PS's piece, under asgd, dc-asgd-c and Delayed Nesterov alike; the job's rates elsewhere.
#[test]
fn each_tensor_takes_its_groups_weight_decay_and_rate() {
    use crate::optimizer::ParameterGroup;
    let layout = Layout::new(vec![
        TensorSpec { name: "fc.weight".into(), shape: vec![4] },
        TensorSpec { name: "fc.bias".into(), shape: vec![2] },
        TensorSpec { name: "embed.weight[0..3 of 2x5]".into(), shape: vec![3] },
    ])
    .unwrap();
    let init: Vec<f32> = (0..9).map(|i| 1.0 + i as f32 * 0.25).collect();
    let g: Vec<f32> = (0..9).map(|i| 0.5 - i as f32 * 0.125).collect();
    let groups = vec![
        ParameterGroup { names: vec!["bias$".into()], weight_decay: Some(0.0), learning_rate_scale: None },
        ParameterGroup { names: vec!["^embed".into()], weight_decay: None, learning_rate_scale: Some(0.5) },
    ];
    // (lr scale, weight decay) of each element.
    let rates = |i: usize| match i {
        0..4 => (1.0f32, 0.1f32),
        4..6 => (1.0, 0.0),
        _ => (0.5, 0.1),
    };
    for algorithm in [Algorithm::Asgd, Algorithm::DcAsgdC] {
        let mut hyper = Hyper::new(algorithm, 0.2);
        (hyper.weight_decay, hyper.parameter_groups) = (0.1, groups.clone());
        let s = Store::with_shard_len(layout.clone(), init.clone(), hyper.clone(), 1, 3);
        s.pull(0).unwrap();
        s.push(push(0, 0, 1), &g).unwrap();
        let got = s.snapshot_now().params().to_vec();
        for i in 0..9 {
            let (scale, wd) = rates(i);
            // Pulled and pushed at version 0: no compensation (w − w_bak = 0).
            let expect = init[i] - 0.2 * scale * (g[i] + wd * init[i]);
            assert!((got[i] - expect).abs() < 1e-6, "{algorithm} element {i}: {} vs {expect}", got[i]);
        }
    }
    // Delayed Nesterov, N = 2: each update its own share η·d/N, the momentum at the second.
    let mut hyper = Hyper::new(Algorithm::Asgd, 0.2);
    (hyper.weight_decay, hyper.parameter_groups) = (0.1, groups.clone());
    (hyper.momentum, hyper.momentum_delay, hyper.nesterov) = (0.5, 2, false);
    let s = Store::with_shard_len(layout.clone(), init.clone(), hyper, 1, 3);
    let v = s.pull(0).unwrap().version();
    s.push(push(0, v, 1), &g).unwrap();
    let w1 = s.snapshot_now().params().to_vec();
    for i in 0..9 {
        let (scale, wd) = rates(i);
        let expect = init[i] - 0.2 * scale * (g[i] + wd * init[i]) / 2.0;
        assert!((w1[i] - expect).abs() < 1e-6, "delayed element {i}: {} vs {expect}", w1[i]);
    }
    let v = s.pull(0).unwrap().version();
    s.push(push(0, v, 2), &g).unwrap();
    let w2 = s.snapshot_now().params().to_vec();
    for i in 0..9 {
        let (scale, wd) = rates(i);
        // Heavy ball: m ← μ·m + Σg/N = g, and w takes η·μ·m_old = 0 from it at the first cycle.
        let expect = w1[i] - 0.2 * scale * (g[i] + wd * w1[i]) / 2.0;
        assert!((w2[i] - expect).abs() < 1e-5, "delayed element {i} at the milestone: {} vs {expect}", w2[i]);
    }
    assert_eq!(matched_by(&layout, &groups), [2, 3]);
}

fn matched_by(layout: &Layout, groups: &[crate::optimizer::ParameterGroup]) -> Vec<usize> {
    let mut hyper = Hyper::new(Algorithm::Asgd, 0.1);
    hyper.parameter_groups = groups.to_vec();
    Store::new(layout.clone(), vec![0.0; layout.len()], hyper, 1).group_parameters().to_vec()
}

/// A worker that overlaps its exchange with its next step computes each gradient on the model it
/// pulled one pull before: its pushes name that version, and the PS keeps that backup too and
/// compensates against it. A worker that does not overlap keeps one backup: the older version
/// is refused as `pull_required`, as before.
#[test]
fn an_overlapping_worker_is_compensated_against_the_model_it_pulled_one_pull_before() {
    let mut hyper = Hyper::new(Algorithm::DcAsgdC, 0.1);
    hyper.lambda0 = 0.5;
    let s = Store::with_shard_len(layout(3), vec![1.0, 2.0, 3.0], hyper, 2, 2);
    s.overlaps(0, true).unwrap();
    let w0 = s.pull(0).unwrap().params().to_vec();
    s.push(push(0, 0, 1), &[0.5, -0.5, 1.0]).unwrap();
    assert_eq!(s.pull(0).unwrap().version(), 1, "pulled while step 2 computes on w0");
    assert_eq!(s.snapshots_held(), 2, "both backups held (w0, and w1 which is also the cache)");
    let w1 = s.snapshot_now().params().to_vec();
    let g = [2.0, -1.0, 0.5];
    let o = s.push(push(0, 0, 2), &g).unwrap();
    assert_eq!((o.version, o.staleness), (2, 1));
    let got = s.snapshot_now().params().to_vec();
    for i in 0..3 {
        let expect = w1[i] - 0.1 * (g[i] + 0.5 * g[i] * g[i] * (w1[i] - w0[i]));
        assert!((got[i] - expect).abs() < 1e-6, "{got:?}: element {i} should be {expect}");
    }
    // Worker 1 does not overlap: a pull replaces its backup, and the older version is refused.
    assert_eq!(s.pull(1).unwrap().version(), 2);
    s.push(push(0, 1, 3), &g).unwrap();
    assert_eq!(s.pull(1).unwrap().version(), 3);
    let refused = s.push(push(1, 2, 1), &g).unwrap_err();
    assert!(matches!(refused, StoreError::PullRequired { got: 2, pulled: Some(3), .. }), "{refused:?}");
}

/// A worker that pulled the model as bf16 computed its gradient on the model rounded: its
/// w_bak is that rounded model, not the float32 snapshot (the difference is rounding error the
/// compensation would otherwise take for drift).
#[test]
fn dc_asgd_compensates_a_bf16_puller_against_the_rounded_model_it_trained_on() {
    let mut hyper = Hyper::new(Algorithm::DcAsgdC, 0.1);
    hyper.lambda0 = 0.5;
    // Values bf16 cannot hold: rounding moves each by up to 2^-8 of its size.
    let init = vec![1.001, 2.003, 3.007];
    let s = Store::with_shard_len(layout(3), init.clone(), hyper.clone(), 2, 2);
    let pulled = s.pull_as(1, BackupAs::Bf16).unwrap().params().to_vec();
    let trained_on: Vec<f32> = pulled.iter().map(|&v| crate::wire::bf16_round_trip(v)).collect();
    assert_ne!(pulled, trained_on);
    let v = s.pull(0).unwrap().version();
    s.push(push(0, v, 1), &[0.5, -0.5, 1.0]).unwrap();
    let w_now = s.snapshot_now().params().to_vec();
    let g1 = [2.0, -1.0, 0.5];
    s.push(push(1, 0, 1), &g1).unwrap();
    let got = s.snapshot_now().params().to_vec();
    for i in 0..3 {
        let expect = w_now[i] - 0.1 * (g1[i] + 0.5 * g1[i] * g1[i] * (w_now[i] - trained_on[i]));
        let against_f32 = w_now[i] - 0.1 * (g1[i] + 0.5 * g1[i] * g1[i] * (w_now[i] - pulled[i]));
        assert!((got[i] - expect).abs() < 1e-7, "{i}: {} vs {expect}", got[i]);
        assert!((got[i] - against_f32).abs() > 1e-5, "{i}: the float32 snapshot was used");
    }
}

#[test]
fn refusals_change_nothing() {
    let mut hyper = Hyper::new(Algorithm::DcAsgdA, 0.1);
    hyper.max_staleness = Some(1);
    let s = Store::with_shard_len(layout(4), vec![0.5; 4], hyper, 2, 2);
    let g = [1.0; 4];
    s.pull(1).unwrap(); // worker 1 keeps version 0
    s.push(push(0, 0, 5), &g).unwrap();
    s.pull(0).unwrap();
    s.push(push(0, 1, 6), &g).unwrap();
    let state = || {
        let st = s.status();
        (s.checkpoint(), st.staleness, st.workers)
    };
    let before = state();
    let cases = [
        (push(2, 0, 1), "unknown_worker"),
        (push(0, 2, 4), "stale_seq"),
        (push(0, 9, 7), "future_version"),
        (push(1, 0, 1), "too_stale"),     // τ = 2 > maxStaleness 1
        (push(1, 1, 1), "pull_required"), // worker 1 pulled version 0, not 1
    ];
    for (p, reason) in cases {
        assert_eq!(s.push(p, &g).unwrap_err().reason(), reason, "{p:?}");
        assert!(state() == before, "{reason} changed the store");
    }
}

#[test]
fn a_retried_push_is_applied_once() {
    let s = store(Algorithm::Asgd, 1.0, vec![0.0; 5], 1, 2);
    let first = s.push(push(0, 0, 7), &[1.0; 5]).unwrap();
    let again = s.push(push(0, 0, 7), &[1.0; 5]).unwrap();
    assert!(again.replayed && !first.replayed);
    assert_eq!(again.version, first.version);
    assert_eq!(s.version(), 1);
    assert_eq!(s.snapshot_now().params(), &[-1.0; 5]);
    assert_eq!(s.status().workers[0].pushes, 1);
}

#[test]
fn finalize_makes_the_model_read_only() {
    let s = store(Algorithm::Asgd, 1.0, vec![0.0; 3], 1, 2);
    s.push(push(0, 0, 1), &[1.0; 3]).unwrap();
    let data = s.finalize();
    assert_eq!((data.version, data.params.clone()), (1, vec![-1.0; 3]));
    assert_eq!(s.push(push(0, 1, 2), &[1.0; 3]).unwrap_err(), StoreError::Finalized);
    assert_eq!(s.finalize().params, data.params);
    assert_eq!(s.pull(0).unwrap().version(), 1);
}

#[test]
fn sync_applies_once_per_round_and_waits_for_every_worker() {
    let s = store(Algorithm::Sync, 0.5, vec![0.0, 0.0], 2, 1);
    // Round 1: g1 = [1, 2], h1 = [3, -2] → mean [2, 0].
    let o = s.push(push(0, 0, 1), &[1.0, 2.0]).unwrap();
    assert!(!o.applied && o.version == 0);
    assert_eq!(s.version(), 0);
    assert_eq!(s.push(push(0, 0, 2), &[9.0, 9.0]).unwrap_err().reason(), "already_contributed");
    let o = s.push(push(1, 0, 1), &[3.0, -2.0]).unwrap();
    assert!(o.applied && o.version == 1);
    assert_eq!(s.snapshot_now().params(), &[-1.0, 0.0]);
    // A contribution for the old version is refused; round 2 works.
    assert_eq!(s.push(push(0, 0, 3), &[1.0, 1.0]).unwrap_err().reason(), "round_closed");
    s.push(push(1, 1, 2), &[2.0, 1.0]).unwrap();
    s.push(push(0, 1, 3), &[0.0, 1.0]).unwrap();
    assert_eq!(s.snapshot_now().params(), &[-1.5, -0.5]);
    assert_eq!(s.status().staleness.max, 0);
}

#[test]
fn listener_sees_every_completed_version() {
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let mut s = store(Algorithm::Asgd, 1.0, vec![0.0; 3], 1, 1);
    let sink = seen.clone();
    s.set_listener(Box::new(move |v| sink.lock().push(v)));
    for seq in 1..=3 {
        s.push(push(0, s.version(), seq), &[1.0; 3]).unwrap();
    }
    assert_eq!(*seen.lock(), [1, 2, 3]);
}

/// Many workers push and pull at once over small shards. Every gradient is all ones at rate 1,
/// so the model at version v is −v in every element: a snapshot that mixed two versions, or an
/// update that was not atomic per shard, would show up as unequal elements.
/// The store as a large model's is walked: its shards cut into `threads` groups, each walked by
/// its own thread (a real 1M-element model gets as many as the machine has cores).
fn walked_by(mut s: Store, threads: usize) -> Store {
    s.groups = walk_groups(s.shards.len(), threads);
    assert_eq!(s.groups.len(), threads.min(s.shards.len()));
    s
}

#[test]
fn concurrent_pushes_are_atomic_and_versions_monotonic() {
    for threads in [1, 3] {
        concurrent_pushes_by(threads);
    }
}

fn concurrent_pushes_by(threads: usize) {
    let n = 1000;
    let workers = 8;
    let per_worker = 50;
    let s = Arc::new(walked_by(store(Algorithm::Asgd, 1.0, vec![0.0; n], workers, 64), threads));
    let handles: Vec<_> = (0..workers)
        .map(|m| {
            let s = s.clone();
            std::thread::spawn(move || {
                let mut versions = Vec::new();
                for seq in 1..=per_worker {
                    let snap = s.pull(m).unwrap();
                    let p = snap.params();
                    assert!(
                        p.iter().all(|&x| x == -(snap.version() as f32)),
                        "torn snapshot at {}",
                        snap.version()
                    );
                    let o = s.push(push(m, snap.version(), seq), &vec![1.0; n]).unwrap();
                    versions.push(o.version);
                }
                versions
            })
        })
        .collect();
    let mut all: Vec<u64> = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
    all.sort();
    let total = (workers * per_worker as usize) as u64;
    assert_eq!(all, (1..=total).collect::<Vec<_>>());
    assert!(s.snapshot_now().params().iter().all(|&x| x == -(total as f32)));
}

#[test]
fn a_snapshot_is_read_while_it_is_copied_and_holds_exactly_its_version() {
    for threads in [1, 3] {
        snapshot_read_while_copied_by(threads);
    }
}

/// As a server streams a pull: a reader takes each piece as the copy publishes it, while an
/// update that came after the pull waits for the copy to leave each shard.
fn snapshot_read_while_copied_by(threads: usize) {
    let n = 1000;
    let s = Arc::new(walked_by(store(Algorithm::Asgd, 1.0, vec![0.0; n], 2, 64), threads));
    s.push(push(0, 0, 1), &vec![1.0; n]).unwrap();
    let (snap, copy) = s.pull_copying(Some(1)).unwrap();
    let copy = copy.expect("the first pull of a version copies it");
    let header = snap.len_bytes() - 4 * n;
    assert_eq!(snap.ready_len(), header, "nothing is published before the copy runs");
    let (again, none) = s.pull_copying(Some(0)).unwrap();
    assert!(Arc::ptr_eq(&snap, &again) && none.is_none(), "one copy per version, shared while it runs");
    let pusher = {
        let s = s.clone();
        std::thread::spawn(move || s.push(push(0, 1, 2), &vec![1.0; n]).unwrap().version)
    };
    let reader = {
        let snap = snap.clone();
        std::thread::spawn(move || {
            let mut got = Vec::new();
            while got.len() < snap.len_bytes() {
                match snap.ready_len() {
                    ready if ready > got.len() => {
                        got.extend_from_slice(snap.ready_bytes(got.len()..ready).unwrap())
                    }
                    _ => std::thread::yield_now(),
                }
            }
            got
        })
    };
    let published = std::sync::atomic::AtomicUsize::new(0);
    copy.run(&|| {
        published.fetch_add(1, Ordering::Relaxed);
    });
    assert_eq!(reader.join().unwrap(), snap.bytes(), "the pieces make the whole body");
    assert!(snap.params().iter().all(|&x| x == -1.0), "version 1, none of the update after it");
    assert_eq!(published.into_inner(), s.shards.len() + 1, "each shard as it lands, then the whole");
    assert_eq!(pusher.join().unwrap(), 2);
    assert!(s.snapshot_now().params().iter().all(|&x| x == -2.0));
}

#[test]
fn a_snapshot_copy_dropped_unrun_still_runs() {
    let s = store(Algorithm::Asgd, 1.0, vec![0.5; 100], 1, 16);
    let (snap, copy) = s.pull_copying(Some(0)).unwrap();
    drop(copy);
    assert!(snap.is_complete());
    // The copy's ticket is spent: a later update does not wait for it forever.
    assert_eq!(s.push(push(0, 0, 1), &[1.0; 100]).unwrap().version, 1);
    assert_eq!(snap.params(), &[0.5; 100]);
}

#[test]
fn workers_that_pull_the_same_version_share_one_snapshot() {
    let s = store(Algorithm::DcAsgdA, 0.1, vec![0.0; 100], 64, 16);
    let snaps: Vec<_> = (0..64).map(|m| s.pull(m).unwrap()).collect();
    assert!(snaps.windows(2).all(|w| Arc::ptr_eq(&w[0], &w[1])));
    assert_eq!(s.snapshots_held(), 1);
    s.push(push(0, 0, 1), &[1.0; 100]).unwrap();
    s.pull(0).unwrap();
    assert_eq!(s.snapshots_held(), 2);
}

#[test]
fn restore_requires_a_pull_before_compensated_pushes() {
    let hyper = Hyper::new(Algorithm::DcAsgdA, 0.1);
    let a = Store::with_shard_len(layout(4), vec![1.0; 4], hyper.clone(), 2, 2);
    a.push(push(0, 0, 1), &[1.0; 4]).unwrap();
    let data = a.checkpoint();
    let b = Store::restore(layout(4), data.clone(), hyper, 2);
    assert_eq!(b.checkpoint(), data);
    assert_eq!(b.push(push(0, 1, 2), &[1.0; 4]).unwrap_err().reason(), "pull_required");
    b.pull(0).unwrap();
    assert!(!b.push(push(0, 1, 2), &[1.0; 4]).unwrap().replayed);
}

fn vec_of(len: usize) -> impl Strategy<Value = Vec<f32>> {
    proptest::collection::vec(-2.0f32..2.0, len)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// `sync` with M workers equals one sequential SGD step on the combined gradient.
    #[test]
    fn sync_equals_one_sgd_step_on_the_combined_gradient(
        (w0, grads) in (1usize..30, 1usize..6).prop_flat_map(|(n, m)| (vec_of(n), proptest::collection::vec(vec_of(n), m))),
        sum in any::<bool>(),
    ) {
        let m = grads.len();
        let mut hyper = Hyper::new(Algorithm::Sync, 0.1);
        hyper.combine = if sum { Combine::Sum } else { Combine::Mean };
        let s = Store::with_shard_len(layout(w0.len()), w0.clone(), hyper.clone(), m, 7);
        for (k, g) in grads.iter().enumerate() {
            s.push(push(k, 0, 1), g).unwrap();
        }
        let mut combined = vec![0.0; w0.len()];
        for g in &grads {
            crate::optimizer::accumulate(&mut combined, g);
        }
        crate::optimizer::finish_combined(&hyper, &mut combined, m);
        let asgd = Hyper::new(Algorithm::Asgd, 0.1);
        let mut expect = w0.clone();
        crate::optimizer::apply(&asgd, crate::optimizer::Step::at(0.1, 0), &mut expect, &combined, None, &mut [], &mut []);
        let got = s.snapshot_now();
        prop_assert_eq!(got.params(), &expect[..]);
        prop_assert_eq!(s.version(), 1);
    }

    /// A store walked by several threads at once gives the bits of one walked by one: the same
    /// model, MeanSquare and momentum after a schedule with staleness (each element's update
    /// depends only on that element).
    #[test]
    fn several_walking_threads_give_the_bits_of_one(
        (w0, grads) in (1usize..300, 1usize..10).prop_flat_map(|(n, k)| (vec_of(n), proptest::collection::vec(vec_of(n), k))),
        threads in 2usize..5,
        shard in 1usize..40,
    ) {
        let mut hyper = Hyper::new(Algorithm::DcAsgdA, 0.1);
        hyper.momentum = 0.9;
        let one = Store::with_shard_len(layout(w0.len()), w0.clone(), hyper.clone(), 2, shard);
        let many = walked_by(Store::with_shard_len(layout(w0.len()), w0.clone(), hyper, 2, shard), threads);
        for s in [&one, &many] {
            s.pull(1).unwrap();
            for (k, g) in grads.iter().enumerate() {
                // Worker 0 pulls before each push; worker 1 pushes against its first pull.
                let worker = k % 2;
                let v = if worker == 0 { s.pull(0).unwrap().version() } else { 0 };
                s.push(push(worker, v, k as u64 + 1), g).unwrap();
            }
        }
        let (a, b) = (one.snapshot_now(), many.snapshot_now());
        prop_assert_eq!(a.params(), b.params());
        prop_assert_eq!(one.checkpoint(), many.checkpoint());
    }

    /// With every worker pulling right before its push (τ = 0), DC-ASGD equals ASGD.
    #[test]
    fn dc_asgd_with_fresh_pulls_equals_asgd(
        (w0, grads) in (1usize..30, 1usize..8).prop_flat_map(|(n, k)| (vec_of(n), proptest::collection::vec(vec_of(n), k))),
        adaptive in any::<bool>(),
    ) {
        let dc = Store::with_shard_len(layout(w0.len()), w0.clone(),
            Hyper::new(if adaptive { Algorithm::DcAsgdA } else { Algorithm::DcAsgdC }, 0.1), 3, 5);
        let asgd = Store::with_shard_len(layout(w0.len()), w0.clone(), Hyper::new(Algorithm::Asgd, 0.1), 3, 5);
        for (k, g) in grads.iter().enumerate() {
            let worker = k % 3;
            for s in [&dc, &asgd] {
                let v = s.pull(worker).unwrap().version();
                let o = s.push(push(worker, v, k as u64 + 1), g).unwrap();
                prop_assert_eq!(o.staleness, 0);
            }
        }
        let (a, b) = (dc.snapshot_now(), asgd.snapshot_now());
        prop_assert_eq!(a.params(), b.params());
    }
}

#[test]
fn a_refused_sync_push_does_not_move_the_learning_rate() {
    let mut hyper = Hyper::new(Algorithm::Sync, 0.1);
    hyper.lr = crate::optimizer::LrSchedule { base: 0.1, factor: 0.1, milestones: vec![6.0], warmup: 0.0 };
    let s = Store::with_shard_len(layout(2), vec![0.0; 2], hyper, 2, 1);
    s.push(Push { epoch: Some(1.0), ..push(0, 0, 1) }, &[1.0, 1.0]).unwrap();
    let refused = s.push(Push { epoch: Some(7.0), ..push(0, 0, 2) }, &[1.0, 1.0]).unwrap_err();
    assert_eq!(refused.reason(), "already_contributed");
    assert_eq!(s.status().learning_rate, 0.1);
    assert_eq!(s.status().epoch, 1.0);
}

#[test]
fn restore_remembers_applied_seqs_and_finalization() {
    let hyper = Hyper::new(Algorithm::Asgd, 1.0);
    let a = Store::with_shard_len(layout(2), vec![0.0; 2], hyper.clone(), 2, 1);
    a.push(push(0, 0, 5), &[1.0, 1.0]).unwrap();
    let data = a.checkpoint();
    assert_eq!(data.worker_seqs, [Some(5), None]);
    let b = Store::restore(layout(2), data, hyper.clone(), 2);
    // The retry of seq 5 was applied before the restart: it is a replay, not a second update.
    let replay = b.push(push(0, 1, 5), &[1.0, 1.0]).unwrap();
    assert!(replay.replayed);
    assert_eq!(b.version(), 1);
    assert_eq!(b.push(push(0, 1, 4), &[1.0, 1.0]).unwrap_err().reason(), "stale_seq");
    b.push(push(0, 1, 6), &[1.0, 1.0]).unwrap();
    b.push(push(1, 2, 1), &[1.0, 1.0]).unwrap();
    let done = b.finalize();
    assert!(done.finalized);
    let c = Store::restore(layout(2), done, hyper, 2);
    assert!(c.is_finalized());
    assert_eq!(c.push(push(1, 3, 2), &[1.0, 1.0]).unwrap_err(), StoreError::Finalized);
}

#[test]
fn sync_seqs_become_durable_when_their_round_is_applied() {
    let s = store(Algorithm::Sync, 0.1, vec![0.0; 2], 2, 1);
    s.push(push(0, 0, 3), &[1.0, 1.0]).unwrap();
    // Round not applied yet: a restart would lose the contribution, so its seq is not durable.
    assert_eq!(s.checkpoint().worker_seqs, [None, None]);
    s.push(push(1, 0, 8), &[1.0, 1.0]).unwrap();
    assert_eq!(s.checkpoint().worker_seqs, [Some(3), Some(8)]);
}

fn pushed_by(worker: usize, generation: u64, version: u64, seq: u64) -> Push {
    Push { generation: Some(generation), ..push(worker, version, seq) }
}

/// The bug this prevents: a replacement worker that numbered its steps from 1 again was
/// answered `stale_seq` forever, so one lost pod failed the whole job.
#[test]
fn a_new_incarnation_starts_clean_and_resumes_after_the_steps_in_the_model() {
    let s = store(Algorithm::Asgd, 1.0, vec![0.0; 2], 2, 1);
    let first = s.join(0, None).unwrap();
    assert_eq!((first.generation, first.resume_step, first.version), (1, 0, 0));
    for step in 1..=22 {
        s.push(pushed_by(0, 1, s.version(), step), &[1.0, 1.0]).unwrap();
    }
    // The process dies with step 23 in flight; its replacement joins.
    let second = s.join(0, None).unwrap();
    assert_eq!((second.generation, second.resume_step, second.version), (2, 22, 22));
    // The dead process's late push of step 23 is refused and changes nothing ...
    let late = s.push(pushed_by(0, 1, 22, 23), &[5.0, 5.0]).unwrap_err();
    assert_eq!(late, StoreError::Superseded { worker: 0, got: 1, current: 2 });
    assert_eq!((s.version(), s.snapshot_now().params()), (22, &[-22.0, -22.0][..]));
    // ... while the new one's step 23 is applied, not mistaken for a replay of the old one's.
    let o = s.push(pushed_by(0, 2, 22, 23), &[1.0, 1.0]).unwrap();
    assert!(o.applied && !o.replayed && o.version == 23);
    // A generation the PS never handed out (a restore from an older checkpoint): join again.
    assert_eq!(s.push(pushed_by(0, 3, 23, 24), &[1.0, 1.0]).unwrap_err().reason(), "rejoin_required");
    // The other worker is untouched; a worker further along than the PS knows keeps its place.
    assert_eq!(s.join(1, Some(40)).unwrap().resume_step, 40);
    assert_eq!(s.status().workers[0].generation, 2);
}

#[test]
fn generations_survive_a_checkpoint() {
    let hyper = Hyper::new(Algorithm::Asgd, 1.0);
    let a = Store::with_shard_len(layout(2), vec![0.0; 2], hyper.clone(), 2, 1);
    a.join(0, None).unwrap();
    a.join(0, None).unwrap();
    a.push(pushed_by(0, 2, 0, 7), &[1.0, 1.0]).unwrap();
    let data = a.checkpoint();
    assert_eq!(data.worker_generations, [2, 0]);
    let b = Store::restore(layout(2), data, hyper, 2);
    assert_eq!(b.push(pushed_by(0, 1, 1, 8), &[1.0, 1.0]).unwrap_err().reason(), "superseded");
    assert!(b.push(pushed_by(0, 2, 1, 7), &[1.0, 1.0]).unwrap().replayed);
    assert_eq!(b.join(0, None).unwrap(), Joined { generation: 3, resume_step: 7, version: 1, workers: 2 });
}

#[test]
fn a_fresher_copy_replaces_a_seeded_model_until_the_first_update() {
    let hyper = Hyper::new(Algorithm::DcAsgdA, 0.1);
    let s = Store::seeded(layout(2), vec![1.0, 1.0], 100, hyper, 2);
    assert_eq!(s.version(), 100);
    // Seeded from one worker's copy: nobody's w_bak is known, so everyone pulls first.
    assert_eq!(s.push(push(0, 100, 1), &[1.0, 1.0]).unwrap_err().reason(), "pull_required");
    assert!(!s.takes_copy(90) && !s.reseed(&[9.0, 9.0], 90), "an older copy is refused");
    assert!(!s.reseed(&[9.0, 9.0], 100), "so is one as fresh");
    s.pull(0).unwrap();
    assert!(s.takes_copy(120) && s.reseed(&[2.0, 2.0], 120));
    assert_eq!((s.version(), s.snapshot_now().params()), (120, &[2.0, 2.0][..]));
    // The pull before the re-seed is not a backup of the new model.
    assert_eq!(s.push(push(0, 100, 1), &[1.0, 1.0]).unwrap_err().reason(), "pull_required");
    s.pull(0).unwrap();
    s.push(push(0, 120, 1), &[1.0, 1.0]).unwrap();
    assert!(!s.takes_copy(500) && !s.reseed(&[3.0, 3.0], 500), "training has moved on from the seed");
    assert_eq!(s.version(), 121);
}

#[test]
fn a_registered_model_takes_a_fresher_copy_even_after_updates() {
    // The PS lost the job's model and a new worker registered its initial weights first: a
    // surviving worker's copy of v50 replaces it, though two updates were applied to it.
    let s = Store::registered(layout(2), vec![0.0, 0.0], 0, Hyper::new(Algorithm::Asgd, 1.0), 2);
    s.push(push(1, 0, 1), &[1.0, 1.0]).unwrap();
    s.push(push(1, 1, 2), &[1.0, 1.0]).unwrap();
    assert!(!s.takes_copy(2) && !s.reseed(&[9.0, 9.0], 2), "not as fresh as the model");
    assert!(s.takes_copy(50) && s.reseed(&[5.0, 5.0], 50));
    assert_eq!((s.version(), s.snapshot_now().params()), (50, &[5.0, 5.0][..]));
    // Gradients computed on the registered model are refused, even under asgd.
    assert_eq!(s.push(push(1, 2, 3), &[1.0, 1.0]).unwrap_err().reason(), "pull_required");
    assert_eq!(s.version(), 50);
    s.push(push(1, 50, 3), &[1.0, 1.0]).unwrap();
    // From now on it is a copy's model: a fresher copy after an update is refused.
    assert!(!s.takes_copy(500), "training has moved on from the copy");
    // A model restored or seeded (not registered) never takes a copy after an update.
    let kept = store(Algorithm::Asgd, 1.0, vec![0.0, 0.0], 2, 2);
    kept.push(push(0, 0, 1), &[1.0, 1.0]).unwrap();
    assert!(!kept.takes_copy(50));
}

#[test]
fn backup_workers_close_a_round_with_the_first_m_minus_b_gradients() {
    let mut hyper = Hyper::new(Algorithm::Sync, 1.0);
    hyper.backup_workers = 1;
    let s = Store::with_shard_len(layout(2), vec![0.0; 2], hyper, 3, 1);
    assert!(!s.push(push(0, 0, 1), &[1.0, 0.0]).unwrap().applied);
    let o = s.push(push(2, 0, 1), &[3.0, 2.0]).unwrap();
    assert!(o.applied && o.version == 1);
    assert_eq!(s.snapshot_now().params(), &[-2.0, -1.0], "the mean of the two that came");
    assert_eq!(s.push(push(1, 0, 1), &[9.0, 9.0]).unwrap_err().reason(), "round_closed");
    assert_eq!(s.rounds_closed_short(), 1);
    // Durable seqs: the late worker's is unchanged (None), not overwritten.
    assert_eq!(s.checkpoint().worker_seqs, [Some(1), None, Some(1)]);
}

/// A round closed with k of its whole M − b gradients steps k/(M − b) as far as a whole round
/// (its mean counts the missing gradients as zero), whatever closed it; a whole round, backup
/// workers' rounds included, is the mean of what it holds, and `combine: sum` is the sum.
#[test]
fn a_round_closed_short_steps_as_far_as_its_share_of_a_whole_round() {
    // 4 workers, 1 backup: a whole round is 3 gradients.
    let mut hyper = Hyper::new(Algorithm::Sync, 1.0);
    hyper.backup_workers = 1;
    let s = Store::with_shard_len(layout(1), vec![0.0], hyper.clone(), 4, 1);
    let generations: Vec<u64> = (0..4).map(|m| s.join(m, None).unwrap().generation).collect();
    let step = |s: &Store| {
        let before = s.snapshot_now().params()[0];
        move |s: &Store| before - s.snapshot_now().params()[0]
    };
    // Whole: the first 3 of 4, each 6.
    let moved = step(&s);
    for m in 0..3 {
        s.push(push(m, 0, 1), &[6.0]).unwrap();
    }
    assert_eq!(moved(&s), 6.0);
    // The round timeout closes a round of 2: 12 over 3.
    let moved = step(&s);
    s.push(push(0, 1, 2), &[6.0]).unwrap();
    s.push(push(1, 1, 2), &[6.0]).unwrap();
    s.close_round(1).expect("closed");
    assert_eq!(moved(&s), 4.0);
    // The other three silent: a round of 1 closes at once, and steps a third.
    s.set_silent(1, true);
    s.set_silent(2, true);
    let moved = step(&s);
    s.push(push(0, 2, 3), &[6.0]).unwrap();
    assert_eq!(s.set_silent(3, true).map(|o| o.version), Some(3));
    assert_eq!(moved(&s), 2.0);
    // Workers that finished their steps: the last one training alone steps a third too.
    for (m, generation) in generations.iter().enumerate().skip(1) {
        s.set_silent(m, false);
        s.leave(m, *generation).unwrap();
    }
    let moved = step(&s);
    assert!(s.push(push(0, 3, 4), &[6.0]).unwrap().applied);
    assert_eq!(moved(&s), 2.0);
    // Scaled down to 2 workers (a whole round of 1): a round of one is whole.
    let s = Store::with_shard_len(layout(1), vec![0.0], hyper.clone(), 4, 1);
    s.set_workers(2);
    assert!(s.push(push(1, 0, 1), &[6.0]).unwrap().applied);
    assert_eq!(s.snapshot_now().params(), &[-6.0]);
    // combine: sum adds what came.
    hyper.combine = Combine::Sum;
    let s = Store::with_shard_len(layout(1), vec![0.0], hyper, 4, 1);
    s.push(push(0, 0, 1), &[6.0]).unwrap();
    s.close_round(0).expect("closed");
    assert_eq!(s.snapshot_now().params(), &[-6.0]);
}

#[test]
fn an_open_round_can_be_closed_with_the_gradients_it_has() {
    let s = store(Algorithm::Sync, 1.0, vec![0.0; 2], 3, 1);
    assert_eq!(s.close_round(0), None, "an empty round is left alone");
    s.push(push(1, 0, 4), &[3.0, 6.0]).unwrap();
    assert_eq!(s.sync_round(), Some((0, 1)));
    assert_eq!(s.close_round(7), None, "only the round of the version named");
    let o = s.close_round(0).expect("closed");
    assert_eq!((o.version, s.version()), (1, 1));
    assert_eq!(s.snapshot_now().params(), &[-1.0, -2.0], "one gradient of three: a third of the step");
    assert_eq!(s.sync_round(), Some((1, 0)));
    assert_eq!(s.rounds_closed_short(), 1);
    assert_eq!(store(Algorithm::Asgd, 1.0, vec![0.0; 2], 3, 1).sync_round(), None);
}

#[test]
fn a_job_scaled_up_and_down_follows_its_worker_count() {
    let s = store(Algorithm::Sync, 1.0, vec![0.0; 2], 2, 1);
    assert_eq!(s.pull(2).err(), Some(StoreError::UnknownWorker { worker: 2, workers: 2 }));
    // Up to 3: worker 2 joins, pulls and its gradient is part of the round, which now needs 3.
    s.set_workers(3);
    assert_eq!(s.join(2, None).unwrap().workers, 3);
    s.pull(2).unwrap();
    assert!(!s.push(push(0, 0, 1), &[3.0, 0.0]).unwrap().applied);
    assert!(!s.push(push(1, 0, 1), &[0.0, 3.0]).unwrap().applied, "two of three is not a round any more");
    let o = s.push(push(2, 0, 1), &[3.0, 3.0]).unwrap();
    assert!(o.applied && o.version == 1);
    assert_eq!(s.snapshot_now().params(), &[-2.0, -2.0], "the mean of three");
    assert_eq!(s.status().workers.len(), 3);
    // Down to 2: the highest index is gone, its entries kept for a later scale-up.
    s.set_workers(2);
    assert_eq!(s.push(push(2, 1, 2), &[1.0, 1.0]).unwrap_err().reason(), "unknown_worker");
    s.push(push(0, 1, 2), &[1.0, 1.0]).unwrap();
    assert!(s.push(push(1, 1, 2), &[1.0, 1.0]).unwrap().applied, "two make a round again");
    assert_eq!(s.status().workers.len(), 2);
    assert_eq!(s.checkpoint().worker_seqs, [Some(2), Some(2), Some(1)]);
    // A restore at the old count keeps the scaled-away worker's seq for when it comes back.
    let r = Store::restore(layout(2), s.checkpoint(), Hyper::new(Algorithm::Sync, 1.0), 2);
    assert_eq!(r.workers(), 2);
    r.set_workers(3);
    assert_eq!(r.join(2, None).unwrap().resume_step, 1);
}

/// The protocol: a scale-up changes the quorum from the next round on. A round that already
/// has gradients closes with the membership it started with; the new worker may still add
/// its gradient to it.
#[test]
fn a_scale_up_mid_round_counts_from_the_next_round() {
    let s = store(Algorithm::Sync, 1.0, vec![0.0; 2], 2, 1);
    assert!(!s.push(push(0, 0, 1), &[2.0, 0.0]).unwrap().applied);
    s.set_workers(3);
    let o = s.push(push(1, 0, 1), &[0.0, 2.0]).unwrap();
    assert!(o.applied && o.version == 1, "the round of two closes with two");
    assert_eq!(s.snapshot_now().params(), &[-1.0, -1.0]);
    assert_eq!(s.rounds_closed_short(), 0);
    // The next round is a round of three.
    s.pull(2).unwrap();
    assert!(!s.push(push(0, 1, 2), &[1.0, 1.0]).unwrap().applied);
    assert!(!s.push(push(1, 1, 2), &[1.0, 1.0]).unwrap().applied, "two of three is not a round");
    assert!(s.push(push(2, 1, 1), &[1.0, 1.0]).unwrap().applied);
    // A scale-down mid-round counts at once: the removed worker could never contribute.
    s.push(push(0, 2, 3), &[1.0, 1.0]).unwrap();
    s.set_workers(2);
    assert!(s.push(push(1, 2, 3), &[1.0, 1.0]).unwrap().applied);
}

/// Finalize leaves a partial `sync` round open (the final model is the last version); a worker
/// whose gradient is in it re-pushes it while it waits, and must hear that the job ended.
#[test]
fn a_worker_waiting_in_a_round_that_finalize_left_open_hears_the_job_ended() {
    let s = store(Algorithm::Sync, 1.0, vec![0.0; 2], 2, 1);
    assert!(!s.push(push(0, 0, 1), &[1.0, 1.0]).unwrap().applied);
    s.finalize();
    assert_eq!(s.push(push(0, 0, 1), &[1.0, 1.0]).unwrap_err().reason(), "finalized");
    assert_eq!(s.answer_before_body(push(0, 0, 1)).unwrap().unwrap_err().reason(), "finalized");
    assert_eq!(s.version(), 0);
}

#[test]
fn a_worker_scaled_away_leaves_no_model_copy_behind() {
    let s = store(Algorithm::DcAsgdA, 0.1, vec![0.0; 4], 3, 2);
    // Three backups at three versions: three copies beside the pull cache.
    s.pull(0).unwrap();
    s.push(push(0, 0, 1), &[1.0; 4]).unwrap();
    s.pull(1).unwrap();
    s.push(push(1, 1, 1), &[1.0; 4]).unwrap();
    s.pull(2).unwrap();
    assert_eq!(s.snapshots_held(), 3);
    s.set_workers(1);
    assert_eq!(s.snapshots_held(), 2, "workers 1 and 2's backups are freed (the cache keeps v2)");
    // Scaled back: worker 2 must pull again before its push counts.
    s.set_workers(3);
    assert_eq!(s.push(push(2, 2, 1), &[1.0; 4]).unwrap_err().reason(), "pull_required");
    s.pull(2).unwrap();
    assert!(s.push(push(2, 2, 1), &[1.0; 4]).unwrap().applied);
}

#[test]
fn snapshots_of_later_versions_reuse_released_buffers() {
    let s = store(Algorithm::Asgd, 1.0, vec![0.0; 100], 1, 16);
    let mut buffers = std::collections::HashSet::new();
    for v in 0..6u64 {
        let snap = s.pull(0).unwrap();
        assert_eq!(snap.version(), v);
        let f32_header = s.gradient_encodings()[0].header;
        assert_eq!(&snap.bytes()[..f32_header.len()], f32_header);
        assert!(snap.params().iter().all(|&x| x == -(v as f32)), "version {v}: {:?}", &snap.params()[..4]);
        buffers.insert(snap.params().as_ptr() as usize);
        drop(snap);
        s.push(push(0, v, v + 1), &[1.0; 100]).unwrap();
    }
    // The pull cache holds the newest version while the next one is copied: two buffers take
    // turns, and no version after the second allocates.
    assert_eq!(buffers.len(), 2);
}

#[test]
fn released_snapshots_beyond_the_spares_are_freed() {
    let workers = 8;
    let s = store(Algorithm::DcAsgdA, 0.1, vec![0.0; 64], workers, 16);
    for m in 0..workers {
        s.pull(m).unwrap();
        s.push(push(m, m as u64, 1), &[1.0; 64]).unwrap();
    }
    assert_eq!(s.snapshots_held(), workers);
    // Worker 0's backup (version 0) and the pull cache (version 7, worker 7's) stay.
    s.set_workers(1);
    assert_eq!(s.snapshots_held(), 2);
    assert_eq!(s.spare_snapshots(), SPARE_SNAPSHOTS, "6 backups released, {SPARE_SNAPSHOTS} kept");
}

#[test]
fn a_sync_round_closes_once_it_holds_every_still_training_workers_gradient() {
    // 4 workers, 1 backup: rounds close with 3 gradients. Workers 0 and 1 finished their steps
    // (they left); 2 and 3 train on. Before `leave`, their rounds could never reach 3 again.
    let mut hyper = Hyper::new(Algorithm::Sync, 0.5);
    hyper.backup_workers = 1;
    let s = Store::with_shard_len(layout(2), vec![0.0; 2], hyper, 4, 2);
    let generations: Vec<u64> = (0..4).map(|m| s.join(m, None).unwrap().generation).collect();
    s.leave(0, generations[0]).unwrap();
    let o = s.push(push(2, 0, 1), &[1.0, 1.0]).unwrap();
    assert!(!o.applied, "3 workers still train: the round waits for 2 of them");
    s.push(push(3, 0, 1), &[5.0, 5.0]).unwrap();
    let o =
        s.leave(1, generations[1]).unwrap().expect("the round holds both still-training workers' gradients");
    assert_eq!(o.version, 1);
    assert_eq!(
        s.snapshot_now().params(),
        &[-1.0, -1.0],
        "1 and 5 over a whole round's 3 (M − b), at learning rate 0.5"
    );
    assert_eq!(s.rounds_closed_short(), 0, "no still-training worker was missing");
    // The next round needs only workers 2 and 3.
    s.push(push(2, 1, 2), &[1.0, 1.0]).unwrap();
    assert!(s.push(push(3, 1, 2), &[1.0, 1.0]).unwrap().applied);
    assert_eq!(s.status().version, 2);
}

#[test]
fn only_the_current_incarnation_of_a_worker_can_leave_and_a_new_one_trains_again() {
    let mut hyper = Hyper::new(Algorithm::Sync, 1.0);
    hyper.backup_workers = 0;
    let s = Store::with_shard_len(layout(1), vec![0.0], hyper, 2, 1);
    let first = s.join(0, None).unwrap().generation;
    let second = s.join(0, None).unwrap().generation;
    assert_eq!(s.leave(0, first).unwrap_err().reason(), "superseded");
    assert_eq!(s.leave(0, second + 1).unwrap_err().reason(), "rejoin_required");
    assert!(!s.status().workers[0].finished, "a refused leave changes nothing");
    s.leave(0, second).unwrap();
    assert!(s.status().workers[0].finished);
    s.join(0, None).unwrap();
    assert!(!s.status().workers[0].finished, "a process joining as the worker trains again");
}

#[test]
fn a_partial_round_is_not_closed_after_finalize() {
    let s = store(Algorithm::Sync, 1.0, vec![0.0; 2], 3, 1);
    s.push(push(1, 0, 1), &[2.0, 4.0]).unwrap();
    let last = s.finalize();
    assert_eq!(s.close_round(0), None, "the round timeout must not move the model past its final version");
    assert_eq!(s.status().version, last.version);
    assert_eq!(s.snapshot_now().params(), &last.params[..]);
}

#[test]
fn a_worker_whose_last_gradient_is_in_the_round_still_counts_when_it_leaves() {
    // 3 workers, no backups: worker 0 contributes its last gradient, then leaves. The round
    // still needs workers 1 and 2: it must not close with 0's and 1's alone.
    let s = store(Algorithm::Sync, 1.0, vec![0.0], 3, 1);
    let g0 = s.join(0, None).unwrap().generation;
    s.push(push(0, 0, 1), &[3.0]).unwrap();
    assert_eq!(s.leave(0, g0).unwrap(), None, "the round waits for 1 and 2");
    assert!(!s.push(push(1, 0, 1), &[3.0]).unwrap().applied, "worker 2 has not contributed");
    let o = s.push(push(2, 0, 1), &[3.0]).unwrap();
    assert!(o.applied && o.version == 1);
    assert_eq!(s.rounds_closed_short(), 0);
    // From the next round on, worker 0 is not waited for.
    s.push(push(1, 1, 2), &[1.0]).unwrap();
    assert!(s.push(push(2, 1, 2), &[1.0]).unwrap().applied);
}

#[test]
fn a_silent_worker_stops_holding_up_sync_rounds_until_it_is_heard_again() {
    // 3 workers, no backups: worker 2 falls silent (dead or stopped) with rounds to go.
    let s = store(Algorithm::Sync, 1.0, vec![0.0], 3, 1);
    s.push(push(0, 0, 1), &[1.0]).unwrap();
    s.push(push(1, 0, 1), &[1.0]).unwrap();
    let o = s.set_silent(2, true).expect("the round holds every gradient that can still come");
    assert_eq!((o.version, s.rounds_closed_short()), (1, 1));
    assert!(s.status().workers[2].silent);
    // Later rounds close as soon as the two live workers contributed: no timeout each time
    // (closed short all the same: worker 2 has not finished its steps).
    s.push(push(0, 1, 2), &[1.0]).unwrap();
    assert!(s.push(push(1, 1, 2), &[1.0]).unwrap().applied);
    assert_eq!(s.rounds_closed_short(), 2);
    // Heard again: it counts from the round in progress on.
    assert_eq!(s.set_silent(2, false), None);
    s.push(push(0, 2, 3), &[1.0]).unwrap();
    assert!(!s.push(push(1, 2, 3), &[1.0]).unwrap().applied, "the round waits for worker 2 again");
    assert!(s.push(push(2, 2, 1), &[1.0]).unwrap().applied);
    // A worker whose gradient is in the round still counts when it falls silent.
    s.push(push(2, 3, 2), &[1.0]).unwrap();
    assert_eq!(s.set_silent(2, true), None, "workers 0 and 1 have not contributed");
    s.push(push(0, 3, 4), &[1.0]).unwrap();
    assert!(s.push(push(1, 3, 4), &[1.0]).unwrap().applied);
    // Not after finalize, and not for a worker outside the job.
    s.push(push(0, 4, 5), &[1.0]).unwrap();
    s.finalize();
    assert_eq!(s.set_silent(1, true), None);
    assert_eq!(s.set_silent(7, true), None);
}

/// What a `sync` worker does next in [`a_sync_round_only_ever_waits_for_a_worker_that_can_still_send`].
#[derive(Clone, Copy, Debug)]
enum Event {
    /// Pull, compute, push a gradient for the version pulled.
    Push,
    /// SIGSTOP, or dead: after the silence timeout the PS marks it silent.
    Stop,
    /// SIGCONT: its next request is heard.
    Resume,
    /// SIGKILL and a new process joins as the worker.
    Restart,
    /// It trained all its steps and leaves.
    Finish,
    /// The round timeout passes.
    Timeout,
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        6 => Just(Event::Push),
        1 => Just(Event::Stop),
        1 => Just(Event::Resume),
        1 => Just(Event::Restart),
        1 => Just(Event::Finish),
        1 => Just(Event::Timeout),
    ]
}

/// The driver's view of one worker process.
#[derive(Clone, Copy, Default)]
struct Proc {
    generation: u64,
    seq: u64,
    stopped: bool,
    finished: bool,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A `sync` job never hangs: whatever pauses, kills, restarts and finishes happen at any
    /// point of a round, an open round always has a worker that can still send the gradient it
    /// waits for (running, not finished, not yet in the round). The round timeout is only a
    /// fallback for the time before the PS notices a silent worker.
    #[test]
    fn a_sync_round_only_ever_waits_for_a_worker_that_can_still_send(
        (m, b) in (1usize..5).prop_flat_map(|m| (Just(m), 0..m)),
        script in proptest::collection::vec((0usize..4, event()), 1..80),
    ) {
        let mut hyper = Hyper::new(Algorithm::Sync, 0.1);
        hyper.backup_workers = b;
        let s = Store::with_shard_len(layout(2), vec![0.0; 2], hyper, m, 1);
        let mut procs: Vec<Proc> = (0..m).map(|w| Proc { generation: s.join(w, None).unwrap().generation, ..Proc::default() }).collect();
        for (w, e) in script {
            let w = w % m;
            let p = &mut procs[w];
            let live = !p.stopped && !p.finished;
            match e {
                Event::Push if live => {
                    let version = s.pull(w).unwrap().version();
                    p.seq += 1;
                    let push = Push { worker: w, generation: Some(p.generation), version, seq: p.seq, epoch: None, body: None };
                    let _ = s.push(push, &[1.0, -1.0]);
                }
                Event::Stop if live => {
                    p.stopped = true;
                    s.set_silent(w, true);
                }
                Event::Resume if p.stopped => {
                    p.stopped = false;
                    s.set_silent(w, false);
                }
                Event::Restart => {
                    s.set_silent(w, false);
                    *p = Proc { generation: s.join(w, None).unwrap().generation, ..Proc::default() };
                }
                Event::Finish if live => {
                    p.finished = true;
                    s.leave(w, p.generation).unwrap();
                }
                Event::Timeout => {
                    let (version, _) = s.sync_round().unwrap();
                    s.close_round(version);
                }
                _ => {}
            }
            let round = s.round.lock();
            if round.count > 0 {
                let waits_for_someone = (0..m).any(|i| {
                    !procs[i].stopped && !procs[i].finished && round.contributed[i].is_none()
                });
                prop_assert!(waits_for_someone, "round {} holds {} gradients and no worker that can still send one is missing", round.version, round.count);
            }
        }
    }
}

/// Under a momentum delay of N the store's asynchronous updates, with shards of 3 elements,
/// end each cycle of N where a `sync` store's one round of the same gradients does (Nesterov on
/// their mean); between milestones the momentum is untouched, and a checkpoint carries it.
#[test]
fn delayed_nesterov_cycles_match_sync_rounds_in_the_store() {
    let (n, len) = (4usize, 7usize);
    let w0: Vec<f32> = (0..len).map(|i| i as f32 * 0.1 - 0.3).collect();
    let mut delayed = Hyper::new(Algorithm::Asgd, 0.7);
    (delayed.momentum, delayed.nesterov, delayed.momentum_delay) = (0.9, true, n as u32);
    let mut sync = Hyper::new(Algorithm::Sync, 0.7);
    (sync.momentum, sync.nesterov) = (0.9, true);
    let a = Store::with_shard_len(layout(len), w0.clone(), delayed, n, 3);
    let s = Store::with_shard_len(layout(len), w0, sync, n, 3);
    for round in 0..3u64 {
        for k in 0..n {
            let g: Vec<f32> = (0..len).map(|i| ((i * 7 + k * 3 + round as usize) % 5) as f32 - 2.0).collect();
            a.push(push(k, a.version(), round + 1), &g).unwrap();
            s.push(push(k, s.version(), round + 1), &g).unwrap();
            let momentum = a.checkpoint().state.momentum;
            if k + 1 < n {
                assert_eq!(momentum, s.checkpoint().state.momentum, "the momentum waits for the N-th update");
            }
        }
        let (got, want) = (a.snapshot_now().params().to_vec(), s.snapshot_now().params().to_vec());
        assert!(
            got.iter().zip(&want).all(|(x, y)| (x - y).abs() < 1e-5),
            "round {round}: {got:?} vs {want:?}"
        );
    }
}

/// A PS restored from a checkpoint taken in the middle of a Delayed Nesterov cycle goes on
/// bit for bit as one that never stopped: the pending sum is in the checkpoint (it was lost
/// before, and the next milestone stepped the momentum on fewer gradients).
#[test]
fn a_store_restored_mid_cycle_continues_delayed_nesterov_bit_for_bit() {
    let (n, len) = (4usize, 7usize);
    let w0: Vec<f32> = (0..len).map(|i| i as f32 * 0.1 - 0.3).collect();
    let mut h = Hyper::new(Algorithm::Asgd, 0.7);
    (h.momentum, h.nesterov, h.momentum_delay) = (0.9, true, n as u32);
    let through = Store::with_shard_len(layout(len), w0.clone(), h.clone(), 2, 3);
    let before = Store::with_shard_len(layout(len), w0, h.clone(), 2, 3);
    let grad = |k: usize| -> Vec<f32> { (0..len).map(|i| ((i * 5 + k * 3) % 7) as f32 - 3.0).collect() };
    for k in 0..6 {
        through.push(push(k % 2, through.version(), k as u64 + 1), &grad(k)).unwrap();
        before.push(push(k % 2, before.version(), k as u64 + 1), &grad(k)).unwrap();
    }
    let data = before.checkpoint();
    assert!(data.state.pending.iter().any(|p| *p != 0.0), "two gradients pending at version 6");
    let restored = Store::restore(layout(len), data, h, 2);
    for k in 6..12 {
        through.push(push(k % 2, through.version(), k as u64 + 1), &grad(k)).unwrap();
        restored.push(push(k % 2, restored.version(), k as u64 + 1), &grad(k)).unwrap();
    }
    let bits = |s: &Store| s.snapshot_now().params().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&restored), bits(&through));
    assert_eq!(restored.checkpoint().state, through.checkpoint().state);
}

/// A panic in one operation's turn on a shard (a bug) fails that operation only: before, the
/// shard's turn never passed on, and every later push, pull and checkpoint waited for ever.
#[test]
fn a_panic_in_one_turn_passes_the_turn_on() {
    let shard = Shard {
        range: 0..2,
        data: Mutex::new(ShardData {
            next_op: 0,
            w: vec![0.0; 2],
            state: OptimizerState::new(&Hyper::new(Algorithm::Asgd, 0.1), 2),
        }),
        turn: Condvar::new(),
    };
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        enter(&shard, 0, |_, _| panic!("a bug in an update"));
    }));
    assert!(panicked.is_err(), "the panic goes on up");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            enter(&shard, 1, |_, d| d.w[0] = 1.0);
            tx.send(()).unwrap();
        });
        let passed = rx.recv_timeout(std::time::Duration::from_secs(5));
        if passed.is_err() {
            // Unblock the waiter so the scope can end, then fail.
            shard.data.lock().next_op = 1;
            shard.turn.notify_all();
        }
        assert!(passed.is_ok(), "the next operation waited behind the panicked one");
    });
    assert_eq!(shard.data.lock().w[0], 1.0);
}
