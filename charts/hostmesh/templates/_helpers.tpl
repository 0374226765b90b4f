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
# (get, list, watch) and add or remove their finalizers (patch).
- apiGroups: ["hostmesh.dev"]
  resources: ["worlds", "procmeshes"]
  verbs: ["get", "list", "watch", "patch"]
# A World being deleted deletes its ProcMeshes first, so their procs stop
# gracefully before the host pods go; a finished World is deleted once its
# spec.ttlSecondsAfterFinished has passed.
- apiGroups: ["hostmesh.dev"]
  resources: ["procmeshes", "worlds"]
  verbs: ["delete"]
# Status is computed by the controllers and replaced whole through the status
# subresource, guarded by the resourceVersion it was computed from (update).
- apiGroups: ["hostmesh.dev"]
  resources: ["worlds/status", "procmeshes/status"]
  verbs: ["update"]
# Host pods, the Service and the Secret carry an owner reference to their
# World with blockOwnerDeletion, which needs update on the World's finalizers
# subresource (OwnerReferencesPermissionEnforcement).
- apiGroups: ["hostmesh.dev"]
  resources: ["worlds/finalizers"]
  verbs: ["update"]
# One pod per host rank: created (never patched), watched for readiness
# and failure reasons into the operator's cache (list, watch), and deleted
# to replace a failed host, recreate the gang, or roll a changed template.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "create", "delete"]
# The headless Service per World that gives host pods their DNS names,
# server-side applied (create, patch); garbage collection deletes it.
- apiGroups: [""]
  resources: ["services"]
  verbs: ["create", "patch"]
# The per-World agent Secret: created once, then read by name to authenticate
# to the agents; its recovery copy; and <world>-runtime, the runtime key for
# clients of the procs' actors. A Monarch TLS World's CA, host and client
# certificates: update renews them in place before they expire (and issues
# them anew under a new CA). No list or watch: the operator never
# enumerates Secrets.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "create", "update"]
# The stacks a stall captured, in ConfigMap <procmesh>-stacks, and a
# runtime-aware mesh's proc addresses, in <procmesh>-runtime (both owned by
# the ProcMesh): read by name, created once, replaced on a new stall or when
# the addresses change. No list, watch or delete (garbage collection removes
# them with their ProcMesh).
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "create", "update"]
# Events tell users what happened (host failed, proc failed, restarting, gave
# up); patch updates the count of a repeated Event.
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- if .Values.networkPolicy.enabled }}
# One NetworkPolicy per World (networkPolicy.enabled), server-side applied
# (create, patch) on every reconcile; garbage collection deletes it with its
# World.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["create", "patch"]
{{- else }}
# With networkPolicy.enabled off the operator deletes, once at start-up, the
# per-World NetworkPolicies an earlier install made: it lists them by the
# label hostmesh.dev/world (list) and deletes those a World owns (delete).
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["list", "delete"]
{{- end }}
{{- if .Values.kueue.enabled }}
# Kueue integration (docs/scheduling.md): the operator keeps one Workload per
# queued World (create; delete to replace a stale one; patch spec.active and
# Kueue's resource-in-use finalizer), reads it (get) and watches Workloads to
# act on admission and eviction at once (list, watch).
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# After an eviction, once the World's hosts are gone, the operator gives the
# quota back in the Workload's status, as Kueue's own integrations do.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads/status"]
  verbs: ["patch"]
{{- end }}
{{- if .Values.monarch.serveMonarchMesh }}
# Monarch's MonarchMeshes are the MonarchMesh controller's input (get, list,
# watch); it adds no finalizer.
- apiGroups: ["monarch.pytorch.org"]
  resources: ["monarchmeshes"]
  verbs: ["get", "list", "watch"]
# A MonarchMesh's status is replaced whole through the status subresource,
# guarded by the resourceVersion it was computed from (update).
- apiGroups: ["monarch.pytorch.org"]
  resources: ["monarchmeshes/status"]
  verbs: ["update"]
# Its World and <name>-svc Service carry an owner reference to it with
# blockOwnerDeletion (OwnerReferencesPermissionEnforcement).
- apiGroups: ["monarch.pytorch.org"]
  resources: ["monarchmeshes/finalizers"]
  verbs: ["update"]
# A MonarchMesh's World is server-side applied: create when it is new (patch
# is granted above).
- apiGroups: ["hostmesh.dev"]
  resources: ["worlds"]
  verbs: ["create"]
{{- end }}
{{- if .Values.gangScheduling.enabled }}
# Gang scheduling (spec.scheduling.gang): one PodGroup per World for the
# chosen provider, server-side applied (create, patch); garbage collection
# deletes it with the World.
- apiGroups: ["scheduling.x-k8s.io", "scheduling.volcano.sh"]
  resources: ["podgroups"]
  verbs: ["create", "patch"]
# Kubernetes' Workload API (docs/scheduling.md): PodGroups (one per gang)
# are also listed (the scheduler's PodGroupScheduled verdict, and groups of
# an earlier layout to remove) and deleted (their spec is immutable: a
# changed one is made again); v1alpha2's Workload holds their template.
- apiGroups: ["scheduling.k8s.io"]
  resources: ["podgroups"]
  verbs: ["create", "patch", "get", "list", "delete"]
# v1alpha2's Workload (one per World, the PodGroups' template): applied,
# read and deleted as its PodGroups are (its templates are immutable).
- apiGroups: ["scheduling.k8s.io"]
  resources: ["workloads"]
  verbs: ["create", "patch", "get", "delete"]
{{- end }}
{{- end }}

{{- define "hostmesh.kueueClusterRules" -}}
# Kueue admission names ResourceFlavors; their node labels and tolerations
# place the host pods (get by name only).
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["resourceflavors", "workloadpriorityclasses"]
  verbs: ["get"]
# A queued World's priority is its pods' PriorityClass value (get by name).
- apiGroups: ["scheduling.k8s.io"]
  resources: ["priorityclasses"]
  verbs: ["get"]
{{- end }}
