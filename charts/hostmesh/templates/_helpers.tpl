{{/* Names, labels and the operator's RBAC rules, shared by the templates. */}}

{{- define "hostmesh.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "hostmesh.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "hostmesh.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "hostmesh.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hostmesh.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "hostmesh.labels" -}}
helm.sh/chart: {{ include "hostmesh.chart" . }}
{{ include "hostmesh.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: hostmesh
{{- end }}

{{- define "hostmesh.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "hostmesh.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "hostmesh.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end -}}
{{- end }}

{{/*
The rules the controllers need on the objects they manage, in every watched
namespace. Granted by a ClusterRole when watchNamespaces is empty, else by a
Role in each watched namespace. Every rule says why it is needed.
*/}}
{{- define "hostmesh.managerRules" -}}
# Worlds and ProcMeshes are the operator's input: the controllers watch them
# (list/watch), read them (get), and add/remove their finalizers (patch, update).
- apiGroups: ["hostmesh.dev"]
  resources: ["worlds", "procmeshes"]
  verbs: ["get", "list", "watch", "patch", "update"]
# Status is computed by the controllers and written through the status
# subresource (server-side apply is a patch; update for full replacement).
- apiGroups: ["hostmesh.dev"]
  resources: ["worlds/status", "procmeshes/status"]
  verbs: ["get", "patch", "update"]
# Owner references with blockOwnerDeletion on host pods, Services and Secrets
# need update on the owner's finalizers subresource (OwnerReferencesPermissionEnforcement).
- apiGroups: ["hostmesh.dev"]
  resources: ["worlds/finalizers", "procmeshes/finalizers"]
  verbs: ["update"]
# One pod per host rank: created, watched for readiness and failure reasons,
# patched (labels and annotations), and deleted to replace a failed host or
# recreate the gang.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# The headless Service per World that gives host pods their DNS names.
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# The per-World agent Secret: created once, then read to authenticate to the
# agents. No list/watch: the operator only reads Secrets it knows by name.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "create"]
# Events tell users what happened (host failed, proc failed, restarting, gave
# up); patch updates the count of a repeated Event.
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}
