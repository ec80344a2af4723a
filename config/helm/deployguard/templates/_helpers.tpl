{{/*
Labels Helm adds to every object. The objects themselves carry the same
labels as config/ (the drift test removes only these two before comparing).
*/}}
{{- define "deployguard.helmLabels" -}}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* The namespaces the Deployment and budget webhooks are not called for: the list and the release namespace (the rollback verdict's entry has its own). */}}
{{- define "deployguard.excludedNamespaces" -}}
{{- $ns := list }}
{{- range .Values.webhooks.excludedNamespaces }}{{ $ns = append $ns . }}{{ end }}
{{- $ns = append $ns .Release.Namespace | uniq }}
{{- toJson $ns }}
{{- end }}

{{/* The CEL matchCondition that keeps the excluded namespaces out, written as config/webhook writes it. */}}
{{- define "deployguard.notSystemNamespaces" -}}
{{- include "deployguard.notInNamespaces" (include "deployguard.excludedNamespaces" . | fromJsonArray) }}
{{- end }}

{{/* The CEL matchCondition that keeps the namespaces of a list out. */}}
{{- define "deployguard.notInNamespaces" -}}
{{- $q := list }}
{{- range . }}{{ $q = append $q (quote .) }}{{ end }}
{{- printf "!(request.namespace in [%s])" (join ", " $q) }}
{{- end }}

{{- define "deployguard.selfManaged" -}}
{{- if eq .Values.certificates.mode "self-managed" }}true{{ else if eq .Values.certificates.mode "cert-manager" }}{{ else }}{{ fail (printf "certificates.mode must be cert-manager or self-managed, not %q" .Values.certificates.mode) }}{{ end }}
{{- end }}

{{/* The value of serve's --config-snapshots from configSnapshots. */}}
{{- define "deployguard.configSnapshots" -}}
{{- $kinds := list -}}
{{- if .Values.configSnapshots.configMaps }}{{ $kinds = append $kinds "configmaps" }}{{ end -}}
{{- if .Values.configSnapshots.secrets }}{{ $kinds = append $kinds "secrets" }}{{ end -}}
{{- if $kinds }}{{ join "," $kinds }}{{ else }}none{{ end -}}
{{- end }}
