#!/bin/bash
# Smoke run of tests/bench/time_to_target.py on the MLP (a few seconds of
# training per run): two stage counts, an exact schedule whose J = 3 row takes
# its J = 2 run (--same), a decoupled one with its own budget, a configuration
# the model cannot hold (more virtual stages than blocks), the real-process
# check and the plot; the target is 1F1B's final accuracy per seed. Asserts the
# table's rows, that --reuse trains nothing, that --table-only says which
# runs are missing and that --check-only runs the model check alone.
#   BIN=build/bin bash tests/bench/time_to_target_smoke.sh
set -euo pipefail
BIN=${BIN:-build/bin}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
run() {
  python3 tests/bench/time_to_target.py examples/fmnist_mlp.yaml --stagewise "$BIN/stagewise" \
    --out "$out" --target-accuracy final:1f1b --stages 2 3 --seeds 1 2 --steps 12 --eval-every 4 \
    --check-stages 2 --check-steps 8 --plot \
    --set data.limit_train=2048 --set data.limit_test=512 \
    --config '1f1b=backprop, micro_batches: 2, schedule: 1f1b' \
    --config 'delayed=delayed, lr_by_delay: inverse_sqrt' \
    --config 'interleaved=backprop, micro_batches: 2, schedule: interleaved' \
    --config-set 'interleaved:stages.chunks_per_worker=4' \
    --same '1f1b=1f1b@2' --budget delayed=16 "$@"
}
run > "$out/first.txt" 2> "$out/first.err" || { cat "$out/first.err"; exit 1; }
fail() { echo "FAIL: $*"; cat "$out/first.txt"; exit 1; }
table="$out/table.md"
[ -s "$table" ] || fail "no table"
grep -q '^Target: test accuracy >= the final one of 1f1b with the same seed and J (J = 2: seed 1 0\.[0-9]*, seed 2 0\.[0-9]*' "$table" \
  || fail "no per-seed target"
# 1F1B reaches its own final accuracy, at the latest at its last evaluation.
grep -q '^| 1f1b | .* | 2 | [0-9.]* \[[0-9]*, [0-9]*\] | ' "$table" \
  || grep -q '^| 1f1b | .* | 2 | [0-9.]* | ' "$table" || fail "1f1b at J = 2 misses its own final"
grep -q '^| 1f1b | .* | 3 | .*(the run of 1f1b at J = 2)' "$table" || fail "J = 3 row does not take the J = 2 run"
grep -q '^| delayed | .* | 3 | .*(budget 16)' "$table" || fail "delayed row without its budget"
grep -q '^| interleaved | .* | 2 | not run: .*chunks' "$table" || fail "interleaved row does not say why"
grep -q '^| delayed | [0-9.]* | [0-9.]* | [0-9.]* |$' "$table" || fail "no model check row for delayed"
[ -s "$out/curves_J3.svg" ] || fail "no plot"
[ ! -e "$out/run_1f1b_J3_s1.json" ] || fail "1f1b trained at J = 3 despite --same"
# Its J = 2 run serves both rows, trained once.
[ "$(grep -c '^\$ .* local .*run_1f1b_J2_s1' "$out/first.err")" = 1 ] || fail "1f1b J = 2 trained twice"
[ -e "$out/run_delayed_J3_s2.json" ] || fail "delayed seed 2 did not run at J = 3"
# Every step of the delayed budget was trained.
grep -q '"step": *16' "$out/run_delayed_J3_s2.json" || fail "delayed did not run its budget of 16"
run --reuse > "$out/second.txt" 2> "$out/second.err"
! grep -q '^\$ .* local ' "$out/second.err" || fail "--reuse trained again"
rm "$out"/run_delayed_J3_s2.*
run --table-only > "$out/third.txt" 2> "$out/third.err"
! grep -q '^\$ .* local ' "$out/third.err" || fail "--table-only trained"
grep -q '^| delayed | .* | 3 | not run: no run yet for seed 2 ' "$out/third.txt" \
  || fail "--table-only does not name the missing run"
# --check-only: the model check alone (the missing check run trains; no run
# to the target does, and no target table is printed).
rm "$out"/check_delayed_J2_s1.*
run --check-only --reuse > "$out/fourth.txt" 2> "$out/fourth.err"
grep -q '^\$ .* local .*check_delayed_J2_s1' "$out/fourth.err" || fail "--check-only did not check delayed"
! grep -q '^\$ .* local .*run_' "$out/fourth.err" || fail "--check-only trained to the target"
! grep -q '^Target:' "$out/fourth.txt" || fail "--check-only printed the target table"
grep -q '^| delayed | [0-9.]* | [0-9.]* | [0-9.]* |$' "$out/fourth.txt" \
  || fail "--check-only without the model check"
# --step-ms prices a row with a measured time instead of the plan's, and
# --slack loosens every seed's target (accuracy: minus the slack).
run --table-only --step-ms '1f1b=1000' --slack 0.5 > "$out/fifth.txt" 2> "$out/fifth.err"
grep -q '^Target: .*the final one of 1f1b with the same seed and J - 0\.5 ' "$out/fifth.txt" \
  || fail "--slack not in the target"
grep -q 'ms per step measured (--step-ms) for 1f1b' "$out/fifth.txt" || fail "--step-ms not said"
grep -q '^| 1f1b | .* | 2 | [0-9.]* .*| 1000\.0 | ' "$out/fifth.txt" || fail "1f1b not priced at 1000 ms"
! grep -q '^| delayed | .* | 2 | .*| 1000\.0 | ' "$out/fifth.txt" || fail "--step-ms priced another row"
echo "time_to_target smoke: ok"
