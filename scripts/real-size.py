#!/usr/bin/env python3
"""The parameter server at a real model size (`make real-size`; docs/benchmarks.md).

One `foresight-ps` process (or --shards N, shard 0 with the others as --peers) and
`foresight-loadgen`'s simulated workers on loopback, a model of --params float32 parameters
(100M by default). Each PS process's resident memory is sampled from /proc
every 20 ms and read at each phase: at start, once the model is registered, once every worker
has pushed, its peak while training, at the end of training, and during the checkpoint that
SIGTERM writes; then the PS is started again on that checkpoint and the restore is timed (every
shard's figures separately when sharded, in `shards`). The
figures are compared with what the store is meant to hold: bytes per parameter of w, the
optimizer's state and one backup per worker (see docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

GIB = 1 << 30


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss(pid: int) -> tuple[int, int]:
    """VmRSS and VmHWM (the peak) of `pid`, in bytes."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    kib = lambda k: int(fields[k].split()[0]) * 1024  # noqa: E731
    return kib("VmRSS"), kib("VmHWM")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds `pid` has used so far."""
    after = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(after[11]) + int(after[12])) / os.sysconf("SC_CLK_TCK")


class Sampler(threading.Thread):
    """The PS's resident memory every 20 ms, and its own status (registered, pushes per worker)."""

    def __init__(self, pid: int, url: str, token: str) -> None:
        super().__init__(daemon=True)
        self.pid, self.url, self.token = pid, url, token
        self.samples: list[tuple[float, int]] = []
        self.events: dict[str, float] = {}
        self.memory_plan: dict | None = None
        self.stop = threading.Event()

    def status(self) -> dict:
        req = urllib.request.Request(f"{self.url}/v1/status", headers={"Authorization": f"Bearer {self.token}"})
        return json.loads(urllib.request.urlopen(req, timeout=5).read())

    def run(self) -> None:
        last_status = 0.0
        while not self.stop.is_set():
            now = time.monotonic()
            try:
                self.samples.append((now, rss(self.pid)[0]))
            except (FileNotFoundError, ProcessLookupError, KeyError):
                return  # the process ended (an exiting process's status has no VmRSS)
            if now - last_status > 0.25 and "joined" not in self.events:
                last_status = now
                try:
                    st = self.status()
                except OSError:
                    st = {}
                if st.get("registered"):
                    self.events.setdefault("registered", now)
                workers = st.get("workers") or []
                if workers and all(w["pushes"] > 0 for w in workers):
                    self.events["joined"] = now
                    # The PS's own memory plan (--memory-limit): the peak it plans for.
                    self.memory_plan = st.get("memory")
            time.sleep(0.02)

    def at(self, t: float) -> int:
        """The resident memory sampled last before `t`."""
        before = [r for s, r in self.samples if s <= t]
        return before[-1] if before else self.samples[0][1]

    def peak(self, start: float, end: float) -> int:
        return max((r for s, r in self.samples if start <= s <= end), default=0)


def start_ps(args, out: Path, port: int, token: str, log_name: str, ckpt: Path, peers: list[str]) -> subprocess.Popen:
    cmd = [
        str(args.ps_bin or args.bin / "foresight-ps"), "--listen", f"127.0.0.1:{port}", "--workers", str(args.workers),
        "--algorithm", args.algorithm, "--learning-rate", "0.1", "--checkpoint-dir", str(ckpt),
        "--checkpoint-interval", "0", "--log-format", "json",
    ]
    if args.memory_limit:
        cmd += ["--memory-limit", str(args.memory_limit)]
    if peers:
        cmd += ["--peers", ",".join(peers)]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("FORESIGHT_")}, "FORESIGHT_TOKEN": token}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=open(out / log_name, "wb"))


def wait_listening(ps: subprocess.Popen, url: str, log: Path, timeout: float = 600) -> float:
    started = time.monotonic()
    while True:
        try:
            urllib.request.urlopen(f"{url}/healthz", timeout=1).read()
            return time.monotonic() - started
        except OSError:
            if ps.poll() is not None or time.monotonic() - started > timeout:
                sys.exit(f"foresight-ps did not start:\n{log.read_text()[-2000:]}")
            time.sleep(0.02)


def log_field(log: Path, message: str, field: str) -> float | None:
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            entry = json.loads(line)
            fields = entry.get("fields", {})
            if fields.get("message") == message and field in fields:
                return float(fields[field])
    return None


class Shard:
    """One PS process: its port, directories, logs and memory sampler."""

    def __init__(self, args, out: Path, i: int, n: int) -> None:
        self.args, self.out, self.i = args, out, i
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ckpt = out / "checkpoints" if n == 1 else out / "checkpoints" / f"shard-{i}"
        self.log = "ps.log" if n == 1 else f"ps-{i}.log"
        self.ckpt.mkdir(parents=True, exist_ok=True)
        for old in self.ckpt.glob("*"):
            old.unlink()

    def start(self, token: str, peers: list[str], log: str | None = None) -> subprocess.Popen:
        log = log or self.log
        ps = start_ps(self.args, self.out, self.port, token, log, self.ckpt, peers)
        self.listen_s = wait_listening(ps, self.url, self.out / log)
        return ps


def figures(args, shard: Shard, sampler: Sampler, times: dict, restored: tuple[int, int], params: int) -> dict:
    """One PS process's memory by phase and its checkpoint and restore times."""
    ev, (t_start, t_trained, t_end, t_stopped) = sampler.events, (times[k] for k in ("start", "trained", "end", "stopped"))
    joined = ev.get("joined", t_trained)
    restored_rss, restored_hwm = restored
    plan = sampler.memory_plan or {}
    planned = plan.get("planned_peak_bytes")
    # Every phase's peak against the plan's, measured from outside the process (VmRSS, VmHWM).
    peaks = [sampler.peak(t_start, t_trained), sampler.peak(t_end, t_stopped), restored_hwm]
    return {
        "memory_plan": plan,
        "within_plan": None if planned is None else max(peaks) <= planned,
        "peak_over_plan": None if planned is None else max(peaks) / planned,
        "params": params,
        "rss_gib": {
            "start": sampler.at(t_start) / GIB,
            "registered": sampler.at(ev.get("registered", t_start) + 0.05) / GIB,
            "all_joined": sampler.at(joined + 0.05) / GIB,
            "peak_training": sampler.peak(t_start, t_trained) / GIB,
            "end_of_training": sampler.at(t_end) / GIB,
            "peak_checkpoint": sampler.peak(t_end, t_stopped) / GIB,
            "after_restore": restored_rss / GIB,
            "peak_restore": restored_hwm / GIB,
        },
        # Once every worker has pushed: at a quarter, half, three quarters and the end of the
        # rest of training (flat, or growing?).
        "rss_after_joined_gib": [sampler.at(joined + f * (t_trained - joined)) / GIB for f in (0.25, 0.5, 0.75, 1.0)],
        "bytes_per_param": {
            "all_joined": sampler.at(joined + 0.05) / params,
            "peak_training": sampler.peak(t_start, t_trained) / params,
            "after_restore": restored_rss / params,
        },
        "seconds": {
            "checkpoint_write": log_field(shard.out / shard.log, "checkpoint written", "seconds"),
            "sigterm_to_exit": t_stopped - t_end,
            "restore": log_field(shard.out / f"restore-{shard.log}", "restored checkpoint", "seconds"),
            "restart_to_listening": shard.listen_s,
        },
        "checkpoint_bytes": next(shard.ckpt.glob("ckpt-*.safetensors")).stat().st_size,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", type=Path, default=Path("target/release"))
    ap.add_argument("--ps-bin", type=Path, help="foresight-ps to measure (default: the one in --bin)")
    ap.add_argument("--params", type=int, default=100_000_000)
    ap.add_argument("--shards", type=int, default=1, help="PS processes the model is split over")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20, help="pushes per worker")
    ap.add_argument("--algorithm", default="dc-asgd-a")
    ap.add_argument("--pull-dtype", default="f32", choices=["f32", "bf16", "int8"],
                    help="the type the simulated workers pull the model in (int8: the PS keeps each one's copy)")
    ap.add_argument("--push-dtype", default="f32", choices=["f32", "bf16", "int8"],
                    help="what the simulated workers push their gradients as")
    ap.add_argument("--memory-limit", type=int, help="each PS's --memory-limit in bytes (bounds its push slots)")
    ap.add_argument("--out", type=Path, default=Path("out/real-size"))
    args = ap.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(16)
    shards = [Shard(args, out, i, args.shards) for i in range(args.shards)]
    urls = [s.url for s in shards]
    # Shard 0 last: it is told where the others are.
    procs = [s.start(token, []) for s in shards[1:]]
    procs.insert(0, shards[0].start(token, urls[1:]))
    samplers = [Sampler(p.pid, s.url, token) for p, s in zip(procs, shards)]
    for sm in samplers:
        sm.start()
    time.sleep(0.2)
    times = {"start": time.monotonic()}
    cpu_at_start = [cpu_seconds(p.pid) for p in procs]
    env = {**os.environ, "FORESIGHT_TOKEN": token}
    loadgen = subprocess.run(
        [str(args.bin / "foresight-loadgen"), "--ps", ",".join(urls), "--workers", str(args.workers),
         "--params", str(args.params), "--steps", str(args.steps), "--pull-dtype", args.pull_dtype,
         "--dtype", args.push_dtype],
        env=env, capture_output=True, text=True,
    )
    if loadgen.returncode != 0:
        sys.exit(f"foresight-loadgen failed:\n{loadgen.stdout}\n{loadgen.stderr[-3000:]}")
    times["trained"] = time.monotonic()
    # What the PS processes spent on the whole run (registration, every pull and push): the
    # model updates they applied per CPU-second is a rate per core, which the 2 cores shared
    # with the simulated workers here do not cap the way wall-clock throughput is capped.
    ps_cpu = sum(cpu_seconds(p.pid) - c for p, c in zip(procs, cpu_at_start))
    print(loadgen.stdout, end="")
    time.sleep(0.5)
    times["end"] = time.monotonic()

    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        p.wait(timeout=600)
    times["stopped"] = time.monotonic()
    for sm in samplers:
        sm.stop.set()

    # The restore: new processes on the same directories; each listens once its slice is restored.
    restored = []
    for s in shards:
        ps2 = s.start(token, [], log=f"restore-{s.log}")
        restored.append(rss(ps2.pid))
        ps2.send_signal(signal.SIGKILL)
        ps2.wait()

    grab = lambda pattern: re.search(pattern, loadgen.stdout)  # noqa: E731
    registered_s = float(grab(r"\) in ([\d.]+)s").group(1))
    push = grab(r"push latency p50 ([\d.]+) ms p99 ([\d.]+) ms")
    pull = grab(r"pull latency p50 ([\d.]+) ms p99 ([\d.]+) ms")
    rate = float(grab(r"([\d.]+) pushes/s").group(1))
    busy = int(grab(r"refused busy and retried: (\d+)").group(1))
    per_shard = [
        figures(args, s, sm, times, r, len(range(args.params * i // args.shards, args.params * (i + 1) // args.shards)))
        for i, (s, sm, r) in enumerate(zip(shards, samplers, restored))
    ]
    result = {
        "params": args.params,
        "shards": args.shards,
        "workers": args.workers,
        "algorithm": args.algorithm,
        "pull_dtype": args.pull_dtype,
        "push_dtype": args.push_dtype,
        "steps_per_worker": args.steps,
        "memory_limit": args.memory_limit,
        "seconds": {
            "register": registered_s,
            "pull_p50": float(pull.group(1)) / 1e3,
            "pull_p99": float(pull.group(2)) / 1e3,
            "push_apply_p50": float(push.group(1)) / 1e3,
            "push_apply_p99": float(push.group(2)) / 1e3,
        },
        "pushes_per_second": rate,
        "ps_cpu_seconds": ps_cpu,
        "updates_per_ps_core_second": args.workers * args.steps / ps_cpu,
        "pushes_refused_busy": busy,
        "model_bytes": 4 * args.params,
    }
    if args.shards == 1:
        only = per_shard[0]
        result["seconds"].update(only.pop("seconds"))
        result.update({k: v for k, v in only.items() if k != "params"})
    else:
        result["per_shard"] = per_shard
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
