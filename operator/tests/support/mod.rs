//! A real Kubernetes control plane for the operator's integration tests: etcd, kube-apiserver,
//! kube-controller-manager (Job, Deployment, ReplicaSet, garbage-collector controllers...) and
//! kube-scheduler (v1.37, built from Go modules by `tools/build-control-plane.sh`) on free
//! loopback ports, with throw-away certificates and token auth, and the TrainingJob CRD
//! installed. No kubelet runs: one Node object, `node-1` (32 CPUs, 128 Gi, 4 `nvidia.com/gpu`),
//! lets the scheduler bind pods, and tests play the kubelet by writing pod status
//! (`ControlPlane::set_pod_phase`). Its node-lifecycle controller is off, so the silent node is
//! never tainted or evicted. One control plane per test binary (`control_plane()`), one namespace per test
//! (`ControlPlane::namespace`).
//!
//! Teardown. The processes run under `tools/control-plane.sh` (a bash supervisor, also used by
//! `tools/smoke-control-plane.sh`) whose stdin is a pipe held by this process. The supervisor
//! waits for EOF on it, then stops the servers (TERM, then KILL after 5 s) and removes the
//! temporary directory. The kernel closes the pipe however this process
//! ends — tests passing, a test panicking (the test binary exits with 101), a panic during
//! setup, an abort, even SIGKILL — so nothing outlives the test binary. On an ordinary exit an
//! `atexit` handler also closes the pipe itself and waits for the supervisor, so the control
//! plane is gone before `cargo test` moves on; after a crash the supervisor finishes on its own
//! a few seconds later. The supervisor and the servers stay in the test's process group, so a
//! Ctrl-C reaches them too. `KEEP_CONTROL_PLANE_TMP=1` keeps the directory (logs) afterwards.
#![allow(dead_code)] // each test binary uses its own part of the harness

pub mod kueue;
pub mod operator;
pub mod proxy;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The running control plane of this test binary.
pub struct ControlPlane {
    /// Directory of etcd, kube-apiserver and kubectl.
    pub bin: PathBuf,
    /// Temporary directory: certificates, kubeconfig, logs, etcd data.
    pub dir: PathBuf,
    /// Admin kubeconfig (token of a `system:masters` user).
    pub kubeconfig: PathBuf,
    /// `https://127.0.0.1:<port>`.
    pub server: String,
    /// How long starting took, for the test log: control plane ready, CRD established.
    pub ready_after: Duration,
    pub crd_established_after: Duration,
}

/// The supervisor process and the write end of its stdin; taken by the `atexit` handler.
static SUPERVISOR_HANDLE: Mutex<Option<(Child, ChildStdin)>> = Mutex::new(None);
static CONTROL_PLANE: OnceLock<ControlPlane> = OnceLock::new();

/// The control plane of this test binary, started on first use (panics when it cannot start;
/// the message includes the logs).
pub fn control_plane() -> &'static ControlPlane {
    CONTROL_PLANE.get_or_init(|| ControlPlane::start().unwrap_or_else(|e| panic!("control plane: {e}")))
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("operator/ has a parent").to_path_buf()
}

impl ControlPlane {
    fn start() -> Result<Self, String> {
        let t0 = Instant::now();
        let bin = control_plane_bin()?;
        for b in ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"] {
            if !bin.join(b).is_file() {
                return Err(format!("{} missing", bin.join(b).display()));
            }
        }
        let dir = tempfile::Builder::new()
            .prefix("foresight-cp.")
            .tempdir()
            .map_err(|e| format!("temp dir: {e}"))?
            .keep();
        let script = repo_root().join("tools/control-plane.sh");
        let ports = free_ports(5);
        let mut child = Command::new("bash")
            .arg(&script)
            .env("BIN", &bin)
            .env("WORK", &dir)
            .env("ETCD_PORT", ports[0].to_string())
            .env("ETCD_PEER_PORT", ports[1].to_string())
            .env("API_PORT", ports[2].to_string())
            .env("KCM_PORT", ports[3].to_string())
            .env("SCHED_PORT", ports[4].to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("bash {}: {e}", script.display()))?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        *SUPERVISOR_HANDLE.lock().unwrap() = Some((child, stdin));
        register_atexit();

        // The supervisor prints one line: READY, or FAILED with the reason (logs on stderr).
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).map_err(|e| format!("supervisor stdout: {e}"))?;
        if line.trim() != "READY" {
            return Err(format!("the supervisor said {:?}; its log is above", line.trim()));
        }
        let ready_after = t0.elapsed();
        let cp = Self {
            kubeconfig: dir.join("admin.kubeconfig"),
            server: format!("https://127.0.0.1:{}", ports[2]),
            bin,
            dir,
            ready_after,
            crd_established_after: Duration::ZERO,
        };
        let crd = repo_root().join("crds/trainingjob.yaml");
        cp.kubectl_ok(&["apply", "-f", crd.to_str().unwrap()], None);
        // Served once discovery (`kubectl get tj`) and the published OpenAPI document (`kubectl
        // explain`) have it. (Not `kubectl wait --for condition=Established`: it fails at once
        // when the new CRD has no conditions yet, which a slow machine shows.)
        let deadline = Instant::now() + Duration::from_secs(60);
        while !(cp.kubectl(&["get", "tj", "-A"], None).status.success()
            && cp.kubectl(&["explain", "trainingjob.spec"], None).status.success())
        {
            if Instant::now() > deadline {
                return Err("the TrainingJob resource never appeared in discovery and OpenAPI".into());
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        let cp = Self { crd_established_after: t0.elapsed(), ..cp };
        eprintln!(
            "control plane at {} ({}): ready after {:.1?}, CRD established after {:.1?}",
            cp.server,
            cp.dir.display(),
            cp.ready_after,
            cp.crd_established_after
        );
        Ok(cp)
    }

    /// A `kubectl` command against this control plane.
    pub fn kubectl_cmd(&self) -> Command {
        let mut c = Command::new(self.bin.join("kubectl"));
        c.env("KUBECONFIG", &self.kubeconfig).env_remove("KUBERNETES_SERVICE_HOST");
        c
    }

    /// Runs kubectl with `args`, `stdin` piped in; returns its output whatever the status.
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut c = self.kubectl_cmd();
        c.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
        c.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
        let mut child = c.spawn().expect("kubectl starts");
        if let Some(text) = stdin {
            child.stdin.take().unwrap().write_all(text.as_bytes()).expect("kubectl stdin");
        }
        child.wait_with_output().expect("kubectl runs")
    }

    /// Runs kubectl and returns its stdout; panics with its stderr when it fails.
    pub fn kubectl_ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.kubectl(args, stdin);
        assert!(
            out.status.success(),
            "kubectl {} failed ({}):\n{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("kubectl prints UTF-8")
    }

    /// A new namespace for one test, named after it (`tj-<test>-<n>`).
    pub fn namespace(&self, test: &str) -> String {
        static N: AtomicUsize = AtomicUsize::new(0);
        let slug: String = test
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' })
            .take(40)
            .collect();
        let ns = format!("t-{}-{}", slug.trim_matches('-'), N.fetch_add(1, Ordering::Relaxed));
        self.kubectl_ok(&["create", "namespace", &ns], None);
        ns
    }
}

/// Runs `tools/build-control-plane.sh` (instant when built, ~20 min cold) unless
/// `CONTROL_PLANE_BIN` names the directory; the script prints the directory last.
fn control_plane_bin() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("CONTROL_PLANE_BIN") {
        return Ok(dir.into());
    }
    built("build-control-plane.sh")
}

/// Runs `tools/<script>` (a build script that is instant once its cache is warm) and returns the
/// directory it prints last.
pub fn built(script: &str) -> Result<PathBuf, String> {
    let script = repo_root().join("tools").join(script);
    let out = Command::new(&script)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("{}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!("{} failed ({})", script.display(), out.status));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().ok_or_else(|| format!("{} printed nothing", script.display()))?;
    Ok(PathBuf::from(last.trim()))
}

/// `n` distinct loopback ports that were free a moment ago.
pub fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<_> =
        (0..n).map(|_| TcpListener::bind("127.0.0.1:0").expect("bind a loopback port")).collect();
    listeners.iter().map(|l| l.local_addr().unwrap().port()).collect()
}

fn register_atexit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    unsafe extern "C" {
        fn atexit(callback: extern "C" fn()) -> std::os::raw::c_int;
    }
    extern "C" fn stop() {
        // Never panic or block forever here: this runs during process exit.
        let Ok(mut guard) = SUPERVISOR_HANDLE.try_lock() else { return };
        if let Some((mut child, stdin)) = guard.take() {
            drop(stdin); // EOF: the supervisor stops the servers and removes the directory
            let deadline = Instant::now() + Duration::from_secs(15);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
        }
    }
    // SAFETY: `atexit` is the C library's; `stop` is a plain `extern "C" fn` without arguments
    // that does not unwind.
    ONCE.call_once(|| unsafe {
        atexit(stop);
    });
}

impl ControlPlane {
    /// `kubectl get <what> -o json` in `ns`; `None` when it does not exist.
    pub fn get_json(&self, ns: &str, what: &str) -> Option<serde_json::Value> {
        let out = self.kubectl(&["get", "-n", ns, what, "-o", "json"], None);
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("NotFound"), "kubectl get {what}: {err}");
            return None;
        }
        Some(serde_json::from_slice(&out.stdout).expect("kubectl prints JSON"))
    }

    /// The names of the `kind` objects in `ns` matching the label `selector`.
    pub fn names(&self, ns: &str, kind: &str, selector: &str) -> Vec<String> {
        let out = self.kubectl_ok(&["get", "-n", ns, kind, "-l", selector, "-o", "name"], None);
        out.lines().map(|l| l.rsplit('/').next().unwrap().to_string()).collect()
    }

    /// Plays the kubelet: moves a pod to `phase` (Running: with its Ready condition true;
    /// Succeeded/Failed: the container terminated with exit code 0/1).
    pub fn set_pod_phase(&self, ns: &str, pod: &str, phase: &str) {
        self.set_pod_status(ns, pod, phase, if phase == "Succeeded" { 0 } else { 1 }, None, None);
    }

    /// Plays the kubelet for a worker that ended well and left `message` in its termination
    /// message file.
    pub fn succeed_pod_with_message(&self, ns: &str, pod: &str, message: &str) {
        self.set_pod_status(ns, pod, "Succeeded", 0, None, Some(message));
    }

    /// Plays the kubelet for the job's last worker, which the PS told where it wrote the final
    /// model (`version`, kept in memory only) as the worker left.
    pub fn succeed_last_worker(&self, ns: &str, pod: &str, version: u64) {
        let record = serde_json::json!({"finalModel": {"version": version, "path": null}});
        self.succeed_pod_with_message(ns, pod, &record.to_string());
    }

    /// Plays the kubelet (and, with `disruption`, the component that evicted or preempted the
    /// pod): the pod fails, its container with `exit_code`, and with a `DisruptionTarget`
    /// condition whose reason is `disruption`.
    pub fn fail_pod(&self, ns: &str, pod: &str, exit_code: i32, disruption: Option<&str>) {
        self.set_pod_status(ns, pod, "Failed", exit_code, disruption, None);
    }

    fn set_pod_status(
        &self,
        ns: &str,
        pod: &str,
        phase: &str,
        exit_code: i32,
        disruption: Option<&str>,
        message: Option<&str>,
    ) {
        let now = "2026-01-01T00:00:00Z";
        let ready = if phase == "Running" { "True" } else { "False" };
        let state = match phase {
            "Running" => serde_json::json!({"running": {"startedAt": now}}),
            _ => {
                let reason = if exit_code == 0 { "Completed" } else { "Error" };
                serde_json::json!({"terminated": {"exitCode": exit_code, "reason": reason, "startedAt": now,
                                                  "finishedAt": now, "message": message}})
            }
        };
        let container = self
            .get_json(ns, &format!("pod/{pod}"))
            .and_then(|p| p["spec"]["containers"][0]["name"].as_str().map(String::from))
            .unwrap_or_else(|| panic!("pod {ns}/{pod} not found"));
        let mut conditions = serde_json::json!([
            {"type": "PodScheduled", "status": "True"},
            {"type": "Initialized", "status": "True"},
            {"type": "ContainersReady", "status": ready},
            {"type": "Ready", "status": ready},
        ]);
        if let Some(reason) = disruption {
            conditions.as_array_mut().unwrap().push(serde_json::json!(
                {"type": "DisruptionTarget", "status": "True", "reason": reason, "lastTransitionTime": now}
            ));
        }
        let patch = serde_json::json!({"status": {
            "phase": phase,
            "conditions": conditions,
            "containerStatuses": [{"name": container, "ready": ready == "True", "restartCount": 0,
                                   "image": "test", "imageID": "", "state": state}],
        }});
        self.kubectl_ok(
            &[
                "patch",
                "-n",
                ns,
                "pod",
                pod,
                "--subresource=status",
                "--type=strategic",
                "-p",
                &patch.to_string(),
            ],
            None,
        );
    }
}

/// Polls `f` every 100 ms until it returns `Some`, panicking with `what` after `timeout` (a
/// generous bound, never a measure of speed); says how long the wait took.
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(v) = f() {
            eprintln!("waited {:.1?} for {what}", started.elapsed());
            return v;
        }
        assert!(started.elapsed() < timeout, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A child process killed (SIGKILL) when dropped, so a failing test leaves nothing running.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Decodes base64 (a Secret's `data` as kubectl prints it) to text, with k8s-openapi's
/// `ByteString`, the type the API's own bytes fields use.
pub fn base64_decode(s: &str) -> String {
    let bytes: k8s_openapi::ByteString =
        serde_json::from_value(serde_json::Value::String(s.to_string())).expect("valid base64");
    String::from_utf8(bytes.0).expect("UTF-8")
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    free_ports(1)[0]
}
