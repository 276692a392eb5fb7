#!/usr/bin/python3
"""A plain PyTorch two-process pipeline of the byte-level GPT twin
(tests/bench/pytorch_gpt_twin.py), the peer of `stagewise local` with two
stages (tests/bench/gpu_table.sh, docs/cuda.md).

Stage 0 holds the embeddings and the first half of the blocks, stage 1 the
second half, the final LayerNorm and the projection; one process each, joined
by gloo on loopback. Activations and gradients cross as CPU tensors (gloo has
no GPU transport), in 1F1B order over M micro-batches, then each stage takes
its Adam step: exact backprop, as `algorithm: {name: backprop, micro_batches:
M, schedule: 1f1b}`. No stagewise code. `--device cuda:0` puts both stages on
that GPU (`--devices cuda:0,cuda:1` one each).

  python3 tests/bench/pytorch_gpt_pipeline.py --steps 20 --micro-batches 4

Prints one JSON line from stage 1: parameters, steps, seconds,
tokens_per_second over the steps after --warmup.
"""
import argparse
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_gpt_twin import Gpt  # noqa: E402  the same layers, the same count


class FirstHalf(nn.Module):
    def __init__(self, gpt, cut):
        super().__init__()
        self.tokens, self.positions = gpt.tokens, gpt.positions
        self.blocks = nn.Sequential(*list(gpt.blocks)[:cut])

    def forward(self, x):
        return self.blocks(self.tokens(x) + self.positions[: x.shape[1]])


class SecondHalf(nn.Module):
    def __init__(self, gpt, cut):
        super().__init__()
        self.blocks = nn.Sequential(*list(gpt.blocks)[cut:])
        self.norm, self.fc = gpt.norm, gpt.fc

    def forward(self, h):
        return self.fc(self.norm(self.blocks(h)))


def one_f_one_b(rank, micro_batches):
    """The order of one stage of two: ("F", m) and ("B", m)."""
    warmup = min(micro_batches, 2 - rank)  # stage 0 runs one forward ahead
    order = [("F", m) for m in range(warmup)]
    f, b = warmup, 0
    while b < micro_batches:
        order.append(("B", b))
        b += 1
        if f < micro_batches:
            order.append(("F", f))
            f += 1
    return order


def run(rank, args, port):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(args.threads)
    device = torch.device(args.devices[rank])
    torch.manual_seed(0)
    gpt = Gpt(args.depth, args.width, args.heads, args.length)
    cut = args.depth // 2
    stage = (FirstHalf(gpt, cut) if rank == 0 else SecondHalf(gpt, cut)).to(device)
    opt = torch.optim.Adam(stage.parameters(), lr=1e-3)
    parameters = sum(p.numel() for p in gpt.parameters())
    mb = args.batch // args.micro_batches
    shape = (mb, args.length, args.width)
    generator = torch.Generator().manual_seed(1)
    start = None
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            dist.barrier()
            start = time.perf_counter()
        window = torch.randint(256, (args.batch, args.length + 1), generator=generator)
        xs = window[:, :-1].split(mb)
        ys = window[:, 1:].split(mb)
        opt.zero_grad()
        held = {}
        sends = []  # isend: a blocking send here would wait on the peer's own send
        for kind, m in one_f_one_b(rank, args.micro_batches):
            if rank == 0 and kind == "F":
                out = stage(xs[m].to(device))
                payload = out.detach().cpu()
                sends.append((dist.isend(payload, dst=1), payload))
                held[m] = out
            elif rank == 0:
                grad = torch.empty(shape)
                dist.recv(grad, src=1)
                held.pop(m).backward(grad.to(device))
            elif kind == "F":
                h = torch.empty(shape)
                dist.recv(h, src=0)
                h = h.to(device).requires_grad_(True)
                logits = stage(h)
                loss = F.cross_entropy(logits.reshape(-1, 256), ys[m].to(device).reshape(-1))
                held[m] = (h, loss / args.micro_batches)
            else:
                h, loss = held.pop(m)
                loss.backward()
                payload = h.grad.cpu()
                sends.append((dist.isend(payload, dst=0), payload))
        for request, _ in sends:
            request.wait()
        opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()
    seconds = time.perf_counter() - start
    if rank == 1:
        print(json.dumps({"parameters": parameters, "steps": args.steps, "seconds": seconds,
                          "micro_batches": args.micro_batches,
                          "tokens_per_second": args.steps * args.batch * args.length / seconds}),
              flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1, help="per stage")
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--device", default="cpu", help="both stages' device (cpu or cuda:N)")
    ap.add_argument("--devices", default="", help="stage 0's and stage 1's, e.g. cuda:0,cuda:1")
    args = ap.parse_args()
    args.devices = args.devices.split(",") if args.devices else [args.device, args.device]
    if len(args.devices) != 2 or args.batch % args.micro_batches or args.depth < 2:
        ap.error("--devices needs two entries; --batch a multiple of --micro-batches; --depth >= 2")
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(args, port), nprocs=2, join=True)


if __name__ == "__main__":
    main()
