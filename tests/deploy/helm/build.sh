#!/usr/bin/env bash
# Build helm (the Helm 3 CLI) from the Go module proxy for the chart tests
# (tests/deploy/test_helm_chart.py), cached outside the work tree in
#   ${GPU_WEBHOOK_CACHE:-$HOME/.cache/gpu-webhook}/tools/helm-<version>/helm
# A run that finds it there returns at once. First build: a few minutes on 2 cores
# (helm pulls in much of client-go, which the control plane build has already cached).
#
# The last line on stdout is the binary's path:  HELM=$(tests/deploy/helm/build.sh | tail -n1)
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v3.22.0}"
[[ "$HELM_VERSION" =~ ^v3\.[0-9]+\.[0-9]+$ ]] || {
    echo "HELM_VERSION must look like v3.Y.Z, got '$HELM_VERSION'" >&2; exit 1; }

dir="${GPU_WEBHOOK_CACHE:-$HOME/.cache/gpu-webhook}/tools/helm-$HELM_VERSION"
if [[ -x "$dir/helm" ]]; then
    echo "$dir/helm"
    exit 0
fi
command -v go >/dev/null || { echo "go not found on PATH" >&2; exit 1; }
export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-buildvcs=false"
mkdir -p "$dir"
# One build at a time (parallel test workers); a waiter finds the binary built.
if command -v flock >/dev/null; then
    exec 9>"$dir/.build.lock"
    flock 9
    if [[ -x "$dir/helm" ]]; then echo "$dir/helm"; exit 0; fi
fi
tmp=$(mktemp -d "$dir/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "[helm-build $(date +%H:%M:%S)] go install helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
# The version is stamped the way helm's Makefile does, so `helm version` tells the truth.
GOBIN="$tmp" go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
mv "$tmp/helm" "$dir/helm"   # atomically complete: a cut-short build leaves no binary
echo "[helm-build $(date +%H:%M:%S)] built $dir/helm" >&2
echo "$dir/helm"
