#!/usr/bin/python3
"""A plain PyTorch pipeline over gloo: the peer of stagewise_emulated_bench.

J processes, one per stage, each holding K emulated blocks like stagewise's
`emulated` model (y = x + scale * x + shift per value of a sample, waiting
forward_ms / backward_ms per block and mini-batch, scaled to the micro-batch;
services/models/blocks.cc), the last one with the same head (global average
pool + linear) and cross-entropy. Activations and gradients go to the
neighbour with torch.distributed isend / irecv over gloo on loopback; every
stage steps SGD once per mini-batch; stage 0 starts the next mini-batch after
its step (the flush). Schedules: gpipe, 1f1b (J-1-j forwards of warm-up).

Prints one JSON line: {"seconds_per_batch": median over the measured steps,
"min": ..., "max": ...}, measured on stage 0 from the end of one step to the
end of the next, after `--warmup` steps. Never a test; the emulated bench runs
it with --peer so that both sides are measured in the same invocation.

  /usr/bin/python3 tests/bench/gloo_pipeline_peer.py --stages 4 --micro-batches 8
"""
import argparse
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def wait_until(start, seconds):
    """Sleeps until start + seconds (the emulated device's time), if not past."""
    left = start + seconds - time.perf_counter()
    if left > 0:
        time.sleep(left)


class EmulatedAffine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale, shift, forward_s, backward_s):
        start = time.perf_counter()
        y = torch.addcmul(shift, x, scale) + x
        ctx.save_for_backward(x, scale)
        ctx.backward_s = backward_s * x.size(0)
        wait_until(start, forward_s * x.size(0))
        return y

    @staticmethod
    def backward(ctx, g):
        start = time.perf_counter()
        x, scale = ctx.saved_tensors
        gx = g * scale + g
        gscale = (g * x).sum(0)
        gshift = g.sum(0)
        wait_until(start, ctx.backward_s)
        return gx, gscale, gshift, None, None


class Stage(torch.nn.Module):
    def __init__(self, args, last):
        super().__init__()
        shape = args.shape
        self.scales = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.empty(shape).uniform_(-0.01, 0.01))
             for _ in range(args.blocks_per_stage)])
        self.shifts = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.zeros(shape)) for _ in range(args.blocks_per_stage)])
        self.forward_s = args.forward_ms / 1e3 / args.batch  # per sample
        self.backward_s = args.backward_ms / 1e3 / args.batch
        self.head = torch.nn.Linear(shape[0], 10) if last else None

    def forward(self, x):
        for scale, shift in zip(self.scales, self.shifts):
            x = EmulatedAffine.apply(x, scale, shift, self.forward_s, self.backward_s)
        if self.head is not None:
            x = self.head(x.mean(dim=(2, 3)))
        return x


def run_stage(rank, args, port, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=args.stages)
    J, M = args.stages, args.micro_batches
    first, last = rank == 0, rank == J - 1
    torch.manual_seed(rank)
    stage = Stage(args, last)
    optimizer = torch.optim.SGD(stage.parameters(), lr=0.01)
    sizes = [args.batch // M + (1 if m < args.batch % M else 0) for m in range(M)]
    shape = args.shape
    data = torch.randn([args.batch] + shape)
    labels = torch.randint(10, (args.batch,))
    ends = []
    warm = 0 if last else (min(J - 1 - rank, M) if args.schedule == "1f1b" else M)
    for _ in range(args.warmup + args.steps):
        optimizer.zero_grad()
        inputs, outputs, pending_sends = [None] * M, [None] * M, []
        xs, ys = data.split(sizes), labels.split(sizes)

        def forward(m):
            if first:
                x = xs[m]
            else:
                x = torch.empty([sizes[m]] + shape)
                dist.recv(x, src=rank - 1)
                x.requires_grad_(True)
            inputs[m] = x
            out = stage(x)
            if last:
                loss = torch.nn.functional.cross_entropy(out, ys[m]) * (sizes[m] / args.batch)
                loss.backward()
                pending_sends.append(dist.isend(x.grad, dst=rank - 1))
                inputs[m] = None
            else:
                outputs[m] = out
                pending_sends.append(dist.isend(out.detach(), dst=rank + 1))

        def backward(m):
            g = torch.empty([sizes[m]] + shape)
            dist.recv(g, src=rank + 1)
            outputs[m].backward(g)
            if not first:
                pending_sends.append(dist.isend(inputs[m].grad, dst=rank - 1))
            inputs[m] = outputs[m] = None

        for m in range(warm):
            forward(m)
        for m in range(warm, M):
            forward(m)
            if not last:
                backward(m - warm)
        if not last:
            for m in range(M - warm, M):
                backward(m)
        for s in pending_sends:
            s.wait()
        optimizer.step()
        ends.append(time.perf_counter())
    dist.barrier()
    if rank == 0:
        per = [b - a for a, b in zip(ends[args.warmup - 1:], ends[args.warmup:])]
        out.put({"seconds_per_batch": statistics.median(per), "min": min(per), "max": max(per)})
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stages", type=int, default=4)
    p.add_argument("--micro-batches", type=int, default=8)
    p.add_argument("--schedule", choices=["gpipe", "1f1b"], default="1f1b")
    p.add_argument("--forward-ms", type=float, default=5)
    p.add_argument("--backward-ms", type=float, default=10)
    p.add_argument("--blocks-per-stage", type=int, default=2)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--shape", default="2,16,16")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=0, help="default: 2J + 2, like the bench")
    args = p.parse_args()
    args.shape = [int(v) for v in args.shape.split(",")]
    if len(args.shape) != 3 or args.stages < 2 or args.micro_batches < 1:
        p.error("--shape needs C,H,W; --stages >= 2; --micro-batches >= 1")
    if args.warmup <= 0:
        args.warmup = 2 * args.stages + 2
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=run_stage, args=(r, args, port, out)) for r in range(args.stages)]
    for proc in procs:
        proc.start()
    result = out.get(timeout=1800)
    for proc in procs:
        proc.join()
    if any(proc.exitcode != 0 for proc in procs):
        print("gloo_pipeline_peer: a stage failed", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
