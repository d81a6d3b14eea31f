#!/usr/bin/env bash
# k8s-down.sh stops the cluster that scripts/k8s-up.sh started and removes
# what it made: processes (by their recorded PIDs, plus the containerd shims
# that serve our containerd socket), pod sandboxes and their mounts and
# network namespaces, the cni0 and k8s-node0 bridges, the kubepods cgroups,
# the KUBE-* and CNI-* iptables chains, .k8s/data and .k8s/kubeconfig.
#
# The built binaries (.k8s/bin) and the imported images (.k8s/containerd) are
# kept so the next k8s-up takes seconds; CLEAN=1 removes all of .k8s and the
# opensandbox/pause image too.
# Safe to run when nothing is up.
set -euo pipefail
# shellcheck source=k8s/common.sh
source "$(dirname "$0")/k8s/common.sh"
LOG_PREFIX=k8s-down

[[ $(id -u) -eq 0 ]] || die "must run as root"
lock_cluster

# stop NAME...: SIGTERM the recorded PIDs together, SIGKILL what still runs
# after 10 s.
stop() {
  local name pid t0=$SECONDS
  local -A pids=()
  for name in "$@"; do
    pid=$(pid_of "$name") || continue
    if [[ -n $pid ]] && kill "$pid" 2>/dev/null; then pids[$name]=$pid; fi
    rm -f "$DATA/pids/$name.pid"
  done
  for name in "${!pids[@]}"; do
    pid=${pids[$name]}
    while kill -0 "$pid" 2>/dev/null && ((SECONDS - t0 < 10)); do sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    log "stopped $name (pid $pid) after $((SECONDS - t0)) s"
  done
}

# Let the kubelet tear pods down itself (CNI DEL, volume unmounts) first.
if alive kubelet && alive kube-apiserver && alive containerd; then
  log "deleting pods"
  if ! kubectl_ delete pods --all --all-namespaces --grace-period=1 --wait=true --timeout=30s >/dev/null 2>&1; then
    log "some pods were not deleted within 30 s; removing them by force"
  fi
fi
stop kube-proxy kubelet

# Remove every container and sandbox from our containerd, so its root
# (kept for the images) holds images only.
if alive containerd; then
  for id in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true; done
  for id in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks rm -f "$id" >/dev/null 2>&1 || true; done
  for id in $(ctr_ containers ls -q 2>/dev/null); do ctr_ containers rm "$id" >/dev/null 2>&1 || true; done
fi
stop containerd
# Shims outlive containerd; end only those attached to our socket.
for pid in $(pgrep -f -- "-address $CTRD_SOCK( |$)" || true); do
  kill -9 "$pid" 2>/dev/null && log "stopped containerd shim (pid $pid)"
done

stop kube-controller-manager kube-scheduler kube-apiserver
stop etcd

# Mounts: container root filesystems, pod volumes, pod network namespaces.
{ findmnt -rn -o TARGET | grep -E "^($DATA|$CTRD_ROOT)/|^/run/netns/cni-" || true; } | sort -r |
  while read -r m; do umount -l "$m" 2>/dev/null || true; done
rm -f /run/netns/cni-*
# Directories made by the CRI (netns) and by containerd 1.6's shims (their
# sockets always go to /run/containerd/s), if nothing else uses them.
rmdir /run/netns /run/containerd/s /run/containerd 2>/dev/null || true

for link in "$POD_BRIDGE" "$NODE_BRIDGE"; do
  if ip link show "$link" >/dev/null 2>&1; then
    ip link del "$link"
    log "removed link $link"
  fi
done

for c in /sys/fs/cgroup/*/kubepods; do
  if [[ -d $c ]]; then find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null || true; fi
done

# iptables chains kube-proxy made (KUBE-SERVICES, KUBE-SVC-*, ...): its own
# cleanup first, for what it knows (ipvs, nftables too); then every chain the
# kubelet, it and the CNI plugins made (KUBE-FIREWALL, KUBE-KUBELET-CANARY,
# CNI-FORWARD, CNI-HOSTPORT-*, ...): drop the jumps to them from other
# chains, then the chains.
if [[ -x $BIN/kube-proxy ]]; then
  "$BIN/kube-proxy" --cleanup >/dev/null 2>&1 || true
fi
for ipt in iptables ip6tables; do
  command -v "$ipt" >/dev/null || continue
  for table in filter nat mangle; do
    rules=$("$ipt" -t "$table" -S 2>/dev/null) || continue
    { grep -E '^-A [A-Z0-9-]+ .*-j (KUBE|CNI)-' <<<"$rules" | grep -Ev '^-A (KUBE|CNI)-' || true; } | sed 's/^-A/-D/' |
      while read -r rule; do eval "$ipt -t $table $rule" 2>/dev/null || true; done
    for chain in $(awk '$1 == "-N" && $2 ~ /^(KUBE|CNI)-/ {print $2}' <<<"$rules"); do
      "$ipt" -t "$table" -F "$chain" 2>/dev/null || true
    done
    for chain in $(awk '$1 == "-N" && $2 ~ /^(KUBE|CNI)-/ {print $2}' <<<"$rules"); do
      "$ipt" -t "$table" -X "$chain" 2>/dev/null || true
    done
  done
done

# The kubelet keeps pod logs in .k8s/data/pod-logs but always links them from
# /var/log/containers: remove our links, and the directories if now empty.
if [[ -d /var/log/containers ]]; then
  find /var/log/containers -maxdepth 1 -type l -lname "$DATA/*" -delete
fi
rmdir /var/log/containers /var/log/pods 2>/dev/null || true
# ... and its device-plugin socket under /var/lib/kubelet whatever its root dir.
rm -f /var/lib/kubelet/device-plugins/kubelet.sock
rmdir /var/lib/kubelet/device-plugins /var/lib/kubelet 2>/dev/null || true

rm -rf "$DATA" "$KUBECONFIG_OUT"
if [[ ${CLEAN:-0} == 1 ]]; then
  chmod -R u+w "$K8S_DIR/build" 2>/dev/null || true # Go's module cache copies are read-only
  rm -rf "$K8S_DIR"
  if docker image inspect "$PAUSE_IMAGE" >/dev/null 2>&1; then
    docker image rm "$PAUSE_IMAGE" >/dev/null && log "removed the Docker image $PAUSE_IMAGE"
  fi
  log "removed $K8S_DIR (binaries and images included)"
else
  log "done; binaries in $BIN and images in $CTRD_ROOT are kept (CLEAN=1 removes them)"
fi
