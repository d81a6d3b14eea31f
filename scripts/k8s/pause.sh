#!/usr/bin/env bash
# Build the pod sandbox ("pause") image locally: a static Go binary that waits
# for SIGTERM, FROM scratch, tagged opensandbox/pause:1.0 in the local Docker.
# No registry is involved. An existing image is kept.
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"
LOG_PREFIX=k8s-pause

if docker image inspect "$PAUSE_IMAGE" >/dev/null 2>&1; then
  exit 0
fi
log "building $PAUSE_IMAGE"
dir=$K8S_DIR/build/pause
mkdir -p "$dir"
cat >"$dir/main.go" <<'GO'
// pause holds a pod's namespaces open until it is told to stop.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGINT, syscall.SIGTERM)
	<-c
}
GO
printf 'module pause\n\ngo 1.26\n' >"$dir/go.mod"
printf 'FROM scratch\nCOPY pause /pause\nENTRYPOINT ["/pause"]\n' >"$dir/Dockerfile"
(cd "$dir" && GOFLAGS= CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o pause .)
if ! DOCKER_BUILDKIT=0 docker build -q -t "$PAUSE_IMAGE" "$dir" >"$dir/build.log" 2>&1; then
  cat "$dir/build.log" >&2
  die "docker build of $PAUSE_IMAGE failed"
fi
