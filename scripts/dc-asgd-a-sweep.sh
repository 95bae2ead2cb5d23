#!/usr/bin/env bash
# dc-asgd-a at M = 8: why did one seed end at 80%? Vary λ0, μ and the learning rate per seed.
cd "$(dirname "$0")/.."
for seed in 1 2 3; do
  for cfg in "2.0 0.95 0.1" "1.0 0.95 0.1" "0.5 0.95 0.1" "2.0 0.0 0.1" "2.0 0.95 0.05" "0.0 0.95 0.1"; do
    set -- $cfg
    name="dca-l$1-m$2-lr$3-s$seed"
    out=out/sweep/$name; mkdir -p $out
    cat > $out/job.yaml <<YAML
apiVersion: foresight.dev/v1alpha1
kind: TrainingJob
metadata: {name: $name}
spec:
  model: {name: mlp}
  dataset: {format: csv, path: data/mnist5k, holdout: 0.2}
  training: {epochs: 5, batchSize: 32, learningRate: $3, seed: $seed}
  optimizer: {algorithm: dc-asgd-a, lambda0: $1, meanSquareDecay: $2}
  workers: {replicas: 8}
YAML
    target/release/foresight run $out/job.yaml --out $out --no-progress >/dev/null 2>&1 || echo "$name FAILED"
    python3 -c "
import json,sys; s=json.load(open('$out/summary.json'))
ev=s['evaluations']  # one per epoch of data, by the workers in turn
print('$name', 'acc %.3f'%s['accuracy'], 'tau p50 %d p99 %d'%(s['staleness']['p50'],s['staleness']['p99']), 'epochs', ['%.3f'%e[2] for e in ev])"
  done
done
