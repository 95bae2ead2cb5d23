#!/usr/bin/env bash
# Smoke test of the control plane the tests run against: starts it with tools/control-plane.sh
# (etcd, kube-apiserver, kube-controller-manager, kube-scheduler and the simulated node-1 on free
# loopback ports), then checks with the real kubectl that
#   - the apiserver serves namespaces and API resources,
#   - the controller manager works (a new namespace gets its "default" ServiceAccount; a
#     Deployment gets a ReplicaSet and a Pod),
#   - the scheduler works (the Pod is bound to node-1),
# and tears everything down on exit, success or failure.
#
#   tools/smoke-control-plane.sh              # builds (or reuses) the binaries first
#   CONTROL_PLANE_BIN=/path/to/bin tools/smoke-control-plane.sh
#   KEEP_TMP=1 ...                            # keep the temp dir (logs) afterwards
#
# Needs: openssl, curl.
set -euo pipefail

log() { printf '[smoke-control-plane] %s\n' "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }

tools_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bin=${CONTROL_PLANE_BIN:-$("$tools_dir/build-control-plane.sh" | tail -n1)}
for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  [[ -x $bin/$b ]] || die "$bin/$b missing"
done
command -v openssl >/dev/null || die "openssl is not on PATH"
command -v curl >/dev/null || die "curl is not on PATH"

used_ports=" "
free_port() { # a loopback TCP port nobody listens on (and we have not handed out)
  local p
  for _ in $(seq 200); do
    p=$((20000 + RANDOM % 40000))
    [[ $used_ports == *" $p "* ]] && continue
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      used_ports+="$p "
      echo "$p"
      return
    fi
  done
  die "no free port found"
}

work=$(mktemp -d "${TMPDIR:-/tmp}/foresight-smoke.XXXXXX")
now_ms() { date +%s%3N; }
t_start=$(now_ms)

# The control plane lives until its stdin closes: this script's exit closes it.
coproc CP {
  BIN=$bin WORK=$work KEEP_CONTROL_PLANE_TMP=${KEEP_TMP:-0} \
    ETCD_PORT=$(free_port) ETCD_PEER_PORT=$(free_port) API_PORT=$(free_port) \
    KCM_PORT=$(free_port) SCHED_PORT=$(free_port) \
    exec "$tools_dir/control-plane.sh"
}
cp_pid=$CP_PID
cp_in=${CP[1]}
cp_out=${CP[0]}
stop() {
  local rc=$?
  eval "exec $cp_in>&-" 2>/dev/null || true # EOF: the supervisor stops the servers, removes $work
  wait "$cp_pid" 2>/dev/null || true
  exit "$rc"
}
trap stop EXIT
trap 'exit 130' INT TERM

read -r ready <&"$cp_out" || true
[[ $ready == READY ]] || die "the control plane did not start: ${ready:-no answer} (its log is above)"
log "control plane up in $(($(now_ms) - t_start)) ms ($work)"

export KUBECONFIG=$work/admin.kubeconfig
kubectl() { "$bin/kubectl" "$@"; }
wait_for() { # description timeout_s command... : polls until command succeeds
  local what=$1 timeout=$2 t0=$SECONDS
  shift 2
  until "$@" >/dev/null 2>&1; do
    ((SECONDS - t0 < timeout)) || die "$what not seen after ${timeout}s"
    sleep 0.2
  done
}

log "kubectl version"
kubectl version >&2
log "kubectl get ns"
kubectl get ns >&2
log "kubectl api-resources | head"
# Not a pipe: under pipefail, `head` closing early can fail kubectl with SIGPIPE.
kubectl api-resources >"$work/api-resources.txt"
head "$work/api-resources.txt" >&2

t0=$(now_ms)
kubectl create namespace smoke >&2
sa_exists() { kubectl -n smoke get serviceaccount default; }
wait_for "the default ServiceAccount (serviceaccount controller)" 60 sa_exists
log "namespace smoke got its default ServiceAccount after $(($(now_ms) - t0)) ms"

t0=$(now_ms)
kubectl -n smoke create deployment web --image=registry.invalid/none:1 >&2
pod_bound() {
  kubectl -n smoke get pods -l app=web -o jsonpath='{.items[0].spec.nodeName}' | grep -qx node-1
}
wait_for "a pod of the deployment bound to node-1 (deployment/replicaset controllers + scheduler)" 60 pod_bound
log "deployment -> replicaset -> pod -> bound to node-1 after $(($(now_ms) - t0)) ms"
kubectl -n smoke get deploy,rs,pods -o wide >&2

log "OK"
