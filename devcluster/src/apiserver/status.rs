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
        let resource = if group.is_empty() {
            plural.to_string()
        } else {
            format!("{plural}.{group}")
        };
        let mut e = Self::new(404, "NotFound", format!("{resource} \"{name}\" not found"));
        e.details = Some(json!({"name": name, "group": group, "kind": plural}));
        e
    }

    /// 404 for a path that serves nothing.
    pub(crate) fn no_route(path: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    }

    /// 405: the verb is not supported here.
    pub(crate) fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    /// 409: the object already exists.
    pub(crate) fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        let resource = if group.is_empty() {
            plural.to_string()
        } else {
            format!("{plural}.{group}")
        };
        let mut e = Self::new(
            409,
            "AlreadyExists",
            format!("{resource} \"{name}\" already exists"),
        );
        e.details = Some(json!({"name": name, "group": group, "kind": plural}));
        e
    }

    /// 409: optimistic concurrency failed, or an apply conflict.
    pub(crate) fn conflict(message: impl Into<String>) -> Self {
        Self::new(409, "Conflict", message)
    }

    /// 410: the watch resourceVersion is older than the kept history.
    pub(crate) fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 403: the request is understood but refused.
    pub(crate) fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    /// 415: the content type is not one this endpoint accepts.
    pub(crate) fn unsupported_media(message: impl Into<String>) -> Self {
        Self::new(415, "UnsupportedMediaType", message)
    }

    /// 422: the object is invalid; `causes` name each bad field.
    pub(crate) fn invalid(kind: &str, name: &str, causes: Vec<(String, String)>) -> Self {
        let summary: Vec<String> = causes.iter().map(|(f, m)| format!("{f}: {m}")).collect();
        let mut e = Self::new(
            422,
            "Invalid",
            format!("{kind} \"{name}\" is invalid: {}", summary.join(", ")),
        );
        e.details = Some(json!({
            "name": name,
            "kind": kind,
            "causes": causes.iter().map(|(f, m)| json!({"reason": "FieldValueInvalid", "message": m, "field": f})).collect::<Vec<_>>(),
        }));
        e
    }

    /// 422: a patch could not be applied to the object.
    pub(crate) fn invalid_patch(message: impl Into<String>) -> Self {
        Self::new(422, "Invalid", message)
    }

    /// 429: too many concurrent requests of a kind.
    pub(crate) fn too_many_requests(message: impl Into<String>) -> Self {
        Self::new(429, "TooManyRequests", message)
    }

    /// 500: a bug or an I/O failure on the server.
    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// 502/503 when a proxied backend (the kubelet) fails.
    pub(crate) fn backend(message: impl Into<String>) -> Self {
        Self::new(503, "ServiceUnavailable", message)
    }

    /// The `Status` object.
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
        s
    }
}

/// A `Status` object reporting success (delete of a collection, etc.).
pub(crate) fn success_status() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 200})
}
