{{/*
The objects of deploy/base and of the chosen overlay (files/ links to them), each read
with fromYaml and changed only where a value says so: the files are those
deploy/base/kustomization.yaml lists, so an object added there is installed by the
chart as by kustomize, with no copy here to keep in step (tests/deploy/test_helm_chart.py
renders both and compares them).
*/}}

{{- define "gpu-webhook.chartLabels" -}}
app.kubernetes.io/part-of: gpu-webhook
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | quote }}
{{- end }}

{{/* Resources of deploy/base the chart leaves out: the namespace is helm's (-n). */}}
{{- define "gpu-webhook.ownFiles" -}}
namespace.yaml
{{- end }}

{{/* The ledger ConfigMaps the replicas may read and write, one per tenant with a quota. */}}
{{- define "gpu-webhook.ledgers" -}}
{{- $names := list }}
{{- if .Values.policy.existingObject }}
{{- range .Values.policy.quotaTenants }}{{ $names = append $names (printf "gpu-webhook-ledger-%s" .) }}{{ end }}
{{- else }}
{{- range (include "gpu-webhook.policy" . | fromYaml).spec.tenants }}
{{- if .quota }}{{ $names = append $names (printf "gpu-webhook-ledger-%s" .name) }}{{ end }}
{{- end }}
{{- end }}
{{- toJson (dict "names" $names) }}
{{- end }}

{{/* The policy document served from the ConfigMap: policy.inline as a file's text
(--set-file policy.inline=policy.yaml, comments and line numbers kept) or as an object
(a values file), else the shipped example. */}}
{{- define "gpu-webhook.policy" -}}
{{- $p := .Values.policy.inline }}
{{- if kindIs "string" $p }}{{ $p }}{{ else if $p }}{{ toYaml $p }}{{ else }}{{ .Files.Get "files/base/policy.yaml" }}{{ end }}
{{- end }}

{{/* Whether an object of deploy/base is installed with these values ("yes" or ""). */}}
{{- define "gpu-webhook.wanted" -}}
{{- $v := .root.Values }}{{ $obj := .obj }}
{{- if and (eq $obj.kind "PodDisruptionBudget") (not $v.podDisruptionBudget.enabled) }}
{{- else if and (eq $obj.kind "ResourceQuota") (ne $v.priorityClassName "system-cluster-critical") }}
{{- else }}yes{{ end }}
{{- end }}

{{/* Change one object of deploy/base in place, as the values say. */}}
{{- define "gpu-webhook.adapt" -}}
{{- $root := .root }}{{ $v := $root.Values }}{{ $obj := .obj }}{{ $ns := $root.Release.Namespace }}
{{- $meta := $obj.metadata }}
{{- $_ := set $meta "labels" (merge (include "gpu-webhook.chartLabels" $root | fromYaml) ($meta.labels | default dict)) }}
{{- $cluster := list "Namespace" "ClusterRole" "ClusterRoleBinding" "CustomResourceDefinition" "MutatingWebhookConfiguration" "ValidatingWebhookConfiguration" "PriorityClass" }}
{{- if not (has $obj.kind $cluster) }}{{ $_ := set $meta "namespace" $ns }}{{ end }}
{{- range $obj.subjects | default list }}{{ if hasKey . "namespace" }}{{ $_ := set . "namespace" $ns }}{{ end }}{{ end }}

{{- if eq $obj.kind "CustomResourceDefinition" }}
{{- if $v.crds.keep }}{{ $_ := set $meta "annotations" (merge (dict "helm.sh/resource-policy" "keep") ($meta.annotations | default dict)) }}{{ end }}

{{- else if eq $obj.kind "Deployment" }}
{{- $_ := set $obj.spec "replicas" $v.replicas }}
{{- $pod := $obj.spec.template.spec }}
{{- if $v.priorityClassName }}{{ $_ := set $pod "priorityClassName" $v.priorityClassName }}{{ else }}{{ $_ := unset $pod "priorityClassName" }}{{ end }}
{{- $c := first $pod.containers }}
{{- $_ := set $c "image" (printf "%s:%s" $v.image.repository $v.image.tag) }}
{{- $_ := set $c "imagePullPolicy" $v.image.pullPolicy }}
{{- if $v.resources }}{{ $_ := set $c "resources" $v.resources }}{{ end }}
{{- if eq $v.certificates.mode "self-managed" }}
{{- /* the overlay's patch: its args, and the certificate volume in memory */}}
{{- $patch := $root.Files.Get "files/self-managed/deployment.yaml" | fromYaml }}
{{- $pc := first $patch.spec.template.spec.containers }}
{{- $_ := set $c "args" $pc.args }}
{{- $vols := list }}
{{- range $pod.volumes }}{{ if eq .name "certs" }}{{ range $patch.spec.template.spec.volumes }}{{ if eq .name "certs" }}{{ $vols = append $vols (omit . "secret") }}{{ end }}{{ end }}{{ else }}{{ $vols = append $vols . }}{{ end }}{{ end }}
{{- $_ := set $pod "volumes" $vols }}
{{- range $m := $c.volumeMounts }}{{ if eq $m.name "certs" }}{{ range $pc.volumeMounts }}{{ if eq .name "certs" }}{{ $_ := set $m "readOnly" .readOnly }}{{ end }}{{ end }}{{ end }}{{ end }}
{{- end }}
{{- if $v.policy.existingObject }}
{{- $args := list }}
{{- range $c.args }}{{ if hasPrefix "--policy=" . }}{{ $args = append $args (printf "--policy-object=%s" $v.policy.existingObject) }}{{ else }}{{ $args = append $args . }}{{ end }}{{ end }}
{{- $_ := set $c "args" $args }}
{{- $vols := list }}{{ range $pod.volumes }}{{ if ne .name "policy" }}{{ $vols = append $vols . }}{{ end }}{{ end }}
{{- $_ := set $pod "volumes" $vols }}
{{- $mounts := list }}{{ range $c.volumeMounts }}{{ if ne .name "policy" }}{{ $mounts = append $mounts . }}{{ end }}{{ end }}
{{- $_ := set $c "volumeMounts" $mounts }}
{{- end }}

{{- if eq $v.quotaCommit "leader" }}
{{- /* what deploy/components/leader-decides adds to the Deployment */}}
{{- $_ := set $c "env" (append $c.env (dict "name" "GPU_WEBHOOK_QUOTA_COMMIT" "value" "leader")) }}
{{- end }}

{{- else if and (eq $obj.kind "Service") (eq $v.quotaCommit "leader") }}
{{- /* and to the Service: reviews go to the pod the leader labels as its own */}}
{{- $_ := set $obj.spec "selector" (merge (dict "gpu-webhook.dev/quota-leader" "true") $obj.spec.selector) }}

{{- else if eq $obj.kind "PodDisruptionBudget" }}
{{- $_ := set $obj.spec "minAvailable" $v.podDisruptionBudget.minAvailable }}

{{- else if and (eq $obj.kind "Role") (eq $meta.name "gpu-webhook-quota-ledger") }}
{{- $ledgers := (include "gpu-webhook.ledgers" $root | fromJson).names }}
{{- $rules := list }}
{{- range $obj.rules }}
{{- if and (hasKey . "resourceNames") (has "configmaps" .resources) }}{{ if $ledgers }}{{ $rules = append $rules (set . "resourceNames" $ledgers) }}{{ end }}
{{- else }}{{ $rules = append $rules . }}{{ end }}
{{- end }}
{{- $_ := set $obj "rules" $rules }}

{{- else if or (eq $obj.kind "MutatingWebhookConfiguration") (eq $obj.kind "ValidatingWebhookConfiguration") }}
{{- if eq $v.certificates.mode "cert-manager" }}
{{- $_ := set $meta "annotations" (merge (dict "cert-manager.io/inject-ca-from" (printf "%s/gpu-webhook-serving" $ns)) ($meta.annotations | default dict)) }}
{{- end }}
{{- /* The install's choices, from which the leader renders the webhooks again from the
       policy it serves (--webhook-configurations-sync fix; webhook.policy.apiserver.drift) */}}
{{- $record := index $meta.annotations "gpu-webhook.dev/install" | fromJson }}
{{- $_ := set $record "namespace" $ns }}
{{- $_ := set $record "mutatingFailurePolicy" $v.failurePolicy }}
{{- $_ := set $record "validatingFailurePolicy" $v.failurePolicy }}
{{- $_ := set $record "exemptNamespaces" ($v.exemptNamespaces | uniq | sortAlpha) }}
{{- if $v.webhookURL }}{{ $_ := unset $record "service" }}{{ $_ := set $record "url" $v.webhookURL }}{{ end }}
{{- if ne $v.admissionMode "webhook" }}{{ $_ := set $record "admissionMode" $v.admissionMode }}{{ end }}
{{- $_ := set $meta.annotations "gpu-webhook.dev/install" (toJson $record) }}
{{- /* Installed already: its webhooks are those the leader wrote for the policy served,
       kept as they are (rendering deploy/base's again would take the example policy's
       back until the leader's next round). */}}
{{- $live := lookup "admissionregistration.k8s.io/v1" $obj.kind "" $meta.name }}
{{- if and $live (index ($live.metadata.annotations | default dict) "gpu-webhook.dev/install") }}
{{- $_ := set $obj "webhooks" $live.webhooks }}
{{- range $hook := $obj.webhooks }}
{{- /* as webhook.policy.apiserver.drift.ALWAYS_IGNORED: never failing closed */}}
{{- /* and, beside the native policies, the routes webhooks: they fail open */}}
{{- $routes := and (ne $v.admissionMode "webhook") (hasPrefix "routes" $hook.name) }}
{{- if not (or (hasPrefix "scale." $hook.name) (hasPrefix "release." $hook.name) (hasPrefix "policy-file." $hook.name) $routes) }}{{ $_ := set $hook "failurePolicy" $v.failurePolicy }}{{ end }}
{{- end }}
{{- else }}
{{- range $hook := $obj.webhooks }}
{{- if $v.webhookURL }}
{{- $_ := set $hook "clientConfig" (merge (dict "url" (printf "%s%s" (trimSuffix "/" $v.webhookURL) $hook.clientConfig.service.path)) (omit $hook.clientConfig "service")) }}
{{- else }}
{{- $_ := set $hook.clientConfig.service "namespace" $ns }}
{{- end }}
{{- if eq $hook.failurePolicy "Fail" }}{{ $_ := set $hook "failurePolicy" $v.failurePolicy }}{{ end }}
{{- if $hook.namespaceSelector }}
{{- range $e := $hook.namespaceSelector.matchExpressions }}
{{- if and (eq $e.key "kubernetes.io/metadata.name") (eq $e.operator "NotIn") }}
{{- $_ := set $e "values" (concat (without $e.values "gpu-webhook") (list $ns) $v.exemptNamespaces | uniq | sortAlpha) }}
{{- else if and (eq $e.key "kubernetes.io/metadata.name") (eq $e.operator "In") }}
{{- /* the policy ConfigMap's webhook: the release namespace's own */}}
{{- $_ := set $e "values" (list $ns) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{- else if eq $obj.kind "Certificate" }}
{{- if $obj.spec.dnsNames }}
{{- $_ := set $obj.spec "dnsNames" (list "gpu-webhook" (printf "gpu-webhook.%s" $ns) (printf "gpu-webhook.%s.svc" $ns) (printf "gpu-webhook.%s.svc.cluster.local" $ns)) }}
{{- end }}
{{- end }}
{{- end }}
