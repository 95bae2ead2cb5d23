//! The real `foresight-ps` binary: checkpoints across SIGTERM and SIGKILL, restart, TLS.

mod support;

use std::process::Command;
use std::time::Duration;

use foresight_ps::client::{Cadence, GradDtype, PsClient, PullDtype, PushId, StepEnd};
use foresight_ps::server::TlsFiles;
use foresight_ps::store::checkpoint;
use foresight_ps::wire;
use support::*;

async fn train(c: &PsClient, workers: usize, steps: u64, seq0: u64) {
    let l = layout();
    for seq in seq0..seq0 + steps {
        for m in 0..workers {
            let model = c.pull(m, None, Duration::ZERO).await.unwrap().unwrap();
            c.push(
                PushId::unjoined(m, model.version, seq),
                None,
                &l,
                &grad(&l, m + seq as usize),
                GradDtype::F32,
            )
            .await
            .unwrap();
        }
    }
}

fn newest_checkpoint(dir: &std::path::Path) -> checkpoint::CheckpointData {
    let name = checkpoints(dir).pop().expect("a checkpoint exists");
    checkpoint::decode(&std::fs::read(dir.join(name)).unwrap()).unwrap().1
}

/// SIGTERM writes a checkpoint and exits 0; a restart restores the same model and optimizer
/// state (MeanSquare and momentum), and training continues from that version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_checkpoint_then_restart_restores_model_and_optimizer_state() {
    sigterm_then_restart_restores(&[]).await;
}

/// The same under Delayed Nesterov, stopped in the middle of a cycle (version 10, a milestone
/// every 4): its pending sum is in the checkpoint and comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_cycle_then_restart_restores_delayed_nesterovs_pending_sum() {
    sigterm_then_restart_restores(&["--momentum-delay", "4"]).await;
}

async fn sigterm_then_restart_restores(extra: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let args = ["--workers", "2", "--algorithm", "dc-asgd-a", "--momentum", "0.9"];
    let args = [&args[..], extra, &["--checkpoint-dir"]].concat();
    let port = free_port();
    let mut ps = PsProcess::spawn(
        port,
        &[&args[..], &[ckpt.to_str().unwrap(), "--checkpoint-interval", "0"]].concat(),
    );
    ps.wait_ready().await;
    let c = PsClient::new(&ps.url, Some(TOKEN.into())).unwrap();
    let l = layout();
    c.register(&l, &init(&l)).await.unwrap();
    train(&c, 2, 5, 1).await;
    let model_before = c.pull(0, None, Duration::ZERO).await.unwrap().unwrap();
    assert_eq!(model_before.version, 10);

    ps.signal("TERM");
    assert!(ps.wait_exit().success(), "SIGTERM must exit 0");
    let saved = newest_checkpoint(&ckpt);
    assert_eq!(saved.version, 10);
    assert_eq!(saved.params, model_before.values);
    assert!(saved.state.mean_square.iter().any(|&x| x > 0.0), "MeanSquare is checkpointed");
    assert!(saved.state.momentum.iter().any(|&x| x != 0.0), "momentum is checkpointed");
    let delayed = !extra.is_empty();
    assert_eq!(saved.state.pending.iter().any(|&x| x != 0.0), delayed, "the pending sum is checkpointed");

    let port = free_port();
    let mut ps = PsProcess::spawn(
        port,
        &[&args[..], &[ckpt.to_str().unwrap(), "--checkpoint-interval", "0"]].concat(),
    );
    ps.wait_ready().await;
    let c = PsClient::new(&ps.url, Some(TOKEN.into())).unwrap();
    let status = c.status().await.unwrap();
    assert_eq!(status["version"], 10);
    assert!(!c.register(&l, &init(&l)).await.unwrap(), "the restored model counts as registered");
    // Backups are not checkpointed: a push without a fresh pull is refused, not mis-compensated.
    let err = c.push(PushId::unjoined(0, 10, 100), None, &l, &grad(&l, 0), GradDtype::F32).await.unwrap_err();
    assert_eq!(err.reason(), Some("pull_required"));
    let model_after = c.pull(0, None, Duration::ZERO).await.unwrap().unwrap();
    assert_eq!((model_after.version, &model_after.values), (10, &model_before.values));
    // Checkpointing the restored PS again yields exactly the same optimizer state.
    ps.signal("TERM");
    assert!(ps.wait_exit().success());
    assert_eq!(newest_checkpoint(&ckpt), saved);

    // And training goes on from there.
    let port = free_port();
    let ps = PsProcess::spawn(port, &[&args[..], &[ckpt.to_str().unwrap()]].concat());
    ps.wait_ready().await;
    let c = PsClient::new(&ps.url, Some(TOKEN.into())).unwrap();
    train(&c, 2, 1, 200).await;
    assert_eq!(c.status().await.unwrap()["version"], 12);
}

/// After SIGKILL nothing runs on the way out: the newest periodic checkpoint is what survives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_loses_only_what_came_after_the_last_periodic_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let args =
        ["--workers", "1", "--algorithm", "asgd", "--checkpoint-interval", "1", "--keep-checkpoints", "2"];
    let port = free_port();
    let mut ps = PsProcess::spawn(port, &[&args[..], &["--checkpoint-dir", ckpt.to_str().unwrap()]].concat());
    ps.wait_ready().await;
    let c = PsClient::new(&ps.url, Some(TOKEN.into())).unwrap();
    let l = layout();
    c.register(&l, &init(&l)).await.unwrap();
    train(&c, 1, 3, 1).await;
    // Wait for a periodic checkpoint of version 3.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !checkpoints(&ckpt).iter().any(|n| n.contains("000000000003")) {
        assert!(std::time::Instant::now() < deadline, "no periodic checkpoint appeared");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let at_3 = c.pull(0, None, Duration::ZERO).await.unwrap().unwrap();
    ps.signal("KILL");
    ps.wait_exit();

    let port = free_port();
    let ps = PsProcess::spawn(port, &[&args[..], &["--checkpoint-dir", ckpt.to_str().unwrap()]].concat());
    ps.wait_ready().await;
    let c = PsClient::new(&ps.url, Some(TOKEN.into())).unwrap();
    let restored = c.pull(0, None, Duration::ZERO).await.unwrap().unwrap();
    assert_eq!((restored.version, restored.values), (3, at_3.values));
    assert!(checkpoints(&ckpt).len() <= 2, "keeps the newest 2: {:?}", checkpoints(&ckpt));
}

/// The arguments of an `asgd` PS of `workers` checkpointing into `ckpt` (on SIGTERM only).
fn asgd_on(ckpt: &std::path::Path, workers: usize) -> Vec<String> {
    let args = ["--algorithm", "asgd", "--checkpoint-interval", "0", "--workers", &workers.to_string()];
    [&args[..], &["--checkpoint-dir", ckpt.to_str().unwrap()]]
        .concat()
        .into_iter()
        .map(String::from)
        .collect()
}

/// The real binary with `args` on a free port, ready, and a client with the token.
async fn ready(args: &[String]) -> (PsProcess, PsClient) {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let ps = PsProcess::spawn(free_port(), &args);
    ps.wait_ready().await;
    let c = PsClient::new(&ps.url, Some(TOKEN.into())).unwrap();
    (ps, c)
}

/// A job scaled up, then its PS restarted with the command line it was first given: the
/// checkpoint's membership wins, so the added worker is not refused as unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_the_worker_count_the_job_was_scaled_to() {
    let dir = tempfile::tempdir().unwrap();
    let args = asgd_on(&dir.path().join("ckpt"), 2);
    let (mut ps, c) = ready(&args).await;
    let l = layout();
    c.register(&l, &init(&l)).await.unwrap();
    c.set_workers(3).await.unwrap();
    train(&c, 3, 2, 1).await;
    ps.signal("TERM");
    assert!(ps.wait_exit().success());

    let (_ps, c) = ready(&args).await;
    assert_eq!(c.status().await.unwrap()["workers_expected"], 3);
    let joined = c.join(2, Some(2)).await.unwrap();
    assert_eq!(joined.workers, 3);
    train(&c, 3, 1, 3).await;
    assert_eq!(c.status().await.unwrap()["version"], 9);
}

/// After a restart from a checkpoint at v2, versions up to 2 name the same models as before
/// and later ones other models: a gradient the old process served on v3 is refused (asgd would
/// otherwise take it as fresh), one on v2 is taken, and so is one that does not say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_after_a_restart_are_not_mistaken_for_the_old_process_versions() {
    let dir = tempfile::tempdir().unwrap();
    let args = asgd_on(&dir.path().join("ckpt"), 1);
    let (mut ps, c) = ready(&args).await;
    let l = layout();
    c.register(&l, &init(&l)).await.unwrap();
    train(&c, 1, 2, 1).await;
    let old = c.pull(0, None, Duration::ZERO).await.unwrap().unwrap();
    assert_eq!(old.version, 2);
    let old_incarnation = old.incarnation.expect("a pull names its process");
    ps.signal("TERM");
    assert!(ps.wait_exit().success());

    let (_ps, c) = ready(&args).await;
    let new = c.pull(0, None, Duration::ZERO).await.unwrap().unwrap();
    assert_ne!(new.incarnation, Some(old_incarnation));
    let push = |version: u64, incarnation: Option<u64>, seq: u64| {
        let id = PushId { worker: 0, generation: None, version, incarnation, seq };
        let c = c.clone();
        let l = l.clone();
        async move { c.push(id, None, &l, &grad(&l, 0), GradDtype::F32).await }
    };
    assert_eq!(push(2, Some(old_incarnation), 3).await.unwrap().version, 3, "v2 is shared");
    let err = push(3, Some(old_incarnation), 4).await.unwrap_err();
    assert_eq!(err.reason(), Some("pull_required"), "{err}");
    assert_eq!(c.status().await.unwrap()["version"], 3, "the refused push changed nothing");
    assert_eq!(push(3, new.incarnation, 4).await.unwrap().version, 4);
    assert_eq!(push(4, None, 5).await.unwrap().version, 5, "a client that does not say is not checked");
}

/// A tmpfs of `size` mounted on `dir` for the test's life (the tests run as root, as make test
/// does on this project's machines).
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(dir: &std::path::Path, size: &str) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .expect("mount");
        assert!(out.status.success(), "mount a tmpfs (needs root): {}", String::from_utf8_lossy(&out.stderr));
        Self(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Fills the filesystem holding `path` with one file, to the last byte.
fn fill(path: &std::path::Path) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap();
    let chunk = vec![0u8; 4096];
    while f.write_all(&chunk).is_ok() {}
    while f.write_all(&chunk[..1]).is_ok() {}
}

/// A checkpoint volume that fills up: the periodic checkpoints and finalize fail with "No space
/// left on device", the PS keeps serving and training, the last good checkpoint stays and no
/// partial file is left; once there is room again, finalize writes the model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_checkpoint_volume_fails_the_write_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let _volume = Tmpfs::mount(&ckpt, "1m");
    let args = ["--workers", "1", "--algorithm", "dc-asgd-a", "--checkpoint-interval", "1"];
    let port = free_port();
    let ps = PsProcess::spawn(port, &[&args[..], &["--checkpoint-dir", ckpt.to_str().unwrap()]].concat());
    ps.wait_ready().await;
    let c = PsClient::new(&ps.url, Some(TOKEN.into())).unwrap();
    let l = layout();
    c.register(&l, &init(&l)).await.unwrap();
    train(&c, 1, 2, 1).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while checkpoints(&ckpt) != ["ckpt-000000000002.safetensors"] {
        assert!(std::time::Instant::now() < deadline, "no checkpoint of v2: {:?}", checkpoints(&ckpt));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let at_2 = newest_checkpoint(&ckpt);
    fill(&ckpt.join("filler"));

    train(&c, 1, 3, 3).await;
    tokio::time::sleep(Duration::from_millis(2500)).await; // two periodic checkpoints fail
    let err = c.finalize().await.unwrap_err();
    assert!(err.to_string().contains("No space left on device"), "{err}");
    assert_eq!(c.status().await.unwrap()["version"], 5, "the PS still serves");
    let mut names = std::fs::read_dir(&ckpt)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect::<Vec<_>>();
    names.sort();
    // (.lock: the process's ownership of the directory, see dir_lock.)
    assert_eq!(
        names,
        [".lock", "ckpt-000000000002.safetensors", "filler", "journal.jsonl"],
        "no partial file is left"
    );
    assert_eq!(newest_checkpoint(&ckpt), at_2, "the last good checkpoint is intact");

    std::fs::remove_file(ckpt.join("filler")).unwrap();
    let done = c.finalize().await.unwrap();
    assert_eq!(done.version, 5);
    assert_eq!(newest_checkpoint(&ckpt).version, 5);
    assert!(ckpt.join("model-final.safetensors").exists());
    // The journal lost what the full disk refused, says so, and reads back whole.
    let lines = foresight_ps::journal::read(&ckpt).unwrap();
    let summary = foresight_ps::journal::summarize(&lines);
    assert_eq!(summary.last_version, 5, "{summary:?}");
    assert_eq!(summary.updates + summary.missing, 5, "{summary:?}");
}

/// A job made again under the same name writes its final model to the same output directory:
/// the earlier run's model is kept under a name of its own (and the answer says where), never
/// replaced. A PS that restored its own finalized job writes the file in its own place again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_run_keeps_the_earlier_runs_final_model_in_a_shared_output_directory() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("output");
    let out_arg = out.to_str().unwrap().to_string();
    let run = |ckpt: &str, steps: u64| {
        let ckpt = dir.path().join(ckpt).to_str().unwrap().to_string();
        let out_arg = out_arg.clone();
        async move {
            let args = ["--workers", "1", "--checkpoint-dir", &ckpt, "--output-dir", &out_arg];
            let ps = PsProcess::spawn(free_port(), &args);
            ps.wait_ready().await;
            let c = PsClient::new(&ps.url, Some(TOKEN.into())).unwrap();
            if steps > 0 {
                let l = layout();
                c.register(&l, &init(&l)).await.unwrap();
                train(&c, 1, steps, 1).await;
            }
            let done = c.finalize().await.unwrap();
            (ps, done)
        }
    };
    let final_file = out.join("model-final.safetensors");
    let (mut first, done) = run("first", 2).await;
    assert_eq!((done.version, done.earlier.as_deref()), (2, None), "nothing there before");
    let first_bytes = std::fs::read(&final_file).unwrap();
    // The first job's PS restarts (SIGTERM, then its checkpoint): finalizing again rewrites
    // its own file and keeps nothing aside.
    first.signal("TERM");
    first.wait_exit();
    let (_again, done) = run("first", 0).await;
    assert_eq!((done.version, done.earlier.as_deref()), (2, None), "its own model: {done:?}");

    let (_second, done) = run("second", 3).await;
    assert_eq!(done.version, 3);
    let kept = std::path::PathBuf::from(done.earlier.expect("the earlier model was kept"));
    assert_eq!(kept.parent(), Some(out.as_path()));
    assert!(kept.file_name().unwrap().to_string_lossy().starts_with("model-final.before-"), "{kept:?}");
    assert_eq!(std::fs::read(&kept).unwrap(), first_bytes, "the first run's model, byte for byte");
    assert_ne!(std::fs::read(&final_file).unwrap(), first_bytes, "the second run's model in its place");
}

/// --snapshot-every N: the model as first registered, then one file per N updates, each the
/// model at the version its record names, listed in snapshots.jsonl in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_are_written_every_n_updates() {
    let dir = tempfile::tempdir().unwrap();
    let snaps = dir.path().join("snapshots");
    let port = free_port();
    let mut ps = PsProcess::spawn(
        port,
        &["--workers", "2", "--snapshot-every", "4", "--snapshot-dir", snaps.to_str().unwrap()],
    );
    ps.wait_ready().await;
    let c = PsClient::new(&ps.url, Some(TOKEN.into())).unwrap();
    let l = layout();
    c.register(&l, &init(&l)).await.unwrap();
    train(&c, 2, 7, 1).await; // versions 1..=14
    let records = || -> Vec<serde_json::Value> {
        std::fs::read_to_string(snaps.join("snapshots.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    // The last multiple reached is 12: a snapshot at 12, 13 or 14 comes whatever the timing.
    let last = |r: &[serde_json::Value]| r.last().and_then(|r| r["version"].as_u64());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while last(&records()).is_none_or(|v| v < 12) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let records = records();
    let versions: Vec<u64> = records.iter().map(|r| r["version"].as_u64().unwrap()).collect();
    assert_eq!(versions[0], 0, "the registered model first: {versions:?}");
    assert!((12..=14).contains(versions.last().unwrap()), "{versions:?}");
    // At most one per interval of 4 (a loaded machine may skip one, never repeat one).
    let intervals: Vec<u64> = versions.iter().map(|v| v / 4).collect();
    assert!(intervals.windows(2).all(|w| w[0] < w[1]), "{versions:?}");
    for r in &records {
        let bytes = std::fs::read(snaps.join(r["file"].as_str().unwrap())).unwrap();
        let (layout, data, _) = checkpoint::decode(&bytes).unwrap();
        assert_eq!((layout, data.version), (l.clone(), r["version"].as_u64().unwrap()));
        assert!(data.state.mean_square.is_empty(), "a snapshot is the model only");
    }
    ps.signal("TERM");
    assert!(ps.wait_exit().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_to_start_with_bad_configuration() {
    let bin = env!("CARGO_BIN_EXE_foresight-ps");
    let cases: &[(&[&str], &str)] = &[
        (&["--workers", "2"], "no token"),
        (&["--workers", "2", "--token", "t", "--algorithm", "hogwild"], "unknown algorithm"),
        (
            &["--workers", "2", "--token", "t", "--algorithm", "asgd", "--lambda0", "0.5"],
            "lambda0 only applies",
        ),
        (&["--workers", "2", "--token", "t", "--mean-square-decay", "1.5"], "meanSquareDecay"),
        (&["--workers", "0", "--token", "t"], "at least one worker"),
        (&["--workers", "2", "--token-file", "/nonexistent/token"], "/nonexistent/token"),
        (&["--workers", "2", "--token", "t", "--snapshot-every", "5"], "needs --snapshot-dir"),
        (&["--workers", "2", "--token", "t", "--snapshot-dir", "/tmp"], "needs --snapshot-every"),
        (
            &["--workers", "2", "--token", "t", "--snapshot-every", "5", "--snapshot-dir", "/proc/x"],
            "/proc/x",
        ),
    ];
    for (args, expect) in cases {
        let out = Command::new(bin).args(*args).args(["--listen", "127.0.0.1:0"]).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(stderr.contains(expect), "{args:?}: expected {expect:?} in {stderr}");
    }
}

/// A PS started on the checkpoint directory of one that still runs (a deleted pod's replacement,
/// started while the old process writes its last checkpoint) waits for it to exit, and restores
/// the checkpoint the old one wrote on SIGTERM: no update is lost to the race.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_restores_what_its_predecessor_wrote_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let args = ["--workers", "2", "--checkpoint-interval", "0", "--checkpoint-dir", ckpt.to_str().unwrap()];
    let mut old = PsProcess::spawn(free_port(), &args);
    old.wait_ready().await;
    let c = PsClient::new(&old.url, Some(TOKEN.into())).unwrap();
    let l = layout();
    c.register(&l, &init(&l)).await.unwrap();
    train(&c, 2, 5, 1).await;
    let new = PsProcess::spawn(free_port(), &args);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        reqwest::get(format!("{}/healthz", new.url)).await.is_err(),
        "the successor serves while its predecessor still owns the checkpoint directory"
    );
    old.signal("TERM");
    assert!(old.wait_exit().success(), "SIGTERM must exit 0");
    new.wait_ready().await;
    let c = PsClient::new(&new.url, Some(TOKEN.into())).unwrap();
    let model = c.pull(0, None, Duration::ZERO).await.unwrap().unwrap();
    assert_eq!(model.version, 10, "the successor restored another version than the predecessor's last");
}

/// With --tls-cert the same API is served over TLS, HTTP/2 negotiated by ALPN (checked with curl).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_serves_http2_negotiated_by_alpn() {
    let dir = tempfile::tempdir().unwrap();
    let TlsFiles { cert, key } = self_signed_cert(dir.path());
    let port = free_port();
    let ps = PsProcess::spawn(
        port,
        &["--workers", "1", "--tls-cert", cert.to_str().unwrap(), "--tls-key", key.to_str().unwrap()],
    );
    let url = format!("https://127.0.0.1:{port}");
    let curl = |path: &str, token: Option<&str>| {
        let mut cmd = Command::new("curl");
        cmd.args([
            "-s",
            "--http2",
            "--cacert",
            cert.to_str().unwrap(),
            "-w",
            "\n%{http_version} %{http_code}",
        ]);
        if let Some(t) = token {
            cmd.args(["-H", &format!("Authorization: Bearer {t}")]);
        }
        let out = cmd.arg(format!("{url}{path}")).output().expect("curl (make setup installs it)");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !curl("/healthz", None).ends_with("2 200") {
        assert!(
            std::time::Instant::now() < deadline,
            "TLS endpoint never answered: {}",
            curl("/healthz", None)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(curl("/v1/status", Some(TOKEN)).ends_with("2 200"));
    assert!(curl("/v1/status", None).ends_with("2 401"));
    drop(ps);
}

/// The PS dies without a checkpoint, and a new worker process registers its initial weights
/// before the others notice: the next pull of a worker that trained shows an older model from
/// another process, so it offers its copy, which replaces the registered model (updates applied
/// to it or not); gradients computed on the registered model's versions are refused from then
/// on. Training does not go back to the initial weights.
#[test]
fn a_copy_fresher_than_a_model_registered_after_a_loss_replaces_it() {
    let rt = runtime();
    let port = free_port();
    let args = ["--algorithm", "asgd", "--workers", "2", "--checkpoint-interval", "0", "--reseed-hold", "1"];
    let ps = PsProcess::spawn(port, &args);
    rt.block_on(ps.wait_ready());
    let urls = [ps.url.clone()];
    let mut a = worker(&rt, &urls, Cadence::every_step(), 0, Duration::from_secs(30));
    for _ in 0..20 {
        assert_eq!(step(&mut a, 0), StepEnd::Continue);
    }
    drop(ps); // SIGKILL: nothing survives.

    let ps = PsProcess::spawn(port, &args);
    rt.block_on(ps.wait_ready());
    let b = PsClient::new(&ps.url, Some(TOKEN.into())).unwrap();
    let l = layout();
    let on_registered = rt.block_on(async {
        assert!(b.register(&l, &init(&l)).await.unwrap(), "the new process's model is the first");
        let generation = Some(b.join(1, None).await.unwrap().generation);
        // Worker 1's push id for step `seq`, on the model it pulls now.
        let pulled = |seq| {
            let b = b.clone();
            async move {
                let m = b.pull(1, None, Duration::ZERO).await.unwrap().unwrap();
                PushId { worker: 1, generation, version: m.version, incarnation: m.incarnation, seq }
            }
        };
        for seq in 1..=3 {
            b.push(pulled(seq).await, None, &l, &grad(&l, seq as usize), GradDtype::F32).await.unwrap();
        }
        pulled(4).await
    });
    assert_eq!(on_registered.version, 3, "3 updates applied to the registered model");

    // Worker 0's next step pulls v3 from another process, offers its copy (the model it pulled
    // last: v19, its 20th gradient went into v20), pulls that and pushes on it.
    assert_eq!(step(&mut a, 0), StepEnd::Continue);
    let status = rt.block_on(b.status()).unwrap();
    assert_eq!((&status["version"], &status["reseeds"]), (&20.into(), &1.into()), "{status}");
    let err = rt.block_on(b.push(on_registered, None, &l, &grad(&l, 4), GradDtype::F32)).unwrap_err();
    assert_eq!(err.reason(), Some("pull_required"), "a gradient on the replaced model: {err}");
    assert_eq!(rt.block_on(b.status()).unwrap()["version"], 20, "the refused push changed nothing");
}

/// A worker pulling int8 while its PS is stopped (SIGTERM: checkpoint) and started again: the new
/// process does not know the copy the worker holds, so its first pull is the whole model and the
/// ones after it are int8 differences again, and training goes on. Counted from the PS's own
/// metrics: every process sends exactly one whole model, then one int8 body per pull.
#[test]
fn int8_pulls_start_again_from_the_whole_model_after_a_ps_restart() {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let port = free_port();
    let args = ["--algorithm", "asgd", "--workers", "1", "--checkpoint-interval", "0", "--checkpoint-dir"];
    let args = [&args[..], &[ckpt.to_str().unwrap()]].concat();
    let mut ps = PsProcess::spawn(port, &args);
    rt.block_on(ps.wait_ready());
    let cadence = Cadence::every_step().pulling(PullDtype::Int8);
    let mut w = worker(&rt, std::slice::from_ref(&ps.url), cadence, 0, Duration::from_secs(30));
    let l = layout();
    let whole = wire::encode_f32(&l, &init(&l), &Default::default()).len() as f64;
    let int8 = wire::int8::encode(&l, &mut init(&l)).len() as f64;
    let sent = |url: &str| {
        let m = rt.block_on(scrape(url));
        (metric(&m, "foresight_ps_sent_bytes_total", &[]), metric(&m, "foresight_ps_pull_seconds_count", &[]))
    };
    for _ in 0..10 {
        assert_eq!(step(&mut w, 0), StepEnd::Continue);
    }
    let (bytes, pulls) = sent(&ps.url);
    assert!(pulls >= 10.0, "{pulls} pulls");
    assert_eq!(bytes, whole + (pulls - 1.0) * int8, "{pulls} pulls: one whole model, then differences");

    ps.signal("TERM");
    assert!(ps.wait_exit().success());
    let ps = PsProcess::spawn(port, &args);
    rt.block_on(ps.wait_ready());
    for _ in 0..10 {
        assert_eq!(step(&mut w, 0), StepEnd::Continue);
    }
    let (bytes, pulls) = sent(&ps.url);
    assert!(pulls >= 10.0, "{pulls} pulls after the restart");
    assert_eq!(bytes, whole + (pulls - 1.0) * int8, "after the restart, {pulls} pulls");
    assert_eq!(rt.block_on(status_of(&ps.url))["version"], 20, "10 updates before the restart, 10 after");
}

async fn status_of(url: &str) -> serde_json::Value {
    PsClient::new(url, Some(TOKEN.into())).unwrap().status().await.unwrap()
}
