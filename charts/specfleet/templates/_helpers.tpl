{{- define "specfleet.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "specfleet.labels" -}}
app.kubernetes.io/name: specfleet
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "specfleet.selector" -}}
app.kubernetes.io/name: specfleet
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "specfleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "specfleet.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "specfleet.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "specfleet.capacityImage" -}}
{{- printf "%s:%s" .Values.capacityImage.repository (default .Chart.AppVersion .Values.capacityImage.tag) -}}
{{- end -}}

{{/* Whether to render a monitoring.coreos.com object: "auto" follows the cluster's APIs. */}}
{{- define "specfleet.monitoring" -}}
{{- $enabled := index . 0 -}}
{{- $ctx := index . 1 -}}
{{- if eq (toString $enabled) "auto" -}}
{{- if $ctx.Capabilities.APIVersions.Has "monitoring.coreos.com/v1" -}}true{{- end -}}
{{- else if eq (toString $enabled) "true" -}}true{{- end -}}
{{- end -}}
