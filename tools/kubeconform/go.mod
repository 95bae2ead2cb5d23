// Wrapper module that builds kubeconform for the chart tests (tools/build-helm-tools.sh).
// Separate from tools/helm so each program is built with exactly its own dependency pins.
// Re-pin: GOWORK=off go get -tool github.com/yannh/kubeconform/cmd/kubeconform@vX.Y.Z && go mod tidy.
module foresight/tools/kubeconform

go 1.26.0

tool github.com/yannh/kubeconform/cmd/kubeconform

require (
	github.com/hashicorp/go-cleanhttp v0.5.2 // indirect
	github.com/hashicorp/go-retryablehttp v0.7.8 // indirect
	github.com/santhosh-tekuri/jsonschema/v6 v6.0.2 // indirect
	github.com/yannh/kubeconform v0.8.0 // indirect
	go.yaml.in/yaml/v2 v2.4.4 // indirect
	golang.org/x/text v0.37.0 // indirect
	k8s.io/kube-openapi v0.0.0-20260603220949-865597e52e25 // indirect
	k8s.io/utils v0.0.0-20260210185600-b8788abfbbc2 // indirect
	sigs.k8s.io/yaml v1.6.0 // indirect
)
