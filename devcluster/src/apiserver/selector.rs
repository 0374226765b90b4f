//! Owns label and field selectors as clients send them in `labelSelector`
//! and `fieldSelector` (`a=b,c!=d,e in (f,g),!h`).

use serde_json::Value;

use super::status::ApiError;

#[derive(Debug, Clone)]
enum Req {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector.
#[derive(Debug, Clone, Default)]
pub(crate) struct LabelSelector(Vec<Req>);

/// A parsed field selector.
#[derive(Debug, Clone, Default)]
pub(crate) struct FieldSelector(Vec<Req>);

/// Splits on commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out.into_iter()
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect()
}

fn set_values(rest: &str, whole: &str) -> Result<Vec<String>, ApiError> {
    let inner = rest
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "unable to parse requirement {whole:?}: expected a set like (a,b)"
            ))
        })?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

impl LabelSelector {
    /// Parses `labelSelector`.
    pub(crate) fn parse(s: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let req = if let Some(k) = part.strip_prefix('!') {
                Req::NotExists(k.trim().to_string())
            } else if let Some((k, v)) = part.split_once("!=") {
                Req::Ne(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once("==") {
                Req::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once('=') {
                Req::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, rest)) = part.split_once(" notin ") {
                Req::NotIn(k.trim().into(), set_values(rest, part)?)
            } else if let Some((k, rest)) = part.split_once(" in ") {
                Req::In(k.trim().into(), set_values(rest, part)?)
            } else if part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
            {
                Req::Exists(part.to_string())
            } else {
                return Err(ApiError::bad_request(format!(
                    "unable to parse labelSelector requirement {part:?}: use key=value, key!=value, key in (a,b), key notin (a,b), key or !key"
                )));
            };
            reqs.push(req);
        }
        Ok(Self(reqs))
    }

    /// Whether the object's labels satisfy every requirement.
    pub(crate) fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| eval(r, get))
    }
}

fn eval<'a>(r: &Req, get: impl Fn(&str) -> Option<&'a str>) -> bool {
    match r {
        Req::Eq(k, v) => get(k) == Some(v.as_str()),
        Req::Ne(k, v) => get(k) != Some(v.as_str()),
        Req::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
        Req::NotIn(k, vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
        Req::Exists(k) => get(k).is_some(),
        Req::NotExists(k) => get(k).is_none(),
    }
}

impl FieldSelector {
    /// Parses `fieldSelector`: `path=value`, `path==value`, `path!=value`.
    pub(crate) fn parse(s: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let req = if let Some((k, v)) = part.split_once("!=") {
                Req::Ne(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once("==") {
                Req::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once('=') {
                Req::Eq(k.trim().into(), v.trim().into())
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid fieldSelector requirement {part:?}: use field=value or field!=value, e.g. metadata.name=foo"
                )));
            };
            reqs.push(req);
        }
        Ok(Self(reqs))
    }

    /// Whether the object's fields satisfy every requirement. A missing
    /// field compares as the empty string (as the real server does).
    pub(crate) fn matches(&self, obj: &Value) -> bool {
        let owned: Vec<(String, String)> = self
            .0
            .iter()
            .map(|r| {
                let k = match r {
                    Req::Eq(k, _)
                    | Req::Ne(k, _)
                    | Req::In(k, _)
                    | Req::NotIn(k, _)
                    | Req::Exists(k)
                    | Req::NotExists(k) => k,
                };
                (k.clone(), field_value(obj, k))
            })
            .collect();
        let get = |k: &str| owned.iter().find(|(f, _)| f == k).map(|(_, v)| v.as_str());
        self.0.iter().all(|r| eval(r, get))
    }
}

/// The string value of a dotted field path (`spec.nodeName`).
fn field_value(obj: &Value, path: &str) -> String {
    let mut cur = obj;
    for seg in path.split('.') {
        match cur.get(seg) {
            Some(v) => cur = v,
            None => return String::new(),
        }
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selector_forms() {
        let o = json!({"metadata": {"labels": {"app": "web", "tier": "front"}}});
        let m = |s: &str| LabelSelector::parse(s).expect("parses").matches(&o);
        assert!(m("app=web") && m("app==web") && m("app!=db") && m("tier in (front,back)"));
        assert!(m("env notin (prod)") && m("app") && m("!env") && m("app=web,tier=front") && m(""));
        assert!(!m("app=db") && !m("tier notin (front)") && !m("!app") && !m("env"));
        assert!(LabelSelector::parse("a in b").is_err());
        assert!(LabelSelector::parse("a @ b").is_err());
    }

    #[test]
    fn field_selector_paths() {
        let o = json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}});
        let m = |s: &str| FieldSelector::parse(s).expect("parses").matches(&o);
        assert!(
            m("metadata.name=p")
                && m("spec.nodeName=n1,status.phase!=Failed")
                && m("spec.missing=")
        );
        assert!(!m("spec.nodeName=n2") && !m("metadata.namespace!=ns"));
        assert!(FieldSelector::parse("nope").is_err());
    }
}
