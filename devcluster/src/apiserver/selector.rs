//! Owns label and field selectors as clients send them in `labelSelector`
//! and `fieldSelector` (`a=b,c!=d,e in (f,g),!h,i>3`), parsed and
//! validated as kube-apiserver does.
//!
//! Invariants:
//! 1. A label selector that Kubernetes' parser refuses (bad syntax, a key
//!    that is not a qualified name, a value that is not a label value) is
//!    400 BadRequest with the same kind of message.
//! 2. A field selector may name only the fields the resource supports
//!    (`metadata.name`, `metadata.namespace` and the kind's own, as
//!    `selectable` lists them); others are 400 with Kubernetes' message.
//! 3. A field compares as the server's field set renders it: a missing
//!    string is `""`, a missing boolean `false`, a missing count `0`.

use serde_json::Value;

use super::registry::ResourceInfo;
use super::status::ApiError;

#[derive(Debug, Clone)]
enum Req {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
    Gt(String, i64),
    Lt(String, i64),
}

/// A parsed label selector.
#[derive(Debug, Clone, Default)]
pub(crate) struct LabelSelector(Vec<Req>);

/// How a selectable field is rendered from the object.
#[derive(Debug, Clone, Copy)]
enum Render {
    /// A string at a dotted path; missing is `""`.
    Str,
    /// A boolean at a dotted path; missing is `false`.
    Bool,
    /// An integer at a dotted path; missing is `0`.
    Int,
}

/// One selectable field: its label, the path it reads and how.
#[derive(Debug, Clone)]
struct Field {
    label: String,
    path: String,
    render: Render,
}

/// A parsed field selector.
#[derive(Debug, Clone, Default)]
pub(crate) struct FieldSelector(Vec<(Req, Option<Field>)>);

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
    out.into_iter().map(str::trim).collect()
}

/// The tokens of Kubernetes' label selector lexer.
#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Not,
    Eq,
    DoubleEq,
    NotEq,
    Gt,
    Lt,
    Open,
    Close,
    Comma,
    In,
    NotIn,
}

fn lex(s: &str) -> Vec<Tok> {
    let special = |c: char| "!=(),<>".contains(c);
    let mut out = Vec::new();
    let mut it = s.chars().peekable();
    while let Some(&c) = it.peek() {
        if c.is_whitespace() {
            it.next();
            continue;
        }
        if special(c) {
            it.next();
            let next = it.peek().copied();
            let t = match (c, next) {
                ('!', Some('=')) => {
                    it.next();
                    Tok::NotEq
                }
                ('=', Some('=')) => {
                    it.next();
                    Tok::DoubleEq
                }
                ('!', _) => Tok::Not,
                ('=', _) => Tok::Eq,
                ('(', _) => Tok::Open,
                (')', _) => Tok::Close,
                (',', _) => Tok::Comma,
                ('>', _) => Tok::Gt,
                _ => Tok::Lt,
            };
            out.push(t);
            continue;
        }
        let mut word = String::new();
        while let Some(&c) = it.peek() {
            if c.is_whitespace() || special(c) {
                break;
            }
            word.push(c);
            it.next();
        }
        out.push(match word.as_str() {
            "in" => Tok::In,
            "notin" => Tok::NotIn,
            _ => Tok::Ident(word),
        });
    }
    out
}

const NAME_FMT: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";

fn is_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b.first()
                    .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
                && b.last()
                    .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

/// Kubernetes' `IsQualifiedName` for a label key; the error text if not.
fn check_key(k: &str) -> Result<(), String> {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    if name.is_empty() {
        return Err("name part must be non-empty".into());
    }
    if name.len() > 63 {
        return Err("name part must be no more than 63 characters".into());
    }
    if !is_name_part(name) {
        return Err(NAME_FMT.into());
    }
    if let Some(p) = prefix {
        if p.is_empty() {
            return Err("prefix part must be non-empty".into());
        }
        if !is_dns_subdomain(p) {
            return Err("prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')".into());
        }
    }
    Ok(())
}

/// Kubernetes' `IsValidLabelValue`; the error text if not.
fn check_value(v: &str) -> Result<(), String> {
    if v.len() > 63 {
        return Err("must be no more than 63 characters".into());
    }
    if !v.is_empty() && !is_name_part(v) {
        return Err("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')".into());
    }
    Ok(())
}

fn parse_err(msg: impl std::fmt::Display) -> ApiError {
    ApiError::bad_request(format!("unable to parse requirement: {msg}"))
}

fn key_err(k: &str, why: &str) -> ApiError {
    parse_err(format!("<nil>: Invalid value: {k:?}: {why}"))
}

fn value_err(k: &str, i: usize, v: &str, why: &str) -> ApiError {
    parse_err(format!("values[{i}][{k}]: Invalid value: {v:?}: {why}"))
}

/// Parses one requirement from its tokens.
fn requirement(toks: &[Tok], whole: &str) -> Result<Req, ApiError> {
    let syntax = |what: &str| {
        ApiError::bad_request(format!(
            "couldn't parse the selector string {whole:?}: {what}"
        ))
    };
    let ident = |t: Option<&Tok>| match t {
        Some(Tok::Ident(s)) => Some(s.clone()),
        _ => None,
    };
    let checked = |k: String| {
        check_key(&k)
            .map(|_| k.clone())
            .map_err(|e| key_err(&k, &e))
    };
    match toks {
        [Tok::Not, rest @ ..] => {
            let k = ident(rest.first()).ok_or_else(|| syntax("found '!', expected: identifier"))?;
            if rest.len() > 1 {
                return Err(syntax(
                    "found extra tokens after '!key', expected: ',' or end of string",
                ));
            }
            Ok(Req::NotExists(checked(k)?))
        }
        [Tok::Ident(k)] => Ok(Req::Exists(checked(k.clone())?)),
        [Tok::Ident(k), op, rest @ ..] => {
            let k = checked(k.clone())?;
            match op {
                Tok::Eq | Tok::DoubleEq | Tok::NotEq => {
                    let v = match rest {
                        [] => String::new(),
                        [Tok::Ident(v)] => v.clone(),
                        [Tok::In | Tok::NotIn] => {
                            if let [Tok::In] = rest {
                                "in".into()
                            } else {
                                "notin".into()
                            }
                        }
                        _ => {
                            return Err(syntax(
                                "found more than one value, expected: a single value after '=', '==' or '!='",
                            ));
                        }
                    };
                    check_value(&v).map_err(|e| value_err(&k, 0, &v, &e))?;
                    Ok(if *op == Tok::NotEq {
                        Req::Ne(k, v)
                    } else {
                        Req::Eq(k, v)
                    })
                }
                Tok::Gt | Tok::Lt => {
                    let v = ident(rest.first())
                        .filter(|_| rest.len() == 1)
                        .ok_or_else(|| {
                            syntax("expected: a single integer value after '>' or '<'")
                        })?;
                    let n = v.parse::<i64>().map_err(|_| {
                        value_err(
                            &k,
                            0,
                            &v,
                            "for 'Gt', 'Lt' operators, the value must be an integer",
                        )
                    })?;
                    Ok(if *op == Tok::Gt {
                        Req::Gt(k, n)
                    } else {
                        Req::Lt(k, n)
                    })
                }
                Tok::In | Tok::NotIn => {
                    let [Tok::Open, inner @ .., Tok::Close] = rest else {
                        return Err(syntax(
                            "found no '(' ... ')', expected: a set of values like (a,b)",
                        ));
                    };
                    let mut vs = Vec::new();
                    let mut expect_value = true;
                    for t in inner {
                        match (t, expect_value) {
                            (Tok::Ident(v), true) => {
                                vs.push(v.clone());
                                expect_value = false;
                            }
                            (Tok::Comma, true) => vs.push(String::new()),
                            (Tok::Comma, false) => expect_value = true,
                            _ => {
                                return Err(syntax(
                                    "found an unexpected token in the value set, expected: ',' or ')'",
                                ));
                            }
                        }
                    }
                    if expect_value && !inner.is_empty() {
                        vs.push(String::new());
                    }
                    if vs.is_empty() {
                        return Err(parse_err(
                            "values: Invalid value: []: for 'in', 'notin' operators, values set can't be empty",
                        ));
                    }
                    for (i, v) in vs.iter().enumerate() {
                        check_value(v).map_err(|e| value_err(&k, i, v, &e))?;
                    }
                    Ok(if *op == Tok::In {
                        Req::In(k, vs)
                    } else {
                        Req::NotIn(k, vs)
                    })
                }
                _ => Err(syntax(
                    "expected: one of ['=' '==' '!=' 'in' 'notin' '>' '<'] after a key",
                )),
            }
        }
        [] => Err(syntax(
            "found ',', expected: !, identifier, or 'end of string'",
        )),
        _ => Err(syntax("expected: a key, '!key' or 'key <operator> value'")),
    }
}

impl LabelSelector {
    /// Parses `labelSelector` (invariant 1).
    pub(crate) fn parse(s: &str) -> Result<Self, ApiError> {
        if s.trim().is_empty() {
            return Ok(Self::default());
        }
        let mut reqs = Vec::new();
        for part in split_top(s) {
            reqs.push(requirement(&lex(part), s)?);
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
        Req::Gt(k, n) => get(k)
            .and_then(|x| x.parse::<i64>().ok())
            .is_some_and(|x| x > *n),
        Req::Lt(k, n) => get(k)
            .and_then(|x| x.parse::<i64>().ok())
            .is_some_and(|x| x < *n),
    }
}

/// The fields a built-in resource supports beyond `metadata.name` and
/// `metadata.namespace`, as kube-apiserver registers them; `None` for
/// resources with only the default two (whose error message differs).
fn builtin_fields(
    group: &str,
    plural: &str,
) -> Option<&'static [(&'static str, &'static str, Render)]> {
    use Render::{Bool, Int, Str};
    Some(match (group, plural) {
        ("", "pods") => &[
            ("spec.nodeName", "spec.nodeName", Str),
            ("spec.restartPolicy", "spec.restartPolicy", Str),
            ("spec.schedulerName", "spec.schedulerName", Str),
            ("spec.serviceAccountName", "spec.serviceAccountName", Str),
            ("spec.hostNetwork", "spec.hostNetwork", Bool),
            ("status.phase", "status.phase", Str),
            ("status.podIP", "status.podIP", Str),
            ("status.nominatedNodeName", "status.nominatedNodeName", Str),
        ],
        ("", "nodes") => &[("spec.unschedulable", "spec.unschedulable", Bool)],
        ("", "namespaces") => &[("status.phase", "status.phase", Str)],
        ("", "secrets") => &[("type", "type", Str)],
        ("", "services") => &[
            ("spec.clusterIP", "spec.clusterIP", Str),
            ("spec.type", "spec.type", Str),
        ],
        ("", "events") | ("events.k8s.io", "events") => &[
            ("involvedObject.kind", "involvedObject.kind", Str),
            ("involvedObject.namespace", "involvedObject.namespace", Str),
            ("involvedObject.name", "involvedObject.name", Str),
            ("involvedObject.uid", "involvedObject.uid", Str),
            (
                "involvedObject.apiVersion",
                "involvedObject.apiVersion",
                Str,
            ),
            (
                "involvedObject.resourceVersion",
                "involvedObject.resourceVersion",
                Str,
            ),
            ("involvedObject.fieldPath", "involvedObject.fieldPath", Str),
            ("reason", "reason", Str),
            ("reportingComponent", "reportingComponent", Str),
            ("source", "source.component", Str),
            ("type", "type", Str),
        ],
        ("", "replicationcontrollers") | ("apps", "replicasets") => {
            &[("status.replicas", "status.replicas", Int)]
        }
        ("batch", "jobs") => &[("status.successful", "status.succeeded", Int)],
        ("apps", "statefulsets") => &[("status.successful", "status.successful", Int)],
        _ => return None,
    })
}

fn field_for(info: &ResourceInfo, label: &str) -> Result<Field, ApiError> {
    let plain = |path: &str, render| Field {
        label: label.to_string(),
        path: path.to_string(),
        render,
    };
    if label == "metadata.name" || (label == "metadata.namespace") {
        return Ok(plain(label, Render::Str));
    }
    if !info.builtin {
        return info
            .selectable_fields
            .iter()
            .find(|f| f.as_str() == label)
            .map(|f| plain(f, Render::Str))
            .ok_or_else(|| ApiError::bad_request(format!("field label not supported: {label}")));
    }
    match builtin_fields(&info.group, &info.plural) {
        Some(fields) => fields
            .iter()
            .find(|(l, _, _)| *l == label)
            .map(|(_, p, r)| plain(p, *r))
            .ok_or_else(|| ApiError::bad_request(format!("field label not supported: {label}"))),
        None => Err(ApiError::bad_request(format!(
            "{label:?} is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
        ))),
    }
}

impl FieldSelector {
    /// Parses `fieldSelector`: `path=value`, `path==value`, `path!=value`,
    /// checking each field against what `info` supports (invariant 2);
    /// without `info`, every field is taken as a string path.
    pub(crate) fn parse(s: &str, info: Option<&ResourceInfo>) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for part in split_top(s).into_iter().filter(|p| !p.is_empty()) {
            let req = if let Some((k, v)) = part.split_once("!=") {
                Req::Ne(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once("==") {
                Req::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once('=') {
                Req::Eq(k.trim().into(), v.trim().into())
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{s}'; can't understand '{part}'"
                )));
            };
            let (Req::Eq(k, _) | Req::Ne(k, _)) = &req else {
                unreachable!("only = and != are built above")
            };
            let field = match info {
                Some(info) => Some(field_for(info, k)?),
                None => None,
            };
            reqs.push((req, field));
        }
        Ok(Self(reqs))
    }

    /// Whether the object's fields satisfy every requirement (invariant 3).
    pub(crate) fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(r, f)| {
            let (Req::Eq(k, _) | Req::Ne(k, _)) = r else {
                return true;
            };
            let (path, render) = f
                .as_ref()
                .map(|f| (f.path.as_str(), f.render))
                .unwrap_or((k.as_str(), Render::Str));
            let v = field_value(obj, path, render);
            debug_assert!(f.as_ref().is_none_or(|f| f.label == *k));
            eval(r, |_| Some(v.as_str()))
        })
    }
}

/// The string value of a dotted field path (`spec.nodeName`).
fn field_value(obj: &Value, path: &str, render: Render) -> String {
    let mut cur = Some(obj);
    for seg in path.split('.') {
        cur = cur.and_then(|c| c.get(seg));
    }
    match (cur, render) {
        (Some(Value::String(s)), _) => s.clone(),
        (None | Some(Value::Null), Render::Str) => String::new(),
        (None | Some(Value::Null), Render::Bool) => "false".into(),
        (None | Some(Value::Null), Render::Int) => "0".into(),
        (Some(other), _) => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selector_forms() {
        let o = json!({"metadata": {"labels": {"app": "web", "tier": "front", "n": "5"}}});
        let m = |s: &str| LabelSelector::parse(s).expect("parses").matches(&o);
        assert!(m("app=web") && m("app==web") && m("app!=db") && m("tier in (front,back)"));
        assert!(m("env notin (prod)") && m("app") && m("!env") && m("app=web,tier=front") && m(""));
        assert!(m("n>3") && m("n<6") && !m("n>5") && m("example.com/x!=y"));
        assert!(!m("app=db") && !m("tier notin (front)") && !m("!app") && !m("env"));
        for bad in [
            "a in b",
            "a @ b",
            "app=web=x",
            "a b=c",
            "-bad=x",
            "app=-x",
            "a in ()",
            "a>x",
            "Example.com/x=y",
            "a,,b",
            "app=va lue",
        ] {
            let e = LabelSelector::parse(bad).expect_err(bad);
            assert_eq!((e.code, e.reason), (400, "BadRequest"), "{bad}");
        }
    }

    #[test]
    fn field_selector_paths() {
        let o = json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}});
        let m = |s: &str| FieldSelector::parse(s, None).expect("parses").matches(&o);
        assert!(
            m("metadata.name=p")
                && m("spec.nodeName=n1,status.phase!=Failed")
                && m("spec.missing=")
        );
        assert!(!m("spec.nodeName=n2") && !m("metadata.namespace!=ns"));
        assert!(FieldSelector::parse("nope", None).is_err());
    }
}
