{{/* The release's base name: the release name when it contains the chart's. */}}
{{- define "opensandbox.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "opensandbox.serverName" -}}
{{- printf "%s-server" (include "opensandbox.fullname" .) -}}
{{- end -}}

{{- define "opensandbox.ingressName" -}}
{{- printf "%s-ingress" (include "opensandbox.fullname" .) -}}
{{- end -}}

{{- define "opensandbox.apiKeySecret" -}}
{{- .Values.apiKey.existingSecret | default (include "opensandbox.serverName" .) -}}
{{- end -}}

{{- define "opensandbox.keysSecret" -}}
{{- .Values.ingress.signingKeys.existingSecret | default (printf "%s-keys" (include "opensandbox.ingressName" .)) -}}
{{- end -}}

{{/* Labels of every object; the selector labels are the name's alone. */}}
{{- define "opensandbox.labels" -}}
app.kubernetes.io/part-of: opensandbox
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "opensandbox.serverLabels" -}}
app.kubernetes.io/name: {{ include "opensandbox.serverName" . }}
app.kubernetes.io/component: server
{{ include "opensandbox.labels" . }}
{{- end -}}

{{- define "opensandbox.ingressLabels" -}}
app.kubernetes.io/name: {{ include "opensandbox.ingressName" . }}
app.kubernetes.io/component: ingress
{{ include "opensandbox.labels" . }}
{{- end -}}

{{/*
A TOML value from a YAML one: strings and keys as JSON strings (a TOML
basic string), whole numbers without an exponent, lists as arrays, maps as
inline tables.
*/}}
{{- define "opensandbox.toml" -}}
{{- if kindIs "string" . -}}
{{- toJson . -}}
{{- else if kindIs "bool" . -}}
{{- . -}}
{{- else if or (kindIs "float64" .) (kindIs "int" .) (kindIs "int64" .) -}}
{{- if eq (float64 (int64 .)) (float64 .) }}{{ int64 . }}{{ else }}{{ . }}{{ end -}}
{{- else if kindIs "slice" . -}}
[{{ range $i, $v := . }}{{ if $i }}, {{ end }}{{ include "opensandbox.toml" $v }}{{ end }}]
{{- else if kindIs "map" . -}}
{ {{- range $i, $k := keys . | sortAlpha }}{{ if $i }},{{ end }} {{ toJson $k }} = {{ include "opensandbox.toml" (get $ $k) }}{{ end }} }
{{- else if kindIs "invalid" . -}}
""
{{- else -}}
{{- fail (printf "cannot write %v (%s) as TOML" . (kindOf .)) -}}
{{- end -}}
{{- end -}}

{{/*
The keys of a map as TOML lines, sorted. The tables of strings a pool
holds (env, resource_limits) take their values as strings, however YAML
typed them (cpu: 1).
*/}}
{{- define "opensandbox.tomlTable" -}}
{{- range $k := keys . | sortAlpha }}
{{- $v := get $ $k }}
{{- if and (has $k (list "env" "resource_limits")) (kindIs "map" $v) }}
{{ $k }} = { {{- range $i, $mk := keys $v | sortAlpha }}{{ if $i }},{{ end }} {{ toJson $mk }} = {{ include "opensandbox.toml" (toString (get $v $mk)) }}{{ end }} }
{{- else }}
{{ $k }} = {{ include "opensandbox.toml" $v }}
{{- end }}
{{- end -}}
{{- end -}}
