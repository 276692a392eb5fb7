#!/usr/bin/env bash
# ctest -L deploy: the Prometheus configuration and rules of deploy/prometheus.
#   promtool check config  prometheus.yml (see below for the service discovery)
#   promtool check rules   rules/*.yml
#   promtool test rules    tests/*.test.yml (every recording rule and alert)
#   make-prometheusrule --check: the Operator's PrometheusRule holds exactly
#                          rules/stagewise.rules.yml
# Exit 77 (skipped) without promtool (scripts/setup installs `prometheus`).
set -euo pipefail
dir="$1/deploy/prometheus"
if ! command -v promtool >/dev/null; then
  echo "promtool not found (apt-get install prometheus): skipped"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Debian's Prometheus is built without Kubernetes service discovery, so the
# check swaps kubernetes_sd_configs for an equivalent file_sd_configs block;
# everything else (relabelling, honor_labels, rule files) is checked as is.
mkdir -p "$work/rules"
cp "$dir"/rules/*.yml "$work/rules/"
python3 - "$dir/prometheus.yml" "$work/prometheus.yml" <<'PY'
import sys
text = open(sys.argv[1]).read()
k8s = "    kubernetes_sd_configs:\n      - role: pod\n"
if k8s not in text:
    sys.exit("prometheus.yml: expected a kubernetes_sd_configs block with role: pod")
open(sys.argv[2], "w").write(text.replace(k8s, "    file_sd_configs:\n      - files: [targets.json]\n"))
PY
echo '[]' > "$work/targets.json"
promtool check config "$work/prometheus.yml"
python3 "$dir/make-prometheusrule" --check
promtool check rules "$dir"/rules/*.yml
cd "$dir" && promtool test rules tests/*.test.yml
