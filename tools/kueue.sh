#!/usr/bin/env bash
# Installs Kueue into a running test control plane and runs its manager on loopback until its
# stdin closes (the same life as tools/control-plane.sh):
#
#   - Kueue's CRDs, with the conversion webhook of the five that have one, and its mutating and
#     validating webhooks for its own kinds and batch/v1 Jobs, each pointed at
#     https://127.0.0.1:$WEBHOOK_PORT (the test control plane has no cluster network, so a
#     Service reference could not be reached);
#   - the kueue-system namespace and the Secret Kueue's internal certificate management keeps
#     its webhook certificate in, pre-filled with a CA and a serving certificate from openssl
#     that also names 127.0.0.1: Kueue validates and keeps them (it would otherwise make one
#     for its Service's DNS name only) and injects the CA into the webhooks and CRDs itself;
#   - the manager (from tools/build-kueue.sh) with the batch/job integration, no leader
#     election and no visibility API server (that one needs in-cluster credentials).
#
# Environment: BIN (directory of the kueue binary; its crds/ and webhook/ are next to it), KUBECTL,
# KUBECONFIG (an admin's), WORK (an empty directory: certificates, config, kueue.log),
# WEBHOOK_PORT, HEALTH_PORT, METRICS_PORT (free loopback ports). Prints READY, or FAILED and the
# reason (the log's last lines on stderr), then waits for EOF on stdin and stops the manager.
set -uo pipefail
log() { printf '[kueue] %s\n' "$*" >&2; }
pid=
teardown() {
  [[ -n $pid ]] || return 0
  kill "$pid" 2>/dev/null
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
}
fail() {
  log "FAILED: $*"
  [[ -f $WORK/kueue.log ]] && { log "---- last lines of kueue.log ----"; tail -n 30 "$WORK/kueue.log" >&2; }
  echo "FAILED $*"
  teardown
  exit 1
}
trap 'teardown; exit 143' TERM INT
k() { "$KUBECTL" --kubeconfig "$KUBECONFIG" "$@"; }
share=$(dirname "$BIN")
url=https://127.0.0.1:$WEBHOOK_PORT

cd "$WORK" || exit 1
mkdir -p certs
# The certificate controller keeps a Secret whose CA verifies as "kueue-ca" and whose serving
# certificate verifies for the Service's name, both valid for more than its 90-day lookahead,
# with PKCS#1 keys; anything else it replaces.
{
  openssl req -x509 -newkey rsa:2048 -nodes -days 365 -subj "/O=kueue/CN=kueue-ca" \
    -addext "subjectAltName=DNS:kueue-ca" -keyout ca.pkcs8 -out certs/ca.crt &&
  openssl rsa -in ca.pkcs8 -traditional -out ca.key &&
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kueue-webhook-service.kueue-system.svc" \
    -keyout tls.pkcs8 -out tls.csr &&
  printf '%s\n' 'keyUsage = digitalSignature, keyEncipherment' 'extendedKeyUsage = serverAuth' \
    'subjectAltName = IP:127.0.0.1, DNS:kueue-webhook-service.kueue-system.svc' >tls.ext &&
  openssl x509 -req -in tls.csr -CA certs/ca.crt -CAkey ca.pkcs8 -CAcreateserial -days 365 \
    -extfile tls.ext -out certs/tls.crt &&
  openssl rsa -in tls.pkcs8 -traditional -out certs/tls.key
} 2>openssl.log || fail "openssl: $(cat openssl.log)"

# The Workload CRD is over 1 MB: only a server-side apply takes it.
k apply --server-side -f "$share/crds" >/dev/null || fail "applying Kueue's CRDs"
t0=$SECONDS
until k get workloads.kueue.x-k8s.io,clusterqueues.kueue.x-k8s.io,localqueues.kueue.x-k8s.io,resourceflavors.kueue.x-k8s.io -A >/dev/null 2>&1; do
  ((SECONDS - t0 < 60)) || fail "Kueue's CRDs not served after 60s"
  sleep 0.2
done
conversion="{\"spec\":{\"conversion\":{\"strategy\":\"Webhook\",\"webhook\":{\"conversionReviewVersions\":[\"v1\"],\"clientConfig\":{\"url\":\"$url/convert\"}}}}}"
for crd in localqueues clusterqueues workloads cohorts multikueueclusters; do
  k patch crd "$crd.kueue.x-k8s.io" --type merge -p "$conversion" >/dev/null || fail "conversion webhook of $crd"
done

# Applied, not created: a cluster kept from an earlier run (the e2e's KEEP_CLUSTER=1) has them.
k create namespace kueue-system --dry-run=client -o yaml | k apply -f - >/dev/null || fail "namespace kueue-system"
k -n kueue-system create secret generic kueue-webhook-server-cert --from-file=certs/ca.crt \
  --from-file=ca.key --from-file=certs/tls.crt --from-file=certs/tls.key --dry-run=client -o yaml |
  k apply --server-side --force-conflicts -f - >/dev/null || fail "certificate Secret"
# Only the webhooks this manager serves (its own kinds, batch/v1 Jobs): the others would
# refuse every pod and Deployment with a 404.
k create --dry-run=client -o json -f "$share/webhook/manifests.yaml" | python3 -c '
import json, sys
url = sys.argv[1]
docs, text, i = [], sys.stdin.read(), 0
while i < len(text.strip()):
    obj, i = json.JSONDecoder().raw_decode(text, i)
    while i < len(text) and text[i].isspace():
        i += 1
    hooks = [h for h in obj["webhooks"]
             if "kueue-x-k8s-io" in h["clientConfig"]["service"]["path"]
             or "batch-v1-job" in h["clientConfig"]["service"]["path"]]
    for h in hooks:
        h["clientConfig"] = {"url": url + h["clientConfig"]["service"]["path"]}
    obj["webhooks"] = hooks
    obj["metadata"]["name"] = "kueue-" + obj["metadata"]["name"]
    docs.append(obj)
print(json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
' "$url" >webhooks.json || fail "rewriting the webhook configurations"
k apply -f webhooks.json >/dev/null || fail "applying the webhook configurations"

cat >config.yaml <<CONFIG
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
health:
  healthProbeBindAddress: 127.0.0.1:$HEALTH_PORT
metrics:
  bindAddress: 127.0.0.1:$METRICS_PORT
webhook:
  host: 127.0.0.1
  port: $WEBHOOK_PORT
  certDir: $WORK/certs
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: true
integrations:
  frameworks: ["batch/job"]
featureGates:
  VisibilityOnDemand: false
CONFIG

KUBECONFIG=$KUBECONFIG "$BIN/kueue" --config config.yaml </dev/null >kueue.log 2>&1 &
pid=$!
t0=$SECONDS
until curl -fsS "http://127.0.0.1:$HEALTH_PORT/readyz" >/dev/null 2>&1; do
  kill -0 "$pid" 2>/dev/null || fail "the manager exited early"
  ((SECONDS - t0 < 120)) || fail "the manager not ready after 120s"
  sleep 0.2
done
echo READY
cat >/dev/null
teardown
