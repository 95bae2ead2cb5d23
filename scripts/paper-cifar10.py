#!/usr/bin/env python3
"""The paper's Table 1 (Zheng et al., ICML 2017): ResNet-20 on CIFAR-10, sequential, then M = 4
and 8 workers with every rule, with the paper's settings, through `foresight run`. Made for a
GPU machine: every worker process trains on `cuda_if_available()`, so on one GPU all M share it.

Paper settings (REFERENCE.md): 160 epochs, batch 128 per worker, eta 0.5 divided by 10 at epochs
80 and 120, no augmentation; dc-asgd-c lambda0 = 0.04; dc-asgd-a lambda0 = 2, mu = 0.95.

  scripts/paper-cifar10.py --data DIR     # DIR holds data_batch_1..5.bin and test_batch.bin
  scripts/paper-cifar10.py --synthetic 10000 --epochs 3   # no CIFAR-10 at hand: a smoke run on
                                          # generated CIFAR-format data (speed and plumbing only)

Writes OUT/table.md (final error of the PS's final model, on CIFAR-10's test batch, beside the
paper's figures) and OUT/runs.jsonl; --bin-dir names the directory with foresight,
foresight-ps and foresight-worker (default target/release).
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

PAPER = {  # Table 1, test error %: (M, rule) -> error
    (1, "sequential"): 8.65,
    (4, "asgd"): 9.27, (4, "sync"): 9.17, (4, "dc-asgd-c"): 8.67, (4, "dc-asgd-a"): 8.19,
    (8, "asgd"): 10.26, (8, "sync"): 10.10, (8, "dc-asgd-c"): 9.27, (8, "dc-asgd-a"): 8.57,
}
RULES = ["sync", "asgd", "dc-asgd-c", "dc-asgd-a"]


def synthesize(path, n, seed=1):
    """CIFAR-10 binary batches of generated images: each class is a colour and a stripe
    orientation plus noise (64 noisy variants per class), so the model can learn it and the
    accuracy shows training works. Speed and plumbing only: it says nothing about CIFAR-10."""
    os.makedirs(path, exist_ok=True)
    rng = random.Random(seed)

    def image(label):
        px = bytearray([label])
        for base in [(label * 37 + k * 91) % 256 for k in range(3)]:
            for y in range(32):
                for x in range(32):
                    stripe = 60 if ((x if label % 2 else y) // (2 + label // 2)) % 2 else 0
                    px.append(max(0, min(255, base + stripe + rng.randint(-70, 70))))
        return bytes(px)

    variants = [[image(c) for _ in range(64)] for c in range(10)]
    pick = lambda: rng.choice(variants[rng.randrange(10)])  # noqa: E731
    per = max(1, n // 5)
    for i in range(1, 6):
        with open(os.path.join(path, f"data_batch_{i}.bin"), "wb") as f:
            f.write(b"".join(pick() for _ in range(per)))
    with open(os.path.join(path, "test_batch.bin"), "wb") as f:
        f.write(b"".join(pick() for _ in range(max(10, n // 5))))


def job_yaml(name, rule, workers, args):
    opt = {"algorithm": rule}
    if rule == "dc-asgd-c":
        opt["lambda0"] = 0.04
    if rule == "dc-asgd-a":
        opt.update(lambda0=2.0, meanSquareDecay=0.95)
    e = args.epochs
    return (
        "apiVersion: foresight.dev/v1alpha1\nkind: TrainingJob\n"
        f"metadata: {{name: {name}}}\n"
        "spec:\n"
        "  model: {name: resnet20}\n"
        f"  dataset: {{format: cifar10, path: {os.path.abspath(args.data)}}}\n"
        f"  training: {{epochs: {e}, batchSize: 128, learningRate: 0.5, seed: {args.seed}, "
        f"lrDecay: {{factor: 0.1, milestones: [{e * 0.5:g}, {e * 0.75:g}]}}}}\n"
        f"  optimizer: {json.dumps(opt)}\n"
        f"  workers: {{replicas: {workers}}}\n"
    )


def run(args, name, rule, workers):
    out = os.path.join(args.out, name)
    os.makedirs(out, exist_ok=True)
    job = os.path.join(out, "job.yaml")
    with open(job, "w") as f:
        f.write(job_yaml(name, "asgd" if rule == "sequential" else rule, workers, args))
    cmd = [os.path.join(args.bin_dir, "foresight"), "run", job, "--out", out, "--no-progress"]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    row = {"rule": rule, "workers": workers, "error": 100 * (1 - s["accuracy"]), "seconds": s["seconds"],
           "wall": time.time() - t0, "updates": s["final_model"]["version"],
           "tau_p50": s["staleness"]["p50"], "tau_p99": s["staleness"]["p99"]}
    print(json.dumps(row), flush=True)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="directory of CIFAR-10 binary batches")
    ap.add_argument("--synthetic", type=int, help="generate this many CIFAR-format images into OUT/data")
    ap.add_argument("--epochs", type=int, default=160)
    ap.add_argument("--workers", default="4,8")
    ap.add_argument("--rules", default=",".join(RULES))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--bin-dir", default="target/release")
    ap.add_argument("--out", default="out/paper-cifar10")
    args = ap.parse_args()
    if bool(args.data) == bool(args.synthetic):
        sys.exit("give exactly one of --data DIR and --synthetic N")
    os.makedirs(args.out, exist_ok=True)
    if args.synthetic:
        args.data = os.path.join(args.out, "data")
        synthesize(args.data, args.synthetic)
    t0 = time.time()
    rows = [run(args, "sequential-m1", "sequential", 1)]
    for m in [int(x) for x in args.workers.split(",")]:
        for rule in args.rules.split(","):
            rows.append(run(args, f"{rule}-m{m}", rule, m))
    with open(os.path.join(args.out, "runs.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    data = f"synthetic CIFAR-format data ({args.synthetic} images)" if args.synthetic else f"CIFAR-10 from {args.data}"
    lines = [
        f"ResNet-20, {data}, {args.epochs} epochs, batch 128, η 0.5 ÷10 at {args.epochs * 0.5:g} and "
        f"{args.epochs * 0.75:g}; seed {args.seed}; whole run {(time.time() - t0) / 60:.1f} min.",
        "",
        "| M | rule | test error % | paper % | training time (s) | updates | τ p50 | τ p99 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        paper = PAPER.get((r["workers"], r["rule"]))
        lines.append(f"| {r['workers']} | {r['rule']} | {r['error']:.2f} | {'—' if paper is None else paper} | "
                     f"{r['seconds']:.1f} | {r['updates']} | {r['tau_p50']} | {r['tau_p99']} |")
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
