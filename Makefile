# Foresight: the two commands are `make demo` and `make test`; both set up what they need.
SHELL := /bin/bash
.DEFAULT_GOAL := help
CARGO ?= cargo
OUT ?= out
# The worker links libtorch from the PyPI torch wheel in .venv (scripts/setup-torch.sh); tch's
# build finds it through the venv's python.
export LIBTORCH_USE_PYTORCH := 1
export PATH := $(CURDIR)/.venv/bin:$(PATH)

.PHONY: help setup setup-test build test test-stress lint fmt bench demo loadgen convergence compare simulate chaos crd observability clean

help: ## List the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-8s %s\n", $$1, $$2}'

setup: ## Install what builds and the demo need (idempotent)
	@scripts/setup.sh

# Only the tests need a Kubernetes control plane, helm and kubeconform (built from Go modules:
# about 25 minutes the first time on 2 cores, cached in ~/.cache/foresight afterwards).
setup-test: setup ## Also the control plane, helm and kubeconform for the tests (idempotent)
	@tools/build-control-plane.sh >/dev/null
	@tools/build-helm-tools.sh >/dev/null

build: setup ## Build the release binaries
	$(CARGO) build --release --locked --workspace --bins

lint: setup ## rustfmt and clippy, warnings are errors
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --locked --workspace --all-targets -- -D warnings

test: lint setup-test ## Lint, every test (unit, property, integration over loopback HTTP/2), then make e2e
	$(CARGO) test --locked --workspace
	@$(MAKE) --no-print-directory e2e

test-stress: setup-test ## The tests three times in a row with every core kept busy by stress-ng (ARGS=--release, --runs N, --no-hog)
	scripts/test-stress.sh $(ARGS)

fmt: ## Format the code
	$(CARGO) fmt --all

bench: setup ## Criterion benchmarks (figures: docs/benchmarks.md)
	$(CARGO) bench --locked -p foresight-ps

demo: build ## Train MNIST-5k with dc-asgd-a on 4 workers: foresight run examples/mnist-dcasgd.yaml
	rm -rf $(OUT)/demo
	target/release/foresight run examples/mnist-dcasgd.yaml --out $(OUT)/demo

loadgen: build ## The parameter server alone under 4 simulated workers on a 1M-parameter model
	@scripts/loadgen-demo.sh $(OUT)/loadgen

convergence: build ## Table 1 of the paper on MNIST-5k, rewrites docs/convergence.md (about 15 min)
	python3 scripts/convergence.py --out $(OUT)/convergence --doc docs/convergence.md

compare: build ## Foresight against PyTorch DDP and a single process, same model, data and budget; rewrites docs/comparison.md (about 13 min)
	python3 scripts/compare.py --out $(OUT)/compare --doc docs/comparison.md

simulate: build ## The rules at any staleness without the machine: foresight-worker simulate sweeps, rewrites part of docs/convergence.md (about 7 min)
	python3 scripts/simulate.py --out $(OUT)/simulate --doc docs/convergence.md

chaos: build ## Scripted failures against foresight run vs a failure-free run, rewrites docs/reliability.md (about 45 min here; ARGS=...)
	python3 scripts/chaos.py --out $(OUT)/chaos --doc docs/reliability.md $(ARGS)

observability: build ## Run a job under Prometheus, render the dashboard's panels to docs/img/dashboard.png (1 min)
	python3 scripts/render-dashboard.py --out $(OUT)/observability --png docs/img/dashboard.png

crd: ## Regenerate crds/trainingjob.yaml from the TrainingJob types (a test fails when it is stale)
	$(CARGO) run -q -p foresight-operator --bin foresight -- crd > crds/trainingjob.yaml
	cp crds/trainingjob.yaml charts/foresight/crds/trainingjob.yaml

clean: ## Remove build outputs and demo output
	$(CARGO) clean
	rm -rf $(OUT)

# A real single-node cluster and the images it runs (tools/README.md). Declared .PHONY here,
# not on the list at the top, so that the two lists never collide in a merge.
.PHONY: images cluster-up cluster-down e2e cluster-demo

images: build ## Operator, PS and worker images: buildah on a Debian rootfs (no Docker daemon, no registry)
	@tools/build-node.sh >/dev/null
	tools/build-images.sh

cluster-up: ## A real single-node Kubernetes cluster: kubelet, containerd, CNI bridge, kube-proxy, CoreDNS
	@tools/build-node.sh >/dev/null
	tools/cluster.sh up

cluster-down: ## Take the cluster down and put the host back as it was (checked by diffing)
	tools/cluster.sh down

e2e: setup-test ## The user's path and the failure paths in real pods on a real single-node cluster (tools/e2e.sh)
	@tools/build-node.sh >/dev/null
	$(CARGO) build --locked --workspace --bins
	RELEASE_DIR=$(CURDIR)/target/debug tools/e2e.sh

cluster-demo: build ## A real cluster, the images, helm install, the MNIST TrainingJob watched to the end, its model
	@tools/build-control-plane.sh >/dev/null
	@tools/build-helm-tools.sh >/dev/null
	@tools/build-node.sh >/dev/null
	OUT=$(OUT)/cluster-demo tools/cluster-demo.sh
