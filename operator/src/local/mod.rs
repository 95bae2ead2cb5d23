//! `foresight run`: a TrainingJob as local processes — one parameter server and M workers on
//! loopback, with the environment the operator would inject — then the final model, a
//! `summary.json` and a plot in the output directory.

mod plot;
mod servers;
mod summary;

use std::net::TcpListener;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use foresight_ps::server::{SNAPSHOT_INDEX, SnapshotRecord};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

use crate::api::{self, DEFAULT_BACKOFF_LIMIT, TrainingJob, WORKER_EXIT_PERMANENT};
use servers::Servers;
pub use summary::Summary;
use summary::{FinalEvaluation, History, WorkerEvent};

/// How to run a job locally.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Output directory (final model, summary.json, plot.png, logs/, checkpoints/).
    pub out: PathBuf,
    pub ps_bin: PathBuf,
    pub worker_bin: PathBuf,
    /// libtorch threads per worker (default: cores / workers, at least 1).
    pub torch_threads: Option<usize>,
    /// Extra environment for single workers, e.g. `(2, "FORESIGHT_SLOWDOWN", "3")`.
    pub worker_overrides: Vec<(usize, String, String)>,
    pub progress: bool,
    /// Continue from the checkpoints an earlier (interrupted) run left in `out`.
    pub resume: bool,
    /// The job token (default: a new random one).
    pub token: Option<String>,
    /// The control token, which alone may finalize or rescale the job (default: a new random one).
    pub control_token: Option<String>,
    /// The PS writes its model every N updates into `out/snapshots`, and the run evaluates each
    /// (summary.json's `curve`).
    pub snapshot_every: Option<u64>,
    /// The parameter servers' update journal (`None`: their default, on).
    pub journal: Option<foresight_ps::journal::Mode>,
}

impl RunOptions {
    /// Binaries next to the running `foresight` executable (how `cargo build` lays them out).
    pub fn beside_current_exe(out: PathBuf) -> Self {
        let dir =
            std::env::current_exe().ok().and_then(|p| p.parent().map(Path::to_path_buf)).unwrap_or_default();
        Self {
            out,
            ps_bin: dir.join("foresight-ps"),
            worker_bin: dir.join("foresight-worker"),
            torch_threads: None,
            worker_overrides: Vec::new(),
            progress: true,
            resume: false,
            token: None,
            control_token: None,
            snapshot_every: None,
            journal: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("invalid TrainingJob:\n  {}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n  "))]
    Invalid(Vec<api::ValidationError>),
    #[error("{0}")]
    Setup(String),
    #[error("{name} failed ({status}); last lines of {log}:\n{tail}")]
    ProcessFailed { name: String, status: String, log: String, tail: String },
    #[error("interrupted: every process was stopped; the parameter server left a checkpoint in {0}")]
    Interrupted(String),
}

impl RunError {
    /// The CLI's exit code: 2 for a bad job, 130 for Ctrl-C, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Invalid(_) | Self::Setup(_) => 2,
            Self::Interrupted(_) => 130,
            Self::ProcessFailed { .. } => 1,
        }
    }
}

fn setup(what: impl std::fmt::Display) -> RunError {
    RunError::Setup(what.to_string())
}

/// Reads and validates a TrainingJob YAML file.
pub fn load_job(path: &Path) -> Result<TrainingJob, RunError> {
    let text = std::fs::read_to_string(path).map_err(|e| setup(format!("{}: {e}", path.display())))?;
    let value: serde_yaml::Value =
        serde_yaml::from_str(&text).map_err(|e| setup(format!("{}: not valid YAML: {e}", path.display())))?;
    let (api_version, kind) =
        (value.get("apiVersion").and_then(|v| v.as_str()), value.get("kind").and_then(|v| v.as_str()));
    if api_version != Some("foresight.dev/v1alpha1") || kind != Some("TrainingJob") {
        return Err(setup(format!(
            "{}: expected apiVersion foresight.dev/v1alpha1 and kind TrainingJob, found {:?} and {:?}",
            path.display(),
            api_version.unwrap_or("none"),
            kind.unwrap_or("none")
        )));
    }
    let job: TrainingJob =
        serde_yaml::from_value(value).map_err(|e| setup(format!("{}: {e}", path.display())))?;
    api::validate(&job.spec).map_err(RunError::Invalid)?;
    let pods = [("workers", &job.spec.workers.pod), ("parameterServer", &job.spec.parameter_server.pod)];
    for (role, pod) in pods {
        if pod.as_ref().is_some_and(|p| p.init_containers.as_ref().is_some_and(|c| !c.is_empty())) {
            tracing::warn!(
                "{role}.pod.initContainers run in a cluster's pods only; foresight run starts none"
            );
        }
    }
    Ok(job)
}

/// `n` listening sockets on free loopback ports, held for the whole run: each server inherits
/// its own (`Inherited`), so no other process can take a port between its choice and the
/// server's start, nor while the server restarts. (Chosen and released instead, a port was
/// taken in between: CI saw a PS shard fail with "Address already in use", and `make
/// convergence` a worker of 16 whose sibling held its metrics port.)
fn loopback_listeners(n: usize) -> Result<Vec<TcpListener>, RunError> {
    (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| setup(format!("no free loopback port: {e}")))
}

fn port_of(listener: &TcpListener) -> u16 {
    listener.local_addr().map_or(0, |a| a.port())
}

/// A listening socket a child process inherits: its descriptor here (and in the child), and the
/// variable that tells the child which descriptor it is.
#[derive(Clone, Copy, Debug)]
struct Inherited {
    var: &'static str,
    fd: RawFd,
}

impl Inherited {
    fn new(var: &'static str, listener: &TcpListener) -> Self {
        Self { var, fd: listener.as_raw_fd() }
    }
}

/// A started child process and where its stderr goes.
struct Proc {
    name: String,
    pid: u32,
    log: PathBuf,
}

impl Proc {
    fn signal(&self, sig: &str) {
        // The process may have exited already; that is fine.
        let _ = std::process::Command::new("kill")
            .args([&format!("-{sig}"), &self.pid.to_string()])
            .stderr(Stdio::null())
            .status();
    }

    fn failed(&self, status: ExitStatus) -> RunError {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(8)..].join("\n");
        RunError::ProcessFailed {
            name: self.name.clone(),
            status: status.to_string(),
            log: self.log.display().to_string(),
            tail,
        }
    }
}

/// What a process runs: a program and its arguments.
#[derive(Clone, Debug)]
struct Program {
    path: PathBuf,
    args: Vec<String>,
}

impl Program {
    fn bare(path: &Path) -> Self {
        Self { path: path.to_path_buf(), args: Vec::new() }
    }

    /// A worker's: the job's own program (`workers.command` and `args`, e.g. a Python script
    /// with the `foresight` package, found on `PATH` as a shell would), or the built-in worker.
    fn worker(spec: &api::TrainingJobSpec, opts: &RunOptions) -> Self {
        match spec.workers.command.as_deref() {
            Some([program, rest @ ..]) => Self {
                path: PathBuf::from(program),
                args: rest.iter().chain(spec.workers.args.iter().flatten()).cloned().collect(),
            },
            _ => Self::bare(&opts.worker_bin),
        }
    }
}

fn spawn(
    name: &str,
    program: &Program,
    env: &[(String, String)],
    log: PathBuf,
    stdout: Stdio,
    inherited: Option<Inherited>,
) -> Result<(Proc, Child), RunError> {
    // Appended, so that a restarted process's log follows its predecessor's.
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .map_err(|e| setup(format!("{}: {e}", log.display())))?;
    let bin = &program.path;
    let mut command = Command::new(bin);
    if let Some(Inherited { var, fd }) = inherited {
        command.env(var, fd.to_string());
        // SAFETY: between fork and exec the closure only calls fcntl, which is
        // async-signal-safe, on a descriptor this process holds open for the whole run.
        unsafe { command.pre_exec(move || keep_open_across_exec(fd)) };
    }
    let child = command
        .args(&program.args)
        // Given to the PS explicitly; a worker must not inherit it from this process.
        .env_remove("FORESIGHT_CONTROL_TOKEN")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(file)
        // Own process group: a terminal's Ctrl-C reaches only `foresight run`, which then stops
        // the children in order (SIGTERM, so the PS writes its checkpoint).
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| {
            setup(format!(
                "cannot start {name} ({}): {e} (Foresight's own binaries: `cargo build --release`; \
                 a workers.command program: is it on PATH?)",
                bin.display()
            ))
        })?;
    let pid = child.id().ok_or_else(|| setup(format!("{name} exited at once")))?;
    Ok((Proc { name: name.to_string(), pid, log }, child))
}

/// Clears close-on-exec on `fd` (Rust opens every descriptor with it), in a forked child.
fn keep_open_across_exec(fd: RawFd) -> std::io::Result<()> {
    // SAFETY: fcntl(F_SETFD) reads no memory of this process.
    match unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } {
        -1 => Err(std::io::Error::last_os_error()),
        _ => Ok(()),
    }
}

enum Msg {
    Line(usize, String),
    Exit(usize, ExitStatus),
}

/// The `namespace` label of a local run's metrics.
const NAMESPACE: &str = "local";

fn job_name(job: &TrainingJob) -> String {
    job.metadata.name.clone().unwrap_or_else(|| "local".into())
}

/// A process `foresight run` started again after it failed, as a Deployment or a Job would.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Restart {
    pub process: String,
    /// Seconds since the run started.
    pub at: f64,
    pub status: String,
}

/// The worker processes: how to start each again, and where their output goes.
struct Workers {
    env: Vec<Vec<(String, String)>>,
    procs: Vec<Proc>,
    tx: mpsc::Sender<Msg>,
    program: Program,
    logs: PathBuf,
    /// Each built-in worker's metrics listener (a job's own program serves none).
    metrics: Vec<TcpListener>,
}

impl Workers {
    /// Starts worker `i` and a task that forwards its stdout lines, then its exit status.
    fn start(&self, i: usize) -> Result<Proc, RunError> {
        let log = self.logs.join(format!("worker-{i}.log"));
        let metrics = self.metrics.get(i).map(|l| Inherited::new("FORESIGHT_METRICS_LISTEN_FD", l));
        let (proc_, mut child) =
            spawn(&format!("worker {i}"), &self.program, &self.env[i], log, Stdio::piped(), metrics)?;
        let stdout = child.stdout.take().expect("piped");
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let _ = tx.send(Msg::Line(i, line)).await;
            }
            let status = child.wait().await;
            let _ = tx.send(Msg::Exit(i, status.unwrap_or_else(|_| failed_status()))).await;
        });
        Ok(proc_)
    }

    fn signal_all(&self, sig: &str) {
        for w in &self.procs {
            w.signal(sig);
        }
    }
}

/// Counts restarts against the job's `backoffLimit`, per kind of process.
struct Backoff {
    limit: u32,
    workers: u32,
    ps: u32,
    restarts: Vec<Restart>,
}

impl Backoff {
    /// Records a failure of `process`; false when its budget is spent.
    fn allow(&mut self, process: &str, is_ps: bool, status: ExitStatus, at: f64) -> bool {
        let used = if is_ps { &mut self.ps } else { &mut self.workers };
        if *used >= self.limit {
            return false;
        }
        *used += 1;
        self.restarts.push(Restart { process: process.to_string(), at, status: status.to_string() });
        true
    }
}

/// Runs `job` to completion on this machine.
pub async fn run(job: &TrainingJob, opts: &RunOptions) -> Result<Summary, RunError> {
    // Installed before any child starts, so Ctrl-C, `kill` or a closed terminal at any point
    // stop the run in order, instead of the default exit that would orphan the children.
    let mut stop = stop_signals()?;
    let spec = &job.spec;
    let name = job_name(job);
    let namespace = NAMESPACE;
    check_paths(spec)?;
    let m = spec.workers.replicas as usize;
    let ckpt_dir = opts.out.join("checkpoints");
    let earlier = std::fs::read_dir(&ckpt_dir).map(|d| d.count() > 0).unwrap_or(false);
    if earlier && !opts.resume {
        return Err(setup(format!(
            "{} holds checkpoints of an earlier run: pass --resume to continue from them, or choose another --out",
            ckpt_dir.display()
        )));
    }
    std::fs::create_dir_all(opts.out.join("logs"))
        .map_err(|e| setup(format!("{}: {e}", opts.out.display())))?;
    let random_token = || {
        use rand::Rng;
        let mut rng = rand::rng();
        (0..32).map(|_| format!("{:x}", rng.random_range(0..16u8))).collect::<String>()
    };
    let token: String = opts.token.clone().unwrap_or_else(random_token);
    // What this process finalizes the job with; the workers never see it.
    let control: String = opts.control_token.clone().unwrap_or_else(random_token);
    if control == token {
        return Err(setup("the control token must differ from the job token"));
    }
    let started = Instant::now();
    let started_unix_ms = unix_ms();

    // The parameter server: one process per shard.
    let n = spec.parameter_server.shards();
    let mut ps_listeners = loopback_listeners(n + m)?;
    let metrics_listeners = ps_listeners.split_off(n);
    let metrics_ports: Vec<u16> = metrics_listeners.iter().map(port_of).collect();
    let mut ps_env = api::ps_env(spec, &name, namespace);
    ps_env.push(("FORESIGHT_TOKEN".into(), token.clone()));
    ps_env.push(("FORESIGHT_CONTROL_TOKEN".into(), control.clone()));
    let snapshot_dir = opts.out.join("snapshots");
    let own_program = spec.workers.command.is_some();
    if own_program && opts.snapshot_every.is_some() {
        return Err(setup(
            "--snapshot-every evaluates snapshots with the built-in worker, which cannot evaluate the model of \
             workers.command's program",
        ));
    }
    if n > 1 && opts.snapshot_every.is_some() {
        return Err(setup(
            "--snapshot-every is for an unsharded parameter server (parameterServer.replicas: 1)",
        ));
    }
    if let Some(mode) = opts.journal {
        let mode = clap::ValueEnum::to_possible_value(&mode).expect("every mode has a name");
        ps_env.push(("FORESIGHT_JOURNAL".into(), mode.get_name().to_string()));
    }
    if let Some(every) = opts.snapshot_every {
        ps_env.extend([
            ("FORESIGHT_SNAPSHOT_EVERY".into(), every.to_string()),
            ("FORESIGHT_SNAPSHOT_DIR".into(), snapshot_dir.display().to_string()),
        ]);
    }
    let mut ps = Servers::start(&opts.ps_bin, ps_env, ps_listeners, &control, &ckpt_dir, &opts.out).await?;
    let client = ps.first().clone();

    // The workers, with the environment the operator would give their pods.
    let (tx, mut rx) = mpsc::channel::<Msg>(1024);
    let worker_targets: Vec<String> = metrics_ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    // A job's own program serves no metrics (the Python package has no metrics server): its
    // sockets are closed, so that a scrape of its port is refused rather than left waiting.
    let worker_metrics = if own_program {
        drop(metrics_listeners);
        Vec::new()
    } else {
        metrics_listeners
    };
    let env = worker_envs(job, opts, &ps.urls(), &token, &metrics_ports);
    let mut workers = Workers {
        env,
        procs: Vec::with_capacity(m),
        tx,
        program: Program::worker(spec, opts),
        logs: opts.out.join("logs"),
        metrics: worker_metrics,
    };
    for i in 0..m {
        let p = workers.start(i)?;
        workers.procs.push(p);
    }
    write_targets(&opts.out, &name, &ps.targets(), &worker_targets);

    let bar = progress_bar(opts.progress, spec.training.epochs);
    let limit = spec.run_policy.backoff_limit.unwrap_or(DEFAULT_BACKOFF_LIMIT);
    let mut backoff = Backoff { limit, workers: 0, ps: 0, restarts: Vec::new() };
    let mut history = History::default();
    let mut done: Vec<Option<WorkerEvent>> = vec![None; m];
    let mut last_done = None;
    let mut exited = 0;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    while exited < m {
        tokio::select! {
            msg = rx.recv() => match msg {
                Some(Msg::Line(i, line)) => {
                    if let Ok(ev) = serde_json::from_str::<WorkerEvent>(&line) {
                        history.record(started.elapsed().as_secs_f64(), &ev);
                        if let WorkerEvent::Done { last, .. } = ev {
                            // The worker whose leave wrote the final model evaluated that very
                            // model; without one (a PS too old to say), the last line.
                            if last || !last_done.is_some_and(|d| matches!(done[d], Some(WorkerEvent::Done { last: true, .. }))) {
                                last_done = Some(i);
                            }
                            done[i] = Some(ev);
                        }
                    }
                }
                Some(Msg::Exit(_, status)) if status.success() => exited += 1,
                Some(Msg::Exit(i, status)) => {
                    let what = workers.procs[i].name.clone();
                    // Like the worker Job's podFailurePolicy: a failure no retry fixes is final.
                    let permanent = status.code() == Some(WORKER_EXIT_PERMANENT);
                    if permanent || !backoff.allow(&what, false, status, started.elapsed().as_secs_f64()) {
                        bar.abandon();
                        stop_everything(&workers, &mut ps, &mut rx, m - exited - 1).await;
                        return Err(workers.procs[i].failed(status));
                    }
                    bar.println(format!("{what} failed ({status}); starting it again ({} of {limit} restarts)", backoff.workers));
                    workers.procs[i] = workers.start(i)?;
                }
                None => break,
            },
            (i, status) = ps.exited() => {
                let what = ps.name(i);
                if !backoff.allow(&what, true, status, started.elapsed().as_secs_f64()) {
                    bar.abandon();
                    stop_everything(&workers, &mut ps, &mut rx, m - exited).await;
                    return Err(ps.failed(i, status));
                }
                bar.println(format!("the {what} failed ({status}); starting it again ({} of {limit} restarts)", backoff.ps));
                ps.restart(i).await?;
            }
            _ = tick.tick() => {
                let status = client.status().await.ok();
                bar.set_position((history.mean_epoch(m) * 1000.0) as u64);
                bar.set_message(history.line(status.as_ref()));
            }
            _ = stop.changed() => {
                bar.abandon();
                stop_everything(&workers, &mut ps, &mut rx, m - exited).await;
                return Err(RunError::Interrupted(ckpt_dir.display().to_string()));
            }
        }
    }
    bar.finish_and_clear();

    // Every worker finished: write the final model, collect the figures, stop the PS.
    // (A sharded job's status and metrics are its first shard's: each shard applies every
    // push, so versions and staleness agree but for pushes a restarted shard lost.)
    let model = ps.finalize().await?;
    let status = client.status().await.map_err(|e| setup(format!("reading the PS status: {e}")))?;
    let metrics = reqwest_text(&format!("http://{}/metrics", ps.targets()[0])).await.unwrap_or_default();
    let ps_cpu_seconds = ps.cpu_seconds();
    ps.stop(Duration::from_secs(60)).await?;
    let (bin, env) = (&opts.worker_bin, &workers.env[0]);
    let final_model = match &model {
        Some(path) if !own_program => {
            evaluate_models(bin, env, "--model-file", path).await?.into_iter().next()
        }
        _ => None,
    };
    // The built-in evaluator does not know the model of the job's own program: the worker whose
    // leave was the last evaluated the final model, its own buffers included
    // (`foresight.finish(evaluate=...)`).
    let last_evaluation = match last_done.and_then(|i| done[i].clone()) {
        Some(WorkerEvent::Done { test_loss: Some(loss), test_accuracy: Some(accuracy), .. })
            if own_program =>
        {
            Some((loss, accuracy))
        }
        _ => None,
    };
    let curve = match opts.snapshot_every {
        Some(_) => summary::curve(
            &snapshot_records(&snapshot_dir)?,
            &evaluate_models(bin, env, "--snapshot-dir", &snapshot_dir).await?,
            started_unix_ms,
        ),
        None => Vec::new(),
    };
    let mut summary = Summary::build(
        &name,
        spec,
        started.elapsed().as_secs_f64(),
        done.into_iter().flatten().collect(),
        &status,
        &metrics,
        model,
        final_model,
        &history,
    );
    summary.ps_cpu_seconds = ps_cpu_seconds;
    if let Some((loss, accuracy)) = last_evaluation {
        (summary.loss, summary.accuracy) = (Some(loss), Some(accuracy));
    }
    summary.restarts = backoff.restarts;
    summary.curve = curve;
    summary.write(&opts.out).map_err(|e| setup(format!("writing the summary: {e}")))?;
    plot::draw(&opts.out.join("plot.png"), &history, &summary)
        .map_err(|e| setup(format!("drawing the plot: {e}")))?;
    Ok(summary)
}

/// Held-out loss and accuracy of saved models (the final one, or every snapshot), by
/// `foresight-worker evaluate` with the job's model and dataset settings (a worker's
/// environment): one evaluation per line of its output.
async fn evaluate_models(
    worker_bin: &Path,
    env: &[(String, String)],
    flag: &str,
    path: &Path,
) -> Result<Vec<FinalEvaluation>, RunError> {
    let what = format!("{flag} {}", path.display());
    let out = Command::new(worker_bin)
        .arg("evaluate")
        .arg(flag)
        .arg(path)
        .envs(env.iter().map(|(k, v)| (k, v)))
        // An evaluation is no worker: whatever finds worker m's process by its index (a
        // supervisor, scripts/chaos.py killing workers) must not find this one.
        .env_remove("FORESIGHT_WORKER_INDEX")
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| setup(format!("cannot start {} evaluate: {e}", worker_bin.display())))?;
    if !out.status.success() {
        let why = String::from_utf8_lossy(&out.stderr);
        return Err(setup(format!("evaluating {what} failed: {}", why.trim())));
    }
    out.stdout
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| {
            serde_json::from_slice(l).map_err(|e| setup(format!("reading the evaluation of {what}: {e}")))
        })
        .collect()
}

/// The PS's record of the snapshots it wrote.
fn snapshot_records(dir: &Path) -> Result<Vec<SnapshotRecord>, RunError> {
    let path = dir.join(SNAPSHOT_INDEX);
    let text = std::fs::read_to_string(&path).map_err(|e| setup(format!("{}: {e}", path.display())))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).map_err(|e| setup(format!("{}: {e}", path.display()))))
        .collect()
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Stops every process in order — SIGTERM to all, the parameter server's last checkpoint (up to
/// 60 s), then the exit of each of the `live` workers (up to 30 s, then SIGKILL) — so that no
/// process outlives `foresight run`.
async fn stop_everything(workers: &Workers, ps: &mut Servers, rx: &mut mpsc::Receiver<Msg>, live: usize) {
    workers.signal_all("TERM");
    let _ = ps.stop(Duration::from_secs(60)).await;
    let mut live = live;
    for (sig, limit) in [(None, 30), (Some("KILL"), 10)] {
        if live == 0 {
            return;
        }
        if let Some(sig) = sig {
            workers.signal_all(sig);
        }
        let exits = async {
            while live > 0 {
                match rx.recv().await {
                    Some(Msg::Exit(..)) => live -= 1,
                    Some(Msg::Line(..)) => {}
                    None => break,
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(limit), exits).await;
    }
}

/// Each worker's environment: what the operator gives its pod, plus its index, the token, its
/// metrics port, libtorch threads (cores / M by default) and the run's per-worker overrides.
fn worker_envs(
    job: &TrainingJob,
    opts: &RunOptions,
    ps_url: &str,
    token: &str,
    metrics_ports: &[u16],
) -> Vec<Vec<(String, String)>> {
    let m = metrics_ports.len();
    let threads = opts.torch_threads.unwrap_or_else(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        (cores / m).max(1)
    });
    let name = job_name(job);
    metrics_ports
        .iter()
        .enumerate()
        .map(|(i, port)| {
            let mut e = api::worker_env(&job.spec, &name, NAMESPACE, ps_url);
            e.extend([
                ("FORESIGHT_WORKER_INDEX".into(), i.to_string()),
                ("FORESIGHT_TOKEN".into(), token.to_string()),
                ("FORESIGHT_TORCH_THREADS".into(), threads.to_string()),
                ("FORESIGHT_METRICS_ADDR".into(), format!("127.0.0.1:{port}")),
            ]);
            let overrides = opts.worker_overrides.iter().filter(|(w, _, _)| *w == i);
            e.extend(overrides.map(|(_, k, v)| (k.clone(), v.clone())));
            e
        })
        .collect()
}

/// The data and model files the spec names must exist here.
fn check_paths(spec: &api::TrainingJobSpec) -> Result<(), RunError> {
    for (what, p) in [
        ("dataset.path", Some(&spec.dataset.path)),
        ("model.torchscript.path", spec.model.torchscript.as_ref().map(|t| &t.path)),
    ] {
        if let Some(p) = p.filter(|p| !Path::new(p).exists()) {
            return Err(setup(format!(
                "spec.{what} {p:?} does not exist on this machine (for the demo data: make setup)"
            )));
        }
    }
    Ok(())
}

/// Becomes true on SIGINT, SIGTERM or SIGHUP.
fn stop_signals() -> Result<tokio::sync::watch::Receiver<bool>, RunError> {
    use tokio::signal::unix::{SignalKind, signal};
    let listen = |kind: SignalKind| signal(kind).map_err(|e| setup(format!("cannot handle signals: {e}")));
    let (mut int, mut term, mut hup) =
        (listen(SignalKind::interrupt())?, listen(SignalKind::terminate())?, listen(SignalKind::hangup())?);
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
            _ = hup.recv() => {}
        }
        let _ = tx.send(true);
    });
    Ok(rx)
}

fn failed_status() -> ExitStatus {
    use std::os::unix::process::ExitStatusExt;
    ExitStatus::from_raw(1 << 8)
}

async fn wait_ready(url: &str, child: &mut Child, ps: &Proc) -> Result<(), RunError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(ps.failed(status));
        }
        if reqwest_text(&format!("{url}/readyz")).await.is_some() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(setup("the parameter server did not become ready within 30 s"))
}

/// GET `url`, the body on a 200, within two seconds: the run keeps a PS's listening socket (the
/// PS inherits it), so a PS that died still has its connections accepted by the kernel, and a
/// call without a deadline would wait on them for ever instead of seeing the PS exit.
async fn reqwest_text(url: &str) -> Option<String> {
    let client = reqwest::Client::builder().timeout(Duration::from_secs(2)).build().ok()?;
    let resp = client.get(url).send().await.ok()?;
    if !resp.status().is_success() {
        return None;
    }
    resp.text().await.ok()
}

/// Prometheus file-based service discovery for the PS and the workers of this run: the PS
/// shards first (labelled as the chart's PodMonitor labels a sharded PS's pods), then the
/// workers.
fn write_targets(out: &Path, job: &str, shards: &[String], workers: &[String]) {
    let group = |targets: &[String], shard: Option<usize>| {
        let mut labels = serde_json::json!({ "trainingjob": job });
        if let Some(i) = shard {
            labels["foresight_dev_ps_shard"] = i.to_string().into();
        }
        serde_json::json!({ "targets": targets, "labels": labels })
    };
    let sharded = shards.len() > 1;
    let mut sd: Vec<_> = shards
        .iter()
        .enumerate()
        .map(|(i, t)| group(std::slice::from_ref(t), sharded.then_some(i)))
        .collect();
    sd.push(group(workers, None));
    let _ =
        std::fs::write(out.join("prometheus-targets.json"), serde_json::to_vec_pretty(&sd).expect("json"));
}

fn progress_bar(visible: bool, epochs: u32) -> ProgressBar {
    let bar = ProgressBar::new(u64::from(epochs) * 1000);
    if !visible {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] epoch {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar
}

#[cfg(test)]
mod tests {
    #[test]
    fn loopback_ports_are_distinct() {
        let ports: Vec<u16> = super::loopback_listeners(200).unwrap().iter().map(super::port_of).collect();
        let distinct: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len());
    }
}
