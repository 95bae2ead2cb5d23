//! The Grafana dashboard (`charts/foresight/dashboards/foresight.json`) against real Prometheus
//! (Debian's `prometheus` and `promtool`, installed by `make setup`):
//!
//! - a short `foresight run` (2 workers) is scraped through its `prometheus-targets.json`, every
//!   PromQL expression of the dashboard is evaluated over the run with `query_range`, and each
//!   must parse and return data; the operator (`foresight operator` against the test control
//!   plane, taking a TrainingJob to Succeeded meanwhile) is scraped as well;
//! - `promtool check metrics` is clean on the live `/metrics` of the PS, a worker and the operator;
//! - every metric name in the dashboard is one the code exports, and every PS and worker metric
//!   is on the dashboard;
//! - the JSON passes the grafana-foundation-sdk's Dashboard model (`scripts/check-dashboard.py`).

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use support::control_plane;
use support::operator::{Operator, job, ps_pod, wait_phase, worker_pods};

mod support;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn dashboard() -> Value {
    let path = repo().join("charts/foresight/dashboards/foresight.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

#[test]
fn every_dashboard_query_returns_data_from_a_real_run_and_promtool_is_clean() {
    let tmp = tempfile::tempdir().unwrap();
    // The operator, against the test control plane, takes a TrainingJob from creation to
    // Succeeded while Prometheus scrapes it, so that its panels have data too.
    let cp = control_plane();
    let ns = cp.namespace("dashboard");
    let operator = Operator::start(cp, &ns, &["--leader-elect=false", "--finalize-grace-seconds", "0"]);
    let driver = std::thread::spawn({
        let ns = ns.clone();
        move || {
            let cp = control_plane();
            // Past the first scrapes: the job's duration must increase inside the window.
            std::thread::sleep(Duration::from_secs(3));
            cp.kubectl_ok(
                &["apply", "-n", &ns, "-f", "-"],
                Some(&job("observed", serde_json::json!({"workers": {"replicas": 1}}))),
            );
            cp.set_pod_phase(&ns, &ps_pod(cp, &ns, "observed"), "Running");
            let pod = worker_pods(cp, &ns, "observed", 1).remove(0);
            cp.set_pod_phase(&ns, &pod, "Running");
            wait_phase(cp, &ns, "observed", "Running");
            std::thread::sleep(Duration::from_secs(2));
            cp.set_pod_phase(&ns, &pod, "Succeeded");
            wait_phase(cp, &ns, "observed", "Succeeded");
        }
    });
    let run = run_scraped(tmp.path(), &[format!("127.0.0.1:{}", operator.metrics)]);
    driver.join().expect("the TrainingJob went from Created to Succeeded");
    let operator_metrics = operator.metrics_text();
    let failures = check_queries(&run, |_| true);
    assert!(failures.is_empty(), "{} dashboard queries failed:\n{}", failures.len(), failures.join("\n"));

    for (what, text) in [
        ("parameter server", &run.ps_metrics),
        ("worker 0", &run.worker_metrics),
        ("operator", &operator_metrics),
    ] {
        let problems = promtool_check_metrics(text);
        assert!(problems.is_empty(), "promtool check metrics on the {what}'s /metrics:\n{problems}");
    }

    // Every metric the dashboard names is exported; every Foresight metric is on it.
    let mut exported = series_names(&run.ps_metrics);
    exported.extend(series_names(&run.worker_metrics));
    exported.extend(series_names(&operator_metrics));
    let used: BTreeSet<String> =
        expressions(&dashboard()).iter().flat_map(|(_, e)| metric_names(e)).collect();
    let unknown: Vec<_> = used.iter().filter(|m| !exported.contains(*m)).collect();
    assert!(unknown.is_empty(), "the dashboard uses metrics nothing exports: {unknown:?}");
    let base = |m: &str| {
        ["_bucket", "_sum", "_count"]
            .iter()
            .fold(m.to_string(), |m, s| m.strip_suffix(s).unwrap_or(&m).to_string())
    };
    let used_base: BTreeSet<String> = used.iter().map(|m| base(m)).collect();
    // The process collector's series (open fds, start time, ...) are not dashboard material;
    // memory and CPU are on a panel, which the unknown-metric check above holds to.
    let missing: Vec<_> = exported
        .iter()
        .map(|m| base(m))
        .filter(|m| !used_base.contains(m) && !m.starts_with("process_"))
        .collect();
    assert!(missing.is_empty(), "exported but on no dashboard panel: {missing:?}");
}

#[test]
fn the_dashboard_passes_the_grafana_schema_check() {
    let python = repo().join(".venv/bin/python");
    assert!(python.exists(), "{} is missing: run `make setup`", python.display());
    let o = Command::new(&python)
        .arg(repo().join("scripts/check-dashboard.py"))
        .arg(repo().join("charts/foresight/dashboards/foresight.json"))
        .output()
        .unwrap();
    let out = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "scripts/check-dashboard.py:\n{out}");

    let d = dashboard();
    assert_eq!(d["uid"], "foresight");
    assert!(d["schemaVersion"].as_u64().unwrap() >= 39);
    let vars = d["templating"]["list"].as_array().unwrap();
    let var = |name: &str| vars.iter().find(|v| v["name"] == name).unwrap_or_else(|| panic!("no ${name}"));
    assert_eq!(var("datasource")["type"], "datasource");
    assert_eq!(var("datasource")["query"], "prometheus");
    for name in ["namespace", "job"] {
        let q = var(name)["query"]["query"].as_str().unwrap();
        assert!(q.starts_with("label_values(foresight_ps_model_version"), "${name}: {q}");
    }
    // Every panel and query reads the chosen data source.
    for p in d["panels"].as_array().unwrap().iter().filter(|p| p["type"] != "row") {
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        for t in p["targets"].as_array().unwrap() {
            assert_eq!(t["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        }
    }
}

#[test]
fn metric_names_are_read_from_promql() {
    let e = r#"histogram_quantile(0.99, sum by (worker, le) (rate(a_bucket{job=~"$job", le="0"}[$__rate_interval]))) / on (x) group_left (y) (b_total offset 5m) + (sum(c) or vector(1e-9))"#;
    assert_eq!(metric_names(e), ["a_bucket", "b_total", "c"].map(String::from).into());
}

/// What a scraped run leaves: when it ran, its labels, and the /metrics texts taken during it.
struct ScrapedRun {
    prometheus: Prometheus,
    start: f64,
    end: f64,
    namespace: String,
    job: String,
    ps_metrics: String,
    worker_metrics: String,
}

/// Runs a short `foresight run` (2 workers, 3 epochs of MNIST-5k) while Prometheus scrapes its
/// PS and workers through `prometheus-targets.json`, and `extra_targets` (host:port) as well.
fn run_scraped(dir: &Path, extra_targets: &[String]) -> ScrapedRun {
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let sd = out.join("prometheus-targets.json");
    let prometheus = Prometheus::start(dir, &sd, extra_targets);
    let job = "dash";
    let yaml = dir.join("job.yaml");
    std::fs::write(
        &yaml,
        format!(
            "apiVersion: foresight.dev/v1alpha1\nkind: TrainingJob\nmetadata: {{name: {job}}}\nspec:\n  \
             model: {{name: mlp}}\n  dataset: {{format: csv, path: data/mnist5k}}\n  \
             training: {{epochs: 6, batchSize: 32, learningRate: 0.1}}\n  \
             optimizer: {{algorithm: dc-asgd-a, lambda0: 2}}\n  workers: {{replicas: 2}}\n"
        ),
    )
    .unwrap();
    let start = now() - 1.0;
    let mut run = Foresight::spawn(&yaml, &out);

    let deadline = Instant::now() + Duration::from_secs(120);
    let targets: Vec<String> = loop {
        if let Ok(s) = std::fs::read_to_string(&sd)
            && let Ok(v) = serde_json::from_str::<Value>(&s)
        {
            break v[0]["targets"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_str().unwrap().to_string())
                .collect();
        }
        run.assert_running();
        assert!(Instant::now() < deadline, "no {} after 120 s", sd.display());
        std::thread::sleep(Duration::from_millis(100));
    };
    let (ps, worker) = (&targets[0], &targets[1]);
    // Wait until both have something to show, then refuse one push (no token) so that
    // foresight_ps_gradients_rejected_total{reason} exists, and take both /metrics texts.
    let has = |addr: &str, series: &str| {
        http(addr, "GET", "/metrics", "").ok().is_some_and(|(_, body)| {
            body.lines().any(|l| l.starts_with(series) && l.split(' ').next_back() != Some("0"))
        })
    };
    while !(has(ps, "foresight_ps_updates_total") && has(worker, "foresight_worker_step_seconds_count")) {
        run.assert_running();
        assert!(Instant::now() < deadline, "the run made no update within 120 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (status, body) = http(ps, "POST", "/v1/gradients?worker=0&version=0&seq=1", "").unwrap();
    assert_eq!(status, 401, "{body}");
    let ps_metrics = http(ps, "GET", "/metrics", "").unwrap().1;
    let worker_metrics = http(worker, "GET", "/metrics", "").unwrap().1;
    let status = run.wait(Duration::from_secs(300));
    assert!(status.success(), "foresight run failed: see {}/logs", out.display());
    // Let the last scrape of every target land.
    std::thread::sleep(Duration::from_millis(1500));
    let namespace = ps_metrics
        .split("namespace=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .expect("the PS's series carry a namespace label")
        .to_string();
    let end = now();
    // Prometheus hands new file_sd targets to its scrapers every 5 s: make sure the run was long
    // enough to be scraped a few times over, or say so.
    let q = format!(
        "/api/v1/query?query={}&time={end:.3}",
        urlencode("count_over_time(foresight_ps_model_version[1h])")
    );
    let scrapes =
        prometheus.api(&q).unwrap()["result"][0]["value"][1].as_str().unwrap_or("0").parse::<f64>().unwrap();
    eprintln!("the PS was scraped {scrapes} times during the {:.0} s run", end - start);
    assert!(scrapes >= 4.0, "Prometheus scraped the PS only {scrapes} times during the run");
    ScrapedRun { prometheus, start, end, namespace, job: job.into(), ps_metrics, worker_metrics }
}

/// Evaluates every expression of the dashboard (panels and template variables) over the run;
/// returns one line per failure. Every expression must be accepted; those for which `must_have_data`
/// holds must also return a series with at least one finite value.
fn check_queries(run: &ScrapedRun, must_have_data: impl Fn(&str) -> bool) -> Vec<String> {
    let d = dashboard();
    let range_s = (run.end - run.start).ceil() as u64 + 1;
    let vars = [
        ("namespace", run.namespace.clone()),
        ("job", run.job.clone()),
        // Grafana's $__rate_interval: max($__interval + scrape interval, 4 × scrape interval).
        ("__rate_interval", "4s".into()),
        ("__interval", "1s".into()),
        ("__range", format!("{range_s}s")),
    ];
    let subst = |e: &str| {
        let mut e = e.to_string();
        for (k, v) in &vars {
            e = e.replace(&format!("${{{k}}}"), v).replace(&format!("${k}"), v);
        }
        e
    };
    let mut failures = vec![];
    let exprs = expressions(&d);
    assert!(exprs.len() > 20, "only {} expressions in the dashboard", exprs.len());
    for (title, raw) in &exprs {
        let e = subst(raw);
        if e.contains('$') {
            failures.push(format!("{title}: unsubstituted variable in {e}"));
            continue;
        }
        let q = format!(
            "/api/v1/query_range?query={}&start={:.3}&end={:.3}&step=1",
            urlencode(&e),
            run.start,
            run.end
        );
        match run.prometheus.api(&q) {
            Err(err) => failures.push(format!("{title}: {e}\n    {err}")),
            Ok(data) if must_have_data(raw) && !has_finite_value(&data) => {
                failures.push(format!("{title}: no data: {e}\n    {data}"))
            }
            Ok(_) => {}
        }
    }
    // Template variables: label_values(selector, label), as Grafana asks Prometheus for them.
    for v in d["templating"]["list"].as_array().unwrap().iter().filter(|v| v["type"] == "query") {
        let q = v["query"]["query"].as_str().unwrap();
        let inner = q.strip_prefix("label_values(").and_then(|s| s.strip_suffix(')')).unwrap();
        let (selector, label) = inner.rsplit_once(',').unwrap();
        let path = format!(
            "/api/v1/label/{}/values?match[]={}&start={:.3}&end={:.3}",
            label.trim(),
            urlencode(&subst(selector.trim())),
            run.start,
            run.end
        );
        let want = if label.trim() == "job" { &run.job } else { &run.namespace };
        match run.prometheus.api(&path) {
            Ok(values) if values.as_array().is_some_and(|a| a.iter().any(|x| x == want.as_str())) => {}
            Ok(values) => {
                failures.push(format!("${}: {q} gave {values}, not {want}", v["name"].as_str().unwrap()))
            }
            Err(err) => failures.push(format!("${}: {q}: {err}", v["name"].as_str().unwrap())),
        }
    }
    failures
}

fn has_finite_value(data: &Value) -> bool {
    data["result"].as_array().into_iter().flatten().any(|series| {
        series["values"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| p[1].as_str().and_then(|s| s.parse::<f64>().ok()).is_some_and(f64::is_finite))
    })
}

/// (panel title, expr) for every query of every panel, rows' nested panels included.
fn expressions(d: &Value) -> Vec<(String, String)> {
    fn walk(panels: &Value, out: &mut Vec<(String, String)>) {
        for p in panels.as_array().into_iter().flatten() {
            for t in p["targets"].as_array().into_iter().flatten() {
                let title = format!(
                    "{} [{}]",
                    p["title"].as_str().unwrap_or("?"),
                    t["refId"].as_str().unwrap_or("?")
                );
                out.push((title, t["expr"].as_str().expect("every target has an expr").to_string()));
            }
            walk(&p["panels"], out);
        }
    }
    let mut out = vec![];
    walk(&d["panels"], &mut out);
    out
}

/// Metric names in a PromQL expression: identifiers outside label matchers, strings, ranges and
/// by/on clauses that are neither functions, aggregations nor keywords.
fn metric_names(expr: &str) -> BTreeSet<String> {
    const KEYWORDS: &[&str] = &["bool", "and", "or", "unless", "offset", "inf", "nan", "atan2"];
    const GROUPING: &[&str] = &["by", "without", "on", "ignoring", "group_left", "group_right"];
    const AGGREGATIONS: &[&str] = &[
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
    ];
    let c: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    let skip_to = |mut i: usize, close: char| {
        let mut quote = None;
        while i < c.len() {
            match (quote, c[i]) {
                (Some(_), '\\') => i += 1,
                (Some(q), ch) if ch == q => quote = None,
                (None, '"' | '\'' | '`') => quote = Some(c[i]),
                (None, ch) if ch == close => return i + 1,
                _ => {}
            }
            i += 1;
        }
        i
    };
    let mut grouping = false;
    while i < c.len() {
        match c[i] {
            '"' | '\'' | '`' => i = skip_to(i + 1, c[i]),
            '{' => i = skip_to(i + 1, '}'),
            '[' => i = skip_to(i + 1, ']'),
            '(' if grouping => {
                i = skip_to(i + 1, ')');
                grouping = false;
            }
            ch if ch.is_ascii_digit() || ch == '.' => {
                while i < c.len() && (c[i].is_ascii_alphanumeric() || c[i] == '.') {
                    i += 1;
                }
            }
            ch if ch.is_ascii_alphabetic() || ch == '_' || ch == ':' => {
                let start = i;
                while i < c.len() && (c[i].is_ascii_alphanumeric() || c[i] == '_' || c[i] == ':') {
                    i += 1;
                }
                let ident: String = c[start..i].iter().collect();
                let next = c[i..].iter().find(|ch| !ch.is_whitespace());
                if GROUPING.contains(&ident.as_str()) {
                    grouping = true;
                } else if !(KEYWORDS.contains(&ident.as_str())
                    || AGGREGATIONS.contains(&ident.as_str())
                    || next == Some(&'('))
                {
                    names.insert(ident);
                }
            }
            _ => i += 1,
        }
    }
    names
}

/// Series names in a Prometheus text exposition.
fn series_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap().to_string())
        .collect()
}

/// `promtool check metrics` on an exposition; its complaints, empty when clean.
fn promtool_check_metrics(text: &str) -> String {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus package) is not installed: run `make setup`");
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let o = child.wait_with_output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    if o.status.success() && said.trim().is_empty() { String::new() } else { format!("{}: {said}", o.status) }
}

/// A Prometheus server on a free loopback port with a throw-away config and data directory,
/// killed when dropped (however the test ends).
struct Prometheus {
    child: Child,
    addr: String,
}

impl Prometheus {
    fn start(dir: &Path, file_sd: &Path, extra_targets: &[String]) -> Self {
        let addr = format!("127.0.0.1:{}", free_port());
        let mut config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n\
             # The series carry their TrainingJob's `job` and `namespace`: keep them.\n\
             - job_name: foresight-run\n  honor_labels: true\n  file_sd_configs:\n  \
             - files: [{:?}]\n    refresh_interval: 1s\n",
            file_sd.display().to_string()
        );
        if !extra_targets.is_empty() {
            config += &format!(
                "- job_name: extra\n  honor_labels: true\n  static_configs:\n  - targets: {:?}\n",
                extra_targets
            );
        }
        let cfg = dir.join("prometheus.yml");
        std::fs::write(&cfg, config).unwrap();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("prometheus-data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("prometheus (Debian's prometheus package) is not installed: run `make setup`");
        let mut p = Self { child, addr };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !http(&p.addr, "GET", "/-/ready", "").is_ok_and(|(s, _)| s == 200) {
            if let Some(status) = p.child.try_wait().unwrap() {
                let log = std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default();
                panic!("prometheus exited ({status}):\n{log}");
            }
            assert!(Instant::now() < deadline, "prometheus not ready within 60 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        p
    }

    /// GET an /api/v1 path; `data` when the status is success, the error otherwise.
    fn api(&self, path: &str) -> Result<Value, String> {
        let (code, body) = http(&self.addr, "GET", path, "").map_err(|e| e.to_string())?;
        let v: Value = serde_json::from_str(&body).map_err(|e| format!("HTTP {code}: {e}: {body}"))?;
        if v["status"] == "success" {
            Ok(v["data"].clone())
        } else {
            Err(format!("HTTP {code}: {}: {}", v["errorType"], v["error"]))
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `foresight run` in the background; on drop (a failing test) it gets SIGTERM, which stops its
/// PS and workers, then SIGKILL if it has not exited within 20 s.
struct Foresight(Child);

impl Foresight {
    fn spawn(yaml: &Path, out: &Path) -> Self {
        let dir = Path::new(env!("CARGO_BIN_EXE_foresight")).parent().unwrap().to_path_buf();
        for b in ["foresight-ps", "foresight-worker"] {
            assert!(dir.join(b).exists(), "{b} is not built next to foresight: run `cargo test --workspace`");
        }
        let log = std::fs::File::create(out.parent().unwrap().join("foresight-run.log")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_foresight"))
            .args(["run", yaml.to_str().unwrap(), "--out", out.to_str().unwrap(), "--no-progress"])
            .current_dir(repo())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        Self(child)
    }

    fn assert_running(&mut self) {
        if let Some(status) = self.0.try_wait().unwrap() {
            panic!("foresight run exited early ({status})");
        }
    }

    fn wait(&mut self, limit: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "foresight run did not finish within {limit:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Foresight {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_some() {
            return;
        }
        let _ = Command::new("kill").args(["-TERM", &self.0.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if self.0.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A minimal HTTP/1.0 exchange (the response ends when the server closes): (status, body).
fn http(addr: &str, method: &str, path: &str, body: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(s, "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Length: {}\r\n\r\n{body}", body.len())?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    Ok((status, body.to_string()))
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}
