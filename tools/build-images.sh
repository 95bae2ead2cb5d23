#!/usr/bin/env bash
# Builds the operator, PS and worker images without a Docker daemon or a container registry:
#
#   1. a base rootfs from Debian's packages (mmdebstrap --variant=extract: libc6, libgcc-s1,
#      libstdc++6, netbase; no shell, no package manager) plus /etc/passwd with the non-root
#      user 10001, /tmp and the CA bundle: the counterpart of distroless/cc-debian12;
#   2. each image with buildah from the repository's own Dockerfile: its runtime stage is used
#      verbatim with FROM pointing at the local base, and its builder stage is replaced by
#      the binaries the workspace already built (target/release; for the worker, the libtorch
#      libraries the binary needs, found with ldd, in the wheel's torch/lib layout);
#   3. each image exported as a docker-archive tar, ready for `ctr -n k8s.io images import`.
#
# Output: ${FORESIGHT_CACHE:-$HOME/.cache/foresight}/images/archives/<name>.tar, one line per
# image on stdout: "<name> <image ref> <archive>". Images are tagged with the chart's
# appVersion under the chart's default repositories, so `helm install` with default values and
# pullPolicy IfNotPresent finds them on the node.
#
# Environment: RELEASE_DIR (default <repo>/target/release: foresight, foresight-ps,
# foresight-worker), TORCH_LIB (default <repo>/.venv/lib/python3.11/site-packages/torch/lib),
# IMAGES (default "operator ps worker"). Content-cached: an image whose inputs (Dockerfile,
# binaries, libraries, base) are unchanged is not rebuilt. `--force` rebuilds everything.
#
# Needs root (buildah, mmdebstrap); tools/build-node.sh installs both.
set -euo pipefail

RECIPE=1
log() { printf '[build-images] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

force=0
for arg in "$@"; do
  case $arg in
    --force) force=1 ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 0 ;;
    *) die "unknown argument: $arg" ;;
  esac
done
# Old bases and the images of earlier builds, now untagged.
bah rmi --prune >/dev/null 2>&1 || true

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
release=${RELEASE_DIR:-$repo/target/release}
torch_lib=${TORCH_LIB:-$repo/.venv/lib/python3.11/site-packages/torch/lib}
images=${IMAGES:-operator ps worker}
cache=${FORESIGHT_CACHE:-$HOME/.cache/foresight}/images
store=$cache/storage
archives=$cache/archives
mkdir -p "$cache" "$archives"
exec 9>"$cache/lock"
flock 9

command -v buildah >/dev/null && command -v mmdebstrap >/dev/null ||
  die "buildah and mmdebstrap are needed: tools/build-node.sh installs them"
# buildah's storage and run state stay under the cache, not in /var/lib/containers, and its
# CNI directory too (buildah creates /etc/cni/net.d otherwise, even with chroot isolation).
mkdir -p "$cache/cni"
printf '[network]\nnetwork_config_dir = "%s"\n' "$cache/cni" >"$cache/containers.conf"
export CONTAINERS_CONF=$cache/containers.conf
# containers/storage bind-mounts its overlay directory onto itself and leaves it mounted: undone
# on exit, so the host's mount table is as it was.
release_storage() { if mountpoint -q "$store/root/overlay"; then umount "$store/root/overlay" || true; fi; }
trap release_storage EXIT
bah() { buildah --root "$store/root" --runroot "$store/run" --storage-driver overlay "$@"; }

app_version=$(awk -F'"' '/^appVersion:/ { print $2 }' "$repo/charts/foresight/Chart.yaml")
[[ -n $app_version ]] || die "no appVersion in charts/foresight/Chart.yaml"

# --- base rootfs ----------------------------------------------------------------------------
suite=bookworm
base_packages=libc6,libgcc-s1,libstdc++6,netbase
# Keyed on this section of the script (how the base is made), so other edits rebuild nothing.
base_key=$(printf 'recipe=%s\nsuite=%s\npackages=%s\n' "$RECIPE" "$suite" "$base_packages" |
  cat - <(awk '/^# --- base rootfs/ { on = 1 } /^# --- images/ { on = 0 } on' "${BASH_SOURCE[0]}") |
  sha256sum | cut -c1-12)
base_ref=localhost/foresight-base:$base_key
if [[ $force == 1 ]] || ! bah inspect --type image "$base_ref" >/dev/null 2>&1; then
  t0=$SECONDS
  log "base rootfs: mmdebstrap --variant=extract $suite ($base_packages)"
  rootfs=$cache/base-rootfs
  rm -rf "$rootfs" "$cache/base.tar"
  # extract: unpack the packages and their dependencies, run no maintainer script, so no
  # shell or dpkg is needed inside (hooks do not run for this variant: the files below are
  # written from here).
  nice -n 10 mmdebstrap --quiet --variant=extract --include="$base_packages" "$suite" "$rootfs" >&2
  (
    cd "$rootfs"
    rm -rf usr/share/doc usr/share/man usr/share/info usr/share/lintian usr/share/locale \
      usr/lib/x86_64-linux-gnu/gconv var/cache/apt var/lib/apt etc/apt dev/* var/log/*
    printf '%s\n' "root:x:0:0:root:/root:/sbin/nologin" \
      "foresight:x:10001:10001:foresight:/home/foresight:/sbin/nologin" \
      "nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin" >etc/passwd
    printf '%s\n' "root:x:0:" "foresight:x:10001:" "nogroup:x:65534:" >etc/group
    printf '%s\n' "passwd: files" "group: files" "hosts: files dns" >etc/nsswitch.conf
    install -d -m 1777 tmp
    install -d -m 0755 -o 10001 -g 10001 home/foresight
    install -d -m 0700 root
    # The CA bundle of Debian's ca-certificates (installed on this host by Debian): the package
    # itself would pull in openssl and perl through its maintainer scripts.
    install -D -m 0644 /etc/ssl/certs/ca-certificates.crt etc/ssl/certs/ca-certificates.crt
  )
  ldconfig -r "$rootfs"
  ! ls "$rootfs"/bin/*sh "$rootfs"/usr/bin/*sh >/dev/null 2>&1 || die "the base rootfs has a shell"
  tar -C "$rootfs" --numeric-owner --sort=name -cf "$cache/base.tar" .
  rm -rf "$rootfs"
  ctr=$(bah from --quiet scratch)
  bah add --quiet "$ctr" "$cache/base.tar" / >/dev/null
  bah config --env PATH=/usr/local/bin:/usr/bin:/bin \
    --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt --user 10001:10001 \
    --label org.opencontainers.image.title=foresight-base \
    --label "org.opencontainers.image.description=Debian $suite $base_packages, no shell (tools/build-images.sh)" \
    "$ctr"
  bah commit --quiet --rm "$ctr" "$base_ref" >/dev/null
  for old in $(bah images --format '{{.Name}}:{{.Tag}}' | awk -v r="$base_ref" '/foresight-base:/ && $0 != r'); do
    bah rmi "$old" >/dev/null 2>&1 || true
  done
  log "base $base_ref built in $((SECONDS - t0))s ($(stat -c %s "$cache/base.tar") bytes of rootfs tar)"
fi

# --- images ---------------------------------------------------------------------------------
# name  Dockerfile  binary
declare -A dockerfile=([operator]=operator/Dockerfile [ps]=ps-service/Dockerfile [worker]=worker-image/Dockerfile)
declare -A binary=([operator]=foresight [ps]=foresight-ps [worker]=foresight-worker)
declare -A repository=(
  [operator]=ghcr.io/foresight-dev/foresight-operator
  [ps]=ghcr.io/foresight-dev/foresight-ps
  [worker]=ghcr.io/foresight-dev/foresight-worker)

# The libraries of the torch wheel that foresight-worker loads (ldd, transitively: libtorch and,
# for a CUDA wheel, the nvidia/* libraries libtorch_cuda finds through its $ORIGIN/../../nvidia
# rpath), copied into out/torch with their paths relative to site-packages: the layout the
# Dockerfile's builder produces (/out/torch/torch/lib, /out/torch/nvidia/...). Libraries outside
# the wheel (libc, libstdc++, libm...) come from the base.
stage_torch() { # $1 = destination (out/torch)
  local site lib real
  site=$(cd "$torch_lib/../.." && pwd)
  mkdir -p "$1/torch/lib"
  LD_LIBRARY_PATH=$torch_lib ldd "$release/foresight-worker" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' |
    while read -r lib; do
      real=$(realpath -s "$lib")
      [[ $real == "$site"/* ]] || continue
      # A hard link where it can be (same filesystem): 2.7 GB not copied on every run.
      mkdir -p "$(dirname "$1/${real#"$site"/}")"
      ln -L -f "$real" "$1/${real#"$site"/}" 2>/dev/null || install -m 0644 "$real" "$1/${real#"$site"/}"
    done
  # A library not found must fail here, not in a pod.
  if LD_LIBRARY_PATH=$1/torch/lib ldd "$release/foresight-worker" | grep 'not found' >&2; then
    die "foresight-worker needs libraries that are not in $site"
  fi
}

for name in $images; do
  [[ -n ${dockerfile[$name]:-} ]] || die "unknown image $name (operator, ps, worker)"
  bin=${binary[$name]}
  [[ -x $release/$bin ]] || die "$release/$bin is missing: build it first (cargo build --release)"
  ref=${repository[$name]}:$app_version
  archive=$archives/$name.tar
  t0=$SECONDS
  ctx=$cache/context/$name
  rm -rf "$ctx"
  mkdir -p "$ctx/out"
  cp "$release/$bin" "$ctx/out/$bin"
  if [[ $name == worker ]]; then
    [[ -d $torch_lib ]] || die "no libtorch at $torch_lib: run scripts/setup-torch.sh"
    stage_torch "$ctx/out/torch"
    mkdir -p "$ctx/out/home"
  fi
  # The Dockerfile's runtime stage (from its last FROM line on), verbatim but for the image
  # it starts from; a one-line stage named builder stands for the Rust builder.
  df=${dockerfile[$name]}
  {
    printf '# Generated by tools/build-images.sh from %s: its runtime stage on the local base.\n' "$df"
    printf 'FROM scratch AS builder\nCOPY out /out\n\n'
    awk -v base="$base_ref" '/^FROM / { n++ } n == stages && /^FROM / { print "FROM " base; next } n == stages' \
      stages="$(grep -c '^FROM ' "$repo/$df")" "$repo/$df"
  } >"$ctx/Dockerfile"
  key=$( (cat "$ctx/Dockerfile"; cd "$ctx" && find out -type f -print0 | sort -z | xargs -0 sha256sum) |
    sha256sum | cut -c1-16)
  if [[ $force == 0 && -f $archive && "$(cat "$archive.key" 2>/dev/null)" == "$key" ]] &&
    bah inspect --type image "$ref" >/dev/null 2>&1; then
    log "$name: up to date ($ref)"
    echo "$name $ref $archive"
    continue
  fi
  log "$name: buildah bud -f ${df} (runtime stage) -> $ref"
  # chroot isolation for RUN steps (the worker checks its libraries with `--version`): no
  # network namespace or cgroup is needed for that, and nothing of the host leaks into the image.
  nice -n 10 buildah --root "$store/root" --runroot "$store/run" --storage-driver overlay \
    bud --quiet --pull=never --isolation chroot --layers=false \
    -f "$ctx/Dockerfile" -t "$ref" "$ctx" >&2
  rm -f "$archive"
  bah push --quiet "$ref" "docker-archive:$archive:$ref" >&2
  echo "$key" >"$archive.key"
  size=$(bah images --format '{{.Size}}' "$ref" | head -n1)
  log "$name: built in $((SECONDS - t0))s, image $size, archive $(du -h "$archive" | cut -f1)"
  echo "$name $ref $archive"
done
# Old bases and the images of earlier builds, now untagged.
bah rmi --prune >/dev/null 2>&1 || true
