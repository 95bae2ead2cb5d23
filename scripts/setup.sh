#!/usr/bin/env bash
# Installs what `make build` and `make demo` need (`make setup` adds the Python package, `make
# setup-test` the tests' tools).
# Safe to run again: each step checks first.
set -euo pipefail

need_apt=()
command -v curl >/dev/null || need_apt+=(curl)        # TLS test talks HTTP/2 over TLS with curl
command -v openssl >/dev/null || need_apt+=(openssl)  # …and makes its certificate with openssl
command -v python3 >/dev/null || need_apt+=(python3)  # protocol test: a client written from docs/protocol.md
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need_apt+=(fonts-dejavu-core)  # plot labels
# The dashboard test scrapes a run with its own prometheus process (the packaged service is not
# used) and lints /metrics with promtool.
command -v prometheus >/dev/null && command -v promtool >/dev/null || need_apt+=(prometheus)
if ((${#need_apt[@]})); then
  echo "setup: installing ${need_apt[*]}" >&2
  apt-get update -qq && apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# The toolchain is pinned in rust-toolchain.toml; rustfmt and clippy come with it.
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
  rustup component add rustfmt clippy
fi

# libtorch (PyPI torch) for the worker, hadolint for its Dockerfile, and the demo data.
"$(dirname "$0")/setup-torch.sh"

cargo fetch --locked >/dev/null

# The `foresight` Python package's wheel is built by scripts/setup-python.sh (`make setup`), not
# here: the release build and `make demo` do not need it.

# The tests' Kubernetes control plane, helm and kubeconform are not built here: `make
# setup-test` (run by `make test` and `make e2e`) builds them, so `make demo` never waits for them.
