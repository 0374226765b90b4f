//! Owns the patch formats other than server-side apply: JSON merge patch
//! (RFC 7386), JSON patch (RFC 6902) and strategic merge patch for built-in
//! types (merge keys from `lists`, the `$patch`, `$setElementOrder` and
//! `$deleteFromPrimitiveList` directives).

use serde_json::Value;

use super::lists::{ListKind, has_key, item_key, list_kind};
use super::status::ApiError;

/// Applies a JSON merge patch.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) -> Result<(), ApiError> {
    if !patch.is_object() {
        return Err(ApiError::bad_request("a merge patch must be a JSON object"));
    }
    json_patch::merge(target, patch);
    Ok(())
}

/// Applies a JSON patch. As in the real server, a `test` of a path that
/// does not exist against `null` succeeds (kube-rs's finalizer helper
/// relies on it to add the first finalizer).
pub(crate) fn json_patch(target: &mut Value, patch: &Value) -> Result<(), ApiError> {
    let ops: json_patch::Patch = serde_json::from_value(patch.clone()).map_err(|e| {
        ApiError::bad_request(format!(
            "invalid JSON patch: {e}: send a list of {{op, path, value}}"
        ))
    })?;
    // The caller patches a copy: a failure leaves the stored object as is.
    for op in ops.0 {
        if let json_patch::PatchOperation::Test(t) = &op
            && t.value.is_null()
            && target.pointer(t.path.as_str()).is_none()
        {
            continue;
        }
        json_patch::patch(target, std::slice::from_ref(&op))
            .map_err(|e| ApiError::invalid_patch(format!("the JSON patch failed: {e}")))?;
    }
    Ok(())
}

/// Applies a strategic merge patch to a built-in object.
pub(crate) fn strategic_merge(target: &mut Value, patch: &Value) -> Result<(), ApiError> {
    if !patch.is_object() {
        return Err(ApiError::bad_request(
            "a strategic merge patch must be a JSON object",
        ));
    }
    merge_map(target, patch);
    Ok(())
}

fn merge_map(target: &mut Value, patch: &Value) {
    let Some(pm) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if pm.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut p = pm.clone();
        p.remove("$patch");
        *target = Value::Object(p);
        return;
    }
    if !target.is_object() {
        *target = Value::Object(serde_json::Map::new());
    }
    for (k, v) in pm {
        if k == "$patch" || k == "$retainKeys" || k.starts_with("$setElementOrder/") {
            continue;
        }
        let t = target.as_object_mut().expect("made an object above");
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Some(del)) = (t.get_mut(field), v.as_array()) {
                list.retain(|x| !del.contains(x));
            }
            continue;
        }
        if v.is_null() {
            t.remove(k);
            continue;
        }
        if v.get("$patch").and_then(Value::as_str) == Some("delete") {
            t.remove(k);
            continue;
        }
        match v {
            Value::Object(_) => merge_map(t.entry(k.clone()).or_insert(Value::Null), v),
            Value::Array(items) => {
                let existing = t
                    .get(k)
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                let merged = merge_list(k, existing, items);
                t.insert(k.clone(), Value::Array(merged));
            }
            _ => {
                t.insert(k.clone(), v.clone());
            }
        }
    }
}

fn merge_list(field: &str, mut existing: Vec<Value>, patch: &[Value]) -> Vec<Value> {
    if patch
        .iter()
        .any(|p| p.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        return patch
            .iter()
            .filter(|p| p.get("$patch").is_none())
            .cloned()
            .collect();
    }
    let mut all = existing.clone();
    all.extend(patch.iter().cloned());
    match list_kind(true, field, None, &all) {
        ListKind::Atomic => patch.to_vec(),
        ListKind::Set => {
            for p in patch {
                if !existing.contains(p) {
                    existing.push(p.clone());
                }
            }
            existing
        }
        ListKind::Map(keys) => {
            for p in patch {
                let Some(key) = item_key(p, &keys) else {
                    existing.push(p.clone());
                    continue;
                };
                let pos = existing.iter().position(|e| has_key(e, &key));
                if p.get("$patch").and_then(Value::as_str) == Some("delete") {
                    if let Some(i) = pos {
                        existing.remove(i);
                    }
                    continue;
                }
                match pos {
                    Some(i) => merge_map(&mut existing[i], p),
                    None => {
                        let mut item = Value::Null;
                        merge_map(&mut item, p);
                        existing.push(item);
                    }
                }
            }
            existing
        }
    }
}

#[cfg(test)]
mod json_patch_tests {
    use serde_json::json;

    #[test]
    fn test_of_a_missing_path_against_null_succeeds_like_the_real_server() {
        let mut obj = json!({"metadata": {"name": "a"}});
        let patch = json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": ["x"]},
        ]);
        super::json_patch(&mut obj, &patch).unwrap();
        assert_eq!(obj["metadata"]["finalizers"], json!(["x"]));
    }

    #[test]
    fn test_of_a_present_value_that_differs_still_fails() {
        let mut obj = json!({"metadata": {"finalizers": ["y"]}});
        let patch = json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers/-", "value": "x"},
        ]);
        assert!(super::json_patch(&mut obj, &patch).is_err());
    }
}
