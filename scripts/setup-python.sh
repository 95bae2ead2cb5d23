#!/usr/bin/env bash
# The `foresight` Python package (python/): maturin builds its abi3 wheel from the Rust client and
# pip installs it into the venv, with pytest for its tests and Hugging Face transformers (with
# accelerate, which its Trainer needs) for foresight.transformers and its example. Run by `make setup`; cargo rebuilds
# only what changed, so a second run takes seconds and a change to the Rust client is picked up.
set -euo pipefail
cd "$(dirname "$0")/.."
MATURIN_VERSION=1.16.0
PYTEST_VERSION=9.2.0
TRANSFORMERS_VERSION=5.23.0
ACCELERATE_VERSION=1.15.0
venv=${FORESIGHT_VENV:-.venv}
stamp="$venv/.foresight-maturin-$MATURIN_VERSION-pytest-$PYTEST_VERSION-transformers-$TRANSFORMERS_VERSION-accelerate-$ACCELERATE_VERSION"
if [ ! -f "$stamp" ]; then
  "$venv/bin/pip" install -q --disable-pip-version-check "maturin==$MATURIN_VERSION" "pytest==$PYTEST_VERSION" \
    "transformers==$TRANSFORMERS_VERSION" "accelerate==$ACCELERATE_VERSION"
  touch "$stamp"
fi
wheels=target/wheels
rm -f "$wheels"/foresight-*.whl
PATH="$PWD/$venv/bin:$PATH" "$venv/bin/maturin" build --quiet --release --locked -m python/Cargo.toml -o "$wheels" >&2
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps --force-reinstall "$wheels"/foresight-*.whl
