# Sourced by the tools/build-*.sh scripts that build pinned Go binaries into
# ${FORESIGHT_CACHE:-$HOME/.cache/foresight}: their logging and the stamp scheme they share.
#
# The caller sets out_dir (its cache directory; binaries in $out_dir/bin), key (RECIPE, the
# pinned versions and the wrapper modules' go.mod/go.sum sums), force (0 or 1) and defines
# up_to_date (stamp_matches and its own outputs present).

log() { printf '[%s] %s\n' "$(basename "$0" .sh)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# A pinned module version, read straight from go.mod so the warm path never starts `go`.
gomod_version() { # $1 = go.mod, $2 = module path
  awk -v m="$2" '($1 == m && $2 ~ /^v/) || ($1 == "require" && $2 == m) { print ($1 == "require" ? $3 : $2); exit }' "$1"
}

stamp_matches() { [[ -f $out_dir/stamp && "$(cat "$out_dir/stamp")" == "$key" ]]; }

# Prints $out_dir/bin and ends the script when the cache is up to date ($1 says what is
# cached). Otherwise takes the cache's lock, serialising concurrent callers (parallel test
# binaries; the loser finds the stamp fresh), and sets Go up for a build of the pinned modules.
use_cache_or_lock() {
  if [[ $force == 0 ]] && up_to_date; then
    log "up to date: $1"
    echo "$out_dir/bin"
    exit 0
  fi
  command -v go >/dev/null || die "go is not on PATH"
  mkdir -p "$out_dir"
  exec 9>"$out_dir/lock"
  flock 9
  if [[ $force == 0 ]] && up_to_date; then
    log "up to date (built by a concurrent run): $1"
    echo "$out_dir/bin"
    exit 0
  fi
  export GOWORK=off CGO_ENABLED=0
  # The committed go.sum files are complete: never let a build edit them.
  export GOFLAGS="-mod=readonly -buildvcs=false"
}

# Marks the cache complete: called after the binaries are in place.
# The build scripts' common arguments: `--force` sets force=1 (rebuild whatever the stamp says),
# `-h`/`--help` prints the calling script's opening comment. Scripts with flags of their own
# (build-node.sh's --no-apt) parse them themselves.
parse_build_args() {
  force=0
  local arg
  for arg in "$@"; do
    case $arg in
      --force) force=1 ;;
      -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0" | sed 's/^# \{0,1\}//' >&2; exit 0 ;;
      *) die "unknown argument: $arg" ;;
    esac
  done
}

write_stamp() { printf '%s\n' "$key" >"$out_dir/stamp"; }
