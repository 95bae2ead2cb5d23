#!/usr/bin/env bash
# Re-pins the Go wrapper modules that build the test control plane.
#
#   tools/update-control-plane-pins.sh [K8S_VERSION] [ETCD_VERSION]
#
# Defaults: the newest v1.37.x of k8s.io/kubernetes and the newest v3.6.x of
# go.etcd.io/etcd/server/v3 that the Go module proxy serves.
#
# k8s.io/kubernetes requires its staging modules (k8s.io/api, k8s.io/client-go, ...)
# at v0.0.0 and replaces them with ./staging/src/... directories that are not part
# of its module zip. A module that depends on it must replace each of them with the
# published k8s.io/<name> v0.<minor>.<patch>. The list is derived here from
# k8s.io/kubernetes's own go.mod (every require at v0.0.0 that its go.mod replaces
# with a ./staging/ path), never typed by hand.
#
# Needs: go, jq. Writes only tools/k8s/go.{mod,sum} and tools/etcd/go.{mod,sum}.
# tools/build-control-plane.sh rebuilds on its next run because the stamp key
# includes these files.
set -euo pipefail

log() { printf '[update-control-plane-pins] %s\n' "$*" >&2; }

tools_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export GOWORK=off
export GOFLAGS="-mod=mod -buildvcs=false"

newest() { # newest version of module $1 whose version starts with $2
  go list -m -versions "$1" | tr ' ' '\n' | grep -E "^${2//./\\.}\.[0-9]+$" | sort -V | tail -n1
}

k8s_version=${1:-$(newest k8s.io/kubernetes v1.37)}
etcd_version=${2:-$(newest go.etcd.io/etcd/server/v3 v3.6)}
[[ -n $k8s_version && -n $etcd_version ]] || { log "could not resolve versions"; exit 1; }
# Staging modules are tagged v0.<minor>.<patch> for Kubernetes v1.<minor>.<patch>.
staging_version="v0.${k8s_version#v1.}"
log "k8s.io/kubernetes $k8s_version (staging $staging_version), etcd $etcd_version"

k8s_gomod=$(go mod download -json "k8s.io/kubernetes@${k8s_version}" | jq -r .GoMod)
mapfile -t staging < <(go mod edit -json "$k8s_gomod" | jq -r '
  [.Replace[]? | select(.New.Path | startswith("./staging/")) | .Old.Path] as $staged
  | .Require[] | select(.Version == "v0.0.0" and (.Path as $p | $staged | index($p))) | .Path')
[[ ${#staging[@]} -gt 0 ]] || { log "no staging modules found in $k8s_gomod"; exit 1; }
log "${#staging[@]} staging modules: ${staging[*]}"

# --- tools/k8s -------------------------------------------------------------------
cd "$tools_dir/k8s"
# Drop every old replace, then add one per staging module of the pinned release.
go mod edit -json go.mod | jq -r '.Replace[]? | "-dropreplace=\(.Old.Path)"' | xargs -r go mod edit
# Appended as one block at the end, so a re-run with the same pins leaves go.mod as it was.
{
  echo
  echo "// Derived from the go.mod of k8s.io/kubernetes@${k8s_version} by tools/update-control-plane-pins.sh:"
  echo "// each staging module it requires at v0.0.0, at its published ${staging_version}."
  echo "replace ("
  for m in "${staging[@]}"; do printf '\t%s => %s %s\n' "$m" "$m" "$staging_version"; done
  echo ")"
} >>go.mod
go mod edit -fmt "-require=k8s.io/kubernetes@${k8s_version}"
go mod tidy
log "tools/k8s pinned"

# --- tools/etcd ------------------------------------------------------------------
# Separate module: k8s.io/kubernetes itself requires go.etcd.io/etcd/*/v3 at v3.7.x, so
# in one module graph minimal version selection would lift the etcd server past 3.6.
cd "$tools_dir/etcd"
go mod edit "-require=go.etcd.io/etcd/server/v3@${etcd_version}"
go mod tidy
log "tools/etcd pinned"
