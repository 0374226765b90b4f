//! The `baseline` checks, in the real server's order; `restricted` runs
//! them too, except where its own stricter checks replace them
//! (capabilities, hostPath, seccomp).

use std::collections::BTreeSet;

use serde_json::Value;

use super::Violation;
use super::pod::*;

pub(super) fn app_armor(
    psc: &Value,
    cs: &[Ctr<'_>],
    annotations: Option<&Value>,
) -> Option<Violation> {
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
pub(super) const BASELINE_CAPS: &[&str] = &[
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

pub(super) fn capabilities_baseline(cs: &[Ctr<'_>]) -> Option<Violation> {
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

pub(super) fn host_namespaces(spec: &Value) -> Option<Violation> {
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

pub(super) fn host_path(spec: &Value) -> Option<Violation> {
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

pub(super) fn host_ports(cs: &[Ctr<'_>]) -> Option<Violation> {
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

pub(super) fn privileged(cs: &[Ctr<'_>]) -> Option<Violation> {
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

pub(super) fn proc_mount(cs: &[Ctr<'_>]) -> Option<Violation> {
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

pub(super) fn se_linux(psc: &Value, cs: &[Ctr<'_>]) -> Option<Violation> {
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

pub(super) fn seccomp_baseline(psc: &Value, cs: &[Ctr<'_>]) -> Option<Violation> {
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
pub(super) const SAFE_SYSCTLS: &[&str] = &[
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

pub(super) fn sysctls(psc: &Value) -> Option<Violation> {
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

pub(super) fn host_process(psc: &Value, cs: &[Ctr<'_>]) -> Option<Violation> {
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
