#!/usr/bin/env bash
# Build Kyverno's admission controller (cmd/kyverno) at a pinned tag, for the side-by-side
# run of bench/apiserver.py (Kyverno doing the same stateless work as gpu-webhook).
#
# The source comes from a git directory of github.com/kyverno/kyverno (KYVERNO_GIT_DIR,
# e.g. a bare mirror); the tag is exported with `git archive`, built with the Go module
# proxy for its dependencies. Cached outside the work tree in
#   ${GPU_WEBHOOK_CACHE:-$HOME/.cache/gpu-webhook}/tools/kyverno-<tag>/
# with the binary `kyverno` and the tag's CRDs (`crds/`, from config/crds), and a run that
# finds them there returns at once. Progress goes to stderr; the last line on stdout is
# the directory:  KYVERNO_DIR=$(tools/kyverno.sh | tail -n1)
set -euo pipefail

KYVERNO_TAG="${KYVERNO_TAG:-v1.19.0}"

log() { printf '[kyverno-build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

dir="${GPU_WEBHOOK_CACHE:-$HOME/.cache/gpu-webhook}/tools/kyverno-$KYVERNO_TAG"
bin="$dir/kyverno"
if [[ -x "$bin" && -d "$dir/crds" ]]; then
    log "cached: $dir"
    echo "$dir"
    exit 0
fi

command -v go >/dev/null || die "go not found on PATH (kyverno is built from source with the Go module proxy)"
git_dir="${KYVERNO_GIT_DIR:-}"
[[ -n "$git_dir" ]] || die "KYVERNO_GIT_DIR is not set: point it at a git directory of github.com/kyverno/kyverno that has tag $KYVERNO_TAG"
git --git-dir="$git_dir" rev-parse -q --verify "refs/tags/$KYVERNO_TAG" >/dev/null \
    || die "$git_dir has no tag $KYVERNO_TAG"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}" GOWORK=off CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-buildvcs=false"
mkdir -p "$dir"

# One build at a time (parallel runs); a waiter finds the binary built.
if command -v flock >/dev/null; then
    exec 9>"$dir/.build.lock"
    flock 9
    if [[ -x "$bin" && -d "$dir/crds" ]]; then echo "$dir"; exit 0; fi
fi

src="$dir/src"
rm -rf "$src" && mkdir -p "$src"
log "exporting $KYVERNO_TAG from $git_dir"
# A mirror may lack its largest blobs; the build needs none of them (the one known to be
# absent is config/install-latest-testing.yaml, a generated install manifest), so the
# tree is exported without the blobs that are missing.
missing=()
while read -r _ _ hash path; do
    git --git-dir="$git_dir" cat-file -e "$hash" 2>/dev/null || missing+=(":(exclude)$path")
done < <(git --git-dir="$git_dir" ls-tree -r "$KYVERNO_TAG")
(( ${#missing[@]} == 0 )) || log "not in the mirror, left out: ${missing[*]}"
git --git-dir="$git_dir" archive "$KYVERNO_TAG" -- . "${missing[@]}" | tar -x -C "$src"
log "building ./cmd/kyverno ($(go env GOVERSION); the tag's go.mod asks for $(sed -n 's/^go //p' "$src/go.mod"))"
(cd "$src" && go build -trimpath -o "$bin.tmp" ./cmd/kyverno) >&2
rm -rf "$dir/crds" && cp -r "$src/config/crds" "$dir/crds"
mv "$bin.tmp" "$bin"  # atomic: never half a binary
rm -rf "$src"
log "built: $bin"
echo "$dir"
