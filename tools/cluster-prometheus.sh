#!/usr/bin/env bash
# Prometheus (tools/build-prometheus.sh: built from its Go module with the Kubernetes service
# discovery, which Debian's package lacks; run on this host) scraping the real cluster of tools/cluster.sh
# the way the chart's monitors would have prometheus-operator scrape it, with Kubernetes
# service discovery rather than a list of addresses:
#
#   tools/cluster-prometheus.sh start DIR   config, data and log under DIR; prints the URL
#   tools/cluster-prometheus.sh stop DIR
#
# - Discovery authenticates as a ServiceAccount `prometheus` in `monitoring` holding only what
#   kube-prometheus's Prometheus ClusterRole holds (get/list/watch pods, services, endpoints),
#   with a token from `kubectl create token`, against https://10.244.0.1:6443 and the cluster's
#   CA: a discovery that needed more (or an operator pod whose /metrics needed a token) fails.
# - `foresight-operator` is charts/foresight/templates/servicemonitor.yaml as prometheus-operator
#   renders a ServiceMonitor: role endpoints in the release's namespace, the Service selected by
#   the chart's selector labels, port `metrics`, no honor_labels; the scrape job is named after
#   the Service, as prometheus-operator names it.
# - `foresight-jobs` is templates/podmonitor.yaml as prometheus-operator renders a PodMonitor:
#   role pod in every namespace, the pods selected by foresight.jobPodSelector (name foresight,
#   managed-by foresight-operator, component parameter-server or worker), ports `http` or `https` (PS, the latter scraped over TLS without checking the per-job CA) and
#   `metrics` (workers), Succeeded/Failed pods dropped, no honor_labels (the chart's default:
#   the series' own `job`/`namespace` become exported_*), `job` from the pod's foresight.dev/job
#   label (the PodMonitor's jobLabel), the podTargetLabels as foresight_dev_job and
#   app_kubernetes_io_component on the target (so on `up`).
# - Pod IPs (10.244.0.0/24) are reached from the host over the bridge fsbr0.
#
# Scrape interval 2 s (PROM_SCRAPE_INTERVAL): a PS lives a few minutes in the e2e, and Grafana's
# $__rate_interval is then 8 s. Environment as tools/cluster.sh (FORESIGHT_CLUSTER_DIR, ...).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
S=${FORESIGHT_CLUSTER_DIR:-${FORESIGHT_CACHE:-$HOME/.cache/foresight}/cluster}
interval=${PROM_SCRAPE_INTERVAL:-2s}
release_ns=${FORESIGHT_NAMESPACE:-foresight-system}
log() { printf '[cluster-prometheus] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
[[ $# == 2 ]] || die "usage: $0 start|stop DIR"
dir=$(mkdir -p "$2" && cd "$2" && pwd)

stop() {
  local pid
  pid=$(cat "$dir/prometheus.pid" 2>/dev/null) || return 0
  if kill "$pid" 2>/dev/null; then
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$dir/prometheus.pid"
}

start() {
  local CP_BIN PROM_BIN
  CP_BIN=$("$repo/tools/build-control-plane.sh" | tail -n1)
  PROM_BIN=$("$repo/tools/build-prometheus.sh" | tail -n1)
  kc() { "$CP_BIN/kubectl" --kubeconfig "$S/admin.kubeconfig" "$@"; }
  stop
  kc apply -f - >&2 <<'EOF'
apiVersion: v1
kind: Namespace
metadata: {name: monitoring}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: prometheus, namespace: monitoring}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: prometheus}
rules:
  - apiGroups: [""]
    resources: [pods, services, endpoints]
    verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: prometheus}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: prometheus}
subjects: [{kind: ServiceAccount, name: prometheus, namespace: monitoring}]
EOF
  (umask 077 && kc -n monitoring create token prometheus --duration 24h >"$dir/token")
  local api ca
  api=$(kc config view --minify -o jsonpath='{.clusters[0].cluster.server}')
  ca=$(kc config view --minify -o jsonpath='{.clusters[0].cluster.certificate-authority}')
  local sd="api_server: $api
      tls_config: {ca_file: $ca}
      authorization: {credentials_file: $dir/token}"
  # The PodMonitor's endpoints: h2c parameter servers and workers, and (psTls) parameter servers
  # serving HTTPS, whose per-job CA the scrape does not hold.
  local job_relabels
  job_relabels=$(cat <<EOF
    - {action: keep, source_labels: [__meta_kubernetes_pod_label_app_kubernetes_io_name], regex: foresight}
    - {action: keep, source_labels: [__meta_kubernetes_pod_label_app_kubernetes_io_managed_by], regex: foresight-operator}
    - {action: keep, source_labels: [__meta_kubernetes_pod_label_app_kubernetes_io_component], regex: parameter-server|worker}
    - {action: drop, source_labels: [__meta_kubernetes_pod_phase], regex: Failed|Succeeded}
    - {source_labels: [__meta_kubernetes_namespace], target_label: namespace}
    - {source_labels: [__meta_kubernetes_pod_name], target_label: pod}
    - {source_labels: [__meta_kubernetes_pod_container_name], target_label: container}
    - {source_labels: [__meta_kubernetes_pod_label_foresight_dev_job], target_label: foresight_dev_job}
    - {source_labels: [__meta_kubernetes_pod_label_app_kubernetes_io_component], target_label: app_kubernetes_io_component}
    - {source_labels: [__meta_kubernetes_pod_label_foresight_dev_ps_shard], target_label: foresight_dev_ps_shard}
    - {source_labels: [__meta_kubernetes_pod_container_port_name], target_label: endpoint}
    - {target_label: job, replacement: $release_ns/foresight-jobs}
    - {source_labels: [__meta_kubernetes_pod_label_foresight_dev_job], target_label: job, regex: (.+)}
EOF
)
  cat >"$dir/prometheus.yml" <<EOF
global: {scrape_interval: $interval, scrape_timeout: $interval, evaluation_interval: $interval}
scrape_configs:
  - job_name: foresight-operator
    kubernetes_sd_configs:
    - role: endpoints
      namespaces: {names: [$release_ns]}
      $sd
    relabel_configs:
    - {action: keep, source_labels: [__meta_kubernetes_service_label_app_kubernetes_io_name], regex: foresight}
    - {action: keep, source_labels: [__meta_kubernetes_service_label_app_kubernetes_io_component], regex: operator}
    - {action: keep, source_labels: [__meta_kubernetes_endpoint_port_name], regex: metrics}
    - {source_labels: [__meta_kubernetes_namespace], target_label: namespace}
    - {source_labels: [__meta_kubernetes_service_name], target_label: service}
    - {source_labels: [__meta_kubernetes_pod_name], target_label: pod}
    - {source_labels: [__meta_kubernetes_service_name], target_label: job}
    - {target_label: endpoint, replacement: metrics}
  - job_name: foresight-jobs
    kubernetes_sd_configs:
    - role: pod
      $sd
    relabel_configs:
    - {action: keep, source_labels: [__meta_kubernetes_pod_container_port_name], regex: http|metrics}
$job_relabels
  - job_name: foresight-jobs-tls
    scheme: https
    tls_config: {insecure_skip_verify: true}
    kubernetes_sd_configs:
    - role: pod
      $sd
    relabel_configs:
    - {action: keep, source_labels: [__meta_kubernetes_pod_container_port_name], regex: https}
$job_relabels
EOF
  local port
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "$PROM_BIN/prometheus" --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/data" \
    --web.listen-address="127.0.0.1:$port" --log.level=warn >"$dir/prometheus.log" 2>&1 &
  echo $! >"$dir/prometheus.pid"
  local url=http://127.0.0.1:$port
  for _ in $(seq 600); do
    if curl -fsS --max-time 2 "$url/-/ready" >/dev/null 2>&1; then
      echo "$url" >"$dir/url"
      log "Prometheus at $url (config $dir/prometheus.yml, log $dir/prometheus.log)"
      echo "$url"
      return 0
    fi
    kill -0 "$(cat "$dir/prometheus.pid")" 2>/dev/null || break
    sleep 0.1
  done
  cat "$dir/prometheus.log" >&2
  stop
  die "prometheus did not start"
}

case $1 in
  start) start ;;
  stop) stop ;;
  *) die "usage: $0 start|stop DIR" ;;
esac
