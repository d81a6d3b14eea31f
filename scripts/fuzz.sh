#!/usr/bin/env bash
# fuzz.sh runs every native fuzz target of the module for the given time
# each (default 30s); minimizing a new input is capped at 5s so that slow
# targets keep exploring. Crashers are written to testdata/fuzz by go test.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${1:-30s}
for pkg in $(go list ./...); do
	dir=$(go list -f '{{.Dir}}' "$pkg")
	for target in $(grep -hoE '^func (Fuzz[A-Za-z0-9_]+)' "$dir"/*_test.go 2>/dev/null | awk '{print $2}'); do
		echo "== $pkg $target ($fuzztime)"
		go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" -fuzzminimizetime 5s "$pkg"
	done
done
