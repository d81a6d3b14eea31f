#!/usr/bin/env bash
# Build containerd-shim-runsc-v1 into .k8s/bin, so the test cluster's
# containerd can run pods under gVisor (RuntimeClass `gvisor`, handler
# `runsc`). Debian's runsc package ships runsc only, not the shim. A shim that
# is there at the pinned version is kept, so a second run does nothing.
#
# The shim comes from the Go module proxy at the gVisor snapshot closest to
# Debian 12's runsc (release-20221219), for two reasons:
#   - newer shims speak containerd 2's bootstrap protocol, which Debian's
#     containerd 1.6 does not understand;
#   - the runsc they drive must understand the flags they pass.
# That snapshot only builds with Go < 1.21 (its runtime hacks are guarded by
# build constraints), so it is built with the go1.20 toolchain, which the go
# command fetches from the module proxy itself (GOTOOLCHAIN).
#
# One line is patched, through `go build -overlay` (the module cache stays
# untouched): the shim sets its own oom_score_adj to -999, which needs
# CAP_SYS_RESOURCE, and this kind of VM does not have it ("failed to set OOM
# Score on shim: permission denied"). The patched shim takes containerd's
# score + 1 instead, as containerd 1.6's own runc shim does.
#
#   GVISOR_VERSION  gvisor.dev/gvisor version ("go" branch pseudo-version)
#   GVISOR_GO       Go toolchain the shim is built with
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
GVISOR_VERSION=${GVISOR_VERSION:-v0.0.0-20221203005347-703fd9b7fbc0}
GVISOR_GO=${GVISOR_GO:-go1.20.14}
K8S_DIR=${K8S_DIR:-$ROOT/.k8s}
BIN_DIR=$K8S_DIR/bin
BUILD_DIR=$K8S_DIR/build/gvisor-shim
SHIM=containerd-shim-runsc-v1
STAMP="$GVISOR_VERSION $GVISOR_GO"

log() { echo "k8s-gvisor: $*"; }

if [[ -x $BIN_DIR/$SHIM && "$(cat "$BIN_DIR/.$SHIM.version" 2>/dev/null)" == "$STAMP" ]]; then
  log "$SHIM $GVISOR_VERSION cached"
  exit 0
fi
log "building $SHIM $GVISOR_VERSION with $GVISOR_GO (about 1 min cold)"
mkdir -p "$BIN_DIR" "$BUILD_DIR"
export GOFLAGS=-mod=mod GOTOOLCHAIN=$GVISOR_GO CGO_ENABLED=0
cd "$BUILD_DIR"
printf 'module gvisorshimbuild\n\ngo 1.20\n\nrequire gvisor.dev/gvisor %s\n' "$GVISOR_VERSION" >go.mod
printf '//go:build tools\n\npackage tools\n\nimport _ "gvisor.dev/gvisor/shim"\n' >tools.go
if ! go mod tidy >tidy.log 2>&1; then
  cat tidy.log >&2
  exit 1
fi

src=$(go list -m -f '{{.Dir}}' gvisor.dev/gvisor)/pkg/shim/service.go
grep -q 'shim.SetScore(cmd.Process.Pid)' "$src" || {
  log "$src no longer calls shim.SetScore; review the oom_score_adj patch"
  exit 1
}
sed 's/shim\.SetScore(cmd\.Process\.Pid)/shim.AdjustOOMScore(cmd.Process.Pid)/' "$src" >service.go
printf '{"Replace": {"%s": "%s"}}\n' "$src" "$BUILD_DIR/service.go" >overlay.json

go build -trimpath -ldflags='-s -w' -overlay=overlay.json -o "$BIN_DIR/$SHIM" gvisor.dev/gvisor/shim
echo "$STAMP" >"$BIN_DIR/.$SHIM.version"
log "built $BIN_DIR/$SHIM"
