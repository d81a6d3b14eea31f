# OpenSandbox: build, test and run. `make help` lists the targets.

SHELL := /bin/bash
GO ?= go
BIN := bin
GOFLAGS_STATIC := CGO_ENABLED=0
# VERSION is stamped into every binary: osb's cli.Version and the
# servers' main.version (GET /health reports the lifecycle server's).
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X github.com/opensandbox/opensandbox/cli.Version=$(VERSION) -X main.version=$(VERSION)
# BENCH=quick runs a shorter benchmark.
BENCH ?= full

.PHONY: help build test test-unit test-e2e attack bench images docker demo fuzz lint clean k8s-up k8s-down k8s-clean k8s-images

help: ## list the targets
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

build: ## build the binaries into bin/ (static)
	@mkdir -p $(BIN)
	$(GOFLAGS_STATIC) $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/...

docker: ## install and start a Docker engine (with runsc) if needed
	@./scripts/docker-up.sh

images: build docker ## build the local images used by tests, the demo and the cluster (execd and server images from bin/)
	@./scripts/images.sh

demo: build images ## start the server, create a sandbox, run python in it, clean up
	@./scripts/demo.sh

test: build images ## the whole suite: unit, real processes, containers, the local Kubernetes (race detector on)
	@./scripts/test-deps.sh
	@./scripts/k8s-up.sh && ./scripts/k8s-images.sh
	OSB_REQUIRE_ALL=1 $(GO) test -race -count=1 -timeout 30m ./...

test-unit: ## tests that need neither Docker nor images
	$(GO) test -race ./api/... ./internal/... ./execd/... ./sandbox/... ./lifecycle/... ./runtime/fake/...

test-e2e: build images ## only the end-to-end tests against real containers and the local Kubernetes
	@./scripts/test-deps.sh
	@./scripts/k8s-up.sh && ./scripts/k8s-images.sh
	OSB_REQUIRE_ALL=1 $(GO) test -count=1 -timeout 20m ./e2e/...

attack: build images ## only the attack suite (e2e/attack_*_test.go and the Kubernetes runtime's), printing each attempt and its result
	@./scripts/test-deps.sh
	@./scripts/k8s-up.sh && ./scripts/k8s-images.sh
	set -o pipefail; OSB_REQUIRE_ALL=1 $(GO) test -count=1 -timeout 30m -v -run 'Attack' ./e2e/... ./runtime/kubernetes/... | grep -E '^(--- |\s+[a-z_]*attack[a-z_]*_test.go:[0-9]+: attempt |ok|FAIL|PASS)'

bench: build images ## every performance harness, with the Docker engine (or, on the make k8s-up cluster, a bare Pod) as baseline; tables, JSON and PNG charts in bench/results (BENCH=quick: under 2 minutes, 4 with the cluster up)
	$(GO) run ./bench/execdbench -mode $(BENCH) -out bench/results
	$(GO) run ./bench/serverbench -mode $(BENCH) -out bench/results
	$(GO) run ./bench/cpbench -mode $(BENCH) -out bench/results
	$(GO) run ./bench/codebench -mode $(BENCH) -out bench/results
	$(GO) run ./bench/perfbench -mode $(BENCH) -out bench/results
	$(GO) run ./bench/egressbench -mode $(BENCH) -out bench/results
	$(GO) run ./bench/vaultbench -mode $(BENCH) -out bench/results
	$(GO) run ./bench/ingressbench -mode $(BENCH) -out bench/results
	$(GO) run ./bench/k8sbench -mode $(BENCH) -out bench/results

fuzz: ## run every fuzz target for FUZZTIME each (default 30s)
	@./scripts/fuzz.sh $${FUZZTIME:-30s}

# The linters, pinned. make lint installs each once from the Go module
# proxy into .cache/tools, under the Go version that builds it (a tool
# built by an older Go cannot read code that needs a newer one).
STATICCHECK_VERSION := v0.8.2
DEADCODE_VERSION := v0.52.0
TOOLS := .cache/tools/$(shell $(GO) env GOVERSION)
STATICCHECK := $(TOOLS)/staticcheck-$(STATICCHECK_VERSION)/staticcheck
DEADCODE := $(TOOLS)/deadcode-$(DEADCODE_VERSION)/deadcode

$(STATICCHECK):
	GOBIN=$(abspath $(@D)) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

$(DEADCODE):
	GOBIN=$(abspath $(@D)) $(GO) install golang.org/x/tools/cmd/deadcode@$(DEADCODE_VERSION)

lint: $(STATICCHECK) $(DEADCODE) ## gofmt, go vet, go mod tidy check, staticcheck, deadcode (part of CI)
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...
	@$(GO) mod tidy && git diff --exit-code go.mod go.sum
	$(STATICCHECK) ./...
	@echo '$(DEADCODE) -test ./...'; out="$$($(DEADCODE) -test ./...)" || exit 1; \
	test -z "$$out" || { echo "$$out"; echo "unreachable code: delete it, or move a helper only tests use into a _test.go file"; exit 1; }

k8s-up: images ## start a local 1-node Kubernetes (builds it once, ~10 min; then seconds); kubeconfig in .k8s/kubeconfig
	@./scripts/k8s-up.sh

k8s-images: images ## import into the running local Kubernetes the local images that changed (execd, server, ...)
	@./scripts/k8s-images.sh

k8s-down: ## stop the local Kubernetes and remove what it made (keeps the built binaries and images in .k8s/)
	@./scripts/k8s-down.sh

k8s-clean: ## k8s-down, and remove .k8s/ with the built binaries too
	@CLEAN=1 ./scripts/k8s-down.sh

clean: ## remove build output and caches made by the scripts
	rm -rf $(BIN) .cache
