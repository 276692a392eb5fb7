#!/usr/bin/env bash
# stagewise train-local against a plain PyTorch twin of the quickstart model
# (tests/bench/pytorch_twin.py, Debian's python3-torch: the same LibTorch),
# side by side: every round runs both at every thread count, interleaved;
# medians and spread of samples/s and of the ratio stagewise / PyTorch.
# With TWIN=gpt, the byte-level GPT of tests/bench/gpt_twin.yaml against
# tests/bench/pytorch_gpt_twin.py, in tokens/s (docs/text.md).
# DEVICE=cuda:0 runs both on a GPU (the job gets `device: cuda:0`).
# No environment variable is set for either program.
#   tests/bench/twin_bench.sh [ROUNDS] [STEPS] [THREADS...]
#   tests/bench/twin_bench.sh 3 60 1 2        (the defaults)
#   TWIN=gpt tests/bench/twin_bench.sh 3 30 1 2
# Needs build/bin/stagewise (scripts/setup) and python3-torch.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${1:-3}
STEPS=${2:-60}
shift $(( $# > 2 ? 2 : $# )) || true
THREADS=("$@")
[ ${#THREADS[@]} -eq 0 ] && THREADS=(1 2)
BIN=${STAGEWISE_BIN:-build/bin/stagewise}
# Debian's interpreter: python3-torch installs there (not into other pythons on PATH).
PY=${PYTHON:-/usr/bin/python3}
[ -x "$BIN" ] || { echo "twin_bench: $BIN not built (scripts/setup)" >&2; exit 2; }
"$PY" -c 'import torch' 2>/dev/null || { echo "twin_bench: needs python3-torch (apt-get install python3-torch)" >&2; exit 2; }

case "${TWIN:-quickstart}" in
  quickstart) JOB=examples/quickstart.yaml; TWIN_PY=tests/bench/pytorch_twin.py; UNIT=samples_per_second ;;
  gpt) JOB=tests/bench/gpt_twin.yaml; TWIN_PY=tests/bench/pytorch_gpt_twin.py; UNIT=tokens_per_second ;;
  *) echo "twin_bench: TWIN must be quickstart or gpt" >&2; exit 2 ;;
esac
export UNIT

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
DEVICE=${DEVICE:-cpu}
if [ "$DEVICE" != cpu ]; then
  { cat "$JOB"; echo "device: $DEVICE"; } >"$out/job.yaml"
  JOB=$out/job.yaml
fi
for r in $(seq "$ROUNDS"); do
  for t in "${THREADS[@]}"; do
    "$BIN" train-local "$JOB" --steps "$STEPS" --threads "$t" -o json -q >"$out/s.json"
    "$PY" "$TWIN_PY" --threads "$t" --steps "$STEPS" --device "$DEVICE" >"$out/p.json"
    python3 - "$out" "$t" <<'EOF2'
import json, os, sys
out, t = sys.argv[1], sys.argv[2]
s, p = (json.load(open(f"{out}/{n}.json")) for n in ("s", "p"))
if s["parameters"] != p["parameters"]:
    sys.exit(f"twin_bench: parameter counts differ: stagewise {s['parameters']}, pytorch {p['parameters']}")
unit = os.environ["UNIT"]
print(s[unit], file=open(f"{out}/stagewise-{t}", "a"))
print(p[unit], file=open(f"{out}/pytorch-{t}", "a"))
EOF2
    echo "round $r, $t thread(s): stagewise $(tail -1 "$out/stagewise-$t"), pytorch $(tail -1 "$out/pytorch-$t") ${UNIT//_per_second/}/s" >&2
  done
done
python3 - "$out" "${THREADS[@]}" <<'EOF'
import os, statistics, sys
out, threads = sys.argv[1], sys.argv[2:]
unit = os.environ["UNIT"].replace("_per_second", "/s")
print(f"{'threads':>7} {'stagewise ' + unit:>26} {'pytorch ' + unit:>26} {'ratio':>7} {'ratio spread':>13}")
for t in threads:
    s = [float(x) for x in open(f"{out}/stagewise-{t}")]
    p = [float(x) for x in open(f"{out}/pytorch-{t}")]
    ratios = [a / b for a, b in zip(s, p)]
    med = statistics.median(ratios)
    fmt = lambda v: f"{statistics.median(v):7.1f} [{min(v):6.1f}-{max(v):6.1f}]"
    print(f"{t:>7} {fmt(s):>26} {fmt(p):>26} {med:7.3f} {100 * (max(ratios) - min(ratios)) / med:12.1f}%")
EOF
