#!/usr/bin/python3
"""A plain PyTorch twin of the zoo's byte-level `gpt` (docs/text.md), for speed
comparisons with `stagewise train-local tests/bench/gpt_twin.yaml`
(TWIN=gpt tests/bench/twin_bench.sh).

Byte + learned position embedding, `depth` pre-LayerNorm blocks (causal
self-attention with a fused qkv projection, GELU MLP of 4 x width), final
LayerNorm and a projection to the 256 byte values: layer for layer what
services/models/transformer.cc builds, so the parameter counts agree (the
script prints its count; the bench checks it against `stagewise validate`).
Trained with Adam (lr 1e-3) on random bytes. No stagewise code. `--device
cuda:0` trains on a GPU.

  python3 tests/bench/pytorch_gpt_twin.py --threads 1 --steps 30

Prints one JSON line: parameters, steps, seconds, samples_per_second,
tokens_per_second; seconds covers every step from the first.
"""
import argparse
import json
import math
import time

import torch
from torch import nn
from torch.nn import functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        b, t, w = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(w // self.heads))
        future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
        out = torch.softmax(scores, -1) @ v
        return self.proj(out.transpose(1, 2).reshape(b, t, w))


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.norm2 = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x):
        h = x + self.attn(self.norm1(x))
        return h + self.down(F.gelu(self.up(self.norm2(h))))


class Gpt(nn.Module):
    def __init__(self, depth, width, heads, length, vocab=256):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Parameter(torch.randn(length, width) * 0.02)
        nn.init.normal_(self.tokens.weight, std=0.02)
        self.blocks = nn.Sequential(*[Block(width, heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, vocab)

    def forward(self, x):
        h = self.tokens(x) + self.positions[: x.shape[1]]
        return self.fc(self.norm(self.blocks(h)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--device", default="cpu", help="cpu or cuda:N (batches are copied there per step)")
    args = ap.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = Gpt(args.depth, args.width, args.heads, args.length).to(device)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    start = time.perf_counter()
    for _ in range(args.steps):
        window = torch.randint(256, (args.batch, args.length + 1))
        x, y = window[:, :-1].to(device), window[:, 1:].to(device)
        opt.zero_grad()
        loss = F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
        loss.backward()
        opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    print(json.dumps({"parameters": params, "steps": args.steps, "seconds": seconds,
                      "samples_per_second": args.steps * args.batch / seconds,
                      "tokens_per_second": args.steps * args.batch * args.length / seconds}))


if __name__ == "__main__":
    main()
