#!/usr/bin/env bash
# demo.sh starts execd as the init process of a container made from the
# local opensandbox/python:3.11 image, then talks to it over HTTP the way
# every OpenSandbox client does: a command streamed as events, a stateful
# bash session, a file round trip and the container's own metrics.
# The container is removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

image=${DEMO_IMAGE:-opensandbox/python:3.11}
token=$(head -c 24 /dev/urandom | base64 | tr '+/' '-_')
name=osb-demo-$$

cleanup() { docker rm -f "$name" >/dev/null 2>&1 || true; }
trap cleanup EXIT

echo "== starting $image with execd as init"
docker run -d --name "$name" --memory 512m \
	-p 127.0.0.1::44772 \
	-v "$PWD/bin/execd:/opt/opensandbox/bin/execd:ro" \
	--entrypoint /opt/opensandbox/bin/execd \
	"$image" --access-token "$token" -- sleep infinity >/dev/null
addr=$(docker port "$name" 44772/tcp | head -n1)
base="http://$addr"
auth=(-H "X-EXECD-ACCESS-TOKEN: $token")
for _ in $(seq 1 100); do
	curl -fsS "${auth[@]}" "$base/ping" >/dev/null 2>&1 && break
	sleep 0.05
done
echo "execd answers at $base"

echo
echo "== POST /command (events as they stream)"
curl -sS -N "${auth[@]}" "$base/command" \
	-d '{"command":"python3 -c \"import platform,sys; print(\\\"python\\\", platform.python_version()); print(\\\"to stderr\\\", file=sys.stderr)\"; uname -sr"}'

echo "== a bash session keeps its state between runs"
sid=$(curl -sS "${auth[@]}" -X POST "$base/session" | sed -E 's/.*"session_id":"([^"]+)".*/\1/')
curl -sS -N "${auth[@]}" "$base/session/$sid/run" -d '{"command":"greet() { echo hello from $*; }; cd /tmp"}' >/dev/null
curl -sS -N "${auth[@]}" "$base/session/$sid/run" -d '{"command":"greet the session; pwd"}' | grep '"stdout"'

echo
echo "== a file uploaded, then read back"
printf 'print(sum(range(101)))\n' >"/tmp/$name.py"
curl -sS "${auth[@]}" "$base/files/upload" \
	-F 'metadata={"path":"/workspace/sum.py","mode":644};filename=metadata;type=application/json' \
	-F "file=@/tmp/$name.py"
rm -f "/tmp/$name.py"
curl -sS -N "${auth[@]}" "$base/command" -d '{"command":"python3 sum.py","cwd":"/workspace"}' | grep '"stdout"'

echo
echo "== GET /metrics (the container's own cgroup: 512 MiB limit)"
curl -sS "${auth[@]}" "$base/metrics"
echo
echo
echo "demo done; the container is removed"
