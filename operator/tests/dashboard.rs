//! The Grafana dashboard (`charts/foresight/dashboards/foresight.json`) against real Prometheus
//! (Debian's `prometheus` and `promtool`, installed by `make setup`):
//!
//! - a `foresight run` (2 workers) is scraped through its `prometheus-targets.json` until every
//!   target has been scraped enough times (then ended by `/v1/finalize`, nothing timed), every
//!   PromQL expression of the dashboard is evaluated over the run with `query_range`, and each
//!   must parse and return data; the operator (`foresight operator` against the test control
//!   plane, taking a TrainingJob to Succeeded meanwhile) is scraped as well;
//! - `promtool check metrics` is clean on the live `/metrics` of the PS, a worker and the operator;
//! - every metric name in the dashboard is one the code exports, and every PS and worker metric
//!   is on the dashboard;
//! - the JSON passes the grafana-foundation-sdk's Dashboard model (`scripts/check-dashboard.py`).

use std::collections::{BTreeMap, BTreeSet};
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

/// Samples every target must have in Prometheus after the moment that matters (all series
/// exported, a phase reached): `rate` over the dashboard's 4 s `$__rate_interval` needs two, and
/// the panels are read over the whole run. The test waits for them, however long a scrape takes.
const SCRAPES: f64 = 4.0;

#[test]
fn every_dashboard_query_returns_data_from_a_real_run_and_promtool_is_clean() {
    let tmp = tempfile::tempdir().unwrap();
    // The operator, against the test control plane, takes a TrainingJob from creation to
    // Succeeded while Prometheus scrapes it, so that its panels have data too.
    let cp = control_plane();
    let ns = cp.namespace("dashboard");
    let operator = Operator::start(cp, &ns, &["--leader-elect=false", "--finalize-grace-seconds", "0"]);
    let operator_target = format!("127.0.0.1:{}", operator.metrics);
    let out = tmp.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let sd = out.join("prometheus-targets.json");
    let prometheus = Prometheus::start(tmp.path(), &sd, std::slice::from_ref(&operator_target));
    let run = std::thread::scope(|s| {
        let driver = s.spawn(|| drive_a_job_to_success(&prometheus, &ns, &operator_target));
        run_scraped(&prometheus, &out, || {
            driver.join().expect("the TrainingJob went from Created to Succeeded")
        })
    });
    let operator_metrics = operator.metrics_text();
    let failures = check_queries(&prometheus, &run, |_| true);
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

/// Takes a TrainingJob of the test's operator from creation to Succeeded (the test plays the
/// kubelet), each step only once Prometheus has seen the one before it, so that the operator's
/// panels (reconciles, jobs by phase, durations) have data however fast either side is.
fn drive_a_job_to_success(prometheus: &Prometheus, ns: &str, operator: &str) {
    let cp = control_plane();
    // A few scrapes before the job exists: its duration must increase inside the window.
    prometheus.wait_scrapes(&[operator.to_string()], SCRAPES);
    cp.kubectl_ok(
        &["apply", "-n", ns, "-f", "-"],
        Some(&job("observed", serde_json::json!({"workers": {"replicas": 1}}))),
    );
    cp.set_pod_phase(ns, &ps_pod(cp, ns, "observed"), "Running");
    let pod = worker_pods(cp, ns, "observed", 1).remove(0);
    cp.set_pod_phase(ns, &pod, "Running");
    wait_phase(cp, ns, "observed", "Running");
    prometheus.wait_for_positive_sample("foresight_operator_jobs{phase=\"Running\"}");
    cp.succeed_last_worker(ns, &pod, 1);
    wait_phase(cp, ns, "observed", "Succeeded");
    prometheus.wait_scrapes(&[operator.to_string()], SCRAPES);
}

/// What a scraped run leaves: when it ran, its labels, and the /metrics texts taken during it.
struct ScrapedRun {
    start: f64,
    end: f64,
    namespace: String,
    job: String,
    ps_metrics: String,
    worker_metrics: String,
}

/// The job token of the scraped run.
const RUN_TOKEN: &str = "dashboard-test-token";
/// Its control token, so that the test can end it with `/v1/finalize` as the operator does.
const RUN_CONTROL_TOKEN: &str = "dashboard-test-control-token";

/// Runs `foresight run` (2 workers) while Prometheus scrapes its PS and workers through
/// `out/prometheus-targets.json`, until every target has been scraped [`SCRAPES`] times with all
/// of its series (worker accuracy included) and `also` has returned; then ends the job the way
/// the operator does, with `/v1/finalize`: the workers stop at their next push and the run
/// finishes normally. The epoch budget is only a bound: no run gets near it.
fn run_scraped(prometheus: &Prometheus, out: &Path, also: impl FnOnce()) -> ScrapedRun {
    let job = "dash";
    let yaml = out.parent().unwrap().join("job.yaml");
    std::fs::write(
        &yaml,
        format!(
            "apiVersion: foresight.dev/v1alpha1\nkind: TrainingJob\nmetadata: {{name: {job}}}\nspec:\n  \
             model: {{name: mlp}}\n  dataset: {{format: csv, path: data/mnist5k}}\n  \
             training: {{epochs: 10000, batchSize: 32, learningRate: 0.1}}\n  \
             optimizer: {{algorithm: dc-asgd-a, lambda0: 2}}\n  workers: {{replicas: 2}}\n"
        ),
    )
    .unwrap();
    let start = now() - 1.0;
    let mut run = Foresight::spawn(&yaml, out);
    let sd = out.join("prometheus-targets.json");
    let targets: Vec<String> = run.wait_for("the run's prometheus-targets.json", || {
        // Every group's targets: the PS (one group per shard) first, then the workers.
        let v = serde_json::from_str::<Value>(&std::fs::read_to_string(&sd).ok()?).ok()?;
        let groups = v.as_array()?.iter().filter_map(|g| g["targets"].as_array());
        Some(groups.flatten().map(|t| t.as_str().unwrap().to_string()).collect())
    });
    let (ps, workers) = (&targets[0], &targets[1..]);
    // Wait until every series has a value worth showing: updates applied, steps taken, and an
    // evaluation at the end of an epoch on each worker.
    let has = |addr: &str, series: &str| {
        http(addr, "GET", "/metrics", "").ok().is_some_and(|(_, body)| {
            body.lines().any(|l| l.starts_with(series) && l.split(' ').next_back() != Some("0"))
        })
    };
    run.wait_for("updates on the PS and an evaluation on every worker", || {
        (has(ps, "foresight_ps_updates_total")
            && workers.iter().all(|w| {
                has(w, "foresight_worker_step_seconds_count") && has(w, "foresight_worker_accuracy")
            }))
        .then_some(())
    });
    // Refuse one push (no token) so that foresight_ps_gradients_rejected_total{reason} exists.
    let (status, body) = http(ps, "POST", "/v1/gradients?worker=0&version=0&seq=1", "").unwrap();
    assert_eq!(status, 401, "{body}");
    prometheus.wait_scrapes(&targets, SCRAPES);
    also();
    let ps_metrics = http(ps, "GET", "/metrics", "").unwrap().1;
    let worker_metrics = http(&workers[0], "GET", "/metrics", "").unwrap().1;

    let auth = format!("Bearer {RUN_CONTROL_TOKEN}");
    let (status, body) = http_with(ps, "POST", "/v1/finalize", &[("Authorization", &auth)], "").unwrap();
    assert_eq!(status, 200, "POST /v1/finalize: {body}");
    let status = run.wait();
    assert!(status.success(), "foresight run failed: see {}/logs", out.display());
    let namespace = ps_metrics
        .split("namespace=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .expect("the PS's series carry a namespace label")
        .to_string();
    let end = now();
    eprintln!("the run was scraped over {:.0} s", end - start);
    ScrapedRun { start, end, namespace, job: job.into(), ps_metrics, worker_metrics }
}

/// Evaluates every expression of the dashboard (panels and template variables) over the run;
/// returns one line per failure. Every expression must be accepted; those for which `must_have_data`
/// holds must also return a series with at least one finite value.
fn check_queries(
    prometheus: &Prometheus,
    run: &ScrapedRun,
    must_have_data: impl Fn(&str) -> bool,
) -> Vec<String> {
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
        match prometheus.api(&q) {
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
        match prometheus.api(&path) {
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
        wait("prometheus to be ready", || {
            if let Some(status) = p.child.try_wait().unwrap() {
                let log = std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default();
                panic!("prometheus exited ({status}):\n{log}");
            }
            http(&p.addr, "GET", "/-/ready", "").is_ok_and(|(s, _)| s == 200).then_some(())
        });
        p
    }

    /// How many times Prometheus has scraped each target so far, by `instance`.
    fn scrape_counts(&self) -> BTreeMap<String, f64> {
        let q = format!("/api/v1/query?query={}", urlencode("count_over_time(up[1h])"));
        let data = self.api(&q).unwrap_or_else(|e| panic!("{q}: {e}"));
        data["result"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| {
                let instance = r["metric"]["instance"].as_str()?.to_string();
                Some((instance, r["value"][1].as_str()?.parse().ok()?))
            })
            .collect()
    }

    /// Waits until each of `instances` has been scraped `n` more times than it had been now.
    fn wait_scrapes(&self, instances: &[String], n: f64) {
        let before = self.scrape_counts();
        let count = |c: &BTreeMap<String, f64>, i: &String| c.get(i).copied().unwrap_or(0.0);
        wait(&format!("{n} more scrapes of {instances:?}"), || {
            let now = self.scrape_counts();
            instances.iter().all(|i| count(&now, i) >= count(&before, i) + n).then_some(())
        });
    }

    /// Waits until Prometheus holds a sample of `selector` above zero.
    fn wait_for_positive_sample(&self, selector: &str) {
        let q = format!("/api/v1/query?query={}", urlencode(&format!("max_over_time({selector}[1h]) > 0")));
        wait(&format!("a sample of {selector} above 0 in Prometheus"), || {
            self.api(&q).ok()?["result"].as_array().is_some_and(|r| !r.is_empty()).then_some(())
        });
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
            .env("FORESIGHT_TOKEN", RUN_TOKEN)
            .env("FORESIGHT_CONTROL_TOKEN", RUN_CONTROL_TOKEN)
            .current_dir(repo())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        Self(child)
    }

    /// Polls `f` until it answers, while the run keeps running (a bound of [`LIMIT`]).
    fn wait_for<T>(&mut self, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
        wait(what, || {
            if let Some(status) = self.0.try_wait().unwrap() {
                panic!("foresight run exited early ({status}) while the test waited for {what}");
            }
            f()
        })
    }

    fn wait(&mut self) -> std::process::ExitStatus {
        wait("foresight run to finish", || self.0.try_wait().unwrap())
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

/// How long the test waits for any one thing (a generous bound: each wait says what it waited
/// for and how long it took).
const LIMIT: Duration = Duration::from_secs(300);

fn wait<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    support::wait_for(what, LIMIT, f)
}

/// A minimal HTTP/1.0 exchange (the response ends when the server closes): (status, body).
fn http(addr: &str, method: &str, path: &str, body: &str) -> std::io::Result<(u16, String)> {
    http_with(addr, method, path, &[], body)
}

fn http_with(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let headers: String = headers.iter().map(|(k, v)| format!("{k}: {v}\r\n")).collect();
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\n{headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
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
