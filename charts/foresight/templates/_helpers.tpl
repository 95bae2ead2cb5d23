{{/*
The chart's name, overridable with nameOverride.
*/}}
{{- define "foresight.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
A fully qualified name for the release's objects: the release name when it already contains
the chart's name, else <release>-<chart>. Truncated to 63 characters (DNS label limit).
*/}}
{{- define "foresight.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
chart label value: <name>-<version>.
*/}}
{{- define "foresight.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels on every object of the chart.
*/}}
{{- define "foresight.labels" -}}
helm.sh/chart: {{ include "foresight.chart" . }}
{{ include "foresight.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: foresight
{{- end }}

{{/*
Selector labels of the operator's pods. The component label keeps the operator's Service and
Deployment from selecting the parameter-server and worker pods the operator creates, which
also carry app.kubernetes.io/name=foresight (and app.kubernetes.io/instance=<job name>).
*/}}
{{- define "foresight.selectorLabels" -}}
app.kubernetes.io/name: {{ include "foresight.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/*
The operator's ServiceAccount.
*/}}
{{- define "foresight.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "foresight.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The Secret holding the key job tokens are derived from.
*/}}
{{- define "foresight.tokenKeySecretName" -}}
{{- printf "%s-token-key" (include "foresight.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Images. An empty tag means the chart's appVersion.
*/}}
{{- define "foresight.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{- define "foresight.psImage" -}}
{{- printf "%s:%s" .Values.psImage.repository (.Values.psImage.tag | default .Chart.AppVersion) }}
{{- end }}

{{- define "foresight.workerImage" -}}
{{- printf "%s:%s" .Values.workerImage.repository (.Values.workerImage.tag | default .Chart.AppVersion) }}
{{- end }}

{{/*
The name of the coordination.k8s.io Lease the operator's replicas elect a leader with (the
operator's --lease-name; the lease Role grants get/update on this name only). One per release,
so that two releases in one namespace (each watching its own namespaces) do not block each
other; the default release, `foresight`, keeps the name it always had.
*/}}
{{- define "foresight.leaseName" -}}
{{- printf "%s-operator" (include "foresight.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The claim a namespaced release writes in each other namespace it watches
(operator/src/controller/leadership/claims.rs `claim_name`).
*/}}
{{- define "foresight.claimName" -}}
{{- printf "foresight-claim.%s.%s" .Release.Namespace (include "foresight.leaseName" .) }}
{{- end }}

{{/*
Labels of the parameter-server and worker pods the operator creates (the PodMonitor's selector).
*/}}
{{- define "foresight.jobPodSelector" -}}
matchLabels:
  app.kubernetes.io/name: foresight
  app.kubernetes.io/managed-by: foresight-operator
matchExpressions:
  - key: app.kubernetes.io/component
    operator: In
    values:
      - parameter-server
      - worker
{{- end }}

{{/*
The namespaces the operator watches, comma-separated: watchNamespaces and the older single
watchNamespace together, sorted, without repeats. Empty: every namespace.
*/}}
{{- define "foresight.watchNamespaces" -}}
{{- $names := concat (.Values.watchNamespaces | default list) (compact (list .Values.watchNamespace)) }}
{{- $names | uniq | sortAlpha | join "," }}
{{- end }}

{{/*
A CEL condition that volume expression (index . 0) has none of the sources in (index . 1).
*/}}
{{- define "foresight.volumeAllowed" -}}
{{- $v := index . 0 }}{{ $banned := index . 1 -}}
{{- range $i, $s := $banned }}{{ if $i }} && {{ end }}!has({{ $v }}.{{ $s }}){{ end }}
{{- end }}
