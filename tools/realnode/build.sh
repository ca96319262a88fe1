#!/usr/bin/env bash
# Build, here, everything a real GPU node needs besides its kernel and NVIDIA driver, and
# pack it small for a GPU host with no network (tools/realnode/run.sh unpacks and runs it):
#
#   kube            kubelet, kube-apiserver, kube-scheduler, kube-controller-manager and
#                   kubectl in one binary (kube/main.go; chosen by the name it runs as),
#                   Kubernetes $K8S_VERSION (tests/e2e/controlplane/versions.env)
#   etcd            the control plane's (tests/e2e/controlplane/build.sh, cached)
#   containerd, containerd-shim-runc-v2, ctr      containerd $CONTAINERD_VERSION
#   runc            $RUNC_VERSION (cgo, seccomp; static, with Debian's libseccomp.a)
#   nvidia-container-runtime, nvidia-ctk, nvidia-cdi-hook    NVIDIA container toolkit
#                   $NVCT_VERSION (cgo)
#   nvidia-device-plugin, gpu-feature-discovery   NVIDIA's k8s-device-plugin
#                   $NDP_VERSION (cgo: NVML is opened at run time), from a checkout
#                   of its repository ($NDP_SRC)
#   bridge, host-local, loopback, portmap         CNI plugins $CNI_VERSION
#   images          OCI image archives: a pause image (a static C program written here)
#                   and a test image (Debian's static busybox, glibc for nvidia-smi, and a
#                   /check script); a second tag of it sets NVIDIA_VISIBLE_DEVICES=all as
#                   CUDA images do
#   wheels          gpu-webhook and what it needs, as CPython 3.12 manylinux wheels
#
# Every Go program comes from the Go module proxy (GOFLAGS=-mod=mod, the environment's
# GOPROXY), stripped (-s -w). Built files are cached under
#   ${GPU_WEBHOOK_CACHE:-$HOME/.cache/gpu-webhook}/realnode/
# and the bundles (kube.tar.xz, node.tar.xz, wheels.tar: each under 64 MiB) are written to $OUT_DIR
# (default: that cache's bundles/). The last line on stdout is that directory.
#
#   tools/realnode/build.sh                 # everything
#   OUT_DIR=dist/realnode tools/realnode/build.sh
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)

log() { printf '[realnode-build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# --- versions ---------------------------------------------------------------------------
# shellcheck disable=SC1091
source "$repo/tests/e2e/controlplane/versions.env"
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.4.2}
RUNC_VERSION=${RUNC_VERSION:-v1.5.3}
NVCT_VERSION=${NVCT_VERSION:-v1.20.2}
NDP_VERSION=${NDP_VERSION:-v0.20.0}
CNI_VERSION=${CNI_VERSION:-v1.10.0}
k8s_minor=$(sed -E 's/^v1\.([0-9]+)\..*/\1/' <<<"$K8S_VERSION")

cache="${GPU_WEBHOOK_CACHE:-$HOME/.cache/gpu-webhook}/realnode"
bin="$cache/bin"
OUT_DIR=${OUT_DIR:-$cache/bundles}
NDP_SRC=${NDP_SRC:-$cache/src/k8s-device-plugin}
mkdir -p "$bin" "$cache/src" "$cache/work" "$OUT_DIR"

export GOTOOLCHAIN=local GOWORK=off
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=mod -buildvcs=false"
command -v go >/dev/null || die "go not found on PATH"
nice_=(nice -n 10)

# go_install NAME CGO MODULE/PKG@VERSION [flags...]: a binary NAME in $bin, built once.
go_install() {
    local name=$1 cgo=$2 target=$3
    shift 3
    if [[ -x "$bin/$name" ]]; then log "cached: $name"; return; fi
    local tmp
    tmp=$(mktemp -d "$cache/work/gobin.XXXXXX")
    log "go install $target ($name)"
    CGO_ENABLED=$cgo GOBIN="$tmp" "${nice_[@]}" go install -trimpath "$@" "$target" >&2
    mv "$tmp/$(basename "${target%@*}")" "$bin/$name"
    rm -rf "$tmp"
}

# --- kube: the five Kubernetes commands in one binary -------------------------------------
build_kube() {
    [[ -x "$bin/kube" ]] && { log "cached: kube"; return; }
    local cp_src mod="$cache/src/kube" ld="-s -w" p
    cp_src="${GPU_WEBHOOK_CACHE:-$HOME/.cache/gpu-webhook}/controlplane/${K8S_VERSION}-${ETCD_VERSION}/src/kubernetes"
    mkdir -p "$mod"
    if [[ ! -f "$mod/go.mod" ]]; then
        # The control plane's module (its staging replaces resolved), built by
        # tests/e2e/controlplane/build.sh; this adds the kubelet's packages to it.
        [[ -f "$cp_src/go.mod" ]] || bash "$repo/tests/e2e/controlplane/build.sh" >/dev/null
        cp "$cp_src/go.mod" "$cp_src/go.sum" "$mod/"
        sed -i 's#^module .*#module gpu-webhook.local/realnode/kube#' "$mod/go.mod"
    fi
    cp "$here/kube/main.go" "$mod/main.go"
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ld+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$k8s_minor"
        ld+=" -X $p.gitTreeState=clean"
    done
    log "go build kube ($K8S_VERSION: kubelet, kube-apiserver, kube-scheduler, kube-controller-manager, kubectl)"
    (cd "$mod" && go get "k8s.io/kubernetes/cmd/kubelet@$K8S_VERSION" >&2 \
        && CGO_ENABLED=0 "${nice_[@]}" go build -trimpath -ldflags "$ld" -o "$bin/.kube.tmp" . >&2)
    mv "$bin/.kube.tmp" "$bin/kube"
}

build_etcd() {
    [[ -x "$bin/etcd" ]] && { log "cached: etcd"; return; }
    local cp_bin
    cp_bin=$(bash "$repo/tests/e2e/controlplane/build.sh" | tail -n1)
    cp "$cp_bin/etcd" "$bin/etcd"
}

build_go() {
    local c=github.com/containerd/containerd/v2 v
    v="-s -w -X $c/version.Version=$CONTAINERD_VERSION -X $c/version.Package=github.com/containerd/containerd/v2"
    go_install containerd 0 "$c/cmd/containerd@$CONTAINERD_VERSION" -tags no_btrfs,no_zfs -ldflags "$v"
    go_install containerd-shim-runc-v2 0 "$c/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" -ldflags "$v"
    go_install ctr 0 "$c/cmd/ctr@$CONTAINERD_VERSION" -tags no_btrfs,no_zfs -ldflags "$v"
    # runc with seccomp (containerd gives the pod sandbox a seccomp profile), linked
    # statically with Debian's libseccomp.a so the host needs no libseccomp.
    if [[ ! -x "$bin/runc" && ! -f /usr/lib/x86_64-linux-gnu/libseccomp.a ]]; then
        log "apt-get install libseccomp-dev (runc's seccomp)"
        apt-get install -y -q libseccomp-dev >&2 || die "runc needs libseccomp-dev"
    fi
    go_install runc 1 "github.com/opencontainers/runc@$RUNC_VERSION" -tags seccomp \
        -ldflags "-s -w -X main.version=${RUNC_VERSION#v} -linkmode external -extldflags -static"
    local t=github.com/NVIDIA/nvidia-container-toolkit n
    for n in nvidia-container-runtime nvidia-ctk nvidia-cdi-hook; do
        go_install "$n" 1 "$t/cmd/$n@$NVCT_VERSION" \
            -ldflags "-s -w -X $t/internal/info.version=${NVCT_VERSION#v}"
    done
    build_ndp
    local cni=github.com/containernetworking/plugins/plugins
    go_install bridge 0 "$cni/main/bridge@$CNI_VERSION" -ldflags "-s -w"
    go_install loopback 0 "$cni/main/loopback@$CNI_VERSION" -ldflags "-s -w"
    go_install host-local 0 "$cni/ipam/host-local@$CNI_VERSION" -ldflags "-s -w"
    go_install portmap 0 "$cni/meta/portmap@$CNI_VERSION" -ldflags "-s -w"
}

# NVIDIA's device plugin and GPU Feature Discovery, from a checkout of
# NVIDIA/k8s-device-plugin at $NDP_VERSION ($NDP_SRC; cloned there when absent): the Go
# module proxy does not serve v0.20, and GFD's v0.17 needs a node-feature-discovery it
# refuses; its checkout names one the proxy serves (its vendor folder is not used).
build_ndp() {
    local n d=github.com/NVIDIA/k8s-device-plugin
    if [[ -x "$bin/nvidia-device-plugin" && -x "$bin/gpu-feature-discovery" ]]; then
        log "cached: nvidia-device-plugin, gpu-feature-discovery"; return
    fi
    if [[ ! -f "$NDP_SRC/go.mod" ]]; then
        log "git clone $d $NDP_VERSION into $NDP_SRC"
        git clone -q --depth 1 --branch "$NDP_VERSION" "https://$d" "$NDP_SRC" >&2 \
            || die "no NVIDIA/k8s-device-plugin checkout at $NDP_SRC (set NDP_SRC)"
    fi
    for n in nvidia-device-plugin gpu-feature-discovery; do
        log "go build $n ($d $NDP_VERSION)"
        (cd "$NDP_SRC" && CGO_ENABLED=1 "${nice_[@]}" go build \
            -trimpath -ldflags "-s -w -X $d/internal/info.version=$NDP_VERSION" \
            -o "$bin/.$n.tmp" "./cmd/$n" >&2)
        mv "$bin/.$n.tmp" "$bin/$n"
    done
}

# --- images ---------------------------------------------------------------------------------
build_images() {
    local img="$cache/images"
    if [[ -f "$img/pause.tar" && -f "$img/check.tar" && "$img/.stamp" -nt "$here/images.py" ]]; then
        log "cached: images"; return
    fi
    mkdir -p "$img" "$cache/work/debs"
    [[ -x "$bin/pause" ]] || { log "cc -static pause"; cc -static -Os -s -o "$bin/pause" "$here/pause.c"; }
    (cd "$cache/work/debs"
        ls busybox-static_*.deb >/dev/null 2>&1 || apt-get download busybox-static >&2
        ls libc6_*.deb >/dev/null 2>&1 || apt-get download libc6 >&2)
    python3 "$here/images.py" --pause "$bin/pause" --debs "$cache/work/debs" --out "$img" >&2
    touch "$img/.stamp"
}

# --- wheels ---------------------------------------------------------------------------------
build_wheels() {
    local w="$cache/wheels" py=python3
    [[ -x "$repo/.venv/bin/python" ]] && py="$repo/.venv/bin/python"
    rm -rf "$w" && mkdir -p "$w"
    log "wheels: gpu-webhook and its dependencies for CPython 3.12 manylinux"
    "$py" -m pip wheel -q --no-deps -w "$w" "$repo" >&2
    # The versions the project's own virtualenv runs, where it has one.
    : > "$cache/work/constraints.txt"
    [[ -x "$repo/.venv/bin/pip" ]] && "$repo/.venv/bin/pip" freeze --exclude-editable \
        | grep -v '^-e ' > "$cache/work/constraints.txt"
    "$py" -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
        -c "$cache/work/constraints.txt" \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux_2_34_x86_64 \
        --platform manylinux_2_31_x86_64 --platform manylinux_2_24_x86_64 \
        --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
        -d "$w" "$w"/gpu_webhook-*.whl >&2
}

# --- bundles --------------------------------------------------------------------------------
pack() {  # pack NAME FILE... (paths relative to $cache)
    local name=$1
    shift
    log "packing $name.tar.xz"
    tar -C "$cache" -cf - "$@" | "${nice_[@]}" xz -T2 -9e > "$OUT_DIR/.$name.tar.xz"
    mv "$OUT_DIR/.$name.tar.xz" "$OUT_DIR/$name.tar.xz"
    log "$name.tar.xz: $(du -h "$OUT_DIR/$name.tar.xz" | cut -f1)"
}

versions() {
    cat <<EOF
kubernetes $K8S_VERSION
etcd $ETCD_VERSION
containerd $CONTAINERD_VERSION
runc $RUNC_VERSION
nvidia-container-toolkit $NVCT_VERSION
k8s-device-plugin $NDP_VERSION
cni-plugins $CNI_VERSION
go $(go env GOVERSION)
busybox-static $(cd "$cache/work/debs" && ls busybox-static_*.deb | sed 's/^busybox-static_//; s/_amd64.deb$//')
libc6 $(cd "$cache/work/debs" && ls libc6_*.deb | sed 's/^libc6_//; s/_amd64.deb$//')
EOF
}

# ONLY="go images" builds just those steps (kube etcd go images wheels), and packs nothing.
if [[ -n "${ONLY:-}" ]]; then
    for step in $ONLY; do "build_$step"; done
    exit 0
fi
build_kube
build_etcd
build_go
build_images
build_wheels
versions > "$cache/VERSIONS"
# Three bundles, each well under the 64 MiB one call can carry to the lent machine: the
# Kubernetes binaries; the node's runtime, etcd and the images; the wheels (a plain tar:
# wheels are compressed already).
pack kube bin/kube VERSIONS
pack node bin/etcd bin/containerd bin/containerd-shim-runc-v2 bin/ctr bin/runc \
    bin/nvidia-container-runtime bin/nvidia-ctk bin/nvidia-cdi-hook \
    bin/nvidia-device-plugin bin/gpu-feature-discovery \
    bin/bridge bin/loopback bin/host-local bin/portmap \
    images/pause.tar images/check.tar VERSIONS
tar -C "$cache" -cf "$OUT_DIR/wheels.tar" wheels VERSIONS
log "wheels.tar: $(du -h "$OUT_DIR/wheels.tar" | cut -f1)"
ls -l "$OUT_DIR" >&2
echo "$OUT_DIR"
