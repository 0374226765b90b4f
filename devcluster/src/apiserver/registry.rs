//! Owns the catalogue of served resources: a static table of built-in
//! Kubernetes resources plus the resources of installed CRDs.
//!
//! Invariants:
//! 1. A resource is identified by `(group, plural)`; every served version of
//!    it shares one storage, so a CRD with two versions serves one set of
//!    objects under both (no conversion: `apiVersion` is rewritten).
//! 2. The CRD part is rebuilt from the stored CRD objects after every CRD
//!    write, under the store lock, so discovery and routing never disagree
//!    with the stored CRDs.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

/// One printer column of a resource (CRD `additionalPrinterColumns`).
#[derive(Clone, Debug)]
pub(crate) struct PrinterColumn {
    pub(crate) name: String,
    pub(crate) type_: String,
    pub(crate) format: String,
    pub(crate) description: String,
    pub(crate) priority: i64,
    pub(crate) json_path: String,
}

/// What the server knows about one served resource.
#[derive(Clone, Debug)]
pub(crate) struct ResourceInfo {
    pub(crate) group: String,
    /// Served versions, the storage (preferred) version first.
    pub(crate) versions: Vec<String>,
    pub(crate) plural: String,
    pub(crate) singular: String,
    pub(crate) kind: String,
    pub(crate) namespaced: bool,
    pub(crate) short_names: Vec<String>,
    pub(crate) categories: Vec<String>,
    /// Has a `status` subresource (status writes go through it only).
    pub(crate) status: bool,
    /// Built in (strategic merge patch allowed) rather than a CRD.
    pub(crate) builtin: bool,
    /// Per version: the structural schema of a CRD, if any.
    pub(crate) schemas: BTreeMap<String, Value>,
    /// Per version: printer columns of a CRD.
    pub(crate) columns: BTreeMap<String, Vec<PrinterColumn>>,
    /// CRD `selectableFields` (field selector labels, without the dot).
    pub(crate) selectable_fields: Vec<String>,
    /// CRD `subresources.scale`: where replicas and the selector live.
    pub(crate) scale: Option<ScalePaths>,
    /// Served for `get` and `list` only (`componentstatuses`).
    pub(crate) read_only: bool,
}

impl ScalePaths {
    /// The paths of the built-in workloads (`apps/v1` Deployments,
    /// ReplicaSets, StatefulSets).
    fn builtin() -> Self {
        Self {
            spec_replicas: "spec.replicas".into(),
            status_replicas: "status.replicas".into(),
            label_selector: Some("spec.selector".into()),
        }
    }
}

/// The paths a CRD's `scale` subresource reads and writes (JSON paths
/// without the leading dot, e.g. `spec.replicas`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ScalePaths {
    pub(crate) spec_replicas: String,
    pub(crate) status_replicas: String,
    pub(crate) label_selector: Option<String>,
}

impl ResourceInfo {
    /// The storage key of this resource: `group/plural`.
    pub(crate) fn key(&self) -> String {
        if self.builtin && self.group == "events.k8s.io" && self.plural == "events" {
            // Shares storage with core events (see `convert`).
            return "/events".into();
        }
        format!("{}/{}", self.group, self.plural)
    }

    /// `Kind` or `Kind.group`, as validation errors name an object's kind.
    pub(crate) fn group_kind(&self) -> String {
        if self.group.is_empty() {
            self.kind.clone()
        } else {
            format!("{}.{}", self.kind, self.group)
        }
    }

    /// `v1` or `group/version`.
    pub(crate) fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{}", self.group, version)
        }
    }

    /// The preferred (storage) version.
    pub(crate) fn preferred(&self) -> &str {
        &self.versions[0]
    }

    /// Whether this is a create-only review (access reviews, whoami): it
    /// answers a question and stores nothing.
    pub(crate) fn is_review(&self) -> bool {
        self.builtin
            && matches!(
                self.group.as_str(),
                "authorization.k8s.io" | "authentication.k8s.io"
            )
    }

    /// The subresources this resource serves.
    pub(crate) fn subresources(&self) -> Vec<&'static str> {
        let mut subs = Vec::new();
        if self.status {
            subs.push("status");
        }
        if self.scale.is_some() {
            subs.push("scale");
        }
        if self.builtin && self.group.is_empty() && self.plural == "pods" {
            subs.extend([
                "attach",
                "binding",
                "ephemeralcontainers",
                "eviction",
                "exec",
                "log",
                "portforward",
            ]);
        }
        if self.builtin && self.group.is_empty() && self.plural == "namespaces" {
            subs.push("finalize");
        }
        if self.builtin && self.group.is_empty() && self.plural == "serviceaccounts" {
            subs.push("token");
        }
        if self.builtin
            && self.group == "certificates.k8s.io"
            && self.plural == "certificatesigningrequests"
        {
            subs.push("approval");
        }
        subs
    }
}

struct Builtin {
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
    short: &'static [&'static str],
    status: bool,
}

const fn b(
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
    short: &'static [&'static str],
    status: bool,
) -> Builtin {
    Builtin {
        group,
        version,
        plural,
        kind,
        namespaced,
        short,
        status,
    }
}

const BUILTINS: &[Builtin] = &[
    b("", "v1", "namespaces", "Namespace", false, &["ns"], true),
    b("", "v1", "nodes", "Node", false, &["no"], true),
    b("", "v1", "pods", "Pod", true, &["po"], true),
    b("", "v1", "services", "Service", true, &["svc"], true),
    b("", "v1", "endpoints", "Endpoints", true, &["ep"], false),
    b("", "v1", "secrets", "Secret", true, &[], false),
    b("", "v1", "configmaps", "ConfigMap", true, &["cm"], false),
    b(
        "",
        "v1",
        "serviceaccounts",
        "ServiceAccount",
        true,
        &["sa"],
        false,
    ),
    b("", "v1", "events", "Event", true, &["ev"], false),
    b(
        "",
        "v1",
        "persistentvolumeclaims",
        "PersistentVolumeClaim",
        true,
        &["pvc"],
        true,
    ),
    b(
        "",
        "v1",
        "resourcequotas",
        "ResourceQuota",
        true,
        &["quota"],
        true,
    ),
    b(
        "",
        "v1",
        "limitranges",
        "LimitRange",
        true,
        &["limits"],
        false,
    ),
    b(
        "",
        "v1",
        "componentstatuses",
        "ComponentStatus",
        false,
        &["cs"],
        false,
    ),
    b(
        "apiregistration.k8s.io",
        "v1",
        "apiservices",
        "APIService",
        false,
        &[],
        true,
    ),
    b(
        "admissionregistration.k8s.io",
        "v1",
        "mutatingwebhookconfigurations",
        "MutatingWebhookConfiguration",
        false,
        &[],
        false,
    ),
    b(
        "admissionregistration.k8s.io",
        "v1",
        "validatingwebhookconfigurations",
        "ValidatingWebhookConfiguration",
        false,
        &[],
        false,
    ),
    b(
        "admissionregistration.k8s.io",
        "v1",
        "validatingadmissionpolicies",
        "ValidatingAdmissionPolicy",
        false,
        &[],
        true,
    ),
    b(
        "admissionregistration.k8s.io",
        "v1",
        "validatingadmissionpolicybindings",
        "ValidatingAdmissionPolicyBinding",
        false,
        &[],
        false,
    ),
    b(
        "autoscaling",
        "v2",
        "horizontalpodautoscalers",
        "HorizontalPodAutoscaler",
        true,
        &["hpa"],
        true,
    ),
    b(
        "certificates.k8s.io",
        "v1",
        "certificatesigningrequests",
        "CertificateSigningRequest",
        false,
        &["csr"],
        true,
    ),
    b(
        "storage.k8s.io",
        "v1",
        "csidrivers",
        "CSIDriver",
        false,
        &[],
        false,
    ),
    b(
        "storage.k8s.io",
        "v1",
        "csinodes",
        "CSINode",
        false,
        &[],
        false,
    ),
    b(
        "storage.k8s.io",
        "v1",
        "csistoragecapacities",
        "CSIStorageCapacity",
        true,
        &[],
        false,
    ),
    b(
        "storage.k8s.io",
        "v1",
        "storageclasses",
        "StorageClass",
        false,
        &["sc"],
        false,
    ),
    b(
        "storage.k8s.io",
        "v1",
        "volumeattachments",
        "VolumeAttachment",
        false,
        &[],
        true,
    ),
    b(
        "node.k8s.io",
        "v1",
        "runtimeclasses",
        "RuntimeClass",
        false,
        &[],
        false,
    ),
    b(
        "flowcontrol.apiserver.k8s.io",
        "v1",
        "flowschemas",
        "FlowSchema",
        false,
        &[],
        true,
    ),
    b(
        "flowcontrol.apiserver.k8s.io",
        "v1",
        "prioritylevelconfigurations",
        "PriorityLevelConfiguration",
        false,
        &[],
        true,
    ),
    b(
        "events.k8s.io",
        "v1",
        "events",
        "Event",
        true,
        &["ev"],
        false,
    ),
    b(
        "coordination.k8s.io",
        "v1",
        "leases",
        "Lease",
        true,
        &[],
        false,
    ),
    b(
        "discovery.k8s.io",
        "v1",
        "endpointslices",
        "EndpointSlice",
        true,
        &[],
        false,
    ),
    b(
        "apps",
        "v1",
        "deployments",
        "Deployment",
        true,
        &["deploy"],
        true,
    ),
    b(
        "apps",
        "v1",
        "statefulsets",
        "StatefulSet",
        true,
        &["sts"],
        true,
    ),
    b("apps", "v1", "daemonsets", "DaemonSet", true, &["ds"], true),
    b(
        "apps",
        "v1",
        "replicasets",
        "ReplicaSet",
        true,
        &["rs"],
        true,
    ),
    b("batch", "v1", "jobs", "Job", true, &[], true),
    b(
        "policy",
        "v1",
        "poddisruptionbudgets",
        "PodDisruptionBudget",
        true,
        &["pdb"],
        true,
    ),
    b(
        "networking.k8s.io",
        "v1",
        "networkpolicies",
        "NetworkPolicy",
        true,
        &["netpol"],
        false,
    ),
    b(
        "rbac.authorization.k8s.io",
        "v1",
        "roles",
        "Role",
        true,
        &[],
        false,
    ),
    b(
        "rbac.authorization.k8s.io",
        "v1",
        "rolebindings",
        "RoleBinding",
        true,
        &[],
        false,
    ),
    b(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterroles",
        "ClusterRole",
        false,
        &[],
        false,
    ),
    b(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "ClusterRoleBinding",
        false,
        &[],
        false,
    ),
    b(
        "scheduling.k8s.io",
        "v1",
        "priorityclasses",
        "PriorityClass",
        false,
        &["pc"],
        false,
    ),
    b(
        "authorization.k8s.io",
        "v1",
        "selfsubjectaccessreviews",
        "SelfSubjectAccessReview",
        false,
        &[],
        false,
    ),
    b(
        "authorization.k8s.io",
        "v1",
        "selfsubjectrulesreviews",
        "SelfSubjectRulesReview",
        false,
        &[],
        false,
    ),
    b(
        "authorization.k8s.io",
        "v1",
        "subjectaccessreviews",
        "SubjectAccessReview",
        false,
        &[],
        false,
    ),
    b(
        "authentication.k8s.io",
        "v1",
        "tokenreviews",
        "TokenReview",
        false,
        &[],
        false,
    ),
    b(
        "authentication.k8s.io",
        "v1",
        "selfsubjectreviews",
        "SelfSubjectReview",
        false,
        &[],
        false,
    ),
    b(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        false,
        &["crd", "crds"],
        true,
    ),
];

/// The served resources, built in and from CRDs.
#[derive(Clone, Debug, Default)]
pub(crate) struct Registry {
    builtin: Vec<Arc<ResourceInfo>>,
    crds: Vec<Arc<ResourceInfo>>,
}

impl Registry {
    /// A registry with the built-in resources only.
    pub(crate) fn new() -> Self {
        let builtin = BUILTINS
            .iter()
            .map(|r| {
                let mut categories = Vec::new();
                if matches!(
                    r.plural,
                    "pods"
                        | "services"
                        | "deployments"
                        | "statefulsets"
                        | "daemonsets"
                        | "replicasets"
                        | "jobs"
                        | "horizontalpodautoscalers"
                ) {
                    categories.push("all".to_string());
                }
                if matches!(
                    r.plural,
                    "apiservices"
                        | "mutatingwebhookconfigurations"
                        | "validatingwebhookconfigurations"
                        | "validatingadmissionpolicies"
                        | "validatingadmissionpolicybindings"
                ) {
                    categories.push("api-extensions".to_string());
                }
                // HorizontalPodAutoscalers are served as `autoscaling/v2`
                // and `v1` (`convert`); the rest in one version.
                let versions = if r.plural == "horizontalpodautoscalers" {
                    vec!["v2".to_string(), "v1".to_string()]
                } else {
                    vec![r.version.to_string()]
                };
                Arc::new(ResourceInfo {
                    group: r.group.into(),
                    versions,
                    plural: r.plural.into(),
                    singular: r.kind.to_lowercase(),
                    kind: r.kind.into(),
                    namespaced: r.namespaced,
                    short_names: r.short.iter().map(|s| s.to_string()).collect(),
                    categories,
                    status: r.status,
                    builtin: true,
                    schemas: BTreeMap::new(),
                    columns: BTreeMap::new(),
                    selectable_fields: Vec::new(),
                    scale: (r.group == "apps"
                        && matches!(r.plural, "deployments" | "replicasets" | "statefulsets"))
                    .then(ScalePaths::builtin),
                    read_only: r.plural == "componentstatuses",
                })
            })
            .collect();
        Self {
            builtin,
            crds: Vec::new(),
        }
    }

    /// Every served resource.
    pub(crate) fn all(&self) -> impl Iterator<Item = &Arc<ResourceInfo>> {
        self.builtin.iter().chain(self.crds.iter())
    }

    /// The resource served at `group/version/plural`.
    pub(crate) fn lookup(
        &self,
        group: &str,
        version: &str,
        plural: &str,
    ) -> Option<Arc<ResourceInfo>> {
        self.all()
            .find(|r| {
                r.group == group && r.plural == plural && r.versions.iter().any(|v| v == version)
            })
            .cloned()
    }

    /// The resource of a given key (`group/plural`).
    pub(crate) fn by_key(&self, key: &str) -> Option<Arc<ResourceInfo>> {
        self.all().find(|r| r.key() == key).cloned()
    }

    /// Groups with their versions (preferred first), `""` first, then in
    /// the real server's order (`apiregistration.k8s.io`, then by the
    /// built-in groups' priority, then custom resource groups).
    pub(crate) fn groups(&self) -> Vec<(String, Vec<String>)> {
        let mut out: Vec<(String, Vec<String>)> = Vec::new();
        for r in self.all() {
            let entry = match out.iter_mut().find(|(g, _)| *g == r.group) {
                Some(e) => e,
                None => {
                    out.push((r.group.clone(), Vec::new()));
                    out.last_mut().expect("just pushed")
                }
            };
            for v in &r.versions {
                if !entry.1.contains(v) {
                    entry.1.push(v.clone());
                }
            }
        }
        for (_, versions) in &mut out {
            versions.sort_by_key(|v| std::cmp::Reverse(version_priority(v)));
        }
        // Stable: groups of equal priority (custom resources) keep the
        // order they were installed in.
        out.sort_by_key(|(g, _)| {
            let first = g.is_empty() || g == "apiregistration.k8s.io";
            (!first, std::cmp::Reverse(group_priority(g).0))
        });
        out
    }

    /// Rebuilds the CRD part from the stored CRD objects.
    pub(crate) fn set_crds<'a>(&mut self, crds: impl Iterator<Item = &'a Value>) {
        self.crds = crds.filter_map(crd_info).map(Arc::new).collect();
    }
}

/// A group's and a version's place in discovery and their APIService
/// `groupPriorityMinimum` and `versionPriority` (kube-apiserver's
/// `apiVersionPriorities`; custom resources get 1000 and 100, as the CRD
/// registration controller gives them).
pub(crate) fn group_priority(group: &str) -> (i64, i64) {
    const TABLE: &[(&str, i64)] = &[
        ("", 18000),
        ("apps", 17800),
        ("events.k8s.io", 17750),
        ("authentication.k8s.io", 17700),
        ("authorization.k8s.io", 17600),
        ("autoscaling", 17500),
        ("batch", 17400),
        ("certificates.k8s.io", 17300),
        ("networking.k8s.io", 17200),
        ("policy", 17100),
        ("rbac.authorization.k8s.io", 17000),
        ("storage.k8s.io", 16800),
        ("admissionregistration.k8s.io", 16700),
        ("apiextensions.k8s.io", 16700),
        ("scheduling.k8s.io", 16600),
        ("coordination.k8s.io", 16500),
        ("node.k8s.io", 16300),
        ("discovery.k8s.io", 16200),
        ("flowcontrol.apiserver.k8s.io", 16100),
    ];
    TABLE
        .iter()
        .find(|(g, _)| *g == group)
        .map_or((1000, 100), |(_, p)| (*p, 15))
}

/// The `versionPriority` of a built-in group version (`group_priority`
/// gives the default).
pub(crate) fn version_priority_of(group: &str, version: &str) -> i64 {
    match (group, version) {
        ("", _) => 1,
        ("autoscaling", "v2") => 30,
        ("flowcontrol.apiserver.k8s.io", "v1") => 21,
        _ => group_priority(group).1,
    }
}

/// Kubernetes version priority: GA > beta > alpha, higher numbers first.
fn version_priority(v: &str) -> (u8, u32, u32) {
    let rest = v.strip_prefix('v').unwrap_or(v);
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    let major = digits.parse().unwrap_or(0);
    let tail = &rest[digits.len()..];
    let (stage, n) = if tail.is_empty() {
        (3, 0)
    } else if let Some(n) = tail.strip_prefix("beta") {
        (2, n.parse().unwrap_or(0))
    } else if let Some(n) = tail.strip_prefix("alpha") {
        (1, n.parse().unwrap_or(0))
    } else {
        (0, 0)
    };
    (stage, major, n)
}

/// The served resource of a stored CRD object, if it is well formed.
fn crd_info(crd: &Value) -> Option<ResourceInfo> {
    let spec = crd.get("spec")?;
    let names = spec.get("names")?;
    let s = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
    let strs = |v: Option<&Value>| {
        v.and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut versions: Vec<(bool, String)> = Vec::new();
    let mut schemas = BTreeMap::new();
    let mut columns = BTreeMap::new();
    let mut status = false;
    let mut selectable_fields = Vec::new();
    let mut scale = None;
    for v in spec.get("versions")?.as_array()? {
        let name = s(v.get("name"))?;
        if v.get("served").and_then(Value::as_bool) == Some(false) {
            continue;
        }
        let storage = v.get("storage").and_then(Value::as_bool).unwrap_or(false);
        if v.pointer("/subresources/status").is_some() {
            status = true;
        }
        if let Some(sc) = v.pointer("/subresources/scale") {
            let path = |k: &str| {
                sc.get(k)
                    .and_then(Value::as_str)
                    .map(|p| p.trim_start_matches('.').to_string())
            };
            scale = Some(ScalePaths {
                spec_replicas: path("specReplicasPath")?,
                status_replicas: path("statusReplicasPath")?,
                label_selector: path("labelSelectorPath"),
            });
        }
        for f in v
            .get("selectableFields")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(p) = f.get("jsonPath").and_then(Value::as_str) {
                selectable_fields.push(p.trim_start_matches('.').to_string());
            }
        }
        if let Some(schema) = v.pointer("/schema/openAPIV3Schema") {
            schemas.insert(name.clone(), schema.clone());
        }
        let cols = v
            .get("additionalPrinterColumns")
            .and_then(Value::as_array)
            .map(|cols| {
                cols.iter()
                    .filter_map(|c| {
                        Some(PrinterColumn {
                            name: s(c.get("name"))?,
                            type_: s(c.get("type")).unwrap_or_else(|| "string".into()),
                            format: s(c.get("format")).unwrap_or_default(),
                            description: s(c.get("description")).unwrap_or_default(),
                            priority: c.get("priority").and_then(Value::as_i64).unwrap_or(0),
                            json_path: s(c.get("jsonPath"))?,
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        columns.insert(name.clone(), cols);
        versions.push((storage, name));
    }
    if versions.is_empty() {
        return None;
    }
    versions.sort_by_key(|(storage, _)| !*storage);
    let kind = s(names.get("kind"))?;
    Some(ResourceInfo {
        group: s(spec.get("group"))?,
        versions: versions.into_iter().map(|(_, v)| v).collect(),
        plural: s(names.get("plural"))?,
        singular: s(names.get("singular")).unwrap_or_else(|| kind.to_lowercase()),
        kind,
        namespaced: spec.get("scope").and_then(Value::as_str) != Some("Cluster"),
        short_names: strs(names.get("shortNames")),
        categories: strs(names.get("categories")),
        status,
        builtin: false,
        schemas,
        columns,
        selectable_fields,
        scale,
        read_only: false,
    })
}
