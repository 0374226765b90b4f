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

use std::collections::BTreeSet;

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

/// A container of the pod with its security context.
struct Ctr<'a> {
    name: &'a str,
    c: &'a Value,
}

impl Ctr<'_> {
    fn sc(&self, field: &str) -> Option<&Value> {
        self.c.get("securityContext").and_then(|s| s.get(field))
    }
}

fn containers(spec: &Value) -> Vec<Ctr<'_>> {
    ["initContainers", "containers", "ephemeralContainers"]
        .iter()
        .filter_map(|l| spec.get(*l).and_then(Value::as_array))
        .flatten()
        .map(|c| Ctr {
            name: c.get("name").and_then(Value::as_str).unwrap_or(""),
            c,
        })
        .collect()
}

fn quote_join<S: AsRef<str>>(items: impl IntoIterator<Item = S>) -> String {
    items
        .into_iter()
        .map(|s| format!("\"{}\"", s.as_ref()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn plural<'a>(one: &'a str, many: &'a str, n: usize) -> &'a str {
    if n == 1 { one } else { many }
}

/// `container "a"` / `containers "a", "b"`.
fn ctrs(names: &[&str]) -> String {
    format!(
        "{} {}",
        plural("container", "containers", names.len()),
        quote_join(names)
    )
}

/// `pod`, `container "a"`, `pod and containers "a", "b"`.
fn setters(pod: bool, names: &[&str]) -> String {
    let mut parts = Vec::new();
    if pod {
        parts.push("pod".to_string());
    }
    if !names.is_empty() {
        parts.push(ctrs(names));
    }
    parts.join(" and ")
}

fn bool_at(v: Option<&Value>) -> Option<bool> {
    v.and_then(Value::as_bool)
}

fn str_at(v: Option<&Value>) -> &str {
    v.and_then(Value::as_str).unwrap_or("")
}

fn violation(reason: &str, detail: String) -> Option<Violation> {
    Some(Violation {
        reason: reason.to_string(),
        detail,
    })
}

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

fn app_armor(psc: &Value, cs: &[Ctr<'_>], annotations: Option<&Value>) -> Option<Violation> {
    const PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";
    let mut bad: Vec<String> = annotations
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.starts_with(PREFIX))
        .filter_map(|(k, v)| {
            let v = v.as_str().unwrap_or("");
            let ok = v.is_empty() || v == "runtime/default" || v.starts_with("localhost/");
            (!ok).then(|| format!("{k}=\"{v}\""))
        })
        .collect();
    let unconfined = |sc: Option<&Value>| str_at(sc.and_then(|a| a.get("type"))) == "Unconfined";
    if unconfined(psc.get("appArmorProfile")) {
        bad.push("pod must not set AppArmor profile type to \"Unconfined\"".into());
    }
    for c in cs.iter().filter(|c| unconfined(c.sc("appArmorProfile"))) {
        bad.push(format!(
            "container \"{}\" must not set AppArmor profile type to \"Unconfined\"",
            c.name
        ));
    }
    if bad.is_empty() {
        return None;
    }
    let reason = plural(
        "forbidden AppArmor profile",
        "forbidden AppArmor profiles",
        bad.len(),
    );
    violation(reason, bad.join(", "))
}

/// The capabilities baseline lets a container add.
const BASELINE_CAPS: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

fn added_caps<'a>(c: &Ctr<'a>) -> Vec<&'a str> {
    c.c.pointer("/securityContext/capabilities/add")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|v| v.as_str().unwrap_or(""))
        .collect()
}

fn capabilities_baseline(cs: &[Ctr<'_>]) -> Option<Violation> {
    let mut names = Vec::new();
    let mut caps = BTreeSet::new();
    for c in cs {
        let bad: Vec<&str> = added_caps(c)
            .into_iter()
            .filter(|cap| !BASELINE_CAPS.contains(cap))
            .collect();
        if !bad.is_empty() {
            names.push(c.name);
            caps.extend(bad);
        }
    }
    if names.is_empty() {
        return None;
    }
    violation(
        "non-default capabilities",
        format!(
            "{} must not include {} in securityContext.capabilities.add",
            ctrs(&names),
            quote_join(&caps)
        ),
    )
}

fn host_namespaces(spec: &Value) -> Option<Violation> {
    let set: Vec<String> = ["hostNetwork", "hostPID", "hostIPC"]
        .iter()
        .filter(|f| bool_at(spec.get(**f)) == Some(true))
        .map(|f| format!("{f}=true"))
        .collect();
    (!set.is_empty()).then(|| Violation {
        reason: "host namespaces".into(),
        detail: set.join(", "),
    })
}

fn volumes(spec: &Value) -> impl Iterator<Item = &Value> {
    spec.get("volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

fn volume_name(v: &Value) -> &str {
    str_at(v.get("name"))
}

fn host_path(spec: &Value) -> Option<Violation> {
    let names: Vec<&str> = volumes(spec)
        .filter(|v| v.get("hostPath").is_some_and(|h| !h.is_null()))
        .map(volume_name)
        .collect();
    if names.is_empty() {
        return None;
    }
    violation(
        "hostPath volumes",
        format!(
            "{} {}",
            plural("volume", "volumes", names.len()),
            quote_join(&names)
        ),
    )
}

fn host_ports(cs: &[Ctr<'_>]) -> Option<Violation> {
    let mut names = Vec::new();
    let mut ports = BTreeSet::new();
    for c in cs {
        let used: Vec<i64> =
            c.c.get("ports")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|p| p.get("hostPort").and_then(Value::as_i64))
                .filter(|p| *p != 0)
                .collect();
        if !used.is_empty() {
            names.push(c.name);
            ports.extend(used);
        }
    }
    if names.is_empty() {
        return None;
    }
    let ports: Vec<String> = ports.iter().map(i64::to_string).collect();
    violation(
        "hostPort",
        format!(
            "{} {} {} {}",
            ctrs(&names),
            plural("uses", "use", names.len()),
            plural("hostPort", "hostPorts", ports.len()),
            ports.join(", ")
        ),
    )
}

fn privileged(cs: &[Ctr<'_>]) -> Option<Violation> {
    let names: Vec<&str> = cs
        .iter()
        .filter(|c| bool_at(c.sc("privileged")) == Some(true))
        .map(|c| c.name)
        .collect();
    if names.is_empty() {
        return None;
    }
    violation(
        "privileged",
        format!(
            "{} must not set securityContext.privileged=true",
            ctrs(&names)
        ),
    )
}

fn proc_mount(cs: &[Ctr<'_>]) -> Option<Violation> {
    let mut names = Vec::new();
    let mut values = BTreeSet::new();
    for c in cs {
        let v = str_at(c.sc("procMount"));
        if !v.is_empty() && v != "Default" {
            names.push(c.name);
            values.insert(v);
        }
    }
    if names.is_empty() {
        return None;
    }
    violation(
        "procMount",
        format!(
            "{} {} forbidden securityContext.procMount {} {}",
            ctrs(&names),
            plural("sets", "set", names.len()),
            plural("value", "values", values.len()),
            quote_join(&values)
        ),
    )
}

fn se_linux(psc: &Value, cs: &[Ctr<'_>]) -> Option<Violation> {
    const TYPES: &[&str] = &[
        "",
        "container_t",
        "container_init_t",
        "container_kvm_t",
        "container_engine_t",
    ];
    let mut types = BTreeSet::new();
    let (mut user, mut role) = (false, false);
    let mut inspect = |opts: Option<&Value>| {
        let Some(o) = opts.filter(|o| !o.is_null()) else {
            return false;
        };
        let t = str_at(o.get("type"));
        let bad_type = !TYPES.contains(&t);
        if bad_type {
            types.insert(t.to_string());
        }
        let u = !str_at(o.get("user")).is_empty();
        let r = !str_at(o.get("role")).is_empty();
        user |= u;
        role |= r;
        bad_type || u || r
    };
    let pod = inspect(psc.get("seLinuxOptions"));
    let names: Vec<&str> = cs
        .iter()
        .filter(|c| inspect(c.sc("seLinuxOptions")))
        .map(|c| c.name)
        .collect();
    if !pod && names.is_empty() {
        return None;
    }
    let mut data = Vec::new();
    if !types.is_empty() {
        data.push(format!(
            "{} {}",
            plural("type", "types", types.len()),
            quote_join(&types)
        ));
    }
    if user {
        data.push("user may not be set".to_string());
    }
    if role {
        data.push("role may not be set".to_string());
    }
    violation(
        "seLinuxOptions",
        format!(
            "{} set forbidden securityContext.seLinuxOptions: {}",
            setters(pod, &names),
            data.join("; ")
        ),
    )
}

fn seccomp_type(sc: Option<&Value>) -> Option<&str> {
    sc.and_then(|s| s.get("type")).and_then(Value::as_str)
}

fn seccomp_baseline(psc: &Value, cs: &[Ctr<'_>]) -> Option<Violation> {
    let unconfined = |sc: Option<&Value>| seccomp_type(sc) == Some("Unconfined");
    let pod = unconfined(psc.get("seccompProfile"));
    let names: Vec<&str> = cs
        .iter()
        .filter(|c| unconfined(c.sc("seccompProfile")))
        .map(|c| c.name)
        .collect();
    if !pod && names.is_empty() {
        return None;
    }
    violation(
        "seccompProfile",
        format!(
            "{} must not set securityContext.seccompProfile.type to \"Unconfined\"",
            setters(pod, &names)
        ),
    )
}

/// The sysctls baseline allows (namespaced, safe ones; Kubernetes 1.33).
const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
];

fn sysctls(psc: &Value) -> Option<Violation> {
    let bad: Vec<&str> = psc
        .get("sysctls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|s| str_at(s.get("name")))
        .filter(|n| !SAFE_SYSCTLS.contains(n))
        .collect();
    (!bad.is_empty()).then(|| Violation {
        reason: "forbidden sysctls".into(),
        detail: bad.join(", "),
    })
}

fn host_process(psc: &Value, cs: &[Ctr<'_>]) -> Option<Violation> {
    let set = |w: Option<&Value>| bool_at(w.and_then(|w| w.get("hostProcess"))) == Some(true);
    let pod = set(psc.get("windowsOptions"));
    let names: Vec<&str> = cs
        .iter()
        .filter(|c| set(c.sc("windowsOptions")))
        .map(|c| c.name)
        .collect();
    if !pod && names.is_empty() {
        return None;
    }
    violation(
        "hostProcess",
        format!(
            "{} must not set securityContext.windowsOptions.hostProcess=true",
            setters(pod, &names)
        ),
    )
}

fn allow_privilege_escalation(cs: &[Ctr<'_>]) -> Option<Violation> {
    let names: Vec<&str> = cs
        .iter()
        .filter(|c| bool_at(c.sc("allowPrivilegeEscalation")) != Some(false))
        .map(|c| c.name)
        .collect();
    if names.is_empty() {
        return None;
    }
    violation(
        "allowPrivilegeEscalation != false",
        format!(
            "{} must set securityContext.allowPrivilegeEscalation=false",
            ctrs(&names)
        ),
    )
}

fn capabilities_restricted(cs: &[Ctr<'_>]) -> Option<Violation> {
    let mut no_drop = Vec::new();
    let mut adders = Vec::new();
    let mut caps = BTreeSet::new();
    for c in cs {
        let drops_all =
            c.c.pointer("/securityContext/capabilities/drop")
                .and_then(Value::as_array)
                .is_some_and(|d| d.iter().any(|x| x == "ALL"));
        if !drops_all {
            no_drop.push(c.name);
        }
        let bad: Vec<&str> = added_caps(c)
            .into_iter()
            .filter(|cap| *cap != "NET_BIND_SERVICE")
            .collect();
        if !bad.is_empty() {
            adders.push(c.name);
            caps.extend(bad);
        }
    }
    let mut details = Vec::new();
    if !no_drop.is_empty() {
        details.push(format!(
            "{} must set securityContext.capabilities.drop=[\"ALL\"]",
            ctrs(&no_drop)
        ));
    }
    if !adders.is_empty() {
        details.push(format!(
            "{} must not include {} in securityContext.capabilities.add",
            ctrs(&adders),
            quote_join(&caps)
        ));
    }
    if details.is_empty() {
        return None;
    }
    violation("unrestricted capabilities", details.join("; "))
}

/// The volume types restricted allows.
const RESTRICTED_VOLUMES: &[&str] = &[
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

fn restricted_volumes(spec: &Value) -> Option<Violation> {
    let mut names = Vec::new();
    let mut types = BTreeSet::new();
    for v in volumes(spec) {
        let kind = v
            .as_object()
            .into_iter()
            .flatten()
            .find(|(k, val)| *k != "name" && !val.is_null())
            .map_or("unknown", |(k, _)| k.as_str());
        if !RESTRICTED_VOLUMES.contains(&kind) {
            names.push(volume_name(v));
            types.insert(kind);
        }
    }
    if names.is_empty() {
        return None;
    }
    violation(
        "restricted volume types",
        format!(
            "{} {} {} restricted volume {} {}",
            plural("volume", "volumes", names.len()),
            quote_join(&names),
            plural("uses", "use", names.len()),
            plural("type", "types", types.len()),
            quote_join(&types)
        ),
    )
}

fn run_as_non_root(psc: &Value, cs: &[Ctr<'_>]) -> Option<Violation> {
    let pod = bool_at(psc.get("runAsNonRoot"));
    let mut explicit = Vec::new();
    let mut implicit = Vec::new();
    for c in cs {
        match bool_at(c.sc("runAsNonRoot")) {
            Some(true) => {}
            Some(false) => explicit.push(c.name),
            None if pod == Some(true) => {}
            None => implicit.push(c.name),
        }
    }
    let mut details = Vec::new();
    if pod == Some(false) {
        details.push("pod must not set securityContext.runAsNonRoot=false".to_string());
    }
    if !explicit.is_empty() {
        details.push(format!(
            "{} must not set securityContext.runAsNonRoot=false",
            ctrs(&explicit)
        ));
    }
    if !implicit.is_empty() {
        details.push(format!(
            "pod or {} must set securityContext.runAsNonRoot=true",
            ctrs(&implicit)
        ));
    }
    if details.is_empty() {
        return None;
    }
    violation("runAsNonRoot != true", details.join("; "))
}

fn run_as_user(psc: &Value, cs: &[Ctr<'_>]) -> Option<Violation> {
    let root = |v: Option<&Value>| v.and_then(Value::as_i64) == Some(0);
    let pod = root(psc.get("runAsUser"));
    let names: Vec<&str> = cs
        .iter()
        .filter(|c| root(c.sc("runAsUser")))
        .map(|c| c.name)
        .collect();
    if !pod && names.is_empty() {
        return None;
    }
    violation(
        "runAsUser=0",
        format!("{} must not set runAsUser=0", setters(pod, &names)),
    )
}

fn seccomp_restricted(psc: &Value, cs: &[Ctr<'_>]) -> Option<Violation> {
    let valid = |t: &str| t == "RuntimeDefault" || t == "Localhost";
    let pod_type = seccomp_type(psc.get("seccompProfile"));
    let pod_bad = pod_type.is_some_and(|t| !valid(t));
    let pod_ok = pod_type.is_some_and(valid);
    let mut values = BTreeSet::new();
    if let Some(t) = pod_type.filter(|t| !valid(t)) {
        values.insert(t);
    }
    let mut explicit = Vec::new();
    let mut implicit = Vec::new();
    for c in cs {
        match seccomp_type(c.sc("seccompProfile")) {
            Some(t) if valid(t) => {}
            Some(t) => {
                explicit.push(c.name);
                values.insert(t);
            }
            None if pod_ok => {}
            None => implicit.push(c.name),
        }
    }
    let mut details = Vec::new();
    if pod_bad || !explicit.is_empty() {
        details.push(format!(
            "{} must not set securityContext.seccompProfile.type to {}",
            setters(pod_bad, &explicit),
            quote_join(&values)
        ));
    }
    if !implicit.is_empty() {
        details.push(format!(
            "pod or {} must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\"",
            ctrs(&implicit)
        ));
    }
    if details.is_empty() {
        return None;
    }
    violation("seccompProfile", details.join("; "))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A pod that meets `restricted`: non-root, seccomp RuntimeDefault on
    /// the pod, every container dropping ALL without escalation.
    fn compliant() -> Value {
        let sc = json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}});
        json!({
            "metadata": {"name": "p"},
            "spec": {
                "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
                "initContainers": [{"name": "i", "image": "x", "securityContext": sc}],
                "containers": [{"name": "c", "image": "x", "securityContext": sc}],
                "volumes": [
                    {"name": "s", "secret": {"secretName": "s", "defaultMode": 288}},
                    {"name": "e", "emptyDir": {}},
                    {"name": "kube-api-access-abcde", "projected": {"sources": []}},
                ],
            },
        })
    }

    fn with(mut pod: Value, path: &str, v: Value) -> Value {
        let mut cur = &mut pod;
        for part in path.split('/') {
            cur = match part.parse::<usize>() {
                Ok(i) => &mut cur[i],
                Err(_) => &mut cur[part],
            };
        }
        *cur = v;
        pod
    }

    fn check(level: Level, pod: &Value) -> Vec<Violation> {
        evaluate(level, &pod["spec"], pod.pointer("/metadata/annotations"))
    }

    /// The rendered `reason (detail)` list for a pod at a level.
    fn msg(level: Level, pod: &Value) -> String {
        render(&check(level, pod))
    }

    #[test]
    fn a_compliant_pod_passes_every_level() {
        for level in [Level::Privileged, Level::Baseline, Level::Restricted] {
            assert_eq!(check(level, &compliant()), vec![], "{level:?}");
        }
    }

    #[test]
    fn a_minimal_pod_passes_baseline_and_fails_restricted_as_the_real_server_says() {
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x"}]}});
        assert_eq!(msg(Level::Baseline, &pod), "");
        assert_eq!(
            msg(Level::Restricted, &pod),
            "allowPrivilegeEscalation != false (container \"c\" must set securityContext.allowPrivilegeEscalation=false), \
             unrestricted capabilities (container \"c\" must set securityContext.capabilities.drop=[\"ALL\"]), \
             runAsNonRoot != true (pod or container \"c\" must set securityContext.runAsNonRoot=true), \
             seccompProfile (pod or container \"c\" must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")"
        );
    }

    #[test]
    fn host_namespaces_are_baseline_violations() {
        let pod = with(compliant(), "spec/hostNetwork", json!(true));
        let pod = with(pod, "spec/hostIPC", json!(true));
        assert_eq!(
            msg(Level::Baseline, &pod),
            "host namespaces (hostNetwork=true, hostIPC=true)"
        );
        assert_eq!(
            msg(Level::Restricted, &pod),
            "host namespaces (hostNetwork=true, hostIPC=true)"
        );
    }

    #[test]
    fn privileged_containers_are_named() {
        let pod = with(
            compliant(),
            "spec/containers/0/securityContext/privileged",
            json!(true),
        );
        let pod = with(
            pod,
            "spec/initContainers/0/securityContext/privileged",
            json!(true),
        );
        assert_eq!(
            msg(Level::Baseline, &pod),
            "privileged (containers \"i\", \"c\" must not set securityContext.privileged=true)"
        );
    }

    #[test]
    fn capabilities_beyond_the_default_set_fail_baseline_and_restricted_differently() {
        let pod = with(
            compliant(),
            "spec/containers/0/securityContext/capabilities/add",
            json!(["SYS_ADMIN", "CHOWN", "NET_BIND_SERVICE"]),
        );
        assert_eq!(
            msg(Level::Baseline, &pod),
            "non-default capabilities (container \"c\" must not include \"SYS_ADMIN\" in securityContext.capabilities.add)"
        );
        assert_eq!(
            msg(Level::Restricted, &pod),
            "unrestricted capabilities (container \"c\" must not include \"CHOWN\", \"SYS_ADMIN\" in securityContext.capabilities.add)"
        );
        let no_drop = with(
            compliant(),
            "spec/initContainers/0/securityContext/capabilities",
            json!({"drop": ["NET_RAW"]}),
        );
        assert_eq!(
            msg(Level::Restricted, &no_drop),
            "unrestricted capabilities (container \"i\" must set securityContext.capabilities.drop=[\"ALL\"])"
        );
    }

    #[test]
    fn host_path_volumes_fail_baseline_and_restricted_volume_types() {
        let pod = with(
            compliant(),
            "spec/volumes/1",
            json!({"name": "h", "hostPath": {"path": "/"}}),
        );
        let pod = with(
            pod,
            "spec/volumes/0",
            json!({"name": "n", "nfs": {"server": "x", "path": "/"}}),
        );
        assert_eq!(
            msg(Level::Baseline, &pod),
            "hostPath volumes (volume \"h\")"
        );
        assert_eq!(
            msg(Level::Restricted, &pod),
            "restricted volume types (volumes \"n\", \"h\" use restricted volume types \"hostPath\", \"nfs\")"
        );
    }

    #[test]
    fn host_ports_are_listed() {
        let pod = with(
            compliant(),
            "spec/containers/0/ports",
            json!([{"containerPort": 80, "hostPort": 8080}, {"containerPort": 81}]),
        );
        assert_eq!(
            msg(Level::Baseline, &pod),
            "hostPort (container \"c\" uses hostPort 8080)"
        );
    }

    #[test]
    fn app_armor_unconfined_by_field_or_annotation() {
        let pod = with(
            compliant(),
            "spec/containers/0/securityContext/appArmorProfile",
            json!({"type": "Unconfined"}),
        );
        assert_eq!(
            msg(Level::Baseline, &pod),
            "forbidden AppArmor profile (container \"c\" must not set AppArmor profile type to \"Unconfined\")"
        );
        let pod = with(
            compliant(),
            "metadata/annotations",
            json!({"container.apparmor.security.beta.kubernetes.io/c": "unconfined",
                   "container.apparmor.security.beta.kubernetes.io/i": "runtime/default"}),
        );
        assert_eq!(
            msg(Level::Baseline, &pod),
            "forbidden AppArmor profile (container.apparmor.security.beta.kubernetes.io/c=\"unconfined\")"
        );
    }

    #[test]
    fn se_linux_type_user_and_role() {
        let pod = with(
            compliant(),
            "spec/securityContext/seLinuxOptions",
            json!({"type": "spc_t", "user": "u"}),
        );
        let pod = with(
            pod,
            "spec/containers/0/securityContext/seLinuxOptions",
            json!({"role": "r", "type": "container_t"}),
        );
        assert_eq!(
            msg(Level::Baseline, &pod),
            "seLinuxOptions (pod and container \"c\" set forbidden securityContext.seLinuxOptions: type \"spc_t\"; user may not be set; role may not be set)"
        );
    }

    #[test]
    fn proc_mount_unmasked() {
        let pod = with(
            compliant(),
            "spec/containers/0/securityContext/procMount",
            json!("Unmasked"),
        );
        assert_eq!(
            msg(Level::Baseline, &pod),
            "procMount (container \"c\" sets forbidden securityContext.procMount value \"Unmasked\")"
        );
    }

    #[test]
    fn seccomp_unconfined_and_missing() {
        let pod = with(
            compliant(),
            "spec/containers/0/securityContext/seccompProfile",
            json!({"type": "Unconfined"}),
        );
        assert_eq!(
            msg(Level::Baseline, &pod),
            "seccompProfile (container \"c\" must not set securityContext.seccompProfile.type to \"Unconfined\")"
        );
        assert_eq!(
            msg(Level::Restricted, &pod),
            "seccompProfile (container \"c\" must not set securityContext.seccompProfile.type to \"Unconfined\")"
        );
        // Without the pod's profile, a container with its own passes and
        // one without fails.
        let pod = with(
            compliant(),
            "spec/securityContext/seccompProfile",
            Value::Null,
        );
        let pod = with(
            pod,
            "spec/containers/0/securityContext/seccompProfile",
            json!({"type": "Localhost", "localhostProfile": "p.json"}),
        );
        assert_eq!(
            msg(Level::Restricted, &pod),
            "seccompProfile (pod or container \"i\" must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")"
        );
    }

    #[test]
    fn unsafe_sysctls() {
        let pod = with(
            compliant(),
            "spec/securityContext/sysctls",
            json!([{"name": "net.ipv4.tcp_syncookies", "value": "1"}, {"name": "kernel.msgmax", "value": "1"}]),
        );
        assert_eq!(
            msg(Level::Baseline, &pod),
            "forbidden sysctls (kernel.msgmax)"
        );
    }

    #[test]
    fn privilege_escalation_must_be_false_in_restricted() {
        let pod = with(
            compliant(),
            "spec/containers/0/securityContext/allowPrivilegeEscalation",
            json!(true),
        );
        assert_eq!(msg(Level::Baseline, &pod), "");
        assert_eq!(
            msg(Level::Restricted, &pod),
            "allowPrivilegeEscalation != false (container \"c\" must set securityContext.allowPrivilegeEscalation=false)"
        );
    }

    #[test]
    fn run_as_non_root_on_the_pod_or_every_container() {
        let pod = with(
            compliant(),
            "spec/securityContext/runAsNonRoot",
            Value::Null,
        );
        let pod = with(
            pod,
            "spec/containers/0/securityContext/runAsNonRoot",
            json!(true),
        );
        assert_eq!(
            msg(Level::Restricted, &pod),
            "runAsNonRoot != true (pod or container \"i\" must set securityContext.runAsNonRoot=true)"
        );
        let pod = with(
            compliant(),
            "spec/securityContext/runAsNonRoot",
            json!(false),
        );
        let pod = with(
            pod,
            "spec/containers/0/securityContext/runAsNonRoot",
            json!(false),
        );
        assert_eq!(
            msg(Level::Restricted, &pod),
            "runAsNonRoot != true (pod must not set securityContext.runAsNonRoot=false; \
             container \"c\" must not set securityContext.runAsNonRoot=false; \
             pod or container \"i\" must set securityContext.runAsNonRoot=true)"
        );
    }

    #[test]
    fn run_as_user_zero() {
        let pod = with(compliant(), "spec/securityContext/runAsUser", json!(0));
        let pod = with(pod, "spec/containers/0/securityContext/runAsUser", json!(0));
        assert_eq!(
            msg(Level::Restricted, &pod),
            "runAsUser=0 (pod and container \"c\" must not set runAsUser=0)"
        );
        assert_eq!(msg(Level::Baseline, &pod), "");
    }

    #[test]
    fn enforce_refuses_with_the_real_message_and_warn_admits_with_a_warning() {
        let ns = json!({"metadata": {"name": "a", "labels": {
            "pod-security.kubernetes.io/enforce": "baseline",
            "pod-security.kubernetes.io/enforce-version": "v1.30",
            "pod-security.kubernetes.io/warn": "restricted",
        }}});
        let policy = Policy::of_namespace(&ns);
        assert_eq!(policy.enforce, Some(Level::Baseline));
        assert_eq!(policy.warn, Some(Level::Restricted));
        let pod = with(compliant(), "spec/hostPID", json!(true));
        let err = policy.admit_pod(&pod).unwrap_err();
        assert_eq!(err.code, 403);
        assert_eq!(
            err.message,
            "pods \"p\" is forbidden: violates PodSecurity \"baseline:latest\": host namespaces (hostPID=true)"
        );
        let pod = with(compliant(), "spec/containers/0/securityContext", json!({}));
        let warnings = policy.admit_pod(&pod).unwrap();
        assert_eq!(warnings.len(), 1);
        assert!(
            warnings[0].starts_with("would violate PodSecurity \"restricted:latest\": allowPrivilegeEscalation != false (container \"c\""),
            "{warnings:?}"
        );
        assert!(
            warning_header(&warnings[0])
                .starts_with("299 - \"would violate PodSecurity \\\"restricted:latest\\\": ")
        );
        assert_eq!(
            policy.admit_pod(&compliant()).unwrap(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn no_labels_privileged_and_unknown_levels() {
        let pod = with(compliant(), "spec/hostPID", json!(true));
        assert!(Policy::default().admit_pod(&pod).is_ok());
        let privileged = Policy::of_namespace(
            &json!({"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "privileged"}}}),
        );
        assert!(privileged.admit_pod(&pod).is_ok());
        // An unknown level fails closed.
        let bogus = Policy::of_namespace(
            &json!({"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "strict"}}}),
        );
        assert_eq!(bogus.enforce, Some(Level::Restricted));
        // Garbage in the pod is not a panic.
        let garbage = json!({"spec": {"containers": "x", "volumes": [1, {"name": 2}], "securityContext": []}});
        assert!(bogus.admit_pod(&garbage).is_err());
    }

    #[test]
    fn workload_templates_only_warn() {
        let policy = Policy {
            enforce: Some(Level::Restricted),
            warn: Some(Level::Baseline),
        };
        let deploy = json!({"spec": {"template": {"spec": {"hostNetwork": true, "containers": [{"name": "c"}]}}}});
        assert_eq!(
            policy.warn_template("deployments", &deploy),
            vec![
                "would violate PodSecurity \"baseline:latest\": host namespaces (hostNetwork=true)"
                    .to_string()
            ]
        );
        assert!(policy.warn_template("configmaps", &deploy).is_empty());
    }
}
