#!/usr/bin/env bash
# Builds h2spec, the HTTP/2 conformance tester that scripts/h2spec.sh (make h2spec) runs against
# the PS, from Go modules only (no prebuilt release downloads):
#
#   h2spec   github.com/summerwind/h2spec/cmd/h2spec   (tools/h2spec)
#
# into ${FORESIGHT_CACHE:-$HOME/.cache/foresight}/h2spec/<version>/bin.
# Prints that directory as the last line of stdout. Progress goes to stderr.
#
# Idempotent: a stamp keyed on the pinned version, the wrapper module's go.mod/go.sum and
# RECIPE below makes a second run return at once. `--force` rebuilds regardless.
set -euo pipefail

# Bump when the way h2spec is built changes (flags, ldflags), so caches are rebuilt.
RECIPE=1

source "$(dirname "${BASH_SOURCE[0]}")/go-cache.sh"

parse_build_args "$@"

tools_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
h2spec_mod=$tools_dir/h2spec
h2spec_version=$(gomod_version "$h2spec_mod/go.mod" github.com/summerwind/h2spec)
[[ -n $h2spec_version ]] || die "github.com/summerwind/h2spec is not required in $h2spec_mod/go.mod"
h2spec_version=${h2spec_version%+incompatible}

cache_root=${FORESIGHT_CACHE:-$HOME/.cache/foresight}
out_dir=$cache_root/h2spec/$h2spec_version
bin_dir=$out_dir/bin

key=$(
  printf 'recipe=%s\nh2spec=%s\n' "$RECIPE" "$h2spec_version"
  cd "$tools_dir" && sha256sum h2spec/go.mod h2spec/go.sum
)

up_to_date() { stamp_matches && [[ -x $bin_dir/h2spec ]]; }
use_cache_or_lock "h2spec $h2spec_version"

tmp_bin=$out_dir/bin.tmp
rm -rf "$tmp_bin"
mkdir -p "$tmp_bin"
start=$SECONDS

# Upstream's Makefile sets main.VERSION (without the v) and main.COMMIT from git, which a
# module zip does not have: h2spec --version prints "(Unknown)" for it.
log "building h2spec $h2spec_version"
(
  cd "$h2spec_mod"
  go build -trimpath -ldflags "-s -w -X main.VERSION=${h2spec_version#v}" \
    -o "$tmp_bin/h2spec" github.com/summerwind/h2spec/cmd/h2spec
) >&2
"$tmp_bin/h2spec" --version >&2

rm -rf "$bin_dir"
mv "$tmp_bin" "$bin_dir"
write_stamp
log "done in $((SECONDS - start))s: $bin_dir"
echo "$bin_dir"
