{{/* Names and labels. */}}
{{- define "hbmwatch.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "hbmwatch.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "hbmwatch.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hbmwatch.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "hbmwatch.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "hbmwatch.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "hbmwatch.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "hbmwatch.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "hbmwatch.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* Split mode runs over a shared PostgreSQL: refuse to render without its Secret. */}}
{{- define "hbmwatch.checks" -}}
{{- if not (has .Values.mode (list "single" "split")) -}}
{{- fail (printf "mode must be single or split, not %q" .Values.mode) -}}
{{- end -}}
{{- if and (eq .Values.mode "split") (not .Values.store.existingSecret) -}}
{{- fail "mode split needs PostgreSQL: set store.existingSecret to a Secret holding its URL" -}}
{{- end -}}
{{- end -}}

{{/* The settings file: values.config, with what the chart decides laid over it. */}}
{{- define "hbmwatch.config" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- $api := dict "host" "0.0.0.0" "port" (int .Values.api.port) "open_reads" .Values.api.openReads -}}
{{- $_ := set $cfg "api" (mergeOverwrite (get $cfg "api" | default dict) $api) -}}
{{- $collector := get $cfg "collector" | default dict -}}
{{- $_ := set $collector "spool_dir" "/var/lib/hbmwatch/spool" -}}
{{- if .Values.discovery.enabled -}}
{{- $exporters := list -}}
{{- range .Values.discovery.exporters -}}
{{- $e := dict "kind" .kind "label_selector" .labelSelector "role" (.role | default "pod") -}}
{{- if .namespace }}{{ $_ := set $e "namespace" .namespace }}{{ end -}}
{{- if kindIs "string" .port }}{{ $_ := set $e "port" .port }}{{ else }}{{ $_ := set $e "port" (int .port) }}{{ end -}}
{{- if $.Values.discovery.labels }}{{ $_ := set $e "labels" $.Values.discovery.labels }}{{ end -}}
{{- $exporters = append $exporters $e -}}
{{- end -}}
{{- $k8s := dict "exporters" $exporters "refresh_seconds" (float64 .Values.discovery.refreshSeconds) -}}
{{- $_ := set $collector "kubernetes" $k8s -}}
{{- end -}}
{{- $_ := set $cfg "collector" $collector -}}
{{- $sim := get $cfg "simulator" | default dict -}}
{{- $_ := set $sim "truth_file" "/var/lib/hbmwatch/hbmwatch-sim-truth.json" -}}
{{- $_ := set $cfg "simulator" $sim -}}
{{- toToml $cfg -}}
{{- end -}}

{{/* Variables every hbmwatch container gets: the config file, the store's Secret; the API
tokens only where an API serves (.tokens). Called with (dict "root" $ "tokens" bool). */}}
{{- define "hbmwatch.env" -}}
{{- $tokens := .tokens -}}
{{- $root := .root -}}
{{- with .root -}}
- name: HBMWATCH_CONFIG
  value: /etc/hbmwatch/hbmwatch.toml
{{- if .Values.store.existingSecret }}
- name: HBMWATCH_STORE__URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.store.existingSecret }}
      key: {{ .Values.store.urlKey }}
{{- else }}
- name: HBMWATCH_STORE__URL
  value: sqlite:////var/lib/hbmwatch/hbmwatch.db
{{- end }}
{{- if and $tokens .Values.api.existingSecret }}
{{- range $var, $key := dict "READ_TOKEN" .Values.api.readTokenKey "WRITE_TOKEN" .Values.api.writeTokenKey "ADMIN_TOKEN" .Values.api.adminTokenKey }}
- name: HBMWATCH_API__{{ $var }}
  valueFrom:
    secretKeyRef:
      name: {{ $root.Values.api.existingSecret }}
      key: {{ $key }}
      optional: true
{{- end }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Pod-level fields every workload shares. */}}
{{- define "hbmwatch.podSpec" -}}
serviceAccountName: {{ include "hbmwatch.serviceAccountName" . }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Container fields every hbmwatch container shares; (dict "root" $ "tokens" bool). */}}
{{- define "hbmwatch.container" -}}
image: {{ include "hbmwatch.image" .root }}
imagePullPolicy: {{ .root.Values.image.pullPolicy }}
securityContext:
  {{- toYaml .root.Values.securityContext | nindent 2 }}
env:
  {{- include "hbmwatch.env" . | nindent 2 }}
{{- end -}}

{{/* The read-only root's writable places: config, data (spool, SQLite), /tmp. */}}
{{- define "hbmwatch.mounts" -}}
- name: config
  mountPath: /etc/hbmwatch
  readOnly: true
- name: data
  mountPath: /var/lib/hbmwatch
- name: tmp
  mountPath: /tmp
{{- end -}}

{{- define "hbmwatch.volumes" -}}
- name: config
  configMap:
    name: {{ include "hbmwatch.fullname" . }}
- name: tmp
  emptyDir: {}
{{- end -}}

{{/* The hash that restarts pods when the settings change. */}}
{{- define "hbmwatch.configHash" -}}
checksum/config: {{ include "hbmwatch.config" . | sha256sum }}
{{- end -}}
