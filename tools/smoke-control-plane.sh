#!/usr/bin/env bash
# Smoke test of the control plane built by tools/build-control-plane.sh:
# starts etcd, kube-apiserver, kube-controller-manager and kube-scheduler on free
# loopback ports in a temporary directory (certificates from openssl, token auth, RBAC),
# then checks with the real kubectl that
#   - the apiserver becomes ready and serves namespaces and API resources,
#   - the controller manager is healthy and works (a new namespace gets its "default"
#     ServiceAccount; a Deployment gets a ReplicaSet and a Pod),
#   - the scheduler is healthy and works (the Pod is marked Unschedulable: there are no
#     nodes here),
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

work=$(mktemp -d "${TMPDIR:-/tmp}/foresight-smoke.XXXXXX")
pids=()
names=()
cleanup() {
  local rc=$? i
  # Stop in reverse start order (etcd last), each fully before the next; then insist.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill "${pids[i]}" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "${pids[i]}" 2>/dev/null || break; sleep 0.1; done
    kill -9 "${pids[i]}" 2>/dev/null || true
    wait "${pids[i]}" 2>/dev/null || true
  done
  if [[ $rc != 0 ]]; then
    for i in "${!names[@]}"; do
      log "---- last lines of ${names[i]}.log ----"
      tail -n 25 "$work/${names[i]}.log" >&2 || true
    done
  fi
  if [[ ${KEEP_TMP:-0} == 1 ]]; then log "kept $work"; else rm -rf "$work"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'log "FAILED at line $LINENO: $BASH_COMMAND"' ERR
trap 'exit 130' INT TERM

start() { # name args... : runs in the background, logs to $work/name.log
  local name=$1
  shift
  "$@" >"$work/$name.log" 2>&1 &
  pids+=("$!")
  names+=("$name")
}

alive() { kill -0 "${pids[$1]}" 2>/dev/null || die "${names[$1]} exited early (see log above)"; }

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

wait_for() { # description timeout_s process_index command... : polls until command succeeds
  local what=$1 timeout=$2 idx=$3 t0=$SECONDS
  shift 3
  until "$@" >/dev/null 2>&1; do
    alive "$idx"
    ((SECONDS - t0 < timeout)) || die "$what not ready after ${timeout}s"
    sleep 0.2
  done
}

now_ms() { date +%s%3N; }
t_start=$(now_ms)

# --- certificates and credentials -------------------------------------------------
cd "$work"
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=foresight-smoke-ca" \
  -keyout ca.key -out ca.crt 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" \
  -keyout apiserver.key -out apiserver.csr 2>/dev/null
cat >apiserver.ext <<'EOF'
basicConstraints = CA:FALSE
keyUsage = digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, DNS:localhost, DNS:kubernetes, DNS:kubernetes.default, DNS:kubernetes.default.svc, IP:10.0.0.1
EOF
openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
  -extfile apiserver.ext -out apiserver.crt 2>/dev/null
openssl genrsa -out sa.key 2048 2>/dev/null
openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null

admin_token=$(openssl rand -hex 16)
kcm_token=$(openssl rand -hex 16)
sched_token=$(openssl rand -hex 16)
cat >tokens.csv <<EOF
$admin_token,admin,admin,"system:masters"
$kcm_token,system:kube-controller-manager,kcm,"system:masters"
$sched_token,system:kube-scheduler,scheduler
EOF

etcd_port=$(free_port)
etcd_peer_port=$(free_port)
api_port=$(free_port)
kcm_port=$(free_port)
sched_port=$(free_port)

kubeconfig() { # file token
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: smoke
  cluster:
    server: https://127.0.0.1:$api_port
    certificate-authority: $work/ca.crt
users:
- name: user
  user:
    token: $2
contexts:
- name: smoke
  context: {cluster: smoke, user: user}
current-context: smoke
EOF
}
kubeconfig admin.kubeconfig "$admin_token"
kubeconfig kcm.kubeconfig "$kcm_token"
kubeconfig scheduler.kubeconfig "$sched_token"
export KUBECONFIG=$work/admin.kubeconfig
kubectl() { "$bin/kubectl" "$@"; }
log "certificates and kubeconfigs ready in $(($(now_ms) - t_start)) ms ($work)"

# --- etcd ---------------------------------------------------------------------------
t0=$(now_ms)
start etcd "$bin/etcd" --name smoke --data-dir "$work/etcd" \
  --listen-client-urls "http://127.0.0.1:$etcd_port" \
  --advertise-client-urls "http://127.0.0.1:$etcd_port" \
  --listen-peer-urls "http://127.0.0.1:$etcd_peer_port" \
  --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer_port" \
  --initial-cluster "smoke=http://127.0.0.1:$etcd_peer_port" \
  --unsafe-no-fsync --log-level warn
etcd_health() { curl -fsS "http://127.0.0.1:$etcd_port/health" | grep -q '"health":"true"'; }
wait_for etcd 60 0 etcd_health
log "etcd healthy on 127.0.0.1:$etcd_port after $(($(now_ms) - t0)) ms"

# --- kube-apiserver -----------------------------------------------------------------
t0=$(now_ms)
start kube-apiserver "$bin/kube-apiserver" \
  --etcd-servers "http://127.0.0.1:$etcd_port" \
  --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" \
  --endpoint-reconciler-type none \
  --cert-dir "$work/apiserver-certs" \
  --tls-cert-file "$work/apiserver.crt" --tls-private-key-file "$work/apiserver.key" \
  --client-ca-file "$work/ca.crt" \
  --token-auth-file "$work/tokens.csv" \
  --authorization-mode RBAC \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --service-account-key-file "$work/sa.pub" \
  --service-account-signing-key-file "$work/sa.key" \
  --service-cluster-ip-range 10.0.0.0/24
wait_for kube-apiserver 120 1 kubectl get --raw /readyz
log "kube-apiserver ready on 127.0.0.1:$api_port after $(($(now_ms) - t0)) ms"

# --- kube-controller-manager and kube-scheduler -------------------------------------
t0=$(now_ms)
start kube-controller-manager "$bin/kube-controller-manager" \
  --kubeconfig "$work/kcm.kubeconfig" \
  --authentication-kubeconfig "$work/kcm.kubeconfig" \
  --authorization-kubeconfig "$work/kcm.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port "$kcm_port" --cert-dir "$work/kcm-certs" \
  --service-account-private-key-file "$work/sa.key" \
  --root-ca-file "$work/ca.crt" \
  --service-cluster-ip-range 10.0.0.0/24 \
  --leader-elect=false
start kube-scheduler "$bin/kube-scheduler" \
  --kubeconfig "$work/scheduler.kubeconfig" \
  --authentication-kubeconfig "$work/scheduler.kubeconfig" \
  --authorization-kubeconfig "$work/scheduler.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port "$sched_port" \
  --leader-elect=false
wait_for kube-controller-manager 120 2 curl -fsSk "https://127.0.0.1:$kcm_port/healthz"
log "kube-controller-manager healthy on 127.0.0.1:$kcm_port after $(($(now_ms) - t0)) ms"
wait_for kube-scheduler 120 3 curl -fsSk "https://127.0.0.1:$sched_port/healthz"
log "kube-scheduler healthy on 127.0.0.1:$sched_port after $(($(now_ms) - t0)) ms"
log "control plane up in $(($(now_ms) - t_start)) ms in total"

# --- checks with kubectl ------------------------------------------------------------
log "kubectl version"
kubectl version >&2
log "kubectl get ns"
kubectl get ns >&2
log "kubectl api-resources | head"
# Not a pipe: under pipefail, `head` closing early can fail kubectl with SIGPIPE.
kubectl api-resources >api-resources.txt
head api-resources.txt >&2

t0=$(now_ms)
kubectl create namespace smoke >&2
sa_exists() { kubectl -n smoke get serviceaccount default; }
wait_for "the default ServiceAccount (serviceaccount controller)" 60 2 sa_exists
log "namespace smoke got its default ServiceAccount after $(($(now_ms) - t0)) ms"

t0=$(now_ms)
kubectl -n smoke create deployment web --image=registry.invalid/none:1 >&2
pod_unschedulable() {
  kubectl -n smoke get pods -l app=web \
    -o jsonpath='{.items[0].status.conditions[?(@.type=="PodScheduled")].reason}' |
    grep -qx Unschedulable
}
wait_for "a pod of the deployment marked Unschedulable (deployment/replicaset controllers + scheduler)" 60 3 pod_unschedulable
log "deployment -> replicaset -> pod -> Unschedulable after $(($(now_ms) - t0)) ms"
kubectl -n smoke get deploy,rs,pods >&2
kubectl -n smoke get pods -l app=web \
  -o jsonpath='{.items[0].status.conditions[?(@.type=="PodScheduled")].message}{"\n"}' >&2

log "OK"
