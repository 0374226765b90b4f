//! The one CEL transition rule the embedded server enforces on custom
//! resources: `x-kubernetes-validations: [{rule: "self == oldSelf"}]`, the
//! immutable-field idiom (hostmesh's `World.spec.managedBy`).
//!
//! Invariants:
//! 1. As on a real API server, the rule is evaluated only on updates and
//!    only where the old object has the field (a transition rule does not
//!    apply to a field being added); a change is refused with 422 naming the
//!    field and the rule's `message` (or the rule itself).
//! 2. Any other rule is not evaluated here (the server has no CEL engine);
//!    it is neither enforced nor refused.
//! 3. Only `properties` of objects are walked: the rule on a list item or a
//!    map value is not enforced.

use serde_json::Value;

use super::registry::ResourceInfo;
use super::status::ApiError;

/// The only rule understood (whitespace is ignored).
const IMMUTABLE: &str = "self==oldSelf";

/// Refuses an update of a custom resource that breaks a `self == oldSelf`
/// rule of its schema (invariants 1-3).
pub(crate) fn check_update(
    info: &ResourceInfo,
    version: &str,
    old: &Value,
    new: &Value,
) -> Result<(), ApiError> {
    let Some(schema) = info.schemas.get(version) else {
        return Ok(());
    };
    let mut errors = Vec::new();
    walk(schema, Some(old), Some(new), "", &mut errors);
    if errors.is_empty() {
        return Ok(());
    }
    Err(ApiError::invalid(
        &format!("{}.{}", info.kind, info.group),
        super::meta::name(new),
        errors,
    ))
}

fn walk(
    schema: &Value,
    old: Option<&Value>,
    new: Option<&Value>,
    path: &str,
    errors: &mut Vec<(String, String)>,
) {
    let (Some(old), Some(new)) = (old, new) else {
        return;
    };
    for rule in schema
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let text: String = rule
            .get("rule")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        if text == IMMUTABLE && old != new {
            let message = rule.get("message").and_then(Value::as_str).map_or_else(
                || "failed rule: self == oldSelf".to_string(),
                str::to_string,
            );
            errors.push((path.to_string(), format!("Invalid value: {message}")));
        }
    }
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (k, s) in props {
            if path.is_empty() && matches!(k.as_str(), "metadata" | "status") {
                continue;
            }
            let child = if path.is_empty() {
                k.clone()
            } else {
                format!("{path}.{k}")
            };
            walk(s, old.get(k), new.get(k), &child, errors);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
            "managedBy": {"type": "string", "x-kubernetes-validations": [
                {"rule": "self == oldSelf", "message": "spec.managedBy is immutable"}]},
            "other": {"type": "string", "x-kubernetes-validations": [{"rule": "self.size() < 3"}]},
        }}}})
    }

    fn errs(old: Value, new: Value) -> Vec<(String, String)> {
        let mut e = Vec::new();
        walk(&schema(), Some(&old), Some(&new), "", &mut e);
        e
    }

    #[test]
    fn a_changed_immutable_field_is_refused_with_its_message() {
        let e = errs(
            json!({"spec": {"managedBy": "a"}}),
            json!({"spec": {"managedBy": "b"}}),
        );
        assert_eq!(
            e,
            [(
                "spec.managedBy".to_string(),
                "Invalid value: spec.managedBy is immutable".to_string()
            )]
        );
    }

    #[test]
    fn unchanged_added_and_other_rules_pass() {
        assert!(
            errs(
                json!({"spec": {"managedBy": "a"}}),
                json!({"spec": {"managedBy": "a"}})
            )
            .is_empty()
        );
        // A transition rule does not apply to a field the old object lacks.
        assert!(errs(json!({"spec": {}}), json!({"spec": {"managedBy": "b"}})).is_empty());
        // Rules other than `self == oldSelf` are not evaluated.
        assert!(
            errs(
                json!({"spec": {"other": "a"}}),
                json!({"spec": {"other": "abcd"}})
            )
            .is_empty()
        );
    }
}
