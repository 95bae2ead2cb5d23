#!/usr/bin/env python3
"""Two update rules on the simulator, paired by seed: the same settings as `make simulate`'s table
(MLP 784-64-10 on MNIST-5k, 20 epochs, batch 32, η = 0.1 ×0.1 at epochs 10 and 15, round-robin
delay over M workers), more seeds. With the same seed both rules start from the same model and see
the same batches and delays, so the per-seed difference isolates the rule.

    scripts/simulate-pair.py --workers 8 --seeds 20 asgd dc-asgd-a

prints each rule's final held-out error (mean ± std over seeds) and the paired difference (mean ±
its standard error, and how many seeds it was below, equal or above). Deterministic: the same
command prints the same numbers on any machine.
"""
import argparse
import json
import statistics
import subprocess


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("first")
    ap.add_argument("second")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--bin", default="target/release/foresight-worker")
    args = ap.parse_args()
    seeds = list(range(1, args.seeds + 1))
    cmd = [
        args.bin, "simulate",
        "--algorithms", f"{args.first},{args.second}",
        "--delays", f"round-robin:{args.workers}",
        "--seeds", ",".join(map(str, seeds)),
        "--epochs", "20", "--batch-size", "32",
        "--learning-rate", "0.1", "--lr-milestones", "10,15",
    ]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    error = {}
    for line in out.splitlines():
        r = json.loads(line)
        error.setdefault(r["algorithm"], {})[r["seed"]] = 100 * (1 - r["accuracy"])
    print(" ".join(cmd))
    for rule in (args.first, args.second):
        e = [error[rule][s] for s in seeds]
        print(f"{rule}: {statistics.mean(e):.2f} ± {statistics.stdev(e):.2f} % over {len(seeds)} seeds")
    d = [error[args.second][s] - error[args.first][s] for s in seeds]
    se = statistics.stdev(d) / len(d) ** 0.5
    below, equal = sum(x < -1e-9 for x in d), sum(abs(x) <= 1e-9 for x in d)
    print(
        f"{args.second} − {args.first}: {statistics.mean(d):+.2f} ± {se:.2f} pp (standard error), "
        f"below in {below}, equal in {equal}, above in {len(d) - below - equal} of {len(d)} seeds; "
        + ("resolved (> 2 standard errors)" if abs(statistics.mean(d)) > 2 * se else "not resolved")
    )


if __name__ == "__main__":
    main()
