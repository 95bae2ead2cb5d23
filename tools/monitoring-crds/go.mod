// Pins the prometheus-operator module whose zip holds the monitoring.coreos.com CRDs
// (example/prometheus-operator-crd/*.yaml); tools/build-helm-tools.sh copies the ServiceMonitor
// and PodMonitor CRDs from it so the chart tests can validate those objects. Nothing is built
// from it, so do not run `go mod tidy` here (it would drop the requirement).
// Re-pin: edit the version below, then GOWORK=off go mod download -json github.com/prometheus-operator/prometheus-operator
module foresight/tools/monitoring-crds

go 1.26.0

require github.com/prometheus-operator/prometheus-operator v0.85.0
