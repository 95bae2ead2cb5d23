#!/usr/bin/env bash
# Builds Kueue's manager for the Kueue admission test (operator/tests/kueue.rs), from Go
# modules only (no container registry, no prebuilt release downloads):
#
#   kueue   sigs.k8s.io/kueue/cmd/kueue   (tools/kueue)
#
# and copies Kueue's CRDs (config/components/crd/bases) and webhook configurations
# (config/components/webhook/manifests.yaml) out of the same module zip into crds/ and
# webhook/ next to bin/, all under ${FORESIGHT_CACHE:-$HOME/.cache/foresight}/kueue/<version>/.
# Prints that directory's bin/ as the last line of stdout. Progress goes to stderr.
#
# Idempotent: a stamp keyed on the pinned version, the wrapper module's go.mod/go.sum and
# RECIPE below makes a second run return at once. `--force` rebuilds regardless.
set -euo pipefail

# Bump when the way Kueue is built changes (flags, ldflags, copied files), so caches are rebuilt.
RECIPE=1

source "$(dirname "${BASH_SOURCE[0]}")/go-cache.sh"

parse_build_args "$@"

tools_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
kueue_mod=$tools_dir/kueue
kueue_version=$(gomod_version "$kueue_mod/go.mod" sigs.k8s.io/kueue)
[[ -n $kueue_version ]] || die "sigs.k8s.io/kueue is not required in $kueue_mod/go.mod"

cache_root=${FORESIGHT_CACHE:-$HOME/.cache/foresight}
out_dir=$cache_root/kueue/$kueue_version
bin_dir=$out_dir/bin

key=$(
  printf 'recipe=%s\nkueue=%s\n' "$RECIPE" "$kueue_version"
  cd "$tools_dir" && sha256sum kueue/go.mod kueue/go.sum
)

up_to_date() {
  stamp_matches || return 1
  [[ -x $bin_dir/kueue && -f $out_dir/webhook/manifests.yaml ]] || return 1
  compgen -G "$out_dir/crds/*.yaml" >/dev/null
}
use_cache_or_lock "kueue $kueue_version"

tmp=$out_dir/tmp
rm -rf "$tmp"
mkdir -p "$tmp/bin" "$tmp/crds" "$tmp/webhook"
start=$SECONDS

# Upstream's Makefile sets the version and leaves the commit to git, unknown from a module zip.
log "building kueue $kueue_version (a cold build takes several minutes on a small machine)"
(
  cd "$kueue_mod"
  go build -trimpath -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$kueue_version" \
    -o "$tmp/bin/kueue" sigs.k8s.io/kueue/cmd/kueue
) >&2
log "kueue built after $((SECONDS - start))s"

# `go mod download` inside the pinning module checks the zip against its go.sum.
kueue_dir=$(cd "$kueue_mod" && go mod download -json sigs.k8s.io/kueue | awk -F'"' '$2 == "Dir" { print $4 }')
[[ -d $kueue_dir ]] || die "kueue $kueue_version was not downloaded"
cp "$kueue_dir"/config/components/crd/bases/*.yaml "$tmp/crds/"
cp "$kueue_dir/config/components/webhook/manifests.yaml" "$tmp/webhook/"
chmod -R u+w "$tmp"

rm -rf "$bin_dir" "$out_dir/crds" "$out_dir/webhook"
mv "$tmp/bin" "$bin_dir"
mv "$tmp/crds" "$out_dir/crds"
mv "$tmp/webhook" "$out_dir/webhook"
rm -rf "$tmp"
write_stamp
log "done in $((SECONDS - start))s: $bin_dir"
echo "$bin_dir"
