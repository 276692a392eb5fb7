#!/usr/bin/env bash
# Time lost to one lost worker: today's rollback (recovery.replay: false)
# against replacing only its stage (recovery.replay: true), for two stages of
# about 25 M parameters each (Adam: 300 MB of state per stage in its shard),
# on local worker processes (`stagewise local --workers 3`: one idle worker
# to take a stage over; the killed one is started again at once). The
# stages' forward and backward are emulated accelerator work (docs/models.md,
# "Emulated accelerators": 64 blocks a stage, each waiting FORWARD_MS and
# BACKWARD_MS per mini-batch), so that a 2-core machine measures the
# recovery, not the cores; the parameters, the optimizer, the shards, the
# messages (3 MB a micro-batch) and their replay are real.
#
# For each seed, interleaved: the job without a fault, then with one SIGKILL
# of a random worker at a random step (`--chaos 1 --chaos-seed SEED`, the
# same moment and victim for both modes) under rollback and under replay.
# Time lost = wall time with the kill - without; medians and spread over the
# seeds, and what each recovery redid.
#
# With REPLICAS=R > 1 each stage has R replicas (2R + 1 workers): replay then
# means a lost replica copies a surviving one's live state
# (docs/fault_tolerance.md, "Replacing a replica").
#
#   tests/bench/replay_bench.sh [SEED ...]        (default: 1 2 3)
#   STEPS=60 EVERY=20 FORWARD_MS=2 BACKWARD_MS=4 tests/bench/replay_bench.sh 4 5
#   REPLICAS=2 tests/bench/replay_bench.sh 1 2
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-build/bin}
seeds=("$@")
[[ ${#seeds[@]} -gt 0 ]] || seeds=(1 2 3)
steps=${STEPS:-60}
every=${EVERY:-20}
forward_ms=${FORWARD_MS:-2}
backward_ms=${BACKWARD_MS:-4}
replicas=${REPLICAS:-1}
workers=$((2 * replicas + 1))
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

job() {  # job MODE(true|false) -> $work/job-MODE.yaml
  cat > "$work/job-$1.yaml" <<EOF
name: replay-bench
seed: 0
model: {name: emulated, depth: 128, forward_ms: $forward_ms, backward_ms: $backward_ms}
data: {dataset: synthetic, shape: [4, 384, 256], train_size: 128, test_size: 16}
algorithm: {name: backprop, micro_batches: 4, schedule: 1f1b}
stages: {count: 2, replicas: $replicas, partition: even}
optimizer: {name: adam, lr: 1.0e-4}
batch_size: 8
steps: $steps
eval: {at_end: false}
checkpoint: {dir: $work/checkpoints, every_steps: $every, keep: 2}
recovery: {replay: $1, max_restarts: 3}
EOF
}
job true
job false

run() {  # run LABEL ARGS... -> "LABEL <wall s> <result json file>"
  local label=$1
  shift
  local out="$work/$label.json"
  local t0 t1
  t0=$(date +%s.%N)
  "$BIN/stagewise" local -q -o json --workers "$workers" --threads 1 "$@" > "$out"
  t1=$(date +%s.%N)
  echo "$label $(python3 -c "print(f'{$t1 - $t0:.2f}')") $out"
}

echo "# replay_bench: 2 stages of 25 M parameters x $replicas replica(s) (emulated blocks," \
  "${forward_ms}/${backward_ms} ms), $steps steps, checkpoints every $every; $(nproc) cores; seeds ${seeds[*]}"
rows=()
for seed in "${seeds[@]}"; do
  rows+=("$(run "clean-$seed" "$work/job-true.yaml")")
  rows+=("$(run "rollback-$seed" --chaos 1 --chaos-seed "$seed" "$work/job-false.yaml")")
  rows+=("$(run "replay-$seed" --chaos 1 --chaos-seed "$seed" "$work/job-true.yaml")")
  printf '# %s\n' "${rows[@]: -3}" >&2
done
printf '%s\n' "${rows[@]}" | python3 -c '
import json, statistics, sys
rows = [l.split() for l in sys.stdin if l.strip()]
wall = {label: float(w) for label, w, _ in rows}
files = {label: f for label, _, f in rows}
def status(label):
    text = open(files[label]).read()
    return json.loads(text[text.index("{"):])
lost = {"rollback": [], "replay": []}
print("seed  mode      wall_s  lost_s  attempts  steps_redone(job)  replaced(stage: steps, replay_s, full_speed_s[, copied MB in s])")
for label in wall:
    mode, seed = label.split("-")
    if mode == "clean":
        print("%4s  clean     %6.1f" % (seed, wall[label]))
        continue
    d = wall[label] - wall["clean-" + seed]
    lost[mode].append(d)
    st = status(label)
    attempts = st.get("attempts") or []
    reps = [r for a in attempts for r in (a.get("replacements") or [])]
    def copied(r):
        if not r.get("copied_bytes"):
            return ""
        return ", copied %.0f MB in %.1f s" % (r["copied_bytes"] / 1e6, r.get("copy_seconds") or 0)
    rep = "; ".join("%d: %d, %.1f, %.1f%s" % (r.get("stage", 0), r.get("steps_redone", 0),
                                               r.get("replay_seconds", 0), r.get("full_speed_seconds", 0),
                                               copied(r))
                    for r in reps)
    print("%4s  %-8s  %6.1f  %6.1f  %8d  %17d  %s" % (seed, mode, wall[label], d, len(attempts),
                                                   st.get("steps_redone", 0), rep))
for mode, xs in lost.items():
    if xs:
        print("# %s: time lost per failure, median %.1f s (min %.1f, max %.1f, n=%d)" %
              (mode, statistics.median(xs), min(xs), max(xs), len(xs)))
if lost["rollback"] and lost["replay"] and statistics.median(lost["replay"]) > 0:
    print("# rollback / replay: %.2fx" % (statistics.median(lost["rollback"]) / statistics.median(lost["replay"])))
'
