#!/usr/bin/env bash
# Dependency direction (docs/architecture.md, "Layers"): the executables'
# folders (worker/, coordinator/, clients/) sit on top of services/ and never
# include one another; services/ includes none of them; and the coordinator
# binary does not link LibTorch.
#   check_layering.sh SOURCE_DIR [COORDINATOR_BINARY]
set -euo pipefail
src=${1:?source dir}
coordinator_bin=${2:-}
cd "$src"
fail=0
tops=(worker coordinator clients)
for top in "${tops[@]}" services; do
  for other in "${tops[@]}"; do
    [ "$top" = "$other" ] && continue
    hits=$(grep -rnE "^#include \"${other}/" "$top" --include='*.h' --include='*.cc' || true)
    if [ -n "$hits" ]; then
      echo "layering: files under $top/ include $other/ (move the shared code to services/):"
      echo "$hits"
      fail=1
    fi
  done
done
# The coordinator's own sources never include LibTorch.
hits=$(grep -rnE '^#include <(torch|ATen|c10)/' coordinator --include='*.h' --include='*.cc' || true)
if [ -n "$hits" ]; then
  echo "layering: coordinator/ includes LibTorch:"; echo "$hits"; fail=1
fi
# The job spec's closed sets (algorithm, pipeline schedule, block modes,
# compression, partition, optimizer and lr schedule names, the algorithms'
# enum parameters, model names and styles, datasets) are enums outside
# services/spec/: no code compares their spellings as strings
# (services/spec/enums.h is their one home). "emulated" is left out: it is
# also a block kind (models::BlockInfo::kind, a display name).
names='backprop|delayed|features_replay|petra|nwise|auxnet|gpipe|1f1b|stash|current|store|rebuild|auto|none|fp16|bf16|distill|direct|mse|relative|serial|local|balanced|even|explicit|sgd|adam|constant|multistep|cosine|conv|mlp|resnet|revnet|torchscript|cifar|imagenet|fashion_mnist|cifar10|cifar100|synthetic'
hits=$(grep -rnE "(==|!=) *\"($names)\"|\"($names)\" *(==|!=)|\bIs\([^,]+, *\"($names)\"" \
  worker coordinator clients services --include='*.h' --include='*.cc' | grep -v '^services/spec/' || true)
if [ -n "$hits" ]; then
  echo "layering: string comparisons against job-spec names (compare the enums of services/spec/enums.h):"
  echo "$hits"; fail=1
fi
# Why an attempt ended is a v1::EndCause (coordinator/end_cause.h): no code
# or test compares a cause's label.
causes='worker_lost|stage_error|configure_timeout|stalled|corrupt_checkpoint|coordinator_restart|preempted|grow|rebalance|priority'
hits=$(grep -rnE "(==|!=) *\"($causes)\"|\"($causes)\" *(==|!=)|end_cause\(\)( *[!=]=|, *\")" \
  worker coordinator clients services tests --include='*.h' --include='*.cc' || true)
if [ -n "$hits" ]; then
  echo "layering: end causes compared as strings (compare v1::EndCause):"; echo "$hits"; fail=1
fi
# Inside coordinator/ the units (x.h with x.cc) include one another in one
# direction only: no cycle.
if ! python3 - <<'PY'
import glob, os, re, sys
graph = {}
for f in glob.glob("coordinator/*.h") + glob.glob("coordinator/*.cc"):
    unit = os.path.basename(f).rsplit(".", 1)[0]
    for inc in re.findall(r'^#include "coordinator/([a-z_0-9]+)\.h"', open(f).read(), re.M):
        if inc != unit:
            graph.setdefault(unit, set()).add(inc)
def reaches(a, b):
    seen, todo = set(), [a]
    while todo:
        x = todo.pop()
        if x == b:
            return True
        if x not in seen:
            seen.add(x)
            todo.extend(graph.get(x, ()))
    return False
bad = sorted({tuple(sorted((a, b))) for a in graph for b in graph[a] if reaches(b, a)})
for a, b in bad:
    print(f"layering: coordinator/{a} and coordinator/{b} include each other (directly or not)")
sys.exit(1 if bad else 0)
PY
then
  fail=1
fi
# What an algorithm sees stays small: at most 25 virtual methods on
# StageContext (its destructor not counted).
virtuals=$(python3 - worker/stage_context.h <<'PY'
import re, sys
text = open(sys.argv[1]).read()
body = text[text.index("class StageContext {"):]
body = body[:body.index("\n};")]
print(len([m for m in re.findall(r"^\s*virtual\s+([^;{]*)", body, re.M) if "~" not in m]))
PY
)
if [ "$virtuals" -gt 25 ]; then
  echo "layering: StageContext has $virtuals virtual methods (at most 25)"; fail=1
fi
if [ -n "$coordinator_bin" ]; then
  if [ ! -x "$coordinator_bin" ]; then
    echo "layering: $coordinator_bin is not built"; fail=1
  elif ldd "$coordinator_bin" | grep -E 'libtorch|libc10' ; then
    echo "layering: $coordinator_bin links LibTorch (above)"; fail=1
  fi
fi
if [ "$fail" = 0 ]; then echo "layering: ok"; fi
exit "$fail"
