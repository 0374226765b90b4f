//! Label selectors in a spec (`metav1.LabelSelector`), checked as the API
//! server checks them (`ValidateLabelSelector`): the schema says only that
//! they are maps and lists of strings, so a key or operator Kubernetes would
//! refuse is caught here, with the field named.
//!
//! Invariants:
//! 1. A selector accepted here is one a real API server accepts inside a
//!    NetworkPolicy's `podSelector`: qualified-name keys, label values,
//!    `In`/`NotIn` with values, `Exists`/`DoesNotExist` without.
//! 2. The empty selector (`{}`) is valid and selects every pod, as in
//!    Kubernetes.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::field::FieldError;

/// The longest DNS subdomain (a qualified name's prefix).
const MAX_PREFIX: usize = 253;
/// The longest name part of a qualified name, and the longest label value.
const MAX_NAME: usize = 63;

/// Whether `s` is a label name part or a non-empty label value: at most 63
/// characters, alphanumerics with `-`, `_` and `.` inside.
fn is_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_NAME
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Whether `s` is a DNS subdomain (RFC 1123): dot-separated labels of lower
/// case alphanumerics and `-`, at most 253 characters.
fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_PREFIX
        && s.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b.len() <= MAX_NAME
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

/// Why `key` is not a label key (`[prefix/]name`), or `None`.
pub fn label_key_problem(key: &str) -> Option<String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix
        && !is_dns_subdomain(p)
    {
        return Some(format!(
            "{key:?} has the prefix {p:?}, which is not a DNS subdomain (lower-case letters, digits, '-' and '.', at most 253 characters)"
        ));
    }
    if !is_name_part(name) {
        return Some(format!(
            "{key:?} is not a label key: its name part must be 1 to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit (e.g. \"app.kubernetes.io/name\")"
        ));
    }
    None
}

/// Why `value` is not a label value, or `None` (the empty value is one).
pub fn label_value_problem(value: &str) -> Option<String> {
    (!value.is_empty() && !is_name_part(value)).then(|| {
        format!(
            "{value:?} is not a label value: at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
        )
    })
}

/// Checks the selector at `path` (e.g. `spec.monarch.clientSelector`)
/// (invariant 1); each error names the entry and the fix.
pub fn check(path: &str, sel: &LabelSelector) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for (k, v) in sel.match_labels.iter().flatten() {
        if let Some(p) = label_key_problem(k) {
            errs.push(FieldError::new(format!("{path}.matchLabels"), p));
        }
        if let Some(p) = label_value_problem(v) {
            errs.push(FieldError::new(format!("{path}.matchLabels[{k:?}]"), p));
        }
    }
    for (i, e) in sel.match_expressions.iter().flatten().enumerate() {
        let at = format!("{path}.matchExpressions[{i}]");
        if let Some(p) = label_key_problem(&e.key) {
            errs.push(FieldError::new(format!("{at}.key"), p));
        }
        let values = e.values.as_deref().unwrap_or_default();
        match e.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => errs.push(FieldError::new(
                format!("{at}.values"),
                format!("is empty; operator {} needs at least one value", e.operator),
            )),
            "Exists" | "DoesNotExist" if !values.is_empty() => errs.push(FieldError::new(
                format!("{at}.values"),
                format!("must be empty with operator {}; remove them", e.operator),
            )),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => errs.push(FieldError::new(
                format!("{at}.operator"),
                format!("{other:?} is not an operator; use In, NotIn, Exists or DoesNotExist"),
            )),
        }
        for (j, v) in values.iter().enumerate() {
            if let Some(p) = label_value_problem(v) {
                errs.push(FieldError::new(format!("{at}.values[{j}]"), p));
            }
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
    use std::collections::BTreeMap;

    fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
        }
    }

    #[test]
    fn valid_selectors_pass_and_the_empty_one_too() {
        assert!(check("s", &LabelSelector::default()).is_empty());
        let sel = LabelSelector {
            match_labels: Some(BTreeMap::from([
                ("app.kubernetes.io/name".into(), "monarch-client".into()),
                ("tier".into(), "".into()),
            ])),
            match_expressions: Some(vec![
                expr("role", "In", &["client", "notebook"]),
                expr("example.com/debug", "DoesNotExist", &[]),
            ]),
        };
        assert!(check("s", &sel).is_empty(), "{:?}", check("s", &sel));
    }

    #[test]
    fn bad_keys_values_and_operators_name_the_entry() {
        let sel = LabelSelector {
            match_labels: Some(BTreeMap::from([
                ("Bad_Prefix.com/app".into(), "x".into()),
                ("app".into(), "-no".into()),
            ])),
            match_expressions: Some(vec![
                expr("role", "Equals", &["x"]),
                expr("role", "In", &[]),
                expr("role", "Exists", &["x"]),
                expr("", "Exists", &[]),
            ]),
        };
        let errs = check("spec.monarch.clientSelector", &sel);
        let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.monarch.clientSelector.matchLabels",
                "spec.monarch.clientSelector.matchLabels[\"app\"]",
                "spec.monarch.clientSelector.matchExpressions[0].operator",
                "spec.monarch.clientSelector.matchExpressions[1].values",
                "spec.monarch.clientSelector.matchExpressions[2].values",
                "spec.monarch.clientSelector.matchExpressions[3].key",
            ]
        );
        assert!(
            errs[0].message.contains("DNS subdomain"),
            "{}",
            errs[0].message
        );
        assert!(errs[2].message.contains("In, NotIn"), "{}", errs[2].message);
    }

    #[test]
    fn label_rules_match_kubernetes() {
        assert_eq!(label_key_problem("a"), None);
        assert_eq!(label_key_problem("a.b/c-d_e.f"), None);
        assert!(label_key_problem(&"a".repeat(64)).is_some());
        assert_eq!(label_key_problem(&"a".repeat(63)), None);
        assert!(label_key_problem("a/").is_some());
        assert!(label_key_problem("/a").is_some());
        assert!(label_key_problem("a/b/c").is_some());
        assert_eq!(label_value_problem(""), None);
        assert!(label_value_problem("a b").is_some());
        assert!(label_value_problem("x.").is_some());
    }
}
