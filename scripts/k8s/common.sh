# Shared settings and helpers for scripts/k8s-up.sh and scripts/k8s-down.sh.
# Sourced, not run.
#
# Layout (all under .k8s/, git-ignored):
#   bin/         etcd and the Kubernetes binaries (cached across up/down)
#   build/       throwaway Go modules used to build them
#   containerd/  the node's containerd root: imported images (cached)
#   data/        everything of one running cluster: PKI, etcd, logs, pids,
#                containerd state, kubelet root, CNI config (removed by down)
#   kubeconfig   the admin kubeconfig of the running cluster

K8S_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# Resolved, so that the paths recorded in mounts and process command lines,
# which k8s-down.sh matches, are the same whichever way .k8s is reached (it
# may be a symlink to another worktree's).
K8S_DIR=$(realpath -m "${K8S_DIR:-$K8S_ROOT/.k8s}")
BIN=$K8S_DIR/bin
DATA=$K8S_DIR/data
CTRD_ROOT=$K8S_DIR/containerd
CTRD_STATE=$DATA/containerd-state
CTRD_SOCK=$DATA/containerd.sock
PKI=$DATA/pki
KUBECONFIG_OUT=$K8S_DIR/kubeconfig

NODE_NAME=${NODE_NAME:-$(hostname | tr '[:upper:]' '[:lower:]')}
# The node address lives on a bridge of its own (the kubelet refuses a
# loopback node IP, and this kind of VM has no dummy netdev module).
NODE_BRIDGE=k8s-node0
NODE_IP=10.255.0.1
POD_BRIDGE=cni0
POD_CIDR=10.244.0.0/24
SERVICE_CIDR=10.96.0.0/16
APISERVER=https://127.0.0.1:6443
PAUSE_IMAGE=opensandbox/pause:1.0
# Local images imported into the node (built by `make images`).
K8S_IMAGES=${K8S_IMAGES:-opensandbox/busybox opensandbox/python:3.11 opensandbox/code-interpreter opensandbox/execd opensandbox/server opensandbox/egress opensandbox/ingress}
# The processes k8s-up.sh starts, in order.
COMPONENTS=(etcd kube-apiserver kube-scheduler kube-controller-manager containerd kubelet kube-proxy)

log() { printf '%s: %s\n' "${LOG_PREFIX:-k8s}" "$*" >&2; }
die() { log "$*"; exit 1; }

pid_of() { cat "$DATA/pids/$1.pid" 2>/dev/null; }
alive() { local p; p=$(pid_of "$1") && [[ -n $p ]] && kill -0 "$p" 2>/dev/null; }

kubectl_() { "$BIN/kubectl" --kubeconfig "$DATA/admin.kubeconfig" "$@"; }
ctr_() { ctr --address "$CTRD_SOCK" --namespace k8s.io "$@"; }

node_ready() {
  [[ $(kubectl_ get node "$NODE_NAME" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}

# lock_cluster waits until no other k8s-up, k8s-down or k8s-images runs on
# this .k8s, then holds the lock until the script exits: two of them at once
# (from two worktrees sharing .k8s, say) would start or stop components
# under each other. A script run by one that holds it (k8s-up runs k8s-down)
# goes on. Daemons must not inherit the descriptor (start closes it).
lock_cluster() {
  [[ ${K8S_LOCK_HELD:-} == "$K8S_DIR" ]] && return
  mkdir -p "$K8S_DIR"
  exec 9>"$K8S_DIR/.lock"
  if ! flock -n 9; then
    log "waiting for another k8s-up/k8s-down/k8s-images on $K8S_DIR"
    flock -w 600 9 || die "another k8s-up/k8s-down/k8s-images held $K8S_DIR/.lock for 10 minutes"
  fi
  export K8S_LOCK_HELD=$K8S_DIR
}

# import_images IMAGE...: copy local Docker images into the node's containerd
# (namespace k8s.io), where pods find them without a pull. An image is
# skipped when the Docker image ID imported last for its reference is the
# current one and containerd still has it; a newer one replaces the
# reference, and pods started afterwards use it. Needs our containerd up.
import_images() {
  local imported=$CTRD_ROOT/opensandbox-imported img ref id stamp t0
  mkdir -p "$imported"
  for img in "$@"; do
    ref=docker.io/$img
    [[ $img == *:* ]] || ref=$ref:latest
    id=$(docker image inspect --format '{{.Id}}' "$img") || die "image $img is missing; run \`make images\`"
    stamp=$imported/$(echo "$ref" | tr '/:' '__')
    if [[ $(cat "$stamp" 2>/dev/null) == "$id" ]] && ctr_ images ls -q | grep -qxF "$ref"; then
      continue
    fi
    t0=$SECONDS
    docker save "$img" | ctr_ images import - >/dev/null
    echo "$id" >"$stamp"
    log "imported $img in $((SECONDS - t0)) s"
  done
}

# wait_for SECONDS WHAT CMD...: poll CMD every 0.2 s.
wait_for() {
  local secs=$1 what=$2; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
}
