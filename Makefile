# deployguard — the two commands a newcomer needs:
#   make run    build everything and run the guard on a local control plane
#               (NODE=real: on a real node, as root)
#   make test   every test tier: unit, integration (real kube-apiserver),
#               end-to-end (full local cluster with kwok nodes)

SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c

K8S_VERSION ?= v1.37.2
TOOLS_DIR   ?= $(CURDIR)/bin/tools/k8s-$(K8S_VERSION)
BIN         ?= $(CURDIR)/bin/deployguard
VERSION     ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
GOTEST      ?= go test
# Test binaries find the control plane here.
export DEPLOYGUARD_TOOLS := $(TOOLS_DIR)

PKGS_UNIT := $(shell go list ./... | grep -v '/test/')

.PHONY: haproxy xmllint all build lint tools upstream-e2e run test test-unit test-integration test-e2e test-clients test-tls test-upstream test-faults test-install test-node node-tools bench bench-apiserver bench-apiserver-min bench-reaction bench-checks tools-min test-min bench-scale fuzz kustomize clean help

all: build

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

build: ## build bin/deployguard, and bin/kubectl-deployguard and bin/kubectl_complete-deployguard (the kubectl plugin and its completion: symlinks to it)
	go build -trimpath -ldflags "-X main.version=$(VERSION)" -o $(BIN) ./cmd/deployguard
	ln -sf $(notdir $(BIN)) $(dir $(BIN))kubectl-deployguard
	ln -sf $(notdir $(BIN)) $(dir $(BIN))kubectl_complete-deployguard

tools: $(TOOLS_DIR)/.complete ## build the local control plane from the Go module proxy (cached)

$(TOOLS_DIR)/.complete: test/tools/build.sh test/tools/kube-ldflags.sh test/tools/kube/go.mod test/tools/etcd/go.mod test/tools/helm/go.mod test/tools/helm4/go.mod
	bash test/tools/build.sh $(TOOLS_DIR)
	touch $@

# Kubernetes' own e2e specs for Deployments (test/tools/kube/upstreame2e), from
# the same k8s.io/kubernetes module as the control plane.
UPSTREAM_E2E := $(TOOLS_DIR)/e2e-upstream.test

upstream-e2e: $(UPSTREAM_E2E) ## build the upstream e2e test binary (cached)

$(UPSTREAM_E2E): test/tools/kube/go.mod test/tools/kube/go.sum $(wildcard test/tools/kube/upstreame2e/*.go)
	@mkdir -p $(TOOLS_DIR)
	cd test/tools/kube && go test -c -trimpath -ldflags "-s -w" -o $@ ./upstreame2e

# NODE=real: one real node (kubelet, containerd, runc) instead of kwok's, the
# guard's image installed by helm and a real Prometheus; as root, said before
# anything is built.
NODE ?= kwok
ifneq ($(filter run,$(MAKECMDGOALS)),)
ifeq ($(filter kwok real,$(NODE)),)
$(error NODE=$(NODE): want kwok (the default) or real)
endif
ifeq ($(NODE),real)
ifneq ($(shell id -u),0)
$(error make run NODE=real runs as root: it creates a network namespace of its own and runs the kubelet, containerd and runc (cgroups, mounts); run it as root, or `make run` (kwok's nodes) without)
endif
endif
endif

run: build tools $(if $(filter real,$(NODE)),node-tools image) ## run the guard on a local cluster (Ctrl-C stops everything); NODE=real: on a real node, with a bad release rolled back on its error rate (as root)
	go build -o $(CURDIR)/bin/localrun ./test/localrun
	$(CURDIR)/bin/localrun --tools $(TOOLS_DIR) --guard $(BIN) --node $(NODE) --workdir $(CURDIR)/bin/local$(if $(filter real,$(NODE)),-node)

test: test-unit test-integration test-min test-e2e test-clients test-tls test-upstream test-faults test-install test-node ## every tier

test-unit: xmllint ## unit tests, Rego tests, the fuzz seed corpora and the docs' links (no cluster)
	$(GOTEST) -count=1 $(PKGS_UNIT) ./test/docs/ ./test/harness/ ./test/localrun/

test-integration: tools build ## webhooks and policies through a real kube-apiserver (envtest); check/webhook parity
	DEPLOYGUARD_BIN=$(BIN) $(GOTEST) -count=1 -timeout 20m ./test/integration/...

test-e2e: tools build ## end-to-end tests on a full local cluster (kube-controller-manager, kwok nodes)
	DEPLOYGUARD_BIN=$(BIN) $(GOTEST) -count=1 -timeout 40m -p 1 ./test/e2e/...

test-clients: tools build ## the tools that deploy (kubectl, the pipeline step, helm v3 and v4, Flux, Argo CD's health) on a good deploy and on one the guard rolls back
	DEPLOYGUARD_BIN=$(BIN) $(GOTEST) -count=1 -timeout 30m -p 1 -v ./test/clients/...
	cd test/tools/argocd && GOWORK=off $(GOTEST) -count=1 ./...

# A real node's parts (containerd, runc, kubelet, kube-proxy, distribution's
# registry) and Prometheus (test/node/checks_test.go runs it), built from the
# Go module proxy beside the control plane; the CNI plugins and libseccomp
# from Debian's packages.
NODE_TOOLS_DIR ?= $(CURDIR)/bin/tools/node-$(K8S_VERSION)
export DEPLOYGUARD_NODE_TOOLS := $(NODE_TOOLS_DIR)

node-tools: $(NODE_TOOLS_DIR)/.complete ## a real node's parts and Prometheus, built from the Go module proxy (about 6 minutes cold, cached)

$(NODE_TOOLS_DIR)/.complete: test/tools/build-node.sh test/tools/kube/go.mod test/tools/kube/go.sum
	bash test/tools/build-node.sh $(NODE_TOOLS_DIR)

test-node: tools node-tools build image ## the guard's image installed by helm with cert-manager on a real node (kubelet, containerd, runc), with pods that really fail; as root, in a network namespace of its own
	DEPLOYGUARD_BIN=$(BIN) $(GOTEST) -count=1 -timeout 30m -p 1 -v ./test/node/...

test-install: tools build ## the Helm chart (lint, drift from config/, server-side dry-run) and the dashboard's and alerts' metrics in a running guard
	DEPLOYGUARD_BIN=$(BIN) $(GOTEST) -count=1 -timeout 15m -p 1 ./test/install/...
	cd test/tools/promql && GOWORK=off $(GOTEST) -count=1 ./...

test-tls: tools build ## webhook TLS: cert-manager's own controllers, the self-managed path, rotation under load
	DEPLOYGUARD_BIN=$(BIN) $(GOTEST) -count=1 -timeout 30m -p 1 ./test/tls/...

test-coldstart: tools build ## only the e2e tier's cold start: a whole-cluster stop and start with the webhooks registered and no guard
	DEPLOYGUARD_BIN=$(BIN) $(GOTEST) -count=1 -timeout 20m -run TestColdStartWithoutTheGuard ./test/e2e/

test-upstream: tools build upstream-e2e ## upstream's Deployment e2e specs without and with the guard: same results
	DEPLOYGUARD_BIN=$(BIN) DEPLOYGUARD_UPSTREAM_E2E=$(UPSTREAM_E2E) $(GOTEST) -count=1 -timeout 60m -v ./test/upstream/...

test-faults: tools build haproxy ## guard replicas behind HAProxy killed (SIGKILL) and rolled (SIGTERM) under admission load
	DEPLOYGUARD_BIN=$(BIN) $(GOTEST) -count=1 -timeout 15m -p 1 -v ./test/faults/...

# The faults tier's load balancer: Debian's haproxy, installed with apt when
# it is not on PATH (sudo when not root).
haproxy:
	@command -v haproxy >/dev/null || { s=; [ "$$(id -u)" = 0 ] || s=sudo; $$s apt-get update && $$s apt-get install -y haproxy; }

# The unit tier validates `check -o junit` against an XML Schema with xmllint
# (Debian's libxml2-utils), installed with apt when it is not on PATH.
xmllint:
	@command -v xmllint >/dev/null || { s=; [ "$$(id -u)" = 0 ] || s=sudo; $$s apt-get update && $$s apt-get install -y libxml2-utils; }

bench: ## admission and policy benchmarks
	$(GOTEST) -run '^$$' -bench . -benchmem ./webhook/ ./policy/

bench-apiserver: tools build ## requests/s and CPU per request through a real kube-apiserver: no guard, a VAP, the guard
	go run ./test/bench/apiserver -tools $(TOOLS_DIR) -guard $(BIN)

bench-reaction: tools build ## how fast the guard rolls back (on a deadline, by fail-fast), on the e2e tier's cluster and settings
	go run ./test/bench/reaction -tools $(TOOLS_DIR) -guard $(BIN)

bench-checks: tools build ## metric checks at 1,000 Deployments: guard memory, queries per rollout, the qps bound, rollback reaction (stand-in Prometheus)
	go run ./test/bench/checks -tools $(TOOLS_DIR) -guard $(BIN)

FUZZTIME ?= 60s
fuzz: ## run every fuzz target for FUZZTIME each (default 60s); crashes land in testdata/fuzz
	FUZZTIME=$(FUZZTIME) bash test/fuzz/run.sh

# The oldest Kubernetes the guard supports with its native floor
# (MutatingAdmissionPolicy is GA in 1.36): its kube-apiserver,
# kube-controller-manager and kube-scheduler, built from test/tools/kube-min,
# beside the rest of TOOLS_DIR's control plane (cp -s: links, not copies).
# 1.36's API server evaluates the native policies differently (it converts the
# object for every set of expressions), so the integration tier, where they
# are compared with the guard's own evaluation, and the guard-down test run on
# it too.
MIN_K8S_VERSION ?= v1.36.3
MIN_TOOLS_DIR   ?= $(CURDIR)/bin/tools/k8s-min-$(MIN_K8S_VERSION)

tools-min: $(MIN_TOOLS_DIR)/.complete ## the control plane of Kubernetes 1.36 (a few minutes cold, cached)

$(MIN_TOOLS_DIR)/.complete: $(TOOLS_DIR)/.complete test/tools/kube-min/go.mod test/tools/kube-min/go.sum test/tools/kube-ldflags.sh
	@mkdir -p $(MIN_TOOLS_DIR)
	cp -rsf $(TOOLS_DIR)/. $(MIN_TOOLS_DIR)/
	cd $(MIN_TOOLS_DIR) && rm -f kube-apiserver kube-controller-manager kube-scheduler .complete e2e-upstream.test
	cd test/tools/kube-min && flags="$$(../kube-ldflags.sh .)" && GOWORK=off go build -trimpath -ldflags "$$flags" -o $(MIN_TOOLS_DIR)/ \
		k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler
	[[ "$$($(MIN_TOOLS_DIR)/kube-apiserver --version)" == "Kubernetes $(MIN_K8S_VERSION)" ]] || { echo "$(MIN_TOOLS_DIR)/kube-apiserver is not $(MIN_K8S_VERSION): change MIN_K8S_VERSION and test/tools/kube-min/go.mod together" >&2; exit 1; }
	touch $@

test-min: tools-min build haproxy ## the integration tier and the guard-down test on Kubernetes 1.36, the oldest the native floor supports
	DEPLOYGUARD_TOOLS=$(MIN_TOOLS_DIR) DEPLOYGUARD_BIN=$(BIN) $(GOTEST) -count=1 -timeout 20m ./test/integration/...
	DEPLOYGUARD_TOOLS=$(MIN_TOOLS_DIR) DEPLOYGUARD_BIN=$(BIN) $(GOTEST) -count=1 -timeout 15m -v -run '^TestGuardDown$$' ./test/faults/

bench-apiserver-min: tools-min build ## bench-apiserver through 1.36's kube-apiserver
	go run ./test/bench/apiserver -tools $(MIN_TOOLS_DIR) -guard $(BIN) -workdir bin/bench-apiserver-min -out bin/bench-apiserver-min.json

# The issue 56 cluster by default; BENCH_NAMESPACES=20 BENCH_DEPLOYMENTS=2000
# for a quick run, BENCH_NAMESPACES=1 BENCH_DEPLOYMENTS=10000
# BENCH_SIZES=100,1000,5000 for the earlier single-namespace figures.
BENCH_NAMESPACES ?= 500
BENCH_DEPLOYMENTS ?= 50000
BENCH_SIZES ?= 1000
# BENCH_ARGS: more of its flags, e.g. '-memory-limit 3072 -env 10' (go run ./test/bench/scale -h).
BENCH_ARGS ?=
bench-scale: tools build ## guard memory, restart, admission, audit and rollback reaction at BENCH_DEPLOYMENTS over BENCH_NAMESPACES (50,000 over 500: about two hours)
	go run ./test/bench/scale -tools $(TOOLS_DIR) -guard $(BIN) -namespaces $(BENCH_NAMESPACES) -deployments $(BENCH_DEPLOYMENTS) -sizes $(BENCH_SIZES) $(BENCH_ARGS)

# golangci-lint, built from its module (test/tools/golangci-lint) and kept with
# the other tools; rebuilt when that module changes. .ci/run runs `make lint`.
GOLANGCI_LINT := $(CURDIR)/bin/tools/golangci-lint/golangci-lint

lint: $(GOLANGCI_LINT) ## golangci-lint (.golangci.yml) on every package
	$(GOLANGCI_LINT) run ./...

$(GOLANGCI_LINT): test/tools/golangci-lint/go.mod test/tools/golangci-lint/go.sum
	cd test/tools/golangci-lint && GOWORK=off go build -trimpath -ldflags "-s -w" -o $@ github.com/golangci/golangci-lint/v2/cmd/golangci-lint

kustomize: tools ## render config/default (checks the manifests build)
	$(TOOLS_DIR)/kubectl kustomize config/default >/dev/null

clean: ## remove built binaries (keeps the control plane cache)
	rm -rf bin/deployguard bin/kubectl-deployguard bin/kubectl_complete-deployguard bin/local

# The guard's image and the real-node tier's test app, built from Go code
# without a Docker engine (test/image, go-containerregistry): OCI layouts
# bin/image/<name>/ for a registry, and tarballs bin/image/<name>.tar for
# `docker load` or `ctr images import`. The binaries are built as the
# Dockerfile's build stage builds the guard (static, -trimpath, stripped):
# `make build`'s bin/deployguard links the C library through cgo, which the
# image does not have, and image-build refuses it. Each binary is replaced
# only when its bytes change (Go's builds are reproducible), so an unchanged
# tree rebuilds no image.
IMAGE_DIR     ?= $(CURDIR)/bin/image
# VERSION once: it is expanded anew at each use, and a commit made while the
# binary builds would otherwise tag the image with another version than the
# one the binary holds (image-build refuses that).
IMAGE_VERSION := $(VERSION)
IMAGE_BUILDER := $(CURDIR)/bin/tools/image/image-build
IMAGE_GOBUILD := CGO_ENABLED=0 GOOS=linux go build -trimpath
ZONEINFO      := $(shell go env GOROOT)/lib/time/zoneinfo.zip

.PHONY: image test-image FORCE

image: $(IMAGE_DIR)/deployguard.tar $(IMAGE_DIR)/testapp.tar ## the guard's image (tagged with VERSION and latest) and the test app's in bin/image, without Docker

$(IMAGE_BUILDER): go.mod go.sum $(filter-out %_test.go,$(wildcard test/image/*.go test/image/build/*.go))
	go build -o $@ ./test/image/build

$(IMAGE_DIR)/deployguard.bin: FORCE
	@mkdir -p $(@D)
	$(IMAGE_GOBUILD) -ldflags "-s -w -X main.version=$(IMAGE_VERSION)" -o $@.new ./cmd/deployguard
	if cmp -s $@.new $@; then rm $@.new; else mv $@.new $@; fi

$(IMAGE_DIR)/testapp.bin: FORCE
	@mkdir -p $(@D)
	$(IMAGE_GOBUILD) -ldflags "-s -w" -o $@.new ./test/image/app
	if cmp -s $@.new $@; then rm $@.new; else mv $@.new $@; fi

$(IMAGE_DIR)/deployguard.tar: $(IMAGE_DIR)/deployguard.bin $(IMAGE_BUILDER)
	$(IMAGE_BUILDER) guard -binary $< -version $(IMAGE_VERSION) -zoneinfo $(ZONEINFO) -out $(IMAGE_DIR)

$(IMAGE_DIR)/testapp.tar: $(IMAGE_DIR)/testapp.bin $(IMAGE_BUILDER)
	$(IMAGE_BUILDER) app -binary $< -zoneinfo $(ZONEINFO) -out $(IMAGE_DIR)

FORCE:

# The image's agreement with the Dockerfile and the install manifests, and
# the test app: no cluster, no image built, part of the unit tier (whose
# package list leaves out test/).
test-image: ## the image's agreement with the Dockerfile and config/ (no cluster; part of test-unit)
	$(GOTEST) -count=1 ./test/image/...

test-unit: test-image
