#!/usr/bin/env bash
# A real one-node Kubernetes cluster on this GPU host, with gpu-webhook in front, and the
# checks of docs/real-gpu-node.md: run as root on any host with an NVIDIA driver
# (nvidia-smi works), no network needed, nothing installed outside --prefix (the kubelet
# keeps its default /var/lib/kubelet, the CNI bridge is cni0; do not run it on a host that
# is already a Kubernetes node).
#
#   tools/realnode/run.sh --bundles DIR [--out DIR] [--prefix /opt/realnode] [--stage-only]
#                         [--deadline SECONDS]
#
# DIR holds the bundles tools/realnode/build.sh packs (kube.tar.xz, node.tar.xz,
# wheels.tar); each one
# is unpacked once into --prefix (a bundle already unpacked there is skipped, so the two
# can come in two steps: --stage-only unpacks and stops). Then, as a cluster would run
# them: etcd, kube-apiserver, kube-controller-manager, kube-scheduler; gpu-webhook serve
# (TLS, its certificates from `gpu-webhook certs`) and its configurations (`gpu-webhook
# manifests`); containerd with NVIDIA's container runtime (CDI mode) as the default
# runtime; the kubelet, registering this host as a node; GPU Feature Discovery's labels
# put on the node (as Node Feature Discovery would); NVIDIA's device plugin. Then the
# checks, and a report in --out: report.md, raw.tar.gz (every command's output), logs.tar.gz.
# Everything started is stopped at the end.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$here/../.." && pwd)
PREFIX=/opt/realnode
BUNDLES=""
OUT_DIR=${OUT:-$PWD/realnode-report}
STAGE_ONLY=0
DEADLINE=0
# How long a pod may take to finish (REALNODE_POD_WAIT seconds).
POD_WAIT=${REALNODE_POD_WAIT:-30}
while [[ $# -gt 0 ]]; do
    case $1 in
        --bundles) BUNDLES=$2; shift 2 ;;
        --out) OUT_DIR=$2; shift 2 ;;
        --prefix) PREFIX=$2; shift 2 ;;
        --repo) REPO=$2; shift 2 ;;
        --stage-only) STAGE_ONLY=1; shift ;;
        --deadline) DEADLINE=$2; shift 2 ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[[ $(id -u) -eq 0 ]] || { echo "run.sh: run as root" >&2; exit 2; }

T0=$SECONDS
log() { printf '[realnode %4ds] %s\n' "$((SECONDS - T0))" "$*" >&2; }

# --- unpack -------------------------------------------------------------------------------
mkdir -p "$PREFIX"
if [[ -n "$BUNDLES" ]]; then
    for b in "$BUNDLES"/*.tar.xz "$BUNDLES"/*.tar; do
        [[ -f "$b" ]] || continue
        name=$(basename "$(basename "$b" .xz)" .tar)
        sum=$(sha256sum "$b" | cut -c1-16)
        if [[ "$(cat "$PREFIX/.unpacked-$name" 2>/dev/null)" == "$sum" ]]; then
            log "$name: already unpacked"
            continue
        fi
        log "unpacking $name ($(du -h "$b" | cut -f1))"
        if [[ $b != *.xz ]]; then
            tar -C "$PREFIX" -xf "$b"
        elif command -v xz >/dev/null; then
            xz -dc "$b" | tar -C "$PREFIX" -xf -
        else
            python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' "$b" "$PREFIX"
        fi && echo "$sum" > "$PREFIX/.unpacked-$name"
    done
fi
# gpu-webhook: Python 3.12 (the wheels' ABI) with the wheels installed into --prefix once,
# or REALNODE_PYTHON: one that already has gpu-webhook.
PY=${REALNODE_PYTHON:-python3}
if ! "$PY" -m webhook.cli --help >/dev/null 2>&1; then
    if ! PYTHONPATH=$PREFIX/site "$PY" -m webhook.cli --help >/dev/null 2>&1 && [[ -d "$PREFIX/wheels" ]]; then
        log "installing gpu-webhook from wheels ($("$PY" --version))"
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$PREFIX/site" "$PREFIX"/wheels/*.whl >&2
    fi
    export PYTHONPATH=$PREFIX/site
fi
gw() { "$PY" -m webhook.cli "$@"; }
if [[ $STAGE_ONLY -eq 1 ]]; then
    ls -la "$PREFIX" "$PREFIX/bin" >&2
    gw --help > /dev/null && log "gpu-webhook runs with $("$PY" --version)"
    exit 0
fi
for f in bin/kube bin/etcd bin/containerd bin/runc bin/nvidia-device-plugin images/check.tar; do
    [[ -e "$PREFIX/$f" ]] || { log "missing $PREFIX/$f: unpack every bundle (--bundles)"; exit 2; }
done

W=$PREFIX/work
RAW=$W/raw
LOGS=$W/logs
rm -rf "$W"
mkdir -p "$W" "$RAW" "$LOGS" "$OUT_DIR" "$W/bin" "$PREFIX/cni"
export PATH="$W/bin:$PREFIX/bin:$PATH"
for n in kubelet kube-apiserver kube-scheduler kube-controller-manager kubectl; do
    ln -sf "$PREFIX/bin/kube" "$W/bin/$n"
done
for n in bridge host-local loopback portmap; do ln -sf "$PREFIX/bin/$n" "$PREFIX/cni/$n"; done
exec > >(tee "$OUT_DIR/run.log") 2>&1
trap finish EXIT
trap 'exit 143' TERM INT   # a timeout still writes the report

REPORT=$W/report.md
: > "$REPORT"
ROUTE_ROWS_START=0
ROUTE_ROWS=$W/routes.md
GPU_ROWS=$W/gpu.md
QUOTA_ROWS=$W/quota.md
: > "$GPU_ROWS"
: > "$QUOTA_ROWS"
NET=unknown
HOST_GPU=unknown
DRIVER=unknown
CTR=(ctr --address "$W/containerd.sock" -n k8s.io)
say() { printf '%s\n' "$*" >> "$REPORT"; }
# raw NAME CMD...: run, keep stdout+stderr in raw/NAME.txt (and the exit code), print it.
raw() {
    local name=$1
    shift
    "$@" > "$RAW/$name.txt" 2>&1
    local rc=$?
    echo "[exit $rc]" >> "$RAW/$name.txt"
    cat "$RAW/$name.txt"
    return $rc
}
wait_for() {  # wait_for SECONDS DESCRIPTION CMD...: poll CMD until it succeeds
    local limit=$1 what=$2 end=$((SECONDS + $1))
    shift 2
    until "$@" >/dev/null 2>&1; do
        if (( SECONDS >= end )); then log "gave up waiting ${limit}s for: $what"; return 1; fi
        sleep 1
    done
    log "ready: $what"
}
PIDS=()
start() {  # start NAME CMD...: a daemon in its own session, its log in logs/NAME.log
    local name=$1
    shift
    setsid "$@" > "$LOGS/$name.log" 2>&1 < /dev/null &
    PIDS+=("$!")
    echo "$!" > "$W/$name.pid"
    log "started $name (pid $!)"
}
stop() {  # stop NAME: SIGTERM to the daemon, then SIGKILL after 5 s
    local pid
    pid=$(cat "$W/$1.pid" 2>/dev/null) || return 0
    kill "$pid" 2>/dev/null || return 0
    for _ in $(seq 10); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.5; done
    kill -9 "$pid" 2>/dev/null
}

# --- the host -----------------------------------------------------------------------------
log "host: $(uname -sr), $(nproc) cores"
NVSMI=$(command -v nvidia-smi || true)
HOST_UUID=none
if [[ -n "$NVSMI" ]]; then
    raw host-nvidia-smi-L "$NVSMI" -L
    raw host-nvidia-smi-q "$NVSMI" --query-gpu=name,uuid,driver_version,memory.total,mig.mode.current --format=csv
    HOST_UUID=$("$NVSMI" --query-gpu=uuid --format=csv,noheader | head -n1 | tr -d ' ')
    HOST_GPU=$("$NVSMI" --query-gpu=name --format=csv,noheader | head -n1)
    DRIVER=$("$NVSMI" --query-gpu=driver_version --format=csv,noheader | head -n1)
else
    log "no nvidia-smi on this host: no NVIDIA driver; the node's plumbing alone is tried"
    echo "(no nvidia-smi)" > "$RAW/host-nvidia-smi-L.txt"
fi
raw host-facts sh -c 'uname -a; cat /etc/os-release | head -4; stat -fc "cgroup fs: %T" /sys/fs/cgroup;
    cat /sys/fs/cgroup/cgroup.controllers 2>/dev/null; ls -l /dev/nvidia*; free -g | head -2;
    python3 --version; ldconfig -p | grep -E "libnvidia-ml|libcuda\." ; ip -V 2>&1'
for v in "$PREFIX/VERSIONS"; do cp "$v" "$RAW/versions.txt"; done

# cgroup v2: the kubelet (cgroupfs driver) needs the controllers given to children of the root.
if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
    for c in $(cat /sys/fs/cgroup/cgroup.controllers); do
        echo "+$c" > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null \
            || log "cgroup: could not enable $c for children"
    done
    log "cgroup v2 subtree_control: $(cat /sys/fs/cgroup/cgroup.subtree_control)"
fi
swapoff -a 2>/dev/null || true
modprobe overlay 2>/dev/null || true
modprobe br_netfilter 2>/dev/null || true
sysctl -qw net.ipv4.ip_forward=1 2>/dev/null || true

# --- PKI ----------------------------------------------------------------------------------
P=$W/pki
mkdir -p "$P"
NODE=$(hostname | tr 'A-Z_' 'a-z-' | sed 's/[^a-z0-9.-]//g; s/^[.-]*//; s/[.-]*$//')
NODE=${NODE:-gpu-node}
# The node's address: the kubelet refuses a loopback one, and the API server reaches the
# kubelet (logs, exec) there. The host's source address, else a dummy link's.
NODE_IP=$(ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')
[[ -n "$NODE_IP" ]] || NODE_IP=$(ip -4 -o addr show scope global 2>/dev/null | awk '{print $4}' | cut -d/ -f1 | head -n1)
[[ -n "$NODE_IP" ]] || NODE_IP=$("$PY" -c 'import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect(("10.255.255.255", 1)); print(s.getsockname()[0])' 2>/dev/null | grep -v '^127\.')
if [[ -z "$NODE_IP" ]]; then
    ip link add realnode-ip type dummy && ip addr add 10.217.255.1/32 dev realnode-ip \
        && ip link set realnode-ip up && NODE_IP=10.217.255.1
fi
log "node $NODE, address ${NODE_IP:-none}"
SAN_NODE="IP:127.0.0.1,${NODE_IP:+IP:$NODE_IP,}DNS:$NODE,DNS:localhost"
raw pki "$PY" "$here/pki.py" "$P" \
    "apiserver=CN=kube-apiserver;IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default.svc" \
    "admin=O=system:masters,CN=realnode-admin" \
    "apiserver-kubelet-client=O=system:masters,CN=kube-apiserver-kubelet-client" \
    "node=O=system:nodes,CN=system:node:$NODE" \
    "kubelet-serving=CN=$NODE;$SAN_NODE" > /dev/null
[[ -f "$P/node.crt" && -f "$P/admin.crt" ]] || { log "no certificates: $(cat "$RAW/pki.txt")"; exit 1; }
kubeconfig() {  # kubeconfig NAME CERT: a kubeconfig for the API server on 127.0.0.1:6443
    cat > "$W/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: realnode, cluster: {server: "https://127.0.0.1:6443", certificate-authority: "$P/ca.crt"}}]
users: [{name: $1, user: {client-certificate: "$P/$2.crt", client-key: "$P/$2.key"}}]
contexts: [{name: realnode, context: {cluster: realnode, user: $1}}]
current-context: realnode
EOF
}
kubeconfig admin admin
kubeconfig kubelet node
export KUBECONFIG=$W/admin.kubeconfig
k() { kubectl "$@"; }

# --- control plane ------------------------------------------------------------------------
start etcd etcd --name realnode --data-dir "$W/etcd" --listen-client-urls http://127.0.0.1:23790 \
    --advertise-client-urls http://127.0.0.1:23790 --listen-peer-urls http://127.0.0.1:23800 \
    --initial-advertise-peer-urls http://127.0.0.1:23800 --initial-cluster realnode=http://127.0.0.1:23800 \
    --unsafe-no-fsync --log-level warn
start kube-apiserver kube-apiserver --advertise-address=127.0.0.1 --bind-address=127.0.0.1 \
    --secure-port=6443 --etcd-servers=http://127.0.0.1:23790 \
    --client-ca-file="$P/ca.crt" --tls-cert-file="$P/apiserver.crt" --tls-private-key-file="$P/apiserver.key" \
    --kubelet-client-certificate="$P/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$P/apiserver-kubelet-client.key" --kubelet-certificate-authority="$P/ca.crt" \
    --service-account-key-file="$P/sa.pub" --service-account-signing-key-file="$P/sa.key" \
    --service-account-issuer=https://kubernetes.default.svc --service-cluster-ip-range=10.96.0.0/24 \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --endpoint-reconciler-type=none --allow-privileged=true --profiling=false \
    --cert-dir="$W/apiserver-certs"
wait_for 90 "kube-apiserver /readyz" k get --raw /readyz || { tail -30 "$LOGS/kube-apiserver.log"; }
start kube-controller-manager kube-controller-manager --kubeconfig="$W/admin.kubeconfig" \
    --authentication-kubeconfig="$W/admin.kubeconfig" --authorization-kubeconfig="$W/admin.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port=10257 --leader-elect=false \
    --service-account-private-key-file="$P/sa.key" --root-ca-file="$P/ca.crt" \
    --cluster-signing-cert-file="$P/ca.crt" --cluster-signing-key-file="$P/ca.key" \
    --use-service-account-credentials=false --cert-dir="$W/kcm-certs"
start kube-scheduler kube-scheduler --kubeconfig="$W/admin.kubeconfig" \
    --authentication-kubeconfig="$W/admin.kubeconfig" --authorization-kubeconfig="$W/admin.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port=10259 --leader-elect=false
raw versions-kube sh -c 'kubectl version; kubelet --version; etcd --version | head -1'

# NVML for the device plugin and GPU Feature Discovery: where the driver put it.
NVML=$(ldconfig -p 2>/dev/null | awk '/libnvidia-ml\.so\.1 /{print $NF; exit}')
for d in /usr/local/nvidia/lib64 /usr/lib/x86_64-linux-gnu /usr/lib64; do
    [[ -z "$NVML" && -e "$d/libnvidia-ml.so.1" ]] && NVML=$d/libnvidia-ml.so.1
done
[[ -n "$NVML" ]] && export LD_LIBRARY_PATH="$(dirname "$NVML")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
log "NVML: ${NVML:-not found}"

# --- GPU Feature Discovery: the node's labels, from the GPU --------------------------------
raw gfd sh -c "gpu-feature-discovery --oneshot --no-timestamp --output-file=$W/gfd-labels \
    --mig-strategy=none --use-node-feature-api=false 2>&1 | tail -20; echo '--- labels:'; cat $W/gfd-labels"
PRODUCT=$(sed -n 's/^nvidia.com\/gpu.product=//p' "$W/gfd-labels" 2>/dev/null | head -n1)
log "GFD: nvidia.com/gpu.product=${PRODUCT:-(none)}"

# --- the webhook ----------------------------------------------------------------------------

# The policy under test, its product pinned to what GPU Feature Discovery reported.
sed "s/NVIDIA-H100-80GB-HBM3/${PRODUCT:-NVIDIA-H100-80GB-HBM3}/" "$here/policy.yaml" > "$W/policy.yaml"
raw policy-check gw policy check "$W/policy.yaml"
gw certs --out "$W/webhook-certs" --dns localhost --ip 127.0.0.1 > "$RAW/webhook-certs.txt" 2>&1
k apply -f "$REPO/deploy/base/namespace.yaml" -f "$REPO/deploy/base/crd-gpuquota.yaml" \
    -f "$REPO/deploy/base/crd-gpupolicy.yaml" -f "$REPO/deploy/base/priority-quota.yaml" \
    -f "$REPO/deploy/base/priority-borrowed.yaml" > "$RAW/install-base.txt" 2>&1
[[ -f "$REPO/tests/e2e/crds/wgpolicyk8s.io_policyreports.yaml" ]] \
    && k apply -f "$REPO/tests/e2e/crds/wgpolicyk8s.io_policyreports.yaml" >> "$RAW/install-base.txt" 2>&1
start gpu-webhook "$PY" -m webhook.cli serve --host 127.0.0.1 --port 8443 \
    --cert-dir "$W/webhook-certs" --policy "$W/policy.yaml" --kubeconfig "$W/admin.kubeconfig" \
    --namespace gpu-webhook --webhook-configurations-sync off
wait_for 60 "gpu-webhook /readyz" "$PY" -c "import ssl, urllib.request; urllib.request.urlopen('https://127.0.0.1:8443/readyz', context=ssl.create_default_context(cafile='$W/webhook-certs/ca.pem'), timeout=3)" \
    || tail -30 "$LOGS/gpu-webhook.log"
gw manifests --policy "$W/policy.yaml" --url https://127.0.0.1:8443 \
    --ca-file "$W/webhook-certs/ca.pem" > "$W/webhook-configurations.yaml" 2> "$RAW/manifests-stderr.txt"
webhook_on() {
    k apply -f "$W/webhook-configurations.yaml" > /dev/null
    sleep 2  # the API server's configuration cache
}
webhook_off() {
    k delete -f "$W/webhook-configurations.yaml" --ignore-not-found --wait=true > /dev/null
    sleep 2
}

# --- containerd with NVIDIA's runtime ------------------------------------------------------
mkdir -p "$W/cdi" "$W/nvcr/nvidia-container-runtime" "$W/cni" /var/run/cdi
# The toolkit's configuration: its defaults (nvidia-ctk config default), in CDI mode; read
# through XDG_CONFIG_HOME so a host's own /etc/nvidia-container-runtime is left alone.
NVCR_CFG=$W/nvcr/nvidia-container-runtime/config.toml
nvidia-ctk config default --output "$NVCR_CFG" 2>> "$LOGS/nvidia-ctk.log"
nvidia-ctk config --config-file "$NVCR_CFG" --in-place \
    --set nvidia-container-runtime.mode=cdi \
    --set nvidia-container-runtime.debug="$LOGS/nvidia-container-runtime.log" \
    --set nvidia-container-runtime.modes.cdi.spec-dirs="$W/cdi:/var/run/cdi" \
    --set nvidia-ctk.path="$PREFIX/bin/nvidia-ctk" 2>> "$LOGS/nvidia-ctk.log"
cp "$NVCR_CFG" "$RAW/nvidia-container-runtime-config.toml"
cat > "$W/bin/nvidia-container-runtime" <<EOF
#!/bin/sh
XDG_CONFIG_HOME=$W/nvcr exec $PREFIX/bin/nvidia-container-runtime "\$@"
EOF
chmod +x "$W/bin/nvidia-container-runtime"
raw cdi-generate nvidia-ctk cdi generate --output="$W/cdi/nvidia.yaml" \
    --nvidia-cdi-hook-path="$PREFIX/bin/nvidia-cdi-hook" --device-name-strategy=index \
    --device-name-strategy=uuid
cp "$W/cdi/nvidia.yaml" "$RAW/cdi-nvidia.yaml" 2>/dev/null

# Pod network: a bridge (the CNI bridge plugin). A loopback-only network is the fallback
# where the kernel has no bridge, but containerd refuses it for pods off the host network
# ("failed to find network info for sandbox"): the report then shows no pod ran.
# (the bridge plugin needs no ip command; where there is one, it asks the kernel first)
if ! command -v ip >/dev/null || { ip link add name rnprobe0 type bridge 2>/dev/null && ip link del rnprobe0; }; then
    NET=bridge
    cat > "$W/cni/10-realnode.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "realnode", "plugins": [
  {"type": "bridge", "bridge": "realnode0", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "dataDir": "$W/cni-ipam",
            "ranges": [[{"subnet": "10.217.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}}]}
EOF
else
    NET=loopback
    cat > "$W/cni/10-realnode.conflist" <<'EOF'
{"cniVersion": "1.0.0", "name": "realnode", "plugins": [{"type": "loopback"}]}
EOF
fi
log "pod network: $NET"

# A host where root may not lower a process's oom_score_adj (no CAP_SYS_RESOURCE: some
# sandboxes) gets containerd's restrict_oom_score_adj, else no container could start.
RESTRICT_OOM=false
if ! (echo -1 > /proc/self/oom_score_adj) 2>/dev/null; then
    RESTRICT_OOM=true
    log "this host refuses lowering oom_score_adj: containerd restrict_oom_score_adj = true"
fi
cat > "$W/containerd.toml" <<EOF
version = 3
root = "$W/containerd/root"
state = "$W/containerd/state"
[grpc]
  address = "$W/containerd.sock"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = 'registry.k8s.io/pause:3.10.2'
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = $RESTRICT_OOM
  cdi_spec_dirs = ['$W/cdi', '/var/run/cdi']
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'nvidia'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]
      runtime_type = 'io.containerd.runc.v2'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia.options]
        BinaryName = '$W/bin/nvidia-container-runtime'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = '$PREFIX/bin/runc'
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['$PREFIX/cni']
    conf_dir = '$W/cni'
EOF
start containerd containerd --config "$W/containerd.toml"
CTR=(ctr --address "$W/containerd.sock" -n k8s.io)
wait_for 30 "containerd" "${CTR[@]}" version
raw images-import sh -c "${CTR[*]} images import $PREFIX/images/pause.tar && ${CTR[*]} images import $PREFIX/images/check.tar && ${CTR[*]} images ls -q"

# --- the kubelet ----------------------------------------------------------------------------
cat > "$W/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$P/ca.crt"}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
containerRuntimeEndpoint: "unix://$W/containerd.sock"
tlsCertFile: "$P/kubelet-serving.crt"
tlsPrivateKeyFile: "$P/kubelet-serving.key"
failSwapOn: false
failCgroupV1: false
resolvConf: /etc/resolv.conf
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
registerWithTaints:   # as GPU nodes are tainted, so only pods that tolerate it land there
- {key: nvidia.com/gpu, effect: NoSchedule}
EOF
start kubelet kubelet --config="$W/kubelet.yaml" --kubeconfig="$W/kubelet.kubeconfig" \
    --hostname-override="$NODE" ${NODE_IP:+--node-ip="$NODE_IP"} --v=2
NODE_OK=0
wait_for 90 "node $NODE registered" k get node "$NODE" && NODE_OK=1
if [[ $NODE_OK -eq 1 ]]; then
    wait_for 60 "node $NODE Ready" sh -c "kubectl get node $NODE -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True" \
        || raw node-not-ready k describe node "$NODE"
else
    grep -E "^E|error|failed" "$LOGS/kubelet.log" | tail -20 > "$RAW/kubelet-errors.txt"
    cat "$RAW/kubelet-errors.txt"
fi

# GFD's labels put on the node (what Node Feature Discovery does with GFD's output).
if [[ -s "$W/gfd-labels" ]]; then
    # shellcheck disable=SC2046
    raw node-label k label node "$NODE" --overwrite $(grep -E '^[a-z0-9./-]+=[A-Za-z0-9._-]*$' "$W/gfd-labels")
fi

# --- the device plugin ------------------------------------------------------------------------
device_plugin() {  # device_plugin STRATEGY: (re)start NVIDIA's device plugin with that list strategy
    stop nvidia-device-plugin
    start nvidia-device-plugin nvidia-device-plugin --device-list-strategy="$1" \
        --device-id-strategy=uuid --mig-strategy=none --fail-on-init-error=true \
        --driver-root=/ --driver-root-ctr-path=/ --nvidia-cdi-hook-path="$PREFIX/bin/nvidia-cdi-hook"
    sleep 3
    wait_for "$POD_WAIT" "nvidia.com/gpu allocatable on $NODE ($1)" sh -c \
        "kubectl get node $NODE -o jsonpath='{.status.allocatable.nvidia\.com/gpu}' | grep -qx '[1-9][0-9]*'"
}

# --- checks -------------------------------------------------------------------------------------
k create namespace research > /dev/null
k create namespace other > /dev/null
wait_for 30 "default ServiceAccount in research" k get serviceaccount default -n research

# pod NAME [key=value...]: a pod manifest. gpu=N, env=VALUE (own NVIDIA_VISIBLE_DEVICES),
# image=check|cuda, privileged=1, sysadmin=1, devmounts=1, devnull=1, nodename=1,
# annotation=1, hold=SECONDS, ns=NAMESPACE, tolerate=1 (the GPU node's taint)
pod() {
    local name=$1 gpu="" env="" image=check priv="" sysadmin="" devmounts="" devnull=""
    local nodename="" annotation="" hold="" ns=research tolerate="" kv
    shift
    for kv in "$@"; do
        case $kv in
            gpu=*) gpu=${kv#gpu=} ;; env=*) env=${kv#env=} ;; image=*) image=${kv#image=} ;;
            privileged=1) priv=1 ;; sysadmin=1) sysadmin=1 ;; devmounts=1) devmounts=1 ;;
            devnull=1) devnull=1 ;; nodename=1) nodename=1 ;; annotation=1) annotation=1 ;;
            hold=*) hold=${kv#hold=} ;; ns=*) ns=${kv#ns=} ;; tolerate=1) tolerate=1 ;;
        esac
    done
    cat <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $name
  namespace: $ns
EOF
    [[ -n "$annotation" ]] && printf '  annotations:\n    cdi.k8s.io/route: nvidia.com/gpu=all\n'
    echo "spec:"
    echo "  restartPolicy: Never"
    echo "  terminationGracePeriodSeconds: 1"
    echo "  automountServiceAccountToken: false"
    [[ -n "$nodename" ]] && echo "  nodeName: $NODE"
    [[ -n "$tolerate" ]] && printf '  tolerations:\n  - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}\n'
    echo "  containers:"
    echo "  - name: c"
    echo "    image: gpu-webhook.dev/check:$([[ $image == cuda ]] && echo cuda || echo 1)"
    echo "    imagePullPolicy: Never"
    if [[ -n "$env$hold" ]]; then
        echo "    env:"
        [[ -n "$env" ]] && printf '    - {name: NVIDIA_VISIBLE_DEVICES, value: "%s"}\n' "$env"
        [[ -n "$hold" ]] && printf '    - {name: HOLD, value: "%s"}\n' "$hold"
    fi
    [[ -n "$gpu" ]] && printf '    resources:\n      limits: {nvidia.com/gpu: %s}\n' "$gpu"
    if [[ -n "$priv" ]]; then
        printf '    securityContext: {privileged: true}\n'
    elif [[ -n "$sysadmin" ]]; then
        printf '    securityContext: {capabilities: {add: [SYS_ADMIN]}}\n'
    fi
    if [[ -n "$devmounts" ]]; then
        printf '    volumeMounts:\n'
        printf '    - {name: d0, mountPath: /dev/nvidia0}\n    - {name: d1, mountPath: /dev/nvidiactl}\n'
        printf '  volumes:\n'
        printf '  - {name: d0, hostPath: {path: /dev/nvidia0, type: CharDevice}}\n'
        printf '  - {name: d1, hostPath: {path: /dev/nvidiactl, type: CharDevice}}\n'
    elif [[ -n "$devnull" ]]; then
        printf '    volumeMounts:\n    - {name: req, mountPath: /var/run/nvidia-container-devices/all}\n'
        printf '  volumes:\n  - {name: req, hostPath: {path: /dev/null, type: CharDevice}}\n'
    fi
}

# The routes of docs/security.md that one node can try: ID|what the pod is|pod arguments.
# Each pod tolerates the GPU node's taint (as a user who wants that node writes it), but
# route 11's, which names the node instead.
ROUTES=(
    "1|asks 1 GPU (limits), check image|gpu=1 tolerate=1"
    "3|asks no GPU, own NVIDIA_VISIBLE_DEVICES=all|env=all tolerate=1"
    "4|asks no GPU, CUDA-like image (ENV NVIDIA_VISIBLE_DEVICES=all)|image=cuda tolerate=1"
    "5|asks 1 GPU, own NVIDIA_VISIBLE_DEVICES=all|gpu=1 env=all tolerate=1"
    "5v|asks 1 GPU, own NVIDIA_VISIBLE_DEVICES=void (whose entry wins)|gpu=1 env=void tolerate=1"
    "7|privileged, asks no GPU, CUDA-like image|privileged=1 image=cuda tolerate=1"
    "8|SYS_ADMIN, asks no GPU, CUDA-like image|sysadmin=1 image=cuda tolerate=1"
    "9|hostPath /dev/nvidia0 and /dev/nvidiactl, unprivileged, asks no GPU|devmounts=1 tolerate=1"
    "10|hostPath /dev/null at /var/run/nvidia-container-devices/all, asks no GPU|devnull=1 tolerate=1"
    "11|spec.nodeName of the GPU node, no toleration, CUDA-like image, asks no GPU|nodename=1 image=cuda"
    "19|pod annotation cdi.k8s.io/route: nvidia.com/gpu=all, asks no GPU|annotation=1 tolerate=1"
)

# summary of a finished pod's /check output: "GPU SEEN (UUID)" / "no GPU (...)"
summarize() {  # summarize LOGFILE
    local f=$1 v
    v=$(sed -n 's/^verdict: //p' "$f" | tail -n1)
    if [[ "$v" == "GPU SEEN" ]]; then
        echo "**GPU seen**: $(grep -o 'GPU-[0-9a-f-]*' "$f" | head -n1 | cut -c1-12)…; env \`$(sed -n 's/^env: //p' "$f" | sed 's/ *$//')\`"
    elif [[ "$v" == "NO GPU" ]]; then
        local why
        why=$(sed -n 's/^open \/dev\/nvidiactl: //p' "$f" | head -n1)
        echo "no GPU; env \`$(sed -n 's/^env: //p' "$f" | sed 's/ *$//')\`; /dev: \`$(sed -n 's/^dev: //p' "$f" | sed 's/ *$//')\`${why:+; open /dev/nvidiactl: $why}"
    else
        echo "did not run: $(head -c 300 "$f" | tr '\n' ' ')"
    fi
}

# create_pod NAME ARGS...: the pod created with kubectl; prints "" when created, else
# "refused: <what kubectl said>".
create_pod() {
    local name=$1
    shift
    pod "$name" "$@" > "$RAW/pod-$name.yaml"
    if ! k create -f "$RAW/pod-$name.yaml" > "$RAW/create-$name.txt" 2>&1; then
        echo "refused: $(sed 's/^Error from server[^:]*: //' "$RAW/create-$name.txt" | tr '\n' ' ' | cut -c1-400)"
    fi
}
# finish_pod NAME [NS]: wait until it ended, keep what it printed, print its summary.
finish_pod() {  # finish_pod NAME [NS [SECONDS]]
    local name=$1 ns=${2:-research} limit=${3:-$POD_WAIT}
    (( limit < 3 )) && limit=3
    k get pod "$name" -n "$ns" -o yaml > "$RAW/admitted-$name.yaml" 2>&1
    wait_for "$limit" "pod $name finished" sh -c \
        "kubectl get pod $name -n $ns -o jsonpath='{.status.phase}' | grep -qE 'Succeeded|Failed'" \
        || k describe pod "$name" -n "$ns" > "$RAW/describe-$name.txt" 2>&1
    # kubectl logs (through the kubelet), else the kubelet's own file of it
    k logs "$name" -n "$ns" > "$RAW/logs-$name.txt" 2>&1 \
        || cat /var/log/pods/"${ns}_${name}"_*/c/*.log 2>/dev/null | cut -d' ' -f4- > "$RAW/logs-$name.txt"
    k get pod "$name" -n "$ns" -o wide >> "$RAW/logs-$name.txt" 2>&1
    summarize "$RAW/logs-$name.txt"
}

# route 13: an ephemeral container (kubectl debug) with the CUDA-like image in a running pod
try_debug() {  # try_debug NAME
    local name=$1
    pod "$name" hold=300 tolerate=1 > "$RAW/pod-$name.yaml"
    k create -f "$RAW/pod-$name.yaml" > "$RAW/create-$name.txt" 2>&1 || { echo "target refused"; return; }
    wait_for 60 "pod $name running" sh -c "kubectl get pod $name -n research -o jsonpath='{.status.phase}' | grep -qx Running"
    if ! k debug -n research "pod/$name" --image=gpu-webhook.dev/check:cuda --image-pull-policy=Never \
            --container=dbg -- /check > "$RAW/debug-$name.txt" 2>&1; then
        echo "refused: $(sed 's/^Error from server[^:]*: //' "$RAW/debug-$name.txt" | tr '\n' ' ' | cut -c1-400)"
    else
        wait_for 60 "ephemeral container of $name finished" sh -c \
            "kubectl get pod $name -n research -o jsonpath='{.status.ephemeralContainerStatuses[0].state.terminated.reason}' | grep -q ."
        k logs "$name" -n research -c dbg > "$RAW/logs-$name-dbg.txt" 2>&1
        k get pod "$name" -n research -o yaml > "$RAW/admitted-$name.yaml" 2>&1
        summarize "$RAW/logs-$name-dbg.txt"
    fi
    k delete pod "$name" -n research --wait=false > /dev/null 2>&1
}

# batch STATE MODE: every route's pod (and route 13's) with the webhook in STATE (off|on);
# the results in $W/result-<route>-<mode>-<state>. Pods that ask no GPU run together; GPU
# pods run one after another (the node has its GPUs only, and the tenant a cap of 1).
batch() {
    local state=$1 mode=$2 r id what args name created=() res
    [[ $state == on ]] && webhook_on || webhook_off
    for r in "${ROUTES[@]}"; do
        IFS='|' read -r id what args <<<"$r"
        [[ $args == *gpu=* ]] && continue
        name="r$id-$mode-$state"
        # shellcheck disable=SC2086
        res=$(create_pod "$name" $args)
        if [[ -n "$res" ]]; then echo "$res" > "$W/result-$id-$mode-$state"; else created+=("$id"); fi
    done
    try_debug "r13-$mode-$state" > "$W/result-13-$mode-$state"
    for r in "${ROUTES[@]}"; do
        IFS='|' read -r id what args <<<"$r"
        [[ $args == *gpu=* ]] || continue
        name="r$id-$mode-$state"
        # shellcheck disable=SC2086
        res=$(create_pod "$name" $args)
        if [[ -n "$res" ]]; then echo "$res" > "$W/result-$id-$mode-$state"; continue; fi
        finish_pod "$name" > "$W/result-$id-$mode-$state"
        k delete pod "$name" -n research --wait=true --timeout=60s > /dev/null 2>&1
    done
    # the pods that ask no GPU ran meanwhile: one wait of $POD_WAIT for them all
    local until=$((SECONDS + POD_WAIT))
    for id in "${created[@]}"; do
        finish_pod "r$id-$mode-$state" research $((until - SECONDS)) > "$W/result-$id-$mode-$state"
    done
    k delete pods --all -n research --wait=true --timeout=90s > /dev/null 2>&1
}

# routes MODE: rows "| route | the pod | MODE | off | on |"
routes() {
    local mode=$1 r id what args
    batch off "$mode"
    batch on "$mode"
    for r in "${ROUTES[@]}" "13|ephemeral container (kubectl debug), CUDA-like image|"; do
        IFS='|' read -r id what args <<<"$r"
        say "| $id | $what | $mode | $(cat "$W/result-$id-$mode-off" 2>/dev/null) | $(cat "$W/result-$id-$mode-on" 2>/dev/null) |"
    done
}

main_checks() {
    webhook_on
    # 1. A GPU pod through the webhook to the real node and its GPU.
    pod gpu-pod gpu=1 > "$RAW/pod-gpu-pod.yaml"
    raw create-gpu-pod k create -f "$RAW/pod-gpu-pod.yaml"
    wait_for "$POD_WAIT" "gpu-pod finished" sh -c \
        "kubectl get pod gpu-pod -n research -o jsonpath='{.status.phase}' | grep -qE 'Succeeded|Failed'"
    raw gpu-pod-yaml k get pod gpu-pod -n research -o yaml > /dev/null
    raw gpu-pod-logs k logs gpu-pod -n research > /dev/null
    raw gpu-pod-node k describe node "$NODE" > /dev/null
    local pod_node smi uuid aff tol mutated
    pod_node=$(k get pod gpu-pod -n research -o jsonpath='{.spec.nodeName}')
    smi=$(sed -n 's/^nvidia-smi -L: //p' "$RAW/gpu-pod-logs.txt")
    uuid=$(grep -o 'GPU-[0-9a-f-]*' "$RAW/gpu-pod-logs.txt" | head -n1)
    aff=$(k get pod gpu-pod -n research -o jsonpath='{.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[*].matchExpressions}')
    tol=$(k get pod gpu-pod -n research -o jsonpath='{.spec.tolerations}')
    mutated=$(k get pod gpu-pod -n research -o jsonpath='{.metadata.annotations.gpu-webhook\.dev/mutated}')
    {
        echo "| the webhook's changes (annotation) | \`$mutated\` |"
        echo "| node affinity it added | \`$aff\` |"
        echo "| tolerations it added | \`$tol\` |"
        echo "| node the scheduler chose | \`$pod_node\` (this host's node: \`$NODE\`) |"
        echo "| pod phase | $(k get pod gpu-pod -n research -o jsonpath='{.status.phase}') |"
        echo "| \`nvidia-smi -L\` in the pod | \`$smi\` |"
        echo "| the host's \`nvidia-smi -L\` | \`$(head -n1 "$RAW/host-nvidia-smi-L.txt")\` |"
        echo "| UUIDs match | $([[ -n "$uuid" && "$uuid" == "$HOST_UUID" ]] && echo "**yes**" || echo "**no** (pod: ${uuid:-none}, host: $HOST_UUID)") |"
        echo "| environment the container was given | \`$(sed -n 's/^env: //p' "$RAW/gpu-pod-logs.txt")\` |"
    } >> "$GPU_ROWS"
    k delete pod gpu-pod -n research --wait=true --timeout=60s > /dev/null 2>&1

    # 2. Quota through the kubelet: the tenant's cap is 1 GPU.
    pod q1 gpu=1 hold=600 > "$RAW/pod-q1.yaml"
    pod q2 gpu=1 > "$RAW/pod-q2.yaml"
    raw quota-create-q1 k create -f "$RAW/pod-q1.yaml" > /dev/null
    wait_for 60 "q1 running" sh -c "kubectl get pod q1 -n research -o jsonpath='{.status.phase}' | grep -qx Running"
    echo "| q1 (1 GPU, holds it) created | $(head -n1 "$RAW/quota-create-q1.txt"); phase $(k get pod q1 -n research -o jsonpath='{.status.phase}') on \`$(k get pod q1 -n research -o jsonpath='{.spec.nodeName}')\` |" >> "$QUOTA_ROWS"
    raw quota-create-q2-refused k create -f "$RAW/pod-q2.yaml" > /dev/null
    echo "| q2 (1 GPU) while q1 runs | $(grep -v '^\[exit' "$RAW/quota-create-q2-refused.txt" | tr '\n' ' ' | cut -c1-500) |" >> "$QUOTA_ROWS"
    raw quota-delete-q1 k delete pod q1 -n research --wait=true --timeout=90s > /dev/null
    echo "| q1 deleted (the kubelet stops it) | $(head -n1 "$RAW/quota-delete-q1.txt") |" >> "$QUOTA_ROWS"
    sleep 2
    raw quota-create-q2 k create -f "$RAW/pod-q2.yaml" > /dev/null
    wait_for "$POD_WAIT" "q2 finished" sh -c "kubectl get pod q2 -n research -o jsonpath='{.status.phase}' | grep -qE 'Succeeded|Failed'"
    k logs q2 -n research > "$RAW/logs-q2.txt" 2>&1
    echo "| q2 created again | $(head -n1 "$RAW/quota-create-q2.txt"); $(summarize "$RAW/logs-q2.txt") |" >> "$QUOTA_ROWS"
    k delete pod q2 -n research --wait=true --timeout=60s > /dev/null 2>&1
}

finish() {
    trap - EXIT
    set +e
    tail -n +"$((ROUTE_ROWS_START + 1))" "$REPORT" > "$ROUTE_ROWS"
    # --- report ---------------------------------------------------------------------------------
    k get nodes -o wide > "$RAW/nodes.txt" 2>&1
    k get node "$NODE" -o jsonpath='{.metadata.labels}' > "$RAW/node-labels.json" 2>&1
    k get node "$NODE" -o jsonpath='{.status.capacity}' > "$RAW/node-capacity.json" 2>&1
    {
        echo "# A real GPU node with gpu-webhook in front: what was seen"
        echo
        echo "Run by tools/realnode/run.sh on $(date -u '+%Y-%m-%d %H:%M UTC'), node \`$NODE\`."
        echo
        echo "## The host and the versions"
        echo
        echo "- GPU: $HOST_GPU, driver $DRIVER; \`$(head -n1 "$RAW/host-nvidia-smi-L.txt")\`"
        echo "- kernel $(uname -r); $(grep PRETTY_NAME /etc/os-release | cut -d= -f2 | tr -d '"'); cgroup $(stat -fc %T /sys/fs/cgroup); pod network: $NET"
        echo "- built: $(tr '\n' ';' < "$RAW/versions.txt" | sed 's/;/; /g')"
        echo "- node labels from GPU Feature Discovery: \`$(grep -E '^nvidia.com/gpu\.(product|count|memory|family)=' "$W/gfd-labels" 2>/dev/null | tr '\n' ' ')\`"
        echo "- node capacity: \`$(cat "$RAW/node-capacity.json")\`"
        echo "- toolkit settings (nvidia-ctk config default, mode cdi): \`$(grep -E '^#?accept-nvidia' "$RAW/nvidia-container-runtime-config.toml" | tr '\n' ' ')\`"
        echo
        echo "## A GPU pod, admitted by the webhook, on the real node"
        echo
        cat "$GPU_ROWS"
        echo
        echo "## The routes of docs/security.md, webhook off and on"
        echo
        echo "| route | the pod | device plugin strategy | webhook off: what the container saw | webhook on |"
        echo "|---|---|---|---|---|"
        cat "$ROUTE_ROWS"
        echo
        echo "## Quota through the kubelet (tenant research: 1 GPU)"
        echo
        echo "| step | seen |"
        echo "|---|---|"
        cat "$QUOTA_ROWS"
    } > "$OUT_DIR/report.md"

    # --- stop everything --------------------------------------------------------------------------
    log "stopping"
    k delete pods --all -n research --wait=false > /dev/null 2>&1
    for n in nvidia-device-plugin kubelet; do stop "$n"; done
    # the pods' containers: their shims, then containerd
    for c in $("${CTR[@]}" tasks ls -q 2>/dev/null); do "${CTR[@]}" tasks kill -s SIGKILL "$c" >/dev/null 2>&1; done
    sleep 1
    for n in containerd gpu-webhook kube-scheduler kube-controller-manager kube-apiserver etcd; do stop "$n"; done
    # the shims containerd started (their pid files), by id
    for f in "$W"/containerd/state/io.containerd.runtime.v2.task/*/*/shim.pid; do
        [[ -f "$f" ]] && kill -9 "$(cat "$f")" 2>/dev/null
    done
    ip link del realnode0 2>/dev/null
    ip link del realnode-ip 2>/dev/null
    grep -E '^/' /proc/mounts | awk '{print $2}' | grep "^$W" | sort -r | xargs -r -n1 umount -l 2>/dev/null
    tar -C "$W" -czf "$OUT_DIR/raw.tar.gz" raw report.md policy.yaml containerd.toml kubelet.yaml \
        webhook-configurations.yaml gfd-labels 2>/dev/null
    tar -C "$W" -czf "$OUT_DIR/logs.tar.gz" logs 2>/dev/null
    log "report: $OUT_DIR/report.md ($(( SECONDS - T0 )) s)"
    cat "$OUT_DIR/report.md"
}

# in_time PHASE: whether --deadline leaves room for PHASE (else it is skipped, and said so)
in_time() {
    if (( DEADLINE > 0 && SECONDS - T0 > DEADLINE )); then
        log "skipped (deadline ${DEADLINE}s passed): $1"
        say "| - | skipped: $1 (run.sh --deadline ${DEADLINE}s passed) | | | |"
        return 1
    fi
}
if [[ $NODE_OK -eq 1 ]]; then
    # A pod that asks for nothing, in a namespace of no tenant: the node runs pods at all.
    pod hello ns=other tolerate=1 > "$RAW/pod-hello.yaml"
    raw create-hello k create -f "$RAW/pod-hello.yaml" > /dev/null
    HELLO=$(finish_pod hello other)
    log "hello pod: $HELLO"
    echo "| a pod asking for nothing, tolerating the GPU taint (namespace of no tenant) | $HELLO |" >> "$GPU_ROWS"
    if [[ $HELLO == "did not run"* ]]; then
        # No pod runs on this node: say why, and stop here.
        k describe pod hello -n other > "$RAW/describe-hello.txt" 2>&1
        grep 'level=error' "$LOGS/containerd.log" | tail -5 | cut -c1-700 > "$RAW/containerd-errors.txt"
        grep '^E' "$LOGS/kubelet.log" | tail -5 | cut -c1-700 > "$RAW/kubelet-errors.txt"
        tail -15 "$RAW/describe-hello.txt"; cat "$RAW/containerd-errors.txt" "$RAW/kubelet-errors.txt"
        echo "| why (containerd) | \`$(tail -n1 "$RAW/containerd-errors.txt" | tr '|`' '  ')\` |" >> "$GPU_ROWS"
        NODE_OK=0
    fi
fi
if [[ $NODE_OK -eq 1 && -z "$NVSMI" && -z "${REALNODE_FORCE_CHECKS:-}" ]]; then
    log "no NVIDIA driver here: the GPU checks are skipped"
elif [[ $NODE_OK -eq 1 ]]; then
    device_plugin envvar
    raw node-after-plugin k get node "$NODE" -o yaml > /dev/null
    main_checks
    in_time "routes, envvar" && routes envvar
    in_time "routes, cdi-cri" && device_plugin cdi-cri && routes cdi-cri
fi
