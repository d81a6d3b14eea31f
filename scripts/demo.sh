#!/usr/bin/env bash
# demo.sh is the main job end to end: it starts opensandbox-server on a
# throwaway configuration, creates a sandbox from opensandbox/python:3.11
# through the lifecycle API, runs python3 -c "print(1 + 1)" in it through
# the sandbox's execd endpoint, prints the result, and cleans up. The
# first part uses only curl and the API, the way any OpenSandbox client
# does; the second does the same with the osb command line.
set -euo pipefail
cd "$(dirname "$0")/.."

work=$(mktemp -d)
port=${DEMO_PORT:-18181}
base="http://127.0.0.1:$port/v1"
server_pid=""
sandbox=""

cleanup() {
	if [[ -n $sandbox ]]; then
		curl -s -o /dev/null -X DELETE -H "OPEN-SANDBOX-API-KEY: $key" "$base/sandboxes/$sandbox" || true
	fi
	if [[ -n $server_pid ]]; then
		kill "$server_pid" 2>/dev/null || true
		wait "$server_pid" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT

json() { sed -nE "s/.*\"$1\":\"([^\"]*)\".*/\1/p" | head -n1; }

echo "== configuration (opensandbox-server init-config)"
./bin/opensandbox-server init-config "$work/sandbox.toml" --example docker >/dev/null
sed -i -e "s|^listen = .*|listen = \"127.0.0.1:$port\"|" \
	-e "s|^data_dir = .*|data_dir = \"$work/data\"|" \
	-e "s|^label_scope = .*|label_scope = \"demo-$$\"|" "$work/sandbox.toml"
key=$(sed -nE 's/^api_key = "(.*)"/\1/p' "$work/sandbox.toml")

echo "== starting opensandbox-server on 127.0.0.1:$port"
./bin/opensandbox-server --config "$work/sandbox.toml" >"$work/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 1 100); do
	curl -fsS "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
	sleep 0.1
done
curl -fsS "http://127.0.0.1:$port/health"
echo

auth=(-H "OPEN-SANDBOX-API-KEY: $key" -H "Content-Type: application/json")

echo "== POST /v1/sandboxes (opensandbox/python:3.11)"
start=$(date +%s%N)
created=$(curl -fsS "${auth[@]}" "$base/sandboxes" -d '{
  "image": {"uri": "opensandbox/python:3.11"},
  "entrypoint": ["sleep", "infinity"],
  "timeout": 600,
  "resourceLimits": {"cpu": "1", "memory": "512Mi"},
  "metadata": {"purpose": "demo"}
}')
echo "$created"
sandbox=$(echo "$created" | json id)

state=""
for _ in $(seq 1 300); do
	state=$(curl -fsS "${auth[@]}" "$base/sandboxes/$sandbox" | sed -nE 's/.*"state":"([^"]*)".*/\1/p')
	[[ $state == Running || $state == Failed ]] && break
	sleep 0.05
done
echo "state: $state"
[[ $state == Running ]] || { echo "sandbox did not start; server log:"; tail -20 "$work/server.log"; exit 1; }

echo "== GET /v1/sandboxes/$sandbox/endpoints/44772"
endpoint=$(curl -fsS "${auth[@]}" "$base/sandboxes/$sandbox/endpoints/44772")
echo "$endpoint" | sed -E 's/("X-EXECD-ACCESS-TOKEN":")[^"]*/\1<token>/'
address=$(echo "$endpoint" | json endpoint)
token=$(echo "$endpoint" | json X-EXECD-ACCESS-TOKEN)

echo "== python3 -c \"print(1 + 1)\" through execd"
events=$(curl -fsS -N -H "X-EXECD-ACCESS-TOKEN: $token" "http://$address/command" \
	-d '{"command":"python3 -c \"print(1 + 1)\""}')
result=$(echo "$events" | sed -nE 's/.*"type":"stdout","text":"([^"]*)".*/\1/p')
end=$(date +%s%N)
echo "$events" | grep -v '^$'
echo
echo "result: $result   (create to first result: $(((end - start) / 1000000)) ms)"

echo "== DELETE /v1/sandboxes/$sandbox"
curl -fsS -o /dev/null -w "%{http_code}\n" -X DELETE "${auth[@]}" "$base/sandboxes/$sandbox"
sandbox=""

echo "== the same with osb"
export OPEN_SANDBOX_DOMAIN="127.0.0.1:$port" OPEN_SANDBOX_API_KEY="$key" HOME="$work"
echo "\$ osb sandbox create --image opensandbox/python:3.11 --timeout 10m -o json"
created=$(./bin/osb sandbox create --image opensandbox/python:3.11 --timeout 10m -o json)
echo "$created"
sandbox=$(echo "$created" | sed -nE 's/.*"id": "([^"]*)".*/\1/p')
echo "\$ osb command run $sandbox -- python3 -c 'print(1 + 1)'"
./bin/osb command run "$sandbox" -- python3 -c 'print(1 + 1)'
echo "\$ osb code run $sandbox -c 'x = 20'   # a stateful python context"
./bin/osb code run "$sandbox" -c 'x = 20'
echo "\$ osb code run $sandbox -c 'x + 22'"
./bin/osb code run "$sandbox" -c 'x + 22'
echo "\$ osb sandbox kill $sandbox"
./bin/osb sandbox kill "$sandbox"
sandbox=""
echo "demo done"
