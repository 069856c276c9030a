{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "elastic-jax.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name of the release's objects: "<release>-elastic-jax" unless the release already says it. */}}
{{- define "elastic-jax.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels that never change for a release: the Deployment's selector. */}}
{{- define "elastic-jax.selectorLabels" -}}
app.kubernetes.io/name: {{ include "elastic-jax.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "elastic-jax.labels" -}}
{{ include "elastic-jax.selectorLabels" . }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: elastic-jax
{{- end -}}

{{- define "elastic-jax.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "elastic-jax.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "elastic-jax.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "elastic-jax.peeringName" -}}
{{- default (include "elastic-jax.fullname" .) .Values.peering.name -}}
{{- end -}}

{{- define "elastic-jax.operatorKeySecret" -}}
{{- default (printf "%s-operator-key" (include "elastic-jax.fullname" .)) .Values.operatorKey.existingSecret -}}
{{- end -}}

{{/* NetworkPolicyPeers allowed to the jobs' control API, as JSON: this release's operator pods first. */}}
{{- define "elastic-jax.controlApiFrom" -}}
{{- $operator := dict "namespaceSelector" (dict "matchLabels" (dict "kubernetes.io/metadata.name" .Release.Namespace)) "podSelector" (dict "matchLabels" (include "elastic-jax.selectorLabels" . | fromYaml)) -}}
{{- prepend (.Values.networkPolicy.controlApiFrom | default list) $operator | toJson -}}
{{- end -}}
