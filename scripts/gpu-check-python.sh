#!/bin/bash
# One call on a GPU machine lent to a session (the `device` tool; no network): the Python
# package's GPU path. Pinned host buffers, non-blocking loads and a model moved to the GPU after
# the Optimizer was built (the Hugging Face Trainer's flow): python/tests/test_gpu.py, which
# skips without CUDA; then examples/python/mnist_dataloader.py (BatchNorm, a DataLoader) as a
# 2-worker `foresight run` on the GPU, its final model loaded strictly. Prepare here:
#   make build && scripts/setup-python.sh && mkdir -p target/gpu && for b in foresight foresight-ps \
#     foresight-worker; do strip -o target/gpu/$b target/release/$b; done
#   cp target/wheels/foresight-*.whl target/gpu/
#   device run: bash scripts/gpu-check-python.sh   (carry: target/gpu; a few minutes)
set -u
OUT=${OUT:-out/gpu-check-python}
B=${B:-target/gpu}
mkdir -p "$OUT"
{
date -u
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -m pip install -q --no-deps --force-reinstall "$B"/foresight-*.whl
python3 -c 'import torch, foresight; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "foresight", foresight.__version__)'
echo "--- pytest python/tests/test_gpu.py"
FORESIGHT_BIN_DIR=$B timeout 300 python3 -m pytest -q -p no:cacheprovider python/tests/test_gpu.py 2>&1 | tail -15
echo "--- the DataLoader example, 2 workers, 2 epochs, on the GPU"
sed -e 's/epochs: 4/epochs: 2/' -e 's/replicas: 4/replicas: 2/' examples/python/mnist-dataloader.yaml > /tmp/job.yaml
timeout 240 $B/foresight run /tmp/job.yaml --out /tmp/dl --no-progress 2>&1 | tail -3
cp /tmp/dl/summary.json "$OUT/dataloader-summary.json"
python3 - <<'PY'
import sys, safetensors.torch
sys.path.insert(0, "examples/python")
import mnist_dataloader as m
net = m.Net()
net.load_state_dict(safetensors.torch.load_file("/tmp/dl/model-final.safetensors"), strict=True)
print("final model loads strictly")
PY
nvidia-smi --query-gpu=memory.used --format=csv
} > "$OUT/check.txt" 2>&1
tail -60 "$OUT/check.txt"
