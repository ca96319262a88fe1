#!/usr/bin/env bash
# Build promtool (Prometheus's rule checker and unit-test runner) from the Go module
# proxy, for `promtool test rules` on deploy/monitoring/prometheus-rule.yaml.
#
# Cached outside the work tree in
#   ${GPU_WEBHOOK_CACHE:-$HOME/.cache/gpu-webhook}/tools/promtool-<version>/promtool
# and a run that finds it there returns at once. Progress goes to stderr; the last line
# on stdout is the binary's path:  PROMTOOL=$(tools/promtool.sh | tail -n1)
set -euo pipefail

# Prometheus tags its Go module v0.<minor*100+...>: v0.316.0 is Prometheus 3.16.0.
PROMETHEUS_MODULE_VERSION="${PROMETHEUS_MODULE_VERSION:-v0.316.0}"

log() { printf '[promtool-build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

dir="${GPU_WEBHOOK_CACHE:-$HOME/.cache/gpu-webhook}/tools/promtool-$PROMETHEUS_MODULE_VERSION"
bin="$dir/promtool"
if [[ -x "$bin" ]]; then
    log "cached: $bin"
    echo "$bin"
    exit 0
fi

command -v go >/dev/null || die "go not found on PATH (promtool is built from the Go module proxy)"
export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-buildvcs=false"
mkdir -p "$dir"

# One build at a time (parallel test workers); a waiter finds the binary built.
if command -v flock >/dev/null; then
    exec 9>"$dir/.build.lock"
    flock 9
    if [[ -x "$bin" ]]; then echo "$bin"; exit 0; fi
fi

log "building github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_MODULE_VERSION ($(go env GOVERSION))"
GOBIN="$dir/.gobin" go install \
    "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_MODULE_VERSION" >&2
mv "$dir/.gobin/promtool" "$bin.tmp" && mv "$bin.tmp" "$bin"  # atomic: never half a binary
"$bin" --version >&2
log "built: $bin"
echo "$bin"
