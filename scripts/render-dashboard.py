#!/usr/bin/env python3
"""Renders the key panels of the Grafana dashboard from a real run's Prometheus data.

Grafana does not run here, so this draws with matplotlib what the dashboard's panels would show:
it starts Prometheus (Debian's, scrape interval 1 s, honor_labels) on the run's
prometheus-targets.json, runs `foresight run JOB --out OUT/run`, then evaluates the panels'
own PromQL (read from charts/foresight/dashboards/foresight.json, variables substituted) with
query_range over the run and draws them into one PNG.

  scripts/render-dashboard.py [--job examples/mnist-dcasgd.yaml] [--out out/observability]
                              [--png OUT/dashboard.png] [--reuse]
  scripts/render-dashboard.py --prometheus-url URL --trainingjob NS/NAME --start T0 --end T1
                              [--check] [--png FILE] [--rate-interval 8s]

--reuse skips the run and reads the Prometheus data a previous call left in OUT.

--prometheus-url reads a Prometheus that is already running (tools/cluster-prometheus.sh, which
scrapes the real cluster) instead: no run, the TrainingJob NS/NAME between the Unix times T0 and
T1. --check then evaluates every expression of the dashboard (panels and template variables)
over that window and exits 1, naming them, when any fails or returns no finite value; --png
draws the figure from the same data.
"""
import argparse
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DASHBOARD = os.path.join(ROOT, "charts/foresight/dashboards/foresight.json")

# (panel title in the dashboard, axis label); the staleness heatmap is drawn as a heatmap.
PANELS = [
    ("Gradient staleness τ", "τ (versions)"),
    ("Staleness p50 / p99", "τ (versions)"),
    ("Updates/s", "updates/s"),
    ("Rejected gradients by reason", "pushes/s"),
    ("Push / pull / apply latency p99", "seconds"),
    ("Bytes/s in and out", "MB/s"),
    ("Delay compensation: λ_t and compensation ratio", "ratio"),
    ("Training loss", "loss"),
    ("Held-out accuracy", "accuracy"),
    ("Step time per worker", "seconds"),
    ("Samples/s", "samples/s"),
    ("Checkpoint age", "seconds"),
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url):
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.load(r)


class RemotePrometheus:
    """A Prometheus that is already running (the cluster's, tools/cluster-prometheus.sh)."""

    def __init__(self, url):
        self.url = url.rstrip("/")

    def api(self, path, params):
        r = get(f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params, doseq=True)}")
        if r["status"] != "success":
            raise RuntimeError(f"{params}: {r.get('error')}")
        return r["data"]

    def query_range(self, expr, start, end, step):
        return self.api("query_range", {"query": expr, "start": start, "end": end, "step": step})["result"]

    def label_values(self, label, start, end, match="foresight_ps_model_version"):
        return self.api(f"label/{label}/values", {"match[]": match, "start": start, "end": end})

    def close(self):
        pass


class Prometheus(RemotePrometheus):
    """Debian's prometheus on a free loopback port; scrapes the run's file_sd targets."""

    def __init__(self, out, targets_file):
        self.addr = f"127.0.0.1:{free_port()}"
        super().__init__(f"http://{self.addr}")
        cfg = os.path.join(out, "prometheus.yml")
        with open(cfg, "w") as f:
            f.write(
                "global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}\n"
                "scrape_configs:\n"
                "- job_name: foresight-run\n"
                "  honor_labels: true\n"
                f"  file_sd_configs: [{{files: [{json.dumps(targets_file)}], refresh_interval: 1s}}]\n"
            )
        log = open(os.path.join(out, "prometheus.log"), "w")
        self.proc = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={cfg}",
                f"--storage.tsdb.path={os.path.join(out, 'prometheus-data')}",
                f"--web.listen-address={self.addr}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=log,
        )
        deadline = time.time() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://{self.addr}/-/ready", timeout=2)
                return
            except OSError:
                if self.proc.poll() is not None or time.time() > deadline:
                    self.close()
                    sys.exit(f"prometheus did not start: see {out}/prometheus.log")
                time.sleep(0.1)

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def run_job(args, out, run_dir):
    job = args.job
    if args.epochs:
        # The same job, trained longer: Prometheus starts scraping new targets up to ~5 s late.
        with open(os.path.join(ROOT, args.job)) as f:
            text, n = re.subn(r"(?m)^(\s+epochs:)\s*\d+", rf"\g<1> {args.epochs}", f.read())
        if n != 1:
            sys.exit(f"render-dashboard: no single `epochs:` line in {args.job}")
        job = os.path.join(out, "job.yaml")
        with open(job, "w") as f:
            f.write(text)
    cmd = [args.foresight, "run", job, "--out", run_dir, "--no-progress"]
    for s in args.slow_worker:
        cmd += ["--slow-worker", s]
    print("render-dashboard:", " ".join(cmd), file=sys.stderr)
    start = time.time() - 1
    subprocess.run(cmd, cwd=ROOT, check=True)
    time.sleep(2)  # the last scrapes
    return start, time.time()


def panels_by_title(d):
    out = {}

    def walk(ps):
        for p in ps:
            out[p["title"]] = p
            walk(p.get("panels", []))

    walk(d["panels"])
    return out


def legend(fmt, metric):
    """Grafana's legendFormat: {{label}} becomes the series' label value."""
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), fmt or "")


def draw_heatmap(ax, result, start):
    buckets = sorted(result, key=lambda s: float(s["metric"]["le"]))
    les = [float(s["metric"]["le"]) for s in buckets]
    times = sorted({float(v[0]) for s in buckets for v in s["values"]})
    index = {t: i for i, t in enumerate(times)}
    cum = [[0.0] * len(times) for _ in les]
    for b, s in enumerate(buckets):
        for t, v in s["values"]:
            cum[b][index[float(t)]] = float(v) if v not in ("NaN", "+Inf") else 0.0
    # Cumulative buckets → counts per bucket; keep buckets up to the largest one used (+1).
    per = [[cum[b][j] - (cum[b - 1][j] if b else 0.0) for j in range(len(times))] for b in range(len(les))]
    used = [b for b in range(len(les)) if any(x > 1e-9 for x in per[b])]
    top = min(len(les), (max(used) + 2) if used else 2)
    per, les = per[:top], les[:top]
    xs = [t - start for t in times]
    im = ax.pcolormesh(xs, range(len(les)), per, shading="nearest", cmap="Oranges")
    ax.set_yticks(range(len(les)))
    ax.set_yticklabels(["+Inf" if math.isinf(le) else f"≤{le:g}" for le in les])
    plt.colorbar(im, ax=ax, label="gradients per interval")


def substitute(expr, subst):
    for k, v in sorted(subst.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace("${" + k[1:] + "}", v).replace(k, v)
    return expr


def expressions(d):
    """(panel title [refId], expr) of every query of every panel, rows' nested panels included."""
    out = []

    def walk(ps):
        for p in ps:
            for t in p.get("targets", []):
                out.append((f"{p['title']} [{t.get('refId', '?')}]", t["expr"]))
            walk(p.get("panels", []))

    walk(d["panels"])
    return out


def has_finite_value(result):
    return any(math.isfinite(float(v)) for s in result for _, v in s["values"])


def check(prom, dash, subst, start, end, namespace, job):
    """Every expression of the dashboard over [start, end]: one line per failure (an error, an
    unsubstituted variable, or no series with a finite value); the template variables must list
    the TrainingJob's namespace and name."""
    failures = []
    exprs = expressions(dash)
    for title, raw in exprs:
        e = substitute(raw, subst)
        if "$" in e:
            failures.append(f"{title}: unsubstituted variable in {e}")
            continue
        try:
            result = prom.query_range(e, start, end, 1)
        except (RuntimeError, OSError) as err:
            failures.append(f"{title}: {e}: {err}")
            continue
        if not has_finite_value(result):
            failures.append(f"{title}: no data: {e}")
    for v in dash["templating"]["list"]:
        if v["type"] != "query":
            continue
        q = v["query"]["query"]
        selector, label = q[len("label_values("):-1].rsplit(",", 1)
        want = job if label.strip() == "job" else namespace
        values = prom.label_values(label.strip(), start, end, substitute(selector.strip(), subst))
        if want not in values:
            failures.append(f"${v['name']}: {q} gave {values}, not {want}")
    print(f"render-dashboard: {len(exprs) - sum(1 for f in failures if not f.startswith('$'))} of "
          f"{len(exprs)} dashboard queries returned data for {namespace}/{job}", file=sys.stderr)
    return failures


def summary(prom, subst, end):
    """The figures docs/observability.md quotes about the figure, over its whole window."""
    sel = substitute('{namespace=~"$namespace", job=~"$job"}', subst)
    r = subst["$__range"]
    h = "foresight_ps_gradient_staleness"
    queries = {
        "updates (max model version)": f"max(max_over_time(foresight_ps_model_version{sel}[{r}]))",
        "mean τ": f"sum(increase({h}_sum{sel}[{r}])) / sum(increase({h}_count{sel}[{r}]))",
        "τ p50": f"histogram_quantile(0.5, sum by (le) (increase({h}_bucket{sel}[{r}])))",
        "τ p99": f"histogram_quantile(0.99, sum by (le) (increase({h}_bucket{sel}[{r}])))",
        "share at τ = 0": f'sum(increase({h}_bucket{sel[:-1]}, le=~"0|0\\\\.0"}}[{r}])) / sum(increase({h}_count{sel}[{r}]))',
        # (Positive values only: both gauges read 0 until the first delay-compensated update.)
        "compensation ratio min": f"min(min_over_time((foresight_ps_compensation_ratio{sel} > 0)[{r}:1s]))",
        "compensation ratio max": f"max(max_over_time(foresight_ps_compensation_ratio{sel}[{r}]))",
        "λ_t min": f"min(min_over_time((foresight_ps_lambda{sel} > 0)[{r}:1s]))",
        "λ_t max": f"max(max_over_time(foresight_ps_lambda{sel}[{r}]))",
        "held-out accuracy max": f"max(max_over_time(foresight_worker_accuracy{sel}[{r}]))",
    }
    parts = []
    for name, q in queries.items():
        res = prom.api("query", {"query": q, "time": end})["result"]
        parts.append(f"{name} {float(res[0]['value'][1]):.4g}" if res else f"{name} -")
    print("render-dashboard: over the figure's window: " + ", ".join(parts), file=sys.stderr)


def render(prom, panels, subst, start, end, png, rate_interval, title):
    plt.rcParams.update({"font.size": 8, "axes.titlesize": 9, "axes.titleweight": "bold"})
    fig, axes = plt.subplots(4, 3, figsize=(16, 14))
    for ax, (name, ylabel) in zip(axes.flat, PANELS):
        p = panels[name]
        ax.set_title(name)
        ax.set_xlabel("seconds since start")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        for t in p["targets"]:
            result = prom.query_range(substitute(t["expr"], subst), start, end, 1)
            if p["type"] == "heatmap":
                draw_heatmap(ax, result, start)
                continue
            for s in sorted(result, key=lambda s: json.dumps(s["metric"], sort_keys=True)):
                xs, ys = [], []
                for ts, v in s["values"]:
                    v = float(v)
                    if math.isfinite(v):
                        xs.append(float(ts) - start)
                        ys.append(v / 1e6 if ylabel == "MB/s" else v)
                # The refusals panel's 0 line has no reason label: the PS refused nothing.
                label = legend(t.get("legendFormat", ""), s["metric"]) or ("none refused" if "Rejected" in name else "")
                ax.plot(xs, ys, lw=1.2, label=label)
        if ax.lines:
            ax.legend(loc="best", fontsize=7)
        elif p["type"] != "heatmap":
            ax.text(0.5, 0.5, "no data (none refused)" if "Rejected" in name else "no data",
                    transform=ax.transAxes, ha="center", va="center", color="grey")
        if name.startswith("Delay compensation"):
            ax.set_yscale("log")
            ax.set_ylabel("λ_t and ratio (log)")
    fig.suptitle(f"Foresight dashboard, rendered from Prometheus: {title} "
                 f"({end - start:.0f} s, $__rate_interval = {rate_interval})", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    os.makedirs(os.path.dirname(os.path.abspath(png)), exist_ok=True)
    fig.savefig(png, dpi=90)
    print(f"render-dashboard: wrote {png}", file=sys.stderr)
    summary(prom, subst, end)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--job", default="examples/mnist-dcasgd.yaml")
    ap.add_argument("--out", default="out/observability")
    ap.add_argument("--png", help="default OUT/dashboard.png; none with --prometheus-url")
    ap.add_argument("--foresight", default=os.path.join(ROOT, "target/release/foresight"))
    ap.add_argument("--epochs", type=int, default=40, help="train this many epochs instead (0: as the job says)")
    ap.add_argument("--slow-worker", action="append", default=[], help="passed to foresight run (N=F)")
    ap.add_argument("--rate-interval", default="5s", help="what $__rate_interval becomes")
    ap.add_argument("--reuse", action="store_true", help="reuse the Prometheus data of a previous call")
    ap.add_argument("--prometheus-url", help="read this running Prometheus; no run")
    ap.add_argument("--trainingjob", metavar="NS/NAME", help="with --prometheus-url: the TrainingJob")
    ap.add_argument("--start", type=float, help="with --prometheus-url: the window's start (Unix time)")
    ap.add_argument("--end", type=float, help="with --prometheus-url: the window's end (Unix time)")
    ap.add_argument("--check", action="store_true", help="with --prometheus-url: every dashboard query must return data (exit 1)")
    ap.add_argument("--title", help="the figure's title (default: the run or the TrainingJob)")
    args = ap.parse_args()
    with open(DASHBOARD) as f:
        dash = json.load(f)
    if args.check and not args.prometheus_url:
        ap.error("--check needs --prometheus-url: a local run has no operator for the operator row")
    if args.prometheus_url:
        if not (args.trainingjob and "/" in args.trainingjob and args.start and args.end):
            ap.error("--prometheus-url needs --trainingjob NS/NAME, --start and --end")
        namespace, job = args.trainingjob.split("/", 1)
        # The window ends on the step grid: query_range evaluates at start + k·step ≤ end, and a
        # sample scraped in the last second before `end` (the operator's count of a job that
        # just finished) would otherwise fall after the last evaluation.
        prom, end = RemotePrometheus(args.prometheus_url), args.end
        start = end - math.ceil(end - args.start)
        ns, jobs = [namespace], [job]
        title = args.title or f"TrainingJob {namespace}/{job} on the real cluster"
    else:
        out = os.path.abspath(args.out)
        args.png = args.png or os.path.join(out, "dashboard.png")
        run_dir = os.path.join(out, "run")
        window = os.path.join(out, "window.json")
        if not args.reuse:
            for d in ("prometheus-data", "run"):
                shutil.rmtree(os.path.join(out, d), ignore_errors=True)
        # Prometheus watches the directory of the targets file: it must exist before it starts.
        os.makedirs(run_dir, exist_ok=True)
        prom = Prometheus(out, os.path.join(run_dir, "prometheus-targets.json"))
    try:
        if not args.prometheus_url:
            if args.reuse:
                with open(window) as f:
                    start, end = json.load(f)
            else:
                start, end = run_job(args, out, run_dir)
                with open(window, "w") as f:
                    json.dump([start, end], f)
            ns = prom.label_values("namespace", start, end)
            jobs = prom.label_values("job", start, end)
            if not ns or not jobs:
                sys.exit("render-dashboard: Prometheus holds no foresight_ps series for the run")
            title = os.path.relpath(os.path.join(ROOT, args.job), ROOT)
            if args.epochs:
                title += f" with epochs: {args.epochs}"
            title = args.title or f"foresight run {title}"
        subst = {
            "$namespace": "|".join(ns),
            "$job": "|".join(jobs),
            "$__rate_interval": args.rate_interval,
            "$__interval": "1s",
            "$__range": f"{math.ceil(end - start)}s",
        }
        failures = check(prom, dash, subst, start, end, ns[0], jobs[0]) if args.check else []
        for f in failures:
            print(f"render-dashboard: FAILED {f}", file=sys.stderr)
        if args.png:
            render(prom, panels_by_title(dash), subst, start, end, args.png, args.rate_interval, title)
        if failures:
            sys.exit(f"render-dashboard: {len(failures)} dashboard queries failed")
    finally:
        prom.close()


if __name__ == "__main__":
    main()
