"""A small transformer language model in plain PyTorch, as a Foresight worker.

A GPT-style decoder (byte and position embeddings, pre-norm causal self-attention blocks, a
linear output head) predicts the next byte of the text files in
$FORESIGHT_DATASET_PATH. The example's corpus is the Python source of the pinned torch's
torch.nn modules (code and English docstrings, 0.9 MB), which `make setup` writes to
data/torch-nn/corpus.txt: nothing is downloaded at run time. Every window of CONTEXT bytes is
one example; the job holds out a share of them, and the final model's held-out loss is printed
in bits per byte, with how often its most likely next byte is the right one.

    foresight run examples/python/charlm.yaml       # 4 workers, dc-asgd-a

The loop is an ordinary one, gradient clipping included; the lines marked `# foresight` make
it a worker. The size comes from the environment, so that the same script makes larger models:
CHARLM_WIDTH (default 128), CHARLM_LAYERS (2), CHARLM_HEADS (4), CHARLM_CONTEXT (64).
"""

import math
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import foresight  # foresight
import foresight.torch  # foresight

WIDTH = int(os.environ.get("CHARLM_WIDTH", 128))
LAYERS = int(os.environ.get("CHARLM_LAYERS", 2))
HEADS = int(os.environ.get("CHARLM_HEADS", 4))
CONTEXT = int(os.environ.get("CHARLM_CONTEXT", 64))


def corpus(path):
    """The bytes of every .txt file under `path` (sorted by name), as (inputs, next bytes) windows."""
    files = sorted(p for p in Path(path).rglob("*.txt") if p.is_file())
    if not files:
        raise SystemExit(f"no .txt file under {path}: run `make setup` (it writes data/torch-nn/corpus.txt)")
    data = b"".join(p.read_bytes() for p in files)
    n = (len(data) - 1) // CONTEXT
    tokens = torch.frombuffer(bytearray(data[: n * CONTEXT + 1]), dtype=torch.uint8).long()
    # Example i: bytes [i*C, (i+1)*C) and, shifted by one, the bytes to predict.
    return tokens[:-1].view(n, CONTEXT), tokens[1:].view(n, CONTEXT)


class CharLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(256, WIDTH)
        self.position = nn.Parameter(torch.zeros(CONTEXT, WIDTH))
        layer = nn.TransformerEncoderLayer(
            WIDTH, HEADS, 4 * WIDTH, dropout=0.0, batch_first=True, norm_first=True, activation="gelu"
        )
        self.blocks = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, 256)
        # The byte embedding keeps PyTorch's N(0, 1): with plain SGD (the PS's rule, no Adam), the
        # GPT-2 init (std 0.02, the head tied to it) sat at the byte-frequency loss for hundreds
        # of steps here (3.26 nats/byte after 150 steps, against 2.59 with this one).
        nn.init.normal_(self.position, std=0.02)
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(CONTEXT), persistent=False)

    def forward(self, x):
        h = self.embed(x) + self.position[: x.shape[1]]
        h = self.blocks(h, mask=self.causal[: x.shape[1], : x.shape[1]], is_causal=True)
        return self.head(self.norm(h))


def evaluate(model, x, y):
    """Mean cross-entropy in nats per byte, and how often the most likely next byte is right."""
    model.eval()
    loss = right = 0.0
    with torch.no_grad():
        for xb, yb in zip(x.split(256), y.split(256)):
            logits = model(xb).flatten(0, 1)
            loss += F.cross_entropy(logits, yb.flatten(), reduction="sum").item()
            right += (logits.argmax(1) == yb.flatten()).sum().item()
    model.train()
    return loss / y.numel(), right / y.numel()


def main():
    job = foresight.init()  # foresight
    torch.manual_seed(job.seed)  # the same initial weights on every worker
    x, y = corpus(os.environ["FORESIGHT_DATASET_PATH"])
    train, test = foresight.split(len(x))  # foresight: the job's held-out windows
    train_x, train_y, test_x, test_y = x[train], y[train], x[test], y[test]
    model = CharLM()
    opt = foresight.torch.Optimizer(model)  # foresight: replaces torch.optim.SGD(...)
    current = 0
    for epoch, idx in foresight.batches(len(train_x)):  # foresight: this worker's shard, resumed
        if epoch != current:  # an epoch ended: the held-out figures of this worker's copy
            held_out_loss, accuracy = evaluate(model, test_x, test_y)
            foresight.report(loss=held_out_loss, accuracy=accuracy, epoch=epoch)  # foresight
            current = epoch
        loss = F.cross_entropy(model(train_x[idx]).flatten(0, 1), train_y[idx].flatten())
        opt.zero_grad()
        loss.backward()
        # Without clipping, plain SGD on a transformer stalls at the unigram loss or diverges.
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if job.step % job.report_every == 0:  # $FORESIGHT_REPORT_EVERY, 20 by default
            foresight.report(loss=loss.item())  # foresight
    done = foresight.finish(evaluate=lambda: evaluate(model, test_x, test_y))  # foresight: the PS's model
    params = sum(p.numel() for p in model.parameters())
    print(
        f"worker {job.worker}: {params} parameters; the final model's held-out loss "
        f"{done['test_loss']:.3f} nats/byte = {done['test_loss'] / math.log(2):.3f} bits/byte, "
        f"next byte right {done['test_accuracy']:.1%}"
    )


if __name__ == "__main__":
    main()
