#!/usr/bin/env bash
# Runs the whole test suite several times in a row, by default while a CPU hog (Debian's
# stress-ng) keeps every core busy: the suite must not depend on how fast the machine is.
#   scripts/test-stress.sh [--runs N] [--release] [--no-hog]
# Prints one line per run (PASS/FAIL, seconds) and exits non-zero if any run failed; each run's
# output is kept in $OUT/test-stress/run-K.log.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=3 profile=() hog=1
while (($#)); do
  case $1 in
    --runs) runs=$2; shift ;;
    --release) profile=(--release) ;;
    --no-hog) hog=0 ;;
    *) echo "usage: $0 [--runs N] [--release] [--no-hog]" >&2; exit 2 ;;
  esac
  shift
done
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "--runs takes a positive integer, not '$runs'" >&2; exit 2; }
logs=${OUT:-out}/test-stress
mkdir -p "$logs"

# Build first, outside the timed runs, so that each run is the tests alone.
cargo test --locked --workspace "${profile[@]}" --no-run >"$logs/build.log" 2>&1 \
  || { tail -30 "$logs/build.log"; exit 1; }

if ((hog)); then
  if ! command -v stress-ng >/dev/null; then
    echo "test-stress: installing stress-ng" >&2
    apt-get update -qq && apt-get install -y -qq stress-ng >/dev/null
  fi
  stress-ng --cpu "$(nproc)" --cpu-method matrixprod --quiet &
  hog_pid=$!
  trap 'kill "$hog_pid" 2>/dev/null; wait "$hog_pid" 2>/dev/null || true' EXIT
  echo "test-stress: stress-ng keeps $(nproc) cores busy (pid $hog_pid)"
fi

failed=0
for k in $(seq 1 "$runs"); do
  t0=$(date +%s)
  if cargo test --locked --workspace "${profile[@]}" >"$logs/run-$k.log" 2>&1; then verdict=PASS; else verdict=FAIL; failed=1; fi
  passed=$(grep -Eo '[0-9]+ passed' "$logs/run-$k.log" | awk '{s+=$1} END {print s+0}')
  echo "run $k/$runs (${profile[*]:-debug}, hog=$hog): $verdict, $passed tests passed, $(( $(date +%s) - t0 )) s"
done
exit "$failed"
