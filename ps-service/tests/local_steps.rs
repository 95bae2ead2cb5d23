//! Local steps with an outer optimizer on the PS (DiLoCo-style), over the real client and a
//! real HTTP/2 server: a worker trains `h` steps on its own copy, then pushes its
//! pseudo-gradient θ_pulled − θ_local once; the PS applies its rule to it, here with Nesterov
//! momentum (DiLoCo's outer step).

mod support;

use std::time::Duration;

use foresight_ps::client::{Cadence, GradDtype, PushStats, StepEnd};
use foresight_ps::optimizer::Algorithm;
use support::*;

const H: u64 = 4;
const INNER_LR: f32 = 0.05;
const OUTER_LR: f32 = 0.7;
const MU: f32 = 0.9;

/// `h` inner SGD steps from `from` with the scripted gradients of steps `first..first + h`.
fn inner_steps(from: &[f32], first: u64) -> Vec<f32> {
    let l = layout();
    let mut w = from.to_vec();
    for k in first..first + H {
        for (x, g) in w.iter_mut().zip(grad(&l, k as usize)) {
            *x -= INNER_LR * g;
        }
    }
    w
}

#[test]
fn a_worker_pushes_one_pseudo_gradient_per_h_local_steps_and_the_ps_applies_nesterov_to_it() {
    let rt = runtime();
    let mut cfg = config(Algorithm::Asgd, 1);
    cfg.hyper.lr = foresight_ps::optimizer::LrSchedule::constant(OUTER_LR);
    (cfg.hyper.momentum, cfg.hyper.nesterov) = (MU, true);
    let ps = rt.block_on(start(cfg));
    let cadence = Cadence::local_steps(H, GradDtype::F32).unwrap();
    assert_eq!(cadence.local(), Some(H));
    let mut w = worker(&rt, std::slice::from_ref(&ps.url), cadence, 0, Duration::from_secs(30));

    // The worker's loop: pull when due, an inner step on the local copy, and at the h-th step
    // the pseudo-gradient into grad_mut.
    let (mut pulled, mut local) = (Vec::new(), Vec::new());
    let mut pulls = 0;
    for _ in 0..2 * H {
        if let Some(m) = w.pull_if_due().unwrap() {
            (pulled, local) = (m.values.clone(), m.values);
            pulls += 1;
        }
        local = {
            let l = layout();
            let g = grad(&l, w.step() as usize);
            local.iter().zip(g).map(|(x, g)| x - INNER_LR * g).collect()
        };
        if w.push_due_next() {
            for ((d, p), x) in w.grad_mut().iter_mut().zip(&pulled).zip(&local) {
                *d = p - x;
            }
        }
        assert_eq!(w.end_step(None).unwrap(), StepEnd::Continue);
    }
    assert_eq!(pulls, 2, "one pull per h steps");
    let status = ps.state.store().unwrap().status();
    assert_eq!(status.version, 2, "one update per h steps");

    // The PS's model: two Nesterov outer steps on the unscaled pseudo-gradients.
    let w0 = init(&layout());
    let mut m = vec![0f32; w0.len()];
    let mut model = w0.clone();
    for first in [0, H] {
        let after = inner_steps(&model, first);
        for ((x, mi), a) in model.iter_mut().zip(&mut m).zip(after) {
            let delta = *x - a;
            *mi = MU * *mi + delta;
            *x -= OUTER_LR * (delta + MU * *mi);
        }
    }
    let got = ps.state.store().unwrap().snapshot_now();
    let worst = got.params().iter().zip(&model).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst < 1e-5, "the PS's model is off the hand-computed outer steps by {worst}");
    assert!(got.params() != &w0[..], "the model moved");
}

/// A worker whose steps end between two exchanges (6 steps at h = 4) pushes the last 2 steps'
/// pseudo-gradient when it finishes: the model holds every step it trained.
#[test]
fn the_local_steps_left_at_the_end_are_pushed_by_finish() {
    let rt = runtime();
    let mut cfg = config(Algorithm::Asgd, 1);
    cfg.hyper.lr = foresight_ps::optimizer::LrSchedule::constant(OUTER_LR);
    let ps = rt.block_on(start(cfg));
    let cadence = Cadence::local_steps(H, GradDtype::F32).unwrap();
    let mut w = worker(&rt, std::slice::from_ref(&ps.url), cadence, 0, Duration::from_secs(30));
    let l = layout();
    let (mut pulled, mut local) = (Vec::new(), Vec::new());
    let pseudo = |pulled: &[f32], local: &[f32], out: &mut [f32]| {
        for ((d, p), x) in out.iter_mut().zip(pulled).zip(local) {
            *d = p - x;
        }
    };
    for _ in 0..H + 2 {
        if let Some(m) = w.pull_if_due().unwrap() {
            (pulled, local) = (m.values.clone(), m.values);
        }
        let g = grad(&l, w.step() as usize);
        local = local.iter().zip(g).map(|(x, g)| x - INNER_LR * g).collect();
        if w.push_due_next() {
            pseudo(&pulled, &local, w.grad_mut());
        }
        assert_eq!(w.end_step(None).unwrap(), StepEnd::Continue);
    }
    assert_eq!(ps.state.store().unwrap().status().version, 1, "one whole block of h steps pushed");
    assert_eq!(w.steps_unsent(), 2);
    pseudo(&pulled, &local, w.grad_mut());
    let last = w.finish(None).unwrap();
    assert_eq!((last.version, w.steps_unsent()), (2, 0), "finish pushed the 2 steps left");

    // By hand: an outer step after the first h inner steps, then one after the last 2.
    let mut model = init(&l);
    let after = inner_steps(&model, 0);
    for (x, a) in model.iter_mut().zip(after) {
        *x -= OUTER_LR * (*x - a);
    }
    let mut inner = model.clone();
    for k in H..H + 2 {
        for (x, g) in inner.iter_mut().zip(grad(&l, k as usize)) {
            *x -= INNER_LR * g;
        }
    }
    for (x, a) in model.iter_mut().zip(inner) {
        *x -= OUTER_LR * (*x - a);
    }
    let worst = last.values.iter().zip(&model).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst < 1e-5, "the final model is off the hand-computed steps by {worst}");
}

/// Every pushEvery = 3 steps the mean gradient; the 7th step, alone at the end, is pushed by
/// finish as its own mean (not divided by 3).
#[test]
fn a_gradient_window_cut_short_by_the_end_is_pushed_as_the_mean_of_its_own_steps() {
    let rt = runtime();
    let mut cfg = config(Algorithm::Asgd, 1);
    cfg.hyper.lr = foresight_ps::optimizer::LrSchedule::constant(OUTER_LR);
    let ps = rt.block_on(start(cfg));
    let cadence = Cadence::new(3, 3, GradDtype::F32).unwrap();
    let mut w = worker(&rt, std::slice::from_ref(&ps.url), cadence, 0, Duration::from_secs(30));
    let l = layout();
    for _ in 0..7 {
        w.pull_if_due().unwrap();
        let g = grad(&l, w.step() as usize);
        w.grad_mut().iter_mut().zip(g).for_each(|(acc, g)| *acc += g);
        assert_eq!(w.end_step(None).unwrap(), StepEnd::Continue);
    }
    let before = ps.state.store().unwrap().snapshot_now().params().to_vec();
    assert_eq!(ps.state.store().unwrap().status().version, 2);
    let last = w.finish(None).unwrap();
    assert_eq!(last.version, 3, "finish pushed the 7th step");
    let expected: Vec<f32> = before.iter().zip(grad(&l, 6)).map(|(x, g)| x - OUTER_LR * g).collect();
    let worst = last.values.iter().zip(&expected).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst < 1e-6, "the last push was not the 7th step's own gradient: off by {worst}");
}

/// A `sync` PS of 2 workers whose silence and round timeouts are both `timeout`, its watches on.
fn sync_ps(rt: &tokio::runtime::Runtime, timeout: Duration) -> Ps {
    let mut cfg = config(Algorithm::Sync, 2);
    cfg.worker_silence_timeout = timeout;
    cfg.sync_round_timeout = timeout;
    let ps = rt.block_on(start(cfg));
    rt.block_on(async {
        ps.state.spawn_presence_watch();
        ps.state.spawn_round_watch();
    });
    ps
}

/// Worker `m` joined now; run by the returned closure: a block of 6 local steps of `step_time`
/// each, its pseudo-gradient 0.01·(m + 1), then, with `pull_after`, the pull that waits for the
/// round holding that block (its version).
fn block_of(
    rt: &tokio::runtime::Runtime,
    ps: &Ps,
    m: usize,
    step_time: Duration,
    pull_after: bool,
) -> impl FnOnce() -> (Option<u64>, PushStats) + Send + 'static {
    let h = 6;
    let cadence = Cadence::local_steps(h, GradDtype::F32).unwrap();
    let mut w = worker(rt, std::slice::from_ref(&ps.url), cadence, m, Duration::from_secs(30));
    move || {
        w.pull_if_due().unwrap().expect("the first pull");
        for _ in 0..h {
            std::thread::sleep(step_time);
            if w.push_due_next() {
                w.grad_mut().fill(0.01 * (m + 1) as f32);
            }
            assert_eq!(w.end_step(None).unwrap(), StepEnd::Continue);
        }
        let version = pull_after.then(|| w.pull_if_due().unwrap().expect("the pull after the block").version);
        (version, w.stats())
    }
}

/// `sync` over blocks of local steps longer than the silence and round timeouts (0.4 s here; a
/// block of H steps on a real model often takes minutes): the slower worker's heartbeats,
/// sent from its loop between exchanges, keep it counted, so the round waits for its
/// pseudo-gradient. Before, it was marked silent mid-block, the round closed with the faster
/// worker's alone, and the slower one's whole block was refused `round_closed`.
#[test]
fn a_block_longer_than_the_silence_timeout_is_waited_for_not_thrown_away() {
    let rt = runtime();
    let ps = sync_ps(&rt, Duration::from_millis(400));
    // Both joined before either trains. The slow block: 0.9 s, a heartbeat every step.
    let (fast, slow) = (
        block_of(&rt, &ps, 0, Duration::ZERO, false),
        block_of(&rt, &ps, 1, Duration::from_millis(150), false),
    );
    let (fast, slow) = (std::thread::spawn(fast), std::thread::spawn(slow));
    let ((_, fast), (_, slow)) = (fast.join().unwrap(), slow.join().unwrap());
    let store = ps.state.store().unwrap();
    assert_eq!((fast.discarded, slow.discarded), (0, 0), "no block thrown away");
    assert_eq!(store.rounds_closed_short(), 0);
    assert_eq!(store.status().version, 1, "one round, both pseudo-gradients");
    assert!(!store.status().workers[1].silent, "the slow worker was never marked silent");
}

/// A worker that pushed its block and waits in a pull for its `sync` round to close (the
/// others' blocks are longer than the silence timeout) is on a live connection: it is never
/// marked silent. Before, the wait counted as silence; the worker's mark shrank the quorum and
/// the round closed without the slower worker's block, which was refused `round_closed`
/// (`make matrix-quick`'s long-block case on a loaded machine).
#[test]
fn a_worker_waiting_for_its_round_is_not_marked_silent() {
    let rt = runtime();
    let ps = sync_ps(&rt, Duration::from_millis(300));
    // Both joined before either trains. The slow block: 1.2 s.
    let (fast, slow) = (
        block_of(&rt, &ps, 0, Duration::ZERO, true),
        block_of(&rt, &ps, 1, Duration::from_millis(200), true),
    );
    let (fast, slow) = (std::thread::spawn(fast), std::thread::spawn(slow));
    let store = ps.state.store().unwrap();
    let mut marked = false;
    while !fast.is_finished() {
        marked |= store.status().workers[0].silent;
        std::thread::sleep(Duration::from_millis(10));
    }
    let ((fast_version, fast), (slow_version, slow)) = (fast.join().unwrap(), slow.join().unwrap());
    assert!(!marked, "the worker waiting for its round was marked silent");
    assert_eq!((fast.discarded, slow.discarded), (0, 0), "no block thrown away");
    assert_eq!(store.rounds_closed_short(), 0);
    assert_eq!((fast_version, slow_version), (Some(1), Some(1)), "one round, both pseudo-gradients");
}
