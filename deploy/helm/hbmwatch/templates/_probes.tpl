{{/* The API's own endpoints (api/routes/health.py): /healthz answers on the event loop
without the store; /readyz checks the store, its schema, the collector and detectors this
process runs. The startup probe covers migrations and the detectors' state load. */}}
{{- define "hbmwatch.apiProbes" -}}
startupProbe:
  httpGet: {path: /healthz, port: http}
  periodSeconds: 5
  failureThreshold: 60
livenessProbe:
  httpGet: {path: /healthz, port: http}
  periodSeconds: 15
  timeoutSeconds: 5
  failureThreshold: 4
readinessProbe:
  httpGet: {path: /readyz, port: http}
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 3
{{- end -}}
