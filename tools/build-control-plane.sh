#!/usr/bin/env bash
# Builds the real Kubernetes control plane the tests run against, from Go modules only
# (no container registry, no prebuilt release downloads):
#
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl  (tools/k8s)
#   etcd                                                              (tools/etcd)
#
# into ${FORESIGHT_CACHE:-$HOME/.cache/foresight}/control-plane/<k8s>-<etcd>/bin and
# prints that directory as the last line of stdout. Progress goes to stderr.
#
# Idempotent: a stamp keyed on the pinned versions, the wrapper modules' go.mod/go.sum
# and RECIPE below makes a second run return at once. To re-pin, run
# tools/update-control-plane-pins.sh. `--force` rebuilds regardless of the stamp.
#
# A cold build compiles a few thousand packages; with 2 cores that takes tens of minutes.
# The Go module cache (GOMODCACHE) and build cache (GOCACHE) stay at their defaults so
# they are shared with every other Go build on the machine.
set -euo pipefail

# Bump when the way the binaries are built changes (flags, tags, ldflags), so that
# existing caches are rebuilt.
RECIPE=1

source "$(dirname "${BASH_SOURCE[0]}")/go-cache.sh"

parse_build_args "$@"

tools_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
k8s_mod=$tools_dir/k8s
etcd_mod=$tools_dir/etcd

k8s_version=$(gomod_version "$k8s_mod/go.mod" k8s.io/kubernetes)
etcd_version=$(gomod_version "$etcd_mod/go.mod" go.etcd.io/etcd/server/v3)
[[ -n $k8s_version ]] || die "k8s.io/kubernetes is not required in $k8s_mod/go.mod"
[[ -n $etcd_version ]] || die "go.etcd.io/etcd/server/v3 is not required in $etcd_mod/go.mod"

cache_root=${FORESIGHT_CACHE:-$HOME/.cache/foresight}
out_dir=$cache_root/control-plane/$k8s_version-$etcd_version
bin_dir=$out_dir/bin

key=$(
  printf 'recipe=%s\nk8s=%s\netcd=%s\n' "$RECIPE" "$k8s_version" "$etcd_version"
  cd "$tools_dir" && sha256sum k8s/go.mod k8s/go.sum etcd/go.mod etcd/go.sum
)

binaries=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd)
up_to_date() {
  stamp_matches || return 1
  local b
  for b in "${binaries[@]}"; do [[ -x $bin_dir/$b ]] || return 1; done
}
use_cache_or_lock "kubernetes $k8s_version, etcd $etcd_version"

tmp_bin=$out_dir/bin.tmp
rm -rf "$tmp_bin"
mkdir -p "$tmp_bin"
start=$SECONDS

# --- Kubernetes ---------------------------------------------------------------------
# The same version variables and tags as upstream's hack/lib/version.sh and
# hack/lib/golang.sh. buildDate is the release's publication time on the module proxy
# (reproducible, like SOURCE_DATE_EPOCH); the commit is not known from a module zip.
k8s_minor=${k8s_version#v1.}
k8s_minor=${k8s_minor%%.*}
build_date=$(cd "$k8s_mod" && go list -m -f '{{if .Time}}{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}{{end}}' k8s.io/kubernetes)
[[ -n $build_date ]] || build_date=1970-01-01T00:00:00Z
k8s_ldflags="-s -w"
for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
  k8s_ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor"
  k8s_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.gitCommit= -X $pkg.buildDate=$build_date"
done
log "building kubernetes $k8s_version (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl)"
log "  a cold build takes tens of minutes on a small machine; later runs are instant"
(
  cd "$k8s_mod"
  go build -trimpath -tags=selinux,notest,grpcnotrace -ldflags "$k8s_ldflags" -o "$tmp_bin/" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kubectl
) >&2
log "kubernetes built after $((SECONDS - start))s"

# --- etcd ---------------------------------------------------------------------------
# etcd's version string is a constant in go.etcd.io/etcd/api/v3/version; only the git
# SHA is injected by its build script ("GitNotFound" is upstream's value without git).
log "building etcd $etcd_version"
(
  cd "$etcd_mod"
  go build -trimpath -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=GitNotFound" \
    -o "$tmp_bin/etcd" go.etcd.io/etcd/server/v3
) >&2
log "etcd built after $((SECONDS - start))s"

for b in "${binaries[@]}"; do [[ -x $tmp_bin/$b ]] || die "$b was not built"; done
"$tmp_bin/kube-apiserver" --version >&2
"$tmp_bin/etcd" --version >&2

rm -rf "$bin_dir"
mv "$tmp_bin" "$bin_dir"
write_stamp
log "done in $((SECONDS - start))s: $bin_dir"
echo "$bin_dir"
