#!/usr/bin/env bash
# Builds the operator, PS and worker images without a Docker daemon or a container registry:
#
#   1. a base rootfs from Debian's packages (mmdebstrap --variant=extract: libc6, libgcc-s1,
#      libstdc++6, netbase; no shell, no package manager) plus /etc/passwd with the non-root
#      user 10001, /tmp and the CA bundle: the counterpart of distroless/cc-debian12; for the
#      worker, the same plus Debian's python3.11 (the worker image is also the ready image for
#      users' Python scripts);
#   2. each image with buildah from the repository's own Dockerfile: its runtime stage is used
#      verbatim with FROM pointing at the local base, and its builder stage is replaced by
#      the binaries the workspace already built (target/release; for the worker, the venv's
#      torch, its nvidia libraries, numpy and the foresight package as a site-packages
#      directory: stage_site below);
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
# The worker's base adds Debian's Python: the worker image is also the ready image for users'
# Python scripts (`workers.command: [python, ...]`), with torch and the foresight package on
# its PYTHONPATH (see stage_site below).
python_packages=$base_packages,python3.11

# build_base NAME PACKAGES: the base image localhost/foresight-NAME:<key> (built unless it is
# there), its reference on stdout.
build_base() {
  local name=$1 packages=$2 key ref rootfs t0=$SECONDS old
  # Keyed on this section of the script (how a base is made), so other edits rebuild nothing.
  key=$(printf 'recipe=%s\nsuite=%s\npackages=%s\n' "$RECIPE" "$suite" "$packages" |
    cat - <(awk '/^# --- base rootfs/ { on = 1 } /^# --- images/ { on = 0 } on' "${BASH_SOURCE[0]}") |
    sha256sum | cut -c1-12)
  ref=localhost/foresight-$name:$key
  if [[ $force == 0 ]] && bah inspect --type image "$ref" >/dev/null 2>&1; then
    echo "$ref"
    return
  fi
  log "$name rootfs: mmdebstrap --variant=extract $suite ($packages)"
  rootfs=$cache/$name-rootfs
  rm -rf "$rootfs" "$cache/$name.tar"
  # extract: unpack the packages and their dependencies, run no maintainer script, so no
  # shell or dpkg is needed inside (hooks do not run for this variant: the files below are
  # written from here).
  nice -n 10 mmdebstrap --quiet --variant=extract --include="$packages" "$suite" "$rootfs" >&2
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
    # python3-minimal's symlinks (that package would bring dpkg along), and `python`, which
    # users' commands say.
    if [[ -x usr/bin/python3.11 ]]; then
      ln -sf python3.11 usr/bin/python3
      ln -sf python3.11 usr/bin/python
    fi
  )
  ldconfig -r "$rootfs"
  ! ls "$rootfs"/bin/*sh "$rootfs"/usr/bin/*sh >/dev/null 2>&1 || die "the $name rootfs has a shell"
  tar -C "$rootfs" --numeric-owner --sort=name -cf "$cache/$name.tar" .
  rm -rf "$rootfs"
  local ctr
  ctr=$(bah from --quiet scratch)
  bah add --quiet "$ctr" "$cache/$name.tar" / >/dev/null
  bah config --env PATH=/usr/local/bin:/usr/bin:/bin \
    --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt --user 10001:10001 \
    --label org.opencontainers.image.title=foresight-$name \
    --label "org.opencontainers.image.description=Debian $suite $packages, no shell (tools/build-images.sh)" \
    "$ctr"
  bah commit --quiet --rm "$ctr" "$ref" >/dev/null
  for old in $(bah images --format '{{.Name}}:{{.Tag}}' | awk -v r="$ref" -v n="foresight-$name:" 'index($0, n) && $0 != r'); do
    bah rmi "$old" >/dev/null 2>&1 || true
  done
  log "$name $ref built in $((SECONDS - t0))s ($(stat -c %s "$cache/$name.tar") bytes of rootfs tar)"
  echo "$ref"
}

base_ref=$(build_base base "$base_packages")
# Only for an image that needs it: `IMAGES="operator ps"` builds no Python.
python_base_ref=""
[[ " $images " != *" worker "* ]] || python_base_ref=$(build_base python-base "$python_packages")

# --- images ---------------------------------------------------------------------------------
# name  Dockerfile  binary
declare -A dockerfile=([operator]=operator/Dockerfile [ps]=ps-service/Dockerfile [worker]=worker-image/Dockerfile)
declare -A binary=([operator]=foresight [ps]=foresight-ps [worker]=foresight-worker)
declare -A repository=(
  [operator]=ghcr.io/foresight-dev/foresight-operator
  [ps]=ghcr.io/foresight-dev/foresight-ps
  [worker]=ghcr.io/foresight-dev/foresight-worker)

# The worker image's Python site-packages, staged from the venv's (what `make setup` installed)
# into out/site-packages: torch with its whole lib/ and the nvidia/* libraries (libtorch_cuda
# finds them through its $ORIGIN/../../nvidia rpath; cudnn's and cusolver's are dlopened, so
# an ldd closure is not enough), what torch, numpy and the foresight package require (their
# metadata, followed transitively), with their bytecode. Not triton (691 MB, torch.compile's
# GPU backend; an image FROM this one can add it), no headers or static libraries. foresight-
# worker loads libtorch from the same torch/lib (LD_LIBRARY_PATH in the Dockerfile).
stage_site() { # $1 = destination (out/site-packages)
  local site top
  site=$(cd "$torch_lib/../.." && pwd)
  mkdir -p "$1"
  for top in $("$site/../../../bin/python" - <<'EOF'
import importlib.metadata as md
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name
todo, seen = ["torch", "numpy", "foresight"], {"triton"}
tops = set()
while todo:
    name = canonicalize_name(todo.pop())
    if name in seen:
        continue
    seen.add(name)
    dist = md.distribution(name)
    todo += [r.name for r in map(Requirement, dist.requires or []) if r.marker is None or r.marker.evaluate({"extra": ""})]
    tops |= {f.parts[0] for f in dist.files or [] if not f.parts[0].endswith((".dist-info", ".pth")) and f.parts[0] not in ("..", "__pycache__", "bin")}
print(*sorted(tops))
EOF
  ); do
    # Hard links where they can be (same filesystem): 3 GB not copied on every run.
    cp -al "$site/$top" "$1/" 2>/dev/null || cp -a "$site/$top" "$1/"
  done
  [[ -d $1/torch/lib && -d $1/foresight ]] || die "no torch or foresight package in $site: run make setup"
  rm -rf "$1/torch/include"
  find "$1" -type d -name include -path '*/nvidia/*' -prune -exec rm -rf {} +
  find "$1" -name '*.a' -delete
  # A library not found must fail here, not in a pod; but for the driver's libcuda, which the
  # NVIDIA container toolkit mounts on a GPU node.
  if LD_LIBRARY_PATH=$1/torch/lib ldd "$release/foresight-worker" "$1"/torch/lib/*.so |
    grep 'not found' | grep -v '^\s*libcuda\.so\.1 ' >&2; then
    die "foresight-worker or torch need libraries that are not in $site"
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
    stage_site "$ctx/out/site-packages"
    mkdir -p "$ctx/out/home"
  fi
  # The Dockerfile's runtime stage (from its last FROM line on), verbatim but for the image
  # it starts from; a one-line stage named builder stands for the Rust builder.
  df=${dockerfile[$name]}
  from=$base_ref
  [[ $name != worker ]] || from=$python_base_ref
  {
    printf '# Generated by tools/build-images.sh from %s: its runtime stage on the local base.\n' "$df"
    printf 'FROM scratch AS builder\nCOPY out /out\n\n'
    awk -v base="$from" '/^FROM / { n++ } n == stages && /^FROM / { print "FROM " base; next } n == stages' \
      stages="$(grep -c '^FROM ' "$repo/$df")" "$repo/$df"
  } >"$ctx/Dockerfile"
  # (Bytecode is left out of the key: any python run in the venv compiles more of it, and a
  # missing .pyc is only compiled again in the pod.)
  key=$( (cat "$ctx/Dockerfile"; cd "$ctx" && find out -type f -not -path '*/__pycache__/*' -print0 | sort -z | xargs -0 sha256sum) |
    sha256sum | cut -c1-16)
  if [[ $force == 0 && -f $archive && "$(cat "$archive.key" 2>/dev/null)" == "$key" ]]; then
    log "$name: up to date ($ref)"
    rm -rf "$ctx/out"
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
  # The archive is what the node imports; a second copy in buildah's storage (4.4 GB for the
  # worker) only filled the disk the node's pods need (CI's node evicted them once).
  bah rmi "$ref" >/dev/null
  rm -rf "$ctx/out"
  log "$name: built in $((SECONDS - t0))s, image $size, archive $(du -h "$archive" | cut -f1)"
  echo "$name $ref $archive"
done
# Old bases and the images of earlier builds, now untagged.
bah rmi --prune >/dev/null 2>&1 || true
