#!/usr/bin/env bash
# Builds what a real single-node cluster needs besides the control plane, from Go modules and
# Debian packages only (no container registry, no prebuilt release downloads):
#
#   kubelet, kube-proxy                        (tools/k8s, the control plane's own pin)
#   containerd, containerd-shim-runc-v2, ctr   (tools/containerd)
#   coredns                                    (tools/coredns)
#   local-path-provisioner                     (tools/local-path-provisioner)
#   runc, CNI plugins, iptables, conntrack, mmdebstrap, buildah   (Debian, installed if missing)
#
# into ${FORESIGHT_CACHE:-$HOME/.cache/foresight}/node/<k8s>-containerd<v>-coredns<v>/bin and
# prints that directory as the last line of stdout. Progress goes to stderr.
#
# Idempotent: a stamp keyed on the pinned versions, the wrapper modules' go.mod/go.sum and
# RECIPE makes a second run return at once. `--force` rebuilds regardless of the stamp.
# `--no-apt` skips the Debian packages. Builds run under `nice` so that they yield to
# whatever else the machine is doing; GOMODCACHE and GOCACHE are shared with every other Go
# build (kubelet reuses most of the control plane's compiled packages).
set -euo pipefail

RECIPE=1

source "$(dirname "${BASH_SOURCE[0]}")/go-cache.sh"

force=0
apt=1
for arg in "$@"; do
  case $arg in
    --force) force=1 ;;
    --no-apt) apt=0 ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 0 ;;
    *) die "unknown argument: $arg" ;;
  esac
done

tools_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# --- Debian packages ----------------------------------------------------------------------
# runc (OCI runtime), the CNI plugins (bridge, host-local, loopback, portmap), iptables and
# conntrack (kube-proxy, the kubelet, the portmap plugin), nftables (the cleanup in cluster.sh),
# mmdebstrap and buildah (make images).
if [[ $apt == 1 ]]; then
  need=()
  command -v runc >/dev/null || need+=(runc)
  [[ -x /usr/lib/cni/bridge ]] || need+=(containernetworking-plugins)
  command -v iptables >/dev/null || need+=(iptables)
  command -v conntrack >/dev/null || need+=(conntrack)
  command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
  command -v buildah >/dev/null || need+=(buildah)
  command -v nft >/dev/null || need+=(nftables) # cluster.sh down: removes the tables the node added
  if ((${#need[@]})); then
    log "installing Debian packages: ${need[*]}"
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
  fi
fi

k8s_version=$(gomod_version "$tools_dir/k8s/go.mod" k8s.io/kubernetes)
containerd_version=$(gomod_version "$tools_dir/containerd/go.mod" github.com/containerd/containerd/v2)
coredns_version=$(gomod_version "$tools_dir/coredns/go.mod" github.com/coredns/coredns)
lpp_version=$(gomod_version "$tools_dir/local-path-provisioner/go.mod" github.com/rancher/local-path-provisioner)
[[ -n $k8s_version && -n $containerd_version && -n $coredns_version && -n $lpp_version ]] ||
  die "could not read the pinned versions from tools/{k8s,containerd,coredns,local-path-provisioner}/go.mod"

cache_root=${FORESIGHT_CACHE:-$HOME/.cache/foresight}
out_dir=$cache_root/node/$k8s_version-containerd$containerd_version-coredns$coredns_version-lpp$lpp_version
bin_dir=$out_dir/bin

key=$(
  printf 'recipe=%s\nk8s=%s\ncontainerd=%s\ncoredns=%s\nlocal-path-provisioner=%s\n' \
    "$RECIPE" "$k8s_version" "$containerd_version" "$coredns_version" "$lpp_version"
  cd "$tools_dir" && sha256sum k8s/go.mod k8s/go.sum containerd/go.mod containerd/go.sum \
    coredns/go.mod coredns/go.sum local-path-provisioner/go.mod local-path-provisioner/go.sum
)

binaries=(kubelet kube-proxy containerd containerd-shim-runc-v2 ctr coredns local-path-provisioner)
up_to_date() {
  stamp_matches || return 1
  local b
  for b in "${binaries[@]}"; do [[ -x $bin_dir/$b ]] || return 1; done
}
use_cache_or_lock "kubernetes $k8s_version, containerd $containerd_version, coredns $coredns_version, local-path-provisioner $lpp_version"
gobuild() { nice -n 10 go build -trimpath "$@"; }

tmp_bin=$out_dir/bin.tmp
rm -rf "$tmp_bin"
mkdir -p "$tmp_bin"
start=$SECONDS

# --- containerd -----------------------------------------------------------------------------
# As upstream's Makefile: version variables, the urfave_cli_no_docs tag, the shim with no_grpc.
# CGO off drops only the btrfs snapshotter (overlayfs is the default).
pkg=github.com/containerd/containerd/v2
cd_ldflags="-s -w -X $pkg/version.Version=$containerd_version -X $pkg/version.Revision= -X $pkg/version.Package=$pkg"
log "building containerd $containerd_version (containerd, ctr, containerd-shim-runc-v2)"
(
  cd "$tools_dir/containerd"
  gobuild -tags urfave_cli_no_docs -ldflags "$cd_ldflags" -o "$tmp_bin/" "$pkg/cmd/containerd" "$pkg/cmd/ctr"
  gobuild -tags urfave_cli_no_docs,no_grpc -ldflags "$cd_ldflags" -o "$tmp_bin/" "$pkg/cmd/containerd-shim-runc-v2"
) >&2
log "containerd built after $((SECONDS - start))s"

# --- CoreDNS ----------------------------------------------------------------------------------
log "building coredns $coredns_version"
(
  cd "$tools_dir/coredns"
  gobuild -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=" -o "$tmp_bin/coredns" github.com/coredns/coredns
) >&2
log "coredns built after $((SECONDS - start))s"

# --- local-path-provisioner ----------------------------------------------------------------
log "building local-path-provisioner $lpp_version"
(
  cd "$tools_dir/local-path-provisioner"
  gobuild -ldflags "-s -w -X main.VERSION=$lpp_version" -o "$tmp_bin/local-path-provisioner" github.com/rancher/local-path-provisioner
) >&2
log "local-path-provisioner built after $((SECONDS - start))s"

# --- kubelet, kube-proxy --------------------------------------------------------------------
# Same flags, tags and version variables as tools/build-control-plane.sh.
k8s_minor=${k8s_version#v1.}
k8s_minor=${k8s_minor%%.*}
build_date=$(cd "$tools_dir/k8s" && go list -m -f '{{if .Time}}{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}{{end}}' k8s.io/kubernetes)
[[ -n $build_date ]] || build_date=1970-01-01T00:00:00Z
k8s_ldflags="-s -w"
for p in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
  k8s_ldflags+=" -X $p.gitVersion=$k8s_version -X $p.gitMajor=1 -X $p.gitMinor=$k8s_minor"
  k8s_ldflags+=" -X $p.gitTreeState=clean -X $p.gitCommit= -X $p.buildDate=$build_date"
done
log "building kubernetes $k8s_version (kubelet, kube-proxy)"
(
  cd "$tools_dir/k8s"
  gobuild -tags=selinux,notest,grpcnotrace -ldflags "$k8s_ldflags" -o "$tmp_bin/" \
    k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy
) >&2
log "kubernetes built after $((SECONDS - start))s"

for b in "${binaries[@]}"; do [[ -x $tmp_bin/$b ]] || die "$b was not built"; done
"$tmp_bin/kubelet" --version >&2
"$tmp_bin/containerd" --version >&2
"$tmp_bin/coredns" -version >&2

rm -rf "$bin_dir"
mv "$tmp_bin" "$bin_dir"
write_stamp
log "done in $((SECONDS - start))s: $bin_dir"
echo "$bin_dir"
