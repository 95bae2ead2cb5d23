#!/usr/bin/env bash
# Runs the parameter server with dc-asgd-a and four simulated workers (foresight-loadgen) on
# loopback, then finalizes the job and stops the server with SIGTERM, as Kubernetes would.
set -euo pipefail
out=${1:-out/demo}
bin=target/release
port=${FORESIGHT_DEMO_PORT:-18080}
token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
rm -rf "$out" && mkdir -p "$out"

FORESIGHT_TOKEN=$token "$bin/foresight-ps" --listen "127.0.0.1:$port" --workers 4 \
  --algorithm dc-asgd-a --learning-rate 0.1 --checkpoint-dir "$out/checkpoints" \
  --checkpoint-interval 5 --job-name demo 2>"$out/ps.log" &
ps_pid=$!
trap 'kill $ps_pid 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break
  sleep 0.1
done

echo "== 4 workers, dc-asgd-a, 1M parameters, 200 pushes each"
FORESIGHT_TOKEN=$token "$bin/foresight-loadgen" --ps "http://127.0.0.1:$port" \
  --workers 4 --params 1000000 --steps 200 --finalize

echo "== staleness as Prometheus sees it"
curl -s "http://127.0.0.1:$port/metrics" | grep -E '^foresight_ps_(gradient_staleness_(count|sum)|updates_total|lambda|compensation_ratio)'

kill -TERM $ps_pid
wait $ps_pid
trap - EXIT
echo "== outputs in $out"
ls -l "$out/checkpoints"
