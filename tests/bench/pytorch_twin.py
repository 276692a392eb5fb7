#!/usr/bin/python3
"""A plain PyTorch twin of examples/quickstart.yaml's model, for speed
comparisons with `stagewise train-local` (tests/bench/twin_bench.sh).

RevNet-18, width 16, 3x3 stem, Fashion-MNIST shapes (1x28x28, 10 classes):
stem, R, R, D, R, D, R, D, R, head, block for block what
services/models/blocks.cc builds (same layers, same parameter count), trained
with the quickstart's optimizer (SGD, momentum 0.9, Nesterov, weight decay
5e-4 on weights only) at batch 128 on synthetic data. No stagewise code.

  python3 tests/bench/pytorch_twin.py --threads 1 --steps 60

Prints one JSON line: parameters, steps, seconds, samples_per_second, where
seconds covers every step from the first (as train-local counts it).
"""
import argparse
import json
import time

import torch
from torch import nn


def conv(cin, cout, k, stride=1):
    return nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, bias=False)


def body(cin, cout, stride=1):
    # conv3x3-BN-ReLU-conv3x3-BN, the residual function without its skip.
    return nn.Sequential(conv(cin, cout, 3, stride), nn.BatchNorm2d(cout), nn.ReLU(),
                         conv(cout, cout, 3), nn.BatchNorm2d(cout))


class Stem(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv, self.bn = conv(cin, cout, 3), nn.BatchNorm2d(cout)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class Reversible(nn.Module):
    """(x, x~) -> (x~ + F(x), x) on the channel-split pair."""

    def __init__(self, stream):
        super().__init__()
        self.body = body(stream, stream)

    def forward(self, x):
        a, b = x.chunk(2, 1)
        return torch.cat([b + self.body(a), a], 1)


class Residual(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.body = body(cin, cout, stride)
        self.proj = conv(cin, cout, 1, stride)
        self.proj_bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return torch.relu(self.body(x) + self.proj_bn(self.proj(x)))


class PairDownsample(nn.Module):
    """y = residual block(x) (stride 2), y~ = BN(conv1x1/2(x~))."""

    def __init__(self, stream_in, stream_out):
        super().__init__()
        self.first = Residual(stream_in, stream_out, 2)
        self.proj = conv(stream_in, stream_out, 1, 2)
        self.proj_bn = nn.BatchNorm2d(stream_out)

    def forward(self, x):
        a, b = x.chunk(2, 1)
        return torch.cat([self.first(a), self.proj_bn(self.proj(b))], 1)


class Head(nn.Module):
    def __init__(self, cin, classes):
        super().__init__()
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        return self.fc(x.mean((2, 3)))


def revnet18(width=16, in_channels=1, classes=10):
    blocks = [Stem(in_channels, 2 * width)]
    for g in range(4):
        stream = width << g
        for i in range(2):
            if g > 0 and i == 0:
                blocks.append(PairDownsample(stream // 2, stream))
            else:
                blocks.append(Reversible(stream))
    blocks.append(Head(2 * (width << 3), classes))
    return nn.Sequential(*blocks)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=128)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = revnet18()
    params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() > 1]
    no_decay = [p for p in model.parameters() if p.dim() <= 1]
    opt = torch.optim.SGD([{"params": decay, "weight_decay": 5e-4},
                           {"params": no_decay, "weight_decay": 0.0}],
                          lr=0.1, momentum=0.9, nesterov=True)
    loss_fn = nn.CrossEntropyLoss()
    # A fixed pool of synthetic batches, cycled (no data loading in the loop).
    pool = [(torch.randn(args.batch, 1, 28, 28), torch.randint(0, 10, (args.batch,)))
            for _ in range(8)]
    model.train()
    start = time.perf_counter()
    for step in range(args.steps):
        x, y = pool[step % len(pool)]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    seconds = time.perf_counter() - start
    print(json.dumps({"parameters": params, "steps": args.steps, "seconds": seconds,
                      "samples_per_second": args.steps * args.batch / seconds,
                      "threads": args.threads, "final_loss": float(loss)}))


if __name__ == "__main__":
    main()
