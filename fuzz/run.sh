#!/usr/bin/env bash
# Fuzz every target for SECONDS seconds each (make fuzz / make fuzz-short; fuzz/README.md).
#
#   fuzz/run.sh [--seconds N] [--seed S] [--no-operator] [TARGET...]   (default: every target, 300 s each)
#
# --seed S fixes libFuzzer's random seed: the run then tries the same inputs in the same order
# on every machine (as many of them as fit in N seconds), which make test's gate needs. Without
# it each run explores anew.
# --no-operator leaves out `trainingjob` when no target is named: it needs the operator crate,
# whose first fuzz build is long (fuzz/README.md).
# Installs cargo-fuzz (pinned) into ${FORESIGHT_CACHE:-~/.cache/foresight}/cargo-fuzz-<version>
# when missing, builds with nightly into fuzz/target (never the workspace's target/) with one
# cargo job, writes each target's seeds (made by the product's own encoders) into
# fuzz/corpus/<target>, runs libFuzzer, and prints the executions per target. A crash leaves its
# input in fuzz/artifacts/<target>/ and makes the script exit non-zero after the other targets.
set -euo pipefail

CARGO_FUZZ_VERSION=0.13.2
ALL_TARGETS=(gradient_body model_body push_request checkpoint trainingjob)
seconds=300
seed=()
no_operator=0
targets=()
while [[ $# -gt 0 ]]; do
    case $1 in
        --seconds) seconds=$2; shift 2 ;;
        --seed) seed=(-seed="$2"); shift 2 ;;
        --no-operator) no_operator=1; shift ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        -*) echo "unknown option $1" >&2; exit 2 ;;
        *) targets+=("$1"); shift ;;
    esac
done
if [[ ${#targets[@]} -eq 0 ]]; then
    for t in "${ALL_TARGETS[@]}"; do
        [[ $no_operator == 1 && $t == trainingjob ]] || targets+=("$t")
    done
fi

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cache=${FORESIGHT_CACHE:-$HOME/.cache/foresight}/cargo-fuzz-$CARGO_FUZZ_VERSION
export PATH=$cache/bin:$PATH
if ! cargo-fuzz --version 2>/dev/null | grep -qx "cargo-fuzz $CARGO_FUZZ_VERSION"; then
    echo "installing cargo-fuzz $CARGO_FUZZ_VERSION into $cache" >&2
    cargo install --locked cargo-fuzz --version "$CARGO_FUZZ_VERSION" --root "$cache" -j "${CARGO_BUILD_JOBS:-1}"
fi
rustup run nightly rustc --version >/dev/null 2>&1 || {
    echo "needs a nightly toolchain: rustup toolchain install nightly --profile minimal" >&2
    exit 1
}

export CARGO_TARGET_DIR=$root/fuzz/target CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1}
# cargo fuzz SUBCOMMAND --target-dir DIR ARGS... (ARGS may end in `-- <libFuzzer flags>`).
fuzz() {
    local sub=$1
    shift
    cargo +nightly fuzz "$sub" --target-dir "$CARGO_TARGET_DIR" "$@"
}
features() { [[ $1 == trainingjob ]] && echo "--features=operator" || true; }

for t in "${targets[@]}"; do
    start=$SECONDS
    # shellcheck disable=SC2046
    fuzz build $(features "$t") "$t"
    echo "built $t in $((SECONDS - start)) s" >&2
done

summary=()
failed=0
for t in "${targets[@]}"; do
    corpus=$root/fuzz/corpus/$t
    bin=$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release/$t
    FORESIGHT_FUZZ_SEEDS=$corpus "$bin"
    log=$CARGO_TARGET_DIR/$t.log
    set +e
    # shellcheck disable=SC2046
    fuzz run $(features "$t") "$t" "$corpus" -- -max_total_time="$seconds" "${seed[@]}" -max_len=4096 -print_final_stats=1 2>&1 \
        | tee "$log" | grep --line-buffered -E '^(#[0-9]+[[:space:]]+(INITED|DONE|pulse)|==[0-9]+==|thread .* panicked|SUMMARY|artifact_prefix|Test unit written)'
    rc=${PIPESTATUS[0]}
    set -e
    execs=$(grep -oE '^stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo "?")
    cov=$(grep -oE '^#[0-9]+[[:space:]]+DONE +cov: [0-9]+' "$log" | grep -oE '[0-9]+$' || echo "?")
    if [[ $rc -eq 0 ]]; then
        summary+=("$t: $execs executions in ${seconds} s, coverage $cov, no crash")
    else
        failed=1
        summary+=("$t: CRASH (exit $rc) after $execs executions: input in fuzz/artifacts/$t/, log $log")
    fi
done
printf '%s\n' "${summary[@]}"
exit $failed
