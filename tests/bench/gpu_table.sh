#!/usr/bin/env bash
# The GPU data path's table in one run (docs/cuda.md): on one device, the
# byte-level GPT (tests/bench/gpt_twin.yaml at the sizes below) trained by
#   - `stagewise train-local` and its plain PyTorch twin (pytorch_gpt_twin.py),
#   - `stagewise local` with 2 stages on the device, backprop 1F1B over 4
#     micro-batches, the wire in fp32 and in bf16, with the workers' device
#     copies on the copy stream through pinned rings (the default) and as
#     before (STAGEWISE_DEVICE_COPIES=sync: on the compute stream, pageable),
#   - a plain PyTorch two-process pipeline of the same halves over gloo
#     (pytorch_gpt_pipeline.py),
#   - PETRA on the Reformer of the same size, 2 stages, and its train-local;
# every round runs every row once, interleaved; medians and ranges of
# tokens/s, and the ratios the issue asks for. Prints a markdown table.
#   DEVICE=cuda:0 tests/bench/gpu_table.sh           (the defaults: the issue's size)
#   DEVICE=cpu DEPTH=2 WIDTH=32 HEADS=4 T=32 BATCH=8 STEPS=4 ROUNDS=1 tests/bench/gpu_table.sh
# Environment: DEVICE, DEPTH (8), WIDTH (512), HEADS (8), T (256), BATCH (32),
# STEPS (60 per run), ROUNDS (3), THREADS (per process, 4), BIN_DIR (build/bin),
# PYTHON (/usr/bin/python3, with torch).
set -euo pipefail
cd "$(dirname "$0")/../.."
DEVICE=${DEVICE:-cuda:0}
DEPTH=${DEPTH:-8} WIDTH=${WIDTH:-512} HEADS=${HEADS:-8} T=${T:-256} BATCH=${BATCH:-32}
STEPS=${STEPS:-60} ROUNDS=${ROUNDS:-3} THREADS=${THREADS:-4}
BIN_DIR=${BIN_DIR:-build/bin}
PY=${PYTHON:-/usr/bin/python3}
[ -x "$BIN_DIR/stagewise" ] || { echo "gpu_table: $BIN_DIR/stagewise not built" >&2; exit 2; }
"$PY" -c 'import torch' 2>/dev/null || { echo "gpu_table: $PY has no torch" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

size=(--set "model.depth=$DEPTH" --set "model.width=$WIDTH" --set "model.heads=$HEADS"
      --set "data.sequence_length=$T" --set "batch_size=$BATCH" --set "device=$DEVICE")
pysize=(--depth "$DEPTH" --width "$WIDTH" --heads "$HEADS" --length "$T" --batch "$BATCH"
        --threads "$THREADS" --steps "$STEPS")
pipeline=(--set stages=2 --set 'algorithm={name: backprop, micro_batches: 4, schedule: 1f1b}')
reformer=(--set model.name=reformer --set stages=2 --set 'algorithm={name: petra}')
# tokens/s of a stagewise JSON result (samples/s x tokens per sample).
tokens() {
  "$PY" -c '
import json, sys
r = json.load(open(sys.argv[1]))
sps = r.get("samples_per_second") or r.get("samplesPerSecond") or 0
tps = r.get("tokens_per_sample", r.get("tokensPerSample", 0)) or float(sys.argv[2])
print(r.get("tokens_per_second") or sps * tps)' "$1" "$T"
}
row() {  # NAME COMMAND...: runs it, appends its tokens/s to $out/NAME
  local name=$1
  shift
  if ! "$@" >"$out/last.json" 2>"$out/last.err"; then
    echo "gpu_table: $name failed:" >&2
    tail -5 "$out/last.err" >&2
    echo nan >>"$out/$name"
    return
  fi
  tail -1 "$out/last.json" >"$out/last.line"
  tokens "$out/last.line" >>"$out/$name"
  echo "  $name: $(tail -1 "$out/$name") tokens/s" >&2
}
summary() {  # the table so far (printed after every round: a cut-short run still shows one)
  "$PY" - "$out" "$DEVICE" <<'EOF'
import math, statistics, sys
out, device = sys.argv[1], sys.argv[2]
def values(name):
    return [float(x) for x in open(f"{out}/{name}") if not math.isnan(float(x))]
def med(name):
    v = values(name)
    return statistics.median(v) if v else float("nan")
rows = [("train-local", "`train-local`, one process"),
        ("pytorch-twin", "plain PyTorch (pytorch_gpt_twin.py)"),
        ("local-fp32", "`local`, 2 stages on the device, 1F1B M = 4, fp32 wire"),
        ("local-bf16", "the same, `transport: {compression: bf16}`"),
        ("local-fp32-sync", "the same, fp32, `--device-copies sync` (the copies before: on the compute stream, pageable)"),
        ("local-bf16-sync", "the same, bf16, `--device-copies sync`"),
        ("gloo-pipeline", "plain PyTorch 2-process pipeline over gloo (pytorch_gpt_pipeline.py)"),
        ("petra-local", "PETRA on the Reformer, 2 stages"),
        ("petra-train-local", "`train-local` of that Reformer")]
print(f"device {device}; medians of every round, tokens/s [min-max]\n")
print("| what | tokens/s |\n|---|---|")
for key, what in rows:
    v = values(key)
    shown = f"{med(key):,.0f} [{min(v):,.0f}-{max(v):,.0f}]" if v else "failed"
    print(f"| {what} | {shown} |")
print()
for label, a, b in [("2 stages / train-local (fp32)", "local-fp32", "train-local"),
                    ("bf16 / fp32 (2 stages)", "local-bf16", "local-fp32"),
                    ("bf16 / fp32 (2 stages, sync copies)", "local-bf16-sync", "local-fp32-sync"),
                    ("stream / sync copies (fp32)", "local-fp32", "local-fp32-sync"),
                    ("stream / sync copies (bf16)", "local-bf16", "local-bf16-sync"),
                    ("train-local / PyTorch twin", "train-local", "pytorch-twin"),
                    ("2 stages / gloo pipeline", "local-fp32", "gloo-pipeline"),
                    ("PETRA 2 stages / its train-local", "petra-local", "petra-train-local")]:
    print(f"- {label}: {med(a) / med(b):.3f}")
EOF
}
S=$BIN_DIR/stagewise
for r in $(seq "$ROUNDS"); do
  echo "round $r" >&2
  row train-local "$S" train-local tests/bench/gpt_twin.yaml "${size[@]}" --steps "$STEPS" --threads "$THREADS" -q -o json
  row pytorch-twin "$PY" tests/bench/pytorch_gpt_twin.py "${pysize[@]}" --device "$DEVICE"
  row local-fp32 "$S" local tests/bench/gpt_twin.yaml "${size[@]}" "${pipeline[@]}" --steps "$STEPS" --threads "$THREADS" --devices "$DEVICE,$DEVICE" -q -o json
  row local-bf16 "$S" local tests/bench/gpt_twin.yaml "${size[@]}" "${pipeline[@]}" --set transport.compression=bf16 --steps "$STEPS" --threads "$THREADS" --devices "$DEVICE,$DEVICE" -q -o json
  STAGEWISE_DEVICE_COPIES=sync row local-fp32-sync "$S" local tests/bench/gpt_twin.yaml "${size[@]}" "${pipeline[@]}" --steps "$STEPS" --threads "$THREADS" --devices "$DEVICE,$DEVICE" -q -o json
  STAGEWISE_DEVICE_COPIES=sync row local-bf16-sync "$S" local tests/bench/gpt_twin.yaml "${size[@]}" "${pipeline[@]}" --set transport.compression=bf16 --steps "$STEPS" --threads "$THREADS" --devices "$DEVICE,$DEVICE" -q -o json
  row gloo-pipeline "$PY" tests/bench/pytorch_gpt_pipeline.py "${pysize[@]}" --micro-batches 4 --device "$DEVICE"
  row petra-local "$S" local tests/bench/gpt_twin.yaml "${size[@]}" "${reformer[@]}" --steps "$STEPS" --threads "$THREADS" --devices "$DEVICE,$DEVICE" -q -o json
  row petra-train-local "$S" train-local tests/bench/gpt_twin.yaml "${size[@]}" --set model.name=reformer --steps "$STEPS" --threads "$THREADS" -q -o json
  summary
done
