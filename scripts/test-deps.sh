#!/usr/bin/env bash
# test-deps.sh installs what the end-to-end tests use besides Docker:
# Debian's docker-registry (a real registry on loopback, for pulls with
# credentials), curl, iproute2 and tmux (a real terminal for osb shell), and
# node-typescript and a JDK for the typescript and java code contexts, and
# chromium (headless) for the browser test of the ingress gateway.
# Idempotent.
set -euo pipefail
missing=()
command -v docker-registry >/dev/null 2>&1 || missing+=(docker-registry)
command -v curl >/dev/null 2>&1 || missing+=(curl)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v tmux >/dev/null 2>&1 || missing+=(tmux)
# The code interpreter's typescript and java contexts (execd/interp tests).
command -v tsc >/dev/null 2>&1 || missing+=(node-typescript)
command -v java >/dev/null 2>&1 || missing+=(default-jdk-headless)
# A real browser opens a sandbox's web app through the ingress gateway.
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
if ((${#missing[@]})); then
	if [[ $(id -u) -ne 0 ]]; then
		echo "test-deps: must run as root to install ${missing[*]}" >&2
		exit 1
	fi
	echo "test-deps: installing ${missing[*]} from Debian" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
