#!/usr/bin/env bash
# One accuracy measurement for docs/results.md: an example job with some of
# its keys changed, run to the end, and one result line printed
#   <label>  <test accuracy %>  <wall seconds>  <summary values...>
# (text jobs: the byte accuracy, and bits_per_byte first among the values).
# Distributed algorithms run on local worker processes (`stagewise local`);
# `--reference` runs the job in one process with plain backpropagation
# (`stagewise train-local`, the trainer the oracle tests hold pipelined
# backprop to), whatever its algorithm section says.
#
#   tests/bench/accuracy.sh [--reference] [--label L] EXAMPLE.yaml [KEY=VALUE ...]
#     KEY is a dotted path into the job (algorithm.beta, seed, epochs); VALUE
#     is YAML (0.1, [[0, 4], [4, 11]], {name: nwise, n: 2}).
#   tests/bench/accuracy.sh examples/fmnist_resnet_replay.yaml seed=1 epochs=8
#   tests/bench/accuracy.sh --reference examples/fmnist_resnet_replay.yaml seed=1 epochs=8
#
# Lines go to standard output and, with RESULTS=FILE, are appended there too.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-build/bin}
reference=0
label=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --reference) reference=1; shift ;;
    --label) label=$2; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) break ;;
  esac
done
if [[ $# -lt 1 ]]; then
  echo "usage: $0 [--reference] [--label L] EXAMPLE.yaml [KEY=VALUE ...]" >&2
  exit 2
fi
example=$1
shift
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Keys are set with Python's YAML library (Debian's python3-yaml); a relative
# model or data path stays relative to the example's folder.
python3 - "$example" "$work/job.yaml" "$@" <<'PY'
import sys, os, yaml
src, dst, *sets = sys.argv[1:]
with open(src) as f:
    job = yaml.safe_load(f)
for s in sets:
    if "=" not in s:
        sys.exit(f"accuracy.sh: '{s}' is not KEY=VALUE")
    key, value = s.split("=", 1)
    node = job
    parts = key.split(".")
    for p in parts[:-1]:
        if not isinstance(node.get(p), dict):
            node[p] = {"name": node[p]} if isinstance(node.get(p), str) else {}
        node = node[p]
    node[parts[-1]] = yaml.safe_load(value)
model = job.get("model", {})
if isinstance(model, dict) and "path" in model and not os.path.isabs(model["path"]):
    model["path"] = os.path.abspath(os.path.join(os.path.dirname(src), model["path"]))
with open(dst, "w") as f:
    yaml.safe_dump(job, f, sort_keys=False)
PY
if [[ -z "$label" ]]; then
  label="$(basename "$example" .yaml) $*"
  [[ $reference == 0 ]] || label="$label (reference backprop)"
fi
start=$(date +%s.%N)
if [[ $reference == 1 ]]; then
  "$BIN/stagewise" train-local -q -o json --threads "${THREADS:-$(nproc)}" "$work/job.yaml" > "$work/out.json"
else
  "$BIN/stagewise" local -q -o json --threads "${THREADS:-1}" "$work/job.yaml" > "$work/out.json"
fi
end=$(date +%s.%N)
line=$(python3 - "$work/out.json" "$label" "$start" "$end" <<'PY'
import sys, json
out, label, start, end = sys.argv[1:]
text = open(out).read()
r = json.loads(text[text.index("{"):])
acc = r.get("eval_accuracy")  # train-local and local: one schema (docs/cli.md)
if acc is None:
    sys.exit(f"accuracy.sh: no accuracy in the result: {text[:400]}")
keep = ("relative_violation_end", "serial_gap_end", "serial_train_loss", "local_loss")
extra = [f"{k}={v:.4g}" for k, v in sorted((r.get("summary") or {}).items())
         if k.split(".")[-1] in keep or ".rebuild_error." in k]  # petra's verify_rebuild
bpb = r.get("eval_bits_per_byte")  # text jobs (docs/text.md)
if bpb is not None:
    extra.insert(0, f"bits_per_byte={bpb:.4f}")
if "train_loss" in r:  # train-local: the mean of the last logging window; local: the last reported loss
    extra.append(f"train_loss={r['train_loss']:.4g}")
print(f"{label}\t{100 * acc:.2f}\t{float(end) - float(start):.0f}s\t{' '.join(extra)}")
PY
)
echo "$line"
[[ -z "${RESULTS:-}" ]] || echo "$line" >> "$RESULTS"
