#!/usr/bin/env bash
# Smoke check of the real node, down the user's path as far as it goes:
#
#   1. tools/cluster.sh up (real kubelet, containerd, CNI, kube-proxy, CoreDNS);
#   2. tools/build-images.sh, then the images imported with `ctr -n k8s.io images import`;
#   3. `helm install` of charts/foresight with those images (the chart's default repositories
#      and appVersion tag; pullPolicy IfNotPresent finds them on the node): the operator runs as
#      a pod with the chart's ServiceAccount and RBAC, and must become Ready;
#   4. examples/mnist-dcasgd-cluster.yaml: the claim first (bound by local-path-provisioner);
#      MNIST-5k put on it as the example's comments say (a loader pod, `kubectl cp`), with the
#      node's busybox image for busybox:1.37; then the TrainingJob, watched until
#      Succeeded/Failed (workers reach the PS through its Service name, resolved by CoreDNS);
#   5. tools/cluster.sh down (also on failure), which diffs the host against its snapshot.
#
# Environment: RELEASE_DIR (the workspace's release binaries, default <repo>/target/release),
# CONTROL_PLANE_BIN, NODE_BIN, HELM (default: tools/build-helm-tools.sh's), JOB_TIMEOUT
# (seconds, default 900), DATA_DIR (MNIST-5k, default <repo>/data/mnist5k), KEEP_CLUSTER=1
# leaves the cluster up.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
log() { printf '[smoke-node] %s\n' "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }
step_t0=$SECONDS
step() { log "---- $* (t=$((SECONDS - step_t0))s)"; }

cluster() { "$repo/tools/cluster.sh" "$@"; }
k() { cluster kubectl "$@"; }
if [[ ${KEEP_CLUSTER:-0} != 1 ]]; then
  trap 'rc=$?; step "cluster down"; cluster down || rc=1; exit $rc' EXIT
fi

step "cluster up"
t=$SECONDS
cluster up
log "cluster up took $((SECONDS - t))s"
k get nodes -o wide >&2
k get node foresight-node -o jsonpath='capacity: {.status.capacity}{"\n"}' >&2

step "images"
t=$SECONDS
release=${RELEASE_DIR:-$repo/target/release}
if [[ -z ${IMAGES:-} ]]; then
  IMAGES=""
  if [[ -x $release/foresight ]]; then IMAGES+=" operator"; else log "no $release/foresight: no operator image"; fi
  if [[ -x $release/foresight-ps ]]; then IMAGES+=" ps"; else log "no $release/foresight-ps: no PS image"; fi
  if [[ -x $release/foresight-worker ]]; then IMAGES+=" worker"; else log "no $release/foresight-worker: no worker image"; fi
fi
export IMAGES
mapfile -t built < <("$repo/tools/build-images.sh")
log "build-images took $((SECONDS - t))s"
t=$SECONDS
for line in "${built[@]}"; do
  read -r name ref archive <<<"$line"
  t1=$SECONDS
  cluster import "$archive"
  log "imported $name ($ref, $(du -h "$archive" | cut -f1)) in $((SECONDS - t1))s"
done
log "imports took $((SECONDS - t))s"

step "the PS behind a Service, reached by name from another pod"
# The PS image as a Deployment + Service; the client is foresight-loadgen (the workspace's PS
# load generator: simulated workers speaking the PS protocol) in a throwaway image on the same
# base, run as a Job that reaches the PS as ps-smoke.default.svc.cluster.local (CoreDNS).
ps_ref=$(printf '%s\n' "${built[@]}" | awk '$1 == "ps" { print $2 }')
if [[ -n $ps_ref && -x $release/foresight-loadgen ]]; then
  cache=${FORESIGHT_CACHE:-$HOME/.cache/foresight}
  export CONTAINERS_CONF=$cache/images/containers.conf
  bah() { buildah --root "$cache/images/storage/root" --runroot "$cache/images/storage/run" --storage-driver overlay "$@"; }
  base=$(bah images --format '{{.Name}}:{{.Tag}}' | awk '/foresight-base:/ && !n++')
  c=$(bah from --quiet --pull=never "$base")
  bah copy --quiet "$c" "$release/foresight-loadgen" /usr/local/bin/foresight-loadgen
  bah config --entrypoint '["/usr/local/bin/foresight-loadgen"]' "$c"
  bah commit --quiet --rm "$c" localhost/foresight-loadgen:smoke >/dev/null
  rm -f "$cache/images/archives/loadgen-smoke.tar"
  bah push --quiet localhost/foresight-loadgen:smoke "docker-archive:$cache/images/archives/loadgen-smoke.tar:localhost/foresight-loadgen:smoke"
  if mountpoint -q "$cache/images/storage/root/overlay"; then umount "$cache/images/storage/root/overlay"; fi
  cluster import "$cache/images/archives/loadgen-smoke.tar"
  t=$SECONDS
  k apply -f - >&2 <<EOF
apiVersion: apps/v1
kind: Deployment
metadata: {name: ps-smoke}
spec:
  selector: {matchLabels: {app: ps-smoke}}
  template:
    metadata: {labels: {app: ps-smoke}}
    spec:
      securityContext: {runAsNonRoot: true}
      containers:
      - name: ps
        image: $ps_ref
        imagePullPolicy: IfNotPresent
        args: [--workers, "2", --allow-unauthenticated, --job-name, smoke]
        ports: [{containerPort: 8080}]
        readinessProbe: {httpGet: {path: /readyz, port: 8080}, periodSeconds: 1}
---
apiVersion: v1
kind: Service
metadata: {name: ps-smoke}
spec:
  selector: {app: ps-smoke}
  ports: [{port: 8080}]
EOF
  k rollout status deploy/ps-smoke --timeout=120s >&2
  log "PS Deployment ready after $((SECONDS - t))s"
  # The Service answers once its EndpointSlice lists the ready pod and kube-proxy has synced;
  # before that, connections are refused (seen once). Wait for the slice; the Job's retries
  # cover kube-proxy's sync.
  for _ in $(seq 120); do
    ready=$(k get endpointslice -l kubernetes.io/service-name=ps-smoke \
      -o jsonpath='{.items[*].endpoints[*].conditions.ready}' 2>/dev/null || true)
    [[ $ready == *true* ]] && break
    sleep 0.5
  done
  [[ $ready == *true* ]] || die "the ps-smoke Service never listed a ready endpoint"
  k apply -f - >&2 <<EOF
apiVersion: batch/v1
kind: Job
metadata: {name: ps-client}
spec:
  backoffLimit: 3
  template:
    spec:
      restartPolicy: Never
      securityContext: {runAsNonRoot: true}
      containers:
      - name: loadgen
        image: localhost/foresight-loadgen:smoke
        imagePullPolicy: Never
        args: [--ps, "http://ps-smoke.default.svc.cluster.local:8080", --workers, "2", --params, "100000", --steps, "50", --finalize]
EOF
  if k wait --for=condition=Complete job/ps-client --timeout=180s >&2; then
    log "a pod reached the PS by its Service name: $((SECONDS - t))s from apply"
    k logs job/ps-client --tail=15 >&2
    k logs deploy/ps-smoke --tail=5 >&2
  else
    k describe job/ps-client >&2
    k logs job/ps-client --tail=30 >&2 || true
    die "the PS client Job did not complete"
  fi
  k delete job/ps-client deploy/ps-smoke svc/ps-smoke --wait=false >&2
else
  log "skipped: no PS image or no $release/foresight-loadgen"
fi

step "helm install"
printf '%s\n' "${built[@]}" | grep -q '^operator ' || die "no operator image: the path stops before helm install"
helm=${HELM:-$("$repo/tools/build-helm-tools.sh" | tail -n1)/helm}
export KUBECONFIG=${FORESIGHT_CLUSTER_DIR:-${FORESIGHT_CACHE:-$HOME/.cache/foresight}/cluster}/admin.kubeconfig
t=$SECONDS
"$helm" install foresight "$repo/charts/foresight" --namespace foresight-system --create-namespace \
  --wait --timeout 180s >&2 || {
  k -n foresight-system get pods -o wide >&2
  k -n foresight-system describe pods >&2
  k -n foresight-system logs -l app.kubernetes.io/name=foresight --tail=50 >&2 || true
  die "helm install: the operator did not become Ready"
}
log "helm install --wait took $((SECONDS - t))s"
k -n foresight-system get deploy,pods -o wide >&2

step "MNIST-5k on a claim"
ex=$repo/examples/mnist-dcasgd-cluster.yaml
docs=$(mktemp -d)
python3 - "$ex" "$docs" <<'EOF'
import sys, re
text = open(sys.argv[1]).read()
parts = [p for p in re.split(r'^---\s*$', text, flags=re.M) if 'kind:' in p]
for i, p in enumerate(parts):
    open(f"{sys.argv[2]}/{i}.yaml", "w").write(p)
EOF
k apply -f "$docs/0.yaml" >&2
k wait --for=jsonpath='{.status.phase}'=Bound pvc/mnist5k --timeout=60s >&2
pv=$(k get pvc mnist5k -o jsonpath='{.spec.volumeName}')
log "claim mnist5k bound to $pv ($(k get pv "$pv" -o jsonpath='{.spec.storageClassName}'))"
# The example's own loader steps, with the node's busybox image (Debian's busybox-static) for
# busybox:1.37, which no registry can serve here.
t=$SECONDS
busybox=localhost/busybox:1.35
k run mnist5k-loader --image=$busybox --restart=Never --overrides='{"spec":{
  "containers":[{"name":"l","image":"'$busybox'","imagePullPolicy":"Never","command":["sleep","600"],
  "volumeMounts":[{"name":"d","mountPath":"/data/mnist5k"}]}],
  "volumes":[{"name":"d","persistentVolumeClaim":{"claimName":"mnist5k"}}]}}' >&2
k wait --for=condition=Ready pod/mnist5k-loader --timeout=60s >&2
k cp "${DATA_DIR:-$repo/data/mnist5k}/mnist_5k.csv.gz" mnist5k-loader:/data/mnist5k/mnist_5k.csv.gz >&2
k exec mnist5k-loader -- ls -l /data/mnist5k >&2
k delete pod mnist5k-loader --grace-period=1 >&2
log "MNIST-5k on the claim with kubectl run/cp/exec in $((SECONDS - t))s"

step "TrainingJob"
t=$SECONDS
k apply -f "$docs/1.yaml" >&2
last=""
deadline=$((SECONDS + ${JOB_TIMEOUT:-900}))
while ((SECONDS < deadline)); do
  line=$(k get tj mnist-dcasgd --no-headers 2>&1 | tr -s ' ')
  if [[ $line != "$last" ]]; then log "t+$((SECONDS - t))s: $line"; last=$line; fi
  phase=$(k get tj mnist-dcasgd -o jsonpath='{.status.phase}' 2>/dev/null || true)
  [[ $phase == Succeeded || $phase == Failed ]] && break
  sleep 3
done
log "job ended as ${phase:-?} after $((SECONDS - t))s"
k get pods -o wide >&2
k describe tj mnist-dcasgd >&2 || true
worker=$(k get pods -o name | grep -m1 worker || true)
[[ -z $worker ]] || { log "logs of $worker:"; k logs "$worker" --tail=20 >&2 || true; }
k -n foresight-system logs deploy/foresight --tail=30 >&2 2>/dev/null || true
# What the claims the operator made hold (checkpoints, the final model), read on the host from
# the local PVs they bound.
for claim in $(k get pvc -o jsonpath='{range .items[*]}{.metadata.name}={.spec.volumeName}{"\n"}{end}'); do
  [[ ${claim%%=*} == mnist5k || -z ${claim#*=} ]] && continue
  path=$(k get pv "${claim#*=}" -o jsonpath='{.spec.local.path}{.spec.hostPath.path}')
  log "claim ${claim%%=*} (${claim#*=}):"
  find "$path" -mindepth 1 -maxdepth 3 -printf '  %P %s bytes\n' | head -n 20 >&2
done
k get pods -l app.kubernetes.io/component=parameter-server -o name 2>/dev/null | grep -q . &&
  log "a PS pod is still there after the job ended" || log "no PS pod after the job ended"
[[ $phase == Succeeded ]] || die "TrainingJob phase ${phase:-unknown}"
log "PASSED in $((SECONDS - step_t0))s"
