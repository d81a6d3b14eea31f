#!/usr/bin/env bash
# k8s-images.sh imports into the RUNNING local cluster's containerd every
# local image of K8S_IMAGES (scripts/k8s/common.sh) whose Docker image ID
# changed since it was last imported, e.g. opensandbox/execd and
# opensandbox/server after `make build images`. Pods created afterwards use
# the new image; running pods keep theirs. Images that did not change cost a
# `docker image inspect` each.
set -euo pipefail
# shellcheck source=k8s/common.sh
source "$(dirname "$0")/k8s/common.sh"
LOG_PREFIX=k8s-images

[[ $(id -u) -eq 0 ]] || die "must run as root (the node's containerd socket)"
lock_cluster
alive containerd || die "the local cluster is not running; start it with \`make k8s-up\` (which imports the images itself)"
import_images $K8S_IMAGES
