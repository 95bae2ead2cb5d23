#!/usr/bin/env python3
"""A real-sized model trained end to end, with a worker and a parameter-server shard killed
mid-run (`make real-size-job`; docs/benchmarks.md).

`foresight run` of examples/python/charlm.py made about 100M parameters (CHARLM_WIDTH=1024,
CHARLM_LAYERS=8), 4 Python workers, dc-asgd-a, the PS split over --shards processes, on the
example's corpus cut to --corpus-bytes (8 KiB: an epoch is 15 steps per worker at batch 2).
Once worker 1 has pushed --kill-worker-at steps it is SIGKILLed; once the model reaches version
--kill-shard-at, the last shard is SIGKILLed. `foresight run` starts both again: the worker
resumes at the PS's count of its steps, the shard restores its newest checkpoint (written every
--checkpoint-seconds). The job must finish with every worker's steps in the model.

Each shard's resident memory is sampled from /proc every 50 ms and read at start (listening),
once every worker has pushed, at its peak, and at the end; with the kill times, the restart
counts, the final model's held-out loss and the run's time, in <out>/result.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

GIB = 1 << 30
TOKEN = "real-size-job-token"
ROOT = Path(__file__).resolve().parent.parent


def processes(parent: int) -> dict[int, tuple[str, dict[str, str]]]:
    """Children of `parent`: {pid: (command line, environment)}."""
    found = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid != parent:
                continue
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            env = dict(e.decode().split("=", 1) for e in (d / "environ").read_bytes().split(b"\0") if b"=" in e)
            found[int(d.name)] = (cmd, env)
        except (OSError, ValueError, IndexError):
            continue
    return found


def shard_pids(run: int) -> dict[int, int]:
    """{shard index: pid} of the run's foresight-ps processes (from their checkpoint directory)."""
    out = {}
    for pid, (cmd, env) in processes(run).items():
        if "foresight-ps" in cmd:
            ckpt = env.get("FORESIGHT_CHECKPOINT_DIR", "")
            out[int(ckpt.rsplit("shard-", 1)[1]) if "shard-" in ckpt else 0] = pid
    return out


def worker_pids(run: int) -> dict[int, int]:
    """{worker index: pid} of the run's charlm.py processes."""
    return {
        int(env["FORESIGHT_WORKER_INDEX"]): pid
        for pid, (cmd, env) in processes(run).items()
        if "charlm.py" in cmd and "FORESIGHT_WORKER_INDEX" in env
    }


def rss(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def status(out: Path) -> dict | None:
    """Shard 0's /v1/status, or None while it is down."""
    try:
        targets = json.loads((out / "prometheus-targets.json").read_text())
        req = urllib.request.Request(
            f"http://{targets[0]['targets'][0]}/v1/status", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        with urllib.request.urlopen(req, timeout=2) as r:
            return json.load(r)
    except (OSError, ValueError, KeyError, IndexError):
        return None


class Watch(threading.Thread):
    """Samples every shard's memory and shard 0's status; kills a worker, then a shard."""

    def __init__(self, args, run: subprocess.Popen, out: Path) -> None:
        super().__init__(daemon=True)
        self.args, self.run_proc, self.out = args, run, out
        self.t0 = time.monotonic()
        self.memory: dict[int, list[tuple[float, int]]] = {}
        self.worker_peak: dict[int, int] = {}
        self.events: dict[str, object] = {}
        self.stop = threading.Event()

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 2)

    def run(self) -> None:
        last_status = 0.0
        while not self.stop.is_set() and self.run_proc.poll() is None:
            for shard, pid in shard_pids(self.run_proc.pid).items():
                if (b := rss(pid)) is not None:
                    self.memory.setdefault(shard, []).append((self.now(), b))
            for index, pid in worker_pids(self.run_proc.pid).items():
                self.worker_peak[index] = max(self.worker_peak.get(index, 0), rss(pid) or 0)
            if time.monotonic() - last_status > 0.5:
                last_status = time.monotonic()
                if (s := status(self.out)) is not None:
                    self.step(s)
            time.sleep(0.05)

    def step(self, s: dict) -> None:
        pushes = [w.get("pushes", 0) for w in s.get("workers", [])]
        if "all_pushed" not in self.events and len(pushes) == self.args.workers and min(pushes) > 0:
            self.events["all_pushed"] = self.now()
        if "worker_killed" not in self.events and len(pushes) > 1 and pushes[1] >= self.args.kill_worker_at:
            if (pid := worker_pids(self.run_proc.pid).get(1)) is not None:
                os.kill(pid, signal.SIGKILL)
                self.events["worker_killed"] = {"at": self.now(), "version": s["version"], "pushes": pushes[1]}
                print(f"{self.now():7.1f}s SIGKILL worker 1 after {pushes[1]} pushes (version {s['version']})", flush=True)
        if (
            "worker_killed" in self.events
            and "shard_killed" not in self.events
            and s["version"] >= self.args.kill_shard_at
        ):
            last = self.args.shards - 1
            if (pid := shard_pids(self.run_proc.pid).get(last)) is not None:
                os.kill(pid, signal.SIGKILL)
                self.events["shard_killed"] = {"at": self.now(), "shard": last, "version": s["version"]}
                print(f"{self.now():7.1f}s SIGKILL PS shard {last} at version {s['version']}", flush=True)


def job_yaml(args, corpus: Path) -> str:
    return f"""apiVersion: foresight.dev/v1alpha1
kind: TrainingJob
metadata:
  name: real-size-job
spec:
  dataset: {{format: files, path: {corpus}, holdout: 0.05}}
  training: {{epochs: 1, batchSize: {args.batch}, learningRate: 0.3, seed: 1}}
  optimizer: {{algorithm: dc-asgd-a}}
  parameterServer:
    replicas: {args.shards}
    checkpoint: {{intervalSeconds: {args.checkpoint_seconds}}}
  workers:
    replicas: {args.workers}
    command: [python, examples/python/charlm.py]
  runPolicy: {{backoffLimit: 10}}
"""


def phases(samples: list[tuple[float, int]], all_pushed: float | None) -> dict:
    """Resident GiB at start, once every worker had pushed, at the peak, at the end."""
    gib = lambda b: round(b / GIB, 2)  # noqa: E731
    after = [b for t, b in samples if all_pushed is not None and t >= all_pushed]
    return {
        "start": gib(samples[0][1]),
        "all_workers_pushed": gib(after[0]) if after else None,
        "peak": gib(max(b for _, b in samples)),
        "end": gib(samples[-1][1]),
    }


def parameters(model: Path) -> int:
    """Elements in a safetensors file, from its header."""
    with model.open("rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    total = 0
    for name, t in header.items():
        if name != "__metadata__":
            n = 1
            for d in t["shape"]:
                n *= d
            total += n
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", type=Path, default=Path("target/release"))
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--corpus-bytes", type=int, default=8_192)
    ap.add_argument("--kill-worker-at", type=int, default=4, help="worker 1's pushes before its SIGKILL")
    ap.add_argument("--kill-shard-at", type=int, default=36, help="model version at the shard's SIGKILL")
    ap.add_argument("--checkpoint-seconds", type=int, default=20)
    ap.add_argument("--out", type=Path, default=Path("out/real-size-job"))
    args = ap.parse_args()
    out = args.out.resolve()
    corpus = out / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    source = ROOT / "data/torch-nn/corpus.txt"
    if not source.exists():
        sys.exit("no data/torch-nn/corpus.txt: run `make setup`")
    (corpus / "corpus.txt").write_bytes(source.read_bytes()[: args.corpus_bytes])
    spec = out / "job.yaml"
    spec.write_text(job_yaml(args, corpus))
    env = {**os.environ, "CHARLM_WIDTH": str(args.width), "CHARLM_LAYERS": str(args.layers)}
    env["PATH"] = f"{ROOT / '.venv/bin'}:{env['PATH']}"
    run_out = out / "run"
    cmd = [str(args.bin / "foresight"), "run", str(spec), "--out", str(run_out), "--no-progress", "--token", TOKEN]
    started = time.monotonic()
    run = subprocess.Popen(cmd, cwd=ROOT, env=env)
    watch = Watch(args, run, run_out)
    watch.start()
    rc = run.wait()
    watch.stop.set()
    watch.join()
    seconds = time.monotonic() - started
    if rc != 0:
        sys.exit(f"foresight run failed ({rc}); logs in {run_out}/logs")
    summary = json.loads((run_out / "summary.json").read_text())
    steps = sorted(d["steps"] for d in summary["per_worker"])
    all_pushed = watch.events.get("all_pushed")
    result = {
        "parameters": parameters(run_out / "model-final.safetensors"),
        "shards": args.shards,
        "workers": args.workers,
        "seconds": round(seconds, 1),
        "updates": summary["updates"],
        "steps_per_worker": steps,
        "held_out_loss": summary.get("loss"),
        "restarts": summary.get("restarts"),
        "events": watch.events,
        "memory_gib": {f"shard_{i}": phases(m, all_pushed) for i, m in sorted(watch.memory.items())},
        "worker_peak_gib": {i: round(b / GIB, 2) for i, b in sorted(watch.worker_peak.items())},
    }
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    killed = watch.events.get("worker_killed"), watch.events.get("shard_killed")
    if not all(killed):
        sys.exit(f"a kill did not happen (the run ended first?): {watch.events}")
    if summary["updates"] != sum(steps) or len(set(steps)) != 1:
        sys.exit(f"not every step is in the model once: {summary['updates']} updates, steps {steps}")


if __name__ == "__main__":
    main()
