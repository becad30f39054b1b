{{/* Names and labels shared by every template. */}}

{{/* The name prefix: the release's name when it holds "skyscan" (`helm install skyscan` gives the
names manifests/ uses), else "<release>-skyscan". */}}
{{- define "skyscan.fullname" -}}
{{- if contains "skyscan" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-skyscan" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "skyscan.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: skyscan
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{ include "skyscan.selector" (dict "ctx" . "component" "") }}
{{- end -}}

{{/* The labels that select a component's Pods: (dict "ctx" $ "component" "shim"). */}}
{{- define "skyscan.selector" -}}
app.kubernetes.io/name: skyscan
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{- end -}}

{{- define "skyscan.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The settings ConfigMap's data: names and values first, `settings` over the derived defaults. */}}
{{- define "skyscan.settings" -}}
{{- $name := include "skyscan.fullname" . -}}
{{- $scheme := .Values.shim.tls.enabled | ternary "https" "http" -}}
{{- $out := dict
  "SKYSCAN_REST_ADDRESS" (printf "%s://%s-shim.%s.svc:8080" $scheme $name .Release.Namespace)
  "SKYSCAN_SIDECAR_IMAGE" (include "skyscan.image" .)
-}}
{{- if .Values.shim.tls.enabled }}
{{- $_ := set $out "SKYSCAN_REST_CA_CONFIGMAP" (printf "%s-shim-ca" $name) }}
{{- end }}
{{- range $key, $value := .Values.settings }}
{{- $_ := set $out $key (kindIs "string" $value | ternary $value (toJson $value)) }}
{{- end }}
{{- $_ := set $out "SKYSCAN_SCANNER_SERVICE_ACCOUNT" (printf "%s-scanner" $name) }}
{{- with .Values.wms.address }}{{ $_ := set $out "SKYSCAN_WMS_ADDRESS" . }}{{ end }}
{{- with .Values.wms.oidcIssuer }}{{ $_ := set $out "SKYSCAN_WMS_OIDC_ISSUER" . }}{{ end }}
{{- with .Values.oidc.issuers }}{{ $_ := set $out "SKYSCAN_OIDC_ISSUERS" (toJson .) }}{{ end }}
{{- with .Values.oidc.dashboard }}{{ if .issuer }}
{{- $_ := set $out "SKYSCAN_UI_OIDC_ISSUER" .issuer }}
{{- $_ := set $out "SKYSCAN_UI_OIDC_CLIENT_ID" .clientId }}
{{- $_ := set $out "SKYSCAN_UI_OIDC_SCOPES" .scopes }}
{{- end }}{{ end }}
{{- if .Values.tokens.secretName }}
{{- $_ := set $out "SKYSCAN_TOKEN_FILE" "/etc/skyscan/tokens/tokens.json" }}
{{- end }}
{{- if .Values.presignKey.secretName }}
{{- $_ := set $out "SKYSCAN_PRESIGN_KEY_FILE" "/etc/skyscan/presign/key" }}
{{- end }}
{{- toYaml $out }}
{{- end -}}

{{/* A NetworkPolicy egress rule to the cluster's DNS (networkPolicy.dns): its peers, port 53. */}}
{{- define "skyscan.dnsEgress" -}}
{{- if not .to }}
{{- fail "networkPolicy.dns.to: the cluster's DNS as NetworkPolicy peers (empty would allow port 53 anywhere)" }}
{{- end }}
- ports:
    - port: 53
      protocol: UDP
    - port: 53
      protocol: TCP
  to:
    {{- toYaml .to | nindent 4 }}
{{- end -}}

{{/* The admission policies' variables: the object written (the old one for a DELETE), its labels, the
old object's labels (the same on a CREATE: an UPDATE must find the object ours before and after). */}}
{{- define "skyscan.admissionVariables" -}}
variables:
  - name: target
    expression: "request.operation == 'DELETE' ? oldObject : object"
  - name: labels
    expression: "variables.target.metadata.?labels.orValue({})"
  - name: oldLabels
    expression: "request.operation == 'UPDATE' ? oldObject.metadata.?labels.orValue({}) : variables.labels"
  - name: scanId
    expression: "variables.labels[?'skyscan.io/scan-id'].orValue('')"
  - name: payload
    expression: "variables.labels[?'skyscan.io/payload'].orValue('')"
{{- end -}}
