//! Many running TrainingJobs at once on the test control plane (a real kube-apiserver, etcd,
//! controller-manager and scheduler): what the operator costs per job once they run.
//!
//! The operator (the real binary) makes every job's children; the controller-manager makes their
//! pods and the scheduler binds them to `node-1`, a Node without a kubelet (its pod capacity
//! raised to hold them all), so the test plays the kubelet and marks each pod Running and Ready.
//! No parameter server runs: a stand-in on loopback answers every job's `/v1/status` (the
//! operator's `--ps-url` points there) with a version that moves every second, as a training
//! PS's does, so each progress read finds news and writes the job's status.
//!
//! Measured over a steady window once every job is Running: the operator's API requests (its own
//! `foresight_operator_api_requests_total`, by verb), its reconciles and their p99, and its
//! resident memory before the jobs and after.
//!
//! - `running_jobs_write_only_their_progress` (in `make test`): 10 jobs, progress read every
//!   20 s; the writes in the window must be the progress writes alone (at most one per job per
//!   read period, plus one), and nothing is read from the API server per reconcile.
//! - `many_jobs_benchmark` (`make scale-many`, ignored otherwise): 100 jobs (`SCALE_JOBS`) with
//!   the operator's default 60 s progress period over a 180 s window (`SCALE_WINDOW_S`); writes
//!   its table into docs/benchmarks.md when `SCALE_DOC` names the file.

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use support::operator::{Operator, job, sample};
use support::{ControlPlane, control_plane, wait_for};

const WORKERS: u32 = 4;

#[test]
fn running_jobs_write_only_their_progress() {
    let f = measure(10, 20, Duration::from_secs(60));
    eprintln!("{}", f.table());
    let periods = f.window_s / f.progress_s as f64;
    let per_job = f.writes as f64 / f.jobs as f64;
    assert!(
        per_job <= periods.ceil() + 1.0,
        "{per_job:.2} writes per job in {:.0} s, progress read every {} s: {:?}",
        f.window_s,
        f.progress_s,
        f.by_verb
    );
    assert!(per_job >= 1.0, "every job's moving progress was written at least once: {:?}", f.by_verb);
    assert_eq!(
        f.by_verb.get("get").copied().unwrap_or(0),
        0,
        "reconciles read their caches: {:?}",
        f.by_verb
    );
}

#[test]
#[ignore = "a benchmark: make scale-many"]
fn many_jobs_benchmark() {
    let env = |k: &str, d: u64| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let f = measure(env("SCALE_JOBS", 100) as usize, 60, Duration::from_secs(env("SCALE_WINDOW_S", 180)));
    let table = f.table();
    println!("{table}");
    if let Some(doc) = std::env::var_os("SCALE_DOC").filter(|d| !d.is_empty()) {
        write_between_markers(std::path::Path::new(&doc), &table);
    }
}

/// What one run measured.
struct Figures {
    jobs: usize,
    progress_s: u64,
    window_s: f64,
    /// Seconds from the apply until every job was Running.
    to_running_s: f64,
    writes: u64,
    by_verb: BTreeMap<String, u64>,
    reconciles: u64,
    reconcile_p99_s: Option<f64>,
    rss_idle_kib: u64,
    rss_running_kib: u64,
    rss_after_kib: u64,
}

impl Figures {
    fn table(&self) -> String {
        let per_min = |n: u64| n as f64 / self.jobs as f64 / (self.window_s / 60.0);
        let verbs: Vec<String> = self.by_verb.iter().map(|(v, n)| format!("{v} {n}")).collect();
        let per_job_kib = (self.rss_after_kib as f64 - self.rss_idle_kib as f64) / self.jobs as f64;
        let p99 = self.reconcile_p99_s.map_or("—".into(), |s| format!("{:.1} ms", s * 1e3));
        [
            "| measure | value |".to_string(),
            "|---|---|".into(),
            format!("| TrainingJobs × workers (pods) | {} × {WORKERS} ({}) |", self.jobs, self.jobs * (WORKERS as usize + 1)),
            format!("| apply → all Running | {:.0} s |", self.to_running_s),
            format!("| steady window (progress read every) | {:.0} s ({} s) |", self.window_s, self.progress_s),
            format!(
                "| operator API writes per job per minute | {:.2} ({} in the window: {}) |",
                per_min(self.writes),
                self.writes,
                verbs.join(", ")
            ),
            format!("| operator reconciles per job per minute (p99) | {:.2} ({p99}) |", per_min(self.reconciles)),
            format!(
                "| operator resident memory: idle / all Running / after the window | {:.1} / {:.1} / {:.1} MiB ({per_job_kib:.0} KiB per job) |",
                self.rss_idle_kib as f64 / 1024.0,
                self.rss_running_kib as f64 / 1024.0,
                self.rss_after_kib as f64 / 1024.0
            ),
        ]
        .join("\n")
    }
}

/// Runs `n` jobs of `WORKERS` workers to Running, then watches the operator for `window`.
fn measure(n: usize, progress_s: u64, window: Duration) -> Figures {
    let cp = control_plane();
    let ns = cp.namespace("many-jobs");
    let pods = n * (WORKERS as usize + 1);
    raise_pod_capacity(cp, pods + 110);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let status_port = rt.block_on(stand_in_status_server());
    let op = Operator::start(
        cp,
        &ns,
        &[
            "--leader-elect=false",
            "--progress-seconds",
            &progress_s.to_string(),
            "--ps-url",
            &format!("http://127.0.0.1:{status_port}/{{name}}"),
        ],
    );
    let rss_idle_kib = rss_kib(op.pid());

    let jobs: Vec<String> =
        (0..n).map(|i| job(&format!("job-{i}"), json!({"workers": {"replicas": WORKERS}}))).collect();
    let applied = Instant::now();
    cp.kubectl_ok(&["apply", "-n", &ns, "-f", "-"], Some(&jobs.join("\n---\n")));
    let client = rt.block_on(client(cp));
    let timeout = Duration::from_secs(120 + 2 * pods as u64);
    rt.block_on(play_kubelet(&client, &ns, pods, timeout));
    wait_for("every job Running", timeout, || (running(cp, &ns) == n).then_some(()));
    let to_running_s = applied.elapsed().as_secs_f64();
    let rss_running_kib = rss_kib(op.pid());

    // Past the first progress read of every job (made when its PS came up) and its writes.
    std::thread::sleep(Duration::from_secs(progress_s + 5));
    let before = op.metrics_text();
    let started = Instant::now();
    std::thread::sleep(window);
    let after = op.metrics_text();
    let window_s = started.elapsed().as_secs_f64();
    assert_eq!(running(cp, &ns), n, "every job still Running after the window");

    let by_verb: BTreeMap<String, u64> = ["get", "post", "patch", "put", "delete"]
        .iter()
        .map(|v| {
            let series = format!("foresight_operator_api_requests_total{{verb=\"{v}\"}}");
            let d = sample(&after, &series).unwrap_or(0.0) - sample(&before, &series).unwrap_or(0.0);
            (v.to_string(), d as u64)
        })
        .filter(|(_, d)| *d > 0)
        .collect();
    let writes = by_verb.iter().filter(|(v, _)| *v != "get").map(|(_, d)| d).sum();
    let count = "foresight_operator_reconcile_seconds_count";
    let reconciles = (sample(&after, count).unwrap_or(0.0) - sample(&before, count).unwrap_or(0.0)) as u64;
    Figures {
        jobs: n,
        progress_s,
        window_s,
        to_running_s,
        writes,
        by_verb,
        reconciles,
        reconcile_p99_s: quantile(&buckets(&after), &buckets(&before), 0.99),
        rss_idle_kib,
        rss_running_kib,
        rss_after_kib: rss_kib(op.pid()),
    }
}

/// node-1 holds 110 pods as a kubelet's default; these jobs need more.
fn raise_pod_capacity(cp: &ControlPlane, pods: usize) {
    let patch = json!({"status": {"capacity": {"pods": pods.to_string()}, "allocatable": {"pods": pods.to_string()}}});
    cp.kubectl_ok(
        &["patch", "node", "node-1", "--subresource=status", "--type=merge", "-p", &patch.to_string()],
        None,
    );
}

/// A server on loopback that answers `/<job>/v1/status` for every job as a training PS would.
async fn stand_in_status_server() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let started = Instant::now();
    let started_ms =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let status = move || async move {
        axum::Json(json!({
            "version": started.elapsed().as_secs(),
            "epoch": 0,
            "workers_expected": WORKERS,
            "process": {"incarnation": "stand-in", "started_at_ms": started_ms},
        }))
    };
    let app = axum::Router::new().route("/{job}/v1/status", axum::routing::get(status));
    tokio::spawn(async move { axum::serve(listener, app).await });
    port
}

async fn client(cp: &ControlPlane) -> kube::Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(&cp.kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await.unwrap();
    kube::Client::try_from(config).unwrap()
}

/// Plays the kubelet until `expected` pods are Running and Ready: each pod bound to node-1 gets
/// the status a kubelet would write for a started container.
async fn play_kubelet(client: &kube::Client, ns: &str, expected: usize, timeout: Duration) {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + timeout;
    loop {
        let list = api.list(&ListParams::default()).await.unwrap().items;
        let is_running = |p: &Pod| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        let running = list.iter().filter(|p| is_running(p)).count();
        if running >= expected {
            return;
        }
        assert!(Instant::now() < deadline, "{running} of {expected} pods Running after {timeout:?}");
        let bound = list
            .into_iter()
            .filter(|p| !is_running(p) && p.spec.as_ref().is_some_and(|s| s.node_name.is_some()));
        futures_util::stream::iter(bound)
            .for_each_concurrent(8, |pod| {
                let api = api.clone();
                async move {
                    let name = pod.metadata.name.clone().unwrap();
                    let container = pod.spec.as_ref().unwrap().containers[0].name.clone();
                    let _ = api
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(started(&container)))
                        .await;
                }
            })
            .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The status a kubelet writes for a pod whose one container started and is ready.
fn started(container: &str) -> Value {
    let now = "2026-01-01T00:00:00Z";
    json!({"status": {
        "phase": "Running",
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Initialized", "status": "True"},
            {"type": "ContainersReady", "status": "True"},
            {"type": "Ready", "status": "True"},
        ],
        "containerStatuses": [{"name": container, "ready": true, "restartCount": 0, "image": "test",
                               "imageID": "", "started": true, "state": {"running": {"startedAt": now}}}],
    }})
}

/// How many of the namespace's TrainingJobs say Running.
fn running(cp: &ControlPlane, ns: &str) -> usize {
    let list: Value =
        serde_json::from_str(&cp.kubectl_ok(&["get", "tj", "-n", ns, "-o", "json"], None)).unwrap();
    list["items"].as_array().unwrap().iter().filter(|j| j["status"]["phase"] == "Running").count()
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:")?.trim().strip_suffix("kB")?.trim().parse().ok())
        .expect("VmRSS in /proc/<pid>/status")
}

/// The reconcile histogram's cumulative buckets: (upper bound, count).
fn buckets(metrics: &str) -> Vec<(f64, f64)> {
    metrics
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("foresight_operator_reconcile_seconds_bucket{le=\"")?;
            let (le, count) = rest.split_once("\"} ")?;
            Some((if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? }, count.trim().parse().ok()?))
        })
        .collect()
}

/// The q-quantile of the observations between two readings of a histogram, interpolated
/// inside its bucket as Prometheus's `histogram_quantile` does.
fn quantile(after: &[(f64, f64)], before: &[(f64, f64)], q: f64) -> Option<f64> {
    let diff: Vec<(f64, f64)> = after.iter().zip(before).map(|((le, a), (_, b))| (*le, a - b)).collect();
    let total = diff.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for &(le, count) in &diff {
        if count >= rank {
            if le.is_infinite() {
                return Some(lower.0);
            }
            return Some(lower.0 + (le - lower.0) * (rank - lower.1) / (count - lower.1).max(1e-9));
        }
        lower = (le, count);
    }
    None
}

/// Replaces the table between `<!-- scale-many:begin … -->` and `<!-- scale-many:end -->`.
fn write_between_markers(doc: &std::path::Path, table: &str) {
    let text = std::fs::read_to_string(doc).unwrap();
    let begin = text.find("<!-- scale-many:begin").expect("the begin marker");
    let body = begin + text[begin..].find('\n').unwrap() + 1;
    let end = text.find("<!-- scale-many:end -->").expect("the end marker");
    std::fs::write(doc, format!("{}{table}\n{}", &text[..body], &text[end..])).unwrap();
}
