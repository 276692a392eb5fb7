#!/usr/bin/env bash
# Do repeated profiles agree? Profiles a job's model N times from scratch
# (`stagewise plan --refresh`, each into its own cache directory), then prints,
# for every block and every timing column, the median over the runs and the
# largest deviation from it; the planner's choices are only as good as this.
#   tests/bench/profile_agreement.sh [JOB.yaml] [RUNS] [extra plan flags...]
#   tests/bench/profile_agreement.sh examples/quickstart.yaml 3      (the defaults)
# Exit 0 always; read the last line: the worst deviation over all blocks and
# columns (columns under 1 ms are listed but left out of it: timer noise).
set -euo pipefail
cd "$(dirname "$0")/../.."
JOB=${1:-examples/quickstart.yaml}
RUNS=${2:-3}
shift $(( $# > 2 ? 2 : $# )) || true
BIN=${STAGEWISE_BIN:-build/bin/stagewise}
[ -x "$BIN" ] || { echo "profile_agreement: $BIN not built (scripts/setup)" >&2; exit 2; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for r in $(seq "$RUNS"); do
  "$BIN" plan "$JOB" --partition auto --refresh -q --cache-dir "$dir/run$r" "$@" >/dev/null
  echo "profile $r of $RUNS done" >&2
done
python3 - "$dir" "$RUNS" <<'EOF'
import glob, statistics, sys
root, runs = sys.argv[1], int(sys.argv[2])
cols = ["forward", "forward_nograd", "backward", "rebuild_backward", "inverse", "step", "message", "aux_head"]
profiles = []
for r in range(1, runs + 1):
    files = glob.glob(f"{root}/run{r}/**/*", recursive=True)
    files = [f for f in files if not f.endswith("/") and open(f, errors="replace").read(9) != ""]
    blocks = {}
    for f in files:
        for line in open(f, errors="replace"):
            p = line.split()
            if p and p[0] == "block":
                blocks[int(p[1])] = (p[2], [float(x) for x in p[4:12]])
    profiles.append(blocks)
worst = (0.0, "")
print(f"{'block':>5} {'kind':<11} {'column':<17} {'median ms':>10} {'max dev':>8}")
for b in sorted(profiles[0]):
    kind = profiles[0][b][0]
    for c, name in enumerate(cols):
        v = [p[b][1][c] for p in profiles]
        med = statistics.median(v)
        if med <= 0:
            continue
        dev = max(abs(x - med) for x in v) / med
        note = "" if med >= 1e-3 else "  (under 1 ms)"
        print(f"{b:>5} {kind:<11} {name:<17} {1e3 * med:10.3f} {100 * dev:7.1f}%{note}")
        if med >= 1e-3 and dev > worst[0]:
            worst = (dev, f"block {b} {name}")
print(f"worst deviation from the median over {runs} profiles: {100 * worst[0]:.1f}% ({worst[1]})")
EOF
