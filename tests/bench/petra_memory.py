#!/usr/bin/env python3
"""PETRA's memory against delayed gradients with weight stashing and backprop.

Reads the JSON results (`stagewise local -o json`) of one job run three
times, as petra, delayed and backprop, and prints per stage what each one
buffers and its measured tensor peak, then the totals the way the PETRA paper
counts them (Table 3: model + input buffers + parameter buffers, without
stage 0's input buffer, which holds dataset inputs that can be read again).
tests/bench/petra_memory.sh runs the jobs; see docs/results.md.

    petra_memory.py petra.json delayed.json backprop.json
"""
import json
import sys


def stages(path):
    doc = json.load(open(path))
    if doc.get("state") != "SUCCEEDED":
        sys.exit(f"{path}: the job did not succeed: {doc.get('state')} {doc.get('reason')}")
    out = {}
    for key, value in doc["summary"].items():
        stage, name = key.split(".", 1)
        out.setdefault(int(stage[len("stage"):]), {})[name] = value if isinstance(value, (int, float)) else 0
    return doc, [out[j] for j in sorted(out)]


def mib(x):
    return f"{x / 2**20:9.2f}"


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    pdoc, petra = stages(sys.argv[1])
    ddoc, delayed = stages(sys.argv[2])
    bdoc, backprop = stages(sys.argv[3])
    J = len(petra)
    # Model bytes per stage: one stashed version is the stage's parameters.
    model = [s.get("peak_stashed_parameter_bytes", 0) / max(1, s.get("peak_stashed_versions", 1)) for s in delayed]
    print(f"{J} stages, {pdoc['step']} steps; MiB (the last stage buffers nothing; its parameters,"
          " the head's, are not counted)")
    print("stage  in-flight    params  delayed:inputs  delayed:stash  petra:inputs"
          "  peak:backprop  peak:delayed  peak:petra")
    tot = {"model": 0, "d_in": 0, "d_stash": 0, "p_in": 0, "b_peak": 0, "d_peak": 0, "p_peak": 0}
    for j in range(J):
        d, p, b = delayed[j], petra[j], backprop[j]
        print(f"{j:5d}  {int(d.get('peak_inputs', 0)):9d} {mib(model[j])}       {mib(d.get('peak_input_bytes', 0))}"
              f"      {mib(d.get('peak_stashed_parameter_bytes', 0))}     {mib(p.get('peak_input_bytes', 0))}"
              f"      {mib(b.get('peak_memory_bytes', 0))}     {mib(d.get('peak_memory_bytes', 0))}"
              f"   {mib(p.get('peak_memory_bytes', 0))}")
        tot["model"] += model[j]
        if j > 0:
            tot["d_in"] += d.get("peak_input_bytes", 0)
            tot["p_in"] += p.get("peak_input_bytes", 0)
        else:
            # Stage 0's own input buffer holds dataset inputs, which can be
            # read again (the paper leaves it out); delayed buffers only that,
            # petra also the inputs of non-reversible blocks inside the stage.
            tot["p_in"] += max(0, p.get("peak_input_bytes", 0) - d.get("peak_input_bytes", 0))
        tot["d_stash"] += d.get("peak_stashed_parameter_bytes", 0)
        tot["b_peak"] += b.get("peak_memory_bytes", 0)
        tot["d_peak"] += d.get("peak_memory_bytes", 0)
        tot["p_peak"] += p.get("peak_memory_bytes", 0)
    rows = [
        ("delayed: inputs and parameters buffered", tot["model"] + tot["d_in"] + tot["d_stash"]),
        ("delayed: inputs only (no stashing)", tot["model"] + tot["d_in"]),
        ("reversible stages buffer nothing, parameters stashed", tot["model"] + tot["p_in"] + tot["d_stash"]),
        ("petra: reversible stages buffer nothing, no stash", tot["model"] + tot["p_in"]),
    ]
    base = rows[0][1]
    print("\nmodel + buffers (the PETRA paper's Table 3 count; stage 0's input buffer, dataset inputs,"
          " left out):")
    for name, value in rows:
        print(f"  {name:52s} {value / 2**20:9.2f} MiB   saving {100 * (1 - value / base):5.1f}%")
    print("\nmeasured peak of tensor memory, summed over stages (model, buffers, working memory):")
    for name, key in (("backprop", "b_peak"), ("delayed", "d_peak"), ("petra", "p_peak")):
        print(f"  {name:10s} {tot[key] / 2**20:9.2f} MiB   against delayed {100 * (1 - tot[key] / tot['d_peak']):5.1f}% less")


if __name__ == "__main__":
    main()
