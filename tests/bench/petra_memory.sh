#!/usr/bin/env bash
# PETRA's memory at the model level, the way the PETRA paper counts it
# (Table 3), against delayed gradients with weight stashing and backprop:
# the quickstart RevNet-18 (width 16, 28x28 inputs) cut as the paper cuts it,
# one block per stage (J = 10), so that the three downsampling blocks, the
# stem and the head are stages of their own and every other stage is
# reversible. Runs the job three times with `stagewise local` (synthetic data,
# batch 64 as in the paper's table, long enough for every stage's buffer to
# fill) and prints the per-stage buffers, measured peaks and the savings
# (tests/bench/petra_memory.py). docs/results.md holds the numbers.
#   tests/bench/petra_memory.sh [STEPS] [BATCH]
#   STAGES='{partition: [[0, 3], [3, 5], [5, 7], [7, 10]]}' tests/bench/petra_memory.sh
#     another cut (here J = 4, each downsampling block first in its stage)
set -euo pipefail
cd "$(dirname "$0")/../.."
STEPS=${1:-40}
BATCH=${2:-64}
BIN=${BIN:-build/bin}
STAGES=${STAGES:-10}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for algorithm in petra delayed backprop; do
  cat > "$work/$algorithm.yaml" <<YAML
name: petra-memory-$algorithm
seed: 0
model: {name: revnet, depth: 18, width: 16, small_input: true}
data: {dataset: synthetic, shape: [1, 28, 28], classes: 10, train_size: 8192, test_size: 128}
algorithm: $algorithm
stages: $STAGES   # 10: one block per stage (stem, R, R, D, R, D, R, D, R, head)
optimizer: {name: sgd, lr: 0.05, momentum: 0.9}
batch_size: $BATCH
steps: $STEPS
eval: {at_end: false, every_epochs: 0}
YAML
  echo "running $algorithm ($STEPS steps of $BATCH, stages: $STAGES)" >&2
  "$BIN/stagewise" local -q -o json --threads 1 "$work/$algorithm.yaml" > "$work/$algorithm.json"
done
python3 tests/bench/petra_memory.py "$work/petra.json" "$work/delayed.json" "$work/backprop.json"
