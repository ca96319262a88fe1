#!/usr/bin/env bash
# Build promtool (Prometheus's rule checker and unit-test runner) from the Go module
# proxy, for `promtool test rules` on deploy/monitoring/prometheus-rule.yaml.
#
# Cached outside the work tree in
#   ${GPU_WEBHOOK_CACHE:-$HOME/.cache/gpu-webhook}/tools/promtool-<version>/promtool
# and a run that finds it there returns at once. Progress goes to stderr; the last line
# on stdout is the binary's path:  PROMTOOL=$(tools/promtool.sh | tail -n1)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gotool.sh"

# Prometheus tags its Go module v0.<minor*100+...>: v0.316.0 is Prometheus 3.16.0.
PROMETHEUS_MODULE_VERSION="${PROMETHEUS_MODULE_VERSION:-v0.316.0}"

go_tool promtool "$PROMETHEUS_MODULE_VERSION" github.com/prometheus/prometheus/cmd/promtool
