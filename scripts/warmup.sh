#!/bin/bash
# Does a learning-rate warm-up stop the collapses seen at M = 16 (docs/convergence.md)? Runs the
# make-convergence job that collapsed (LeNet-5, MNIST-5k, 16 workers, seed 4) for asgd and
# dc-asgd-c, RUNS times each without and with `lrWarmupEpochs: 1`, and prints each run's final
# held-out accuracy (the PS's final model). A collapse ends near 10 % (chance).
# Usage: scripts/warmup.sh [RUNS=3] (about 26 s a run on 2 cores)
set -euo pipefail
runs=${1:-3}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${OUT:-$repo/out/warmup}
mkdir -p "$out"
for algo in asgd dc-asgd-c; do
  for warmup in 0 1; do
    job=$out/$algo-w$warmup.yaml
    cat >"$job" <<YAML
apiVersion: foresight.dev/v1alpha1
kind: TrainingJob
metadata: {name: $algo-m16-w$warmup}
spec:
  model: {name: lenet5}
  dataset: {format: csv, path: $repo/data/mnist5k, holdout: 0.2}
  training: {epochs: 20, batchSize: 32, learningRate: 0.05, seed: 4, lrWarmupEpochs: $warmup, lrDecay: {factor: 0.1, milestones: [10, 15]}}
  optimizer: {algorithm: $algo}
  workers: {replicas: 16}
YAML
    accs=()
    for i in $(seq "$runs"); do
      rm -rf "$out/$algo-w$warmup-$i"
      "$repo/target/release/foresight" run "$job" --out "$out/$algo-w$warmup-$i" --no-progress >/dev/null 2>&1
      accs+=("$(python3 -c "import json,sys; print(round(100 * json.load(open(sys.argv[1]))['accuracy'], 1))" "$out/$algo-w$warmup-$i/summary.json")")
    done
    echo "$algo, M = 16, seed 4, lrWarmupEpochs $warmup: held-out accuracy % ${accs[*]}"
  done
done
