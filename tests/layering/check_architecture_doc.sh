#!/usr/bin/env bash
# docs/architecture.md names every source folder: each folder under worker/,
# coordinator/, clients/ and services/ that holds a header or a source file
# appears as "folder/", and every services/* library in the Layers diagram.
#   check_architecture_doc.sh SOURCE_DIR
set -euo pipefail
src=${1:?source dir}
cd "$src"
doc=docs/architecture.md
fail=0
folders=$(git ls-files 'worker/*' 'coordinator/*' 'clients/*' 'services/*' 2>/dev/null |
  grep -E '\.(h|cc)$' | xargs -n1 dirname | sort -u)
[ -n "$folders" ] || folders=$(find worker coordinator clients services -name '*.h' -o -name '*.cc' |
  xargs -n1 dirname | sort -u)
for d in $folders; do
  if ! grep -qF "$d/" "$doc"; then
    echo "architecture: $doc does not name $d/"
    fail=1
  fi
done
layers=$(sed -n '/^## Layers/,/^## /p' "$doc")
for d in services/*/; do
  name=$(basename "$d")
  if ! grep -qw "$name" <<<"$layers"; then
    echo "architecture: the Layers diagram of $doc does not show services/$name"
    fail=1
  fi
done
if [ "$fail" = 0 ]; then echo "architecture: every folder is named"; fi
exit "$fail"
