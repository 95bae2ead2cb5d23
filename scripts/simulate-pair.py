#!/usr/bin/env python3
"""Two update rules on the simulator, paired by seed: the same settings as `make simulate`'s table
(MLP 784-64-10 on MNIST-5k, 20 epochs, batch 32, η = 0.1 ×0.1 at epochs 10 and 15, round-robin
delay over M workers) unless the flags below change η, the warm-up or λ0, over more seeds. With
the same seed both rules start from the same model and see the same batches and delays, so the
per-seed difference isolates the rule.

    scripts/simulate-pair.py --workers 8 --seeds 20 asgd dc-asgd-a
    scripts/simulate-pair.py --workers 8 --seeds 20 --learning-rate 0.3 --sequential asgd dc-asgd-a

prints each rule's final held-out error (mean ± std over seeds) and the paired difference (mean ±
its standard error, and how many seeds it was below, equal or above); with --sequential also
sequential SGD (M = 1) at the same settings and each rule's paired difference from it.
Deterministic: the same command prints the same numbers on any machine.
"""
import argparse
import json
import statistics
import subprocess


def simulate(args, rules, workers, seeds):
    """{rule: {seed: final held-out error %}} from one `foresight-worker simulate` call."""
    cmd = [
        args.bin, "simulate",
        "--algorithms", ",".join(rules),
        "--delays", f"round-robin:{workers}",
        "--seeds", ",".join(map(str, seeds)),
        "--epochs", "20", "--batch-size", "32",
        "--learning-rate", str(args.learning_rate), "--lr-milestones", "10,15",
        "--lr-warmup-epochs", str(args.lr_warmup_epochs),
    ] + (["--lambda0", str(args.lambda0)] if args.lambda0 is not None else [])
    print(" ".join(cmd), flush=True)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    error = {}
    for line in out.splitlines():
        r = json.loads(line)
        error.setdefault(r["algorithm"], {})[r["seed"]] = 100 * (1 - r["accuracy"])
    return error


def paired(name, base_name, e, base):
    """The paired difference e − base over the seeds, as one line."""
    d = [a - b for a, b in zip(e, base)]
    se = statistics.stdev(d) / len(d) ** 0.5
    below, equal = sum(x < -1e-9 for x in d), sum(abs(x) <= 1e-9 for x in d)
    return (
        f"{name} − {base_name}: {statistics.mean(d):+.2f} ± {se:.2f} pp (standard error), "
        f"below in {below}, equal in {equal}, above in {len(d) - below - equal} of {len(d)} seeds; "
        + ("resolved (> 2 standard errors)" if abs(statistics.mean(d)) > 2 * se else "not resolved")
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("first")
    ap.add_argument("second")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--learning-rate", type=float, default=0.1, help="η before the decays")
    ap.add_argument("--lr-warmup-epochs", type=float, default=0, help="linear warm-up from η/10 (0: none)")
    ap.add_argument("--lambda0", type=float, help="λ0 of the delay-compensated rules (default: the paper's)")
    ap.add_argument("--sequential", action="store_true", help="also sequential SGD (M = 1), as the reference")
    ap.add_argument("--bin", default="target/release/foresight-worker")
    args = ap.parse_args()
    seeds = list(range(1, args.seeds + 1))
    rules = (args.first, args.second)
    error = simulate(args, rules, args.workers, seeds)
    per_rule = {rule: [error[rule][s] for s in seeds] for rule in rules}
    if args.sequential:
        sequential = simulate(args, ["asgd"], 1, seeds)["asgd"]
        per_rule["sequential"] = [sequential[s] for s in seeds]
    for rule, e in per_rule.items():
        print(f"{rule}: {statistics.mean(e):.2f} ± {statistics.stdev(e):.2f} % over {len(seeds)} seeds")
    print(paired(args.second, args.first, per_rule[args.second], per_rule[args.first]))
    if args.sequential:
        for rule in rules:
            print(paired(rule, "sequential", per_rule[rule], per_rule["sequential"]))


if __name__ == "__main__":
    main()
