#!/usr/bin/env bash
# stagewise train-local against a plain PyTorch twin of the quickstart model
# (tests/bench/pytorch_twin.py, Debian's python3-torch: the same LibTorch),
# side by side: every round runs both at every thread count, interleaved;
# medians and spread of samples/s and of the ratio stagewise / PyTorch.
# No environment variable is set for either program.
#   tests/bench/twin_bench.sh [ROUNDS] [STEPS] [THREADS...]
#   tests/bench/twin_bench.sh 3 60 1 2        (the defaults)
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

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for r in $(seq "$ROUNDS"); do
  for t in "${THREADS[@]}"; do
    "$BIN" train-local examples/quickstart.yaml --steps "$STEPS" --threads "$t" -o json -q \
      | python3 -c 'import json,sys; print(json.load(sys.stdin)["samples_per_second"])' \
      >>"$out/stagewise-$t"
    "$PY" tests/bench/pytorch_twin.py --threads "$t" --steps "$STEPS" \
      | python3 -c 'import json,sys; print(json.load(sys.stdin)["samples_per_second"])' \
      >>"$out/pytorch-$t"
    echo "round $r, $t thread(s): stagewise $(tail -1 "$out/stagewise-$t"), pytorch $(tail -1 "$out/pytorch-$t") samples/s" >&2
  done
done
python3 - "$out" "${THREADS[@]}" <<'EOF'
import statistics, sys
out, threads = sys.argv[1], sys.argv[2:]
print(f"{'threads':>7} {'stagewise samples/s':>26} {'pytorch samples/s':>26} {'ratio':>7} {'ratio spread':>13}")
for t in threads:
    s = [float(x) for x in open(f"{out}/stagewise-{t}")]
    p = [float(x) for x in open(f"{out}/pytorch-{t}")]
    ratios = [a / b for a, b in zip(s, p)]
    med = statistics.median(ratios)
    fmt = lambda v: f"{statistics.median(v):7.1f} [{min(v):6.1f}-{max(v):6.1f}]"
    print(f"{t:>7} {fmt(s):>26} {fmt(p):>26} {med:7.3f} {100 * (max(ratios) - min(ratios)) / med:12.1f}%")
EOF
