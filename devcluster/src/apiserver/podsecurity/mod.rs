//! Owns PodSecurity admission: the Pod Security Standards (`baseline`,
//! `restricted`) checked against new pods (and, for warnings, the pod
//! templates of workloads) in namespaces that ask for them with the
//! `pod-security.kubernetes.io/enforce` and `.../warn` labels.
//!
//! Invariants:
//! 1. A pod is created in a namespace labelled `enforce: <level>` only if
//!    it passes every check of that level; otherwise 403 with the real
//!    server's message, `pods "p" is forbidden: violates PodSecurity
//!    "restricted:latest": <reason> (<detail>), ...`, one entry per failed
//!    check, in the real server's order.
//! 2. A pod or workload template failing the `warn` level is admitted, with
//!    one `299 - "would violate PodSecurity ..."` warning. Workload
//!    templates are never refused (as in Kubernetes, `enforce` applies to
//!    pods only).
//! 3. Levels: `privileged` (no checks), `baseline`, `restricted` (baseline
//!    plus its own checks, which replace baseline's capabilities, hostPath
//!    and seccomp checks). An unknown level fails closed to `restricted`;
//!    `-version` labels are read as `latest`; `audit` is not evaluated (no
//!    audit log here).
//! 4. The checks read the pod as sent plus the defaults and the
//!    ServiceAccount volume admission added (mutation precedes
//!    validation); nothing here panics on malformed input (a field of the
//!    wrong type counts as unset).

use serde_json::Value;
use tracing::debug;

use super::status::ApiError;
use super::store::Store;

const LABEL_PREFIX: &str = "pod-security.kubernetes.io/";

/// A Pod Security Standards level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Level {
    Privileged,
    Baseline,
    Restricted,
}

impl Level {
    /// A label value; unknown values fail closed (invariant 3).
    fn parse(v: &str) -> Self {
        match v {
            "privileged" => Self::Privileged,
            "baseline" => Self::Baseline,
            _ => Self::Restricted,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Privileged => "privileged",
            Self::Baseline => "baseline",
            Self::Restricted => "restricted",
        }
    }
}

/// What a namespace's labels ask for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Policy {
    pub(crate) enforce: Option<Level>,
    pub(crate) warn: Option<Level>,
}

impl Policy {
    /// The policy of a namespace object.
    pub(crate) fn of_namespace(ns: &Value) -> Self {
        let label = |mode: &str| {
            ns.pointer("/metadata/labels")
                .and_then(|l| l.get(format!("{LABEL_PREFIX}{mode}")))
                .and_then(Value::as_str)
                .map(Level::parse)
        };
        Self {
            enforce: label("enforce"),
            warn: label("warn"),
        }
    }

    /// The policy of namespace `ns` as stored now.
    pub(crate) fn lookup(store: &Store, ns: &str) -> Self {
        let obj = store.lock().get("/namespaces", "", ns);
        obj.map(|o| Self::of_namespace(&o)).unwrap_or_default()
    }

    /// Admission of a new pod (invariants 1, 2): the warnings to send, or
    /// 403.
    pub(crate) fn admit_pod(&self, pod: &Value) -> Result<Vec<String>, ApiError> {
        let spec = pod.get("spec").unwrap_or(&Value::Null);
        let annotations = pod.pointer("/metadata/annotations");
        if let Some(level) = self.enforce.filter(|l| *l != Level::Privileged) {
            let failed = evaluate(level, spec, annotations);
            if !failed.is_empty() {
                let name = pod.pointer("/metadata/name").and_then(Value::as_str);
                debug!(
                    pod = name.unwrap_or(""),
                    level = level.name(),
                    "PodSecurity refused a pod"
                );
                return Err(ApiError::forbidden(format!(
                    "pods \"{}\" is forbidden: violates PodSecurity \"{}:latest\": {}",
                    name.unwrap_or(""),
                    level.name(),
                    render(&failed)
                )));
            }
        }
        Ok(self.warnings(spec, annotations))
    }

    /// Warnings for a workload's pod template (invariant 2); none for
    /// objects that carry no template.
    pub(crate) fn warn_template(&self, plural: &str, obj: &Value) -> Vec<String> {
        let template = match plural {
            "deployments"
            | "statefulsets"
            | "daemonsets"
            | "replicasets"
            | "jobs"
            | "replicationcontrollers" => obj.pointer("/spec/template"),
            "cronjobs" => obj.pointer("/spec/jobTemplate/spec/template"),
            _ => None,
        };
        let Some(t) = template else { return Vec::new() };
        self.warnings(
            t.get("spec").unwrap_or(&Value::Null),
            t.pointer("/metadata/annotations"),
        )
    }

    fn warnings(&self, spec: &Value, annotations: Option<&Value>) -> Vec<String> {
        let Some(level) = self.warn.filter(|l| *l != Level::Privileged) else {
            return Vec::new();
        };
        let failed = evaluate(level, spec, annotations);
        if failed.is_empty() {
            return Vec::new();
        }
        vec![format!(
            "would violate PodSecurity \"{}:latest\": {}",
            level.name(),
            render(&failed)
        )]
    }
}

/// One failed check: the real server's `forbiddenReason` and
/// `forbiddenDetail`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Violation {
    pub(crate) reason: String,
    pub(crate) detail: String,
}

fn render(failed: &[Violation]) -> String {
    failed
        .iter()
        .map(|v| format!("{} ({})", v.reason, v.detail))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A warning as a `Warning` header value (RFC 7234: code, agent, quoted
/// text); characters a header cannot carry become `?`.
pub(crate) fn warning_header(text: &str) -> String {
    let escaped: String = text
        .chars()
        .flat_map(|c| match c {
            '"' | '\\' => vec!['\\', c],
            ' '..='~' => vec![c],
            _ => vec!['?'],
        })
        .collect();
    format!("299 - \"{escaped}\"")
}

mod baseline;
mod pod;
mod restricted;
#[cfg(test)]
mod tests;

use baseline::*;
use pod::containers;
use restricted::*;

/// Every check of `level` the pod fails, in the real server's order (by
/// check id: baseline's, then restricted's).
pub(crate) fn evaluate(level: Level, spec: &Value, annotations: Option<&Value>) -> Vec<Violation> {
    if level == Level::Privileged {
        return Vec::new();
    }
    let cs = containers(spec);
    let psc = spec.get("securityContext").unwrap_or(&Value::Null);
    let restricted = level == Level::Restricted;
    let mut out = vec![
        app_armor(psc, &cs, annotations),
        if restricted {
            None
        } else {
            capabilities_baseline(&cs)
        },
        host_namespaces(spec),
        if restricted { None } else { host_path(spec) },
        host_ports(&cs),
        privileged(&cs),
        proc_mount(&cs),
        se_linux(psc, &cs),
        if restricted {
            None
        } else {
            seccomp_baseline(psc, &cs)
        },
        sysctls(psc),
        host_process(psc, &cs),
    ];
    if restricted {
        out.extend([
            allow_privilege_escalation(&cs),
            capabilities_restricted(&cs),
            restricted_volumes(spec),
            run_as_non_root(psc, &cs),
            run_as_user(psc, &cs),
            seccomp_restricted(psc, &cs),
        ]);
    }
    out.into_iter().flatten().collect()
}
