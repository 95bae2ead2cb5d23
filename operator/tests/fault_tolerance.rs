//! Training that survives, with real processes killed for real (SIGKILL, SIGSTOP): a worker
//! replaced mid-run resumes where it left off; a parameter server that dies comes back from
//! its checkpoint, or without one from the freshest copy a worker holds, and so does one shard of
//! a sharded parameter server while the others keep serving; a `sync` round never
//! waits forever for a stuck worker. MNIST-5k, libtorch workers, the real `foresight-ps`.
//!
//! Nothing here depends on how fast the machine trains: every job has an epoch budget no run
//! reaches ([`EPOCHS`]), each step waits for what it needs (updates, a checkpoint, a join),
//! and the test ends the job itself with `/v1/finalize` once it has seen the recovery, as the
//! operator does when the workers are done; the workers then stop and exit 0.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use serde_json::Value;

mod support;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn bin(name: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_BIN_EXE_foresight")).parent().unwrap().join(name);
    assert!(p.exists(), "{name} is not built next to foresight: run `cargo test --workspace` (make test)");
    p
}

/// How long the test waits for any one thing: a generous bound, never a measure of speed.
const LIMIT: Duration = Duration::from_secs(600);

fn wait<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    support::wait_for(what, LIMIT, f)
}

/// A minimal HTTP/1.0 exchange with the PS: (status, body).
fn http(addr: &str, method: &str, path: &str, token: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    write!(s, "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    Some((head.split(' ').nth(1)?.parse().ok()?, body.to_string()))
}

fn status(addr: &str, token: &str) -> Option<Value> {
    let (code, body) = http(addr, "GET", "/v1/status", token)?;
    (code == 200).then(|| serde_json::from_str(&body).ok()).flatten()
}

/// A sample of the PS's /metrics (0 when absent).
fn metric(addr: &str, series: &str) -> f64 {
    let body = http(addr, "GET", "/metrics", "").map(|r| r.1).unwrap_or_default();
    body.lines()
        .find_map(|l| l.strip_prefix(series).filter(|rest| rest.starts_with([' ', '{'])))
        .and_then(|rest| rest.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

/// Processes of this test (their environment holds its token) that also have `var=value`.
fn pids_with(token: &str, var: &str, value: &str) -> Vec<u32> {
    let want = [format!("FORESIGHT_TOKEN={token}"), format!("{var}={value}")];
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let vars: Vec<&[u8]> = env.split(|b| *b == 0).collect();
            want.iter().all(|w| vars.contains(&w.as_bytes()))
        })
        .collect()
}

/// The sockets process `pid` holds open ("socket:[inode]").
fn sockets_of(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|l| l.display().to_string())
        .filter(|l| l.starts_with("socket:"))
        .collect()
}

/// The socket on the descriptor that process `pid`'s variable `var` names.
fn listen_socket_of(pid: u32, var: &str) -> String {
    let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let prefix = format!("{var}=");
    let fd = env
        .split(|b| *b == 0)
        .find_map(|v| std::str::from_utf8(v).ok()?.strip_prefix(&prefix).map(str::to_string))
        .unwrap_or_else(|| panic!("process {pid} has no {var}"));
    std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).unwrap().display().to_string()
}

/// The text of a log written with colours (tracing's default on a terminal-less stderr too).
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            chars.by_ref().find(|c| c.is_ascii_alphabetic());
        } else {
            out.push(c);
        }
    }
    out
}

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill").args([&format!("-{sig}"), &pid.to_string()]).status().unwrap();
    assert!(ok.success(), "kill -{sig} {pid}");
}

/// An epoch budget that bounds the runs without being reached: the tests finalize them.
const EPOCHS: u32 = 10_000;

fn job_yaml(dir: &Path, spec: &str) -> PathBuf {
    let p = dir.join("job.yaml");
    let text = format!(
        "apiVersion: foresight.dev/v1alpha1\nkind: TrainingJob\nmetadata: {{name: ft}}\nspec:\n  \
         model: {{name: mlp}}\n  dataset: {{format: csv, path: data/mnist5k}}\n  \
         training: {{epochs: {EPOCHS}, batchSize: 32, learningRate: 0.1}}\n  workers: {{replicas: 2}}\n{spec}"
    );
    std::fs::write(&p, text).unwrap();
    p
}

/// `foresight run` in the background with a known token, so that the test can find its
/// processes and read its PS; stopped if the test fails.
struct Run {
    child: Child,
    out: PathBuf,
    /// The run's control token: the one that may finalize it.
    control: String,
}

impl Run {
    fn start(dir: &Path, yaml: &Path, token: &str) -> Self {
        Self::start_with(dir, yaml, token, &[])
    }

    /// With extra environment for the run (its PS reads `FORESIGHT_*` settings from it).
    fn start_with(dir: &Path, yaml: &Path, token: &str, env: &[(&str, &str)]) -> Self {
        let out = dir.join("out");
        let control = format!("{token}-control");
        let log = std::fs::File::create(dir.join("foresight-run.log")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_foresight"))
            .args(["run", yaml.to_str().unwrap(), "--out", out.to_str().unwrap(), "--no-progress"])
            .env("FORESIGHT_TOKEN", token)
            .env("FORESIGHT_CONTROL_TOKEN", &control)
            .envs(env.iter().copied())
            .current_dir(repo())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        Self { child, out, control }
    }

    /// The PS's address, from the run's Prometheus targets.
    fn ps(&mut self) -> String {
        let sd = self.out.join("prometheus-targets.json");
        wait("the run's prometheus-targets.json", || {
            assert!(self.child.try_wait().unwrap().is_none(), "foresight run exited early");
            let v: Value = serde_json::from_str(&std::fs::read_to_string(&sd).ok()?).ok()?;
            Some(v[0]["targets"][0].as_str()?.to_string())
        })
    }

    /// Ends the job as the operator does, then waits for the run to finish.
    fn finalize(&mut self, ps: &str) -> ExitStatus {
        let (code, body) = http(ps, "POST", "/v1/finalize", &self.control.clone()).expect("the PS answers");
        assert_eq!(code, 200, "POST /v1/finalize: {body}");
        wait("foresight run to finish", || self.child.try_wait().unwrap())
    }

    fn summary(&self) -> Value {
        serde_json::from_slice(&std::fs::read(self.out.join("summary.json")).unwrap()).unwrap()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.out.parent().unwrap().join("foresight-run.log")).unwrap_or_default()
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
            let _ = wait("foresight run to stop", || self.child.try_wait().ok().flatten());
        }
    }
}

/// (accepted pushes, discarded gradients, test accuracy) from worker `w`'s `done` event (the
/// last process of that worker).
fn done(summary: &Value, w: u64) -> (u64, u64, f64) {
    let d = summary["per_worker"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["worker"] == w)
        .unwrap_or_else(|| panic!("no done event of worker {w}: {summary:#}"));
    (d["pushes"].as_u64().unwrap(), d["discarded"].as_u64().unwrap(), d["test_accuracy"].as_f64().unwrap())
}

/// Worker `w`'s entry in the PS's `/v1/status`, once `ready` holds for it.
fn worker_status(ps: &str, token: &str, w: usize, what: &str, ready: impl Fn(&Value) -> bool) -> Value {
    wait(what, || status(ps, token).map(|s| s["workers"][w].clone()).filter(&ready))
}

/// The bug this prevents: a replacement worker used to number its pushes from 1 again, the PS
/// answered `stale_seq`, and the worker exited 1 until `backoffLimit` failed the whole job.
#[test]
fn a_killed_worker_is_started_again_and_resumes_where_it_left_off() {
    let tmp = tempfile::tempdir().unwrap();
    let token = "fault-tolerance-worker-kill";
    let yaml = job_yaml(tmp.path(), "  optimizer: {algorithm: dc-asgd-a}\n");
    let mut run = Run::start(tmp.path(), &yaml, token);
    let ps = run.ps();
    let has = |key: &'static str, at_least: u64| move |w: &Value| w[key].as_u64().unwrap_or(0) >= at_least;
    worker_status(&ps, token, 1, "worker 1 to have 20 steps in the model", has("resume_step", 20));
    let pid = pids_with(token, "FORESIGHT_WORKER_INDEX", "1");
    assert_eq!(pid.len(), 1, "one process is worker 1: {pid:?}");
    signal(pid[0], "KILL");
    // The replacement joins as generation 2 and resumes where the PS says; then it trains on.
    let joined = worker_status(&ps, token, 1, "worker 1's replacement to join", has("generation", 2));
    let seen = joined["resume_step"].as_u64().unwrap();
    worker_status(&ps, token, 1, "the replacement's steps in the model", has("resume_step", seen + 20));
    // Its metrics are served on the socket `foresight run` held through the restart.
    let again = pids_with(token, "FORESIGHT_WORKER_INDEX", "1");
    assert_eq!(again.len(), 1, "one process is worker 1 after the restart: {again:?}");
    let served = listen_socket_of(again[0], "FORESIGHT_METRICS_LISTEN_FD");
    assert!(sockets_of(run.child.id()).contains(&served), "worker 1's metrics socket {served}");
    let exit = run.finalize(&ps);
    assert!(exit.success(), "foresight run failed ({exit}):\n{}", run.log());

    let summary = run.summary();
    let restarts = summary["restarts"].as_array().unwrap();
    assert_eq!(restarts.len(), 1, "{restarts:?}");
    assert_eq!(restarts[0]["process"], "worker 1");
    assert!(restarts[0]["status"].as_str().unwrap().contains("9"), "{restarts:?}");
    let worker_log = strip_ansi(&std::fs::read_to_string(run.out.join("logs/worker-1.log")).unwrap());
    let resumed_at: u64 = worker_log
        .lines()
        .find(|l| l.contains("resuming where this worker's earlier process left off"))
        .and_then(|l| l.split(" step=").nth(1)?.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("the replacement logs where it resumed:\n{worker_log}"));
    assert!(
        resumed_at >= 20 && resumed_at <= seen,
        "resumed at {resumed_at}; the PS said {seen} after the join"
    );
    // Every step is in the model exactly once: worker 0's pushes, the first process's steps
    // 1..=resumed_at, and the replacement's pushes from resumed_at + 1 on.
    let ((p0, d0, acc), (p1, d1, _)) = (done(&summary, 0), done(&summary, 1));
    assert_eq!((d0, d1), (0, 0), "no gradient was discarded");
    assert_eq!(summary["updates"].as_u64().unwrap(), p0 + resumed_at + p1, "{summary:#}");
    let rejected = &summary["rejected_gradients"];
    assert!(rejected.get("stale_seq").is_none_or(|n| n == 0), "{rejected}");
    assert!(acc > 0.5, "held-out accuracy of the final model {acc}");
    eprintln!(
        "worker 1 resumed at step {resumed_at}; {} updates, final held-out accuracy {acc:.4}",
        summary["updates"]
    );
}

/// With a checkpoint: the PS is killed, `foresight run` starts it again (as its Deployment
/// would), it restores the newest checkpoint and the workers carry on.
#[test]
fn a_killed_parameter_server_comes_back_from_its_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let token = "fault-tolerance-ps-kill";
    let spec = "  optimizer: {algorithm: dc-asgd-a}\n  parameterServer: {checkpoint: {intervalSeconds: 1}}\n";
    let yaml = job_yaml(tmp.path(), spec);
    let mut run = Run::start(tmp.path(), &yaml, token);
    let ps = run.ps();
    let ckpts = run.out.join("checkpoints");
    let newest_checkpoint = || {
        std::fs::read_dir(&ckpts)
            .ok()?
            .filter_map(|e| {
                e.ok()?.file_name().to_str()?.strip_prefix("ckpt-")?.get(..12)?.parse::<u64>().ok()
            })
            .max()
    };
    wait("a checkpoint of version ≥ 20", || newest_checkpoint().filter(|v| *v >= 20));
    let at_kill = status(&ps, token).unwrap()["version"].as_u64().unwrap();
    let pid = pids_with(token, "FORESIGHT_PS_LISTEN", &ps);
    assert_eq!(pid.len(), 1, "one parameter server: {pid:?}");
    signal(pid[0], "KILL");
    let version = || status(&ps, token).and_then(|s| s["version"].as_u64());
    let ps_log = || strip_ansi(&std::fs::read_to_string(run.out.join("logs/ps.log")).unwrap_or_default());
    let restored: u64 = wait("the new PS to restore a checkpoint", || {
        ps_log()
            .lines()
            .find(|l| l.contains("restored checkpoint"))
            .and_then(|l| l.split("version=").nth(1)?.split_whitespace().next()?.parse().ok())
    });
    wait("20 updates after the restore", || version().filter(|v| *v >= restored + 20));
    // The new PS serves on the socket `foresight run` held through the restart, so no other
    // process could take the port while the PS was down.
    let again = pids_with(token, "FORESIGHT_PS_LISTEN", &ps);
    assert_eq!(again.len(), 1, "one parameter server after the restart: {again:?}");
    let held = sockets_of(run.child.id());
    let served = listen_socket_of(again[0], "FORESIGHT_PS_LISTEN_FD");
    assert!(held.contains(&served), "the PS listens on {served}, foresight run holds {held:?}");
    let exit = run.finalize(&ps);
    assert!(exit.success(), "foresight run failed ({exit}):\n{}", run.log());

    let summary = run.summary();
    let restarts = summary["restarts"].as_array().unwrap();
    assert_eq!(restarts.len(), 1, "{restarts:?}");
    assert_eq!(restarts[0]["process"], "parameter server");
    assert!(
        restored >= 20 && restored <= at_kill + 1,
        "restored version {restored}, {at_kill} read before the kill"
    );
    let ((_, _, acc), _) = (done(&summary, 0), done(&summary, 1));
    assert!(acc > 0.5, "held-out accuracy of the final model {acc}");
    // `at_kill` was read just before the kill, so the loss is at least the difference.
    eprintln!(
        "PS killed at version ≥ {at_kill}, restored version {restored}: at least {} updates lost; final held-out accuracy {acc:.4}",
        at_kill.saturating_sub(restored)
    );
}

/// A model sharded over two parameter servers: shard 1 is SIGKILLed. Shard 0 keeps serving
/// with nothing lost while shard 1 is gone; `foresight run` starts shard 1 again, it restores
/// its own checkpoint, the workers carry on against both, and the final model, merged from the
/// shards' slices, is evaluated like an unsharded one.
#[test]
fn a_killed_shard_comes_back_from_its_checkpoint_while_the_other_keeps_serving() {
    let tmp = tempfile::tempdir().unwrap();
    let token = "fault-tolerance-shard-kill";
    let spec = "  optimizer: {algorithm: dc-asgd-a}\n  \
                parameterServer: {replicas: 2, checkpoint: {intervalSeconds: 1}}\n";
    let yaml = job_yaml(tmp.path(), spec);
    let mut run = Run::start(tmp.path(), &yaml, token);
    let shard0 = run.ps();
    let targets: Value =
        serde_json::from_str(&std::fs::read_to_string(run.out.join("prometheus-targets.json")).unwrap())
            .unwrap();
    assert_eq!(targets[1]["labels"]["foresight_dev_ps_shard"], "1", "{targets}");
    let shard1 = targets[1]["targets"][0].as_str().unwrap().to_string();
    let version = |addr: &str| status(addr, token).and_then(|s| s["version"].as_u64());
    let ckpts = run.out.join("checkpoints/shard-1");
    // A finished checkpoint, not the temporary file of one being written: a shard killed before
    // its first checkpoint is complete has nothing to restore (its workers re-seed it instead).
    let finished = || {
        let names =
            std::fs::read_dir(&ckpts).ok()?.flatten().filter_map(|e| e.file_name().into_string().ok());
        names.filter(|n| n.starts_with("ckpt-") && n.ends_with(".safetensors")).map(|_| ()).next()
    };
    wait("a finished checkpoint of shard 1", finished);
    wait("shard 1 at version ≥ 20", || version(&shard1).filter(|v| *v >= 20));
    let pid = pids_with(token, "FORESIGHT_PS_LISTEN", &shard1);
    assert_eq!(pid.len(), 1, "one process is shard 1: {pid:?}");
    signal(pid[0], "KILL");
    let at_kill = version(&shard0).expect("shard 0 answers");
    let ps_log = || strip_ansi(&std::fs::read_to_string(run.out.join("logs/ps-1.log")).unwrap_or_default());
    let restored: u64 = wait("shard 1 to restore its checkpoint", || {
        ps_log()
            .lines()
            .find(|l| l.contains("restored checkpoint"))
            .and_then(|l| l.split("version=").nth(1)?.split_whitespace().next()?.parse().ok())
    });
    assert!(version(&shard0).unwrap() >= at_kill, "shard 0 lost updates while shard 1 was down");
    wait("20 updates on shard 1 after its restore", || version(&shard1).filter(|v| *v >= restored + 20));
    let exit = run.finalize(&shard0);
    assert!(exit.success(), "foresight run failed ({exit}):\n{}", run.log());

    let summary = run.summary();
    let restarts = summary["restarts"].as_array().unwrap();
    assert_eq!(restarts.len(), 1, "{restarts:?}");
    assert_eq!(restarts[0]["process"], "parameter server shard 1");
    let final_model = &summary["final_model"];
    assert!(final_model["accuracy"].as_f64().unwrap() > 0.5, "{summary:#}");
    // The merged file holds the whole model at the lower of the shards' versions.
    assert!(final_model["version"].as_u64().unwrap() >= restored + 20, "{summary:#}");
    eprintln!(
        "shard 1 killed, restored at version {restored}; shard 0 at {at_kill} then; final model {final_model}"
    );
}

/// A `foresight-ps` process with its log in `dir`, killed when dropped.
struct Ps(Child);

impl Ps {
    fn start(dir: &Path, addr: &str, token: &str, args: &[&str]) -> Self {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("ps.log")).unwrap();
        let child = Command::new(bin("foresight-ps"))
            .args([
                "--listen",
                addr,
                "--workers",
                "2",
                "--learning-rate",
                "0.1",
                "--checkpoint-interval",
                "0",
            ])
            .args(args)
            .env("FORESIGHT_TOKEN", token)
            .env("FORESIGHT_PS_LISTEN", addr)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        wait("the PS to listen", || http(addr, "GET", "/readyz", "").map(|_| ()));
        Self(child)
    }
}

impl Drop for Ps {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Without a checkpoint the PS comes back empty: the workers offer their copies and training
/// continues from the freshest one, never from the initial weights.
#[test]
fn a_parameter_server_that_lost_everything_is_reseeded_from_the_workers_copies() {
    let tmp = tempfile::tempdir().unwrap();
    let token = "fault-tolerance-reseed";
    let addr = format!(
        "127.0.0.1:{}",
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    );
    let ps_args = ["--algorithm", "dc-asgd-a", "--reseed-hold", "30"];
    let first = Ps::start(tmp.path(), &addr, token, &ps_args);
    let data = repo().join("data/mnist5k");
    let workers: Vec<Child> = (0..2)
        .map(|i| {
            let log = std::fs::File::create(tmp.path().join(format!("worker-{i}.log"))).unwrap();
            Command::new(bin("foresight-worker"))
                .env("FORESIGHT_PS_URL", format!("http://{addr}"))
                .env("FORESIGHT_TOKEN", token)
                .env("FORESIGHT_WORKER_INDEX", i.to_string())
                .env("FORESIGHT_MODEL", "mlp")
                .env("FORESIGHT_DATASET_FORMAT", "csv")
                .env("FORESIGHT_DATASET_PATH", &data)
                .env("FORESIGHT_EPOCHS", EPOCHS.to_string())
                .env("FORESIGHT_BATCH_SIZE", "32")
                .env("FORESIGHT_TORCH_THREADS", "1")
                .env("FORESIGHT_METRICS_ADDR", "")
                .stdout(Stdio::piped())
                .stderr(log)
                .spawn()
                .unwrap()
        })
        .collect();
    let before = wait("40 updates", || status(&addr, token).filter(|s| s["version"].as_u64() >= Some(40)));
    let at_kill = before["version"].as_u64().unwrap();
    // The freshest copy a worker holds is its last pull: the newest updates may be nobody's yet.
    let pulled =
        before["workers"].as_array().unwrap().iter().filter_map(|w| w["pulled_version"].as_u64()).max();
    drop(first); // SIGKILL: the model existed only in its memory
    let second = Ps::start(tmp.path(), &addr, token, &ps_args);
    let updates_since = || metric(&addr, "foresight_ps_updates_total");
    wait("20 updates on the re-seeded PS", || (updates_since() >= 20.0).then_some(()));
    let (code, body) = http(&addr, "POST", "/v1/finalize", token).unwrap();
    assert_eq!(code, 200, "{body}");

    let mut finished = vec![];
    for (i, w) in workers.into_iter().enumerate() {
        let out = w.wait_with_output().unwrap();
        let log = std::fs::read_to_string(tmp.path().join(format!("worker-{i}.log"))).unwrap();
        assert!(out.status.success(), "worker {i} failed:\n{log}");
        let done: Value = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|e| e["event"] == "done")
            .unwrap_or_else(|| panic!("no done event from worker {i}"));
        finished.push(done);
    }
    let version = status(&addr, token).unwrap()["version"].as_u64().unwrap();
    let applied_since = metric(&addr, "foresight_ps_updates_total") as u64;
    let seed = version - applied_since;
    let logs = || {
        ["ps.log", "worker-0.log", "worker-1.log"]
            .map(|f| {
                format!(
                    "--- {f}\n{}",
                    strip_ansi(&std::fs::read_to_string(tmp.path().join(f)).unwrap_or_default())
                )
            })
            .join("\n")
    };
    let reseeds = metric(&addr, "foresight_ps_reseeds_total");
    assert!(
        reseeds >= 1.0,
        "the model came from a worker's copy (seed {seed}, version {version}):\n{}",
        logs()
    );
    // Not the initial model, nor an early one: the workers held copies of about `at_kill`. (The
    // newest version the PS recorded as pulled can be one no worker received: SIGKILL may cut
    // the response.)
    let pulled = pulled.expect("the workers had pulled");
    assert!(seed >= 20, "seeded at version {seed}; a worker had pulled version {pulled}:\n{}", logs());
    let acc = finished[0]["test_accuracy"].as_f64().unwrap();
    assert!(acc > 0.5, "held-out accuracy of the final model {acc}");
    eprintln!(
        "PS lost at version ≥ {at_kill}; re-seeded at version {seed} from a worker's copy (at least {} updates lost); \
         final version {version}, accuracy {acc:.4}",
        at_kill.saturating_sub(seed)
    );
    drop(second);
}

/// A stuck worker (SIGSTOP) does not stop a `sync` job: once the PS has heard nothing from it
/// for the silence timeout (2 s here), rounds close as soon as the other worker contributed,
/// and when it wakes it carries on. The round timeout is an hour: without the silence check
/// each round would wait for it.
#[test]
fn a_sync_round_never_waits_forever_for_a_stuck_worker() {
    let tmp = tempfile::tempdir().unwrap();
    let token = "fault-tolerance-sync-stuck";
    let yaml = job_yaml(tmp.path(), "  optimizer: {algorithm: sync, syncRoundTimeoutSeconds: 3600}\n");
    let mut run = Run::start_with(tmp.path(), &yaml, token, &[("FORESIGHT_WORKER_SILENCE_TIMEOUT", "2")]);
    let ps = run.ps();
    let version = || status(&ps, token).and_then(|s| s["version"].as_u64());
    wait("10 sync rounds", || version().filter(|v| *v >= 10));
    let pid = pids_with(token, "FORESIGHT_WORKER_INDEX", "1");
    assert_eq!(pid.len(), 1, "{pid:?}");
    // Rounds may have closed short before the stop too (worker 1 silent while libtorch loaded on
    // a busy machine), so both counts are taken from the moment of the stop.
    let closed_short = || metric(&ps, "foresight_ps_sync_rounds_closed_short_total");
    signal(pid[0], "STOP");
    let (stopped_at, short_at_stop) = (version().unwrap(), closed_short());
    wait("20 rounds without worker 1", || {
        (closed_short() >= short_at_stop + 20.0 && version()? >= stopped_at + 20).then_some(())
    });
    assert_eq!(status(&ps, token).unwrap()["workers"][1]["silent"], true);
    signal(pid[0], "CONT");
    let pushes = |w: &Value| w["pushes"].as_u64().unwrap_or(0);
    let before = pushes(&status(&ps, token).unwrap()["workers"][1]);
    worker_status(&ps, token, 1, "worker 1 to push again", |w| pushes(w) > before);
    let exit = run.finalize(&ps);
    assert!(exit.success(), "foresight run failed ({exit}):\n{}", run.log());
    let summary = run.summary();
    assert!(summary["restarts"].as_array().unwrap().is_empty());
    // Whether worker 1's first gradient after waking is late (`round_closed`, dropped) depends on
    // where SIGSTOP caught it (computing, or waiting for a round); either way it carries on.
    let ((_, _, acc), (p1, _, _)) = (done(&summary, 0), done(&summary, 1));
    assert!(p1 > before, "worker 1 pushed after it woke");
    assert!(acc > 0.5, "held-out accuracy of the final model {acc}");
}

/// Workers of a `sync` job finish at different times (one was stopped for a while and is 25
/// rounds behind): the rounds of the worker still training close without waiting for those that
/// finished, which say so (`POST /v1/leave`). The round timeout is an hour, so without that the
/// job would not end within the test's limit: every round after the others finished used to
/// wait for it.
#[test]
fn a_sync_job_does_not_wait_for_workers_that_finished_their_steps() {
    let tmp = tempfile::tempdir().unwrap();
    let token = "fault-tolerance-sync-finished";
    let yaml = tmp.path().join("job.yaml");
    let spec = "apiVersion: foresight.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: ft}\nspec:\n  \
                model: {name: mlp}\n  dataset: {format: csv, path: data/mnist5k}\n  \
                training: {epochs: 2, batchSize: 32, learningRate: 0.1}\n  \
                optimizer: {algorithm: sync, backupWorkers: 1, syncRoundTimeoutSeconds: 3600}\n  \
                workers: {replicas: 3}\n";
    std::fs::write(&yaml, spec).unwrap();
    let mut run = Run::start(tmp.path(), &yaml, token);
    let ps = run.ps();
    wait("5 sync rounds", || status(&ps, token).and_then(|s| s["version"].as_u64()).filter(|v| *v >= 5));
    let pid = pids_with(token, "FORESIGHT_WORKER_INDEX", "2");
    assert_eq!(pid.len(), 1, "{pid:?}");
    signal(pid[0], "STOP");
    // Rounds close with 2 of 3 (one backup worker) while worker 2 is stopped. (Not until 0 and 1
    // finish: one of them may be a step behind the other, and its last rounds then need worker 2.)
    let stopped = status(&ps, token).unwrap()["workers"][2]["pushes"].as_u64().unwrap();
    wait("25 rounds without worker 2", || {
        status(&ps, token).and_then(|s| s["version"].as_u64()).filter(|v| *v >= 30)
    });
    signal(pid[0], "CONT");
    let exit = wait("foresight run to finish", || run.child.try_wait().unwrap());
    assert!(exit.success(), "foresight run failed ({exit}):\n{}", run.log());
    let summary = run.summary();
    assert!(summary["restarts"].as_array().unwrap().is_empty());
    let (p2, _, acc) = done(&summary, 2);
    assert!(p2 > stopped, "worker 2 trained on alone after it woke ({stopped} pushes before, {p2} in all)");
    assert!(acc > 0.5, "held-out accuracy of the final model {acc}");
}
