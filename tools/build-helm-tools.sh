#!/usr/bin/env bash
# Builds the tools the Helm chart's tests (operator/tests/chart.rs) run, from Go modules only
# (no container registry, no prebuilt release downloads):
#
#   helm         helm.sh/helm/v3/cmd/helm                 (tools/helm)
#   kubeconform  github.com/yannh/kubeconform/cmd/kubeconform  (tools/kubeconform)
#
# and copies the ServiceMonitor and PodMonitor CRDs out of the prometheus-operator module zip
# (tools/monitoring-crds) into crds/ next to bin/, all under
# ${FORESIGHT_CACHE:-$HOME/.cache/foresight}/helm-tools/<helm>-<kubeconform>-<prom-op>/.
# Prints that directory's bin/ as the last line of stdout. Progress goes to stderr.
#
# Idempotent: a stamp keyed on the pinned versions, the wrapper modules' go.mod/go.sum and
# RECIPE below makes a second run return at once. `--force` rebuilds regardless.
set -euo pipefail

# Bump when the way the tools are built changes (flags, ldflags), so caches are rebuilt.
RECIPE=1

source "$(dirname "${BASH_SOURCE[0]}")/go-cache.sh"

parse_build_args "$@"

tools_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
helm_mod=$tools_dir/helm
kubeconform_mod=$tools_dir/kubeconform
crds_mod=$tools_dir/monitoring-crds

helm_version=$(gomod_version "$helm_mod/go.mod" helm.sh/helm/v3)
kubeconform_version=$(gomod_version "$kubeconform_mod/go.mod" github.com/yannh/kubeconform)
promop_version=$(gomod_version "$crds_mod/go.mod" github.com/prometheus-operator/prometheus-operator)
[[ -n $helm_version ]] || die "helm.sh/helm/v3 is not required in $helm_mod/go.mod"
[[ -n $kubeconform_version ]] || die "github.com/yannh/kubeconform is not required in $kubeconform_mod/go.mod"
[[ -n $promop_version ]] || die "github.com/prometheus-operator/prometheus-operator is not required in $crds_mod/go.mod"

cache_root=${FORESIGHT_CACHE:-$HOME/.cache/foresight}
out_dir=$cache_root/helm-tools/helm-$helm_version-kubeconform-$kubeconform_version-promop-$promop_version
bin_dir=$out_dir/bin
crd_dir=$out_dir/crds

key=$(
  printf 'recipe=%s\nhelm=%s\nkubeconform=%s\nprometheus-operator=%s\n' \
    "$RECIPE" "$helm_version" "$kubeconform_version" "$promop_version"
  cd "$tools_dir" && sha256sum helm/go.mod helm/go.sum kubeconform/go.mod kubeconform/go.sum \
    monitoring-crds/go.mod monitoring-crds/go.sum
)

crd_files=(monitoring.coreos.com_servicemonitors.yaml monitoring.coreos.com_podmonitors.yaml)
up_to_date() {
  stamp_matches || return 1
  [[ -x $bin_dir/helm && -x $bin_dir/kubeconform ]] || return 1
  local f
  for f in "${crd_files[@]}"; do [[ -f $crd_dir/$f ]] || return 1; done
}
use_cache_or_lock "helm $helm_version, kubeconform $kubeconform_version, prometheus-operator CRDs $promop_version"

tmp_bin=$out_dir/bin.tmp
tmp_crds=$out_dir/crds.tmp
rm -rf "$tmp_bin" "$tmp_crds"
mkdir -p "$tmp_bin" "$tmp_crds"
start=$SECONDS

# --- Helm -----------------------------------------------------------------------------
# The same variables as upstream's Makefile for a tagged build: version, empty metadata,
# clean tree; the commit is not known from a module zip. The Kubernetes version Helm
# assumes for lint and `template` (.Capabilities.KubeVersion) comes from the client-go it
# links, as in upstream's Makefile (major = client-go major + 1).
client_go=$(cd "$helm_mod" && go list -m -f '{{.Version}}' k8s.io/client-go)
client_go=${client_go#v}
k8s_major=$((${client_go%%.*} + 1))
k8s_minor=${client_go#*.}
k8s_minor=${k8s_minor%%.*}
helm_ldflags="-s -w"
helm_ldflags+=" -X helm.sh/helm/v3/internal/version.version=$helm_version"
helm_ldflags+=" -X helm.sh/helm/v3/internal/version.metadata="
helm_ldflags+=" -X helm.sh/helm/v3/internal/version.gitCommit="
helm_ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  helm_ldflags+=" -X $pkg.k8sVersionMajor=$k8s_major -X $pkg.k8sVersionMinor=$k8s_minor"
done
log "building helm $helm_version (a cold build takes several minutes on a small machine)"
(
  cd "$helm_mod"
  go build -trimpath -ldflags "$helm_ldflags" -o "$tmp_bin/helm" helm.sh/helm/v3/cmd/helm
) >&2
log "helm built after $((SECONDS - start))s"

# --- kubeconform ------------------------------------------------------------------------
# Upstream's .goreleaser.yml sets main.version to the tag.
log "building kubeconform $kubeconform_version"
(
  cd "$kubeconform_mod"
  go build -trimpath -ldflags "-s -w -X main.version=$kubeconform_version" \
    -o "$tmp_bin/kubeconform" github.com/yannh/kubeconform/cmd/kubeconform
) >&2
log "kubeconform built after $((SECONDS - start))s"

# --- monitoring.coreos.com CRDs ------------------------------------------------------------
# `go mod download` inside the pinning module checks the zip against its go.sum.
log "fetching ServiceMonitor and PodMonitor CRDs from prometheus-operator $promop_version"
promop_dir=$(cd "$crds_mod" && go mod download -json github.com/prometheus-operator/prometheus-operator |
  awk -F'"' '$2 == "Dir" { print $4 }')
[[ -d $promop_dir ]] || die "prometheus-operator $promop_version was not downloaded"
for f in "${crd_files[@]}"; do
  cp "$promop_dir/example/prometheus-operator-crd/$f" "$tmp_crds/$f"
done
chmod u+w "$tmp_crds"/*

"$tmp_bin/helm" version >&2
"$tmp_bin/kubeconform" -v >&2

rm -rf "$bin_dir" "$crd_dir"
mv "$tmp_bin" "$bin_dir"
mv "$tmp_crds" "$crd_dir"
write_stamp
log "done in $((SECONDS - start))s: $bin_dir"
echo "$bin_dir"
