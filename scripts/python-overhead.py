#!/usr/bin/env python3
"""A training step of LeNet-5 on MNIST-5k through the Python package (examples/python/mnist.py)
against the Rust worker (`foresight-worker --model lenet5`), same model, data, batch and PS.

Each run starts a fresh `foresight-ps` (asgd, one worker) and one worker with one torch thread,
for one epoch (125 steps of 32), and times the steps between its first and last progress line
(every 20 steps: pull, forward, backward, push, and the report each 20th step). The two kinds
alternate, so that the machine's load falls on both alike; the ratio is per pair of runs.

    python3 scripts/python-overhead.py [--runs 5] [--bin-dir target/release]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "overhead"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ps(bin_dir: Path, port: int, tmp: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORESIGHT_")}
    env.update(
        FORESIGHT_PS_LISTEN=f"127.0.0.1:{port}",
        FORESIGHT_TOKEN=TOKEN,
        FORESIGHT_WORKERS="1",
        FORESIGHT_ALGORITHM="asgd",
        FORESIGHT_LEARNING_RATE="0.05",
        FORESIGHT_CHECKPOINT_DIR=str(tmp / "ckpt"),
        FORESIGHT_OUTPUT_DIR=str(tmp / "out"),
    )
    ps = subprocess.Popen([str(bin_dir / "foresight-ps")], env=env, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).read()
            return ps
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("foresight-ps did not start")


def seconds_per_step(kind: str, bin_dir: Path, tmp: Path) -> float:
    port = free_port()
    ps = start_ps(bin_dir, port, tmp / kind)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORESIGHT_")}
    env.update(
        FORESIGHT_PS_URL=f"http://127.0.0.1:{port}",
        FORESIGHT_WORKER_INDEX="0",
        FORESIGHT_TOKEN=TOKEN,
        FORESIGHT_DATASET_FORMAT="csv",
        FORESIGHT_DATASET_PATH=str(ROOT / "data/mnist5k"),
        FORESIGHT_HOLDOUT="0.2",
        FORESIGHT_EPOCHS="1",
        FORESIGHT_BATCH_SIZE="32",
        FORESIGHT_SEED="1",
        FORESIGHT_TORCH_THREADS="1",
        FORESIGHT_METRICS_ADDR="",
        FORESIGHT_MODEL="lenet5",
    )
    cmd = [str(bin_dir / "foresight-worker")] if kind == "rust" else [sys.executable, str(ROOT / "examples/python/mnist.py")]
    marks: list[tuple[float, int]] = []
    try:
        worker = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        for line in worker.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") == "progress":
                marks.append((time.monotonic(), event["step"]))
        if worker.wait() != 0:
            raise RuntimeError(f"the {kind} worker failed")
    finally:
        ps.kill()
        ps.wait()
    (t0, s0), (t1, s1) = marks[0], marks[-1]
    return (t1 - t0) / (s1 - s0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--bin-dir", type=Path, default=ROOT / "target/release")
    ap.add_argument("--tmp", type=Path, default=ROOT / "out/python-overhead")
    a = ap.parse_args()
    ratios = []
    print("run  rust ms/step  python ms/step  python/rust")
    for r in range(a.runs):
        order = ["rust", "python"] if r % 2 == 0 else ["python", "rust"]
        t = {kind: seconds_per_step(kind, a.bin_dir, a.tmp / str(r)) for kind in order}
        ratios.append(t["python"] / t["rust"])
        print(f"{r + 1:>3}  {t['rust'] * 1e3:12.2f}  {t['python'] * 1e3:14.2f}  {ratios[-1]:11.3f}", flush=True)
    print(f"median python/rust {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})")


if __name__ == "__main__":
    main()
