#!/usr/bin/env python3
"""`make chaos`: scripted failures against `foresight run`, each measured against a failure-free
run of the same job in the same invocation; writes docs/reliability.md.

Scenarios (one job: LeNet-5 on MNIST-5k, 4 workers, dc-asgd-a; the PS checkpoints every 5 s):

- baseline: no failure (run first and again last, so the noise of this machine is visible);
- worker-kills: SIGKILL one of the 4 workers (seeded choice) every --kill-every seconds; `foresight
  run` starts it again, as the worker Job would, and it resumes where its predecessor stopped;
- ps-kill-storage: SIGKILL the parameter server once, half-way; it restarts from its newest checkpoint
  (or a rejoining worker's copy, when that is fresher);
- ps-kill-no-storage: the same, but its checkpoints are taken away first (a PS whose emptyDir died
  with its node): it restarts empty and is re-seeded from the freshest copy a worker holds;
- slow-worker: worker 1 runs 3x slower (`--slow-worker 1=3`).

Measured per run, from the run's own outputs:
- final accuracy/loss: the PS's final model, evaluated by `foresight-worker evaluate`
  (summary.json);
- goodput: updates in the final model per second of the run, as a share of the same figure of the
  failure-free runs (their mean);
- time to the accuracy target: the PS's checkpoints are copied as they appear (every 5 s) and each
  is evaluated afterwards; the first one at or above --target, by its time;
- per failure: for a worker, the seconds from SIGKILL until its replacement joined the PS (the PS
  log's "worker joined"); for the PS, the version before the kill, the version it restarted at
  (restored, re-seeded, or restored then replaced by a fresher copy, from its log) and the
  updates lost.

Usage: scripts/chaos.py [--epochs 200] [--kill-every 30] [--seed 1] [--target 0.97]
                        [--out out/chaos] [--doc docs/reliability.md]
"""

import argparse
import datetime as dt
import json
import os
import platform
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TOKEN = "chaos-benchmark-token"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def job_yaml(name, epochs, seed):
    return (
        "apiVersion: foresight.dev/v1alpha1\nkind: TrainingJob\n"
        f"metadata: {{name: {name}}}\n"
        "spec:\n"
        "  model: {name: lenet5}\n"
        "  dataset: {format: csv, path: data/mnist5k, holdout: 0.2}\n"
        f"  training: {{epochs: {epochs}, batchSize: 32, learningRate: 0.05, seed: {seed},\n"
        f"    lrDecay: {{factor: 0.1, milestones: [{epochs * 0.5}, {epochs * 0.75}]}}}}\n"
        "  optimizer: {algorithm: dc-asgd-a, lambda0: 2.0, meanSquareDecay: 0.95}\n"
        "  parameterServer: {checkpoint: {intervalSeconds: 5}}\n"
        "  workers: {replicas: 4}\n"
        "  runPolicy: {backoffLimit: 100}\n"
    )


def children(pid, name=None):
    """Processes started by `pid` (whose executable is `name`, if given): {pid: environ}."""
    found = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            exe = os.path.basename(os.readlink(d / "exe"))
            if ppid == pid and name in (None, exe):
                env = (d / "environ").read_bytes().split(b"\0")
                found[int(d.name)] = dict(e.decode(errors="replace").split("=", 1) for e in env if b"=" in e)
        except (OSError, ValueError, IndexError):
            continue
    return found


def worker_pid(run_pid, index):
    for pid, env in children(run_pid, "foresight-worker").items():
        if env.get("FORESIGHT_WORKER_INDEX") == str(index):
            return pid
    return None


def ps_status(out):
    """The PS's /v1/status, or None while it is down."""
    try:
        targets = json.loads((out / "prometheus-targets.json").read_text())
        addr = targets[0]["targets"][0]
        req = urllib.request.Request(f"http://{addr}/v1/status", headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(req, timeout=2) as r:
            return json.load(r)
    except (OSError, ValueError, KeyError, IndexError):
        return None


class Checkpoints(threading.Thread):
    """Copies every checkpoint the PS writes (it keeps only the newest 3) with the time it appeared."""

    def __init__(self, out, t0):
        super().__init__(daemon=True)
        self.src, self.dst, self.t0 = out / "checkpoints", out / "snapshots", t0
        self.dst.mkdir(parents=True, exist_ok=True)
        self.seen = {}  # name -> seconds since start
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            self.collect()
            time.sleep(0.25)

    def collect(self):
        for f in sorted(self.src.glob("ckpt-*.safetensors")) if self.src.is_dir() else []:
            if f.name not in self.seen:
                try:
                    shutil.copy2(f, self.dst / f.name)
                    self.seen[f.name] = time.time() - self.t0
                except OSError:
                    pass  # rotated away between the listing and the copy

    def take_away(self):
        """Moves the PS's checkpoints out of its reach (kept for the curve)."""
        self.collect()
        for f in self.src.glob("ckpt-*"):
            f.unlink()


def kill_workers(run, every, seed, events):
    rng = random.Random(seed)
    while run.proc.poll() is None:
        if run.proc.wait_or_sleep(every):
            return
        i = rng.randrange(4)
        pid = worker_pid(run.proc.pid, i)
        if pid is None:
            continue
        os.kill(pid, signal.SIGKILL)
        events.append({"kind": "worker", "worker": i, "at": time.time() - run.t0, "wall": time.time()})
        print(f"  {time.time() - run.t0:6.1f}s SIGKILL worker {i} (pid {pid})", flush=True)


def kill_ps(run, at, take_checkpoints, ckpts, events):
    if run.proc.wait_or_sleep(at):
        return
    pids = list(children(run.proc.pid, "foresight-ps"))
    status = ps_status(run.out)
    if not pids or status is None:
        print("  the PS was not found; no kill", flush=True)
        return
    if take_checkpoints:
        ckpts.take_away()
    os.kill(pids[0], signal.SIGKILL)
    events.append({"kind": "ps", "at": time.time() - run.t0, "wall": time.time(),
                   "version_before": status["version"], "checkpoints": not take_checkpoints})
    print(f"  {time.time() - run.t0:6.1f}s SIGKILL the PS at version {status['version']}"
          f"{'' if not take_checkpoints else ' (checkpoints taken away)'}", flush=True)


class Proc:
    def __init__(self, cmd):
        self.p = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.pid = self.p.pid

    def poll(self):
        return self.p.poll()

    def wait_or_sleep(self, seconds):
        """Sleeps; True if the run ended meanwhile."""
        try:
            self.p.wait(timeout=seconds)
            return True
        except subprocess.TimeoutExpired:
            return False


class Run:
    def __init__(self, args, name, extra=()):
        self.out = Path(args.out) / name
        shutil.rmtree(self.out, ignore_errors=True)
        self.out.mkdir(parents=True)
        job = self.out / "job.yaml"
        job.write_text(job_yaml(name.replace("/", "-"), args.epochs, args.seed))
        self.cmd = [str(args.foresight), "run", str(job), "--out", str(self.out), "--no-progress",
                    "--token", TOKEN, *extra]
        self.name = name

    def start(self):
        self.t0 = time.time()
        self.proc = Proc(self.cmd)

    def finish(self):
        text = self.proc.p.communicate()[0]
        (self.out / "foresight-run.log").write_text(text)
        if self.proc.p.returncode != 0:
            sys.exit(f"{self.name}: {' '.join(self.cmd)} failed ({self.proc.p.returncode}):\n{text[-3000:]}")
        return json.loads((self.out / "summary.json").read_text())


def log_events(out):
    """(wall time, message, fields) of the PS log's lines."""
    lines = []
    for line in (out / "logs/ps.log").read_text(errors="replace").splitlines():
        line = ANSI.sub("", line)
        m = re.match(r"(\S+)\s+\w+\s+\S+:\s+(.*)", line)
        if not m:
            continue
        try:
            t = dt.datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()
        except ValueError:
            continue
        lines.append((t, m.group(2), dict(re.findall(r"(\w+)=(\S+)", m.group(2)))))
    return lines


def failure_costs(out, events):
    ps_log = log_events(out)
    for ev in events:
        after = [(t, msg, f) for t, msg, f in ps_log if t >= ev["wall"]]
        if ev["kind"] == "worker":
            joined = next((t for t, msg, f in after
                           if msg.startswith("worker joined") and f.get("worker") == str(ev["worker"])), None)
            ev["down_seconds"] = None if joined is None else round(joined - ev["wall"], 2)
        else:
            restored = next((int(f["version"]) for t, msg, f in after if msg.startswith("restored checkpoint")), None)
            # Offers replace one another while the PS holds for every worker's copy: the last
            # (freshest) one taken is the model it continued from.
            seeds = [int(f["version"]) for t, msg, f in after if msg.startswith("model seeded")]
            if restored is not None and seeds and max(seeds) > restored:
                # A rejoining worker's copy fresher than the checkpoint replaces it before any
                # update is applied: the updates since the checkpoint that it holds are kept.
                ev["restarted_at"] = max(seeds)
                ev["how"] = f"restored checkpoint at v{restored}, then took a worker's fresher copy"
            elif restored is not None:
                ev["restarted_at"], ev["how"] = restored, "restored checkpoint"
            elif seeds:
                ev["restarted_at"], ev["how"] = max(seeds), "re-seeded from a worker's copy"
            ready = next((t for t, msg, f in after if "listening" in msg), None)
            ev["down_seconds"] = None if ready is None else round(ready - ev["wall"], 2)
    return events


def curve(args, out, seen):
    """(seconds, version, accuracy) of every copied checkpoint, by `foresight-worker evaluate`."""
    points = []
    for name, t in sorted(seen.items(), key=lambda kv: kv[1]):
        p = subprocess.run(
            [str(args.worker), "evaluate", "--model-file", str(out / "snapshots" / name), "--model", "lenet5",
             "--dataset-format", "csv", "--dataset-path", "data/mnist5k", "--holdout", "0.2",
             "--seed", str(args.seed)],
            cwd=REPO, capture_output=True, text=True)
        if p.returncode == 0:
            e = json.loads(p.stdout)
            points.append((round(t, 1), e["version"], e["accuracy"]))
    return points


def scenario(args, name, extra=(), workers_every=None, ps_at=None, take_checkpoints=False):
    print(f"{name}:", flush=True)
    run = Run(args, name, extra)
    run.start()
    ckpts = Checkpoints(run.out, run.t0)
    ckpts.start()
    events = []
    threads = []
    if workers_every:
        threads.append(threading.Thread(target=kill_workers, args=(run, workers_every, args.seed, events)))
    if ps_at:
        threads.append(threading.Thread(target=kill_ps, args=(run, ps_at, take_checkpoints, ckpts, events)))
    for t in threads:
        t.start()
    summary = run.finish()
    for t in threads:
        t.join()
    ckpts.stop.set()
    ckpts.join()
    result = {
        "name": name,
        "seconds": summary["seconds"],
        "version": summary["final_model"]["version"],
        "accuracy": summary["accuracy"],
        "loss": summary["loss"],
        "restarts": len(summary["restarts"]),
        "events": failure_costs(run.out, events),
        "curve": curve(args, run.out, ckpts.seen),
    }
    result["updates_per_second"] = result["version"] / result["seconds"]
    reached = next((p for p in result["curve"] if p[2] >= args.target), None)
    result["time_to_target"] = reached[0] if reached else None
    print(f"  {result['seconds']:.1f}s, final model v{result['version']}, accuracy {result['accuracy']:.4f}, "
          f"{result['restarts']} restarts, target at {result['time_to_target']}", flush=True)
    (run.out / "result.json").write_text(json.dumps(result, indent=1))
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--kill-every", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2, help="rounds of every scenario, interleaved")
    ap.add_argument("--target", type=float, default=0.97)
    ap.add_argument("--out", default="out/chaos")
    ap.add_argument("--doc", default=None)
    ap.add_argument("--bin", default=str(REPO / "target/release"))
    ap.add_argument("--render-only", action="store_true",
                    help="write the report from --out's results.json without running anything")
    args = ap.parse_args()
    args.foresight = Path(args.bin) / "foresight"
    args.worker = Path(args.bin) / "foresight-worker"
    if args.render_only:
        saved = json.loads((Path(args.out) / "results.json").read_text())
        for r in saved["results"]:
            # The recovery read again from the run's PS log, where it is still there.
            run_out = Path(args.out) / r["name"]
            if (run_out / "logs/ps.log").exists():
                failure_costs(run_out, r["events"])
        report = render(args, saved["results"], saved["minutes"])
        print(report)
        if args.doc:
            write_doc(Path(args.doc), report)
        return
    t0 = time.time()

    # Rounds of every scenario in turn, then one more failure-free run: the machine's drift
    # falls on every scenario alike, and the baselines bracket it.
    results = []
    for k in range(args.repeats):
        base = scenario(args, f"baseline/{k}")
        half = base["seconds"] / 2
        results += [
            base,
            scenario(args, f"worker-kills/{k}", workers_every=args.kill_every),
            scenario(args, f"ps-kill-storage/{k}", ps_at=half),
            scenario(args, f"ps-kill-no-storage/{k}", ps_at=half, take_checkpoints=True),
            scenario(args, f"slow-worker/{k}", extra=["--slow-worker", "1=3"]),
        ]
    results.append(scenario(args, f"baseline/{args.repeats}"))
    minutes = (time.time() - t0) / 60
    saved = {"results": results, "minutes": minutes}
    (Path(args.out) / "results.json").write_text(json.dumps(saved, indent=1))
    report = render(args, results, minutes)
    print(report)
    if args.doc:
        write_doc(Path(args.doc), report)


def write_doc(path, report):
    """Writes `report` over the doc's sections that `make chaos` measures, keeping the rest as it
    is: the conformance matrix's section (`make matrix` writes it) and every section after it
    (the hostile-client rows, each a test of `make test`)."""
    rest = ""
    if path.exists():
        old = path.read_text()
        at = old.find("## Where features meet")
        rest = "" if at < 0 else "\n" + old[at:]
    path.write_text(report + rest)


def shown(path):
    """`path` relative to the repository when it is inside it (the doc names no machine's paths)."""
    p = Path(path).resolve()
    return str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(p)


def seconds(x):
    return "–" if x is None else f"{x:.1f}"


def pct(x):
    return "–" if x is None else f"{100 * x:.2f} %"


def spread(values, fmt):
    """mean (min–max) of the values, or the one value."""
    values = [v for v in values if v is not None]
    if not values:
        return "not reached"
    if len(values) == 1:
        return fmt(values[0])
    return f"{fmt(statistics.mean(values))} ({fmt(min(values))}–{fmt(max(values))})"


def render(args, results, minutes):
    kind = lambda r: r["name"].split("/")[0]  # noqa: E731
    baselines = [r for r in results if kind(r) == "baseline"]
    ref_rate = statistics.mean(r["updates_per_second"] for r in baselines)
    ref_acc = statistics.mean(r["accuracy"] for r in baselines)
    # Every step of the spec is one update (pushEvery 1, asynchronous), and replaced workers
    # resume rather than redo: what the final model lacks against a baseline's is what was lost.
    total = max(r["version"] for r in baselines)
    rows = []
    for name in dict.fromkeys(kind(r) for r in results):
        runs = [r for r in results if kind(r) == name]
        reached = [r["time_to_target"] for r in runs]
        rows.append(
            f"| {name} | {len(runs)} | {spread([r['seconds'] for r in runs], seconds)} | "
            f"{spread([r['version'] for r in runs], lambda v: f'{v:.0f}')} | "
            f"{spread([r['updates_per_second'] / ref_rate for r in runs], lambda v: f'{v:.3f}')} | "
            f"{spread([r['accuracy'] for r in runs], pct)} | "
            f"{100 * (statistics.mean(r['accuracy'] for r in runs) - ref_acc):+.2f} pp | "
            f"{spread(reached, seconds)}{'' if None not in reached else f' ({reached.count(None)} not reached)'} | "
            f"{sum(r['restarts'] for r in runs)} |")
    costs = []
    for r in results:
        for ev in r["events"]:
            if ev["kind"] == "worker":
                costs.append(f"| {r['name']} | {ev['at']:.1f} | SIGKILL worker {ev['worker']} | "
                             f"replacement joined after {ev['down_seconds']} s | – |")
            else:
                costs.append(f"| {r['name']} | {ev['at']:.1f} | SIGKILL PS at v{ev['version_before']} or later | "
                             f"{ev.get('how', '?')} at v{ev.get('restarted_at', '?')}, listening after "
                             f"{ev['down_seconds']} s | {total - r['version']} |")
    drift = max(r["updates_per_second"] for r in baselines) / min(r["updates_per_second"] for r in baselines)
    return TEMPLATE.format(
        epochs=args.epochs, kill_every=args.kill_every, seed=args.seed, target=pct(args.target),
        rows="\n".join(rows), costs="\n".join(costs) or "| – | | | | |", minutes=minutes, drift=drift,
        machine=f"{os.cpu_count()} cores, {platform.machine()}, {platform.system()}",
        date=dt.date.today().isoformat(), repeats=args.repeats, baselines=len(baselines),
        half=args.epochs // 2, three_quarters=args.epochs * 3 // 4, total=total, bin=shown(args.bin),
    )


TEMPLATE = """# Reliability: training that survives failures, measured

Written by `make chaos` (`scripts/chaos.py --doc docs/reliability.md`) on {date}; the run took
{minutes:.1f} minutes on this machine ({machine}). Every figure below is from that one invocation.

The job: LeNet-5 on MNIST-5k (4,000 training / 1,000 held-out examples), 4 workers, dc-asgd-a
(λ0 = 2, μ = 0.95), η = 0.05 (×0.1 after epochs {half} and {three_quarters}), batch 32, {epochs}
epochs, seed {seed}, PS checkpoints every 5 s, `runPolicy.backoffLimit: 100`, run with
`foresight run` (the binaries in `{bin}`). Each scenario is the same job with one kind of failure, and
the scenarios run in {repeats} interleaved rounds (then one more baseline), so that the machine's
drift falls on all of them alike:

- **baseline**: no failure ({baselines} runs, bracketing the others; their updates/s differ by up
  to a factor {drift:.3f}: that is the noise floor of every ratio below);
- **worker-kills**: every {kill_every:.0f} s, SIGKILL one of the 4 workers (seeded choice);
  `foresight run` starts it again, as the worker Job would, and it resumes from the PS's record
  of its step;
- **ps-kill-storage**: SIGKILL the parameter server half-way (by the round's baseline duration);
  it restarts from its newest checkpoint, and takes a rejoining worker's copy instead when that
  copy is fresher (before any update is applied to the checkpoint's model);
- **ps-kill-no-storage**: the same, with its checkpoints taken away just before the kill (a PS
  whose emptyDir died with its node): it restarts empty and is re-seeded from the freshest model a
  worker holds;
- **slow-worker**: worker 1 three times slower (`foresight run --slow-worker 1=3`).

## Results

Per scenario: the mean over its runs, and (min–max).

- *final model*: the PS's model after every worker finished, evaluated on the held-out split by
  `foresight-worker evaluate` (summary.json's `accuracy`); its *version* is the number of updates
  it contains (the spec's total work is {total} steps, each one update: every baseline's final
  model has them all);
- *goodput*: updates in the final model per second of the run, as a share of the baselines' mean
  updates per second;
- *time to {target}*: the first PS checkpoint (copied as written, every 5 s, and evaluated
  afterwards by the same evaluator) at or above {target} held-out accuracy, by the time it was
  written (a 5 s resolution). A scenario whose target comes before its first failure (30 s for
  worker kills, half-way for the PS) cannot differ here from the baseline: then the final
  accuracy and the goodput are what tell.

| scenario | runs | seconds | final model version | goodput | final accuracy | vs baselines | time to {target} (s) | restarts |
|---|---|---|---|---|---|---|---|---|
{rows}

## What each failure cost

Worker kills: the time from SIGKILL until the replacement process joined the PS (the PS log's
`worker joined`); the work lost is at most the killed worker's step in flight (`pushEvery: 1`), as
the replacement resumes at the step after its predecessor's last applied gradient. PS kills: the
version read from `/v1/status` just before the kill (updates went on until the signal landed),
the version the new PS started from (its log), and the updates lost: the spec's {total} steps
minus the final model's version (exact: each step is one update, and no step is done twice).

| run | at (s) | failure | recovery | updates lost |
|---|---|---|---|---|
{costs}

## How to read it

- Targets (issue #10): one of 4 workers killed every 30 s → goodput ≥ 0.85 and final accuracy
  within 1 pp of the failure-free run; PS SIGKILL with storage → at most one checkpoint interval
  of updates lost (a few, when a rejoining worker's copy is fresher than the checkpoint); without
  storage → at most the updates since the freshest worker copy (with `pullEvery: 1` every worker
  pulls before each step, so that is a few updates).
- The job's total work is fixed by its epochs, so a slow worker's shard is finished by that worker
  alone at its own pace after the others are done: asynchronous training does not wait for it,
  but cannot finish its data faster either.
- The machine may be shared with other work while this runs; the baselines bound the noise.

Rerun: `make chaos` (about {minutes:.0f} minutes here; `ARGS="--epochs 20 --repeats 1"` for a
shorter one).
"""

if __name__ == "__main__":
    main()
