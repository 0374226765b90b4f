//! Owns `meta.k8s.io/v1` Table responses (what `kubectl get` prints):
//! columns for the common built-in types, a CRD's `additionalPrinterColumns`
//! evaluated with a small JSONPath subset, and ages rendered like the real
//! server (`5m30s`, `3h15m`, `45d`).

use serde_json::{Value, json};

use super::registry::{PrinterColumn, ResourceInfo};

fn col(name: &str, type_: &str, format: &str, description: &str, priority: i64) -> Value {
    json!({"name": name, "type": type_, "format": format, "description": description, "priority": priority})
}

fn age(obj: &Value) -> Value {
    json!(human_age(
        obj.pointer("/metadata/creationTimestamp")
            .and_then(Value::as_str)
    ))
}

/// A timestamp rendered as the real server's human duration.
pub(crate) fn human_age(ts: Option<&str>) -> String {
    let Some(t) = ts.and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok()) else {
        return "<unknown>".into();
    };
    let d = (chrono::Utc::now() - t.with_timezone(&chrono::Utc)).num_seconds();
    human_duration(d)
}

fn human_duration(secs: i64) -> String {
    // `5m30s`, or `5m` when the minor unit is zero.
    fn pair(major: i64, major_unit: &str, minor: i64, minor_unit: &str) -> String {
        if minor == 0 {
            format!("{major}{major_unit}")
        } else {
            format!("{major}{major_unit}{minor}{minor_unit}")
        }
    }
    if secs < 0 {
        return "<invalid>".into();
    }
    let (m, h, d) = (secs / 60, secs / 3600, secs / 86400);
    if secs < 120 {
        format!("{secs}s")
    } else if m < 10 {
        pair(m, "m", secs % 60, "s")
    } else if h < 3 {
        format!("{m}m")
    } else if h < 8 {
        pair(h, "h", m % 60, "m")
    } else if h < 48 {
        format!("{h}h")
    } else if d < 8 {
        pair(d, "d", h % 24, "h")
    } else if d < 365 * 2 {
        format!("{d}d")
    } else if d < 365 * 8 {
        pair(d / 365, "y", d % 365, "d")
    } else {
        format!("{}y", d / 365)
    }
}

fn s<'a>(obj: &'a Value, p: &str) -> &'a str {
    obj.pointer(p).and_then(Value::as_str).unwrap_or("")
}

fn or_none(v: &str) -> String {
    if v.is_empty() {
        "<none>".into()
    } else {
        v.to_string()
    }
}

fn or<'a>(v: &'a str, default: &'a str) -> &'a str {
    if v.is_empty() { default } else { v }
}

/// A HorizontalPodAutoscaler's cells: the targets as `current/target` per
/// metric (`<unknown>` before the first measurement), as kubectl's printer.
fn hpa_row(o: &Value) -> Vec<Value> {
    let current = o
        .pointer("/status/currentMetrics")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let targets: Vec<String> = o
        .pointer("/spec/metrics")
        .and_then(Value::as_array)
        .map(|ms| {
            ms.iter()
                .map(|m| {
                    let kind = m["type"].as_str().unwrap_or("");
                    let key = match kind {
                        "Resource" => "resource",
                        "ContainerResource" => "containerResource",
                        "Pods" => "pods",
                        "Object" => "object",
                        "External" => "external",
                        _ => "",
                    };
                    let target = &m[key]["target"];
                    let now = current
                        .iter()
                        .find(|c| c["type"] == kind && c[key].get("name") == m[key].get("name"))
                        .map(|c| &c[key]["current"]);
                    let (want, have) = if let Some(u) = target.get("averageUtilization") {
                        (
                            format!("{u}%"),
                            now.and_then(|c| c.get("averageUtilization"))
                                .map(|v| format!("{v}%")),
                        )
                    } else {
                        let field = if target.get("averageValue").is_some() {
                            "averageValue"
                        } else {
                            "value"
                        };
                        (
                            target[field]
                                .as_str()
                                .map_or_else(|| target[field].to_string(), str::to_string),
                            now.and_then(|c| c.get(field))
                                .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string)),
                        )
                    };
                    format!("{}/{want}", have.unwrap_or_else(|| "<unknown>".into()))
                })
                .collect()
        })
        .unwrap_or_default();
    let targets = if targets.is_empty() {
        "<none>".to_string()
    } else {
        targets.join(", ")
    };
    vec![
        json!(s(o, "/metadata/name")),
        json!(format!(
            "{}/{}",
            s(o, "/spec/scaleTargetRef/kind"),
            s(o, "/spec/scaleTargetRef/name")
        )),
        json!(targets),
        json!(
            o.pointer("/spec/minReplicas")
                .map_or("<unset>".to_string(), |v| v.to_string())
        ),
        o.pointer("/spec/maxReplicas").cloned().unwrap_or(json!(0)),
        o.pointer("/status/currentReplicas")
            .cloned()
            .unwrap_or(json!(0)),
        age(o),
    ]
}

/// A CertificateSigningRequest's cells: its conditions as `kubectl get csr`
/// shows them (`Pending`, `Approved,Issued`, `Denied`, ...).
fn csr_row(o: &Value) -> Vec<Value> {
    let mut conditions: Vec<String> = o
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .map(|cs| {
            cs.iter()
                .filter(|c| c["status"] != "False")
                .filter_map(|c| c["type"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    if conditions.is_empty() {
        conditions.push("Pending".into());
    }
    if o.pointer("/status/certificate")
        .and_then(Value::as_str)
        .is_some_and(|c| !c.is_empty())
    {
        conditions.push("Issued".into());
    }
    let duration = o
        .pointer("/spec/expirationSeconds")
        .and_then(Value::as_i64)
        .map_or("<none>".to_string(), human_duration);
    vec![
        json!(s(o, "/metadata/name")),
        age(o),
        json!(s(o, "/spec/signerName")),
        json!(s(o, "/spec/username")),
        json!(duration),
        json!(conditions.join(",")),
    ]
}

fn deleting(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
}

/// The real server's description of the node address columns.
const NODE_ADDRESSES: &str =
    "List of addresses reachable to the node. Queried from cloud provider, if available.";

/// A Node's cells, as kube-apiserver's node printer: status (with
/// `SchedulingDisabled`), roles from the `node-role.kubernetes.io/<role>`
/// and `kubernetes.io/role` labels, then the wide columns.
fn node_row(o: &Value) -> Vec<Value> {
    let ready = o
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .map(|c| c["status"] == "True");
    let mut status = match ready {
        Some(true) => "Ready",
        Some(false) => "NotReady",
        None => "Unknown",
    }
    .to_string();
    if o.pointer("/spec/unschedulable") == Some(&json!(true)) {
        status.push_str(",SchedulingDisabled");
    }
    let mut roles: Vec<String> = o
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|labels| {
            labels
                .iter()
                .filter_map(|(k, v)| {
                    if let Some(role) = k.strip_prefix("node-role.kubernetes.io/") {
                        (!role.is_empty()).then(|| role.to_string())
                    } else if k == "kubernetes.io/role" {
                        v.as_str().filter(|r| !r.is_empty()).map(str::to_string)
                    } else {
                        None
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    roles.sort();
    roles.dedup();
    let address = |type_: &str| {
        o.pointer("/status/addresses")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().find(|a| a["type"] == type_))
            .and_then(|a| a["address"].as_str())
            .map_or_else(|| "<none>".to_string(), str::to_string)
    };
    let info = |f: &str| {
        let v = s(o, &format!("/status/nodeInfo/{f}"));
        if v.is_empty() {
            "<unknown>".to_string()
        } else {
            v.to_string()
        }
    };
    vec![
        json!(s(o, "/metadata/name")),
        json!(status),
        json!(if roles.is_empty() {
            "<none>".to_string()
        } else {
            roles.join(",")
        }),
        age(o),
        json!(s(o, "/status/nodeInfo/kubeletVersion")),
        json!(address("InternalIP")),
        json!(address("ExternalIP")),
        json!(info("osImage")),
        json!(info("kernelVersion")),
        json!(info("containerRuntimeVersion")),
    ]
}

/// Columns and cells of a built-in resource.
fn builtin(info: &ResourceInfo, objs: &[Value]) -> (Vec<Value>, Vec<Vec<Value>>) {
    let name_col = col(
        "Name",
        "string",
        "name",
        "Name must be unique within a namespace.",
        0,
    );
    let age_col = col(
        "Age",
        "string",
        "",
        "CreationTimestamp is a timestamp representing the server time when this object was created.",
        0,
    );
    let name = |o: &Value| json!(s(o, "/metadata/name"));
    match (info.group.as_str(), info.plural.as_str()) {
        ("", "pods") => (
            vec![
                name_col,
                col(
                    "Ready",
                    "string",
                    "",
                    "The aggregate readiness state of this pod for accepting traffic.",
                    0,
                ),
                col(
                    "Status",
                    "string",
                    "",
                    "The aggregate status of the containers in this pod.",
                    0,
                ),
                col(
                    "Restarts",
                    "string",
                    "",
                    "The number of times the containers in this pod have been restarted.",
                    0,
                ),
                age_col,
                col("IP", "string", "", "IP address allocated to the pod.", 1),
                col(
                    "Node",
                    "string",
                    "",
                    "Name of the node the pod is assigned to.",
                    1,
                ),
            ],
            objs.iter()
                .map(|o| {
                    let total = o
                        .pointer("/spec/containers")
                        .and_then(Value::as_array)
                        .map_or(0, Vec::len);
                    let statuses = o
                        .pointer("/status/containerStatuses")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default();
                    let ready = statuses
                        .iter()
                        .filter(|c| c["ready"] == json!(true))
                        .count();
                    let restarts: i64 = statuses
                        .iter()
                        .filter_map(|c| c["restartCount"].as_i64())
                        .sum();
                    let waiting = statuses
                        .iter()
                        .find_map(|c| c.pointer("/state/waiting/reason").and_then(Value::as_str));
                    let terminated = statuses.iter().find_map(|c| {
                        c.pointer("/state/terminated/reason")
                            .and_then(Value::as_str)
                    });
                    let mut status = s(o, "/status/reason").to_string();
                    if status.is_empty() {
                        status = waiting
                            .or(terminated)
                            .unwrap_or(s(o, "/status/phase"))
                            .to_string();
                    }
                    if deleting(o) {
                        status = "Terminating".into();
                    }
                    vec![
                        name(o),
                        json!(format!("{ready}/{total}")),
                        json!(status),
                        json!(restarts.to_string()),
                        age(o),
                        json!(or_none(s(o, "/status/podIP"))),
                        json!(or_none(s(o, "/spec/nodeName"))),
                    ]
                })
                .collect(),
        ),
        ("", "namespaces") => (
            vec![
                name_col,
                col("Status", "string", "", "The status of the namespace", 0),
                age_col,
            ],
            objs.iter()
                .map(|o| vec![name(o), json!(s(o, "/status/phase")), age(o)])
                .collect(),
        ),
        ("", "nodes") => (
            vec![
                name_col,
                col("Status", "string", "", "The status of the node", 0),
                col("Roles", "string", "", "The roles of the node", 0),
                age_col,
                col(
                    "Version",
                    "string",
                    "",
                    "Kubelet Version reported by the node.",
                    0,
                ),
                col("Internal-IP", "string", "", NODE_ADDRESSES, 1),
                col("External-IP", "string", "", NODE_ADDRESSES, 1),
                col(
                    "OS-Image",
                    "string",
                    "",
                    "OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 (wheezy)).",
                    1,
                ),
                col(
                    "Kernel-Version",
                    "string",
                    "",
                    "Kernel Version reported by the node from 'uname -r' (e.g. 3.16.0-0.bpo.4-amd64).",
                    1,
                ),
                col(
                    "Container-Runtime",
                    "string",
                    "",
                    "ContainerRuntime Version reported by the node through runtime remote API (e.g. containerd://1.4.2).",
                    1,
                ),
            ],
            objs.iter().map(node_row).collect(),
        ),
        ("", "services") => (
            vec![
                name_col,
                col("Type", "string", "", "The type of service.", 0),
                col(
                    "Cluster-IP",
                    "string",
                    "",
                    "The cluster IP of the service.",
                    0,
                ),
                col(
                    "External-IP",
                    "string",
                    "",
                    "The external IP of the service.",
                    0,
                ),
                col("Port(s)", "string", "", "The ports of the service.", 0),
                age_col,
            ],
            objs.iter()
                .map(|o| {
                    let ports: Vec<String> = o
                        .pointer("/spec/ports")
                        .and_then(Value::as_array)
                        .map(|ps| {
                            ps.iter()
                                .map(|p| {
                                    format!(
                                        "{}/{}",
                                        p["port"],
                                        p["protocol"].as_str().unwrap_or("TCP")
                                    )
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    vec![
                        name(o),
                        json!(s(o, "/spec/type")),
                        json!(or_none(s(o, "/spec/clusterIP"))),
                        json!("<none>"),
                        json!(if ports.is_empty() {
                            "<none>".to_string()
                        } else {
                            ports.join(",")
                        }),
                        age(o),
                    ]
                })
                .collect(),
        ),
        ("", "configmaps") | ("", "secrets") => {
            let secret = info.plural == "secrets";
            let mut cols = vec![name_col];
            if secret {
                cols.push(col("Type", "string", "", "The type of the secret", 0));
            }
            cols.push(col(
                "Data",
                "string",
                "",
                "The number of entries in the data",
                0,
            ));
            cols.push(age_col);
            (
                cols,
                objs.iter()
                    .map(|o| {
                        let n = o
                            .get("data")
                            .and_then(Value::as_object)
                            .map_or(0, |m| m.len())
                            + o.get("binaryData")
                                .and_then(Value::as_object)
                                .map_or(0, |m| m.len());
                        let mut row = vec![name(o)];
                        if secret {
                            row.push(json!(s(o, "/type")));
                        }
                        row.push(json!(n));
                        row.push(age(o));
                        row
                    })
                    .collect(),
            )
        }
        ("apps", "deployments") => (
            vec![
                name_col,
                col(
                    "Ready",
                    "string",
                    "",
                    "Number of the pod with ready state",
                    0,
                ),
                col(
                    "Up-to-date",
                    "string",
                    "",
                    "Total number of non-terminated pods targeted by this deployment that have the desired template spec.",
                    0,
                ),
                col(
                    "Available",
                    "string",
                    "",
                    "Total number of available pods (ready for at least minReadySeconds) targeted by this deployment.",
                    0,
                ),
                age_col,
            ],
            objs.iter()
                .map(|o| {
                    let n = |p: &str| o.pointer(p).and_then(Value::as_i64).unwrap_or(0);
                    vec![
                        name(o),
                        json!(format!(
                            "{}/{}",
                            n("/status/readyReplicas"),
                            n("/spec/replicas")
                        )),
                        json!(n("/status/updatedReplicas")),
                        json!(n("/status/availableReplicas")),
                        age(o),
                    ]
                })
                .collect(),
        ),
        ("", "events") => (
            vec![
                col(
                    "Last Seen",
                    "string",
                    "",
                    "Time since the event was last seen.",
                    0,
                ),
                col("Type", "string", "", "Normal or Warning.", 0),
                col("Reason", "string", "", "Why the event happened.", 0),
                col("Object", "string", "", "The object the event is about.", 0),
                col("Message", "string", "", "What happened.", 0),
            ],
            objs.iter()
                .map(|o| {
                    let last = [
                        "/lastTimestamp",
                        "/eventTime",
                        "/series/lastObservedTime",
                        "/metadata/creationTimestamp",
                    ]
                    .iter()
                    .find_map(|p| {
                        o.pointer(p)
                            .and_then(Value::as_str)
                            .filter(|s| !s.is_empty())
                    });
                    let kind = s(o, "/involvedObject/kind").to_lowercase();
                    vec![
                        json!(human_age(last)),
                        json!(s(o, "/type")),
                        json!(s(o, "/reason")),
                        json!(format!("{kind}/{}", s(o, "/involvedObject/name"))),
                        json!(s(o, "/message")),
                    ]
                })
                .collect(),
        ),
        ("coordination.k8s.io", "leases") => (
            vec![
                name_col,
                col(
                    "Holder",
                    "string",
                    "",
                    "The current holder of the lease.",
                    0,
                ),
                age_col,
            ],
            objs.iter()
                .map(|o| vec![name(o), json!(s(o, "/spec/holderIdentity")), age(o)])
                .collect(),
        ),
        ("", "componentstatuses") => (
            vec![
                name_col,
                col(
                    "Status",
                    "string",
                    "",
                    "Status of the component conditions",
                    0,
                ),
                col(
                    "Message",
                    "string",
                    "",
                    "Message of the component conditions",
                    0,
                ),
                col(
                    "Error",
                    "string",
                    "",
                    "Error of the component conditions",
                    0,
                ),
            ],
            objs.iter()
                .map(|o| {
                    let healthy = o
                        .get("conditions")
                        .and_then(Value::as_array)
                        .and_then(|cs| cs.iter().find(|c| c["type"] == "Healthy"));
                    let status = match healthy.map(|c| c["status"] == "True") {
                        Some(true) => "Healthy",
                        Some(false) => "Unhealthy",
                        None => "Unknown",
                    };
                    let f = |k: &str| healthy.and_then(|c| c[k].as_str()).unwrap_or("");
                    vec![
                        name(o),
                        json!(status),
                        json!(f("message")),
                        json!(f("error")),
                    ]
                })
                .collect(),
        ),
        ("apiregistration.k8s.io", "apiservices") => (
            vec![
                name_col,
                col(
                    "Service",
                    "string",
                    "",
                    "The reference to the service that hosts this API endpoint.",
                    0,
                ),
                col(
                    "Available",
                    "string",
                    "",
                    "Whether this service is available.",
                    0,
                ),
                age_col,
            ],
            objs.iter()
                .map(|o| {
                    let service = match o.pointer("/spec/service") {
                        Some(svc) if svc.is_object() => format!(
                            "{}/{}",
                            svc["namespace"].as_str().unwrap_or(""),
                            svc["name"].as_str().unwrap_or("")
                        ),
                        _ => "Local".into(),
                    };
                    let available = o
                        .pointer("/status/conditions")
                        .and_then(Value::as_array)
                        .and_then(|cs| cs.iter().find(|c| c["type"] == "Available"))
                        .map_or("Unknown".to_string(), |c| {
                            let status = c["status"].as_str().unwrap_or("Unknown");
                            match c["reason"].as_str().filter(|_| status != "True") {
                                Some(r) => format!("{status} ({r})"),
                                None => status.to_string(),
                            }
                        });
                    vec![name(o), json!(service), json!(available), age(o)]
                })
                .collect(),
        ),
        ("storage.k8s.io", "storageclasses") => (
            vec![
                name_col,
                col(
                    "Provisioner",
                    "string",
                    "",
                    "Indicates the type of the provisioner.",
                    0,
                ),
                col(
                    "ReclaimPolicy",
                    "string",
                    "",
                    "Dynamically provisioned PersistentVolumes of this storage class are created with this reclaimPolicy. Defaults to Delete.",
                    0,
                ),
                col(
                    "VolumeBindingMode",
                    "string",
                    "",
                    "VolumeBindingMode indicates how PersistentVolumeClaims should be provisioned and bound.  When unset, VolumeBindingImmediate is used. This field is only honored by servers that enable the VolumeScheduling feature.",
                    0,
                ),
                col(
                    "AllowVolumeExpansion",
                    "string",
                    "",
                    "AllowVolumeExpansion shows whether the storage class allow volume expand",
                    0,
                ),
                age_col,
            ],
            objs.iter()
                .map(|o| {
                    let default = o
                        .pointer("/metadata/annotations")
                        .and_then(Value::as_object)
                        .is_some_and(|a| {
                            [
                                "storageclass.kubernetes.io/is-default-class",
                                "storageclass.beta.kubernetes.io/is-default-class",
                            ]
                            .iter()
                            .any(|k| a.get(*k).and_then(Value::as_str) == Some("true"))
                        });
                    let n = s(o, "/metadata/name");
                    vec![
                        json!(if default {
                            format!("{n} (default)")
                        } else {
                            n.to_string()
                        }),
                        json!(s(o, "/provisioner")),
                        json!(or(s(o, "/reclaimPolicy"), "Delete")),
                        json!(or(s(o, "/volumeBindingMode"), "Immediate")),
                        json!(
                            o.get("allowVolumeExpansion")
                                .and_then(Value::as_bool)
                                .unwrap_or(false)
                        ),
                        age(o),
                    ]
                })
                .collect(),
        ),
        ("node.k8s.io", "runtimeclasses") => (
            vec![
                name_col,
                col(
                    "Handler",
                    "string",
                    "",
                    "Handler specifies the underlying runtime and configuration that the CRI implementation will use to handle pods of this class.",
                    0,
                ),
                age_col,
            ],
            objs.iter()
                .map(|o| vec![name(o), json!(s(o, "/handler")), age(o)])
                .collect(),
        ),
        (
            "admissionregistration.k8s.io",
            "validatingwebhookconfigurations" | "mutatingwebhookconfigurations",
        ) => (
            vec![
                name_col,
                col(
                    "Webhooks",
                    "integer",
                    "",
                    "Webhooks indicates the number of webhooks registered in this configuration.",
                    0,
                ),
                age_col,
            ],
            objs.iter()
                .map(|o| {
                    let n = o
                        .get("webhooks")
                        .and_then(Value::as_array)
                        .map_or(0, Vec::len);
                    vec![name(o), json!(n), age(o)]
                })
                .collect(),
        ),
        ("autoscaling", "horizontalpodautoscalers") => (
            vec![
                name_col,
                col(
                    "Reference",
                    "string",
                    "",
                    "Reference to the target resource that is being scaled.",
                    0,
                ),
                col(
                    "Targets",
                    "string",
                    "",
                    "The metrics the autoscaler targets, as current/target.",
                    0,
                ),
                col(
                    "MinPods",
                    "string",
                    "",
                    "Lower limit for the number of pods that can be set by the autoscaler, default 1.",
                    0,
                ),
                col(
                    "MaxPods",
                    "string",
                    "",
                    "Upper limit for the number of pods that can be set by the autoscaler; cannot be smaller than MinReplicas.",
                    0,
                ),
                col(
                    "Replicas",
                    "string",
                    "",
                    "Current number of replicas of pods managed by this autoscaler.",
                    0,
                ),
                age_col,
            ],
            objs.iter().map(hpa_row).collect(),
        ),
        ("flowcontrol.apiserver.k8s.io", "flowschemas") => (
            vec![
                name_col,
                col(
                    "PriorityLevel",
                    "string",
                    "",
                    "The name of the priority level configuration this flow schema refers to.",
                    0,
                ),
                col(
                    "MatchingPrecedence",
                    "string",
                    "",
                    "The matching precedence of this flow schema.",
                    0,
                ),
                col(
                    "DistinguisherMethod",
                    "string",
                    "",
                    "How requests of this flow schema are told apart.",
                    0,
                ),
                age_col,
                col(
                    "MissingPL",
                    "string",
                    "",
                    "Whether the referenced priority level configuration object is missing.",
                    0,
                ),
            ],
            objs.iter()
                .map(|o| {
                    let missing = o
                        .pointer("/status/conditions")
                        .and_then(Value::as_array)
                        .and_then(|cs| cs.iter().find(|c| c["type"] == "Dangling"))
                        .and_then(|c| c["status"].as_str())
                        .unwrap_or("?");
                    vec![
                        name(o),
                        json!(s(o, "/spec/priorityLevelConfiguration/name")),
                        o.pointer("/spec/matchingPrecedence")
                            .cloned()
                            .unwrap_or(json!(0)),
                        json!(or_none(s(o, "/spec/distinguisherMethod/type"))),
                        age(o),
                        json!(missing),
                    ]
                })
                .collect(),
        ),
        ("flowcontrol.apiserver.k8s.io", "prioritylevelconfigurations") => (
            vec![
                name_col,
                col("Type", "string", "", "The type of this priority level.", 0),
                col(
                    "NominalConcurrencyShares",
                    "string",
                    "",
                    "The nominal concurrency shares of this priority level.",
                    0,
                ),
                col(
                    "Queues",
                    "string",
                    "",
                    "The number of queues of this priority level.",
                    0,
                ),
                col(
                    "HandSize",
                    "string",
                    "",
                    "The hand size of this priority level.",
                    0,
                ),
                col(
                    "QueueLengthLimit",
                    "string",
                    "",
                    "The queue length limit of this priority level.",
                    0,
                ),
                age_col,
            ],
            objs.iter()
                .map(|o| {
                    let limited = s(o, "/spec/type") == "Limited";
                    let at = |p: &str| {
                        o.pointer(p)
                            .filter(|_| limited)
                            .cloned()
                            .unwrap_or(json!("<none>"))
                    };
                    vec![
                        name(o),
                        json!(s(o, "/spec/type")),
                        at("/spec/limited/nominalConcurrencyShares"),
                        at("/spec/limited/limitResponse/queuing/queues"),
                        at("/spec/limited/limitResponse/queuing/handSize"),
                        at("/spec/limited/limitResponse/queuing/queueLengthLimit"),
                        age(o),
                    ]
                })
                .collect(),
        ),
        ("certificates.k8s.io", "certificatesigningrequests") => (
            vec![
                name_col,
                age_col,
                col(
                    "SignerName",
                    "string",
                    "",
                    "Requested signer for the request. It is a qualified name in the form: `scope-hostname.io/name`.",
                    0,
                ),
                col(
                    "Requestor",
                    "string",
                    "",
                    "Name of the user who created the request.",
                    0,
                ),
                col(
                    "RequestedDuration",
                    "string",
                    "",
                    "The requested duration of the issued certificate.",
                    0,
                ),
                col(
                    "Condition",
                    "string",
                    "",
                    "The conditions of the request and whether a certificate was issued.",
                    0,
                ),
            ],
            objs.iter().map(csr_row).collect(),
        ),
        ("apiextensions.k8s.io", "customresourcedefinitions") => (
            vec![name_col, col("Created At", "date", "", "", 0)],
            objs.iter()
                .map(|o| vec![name(o), json!(s(o, "/metadata/creationTimestamp"))])
                .collect(),
        ),
        _ => (
            vec![name_col, age_col],
            objs.iter().map(|o| vec![name(o), age(o)]).collect(),
        ),
    }
}

/// Columns and cells of a custom resource.
fn custom(cols: &[PrinterColumn], objs: &[Value]) -> (Vec<Value>, Vec<Vec<Value>>) {
    let mut defs = vec![col(
        "Name",
        "string",
        "name",
        "Name must be unique within a namespace.",
        0,
    )];
    if cols.is_empty() {
        defs.push(col("Age", "date", "", "CreationTimestamp is a timestamp representing the server time when this object was created.", 0));
        let rows = objs
            .iter()
            .map(|o| vec![json!(s(o, "/metadata/name")), age(o)])
            .collect();
        return (defs, rows);
    }
    defs.extend(
        cols.iter()
            .map(|c| col(&c.name, &c.type_, &c.format, &c.description, c.priority)),
    );
    let rows = objs
        .iter()
        .map(|o| {
            let mut row = vec![json!(s(o, "/metadata/name"))];
            for c in cols {
                row.push(cell(&c.type_, jsonpath(o, &c.json_path)));
            }
            row
        })
        .collect();
    (defs, rows)
}

fn cell(type_: &str, v: Option<Value>) -> Value {
    let Some(v) = v else { return Value::Null };
    match type_ {
        "date" => match v.as_str() {
            Some(t) => json!(human_age(Some(t))),
            None => json!("<invalid>"),
        },
        "integer" => v.as_i64().map(|i| json!(i)).unwrap_or(Value::Null),
        "number" => v.as_f64().map(|f| json!(f)).unwrap_or(Value::Null),
        "boolean" => v.as_bool().map(|b| json!(b)).unwrap_or(Value::Null),
        _ => match v {
            Value::String(s) => json!(s),
            other => json!(other.to_string()),
        },
    }
}

/// Evaluates the JSONPath subset CRDs use: `.a.b`, `.a[0]`, `.a[*].b`,
/// `.a[?(@.type=="Ready")].status`, optionally wrapped in `{}`. Returns the
/// first match.
pub(crate) fn jsonpath(obj: &Value, path: &str) -> Option<Value> {
    let p = path.trim().trim_start_matches('{').trim_end_matches('}');
    let mut cur = vec![obj.clone()];
    let mut rest = p.trim_start_matches('$');
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            let field = &r[..end];
            rest = &r[end..];
            if field.is_empty() {
                continue;
            }
            cur = cur.iter().filter_map(|v| v.get(field).cloned()).collect();
        } else if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']')?;
            let sel = &r[..end];
            rest = &r[end + 1..];
            let mut next = Vec::new();
            for v in &cur {
                let Some(items) = v.as_array() else { continue };
                if sel == "*" {
                    next.extend(items.iter().cloned());
                } else if let Ok(i) = sel.parse::<i64>() {
                    let idx = if i < 0 { items.len() as i64 + i } else { i };
                    if let Some(x) = usize::try_from(idx).ok().and_then(|i| items.get(i)) {
                        next.push(x.clone());
                    }
                } else if let Some(f) = sel.strip_prefix("?(@.").and_then(|f| f.strip_suffix(')')) {
                    let (field, want) = f.split_once("==")?;
                    let want = want.trim().trim_matches(|c| c == '"' || c == '\'');
                    next.extend(
                        items
                            .iter()
                            .filter(|x| {
                                x.get(field.trim())
                                    .is_some_and(|v| v.as_str().map_or(*v == want, |s| s == want))
                            })
                            .cloned(),
                    );
                }
            }
            cur = next;
        } else {
            return None;
        }
    }
    cur.into_iter().next()
}

/// A Table of `objs`. `include` is the `includeObject` parameter
/// (`None`, `Metadata` (default) or `Object`).
pub(crate) fn table(
    info: &ResourceInfo,
    version: &str,
    objs: &[Value],
    include: Option<&str>,
    rv: Option<u64>,
    with_columns: bool,
) -> Value {
    let (cols, cells) = if info.builtin {
        builtin(info, objs)
    } else {
        custom(
            info.columns.get(version).map(Vec::as_slice).unwrap_or(&[]),
            objs,
        )
    };
    let rows: Vec<Value> = objs
        .iter()
        .zip(cells)
        .map(|(o, cells)| {
            let mut row = json!({"cells": cells});
            match include.unwrap_or("Metadata") {
                "None" => {}
                "Object" => row["object"] = o.clone(),
                _ => {
                    row["object"] = json!({
                        "kind": "PartialObjectMetadata",
                        "apiVersion": "meta.k8s.io/v1",
                        "metadata": o.get("metadata").cloned().unwrap_or(json!({})),
                    })
                }
            }
            row
        })
        .collect();
    let mut t = json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {},
        "columnDefinitions": if with_columns { json!(cols) } else { json!([]) },
        "rows": rows,
    });
    if let Some(rv) = rv {
        t["metadata"]["resourceVersion"] = json!(rv.to_string());
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_render_like_the_real_server() {
        assert_eq!(human_duration(45), "45s");
        assert_eq!(human_duration(330), "5m30s");
        assert_eq!(human_duration(45 * 60), "45m");
        assert_eq!(human_duration(3 * 3600 + 15 * 60), "3h15m");
        assert_eq!(human_duration(25 * 3600), "25h");
        assert_eq!(human_duration(3 * 86400 + 5 * 3600), "3d5h");
        assert_eq!(human_duration(45 * 86400), "45d");
    }

    #[test]
    fn jsonpath_subset() {
        let o = json!({"status": {"ready": 3, "conditions": [{"type": "A", "status": "x"}, {"type": "Ready", "status": "True"}]}, "spec": {"l": [1, 2]}});
        assert_eq!(jsonpath(&o, ".status.ready"), Some(json!(3)));
        assert_eq!(
            jsonpath(&o, ".status.conditions[?(@.type==\"Ready\")].status"),
            Some(json!("True"))
        );
        assert_eq!(jsonpath(&o, "{.spec.l[1]}"), Some(json!(2)));
        assert_eq!(jsonpath(&o, ".spec.missing"), None);
    }
}
