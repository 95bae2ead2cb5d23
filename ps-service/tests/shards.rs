//! A model sharded over N parameter servers: the same model as one PS, and a shard lost and
//! restored while the others keep serving. Real PS servers on loopback (in-process, and the
//! real binary for the kill), driven by the workers' own client ([`Exchange`]).

mod support;

use std::time::{Duration, Instant};

use foresight_ps::client::{Cadence, Exchange, GradDtype, LentFloats, PsClient, Retry, Session, StepEnd};
use foresight_ps::optimizer::Algorithm;
use foresight_ps::store::checkpoint;
use foresight_ps::wire::Layout;
use foresight_ps::wire::int8;
use foresight_ps::wire::shards::ShardMap;
use support::*;

/// Pulls every other step: the step between pushes a gradient computed on an older model.
fn every_other() -> Cadence {
    Cadence::new(2, 1, GradDtype::F32).unwrap()
}

fn status(rt: &tokio::runtime::Runtime, url: &str) -> serde_json::Value {
    let c = PsClient::new(url, Some(TOKEN.into())).unwrap();
    rt.block_on(c.status()).unwrap()
}

/// The model after a fixed interleaving of two workers (staleness 2 on every other push)
/// under dc-asgd-a with momentum, on `n` in-process shards; with each shard's version.
fn train_sharded(n: usize, steps: u64) -> (Vec<f32>, Vec<u64>, Vec<Layout>) {
    let rt = runtime();
    let shards: Vec<Ps> = (0..n)
        .map(|_| {
            let mut c = config(Algorithm::DcAsgdA, 2);
            c.hyper.momentum = 0.9;
            rt.block_on(start(c))
        })
        .collect();
    let urls: Vec<String> = shards.iter().map(|s| s.url.clone()).collect();
    let mut a = worker(&rt, &urls, every_other(), 0, Duration::from_secs(5));
    let mut b = worker(&rt, &urls, every_other(), 1, Duration::from_secs(5));
    for _ in 0..steps {
        assert_eq!(step(&mut a, 0), StepEnd::Continue);
        assert_eq!(step(&mut b, 1), StepEnd::Continue);
    }
    assert_eq!((a.stats().discarded, b.stats().discarded), (0, 0));
    assert_eq!((a.stats().last_staleness, b.stats().last_staleness), (Some(2), Some(2)));
    let model = a.pull_now().unwrap();
    let versions = urls.iter().map(|u| status(&rt, u)["version"].as_u64().unwrap()).collect();
    let layouts = urls
        .iter()
        .map(|u| {
            let c = PsClient::new(u, Some(TOKEN.into())).unwrap();
            rt.block_on(c.pull(0, None, Duration::ZERO)).unwrap().unwrap().layout
        })
        .collect();
    (model.values, versions, layouts)
}

#[test]
fn one_two_and_four_shards_train_the_same_model_bits() {
    let steps = 12;
    let (one, versions, _) = train_sharded(1, steps);
    assert_eq!(versions, [2 * steps]);
    assert_ne!(one, init(&layout()), "the model trained");
    for n in [2, 4] {
        let (model, versions, layouts) = train_sharded(n, steps);
        assert_eq!(versions, vec![2 * steps; n], "every shard applied every push");
        let map = ShardMap::new(&layout(), n).unwrap();
        for (i, l) in layouts.iter().enumerate() {
            assert_eq!(l, map.layout(i), "shard {i} of {n} holds its slice of the shard map");
        }
        let same = model.iter().zip(&one).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "{n} shards: the model differs from one PS's");
    }
}

#[test]
fn a_shard_url_that_is_not_http_is_refused_with_the_list_it_came_from() {
    let Err(e) = PsClient::for_shards("http://a:1, b:2", None, None) else { panic!("accepted") };
    assert!(e.is_permanent());
    assert!(e.to_string().contains("\"b:2\" is not an http:// or https:// URL"), "{e}");
}

/// Shard 1 of 2 (the real binary, periodic checkpoints) is SIGKILLed while two workers train.
/// Shard 0 keeps serving with its version intact; shard 1 comes back from its checkpoint on the
/// same address, the workers' client carries on by itself (rejoin, pull, push), and both
/// shards end past where the kill found them.
#[test]
fn a_shard_killed_mid_run_restores_while_the_other_keeps_serving() {
    let restored = kill_shard_1_mid_run(true);
    assert!(restored > 0, "shard 1 restored its checkpoint (version {restored})");
}

/// The same without checkpoints: shard 1 comes back empty and the workers offer their copies of
/// its slice; it resumes from the freshest, never from the initial weights, and shard 0 is not
/// touched.
#[test]
fn a_shard_that_lost_its_slice_is_reseeded_from_the_workers_copies() {
    let seeded = kill_shard_1_mid_run(false);
    assert!(seeded > 30, "shard 1 was re-seeded at version {seeded}, killed past 40");
}

/// Two workers train against 2 real shards until shard 1 has passed version 40 (and, with
/// `checkpoints`, written a checkpoint of it), which is then SIGKILLed and started again on its
/// address; checks that shard 0 lost nothing and that both shards then train on. Shard 1's
/// version once it is back.
fn kill_shard_1_mid_run(checkpoints_on: bool) -> u64 {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let ports = [free_port(), free_port()];
    let shard_args = |i: usize| {
        let mut args: Vec<String> = ["--workers", "2", "--algorithm", "dc-asgd-a"].map(String::from).to_vec();
        if checkpoints_on {
            let ckpt = dir.path().join(format!("shard-{i}")).display().to_string();
            args.extend(["--checkpoint-interval".into(), "1".into(), "--checkpoint-dir".into(), ckpt]);
        }
        args
    };
    let spawn = |i: usize| {
        let args = shard_args(i);
        let ps = PsProcess::spawn(ports[i], &args.iter().map(String::as_str).collect::<Vec<_>>());
        rt.block_on(ps.wait_ready());
        ps
    };
    let _shard0 = spawn(0);
    let mut shard1 = spawn(1);
    let urls: Vec<String> = ports.iter().map(|p| format!("http://127.0.0.1:{p}")).collect();
    // The workers train until told to stop, so the kill always lands mid-run.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let trainers: Vec<_> = (0..2)
        .map(|m| {
            let (urls, stop) = (urls.clone(), stop.clone());
            std::thread::spawn(move || {
                // The client blocks on a runtime of its own, as in a worker process.
                let rt = runtime();
                let mut w = worker(&rt, &urls, every_other(), m, Duration::from_secs(60));
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    assert_eq!(step(&mut w, m), StepEnd::Continue);
                }
                w.stats()
            })
        })
        .collect();

    // (No version before the first worker registered.)
    let version = |i: usize| status(&rt, &urls[i])["version"].as_u64().unwrap_or(0);
    // On a timeout, what each shard says (once seen after 60 s of a run that takes 5).
    let states = || {
        let ask =
            |url: &String| rt.block_on(async { PsClient::new(url, Some(TOKEN.into()))?.status().await });
        urls.iter().map(|u| ask(u).map_or_else(|e| e.to_string(), |s| s.to_string())).collect::<Vec<_>>()
    };
    let until = |what: &str, f: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !f() {
            if Instant::now() >= deadline {
                let written = checkpoints_on.then(|| checkpoints(&dir.path().join("shard-1")));
                panic!(
                    "timed out waiting for {what}; shard 1's checkpoints {written:?}; the shards: {:#?}",
                    states()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    until("shard 1 past version 40 (and a checkpoint of it)", &|| {
        version(1) > 40 && (!checkpoints_on || checkpoints(&dir.path().join("shard-1")).len() > 1)
    });
    shard1.signal("KILL");
    shard1.wait_exit();
    let at_kill = version(0);
    std::thread::sleep(Duration::from_secs(2));
    // Shard 0 answers while shard 1 is gone, and lost nothing.
    assert!(version(0) >= at_kill, "shard 0 went back while shard 1 was down");
    let _shard1 = spawn(1);
    // Restored before it listens, or re-seeded by the first worker's offer.
    until("shard 1 to hold its slice again", &|| version(1) > 0);
    let back = version(1);
    until("100 more updates on both shards", &|| version(0) > at_kill + 100 && version(1) > back + 100);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut pushes = 0;
    for (m, t) in trainers.into_iter().enumerate() {
        pushes += t.join().unwrap_or_else(|_| panic!("worker {m} failed")).pushes;
    }
    // Every shard applied the steps counted here: at least the 100 after the restart.
    assert!(pushes > 100, "{pushes} steps applied in all");
    back
}

/// The job's last worker to finish makes the PS finalize itself, every shard with it, and is
/// told where the whole model's final file is; no `POST /v1/finalize` is needed.
#[test]
fn the_last_worker_to_leave_finalizes_every_shard_and_learns_where_the_model_is() {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let mut c1 = config(Algorithm::DcAsgdA, 2);
    c1.shard = 1;
    let shard1 = rt.block_on(start(c1));
    let mut c = config(Algorithm::DcAsgdA, 2);
    c.output_dir = Some(dir.path().to_path_buf());
    c.peers = vec![shard1.url.clone()];
    let shard0 = rt.block_on(start(c));
    let urls = [shard0.url.clone(), shard1.url.clone()];
    let mut a = worker(&rt, &urls, every_other(), 0, Duration::from_secs(5));
    let mut b = worker(&rt, &urls, every_other(), 1, Duration::from_secs(5));
    for _ in 0..3 {
        assert_eq!(step(&mut a, 0), StepEnd::Continue);
        assert_eq!(step(&mut b, 1), StepEnd::Continue);
    }
    let file = dir.path().join("model-final.safetensors");
    a.finish(None).unwrap();
    assert_eq!(a.final_model(), None, "one worker still trains");
    assert!(!file.exists());
    assert_eq!(status(&rt, &urls[0])["finalized"], false);
    // The worker still training is not held up by the other's leaving.
    assert_eq!(step(&mut b, 1), StepEnd::Continue);
    let last = b.finish(None).unwrap();
    let recorded = b.final_model().expect("the last worker is told where the final model is").clone();
    assert_eq!(recorded.version, 7);
    assert_eq!(recorded.path.as_deref(), Some(file.to_str().unwrap()));
    for url in &urls {
        assert_eq!(status(&rt, url)["finalized"], true, "{url} was finalized");
    }
    let (_, data, _) = checkpoint::decode(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!((data.version, data.finalized), (7, true));
    assert_eq!(data.params, last.values, "the file holds the model the last worker pulled");
    // The operator's finalize, coming later, gets the same answer.
    let again = rt.block_on(PsClient::new(&urls[0], Some(TOKEN.into())).unwrap().finalize()).unwrap();
    assert_eq!(again, recorded);
    // Each shard's series say which shard they are.
    for (i, url) in urls.iter().enumerate() {
        let m = rt.block_on(scrape(url));
        let version = metric(&m, "foresight_ps_model_version", &[&format!("shard=\"{i}\"")]);
        assert_eq!(version, 7.0, "shard {i}'s series carry shard=\"{i}\"");
    }
}

/// Finalizing shard 0 finalizes the others and writes the whole model, merged from every
/// shard's slice: the model's own tensors and the values a worker pulls, at the shards' version.
#[test]
fn finalizing_shard_zero_writes_the_whole_model_and_finalizes_the_others() {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let shard1 = rt.block_on(start(config(Algorithm::DcAsgdA, 1)));
    let mut c = config(Algorithm::DcAsgdA, 1);
    c.output_dir = Some(dir.path().to_path_buf());
    c.peers = vec![shard1.url.clone()];
    let shard0 = rt.block_on(start(c));
    let urls = [shard0.url.clone(), shard1.url.clone()];
    let mut w = worker(&rt, &urls, every_other(), 0, Duration::from_secs(5));
    for _ in 0..5 {
        assert_eq!(step(&mut w, 0), StepEnd::Continue);
    }
    let pulled = w.pull_now().unwrap();
    let answer = rt.block_on(PsClient::new(&urls[0], Some(TOKEN.into())).unwrap().finalize()).unwrap();
    assert_eq!(answer.version, 5);
    assert_eq!(status(&rt, &urls[1])["finalized"], true, "shard 1 was finalized");
    let bytes = std::fs::read(dir.path().join("model-final.safetensors")).unwrap();
    let (l, data, _) = checkpoint::decode(&bytes).unwrap();
    assert_eq!((l, data.version, data.finalized), (layout(), 5, true));
    assert_eq!(data.params, pulled.values);
    // The workers stop at their next push: the job is over on every shard.
    assert_eq!(step(&mut w, 0), StepEnd::Finalized);
}

/// Scaling goes through shard 0, which tells the others first: every shard then takes the new
/// worker's join, and a count a shard refuses changes nothing anywhere.
#[test]
fn scaling_shard_zero_scales_every_shard() {
    let rt = runtime();
    let shard1 = rt.block_on(start(config(Algorithm::Asgd, 1)));
    let mut c = config(Algorithm::Asgd, 1);
    c.peers = vec![shard1.url.clone()];
    let shard0 = rt.block_on(start(c));
    let urls = [shard0.url.clone(), shard1.url.clone()];
    let first = PsClient::new(&urls[0], Some(TOKEN.into())).unwrap();
    let Err(e) = rt.block_on(first.set_workers(0)) else { panic!("0 workers accepted") };
    assert_eq!(e.reason(), Some("bad_request"));
    rt.block_on(first.set_workers(2)).unwrap();
    for u in &urls {
        assert_eq!(status(&rt, u)["workers_expected"], 2, "{u}");
    }
    let mut w = worker(&rt, &urls, every_other(), 1, Duration::from_secs(5));
    assert_eq!(step(&mut w, 1), StepEnd::Continue);
}

/// A worker gives its pulled values back (`Exchange::recycle`) and each link reads the next
/// pull into the slice it kept before: the model handed over must still be the PS's, whole,
/// in the recycled buffer (and in the caller's own, `Exchange::pull_if_due_into`). Checked against another worker's pull of the same version, with
/// the recycled buffer poisoned with NaN first, on one and on two shards.
#[test]
fn a_pull_into_recycled_buffers_is_the_model_the_ps_serves() {
    for n in [1, 2] {
        let rt = runtime();
        let shards: Vec<Ps> = (0..n).map(|_| rt.block_on(start(config(Algorithm::Asgd, 2)))).collect();
        let urls: Vec<String> = shards.iter().map(|s| s.url.clone()).collect();
        let cadence = Cadence::new(1, 1, GradDtype::F32).unwrap();
        let mut a = worker(&rt, &urls, cadence, 0, Duration::from_secs(5));
        let mut b = worker(&rt, &urls, cadence, 1, Duration::from_secs(5));
        let mut last = Vec::new();
        for pull in 0..3 {
            for _ in 0..2 {
                assert_eq!(step(&mut b, 1), StepEnd::Continue);
            }
            let recycled = (pull == 2).then(|| {
                last.fill(f32::NAN);
                let at = last.as_ptr();
                a.recycle(std::mem::take(&mut last));
                at
            });
            let ours = a.pull_now().unwrap();
            let theirs = b.pull_now().unwrap();
            assert_eq!(ours.version, theirs.version, "{n} shards, pull {pull}");
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&ours.values), bits(&theirs.values), "{n} shards, pull {pull}");
            if let Some(at) = recycled {
                assert_eq!(ours.values.as_ptr(), at, "{n} shards: not copied into the recycled buffer");
            }
            last = ours.values;
        }
        // Into the caller's own buffer (the Python package's flat model).
        let mut flat = vec![f32::NAN; last.len()];
        let version = a.pull_if_due_into(&mut flat).unwrap();
        let theirs = b.pull_now().unwrap();
        assert_eq!(version, Some(theirs.version));
        assert!(flat.iter().zip(&theirs.values).all(|(x, y)| x.to_bits() == y.to_bits()), "{n} shards");
    }
}

/// Int8 pushes with error feedback: the model moves by the sum of the gradients sent to within
/// one rounding (half a scale step), even for values far below a step, which plain rounding
/// would send as zero every time; on one and on two shards (each link carries its own slice's).
#[test]
fn int8_pushes_carry_their_rounding_into_the_next_so_small_values_are_not_lost() {
    let (pushes, lr) = (20, 0.1f32);
    for n in [1, 2] {
        let rt = runtime();
        let shards: Vec<Ps> = (0..n).map(|_| rt.block_on(start(config(Algorithm::Asgd, 1)))).collect();
        let urls: Vec<String> = shards.iter().map(|s| s.url.clone()).collect();
        let cadence = Cadence::new(1, 1, GradDtype::Int8).unwrap();
        let mut w = worker(&rt, &urls, cadence, 0, Duration::from_secs(5));
        let l = w.layout().clone();
        // Every tensor is one int8 chunk here: its first value (1.0) sets the scale, 1/127; the
        // others, 1e-3, are a quarter of half a step.
        assert!(l.tensors().iter().all(|t| t.numel() <= int8::CHUNK));
        let mut g = vec![1e-3f32; l.len()];
        for (_, r) in l.iter() {
            g[r.start] = 1.0;
        }
        let start = w.pull_now().unwrap().values;
        for _ in 0..pushes {
            w.pull_if_due().unwrap();
            w.grad_mut().copy_from_slice(&g);
            assert_eq!(w.end_step(None).unwrap(), StepEnd::Continue);
        }
        assert_eq!(w.stats().pushes, pushes);
        let end = w.pull_now().unwrap().values;
        let half_step = 0.5 / 127.0;
        for i in 0..l.len() {
            let moved = (start[i] - end[i]) / lr;
            let want = pushes as f32 * g[i];
            assert!(
                (moved - want).abs() <= half_step * 1.01 + 1e-4,
                "{n} shards, element {i}: moved {moved}, sent {want}"
            );
        }
    }
}

/// A float32 push of a lent gradient (`LentFloats`, the Python package's gradient buffer) sends
/// the lent bytes as they are after each shard's header: the model moves exactly as with the
/// same gradient encoded, on one and two shards, though the slice the push was given is zeros
/// (only the lent bytes carry the gradient), and the lent memory is released when the push
/// returns.
#[test]
fn a_lent_gradient_is_sent_as_it_is_and_released_when_the_push_returns() {
    for n in [1, 2] {
        let models: Vec<Vec<u32>> = [false, true]
            .into_iter()
            .map(|lend| {
                let rt = runtime();
                let shards: Vec<Ps> =
                    (0..n).map(|_| rt.block_on(start(config(Algorithm::Asgd, 1)))).collect();
                let urls: Vec<String> = shards.iter().map(|s| s.url.clone()).collect();
                let cadence = Cadence::new(1, 1, GradDtype::F32).unwrap();
                let mut w = worker(&rt, &urls, cadence, 0, Duration::from_secs(5));
                w.pull_if_due().unwrap().expect("the first pull");
                let g = std::sync::Arc::new(grad(w.layout(), 3));
                if lend {
                    // SAFETY: `g` owns its floats and nobody writes them.
                    let lent = unsafe { LentFloats::new(g.clone(), g.as_ptr(), g.len()) };
                    let zeros = vec![0.0; g.len()];
                    assert_eq!(w.end_step_with(&zeros, Some(lent.bytes()), None).unwrap(), StepEnd::Continue);
                    assert!(
                        lent.release(Duration::from_secs(5)),
                        "{n} shards: the lent bytes are still held"
                    );
                    assert_eq!(std::sync::Arc::strong_count(&g), 1, "{n} shards: the owner went with them");
                } else {
                    assert_eq!(w.end_step_with(&g, None, None).unwrap(), StepEnd::Continue);
                }
                w.pull_now().unwrap().values.iter().map(|x| x.to_bits()).collect()
            })
            .collect();
        assert_ne!(
            models[0],
            support::init(&support::layout()).iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
        assert_eq!(models[0], models[1], "{n} shards: the lent push moved the model otherwise");
    }
}

/// A parameter group that matches no tensor of the model is refused on a sharded PS too, where
/// no shard can tell (each sees only its slice): the joining worker adds up what the group took
/// on every shard and fails with a configuration error naming it; a group whose tensors all lie
/// on one shard is taken.
#[test]
fn a_parameter_group_that_matches_no_tensor_on_any_shard_is_refused_at_the_join() {
    use foresight_ps::optimizer::ParameterGroup;
    let group = |names: &[&str]| ParameterGroup {
        names: names.iter().map(|n| n.to_string()).collect(),
        weight_decay: Some(0.0),
        learning_rate_scale: None,
    };
    let rt = runtime();
    for (groups, refused) in
        [(vec![group(&["bias$"])], false), (vec![group(&["bias$"]), group(&["^embed"])], true)]
    {
        // Each shard knows it is one (an unsharded PS refuses the registration itself).
        let mut c1 = config(Algorithm::Asgd, 1);
        (c1.shard, c1.hyper.parameter_groups) = (1, groups.clone());
        let shard1 = rt.block_on(start(c1));
        let mut c0 = config(Algorithm::Asgd, 1);
        (c0.peers, c0.hyper.parameter_groups) = (vec![shard1.url.clone()], groups);
        let shard0 = rt.block_on(start(c0));
        let urls = [shard0.url.clone(), shard1.url.clone()];
        let l = layout();
        let clients = PsClient::for_shards(&urls.join(","), Some(TOKEN.into()), None).unwrap();
        let started = Session::start(
            clients,
            rt.handle().clone(),
            0,
            l.clone(),
            &init(&l),
            Retry::new(Duration::from_secs(5), 0),
        );
        match (started, refused) {
            (Ok(_), false) => {}
            (Err(e), true) => assert!(
                e.is_permanent()
                    && e.to_string().contains("parameter group 1 (names [\"^embed\"]) matches no tensor of the model on any of the 2"),
                "{e}"
            ),
            (Ok(_), true) => panic!("a group matching nothing was taken"),
            (Err(e), false) => panic!("{e}"),
        }
    }
}

/// The initial model lent to the registration (`Session::start_lent`, the Python package's flat
/// model buffer) is sent as it is after each shard's header: the registered model is the lent
/// bytes' though the slice given beside them is zeros, on one and two shards, and the lent
/// memory is released once the join returns.
#[test]
fn a_lent_initial_model_is_registered_as_it_is_and_released_after_the_join() {
    for n in [1, 2] {
        let rt = runtime();
        let shards: Vec<Ps> = (0..n).map(|_| rt.block_on(start(config(Algorithm::Asgd, 1)))).collect();
        let urls: Vec<String> = shards.iter().map(|s| s.url.clone()).collect();
        let l = layout();
        let w0 = std::sync::Arc::new(init(&l));
        // SAFETY: `w0` owns its floats and nobody writes them.
        let lent = unsafe { LentFloats::new(w0.clone(), w0.as_ptr(), w0.len()) };
        let clients = PsClient::for_shards(&urls.join(","), Some(TOKEN.into()), None).unwrap();
        let zeros = vec![0.0; l.len()];
        let retry = Retry::new(Duration::from_secs(5), 0);
        let (session, joined) = Session::start_lent(
            clients,
            rt.handle().clone(),
            0,
            l.clone(),
            &zeros,
            Some(lent.bytes()),
            retry,
        )
        .unwrap();
        assert!(lent.release(Duration::from_secs(5)), "{n} shards: the lent bytes are still held");
        assert_eq!(std::sync::Arc::strong_count(&w0), 1, "{n} shards: the owner went with them");
        let mut w = Exchange::new(session, &joined, Cadence::new(1, 1, GradDtype::F32).unwrap());
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&w.pull_now().unwrap().values), bits(&w0), "{n} shards: not the lent model");
    }
}
