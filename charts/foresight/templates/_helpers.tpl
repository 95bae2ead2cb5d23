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


{{/*
The author policy's building blocks (templates/author-policy.yaml).

A CEL condition: the user making the request may (index . 0: verb) (index . 1: API group)
(index . 2: resource) named (index . 3: a CEL string; '' for any) in the request's namespace, or
cluster-wide when (index . 4) is "cluster".
*/}}
{{- define "foresight.may" -}}
authorizer.group('{{ index . 1 }}').resource('{{ index . 2 }}')
{{- if not (and (gt (len .) 4) (eq (index . 4) "cluster")) }}.namespace(request.namespace){{ end -}}
.name({{ index . 3 }}).check('{{ index . 0 }}').allowed()
{{- end }}

{{/*
"(a) + (b) + ...": CEL lists joined (the list of CEL expressions in .).
*/}}
{{- define "foresight.concat" -}}
{{- printf "(%s)" (join ") + (" .) }}
{{- end }}

{{/*
A CEL list of references {field, name} to objects of one kind (index . 2: secrets, configmaps
or claims) that volumes (index . 1, a CEL list of core/v1 Volumes under field (index . 0)) name.
*/}}
{{- define "foresight.volumeRefs" -}}
{{- $f := index . 0 }}{{ $vs := index . 1 }}{{ $kind := index . 2 }}
{{- $parts := list }}
{{- if eq $kind "secrets" }}
{{- $parts = list
  (printf "%s.filter(v, has(v.secret)).map(v, {'field': '%s.secret', 'name': string(v.secret.?secretName.orValue(''))})" $vs $f)
  (printf "%s.filter(v, has(v.projected)).map(v, v.projected.?sources.orValue([]).filter(s, has(s.secret)).map(s, {'field': '%s.projected.sources[].secret', 'name': string(s.secret.?name.orValue(''))})).flatten()" $vs $f) }}
{{- else if eq $kind "configmaps" }}
{{- $parts = list
  (printf "%s.filter(v, has(v.configMap)).map(v, {'field': '%s.configMap', 'name': string(v.configMap.?name.orValue(''))})" $vs $f)
  (printf "%s.filter(v, has(v.projected)).map(v, v.projected.?sources.orValue([]).filter(s, has(s.configMap)).map(s, {'field': '%s.projected.sources[].configMap', 'name': string(s.configMap.?name.orValue(''))})).flatten()" $vs $f) }}
{{- else }}
{{- $parts = list (printf "%s.filter(v, has(v.persistentVolumeClaim)).map(v, {'field': '%s.persistentVolumeClaim', 'name': string(v.persistentVolumeClaim.claimName)})" $vs $f) }}
{{- range $src := list "dataSource" "dataSourceRef" }}
{{- $parts = append $parts (printf "%s.filter(d, %s).map(d, {'field': '%s.ephemeral.volumeClaimTemplate.spec.%s', 'name': string(d.name)})" (include "foresight.claimSources" (list $vs $src)) (include "foresight.isClaim" "d") $f $src) }}
{{- end }}
{{- end }}
{{- include "foresight.concat" $parts }}
{{- end }}

{{/*
The dataSource or dataSourceRef (index . 1) of the ephemeral volumes among volumes (index . 0).
*/}}
{{- define "foresight.claimSources" -}}
{{- $t := "v.ephemeral.volumeClaimTemplate.spec" -}}
{{ index . 0 }}.filter(v, has(v.ephemeral) && has(v.ephemeral.volumeClaimTemplate) && has({{ $t }}.{{ index . 1 }})).map(v, {{ $t }}.{{ index . 1 }})
{{- end }}

{{/*
A CEL condition: a volume source (.) is a claim of the request's namespace.
*/}}
{{- define "foresight.isClaim" -}}
{{ . }}.kind == 'PersistentVolumeClaim' && {{ . }}.?apiGroup.orValue('') == '' && {{ . }}.?namespace.orValue(request.namespace) == request.namespace
{{- end }}

{{/*
A CEL list of references {field, name} to objects of one kind (index . 1) that a role's pod block
(index . 0: workers or parameterServer) names.
*/}}
{{- define "foresight.podRefs" -}}
{{- $r := index . 0 }}{{ $kind := index . 1 }}{{ $p := printf "object.spec.?%s.?pod" $r }}{{ $f := printf "%s.pod" $r }}
{{- $parts := list (include "foresight.volumeRefs" (list (printf "%s.volumes[]" $f) (printf "%s.?volumes.orValue([])" $p) $kind)) }}
{{- $env := dict "secrets" (list "secretKeyRef" "secretRef") "configmaps" (list "configMapKeyRef" "configMapRef") }}
{{- with get $env $kind }}
{{- $key := index . 0 }}{{ $from := index . 1 }}
{{- $envRefs := printf "filter(e, has(e.valueFrom) && has(e.valueFrom.%s)).map(e, {'field': '%%s.env[].valueFrom.%s', 'name': string(e.valueFrom.%s.?name.orValue(''))})" $key $key $key }}
{{- $fromRefs := printf "filter(e, has(e.%s)).map(e, {'field': '%%s.envFrom[].%s', 'name': string(e.%s.?name.orValue(''))})" $from $from $from }}
{{- $parts = append $parts (printf (printf "%s.?env.orValue([]).%s" $p $envRefs) $f) }}
{{- $parts = append $parts (printf (printf "%s.?envFrom.orValue([]).%s" $p $fromRefs) $f) }}
{{- $parts = append $parts (printf (printf "%s.?initContainers.orValue([]).map(c, c.?env.orValue([]).%s).flatten()" $p $envRefs) (printf "%s.initContainers[]" $f)) }}
{{- $parts = append $parts (printf (printf "%s.?initContainers.orValue([]).map(c, c.?envFrom.orValue([]).%s).flatten()" $p $fromRefs) (printf "%s.initContainers[]" $f)) }}
{{- end }}
{{- if eq $kind "secrets" }}
{{- $parts = append $parts (printf "%s.?imagePullSecrets.orValue([]).map(s, {'field': '%s.imagePullSecrets[]', 'name': string(s.?name.orValue(''))})" $p $f) }}
{{- end }}
{{- include "foresight.concat" $parts }}
{{- end }}

{{/*
A CEL list of messages, one per volume among volumes (index . 1, under field (index . 0)) that the
policy cannot look into: a type whose content it cannot see (hostPath, csi, nfs, the in-tree
drivers), or an ephemeral volume cloned from something other than a claim of the namespace.
*/}}
{{- define "foresight.volumeUnchecked" -}}
{{- $f := index . 0 }}{{ $vs := index . 1 }}
{{- $types := list "awsElasticBlockStore" "azureDisk" "azureFile" "cephfs" "cinder" "csi" "fc" "flexVolume" "flocker" "gcePersistentDisk" "gitRepo" "glusterfs" "hostPath" "iscsi" "nfs" "photonPersistentDisk" "portworxVolume" "quobyte" "rbd" "scaleIO" "storageos" "vsphereVolume" }}
{{- $any := list }}{{ range $types }}{{ $any = append $any (printf "has(v.%s)" .) }}{{ end }}
{{- $parts := list (printf "%s.filter(v, %s).map(v, '%s ' + v.name + ' is of a type whose content this policy cannot check')" $vs (join " || " $any) $f) }}
{{- range $src := list "dataSource" "dataSourceRef" }}
{{- $parts = append $parts (printf "%s.filter(d, !(%s)).map(d, '%s.ephemeral.volumeClaimTemplate.spec.%s is ' + d.kind + ' ' + d.name + ', not a claim of this namespace')" (include "foresight.claimSources" (list $vs $src)) (include "foresight.isClaim" "d") $f $src) }}
{{- end }}
{{- include "foresight.concat" $parts }}
{{- end }}

{{/*
A CEL list of messages, one per thing a role's pod block (.) asks for that only whoever may
create pods may give: the volumes above, and init containers (sidecars too) asking for privileges.
*/}}
{{- define "foresight.podUnchecked" -}}
{{- $p := printf "object.spec.?%s.?pod" . }}{{ $f := printf "%s.pod" . }}
{{- $privileged := "c.securityContext.?privileged.orValue(false) || c.securityContext.?allowPrivilegeEscalation.orValue(false) || c.securityContext.?runAsUser.orValue(1) == 0 || c.securityContext.?capabilities.?add.orValue([]).size() > 0" }}
{{- include "foresight.concat" (list
  (include "foresight.volumeUnchecked" (list (printf "%s.volumes[]" $f) (printf "%s.?volumes.orValue([])" $p)))
  (printf "%s.?initContainers.orValue([]).filter(c, has(c.securityContext) && (%s)).map(c, '%s.initContainers[] ' + c.name + ' asks for privileges (privileged, allowPrivilegeEscalation, runAsUser 0 or capabilities.add)')" $p $privileged $f)) }}
{{- end }}
