#!/bin/bash
# One call on a GPU machine lent to a session (the `device` tool: one H200, its own PyTorch, no
# network): does the worker built here train on a real GPU, and what does the paper's ResNet-20
# script (scripts/paper-cifar10.py) measure there. Prepare here, then run it there with
# target/gpu carried:
#   make build && mkdir -p target/gpu && for b in foresight foresight-ps foresight-worker; do
#     strip -o target/gpu/$b target/release/$b; done        # 35 MB: under the 64 MiB carry limit
#   device run: bash scripts/gpu-check.sh   (carry: target/gpu; about 8 min)
# The worker links libtorch by name; there it is that machine's torch (LD_LIBRARY_PATH below).
# With CIFAR-10 at hand, pass PAPER_DATA=DIR to run the real table (160 epochs: hours, not one call).
set -u
OUT=${OUT:-out/gpu-check}
mkdir -p "$OUT"
B=${B:-target/gpu}
{
date -u
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
TL=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")')
python3 -c 'import torch;print("torch", torch.__version__, "cuda", torch.cuda.is_available())'
export LD_LIBRARY_PATH=$TL
echo "--- missing libraries:"; ldd $B/foresight-worker | grep -i 'not found'
$B/foresight-worker --version
echo "--- cifar on the machine:"; find / -xdev -maxdepth 6 -iname '*cifar*' 2>/dev/null | head -5
echo "--- mnist demo on the GPU"
t0=$(date +%s.%N)
timeout 150 $B/foresight run examples/mnist-dcasgd.yaml --out /tmp/mnist --no-progress 2>&1 | tail -3
echo "mnist wall $(echo "$(date +%s.%N) - $t0" | bc) s"
grep -h -i 'device' /tmp/mnist/logs/worker-0.log | head -2
cp /tmp/mnist/summary.json $OUT/mnist-summary.json
echo "--- paper script, synthetic"
if [ -n "${PAPER_DATA:-}" ]; then data=(--data "$PAPER_DATA"); else data=(--synthetic 10000 --epochs 3); fi
timeout 330 python3 scripts/paper-cifar10.py "${data[@]}" --bin-dir $B --out /tmp/pc 2>&1 | tail -15
cp /tmp/pc/table.md /tmp/pc/runs.jsonl $OUT/ 2>/dev/null
grep -h -i 'device' /tmp/pc/dc-asgd-a-m8/logs/worker-0.log | head -1
nvidia-smi --query-gpu=memory.used --format=csv
} > $OUT/check.txt 2>&1
tail -60 $OUT/check.txt
