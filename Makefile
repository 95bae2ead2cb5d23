# Foresight: the two commands are `make demo` and `make test`; both set up what they need.
SHELL := /bin/bash
.DEFAULT_GOAL := help
CARGO ?= cargo
OUT ?= out
# The worker links libtorch from the PyPI torch wheel in .venv (scripts/setup-torch.sh); tch's
# build finds it through the venv's python.
export LIBTORCH_USE_PYTORCH := 1
export PATH := $(CURDIR)/.venv/bin:$(PATH)

.PHONY: help setup setup-build setup-test build test test-python test-stress lint fmt bench demo loadgen real-size real-size-job convergence compare simulate low-comm matrix matrix-quick chaos crd observability clean

help: ## List the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-8s %s\n", $$1, $$2}'

setup: setup-build ## setup-build and the foresight Python package's wheel, in .venv (idempotent)
	@scripts/setup-python.sh

# The demo and the release build need neither the wheel nor the tests' tools.
setup-build: ## Install what the release build and make demo need: the venv with torch, the data (idempotent)
	@scripts/setup.sh

# Only the tests need a Kubernetes control plane, helm, kubeconform and Kueue (built from Go
# modules: 8 minutes the first time here, on 2 cores, cached in ~/.cache/foresight afterwards).
setup-test: setup ## Also the control plane, helm, kubeconform and Kueue for the tests (idempotent)
	@tools/build-control-plane.sh >/dev/null
	@tools/build-helm-tools.sh >/dev/null
	@tools/build-kueue.sh >/dev/null

build: setup-build ## Build the release binaries
	$(CARGO) build --release --locked --workspace --bins

lint: setup ## rustfmt and clippy, warnings are errors
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --locked --workspace --all-targets -- -D warnings

test: lint setup-test ## Lint, every test (unit, property, integration over loopback HTTP/2, a bounded fuzz run, the Python package's pytest), the quick conformance matrix, then make e2e
	$(CARGO) test --locked --workspace
	@$(MAKE) --no-print-directory fuzz-short FUZZ_SECONDS=10
	@$(MAKE) --no-print-directory test-python
	@$(MAKE) --no-print-directory matrix-quick
	@$(MAKE) --no-print-directory e2e

# The `foresight` package (installed into .venv by make setup) against the debug binaries that
# cargo test built: a real foresight-ps per test, `foresight run` with Python workers.
test-python: setup ## The Python package's tests (pytest, python/tests)
	$(CARGO) build --locked -p foresight-ps -p foresight-operator -p foresight-worker --bins
	FORESIGHT_BIN_DIR=$(CURDIR)/target/debug python -m pytest -q python/tests

test-stress: setup-test ## The tests three times in a row with every core kept busy by stress-ng (ARGS=--release, --runs N, --no-hog)
	scripts/test-stress.sh $(ARGS)

fmt: ## Format the code
	$(CARGO) fmt --all

bench: setup ## Criterion benchmarks (figures: docs/benchmarks.md)
	$(CARGO) bench --locked -p foresight-ps

# Only the three binaries it runs (the same features as `make build`, so one reuses the other).
demo: setup-build ## Train MNIST-5k with dc-asgd-a on 4 workers: foresight run examples/mnist-dcasgd.yaml
	$(CARGO) build --release --locked --bin foresight --bin foresight-ps --bin foresight-worker
	rm -rf $(OUT)/demo
	target/release/foresight run examples/mnist-dcasgd.yaml --out $(OUT)/demo

loadgen: build ## The parameter server alone under 4 simulated workers on a 1M-parameter model
	@scripts/loadgen-demo.sh $(OUT)/loadgen

real-size: build ## The parameter server at 100M parameters: memory by phase, register/pull/push, checkpoint and restore times (docs/benchmarks.md; ARGS=--shards 2 splits it over 2 PS processes)
	python3 scripts/real-size.py --bin target/release --out $(OUT)/real-size $(ARGS)

real-size-job: setup build ## A 100M-parameter Python transformer trained end to end by 4 workers on a PS of 2 shards, a worker and a shard SIGKILLed mid-run (docs/benchmarks.md)
	python3 scripts/real-size-job.py --bin target/release --out $(OUT)/real-size-job $(ARGS)

convergence: build ## The paper's Table 1 shape: LeNet-5 on MNIST-5k, M = 1, 4, 8, 16, every rule, 5 seeds, per-epoch PS-model curves; rewrites docs/convergence.md (26 min here; ARGS=--reuse keeps finished runs)
	python3 scripts/convergence.py --out $(OUT)/convergence --doc docs/convergence.md $(ARGS)

compare: build ## Foresight against PyTorch DDP and a single process, same model, data and budget; rewrites docs/comparison.md (12 min here)
	python3 scripts/compare.py --out $(OUT)/compare --doc docs/comparison.md

simulate: build ## The rules at any staleness without the machine: foresight-worker simulate sweeps, rewrites part of docs/convergence.md (about 7 min)
	python3 scripts/simulate.py --out $(OUT)/simulate --doc docs/convergence.md

low-comm: setup build ## Local steps (DiLoCo-style, sync and async; f32, bf16 and int8 pseudo-gradients) against every-step dc-asgd-a, then sync/asgd/dc-asgd-a/asgd with Delayed Nesterov with worker 3 slowed 3x: Python LeNet-5, pushes, bytes, accuracy, wall time, 2 seeds; then the same rules in the simulator (10 seeds, deterministic; with bf16 and int8 pulls and pushes); then time to 95 % in real runs of the built-in LeNet-5 with and without the straggler; then the transformer language model (every step against H = 10, 50, 200: f32 and int8 pushes, int8 pushes with bf16 and int8 pulls), and with worker 3 slowed 3x (sync against asgd, dc-asgd-a and Delayed Nesterov at three lrs, H = 50); then fixed against adaptive local steps; rewrites seven sections of docs/convergence.md (about 70 min)
	python3 scripts/low-communication.py --out $(OUT)/low-comm --doc docs/convergence.md $(ARGS)
	python3 scripts/low-communication.py --straggler 3 --out $(OUT)/low-comm --doc docs/convergence.md
	python3 scripts/low-communication.py --simulate --out $(OUT)/low-comm --doc docs/convergence.md
	python3 scripts/low-communication.py --time-to-target --straggler 3 --out $(OUT)/low-comm --doc docs/convergence.md
	python3 scripts/low-communication.py --lm --lm-h 10,50,200 --seeds 1,2 --out $(OUT)/low-comm --doc docs/convergence.md
	python3 scripts/low-communication.py --lm --straggler 3 --lm-h 50 --seeds 1,2 --dn-lrs 0.25,0.5,0.7 --out $(OUT)/low-comm --doc docs/convergence.md
	python3 scripts/low-communication.py --adaptive --straggler 3 --target 0.96 --out $(OUT)/low-comm --doc docs/convergence.md

# The conformance matrix (scripts/matrix.py): about 40 runs of a few seconds to a minute each.
matrix: build setup ## Real foresight run jobs over every pair of the PS's options and faults, invariants checked on each; rewrites its table in docs/reliability.md (ARGS=...)
	python3 scripts/matrix.py --out $(OUT)/matrix --doc docs/reliability.md $(ARGS)

# What make test runs of it: every value once (and every refusal), on the debug binaries.
matrix-quick: setup
	$(CARGO) build --locked -p foresight-ps -p foresight-operator -p foresight-worker --bins
	python3 scripts/matrix.py --quick --bin target/debug --out $(OUT)/matrix-quick

chaos: build ## Scripted failures against foresight run vs a failure-free run, rewrites docs/reliability.md (22–43 min here; ARGS=...)
	python3 scripts/chaos.py --out $(OUT)/chaos --doc docs/reliability.md $(ARGS)

# h2spec is built from Go modules into ~/.cache/foresight (tools/build-h2spec.sh). Declared .PHONY
# here, not on the list at the top, for the same reason as the cluster targets below.
.PHONY: h2spec
h2spec: ## HTTP/2 conformance: h2spec against foresight-ps over h2c and TLS, fails below the floors in scripts/h2spec.sh (about 12 s; ARGS=-- --strict)
	$(CARGO) build --locked -p foresight-ps --bin foresight-ps
	FORESIGHT_BIN_DIR=$(CURDIR)/target/debug scripts/h2spec.sh $(OUT)/h2spec $(ARGS)

# (docs/img/dashboard.png comes from the real cluster now: make cluster-observability.)
observability: build ## Run a local job under Prometheus, render the dashboard's panels to out/observability/dashboard.png (1 min)
	python3 scripts/render-dashboard.py --out $(OUT)/observability --png $(OUT)/observability/dashboard.png

# cargo-fuzz (nightly) on the gradient and model body decoders, the push path through the router,
# the checkpoint reader and the TrainingJob parser (fuzz/README.md). Its own target dir
# (fuzz/target), one cargo job; cargo-fuzz is installed into ~/.cache/foresight when missing.
fuzz: ## Fuzz every target for 5 min each (fuzz/run.sh; ARGS=--seconds N, or target names)
	fuzz/run.sh $(ARGS)

# trainingjob builds the operator crate (12-35 min the first time here): named in ARGS only.
# make test runs it for 10 s a target, with every core building (a crash fails the test).
FUZZ_SECONDS ?= 25
# A fixed seed: the smoke run is a regression gate that tries the same inputs on every machine;
# make fuzz explores with a new seed each time.
FUZZ_SEED ?= 1
fuzz-short: ## Fuzz the ps-service targets for 25 s each, a bounded smoke run (part of make test, 10 s each; ARGS=trainingjob or other names)
	CARGO_BUILD_JOBS=$${CARGO_BUILD_JOBS:-$$(nproc)} fuzz/run.sh --seconds $(FUZZ_SECONDS) --seed $(FUZZ_SEED) --no-operator $(ARGS)

crd: ## Regenerate crds/trainingjob.yaml from the TrainingJob types (a test fails when it is stale)
	$(CARGO) run -q -p foresight-operator --bin foresight -- crd > crds/trainingjob.yaml
	cp crds/trainingjob.yaml charts/foresight/files/trainingjob.crd.yaml

clean: ## Remove build outputs and demo output
	$(CARGO) clean
	rm -rf $(OUT)

.PHONY: fuzz fuzz-short

# A real single-node cluster and the images it runs (tools/README.md). Declared .PHONY here,
# not on the list at the top, so that the two lists never collide in a merge.
.PHONY: images cluster-up cluster-down e2e real-size-pod cluster-demo cluster-observability scale scale-many

images: build setup ## Operator, PS and worker images: buildah on a Debian rootfs (no Docker daemon, no registry)
	@tools/build-node.sh >/dev/null
	tools/build-images.sh

cluster-up: ## A real single-node Kubernetes cluster: kubelet, containerd, CNI bridge, kube-proxy, CoreDNS
	@tools/build-node.sh >/dev/null
	tools/cluster.sh up

cluster-down: ## Take the cluster down and put the host back as it was (checked by diffing)
	tools/cluster.sh down

e2e: setup-test ## The user's path and the failure paths in real pods on a real single-node cluster (tools/e2e.sh)
	@tools/build-node.sh >/dev/null
	@tools/build-prometheus.sh >/dev/null
	$(CARGO) build --locked --workspace --bins
	RELEASE_DIR=$(CURDIR)/target/debug tools/e2e.sh

# The e2e's opt-in real-size case alone, on the release binaries (a debug PS would time its own
# unoptimised decode, not the restore users meet).
real-size-pod: setup-test build ## A 100M-parameter Python transformer in real pods, 2 workers, one PS pod under a 6Gi limit: the PS pod deleted, its replacement restores the checkpoint and passes its probes (tools/e2e.sh case real-size; docs/benchmarks.md)
	@tools/build-node.sh >/dev/null
	@tools/build-prometheus.sh >/dev/null
	E2E_CASES=real-size RELEASE_DIR=$(CURDIR)/target/release tools/e2e.sh

cluster-demo: build setup ## A real cluster, the images, helm install, the MNIST TrainingJob watched to the end, its model
	@tools/build-control-plane.sh >/dev/null
	@tools/build-helm-tools.sh >/dev/null
	@tools/build-node.sh >/dev/null
	OUT=$(OUT)/cluster-demo tools/cluster-demo.sh

# The e2e's main case alone, with E2E_DASHBOARD_PNG: the figure is drawn from the cluster's
# Prometheus (tools/cluster-prometheus.sh) after the same checks the e2e makes.
cluster-observability: setup-test ## The MNIST TrainingJob on the real cluster under Prometheus (kubernetes_sd); redraws docs/img/dashboard.png from it
	@tools/build-node.sh >/dev/null
	@tools/build-prometheus.sh >/dev/null
	$(CARGO) build --locked --workspace --bins
	E2E_CASES=main E2E_DASHBOARD_PNG=$(CURDIR)/docs/img/dashboard.png RELEASE_DIR=$(CURDIR)/target/debug tools/e2e.sh

scale: setup-test ## 10 TrainingJobs x 4 workers at once on the real cluster; timings, reconcile p99 and API requests per job into docs/benchmarks.md
	@tools/build-node.sh >/dev/null
	$(CARGO) build --locked --workspace --bins
	RELEASE_DIR=$(CURDIR)/target/debug tools/scale.sh

scale-many: setup-test ## 100 running TrainingJobs on the test control plane (the kubelet played): the operator's API writes, reconciles and memory per job into docs/benchmarks.md
	SCALE_DOC=$(CURDIR)/docs/benchmarks.md $(CARGO) test --locked -p foresight-operator --test many_jobs -- --ignored --nocapture many_jobs_benchmark
