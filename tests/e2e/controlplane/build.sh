#!/usr/bin/env bash
# Build the binaries of a Kubernetes control plane for end-to-end tests from
# the Go module proxy: kube-apiserver, kubectl and etcd (every e2e test), and
# kube-scheduler, kube-controller-manager and kwok (the simulated GPU cluster
# of tests/e2e/cluster: real scheduler and controllers, kwok's fake nodes).
#
# Versions come from versions.env next to this script (overridable from the
# environment). Binaries are cached outside the work tree in
#   ${GPU_WEBHOOK_CACHE:-$HOME/.cache/gpu-webhook}/controlplane/<k8s>-<etcd>/bin
# and a run that finds them all there returns at once. A cache that lacks some
# (e.g. one made before the scheduler was added) gets only the missing ones
# built, in the same module directory and Go build cache.
#
# Progress goes to stderr; the last line on stdout is the bin directory, so
# callers can do:  BIN_DIR=$(tests/e2e/controlplane/build.sh | tail -n1)
set -euo pipefail

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

log() { printf '[controlplane-build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# --- versions: environment wins over versions.env ---------------------------
while IFS='=' read -r key value; do
    [[ -z "$key" || "$key" == \#* ]] && continue
    if [[ -z "${!key:-}" ]]; then
        printf -v "$key" '%s' "$value"
        export "${key?}"
    fi
done < "$script_dir/versions.env"

: "${K8S_VERSION:?K8S_VERSION not set (versions.env)}"
: "${ETCD_VERSION:?ETCD_VERSION not set (versions.env)}"
: "${KWOK_VERSION:?KWOK_VERSION not set (versions.env)}"
[[ "$K8S_VERSION" =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] \
    || die "K8S_VERSION must look like v1.Y.Z, got '$K8S_VERSION'"
k8s_minor=${BASH_REMATCH[1]}
k8s_patch=${BASH_REMATCH[2]}
staging_version="v0.${k8s_minor}.${k8s_patch}"

cache_root="${GPU_WEBHOOK_CACHE:-$HOME/.cache/gpu-webhook}/controlplane"
version_dir="$cache_root/${K8S_VERSION}-${ETCD_VERSION}"
bin_dir="$version_dir/bin"
src_dir="$version_dir/src"

# The binaries built from k8s.io/kubernetes, all from the one release.
KUBE_CMDS=(kube-apiserver kubectl kube-scheduler kube-controller-manager)

# kwok's release is not part of the cache directory's name (so adding kwok or
# moving its version keeps the Kubernetes binaries): a stamp beside the binary
# says which release it is, and a different KWOK_VERSION rebuilds it.
kwok_stamp="$bin_dir/.kwok-version"
have_kwok() {
    [[ -x "$bin_dir/kwok" && -f "$kwok_stamp" && "$(cat "$kwok_stamp")" == "$KWOK_VERSION" ]]
}

have_all() {
    local b
    for b in "${KUBE_CMDS[@]}" etcd; do
        [[ -x "$bin_dir/$b" ]] || return 1
    done
    have_kwok
}

if have_all; then
    log "cached: $bin_dir"
    echo "$bin_dir"
    exit 0
fi

# --- Go environment -----------------------------------------------------------
command -v go >/dev/null || die "go not found on PATH"
export GOTOOLCHAIN=local      # never download a toolchain
export GOWORK=off             # ignore any go.work above the cache dir
export CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=mod -buildvcs=false"
# GOPATH / GOMODCACHE stay at the Go defaults so downloads are shared/reused.
go_line=$(go env GOVERSION)
log "using $go_line ($(command -v go)); GOMODCACHE=$(go env GOMODCACHE)"
log "building Kubernetes $K8S_VERSION (staging $staging_version), etcd $ETCD_VERSION, kwok $KWOK_VERSION"
log "bin dir: $bin_dir"

mkdir -p "$bin_dir" "$src_dir"

# One build per version at a time (e.g. parallel test workers); a waiter
# finds the binaries the first one built.
if command -v flock >/dev/null; then
    exec 9>"$version_dir/.build.lock"
    flock 9
    if have_all; then
        log "built by a concurrent run: $bin_dir"
        echo "$bin_dir"
        exit 0
    fi
fi

go_version_ok() {  # $1 = required "go" line of a go.mod, e.g. 1.26.0
    local need=$1 have
    have=${go_line#go}
    [[ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -n1)" == "$need" ]]
}

download_module() {  # $1 = module, $2 = version, $3 = its name in errors, $4 = the variable
    # that picks the version; sets $gomod (its go.mod) and $need (its go line), and dies
    # unless the go here is at least that
    log "downloading $1@$2"
    gomod=$(go mod download -json "$1@$2" \
        | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
    [[ -f "$gomod" ]] || die "could not download $1@$2"
    need=$(awk '$1 == "go" { print $2; exit }' "$gomod")
    go_version_ok "$need" || die "$3 $2 needs go $need, have $go_line; pick an older $4"
}

# --- kube-apiserver, kubectl, kube-scheduler, kube-controller-manager ----------
write_kubernetes_module() {  # $1 = module dir; sets $need (the go line)
    local mod_dir=$1 gomod replaces
    download_module k8s.io/kubernetes "$K8S_VERSION" k8s.io/kubernetes K8S_VERSION

    # Every k8s.io/<staging> module is required at v0.0.0 and replaced by a
    # directory in the kubernetes repo; point them at the published v0.Y.Z.
    replaces=$(awk '
        $1 == "require" && $2 == "(" { inreq = 1; next }
        inreq && $1 == ")" { inreq = 0; next }
        inreq && $2 == "v0.0.0" && $1 ~ /^k8s\.io\// { print $1 }
    ' "$gomod" | sort -u)
    [[ -n "$replaces" ]] || die "no k8s.io staging modules found in $gomod"
    log "replacing $(wc -l <<<"$replaces") staging modules with $staging_version"

    rm -rf "$mod_dir"
    mkdir -p "$mod_dir"
    {
        echo "module gpu-webhook.local/controlplane/kubernetes"
        echo
        echo "go $need"
        echo
        echo "require k8s.io/kubernetes $K8S_VERSION"
        echo
        echo "replace ("
        while read -r m; do
            printf '\t%s => %s %s\n' "$m" "$m" "$staging_version"
        done <<<"$replaces"
        echo ")"
    } > "$mod_dir/go.mod"
}

build_kubernetes() {
    local mod_dir="$src_dir/kubernetes" build_date ldflags cmd missing=() gets=()
    for cmd in "${KUBE_CMDS[@]}"; do
        [[ -x "$bin_dir/$cmd" ]] || missing+=("$cmd")
    done
    if [[ ${#missing[@]} -eq 0 ]]; then
        log "${KUBE_CMDS[*]} already built"
        return
    fi
    # The module dir a previous run resolved is reused as it is (same release,
    # same replaces): `go get` only adds what the missing commands import.
    if ! grep -qs "^require k8s.io/kubernetes $K8S_VERSION\$" "$mod_dir/go.mod"; then
        write_kubernetes_module "$mod_dir"
    fi

    for cmd in "${missing[@]}"; do
        gets+=("k8s.io/kubernetes/cmd/$cmd@$K8S_VERSION")
    done
    log "resolving the kubernetes module graph for ${missing[*]}"
    (cd "$mod_dir" && go get "${gets[@]}") >&2

    build_date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
    ldflags="-s -w"
    local pkg
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldflags+=" -X $pkg.gitVersion=$K8S_VERSION"
        ldflags+=" -X $pkg.gitMajor=1"
        ldflags+=" -X $pkg.gitMinor=$k8s_minor"
        ldflags+=" -X $pkg.gitTreeState=clean"
        ldflags+=" -X $pkg.buildDate=$build_date"
    done

    local t0
    for cmd in "${missing[@]}"; do
        t0=$SECONDS
        log "go build $cmd (this is the slow part)"
        (cd "$mod_dir" && go build -trimpath -ldflags "$ldflags" \
            -o "$bin_dir/.$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd") >&2
        mv -f "$bin_dir/.$cmd.tmp" "$bin_dir/$cmd"
        log "built $bin_dir/$cmd ($(du -h "$bin_dir/$cmd" | cut -f1)) in $((SECONDS - t0))s"
    done
}

# --- kwok -------------------------------------------------------------------------
# sigs.k8s.io/kwok simulates nodes and pod lifecycles (Stages) for the real
# scheduler and controllers. Built in a module of its own, at the versions of
# its own go.mod (its k8s.io libraries need not match the control plane's).
build_kwok() {
    local mod_dir="$src_dir/kwok" gomod need t0=$SECONDS
    if have_kwok; then
        log "kwok already built"
        return
    fi
    download_module sigs.k8s.io/kwok "$KWOK_VERSION" kwok KWOK_VERSION

    rm -rf "$mod_dir"
    mkdir -p "$mod_dir"
    printf 'module gpu-webhook.local/controlplane/kwok\n\ngo %s\n\nrequire sigs.k8s.io/kwok %s\n' \
        "$need" "$KWOK_VERSION" > "$mod_dir/go.mod"
    log "resolving the kwok module graph"
    (cd "$mod_dir" && go get "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION") >&2
    log "go build kwok"
    # The version variable kwok's own release script sets.
    (cd "$mod_dir" && go build -trimpath \
        -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}" \
        -o "$bin_dir/.kwok.tmp" sigs.k8s.io/kwok/cmd/kwok) >&2
    mv -f "$bin_dir/.kwok.tmp" "$bin_dir/kwok"
    echo "$KWOK_VERSION" > "$kwok_stamp"
    log "built $bin_dir/kwok ($(du -h "$bin_dir/kwok" | cut -f1)) in $((SECONDS - t0))s"
}

# --- etcd -----------------------------------------------------------------------
build_etcd_go() {
    local mod_dir="$src_dir/etcd" gomod need
    log "downloading go.etcd.io/etcd/server/v3@$ETCD_VERSION"
    gomod=$(go mod download -json "go.etcd.io/etcd/server/v3@$ETCD_VERSION" \
        | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
    [[ -f "$gomod" ]] || { log "could not download go.etcd.io/etcd/server/v3@$ETCD_VERSION"; return 1; }
    need=$(awk '$1 == "go" { print $2; exit }' "$gomod")
    go_version_ok "$need" \
        || { log "etcd $ETCD_VERSION needs go $need, have $go_line"; return 1; }

    rm -rf "$mod_dir"
    mkdir -p "$mod_dir"
    printf 'module gpu-webhook.local/controlplane/etcd\n\ngo %s\n\nrequire go.etcd.io/etcd/server/v3 %s\n' \
        "$need" "$ETCD_VERSION" > "$mod_dir/go.mod"
    log "resolving the etcd module graph"
    (cd "$mod_dir" && go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION") >&2 || return 1
    log "go build etcd"
    # The etcd server module's root package is the etcd main package.
    (cd "$mod_dir" && go build -trimpath -ldflags "-s -w" \
        -o "$bin_dir/.etcd.tmp" go.etcd.io/etcd/server/v3) >&2 || return 1
    mv -f "$bin_dir/.etcd.tmp" "$bin_dir/etcd"
}

build_etcd_debian() {
    # Fallback: Debian's etcd-server package (older etcd, but a real one).
    log "falling back to Debian's etcd-server package"
    if [[ ! -x /usr/bin/etcd ]]; then
        command -v apt-get >/dev/null || return 1
        [[ $(id -u) -eq 0 ]] || { log "need root for apt-get"; return 1; }
        apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive \
            apt-get install -y -qq etcd-server >&2 || return 1
    fi
    cp /usr/bin/etcd "$bin_dir/etcd"
}

build_etcd() {
    if [[ -x "$bin_dir/etcd" ]]; then
        log "etcd already built"
        return
    fi
    if ! build_etcd_go; then
        build_etcd_debian || die "could not build or install etcd"
    fi
    log "built $bin_dir/etcd ($(du -h "$bin_dir/etcd" | cut -f1))"
}

start=$SECONDS
build_etcd
build_kubernetes
build_kwok
have_all || die "binaries missing after build in $bin_dir"

log "versions:"
"$bin_dir/etcd" --version 2>&1 | sed 's/^/    /' >&2 || true
"$bin_dir/kube-apiserver" --version 2>&1 | sed 's/^/    /' >&2 || true
"$bin_dir/kubectl" version --client 2>&1 | sed 's/^/    /' >&2 || true
"$bin_dir/kube-scheduler" --version 2>&1 | sed 's/^/    /' >&2 || true
"$bin_dir/kube-controller-manager" --version 2>&1 | sed 's/^/    /' >&2 || true
"$bin_dir/kwok" --version 2>&1 | sed 's/^/    /' >&2 || true
log "done in $((SECONDS - start))s"
echo "$bin_dir"
