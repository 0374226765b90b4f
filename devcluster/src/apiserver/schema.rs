//! Owns custom resource validation against the CRD's structural schema:
//! defaults are applied, unknown fields pruned, and every violation
//! reported in one 422 naming the field.
//!
//! Supported: `type`, `properties`, `additionalProperties`, `items`,
//! `required`, `enum`, `minimum`/`maximum` (and exclusive forms),
//! `minLength`/`maxLength`, `pattern`, `minItems`/`maxItems`, `nullable`, `default`,
//! `x-kubernetes-preserve-unknown-fields`,
//! `x-kubernetes-int-or-string`, `x-kubernetes-embedded-resource`.

use serde_json::{Map, Value};

use super::registry::ResourceInfo;
use super::status::ApiError;

/// What one validation pass found.
#[derive(Default)]
struct Findings {
    /// Invalid fields and why.
    errors: Vec<(String, String)>,
    /// Pruned unknown fields.
    unknown: Vec<String>,
}

/// Validates and defaults a custom resource in place; unknown fields are
/// pruned, or with `strict` (`fieldValidation=Strict`) refused with 400.
pub(crate) fn validate_and_default(
    info: &ResourceInfo,
    version: &str,
    obj: &mut Value,
    strict: bool,
) -> Result<(), ApiError> {
    let Some(schema) = info.schemas.get(version) else {
        return Ok(());
    };
    let mut f = Findings::default();
    let Some(root) = obj.as_object_mut() else {
        return Err(ApiError::bad_request("the body must be an object"));
    };
    let props = schema.get("properties").and_then(Value::as_object);
    let preserve = schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    apply_defaults(schema, root);
    let keys: Vec<String> = root.keys().cloned().collect();
    for k in keys {
        if matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        match props.and_then(|p| p.get(&k)) {
            Some(s) => {
                if let Some(v) = root.get_mut(&k) {
                    check(s, v, &k, &mut f);
                }
            }
            None if preserve => {}
            None => {
                root.remove(&k);
                f.unknown.push(k.clone());
            }
        }
    }
    check_required(schema, root, "", &mut f);
    if strict && !f.unknown.is_empty() {
        let list: Vec<String> = f
            .unknown
            .iter()
            .map(|u| format!("unknown field \"{u}\""))
            .collect();
        return Err(ApiError::bad_request(format!(
            "{kind} in version \"{version}\" cannot be handled as a {kind}: strict decoding error: {}",
            list.join(", "),
            kind = info.kind
        )));
    }
    let errors = f.errors;
    if errors.is_empty() {
        Ok(())
    } else {
        let name = super::meta::name(obj).to_string();
        Err(ApiError::invalid(
            &format!("{}.{}", info.kind, info.group),
            &name,
            errors,
        ))
    }
}

fn apply_defaults(schema: &Value, m: &mut Map<String, Value>) {
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (k, s) in props {
            if !m.contains_key(k)
                && let Some(d) = s.get("default")
            {
                m.insert(k.clone(), d.clone());
            }
        }
    }
}

fn check_required(schema: &Value, m: &Map<String, Value>, path: &str, f: &mut Findings) {
    if let Some(req) = schema.get("required").and_then(Value::as_array) {
        for r in req.iter().filter_map(Value::as_str) {
            if !m.contains_key(r) {
                f.errors.push((join(path, r), "Required value".into()));
            }
        }
    }
}

/// A compiled `pattern` (cached: schemas are checked on every write).
fn pattern(p: &str) -> Option<regex::Regex> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static CACHE: OnceLock<Mutex<HashMap<String, Option<regex::Regex>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Mutex::default);
    let mut c = cache.lock().unwrap_or_else(|e| e.into_inner());
    if c.len() > 1024 {
        c.clear();
    }
    // A pattern the regex engine cannot compile is not enforced (the CRD
    // was accepted; refusing every object would be worse).
    c.entry(p.to_string())
        .or_insert_with(|| regex::Regex::new(p).ok())
        .clone()
}

fn join(path: &str, k: &str) -> String {
    if path.is_empty() {
        k.to_string()
    } else {
        format!("{path}.{k}")
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn check(schema: &Value, v: &mut Value, path: &str, f: &mut Findings) {
    if v.is_null() {
        if schema.get("nullable") == Some(&Value::Bool(true)) {
            return;
        }
        // A null is dropped like an absent field (the real server prunes it
        // unless nullable), so defaults can apply on the next level up.
        f.errors.push((
            path.to_string(),
            "Invalid value: \"null\": must not be null".into(),
        ));
        return;
    }
    let int_or_string = schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
    if int_or_string {
        if !(v.is_string() || type_name(v) == "integer") {
            f.errors.push((
                path.to_string(),
                format!(
                    "Invalid value: {}: must be an integer or a string",
                    type_name(v)
                ),
            ));
        }
        return;
    }
    if let Some(t) = schema.get("type").and_then(Value::as_str) {
        let actual = type_name(v);
        let ok = t == actual || (t == "number" && actual == "integer");
        if !ok {
            f.errors.push((
                path.to_string(),
                format!(
                    "Invalid value: \"{actual}\": {path} in body must be of type {t}: \"{actual}\""
                ),
            ));
            return;
        }
    }
    if let Some(en) = schema.get("enum").and_then(Value::as_array)
        && !en.contains(v)
    {
        let allowed: Vec<String> = en.iter().map(|e| e.to_string()).collect();
        f.errors.push((
            path.to_string(),
            format!(
                "Unsupported value: {v}: supported values: {}",
                allowed.join(", ")
            ),
        ));
    }
    let num = |k: &str| schema.get(k).and_then(Value::as_f64);
    if let Some(x) = v.as_f64() {
        if let Some(min) = num("minimum") {
            let excl = schema.get("exclusiveMinimum") == Some(&Value::Bool(true));
            if x < min || (excl && x == min) {
                f.errors.push((path.to_string(), format!("Invalid value: {x}: {path} in body should be greater than or equal to {min}")));
            }
        }
        if let Some(max) = num("maximum") {
            let excl = schema.get("exclusiveMaximum") == Some(&Value::Bool(true));
            if x > max || (excl && x == max) {
                f.errors.push((
                    path.to_string(),
                    format!(
                        "Invalid value: {x}: {path} in body should be less than or equal to {max}"
                    ),
                ));
            }
        }
    }
    if let Some(s) = v.as_str() {
        if let Some(pat) = schema.get("pattern").and_then(Value::as_str) {
            match pattern(pat) {
                Some(re) if !re.is_match(s) => f.errors.push((
                    path.to_string(),
                    format!("Invalid value: \"{s}\": {path} in body should match '{pat}'"),
                )),
                _ => {}
            }
        }
        let n = s.chars().count() as f64;
        if num("minLength").is_some_and(|m| n < m) {
            f.errors.push((
                path.to_string(),
                format!(
                    "Invalid value: \"{s}\": {path} in body should be at least {} chars long",
                    num("minLength").unwrap_or(0.0)
                ),
            ));
        }
        if num("maxLength").is_some_and(|m| n > m) {
            f.errors.push((
                path.to_string(),
                format!(
                    "Too long: {path} in body may not be more than {} chars",
                    num("maxLength").unwrap_or(0.0)
                ),
            ));
        }
    }
    match v {
        Value::Array(items) => {
            let n = items.len() as f64;
            if num("minItems").is_some_and(|m| n < m) {
                f.errors.push((
                    path.to_string(),
                    format!(
                        "Invalid value: {path} in body should have at least {} items",
                        num("minItems").unwrap_or(0.0)
                    ),
                ));
            }
            if num("maxItems").is_some_and(|m| n > m) {
                f.errors.push((
                    path.to_string(),
                    format!(
                        "Too many: {path} in body should have at most {} items",
                        num("maxItems").unwrap_or(0.0)
                    ),
                ));
            }
            if let Some(is) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    if let Some(m) = item.as_object_mut() {
                        apply_defaults(is, m);
                    }
                    check(is, item, &format!("{path}[{i}]"), f);
                }
            }
        }
        Value::Object(m) => {
            apply_defaults(schema, m);
            let props = schema.get("properties").and_then(Value::as_object);
            let addl = schema.get("additionalProperties").filter(|a| a.is_object());
            let preserve = schema.get("x-kubernetes-preserve-unknown-fields")
                == Some(&Value::Bool(true))
                || schema.get("x-kubernetes-embedded-resource") == Some(&Value::Bool(true));
            let keys: Vec<String> = m.keys().cloned().collect();
            for k in keys {
                let child = props.and_then(|p| p.get(&k)).or(addl);
                match child {
                    Some(s) => {
                        if let Some(cv) = m.get_mut(&k) {
                            check(s, cv, &join(path, &k), f);
                        }
                    }
                    None if preserve
                        || (props.is_none()
                            && schema.get("additionalProperties").is_none()
                            && schema.get("type").is_none()) => {}
                    None => {
                        m.remove(&k);
                        f.unknown.push(join(path, &k));
                    }
                }
            }
            check_required(schema, m, path, f);
        }
        _ => {}
    }
}
