#!/usr/bin/env bash
# docker-up.sh makes a Docker engine available on this machine and waits
# until it answers. It is idempotent: on a machine where dockerd already
# runs it only checks that the engine answers and that runsc is registered.
#
#   - installs Debian's docker.io and runsc (gVisor) when they are missing;
#   - registers runsc as a Docker runtime ("runsc", with --network=host,
#     which gVisor needs on this kind of machine);
#   - turns off the userland proxy, so ports published on 127.0.0.1 are
#     forwarded by the kernel (iptables) instead of being copied through a
#     docker-proxy process, which halves upload throughput to a sandbox;
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

if engine_answers && docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"' &&
	grep -qs '"userland-proxy"' /etc/docker/daemon.json; then
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

# Register runsc as a runtime and turn the userland proxy off. daemon.json
# may already exist with other settings: merge rather than overwrite, and
# leave a userland-proxy setting made by someone else alone.
daemon_json=/etc/docker/daemon.json
runsc_path=$(command -v runsc)
if ! grep -qs '"runsc"' "$daemon_json" || ! grep -qs '"userland-proxy"' "$daemon_json"; then
	need_root "write $daemon_json"
	mkdir -p /etc/docker
	if [[ ! -s $daemon_json ]]; then
		cat >"$daemon_json" <<JSON
{
  "runtimes": {
    "runsc": { "path": "$runsc_path", "runtimeArgs": ["--network=host"] }
  },
  "userland-proxy": false
}
JSON
	elif ! command -v python3 >/dev/null; then
		log "$daemon_json exists; add the runsc runtime and \"userland-proxy\": false to it by hand (python3 is needed to merge it)"
		exit 1
	else
		python3 - "$daemon_json" "$runsc_path" <<'PY'
import json, sys
path, runsc = sys.argv[1], sys.argv[2]
with open(path) as f:
    cfg = json.load(f)
cfg.setdefault("runtimes", {}).setdefault("runsc", {"path": runsc, "runtimeArgs": ["--network=host"]})
cfg.setdefault("userland-proxy", False)
with open(path + ".tmp", "w") as f:
    json.dump(cfg, f, indent=2)
    f.write("\n")
PY
		mv "$daemon_json.tmp" "$daemon_json"
	fi
	log "configured $daemon_json"
	if pid=$(pidof dockerd); then
		# Runtimes reload on SIGHUP; the proxy setting needs a restart,
		# which is left to the engine's owner.
		kill -HUP "$pid"
		sleep 1
		log "dockerd was already running: the userland-proxy setting applies from its next start"
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
