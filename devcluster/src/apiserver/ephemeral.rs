//! Owns the `pods/ephemeralcontainers` subresource's rules (what `kubectl
//! debug` writes): an update through it changes only
//! `spec.ephemeralContainers` (anything else in the body is dropped, as the
//! real server's strategy does), existing ephemeral containers may be
//! neither removed nor changed, and each container is validated as
//! kube-apiserver's `validateEphemeralContainers` does.
//!
//! Invariants:
//! 1. A write through the subresource stores the live pod with only
//!    `spec.ephemeralContainers` replaced.
//! 2. Ephemeral containers are never set on create, never change once
//!    added and never go away while the pod lives (`existing ephemeral
//!    containers "x" may not be removed`).
//! 3. A name is unique across containers, init containers and ephemeral
//!    containers; a `targetContainerName` names a container or init
//!    container.

use serde_json::{Value, json};

/// Fields an ephemeral container may set (`allowedEphemeralContainerFields`
/// of the Kubernetes validation); any other is `Forbidden: cannot be set
/// for an Ephemeral Container`.
const ALLOWED: &[&str] = &[
    "name",
    "image",
    "command",
    "args",
    "workingDir",
    "envFrom",
    "env",
    "volumeMounts",
    "volumeDevices",
    "terminationMessagePath",
    "terminationMessagePolicy",
    "imagePullPolicy",
    "securityContext",
    "stdin",
    "stdinOnce",
    "tty",
    "targetContainerName",
];

/// Fields of `Container` an ephemeral container has but may not set, in
/// the order the real server reports them.
const FORBIDDEN: &[&str] = &[
    "ports",
    "resources",
    "resizePolicy",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "lifecycle",
    "restartPolicy",
];

/// The pod stored by a write through the subresource (invariant 1):
/// `old` with `new`'s ephemeral containers.
pub(crate) fn merge(old: &Value, new: &Value) -> Value {
    let mut out = old.clone();
    match new.pointer("/spec/ephemeralContainers") {
        Some(v) if !v.is_null() => out["spec"]["ephemeralContainers"] = v.clone(),
        _ => {
            if let Some(spec) = out.get_mut("spec").and_then(Value::as_object_mut) {
                spec.remove("ephemeralContainers");
            }
        }
    }
    if let Some(rv) = new.pointer("/metadata/resourceVersion") {
        out["metadata"]["resourceVersion"] = rv.clone();
    }
    out
}

/// The defaults of ephemeral containers (the same as containers', except
/// that no ports or resources are filled in beyond the empty `resources`).
pub(crate) fn default(spec: &mut Value) {
    let Some(cs) = spec
        .get_mut("ephemeralContainers")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    for c in cs {
        let Some(m) = c.as_object_mut() else { continue };
        m.entry("terminationMessagePath")
            .or_insert(json!("/dev/termination-log"));
        m.entry("terminationMessagePolicy").or_insert(json!("File"));
        let latest = m.get("image").and_then(Value::as_str).is_some_and(|i| {
            i.ends_with(":latest") || !i.rsplit('/').next().unwrap_or(i).contains(':')
        });
        m.entry("imagePullPolicy")
            .or_insert(json!(if latest { "Always" } else { "IfNotPresent" }));
        m.entry("resources").or_insert(json!({}));
    }
}

/// The field errors of a pod created with ephemeral containers.
pub(crate) fn check_create(pod: &Value) -> Vec<(String, String)> {
    match pod.pointer("/spec/ephemeralContainers") {
        Some(Value::Array(a)) if !a.is_empty() => vec![(
            "spec.ephemeralContainers".into(),
            "Forbidden: cannot be set on create".into(),
        )],
        _ => Vec::new(),
    }
}

/// The field errors of an update from `old` to `new` (invariants 2, 3),
/// in the real server's order: the containers themselves, then what
/// changed.
pub(crate) fn check_update(old: &Value, new: &Value) -> Vec<(String, String)> {
    let mut errors = validate(new);
    let list = |v: &Value| -> Vec<Value> {
        v.pointer("/spec/ephemeralContainers")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let (before, after) = (list(old), list(new));
    for o in &before {
        let name = o.get("name").and_then(Value::as_str).unwrap_or("");
        match after.iter().find(|n| n.get("name") == o.get("name")) {
            None => errors.push((
                "spec.ephemeralContainers".into(),
                format!("Forbidden: existing ephemeral containers \"{name}\" may not be removed\n"),
            )),
            Some(n) if n != o => {
                let changed: Vec<String> = fields_changed(o, n);
                errors.push((
                    "spec.ephemeralContainers".into(),
                    format!(
                        "Forbidden: existing ephemeral containers \"{name}\" may not be changed\n  changed: {}\n",
                        changed.join(", ")
                    ),
                ));
            }
            Some(_) => {}
        }
    }
    errors
}

fn fields_changed(a: &Value, b: &Value) -> Vec<String> {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return vec!["the container".into()];
    };
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .cloned()
        .collect()
}

/// The field errors of a pod's ephemeral containers (invariant 3).
fn validate(pod: &Value) -> Vec<(String, String)> {
    let mut errors = Vec::new();
    let Some(ecs) = pod
        .pointer("/spec/ephemeralContainers")
        .and_then(Value::as_array)
    else {
        return errors;
    };
    let names = |list: &str| -> Vec<String> {
        pod.pointer(&format!("/spec/{list}"))
            .and_then(Value::as_array)
            .map(|cs| {
                cs.iter()
                    .filter_map(|c| c.get("name").and_then(Value::as_str))
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    };
    let others: Vec<String> = names("containers")
        .into_iter()
        .chain(names("initContainers"))
        .collect();
    let mut all = others.clone();
    let volumes: Vec<String> = pod
        .pointer("/spec/volumes")
        .and_then(Value::as_array)
        .map(|vs| {
            vs.iter()
                .filter_map(|v| v.get("name").and_then(Value::as_str))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    for (i, ec) in ecs.iter().enumerate() {
        let at = format!("spec.ephemeralContainers[{i}]");
        let Some(c) = ec.as_object() else {
            errors.push((at, "Invalid value: must be an object".into()));
            continue;
        };
        let name = c.get("name").and_then(Value::as_str).unwrap_or("");
        if name.is_empty() {
            errors.push((format!("{at}.name"), "Required value".into()));
        } else if let Err(e) = check_label(name) {
            errors.push((format!("{at}.name"), e));
        }
        if c.get("image")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            errors.push((format!("{at}.image"), "Required value".into()));
        }
        for (j, m) in c
            .get("volumeMounts")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            let v = m.get("name").and_then(Value::as_str).unwrap_or("");
            if !volumes.iter().any(|x| x == v) {
                errors.push((
                    format!("{at}.volumeMounts[{j}].name"),
                    format!("Not found: \"{v}\""),
                ));
            }
        }
        if !name.is_empty() {
            if all.iter().any(|n| n == name) {
                errors.push((format!("{at}.name"), format!("Duplicate value: \"{name}\"")));
            } else {
                all.push(name.to_string());
            }
        }
        if let Some(target) = c
            .get("targetContainerName")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            && !others.iter().any(|n| n == target)
        {
            errors.push((
                format!("{at}.targetContainerName"),
                format!("Not found: \"{target}\""),
            ));
        }
        for f in FORBIDDEN {
            let set = c.get(*f).is_some_and(|v| match v {
                Value::Null => false,
                Value::Object(m) => !m.is_empty(),
                Value::Array(a) => !a.is_empty(),
                Value::String(s) => !s.is_empty(),
                _ => true,
            });
            if set {
                errors.push((
                    format!("{at}.{f}"),
                    "Forbidden: cannot be set for an Ephemeral Container".into(),
                ));
            }
        }
        for k in c.keys() {
            if !ALLOWED.contains(&k.as_str()) && !FORBIDDEN.contains(&k.as_str()) {
                errors.push((
                    format!("{at}.{k}"),
                    "Forbidden: cannot be set for an Ephemeral Container".into(),
                ));
            }
        }
        for (j, m) in c
            .get("volumeMounts")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            for f in ["subPath", "subPathExpr"] {
                if m.get(f)
                    .and_then(Value::as_str)
                    .is_some_and(|s| !s.is_empty())
                {
                    errors.push((
                        format!("{at}.volumeMounts[{j}].{f}"),
                        "Forbidden: cannot be set for an Ephemeral Container".into(),
                    ));
                }
            }
        }
    }
    errors
}

/// A container name: an RFC 1123 label, with the real server's message.
fn check_label(name: &str) -> Result<(), String> {
    let ok = name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else if name.len() > 63 {
        Err(format!(
            "Invalid value: \"{name}\": must be no more than 63 characters"
        ))
    } else {
        Err(format!(
            "Invalid value: \"{name}\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ecs: Value) -> Value {
        json!({
            "metadata": {"name": "p", "resourceVersion": "5"},
            "spec": {
                "containers": [{"name": "main", "image": "i"}],
                "volumes": [{"name": "v", "emptyDir": {}}],
                "ephemeralContainers": ecs,
            },
        })
    }

    /// Invariant 3 and the allow list, in the real server's words.
    #[test]
    fn names_targets_and_forbidden_fields_are_checked_as_the_real_server() {
        let errors = validate(&pod(json!([
            {"name": "main", "image": "b"},
            {"name": "e", "targetContainerName": "nope", "ports": [{"containerPort": 80}],
             "readinessProbe": {"exec": {"command": ["true"]}}, "resources": {},
             "volumeMounts": [{"name": "x", "mountPath": "/x", "subPath": "a"}]},
            {"name": "E_1", "image": "b"},
        ])));
        let fields: Vec<&str> = errors.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.ephemeralContainers[0].name",
                "spec.ephemeralContainers[1].image",
                "spec.ephemeralContainers[1].volumeMounts[0].name",
                "spec.ephemeralContainers[1].targetContainerName",
                "spec.ephemeralContainers[1].ports",
                "spec.ephemeralContainers[1].readinessProbe",
                "spec.ephemeralContainers[1].volumeMounts[0].subPath",
                "spec.ephemeralContainers[2].name",
            ]
        );
        assert_eq!(errors[0].1, "Duplicate value: \"main\"");
        assert_eq!(errors[3].1, "Not found: \"nope\"");
        assert!(errors[7].1.contains("RFC 1123 label"), "{}", errors[7].1);
    }

    /// Invariants 1 and 2.
    #[test]
    fn only_ephemeral_containers_change_and_existing_ones_stay() {
        let old = pod(json!([{"name": "a", "image": "x"}]));
        let mut new = pod(json!([{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]));
        new["spec"]["activeDeadlineSeconds"] = json!(5);
        new["metadata"]["labels"] = json!({"k": "v"});
        let merged = merge(&old, &new);
        assert_eq!(merged["spec"]["ephemeralContainers"][1]["name"], "b");
        assert!(merged["spec"].get("activeDeadlineSeconds").is_none());
        assert!(merged["metadata"].get("labels").is_none());
        assert!(check_update(&old, &merged).is_empty());
        let removed = merge(&old, &pod(json!([])));
        let errors = check_update(&old, &removed);
        assert_eq!(
            errors,
            [(
                "spec.ephemeralContainers".to_string(),
                "Forbidden: existing ephemeral containers \"a\" may not be removed\n".to_string()
            )]
        );
        let changed = merge(&old, &pod(json!([{"name": "a", "image": "z"}])));
        let errors = check_update(&old, &changed);
        assert!(
            errors[0]
                .1
                .starts_with("Forbidden: existing ephemeral containers \"a\" may not be changed"),
            "{errors:?}"
        );
        assert!(errors[0].1.contains("image"), "{errors:?}");
        assert_eq!(
            check_create(&old),
            [(
                "spec.ephemeralContainers".to_string(),
                "Forbidden: cannot be set on create".to_string()
            )]
        );
    }
}
