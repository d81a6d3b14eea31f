#!/usr/bin/env bash
# Build the Kubernetes test-cluster binaries from the Go module proxy into
# .k8s/bin: etcd and kube-apiserver, kube-scheduler, kube-controller-manager,
# kubelet, kube-proxy, kubectl. Binaries that already exist at the pinned version are kept,
# so a second run does nothing.
#
#   K8S_VERSION   k8s.io/kubernetes version (staging modules: v0.<minor>.<patch>)
#   ETCD_VERSION  go.etcd.io/etcd/server/v3 version
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
K8S_VERSION=${K8S_VERSION:-v1.37.2}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
K8S_DIR=${K8S_DIR:-$ROOT/.k8s}
BIN_DIR=$K8S_DIR/bin
BUILD_DIR=$K8S_DIR/build
CMDS=(kube-apiserver kube-scheduler kube-controller-manager kubelet kube-proxy kubectl)

log() { echo "k8s-build: $*"; }
mkdir -p "$BIN_DIR" "$BUILD_DIR"
export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0

# A stamp file records which version each binary was built from.
built() { [[ -x $BIN_DIR/$1 && "$(cat "$BIN_DIR/.$1.version" 2>/dev/null)" == "$2" ]]; }
stamp() { echo "$2" > "$BIN_DIR/.$1.version"; }

build_etcd() {
  if built etcd "$ETCD_VERSION"; then log "etcd $ETCD_VERSION cached"; return; fi
  log "building etcd $ETCD_VERSION (about 1 min cold)"
  local dir=$BUILD_DIR/etcd
  mkdir -p "$dir"
  printf 'module etcdbuild\n\ngo 1.26.0\n' > "$dir/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' > "$dir/tools.go"
  if ! (cd "$dir" && go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION") >"$dir/get.log" 2>&1; then
    cat "$dir/get.log" >&2
    exit 1
  fi
  (cd "$dir" && go build -trimpath -ldflags='-s -w' -o "$BIN_DIR/etcd" go.etcd.io/etcd/server/v3)
  stamp etcd "$ETCD_VERSION"
}

build_kubernetes() {
  local missing=() c
  for c in "${CMDS[@]}"; do built "$c" "$K8S_VERSION" || missing+=("$c"); done
  if ((${#missing[@]} == 0)); then log "kubernetes $K8S_VERSION binaries cached"; return; fi
  log "building ${missing[*]} $K8S_VERSION (about 8-10 min cold on 2 cores)"
  local dir=$BUILD_DIR/kubernetes staging_version=v0.${K8S_VERSION#v1.}
  local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  mkdir -p "$dir"
  # k8s.io/kubernetes requires its staging modules (k8s.io/api, ...) at v0.0.0
  # and replaces them with directories in its own tree; a module that depends
  # on it must replace each with the published v0.X.Y instead.
  local gomod
  gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | awk -F'"' '$2=="GoMod"{print $4}')
  {
    echo "module k8sbuild"
    echo
    echo "go $(awk '$1=="go"{print $2; exit}' "$gomod")"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    awk '$1 ~ /^k8s\.io\// && $2=="v0.0.0" {print $1}' "$gomod" | sort -u |
      while read -r m; do printf '\t%s => %s %s\n' "$m" "$m" "$staging_version"; done
    echo ")"
  } > "$dir/go.mod"
  {
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    for c in "${CMDS[@]}"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$c"; done
    printf ')\n'
  } > "$dir/tools.go"
  (cd "$dir" && go mod tidy -e >/dev/null 2>&1 || true)
  local ld="-s -w" pkg pkgs=()
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  done
  for c in "${missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
  # One go build for all commands shares the compile graph.
  (cd "$dir" && go build -trimpath -ldflags="$ld" -o "$BIN_DIR/" "${pkgs[@]}")
  for c in "${missing[@]}"; do stamp "$c" "$K8S_VERSION"; done
}

build_etcd
build_kubernetes
log "binaries in $BIN_DIR"
