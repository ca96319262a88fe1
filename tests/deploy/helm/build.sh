#!/usr/bin/env bash
# Build helm (the Helm 3 CLI) from the Go module proxy for the chart tests
# (tests/deploy/test_helm_chart.py), cached outside the work tree in
#   ${GPU_WEBHOOK_CACHE:-$HOME/.cache/gpu-webhook}/tools/helm-<version>/helm
# A run that finds it there returns at once. First build: a few minutes on 2 cores
# (helm pulls in much of client-go, which the control plane build has already cached).
#
# The last line on stdout is the binary's path:  HELM=$(tests/deploy/helm/build.sh | tail -n1)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../../tools/gotool.sh"

HELM_VERSION="${HELM_VERSION:-v3.22.0}"
[[ "$HELM_VERSION" =~ ^v3\.[0-9]+\.[0-9]+$ ]] || {
    echo "HELM_VERSION must look like v3.Y.Z, got '$HELM_VERSION'" >&2; exit 1; }

# The version is stamped the way helm's Makefile does, so `helm version` tells the truth.
go_tool helm "$HELM_VERSION" helm.sh/helm/v3/cmd/helm -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
