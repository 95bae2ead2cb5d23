#!/usr/bin/env python3
"""`make low-comm`: low-communication training (optimizer.localSteps, DiLoCo-style) against
Foresight's every-step dc-asgd-a, with `foresight run` of the Python LeNet-5 example
(examples/python/mnist.py) on MNIST-5k, 4 workers, 12 epochs; rewrites a section of
docs/convergence.md.

Runs, each for every seed, in this order:

- every step: examples/python/mnist.yaml as written (dc-asgd-a, lr 0.05 with step decay; every
  worker pushes its gradient and pulls the model at every step);
- sync, H local steps: examples/python/mnist-diloco.yaml (each worker trains H steps with the
  job's inner AdamW, lr 1e-3; the PS averages a round's pseudo-gradients and takes DiLoCo's outer step,
  Nesterov momentum 0.9 at lr 0.7), H in --sync-h;
- asgd / dc-asgd-a, H local steps: the same workers, each pseudo-gradient applied as it arrives
  (plain, or delay-compensated against the worker's backup) at outer lr --async-lr without
  momentum, H in --async-h.

- sync, H local steps, pseudo-gradients in another wire type: the sync runs again with
  optimizer.gradientDtype set to each of --dtypes (bf16, int8; f32 is the runs above).

Measured per run, from the run's own summary.json: the held-out accuracy of the PS's final model
(`foresight run` evaluates it), the pushes the PS took (every worker's, each one model-sized body)
and the bytes they carried (pushes × the model's bytes in the run's wire type: 4 per parameter in
F32, 2 in BF16, 1 in int8 plus a 4-byte scale per 1,024 values of each tensor; read from the
final model file's header), and the wall time. Pulls are one per push in every mode here
(pullEvery 1, or one per H steps), in F32, so the bytes pulled are pushes × the F32 size.

With --straggler F it runs the straggler study instead, and rewrites its own section: for each
seed, sync, asgd, dc-asgd-a and asgd with Delayed Nesterov (momentum 0.9, momentumDelay 4, lr
--dn-lr) at H = --straggler-h, each once as above and once with worker 3
slowed F× (`foresight run --slow-worker 3=F`: after each step it sleeps (F − 1) × the step's
own work, its pull and push left out), paired by seed in the same invocation. Measured: the final model's accuracy and the wall
time of each, and for the pairs the accuracy difference and the wall-time ratio.

With --time-to-target it runs the time question in real runs, and rewrites its own section: the
built-in LeNet-5 worker (examples/mnist-dcasgd.yaml every step, examples/mnist-diloco.yaml with H =
--straggler-h for sync, asgd and dc-asgd-a as above), each without and with worker 3 slowed
(--straggler, default 3), with `foresight run --snapshot-every K`: the PS writes its model every K
versions and the run evaluates each snapshot on the held-out set, so the run's curve says when the
PS's model first reached --target accuracy (seconds since the run started, to the snapshot: K is
chosen for about 20–30 snapshots a run), beside the final model's accuracy and the wall time.

With --simulate it runs the same question in the simulator instead (`foresight-worker simulate
--local-steps H`: its plain-Rust MLP on MNIST-5k, 4 virtual workers, 12 epochs, the inner AdamW at
lr 1e-3 and the outer rules as above), deterministically and for many seeds (--sim-seeds): every
step, sync, asgd and dc-asgd-a at each H of --sim-h, and asynchronous outer steps with DiLoCo's
Nesterov momentum (0.9) at every update (lr 0.7/4 and --dn-lr/4) and delayed (--momentum-delay 4:
Delayed Nesterov, at lr 0.7 and at --dn-lr), with the workers taking turns
(round-robin:4) and with worker 3 three times slower (straggler:4:3, the staleness following
from the timing); the held-out error of the final model, and the time (in batch steps of a worker
at full speed, compute only) until the model first reaches --sim-target accuracy and until the
budget is spent; rewrites its own section. The binary is --bin's foresight-worker.

Usage: scripts/low-communication.py [--seeds 1,2] [--sync-h 10,50,200] [--async-h 10,50]
                                    [--async-lr 0.5] [--dtypes bf16,int8] [--bin target/release]
                                    [--out out/low-comm] [--doc docs/convergence.md]
       scripts/low-communication.py --straggler 3 [--straggler-h 10] [--seeds 1,2] [...]
       scripts/low-communication.py --time-to-target [--straggler 3] [--target 0.95] [--seeds 1,2] [...]
       scripts/low-communication.py --simulate [--sim-h 10,50] [--sim-seeds 10] [--bin target/release]
       scripts/low-communication.py --adaptive [--straggler 3] [--target 0.96] [--seeds 1,2] [--link-mbit 100]
       scripts/low-communication.py --lm [--lm-h 10,50] [--lm-epochs 2] [--seeds 1] [--link-mbit 100 [--link-rtt-ms 50]]
       scripts/low-communication.py --lm --straggler 3 [--lm-h 50] [--async-lr 0.5] [--dn-lrs 0.25,0.5,0.7]
       scripts/low-communication.py --pulls [--straggler-h 10] [--target 0.96] [--seeds 1,2] [--link-mbit 10]

With --adaptive it compares fixed and adaptive local steps (optimizer.adaptiveLocalSteps: the PS
chooses each worker's H from its measured step and exchange times, starting at --straggler-h,
within [--adaptive-min, --adaptive-max], exchanges at most a tenth of a round) with the built-in
LeNet-5 worker, sync and dc-asgd-a, without and with worker 3 slowed: time to --target from the
PS's snapshots as --time-to-target does, the final model's accuracy, the bytes the PS received and
sent per training step, and the H each worker was told last; rewrites its own section (another
one with --link-mbit).

With --lm it runs the transformer language model instead (examples/python/charlm.py, byte-level,
470,784 parameters, 4 workers, --lm-epochs epochs): every step under dc-asgd-a as
examples/python/charlm.yaml has it, and DiLoCo (sync, Nesterov 0.9 at outer lr 0.7, the job's
inner AdamW at 1e-3) at each H of --lm-h, pushing F32, int8, and int8 with the model pulled in
bf16 and in int8 (optimizer.pullDtype); the final model's held-out loss (nats per byte) and accuracy, the bytes
pushed, and the bytes the PS received and sent (its own counters), against every step's; rewrites
its own section. With --link-mbit (and --link-rtt-ms) every run is on that link (root), F32 and
int8-both-ways only, into a section of its own. With --straggler F as well, worker 3 is slowed F×
and DiLoCo's sync outer step at each H is compared with the asynchronous ones (asgd and dc-asgd-a
without momentum at --async-lr, asgd with Delayed Nesterov at each lr of --dn-lrs), paired by
seed, into a section of its own.

With --pulls it runs the built-in LeNet-5 under DiLoCo's sync outer step at H = --straggler-h with
int8 pushes, the model pulled in F32, bf16 and int8 (optimizer.pullDtype): time to --target from
the PS's snapshots, the final model's accuracy and the bytes the PS counted; over --link-mbit
when given; rewrites its own section.
"""

import argparse
import datetime as dt
import json
import os
import platform
import re
import shutil
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

from slowlink import inside, slow_link

ROOT = Path(__file__).resolve().parent.parent
START, END = "<!-- generated by scripts/low-communication.py: start -->", "<!-- generated: end -->"
STRAGGLER_START = "<!-- generated by scripts/low-communication.py --straggler: start -->"
SIMULATE_START = "<!-- generated by scripts/low-communication.py --simulate: start -->"
TIME_START = "<!-- generated by scripts/low-communication.py --time-to-target: start -->"
LINK_START = "<!-- generated by scripts/low-communication.py --time-to-target --link-mbit: start -->"
ADAPTIVE_START = "<!-- generated by scripts/low-communication.py --adaptive: start -->"
ADAPTIVE_LINK_START = "<!-- generated by scripts/low-communication.py --adaptive --link-mbit: start -->"
LM_START = "<!-- generated by scripts/low-communication.py --lm: start -->"
LM_STRAGGLER_START = "<!-- generated by scripts/low-communication.py --lm --straggler: start -->"
LM_LINK_START = "<!-- generated by scripts/low-communication.py --lm --link-mbit: start -->"
PULLS_START = "<!-- generated by scripts/low-communication.py --pulls: start -->"
SLOW_WORKER = 3
DELAYED = "asgd + Delayed Nesterov"
STRAGGLER_RULES = ("sync", "asgd", "dc-asgd-a", DELAYED)


INT8_CHUNK = 1024  # ps-service/src/wire/int8.rs: values per scale


def model_bytes(path: Path, dtype: str = "f32") -> int:
    """The bytes of the model's tensors in `dtype` on the wire, from a safetensors file's header."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    numels = [(v["data_offsets"][1] - v["data_offsets"][0]) // 4 for k, v in header.items() if k != "__metadata__"]
    if dtype == "int8":
        return sum(k + 4 * -(-k // INT8_CHUNK) for k in numels)
    return sum(numels) * {"f32": 4, "bf16": 2}[dtype]


def spec(base: str, seed: int, algorithm: str | None = None, lr: float | None = None, h: int | None = None,
         momentum: bool = True, dtype: str = "f32", pulls: str = "f32") -> str:
    """The example's YAML with the run's seed, rule, outer learning rate, local steps and wire types
    (pushed and pulled)."""
    text = (ROOT / base).read_text().replace("seed: 1", f"seed: {seed}")
    if dtype != "f32":
        text = text.replace("  optimizer:\n", f"  optimizer:\n    gradientDtype: {dtype}\n")
    if pulls != "f32":
        text = text.replace("  optimizer:\n", f"  optimizer:\n    pullDtype: {pulls}\n")
    if algorithm:
        text = text.replace("algorithm: sync", f"algorithm: {algorithm}")
    if lr is not None:
        # training.learningRate (indented 4), not innerOptimizer's (indented 6).
        text = re.sub(r"^    learningRate: [0-9.]+$", f"    learningRate: {lr}", text, flags=re.M)
    if h is not None:
        text = text.replace("localSteps: 10", f"localSteps: {h}")
    if not momentum:
        text = text.replace("    momentum: 0.9\n", "").replace("    nesterov: true\n", "")
    return text


def run(args, name: str, text: str, dtype: str = "f32", slow: float | None = None,
        snapshot_every: int | None = None) -> dict:
    out = args.out / name
    shutil.rmtree(out, ignore_errors=True)  # a rerun starts afresh, not from the last run's checkpoints
    out.mkdir(parents=True)
    job = out / "job.yaml"
    job.write_text(text)
    started = time.monotonic()
    env = {**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}"}
    slowed = ["--slow-worker", f"{SLOW_WORKER}={slow}"] if slow else []
    # In the slow link's network namespace, where loopback is the link (`slow_link`).
    netns = inside(args.netns) if getattr(args, "netns", None) else []
    snapshots = ["--snapshot-every", str(snapshot_every)] if snapshot_every else []
    done = subprocess.run(
        [*netns, str(args.bin / "foresight"), "run", str(job), "--out", str(out / "run"), "--no-progress", *slowed,
         *snapshots],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800,
    )
    if done.returncode != 0:
        sys.exit(f"{name}: foresight run failed:\n{done.stderr[-3000:]}")
    summary = json.loads((out / "run" / "summary.json").read_text())
    pushes = summary["staleness"]["count"]
    size = model_bytes(out / "run" / "model-final.safetensors", dtype)
    row = {
        "name": name,
        "accuracy": summary["accuracy"],
        "loss": summary.get("loss"),
        "pushes": pushes,
        "bytes": pushes * size,
        # What the PS itself counted: every request body (the pushes, the model's registration
        # in F32, progress reports).
        "received": summary.get("ps_received_bytes"),
        "sent": summary.get("ps_sent_bytes"),
        "updates": summary["updates"],
        "wall": time.monotonic() - started,
        "curve": [(p["seconds"], p["accuracy"]) for p in summary.get("curve", [])],
    }
    print(json.dumps({k: v for k, v in row.items() if k != "curve"}), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--sync-h", default="10,50,200")
    ap.add_argument("--async-h", default="10,50")
    ap.add_argument("--async-lr", type=float, default=0.5)
    ap.add_argument("--dtypes", default="bf16,int8", help="wire types the sync runs are repeated in")
    ap.add_argument("--bin", type=Path, default=ROOT / "target" / "release")
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "low-comm")
    ap.add_argument("--doc", type=Path, default=ROOT / "docs" / "convergence.md")
    ap.add_argument("--straggler", type=float, default=None,
                    help="run the straggler study instead: worker 3 slowed this many times")
    ap.add_argument("--straggler-h", type=int, default=10)
    ap.add_argument("--time-to-target", action="store_true",
                    help="run the real time-to-target study instead (the built-in worker, with snapshots)")
    ap.add_argument("--target", type=float, default=0.95, help="held-out accuracy --time-to-target measures")
    ap.add_argument("--link-mbit", type=float, default=None,
                    help="--time-to-target over a link of this many Mbit/s (root: scripts/slowlink.py)")
    ap.add_argument("--link-rtt-ms", type=float, default=None,
                    help="with --link-mbit: a round trip of this many ms on the link as well (scripts/slowlink.py's relay)")
    ap.add_argument("--simulate", action="store_true", help="run the simulator study instead")
    ap.add_argument("--adaptive", action="store_true", help="run the adaptive local steps study instead")
    ap.add_argument("--pulls", action="store_true",
                    help="run the pull types study instead: sync H with int8 pushes, the model pulled in f32, bf16, int8")
    ap.add_argument("--adaptive-min", type=int, default=5)
    ap.add_argument("--adaptive-max", type=int, default=200)
    ap.add_argument("--lm", action="store_true", help="run the transformer language model study instead")
    ap.add_argument("--lm-h", default="10,50")
    ap.add_argument("--lm-epochs", type=int, default=2)
    ap.add_argument("--sim-h", default="10,50")
    ap.add_argument("--sim-seeds", type=int, default=10)
    ap.add_argument("--dn-lr", type=float, default=0.25, help="outer lr of the simulator's Delayed Nesterov rows")
    ap.add_argument("--dn-lrs", default="0.25",
                    help="with --lm --straggler: the outer lrs of the Delayed Nesterov rows, comma-separated")
    ap.add_argument("--sim-target", type=float, default=0.9, help="held-out accuracy the time-to-target columns use")
    args = ap.parse_args()
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    started, at = time.monotonic(), dt.datetime.now(dt.timezone.utc)
    if args.time_to_target or args.adaptive or args.pulls:
        study = adaptive_study if args.adaptive else pulls_study if args.pulls else time_to_target_study
        if args.link_mbit:
            with slow_link(args.link_mbit, args.link_rtt_ms) as args.netns:
                study(args, ints(args.seeds), at, started)
        else:
            study(args, ints(args.seeds), at, started)
        return
    if args.lm and args.straggler:
        lm_straggler_study(args, ints(args.seeds), ints(args.lm_h), at, started)
        return
    if args.lm:
        if args.link_mbit:
            with slow_link(args.link_mbit, args.link_rtt_ms) as args.netns:
                lm_study(args, ints(args.seeds), ints(args.lm_h), at, started)
        else:
            lm_study(args, ints(args.seeds), ints(args.lm_h), at, started)
        return
    if args.straggler:
        straggler_study(args, ints(args.seeds), at, started)
        return
    if args.simulate:
        simulated_study(args, ints(args.sim_h), at, started)
        return
    rows = []
    for seed in ints(args.seeds):
        plan = [("every step, dc-asgd-a", None, "f32", spec("examples/python/mnist.yaml", seed))]
        plan += [
            (f"sync, H={h}", h, "f32", spec("examples/python/mnist-diloco.yaml", seed, h=h)) for h in ints(args.sync_h)
        ]
        for rule in ("asgd", "dc-asgd-a"):
            plan += [
                (f"{rule}, H={h}", h, "f32",
                 spec("examples/python/mnist-diloco.yaml", seed, rule, args.async_lr, h, False))
                for h in ints(args.async_h)
            ]
        for dtype in [d for d in args.dtypes.split(",") if d]:
            plan += [
                (f"sync, H={h}, {dtype}", h, dtype, spec("examples/python/mnist-diloco.yaml", seed, h=h, dtype=dtype))
                for h in ints(args.sync_h)
            ]
        for label, h, dtype, text in plan:
            name = f"{label.replace(', ', '-').replace('=', '').replace(' ', '-')}-seed{seed}"
            rows.append({"label": label, "seed": seed, "h": h, **run(args, name, text, dtype)})
    write_doc(args, rows, at, time.monotonic() - started)


def straggler_study(args, seeds: list[int], at: dt.datetime, started: float) -> None:
    """Sync, asgd, dc-asgd-a and asgd with Delayed Nesterov at H = --straggler-h, without and with
    worker 3 slowed, per seed."""
    h, factor = args.straggler_h, args.straggler
    rows = []
    for seed in seeds:
        for rule in STRAGGLER_RULES:
            if rule == "sync":
                text = spec("examples/python/mnist-diloco.yaml", seed, h=h)
            elif rule == DELAYED:
                # DiLoCo's Nesterov momentum, delayed over the 4 workers' updates, at --dn-lr.
                text = spec("examples/python/mnist-diloco.yaml", seed, "asgd", args.dn_lr, h).replace(
                    "    nesterov: true\n", "    nesterov: true\n    momentumDelay: 4\n")
            else:
                text = spec("examples/python/mnist-diloco.yaml", seed, rule, args.async_lr, h, False)
            for slow in (None, factor):
                name = f"straggler-{rule.replace(' ', '')}-H{h}-{'slow' if slow else 'even'}-seed{seed}"
                rows.append({"rule": rule, "seed": seed, "slow": slow, **run(args, name, text, slow=slow)})
    wall = time.monotonic() - started
    pair = {(r["rule"], r["seed"], r["slow"] is not None): r for r in rows}
    lines = [
        f"Command: `scripts/low-communication.py --straggler {factor:g} --straggler-h {h} --seeds {args.seeds} "
        f"--async-lr {args.async_lr} --dn-lr {args.dn_lr:g}{bin_arg(args.bin)}` — {wall / 60:.1f} min wall, {at:%Y-%m-%d %H:%M} UTC, "
        f"{platform.machine()}, {os.cpu_count()} cores.",
        "",
        f"| rule, H = {h} | seed | accuracy, no straggler | accuracy, worker {SLOW_WORKER} slowed {factor:g}× | "
        "difference (pp) | wall s, no straggler | wall s, slowed | wall ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for seed in seeds:
        for rule in STRAGGLER_RULES:
            even, slow = pair[(rule, seed, False)], pair[(rule, seed, True)]
            lines.append(
                f"| {rule} | {seed} | {even['accuracy']:.3f} | {slow['accuracy']:.3f} | "
                f"{100 * (slow['accuracy'] - even['accuracy']):+.1f} | {even['wall']:.1f} | {slow['wall']:.1f} | "
                f"{slow['wall'] / even['wall']:.2f} |"
            )
    replace_section(args.doc, STRAGGLER_START, "\n".join(lines))


def time_to_target_study(args, seeds: list[int], at: dt.datetime, started: float) -> None:
    """The built-in LeNet-5 worker: every step and H local steps, without and with a straggler,
    each run's PS model evaluated at its snapshots."""
    h, factor, target = args.straggler_h, args.straggler or 3.0, args.target
    # (local steps, rule, job, snapshot every K versions): about 1,500 versions every step, 150
    # with H = 10 asynchronous, 37 rounds in sync.
    configs = [
        ("every step", "dc-asgd-a", lambda s: spec("examples/mnist-dcasgd.yaml", s), 50),
        (f"H = {h}", "sync", lambda s: spec("examples/mnist-diloco.yaml", s, h=h), max(1, 20 // h)),
    ] + [
        (f"H = {h}", rule, lambda s, rule=rule: spec("examples/mnist-diloco.yaml", s, rule, args.async_lr, h, False),
         max(1, 80 // h))
        for rule in ("asgd", "dc-asgd-a")
    ]
    rows = []
    for seed in seeds:
        for when, rule, text, every in configs:
            for slow in (None, factor):
                name = f"time-{rule}-{when.replace(' = ', '')}-{'slow' if slow else 'even'}-seed{seed}"
                name = name.replace(" ", "-")
                r = run(args, name, text(seed), slow=slow, snapshot_every=every)
                reached = next((t for t, acc in r["curve"] if acc >= target), None)
                rows.append({"when": when, "rule": rule, "seed": seed, "slow": slow, "reached": reached, **r})
    wall = time.monotonic() - started
    pair = {(r["when"], r["rule"], r["seed"], r["slow"] is not None): r for r in rows}
    secs = lambda t: "not reached" if t is None else f"{t:.1f}"  # noqa: E731
    lines = [
        f"Command: `scripts/low-communication.py --time-to-target --target {target} --straggler {factor:g} "
        f"--straggler-h {h} --seeds {args.seeds} --async-lr {args.async_lr}{link_arg(args)}{bin_arg(args.bin)}` — "
        f"{wall / 60:.1f} min wall, {at:%Y-%m-%d %H:%M} UTC, {platform.machine()}, {os.cpu_count()} cores.",
        "",
        f"Seconds from the start of `foresight run` until the PS's model first reached {100 * target:.0f} % "
        "held-out accuracy (at the first snapshot that did), the final model's accuracy, and the run's wall time; "
        f"without a straggler and with worker {SLOW_WORKER} slowed {factor:g}×, paired in the same invocation.",
        "",
        f"| local steps | rule | seed | to {100 * target:.0f} %, no straggler | to {100 * target:.0f} %, slowed | "
        "final accuracy, no straggler / slowed | wall s, no straggler / slowed |",
        "|---|---|---|---|---|---|---|",
    ]
    for seed in seeds:
        for when, rule, _, _ in configs:
            even, slow = pair[(when, rule, seed, False)], pair[(when, rule, seed, True)]
            lines.append(
                f"| {when} | {rule} | {seed} | {secs(even['reached'])} | {secs(slow['reached'])} | "
                f"{even['accuracy']:.3f} / {slow['accuracy']:.3f} | {even['wall']:.1f} / {slow['wall']:.1f} |"
            )

    def mean_reached(when, rule, slowed):
        of = [pair[(when, rule, s, slowed)]["reached"] for s in seeds]
        hit = [t for t in of if t is not None]
        return f"{statistics.mean(hit):.1f} ({len(hit)} of {len(of)})" if hit else f"— (0 of {len(of)})"

    lines += [
        "",
        f"Mean over the seeds that reached {100 * target:.0f} % (how many did):",
        "",
        f"| local steps | rule | to {100 * target:.0f} %, no straggler | to {100 * target:.0f} %, slowed |",
        "|---|---|---|---|",
    ]
    lines += [f"| {when} | {rule} | {mean_reached(when, rule, False)} | {mean_reached(when, rule, True)} |"
              for when, rule, _, _ in configs]
    replace_section(args.doc, link_section(args, LINK_START) if args.link_mbit else TIME_START, "\n".join(lines))


def pulls_study(args, seeds: list[int], at: dt.datetime, started: float) -> None:
    """The built-in LeNet-5 worker under DiLoCo's sync outer step at H = --straggler-h, pushing
    int8, with the model pulled in F32, bf16 and int8: time to the target from the PS's snapshots,
    the final model, and the bytes the PS counted, per run (over --link-mbit when given)."""
    h, target = args.straggler_h, args.target
    configs = [(p, lambda s, p=p: spec("examples/mnist-diloco.yaml", s, h=h, dtype="int8", pulls=p))
               for p in ("f32", "bf16", "int8")]
    rows = []
    for seed in seeds:
        for pulls, text in configs:
            r = run(args, f"pulls-{pulls}-H{h}-seed{seed}", text(seed), snapshot_every=max(1, 20 // h))
            r["reached"] = next((t for t, acc in r["curve"] if acc >= target), None)
            rows.append({"pulls": pulls, "seed": seed, **r})
    wall = time.monotonic() - started
    secs = lambda t: "not reached" if t is None else f"{t:.1f}"  # noqa: E731
    moved = lambda r: (r["received"] or 0) + (r["sent"] or 0)  # noqa: E731
    base = {r["seed"]: r for r in rows if r["pulls"] == "f32"}
    lines = [
        f"Command: `scripts/low-communication.py --pulls --target {target} --straggler-h {h} --seeds {args.seeds}"
        f"{link_arg(args)}{bin_arg(args.bin)}` — {wall / 60:.1f} min wall, {at:%Y-%m-%d %H:%M} UTC, "
        f"{platform.machine()}, {os.cpu_count()} cores.",
        "",
        f"| model pulled in | seed | to {100 * target:.0f} % (s) | final model accuracy | MB moved (PS measured) "
        "| against F32 pulls | MB sent by the PS (pulls) | wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        b = base[r["seed"]]
        lines.append(
            f"| {r['pulls']} | {r['seed']} | {secs(r['reached'])} | {r['accuracy']:.3f} | {moved(r) / 1e6:.2f} | "
            f"{moved(r) / moved(b):.2f} | {(r['sent'] or 0) / 1e6:.2f} | {r['wall']:.1f} |"
        )
    replace_section(args.doc, link_section(args, PULLS_START), "\n".join(lines))


def adaptive_study(args, seeds: list[int], at: dt.datetime, started: float) -> None:
    """Fixed against adaptive local steps, sync and dc-asgd-a, without and with a straggler."""
    h, factor, target = args.straggler_h, args.straggler or 3.0, args.target
    lo, hi = args.adaptive_min, args.adaptive_max

    def adaptive(text: str) -> str:
        return text.replace(f"    localSteps: {h}\n", f"    localSteps: {h}\n    adaptiveLocalSteps: {{min: {lo}, max: {hi}}}\n")

    base = {
        "sync": lambda s: spec("examples/mnist-diloco.yaml", s, h=h),
        "dc-asgd-a": lambda s: spec("examples/mnist-diloco.yaml", s, "dc-asgd-a", args.async_lr, h, False),
    }
    configs = [(f"H = {h}", rule, base[rule]) for rule in base] + [
        (f"adaptive from {h}", rule, lambda s, f=base[rule]: adaptive(f(s))) for rule in base
    ]
    rows = []
    for seed in seeds:
        for when, rule, text in configs:
            for slow in (None, factor):
                name = f"adaptive-{rule}-{when.replace(' ', '')}-{'slow' if slow else 'even'}-seed{seed}"
                every = 2 if rule == "sync" else 8
                r = run(args, name, text(seed), slow=slow, snapshot_every=every)
                summary = json.loads((args.out / name / "run" / "summary.json").read_text())
                steps = summary.get("trained_steps") or 0
                moved = (summary.get("ps_received_bytes") or 0) + (summary.get("ps_sent_bytes") or 0)
                # Fixed: the configured H (the gauge ends at the last, shorter push's count).
                told = summary.get("local_steps", {}) if when.startswith("adaptive") else {}
                rows.append({
                    "when": when, "rule": rule, "seed": seed, "slow": slow, **r,
                    "reached": next((t for t, acc in r["curve"] if acc >= target), None),
                    "per_step": moved / steps if steps else None,
                    "told": "/".join(str(told[k]) for k in sorted(told, key=int)) or f"{h} (fixed)",
                })
    wall = time.monotonic() - started
    secs = lambda t: "not reached" if t is None else f"{t:.1f}"  # noqa: E731
    lines = [
        f"Command: `scripts/low-communication.py --adaptive --target {target} --straggler {factor:g} "
        f"--straggler-h {h} --adaptive-min {lo} --adaptive-max {hi} --seeds {args.seeds} --async-lr {args.async_lr}"
        f"{link_arg(args)}{bin_arg(args.bin)}` — {wall / 60:.1f} min wall, {at:%Y-%m-%d %H:%M} UTC, "
        f"{platform.machine()}, {os.cpu_count()} cores.",
        "",
        f"Seconds until the PS's model first reached {100 * target:.0f} % held-out accuracy (at a snapshot), the "
        "final model's accuracy, the run's wall time, the bytes the PS received and sent per training step "
        f"(every worker's steps), and the steps per exchange the PS told each worker last (workers 0/1/2/3); worker "
        f"{SLOW_WORKER} slowed {factor:g}× in the \"slowed\" rows.",
        "",
        f"| local steps | rule | seed | worker {SLOW_WORKER} | to {100 * target:.0f} % | final accuracy | wall s | "
        "kB per step | steps per exchange at the end |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        per_step = "—" if r["per_step"] is None else f"{r['per_step'] / 1e3:.1f}"
        lines.append(
            f"| {r['when']} | {r['rule']} | {r['seed']} | {'slowed' if r['slow'] else 'as the others'} | "
            f"{secs(r['reached'])} | {r['accuracy']:.3f} | {r['wall']:.1f} | {per_step} | {r['told']} |"
        )
    start = link_section(args, ADAPTIVE_LINK_START) if args.link_mbit else ADAPTIVE_START
    if hi != 200:  # a study of another bound keeps a section of its own
        start = start.replace(": start", f" --adaptive-max {hi}: start")
    replace_section(args.doc, start, "\n".join(lines))


def lm_spec(seed: int, epochs: int, h: int | None = None, dtype: str = "f32", pulls: str = "f32",
            rule: str = "sync", lr: float = 0.7, momentum: bool = True, momentum_delay: int | None = None) -> str:
    """examples/python/charlm.yaml with the run's seed and epochs; with `h`, an outer step (DiLoCo's:
    sync, Nesterov 0.9 at lr 0.7, unless told otherwise) over h local steps of AdamW,
    pseudo-gradients in `dtype`, the model pulled in `pulls`."""
    text = (ROOT / "examples/python/charlm.yaml").read_text()
    text = text.replace("seed: 1", f"seed: {seed}").replace("epochs: 3", f"epochs: {epochs}")
    if h is None:
        return text
    diloco = (
        f"  optimizer:\n    algorithm: {rule}\n"
        + ("    momentum: 0.9\n    nesterov: true\n" if momentum else "")
        + (f"    momentumDelay: {momentum_delay}\n" if momentum_delay else "")
        + f"    localSteps: {h}\n    innerOptimizer: {{algorithm: adamw, learningRate: 0.001}}\n"
        + (f"    gradientDtype: {dtype}\n" if dtype != "f32" else "")
        + (f"    pullDtype: {pulls}\n" if pulls != "f32" else "")
    )
    text = text.replace("  optimizer:\n    algorithm: dc-asgd-a\n", diloco)
    return re.sub(r"^    learningRate: [0-9.]+$", f"    learningRate: {lr:g}", text, flags=re.M)


def lm_straggler_study(args, seeds: list[int], hs: list[int], at: dt.datetime, started: float) -> None:
    """The transformer language model with worker 3 slowed: DiLoCo's sync outer step against the
    asynchronous ones (asgd and dc-asgd-a without momentum at --async-lr, asgd with Delayed
    Nesterov at each lr of --dn-lrs), at each H of --lm-h, paired by seed."""
    factor = args.straggler
    rules = [
        ("sync", {}),
        ("asgd", {"rule": "asgd", "lr": args.async_lr, "momentum": False}),
        ("dc-asgd-a", {"rule": "dc-asgd-a", "lr": args.async_lr, "momentum": False}),
    ] + [
        (f"{DELAYED}, lr {lr:g}", {"rule": "asgd", "lr": lr, "momentum_delay": 4})
        for lr in [float(x) for x in args.dn_lrs.split(",") if x]
    ]
    rows = []
    for seed in seeds:
        for h in hs:
            for label, how in rules:
                name = f"lm-straggler-{label.replace(' ', '')}-H{h}-seed{seed}"
                r = run(args, name, lm_spec(seed, args.lm_epochs, h, **how), slow=factor)
                rows.append({"rule": label, "h": h, "seed": seed, **r})
    wall = time.monotonic() - started
    sync = {(r["h"], r["seed"]): r for r in rows if r["rule"] == "sync"}
    lines = [
        f"Command: `scripts/low-communication.py --lm --straggler {factor:g} --lm-h {args.lm_h} "
        f"--lm-epochs {args.lm_epochs} --seeds {args.seeds} --async-lr {args.async_lr:g} --dn-lrs {args.dn_lrs}"
        f"{bin_arg(args.bin)}` — {wall / 60:.1f} min wall, {at:%Y-%m-%d %H:%M} UTC, {platform.machine()}, "
        f"{os.cpu_count()} cores.",
        "",
        f"| outer step | H | seed | final model held-out loss (nats/byte), worker {SLOW_WORKER} slowed {factor:g}× "
        "| against sync | next-byte accuracy | updates | wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        s = sync[(r["h"], r["seed"])]
        against = "—" if r is s else f"{100 * (r['loss'] / s['loss'] - 1):+.1f} %"
        lines.append(f"| {r['rule']} | {r['h']} | {r['seed']} | {r['loss']:.3f} | {against} | {r['accuracy']:.3f} | "
                     f"{r['updates']} | {r['wall']:.0f} |")
    replace_section(args.doc, LM_STRAGGLER_START, "\n".join(lines))


def lm_study(args, seeds: list[int], hs: list[int], at: dt.datetime, started: float) -> None:
    """The transformer language model: every step against DiLoCo at each H, pushes in F32 and
    int8, and int8 with the model pulled in bf16 and in int8; over a slow link (`--link-mbit`),
    F32 both ways and int8 both ways only."""
    wires = (("f32", "f32", ""), ("int8", "f32", ", int8"), ("int8", "bf16", ", int8, bf16 pulls"),
             ("int8", "int8", ", int8, int8 pulls"))
    if args.link_mbit:
        wires = (wires[0], wires[3])
    plan = [("every step, dc-asgd-a", None, "f32", "f32")]
    plan += [(f"sync, H={h}{label}", h, d, p) for h in hs for d, p, label in wires]
    rows = []
    for seed in seeds:
        for label, h, dtype, pulls in plan:
            name = f"lm-{label.replace(', ', '-').replace('=', '').replace(' ', '-')}-seed{seed}"
            r = run(args, name, lm_spec(seed, args.lm_epochs, h, dtype, pulls), dtype)
            rows.append({"label": label, "seed": seed, **r})
    wall = time.monotonic() - started
    base = {r["seed"]: r for r in rows if r["label"].startswith("every step")}
    lines = [
        f"Command: `scripts/low-communication.py --lm --lm-h {args.lm_h} --lm-epochs {args.lm_epochs} "
        f"--seeds {args.seeds}{link_arg(args)}{bin_arg(args.bin)}` — {wall / 60:.1f} min wall, {at:%Y-%m-%d %H:%M} UTC, "
        f"{platform.machine()}, {os.cpu_count()} cores.",
        "",
        "| run | seed | final model held-out loss (nats/byte) | against every step | next-byte accuracy | "
        "pushes | MB pushed | bytes pushed against every step | MB moved (PS measured, in + out) "
        "| bytes moved against every step | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    moved = lambda r: (r["received"] or 0) + (r["sent"] or 0)  # noqa: E731
    for r in rows:
        b = base[r["seed"]]
        lines.append(
            f"| {r['label']} | {r['seed']} | {r['loss']:.3f} | {100 * (r['loss'] / b['loss'] - 1):+.1f} % | "
            f"{r['accuracy']:.3f} | {r['pushes']} | {r['bytes'] / 1e6:.1f} | "
            f"{b['bytes'] / r['bytes']:.0f}× fewer | {moved(r) / 1e6:.1f} | {moved(b) / moved(r):.0f}× fewer | "
            f"{r['wall']:.0f} |"
            if r is not b else
            f"| {r['label']} | {r['seed']} | {r['loss']:.3f} | — | {r['accuracy']:.3f} | {r['pushes']} | "
            f"{r['bytes'] / 1e6:.1f} | 1 | {moved(r) / 1e6:.1f} | 1 | {r['wall']:.0f} |"
        )
    replace_section(args.doc, link_section(args, LM_LINK_START) if args.link_mbit else LM_START, "\n".join(lines))


SIM_DELAYS = {"round-robin:4": "workers take turns", "straggler:4:3": "worker 3 slowed 3×"}
SIM_WORKERS = 4


def simulate(args, name: str, flags: list[str]) -> list[dict]:
    """One `foresight-worker simulate` call over both delays and every seed: its JSON lines."""
    seeds = ",".join(str(s) for s in range(1, args.sim_seeds + 1))
    cmd = [str(args.bin / "foresight-worker"), "simulate", "--epochs", "12", "--batch-size", "32", "--seeds", seeds,
           "--evals", "60", "--jobs", str(os.cpu_count() or 1), *flags]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr}")
    (args.out / f"simulate-{name}.jsonl").write_text(p.stdout)
    runs = [json.loads(line) for line in p.stdout.splitlines()]
    print(f"simulate {name}: {len(runs)} runs", flush=True)
    return runs


def outer(run: dict) -> str:
    """The outer step's learning rate and momentum, from a simulator run's own record of them."""
    lr, delay = f"{run['learning_rate']:.3g}", run["momentum_delay"]
    if not run["momentum"]:
        return f"{lr}, none"
    kind = "Nesterov" if run["nesterov"] else "heavy ball"
    return f"{lr}, {kind} {run['momentum']:.2g}" + (f" once per {delay} updates" if delay > 1 else "")


def simulated_study(args, hs: list[int], at: dt.datetime, started: float) -> None:
    """Every step, sync, asgd and dc-asgd-a at each H, both delays, --sim-seeds seeds."""
    args.out.mkdir(parents=True, exist_ok=True)
    both = ["--delays", ",".join(SIM_DELAYS)]
    table = {("every step", rule): simulate(args, f"every-{rule}", ["--algorithms", rule, *both])
             for rule in ("asgd", "dc-asgd-a")}
    for h in hs:
        local = ["--local-steps", str(h), "--inner-optimizer", "adamw", "--inner-lr", "1e-3"]
        table[(f"H = {h}", "sync")] = simulate(args, f"sync-H{h}", [
            "--algorithms", "sync", *both, "--learning-rate", "0.7", "--momentum", "0.9", "--nesterov", *local])
        for rule in ("asgd", "dc-asgd-a"):
            table[(f"H = {h}", rule)] = simulate(args, f"{rule}-H{h}", [
                "--algorithms", rule, *both, "--learning-rate", str(args.async_lr), *local])
        # DiLoCo's outer momentum on an asynchronous step: at every update, at the lrs that give
        # each update the share it has under the delay (lr / 4), and delayed (Liu et al. 2024).
        nesterov = ["--momentum", "0.9", "--nesterov", *both, *local]
        for lr in (0.7 / SIM_WORKERS, args.dn_lr / SIM_WORKERS):
            table[(f"H = {h}", f"asgd + Nesterov, lr {lr:g}")] = simulate(args, f"asgd-nesterov-lr{lr:g}-H{h}", [
                "--algorithms", "asgd", "--learning-rate", str(lr), *nesterov])
        # Delayed: at sync's outer lr, and at --dn-lr (a lower one, as asynchronous steps take).
        delayed = ["--momentum-delay", str(SIM_WORKERS), *nesterov]
        for rule, lr in (("asgd", 0.7), ("asgd", args.dn_lr), ("dc-asgd-a", args.dn_lr)):
            table[(f"H = {h}", f"{rule} + Delayed Nesterov, lr {lr:g}")] = simulate(
                args, f"{rule}-delayed-lr{lr:g}-H{h}", ["--algorithms", rule, "--learning-rate", str(lr), *delayed])
    # The model pulled in bf16 and in int8 (optimizer.pullDtype), for sync and asgd: a table of its own.
    pulled = {}
    for h in hs:
        local = ["--local-steps", str(h), "--inner-optimizer", "adamw", "--inner-lr", "1e-3"]
        for rule, outer_flags in (("sync", ["--learning-rate", "0.7", "--momentum", "0.9", "--nesterov"]),
                                  ("asgd", ["--learning-rate", str(args.async_lr)])):
            pulled[(h, rule, "f32")] = table[(f"H = {h}", rule)]
            for pulls in ("bf16", "int8"):
                pulled[(h, rule, pulls)] = simulate(args, f"{rule}-H{h}-{pulls}-pulls", [
                    "--algorithms", rule, *both, *outer_flags, *local, "--pull-dtype", pulls])
    # The pseudo-gradient pushed in bf16 and in int8, with and without error feedback: a table of its own.
    pushed = {}
    for h in hs:
        local = ["--local-steps", str(h), "--inner-optimizer", "adamw", "--inner-lr", "1e-3"]
        for rule, outer_flags in (("sync", ["--learning-rate", "0.7", "--momentum", "0.9", "--nesterov"]),
                                  ("asgd", ["--learning-rate", str(args.async_lr)])):
            pushed[(h, rule, "f32")] = table[(f"H = {h}", rule)]
            for name, flags in (("bf16", ["--push-dtype", "bf16"]), ("int8", ["--push-dtype", "int8"]),
                                ("int8, no error feedback", ["--push-dtype", "int8", "--no-error-feedback"])):
                pushed[(h, rule, name)] = simulate(args, f"{rule}-H{h}-{name.replace(', ', '-').replace(' ', '-')}-pushes", [
                    "--algorithms", rule, *both, *outer_flags, *local, *flags])
    wall = time.monotonic() - started

    def err(runs, delay):
        e = [100 * (1 - r["accuracy"]) for r in runs if r["delay"] == delay]
        return e, f"{statistics.mean(e):.2f} ± {statistics.stdev(e):.2f}" if e else "—"

    lines = [
        f"Command: `scripts/low-communication.py --simulate --sim-h {args.sim_h} --sim-seeds {args.sim_seeds} "
        f"--sim-target {args.sim_target} --dn-lr {args.dn_lr:g} "
        f"--async-lr {args.async_lr}{bin_arg(args.bin)}` — {wall / 60:.1f} min wall, {at:%Y-%m-%d %H:%M} UTC, "
        f"{platform.machine()}, {os.cpu_count()} cores. Deterministic: the same command gives the same table.",
        "",
        f"Held-out error (%) of the PS's final model, mean ± std over seeds 1–{args.sim_seeds}; the last column "
        "pairs each asynchronous rule with plain asgd (same H) seed by seed under the straggler (negative: it "
        "ended better than asgd).",
        "",
        "| local steps | rule | outer lr, momentum | pushes per worker-step | "
        + " | ".join(f"{d} ({w})" for d, w in SIM_DELAYS.items())
        + " | − asgd, straggler (pp): mean, seeds better |",
        "|---|---|---|---|---|---|---|",
    ]
    for (when, rule), runs in table.items():
        cells = [err(runs, d)[1] for d in SIM_DELAYS]
        paired = ""
        if rule not in ("asgd", "sync"):
            mine, _ = err(runs, "straggler:4:3")
            plain, _ = err(table[(when, "asgd")], "straggler:4:3")
            diffs = [a - b for a, b in zip(mine, plain)]
            paired = f"{statistics.mean(diffs):+.2f}, {sum(d < 0 for d in diffs)} of {len(diffs)}"
        per = "1" if when == "every step" else f"1/{runs[0]['local_steps']}"
        lines.append(f"| {when} | {rule} | {outer(runs[0])} | {per} | " + " | ".join(cells) + f" | {paired} |")
    target = args.sim_target
    lines += [
        "",
        f"Time until the PS's model first reaches {100 * target:.0f} % held-out accuracy (evaluated at 60 points of "
        "each run), and until the run's budget of data is spent, in batch steps of a worker at full speed (a "
        "push of H local steps takes H; pushes and pulls cost no time here, so this is what the rules do "
        "with compute alone): mean over the seeds that reached the target, and how many did.",
        "",
        "| local steps | rule | " + " | ".join(f"{d}: to {100 * target:.0f} % (seeds) | budget spent" for d in SIM_DELAYS)
        + " |",
        "|---|---|" + "---|---|" * len(SIM_DELAYS),
    ]
    for (when, rule), runs in table.items():
        cells = []
        for d in SIM_DELAYS:
            of = [r for r in runs if r["delay"] == d]
            hit = [next((p["time"] for p in r["curve"] if p["accuracy"] >= target), None) for r in of]
            hit = [t for t in hit if t is not None]
            reach = f"{statistics.mean(hit):,.0f} ({len(hit)} of {len(of)})" if hit else f"— (0 of {len(of)})"
            cells += [reach, f"{statistics.mean(r['curve'][-1]['time'] for r in of):,.0f}"]
        lines.append(f"| {when} | {rule} | " + " | ".join(cells) + " |")
    lines += wire_type_table(
        pulled, "pulled", "model pulled in",
        "The model pulled in bf16 and in int8 (`--pull-dtype`, the virtual workers computing on what each "
        "leaves them holding)")
    lines += wire_type_table(
        pushed, "pushed", "pushed in",
        "The pseudo-gradient pushed in bf16 and in int8 (`--push-dtype`, encoded as a worker encodes it and "
        "decoded by the PS's decoder; int8 with the worker's error feedback, and without it to measure it)")
    replace_section(args.doc, SIMULATE_START, "\n".join(lines))


def wire_type_table(runs_of: dict, verb: str, column: str, what: str) -> list[str]:
    """A table of runs keyed (H, rule, wire type), each type against the same H and rule in F32:
    held-out error per delay, the bytes `verb` against F32's, and the error paired by seed."""
    def err(runs, delay):
        return [100 * (1 - r["accuracy"]) for r in runs if r["delay"] == delay]

    def spread(e):
        return f"{statistics.mean(e):.2f} ± {statistics.stdev(e):.2f}" if e else "—"

    lines = [
        "",
        f"{what}: held-out error (%) of the PS's final model, the {verb} bytes against F32, and paired by "
        f"seed against F32 (pp; negative: better).",
        "",
        f"| local steps | rule | {column} | " + " | ".join(f"{d} ({w})" for d, w in SIM_DELAYS.items())
        + f" | {verb} bytes against F32 | − F32, " + " | − F32, ".join(SIM_DELAYS) + " |",
        "|---|---|---|" + "---|" * (2 * len(SIM_DELAYS) + 1),
    ]
    for (h, rule, dtype), runs in runs_of.items():
        base = runs_of[(h, rule, "f32")]
        cells = [spread(err(runs, d)) for d in SIM_DELAYS]
        ratio = statistics.mean(r[f"{verb}_bytes"] / b[f"{verb}_bytes"] for r, b in zip(runs, base))
        paired = ["—" if dtype == "f32" else
                  f"{statistics.mean(a - b for a, b in zip(err(runs, d), err(base, d))):+.2f}" for d in SIM_DELAYS]
        lines.append(f"| H = {h} | {rule} | {dtype} | " + " | ".join(cells) + f" | {ratio:.2f} | "
                     + " | ".join(paired) + " |")
    return lines


def link_arg(args) -> str:
    """The link's flags, as the command line gave them."""
    if not args.link_mbit:
        return ""
    return f" --link-mbit {args.link_mbit:g}" + (f" --link-rtt-ms {args.link_rtt_ms:g}" if args.link_rtt_ms else "")


def link_section(args, start: str) -> str:
    """A study over a link with latency keeps a section of its own."""
    return start.replace(": start", " --link-rtt-ms: start") if args.link_rtt_ms else start


def replace_section(doc: Path, start: str, body: str) -> None:
    """Puts `body` between `start` and the next end marker in `doc` (appended when missing)."""
    text = doc.read_text()
    if start not in text:
        text += "\n" + start + "\n" + END + "\n"
    head, rest = text.split(start, 1)
    doc.write_text(head + start + "\n" + body + "\n" + END + rest.split(END, 1)[1])


def bin_arg(bin_dir: Path) -> str:
    """` --bin DIR` when the binaries were not the release build's (the debug build's PS is slower)."""
    default = ROOT / "target" / "release"
    if bin_dir.resolve() == default.resolve():
        return ""
    shown = bin_dir.resolve().relative_to(ROOT) if bin_dir.resolve().is_relative_to(ROOT) else bin_dir
    return f" --bin {shown}"


def write_doc(args, rows: list[dict], at: dt.datetime, wall: float) -> None:
    base = {r["seed"]: r for r in rows if r["h"] is None}
    lines = [
        f"Command: `scripts/low-communication.py --seeds {args.seeds} --sync-h {args.sync_h} --async-h "
        f"{args.async_h} --async-lr {args.async_lr}{f' --dtypes {args.dtypes}' if args.dtypes else ''}"
        f"{bin_arg(args.bin)}` — {wall / 60:.1f} min wall, "
        f"{at:%Y-%m-%d %H:%M} UTC, "
        f"{platform.machine()}, {os.cpu_count()} cores.",
        "",
        "| run | seed | final model accuracy | pushes (all workers) | MB pushed | MB the PS received (measured) "
        "| pushes, bytes pushed against every step | wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        b = base[r["seed"]]
        fewer = (
            "1" if r["h"] is None else f"{b['pushes'] / r['pushes']:.1f}×, {b['bytes'] / r['bytes']:.0f}× fewer"
        )
        received = f"{r['received'] / 1e6:.1f}" if r.get("received") is not None else "—"
        lines.append(
            f"| {r['label']} | {r['seed']} | {r['accuracy']:.3f} | {r['pushes']} | {r['bytes'] / 1e6:.2f} | "
            f"{received} | {fewer} | {r['wall']:.1f} |"
        )
    replace_section(args.doc, START, "\n".join(lines))


if __name__ == "__main__":
    main()
