//! Owns `certificates.k8s.io/v1` CertificateSigningRequests: the rules the
//! real server applies on each write (the requester recorded in the spec,
//! the spec's validation, the `approval` and `status` subresources'
//! condition and certificate rules), and in `signer` the controllers a
//! real cluster runs beside it (auto-approval of kubelet client requests,
//! the `kubernetes.io/kube-apiserver-client` and
//! `kubernetes.io/kube-apiserver-client-kubelet` signers, which sign with
//! the cluster CA). `der`, `pkcs10` and `issue` read requests and write
//! certificates.
//!
//! Invariants:
//! 1. `spec.username`, `uid`, `groups` and `extra` are the requester's,
//!    whatever the client sent; the spec never changes after create.
//! 2. Through `approval` only `status.conditions` change; `Approved` and
//!    `Denied` exclude each other and, like `Failed`, are never removed
//!    once set. Through `status`, `Approved` and `Denied` are neither added
//!    nor removed, and a certificate once set never changes.
//! 3. Conditions get `lastUpdateTime` (now, when unset) and
//!    `lastTransitionTime` (kept while type and status stay, else now).

pub(crate) mod der;
mod issue;
pub(crate) mod pkcs10;
pub(crate) mod signer;

use serde_json::{Value, json};

use super::auth::User;
use super::lifecycle::Part;
use super::meta;
use super::registry::ResourceInfo;

/// Whether `info` is CertificateSigningRequests.
pub(crate) fn is_csr(info: &ResourceInfo) -> bool {
    info.builtin
        && info.group == "certificates.k8s.io"
        && info.plural == "certificatesigningrequests"
}

/// The usages a request may ask for (`KeyUsage` of the API), sorted as the
/// real server lists them.
const USAGES: &[&str] = &[
    "any",
    "cert sign",
    "client auth",
    "code signing",
    "content commitment",
    "crl sign",
    "data encipherment",
    "decipher only",
    "digital signature",
    "email protection",
    "encipher only",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "key agreement",
    "key encipherment",
    "microsoft sgc",
    "netscape sgc",
    "ocsp signing",
    "s/mime",
    "server auth",
    "signing",
    "timestamping",
];

/// Condition types whose status can only be `True`.
const TRUE_ONLY: &[&str] = &["Approved", "Denied", "Failed"];

/// Records the requester in the spec of a new request (invariant 1).
pub(crate) fn set_requester(obj: &mut Value, user: &User) {
    let spec = &mut obj["spec"];
    if !spec.is_object() {
        *spec = json!({});
    }
    spec["username"] = json!(user.name);
    match user.uid.as_str() {
        "" => {
            if let Some(s) = spec.as_object_mut() {
                s.remove("uid");
            }
        }
        uid => spec["uid"] = json!(uid),
    }
    spec["groups"] = json!(user.groups);
    let mut extra = serde_json::Map::new();
    for (k, v) in &user.extra {
        if let Some(a) = extra
            .entry(k.clone())
            .or_insert_with(|| json!([]))
            .as_array_mut()
        {
            a.push(json!(v));
        }
    }
    if extra.is_empty() {
        if let Some(s) = spec.as_object_mut() {
            s.remove("extra");
        }
    } else {
        spec["extra"] = Value::Object(extra);
    }
}

/// The request bytes of `spec.request` (base64 in JSON), or `None` when
/// absent.
pub(crate) fn request_bytes(obj: &Value) -> Result<Option<Vec<u8>>, String> {
    use base64::Engine as _;
    match obj.pointer("/spec/request") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => base64::engine::general_purpose::STANDARD
            .decode(s)
            .map(Some)
            .map_err(|e| format!("illegal base64 data: {e}")),
        Some(_) => Err("spec.request must be a base64 string".into()),
    }
}

/// Go's `%#v` of a byte slice, as the real server quotes a bad request.
fn go_bytes(b: Option<&[u8]>) -> String {
    match b {
        None => "[]byte(nil)".into(),
        Some(b) => format!(
            "[]byte{{{}}}",
            b.iter()
                .map(|x| format!("{x:#x}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Whether `name` is `<domain>/<path>` with a fully qualified domain.
fn valid_signer_name(name: &str) -> bool {
    let Some((domain, path)) = name.split_once('/') else {
        return false;
    };
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    domain.len() <= 253
        && domain.split('.').count() >= 2
        && domain.split('.').all(label_ok)
        && !path.is_empty()
        && path.len() <= 571
        && !path.contains('/')
        && path
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'))
}

/// The field errors of a new request's spec, in the real server's order.
pub(crate) fn validate_spec(obj: &Value) -> Vec<(String, String)> {
    let mut errors = Vec::new();
    match request_bytes(obj) {
        Err(e) => errors.push(("spec.request".into(), format!("Invalid value: {e}"))),
        Ok(bytes) => {
            let parsed = match &bytes {
                None => Err("PEM block type must be CERTIFICATE REQUEST".to_string()),
                Some(b) => pkcs10::parse(b).map(|_| ()),
            };
            if let Err(e) = parsed {
                errors.push((
                    "spec.request".into(),
                    format!("Invalid value: {}: {e}", go_bytes(bytes.as_deref())),
                ));
            }
        }
    }
    match obj.pointer("/spec/usages").and_then(Value::as_array) {
        Some(u) if !u.is_empty() => {
            let mut seen = Vec::new();
            for (i, v) in u.iter().enumerate() {
                let s = v.as_str().unwrap_or("");
                if !USAGES.contains(&s) {
                    let supported: Vec<String> =
                        USAGES.iter().map(|u| format!("\"{u}\"")).collect();
                    errors.push((
                        format!("spec.usages[{i}]"),
                        format!(
                            "Unsupported value: \"{s}\": supported values: {}",
                            supported.join(", ")
                        ),
                    ));
                } else if seen.contains(&s) {
                    errors.push((
                        format!("spec.usages[{i}]"),
                        format!("Duplicate value: \"{s}\""),
                    ));
                }
                seen.push(s);
            }
        }
        _ => errors.push(("spec.usages".into(), "Required value".into())),
    }
    match obj.pointer("/spec/signerName").and_then(Value::as_str) {
        None | Some("") => errors.push(("spec.signerName".into(), "Required value".into())),
        Some("kubernetes.io/legacy-unknown") => errors.push((
            "spec.signerName".into(),
            "Invalid value: \"kubernetes.io/legacy-unknown\": the legacy signerName is not allowed via this API version".into(),
        )),
        Some(s) if !valid_signer_name(s) => errors.push((
            "spec.signerName".into(),
            format!("Invalid value: \"{s}\": must be a fully qualified domain and path of the form 'example.com/signer-name'"),
        )),
        Some(_) => {}
    }
    if let Some(e) = obj.pointer("/spec/expirationSeconds")
        && !e.is_null()
    {
        match e.as_i64() {
            Some(n) if n >= 600 => {}
            _ => errors.push((
                "spec.expirationSeconds".into(),
                format!("Invalid value: {e}: may not specify a duration less than 600 seconds (10 minutes)"),
            )),
        }
    }
    errors
}

fn conditions(obj: &Value) -> Vec<Value> {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn count(conds: &[Value], type_: &str) -> usize {
    conds.iter().filter(|c| c["type"] == type_).count()
}

/// Builds what a write to `part` stores from the live request `old` and
/// the client's `new` (invariants 1-3); the field errors when refused.
pub(crate) fn prepare_update(
    old: &Value,
    new: &mut Value,
    part: Part,
) -> Result<(), Vec<(String, String)>> {
    match part {
        Part::Main | Part::Ephemeral => {
            // The spec never changes (invariant 1).
            match old.get("spec") {
                Some(s) => new["spec"] = s.clone(),
                None => {
                    if let Some(o) = new.as_object_mut() {
                        o.remove("spec");
                    }
                }
            }
            return Ok(());
        }
        Part::Approval => {
            let conds = new.pointer("/status/conditions").cloned();
            let mut out = old.clone();
            match conds {
                Some(c) if !c.is_null() => out["status"]["conditions"] = c,
                _ => {
                    if let Some(s) = out.get_mut("status").and_then(Value::as_object_mut) {
                        s.remove("conditions");
                    }
                }
            }
            if let Some(rv) = new.pointer("/metadata/resourceVersion") {
                out["metadata"]["resourceVersion"] = rv.clone();
            }
            *new = out;
        }
        Part::Status => {}
    }
    populate_times(old, new);
    let mut errors = check_conditions(new);
    let (before, after) = (conditions(old), conditions(new));
    for t in TRUE_ONLY {
        let (b, a) = (count(&before, t), count(&after, t));
        if a < b {
            errors.push((
                "status.conditions".into(),
                format!("Forbidden: updates may not remove a condition of type \"{t}\""),
            ));
        }
        if part == Part::Status && *t != "Failed" && a > b {
            errors.push((
                "status.conditions".into(),
                format!("Forbidden: updates may not add a condition of type \"{t}\""),
            ));
        }
    }
    let cert = |o: &Value| {
        o.pointer("/status/certificate")
            .and_then(Value::as_str)
            .filter(|c| !c.is_empty())
            .map(str::to_string)
    };
    if let Some(c) = cert(new)
        && cert(old).as_ref() != Some(&c)
    {
        if !certificate_pem_ok(&c) {
            errors.push((
                "status.certificate".into(),
                "Invalid value: \"<certificate data>\": must contain at least one CERTIFICATE PEM block".into(),
            ));
        }
        if cert(old).is_some() {
            errors.push((
                "status.certificate".into(),
                "Forbidden: updates may not modify existing certificate content".into(),
            ));
        }
    } else if cert(new).is_none() && cert(old).is_some() {
        errors.push((
            "status.certificate".into(),
            "Forbidden: updates may not modify existing certificate content".into(),
        ));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// Whether `b64` (the JSON form of `status.certificate`) holds PEM
/// certificates only, at least one.
fn certificate_pem_ok(b64: &str) -> bool {
    use base64::Engine as _;
    let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(b64) else {
        return false;
    };
    let Ok(text) = String::from_utf8(bytes) else {
        return false;
    };
    let mut blocks = 0;
    let mut rest = text.as_str();
    while let Some(start) = rest.find("-----BEGIN ") {
        let after = &rest[start + 11..];
        let Some(end) = after.find("-----") else {
            return false;
        };
        if &after[..end] != "CERTIFICATE" {
            return false;
        }
        let Some(close) = after.find("-----END CERTIFICATE-----") else {
            return false;
        };
        blocks += 1;
        rest = &after[close + 25..];
    }
    blocks > 0
}

/// The field errors of a request's conditions (types, statuses,
/// duplicates, Approved with Denied).
fn check_conditions(obj: &Value) -> Vec<(String, String)> {
    let mut errors = Vec::new();
    let mut seen: Vec<String> = Vec::new();
    let (mut approved, mut denied) = (false, false);
    for (i, c) in conditions(obj).iter().enumerate() {
        let at = format!("status.conditions[{i}]");
        let t = c.get("type").and_then(Value::as_str).unwrap_or("");
        if t.is_empty() {
            errors.push((format!("{at}.type"), "Required value".into()));
        }
        let s = c.get("status").and_then(Value::as_str).unwrap_or("");
        let allowed: &[&str] = if TRUE_ONLY.contains(&t) {
            &["True"]
        } else {
            &["False", "True", "Unknown"]
        };
        if s.is_empty() {
            errors.push((format!("{at}.status"), "Required value".into()));
        } else if !allowed.contains(&s) {
            errors.push((
                format!("{at}.status"),
                format!(
                    "Unsupported value: \"{s}\": supported values: {}",
                    allowed
                        .iter()
                        .map(|a| format!("\"{a}\""))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        if seen.iter().any(|x| x == t) {
            errors.push((format!("{at}.type"), format!("Duplicate value: \"{t}\"")));
        }
        seen.push(t.to_string());
        match t {
            "Approved" => {
                approved = true;
                if denied {
                    errors.push((format!("{at}.type"), "Invalid value: \"Approved\": Approved and Denied conditions are mutually exclusive".into()));
                }
            }
            "Denied" => {
                denied = true;
                if approved {
                    errors.push((format!("{at}.type"), "Invalid value: \"Denied\": Approved and Denied conditions are mutually exclusive".into()));
                }
            }
            _ => {}
        }
    }
    errors
}

/// Condition times (invariant 3).
fn populate_times(old: &Value, new: &mut Value) {
    let before = conditions(old);
    let now = meta::now();
    let Some(conds) = new
        .pointer_mut("/status/conditions")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    for c in conds {
        let Some(m) = c.as_object_mut() else { continue };
        if m.get("lastUpdateTime")
            .is_none_or(|v| v.is_null() || v == "")
        {
            m.insert("lastUpdateTime".into(), json!(now));
        }
        if m.get("lastTransitionTime")
            .is_none_or(|v| v.is_null() || v == "")
        {
            let kept = before
                .iter()
                .find(|o| o["type"] == m["type"] && o["status"] == m["status"])
                .and_then(|o| {
                    o.get("lastTransitionTime")
                        .filter(|v| v.is_string())
                        .cloned()
                });
            m.insert(
                "lastTransitionTime".into(),
                kept.unwrap_or_else(|| json!(now)),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> String {
        use base64::Engine as _;
        let key = rcgen::KeyPair::generate().expect("key");
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "alice");
        let pem = p.serialize_request(&key).expect("csr").pem().expect("pem");
        base64::engine::general_purpose::STANDARD.encode(pem)
    }

    #[test]
    fn the_spec_is_validated_as_the_real_server() {
        let errors = validate_spec(&json!({"spec": {}}));
        let fields: Vec<&str> = errors.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(fields, ["spec.request", "spec.usages", "spec.signerName"]);
        assert_eq!(
            errors[0].1,
            "Invalid value: []byte(nil): PEM block type must be CERTIFICATE REQUEST"
        );
        let errors = validate_spec(
            &json!({"spec": {"request": "aGVsbG8=", "signerName": "nope", "usages": ["client auth", "frob", "client auth"], "expirationSeconds": 100}}),
        );
        assert_eq!(
            errors[0].1,
            "Invalid value: []byte{0x68, 0x65, 0x6c, 0x6c, 0x6f}: PEM block type must be CERTIFICATE REQUEST"
        );
        assert!(
            errors[1].1.starts_with(
                "Unsupported value: \"frob\": supported values: \"any\", \"cert sign\""
            )
        );
        assert_eq!(
            errors[2],
            (
                "spec.usages[2]".into(),
                "Duplicate value: \"client auth\"".into()
            )
        );
        assert_eq!(
            errors[3].1,
            "Invalid value: \"nope\": must be a fully qualified domain and path of the form 'example.com/signer-name'"
        );
        assert_eq!(
            errors[4].1,
            "Invalid value: 100: may not specify a duration less than 600 seconds (10 minutes)"
        );
        let ok = json!({"spec": {"request": request(), "signerName": "kubernetes.io/kube-apiserver-client", "usages": ["client auth"]}});
        assert!(validate_spec(&ok).is_empty(), "{:?}", validate_spec(&ok));
    }

    /// Invariants 2 and 3.
    #[test]
    fn approval_and_status_keep_their_rules() {
        let old =
            json!({"metadata": {"name": "c"}, "spec": {"signerName": "a.io/b"}, "status": {}});
        let approve = json!({"spec": {"signerName": "changed.io/x"}, "status": {"conditions": [{"type": "Approved", "status": "True", "reason": "KubectlApprove"}]}});
        let mut new = approve.clone();
        prepare_update(&old, &mut new, Part::Approval).expect("approved");
        assert_eq!(new["spec"]["signerName"], "a.io/b");
        let c = &new["status"]["conditions"][0];
        assert!(c["lastUpdateTime"].is_string() && c["lastTransitionTime"].is_string());
        let approved = new.clone();
        let mut deny = approved.clone();
        deny["status"]["conditions"]
            .as_array_mut()
            .expect("conds")
            .push(json!({"type": "Denied", "status": "True"}));
        let errors = prepare_update(&approved, &mut deny, Part::Approval).unwrap_err();
        assert_eq!(
            errors[0],
            (
                "status.conditions[1].type".into(),
                "Invalid value: \"Denied\": Approved and Denied conditions are mutually exclusive"
                    .into()
            )
        );
        let mut removed = approved.clone();
        removed["status"]["conditions"] = json!([]);
        let errors = prepare_update(&approved, &mut removed, Part::Approval).unwrap_err();
        assert_eq!(
            errors[0].1,
            "Forbidden: updates may not remove a condition of type \"Approved\""
        );
        let mut false_ = approved.clone();
        false_["status"]["conditions"][0]["status"] = json!("False");
        let errors = prepare_update(&approved, &mut false_, Part::Approval).unwrap_err();
        assert_eq!(
            errors[0].1,
            "Unsupported value: \"False\": supported values: \"True\""
        );
        let mut by_status = old.clone();
        by_status["status"] = approve["status"].clone();
        let errors = prepare_update(&old, &mut by_status, Part::Status).unwrap_err();
        assert_eq!(
            errors[0].1,
            "Forbidden: updates may not add a condition of type \"Approved\""
        );
        let mut junk = approved.clone();
        junk["status"]["certificate"] = json!("Zm9v");
        let errors = prepare_update(&approved, &mut junk, Part::Status).unwrap_err();
        assert_eq!(errors[0].0, "status.certificate");
    }
}
