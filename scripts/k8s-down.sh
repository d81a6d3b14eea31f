#!/usr/bin/env bash
# k8s-down.sh stops the cluster that scripts/k8s-up.sh started and removes
# what it made: processes (by their recorded PIDs, plus the containerd shims
# that serve our containerd socket), pod sandboxes and their mounts and
# network namespaces, the cni0 and k8s-node0 bridges, the kubepods cgroups,
# the KUBE-* iptables chains, .k8s/data and .k8s/kubeconfig.
#
# The built binaries (.k8s/bin) and the imported images (.k8s/containerd) are
# kept so the next k8s-up takes seconds; CLEAN=1 removes all of .k8s too.
# Safe to run when nothing is up.
set -euo pipefail
# shellcheck source=k8s/common.sh
source "$(dirname "$0")/k8s/common.sh"
LOG_PREFIX=k8s-down

[[ $(id -u) -eq 0 ]] || die "must run as root"

# stop NAME: SIGTERM the recorded PID, SIGKILL after 10 s.
stop() {
  local pid
  pid=$(pid_of "$1") || return 0
  if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.2
    done
    kill -9 "$pid" 2>/dev/null || true
    log "stopped $1 (pid $pid)"
  fi
  rm -f "$DATA/pids/$1.pid"
}

# Let the kubelet tear pods down itself (CNI DEL, volume unmounts) first.
if alive kubelet && alive kube-apiserver && alive containerd; then
  log "deleting pods"
  kubectl_ delete pods --all --all-namespaces --grace-period=0 --force --wait=true --timeout=60s \
    >/dev/null 2>&1 || log "some pods were not deleted in time; removing them by force"
fi
stop kubelet

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

for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do stop "${COMPONENTS[i]}"; done

# Mounts: container root filesystems, pod volumes, pod network namespaces.
findmnt -rn -o TARGET | grep -E "^($DATA|$CTRD_ROOT)/|^/run/netns/cni-" | sort -r |
  while read -r m; do umount -l "$m" 2>/dev/null || true; done
rm -f /run/netns/cni-*

for link in "$POD_BRIDGE" "$NODE_BRIDGE"; do
  if ip link show "$link" >/dev/null 2>&1; then
    ip link del "$link"
    log "removed link $link"
  fi
done

for c in /sys/fs/cgroup/*/kubepods; do
  if [[ -d $c ]]; then find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null || true; fi
done

# iptables chains the kubelet made (KUBE-FIREWALL, KUBE-KUBELET-CANARY, ...):
# drop the jumps to them from other chains, then the chains.
for ipt in iptables ip6tables; do
  command -v "$ipt" >/dev/null || continue
  for table in filter nat mangle; do
    rules=$("$ipt" -t "$table" -S 2>/dev/null) || continue
    grep -E '^-A [A-Z-]+ .*-j KUBE-' <<<"$rules" | grep -v '^-A KUBE-' | sed 's/^-A/-D/' |
      while read -r rule; do eval "$ipt -t $table $rule" 2>/dev/null || true; done
    for chain in $(awk '$1 == "-N" && $2 ~ /^KUBE-/ {print $2}' <<<"$rules"); do
      "$ipt" -t "$table" -F "$chain" 2>/dev/null || true
    done
    for chain in $(awk '$1 == "-N" && $2 ~ /^KUBE-/ {print $2}' <<<"$rules"); do
      "$ipt" -t "$table" -X "$chain" 2>/dev/null || true
    done
  done
done

# The kubelet writes container logs under /var/log/pods and /var/log/containers;
# leave the directories only if something else has files there.
rmdir /var/log/pods /var/log/containers 2>/dev/null || true

rm -rf "$DATA" "$KUBECONFIG_OUT"
if [[ ${CLEAN:-0} == 1 ]]; then
  chmod -R u+w "$K8S_DIR/build" 2>/dev/null || true # Go's module cache copies are read-only
  rm -rf "$K8S_DIR"
  log "removed $K8S_DIR (binaries and images included)"
else
  log "done; binaries in $BIN and images in $CTRD_ROOT are kept (CLEAN=1 removes them)"
fi
