#!/usr/bin/env bash
# Starts a throw-away Kubernetes control plane on loopback and keeps it until its stdin closes:
# etcd, kube-apiserver, kube-controller-manager (every controller but node-lifecycle) and
# kube-scheduler, with certificates from openssl, token auth and RBAC, plus one Node object,
# node-1 (32 CPUs, 128 Gi, 4 nvidia.com/gpu, Ready, untainted) that no kubelet runs. Services
# get addresses from 10.0.0.0/16 (a /24 holds 253: `make scale-many` at 1,000 jobs met "range is
# full").
#
# Environment: BIN (directory of the binaries, from build-control-plane.sh), WORK (an empty
# directory: certificates, admin.kubeconfig, logs, etcd data), ETCD_PORT, ETCD_PEER_PORT,
# API_PORT, KCM_PORT, SCHED_PORT (free loopback ports). Prints one line on stdout: READY, or
# FAILED and the reason (the logs' last lines go to stderr). Then it waits for EOF on stdin and
# stops everything (TERM, KILL after 5 s, newest first) and removes WORK unless
# KEEP_CONTROL_PLANE_TMP=1. Whoever holds the write end of its stdin decides its life: the
# operator's test harness (operator/tests/support) and tools/smoke-control-plane.sh.
set -uo pipefail
log() { printf '[control-plane] %s\n' "$*" >&2; }
pids=()
names=()
teardown() {
  local i
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill "${pids[i]}" 2>/dev/null
    for _ in $(seq 50); do kill -0 "${pids[i]}" 2>/dev/null || break; sleep 0.1; done
    kill -9 "${pids[i]}" 2>/dev/null
    wait "${pids[i]}" 2>/dev/null
  done
  if [[ ${KEEP_CONTROL_PLANE_TMP:-0} == 1 ]]; then log "kept $WORK"; else rm -rf "$WORK"; fi
}
fail() {
  log "FAILED: $*"
  for n in "${names[@]}"; do log "---- last lines of $n.log ----"; tail -n 30 "$WORK/$n.log" >&2; done
  echo "FAILED $*"
  teardown
  exit 1
}
trap 'teardown; exit 143' TERM INT
start() {
  local name=$1
  shift
  "$@" </dev/null >"$WORK/$name.log" 2>&1 &
  pids+=("$!")
  names+=("$name")
}
wait_for() { # what timeout_s index command...
  local what=$1 timeout=$2 idx=$3 t0=$SECONDS
  shift 3
  until "$@" >/dev/null 2>&1; do
    kill -0 "${pids[$idx]}" 2>/dev/null || fail "${names[$idx]} exited early"
    ((SECONDS - t0 < timeout)) || fail "$what not ready after ${timeout}s"
    sleep 0.2
  done
}

cd "$WORK" || exit 1
{
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=foresight-test-ca" -keyout ca.key -out ca.crt &&
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" -keyout apiserver.key -out apiserver.csr &&
  printf '%s\n' 'basicConstraints = CA:FALSE' 'keyUsage = digitalSignature, keyEncipherment' \
    'extendedKeyUsage = serverAuth' \
    'subjectAltName = IP:127.0.0.1, DNS:localhost, DNS:kubernetes, DNS:kubernetes.default, DNS:kubernetes.default.svc, IP:10.0.0.1' \
    >apiserver.ext &&
  openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
    -extfile apiserver.ext -out apiserver.crt &&
  openssl genrsa -out sa.key 2048 &&
  openssl rsa -in sa.key -pubout -out sa.pub
} 2>openssl.log || fail "openssl: $(cat openssl.log)"
admin_token=$(openssl rand -hex 16)
kcm_token=$(openssl rand -hex 16)
sched_token=$(openssl rand -hex 16)
cat >tokens.csv <<EOF
$admin_token,admin,admin,"system:masters"
$kcm_token,system:kube-controller-manager,kcm,"system:masters"
$sched_token,system:kube-scheduler,scheduler
EOF
kubeconfig() { # file token
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority: $WORK/ca.crt
users:
- name: user
  user:
    token: $2
contexts:
- name: test
  context: {cluster: test, user: user}
current-context: test
EOF
}
kubeconfig admin.kubeconfig "$admin_token"
kubeconfig kcm.kubeconfig "$kcm_token"
kubeconfig scheduler.kubeconfig "$sched_token"

start etcd "$BIN/etcd" --name test --data-dir "$WORK/etcd" \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster "test=http://127.0.0.1:$ETCD_PEER_PORT" \
  --unsafe-no-fsync --log-level warn
etcd_health() { curl -fsS "http://127.0.0.1:$ETCD_PORT/health" | grep -q '"health":"true"'; }
wait_for etcd 60 0 etcd_health

start kube-apiserver "$BIN/kube-apiserver" \
  --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
  --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$API_PORT" \
  --endpoint-reconciler-type none \
  --cert-dir "$WORK/apiserver-certs" \
  --tls-cert-file "$WORK/apiserver.crt" --tls-private-key-file "$WORK/apiserver.key" \
  --client-ca-file "$WORK/ca.crt" \
  --token-auth-file "$WORK/tokens.csv" \
  --authorization-mode RBAC \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --service-account-key-file "$WORK/sa.pub" \
  --service-account-signing-key-file "$WORK/sa.key" \
  --service-cluster-ip-range 10.0.0.0/16
wait_for kube-apiserver 120 1 "$BIN/kubectl" --kubeconfig "$WORK/admin.kubeconfig" get --raw /readyz

start kube-controller-manager "$BIN/kube-controller-manager" \
  --kubeconfig "$WORK/kcm.kubeconfig" \
  --authentication-kubeconfig "$WORK/kcm.kubeconfig" \
  --authorization-kubeconfig "$WORK/kcm.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port "$KCM_PORT" --cert-dir "$WORK/kcm-certs" \
  --service-account-private-key-file "$WORK/sa.key" \
  --root-ca-file "$WORK/ca.crt" \
  --service-cluster-ip-range 10.0.0.0/16 \
  --controllers '*,-node-lifecycle-controller' \
  --leader-elect=false
start kube-scheduler "$BIN/kube-scheduler" \
  --kubeconfig "$WORK/scheduler.kubeconfig" \
  --authentication-kubeconfig "$WORK/scheduler.kubeconfig" \
  --authorization-kubeconfig "$WORK/scheduler.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port "$SCHED_PORT" \
  --leader-elect=false
wait_for kube-controller-manager 120 2 curl -fsSk "https://127.0.0.1:$KCM_PORT/healthz"
wait_for kube-scheduler 120 3 curl -fsSk "https://127.0.0.1:$SCHED_PORT/healthz"

# The node the scheduler binds pods to; nothing runs on it.
k() { "$BIN/kubectl" --kubeconfig "$WORK/admin.kubeconfig" "$@"; }
k apply -f - >/dev/null <<EOF || fail "creating node-1"
apiVersion: v1
kind: Node
metadata:
  name: node-1
  labels: {kubernetes.io/hostname: node-1, kubernetes.io/os: linux}
EOF
k patch node node-1 --subresource=status --type=merge -p '{"status": {
  "capacity": {"cpu": "32", "memory": "128Gi", "pods": "110", "nvidia.com/gpu": "4"},
  "allocatable": {"cpu": "32", "memory": "128Gi", "pods": "110", "nvidia.com/gpu": "4"},
  "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "simulated"}]}}' \
  >/dev/null || fail "node-1 status"
# The TaintNodesByCondition admission plugin marks a new node not-ready; the node-lifecycle
# controller that would lift it is off.
k taint node node-1 node.kubernetes.io/not-ready:NoSchedule- >/dev/null || fail "untainting node-1"

echo READY
# Until the test binary ends (EOF on stdin, however it ends).
cat >/dev/null
teardown
