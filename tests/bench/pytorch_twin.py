#!/usr/bin/python3
"""A plain PyTorch twin of examples/quickstart.yaml's model, for speed
comparisons with `stagewise train-local` (tests/bench/twin_bench.sh).

RevNet-18, width 16, 3x3 stem, Fashion-MNIST shapes (1x28x28, 10 classes):
stem, R, R, D, R, D, R, D, R, head, block for block what
services/models/blocks.cc builds (same layers, same parameter count), trained
with the quickstart's optimizer (SGD, momentum 0.9, Nesterov, weight decay
5e-4 on weights only) at batch 128 on synthetic data. No stagewise code.
`--device cuda:0` trains on a GPU (the job then needs `device: cuda:0`).

  python3 tests/bench/pytorch_twin.py --threads 1 --steps 60

Prints one JSON line: parameters, steps, seconds, samples_per_second, where
seconds covers every step from the first (as train-local counts it).
"""
import argparse
import json
import os
import sys
import time

import torch
from torch import nn


# The blocks, module for module the zoo's (services/models/blocks.cc): shared
# with the TorchScript fixtures, whose twins the oracle tests hold to the zoo.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures",
                                "torchscript"))
from make_models import Head, PairDownsample, Reversible, Stem  # noqa: E402


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
    ap.add_argument("--device", default="cpu", help="cpu or cuda:N (batches are copied there per step)")
    args = ap.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = revnet18().to(device)
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
        x, y = (t.to(device, non_blocking=False) for t in pool[step % len(pool)])
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    print(json.dumps({"parameters": params, "steps": args.steps, "seconds": seconds,
                      "samples_per_second": args.steps * args.batch / seconds,
                      "threads": args.threads, "final_loss": float(loss)}))


if __name__ == "__main__":
    main()
