//! Owns the built-in types' server-side defaults and checks that clients
//! rely on: namespace phase, pod defaults and initial status, service
//! cluster IPs, CRD status (Established), and the few validations that
//! keep the process kubelet and the operator out of trouble.

use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::{Value, json};

use super::registry::ResourceInfo;
use super::status::ApiError;

static NEXT_CLUSTER_IP: AtomicU32 = AtomicU32::new(11);

/// The next ClusterIP of `10.96.0.0/16`: never `.0`/`.255` addresses, nor
/// `10.96.0.1` (the `kubernetes` Service) or `10.96.0.10` (the cluster DNS).
fn next_cluster_ip() -> String {
    loop {
        let n = NEXT_CLUSTER_IP.fetch_add(1, Ordering::Relaxed) & 0xffff;
        let (hi, lo) = ((n >> 8) & 0xff, n & 0xff);
        if lo != 0 && lo != 255 && n != 1 && n != 10 {
            return format!("10.96.{hi}.{lo}");
        }
    }
}

fn is(info: &ResourceInfo, group: &str, plural: &str) -> bool {
    info.builtin && info.group == group && info.plural == plural
}

fn set_default(obj: &mut Value, path: &[&str], v: Value) {
    let mut cur = obj;
    for (i, p) in path.iter().enumerate() {
        if !cur.is_object() {
            *cur = json!({});
        }
        let m = cur.as_object_mut().expect("made an object above");
        if i == path.len() - 1 {
            m.entry(p.to_string()).or_insert(v);
            return;
        }
        cur = m.entry(p.to_string()).or_insert_with(|| json!({}));
    }
}

fn default_pod_spec(spec: &mut Value) {
    set_default(spec, &["restartPolicy"], json!("Always"));
    set_default(spec, &["terminationGracePeriodSeconds"], json!(30));
    set_default(spec, &["dnsPolicy"], json!("ClusterFirst"));
    set_default(spec, &["schedulerName"], json!("default-scheduler"));
    set_default(spec, &["securityContext"], json!({}));
    for list in ["containers", "initContainers"] {
        if let Some(cs) = spec.get_mut(list).and_then(Value::as_array_mut) {
            for c in cs {
                set_default(
                    c,
                    &["terminationMessagePath"],
                    json!("/dev/termination-log"),
                );
                set_default(c, &["terminationMessagePolicy"], json!("File"));
                let latest = c
                    .get("image")
                    .and_then(Value::as_str)
                    .is_some_and(|i| i.ends_with(":latest") || !i.contains(':'));
                set_default(
                    c,
                    &["imagePullPolicy"],
                    json!(if latest { "Always" } else { "IfNotPresent" }),
                );
                set_default(c, &["resources"], json!({}));
                if let Some(ports) = c.get_mut("ports").and_then(Value::as_array_mut) {
                    for p in ports {
                        set_default(p, &["protocol"], json!("TCP"));
                    }
                }
            }
        }
    }
}

/// Defaults applied when an object is created.
pub(crate) fn on_create(info: &ResourceInfo, obj: &mut Value) {
    if is(info, "", "namespaces") {
        set_default(obj, &["spec", "finalizers"], json!(["kubernetes"]));
        obj["status"] = json!({"phase": "Active"});
    } else if is(info, "", "pods") {
        if let Some(spec) = obj.get_mut("spec") {
            default_pod_spec(spec);
        }
        let sa = obj
            .pointer("/spec/serviceAccountName")
            .cloned()
            .unwrap_or(json!("default"));
        set_default(obj, &["spec", "serviceAccountName"], sa.clone());
        set_default(obj, &["spec", "serviceAccount"], sa);
        obj["status"] = json!({"phase": "Pending", "qosClass": "BestEffort"});
        if obj
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .is_some_and(|n| !n.is_empty())
        {
            obj["status"]["conditions"] = json!([{"type": "PodScheduled", "status": "True", "lastTransitionTime": super::meta::now()}]);
        }
    } else if is(info, "", "services") {
        set_default(obj, &["spec", "type"], json!("ClusterIP"));
        set_default(obj, &["spec", "sessionAffinity"], json!("None"));
        if obj
            .pointer("/spec/clusterIP")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            obj["spec"]["clusterIP"] = json!(next_cluster_ip());
        }
        let ip = obj["spec"]["clusterIP"].clone();
        set_default(obj, &["spec", "clusterIPs"], json!([ip]));
        if let Some(ports) = obj.pointer_mut("/spec/ports").and_then(Value::as_array_mut) {
            for p in ports {
                set_default(p, &["protocol"], json!("TCP"));
                let port = p.get("port").cloned().unwrap_or(json!(0));
                set_default(p, &["targetPort"], port);
            }
        }
        obj["status"] = json!({"loadBalancer": {}});
    } else if is(info, "", "secrets") {
        set_default(obj, &["type"], json!("Opaque"));
        fold_string_data(obj);
    } else if is(info, "autoscaling", "horizontalpodautoscalers") {
        default_hpa(obj);
    } else if is(info, "apps", "deployments") {
        set_default(obj, &["spec", "replicas"], json!(1));
        if let Some(spec) = obj.pointer_mut("/spec/template/spec") {
            default_pod_spec(spec);
        }
    } else if is(info, "apiextensions.k8s.io", "customresourcedefinitions") {
        crd_status(obj);
        // Deleting a CRD first deletes its objects (see `gc`).
        let mut f = super::meta::finalizers(obj);
        if !f.iter().any(|x| x == CRD_CLEANUP) {
            f.push(CRD_CLEANUP.into());
            super::meta::set_finalizers(obj, &f);
        }
    }
}

/// The finalizer that holds a CRD until its custom resources are gone.
pub(crate) const CRD_CLEANUP: &str = "customresourcecleanup.apiextensions.k8s.io";

/// Defaults applied on update of the main resource.
pub(crate) fn on_update(info: &ResourceInfo, old: &Value, new: &mut Value) {
    if is(info, "", "services") {
        // The cluster IP is allocated once and immutable.
        if let Some(ip) = old.pointer("/spec/clusterIP")
            && new
                .pointer("/spec/clusterIP")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
        {
            super::meta::set_path(new, &["spec", "clusterIP"], ip.clone());
        }
    } else if is(info, "", "pods") {
        if let Some(spec) = new.get_mut("spec") {
            default_pod_spec(spec);
        }
    } else if is(info, "", "secrets") {
        fold_string_data(new);
    } else if is(info, "autoscaling", "horizontalpodautoscalers") {
        default_hpa(new);
    } else if is(info, "apiextensions.k8s.io", "customresourcedefinitions") {
        crd_status(new);
    }
}

/// A HorizontalPodAutoscaler's defaults, in the version it was written
/// in: `minReplicas` 1, and 80% CPU utilization when it names no metric.
fn default_hpa(obj: &mut Value) {
    set_default(obj, &["spec", "minReplicas"], json!(1));
    if obj.get("apiVersion").and_then(Value::as_str) == Some("autoscaling/v1") {
        set_default(obj, &["spec", "targetCPUUtilizationPercentage"], json!(80));
    } else if obj
        .pointer("/spec/metrics")
        .and_then(Value::as_array)
        .is_none_or(|m| m.is_empty())
    {
        obj["spec"]["metrics"] = json!([{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}]);
    }
}

/// `stringData` is write-only: its entries are stored base64-encoded in
/// `data` (overriding same-named keys) and the field itself is dropped.
fn fold_string_data(obj: &mut Value) {
    use base64::Engine as _;
    let Some(sd) = obj.as_object_mut().and_then(|o| o.remove("stringData")) else {
        return;
    };
    let Some(sd) = sd.as_object().cloned() else {
        return;
    };
    for (k, v) in sd {
        let text = v
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| v.to_string());
        super::meta::set_path(
            obj,
            &["data", &k],
            json!(base64::engine::general_purpose::STANDARD.encode(text)),
        );
    }
}

/// Refuses updates the real server refuses: a pod's spec is immutable
/// except container images, `activeDeadlineSeconds`, added tolerations,
/// removed `schedulingGates` and, while the pod is still gated, added
/// `nodeSelector` entries (`spec.nodeName` changes only through
/// `pods/binding`); the data of an
/// immutable Secret or ConfigMap cannot change.
pub(crate) fn check_update(info: &ResourceInfo, old: &Value, new: &Value) -> Result<(), ApiError> {
    let name = super::meta::name(old).to_string();
    if is(info, "", "pods") {
        let mask = |v: &Value| {
            let mut spec = v.get("spec").cloned().unwrap_or(json!({}));
            for list in ["containers", "initContainers"] {
                if let Some(cs) = spec.get_mut(list).and_then(Value::as_array_mut) {
                    for c in cs {
                        if let Some(o) = c.as_object_mut() {
                            o.remove("image");
                        }
                    }
                }
            }
            if let Some(o) = spec.as_object_mut() {
                o.remove("activeDeadlineSeconds");
                o.remove("tolerations");
                // Checked below: gates may only be removed, and a gated
                // pod's node selector may only grow (what Kueue's
                // topology ungater and other schedulers-in-front write).
                o.remove("schedulingGates");
                o.remove("nodeSelector");
            }
            spec
        };
        let gates = |v: &Value| {
            v.pointer("/spec/schedulingGates")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        };
        let selector = |v: &Value| {
            v.pointer("/spec/nodeSelector")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default()
        };
        let (old_gates, new_gates) = (gates(old), gates(new));
        let gate_added = new_gates.iter().any(|g| !old_gates.contains(g));
        let (old_sel, new_sel) = (selector(old), selector(new));
        let selector_ok = old_sel == new_sel
            || (!old_gates.is_empty() && old_sel.iter().all(|(k, v)| new_sel.get(k) == Some(v)));
        if gate_added || !selector_ok {
            return Err(ApiError::invalid(
                "Pod",
                &name,
                vec![(
                    "spec".into(),
                    "Forbidden: spec.schedulingGates may only be removed, and spec.nodeSelector may only gain entries while the pod is still gated; delete and recreate the pod instead".into(),
                )],
            ));
        }
        let tolerations = |v: &Value| {
            v.pointer("/spec/tolerations")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        };
        let (before, after) = (tolerations(old), tolerations(new));
        let removed = before.iter().any(|t| !after.contains(t));
        if mask(old) != mask(new) || removed {
            return Err(ApiError::invalid(
                "Pod",
                &name,
                vec![(
                    "spec".into(),
                    "Forbidden: pod updates may not change fields other than `spec.containers[*].image`, `spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing tolerations); delete and recreate the pod instead".into(),
                )],
            ));
        }
    }
    if (is(info, "", "secrets") || is(info, "", "configmaps"))
        && old.get("immutable") == Some(&json!(true))
    {
        let data = |v: &Value| {
            (
                v.get("data").cloned(),
                v.get("binaryData").cloned(),
                v.get("immutable").cloned(),
            )
        };
        if data(old) != data(new) {
            return Err(ApiError::invalid(
                &info.group_kind(),
                &name,
                vec![("data".into(), "Forbidden: field is immutable when `immutable` is set; delete and recreate the object".into())],
            ));
        }
    }
    Ok(())
}

fn crd_status(obj: &mut Value) {
    let now = super::meta::now();
    let names = obj.pointer("/spec/names").cloned().unwrap_or(json!({}));
    let stored: Vec<Value> = obj
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .map(|vs| {
            vs.iter()
                .filter(|v| v.get("storage") == Some(&json!(true)))
                .filter_map(|v| v.get("name").cloned())
                .collect()
        })
        .unwrap_or_default();
    let keep_time = |t: &str| {
        obj.pointer("/status/conditions")
            .and_then(Value::as_array)
            .and_then(|cs| cs.iter().find(|c| c["type"] == t))
            .and_then(|c| c.get("lastTransitionTime").cloned())
            .unwrap_or(json!(now))
    };
    let status = json!({
        "acceptedNames": names,
        "storedVersions": stored,
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": keep_time("NamesAccepted")},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": keep_time("Established")},
        ],
    });
    obj["status"] = status;
}

/// The built-in checks whose absence would let a client store something
/// no real server accepts.
pub(crate) fn validate_builtin(info: &ResourceInfo, obj: &Value) -> Result<(), ApiError> {
    let name = super::meta::name(obj).to_string();
    let mut causes: Vec<(String, String)> = Vec::new();
    if is(info, "", "pods") {
        match obj.pointer("/spec/containers").and_then(Value::as_array) {
            Some(cs) if !cs.is_empty() => {
                for (i, c) in cs.iter().enumerate() {
                    if c.get("name")
                        .and_then(Value::as_str)
                        .is_none_or(str::is_empty)
                    {
                        causes.push((
                            format!("spec.containers[{i}].name"),
                            "Required value".into(),
                        ));
                    }
                    if c.get("image")
                        .and_then(Value::as_str)
                        .is_none_or(str::is_empty)
                    {
                        causes.push((
                            format!("spec.containers[{i}].image"),
                            "Required value".into(),
                        ));
                    }
                }
            }
            _ => causes.push((
                "spec.containers".into(),
                "Required value: a pod needs at least one container".into(),
            )),
        }
    } else if is(info, "apiextensions.k8s.io", "customresourcedefinitions") {
        let group = obj
            .pointer("/spec/group")
            .and_then(Value::as_str)
            .unwrap_or("");
        let plural = obj
            .pointer("/spec/names/plural")
            .and_then(Value::as_str)
            .unwrap_or("");
        if group.is_empty() {
            causes.push(("spec.group".into(), "Required value".into()));
        }
        if plural.is_empty() {
            causes.push(("spec.names.plural".into(), "Required value".into()));
        }
        if obj
            .pointer("/spec/names/kind")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            causes.push(("spec.names.kind".into(), "Required value".into()));
        }
        if name != format!("{plural}.{group}") {
            causes.push((
                "metadata.name".into(),
                format!("Invalid value: \"{name}\": must be spec.names.plural+\".\"+spec.group"),
            ));
        }
        let versions = obj
            .pointer("/spec/versions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let storage = versions
            .iter()
            .filter(|v| v.get("storage") == Some(&json!(true)))
            .count();
        if versions.is_empty() {
            causes.push((
                "spec.versions".into(),
                "Required value: list at least one version".into(),
            ));
        } else if storage != 1 {
            causes.push((
                "spec.versions".into(),
                "Invalid value: exactly one version must be storage=true".into(),
            ));
        }
        let scope = obj
            .pointer("/spec/scope")
            .and_then(Value::as_str)
            .unwrap_or("");
        if scope != "Namespaced" && scope != "Cluster" {
            causes.push((
                "spec.scope".into(),
                format!(
                    "Unsupported value: \"{scope}\": supported values: \"Cluster\", \"Namespaced\""
                ),
            ));
        }
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(&info.group_kind(), &name, causes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_ips_skip_the_kubernetes_and_dns_addresses() {
        // Every address of a full round of the /16.
        let seen: Vec<String> = (0..65_000).map(|_| next_cluster_ip()).collect();
        assert!(
            !seen
                .iter()
                .any(|ip| ip == "10.96.0.1" || ip == "10.96.0.10")
        );
        assert!(
            !seen
                .iter()
                .any(|ip| ip.ends_with(".0") || ip.ends_with(".255"))
        );
    }
}
