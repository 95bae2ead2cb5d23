//! The real `foresight-worker` binary against a real parameter server started in this process on
//! loopback: MNIST-5k to ≥ 90 % held-out accuracy with one worker, a TorchScript model exported by
//! `examples/torchscript`, and the ways a worker must fail clearly (PS unreachable, wrong token,
//! unreadable data).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use foresight_ps::client::PsClient;
use foresight_ps::optimizer::{Algorithm, Hyper};
use foresight_ps::server::{AppState, Listener, PsConfig, router, serve};
use serde_json::Value;

const TOKEN: &str = "mnist-test-token";
/// A run that takes longer than this is killed and fails the test (a hang, not a slow machine).
const WORKER_LIMIT: Duration = Duration::from_secs(600);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// MNIST-5k, which `make setup` (run by `make test`) puts in data/.
fn mnist5k() -> PathBuf {
    let dir = repo().join("data/mnist5k");
    let file = dir.join("mnist_5k.csv.gz");
    assert!(file.is_file(), "{} is missing: run `make setup` (make test does it first)", file.display());
    dir
}

/// A parameter server in this process, on its own runtime, on a free loopback port.
struct Ps {
    url: String,
    state: Arc<AppState>,
    rt: tokio::runtime::Runtime,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Ps {
    fn start(algorithm: Algorithm, learning_rate: f32, workers: usize) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let mut config = PsConfig::new(Hyper::new(algorithm, learning_rate), workers);
        config.token = Some(TOKEN.into());
        config.job = "worker-it".into();
        config.namespace = "tests".into();
        let state = AppState::new(config).expect("valid PS config");
        let listener = rt.block_on(Listener::bind("127.0.0.1:0", None, None)).expect("a free loopback port");
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        rt.spawn(serve(listener, router(state.clone()), async move {
            let _ = rx.await;
        }));
        Ps { url: format!("http://{addr}"), state, rt, stop: Some(tx) }
    }

    /// `GET /v1/status`, as an operator or `foresight run` reads it.
    fn status(&self) -> Value {
        let client = PsClient::new(&self.url, Some(TOKEN.into())).unwrap();
        self.rt.block_on(client.status()).expect("PS status")
    }
}

impl Drop for Ps {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// What a finished worker left behind.
struct Run {
    status: ExitStatus,
    events: Vec<Value>,
    stderr: String,
    /// `/metrics`, scraped while it was training (when asked for).
    metrics: Option<String>,
}

impl Run {
    fn done(&self) -> &Value {
        self.events.iter().find(|e| e["event"] == "done").unwrap_or_else(|| {
            panic!(
                "no done event ({}); stderr:\n{}\nstdout events: {:?}",
                self.status, self.stderr, self.events
            )
        })
    }
}

/// The line the worker ends with on stderr when it fails: its error.
fn final_error(run: &Run) -> String {
    let err = strip_ansi(&run.stderr);
    err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default().to_string()
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters final-byte
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The address in the worker's "serving worker metrics addr=…" log line.
fn metrics_addr(line: &str) -> Option<SocketAddr> {
    let line = strip_ansi(line);
    if !line.contains("serving worker metrics") {
        return None;
    }
    let at = line.find("addr=")? + "addr=".len();
    line[at..].split_whitespace().next()?.parse().ok()
}

/// A plain HTTP/1.1 GET: the worker's metrics server speaks HTTP/1 like Prometheus does.
fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut s =
        TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect to the worker's metrics");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).expect("read the metrics response");
    assert!(resp.starts_with("HTTP/1.1 200"), "GET {path} on {addr}: {resp}");
    resp
}

/// Runs the worker binary with `args` and the test's environment minus any FORESIGHT_* settings.
fn run_worker(args: &[String], scrape_metrics: bool) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_foresight-worker"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("FORESIGHT_") {
            cmd.env_remove(k);
        }
    }
    let mut child = cmd
        .args(args)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn foresight-worker");
    let pid = child.id();
    let (finished_tx, finished_rx) = mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if finished_rx.recv_timeout(WORKER_LIMIT) == Err(mpsc::RecvTimeoutError::Timeout) {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
    });
    let (addr_tx, addr_rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    let stderr_reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines() {
            let line = line.unwrap_or_default();
            if let Some(addr) = metrics_addr(&line) {
                let _ = addr_tx.send(addr);
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let mut events = Vec::new();
    let mut metrics = None;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.expect("worker stdout");
        let event: Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("stdout line {line:?} is not JSON: {e}"));
        // Scrape while it trains: the first progress event means samples were counted.
        if scrape_metrics && metrics.is_none() && event["event"] == "progress" {
            let addr =
                addr_rx.recv_timeout(Duration::from_secs(30)).expect("the worker logged its metrics address");
            metrics = Some(http_get(addr, "/metrics"));
        }
        events.push(event);
    }
    let status = child.wait().unwrap();
    let _ = finished_tx.send(());
    watchdog.join().unwrap();
    let stderr = stderr_reader.join().unwrap();
    Run { status, events, stderr, metrics }
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// The common flags: one worker of one, one libtorch thread, no fixed ports.
fn worker_args(ps_url: &str, extra: &[&str]) -> Vec<String> {
    let mut a = args(&["--ps-url", ps_url, "--token", TOKEN, "--worker", "0"]);
    a.extend(args(&["--torch-threads", "1", "--metrics-addr", "127.0.0.1:0", "--seed", "1"]));
    a.extend(args(extra));
    a
}

/// The value of the first series of `name` in a Prometheus text exposition.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .and_then(|l| l.rsplit_once(' '))
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in the worker's metrics:\n{text}"))
}

#[test]
fn one_worker_and_a_ps_learn_mnist_5k_to_90_percent() {
    let data = mnist5k();
    let ps = Ps::start(Algorithm::Asgd, 0.1, 1);
    let data = data.to_string_lossy();
    let run = run_worker(
        &worker_args(
            &ps.url,
            &[
                "--model",
                "mlp",
                "--dataset-format",
                "csv",
                "--dataset-path",
                &data,
                "--epochs",
                "3",
                "--batch-size",
                "32",
            ],
        ),
        true,
    );
    assert!(run.status.success(), "worker failed ({}):\n{}", run.status, run.stderr);
    let done = run.done();
    let accuracy = done["test_accuracy"].as_f64().expect("test_accuracy");
    eprintln!("MNIST-5k, mlp, asgd, 1 worker: {done}");
    assert!(accuracy >= 0.90, "held-out accuracy {accuracy} < 0.90: {done}");
    let evals: Vec<&Value> = run.events.iter().filter(|e| e["event"] == "eval").collect();
    assert_eq!(evals.len(), 3, "one evaluation per epoch");
    assert!(run.events.iter().any(|e| e["event"] == "progress"), "no progress events");

    // The PS applied every gradient: 4,000 training examples / 32 = 125 steps per epoch.
    let pushes = done["pushes"].as_u64().unwrap();
    assert_eq!((done["steps"].as_u64(), pushes, done["discarded"].as_u64()), (Some(375), 375, Some(0)));
    let status = ps.status();
    assert_eq!(status["version"].as_u64(), Some(pushes), "one update per push: {status}");
    assert_eq!(
        status["staleness"]["count"].as_u64(),
        Some(pushes),
        "every update's staleness counted: {status}"
    );
    // One worker that pulls every step is never stale.
    assert_eq!(status["staleness"]["max"].as_u64(), Some(0), "{status}");
    assert_eq!(status["workers"][0]["pushes"].as_u64(), Some(pushes), "{status}");
    assert_eq!(status["parameters"].as_u64(), Some(235_146), "the MLP's layout: {status}");
    let reported = status["accuracy"].as_f64().expect("the worker reported its accuracy");
    assert_eq!(Some(reported), evals[2]["accuracy"].as_f64(), "the last report is the last evaluation");
    assert!(ps.state.metrics.staleness.get_sample_count() >= pushes);

    // Its own /metrics was served while it trained.
    let metrics = run.metrics.as_deref().expect("metrics scraped");
    assert!(metrics.contains(r#"job="local""#) && metrics.contains(r#"worker="0""#), "labels:\n{metrics}");
    assert!(metric(metrics, "foresight_worker_samples_total") > 0.0);
    assert!(metric(metrics, "foresight_worker_step_seconds_count") > 0.0);
    let compute = metrics
        .lines()
        .find(|l| l.starts_with("foresight_worker_phase_seconds_total{") && l.contains(r#"phase="compute""#))
        .and_then(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok());
    assert!(compute.is_some_and(|s| s > 0.0), "time in forward and backward:\n{metrics}");
    assert!(metric(metrics, "foresight_worker_loss") > 0.0);
}

#[test]
fn a_worker_added_by_scaling_waits_for_the_ps_to_know_it_then_takes_its_share() {
    let data = mnist5k();
    let ps = Ps::start(Algorithm::Asgd, 0.1, 1);
    let data = data.to_string_lossy();
    let mut a = worker_args(&ps.url, &["--model", "mlp", "--dataset-format", "csv", "--dataset-path", &data]);
    a.extend(args(&["--epochs", "1", "--batch-size", "32"]));
    assert_eq!(a[4], "--worker");
    a[5] = "1".into();
    // Worker 1 of a job the PS still thinks has 1 worker (the Job started the new pod before
    // the operator told the PS): its join is refused; once it has retried, the PS is told.
    let mut child = Command::new(env!("CARGO_BIN_EXE_foresight-worker"))
        .args(&a)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut log = String::new();
    let mut scaled = false;
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        if !scaled && line.contains("joining failed; retrying") && line.contains("unknown_worker") {
            ps.state.set_workers(2).unwrap();
            scaled = true;
        }
        log.push_str(&line);
        log.push('\n');
    }
    let status = child.wait().unwrap();
    assert!(scaled && status.success(), "{status}, scaled: {scaled}:\n{log}");
    // Its share of 4,000 training examples at 2 workers: 2,000, 63 steps of 32.
    assert!(log.contains("workers=2") && log.contains("train=2000"), "{log}");
    assert_eq!(ps.status()["workers"][1]["pushes"].as_u64(), Some(63), "{log}");
}

/// The venv's python (its torch matches the linked libtorch), else the first on PATH.
fn python() -> PathBuf {
    let venv = repo().join(".venv/bin/python");
    if venv.exists() {
        return venv;
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .flat_map(|d| [d.join("python3"), d.join("python")])
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("no python (looked for {} and on PATH): run `make setup`", venv.display()))
}

#[test]
fn a_torchscript_model_exported_by_the_example_trains_through_the_worker() {
    let data = mnist5k();
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("small_cnn.pt");
    let script = repo().join("examples/torchscript/export_model.py");
    let out = Command::new(python()).arg(&script).arg(&model).output().expect("run python");
    assert!(
        out.status.success() && model.is_file(),
        "{} failed ({}): run `make setup`\n{}",
        script.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let ps = Ps::start(Algorithm::Asgd, 0.05, 1);
    let (data, model) = (data.to_string_lossy(), model.to_string_lossy());
    let run = run_worker(
        &worker_args(
            &ps.url,
            &[
                "--model",
                "torchscript",
                "--model-path",
                &model,
                "--dataset-format",
                "csv",
                "--dataset-path",
                &data,
                "--epochs",
                "1",
                "--batch-size",
                "32",
            ],
        ),
        false,
    );
    assert!(run.status.success(), "worker failed ({}):\n{}", run.status, run.stderr);
    let done = run.done();
    eprintln!("MNIST-5k, TorchScript SmallCNN, asgd, 1 worker: {done}");
    let accuracy = done["test_accuracy"].as_f64().unwrap();
    assert!(accuracy >= 0.90, "held-out accuracy {accuracy} < 0.90: {done}");
    let status = ps.status();
    assert_eq!(status["parameters"].as_u64(), Some(9_130), "the exported CNN's layout: {status}");
    assert_eq!(status["version"].as_u64(), done["pushes"].as_u64(), "{status}");
}

/// A few CSV examples in `dir`: enough for the worker to start.
fn tiny_csv(dir: &Path) -> String {
    let lines: Vec<String> =
        (0..12).map(|i| format!("{},{},{},{}", i * 20, 255 - i * 20, 7, i % 2)).collect();
    std::fs::write(dir.join("tiny.csv"), lines.join("\n")).unwrap();
    dir.to_string_lossy().into_owned()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn a_worker_gives_up_on_an_unreachable_ps_after_its_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let data = tiny_csv(dir.path());
    let url = format!("http://127.0.0.1:{}", free_port());
    let run = run_worker(
        &worker_args(
            &url,
            &["--dataset-format", "csv", "--dataset-path", &data, "--ps-deadline-seconds", "2"],
        ),
        false,
    );
    assert!(!run.status.success(), "the worker succeeded without a PS:\n{}", run.stderr);
    assert!(run.events.is_empty(), "no progress without a PS: {:?}", run.events);
    let err = strip_ansi(&run.stderr);
    assert!(
        final_error(&run).contains("request to the parameter server failed")
            && final_error(&run).contains(&url),
        "the final error names the PS and its address:\n{err}"
    );
    let retries = err.matches("registering the model failed; retrying").count();
    assert!(retries >= 2, "it retried before giving up ({retries} retries):\n{err}");
}

#[test]
fn a_wrong_token_is_refused_without_retrying() {
    let dir = tempfile::tempdir().unwrap();
    let data = tiny_csv(dir.path());
    let ps = Ps::start(Algorithm::Asgd, 0.1, 1);
    let mut a = worker_args(&ps.url, &["--dataset-format", "csv", "--dataset-path", &data]);
    let at = a.iter().position(|x| x == TOKEN).unwrap();
    a[at] = "not-the-token".into();
    let run = run_worker(&a, false);
    assert!(!run.status.success(), "the worker succeeded with a wrong token:\n{}", run.stderr);
    let err = strip_ansi(&run.stderr);
    assert!(
        final_error(&run).contains("refused the request (401"),
        "the error says the PS refused it:\n{err}"
    );
    assert!(!err.contains("retrying"), "a refusal is not retried:\n{err}");
    assert!(ps.state.store().is_none(), "nothing was registered");
}

#[test]
fn an_unreadable_dataset_fails_at_start_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    // Whatever the PS: the data is read first.
    let url = format!("http://127.0.0.1:{}", free_port());
    let missing = dir.path().join("no-such-mnist");
    let run = run_worker(
        &worker_args(&url, &["--dataset-format", "mnist", "--dataset-path", &missing.to_string_lossy()]),
        false,
    );
    let err = strip_ansi(&run.stderr);
    assert!(!run.status.success());
    assert!(
        final_error(&run).contains(&format!("{}: no train-images-idx3-ubyte", missing.display())),
        "{err}"
    );
    assert!(!err.contains("retrying"), "it failed before contacting the PS:\n{err}");
    // An I/O error is said once (it was repeated: "…: No such file or directory (os error 2):
    // No such file or directory (os error 2)").
    let run = run_worker(
        &worker_args(&url, &["--dataset-format", "csv", "--dataset-path", &missing.to_string_lossy()]),
        false,
    );
    let said = final_error(&run);
    assert_eq!(said.matches("(os error 2)").count(), 1, "{said}");
    assert!(said.contains(&missing.display().to_string()), "{said}");

    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, "1,2,3,0\n4,five,6,1\n7,8,9,0\n").unwrap();
    let run = run_worker(
        &worker_args(&url, &["--dataset-format", "csv", "--dataset-path", &dir.path().to_string_lossy()]),
        false,
    );
    let err = strip_ansi(&run.stderr);
    assert!(!run.status.success());
    assert!(
        final_error(&run).contains(&format!("{}: line 2: pixel \"five\" is not a number", bad.display())),
        "{err}"
    );
}
