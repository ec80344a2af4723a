{{/*
Labels Helm adds to every object. The objects themselves carry the same
labels as config/ (the drift test removes only these two before comparing).
*/}}
{{- define "deployguard.helmLabels" -}}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* The namespaces neither webhook is called for: the list and the release namespace. */}}
{{- define "deployguard.excludedNamespaces" -}}
{{- $ns := list }}
{{- range .Values.webhooks.excludedNamespaces }}{{ $ns = append $ns . }}{{ end }}
{{- $ns = append $ns .Release.Namespace | uniq }}
{{- toJson $ns }}
{{- end }}

{{/* The CEL matchCondition that keeps the excluded namespaces out, written as config/webhook writes it. */}}
{{- define "deployguard.notSystemNamespaces" -}}
{{- $q := list }}
{{- range (include "deployguard.excludedNamespaces" . | fromJsonArray) }}{{ $q = append $q (quote .) }}{{ end }}
{{- printf "!(request.namespace in [%s])" (join ", " $q) }}
{{- end }}

{{- define "deployguard.selfManaged" -}}
{{- if eq .Values.certificates.mode "self-managed" }}true{{ else if eq .Values.certificates.mode "cert-manager" }}{{ else }}{{ fail (printf "certificates.mode must be cert-manager or self-managed, not %q" .Values.certificates.mode) }}{{ end }}
{{- end }}
