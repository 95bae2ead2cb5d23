//! Adaptive local steps (`optimizer.adaptiveLocalSteps`) over the real client and a real
//! HTTP/2 server: workers report their pace with each push, the PS answers how many local
//! steps each should train next, and the workers' client follows.

mod support;

use std::time::{Duration, Instant};

use foresight_ps::client::{Cadence, ClientError, GradDtype, PsClient, PushId, PushReply, StepEnd};
use foresight_ps::optimizer::Algorithm;
use foresight_ps::pace::{LocalStepsPolicy, PaceReport};
use support::*;

fn adaptive(workers: usize, start: u64, min: u64, max: u64, fraction: f64) -> foresight_ps::server::PsConfig {
    let mut cfg = config(Algorithm::Asgd, workers);
    cfg.local_steps = Some(LocalStepsPolicy::new(start, min, max, fraction).unwrap());
    cfg
}

fn pace(steps: u64, step_ms: u64, exchange_ms: Option<u64>) -> Option<PaceReport> {
    Some(PaceReport {
        steps,
        step_seconds: step_ms as f64 / 1e3,
        exchange_seconds: exchange_ms.map(|c| c as f64 / 1e3),
    })
}

/// Worker `m` pulls, then pushes gradient `seq` computed on that model, reporting `pace`.
async fn push_paced(
    c: &PsClient,
    m: usize,
    seq: u64,
    pace: Option<PaceReport>,
) -> Result<PushReply, ClientError> {
    let l = layout();
    let model = c.pull(m, None, Duration::ZERO).await.unwrap().unwrap();
    let body = foresight_ps::client::encode_gradient(&l, &grad(&l, seq as usize), GradDtype::F32);
    c.push_paced(PushId::unjoined(m, model.version, seq), None, pace, body).await
}

/// The protocol alone: a worker 3× slower than the other is told a third of the steps, both
/// rounds lasting the slowest exchange over the fraction; a push without a report is told the
/// same; a refused report changes nothing.
#[test]
fn the_ps_advises_each_worker_the_steps_that_fill_one_round() {
    let rt = runtime();
    let ps = rt.block_on(start(adaptive(2, 20, 2, 500, 0.1)));
    let c = PsClient::new(&ps.url, Some(TOKEN.into())).unwrap();
    let l = layout();
    rt.block_on(async {
        c.register(&l, &init(&l)).await.unwrap();
        let push = |m, seq, p| push_paced(&c, m, seq, p);
        // Nothing measured: the starting steps.
        let first = push(0, 1, pace(20, 10, None)).await.unwrap();
        assert_eq!(first.local_steps, Some(20), "no exchange measured yet");
        // An exchange is taken only as long as the time since the worker's last push.
        tokio::time::sleep(Duration::from_millis(60)).await;
        // 10 ms and 30 ms steps, 50 ms exchanges at 10 %: a round of 0.5 s.
        assert_eq!(push(0, 2, pace(20, 10, Some(50))).await.unwrap().local_steps, Some(50));
        // Worker 1's first report: its exchange, which nothing bounds, is not taken.
        assert_eq!(push(1, 1, pace(20, 30, Some(5000))).await.unwrap().local_steps, Some(17));
        // A push that reports nothing is answered from what is known.
        assert_eq!(push(0, 3, None).await.unwrap().local_steps, Some(50));

        // Refused reports: answered 400, and the advice and the step count do not move.
        let before = scrape(&ps.url).await;
        for bad in [
            "steps=5&step_ms=-1",
            "steps=5&step_ms=NaN",
            "steps=0&step_ms=10",
            "step_ms=10",
            "steps=5",
            "steps=5&step_ms=10&exchange_ms=1e12",
        ] {
            let model = c.pull(0, None, Duration::ZERO).await.unwrap().unwrap();
            let body = foresight_ps::client::encode_gradient(&l, &grad(&l, 9), GradDtype::F32);
            let url = format!("{}/v1/gradients?worker=0&version={}&seq=9&{bad}", ps.url, model.version);
            let resp = reqwest::Client::builder()
                .http2_prior_knowledge()
                .build()
                .unwrap()
                .post(url)
                .bearer_auth(TOKEN)
                .body(body)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 400, "{bad}");
            let text = resp.text().await.unwrap();
            assert!(text.contains("bad_request"), "{bad}: {text}");
        }
        let after = scrape(&ps.url).await;
        for name in ["foresight_ps_trained_steps_total", "foresight_ps_updates_total"] {
            assert_eq!(metric(&before, name, &[]), metric(&after, name, &[]), "{name} moved");
        }
        assert_eq!(metric(&after, "foresight_ps_trained_steps_total", &[]), 60.0, "three reports of 20");
        assert_eq!(metric(&after, "foresight_ps_local_steps", &["worker=\"0\""]), 50.0);
        assert_eq!(metric(&after, "foresight_ps_local_steps", &["worker=\"1\""]), 17.0);
        assert_eq!(push(0, 10, None).await.unwrap().local_steps, Some(50), "the advice did not move");
    });
}

/// A worker that falls silent (dead, or its link down) no longer sets the others' rounds: the PS
/// forgets its pace when it marks it silent.
#[test]
fn a_silent_worker_s_slow_link_stops_setting_the_round() {
    let rt = runtime();
    let mut cfg = adaptive(2, 20, 2, 500, 0.1);
    cfg.worker_silence_timeout = Duration::from_millis(300);
    let ps = rt.block_on(start(cfg));
    rt.block_on(async { ps.state.spawn_presence_watch() });
    let c = PsClient::new(&ps.url, Some(TOKEN.into())).unwrap();
    let l = layout();
    rt.block_on(async {
        c.register(&l, &init(&l)).await.unwrap();
        let c = &c;
        let push = |m, seq, p| async move { push_paced(c, m, seq, p).await.unwrap() };
        assert_eq!(push(0, 1, pace(20, 10, None)).await.local_steps, Some(20));
        assert_eq!(push(1, 1, pace(20, 10, None)).await.local_steps, Some(20));
        // (An exchange is taken only as long as the time since the worker's last push.)
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(push(0, 2, pace(20, 10, Some(50))).await.local_steps, Some(50));
        // Worker 1's exchanges take 100 ms: everyone's rounds last 1 s.
        assert_eq!(push(1, 2, pace(20, 10, Some(100))).await.local_steps, Some(100));
        assert_eq!(push(0, 3, None).await.local_steps, Some(100));
        // Both fall silent; worker 0 comes back, worker 1 does not. Worker 0 is measured
        // afresh (the starting steps first), and its rounds are its own link's again.
        tokio::time::sleep(Duration::from_millis(900)).await;
        assert_eq!(push(0, 4, pace(20, 10, Some(50))).await.local_steps, Some(20));
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert_eq!(push(0, 5, pace(20, 10, Some(50))).await.local_steps, Some(50));
    });
}

/// A PS without the policy advises nothing (the workers keep their own local steps); it
/// exports the steps each worker's pushes cover.
#[test]
fn without_the_policy_no_advice_is_given() {
    let rt = runtime();
    let ps = rt.block_on(start(config(Algorithm::Asgd, 1)));
    let c = PsClient::new(&ps.url, Some(TOKEN.into())).unwrap();
    let l = layout();
    let reply = rt.block_on(async {
        c.register(&l, &init(&l)).await.unwrap();
        let model = c.pull(0, None, Duration::ZERO).await.unwrap().unwrap();
        let body = foresight_ps::client::encode_gradient(&l, &grad(&l, 1), GradDtype::F32);
        c.push_paced(PushId::unjoined(0, model.version, 1), None, pace(4, 10, Some(50)), body).await.unwrap()
    });
    assert_eq!(reply.local_steps, None);
    let m = rt.block_on(scrape(&ps.url));
    assert_eq!(metric(&m, "foresight_ps_trained_steps_total", &[]), 4.0, "steps are counted anyway");
    assert_eq!(metric(&m, "foresight_ps_local_steps", &["worker=\"0\""]), 4.0, "the steps the push covered");
}

/// One exchange of a worker's loop: when its push was due, the local steps trained before it,
/// and the local steps the PS had told the worker to train.
#[derive(Clone, Copy, Debug)]
struct Block {
    at: Instant,
    trained: u64,
    told: u64,
}

/// One worker's loop: `step` of wall time per local step, pseudo-gradients of a fixed size,
/// for `run_for`; returns its exchanges.
fn train(rt: &tokio::runtime::Runtime, url: &str, m: usize, step: Duration, run_for: Duration) -> Vec<Block> {
    let cadence = Cadence::local_steps(8, GradDtype::F32).unwrap();
    let mut w = worker(rt, &[url.to_string()], cadence, m, Duration::from_secs(30));
    let mut blocks = Vec::new();
    let (mut told, mut steps) = (w.local_steps().unwrap(), 0);
    let started = Instant::now();
    while started.elapsed() < run_for || steps > 0 {
        w.pull_if_due().unwrap();
        std::thread::sleep(step);
        steps += 1;
        if w.push_due_next() {
            w.grad_mut().iter_mut().for_each(|g| *g = 1e-4);
            blocks.push(Block { at: Instant::now(), trained: steps, told });
            steps = 0;
        }
        assert_eq!(w.end_step(None).unwrap(), StepEnd::Continue);
        if steps == 0 {
            told = w.local_steps().unwrap();
        }
    }
    blocks
}

/// Two workers, one 3× slower: each trains exactly the steps the PS told it, the slower one
/// about a third of the faster one's, so their rounds take about the same time.
#[test]
fn workers_follow_the_advice_and_a_slower_one_trains_fewer_steps() {
    let rt = runtime();
    // A small fraction: loopback exchanges of this model take a millisecond or two, so rounds
    // of 0.1–0.3 s, and advice well inside the bounds.
    let ps = rt.block_on(start(adaptive(2, 8, 2, 2000, 0.01)));
    let url = ps.url.clone();
    let slow = {
        let url = url.clone();
        std::thread::spawn(move || {
            train(&runtime(), &url, 1, Duration::from_millis(6), Duration::from_secs(3))
        })
    };
    let fast = train(&rt, &url, 0, Duration::from_millis(2), Duration::from_secs(3));
    let slow = slow.join().unwrap();
    for (who, blocks) in [("fast", &fast), ("slow", &slow)] {
        assert!(blocks.len() >= 4, "{who}: only {} exchanges: {blocks:?}", blocks.len());
        for b in blocks.iter() {
            assert_eq!(b.trained, b.told, "{who} trained other than it was told: {blocks:?}");
        }
    }
    let (fast, slow): (Vec<_>, Vec<_>) = (
        fast.iter().map(|b| (b.trained, b.told)).collect(),
        slow.iter().map(|b| (b.trained, b.told)).collect(),
    );
    eprintln!("steps trained and told per exchange: fast {fast:?}, slow {slow:?}");
    let last = |b: &[(u64, u64)]| b.last().unwrap().1 as f64;
    let (f, s) = (last(&fast), last(&slow));
    assert!(f > 8.0, "the fast worker's steps did not grow from 8: {fast:?}");
    let ratio = f / s;
    assert!((2.0..=4.5).contains(&ratio), "a 3× slower worker told {s} steps against {f}: {fast:?} {slow:?}");
}

/// The real PS binary SIGKILLed mid-run and started again a second later (its checkpoint
/// restored, its workers' pace forgotten): the worker's exchange across the outage, which its
/// retries stretched to the outage's length, is not reported as its link's pace, so the
/// restarted PS does not make every round a hundred times longer (here: the most local steps
/// the job allows) by it.
#[test]
fn an_exchange_stretched_by_a_ps_restart_does_not_set_the_round() {
    const MAX: u64 = 2000;
    let rt = runtime();
    let port = free_port();
    let ckpt = tempfile::tempdir().unwrap();
    let max = MAX.to_string();
    let args = [
        "--workers",
        "1",
        "--algorithm",
        "asgd",
        "--local-steps",
        "8",
        "--local-steps-max",
        &max,
        "--communication-fraction",
        "0.01",
        "--checkpoint-interval",
        "1",
        "--checkpoint-dir",
        ckpt.path().to_str().unwrap(),
    ];
    let mut ps = PsProcess::spawn(port, &args);
    rt.block_on(ps.wait_ready());
    let url = ps.url.clone();
    let training = std::thread::spawn(move || {
        train(&runtime(), &url, 0, Duration::from_millis(2), Duration::from_secs(7))
    });
    std::thread::sleep(Duration::from_secs(3));
    ps.signal("KILL");
    ps.wait_exit();
    let killed = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    let ps = PsProcess::spawn(port, &args);
    rt.block_on(ps.wait_ready());
    let blocks = training.join().unwrap();
    let (before, after): (Vec<Block>, Vec<Block>) = blocks.iter().partition(|b| b.at < killed);
    let told = |bs: &[Block]| bs.iter().map(|b| b.told).collect::<Vec<_>>();
    eprintln!("local steps told before the kill {:?}, after {:?}", told(&before), told(&after));
    assert!(before.len() >= 3 && after.len() >= 3, "exchanges before and after the restart: {blocks:?}");
    let most_before = before.iter().map(|b| b.told).max().unwrap();
    assert!(most_before < MAX, "the advice was in the bounds before the kill: {blocks:?}");
    assert!(
        after.iter().all(|b| b.told < MAX),
        "after the restart the worker was told the most local steps: {:?}",
        told(&after)
    );
}
