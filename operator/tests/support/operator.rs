//! Running `foresight operator` (the real binary) in tests, and reading what it does: the
//! job's status, its pods, its events, the operator's metrics.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use super::{ControlPlane, KillOnDrop, base64_decode, free_port, wait_for};

pub const KEY: &str = "0123456789abcdef0123456789abcdef-test-key";
pub const LONG: Duration = Duration::from_secs(60);

pub struct Operator {
    _proc: KillOnDrop,
    pub metrics: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Operator {
    /// Starts `foresight operator` for namespace `ns` (its Lease there too), as the admin.
    pub fn start(cp: &ControlPlane, ns: &str, extra: &[&str]) -> Self {
        Self::start_with(&cp.kubeconfig, Some(ns), ns, extra)
    }

    /// Starts `foresight operator` with `kubeconfig`'s credentials, watching `watch` (`None`:
    /// every namespace), its Lease (if it elects) in `lease_namespace`.
    pub fn start_with(kubeconfig: &Path, watch: Option<&str>, lease_namespace: &str, extra: &[&str]) -> Self {
        let op = Self::spawn(kubeconfig, watch, lease_namespace, extra);
        wait_for("the operator's /healthz", LONG, || {
            http_get(op.metrics, "/healthz").filter(|(c, _)| *c == 200)
        });
        op
    }

    /// As `start_with`, without waiting for it to serve: for an operator that may stop at once.
    pub fn spawn(kubeconfig: &Path, watch: Option<&str>, lease_namespace: &str, extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("operator.log");
        let metrics = free_port();
        let child = Command::new(foresight_bin())
            .args(["operator", "--kubeconfig", kubeconfig.to_str().unwrap()])
            .args(watch.map(|ns| ["--namespace", ns]).into_iter().flatten())
            .args(["--metrics-addr", &format!("127.0.0.1:{metrics}")])
            // Progress read every second, unless the test sets its own period.
            .args(
                (!extra.contains(&"--progress-seconds"))
                    .then_some(["--progress-seconds", "1"])
                    .into_iter()
                    .flatten(),
            )
            .args(["--log-level", "info", "--log-format", "json"])
            .args(["--lease-namespace", lease_namespace])
            .args(extra)
            // Unless the test keeps the key in a Secret (the flags conflict).
            .envs(
                (!extra.iter().any(|a| a.starts_with("--token-key-secret")))
                    .then_some(("FORESIGHT_TOKEN_KEY", KEY)),
            )
            .env_remove("KUBECONFIG")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("foresight operator starts");
        Self { _proc: KillOnDrop(child), metrics, log, _dir: dir }
    }

    pub fn metrics_text(&self) -> String {
        http_get(self.metrics, "/metrics").expect("operator /metrics").1
    }

    pub fn pid(&self) -> u32 {
        self._proc.0.id()
    }

    /// The exit status once the process has ended.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self._proc.0.try_wait().ok().flatten()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            eprintln!("---- operator log (last lines) ----");
            for l in tail.iter().rev() {
                eprintln!("{l}");
            }
        }
    }
}

/// A plain HTTP/1.1 GET on loopback: (status, body).
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()))
}

/// The value of a sample line `name{labels} value` (labels as written, `""` for none).
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

pub fn job(name: &str, spec: Value) -> String {
    let mut base = json!({
        "model": {"name": "mlp"},
        "dataset": {"format": "csv", "path": "/data/mnist5k"},
        "workers": {"replicas": 2},
    });
    for (k, v) in spec.as_object().unwrap() {
        base[k] = v.clone();
    }
    json!({"apiVersion": "foresight.dev/v1alpha1", "kind": "TrainingJob",
           "metadata": {"name": name}, "spec": base})
    .to_string()
}

/// `kubectl patch tj <name> --type=merge -p <patch>`.
/// `secret/<name>-token-<suffix>`: the job's token Secret, once the operator has recorded the
/// suffix (derived from its key: nobody can make a Secret of that name before it).
pub fn token_secret(cp: &ControlPlane, ns: &str, name: &str) -> String {
    format!("secret/{name}-token-{}", secret_suffix(cp, ns, name))
}

/// The end of the job's Secrets' names, once the operator has recorded it.
pub fn secret_suffix(cp: &ControlPlane, ns: &str, name: &str) -> String {
    wait_for("the job's recorded Secret suffix", LONG, || {
        let job = cp.get_json(ns, &format!("tj/{name}"))?;
        job["status"]["defaultImages"]["secretSuffix"].as_str().map(String::from)
    })
}

pub fn patch_job(cp: &ControlPlane, ns: &str, name: &str, patch: &str) {
    cp.kubectl_ok(&["patch", "-n", ns, "tj", name, "--type=merge", "-p", patch], None);
}

/// Plays the kubelet of the job's stopped worker pods: their containers stop and the pods go.
pub fn remove_worker_pods(cp: &ControlPlane, ns: &str, name: &str) {
    let selector = format!("foresight.dev/job={name},app.kubernetes.io/component=worker");
    cp.kubectl_ok(&["delete", "pods", "-n", ns, "-l", &selector, "--grace-period=0", "--force"], None);
}

pub fn status(cp: &ControlPlane, ns: &str, name: &str) -> Value {
    cp.get_json(ns, &format!("tj/{name}")).map(|j| j["status"].clone()).unwrap_or(Value::Null)
}

pub fn wait_phase(cp: &ControlPlane, ns: &str, name: &str, phase: &str) -> Value {
    let mut last = Value::Null;
    let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(&format!("{name} to reach {phase}"), LONG, || {
            last = status(cp, ns, name);
            (last["phase"] == phase).then(|| last.clone())
        })
    }));
    found.unwrap_or_else(|_| panic!("{name} never reached {phase}; its status: {last:#}"))
}

pub fn condition<'a>(status: &'a Value, type_: &str) -> &'a Value {
    status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .unwrap_or(&Value::Null)
}

/// The job's worker pods, once the Job controller has created `n` of them (not terminated).
pub fn worker_pods(cp: &ControlPlane, ns: &str, name: &str, n: usize) -> Vec<String> {
    wait_for(&format!("{n} live worker pods of {name}"), LONG, || {
        let list = cp.get_json(ns, "pods").unwrap();
        let live: Vec<String> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| {
                let labels = &p["metadata"]["labels"];
                labels["foresight.dev/job"] == name
                    && labels["app.kubernetes.io/component"] == "worker"
                    && !matches!(p["status"]["phase"].as_str(), Some("Succeeded" | "Failed"))
                    && p["metadata"]["deletionTimestamp"].is_null()
            })
            .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
            .collect();
        (live.len() == n).then_some(live)
    })
}

pub fn ps_pod(cp: &ControlPlane, ns: &str, name: &str) -> String {
    wait_for("the parameter server's pod", LONG, || {
        cp.names(
            ns,
            "pods",
            &format!("foresight.dev/job={name},app.kubernetes.io/component=parameter-server"),
        )
        .into_iter()
        .next()
    })
}

/// A real parameter server on loopback, holding the job's tokens from its Secret, as its pod
/// would (`token` is the workers').
pub struct Ps {
    proc_: KillOnDrop,
    pub port: u16,
    pub token: String,
    control: String,
    args: Vec<String>,
    _dir: tempfile::TempDir,
}

impl Ps {
    pub fn start(cp: &ControlPlane, ns: &str, name: &str, port: u16, workers: u32) -> Self {
        Self::start_with(cp, ns, name, port, workers, &[])
    }

    /// With `extra` arguments (e.g. `--peers` for shard 0 of a sharded PS).
    pub fn start_with(
        cp: &ControlPlane,
        ns: &str,
        name: &str,
        port: u16,
        workers: u32,
        extra: &[&str],
    ) -> Self {
        let secret = token_secret(cp, ns, name);
        let secret = wait_for("the token Secret", LONG, || cp.get_json(ns, &secret));
        let token = base64_decode(secret["data"]["token"].as_str().expect("the Secret holds a token"));
        let control = base64_decode(
            secret["data"]["control-token"].as_str().expect("the Secret holds a control token"),
        );
        assert_ne!(token, control);
        let dir = tempfile::tempdir().unwrap();
        let args = [
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--workers",
            &workers.to_string(),
            "--algorithm",
            "dc-asgd-a",
            "--job-name",
            name,
            "--namespace",
            ns,
            "--checkpoint-dir",
            &dir.path().display().to_string(),
        ]
        .map(String::from)
        .to_vec();
        let args = [args, extra.iter().map(|a| a.to_string()).collect()].concat();
        let proc_ = Self::spawn(&args, &token, &control, port);
        Self { proc_, port, token, control, args, _dir: dir }
    }

    fn spawn(args: &[String], token: &str, control: &str, port: u16) -> KillOnDrop {
        let child = Command::new(foresight_bin().with_file_name("foresight-ps"))
            .args(args)
            .env("FORESIGHT_TOKEN", token)
            .env("FORESIGHT_CONTROL_TOKEN", control)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("foresight-ps starts");
        wait_for("the parameter server", LONG, || http_get(port, "/healthz").filter(|(c, _)| *c == 200));
        KillOnDrop(child)
    }

    /// Stops the process with `signal` (SIGTERM: it writes a checkpoint first) and starts a
    /// new one on the same port and checkpoint directory, as a restarted container would be.
    pub fn restart(&mut self, signal: &str) {
        let pid = self.proc_.0.id().to_string();
        assert!(Command::new("kill").args(["-s", signal, &pid]).status().unwrap().success());
        let exit = self.proc_.0.wait().unwrap();
        eprintln!("the parameter server exited on SIG{signal}: {exit}");
        self.proc_ = Self::spawn(&self.args, &self.token, &self.control, self.port);
    }

    /// Registers a 4-float model and applies one gradient from worker 0: step 1.
    pub fn train_one_step(&self) {
        use foresight_ps::client::{GradDtype, PsClient, PushId};
        use foresight_ps::wire::{Layout, TensorSpec};
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let c =
                PsClient::new(&format!("http://127.0.0.1:{}", self.port), Some(self.token.clone())).unwrap();
            let layout = Layout::new(vec![TensorSpec { name: "w".into(), shape: vec![4] }]).unwrap();
            c.register(&layout, &[0.0; 4]).await.unwrap();
            // A worker joins first: its calls carry the credential the join answers.
            let generation = Some(c.join(0, None).await.unwrap().generation);
            let m = c.pull(0, None, Duration::ZERO).await.unwrap().unwrap();
            let id = PushId { worker: 0, generation, version: m.version, incarnation: None, seq: 1 };
            c.push(id, Some(0.5), &layout, &[1.0; 4], GradDtype::F32).await.unwrap();
        });
    }

    /// Worker 0 pulls and pushes for `duration`, as fast as it can; returns the pushes made.
    pub fn push_for(&self, duration: Duration) -> u64 {
        use foresight_ps::client::{GradDtype, PsClient, PushId};
        use foresight_ps::wire::{Layout, TensorSpec};
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let c =
                PsClient::new(&format!("http://127.0.0.1:{}", self.port), Some(self.token.clone())).unwrap();
            let layout = Layout::new(vec![TensorSpec { name: "w".into(), shape: vec![4] }]).unwrap();
            let generation = Some(c.join(0, None).await.unwrap().generation);
            let end = std::time::Instant::now() + duration;
            let mut seq = 100;
            while std::time::Instant::now() < end {
                let m = c.pull(0, None, Duration::ZERO).await.unwrap().unwrap();
                seq += 1;
                let id = PushId { worker: 0, generation, version: m.version, incarnation: None, seq };
                c.push(id, Some(0.5), &layout, &[0.01; 4], GradDtype::F32).await.unwrap();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            seq - 100
        })
    }

    pub fn status(&self) -> Value {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let c = foresight_ps::client::PsClient::new(
                &format!("http://127.0.0.1:{}", self.port),
                Some(self.token.clone()),
            )
            .unwrap();
            c.status().await.unwrap()
        })
    }
}

pub fn events(cp: &ControlPlane, ns: &str, name: &str) -> Vec<(String, String, String)> {
    let list = cp.kubectl_ok(
        &[
            "get",
            "events.events.k8s.io",
            "-n",
            ns,
            "--field-selector",
            &format!("regarding.name={name}"),
            "-o",
            "json",
        ],
        None,
    );
    let list: Value = serde_json::from_str(&list).unwrap();
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap_or("").to_string();
            (s("type"), s("reason"), s("note"))
        })
        .collect()
}

/// The `foresight` binary cargo built for this test (integration tests of this package).
pub fn foresight_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_foresight"))
}
