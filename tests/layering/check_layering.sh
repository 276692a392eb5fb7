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
if [ -n "$coordinator_bin" ]; then
  if [ ! -x "$coordinator_bin" ]; then
    echo "layering: $coordinator_bin is not built"; fail=1
  elif ldd "$coordinator_bin" | grep -E 'libtorch|libc10' ; then
    echo "layering: $coordinator_bin links LibTorch (above)"; fail=1
  fi
fi
if [ "$fail" = 0 ]; then echo "layering: ok"; fi
exit "$fail"
