#!/usr/bin/env bash
# Sourced by the scripts that build one Go command from the Go module proxy for the tests
# (tools/promtool.sh, tests/deploy/helm/build.sh): `go_tool NAME VERSION MODULE_PATH
# [go install flags...]` builds MODULE_PATH@VERSION into
#   ${GPU_WEBHOOK_CACHE:-$HOME/.cache/gpu-webhook}/tools/NAME-VERSION/NAME
# and prints that path as the last line on stdout. A binary found there is returned at
# once; parallel callers build it once (flock); a cut-short build leaves no binary.
set -euo pipefail

go_tool() {
    local name="$1" version="$2" module="$3"
    shift 3
    local dir="${GPU_WEBHOOK_CACHE:-$HOME/.cache/gpu-webhook}/tools/$name-$version"
    local bin="$dir/$name"
    if [[ -x "$bin" ]]; then
        echo "[$name-build $(date +%H:%M:%S)] cached: $bin" >&2
        echo "$bin"
        return 0
    fi
    command -v go >/dev/null || {
        echo "[$name-build] ERROR: go not found on PATH ($name is built from the Go module proxy)" >&2
        return 1
    }
    export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0
    export GOFLAGS="${GOFLAGS:+$GOFLAGS }-buildvcs=false"
    mkdir -p "$dir"
    # One build at a time (parallel test workers); a waiter finds the binary built.
    if command -v flock >/dev/null; then
        exec 9>"$dir/.build.lock"
        flock 9
        if [[ -x "$bin" ]]; then echo "$bin"; return 0; fi
    fi
    local tmp
    tmp=$(mktemp -d "$dir/.build.XXXXXX")
    echo "[$name-build $(date +%H:%M:%S)] go install $module@$version ($(go env GOVERSION))" >&2
    if ! GOBIN="$tmp" go install "$@" "$module@$version" >&2; then
        rm -rf "$tmp"
        return 1
    fi
    mv "$tmp/$name" "$bin.tmp" && mv "$bin.tmp" "$bin"  # atomic: never half a binary
    rm -rf "$tmp"
    echo "[$name-build $(date +%H:%M:%S)] built: $bin" >&2
    echo "$bin"
}
