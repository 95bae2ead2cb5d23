#!/usr/bin/env bash
# HTTP/2 conformance of the parameter server: h2spec (built from Go modules and cached by
# tools/build-h2spec.sh) against foresight-ps on a free loopback port, first over h2c (prior
# knowledge), then over TLS (h2 by ALPN, a throw-away self-signed certificate). Prints h2spec's
# failures and summary for each; exits non-zero when either passes fewer cases than its floor
# below (a regression guard), or when h2spec or the PS cannot run. `make h2spec`.
#
# Usage: scripts/h2spec.sh [OUT_DIR] [-- H2SPEC_ARGS...]
#   OUT_DIR       h2spec's full reports (h2c.txt, tls.txt, JUnit XML) and the PS's logs (out/h2spec)
#   H2SPEC_ARGS   passed on to h2spec (e.g. --strict, or test ids such as http2/6.9.1/3);
#                 with any of them the floors are not checked
#   FORESIGHT_BIN_DIR   where foresight-ps is (default target/debug)
set -euo pipefail

# h2spec 2.2.1, normal mode: 145 cases. Known failures (docs/reliability.md, "HTTP/2
# conformance"), always: http2/4.2/2 and http2/4.2/3 (we advertise the largest
# SETTINGS_MAX_FRAME_SIZE, 2^24-1: h2spec cannot encode a DATA frame above it and its HEADERS
# frame stays below it); on h2c only, http2/3.5/2 (one port serves HTTP/1.1 and h2c: h2spec reads
# our HTTP/1.1 400 as a frame); now and then (1 full run in 10 here): http2/6.9.1/3 (h2 ignores a
# WINDOW_UPDATE on a stream whose response is already sent). So 141 or 142 pass over h2c, 142 or
# 143 over TLS.
FLOOR_H2C=141
FLOOR_TLS=142
# /readyz: a GET without a token whose body ("ready", 5 bytes) is long enough for http2/6.9.2/2,
# which h2spec skips when the path's body is shorter than 5 bytes (/healthz: "ok").
H2SPEC_PATH=/readyz

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=out/h2spec
if [[ $# -gt 0 && $1 != -- ]]; then out=$1; shift; fi
[[ ${1:-} == -- ]] && shift
extra=("$@")
bin=${FORESIGHT_BIN_DIR:-$root/target/debug}/foresight-ps
if [[ ! -x $bin ]]; then
  echo "h2spec.sh: $bin not found (cargo build -p foresight-ps --bin foresight-ps)" >&2
  exit 1
fi

h2spec=$("$root/tools/build-h2spec.sh" | tail -n 1)/h2spec
rm -rf "$out" && mkdir -p "$out"
out=$(cd "$out" && pwd)

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
  -subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 \
  -keyout "$out/key.pem" -out "$out/cert.pem" 2>/dev/null

ps_pid=
stop_ps() {
  if [[ -n $ps_pid ]]; then
    kill "$ps_pid" 2>/dev/null || true
    wait "$ps_pid" 2>/dev/null || true
    ps_pid=
  fi
}
trap stop_ps EXIT

free_port() {
  python3 -c 'import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Starts the PS on a free loopback port ($1: h2c or tls) and waits until /readyz answers.
# The token guards /v1/*, which h2spec never touches.
start_ps() {
  local mode=$1 tls_args=() curl_args=(--http2-prior-knowledge) scheme=http
  port=$(free_port)
  if [[ $mode == tls ]]; then
    tls_args=(--tls-cert "$out/cert.pem" --tls-key "$out/key.pem")
    curl_args=(--http2 --cacert "$out/cert.pem")
    scheme=https
  fi
  FORESIGHT_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n') \
    "$bin" --listen "127.0.0.1:$port" --workers 1 --checkpoint-interval 0 --job-name h2spec \
    "${tls_args[@]}" 2>"$out/ps-$mode.log" &
  ps_pid=$!
  for _ in $(seq 100); do
    curl -sf "${curl_args[@]}" "$scheme://127.0.0.1:$port/readyz" >/dev/null && return 0
    kill -0 "$ps_pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "h2spec.sh: foresight-ps ($mode) did not become ready; its log:" >&2
  cat "$out/ps-$mode.log" >&2
  exit 1
}

status=0
for mode in h2c tls; do
  start_ps "$mode"
  args=(-h 127.0.0.1 -p "$port" -P "$H2SPEC_PATH" -j "$out/$mode.xml")
  [[ $mode == tls ]] && args+=(-t -k)
  echo "== h2spec ${args[*]} ${extra[*]}"
  start=$EPOCHREALTIME
  "$h2spec" "${args[@]}" "${extra[@]}" >"$out/$mode.txt" 2>&1 || true # exits 1 on any failure
  elapsed=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
  stop_ps
  # The failures section (none when everything passed) and the summary line.
  sed -n '/^Failures:/,$p' "$out/$mode.txt" | grep -v '^Finished in' | grep -v ' tests, ' || true
  summary=$(grep -E '^[0-9]+ tests, [0-9]+ passed' "$out/$mode.txt" | tail -n 1 || true)
  if [[ -z $summary ]]; then
    echo "h2spec.sh: h2spec gave no summary over $mode:" >&2
    tail -n 20 "$out/$mode.txt" >&2
    status=1
    continue
  fi
  passed=$(sed -E 's/^[0-9]+ tests, ([0-9]+) passed.*/\1/' <<<"$summary")
  floor=FLOOR_${mode^^}
  if [[ ${#extra[@]} -gt 0 ]]; then
    echo "$mode: $summary (${elapsed}s; floor not checked: h2spec arguments given)"
  else
    echo "$mode: $summary (${elapsed}s; floor: ${!floor})"
  fi
  if [[ ${#extra[@]} -eq 0 && $passed -lt ${!floor} ]]; then
    echo "h2spec.sh: $mode: $passed passed, below the floor ${!floor} (see $out/$mode.txt)" >&2
    status=1
  fi
done
echo "== reports in $out"
exit $status
