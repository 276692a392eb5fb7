#!/usr/bin/env bash
# Time lost to one lost worker: today's rollback (recovery.replay: false)
# against replacing only its stage (recovery.replay: true), for a byte-level
# GPT of two stages of about 25 M parameters each, on local worker processes
# (`stagewise local --workers 3`: one idle worker to take a stage over; the
# killed one is started again at once).
#
# For each seed, interleaved: the job without a fault, then with one SIGKILL
# of a random worker at a random step (`--chaos 1 --chaos-seed SEED`, the
# same moment and victim for both modes) under rollback and under replay.
# Time lost = wall time with the kill - without; medians and spread over the
# seeds, and what each recovery redid.
#
#   tests/bench/replay_bench.sh [SEED ...]        (default: 1 2 3)
#   STEPS=30 EVERY=10 DEPTH=16 WIDTH=512 tests/bench/replay_bench.sh 4 5
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-build/bin}
seeds=("$@")
[[ ${#seeds[@]} -gt 0 ]] || seeds=(1 2 3)
steps=${STEPS:-30}
every=${EVERY:-10}
depth=${DEPTH:-16}
width=${WIDTH:-512}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

job() {  # job MODE(true|false) -> $work/job-MODE.yaml
  cat > "$work/job-$1.yaml" <<EOF
name: replay-bench
seed: 0
model: {name: gpt, depth: $depth, width: $width, heads: 8}
data: {dataset: fortunes, sequence_length: 64, train_size: 4096}
algorithm: {name: backprop, micro_batches: 4, schedule: 1f1b}
stages: {count: 2, partition: even}
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
  "$BIN/stagewise" local -q -o json --workers 3 --threads 1 "$@" > "$out"
  t1=$(date +%s.%N)
  echo "$label $(python3 -c "print(f'{$t1 - $t0:.2f}')") $out"
}

echo "# replay_bench: GPT depth $depth width $width (2 stages), $steps steps," \
  "checkpoints every $every; $(nproc) cores; seeds ${seeds[*]}"
rows=()
for seed in "${seeds[@]}"; do
  rows+=("$(run "clean-$seed" "$work/job-true.yaml")")
  rows+=("$(run "rollback-$seed" --chaos 1 --chaos-seed "$seed" "$work/job-false.yaml")")
  rows+=("$(run "replay-$seed" --chaos 1 --chaos-seed "$seed" "$work/job-true.yaml")")
  echo "${rows[-3]%% *} ${rows[-2]%% *} ${rows[-1]%% *} done" >&2
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
print("seed  mode      wall_s  lost_s  attempts  steps_redone(job)  replaced(stage: steps, replay_s, full_speed_s)")
for label in wall:
    mode, seed = label.split("-")
    if mode == "clean":
        print(f"{seed:4}  clean     {wall[label]:6.1f}")
        continue
    d = wall[label] - wall[f"clean-{seed}"]
    lost[mode].append(d)
    st = status(label)
    attempts = st.get("attempts", [])
    reps = [r for a in attempts for r in a.get("replacements", [])]
    rep = "; ".join(f"{r.get(\"stage\", 0)}: {r.get(\"steps_redone\", 0)}, {r.get(\"replay_seconds\", 0):.1f}, {r.get(\"full_speed_seconds\", 0):.1f}" for r in reps)
    print(f"{seed:4}  {mode:8}  {wall[label]:6.1f}  {d:6.1f}  {len(attempts):8}  {st.get(\"steps_redone\", 0):17}  {rep}")
for mode, xs in lost.items():
    if xs:
        print(f"# {mode}: time lost per failure, median {statistics.median(xs):.1f} s (min {min(xs):.1f}, max {max(xs):.1f}, n={len(xs)})")
if lost["rollback"] and lost["replay"] and statistics.median(lost["replay"]) > 0:
    print(f"# rollback / replay: {statistics.median(lost[\"rollback\"]) / statistics.median(lost[\"replay\"]):.2f}x")
'
