//! Owns API errors: every failure a client sees is a `metav1.Status` with an
//! HTTP code, a machine-readable reason and a message naming the field and
//! the fix.

use serde_json::{Value, json};

/// A failed request, rendered as a `Status` object.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub(crate) code: u16,
    pub(crate) reason: &'static str,
    pub(crate) message: String,
    pub(crate) details: Option<Value>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    /// 400: the request itself is malformed.
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 401: no or a wrong bearer token.
    pub(crate) fn unauthorized() -> Self {
        Self::new(
            401,
            "Unauthorized",
            "Unauthorized: send the token from the kubeconfig as `Authorization: Bearer <token>`",
        )
    }

    /// 404 for a named object.
    pub(crate) fn not_found(group: &str, plural: &str, name: &str) -> Self {
        let mut e = Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", qualified(group, plural)),
        );
        e.details = Some(details(name, group, plural));
        e
    }

    /// 404 for a path that serves nothing: the real server's message and
    /// an empty `details` (kubectl tells this 404 from a missing object by
    /// `details.name` being empty; without `details` it panics).
    pub(crate) fn no_route(path: &str) -> Self {
        tracing::debug!(%path, "no route");
        let mut e = Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        );
        e.details = Some(json!({}));
        e
    }

    /// 405: the verb is not supported here (the real server's message and
    /// an empty `details`).
    pub(crate) fn method_not_allowed() -> Self {
        let mut e = Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        );
        e.details = Some(json!({}));
        e
    }

    /// 409: the object already exists.
    pub(crate) fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        let mut e = Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(group, plural)),
        );
        e.details = Some(details(name, group, plural));
        e
    }

    /// 409: an apply conflict or another conflict that names no object.
    pub(crate) fn conflict(message: impl Into<String>) -> Self {
        Self::new(409, "Conflict", message)
    }

    /// 409 about one object (a stale resourceVersion, a failed
    /// precondition): `details` names it as the real server's do.
    pub(crate) fn conflict_on(
        group: &str,
        plural: &str,
        name: &str,
        message: impl Into<String>,
    ) -> Self {
        let mut e = Self::new(409, "Conflict", message);
        e.details = Some(details(name, group, plural));
        e
    }

    /// 410: the watch resourceVersion is older than the kept history.
    pub(crate) fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 403: the request is understood but refused.
    pub(crate) fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    /// 403 about one object: `<plural> "<name>" is forbidden: <why>`,
    /// `details` naming it.
    pub(crate) fn forbidden_on(group: &str, plural: &str, name: &str, why: &str) -> Self {
        let mut e = Self::forbidden(format!(
            "{} \"{name}\" is forbidden: {why}",
            qualified(group, plural)
        ));
        e.details = Some(details(name, group, plural));
        e
    }

    /// 429: the request would break a limit now (a disruption budget, the
    /// number of concurrent streams); retrying later may succeed.
    pub(crate) fn too_many_requests(message: impl Into<String>) -> Self {
        Self::new(429, "TooManyRequests", message)
    }

    /// 413: the request body is larger than the server reads.
    pub(crate) fn entity_too_large(message: impl Into<String>) -> Self {
        Self::new(413, "RequestEntityTooLarge", message)
    }

    /// An error kube-apiserver passes on from below without a reason (as
    /// `ErrorToAPIStatus` does for errors that are not API errors).
    pub(crate) fn unknown(code: u16, message: impl Into<String>) -> Self {
        Self::new(code, "", message)
    }

    /// 415: the content type is not one this endpoint accepts.
    pub(crate) fn unsupported_media(message: impl Into<String>) -> Self {
        Self::new(415, "UnsupportedMediaType", message)
    }

    /// 422: the object is invalid; `causes` name each bad field (`field`,
    /// `message`, the message starting as Kubernetes' field errors do:
    /// `Required value`, `Invalid value: ...`, `Forbidden: ...`).
    /// `group_kind` is `Kind` or `Kind.group` (`Deployment.apps`): the
    /// message names it so and `details` carries kind and group apart, as
    /// the real server's `NewInvalid`; several causes are listed in `[]`.
    pub(crate) fn invalid(group_kind: &str, name: &str, causes: Vec<(String, String)>) -> Self {
        let summary: Vec<String> = causes
            .iter()
            .map(|(f, m)| {
                if f.is_empty() {
                    m.clone()
                } else {
                    format!("{f}: {m}")
                }
            })
            .collect();
        let listed = if summary.len() == 1 {
            summary[0].clone()
        } else {
            format!("[{}]", summary.join(", "))
        };
        let mut e = Self::new(
            422,
            "Invalid",
            format!("{group_kind} \"{name}\" is invalid: {listed}"),
        );
        let (kind, group) = group_kind.split_once('.').unwrap_or((group_kind, ""));
        let mut d = details(name, group, kind);
        d["causes"] = causes
            .iter()
            .map(|(f, m)| {
                let mut c = json!({"reason": cause_reason(m), "message": m});
                if !f.is_empty() {
                    c["field"] = json!(f);
                }
                c
            })
            .collect();
        e.details = Some(d);
        e
    }

    /// 422: a request option (`PatchOptions`, `DeleteOptions`, ...) is
    /// invalid, as `<kind>.meta.k8s.io "" is invalid: <field>: <message>`;
    /// `reason` is the cause's (`FieldValueRequired`, `FieldValueForbidden`).
    pub(crate) fn invalid_options(kind: &str, field: &str, reason: &str, message: &str) -> Self {
        let mut e = Self::new(
            422,
            "Invalid",
            format!("{kind}.meta.k8s.io \"\" is invalid: {field}: {message}"),
        );
        e.details = Some(json!({
            "group": "meta.k8s.io",
            "kind": kind,
            "causes": [{"reason": reason, "message": message, "field": field}],
        }));
        e
    }

    /// 422: a patch could not be applied to the object.
    pub(crate) fn invalid_patch(message: impl Into<String>) -> Self {
        Self::new(422, "Invalid", message)
    }

    /// 500: a bug or an I/O failure on the server.
    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// 502/503 when a proxied backend (the kubelet) fails.
    pub(crate) fn backend(message: impl Into<String>) -> Self {
        Self::new(503, "ServiceUnavailable", message)
    }

    /// The `Status` object (written in the real server's field order by
    /// `response::to_vec_ordered`).
    pub(crate) fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        if self.reason.is_empty()
            && let Some(o) = s.as_object_mut()
        {
            o.remove("reason");
        }
        s
    }
}

/// A `Status` object reporting success (delete of a collection, etc.).
pub(crate) fn success_status() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 200})
}

/// `plural` or `plural.group`, as messages name a resource.
fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

/// `StatusDetails` naming one object: `group` only when it is not the core
/// group, as the real server leaves empty fields out.
fn details(name: &str, group: &str, kind: &str) -> Value {
    let mut d = serde_json::Map::new();
    for (k, v) in [("name", name), ("group", group), ("kind", kind)] {
        if !v.is_empty() {
            d.insert(k.into(), json!(v));
        }
    }
    Value::Object(d)
}

/// The `StatusCause` reason of a field error, from how its message starts
/// (Kubernetes' `field.Error` types and their words).
fn cause_reason(message: &str) -> &'static str {
    const REASONS: &[(&str, &str)] = &[
        ("Required value", "FieldValueRequired"),
        ("Unsupported value", "FieldValueNotSupported"),
        ("Duplicate value", "FieldValueDuplicate"),
        ("Not found", "FieldValueNotFound"),
        ("Forbidden", "FieldValueForbidden"),
        ("Too long", "FieldValueTooLong"),
        ("Too many", "FieldValueTooMany"),
        ("Internal error", "InternalError"),
        ("Invalid value", "FieldValueInvalid"),
    ];
    REASONS
        .iter()
        .find(|(words, _)| message.starts_with(words))
        .map_or("FieldValueInvalid", |(_, r)| r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_names_the_group_and_lists_several_causes_as_the_real_server() {
        let e = ApiError::invalid(
            "Deployment.apps",
            "d",
            vec![
                ("spec.selector".into(), "Required value".into()),
                (
                    "spec.replicas".into(),
                    "Invalid value: -1: must be greater than or equal to 0".into(),
                ),
            ],
        );
        assert_eq!(
            e.message,
            "Deployment.apps \"d\" is invalid: [spec.selector: Required value, spec.replicas: Invalid value: -1: must be greater than or equal to 0]"
        );
        let d = e.details.expect("details");
        assert_eq!(
            (d["kind"].as_str(), d["group"].as_str()),
            (Some("Deployment"), Some("apps"))
        );
        assert_eq!(d["causes"][0]["reason"], "FieldValueRequired");
        assert_eq!(d["causes"][1]["reason"], "FieldValueInvalid");
        let one = ApiError::invalid(
            "ConfigMap",
            "c",
            vec![(
                "data".into(),
                "Too long: must have at most 1048576 bytes".into(),
            )],
        );
        assert_eq!(
            one.message,
            "ConfigMap \"c\" is invalid: data: Too long: must have at most 1048576 bytes"
        );
        let d = one.details.expect("details");
        assert!(d.get("group").is_none(), "the core group is left out: {d}");
        assert_eq!(d["causes"][0]["reason"], "FieldValueTooLong");
    }

    #[test]
    fn not_found_and_no_route_carry_details() {
        let d = ApiError::not_found("", "pods", "p")
            .details
            .expect("details");
        assert_eq!(d, json!({"name": "p", "kind": "pods"}));
        let d = ApiError::not_found("apps", "deployments", "d")
            .details
            .expect("details");
        assert_eq!(
            d,
            json!({"name": "d", "group": "apps", "kind": "deployments"})
        );
        let e = ApiError::no_route("/api/v1/foos");
        assert_eq!(e.details, Some(json!({})));
        assert_eq!(
            e.message,
            "the server could not find the requested resource"
        );
    }
}
