#!/usr/bin/env bash
# Builds `prometheus` (github.com/prometheus/prometheus/cmd/prometheus, wrapper module
# tools/prometheus) with its Kubernetes service discovery, for tools/cluster-prometheus.sh:
# Debian's package is built without kubernetes_sd_configs ("Disable kubernetes SD, until
# dependencies are more reasonable"), and no prebuilt release can be downloaded here.
#
# Build tags `remove_all_sd,enable_kubernetes_sd` (upstream's plugins/ switches) leave out the
# cloud discoveries (AWS, Azure, GCE, ...), which the cluster does not use and which would
# triple the build; file, static and HTTP discovery are always in. No `builtinassets`: the web
# UI is not embedded (the HTTP API, which the scripts use, is all there). Installed into
# ${FORESIGHT_CACHE:-$HOME/.cache/foresight}/prometheus/<version>/bin; prints that directory as
# the last line of stdout. The stamp scheme of tools/go-cache.sh; `--force` rebuilds.
set -euo pipefail

RECIPE=1 # bump when the build's flags change

source "$(dirname "${BASH_SOURCE[0]}")/go-cache.sh"
parse_build_args "$@"

tools_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mod=$tools_dir/prometheus
version=$(gomod_version "$mod/go.mod" github.com/prometheus/prometheus)
[[ -n $version ]] || die "github.com/prometheus/prometheus is not required in $mod/go.mod"
# The module is tagged v0.<major><minor 2 digits>.<patch> for Prometheus <major>.<minor>.<patch>.
v=${version#v0.}
release=$((${v%%.*} / 100)).$((${v%%.*} % 100)).${v#*.}
out_dir=${FORESIGHT_CACHE:-$HOME/.cache/foresight}/prometheus/$release
bin_dir=$out_dir/bin
key=$(printf 'recipe=%s\nprometheus=%s\n' "$RECIPE" "$version" && cd "$tools_dir" && sha256sum prometheus/go.mod prometheus/go.sum)
up_to_date() { stamp_matches && [[ -x $bin_dir/prometheus ]]; }
use_cache_or_lock "prometheus $release (kubernetes SD)"
start=$SECONDS
log "building prometheus $release ($version) with kubernetes SD (several minutes the first time)"
rm -rf "$out_dir/bin.tmp"
mkdir -p "$out_dir/bin.tmp"
# The version variables upstream's promu sets (the commit is not known from a module zip).
ldflags="-s -w -X github.com/prometheus/common/version.Version=$release"
ldflags+=" -X github.com/prometheus/common/version.Branch=HEAD -X github.com/prometheus/common/version.BuildUser=foresight"
(
  cd "$mod"
  nice go build -trimpath -tags remove_all_sd,enable_kubernetes_sd,netgo -ldflags "$ldflags" \
    -o "$out_dir/bin.tmp/prometheus" github.com/prometheus/prometheus/cmd/prometheus
) >&2
"$out_dir/bin.tmp/prometheus" --version >&2
rm -rf "$bin_dir"
mv "$out_dir/bin.tmp" "$bin_dir"
write_stamp
log "done in $((SECONDS - start))s: $bin_dir"
echo "$bin_dir"
