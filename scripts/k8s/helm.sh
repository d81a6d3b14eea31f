#!/usr/bin/env bash
# Build helm from the Go module proxy into .k8s/bin, once: the chart in
# deploy/helm/opensandbox is linted, rendered and installed with it
# (deploy/deploy_test.go, e2e). A helm that is there at the pinned version
# is kept, so a second run does nothing.
#
#   HELM_VERSION  helm.sh/helm/v4 version
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HELM_VERSION=${HELM_VERSION:-v4.3.1}
K8S_DIR=${K8S_DIR:-$ROOT/.k8s}
BIN_DIR=$K8S_DIR/bin

log() { echo "k8s-helm: $*"; }
mkdir -p "$BIN_DIR"
export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0

if [[ -x $BIN_DIR/helm && "$(cat "$BIN_DIR/.helm.version" 2>/dev/null)" == "$HELM_VERSION" ]]; then
  log "helm $HELM_VERSION cached"
  exit 0
fi
log "building helm $HELM_VERSION (about 2-3 min cold on 2 cores)"
# go install MODULE@VERSION builds with helm's own go.mod, outside this
# module; the version helm reports comes from the linker, as its Makefile
# sets it.
GOBIN=$BIN_DIR go install -trimpath \
  -ldflags="-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION -X helm.sh/helm/v4/internal/version.gitTreeState=clean" \
  "helm.sh/helm/v4/cmd/helm@$HELM_VERSION"
echo "$HELM_VERSION" > "$BIN_DIR/.helm.version"
log "$("$BIN_DIR/helm" version --short 2>/dev/null || echo "helm $HELM_VERSION") in $BIN_DIR"
