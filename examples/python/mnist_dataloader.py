"""A small CNN with BatchNorm and dropout on MNIST-5k, trained through a standard DataLoader, as a
Foresight worker: the script as a PyTorch user writes it, with the lines marked `# foresight`.

The DataLoader's sampler is `foresight.data.Sampler` (DDP's `DistributedSampler`, for a job whose
workers can be replaced: it resumes where the earlier process stopped and tells the parameter
server how many steps an epoch has, for the job's learning-rate schedule). BatchNorm's running
statistics are buffers, trained by the forward passes: the final model carries the last worker's,
so `model-final.safetensors` loads into `Net` with `load_state_dict(strict=True)`:

    foresight run examples/python/mnist-dataloader.yaml
    python -c "import safetensors.torch, sys; sys.path.insert(0, 'examples/python'); import mnist_dataloader as m; \\
        m.Net().load_state_dict(safetensors.torch.load_file('out/model-final.safetensors'), strict=True)"
"""

import gzip
import os

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import foresight  # foresight
import foresight.data  # foresight
import foresight.torch  # foresight

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        )  # fmt: skip
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.25), nn.Linear(32 * 7 * 7, 10))

    def forward(self, x):
        return self.head(self.features(x))


def load(path):
    """MNIST-5k (a gzip CSV: 784 pixels 0-255, then the label): the job's (train, held-out) split."""
    with gzip.open(os.path.join(path, "mnist_5k.csv.gz"), "rt") as f:
        rows = torch.from_numpy(np.loadtxt(f, delimiter=",", dtype=np.float32))
    x, y = rows[:, :784].view(-1, 1, 28, 28) / 255.0, rows[:, 784].long()
    train, test = foresight.split(len(y))  # foresight: the job's held-out split
    return TensorDataset(x[train], y[train]), (x[test], y[test])


@torch.no_grad()
def evaluate(model, x, y):
    model.eval()
    device = next(model.parameters()).device
    x, y = x.to(device), y.to(device)
    logits = model(x)
    model.train()
    return F.cross_entropy(logits, y).item(), (logits.argmax(1) == y).float().mean().item()


def main():
    job = foresight.init()  # foresight
    torch.manual_seed(job.seed)  # the same initial weights on every worker
    train, (test_x, test_y) = load(os.environ["FORESIGHT_DATASET_PATH"])
    sampler = foresight.data.Sampler(train, batch_size=job.batch_size)  # foresight: this worker's shard
    loader = DataLoader(train, batch_size=job.batch_size, sampler=sampler)
    model = Net().to(DEVICE)
    opt = foresight.torch.Optimizer(model)  # foresight: replaces torch.optim.SGD(...)
    for epoch in range(job.epochs):
        for x, y in loader:
            x, y = x.to(DEVICE, non_blocking=True), y.to(DEVICE, non_blocking=True)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        held_out_loss, accuracy = evaluate(model, test_x, test_y)
        foresight.report(loss=held_out_loss, accuracy=accuracy, epoch=epoch + 1)  # foresight
    done = foresight.finish(evaluate=lambda: evaluate(model, test_x, test_y))  # foresight: the PS's model
    print(f"worker {job.worker}: final model held-out accuracy {done['test_accuracy']:.4f} (on {DEVICE})")


if __name__ == "__main__":
    main()
