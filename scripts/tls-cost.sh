#!/usr/bin/env bash
# What TLS costs the exchange: foresight-loadgen (one simulated worker: pull, then push, per step)
# against a foresight-ps on loopback, over h2c and over TLS with an Ed25519 certificate signed by
# a CA of its own (as the operator issues them), alternated ROUNDS times on the same binaries.
# Prints each run's pushes/s and push and pull p50; the ratio TLS/h2c per round is the figure.
#
#   scripts/tls-cost.sh [PARAMS (default 10000000)] [STEPS (30)] [ROUNDS (3)]
set -euo pipefail
params=${1:-10000000}
steps=${2:-30}
rounds=${3:-3}
bin=${BIN:-target/release}
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT
export FORESIGHT_TOKEN=tls-cost-token # read by both foresight-ps and foresight-loadgen

ssl() { openssl "$@" >/dev/null 2>&1; }
(cd "$dir" &&
  ssl req -x509 -newkey ed25519 -nodes -days 1 -subj /CN=tls-cost-ca -keyout ca.key -out ca.pem &&
  ssl req -new -newkey ed25519 -nodes -subj /CN=localhost -keyout key.pem -out leaf.csr &&
  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n' >leaf.ext &&
  ssl x509 -req -in leaf.csr -CA ca.pem -CAkey ca.key -set_serial 2 -days 1 -extfile leaf.ext -out cert.pem)

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# run MODE: one PS, one loadgen run against it; prints "MODE pushes/s push_p50_ms pull_p50_ms".
run() {
  local mode=$1 port tls=() ca=() scheme=http
  port=$(free_port)
  if [[ $mode == tls ]]; then
    tls=(--tls-cert "$dir/cert.pem" --tls-key "$dir/key.pem")
    ca=(--ps-ca-file "$dir/ca.pem")
    scheme=https
  fi
  "$bin/foresight-ps" --listen "127.0.0.1:$port" --workers 1 --algorithm asgd "${tls[@]}" 2>"$dir/ps.log" &
  local ps=$!
  for _ in $(seq 200); do
    curl -sf --cacert "$dir/ca.pem" "$scheme://127.0.0.1:$port/healthz" >/dev/null && break
    sleep 0.05
  done
  "$bin/foresight-loadgen" --ps "$scheme://127.0.0.1:$port" "${ca[@]}" --workers 1 --params "$params" \
    --steps "$steps" >"$dir/loadgen.txt"
  kill "$ps" && wait "$ps" || true
  python3 - "$mode" "$dir/loadgen.txt" <<'EOF'
import re, sys
text = open(sys.argv[2]).read()
rate, push = re.search(r"([\d.]+) pushes/s, push latency p50 ([\d.]+) ms", text).groups()
pull = re.search(r"pull latency p50 ([\d.]+) ms", text).group(1)
print(sys.argv[1], rate, push, pull)
EOF
}

echo "# $params parameters, $steps steps, one worker; columns: mode pushes/s push_p50_ms pull_p50_ms"
for r in $(seq "$rounds"); do
  h=$(run h2c)
  t=$(run tls)
  echo "$h"
  echo "$t"
  python3 -c 'import sys; h, t = float(sys.argv[1]), float(sys.argv[2]); print(f"round {sys.argv[3]}: TLS/h2c pushes/s = {t / h:.3f}")' \
    "$(awk '{print $2}' <<<"$h")" "$(awk '{print $2}' <<<"$t")" "$r"
done
