#!/bin/bash
# One call on a GPU machine lent to a session (the `device` tool; no network): the Python
# package's GPU path, with that machine's own torch.
#   1. python/tests/test_gpu.py (skipped without CUDA): pinned host buffers, non-blocking loads,
#      a model moved to the GPU after the Optimizer was built (the Hugging Face Trainer's flow).
#   2. The examples' own tests, which then run on the GPU: examples/python/mnist_dataloader.py
#      (BatchNorm, a DataLoader) as a 2-worker `foresight run`, its final model loaded strictly
#      and scoring the summary's accuracy; examples/python/hf_trainer.py (the Trainer puts the
#      model on the GPU) on 2 workers.
#   3. scripts/python-memory.py --device cuda: a 100M-parameter model on the GPU, every-step f32
#      exchanges over loopback: the host memory per parameter and the time of a step.
# Prepare here:
#   make build && scripts/setup-python.sh && mkdir -p target/gpu && for b in foresight foresight-ps; do
#     strip -o target/gpu/$b target/release/$b; done && cp target/wheels/foresight-*.whl target/gpu/
#   device run: bash scripts/gpu-check-python.sh   (carry: target/gpu, data; about 5 minutes)
set -u
OUT=${OUT:-out/gpu-check-python}
B=$(realpath "${B:-target/gpu}")
mkdir -p "$OUT" /tmp/bin
# The examples' jobs run `python`; that machine has python3 only.
ln -sf "$(command -v python3)" /tmp/bin/python
export PATH=/tmp/bin:$PATH PYTHONUNBUFFERED=1
{
date -u
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -m pip install -q --no-deps --force-reinstall "$B"/foresight-*.whl
python3 -c 'import torch, transformers, foresight; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "transformers", transformers.__version__, "foresight", foresight.__version__)'
echo "--- pytest: the GPU tests, then the examples' tests (on the GPU)"
FORESIGHT_BIN_DIR=$B timeout 420 python3 -m pytest -q -p no:cacheprovider -s python/tests/test_gpu.py \
  python/tests/test_script.py python/tests/test_worker.py -k 'gpu or final_model_scores or hugging_face' 2>&1 |
  grep -E 'summary |killed at|passed|failed|skipped|Error|error|assert' | tail -25
echo "--- a 100M-parameter model on the GPU"
timeout 150 python3 scripts/python-memory.py --bin "$B" --device cuda --steps 8 2>&1 | tail -2
nvidia-smi --query-gpu=memory.used --format=csv
} > "$OUT/check.txt" 2>&1
tail -60 "$OUT/check.txt"
