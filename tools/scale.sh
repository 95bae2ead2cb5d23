#!/usr/bin/env bash
# Scale run on the real single-node cluster (`make scale`; not part of `make test`): N
# TrainingJobs (default 10) of W workers each (default 4) applied at once, a small model (mlp,
# MNIST-5k, 1 epoch), all must Succeed. Measured and written as a markdown table to
# docs/benchmarks.md (section "Scale on the real cluster", between its markers):
#
# - apply → Running and apply → Succeeded per job, p50 and p99 (nearest rank: with 10 jobs the
#   p99 is the slowest job). The times are the host's clock when `kubectl get tj -w` (started
#   before the apply) printed the phase, minus the host's clock just before the one
#   `kubectl apply` of all N jobs.
# - the operator's reconciles in the run and their p50/p99 duration: the difference of its
#   `foresight_operator_reconcile_seconds` histogram (read from the operator pod's /metrics over
#   the bridge) before the apply and after the last job's PS is gone, interpolated inside the
#   buckets as histogram_quantile does;
# - API requests per job: kube-apiserver's `apiserver_request_total` has no client label, so
#   the script gives the operator's ServiceAccount a FlowSchema of its own (`foresight-operator`,
#   the same priority level as the default `service-accounts` schema it would fall into) and
#   reads the API server's own count of the requests it dispatched for it,
#   `apiserver_flowcontrol_dispatched_requests_total{flow_schema="foresight-operator"}`, after
#   minus before, divided by N. The operator's background traffic (leader-election renewals) is
#   measured over IDLE_S seconds before the apply and subtracted (both figures are printed).
#
# Environment: RELEASE_DIR (default <repo>/target/release), SCALE_JOBS (10), SCALE_WORKERS (4),
# SCALE_DOC (default docs/benchmarks.md; empty: do not write), OUT (default <repo>/out/scale),
# KEEP_CLUSTER=1 leaves the cluster up (a running cluster is reused either way).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
release=${RELEASE_DIR:-$repo/target/release}
data=${DATA_DIR:-$repo/data/mnist5k}
out=${OUT:-$repo/out/scale}
jobs=${SCALE_JOBS:-10}
workers=${SCALE_WORKERS:-4}
idle_s=${IDLE_S:-30}
doc=${SCALE_DOC-$repo/docs/benchmarks.md}
ns=scale
t0=$SECONDS
log() { printf '[scale t=%ss] %s\n' "$((SECONDS - t0))" "$*" >&2; }
fail() { log "FAILED: $*"; exit 1; }
CP_BIN=$("$repo/tools/build-control-plane.sh" | tail -n1)
NODE_BIN=$("$repo/tools/build-node.sh" | tail -n1)
HELM=$("$repo/tools/build-helm-tools.sh" | tail -n1)/helm
export CONTROL_PLANE_BIN=$CP_BIN NODE_BIN
export KUBECONFIG=${FORESIGHT_CLUSTER_DIR:-${FORESIGHT_CACHE:-$HOME/.cache/foresight}/cluster}/admin.kubeconfig
kc() { "$CP_BIN/kubectl" "$@"; }
rm -rf "$out"
mkdir -p "$out"
watch_pid=""
finish() {
  local rc=$?
  trap - EXIT
  [[ -z $watch_pid ]] || kill $watch_pid 2>/dev/null || true
  if ((rc)); then
    kc get tj,pods -A -o wide >&2 2>/dev/null || true
    kc -n foresight-system logs -l app.kubernetes.io/name=foresight --tail=50 >&2 2>/dev/null || true
  fi
  if [[ ${KEEP_CLUSTER:-0} == 1 ]]; then
    log "KEEP_CLUSTER=1: the cluster stays up (tools/cluster.sh down)"
  else
    "$repo/tools/cluster.sh" down || rc=1
  fi
  exit $rc
}
trap finish EXIT

# The cluster, the images and the operator, as tools/e2e.sh sets them up.
"$repo/tools/cluster.sh" up
kc delete ns --ignore-not-found --wait=true $ns >&2
mapfile -t built < <(RELEASE_DIR=$release IMAGES="operator ps worker" "$repo/tools/build-images.sh")
((${#built[@]} == 3)) || fail "build-images.sh built ${#built[@]} images"
for line in "${built[@]}"; do
  read -r _ _ archive <<<"$line"
  "$repo/tools/cluster.sh" import "$archive"
done
"$HELM" upgrade --install foresight "$repo/charts/foresight" -n foresight-system --create-namespace \
  --wait --timeout 300s >&2
kc -n foresight-system rollout status deploy/foresight --timeout=120s >&2

# The operator's requests, counted apart by the API server's flow control.
kc apply -f - >&2 <<'EOF'
apiVersion: flowcontrol.apiserver.k8s.io/v1
kind: FlowSchema
metadata: {name: foresight-operator}
spec:
  matchingPrecedence: 500
  priorityLevelConfiguration: {name: workload-low}
  distinguisherMethod: {type: ByUser}
  rules:
    - subjects: [{kind: ServiceAccount, serviceAccount: {name: foresight, namespace: foresight-system}}]
      resourceRules: [{verbs: ["*"], apiGroups: ["*"], resources: ["*"], clusterScope: true, namespaces: ["*"]}]
      nonResourceRules: [{verbs: ["*"], nonResourceURLs: ["*"]}]
EOF
api_requests() {
  kc get --raw /metrics | awk '/^apiserver_flowcontrol_dispatched_requests_total\{/ && /flow_schema="foresight-operator"/ { n += $NF } END { printf "%d\n", n }'
}
operator_metrics() {
  local ip
  ip=$(kc -n foresight-system get pods -l app.kubernetes.io/name=foresight,app.kubernetes.io/component=operator \
    -o jsonpath='{.items[?(@.status.phase=="Running")].status.podIP}')
  curl -fsS --max-time 5 "http://$ip:8080/metrics"
}

# MNIST-5k on one claim that all N jobs mount read-only (the provisioner's claims are shared).
kc create namespace $ns >&2
kc -n $ns apply -f "$repo/examples/mnist-dcasgd-cluster.yaml" -l foresight.dev/example-data=mnist5k >&2
kc -n $ns wait --for=jsonpath='{.status.phase}'=Bound pvc/mnist5k --timeout=120s >&2
busybox=localhost/busybox:1.35
kc -n $ns run loader --image=$busybox --restart=Never --overrides='{"spec":{
  "containers":[{"name":"l","image":"'$busybox'","imagePullPolicy":"Never","command":["sleep","600"],
  "volumeMounts":[{"name":"d","mountPath":"/data/mnist5k"}]}],
  "volumes":[{"name":"d","persistentVolumeClaim":{"claimName":"mnist5k"}}]}}' >&2
kc -n $ns wait --for=condition=Ready pod/loader --timeout=120s >&2
kc -n $ns cp "$data/mnist_5k.csv.gz" loader:/data/mnist5k/mnist_5k.csv.gz
kc -n $ns delete pod loader --grace-period=1 >&2
log "MNIST-5k on claim mnist5k in namespace $ns"

for i in $(seq "$jobs"); do
  cat <<EOF
---
apiVersion: foresight.dev/v1alpha1
kind: TrainingJob
metadata: {name: scale-$i, namespace: $ns}
spec:
  model: {name: mlp}
  dataset:
    format: csv
    path: /data/mnist5k
    holdout: 0.2
    volume: {name: mnist5k, persistentVolumeClaim: {claimName: mnist5k, readOnly: true}}
  training: {epochs: 1, batchSize: 32, learningRate: 0.1, seed: $i}
  optimizer: {algorithm: dc-asgd-a, lambda0: 2.0, meanSquareDecay: 0.95}
  workers: {replicas: $workers}
EOF
done >"$out/jobs.yaml"

# Before: the operator's background request rate, then its counters.
idle0=$(api_requests)
sleep "$idle_s"
req0=$(api_requests)
operator_metrics >"$out/operator-before.txt" || fail "the operator's /metrics"
# Every phase change with the host's time, from a watch started before the apply.
# (Through a fifo, so that both processes' ids are known and both end.)
mkfifo "$out/watch.fifo"
while read -r n p; do printf '%s %s %s\n' "$(date +%s.%N)" "$n" "$p"; done <"$out/watch.fifo" >"$out/phases.txt" &
watch_pid=$!
kc -n $ns get tj --watch -o 'custom-columns=NAME:.metadata.name,PHASE:.status.phase' --no-headers \
  >"$out/watch.fifo" 2>"$out/watch.err" &
watch_pid="$watch_pid $!"
sleep 1 # the watch's initial (empty) list
applied=$(date +%s.%N)
kc apply -f "$out/jobs.yaml" >&2
log "applied $jobs TrainingJobs × $workers workers"

deadline=$((SECONDS + 1800))
while :; do
  n_ok=$(awk '$3 == "Succeeded" { s[$2] = 1 } END { print length(s) }' "$out/phases.txt")
  failed=$(awk '$3 == "Failed" { print $2 }' "$out/phases.txt" | sort -u | paste -sd' ')
  [[ -z $failed ]] || fail "Failed: $failed"
  ((n_ok == jobs)) && break
  ((SECONDS < deadline)) || fail "only $n_ok of $jobs Succeeded in 1800s"
  sleep 1
done
done_at=$(date +%s.%N)
log "all $jobs Succeeded ($(awk -v a="$applied" -v b="$done_at" 'BEGIN { printf "%.0f", b - a }') s after the apply)"
# The operator's work on a job ends when its PS is gone (finalize, Deployment and Service removed).
for _ in $(seq 240); do
  [[ -z $(kc -n $ns get pods -l app.kubernetes.io/component=parameter-server -o name) ]] && break
  sleep 0.5
done
[[ -z $(kc -n $ns get pods -l app.kubernetes.io/component=parameter-server -o name) ]] || fail "PS pods left"
# ... and its requests stop: the count read until it holds still for 5 s (bounded).
prev=-1 req1=$(api_requests)
for _ in $(seq 12); do
  ((req1 == prev)) && break
  prev=$req1
  sleep 5
  req1=$(api_requests)
done
end=$(date +%s.%N)
((req1 > req0)) || fail "no request of the operator counted under the FlowSchema ($req0 → $req1)"
operator_metrics >"$out/operator-after.txt" || fail "the operator's /metrics"
kill $watch_pid 2>/dev/null || true
watch_pid=""
kc -n $ns get tj -o wide >"$out/tj.txt"
cat "$out/tj.txt" >&2

python3 - "$out" "$applied" "$end" "$jobs" "$workers" "$idle0" "$req0" "$req1" "$idle_s" "${doc:-}" <<'EOF'
import math, re, sys
out, applied, end, jobs, workers, idle0, req0, req1, idle_s, doc = sys.argv[1:]
applied, end, idle_s = float(applied), float(end), float(idle_s)
jobs, workers, idle0, req0, req1 = map(int, (jobs, workers, idle0, req0, req1))

first = {}
for line in open(f"{out}/phases.txt"):
    t, name, phase = line.split()
    first.setdefault((name, phase), float(t))
names = sorted({n for n, _ in first}, key=lambda n: int(n.split("-")[-1]))
assert len(names) == jobs, names

def nearest_rank(xs, q):
    xs = sorted(xs)
    return xs[max(0, math.ceil(q * len(xs)) - 1)]

running = [first[(n, "Running")] - applied for n in names if (n, "Running") in first]
succeeded = [first[(n, "Succeeded")] - applied for n in names]
assert len(running) == jobs, f"Running seen for {len(running)} of {jobs}"

def histogram(path, name):
    b, s, c = {}, 0.0, 0.0
    for line in open(path):
        m = re.match(rf"{name}_bucket\{{.*le=\"([^\"]+)\".*\}} (\S+)", line)
        if m:
            b[float(m.group(1))] = float(m.group(2))
        elif line.startswith(f"{name}_sum"):
            s = float(line.split()[-1])
        elif line.startswith(f"{name}_count"):
            c = float(line.split()[-1])
    return b, s, c

def quantile(q, buckets):
    """histogram_quantile: linear inside the bucket the rank falls in."""
    les = sorted(buckets)
    total = buckets[les[-1]]
    rank, prev_le, prev_n = q * total, 0.0, 0.0
    for le in les:
        if buckets[le] >= rank:
            if math.isinf(le):
                return prev_le
            return prev_le + (le - prev_le) * (rank - prev_n) / max(buckets[le] - prev_n, 1e-12)
        prev_le, prev_n = le, buckets[le]
    return les[-2]

h = "foresight_operator_reconcile_seconds"
b0, s0, c0 = histogram(f"{out}/operator-before.txt", h)
b1, s1, c1 = histogram(f"{out}/operator-after.txt", h)
delta = {le: b1[le] - b0.get(le, 0.0) for le in b1}
reconciles = c1 - c0
errors = 0.0
reasons = {}  # foresight_operator_reconcile_errors_total by reason, after less before
for path, sign in ((f"{out}/operator-after.txt", 1), (f"{out}/operator-before.txt", -1)):
    for line in open(path):
        if line.startswith('foresight_operator_reconciles_total{result="error"}'):
            errors += sign * float(line.split()[-1])
        elif line.startswith('foresight_operator_reconcile_errors_total{reason="'):
            reason = line.split('"')[1]
            reasons[reason] = reasons.get(reason, 0.0) + sign * float(line.split()[-1])
why = ", ".join(f"{r} {n:.0f}" for r, n in sorted(reasons.items()) if n > 0)

def sample(path, name):
    """A sample without labels, e.g. the operator's process_resident_memory_bytes."""
    for line in open(path):
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return float("nan")

rss = [sample(f"{out}/operator-{w}.txt", "process_resident_memory_bytes") / 2**20 for w in ("before", "after")]
cpu = sample(f"{out}/operator-after.txt", "process_cpu_seconds_total") - \
    sample(f"{out}/operator-before.txt", "process_cpu_seconds_total")
idle_rate = (req0 - idle0) / idle_s
gross = req1 - req0
net = gross - idle_rate * (end - applied)
rows = [
    ("TrainingJobs × workers", f"{jobs} × {workers} (mlp, MNIST-5k, 1 epoch, dc-asgd-a)"),
    ("all Succeeded", f"yes, {max(succeeded):.0f} s after the apply"),
    ("apply → Running p50 / p99", f"{nearest_rank(running, .5):.1f} s / {nearest_rank(running, .99):.1f} s"),
    ("apply → Succeeded p50 / p99", f"{nearest_rank(succeeded, .5):.1f} s / {nearest_rank(succeeded, .99):.1f} s"),
    ("operator reconciles (errors)", f"{reconciles:.0f} ({errors:.0f}{': ' + why if why else ''}), "
                                     f"{reconciles / jobs:.0f} per job"),
    ("operator reconcile p50 / p99", f"{quantile(.5, delta) * 1000:.1f} ms / {quantile(.99, delta) * 1000:.1f} ms "
                                     f"(mean {(s1 - s0) / max(reconciles, 1) * 1000:.1f} ms)"),
    ("operator API requests per job", f"{net / jobs:.1f} ({gross} in all, less {idle_rate:.2f}/s of "
                                      f"background × {end - applied:.0f} s, over {jobs})"),
    ("operator resident memory before / after", f"{rss[0]:.1f} MiB / {rss[1]:.1f} MiB "
                                                f"({(rss[1] - rss[0]) / jobs * 1024:.0f} KiB per job)"),
    ("operator CPU over the run", f"{cpu:.1f} s ({cpu / jobs:.2f} s per job)"),
]
table = "| measure | value |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in rows)
print(table)
with open(f"{out}/table.md", "w") as f:
    f.write(table)
if doc:
    text = open(doc).read()
    start, stop = "<!-- scale:begin (tools/scale.sh writes this table) -->", "<!-- scale:end -->"
    block = f"{start}\n{table}{stop}"
    if start in text:
        text = re.sub(re.escape(start) + ".*?" + re.escape(stop), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    open(doc, "w").write(text)
    print(f"scale: table written to {doc}", file=sys.stderr)
EOF
log "done"
