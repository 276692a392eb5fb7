#!/usr/bin/env python3
"""Time to target: which algorithm reaches a quality first, in wall-clock time.

For one job and a target (test accuracy, or validation bits per byte for
text), every configuration (an algorithm with its options, e.g. backprop
1F1B or delayed with its corrections) is trained at each stage count J with
`stagewise local` (J workers in this process tree), evaluating every
--eval-every steps, for each seed. Its steps to the target are the first
evaluation that meets it. Its time per step is the planner's prediction
(`stagewise plan`: the model profiled on this machine, each stage on a
device of its own, messages included) for that algorithm on that cut, so
that the time to target reads as it would on J devices:

    time to target = steps to target x predicted seconds per step

At --check-stages (default 2) the real processes' seconds per step are
measured too and printed beside the prediction (on this machine the J
workers share its cores, so the check is of the model's ratios, not of the
devices' speed).

Every run's command and its JSON result are kept under --out, so the table
can be rebuilt (--reuse) without training again.

  tests/bench/time_to_target.py examples/fmnist_revnet_petra.yaml \\
      --target-accuracy 0.85 --stages 4 8 --seeds 1 2 --steps 900 --eval-every 50 \\
      --config 'backprop=backprop' \\
      --config '1f1b=backprop, micro_batches: 4, schedule: 1f1b' \\
      --config 'delayed=delayed' --config 'petra=petra, accumulation: 2'
"""
import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("job", help="job file (YAML)")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--target-accuracy", type=float, help="test accuracy to reach, in [0, 1]")
    target.add_argument("--target-bpb", type=float, help="validation bits per byte to reach (text)")
    p.add_argument("--config", action="append", required=True, metavar="NAME=ALGORITHM",
                   help="a row: its name and the algorithm map's inside, e.g. "
                        "'petra2=petra, accumulation: 2' (repeatable)")
    p.add_argument("--stages", type=int, nargs="+", default=[4, 8], help="stage counts J")
    p.add_argument("--check-stages", type=int, default=2,
                   help="J at which real processes' time per step is measured (0: none)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    p.add_argument("--steps", type=int, required=True, help="the budget, in optimizer steps")
    p.add_argument("--eval-every", type=int, required=True, help="steps between evaluations")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="more overrides for every run (as stagewise's --set)")
    p.add_argument("--stagewise", default=os.path.join("build", "bin", "stagewise"))
    p.add_argument("--out", default="time_to_target", help="directory for runs and the table")
    p.add_argument("--reuse", action="store_true", help="take runs already under --out")
    args = p.parse_args(argv)
    configs = []
    for c in args.config:
        name, sep, algorithm = c.partition("=")
        if not sep or not name or not algorithm:
            p.error(f"--config {c!r}: expected NAME=ALGORITHM")
        configs.append((name, algorithm))
    args.configs = configs
    if args.target_accuracy is not None and not 0 <= args.target_accuracy <= 1:
        p.error("--target-accuracy: must be in [0, 1]")
    if args.steps < 1 or args.eval_every < 1:
        p.error("--steps and --eval-every: must be >= 1")
    return args


def overrides(args, algorithm, stages, seed):
    sets = [f"algorithm={{name: {algorithm}}}", f"stages.count={stages}", f"seed={seed}",
            "epochs=0", f"steps={args.steps}",
            f"eval={{every_epochs: 0, every_steps: {args.eval_every}, at_end: true}}"]
    sets += args.set
    return [x for s in sets for x in ("--set", s)]


def run_json(cmd, path, reuse):
    """Runs cmd (its stdout is one JSON document) unless path holds its result."""
    if reuse and os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    print("$ " + " ".join(shlex.quote(c) for c in cmd), file=sys.stderr, flush=True)
    out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if out.returncode != 0:
        raise SystemExit(f"failed ({out.returncode}): {' '.join(cmd)}")
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if not lines:
        raise SystemExit(f"no JSON from: {' '.join(cmd)}")
    result = json.loads(lines[-1])
    with open(path, "w") as f:
        json.dump(result, f)
        f.write("\n")
    with open(path + ".cmd", "w") as f:
        f.write(" ".join(shlex.quote(c) for c in cmd) + "\n")
    return result


def read_history(path):
    """The evaluations of a `stagewise local --history` file, in step order."""
    by_step = {}
    with open(path) as f:
        for line in f:
            if line.startswith("#"):
                continue
            fields = line.rstrip("\n").split("\t")
            if len(fields) != 4 or fields[2] not in ("eval_accuracy", "eval_loss"):
                continue
            e = by_step.setdefault(int(fields[0]), {"step": int(fields[0])})
            e[fields[2].split("_")[1]] = float(fields[3])
    return [by_step[k] for k in sorted(by_step) if len(by_step[k]) == 3]


def train(args, name, algorithm, stages, seed):
    """One `stagewise local` run: its JSON result and its evaluations."""
    base = os.path.join(args.out, f"run_{name}_J{stages}_s{seed}")
    history = base + ".tsv"
    r = run_json([args.stagewise, "local", args.job, "-q", "-o", "json", "--history", history]
                 + overrides(args, algorithm, stages, seed), base + ".json", args.reuse)
    return r, read_history(history)


def quality(args, e):
    """(value, met): an evaluation's quality in the target's terms."""
    if args.target_accuracy is not None:
        return e["accuracy"], e["accuracy"] >= args.target_accuracy
    bpb = e["loss"] / math.log(2)
    return bpb, bpb <= args.target_bpb


def predicted_seconds(plan, algorithm):
    """The plan's prediction for this algorithm: the row whose label names it."""
    rows = plan.get("plan", plan).get("predictions", [])
    name = algorithm.split(",")[0].strip()
    want = [r for r in rows if r["algorithm"].split(" ")[0] == name]
    if name == "backprop":
        m = [x for x in algorithm.replace(" ", "").split(",") if x.startswith("micro_batches:")]
        s = [x for x in algorithm.replace(" ", "").split(",") if x.startswith("schedule:")]
        if m and int(m[0].split(":")[1]) > 1:
            label = f"backprop {s[0].split(':')[1] if s else 'gpipe'} M={m[0].split(':')[1]}"
            want = [r for r in rows if r["algorithm"] == label] or want
        else:
            want = [r for r in rows if r["algorithm"] == "backprop"]
    if name == "nwise":
        n = [x for x in algorithm.replace(" ", "").split(",") if x.startswith("n:")]
        label = f"nwise n={n[0].split(':')[1] if n else 2}"
        want = [r for r in rows if r["algorithm"] == label]
    return want[0]["seconds_per_batch"] if want else None


def spread(values):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.4g}"
    return f"{med:.4g} [{min(values):.4g}, {max(values):.4g}]"


def main(argv):
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for stages in args.stages:
        for name, algorithm in args.configs:
            plan = run_json([args.stagewise, "plan", args.job, "-q", "--no-profile", "-o", "json"]
                            + overrides(args, algorithm, stages, args.seeds[0]),
                            os.path.join(args.out, f"plan_{name}_J{stages}.json"), args.reuse)
            seconds = predicted_seconds(plan, algorithm)
            reached, finals = [], []
            for seed in args.seeds:
                _, evals = train(args, name, algorithm, stages, seed)
                hit = next((e["step"] for e in evals if quality(args, e)[1]), None)
                reached.append(hit)
                finals.append(quality(args, evals[-1])[0] if evals else None)
            times = [h * seconds if h is not None and seconds else None for h in reached]
            rows.append((name, algorithm, stages, reached, seconds, times, finals))
    check = []
    if args.check_stages:
        for name, algorithm in args.configs:
            plan = run_json([args.stagewise, "plan", args.job, "-q", "--no-profile", "-o", "json"]
                            + overrides(args, algorithm, args.check_stages, args.seeds[0]),
                            os.path.join(args.out, f"plan_{name}_J{args.check_stages}.json"),
                            args.reuse)
            r, _ = train(args, name, algorithm, args.check_stages, args.seeds[0])
            measured = r["seconds"] / max(1, r["step"]) if r.get("seconds") else None
            check.append((name, predicted_seconds(plan, algorithm), measured))

    what = (f"test accuracy >= {args.target_accuracy}" if args.target_accuracy is not None
            else f"validation bits per byte <= {args.target_bpb}")
    lines = [f"Target: {what}; budget {args.steps} steps, evaluated every {args.eval_every}; "
             f"seeds {' '.join(map(str, args.seeds))} (median [min, max]).", "",
             "| configuration | algorithm | J | steps to target | ms per step (predicted) "
             "| time to target (s) | quality at the budget |",
             "|---|---|---|---|---|---|---|"]
    for name, algorithm, stages, reached, seconds, times, finals in rows:
        missed = sum(1 for h in reached if h is None)
        steps_text = spread(reached) + (f" ({missed} of {len(reached)} missed)" if missed else "")
        lines.append(f"| {name} | `{algorithm}` | {stages} | {steps_text} | "
                     f"{seconds * 1e3:.1f} | {spread(times)} | {spread(finals)} |"
                     if seconds else
                     f"| {name} | `{algorithm}` | {stages} | {steps_text} | - | - | {spread(finals)} |")
    if check:
        lines += ["", f"Model check at J = {args.check_stages} (real processes on this machine's "
                  "shared cores):", "", "| configuration | predicted ms/step | measured ms/step "
                  "| measured / predicted |", "|---|---|---|---|"]
        for name, predicted, measured in check:
            ratio = f"{measured / predicted:.2f}" if predicted and measured else "-"
            lines.append(f"| {name} | {predicted * 1e3 if predicted else float('nan'):.1f} | "
                         f"{measured * 1e3 if measured else float('nan'):.1f} | {ratio} |")
    table = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table)
    print(table)
    print("command: " + " ".join(shlex.quote(a) for a in [sys.argv[0]] + argv))


if __name__ == "__main__":
    main(sys.argv[1:])
