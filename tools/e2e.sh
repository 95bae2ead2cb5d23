#!/usr/bin/env bash
# End-to-end test on the real single-node cluster (tools/cluster.sh): the user's path and the
# failure paths, in real pods, each step an assertion that can fail. `make e2e` (and `make test`,
# after the cargo tests) runs it.
#
#   1. the cluster up (reused if it is already up), the images built (content-cached) and imported,
#      `helm install` of charts/foresight with them: the operator runs as a pod with the chart's RBAC;
#   2. concurrently, each in its own namespace, one cluster for all:
#      main         the README's path in `default`: MNIST-5k put on the example's claim as its
#                   comments say, `kubectl apply -f examples/mnist-dcasgd-cluster.yaml`; `kubectl
#                   get tj` goes Created → Running → Succeeded with the step and (-o wide) staleness columns
#                   filled and changing, a worker's log has progress lines, `kubectl describe tj`
#                   shows conditions and events, the job has its NetworkPolicy (the chart's
#                   networkPolicy.perJob), the PS is gone and model-final.safetensors is on
#                   the claim status.finalModel names (spec.output: no owner), and the last
#                   worker's termination message records that version; its held-out
#                   accuracy (foresight-worker evaluate) is within 2 pp of `foresight run`'s on
#                   the same training (examples/mnist-dcasgd.yaml); `kubectl delete tj` leaves it;
#                   Prometheus on the host (tools/cluster-prometheus.sh, Kubernetes service
#                   discovery relabelled as the chart's PodMonitor/ServiceMonitor) scraped the
#                   operator, the PS and the 4 workers (up = 1) and every query of the Grafana
#                   dashboard returns data for the job (scripts/render-dashboard.py --check);
#      unsched      a job asking for more nvidia.com/gpu than the node has (4): the status says
#                   Unschedulable with the scheduler's message; then `kubectl delete tj`: every
#                   child is gone;
#      badpath      a dataset path that does not exist: the worker exits 3, the Job's
#                   podFailurePolicy fails it, the TrainingJob is Failed with that reason;
#      ps-memory    a PS limited to 6 Mi, less than it starts in: it exits at every start
#                   saying so, and the job is Failed once it restarted more often than
#                   backoffLimit;
#      suspend      training.epochs changed mid-run: refused by the API server; suspended: worker
#                   pods gone, phase Suspended; the same change taken: the worker Job recreated
#                   with it (WorkersRecreated); the operator's pod is
#                   deleted meanwhile: the new one takes over with the same children (same UIDs,
#                   no duplicates); resumed: the job continues from where it was to Succeeded;
#      worker-kill  a worker pod of a job with local steps (localSteps 4, asgd outer step) deleted
#                   mid-run: its replacement resumes (its log says so), the PS counts more joins
#                   than workers and no stale_seq, the job Succeeds;
#      ps-kill      the PS serves TLS (the chart's psTls): its Service's name verified with the
#                   job's CA, no cleartext, the workers told https://; the PS pod deleted mid-run,
#                   with checkpoint storage: the new PS restores the
#                   checkpoint, the status says so (ParameterServerRestarted condition, reason
#                   RestoredCheckpoint, and a Warning event), the job Succeeds;
#      python       examples/python/mnist-cluster.yaml as its comments say, with 2 workers, 3
#                   epochs and the PS sharded over 2 pods: the script from a ConfigMap, run by the
#                   worker image (python, torch, foresight); a Deployment and a Service per shard;
#                   worker 0's pod deleted mid-run, the replacement resumes; Succeeded; the final
#                   model on the output claim (merged by shard 0 from both shards' slices: the
#                   model's own tensors) at ≥ 90 % held-out (foresight-worker);
#      kueue        Kueue's manager (tools/kueue.sh, on the host, started before the chart, which
#                   is installed with kueue.enabled): a ClusterQueue with CPU for one job at a
#                   time, two jobs labelled for it: the first is admitted and trains in real pods
#                   to Succeeded while the second waits Queued (Kueue's reason in its condition),
#                   then the second is admitted (after the first's Workload is Finished) and
#                   succeeds;
#      real-size    (opt-in: E2E_CASES=real-size, `make real-size-pod`) a 101M-parameter Python
#                   transformer, 2 workers, one PS pod under a memory limit; the PS pod deleted
#                   after a checkpoint: the new one restores it, passes its startup probe, is
#                   Ready with no restart; Succeeded;
#   3. `helm uninstall`: the operator is gone, the CRD (and the TrainingJobs) stay;
#   4. the cluster taken down (always, also on failure; tools/cluster.sh down diffs the host).
#
# On failure: the failing assertion, then the operator's logs, the TrainingJobs, pods and events
# of every namespace (also in out/e2e/). Every wait polls for the thing itself, with a generous
# bound that only a failure reaches.
#
# Environment: RELEASE_DIR (the workspace's binaries for the images; default
# <repo>/target/release), DATA_DIR (MNIST-5k, default <repo>/data/mnist5k), E2E_OUT (default
# <repo>/out/e2e), E2E_CASES (default "main unsched badpath ps-memory suspend worker-kill ps-kill python kueue"),
# E2E_DASHBOARD_PNG (draw the dashboard figure from the main case's Prometheus data there),
# KEEP_CLUSTER=1 leaves the cluster up (and a later run reuses it), E2E_LOCK_WAIT (seconds to
# wait for another e2e on this machine to end, default 3600).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
release=${RELEASE_DIR:-$repo/target/release}
data=${DATA_DIR:-$repo/data/mnist5k}
out=${E2E_OUT:-$repo/out/e2e}
cases=${E2E_CASES:-main unsched badpath ps-memory suspend worker-kill ps-kill python kueue}
t0=$SECONDS
exec 3>&2 # the terminal: case logs go to files, their log lines here too
case_name=""
log() {
  local line
  line=$(printf '[e2e%s t=%ss] %s' "${case_name:+ $case_name}" "$((SECONDS - t0))" "$*")
  printf '%s\n' "$line" >&2
  [[ -z $case_name ]] || printf '%s\n' "$line" >&3
}
fail() {
  log "FAILED: $*"
  # Said again as the run's last line (finish): CI shows only the tail of a long log.
  [[ -n $case_name ]] || failure=$*
  exit 1
}

# One e2e per machine at a time: every run uses the same node address, cluster directory and
# host state, so a second run would reuse the first one's cluster ("already up") and lose it
# when the first takes it down. The lock goes with this process (also when it is killed); the
# cluster's daemons and background children do not inherit it (`cluster` closes it for them).
cluster_dir=${FORESIGHT_CLUSTER_DIR:-${FORESIGHT_CACHE:-$HOME/.cache/foresight}/cluster}
mkdir -p "$(dirname "$cluster_dir")"
exec {lock_fd}>"$cluster_dir.e2e.lock"
if ! flock -n "$lock_fd"; then
  log "another e2e is running on this machine ($cluster_dir.e2e.lock): waiting for it to end"
  flock -w "${E2E_LOCK_WAIT:-3600}" "$lock_fd" || fail "the other e2e still holds $cluster_dir.e2e.lock"
fi
rm -rf "$out"
mkdir -p "$out"
for b in foresight foresight-ps foresight-worker; do
  [[ -x $release/$b ]] || fail "no $release/$b: build the workspace first (make e2e does)"
done
[[ -f $data/mnist_5k.csv.gz ]] || fail "no $data/mnist_5k.csv.gz: scripts/setup.sh extracts it"
CP_BIN=$("$repo/tools/build-control-plane.sh" | tail -n1)
NODE_BIN=$("$repo/tools/build-node.sh" | tail -n1)
HELM=$("$repo/tools/build-helm-tools.sh" | tail -n1)/helm
KUEUE_BIN=$("$repo/tools/build-kueue.sh" | tail -n1)
export CONTROL_PLANE_BIN=$CP_BIN NODE_BIN
export KUBECONFIG=$cluster_dir/admin.kubeconfig
kc() { "$CP_BIN/kubectl" "$@"; }
cluster() { "$repo/tools/cluster.sh" "$@" {lock_fd}>&-; }

# wait_for TIMEOUT_S WHAT COMMAND...: polls COMMAND until it succeeds; fails after TIMEOUT_S.
wait_for() {
  local limit=$1 what=$2
  shift 2
  local deadline=$((SECONDS + limit))
  until "$@"; do
    ((SECONDS < deadline)) || fail "timed out after ${limit}s waiting for: $what"
    sleep 0.5
  done
}
# log_has NS POD TEXT: whether POD's log has a line containing TEXT. The whole log is read:
# `kubectl logs | grep -q` (or `grep -m1`) stops reading at the first match, kubectl then dies of
# SIGPIPE while the PS keeps logging, and under pipefail that is a failure (an assignment from it
# ended a case without a word).
log_has() { kc -n "$1" logs "$2" 2>/dev/null | awk -v t="$3" 'index($0, t) {found = 1} END {exit !found}'; }
# first_log_line NS POD TEXT: the first line of POD's log containing TEXT (the whole log read).
first_log_line() { kc -n "$1" logs "$2" | awk -v t="$3" 'index($0, t) && !n++'; }
# field NS KIND/NAME JSONPATH: one field, empty when the object or the field is absent.
field() { kc -n "$1" get "$2" -o "jsonpath=$3" 2>/dev/null || true; }
phase_is() { [[ $(field "$1" "tj/$2" '{.status.phase}') == "$3" ]]; }
gone() { [[ -z $(kc -n "$1" get "$2" -o name --ignore-not-found 2>/dev/null) ]]; }
none_left() { [[ -z $(kc -n "$1" get "$2" -l "$3" -o name 2>/dev/null) ]]; }
condition() { field "$1" "tj/$2" "{.status.conditions[?(@.type==\"$3\")].$4}"; }
pods_of() { # NS JOB COMPONENT: names of the job's pods of that component
  kc -n "$1" get pods -l "foresight.dev/job=$2,app.kubernetes.io/component=$3" -o name 2>/dev/null || true
}
# The PS's /metrics, from the host (the node: pod IPs are on its bridge), unauthenticated.
ps_metrics() {
  local ip
  ip=$(kc -n "$1" get pods -l "foresight.dev/job=$2,app.kubernetes.io/component=parameter-server" \
    -o jsonpath='{range .items[?(@.status.phase=="Running")]}{.status.podIP}{"\n"}{end}' 2>/dev/null | awk 'NR == 1')
  # (The chart's psTls: HTTPS, whose per-job CA the PS's own check below verifies.)
  [[ -n $ip ]] && { curl -fsS --max-time 3 -k "https://$ip:8080/metrics" 2>/dev/null ||
    curl -fsS --max-time 3 "http://$ip:8080/metrics" 2>/dev/null; }
}
# NS NAME: the job's PS serves TLS with the certificate the operator issued for its Service's
# name, verified with the job's CA from its Secret, and no cleartext; the system's CAs do not
# vouch for it; the workers are told https://.
check_ps_tls() {
  local ns=$1 name=$2 secret ip host=$2-ps.$1.svc ca=$out/$2-ca.crt
  secret=$(kc -n "$ns" get secret -l "foresight.dev/job=$name" -o jsonpath='{range .items[?(@.type=="kubernetes.io/tls")]}{.metadata.name}{end}')
  [[ -n $secret ]] || fail "no kubernetes.io/tls Secret for tj/$name"
  kc -n "$ns" get secret "$secret" -o jsonpath='{.data.ca\.crt}' | base64 -d >"$ca"
  ip=$(kc -n "$ns" get pods -l "foresight.dev/job=$name,app.kubernetes.io/component=parameter-server" \
    -o jsonpath='{.items[?(@.status.phase=="Running")].status.podIP}' | awk '{ print $1 }')
  curl -fsS --max-time 5 --cacert "$ca" --resolve "$host:8080:$ip" "https://$host:8080/healthz" >/dev/null ||
    fail "the PS at $ip does not serve $host over TLS with the job's CA"
  if curl -fsS --max-time 5 "http://$ip:8080/healthz" >/dev/null 2>&1; then fail "the PS answers cleartext HTTP"; fi
  if curl -fsS --max-time 5 --resolve "$host:8080:$ip" "https://$host:8080/healthz" >/dev/null 2>&1; then
    fail "the system's CAs vouch for the PS's certificate"
  fi
  [[ $(field "$ns" "job/$name-workers" '{.spec.template.spec.containers[0].env[?(@.name=="FORESIGHT_PS_URL")].value}') == https://* ]] ||
    fail "the workers are not told an https:// URL"
  log "PS serves TLS (Secret $secret): $host verified with the job's CA ($(openssl x509 -noout -subject -in "$ca" | sed 's/^subject=//')); cleartext and the system's CAs refused; workers told https://"
}
metric() { # NAME [LABEL-FILTER]: value from stdin (a /metrics text), 0 when absent
  awk -v m="$1" -v f="${2:-}" '($1 == m || index($1, m "{") == 1) && index($1, f) { v = $NF } END { print v + 0 }'
}
ps_version() { ps_metrics "$1" "$2" | metric foresight_ps_model_version; }
version_at_least() { local v; v=$(ps_version "$1" "$2") && ((${v%.*} >= $3)); }
# The host path of a claim's volume (local-path-provisioner: a hostPath PV; local PVs: .local).
claim_dir() {
  local pv
  pv=$(field "$1" "pvc/$2" '{.spec.volumeName}')
  [[ -n $pv ]] && kc get pv "$pv" -o jsonpath='{.spec.local.path}{.spec.hostPath.path}'
}
# A safetensors file with at least one f32 tensor: its header parsed.
check_safetensors() {
  python3 - "$1" <<'EOF'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    (n,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(n))
tensors = {k: v for k, v in header.items() if k != "__metadata__"}
assert tensors and all(v["dtype"] == "F32" for v in tensors.values()), header
print(f"{len(tensors)} tensors: " + ", ".join(f"{k} {v['shape']}" for k, v in sorted(tensors.items())))
EOF
}

# MNIST-5k onto the example's claim in NS, as its comments tell users: the claim alone first,
# a loader pod, `kubectl cp`, the loader deleted. The node's busybox image stands in for
# busybox:1.37, which no registry can serve here.
load_mnist() {
  local ns=$1 busybox=localhost/busybox:1.35
  kc -n "$ns" apply -f "$repo/examples/mnist-dcasgd-cluster.yaml" -l foresight.dev/example-data=mnist5k
  [[ $(kc -n "$ns" get tj -o name 2>/dev/null) == "" ]] || fail "applying the claim alone created a TrainingJob"
  wait_for 120 "claim mnist5k Bound" eval '[[ $(field '"$ns"' pvc/mnist5k "{.status.phase}") == Bound ]]'
  kc -n "$ns" run mnist5k-loader --image=$busybox --restart=Never --overrides='{"spec":{
    "containers":[{"name":"l","image":"'$busybox'","imagePullPolicy":"Never","command":["sleep","600"],
    "volumeMounts":[{"name":"d","mountPath":"/data/mnist5k"}]}],
    "volumes":[{"name":"d","persistentVolumeClaim":{"claimName":"mnist5k"}}]}}'
  kc -n "$ns" wait --for=condition=Ready pod/mnist5k-loader --timeout=120s
  kc -n "$ns" cp "$data/mnist_5k.csv.gz" mnist5k-loader:/data/mnist5k/mnist_5k.csv.gz
  local size
  size=$(kc -n "$ns" exec mnist5k-loader -- stat -c %s /data/mnist5k/mnist_5k.csv.gz)
  [[ $size == $(stat -c %s "$data/mnist_5k.csv.gz") ]] || fail "the copy on the claim has $size bytes"
  kc -n "$ns" delete pod mnist5k-loader --grace-period=1 --wait=false
  log "MNIST-5k on claim mnist5k in $ns"
}

# A small TrainingJob on the claim mnist5k: NS NAME EPOCHS REPLICAS [EXTRA SPEC YAML, indented 2];
# $OPTIMIZER replaces its optimizer block.
small_job() {
  local default="{algorithm: dc-asgd-a, lambda0: 2.0, meanSquareDecay: 0.95}"
  local optimizer=${OPTIMIZER:-$default}
  kc -n "$1" apply -f - <<EOF
apiVersion: foresight.dev/v1alpha1
kind: TrainingJob
metadata: {name: $2}
spec:
  model: {name: mlp}
  dataset:
    format: csv
    path: /data/mnist5k
    holdout: 0.2
    volume: {name: mnist5k, persistentVolumeClaim: {claimName: mnist5k, readOnly: true}}
  training: {epochs: $3, batchSize: 32, learningRate: 0.1, seed: 1}
  optimizer: $optimizer
  workers: {replicas: $4}
${5:-}
EOF
}
# A one-epoch job with no data volume, for the cases whose pods never read data: NS NAME
# DATASET_PATH WORKERS [MORE SPEC LINES].
bare_job() {
  kc -n "$1" apply -f - <<EOF
apiVersion: foresight.dev/v1alpha1
kind: TrainingJob
metadata: {name: $2}
spec:
  model: {name: mlp}
  dataset: {format: csv, path: $3}
  training: {epochs: 1}
  workers: $4
${5:-}
EOF
}
# The job's children by kind, with their UIDs: one line per object.
children() {
  kc -n "$1" get deploy,svc,job,secret,pvc -l "foresight.dev/job=$2" \
    -o jsonpath='{range .items[*]}{.kind}/{.metadata.name} {.metadata.uid}{"\n"}{end}' | sort
}
operator_pod() {
  kc -n foresight-system get pods -l app.kubernetes.io/name=foresight \
    -o jsonpath='{range .items[?(@.status.phase=="Running")]}{.metadata.name}{"\n"}{end}' 2>/dev/null
}
operator_ready_pod_not() { # OLD: a Ready operator pod other than OLD
  local p
  p=$(kc -n foresight-system get pods -l app.kubernetes.io/name=foresight \
    -o jsonpath='{range .items[*]}{.metadata.name} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' 2>/dev/null |
    awk -v old="$1" '$1 != old && $2 == "True" { print $1 }')
  [[ -n $p ]]
}
# Waits for a finished phase; fails at once if it is not the expected one.
wait_phase() { # NS NAME PHASE TIMEOUT
  local deadline=$(($4 + SECONDS)) p
  while :; do
    p=$(field "$1" "tj/$2" '{.status.phase}')
    [[ $p == "$3" ]] && return 0
    if [[ $p == Succeeded || $p == Failed ]]; then
      fail "tj/$2 in $1 is $p, expected $3: $(field "$1" "tj/$2" '{.status.conditions[?(@.status=="True")].message}')"
    fi
    ((SECONDS < deadline)) || fail "timed out after ${4}s waiting for tj/$2 in $1 to be $3 (now ${p:-no phase})"
    sleep 0.5
  done
}

# Prometheus on the host (tools/cluster-prometheus.sh: Kubernetes service discovery with the
# chart's PodMonitor and ServiceMonitor as relabelling rules, a 2 s scrape interval).
prom_url=""
prom_query() { # EXPR [TIME]: "labels value" lines of an instant query
  curl -fsS --max-time 10 "$prom_url/api/v1/query" --data-urlencode "query=$1" ${2:+--data-urlencode "time=$2"} |
    python3 -c 'import json, sys
for r in json.load(sys.stdin)["data"]["result"]:
    print(",".join(f"{k}={v}" for k, v in sorted(r["metric"].items())), r["value"][1])'
}
prom_value() { prom_query "$@" | awk '{ v = $NF } END { print v + 0 }'; }
# NS NAME APPLIED: the TrainingJob's PS and 4 workers and the operator were discovered and
# scraped (up = 1), and every query of the dashboard returns data for the run; with
# E2E_DASHBOARD_PNG the dashboard figure is drawn from it too (make cluster-observability).
check_prometheus() {
  local ns=$1 name=$2 applied=$3 done0
  # The operator's observation of a finished job, once scraped: the TrainingJob duration panels.
  done0=$(prom_value 'sum(foresight_trainingjob_duration_seconds_count{phase="Succeeded"})' "$applied")
  wait_for 60 "Prometheus to scrape the operator's count of succeeded jobs past $done0" eval \
    '(($(prom_value "sum(foresight_trainingjob_duration_seconds_count{phase=\"Succeeded\"})") > '"${done0%.*}"'))'
  local end w sel
  end=$(date +%s.%N)
  w=$(awk -v a="$applied" -v b="$end" 'BEGIN { printf "%ds", b - a + 1 }')
  sel="namespace=\"$ns\", foresight_dev_job=\"$name\""
  prom_query "max by (job, app_kubernetes_io_component, pod) (max_over_time(up{job=\"foresight-metrics\"}[$w]) or max_over_time(up{$sel}[$w]))" \
    >"$out/main-prometheus-targets.txt"
  log "Prometheus targets seen during the run (up, max over it): $(sed 's/,pod=/ pod=/' "$out/main-prometheus-targets.txt" | paste -sd';')"
  local ops ps workers
  ops=$(grep -c '^job=foresight-metrics,.* 1$' "$out/main-prometheus-targets.txt" || true)
  ps=$(grep -c '^app_kubernetes_io_component=parameter-server,.* 1$' "$out/main-prometheus-targets.txt" || true)
  workers=$(grep -c '^app_kubernetes_io_component=worker,.* 1$' "$out/main-prometheus-targets.txt" || true)
  ((ops >= 1 && ps >= 1 && workers == 4)) ||
    fail "Prometheus scraped (up = 1) $ops operator, $ps PS and $workers worker targets; expected ≥ 1, ≥ 1, 4"
  "$repo/scripts/render-dashboard.py" --prometheus-url "$prom_url" --trainingjob "$ns/$name" \
    --start "$applied" --end "$end" --rate-interval 8s --check ${E2E_DASHBOARD_PNG:+--png "$E2E_DASHBOARD_PNG"} \
    --title "TrainingJob $ns/$name (examples/mnist-dcasgd-cluster.yaml) on the real cluster, scraped by kubernetes_sd" \
    2>&1 | sed 's/^/  /' || fail "dashboard queries without data for $ns/$name (above)"
  log "Prometheus: operator, PS and 4 workers discovered and up; every dashboard query returned data"
}

# ---------------------------------------------------------------------------------------------
# The cases. Each runs in its own namespace (main: default), in the background, its output in
# $out/<case>.log.

case_main() {
  local ns=default name=mnist-dcasgd ex=$repo/examples/mnist-dcasgd-cluster.yaml
  load_mnist $ns
  local applied
  applied=$(date +%s.%N)
  kc -n $ns apply -f "$ex"
  # `kubectl get tj` as the user sees it, every change recorded, until the job ends.
  local seq=$out/main-get-tj.txt last="" line row p step stal deadline=$((SECONDS + 900))
  # (awk, not head: head exits after a line, and kubectl killed by SIGPIPE fails the pipeline
  # under pipefail: seen once, the case ended without a word.)
  kc -n $ns get tj $name | awk 'NR == 1' >"$seq"
  while :; do
    line=$(kc -n $ns get tj $name --no-headers 2>/dev/null | tr -s ' ' || true)
    row=${line% *} # without AGE
    if [[ -n $line && $row != "$last" ]]; then
      printf 't=%ss %s\n' "$((SECONDS - t0))" "$line" >>"$seq"
      log "kubectl get tj: $line"
      last=$row
    fi
    p=$(field $ns tj/$name '{.status.phase}')
    if [[ $p == Succeeded || $p == Failed ]]; then
      # The phase may have changed since the row above was read: the final row too.
      line=$(kc -n $ns get tj $name --no-headers | tr -s ' ')
      [[ ${line% *} == "$last" ]] || printf 't=%ss %s\n' "$((SECONDS - t0))" "$line" >>"$seq"
      log "kubectl get tj: $line"
      break
    fi
    ((SECONDS < deadline)) || fail "tj/$name did not finish in 900s"
    sleep 0.5
  done
  [[ $p == Succeeded ]] || fail "tj/$name ended $p: $(condition $ns $name Failed message)"
  # The observed sequence: phases in order without repeats.
  local phases
  phases=$(awk 'NR > 1 && $3 ~ /^(Created|Running|Restarting|Succeeded|Failed|Suspended)$/ { print $3 }' "$seq" |
    uniq | paste -sd' ')
  log "phases seen: $phases"
  [[ $phases =~ ^(Created\ )?Running\ Succeeded$ ]] || fail "phase sequence '$phases', expected [Created] Running Succeeded"
  # The step (column 6 of the default columns NAME PHASE WORKERS READY STEP REASON AGE, after the
  # t= prefix) was filled and changed; the staleness p99 is column 9 of `-o wide` (AGE, then
  # ALGORITHM, STALENESS P99, EPOCH, LOSS).
  local steps stals
  steps=$(awk 'NR > 1 && $3 != "Created" && $6 ~ /^[0-9]+$/ { print $6 }' "$seq" | uniq | paste -sd' ')
  stals=$(kc -n $ns get tj $name -o wide --no-headers | awk '$9 ~ /^[0-9.]+$/ { print $9 }')
  log "step column: $steps; staleness p99 column at the end: $stals"
  (($(wc -w <<<"$steps") >= 2)) || fail "the step column never changed while the job ran: '$steps'"
  [[ -n $stals ]] || fail "the staleness column was never filled"
  awk -v s="$steps" 'BEGIN { n = split(s, a, " "); for (i = 2; i <= n; i++) if (a[i] + 0 < a[i-1] + 0) exit 1 }' ||
    fail "the step went backwards: $steps"
  # The status: conditions and counts.
  [[ $(condition $ns $name Created status) == True ]] || fail "condition Created is not True"
  [[ $(condition $ns $name Succeeded status) == True ]] || fail "condition Succeeded is not True"
  local msg
  msg=$(condition $ns $name Succeeded message)
  [[ $msg == *"final model (version"*"written to claim"*"outlives the job"* ]] || fail "the Succeeded condition says '$msg'"
  [[ $(field $ns tj/$name '{.status.workers.succeeded}') == 4 ]] || fail "status.workers.succeeded is not 4"
  [[ -n $(field $ns tj/$name '{.status.completionTime}') ]] || fail "no completionTime"
  # networkPolicy.perJob: the operator, with the chart's RBAC, gave the job its NetworkPolicy
  # (the bridge CNI here does not enforce it; the job ran beside it all the same).
  [[ $(field $ns networkpolicy/$name-ps '{.spec.podSelector.matchLabels.foresight\.dev/job}') == "$name" ]] ||
    fail "no NetworkPolicy $name-ps for the job's parameter server"
  # kubectl describe: the conditions and the events.
  # (The operator records the transition's Event just after it writes the phase.)
  wait_for 60 "a Completed event in kubectl describe tj $name" eval \
    'kc -n '$ns' describe tj '$name' >"$out/main-describe.txt" && grep -Eq "^ *Normal +Completed " "$out/main-describe.txt"'
  grep -q '^ *Conditions:' "$out/main-describe.txt" || fail "describe shows no Conditions"
  grep -q '^Events:' "$out/main-describe.txt" || fail "describe shows no Events"
  # A job without faults has nothing to warn about (a claim still being provisioned is not a
  # scheduling failure).
  ! grep -Eq '^ *Warning ' "$out/main-describe.txt" ||
    fail "Warning events on a job without faults: $(grep -E '^ *Warning ' "$out/main-describe.txt" | paste -sd';')"
  log "describe: $(sed -n '/^Events:/,$p' "$out/main-describe.txt" | tail -n +3 | awk '{ print $2 }' | paste -sd, )"
  # A worker's log: progress lines.
  local w
  w=$(pods_of $ns $name worker | awk 'NR == 1')
  [[ -n $w ]] || fail "no worker pod left to read"
  kc -n $ns logs "$w" >"$out/main-worker.log"
  local n
  n=$(grep -c '"event":"progress"' "$out/main-worker.log" || true)
  ((n >= 2)) || fail "kubectl logs $w has $n progress lines"
  grep -q '"event":"done"' "$out/main-worker.log" || fail "kubectl logs $w has no done line"
  log "kubectl logs $w: $n progress lines, e.g. $(grep -m1 '"event":"progress"' "$out/main-worker.log")"
  # The PS is removed after success; the final model stays on its claim.
  wait_for 120 "PS Deployment of $name gone" gone $ns deploy/$name-ps
  wait_for 120 "PS pods of $name gone" none_left $ns pods "foresight.dev/job=$name,app.kubernetes.io/component=parameter-server"
  # Prometheus, discovering pods as the chart's monitors would, scraped the whole run.
  check_prometheus $ns $name "$applied"
  # The example's spec.output: status.finalModel names a claim the job does not own, and the file.
  local claim file dir
  claim=$(field $ns tj/$name '{.status.finalModel.claimName}')
  file=$(field $ns tj/$name '{.status.finalModel.path}')
  [[ $claim == $name-output && $(field $ns tj/$name '{.status.finalModel.kept}') == true ]] ||
    fail "status.finalModel: claim '$claim', kept $(field $ns tj/$name '{.status.finalModel.kept}')"
  [[ -z $(field $ns pvc/$claim '{.metadata.ownerReferences}') ]] || fail "claim $claim has an owner"
  dir=$(claim_dir $ns $claim)
  [[ -n $dir && -s $dir/$file ]] || fail "no $file on claim $claim ($dir)"
  log "final model on claim $claim at $file after the PS is gone: $(check_safetensors "$dir/$file")"
  # The job's last worker was told by the PS where it wrote the model and recorded it in its
  # termination message: what the operator trusts when it cannot reach the PS at the end.
  local records recorded
  records=$(kc -n $ns get pods -l "foresight.dev/job=$name,app.kubernetes.io/component=worker" -o \
    'jsonpath={range .items[*]}{.status.containerStatuses[0].state.terminated.message}{"\n"}{end}' | grep '"finalModel"' || true)
  # (Workers leaving at the same moment may both find every worker finished: both record it.)
  recorded=$(grep -oE '"version":[0-9]+' <<<"$records" | grep -oE '[0-9]+$' | sort -u || true)
  [[ -n $records && $recorded == "$(field $ns tj/$name '{.status.finalModel.version}')" ]] ||
    fail "worker termination messages recording the final model: '$records' (status.finalModel.version $(field $ns tj/$name '{.status.finalModel.version}'))"
  log "the last worker's termination message: $records"
  # Its held-out accuracy, by Foresight's evaluator, against `foresight run` of the same training
  # (examples/mnist-dcasgd.yaml: the api tests hold the two examples' training to be the same).
  local cluster_acc local_acc
  cluster_acc=$("$release/foresight-worker" evaluate --model-file "$dir/$file" --model lenet5 \
    --dataset-format csv --dataset-path "$data" --holdout 0.2 --seed 1 |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["accuracy"])')
  (cd "$repo" && "$release/foresight" run examples/mnist-dcasgd.yaml --out "$out/main-local" --no-progress \
    >"$out/main-local.txt" 2>&1) || fail "foresight run of examples/mnist-dcasgd.yaml failed: $(tail -5 "$out/main-local.txt")"
  local_acc=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["accuracy"])' "$out/main-local/summary.json")
  log "held-out accuracy of the final model: cluster $cluster_acc, foresight run $local_acc"
  python3 -c 'import sys; a, b = map(float, sys.argv[1:]); sys.exit(abs(a - b) > 0.02)' "$cluster_acc" "$local_acc" ||
    fail "the cluster's final model ($cluster_acc) is more than 2 pp from foresight run's ($local_acc)"
  # The model outlives the job.
  kc -n $ns delete tj $name --wait=true >/dev/null
  [[ -s $dir/$file && -n $(field $ns pvc/$claim '{.metadata.name}') ]] || fail "the model went with the job"
  log "TrainingJob deleted: claim $claim and $file are still there"
}

case_unsched() {
  local ns=e2e-unsched name=too-many-gpus
  kc create namespace $ns
  # No data volume: nothing but the GPUs keeps its pods from the node.
  bare_job $ns $name /data/mnist5k '{replicas: 1, gpus: 8}'
  wait_for 180 "tj/$name Unschedulable" eval '[[ $(condition '$ns' '$name' Running reason) == Unschedulable ]]'
  local msg
  msg=$(condition $ns $name Running message)
  log "status: phase $(field $ns tj/$name '{.status.phase}'), Running=False Unschedulable: $msg"
  [[ $(field $ns tj/$name '{.status.phase}') == Created ]] || fail "phase is not Created"
  [[ $msg == *"Insufficient nvidia.com/gpu"* ]] || fail "the message is not the scheduler's: $msg"
  kc -n $ns describe tj $name >"$out/unsched-describe.txt"
  grep -q 'Unschedulable' "$out/unsched-describe.txt" || fail "describe does not show Unschedulable"
  # kubectl delete tj: every child goes (owner references, the garbage collector).
  [[ -n $(children $ns $name) ]] || fail "no children before the delete"
  kc -n $ns delete tj $name --wait=true --timeout=120s
  wait_for 180 "every child of $name gone" eval \
    '[[ -z $(kc -n '$ns' get deploy,rs,svc,job,pod,secret,pvc -o name 2>/dev/null) ]]'
  log "kubectl delete tj: no Deployment, ReplicaSet, Service, Job, pod, Secret or claim left in $ns"
}

case_badpath() {
  local ns=e2e-badpath name=no-such-data
  kc create namespace $ns
  bare_job $ns $name /data/does-not-exist '{replicas: 2}' '  runPolicy: {backoffLimit: 4}'
  wait_phase $ns $name Failed 300
  local reason msg
  reason=$(condition $ns $name Failed reason)
  msg=$(condition $ns $name Failed message)
  log "Failed: $reason: $msg"
  [[ $reason == PodFailurePolicy ]] || fail "the reason is '$reason', expected PodFailurePolicy (exit 3 is permanent)"
  [[ $msg == *"exit code 3"* ]] || fail "the message does not name exit code 3: $msg"
  # The pod the Job controller names (the other worker may have been stopped and removed).
  local w
  w=$(sed -n 's|.* for pod [^/ ]*/\([^ ]*\) failed with exit code 3.*|\1|p' <<<"$msg")
  [[ -n $w ]] || fail "the message names no pod"
  kc -n $ns logs "$w" >"$out/badpath-worker.log" 2>&1 || true
  grep -q 'does-not-exist' "$out/badpath-worker.log" || fail "the worker's log does not name the path: $(cat "$out/badpath-worker.log")"
  log "worker log: $(grep -m1 'does-not-exist' "$out/badpath-worker.log")"
  local failed
  failed=$(kc -n $ns get job $name-workers -o jsonpath='{.status.failed}')
  ((failed <= 2)) || fail "$failed worker pods failed: exit 3 must not be retried"
  wait_for 120 "PS of $name gone after Failed" gone $ns deploy/$name-ps
}

# ps_said NS JOB: sets `said` to the last line its PS pod's previous container wrote, once there
# is one.
ps_said() {
  local pod
  pod=$(pods_of "$1" "$2" parameter-server | head -1)
  [[ -n $pod ]] && said=$(kc -n "$1" logs "$pod" --previous 2>/dev/null | tail -1) && [[ -n $said ]]
}

# A parameter server that can never run (6 Mi of memory, less than the 16 MiB it needs to start
# before any model) fails the job once its container has restarted more often than backoffLimit,
# with the exit's reason. It refuses the limit at start, naming it: left to run, it was
# OOM-killed at every start on earlier runs, and on one ran for 6 minutes unkilled, its probes
# timing out. Before the restart count, each moment it ran between two crashes reset the
# stuck-pods clock, and the job stayed Restarting for good. Its workers wait for a node (8 GPUs),
# so only the PS decides.
case_ps_memory() {
  local ns=e2e-ps-memory name=ps-memory
  kc create namespace $ns
  bare_job $ns $name /data/mnist5k '{replicas: 1, gpus: 8}' '  runPolicy: {backoffLimit: 1}
  parameterServer: {resources: {limits: {memory: 6Mi}}}'
  # What it said, read from its first exit (the pod is deleted once the job has failed).
  local said=""
  wait_for 120 "the PS of $name to exit saying why" ps_said $ns $name
  log "the PS said: $said"
  [[ $said == *"memory limit (6.0 MiB) is below the 16 MiB"* ]] || fail "the PS did not say why: $said"
  wait_phase $ns $name Failed 300
  local reason msg
  reason=$(condition $ns $name Failed reason)
  msg=$(condition $ns $name Failed message)
  log "Failed: $reason: $msg"
  [[ $reason == Error ]] || fail "the reason is '$reason', expected Error"
  [[ $msg == *"more than runPolicy.backoffLimit (1)"* && $msg == *"Error (exit code 1)"* ]] ||
    fail "the message does not name the restarts and the exit: $msg"
  wait_for 120 "PS of $name gone after Failed" gone $ns deploy/$name-ps
}

# The worker Job of tj NAME is no longer UID and its workers train EPOCHS epochs: NS NAME UID EPOCHS.
recreated_with_epochs() {
  local uid epochs
  uid=$(field "$1" "job/$2-workers" '{.metadata.uid}')
  epochs=$(field "$1" "job/$2-workers" '{.spec.template.spec.containers[0].env[?(@.name=="FORESIGHT_EPOCHS")].value}')
  [[ -n $uid && $uid != "$3" && $epochs == "$4" ]]
}

case_suspend() {
  local ns=e2e-suspend name=suspend-resume
  kc create namespace $ns
  load_mnist $ns
  small_job $ns $name 2 2 "  parameterServer: {checkpoint: {intervalSeconds: 5, storage: 100Mi}}"
  wait_for 600 "tj/$name training (PS version ≥ 30)" version_at_least $ns $name 30
  local v dir
  v=$(ps_version $ns $name || true)
  dir=$(claim_dir $ns $name-ps-checkpoints)
  # The workers' pod template cannot change on a running job: the API server says why.
  if kc -n $ns patch tj $name --type merge -p '{"spec":{"training":{"epochs":3}}}' 2>"$out/suspend-refused.txt"; then
    fail "the API server took a change of training.epochs on a running job"
  fi
  grep -q "change only with runPolicy.suspend: true" "$out/suspend-refused.txt" ||
    fail "the refusal does not say why: $(cat "$out/suspend-refused.txt")"
  log "epochs 2 → 3 on the running job refused: $(grep -o 'spec.workers: Invalid value: [^(]*' "$out/suspend-refused.txt" | head -n1)"
  kc -n $ns patch tj $name --type merge -p '{"spec":{"runPolicy":{"suspend":true}}}'
  wait_phase $ns $name Suspended 180
  wait_for 180 "worker pods of $name gone" none_left $ns pods "foresight.dev/job=$name,app.kubernetes.io/component=worker"
  # The PS stops too; its checkpoint, written as it stopped, holds what was trained.
  wait_for 180 "PS pods of $name gone" none_left $ns pods "foresight.dev/job=$name,app.kubernetes.io/component=parameter-server"
  local ckpt
  ckpt=$(find "$dir" -name 'ckpt-*.safetensors' -printf '%f\n' | sort | tail -n1)
  ckpt=${ckpt#ckpt-}
  ckpt=$((10#${ckpt%.safetensors}))
  log "suspended: worker and PS pods gone; PS was at version ≥ $v, newest checkpoint on the claim: version $ckpt"
  ((ckpt >= ${v%.*})) || fail "the newest checkpoint ($ckpt) is older than the version seen before the suspend ($v)"
  # While suspended the change is taken, and the operator recreates the worker Job with it.
  local job_uid
  job_uid=$(field $ns job/$name-workers '{.metadata.uid}')
  kc -n $ns patch tj $name --type merge -p '{"spec":{"training":{"epochs":3}}}'
  wait_for 120 "the worker Job of $name recreated with 3 epochs" recreated_with_epochs $ns $name "$job_uid" 3
  log "suspended job's epochs 2 → 3: worker Job $job_uid replaced by $(field $ns job/$name-workers '{.metadata.uid}'), event: $(kc -n $ns get events.events.k8s.io -o jsonpath='{range .items[?(@.reason=="WorkersRecreated")]}{.note}{end}')"
  # The operator's pod deleted: the new one takes the job over without making anything twice.
  local before old
  before=$(children $ns $name)
  old=$(operator_pod | awk 'NR == 1')
  [[ -n $old ]] || fail "no running operator pod"
  kc -n foresight-system delete pod "$old" --wait=false
  wait_for 300 "a new Ready operator pod" operator_ready_pod_not "$old"
  log "operator pod $old deleted; a new one is Ready"
  kc -n $ns patch tj $name --type merge -p '{"spec":{"runPolicy":{"suspend":false}}}'
  wait_for 300 "a PS pod for the resumed tj/$name" eval '[[ -n $(pods_of '$ns' '$name' parameter-server) ]]'
  local ps
  ps=$(pods_of $ns $name parameter-server | awk 'NR == 1')
  wait_for 300 "the resumed PS $ps logs its restore" log_has $ns "$ps" "restored checkpoint"
  log "resumed PS: $(first_log_line $ns "$ps" 'restored checkpoint')"
  wait_for 300 "tj/$name resumed (Running)" eval '[[ $(field '$ns' tj/'$name' "{.status.phase}") =~ ^(Running|Succeeded)$ ]]'
  local after
  after=$(children $ns $name)
  [[ $before == "$after" ]] || fail "the children changed across the operator's restart:
before:
$before
after:
$after"
  log "after the operator restart: the same children (same UIDs), one each: $(awk '{ print $1 }' <<<"$after" | paste -sd' ')"
  wait_for 300 "tj/$name training again past version $ckpt (or done)" eval \
    'version_at_least '$ns' '$name' '$((ckpt + 1))' || phase_is '$ns' '$name' Succeeded'
  wait_phase $ns $name Succeeded 600
  local msg final
  msg=$(condition $ns $name Succeeded message)
  log "resumed and Succeeded: $msg"
  # 2 workers × 63 steps an epoch (2000 examples each, batch 32): 2 epochs make 252 updates, the
  # 3 the recreated workers trained make 378.
  final=$(sed -n 's/.*final model (version \([0-9]*\)).*/\1/p' <<<"$msg")
  ((${final:-0} > 252)) || fail "the final model (version ${final:-?}) has no more updates than 2 epochs make (252)"
}

case_worker_kill() {
  local ns=e2e-worker-kill name=worker-kill
  kc create namespace $ns
  load_mnist $ns
  # Low-communication training: 4 local steps with the inner AdamW between pushes, asgd as the
  # outer step (3 epochs: 96 pushes, so version 30 is mid-run).
  OPTIMIZER='{algorithm: asgd, localSteps: 4, innerOptimizer: {algorithm: adamw, learningRate: 0.001}}' \
    small_job $ns $name 3 2
  local victim
  victim=$(delete_worker_0 $ns $name)
  replaced_worker_resumes $ns $name 2 "$victim" worker-kill
}

# After worker 0's pod VICTIM was deleted: the job Succeeds, the PS's last metrics count more
# joins than WORKERS and no stale_seq, and the replacement's log says it resumed. NS NAME
# WORKERS VICTIM CASE (the prefix of the files it leaves in $out).
replaced_worker_resumes() {
  local ns=$1 name=$2 workers=$3 victim=$4 prefix=$5
  # The PS's metrics until the job ends (the PS goes with it): the last scrape counts.
  local m="" s joins=0
  while ! phase_is $ns $name Succeeded; do
    [[ $(field $ns tj/$name '{.status.phase}') != Failed ]] || fail "tj/$name Failed: $(condition $ns $name Failed message)"
    if s=$(ps_metrics $ns $name); then
      m=$s
      joins=$(metric foresight_ps_worker_joins_total <<<"$m")
    fi
    ((SECONDS < t0 + 1800)) || fail "tj/$name did not succeed"
    sleep 0.5
  done
  printf '%s\n' "$m" >"$out/$prefix-ps-metrics.txt"
  local stale
  stale=$(metric foresight_ps_gradients_rejected_total 'reason="stale_seq"' <<<"$m")
  log "Succeeded; the PS's last metrics: worker_joins_total $joins, rejected stale_seq $stale"
  ((${joins%.*} > workers)) || fail "foresight_ps_worker_joins_total $joins: the replacement never joined"
  ((${stale%.*} == 0)) || fail "$stale gradients rejected as stale_seq"
  local r
  r=$(kc -n $ns get pods -l "foresight.dev/job=$name,batch.kubernetes.io/job-completion-index=0" -o name | grep -v "/$victim$" | awk 'NR == 1')
  [[ -n $r ]] || fail "no replacement pod for worker 0"
  kc -n $ns logs "$r" >"$out/$prefix-replacement.log"
  grep -q "resuming where this worker's earlier process left off" "$out/$prefix-replacement.log" ||
    fail "the replacement $r did not resume: $(head -n 20 "$out/$prefix-replacement.log")"
  log "replacement $r: $(grep -m1 'resuming where' "$out/$prefix-replacement.log" | sed 's/\x1b\[[0-9;]*m//g')"
}

# Deletes worker 0's running pod once the PS is past version 30; its name on stdout. NS NAME
delete_worker_0() {
  local victim sel="foresight.dev/job=$2,batch.kubernetes.io/job-completion-index=0"
  wait_for 600 "tj/$2 training (PS version ≥ 30)" version_at_least $1 $2 30
  wait_for 300 "worker 0 running" eval '[[ -n $(kc -n '$1' get pods -l '$sel' -o jsonpath="{.items[?(@.status.phase==\"Running\")].metadata.name}") ]]'
  victim=$(kc -n $1 get pods -l "$sel" -o jsonpath='{.items[?(@.status.phase=="Running")].metadata.name}')
  kc -n $1 delete pod "$victim" --wait=false >&2
  log "deleted worker pod $victim at PS version $(ps_version $1 $2)"
  echo "$victim"
}

# examples/python/mnist-cluster.yaml as its comments say (the script into a ConfigMap, the job
# applied), shortened to 2 workers and 3 epochs (378 updates, as the 3-epoch pytest case), its
# parameter server sharded over 2 pods: the worker image runs the user's script as it is; worker
# 0's pod deleted mid-run, its replacement resumes; Succeeded; the final model on the output
# claim evaluated by foresight-worker (the script's LeNet-5 has the built-in's names). The
# workers' pods also get an init container, which stages the script in /tmp where the worker runs
# it from, and a native sidecar, which must not keep the workers' Job from completing.
case_python() {
  local ns=e2e-python name=mnist-python ex=$repo/examples/python/mnist-cluster.yaml
  kc create namespace $ns
  load_mnist $ns
  kc -n $ns create configmap mnist-python --from-file="$repo/examples/python/mnist.py"
  cat >"$out/python-init-containers.yaml" <<'EOF'
      initContainers:
        - name: stage
          image: localhost/busybox:1.35
          imagePullPolicy: Never
          command: [cp, /app/mnist.py, /tmp/mnist.py]
          volumeMounts: [{name: script, mountPath: /app}, {name: tmp, mountPath: /tmp}]
        - name: heartbeat
          image: localhost/busybox:1.35
          imagePullPolicy: Never
          restartPolicy: Always
          command: [sh, -c, "trap 'exit 0' TERM; while sleep 1; do :; done"]
EOF
  sed -e 's/^    epochs: 12$/    epochs: 3/' -e 's/^      milestones: \[6, 9\]$/      milestones: [2]/' \
    -e 's/^    replicas: 4$/    replicas: 2/' -e 's/^  parameterServer:$/&\n    replicas: 2/' \
    -e 's|^    command: \[python, /app/mnist.py\]$|    command: [python, /tmp/mnist.py]|' \
    -e "/^    pod:\$/r $out/python-init-containers.yaml" "$ex" >"$out/python-job.yaml"
  [[ $(diff "$ex" "$out/python-job.yaml" | grep -c '^>') == 16 ]] || fail "the example's epochs, milestones, replicas, parameterServer, command or pod lines changed"
  kc -n $ns apply -f "$out/python-job.yaml"
  local shards
  wait_for 60 "a Deployment per PS shard" eval '[[ $(kc -n '"$ns"' get deploy -l foresight.dev/job='"$name"',app.kubernetes.io/component=parameter-server -o name | wc -l) == 2 ]]'
  shards=$(kc -n $ns get deploy,svc -l foresight.dev/job=$name,app.kubernetes.io/component=parameter-server -o name | paste -sd' ')
  log "parameter server shards: $shards"
  local victim
  victim=$(delete_worker_0 $ns $name)
  replaced_worker_resumes $ns $name 2 "$victim" python
  # (json.dumps writes `"event": "progress"`, the Rust worker `"event":"progress"`.)
  grep -Eq '"event": ?"progress"' "$out/python-replacement.log" || fail "the replacement's log has no progress line"
  # Each worker pod ran the init container to its end, and the sidecar ended on the kubelet's
  # SIGTERM (Completed, not killed at the end of the grace period) once the worker had.
  local pod reasons
  for pod in $(kc -n $ns get pods -l "foresight.dev/job=$name,app.kubernetes.io/component=worker" -o name); do
    reasons=$(kc -n $ns get "$pod" -o jsonpath='{range .status.initContainerStatuses[*]}{.name}={.state.terminated.reason} {end}')
    [[ $reasons == "stage=Completed heartbeat=Completed " ]] || fail "$pod: init containers $reasons"
  done
  log "worker pods' init container and sidecar: $reasons"
  local claim file dir acc
  claim=$(field $ns tj/$name '{.status.finalModel.claimName}')
  file=$(field $ns tj/$name '{.status.finalModel.path}')
  dir=$(claim_dir $ns "$claim")
  [[ -n $dir && -s $dir/$file ]] || fail "no final model: status.finalModel claim '$claim' path '$file'"
  acc=$("$release/foresight-worker" evaluate --model-file "$dir/$file" --model lenet5 \
    --dataset-format csv --dataset-path "$data" --holdout 0.2 --seed 1 |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["accuracy"])')
  log "final model on claim $claim at $file: $(check_safetensors "$dir/$file"); held-out accuracy $acc"
  python3 -c 'import sys; sys.exit(float(sys.argv[1]) < 0.9)' "$acc" || fail "the Python job's final model reached $acc (< 0.9)"
}

# NS POD V: reads the version and seconds of POD's checkpoint restore (the chart's PS logs JSON
# lines) into the caller's `restored` and `seconds`, and fails unless that version is at least V,
# the version seen before its predecessor was deleted (none: 0): the old PS writes one more
# checkpoint on SIGTERM, and the new one restores only once the old one has exited (the
# checkpoint directory's lock), so nothing seen before the delete is lost.
restored_no_older() {
  local line seen=${3:-0}
  line=$(first_log_line "$1" "$2" 'restored checkpoint')
  read -r restored seconds < <(python3 -c 'import json, sys
f = json.loads(sys.argv[1])["fields"]
print(f["version"], round(f["seconds"], 2))' "$line" 2>/dev/null || true)
  [[ -n $restored && -n $seconds ]] || fail "cannot read the restore's version and time from: $line"
  ((restored >= ${seen%.*})) || fail "the new PS restored version $restored, older than $seen seen before the delete"
}

# NS JOB OLD: waits for a PS pod of JOB other than OLD and sets the caller's `new` to it, named by
# the listing that saw it: a second listing that failed (pods_of answers nothing then) ended a
# case under pipefail without a word.
await_new_ps() {
  wait_for 300 "a new PS pod" eval \
    'new=$(pods_of '"$1"' '"$2"' parameter-server | grep -v "^'"$3"'$" | awk "NR == 1"); [[ -n $new ]]'
}

case_ps_kill() {
  local ns=e2e-ps-kill name=ps-kill
  kc create namespace $ns
  load_mnist $ns
  small_job $ns $name 2 2 "  parameterServer: {checkpoint: {intervalSeconds: 1, storage: 100Mi}}"
  local dir
  wait_for 120 "claim $name-ps-checkpoints bound" eval '[[ -n $(claim_dir '$ns' '$name'-ps-checkpoints) ]]'
  dir=$(claim_dir $ns $name-ps-checkpoints)
  wait_for 600 "tj/$name training (PS version ≥ 30)" version_at_least $ns $name 30
  wait_for 120 "a checkpoint on claim $name-ps-checkpoints" eval '[[ -n $(find '"$dir"' -name "*.safetensors" -newer '"$out"'/e2e.started 2>/dev/null) ]]'
  check_ps_tls $ns $name
  local old v
  old=$(pods_of $ns $name parameter-server | awk 'NR == 1')
  v=$(ps_version $ns $name || true)
  kc -n $ns delete "$old" --wait=false
  log "deleted PS $old at version $v; checkpoints: $(ls "$dir" | paste -sd' ')"
  local new=
  await_new_ps $ns $name "$old"
  wait_for 300 "the new PS $new logs its restore" log_has $ns "$new" "restored checkpoint"
  local restored seconds
  restored_no_older $ns "$new" "$v"
  log "new PS $new restored version $restored (≥ $v, seen before the delete) in $seconds s"
  # The operator saw a new PS process: a condition saying what it restored, a Warning event.
  wait_for 300 "the ParameterServerRestarted condition" eval \
    '[[ $(condition '$ns' '$name' ParameterServerRestarted reason) == RestoredCheckpoint ]]'
  log "status: $(condition $ns $name ParameterServerRestarted message); restarts $(field $ns tj/$name '{.status.parameterServer.restarts}')"
  wait_for 60 "the ParameterServerRestarted event" eval \
    'kc -n '$ns' get events --field-selector reason=ParameterServerRestarted -o name | grep -q .'
  wait_phase $ns $name Succeeded 600
  [[ -s $dir/model-final.safetensors ]] || fail "no model-final.safetensors on the claim"
  log "Succeeded after the PS restart: $(condition $ns $name Succeeded message)"
}

# Opt-in (`make real-size-pod`; not among the default cases: about 14 GiB of memory and minutes
# of 400 MB exchanges): examples/python/charlm.py at 101M parameters (CHARLM_WIDTH=1024,
# CHARLM_LAYERS=8) in the worker image, 2 workers, dc-asgd-a, one PS pod with checkpoint storage
# and a memory limit; once a checkpoint is on the claim, the PS pod is deleted. The new PS pod
# restores that model (its log says in how long), passes its startup probe and becomes Ready with
# no container restart, at a version no older than the one seen before the delete; the job
# Succeeds. Into the log: the checkpoint's size, the restore time, pod start to Ready, and the PS
# container's memory peak (its cgroup's).
# The model's parameter count in a PS checkpoint (its tensors but the optimizer state's): FILE.
checkpoint_parameters() {
  python3 - "$1" <<'EOF'
import json, math, struct, sys
with open(sys.argv[1], "rb") as f:
    (n,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(n))
print(sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__" and not k.startswith("optimizer.")))
EOF
}
# NS POD: the PS's resident memory now (its /metrics) and the pod's memory cgroup's peak (cgroup
# v1 on this node: page cache, such as a checkpoint just written, counts there).
pod_memory() {
  local uid cg rss
  uid=$(field "$1" "$2" '{.metadata.uid}')
  cg=$(find /sys/fs/cgroup/memory -maxdepth 3 -type d -name "pod$uid" 2>/dev/null | awk 'NR == 1')
  rss=$(ps_metrics "$1" "$(field "$1" "$2" '{.metadata.labels.foresight\.dev/job}')" | metric process_resident_memory_bytes)
  awk -v r="$rss" -v p="$(cat "$cg/memory.max_usage_in_bytes" 2>/dev/null || echo 0)" \
    'BEGIN { printf "resident %.2f GiB, cgroup peak %.2f GiB", r / 2^30, p / 2^30 }'
}
case_real_size() {
  local ns=e2e-real-size name=real-size
  kc create namespace $ns
  [[ -f $repo/data/torch-nn/corpus.txt ]] || fail "no data/torch-nn/corpus.txt: make setup writes it"
  head -c "${REAL_SIZE_CORPUS_BYTES:-4096}" "$repo/data/torch-nn/corpus.txt" >"$out/corpus.txt"
  kc -n $ns create configmap charlm-script --from-file="$repo/examples/python/charlm.py"
  kc -n $ns create configmap charlm-corpus --from-file=corpus.txt="$out/corpus.txt"
  kc -n $ns apply -f - <<EOF
apiVersion: foresight.dev/v1alpha1
kind: TrainingJob
metadata: {name: $name}
spec:
  dataset:
    format: files
    path: /data/corpus
    holdout: 0.05
    volume: {name: corpus, configMap: {name: charlm-corpus}}
  training: {epochs: 1, batchSize: 2, learningRate: 0.3, seed: 1}
  optimizer: {algorithm: dc-asgd-a}
  parameterServer:
    checkpoint: {intervalSeconds: 20, storage: 4Gi}
    resources: {limits: {memory: ${REAL_SIZE_PS_MEMORY:-6Gi}}}
  workers:
    replicas: 2
    command: [python, /app/charlm.py]
    pod:
      env: [{name: CHARLM_WIDTH, value: "1024"}, {name: CHARLM_LAYERS, value: "8"}]
      volumes: [{name: script, configMap: {name: charlm-script}}]
      volumeMounts: [{name: script, mountPath: /app, readOnly: true}]
  runPolicy: {backoffLimit: 4}
EOF
  local dir
  wait_for 120 "claim $name-ps-checkpoints bound" eval '[[ -n $(claim_dir '$ns' '$name'-ps-checkpoints) ]]'
  dir=$(claim_dir $ns $name-ps-checkpoints)
  wait_for 900 "tj/$name training (PS version ≥ 6)" version_at_least $ns $name 6
  wait_for 300 "a checkpoint on claim $name-ps-checkpoints" eval '[[ -n $(find '"$dir"' -name "*.safetensors" -newer '"$out"'/e2e.started 2>/dev/null) ]]'
  local old v params
  old=$(pods_of $ns $name parameter-server | awk 'NR == 1')
  v=$(ps_version $ns $name)
  params=$(checkpoint_parameters "$(find "$dir" -name 'ckpt-*.safetensors' | sort | tail -n1)")
  log "PS $old at version $v, memory $(pod_memory $ns "$old"); checkpoints of $params parameters: $(ls -l "$dir" | awk 'NR > 1 { printf "%s %d MB; ", $NF, $5 / 1e6 }')"
  ((params >= 100000000)) || fail "the model has $params parameters, not ≥ 10^8"
  kc -n $ns delete "$old" --wait=false
  local new= restored seconds
  await_new_ps $ns $name "$old"
  wait_for 600 "the new PS $new logs its restore" log_has $ns "$new" "restored checkpoint"
  restored_no_older $ns "$new" "$v"
  wait_for 600 "the new PS $new Ready" eval '[[ $(field '$ns' '"$new"' "{.status.conditions[?(@.type==\"Ready\")].status}") == True ]]'
  local started ready restarts
  started=$(field $ns "$new" '{.status.startTime}')
  ready=$(field $ns "$new" '{.status.conditions[?(@.type=="Ready")].lastTransitionTime}')
  restarts=$(field $ns "$new" '{.status.containerStatuses[0].restartCount}')
  ((restarts == 0)) || fail "the new PS container restarted $restarts times (a probe killed the restore?)"
  log "new PS $new restored version $restored in $seconds s; pod started $started, Ready $ready ($(($(date -d "$ready" +%s) - $(date -d "$started" +%s))) s), 0 restarts; memory $(pod_memory $ns "$new")"
  wait_phase $ns $name Succeeded 1800
  log "Succeeded after the PS restart: $(condition $ns $name Succeeded message)"
}

# ---------------------------------------------------------------------------------------------

# A small TrainingJob labelled for Kueue's LocalQueue `team`, 2 workers asking 500m CPU each:
# NS NAME.
queued_job() {
  kc -n "$1" apply -f - <<EOF
apiVersion: foresight.dev/v1alpha1
kind: TrainingJob
metadata:
  name: $2
  labels: {kueue.x-k8s.io/queue-name: team}
spec:
  model: {name: mlp}
  dataset:
    format: csv
    path: /data/mnist5k
    volume: {name: mnist5k, persistentVolumeClaim: {claimName: mnist5k, readOnly: true}}
  training: {epochs: 1, batchSize: 32, learningRate: 0.1, seed: 1}
  workers: {replicas: 2, resources: {requests: {cpu: 500m, memory: 256Mi}}}
EOF
}
workload_condition() { field "$1" "workloads.kueue.x-k8s.io/trainingjob-$2" "{.status.conditions[?(@.type==\"$3\")].$4}"; }

case_kueue() {
  local ns=e2e-kueue
  kc create namespace $ns
  load_mnist $ns
  # Room for one job's workers (2 × 500m) at a time, not two.
  kc apply -f - <<EOF
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {name: e2e-flavor}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: e2e-cpu}
spec:
  namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: $ns}}
  resourceGroups:
  - coveredResources: [cpu, memory]
    flavors:
    - name: e2e-flavor
      resources:
      - {name: cpu, nominalQuota: 1500m}
      - {name: memory, nominalQuota: 4Gi}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {name: team, namespace: $ns}
spec: {clusterQueue: e2e-cpu}
EOF
  queued_job $ns first
  wait_for 120 "first's Workload Admitted" eval '[[ $(workload_condition '"$ns"' first Admitted status) == True ]]'
  queued_job $ns second
  wait_for 120 "second Queued" phase_is $ns second Queued
  wait_for 120 "Kueue's reason in second's Queued condition" eval \
    '[[ $(condition '"$ns"' second Queued message) == *"insufficient unused quota"* ]]'
  log "second Queued: $(condition $ns second Queued message)"
  [[ -z $(pods_of $ns second worker) ]] || fail "second has worker pods while Queued"
  wait_phase $ns first Succeeded 600
  # Until first's quota came back, second ran nothing.
  local finished admitted version
  finished=$(workload_condition $ns first Finished lastTransitionTime)
  [[ -n $finished ]] || fail "first's Workload is not Finished"
  wait_phase $ns second Succeeded 600
  admitted=$(workload_condition $ns second Admitted lastTransitionTime)
  [[ ! $admitted < $finished ]] || fail "second admitted at $admitted, before first's quota came back at $finished"
  # The final model written (reason Completed); its version is the step the status shows.
  [[ $(field $ns tj/second '{.status.reason}') == Completed ]] || fail "second: $(field $ns tj/second '{.status.reason}')"
  version=$(field $ns tj/second '{.status.progress.step}')
  ((${version:-0} > 0)) || fail "second's final model has version ${version:-none}"
  log "first's Workload Finished at $finished; second admitted at $admitted, Succeeded, final model version $version"
}

diagnose() {
  {
    echo "==== TrainingJobs"
    kc get tj -A -o wide
    echo "==== objects"
    kc get deploy,job,pods,svc,pvc -A -o wide
    echo "==== describe tj"
    kc describe tj -A
    echo "==== operator logs"
    kc -n foresight-system logs -l app.kubernetes.io/name=foresight --tail=200 --prefix
    kc -n foresight-system logs -l app.kubernetes.io/name=foresight --tail=50 --prefix --previous
    echo "==== pods not Running/Succeeded, described"
    local ns p
    for ns in default foresight-system $(kc get ns -o name | sed -n 's|namespace/\(e2e-.*\)|\1|p'); do
      for p in $(kc -n "$ns" get pods -o jsonpath='{range .items[?(@.status.phase!="Succeeded")]}{.metadata.name}{"\n"}{end}'); do
        kc -n "$ns" describe pod "$p"
        kc -n "$ns" logs "$p" --tail=30 --all-containers
      done
    done
    echo "==== events"
    kc get events -A --sort-by=.lastTimestamp | tail -n 80
  } >"$out/diagnostics.txt" 2>&1 || true
  cat "$out/diagnostics.txt" >&2
  log "diagnostics above, also in $out/diagnostics.txt; case logs in $out/"
}
finish() {
  local rc=$?
  trap - EXIT
  if ((rc)); then
    log "FAILED (rc=$rc)"
    [[ ! -f $KUBECONFIG ]] || diagnose
  fi
  "$repo/tools/cluster-prometheus.sh" stop "$out/prometheus" || true
  if [[ -n ${KUEUE_PID:-} ]]; then
    # EOF on its stdin: tools/kueue.sh stops the manager (TERM as well, should a child of this
    # script still hold the pipe open).
    local kueue_pid=$KUEUE_PID kueue_in=${KUEUE[1]:-}
    [[ -z $kueue_in ]] || exec {kueue_in}>&-
    for _ in $(seq 100); do kill -0 "$kueue_pid" 2>/dev/null || break; sleep 0.1; done
    kill "$kueue_pid" 2>/dev/null || true
    wait "$kueue_pid" 2>/dev/null || true
  fi
  if [[ ${KEEP_CLUSTER:-0} == 1 ]]; then
    log "KEEP_CLUSTER=1: the cluster stays up (tools/cluster.sh down)"
  else
    local t=$SECONDS
    cluster down || rc=1
    log "cluster down took $((SECONDS - t))s"
  fi
  ((rc)) || log "PASSED in $((SECONDS - t0))s"
  ((rc == 0)) || log "FAILED (rc=$rc): ${failure:-see the log above}"
  exit $rc
}
trap finish EXIT
touch "$out/e2e.started"

t=$SECONDS
cluster up
log "cluster up took $((SECONDS - t))s"
kc get node foresight-node -o jsonpath='{.status.allocatable}{"\n"}' >&2
[[ $(kc get node foresight-node -o jsonpath='{.status.allocatable.nvidia\.com/gpu}') == 4 ]] ||
  fail "the node does not advertise 4 nvidia.com/gpu"

# A cluster left up by an earlier run (KEEP_CLUSTER=1) is reused: what that run left goes first.
if [[ -n $("$HELM" list -n foresight-system -q 2>/dev/null) ]]; then
  log "an earlier run's release and namespaces are removed first"
  "$HELM" uninstall foresight -n foresight-system --wait >&2
fi
kc delete ns --ignore-not-found --wait=true $(kc get ns -o name | sed -n 's|namespace/\(e2e-.*\)|\1|p') foresight-system >&2
# (No TrainingJob to delete on a cluster without the CRD: a fresh one, whose first run used to pass
# only when kubectl's discovery cache remembered the resource from an earlier cluster.)
if kc get crd trainingjobs.foresight.dev >/dev/null 2>&1; then
  kc -n default delete tj --all --wait=true >&2
fi
kc -n default delete pvc,pod --all --wait=true >&2

# The worker image takes about 9 GB of disk while it is built (buildah's layer and the archive)
# and as much on the node while it is imported (4.4 GB after): a CI run once failed on evicted
# pods with less than that free, so the figure goes in the log before and after, and in the
# failure.
free_disk() { df -h --output=avail "${FORESIGHT_CACHE:-$HOME/.cache/foresight}" | tail -n1 | tr -d ' '; }
log "free disk: $(free_disk) in the image cache's filesystem"
t=$SECONDS
mapfile -t built < <(RELEASE_DIR=$release IMAGES="operator ps worker" "$repo/tools/build-images.sh" \
  2>"$out/build-images.log")
cat "$out/build-images.log" >&2
((${#built[@]} == 3)) || fail "build-images.sh built ${#built[@]} of 3 images, $(free_disk) of disk free now;" \
  "its last line: $(tail -n 1 "$out/build-images.log")"
log "images built or found in the cache in $((SECONDS - t))s; free disk: $(free_disk)"
archive_of() { printf '%s\n' "${built[@]}" | awk -v n="$1" '$1 == n { print $3 }'; }
t=$SECONDS
cluster import "$(archive_of operator)" "$(archive_of ps)"
# The worker image (4.4 GB) imports while the operator is installed and the data loaded.
cluster import "$(archive_of worker)" >"$out/import-worker.log" 2>&1 &
import_pid=$!

t=$SECONDS
prom_url=$("$repo/tools/cluster-prometheus.sh" start "$out/prometheus" {lock_fd}>&-)
log "Prometheus discovering the cluster's pods at $prom_url ($((SECONDS - t))s)"
# Kueue's manager on the host (its webhooks on loopback, which the API server reaches), before the
# operator: with kueue.enabled the operator requires Kueue's API at start. It lives as long as
# the coprocess's stdin (closed in finish).
t=$SECONDS
read -r -a kueue_ports < <(python3 -c 'import socket
s = [socket.socket() for _ in range(3)]
for x in s: x.bind(("127.0.0.1", 0))
print(*(x.getsockname()[1] for x in s))')
mkdir -p "$out/kueue"
coproc KUEUE { BIN=$KUEUE_BIN KUBECTL=$CP_BIN/kubectl WORK=$out/kueue WEBHOOK_PORT=${kueue_ports[0]} \
  HEALTH_PORT=${kueue_ports[1]} METRICS_PORT=${kueue_ports[2]} bash "$repo/tools/kueue.sh" {lock_fd}>&-; }
read -r kueue_ready <&"${KUEUE[0]}" || true
[[ $kueue_ready == READY ]] || fail "Kueue did not start: ${kueue_ready:-no answer} (log: $out/kueue/kueue.log)"
log "Kueue's manager ready in $((SECONDS - t))s"

t=$SECONDS
"$HELM" install foresight "$repo/charts/foresight" --namespace foresight-system --create-namespace \
  --set kueue.enabled=true --set networkPolicy.perJob.enabled=true \
  --wait --timeout 300s >&2 || fail "helm install: the operator did not become Ready"
log "helm install --wait took $((SECONDS - t))s: $(operator_pod | paste -sd' ')"
kc get crd trainingjobs.foresight.dev >/dev/null || fail "helm install did not install the CRD"
[[ $(kc -n foresight-system get deploy -l app.kubernetes.io/name=foresight \
  -o jsonpath='{.items[0].spec.template.spec.serviceAccountName}') == foresight ]] ||
  fail "the operator does not run as the chart's ServiceAccount"
[[ $(kc auth can-i get secrets --as=system:serviceaccount:foresight-system:foresight -A || true) == no ]] ||
  fail "the chart's RBAC lets the operator read Secrets"

t=$SECONDS
wait "$import_pid" || { cat "$out/import-worker.log" >&2; fail "importing the worker image failed"; }
log "worker image imported (waited ${t}s → $((SECONDS - t))s more)"

declare -A pids
for c in $cases; do
  fn=case_${c//-/_}
  declare -F "$fn" >/dev/null || fail "no case $c"
  (
    exec >"$out/$c.log" 2>&1
    case_name=$c
    started=$SECONDS
    "$fn"
    log "case passed in $((SECONDS - started))s"
  ) &
  pids[$c]=$!
done
failed=()
for c in $cases; do
  if wait "${pids[$c]}"; then
    log "case $c passed"
  else
    failed+=("$c")
    log "case $c FAILED; its log ($out/$c.log), last 40 lines:"
    tail -n 40 "$out/$c.log" >&2
  fi
done
((${#failed[@]} == 0)) || fail "failed cases: ${failed[*]}"

# helm uninstall: the operator goes, the CRD and the TrainingJobs stay (crds.keep).
t=$SECONDS
"$HELM" uninstall foresight --namespace foresight-system --wait --timeout 120s >&2
wait_for 120 "the operator's pods gone" none_left foresight-system pods app.kubernetes.io/name=foresight
gone foresight-system deploy/foresight || fail "the operator's Deployment is still there"
kc get crd trainingjobs.foresight.dev >/dev/null || fail "helm uninstall removed the CRD"
[[ $cases != *worker-kill* ]] || phase_is e2e-worker-kill worker-kill Succeeded ||
  fail "the TrainingJob did not outlive the operator"
log "helm uninstall: operator gone, CRD kept ($((SECONDS - t))s)"
if [[ -f $out/main-get-tj.txt ]]; then
  log "kubectl get tj, every change seen in the main case ($out/main-get-tj.txt):"
  cat "$out/main-get-tj.txt" >&2
fi
