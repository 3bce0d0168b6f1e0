{{/* The namespace of every namespaced object: namespace.name, else the release namespace. */}}
{{- define "gpufrag.namespace" -}}
{{- .Values.namespace.name | default .Release.Namespace -}}
{{- end -}}

{{/* What every release-scoped name starts with (a ClusterRole's, a ClusterRoleBinding's, an
object's in kube-system): fullnameOverride, else the release name where it holds "gpufrag",
else <release>-gpufrag. The release named gpufrag gets the kustomize base's names. */}}
{{- define "gpufrag.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride -}}
{{- else if contains "gpufrag" .Release.Name -}}
{{- .Release.Name -}}
{{- else -}}
{{- printf "%s-gpufrag" .Release.Name -}}
{{- end -}}
{{- end -}}

{{/* The labels the chart puts on every object beside the base's. */}}
{{- define "gpufrag.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | quote }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/* An image reference from {image: {repository, tag, digest}, registry}:
repository[:tag][@digest], with registry (global.imageRegistry) in place of the repository's
registry host where set. */}}
{{- define "gpufrag.image" -}}
{{- $repository := .image.repository -}}
{{- with .registry -}}
{{- $repository = printf "%s/%s" (trimSuffix "/" .) (regexReplaceAll "^[^/]+/" $repository "") -}}
{{- end -}}
{{- $repository -}}
{{- with .image.tag -}}:{{ . }}{{- end -}}{{- with .image.digest -}}@{{ . }}{{- end -}}
{{- end -}}
