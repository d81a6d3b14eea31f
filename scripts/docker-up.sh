#!/usr/bin/env bash
# docker-up.sh makes a Docker engine available on this machine and waits
# until it answers. It is idempotent: on a machine where dockerd already
# runs it only checks that the engine answers and that runsc is registered.
#
#   - installs Debian's docker.io and runsc (gVisor) when they are missing;
#   - registers runsc as a Docker runtime ("runsc", with --network=host,
#     which gVisor needs on this kind of machine);
#   - starts dockerd in the background when it is not running
#     (log: /var/log/opensandbox-dockerd.log);
#   - waits up to 60 s for the engine to answer.
set -euo pipefail

log() { printf 'docker-up: %s\n' "$*" >&2; }

need_root() {
	if [[ $(id -u) -ne 0 ]]; then
		log "must run as root to $1"
		exit 1
	fi
}

engine_answers() { docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

if engine_answers && docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"'; then
	log "engine $(docker version --format '{{.Server.Version}}') is up"
	exit 0
fi

missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v runsc >/dev/null 2>&1 || missing+=(runsc)
command -v iptables >/dev/null 2>&1 || missing+=(iptables)
if ((${#missing[@]})); then
	need_root "install ${missing[*]}"
	log "installing ${missing[*]} from Debian"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Register runsc as a runtime. daemon.json may already exist with other
# settings; merge rather than overwrite.
daemon_json=/etc/docker/daemon.json
runsc_path=$(command -v runsc)
if ! grep -qs '"runsc"' "$daemon_json"; then
	need_root "write $daemon_json"
	mkdir -p /etc/docker
	if [[ -s $daemon_json ]]; then
		python3 - "$daemon_json" "$runsc_path" <<'PY'
import json, sys
path, runsc = sys.argv[1], sys.argv[2]
with open(path) as f:
    cfg = json.load(f)
cfg.setdefault("runtimes", {})["runsc"] = {"path": runsc, "runtimeArgs": ["--network=host"]}
with open(path + ".tmp", "w") as f:
    json.dump(cfg, f, indent=2)
PY
		mv "$daemon_json.tmp" "$daemon_json"
	else
		cat >"$daemon_json" <<JSON
{
  "runtimes": {
    "runsc": { "path": "$runsc_path", "runtimeArgs": ["--network=host"] }
  }
}
JSON
	fi
	log "registered runsc in $daemon_json"
	# A running engine must reload its configuration to see the runtime.
	if pid=$(pidof dockerd); then
		kill -HUP "$pid"
		sleep 1
	fi
fi

if ! pidof dockerd >/dev/null; then
	need_root "start dockerd"
	log "starting dockerd"
	# Containers of a previous dockerd may have left their shims behind;
	# dockerd reattaches to its own containerd state on start.
	nohup dockerd >>/var/log/opensandbox-dockerd.log 2>&1 </dev/null &
	disown || true
fi

for _ in $(seq 1 120); do
	if engine_answers; then
		log "engine $(docker version --format '{{.Server.Version}}') is up"
		exit 0
	fi
	sleep 0.5
done
log "dockerd did not answer within 60 s; last lines of its log:"
tail -n 20 /var/log/opensandbox-dockerd.log >&2 || true
exit 1
