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
    target.add_argument("--target-accuracy", metavar="VALUE|final:NAME",
                        help="test accuracy to reach, in [0, 1]; final:NAME: the final accuracy "
                             "of configuration NAME's run of the same seed and J")
    target.add_argument("--target-bpb", metavar="VALUE|final:NAME",
                        help="validation bits per byte to reach (text); final:NAME as above")
    p.add_argument("--slack", type=float, default=0.0, metavar="X",
                   help="with final:NAME, a target X looser than that final quality, for every "
                        "configuration: bits per byte x (1 + X) (0.01: within 1%%), accuracy - X")
    p.add_argument("--step-ms", action="append", default=[], metavar="NAME=MS",
                   help="a configuration's time per step measured elsewhere (e.g. by "
                        "tests/bench/emulate_job.py at the link's latency), instead of the "
                        "planner's prediction; the table marks it (repeatable)")
    p.add_argument("--config", action="append", required=True, metavar="NAME=ALGORITHM",
                   help="a row: its name and the algorithm map's inside, e.g. "
                        "'petra2=petra, accumulation: 2' (repeatable)")
    p.add_argument("--stages", type=int, nargs="+", default=[4, 8], help="stage counts J")
    p.add_argument("--check-stages", type=int, default=2,
                   help="J at which real processes' time per step is measured (0: none)")
    p.add_argument("--check-steps", type=int, default=0,
                   help="steps of each check run, without evaluations (0: the budget's run)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    p.add_argument("--steps", type=int, required=True,
                   help="the budget, in steps (mini-batches; PETRA with accumulation k updates every k)")
    p.add_argument("--budget", action="append", default=[], metavar="NAME=STEPS",
                   help="a configuration's own budget (e.g. a decoupled one given longer to reach an "
                        "exact schedule's final quality); the learning-rate schedule spans it")
    p.add_argument("--same", action="append", default=[], metavar="NAME=OTHER@J",
                   help="NAME computes the same updates as OTHER at J stages (the exact schedules: "
                        "the oracle tests hold each to one trainer): take that run's evaluations "
                        "instead of training NAME; only its time per step is its own")
    p.add_argument("--plot", action="store_true",
                   help="also draw quality against modelled time per J (gnuplot, SVG)")
    p.add_argument("--eval-every", type=int, required=True, help="steps between evaluations")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="more overrides for every run (as stagewise's --set)")
    p.add_argument("--config-set", action="append", default=[], metavar="NAME:KEY=VALUE",
                   help="an override for one configuration's runs, e.g. "
                        "'interleaved:stages.chunks_per_worker=2' (repeatable)")
    p.add_argument("--stagewise", default=os.path.join("build", "bin", "stagewise"))
    p.add_argument("--out", default="time_to_target", help="directory for runs and the table")
    p.add_argument("--reuse", action="store_true", help="take runs already under --out")
    p.add_argument("--table-only", action="store_true",
                   help="train nothing: the table from the runs under --out (implies --reuse); "
                        "rows without their runs say so")
    p.add_argument("--check-only", action="store_true",
                   help="only the model check at --check-stages: no training to the target")
    args = p.parse_args(argv)
    if args.check_only and args.check_stages < 1:
        p.error("--check-only: needs --check-stages >= 1")
    configs = []
    for c in args.config:
        name, sep, algorithm = c.partition("=")
        if not sep or not name or not algorithm:
            p.error(f"--config {c!r}: expected NAME=ALGORITHM")
        configs.append((name, algorithm))
    args.configs = configs
    args.reuse = args.reuse or args.table_only
    names = {n for n, _ in configs}
    args.budgets = {}
    for b in args.budget:
        name, sep, steps = b.partition("=")
        if not sep or name not in names or not steps.isdigit() or int(steps) < 1:
            p.error(f"--budget {b!r}: expected NAME=STEPS with NAME a --config and STEPS >= 1")
        args.budgets[name] = int(steps)
    args.config_sets = {}
    for c in args.config_set:
        name, sep, kv = c.partition(":")
        if not sep or name not in names or "=" not in kv:
            p.error(f"--config-set {c!r}: expected NAME:KEY=VALUE with NAME a --config")
        args.config_sets.setdefault(name, []).append(kv)
    given, args.step_ms = args.step_ms, {}
    for m in given:
        name, sep, ms = m.partition("=")
        try:
            value = float(ms)
        except ValueError:
            value = -1
        if not sep or name not in names or not value > 0:
            p.error(f"--step-ms {m!r}: expected NAME=MS with NAME a --config and MS > 0")
        args.step_ms[name] = value / 1e3
    if args.slack < 0:
        p.error("--slack: must be >= 0")
    args.same_as = {}
    for s in args.same:
        name, sep, rest = s.partition("=")
        other, at, stages = rest.partition("@")
        if not sep or not at or name not in names or other not in names or not stages.isdigit():
            p.error(f"--same {s!r}: expected NAME=OTHER@J with NAME and OTHER --configs")
        args.same_as[name] = (other, int(stages))
    args.metric = "accuracy" if args.target_accuracy is not None else "bpb"
    text = args.target_accuracy if args.target_accuracy is not None else args.target_bpb
    flag = f"--target-{args.metric}"
    args.target, args.target_from = None, None
    if text.startswith("final:"):
        args.target_from = text[len("final:"):]
        if args.target_from not in names:
            p.error(f"{flag} {text!r}: {args.target_from!r} is not a --config")
    else:
        try:
            args.target = float(text)
        except ValueError:
            p.error(f"{flag} {text!r}: expected a number or final:NAME")
        if args.metric == "accuracy" and not 0 <= args.target <= 1:
            p.error("--target-accuracy: must be in [0, 1]")
    if args.steps < 1 or args.eval_every < 1:
        p.error("--steps and --eval-every: must be >= 1")
    return args


def overrides(args, name, algorithm, stages, seed):
    sets = [f"algorithm={{name: {algorithm}}}", f"stages.count={stages}", f"seed={seed}",
            "epochs=0", f"steps={args.budgets.get(name, args.steps)}",
            f"eval={{every_epochs: 0, every_steps: {args.eval_every}, at_end: true}}"]
    sets += args.set + args.config_sets.get(name, [])
    return [x for s in sets for x in ("--set", s)]


_WRITTEN = set()  # results this invocation wrote: never run twice (e.g. a --same run)


def run_json(cmd, path, reuse, may_fail=False):
    """Runs cmd (its stdout is one JSON document) unless path holds its result
    (with reuse, or written by this invocation). With may_fail, a failure
    returns {"error": its last line of stderr}."""
    if (reuse or path in _WRITTEN) and os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    print("$ " + " ".join(shlex.quote(c) for c in cmd), file=sys.stderr, flush=True)
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sys.stderr.write(out.stderr)
    if out.returncode != 0 and may_fail:
        return {"error": (out.stderr.strip().splitlines() or ["failed"])[-1]}
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
    _WRITTEN.add(path)
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


def steady_seconds(path):
    """Seconds per step between the first and the last tenth of a run's training
    reports (start-up and the last drain left out)."""
    rows = []
    with open(path) as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            if len(fields) == 4 and fields[2] == "train_loss":
                rows.append((int(fields[0]), float(fields[1])))
    if len(rows) < 3:
        return None
    a, b = rows[len(rows) // 10], rows[-1 - len(rows) // 10]
    return (b[1] - a[1]) / (b[0] - a[0]) if b[0] > a[0] else None


def train(args, name, algorithm, stages, seed, check=False):
    """One `stagewise local` run: its JSON result and its evaluations."""
    base = os.path.join(args.out, f"{'check' if check else 'run'}_{name}_J{stages}_s{seed}")
    history = base + ".tsv"
    sets = overrides(args, name, algorithm, stages, seed)
    if check and args.check_steps:
        sets += ["--set", f"steps={args.check_steps}", "--set", "eval.every_steps=0",
                 "--set", "eval.at_end=false"]
    if args.table_only and not os.path.exists(base + ".json"):
        return None, None
    r = run_json([args.stagewise, "local", args.job, "-q", "-o", "json", "--history", history]
                 + sets, base + ".json", args.reuse)
    return r, read_history(history)


def quality(args, e, target=None):
    """(value, met): an evaluation's quality in the target's terms."""
    value = e["accuracy"] if args.metric == "accuracy" else e["loss"] / math.log(2)
    if target is None:
        return value, False
    return value, value >= target if args.metric == "accuracy" else value <= target


def targets(args, stages, algorithms):
    """The target per seed at J stages: the fixed one, or final:NAME's."""
    if args.target_from is None:
        return {seed: args.target for seed in args.seeds}
    source, source_stages = args.same_as.get(args.target_from, (args.target_from, stages))
    out = {}
    for seed in args.seeds:
        _, evals = train(args, source, algorithms[source], source_stages, seed)
        final = quality(args, evals[-1])[0] if evals else None
        if final is not None and args.slack:
            final = final - args.slack if args.metric == "accuracy" else final * (1 + args.slack)
        out[seed] = final
    return out


def predicted_seconds(plan, algorithm):
    """The plan's prediction for this algorithm: the row whose label names it."""
    rows = plan.get("plan", plan).get("predictions", [])
    name = algorithm.split(",")[0].strip()
    want = [r for r in rows if r["algorithm"].split(" ")[0] == name]
    if name == "backprop":
        m = [x for x in algorithm.replace(" ", "").split(",") if x.startswith("micro_batches:")]
        s = [x for x in algorithm.replace(" ", "").split(",") if x.startswith("schedule:")]
        if m and int(m[0].split(":")[1]) > 1:
            # "backprop 1f1b M=8", "backprop interleaved v=2 M=8"
            schedule, micro = s[0].split(":")[1] if s else "gpipe", m[0].split(":")[1]
            want = [r for r in rows if r["algorithm"].startswith(f"backprop {schedule} ")
                    and r["algorithm"].endswith(f" M={micro}")]
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


def plot(args, stages, by_name, target):
    """Quality against modelled time at J stages, the mean of the seeds per configuration."""
    data = os.path.join(args.out, f"curves_J{stages}.tsv")
    with open(data, "w") as f:
        for name, runs in by_name.items():
            f.write(f"# {name}\n")
            for i in range(min(len(r) for r in runs)):
                t = statistics.mean(r[i][0] for r in runs)
                f.write(f"{t:.6g}\t{statistics.mean(r[i][1] for r in runs):.6g}\n")
            f.write("\n\n")
    svg = os.path.join(args.out, f"curves_J{stages}.svg")
    ylabel = "test accuracy" if args.metric == "accuracy" else "validation bits per byte"
    script = "\n".join([
        "set terminal svg size 720,420 dynamic font 'sans,12'", f"set output '{svg}'",
        f"set title 'J = {stages}: {ylabel} against modelled time (mean of seeds "
        f"{' '.join(map(str, args.seeds))})'",
        "set xlabel 'modelled wall-clock time (s, log scale): steps x "
        f"{'measured' if args.step_ms else 'predicted'} seconds per step'",
        "set logscale x",
        f"set ylabel '{ylabel}'", "set key outside right", "set grid",
        f"plot {target} with lines dashtype 2 lc rgb 'gray' title 'target', \\",
        ", \\\n".join(f"  '{data}' index {i} with linespoints pointsize 0.5 title '{name}'"
                       for i, name in enumerate(by_name))])
    subprocess.run(["gnuplot"], input=script, text=True, check=True)
    return svg


def main(argv):
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    algorithms = dict(args.configs)
    rows, curves, target_lines, target_text = [], {}, {}, []
    for stages in [] if args.check_only else args.stages:
        want = targets(args, stages, algorithms)
        known = [v for v in want.values() if v is not None]
        target_lines[stages] = statistics.mean(known) if known else float("nan")
        if args.target_from is not None:
            target_text.append(f"J = {stages}: " + ", ".join(
                f"seed {seed} {v:.4g}" if v is not None else f"seed {seed} -"
                for seed, v in want.items()))
        for name, algorithm in args.configs:
            plan = run_json([args.stagewise, "plan", args.job, "-q", "--no-profile", "-o", "json"]
                            + overrides(args, name, algorithm, stages, args.seeds[0]),
                            os.path.join(args.out, f"plan_{name}_J{stages}.json"), args.reuse,
                            may_fail=True)
            if "error" in plan:  # e.g. more virtual stages than the model has blocks
                rows.append((name, algorithm, stages, None, None, None, None, plan["error"]))
                continue
            seconds = args.step_ms.get(name) or predicted_seconds(plan, algorithm)
            source, source_stages = args.same_as.get(name, (name, stages))
            reached, finals = [], []
            missing = [seed for seed in args.seeds if args.table_only and not os.path.exists(
                os.path.join(args.out, f"run_{source}_J{source_stages}_s{seed}.json"))]
            if missing:
                rows.append((name, algorithm, stages, None, None, None, None,
                             f"no run yet for seed {' '.join(map(str, missing))}"))
                continue
            for seed in args.seeds:
                _, evals = train(args, source, algorithms[source], source_stages, seed)
                hit = next((e["step"] for e in evals if quality(args, e, want[seed])[1]), None)
                reached.append(hit)
                finals.append(quality(args, evals[-1])[0] if evals else None)
                if seconds:
                    curves.setdefault(stages, {}).setdefault(name, []).append(
                        [(e["step"] * seconds, quality(args, e)[0]) for e in evals])
            times = [h * seconds if h is not None and seconds else None for h in reached]
            shared = f"{source} at J = {source_stages}" if (source, source_stages) != (name, stages) \
                else None
            rows.append((name, algorithm, stages, reached, seconds, times, finals, shared))
    check = []
    if args.check_stages:
        for name, algorithm in args.configs:
            plan = run_json([args.stagewise, "plan", args.job, "-q", "--no-profile", "-o", "json"]
                            + overrides(args, name, algorithm, args.check_stages, args.seeds[0]),
                            os.path.join(args.out, f"plan_{name}_J{args.check_stages}.json"),
                            args.reuse, may_fail=True)
            if "error" in plan:
                continue
            r, _ = train(args, name, algorithm, args.check_stages, args.seeds[0], check=True)
            if r is None:  # --table-only, not run yet
                continue
            measured = steady_seconds(os.path.join(
                args.out, f"check_{name}_J{args.check_stages}_s{args.seeds[0]}.tsv"))
            if measured is None and r.get("seconds"):  # too short for steady reports
                measured = r["seconds"] / max(1, r["step"])
            check.append((name, predicted_seconds(plan, algorithm), measured))

    what = ("test accuracy >=" if args.metric == "accuracy" else "validation bits per byte <=")
    slack = "" if not args.slack else (
        f" - {args.slack}" if args.metric == "accuracy" else f" x {1 + args.slack:g}")
    what += (f" {args.target}" if args.target_from is None else
             f" the final one of {args.target_from} with the same seed and J{slack} "
             f"({'; '.join(target_text)})")
    measured_text = "" if not args.step_ms else (
        "; ms per step measured (--step-ms) for " + ", ".join(sorted(args.step_ms)) +
        ", predicted for the others")
    lines = [] if args.check_only else [
        f"Target: {what}; budget {args.steps} steps, evaluated every {args.eval_every}; "
        f"seeds {' '.join(map(str, args.seeds))} (median [min, max]){measured_text}.", "",
        "| configuration | algorithm | J | steps to target | ms per step "
        "| time to target (s) | quality at the budget |",
        "|---|---|---|---|---|---|---|"]
    for name, algorithm, stages, reached, seconds, times, finals, shared in rows:
        if reached is None:
            lines.append(f"| {name} | `{algorithm}` | {stages} | not run: {shared} | - | - | - |")
            continue
        missed = sum(1 for h in reached if h is None)
        steps_text = spread(reached) + (f" ({missed} of {len(reached)} missed)" if missed else "")
        if name in args.budgets:
            steps_text += f" (budget {args.budgets[name]})"
        if shared:
            steps_text += f" (the run of {shared})"
        lines.append(f"| {name} | `{algorithm}` | {stages} | {steps_text} | "
                     f"{seconds * 1e3:.1f} | {spread(times)} | {spread(finals)} |"
                     if seconds else
                     f"| {name} | `{algorithm}` | {stages} | {steps_text} | - | - | {spread(finals)} |")
    if check:
        lines += ["", f"Model check at J = {args.check_stages} ({args.check_steps or args.steps} "
                  f"steps, seed {args.seeds[0]}; real processes on this machine's shared cores):",
                  "", "| configuration | predicted ms/step | measured ms/step "
                  "| measured / predicted |", "|---|---|---|---|"]
        for name, predicted, measured in check:
            ratio = f"{measured / predicted:.2f}" if predicted and measured else "-"
            lines.append(f"| {name} | {predicted * 1e3 if predicted else float('nan'):.1f} | "
                         f"{measured * 1e3 if measured else float('nan'):.1f} | {ratio} |")
    if args.plot and curves:  # none with --check-only
        lines += ["", "Curves: " + ", ".join(plot(args, stages, by_name, target_lines[stages])
                                             for stages, by_name in sorted(curves.items()))]
    table = "\n".join(lines).lstrip("\n") + "\n"
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table)
    print(table)
    print("command: " + " ".join(shlex.quote(a) for a in [sys.argv[0]] + argv))


if __name__ == "__main__":
    main(sys.argv[1:])
