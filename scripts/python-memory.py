#!/usr/bin/env python3
"""Resident memory of one Python worker (the `foresight` package) at real size, sampled from
outside the process: a ~100M-parameter float32 MLP on the CPU (or, with --device cuda, on a GPU:
then the host memory is the package's pinned buffers and the client's), every-step f32 pushes
and pulls against a release `foresight-ps` on loopback, asgd. Prints the worker's VmRSS after
joining, its median over the training steps and its peak, and bytes per parameter; JSON on the
last line, with the peak of each phase (the join, the first step, the later steps, the finish)
and the median wall time of a step after the first (exchange included).

    python3 scripts/python-memory.py --bin target/release [--steps 12] [--width 3162 --layers 10] [--device cuda]

(after `make build` and `make setup`; docs/benchmarks.md, "A Python worker's memory").
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

WORKER = textwrap.dedent(
    """
    import sys, time, torch, foresight, foresight.torch
    width, layers, steps = map(int, sys.argv[1:4])
    device = torch.device(sys.argv[4])
    foresight.init()
    torch.manual_seed(1)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)]).to(device)
    opt = foresight.torch.Optimizer(model)
    print("joined", sum(p.numel() for p in model.parameters()), flush=True)
    x = torch.randn(4, width, device=device)
    for step in range(steps):
        began = time.perf_counter()
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        print("step", step + 1, time.perf_counter() - began, flush=True)
    foresight.finish()
    print("done", flush=True)
    """
)


def rss(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="target/release", help="where foresight-ps is")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--width", type=int, default=3162)
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--device", default="cpu", help="where the model lives: cpu or cuda")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="python-memory-"))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORESIGHT_")}
    ps_env = dict(env, FORESIGHT_PS_LISTEN=f"127.0.0.1:{port}", FORESIGHT_TOKEN="t", FORESIGHT_WORKERS="1",
                  FORESIGHT_ALGORITHM="asgd", FORESIGHT_LEARNING_RATE="0.01")  # fmt: skip
    ps = subprocess.Popen([str(Path(args.bin) / "foresight-ps")], env=ps_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        script = tmp / "worker.py"
        script.write_text(WORKER)
        worker_env = dict(env, FORESIGHT_PS_URL=f"http://127.0.0.1:{port}", FORESIGHT_WORKER_INDEX="0", FORESIGHT_TOKEN="t")
        w = subprocess.Popen([sys.executable, str(script), str(args.width), str(args.layers), str(args.steps), args.device],
                             env=worker_env, stdout=subprocess.PIPE, text=True)  # fmt: skip
        params, joined, samples, peak, step_s = 0, None, [], 0, []
        peaks: dict[str, int] = {}  # the highest sample in each phase
        os.set_blocking(w.stdout.fileno(), False)
        phase = "start"
        while w.poll() is None:
            for line in iter(w.stdout.readline, ""):
                word = line.split()
                if word and word[0] == "joined":
                    params, phase = int(word[1]), "joined"
                elif word and word[0] == "step" and int(word[1]) >= 2:
                    phase = "training"  # after the first steps' allocations
                    step_s.append(float(word[2]))
                elif word and word[0] == "done":
                    phase = "done"
            r = rss(w.pid)
            if r is not None:
                peak = max(peak, r)
                peaks[phase] = max(peaks.get(phase, 0), r)
                if phase == "joined" and joined is None:
                    joined = r
                if phase == "training":
                    samples.append(r)
            time.sleep(0.05)
        assert w.returncode == 0, f"the worker failed: {w.returncode}"
    finally:
        ps.kill()
        ps.wait()
    steady = statistics.median(samples)
    out = {
        "parameters": params,
        "joined_bytes": joined,
        "training_median_bytes": steady,
        "peak_bytes": peak,
        "training_median_bytes_per_param": round(steady / params, 1),
        "peak_bytes_per_param": round(peak / params, 1),
        "samples": len(samples),
        "device": args.device,
        "step_seconds_median": round(statistics.median(step_s), 3) if step_s else None,
        # start: until the join ended; joined: the first step; training: the steps after it;
        # done: foresight.finish() and the exit.
        "peak_bytes_by_phase": peaks,
    }
    gib = 1 << 30
    print(f"{params:,} parameters: joined {joined / gib:.2f} GiB, training median {steady / gib:.2f} GiB "
          f"({out['training_median_bytes_per_param']} B/param), peak {peak / gib:.2f} GiB ({out['peak_bytes_per_param']} B/param); "
          f"a step {out['step_seconds_median']} s on {args.device}")  # fmt: skip
    print(json.dumps(out))


if __name__ == "__main__":
    main()
