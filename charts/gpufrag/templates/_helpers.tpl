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

{{/*
The webhook's serving TLS where the chart makes it (rightsizing.selfSigned without
cert-manager), as JSON {crt, key, ca}, base64: the Secret's, kept across upgrades (lookup), else
made once per render. Every template that needs it (the Secret, the caBundle of each webhook
configuration) reads this one result: it is kept in the values for the rest of the render, so
the two webhook configurations never carry two different CAs.
*/}}
{{- define "gpufrag.admissionTLS" -}}
{{- if not (hasKey .Values.rightsizing "_tls") }}
{{- $ns := include "gpufrag.namespace" . }}
{{- $found := (lookup "v1" "Secret" $ns "gpufrag-admission-tls").data | default dict }}
{{- $tls := dict "crt" (index $found "tls.crt") "key" (index $found "tls.key") "ca" (index $found "ca.crt") }}
{{- if not (and $tls.crt $tls.key $tls.ca) }}
{{- $made := genCA "gpufrag-admission-ca" 3650 }}
{{- $cert := genSignedCert (print "gpufrag-admission." $ns ".svc") nil (list (print "gpufrag-admission." $ns ".svc") (print "gpufrag-admission." $ns ".svc.cluster.local")) 3650 $made }}
{{- $tls = dict "crt" ($cert.Cert | b64enc) "key" ($cert.Key | b64enc) "ca" ($made.Cert | b64enc) }}
{{- end }}
{{- $_ := set .Values.rightsizing "_tls" $tls }}
{{- end }}
{{- toJson (get .Values.rightsizing "_tls") }}
{{- end }}
