#!/usr/bin/env python3
"""Export a PyTorch model for Foresight's worker (`--model torchscript --model-path out.pt`).

    python export_model.py out.pt            # the small CNN below, for 1x28x28 images, 10 classes

then point a job at it:

    spec:
      model: {torchscript: {path: /models/out.pt}}

What the worker expects from the module:

- `forward(x)` takes one float32 tensor [N, C, H, W] with pixels scaled to [0, 1] (the worker's
  loaders do that for MNIST, CIFAR-10 and CSV) and returns logits [N, classes]; the worker
  applies the softmax cross-entropy itself.
- Its trainable parameters are `named_parameters()` with `requires_grad=True`: those, by their
  dotted names (`features.0.weight`, `fc.bias`, ...) and in the module's own order, are the
  layout the parameter server stores. Frozen parameters stay as exported.
- Buffers (BatchNorm running statistics) are not parameters: each worker keeps its own, updated
  by its training forward passes; evaluation runs in eval mode.
- Use `torch.jit.script`, not `torch.jit.trace`: tracing bakes in one branch and loses the
  difference between training and eval mode (dropout, BatchNorm).
- Export with the same torch version the worker image carries (2.13.0): libtorch reads
  TorchScript files written by the same or an older version.

To export your own model, replace `SmallCNN` with it (and adjust `--shape`/`--classes`); the
check at the end runs one forward pass through the scripted module before saving.
"""

import argparse
import sys

import torch
from torch import nn


class SmallCNN(nn.Module):
    """Two 3x3 convolutions (the second with BatchNorm) and a linear classifier: ~9k parameters."""

    def __init__(self, channels: int = 1, classes: int = 10, size: int = 28):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(channels, 8, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, kernel_size=3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.fc = nn.Linear(16 * (size // 4) * (size // 4), classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.features(x), 1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="where to write the TorchScript module (e.g. model.pt)")
    parser.add_argument("--shape", default="1,28,28", help="input image C,H,W (default 1,28,28)")
    parser.add_argument("--classes", type=int, default=10, help="number of classes (default 10)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the initial weights (default 0)")
    args = parser.parse_args()

    c, h, w = (int(d) for d in args.shape.split(","))
    if h != w or h % 4 != 0:
        parser.error(f"SmallCNN needs square images with a side divisible by 4, got {h}x{w}")
    torch.manual_seed(args.seed)
    model = SmallCNN(channels=c, classes=args.classes, size=h)
    scripted = torch.jit.script(model)

    # Check the contract before writing: logits of the right shape in both modes.
    with torch.no_grad():
        for train in (True, False):
            scripted.train(train)
            out = scripted(torch.rand(2, c, h, w))
            if tuple(out.shape) != (2, args.classes):
                print(f"forward returned shape {tuple(out.shape)}, expected (2, {args.classes})", file=sys.stderr)
                return 1
    scripted.train(True)
    scripted.save(args.out)

    params = [(n, p) for n, p in scripted.named_parameters() if p.requires_grad]
    total = sum(p.numel() for _, p in params)
    print(f"wrote {args.out}: {len(params)} trainable tensors, {total} parameters", file=sys.stderr)
    for name, p in params:
        print(f"  {name} {list(p.shape)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
