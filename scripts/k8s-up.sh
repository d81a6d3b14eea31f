#!/usr/bin/env bash
# k8s-up.sh starts a real single-node Kubernetes cluster on this machine for
# tests, from the Go module proxy and Debian packages only:
#
#   - builds etcd and kube-apiserver, kube-scheduler, kube-controller-manager,
#     kubelet, kube-proxy and kubectl into .k8s/bin (once: ~10 min cold on 2 cores,
#     cached afterwards; see scripts/k8s/build.sh for the pinned versions),
#     and helm (scripts/k8s/helm.sh), which installs deploy/helm/opensandbox;
#   - installs Debian's containerd, runc and containernetworking-plugins when
#     missing, and builds a local pause image;
#   - starts etcd, kube-apiserver, kube-scheduler, kube-controller-manager, a
#     containerd of its own (socket, root and state under .k8s/, not Docker's)
#     a kubelet and kube-proxy (iptables); pods get addresses on a local
#     bridge (cni0, 10.244.0.0/24) that the host reaches directly, and
#     ClusterIP Services work from the host and from pods, `kubernetes`
#     (10.96.0.1:443) included, so in-cluster clients reach the apiserver;
#   - imports the local images (K8S_IMAGES in scripts/k8s/common.sh, built by
#     `make images`) into containerd, so pods use them with imagePullPolicy:
#     Never or IfNotPresent (scripts/k8s-images.sh re-imports changed ones);
#   - waits until the node is Ready and writes the admin kubeconfig to
#     .k8s/kubeconfig.
#
# Idempotent: when the cluster already runs it says so and exits. Logs are in
# .k8s/data/logs. scripts/k8s-down.sh stops and removes it.
set -euo pipefail
# shellcheck source=k8s/common.sh
source "$(dirname "$0")/k8s/common.sh"
LOG_PREFIX=k8s-up
start_time=$SECONDS

[[ $(id -u) -eq 0 ]] || die "must run as root (bridges, mounts, cgroups, iptables)"
lock_cluster

all_alive() {
  local c
  for c in "${COMPONENTS[@]}"; do alive "$c" || return 1; done
}

# helm is no part of the cluster, only a client the tests use: built (once)
# even when the cluster already runs.
"$K8S_ROOT/scripts/k8s/helm.sh" >&2

if all_alive && node_ready; then
  cp "$DATA/admin.kubeconfig" "$KUBECONFIG_OUT"
  log "already running: node $NODE_NAME is Ready; kubeconfig: $KUBECONFIG_OUT"
  exit 0
fi
if [[ -d $DATA ]]; then
  log "a previous cluster is partly there; removing it first"
  "$K8S_ROOT/scripts/k8s-down.sh"
fi

# --- prerequisites -----------------------------------------------------------

missing=()
command -v containerd >/dev/null || missing+=(containerd)
command -v runc >/dev/null || missing+=(runc)
command -v runsc >/dev/null || missing+=(runsc)
[[ -x /usr/lib/cni/bridge ]] || missing+=(containernetworking-plugins)
command -v iptables >/dev/null || missing+=(iptables)
command -v openssl >/dev/null || missing+=(openssl)
if ((${#missing[@]})); then
  log "installing ${missing[*]} from Debian"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
docker version --format '{{.Server.Version}}' >/dev/null 2>&1 ||
  die "the Docker engine does not answer; run \`make docker\` (it holds the images to import)"
for img in $K8S_IMAGES; do
  docker image inspect "$img" >/dev/null 2>&1 || die "image $img is missing; run \`make images\`"
done

"$K8S_ROOT/scripts/k8s/build.sh"
"$K8S_ROOT/scripts/k8s/gvisor.sh"
"$K8S_ROOT/scripts/k8s/pause.sh"

# --- control plane -----------------------------------------------------------

mkdir -p "$DATA/logs" "$DATA/pids"
"$K8S_ROOT/scripts/k8s/pki.sh"

# start NAME CMD...: run CMD in its own session (so ^C on make does not
# reach it), log to logs/NAME.log, remember its PID.
start() {
  local name=$1
  shift
  setsid "$@" >"$DATA/logs/$name.log" 2>&1 </dev/null 9>&- &
  echo $! >"$DATA/pids/$name.pid"
  log "started $name (pid $!)"
}
# fail NAME WHAT: report a component that did not come up, with its log.
fail() {
  log "$1 $2; last lines of $DATA/logs/$1.log:"
  tail -n 20 "$DATA/logs/$1.log" >&2 || true
  log "run scripts/k8s-down.sh (make k8s-down) to clean up"
  exit 1
}

start etcd "$BIN/etcd" --name default --data-dir "$DATA/etcd" \
  --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster default=http://127.0.0.1:2380 --listen-metrics-urls http://127.0.0.1:2381 \
  --unsafe-no-fsync --log-level warn
wait_for 30 etcd curl -fs http://127.0.0.1:2379/health || fail etcd "did not answer within 30 s"

# Pods reach the apiserver through the `kubernetes` Service, whose endpoint
# is the advertised address: the node IP (a loopback address is refused
# there), on the node's bridge. The apiserver listens on every address so it
# answers there and on 127.0.0.1 (the kubeconfigs); it requires a client
# certificate or token for everything but its health and version.
start kube-apiserver "$BIN/kube-apiserver" \
  --etcd-servers=http://127.0.0.1:2379 \
  --bind-address=0.0.0.0 --advertise-address="$NODE_IP" --secure-port=6443 \
  --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
  --client-ca-file="$PKI/ca.crt" \
  --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --api-audiences=https://kubernetes.default.svc.cluster.local \
  --service-cluster-ip-range="$SERVICE_CIDR" \
  --authorization-mode=Node,RBAC --allow-privileged=true \
  --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" \
  --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
  --kubelet-preferred-address-types=InternalIP,Hostname \
  --profiling=false --v=1
wait_for 60 kube-apiserver curl -fs --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
  "$APISERVER/readyz" || fail kube-apiserver "was not ready within 60 s"

common_flags=(--kubeconfig="$DATA/admin.kubeconfig"
  --authentication-kubeconfig="$DATA/admin.kubeconfig" --authorization-kubeconfig="$DATA/admin.kubeconfig"
  --bind-address=127.0.0.1 --leader-elect=false)
start kube-scheduler "$BIN/kube-scheduler" "${common_flags[@]}" --secure-port=10259
# node-ipam-controller is off: the kubelet gets its pod CIDR from its config.
start kube-controller-manager "$BIN/kube-controller-manager" "${common_flags[@]}" --secure-port=10257 \
  --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
  --use-service-account-credentials=false --controllers='*,-node-ipam-controller'

# --- node ----------------------------------------------------------------------

if ! ip link show "$NODE_BRIDGE" >/dev/null 2>&1; then
  ip link add "$NODE_BRIDGE" type bridge
  ip addr add "$NODE_IP/32" dev "$NODE_BRIDGE"
  ip link set "$NODE_BRIDGE" up
fi

mkdir -p "$DATA/cni/net.d" "$DATA/kubelet" "$CTRD_ROOT"
# The firewall plugin accepts each pod's traffic in FORWARD, whose policy
# Docker sets to DROP: without it pod-to-pod traffic (direct or through a
# Service), which br_netfilter sends through FORWARD, is dropped.
cat >"$DATA/cni/net.d/10-bridge.conflist" <<JSON
{
  "cniVersion": "1.0.0",
  "name": "opensandbox-pods",
  "plugins": [
    {"type": "bridge", "bridge": "$POD_BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}],
              "dataDir": "$DATA/cni/ipam"}},
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "firewall", "backend": "iptables"}
  ]
}
JSON

# runsc (gVisor) for pods of RuntimeClass gvisor, with the shim built by
# scripts/k8s/gvisor.sh. network=host as for Docker: the sandbox uses the
# host kernel's network stack inside the pod's network namespace (gVisor's own
# netstack is not used). RUNSC_DEBUG=1 writes runsc's debug logs to
# logs/runsc/<container id>/.
cat >"$DATA/runsc.toml" <<TOML
binary_name = "$(command -v runsc)"
root = "$CTRD_STATE/runsc"
[runsc_config]
  network = "host"
TOML
if [[ ${RUNSC_DEBUG:-0} == 1 ]]; then
  mkdir -p "$DATA/logs/runsc"
  sed -i "1i log_level = \"debug\"\nlog_path = \"$DATA/logs/runsc/%ID%/shim.log\"" "$DATA/runsc.toml"
  printf '  debug = "true"\n  debug-log = "%s/logs/runsc/%%ID%%/"\n' "$DATA" >>"$DATA/runsc.toml"
fi

# restrict_oom_score_adj: this kind of VM lacks CAP_SYS_RESOURCE, and runc
# fails to start the pause container with the -998 the kubelet asks for.
cat >"$DATA/containerd.toml" <<TOML
version = 2
root = "$CTRD_ROOT"
state = "$CTRD_STATE"
[grpc]
  address = "$CTRD_SOCK"
[ttrpc]
  address = "$CTRD_SOCK.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "docker.io/$PAUSE_IMAGE"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$CTRD_STATE/runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc]
      runtime_type = "io.containerd.runsc.v1"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc.options]
        TypeUrl = "io.containerd.runsc.v1.options"
        ConfigPath = "$DATA/runsc.toml"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$DATA/cni/net.d"
TOML
# containerd 1.6 finds a shim on its PATH only (it ignores runtime_path), so
# .k8s/bin, which holds containerd-shim-runsc-v1, goes first.
start containerd env PATH="$BIN:$PATH" containerd --config "$DATA/containerd.toml"
wait_for 30 containerd ctr_ version || fail containerd "did not answer within 30 s"

# Import the local images; one imported before is skipped (the containerd
# root under .k8s/containerd is kept across k8s-down).
import_images "$PAUSE_IMAGE" $K8S_IMAGES

# failCgroupV1: false and cgroupfs: this kind of machine has cgroup v1 only
# and no systemd.
cat >"$DATA/kubelet/config.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $PKI/kubelet-serving.crt
tlsPrivateKeyFile: $PKI/kubelet-serving.key
containerRuntimeEndpoint: unix://$CTRD_SOCK
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
podCIDR: $POD_CIDR
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
serializeImagePulls: false
podLogsDir: $DATA/pod-logs
YAML
start kubelet "$BIN/kubelet" --config="$DATA/kubelet/config.yaml" --kubeconfig="$DATA/kubelet.kubeconfig" \
  --root-dir="$DATA/kubelet/root" --hostname-override="$NODE_NAME" --node-ip="$NODE_IP" --v=1
wait_for 120 node node_ready || fail kubelet "did not make node $NODE_NAME Ready within 120 s"

# kube-proxy in iptables mode makes ClusterIPs work; NodePorts only on the
# node IP. --conntrack-max-per-core=0 leaves the machine's conntrack sysctls
# alone.
start kube-proxy "$BIN/kube-proxy" --kubeconfig="$DATA/admin.kubeconfig" --hostname-override="$NODE_NAME" \
  --proxy-mode=iptables --cluster-cidr="$POD_CIDR" --nodeport-addresses="$NODE_IP/32" \
  --conntrack-max-per-core=0 --bind-address=127.0.0.1 \
  --metrics-bind-address=127.0.0.1:10249 --healthz-bind-address=127.0.0.1:10256 --v=1
wait_for 30 kube-proxy curl -fs http://127.0.0.1:10256/healthz ||
  fail kube-proxy "did not program the Services within 30 s"
# Pods can be created once the service account controller made `default`.
wait_for 60 "default service account" kubectl_ -n default get serviceaccount default ||
  fail kube-controller-manager "did not create the default service account within 60 s"
kubectl_ apply -f - >/dev/null <<YAML || die "could not create the RuntimeClass gvisor"
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: gvisor}
handler: runsc
YAML

cp "$DATA/admin.kubeconfig" "$KUBECONFIG_OUT"
log "node $NODE_NAME is Ready after $((SECONDS - start_time)) s"
log "kubectl --kubeconfig $KUBECONFIG_OUT get pods   (pod IPs in $POD_CIDR are reachable from this host)"
