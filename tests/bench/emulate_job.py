#!/usr/bin/env python3
"""Time per step of a real job's pipeline, measured with real processes on
emulated accelerators.

The job is profiled and planned on this machine (`stagewise plan -o json`,
exact backpropagation on the job's cut at J stages); each stage's forward and
backward time per mini-batch (its optimizer step counted with the backward)
become an emulated job: J emulated blocks that wait those times
(`model.block_forward_ms`, docs/models.md) and pass, on every link, the
largest activation any stage of the job sends (emulated blocks keep their
shape: where a job's activations shrink along the pipeline, its later links
carry fewer bytes than here). `stagewise_emulated_bench --stage-ms`
then runs every algorithm on it with J worker processes, real messages and,
with --link-delay-ms, emulated link latency, interleaved over rounds, and
prints the median time per mini-batch of each (and, with --predict, the
planner's prediction for the emulated job beside it). On J devices the job's
stages would take those times; here J workers share this machine's cores
while they wait, so the pipeline's shape is measured, not the device.

  tests/bench/emulate_job.py examples/text_reformer_petra.yaml --stages 8 \\
      --set model.depth=8 --set model.width=32 --set stages.partition=balanced \\
      -- --algorithms gpipe,1f1b,zb-h1,delayed --link-delay-ms 0,25 --rounds 3 --steps 16 --predict

Everything after `--` goes to stagewise_emulated_bench (see the comment at the
top of tests/bench/emulated_bench.cc); this script sets --stages,
--blocks-per-stage, --stage-ms, --batch and --shape. --print-only prints the
command without running it.
"""
import argparse
import json
import math
import shlex
import subprocess
import sys


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("job", help="job file (YAML)")
    p.add_argument("--stages", type=int, required=True, help="stage count J")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="overrides of the job (as stagewise's --set), e.g. its cut")
    p.add_argument("--stagewise", default="build/bin/stagewise")
    p.add_argument("--bench", default="build/bin/stagewise_emulated_bench")
    p.add_argument("--print-only", action="store_true",
                   help="print the stage times and the bench command; run nothing")
    if "--" in argv:
        at = argv.index("--")
        args = p.parse_args(argv[:at])
        args.bench_args = argv[at + 1:]
    else:
        args = p.parse_args(argv)
        args.bench_args = []
    if args.stages < 2:
        p.error("--stages: at least 2")
    for flag in ("--stages", "--blocks-per-stage", "--stage-ms", "--batch", "--shape"):
        if flag in args.bench_args:
            p.error(f"{flag}: set by this script from the job's plan")
    return args


def shape_of(floats):
    """[2, H, W] holding `floats` values per sample (2 channels: reversible
    emulated blocks split them), H as close to W as divides."""
    if floats < 2 or floats % 2:
        floats += floats % 2
    half = max(1, floats // 2)
    h = int(math.isqrt(half))
    while half % h:
        h -= 1
    return [2, h, half // h]


def main(argv):
    args = parse_args(argv)
    sets = [f"stages.count={args.stages}", "algorithm=backprop"] + args.set
    plan_cmd = [args.stagewise, "plan", args.job, "-q", "-o", "json"]
    for s in sets:
        plan_cmd += ["--set", s]
    print("$ " + shlex.join(plan_cmd), flush=True)
    out = subprocess.run(plan_cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"stagewise plan failed ({out.returncode}):\n{out.stderr}")
    plan = json.loads(out.stdout)["plan"]
    stages = plan["stages"]
    if len(stages) != args.stages:
        sys.exit(f"the plan has {len(stages)} stages, not {args.stages}")
    batch = int(plan["batch_size"])
    per_stage = []
    print(f"{plan['model']}, batch {batch}, profiled on {plan['device']}: per stage "
          "(blocks) forward / backward+step ms, activation bytes sent")
    for s in stages:
        f = 1e3 * s["forward_seconds"]
        b = 1e3 * (s["backward_seconds"] + s["step_seconds"])
        per_stage.append(f"{f:.4g}/{b:.4g}")
        print(f"  stage {s['stage']} {s['blocks']}: {f:.2f} / {b:.2f}, "
              f"{s.get('output_bytes', 0)} B")
    sent = max(int(s.get("output_bytes", 0)) for s in stages[:-1])
    if sent <= 0:
        sys.exit("the plan names no activation size (output_bytes): rebuild stagewise")
    shape = shape_of(max(2, sent // 4 // batch))
    bench_cmd = [args.bench, "--stages", str(args.stages), "--blocks-per-stage", "1",
                 "--stage-ms", ",".join(per_stage), "--batch", str(batch),
                 "--shape", ",".join(map(str, shape))] + args.bench_args
    print("$ " + shlex.join(bench_cmd), flush=True)
    if args.print_only:
        return 0
    return subprocess.run(bench_cmd).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
