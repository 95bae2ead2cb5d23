#!/usr/bin/env bash
# The README's cluster path on this machine (`make cluster-demo`): a real single-node cluster
# (tools/cluster.sh up), the three images built from target/release and imported, `helm install`
# of charts/foresight, MNIST-5k put on the example's claim as its comments say,
# `kubectl apply -f examples/mnist-dcasgd-cluster.yaml`, `kubectl get tj -w` until the job ends,
# and the final model copied from its claim to $OUT/model-final.safetensors.
#
# The cluster is taken down at the end (the host put back as it was) unless KEEP_CLUSTER=1: then
# KUBECONFIG=~/.cache/foresight/cluster/admin.kubeconfig reaches it and `make cluster-down` ends it.
# Environment: RELEASE_DIR (default <repo>/target/release), OUT (default <repo>/out/cluster-demo).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
release=${RELEASE_DIR:-$repo/target/release}
out=${OUT:-$repo/out/cluster-demo}
log() { printf '[cluster-demo] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
CP_BIN=$("$repo/tools/build-control-plane.sh" | tail -n1)
NODE_BIN=$("$repo/tools/build-node.sh" | tail -n1)
HELM=$("$repo/tools/build-helm-tools.sh" | tail -n1)/helm
export CONTROL_PLANE_BIN=$CP_BIN NODE_BIN
export KUBECONFIG=${FORESIGHT_CLUSTER_DIR:-${FORESIGHT_CACHE:-$HOME/.cache/foresight}/cluster}/admin.kubeconfig
kubectl() { "$CP_BIN/kubectl" "$@"; }
cluster() { "$repo/tools/cluster.sh" "$@"; }
mkdir -p "$out"
rm -f "$out/model-final.safetensors"

if [[ ${KEEP_CLUSTER:-0} != 1 ]]; then
  trap 'rc=$?; log "taking the cluster down (KEEP_CLUSTER=1 keeps it)"; cluster down || rc=1; exit $rc' EXIT
fi
cluster up
mapfile -t built < <(RELEASE_DIR=$release "$repo/tools/build-images.sh")
for line in "${built[@]}"; do
  read -r name ref archive <<<"$line"
  log "importing $name ($ref)"
  cluster import "$archive"
done

log "helm install foresight charts/foresight -n foresight-system --create-namespace"
"$HELM" upgrade --install foresight "$repo/charts/foresight" -n foresight-system --create-namespace --wait

ex=$repo/examples/mnist-dcasgd-cluster.yaml
kubectl delete tj mnist-dcasgd --ignore-not-found --wait=true
log "MNIST-5k onto the claim, as the example's comments say (the node's busybox image for busybox:1.37)"
kubectl apply -f "$ex" -l foresight.dev/example-data=mnist5k
kubectl wait --for=jsonpath='{.status.phase}'=Bound pvc/mnist5k --timeout=120s
busybox=localhost/busybox:1.35
kubectl delete pod mnist5k-loader --ignore-not-found --wait=true
kubectl run mnist5k-loader --image=$busybox --restart=Never --overrides='{"spec":{
  "containers":[{"name":"l","image":"'$busybox'","imagePullPolicy":"Never","command":["sleep","600"],
  "volumeMounts":[{"name":"d","mountPath":"/data/mnist5k"}]}],
  "volumes":[{"name":"d","persistentVolumeClaim":{"claimName":"mnist5k"}}]}}'
kubectl wait --for=condition=Ready pod/mnist5k-loader --timeout=120s
kubectl cp "$repo/data/mnist5k/mnist_5k.csv.gz" mnist5k-loader:/data/mnist5k/mnist_5k.csv.gz
kubectl delete pod mnist5k-loader --grace-period=1

log "kubectl apply -f examples/mnist-dcasgd-cluster.yaml; kubectl get tj -w"
kubectl apply -f "$ex"
kubectl get tj -w &
watch=$!
phase=""
until [[ $phase == Succeeded || $phase == Failed ]]; do
  sleep 1
  phase=$(kubectl get tj mnist-dcasgd -o jsonpath='{.status.phase}')
done
sleep 1 # the watch prints the last change
kill "$watch" 2>/dev/null || true
wait "$watch" 2>/dev/null || true
kubectl describe tj mnist-dcasgd | sed -n '/^Status:/,$p'
[[ $phase == Succeeded ]] || die "the job $phase"

# The final model, where the job's status says it is: a file on a claim that outlives the
# parameter server (the example's output claim). Read from the volume's directory on this node.
claim=$(kubectl get tj mnist-dcasgd -o jsonpath='{.status.finalModel.claimName}')
file=$(kubectl get tj mnist-dcasgd -o jsonpath='{.status.finalModel.path}')
[[ -n $claim && -n $file ]] || die "the job's status names no final model on a claim (status.finalModel: claim '$claim', path '$file')"
pv=$(kubectl get pvc "$claim" -o jsonpath='{.spec.volumeName}')
dir=$(kubectl get pv "$pv" -o jsonpath='{.spec.local.path}{.spec.hostPath.path}')
cp "$dir/$file" "$out/model-final.safetensors"
log "the final model: $out/model-final.safetensors ($(stat -c %s "$out/model-final.safetensors") bytes), from claim $claim, file $file (status.finalModel)"
