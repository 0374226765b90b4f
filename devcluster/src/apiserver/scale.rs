//! Owns the `scale` subresource: `autoscaling/v1` `Scale` views of the
//! built-in workloads (Deployments, ReplicaSets, StatefulSets) and of
//! custom resources that declare `subresources.scale`.
//!
//! Invariants:
//! 1. A Scale's `spec.replicas` is the object's replicas at
//!    `specReplicasPath`, `status.replicas` the count at
//!    `statusReplicasPath` (0 when unset), `status.selector` the selector
//!    in string form (the string at a CRD's `labelSelectorPath`; a
//!    workload's `spec.selector` rendered as kube-apiserver does).
//! 2. Writing a Scale (PUT or PATCH) changes only the replicas of the
//!    object, through the same update path as a PUT of the object (its
//!    resourceVersion is a precondition, generation moves, managedFields
//!    record the `scale` subresource).
//! 3. `spec.replicas` must be a non-negative integer (422 otherwise).

use serde_json::{Value, json};

use super::handlers::{Request, name_of, shape, track_update, write_existing};
use super::lifecycle::{self, Part};
use super::meta;
use super::patch as formats;
use super::registry::{ResourceInfo, ScalePaths};
use super::route::RouteTarget;
use super::status::ApiError;
use super::store::Store;

fn paths(info: &ResourceInfo) -> Result<&ScalePaths, ApiError> {
    info.scale
        .as_ref()
        .ok_or_else(|| ApiError::no_route(&format!("{}/scale", info.plural)))
}

fn get_path<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.')
        .filter(|s| !s.is_empty())
        .try_fold(obj, |cur, seg| cur.get(seg))
}

fn set_path(obj: &mut Value, path: &str, v: Value) {
    let segs: Vec<&str> = path.split('.').filter(|s| !s.is_empty()).collect();
    meta::set_path(obj, &segs, v);
}

/// A `metav1.LabelSelector` as the string `LabelSelectorAsSelector`
/// renders: requirements sorted by key.
fn selector_string(sel: &Value) -> String {
    let mut reqs: Vec<(String, String)> = Vec::new();
    if let Some(m) = sel.get("matchLabels").and_then(Value::as_object) {
        for (k, v) in m {
            reqs.push((k.clone(), format!("{k}={}", v.as_str().unwrap_or(""))));
        }
    }
    for e in sel
        .get("matchExpressions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let key = e.get("key").and_then(Value::as_str).unwrap_or("");
        let mut values: Vec<&str> = e
            .get("values")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        values.sort_unstable();
        let values = values.join(",");
        let r = match e.get("operator").and_then(Value::as_str).unwrap_or("") {
            "In" => format!("{key} in ({values})"),
            "NotIn" => format!("{key} notin ({values})"),
            "Exists" => key.to_string(),
            "DoesNotExist" => format!("!{key}"),
            _ => continue,
        };
        reqs.push((key.to_string(), r));
    }
    reqs.sort();
    reqs.into_iter()
        .map(|(_, r)| r)
        .collect::<Vec<_>>()
        .join(",")
}

/// The Scale view of an object (invariant 1).
fn view(info: &ResourceInfo, obj: &Value) -> Result<Value, ApiError> {
    let p = paths(info)?;
    let m = obj.get("metadata").cloned().unwrap_or(json!({}));
    let mut metadata = json!({});
    for k in [
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
    ] {
        if let Some(v) = m.get(k) {
            metadata[k] = v.clone();
        }
    }
    let replicas = get_path(obj, &p.spec_replicas)
        .and_then(Value::as_i64)
        .unwrap_or(if info.builtin { 1 } else { 0 });
    let mut status = json!({
        "replicas": get_path(obj, &p.status_replicas).and_then(Value::as_i64).unwrap_or(0),
    });
    let selector = p.label_selector.as_deref().and_then(|sp| get_path(obj, sp));
    match selector {
        Some(Value::String(s)) if !s.is_empty() => status["selector"] = json!(s),
        Some(sel @ Value::Object(_)) => {
            let s = selector_string(sel);
            if !s.is_empty() {
                status["selector"] = json!(s);
            }
        }
        _ => {}
    }
    Ok(json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": metadata,
        "spec": {"replicas": replicas},
        "status": status,
    }))
}

/// GET `.../{name}/scale`.
pub(crate) fn get(store: &Store, t: &RouteTarget) -> Result<(u16, Value), ApiError> {
    paths(&t.info)?;
    let name = name_of(t)?;
    let obj = store
        .lock()
        .get(&t.info.key(), t.ns.as_deref().unwrap_or(""), name)
        .ok_or_else(|| ApiError::not_found(&t.info.group, &t.info.plural, name))?;
    let obj = super::handlers::present(&t.info, &t.version, &obj);
    Ok((200, view(&t.info, &obj)?))
}

/// PUT or PATCH `.../{name}/scale` (invariants 2 and 3).
pub(crate) fn write(
    store: &Store,
    t: &RouteTarget,
    req: &Request,
    patch: bool,
) -> Result<(u16, Value), ApiError> {
    let p = paths(&t.info)?.clone();
    let name = name_of(t)?.to_string();
    let body = req.json_body()?;
    let ct = req
        .content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_string();
    let manager = req.manager();
    let info = t.info.clone();
    let (code, stored) = write_existing(store, t, &name, req.dry_run(), |old| {
        let Some(old) = old else {
            return Err(ApiError::not_found(&info.group, &info.plural, &name));
        };
        let current = view(&info, old)?;
        let scale = if patch {
            let mut s = current.clone();
            match ct.as_str() {
                "application/merge-patch+json" => formats::merge_patch(&mut s, &body)?,
                "application/json-patch+json" => formats::json_patch(&mut s, &body)?,
                "application/strategic-merge-patch+json" => {
                    formats::strategic_merge(&mut s, &body)?
                }
                other => {
                    return Err(ApiError::unsupported_media(format!(
                        "the patch content type {other:?} is not supported on scale: use application/merge-patch+json, application/json-patch+json or application/strategic-merge-patch+json"
                    )));
                }
            }
            s
        } else {
            body.clone()
        };
        let replicas = scale.pointer("/spec/replicas");
        let n = match replicas {
            Some(Value::Number(n))
                if n.as_i64()
                    .is_some_and(|n| (0..=i32::MAX as i64).contains(&n)) =>
            {
                n.as_i64().unwrap_or(0)
            }
            other => {
                let shown = other.map(Value::to_string).unwrap_or_else(|| "null".into());
                return Err(ApiError::invalid(
                    "Scale.autoscaling",
                    &name,
                    vec![(
                        "spec.replicas".into(),
                        format!("Invalid value: {shown}: must be greater than or equal to 0"),
                    )],
                ));
            }
        };
        let mut new = old.clone();
        set_path(&mut new, &p.spec_replicas, json!(n));
        // A Scale's resourceVersion is a precondition on the object.
        match scale
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
        {
            Some(rv) if !rv.is_empty() && !patch => {
                meta::meta_mut(&mut new).insert("resourceVersion".into(), json!(rv));
            }
            _ => {
                meta::meta_mut(&mut new).remove("resourceVersion");
            }
        }
        let Some(mut new) =
            lifecycle::prepare_update(&info, &t.version, old, new, Part::Main, false)?
        else {
            return Ok(None);
        };
        track_update(
            old,
            &mut new,
            &manager,
            &info.api_version(&t.version),
            "scale",
            shape(&info, &t.version),
        );
        Ok(Some(new))
    })?;
    Ok((code, view(&t.info, &stored)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_render_sorted_as_kubernetes_does() {
        let sel = json!({"matchLabels": {"tier": "web", "app": "a"}, "matchExpressions": [{"key": "b", "operator": "In", "values": ["y", "x"]}, {"key": "z", "operator": "DoesNotExist"}]});
        assert_eq!(selector_string(&sel), "app=a,b in (x,y),tier=web,!z");
    }
}
