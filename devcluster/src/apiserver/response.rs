//! HTTP responses of the API server: the body type (a whole document or a
//! stream), JSON and Status-object responses, and streaming responses for
//! watches and proxied logs.
//!
//! JSON is written in Kubernetes' field order (`to_vec_ordered`): an
//! object with `kind` or `apiVersion` starts with `kind`, `apiVersion`,
//! `metadata`, then `spec`, `status` (lists: `items`), the other fields
//! after; `metadata` starts with `name`, `generateName`, `namespace`,
//! `uid`, `resourceVersion`, `generation`, `creationTimestamp`; a watch
//! event is `type` then `object`; a `Status` is written as `metav1.Status`
//! declares it (`status`, `message`, `reason`, `details`, `code`).

use std::convert::Infallible;

use bytes::Bytes;
use http::{Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::Frame;
use serde_json::Value;
use tokio::sync::mpsc;

use super::status::ApiError;

/// The response body: a whole JSON document or a stream.
pub(crate) type Body = UnsyncBoxBody<Bytes, Infallible>;

pub(crate) fn full(code: u16, content_type: &str, body: Bytes) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(header::CONTENT_TYPE, content_type)
        .body(Full::new(body).boxed_unsync())
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed_unsync()))
}

pub(crate) fn json_response(code: u16, v: &Value) -> Response<Body> {
    full(code, "application/json", Bytes::from(to_vec_ordered(v)))
}

/// Fields written first in an object with `kind` or `apiVersion`.
const OBJECT_ORDER: &[&str] = &["kind", "apiVersion", "metadata", "spec", "status", "items"];
/// Fields written first in `metadata` (as `ObjectMeta` declares them).
const META_ORDER: &[&str] = &[
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];
/// Fields written first in a watch event.
const EVENT_ORDER: &[&str] = &["type", "object"];
/// A `Status` object, as `metav1.Status` declares its fields.
const STATUS_ORDER: &[&str] = &[
    "kind",
    "apiVersion",
    "metadata",
    "status",
    "message",
    "reason",
    "details",
    "code",
];
/// `StatusDetails`.
const DETAILS_ORDER: &[&str] = &[
    "name",
    "group",
    "kind",
    "uid",
    "causes",
    "retryAfterSeconds",
];
/// `StatusCause`.
const CAUSE_ORDER: &[&str] = &["reason", "message", "field"];

/// A JSON value serialized in Kubernetes' field order (module doc).
struct Ordered<'a> {
    value: &'a Value,
    /// The order for this object, when the parent knows it.
    order: Option<&'static [&'static str]>,
}

/// The order of the fields of `m`'s child `k` (and of its elements, for
/// an array), when `m` (written in `order`) says it.
fn child_order(order: &[&str], k: &str) -> Option<&'static [&'static str]> {
    if order == OBJECT_ORDER && k == "metadata" {
        Some(META_ORDER)
    } else if order == STATUS_ORDER && k == "details" {
        Some(DETAILS_ORDER)
    } else if order == DETAILS_ORDER && k == "causes" {
        Some(CAUSE_ORDER)
    } else {
        None
    }
}

impl<'a> serde::Serialize for Ordered<'a> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap as _, SerializeSeq as _};
        match self.value {
            Value::Object(m) => {
                let first = self.order.unwrap_or_else(|| {
                    if m.get("kind").and_then(Value::as_str) == Some("Status")
                        && m.contains_key("code")
                    {
                        STATUS_ORDER
                    } else if m.contains_key("kind") || m.contains_key("apiVersion") {
                        OBJECT_ORDER
                    } else if m.len() == 2 && m.contains_key("type") && m.contains_key("object") {
                        EVENT_ORDER
                    } else {
                        &[]
                    }
                });
                let child = |k: &str, v: &'a Value| -> Ordered<'a> {
                    Ordered {
                        value: v,
                        order: child_order(first, k),
                    }
                };
                let mut map = s.serialize_map(Some(m.len()))?;
                for k in first {
                    if let Some(v) = m.get(*k) {
                        map.serialize_entry(k, &child(k, v))?;
                    }
                }
                for (k, v) in m {
                    if !first.contains(&k.as_str()) {
                        map.serialize_entry(k, &child(k, v))?;
                    }
                }
                map.end()
            }
            Value::Array(a) => {
                // An array's elements share the order given for it.
                let mut seq = s.serialize_seq(Some(a.len()))?;
                for v in a {
                    seq.serialize_element(&Ordered {
                        value: v,
                        order: self.order.filter(|o| *o == CAUSE_ORDER),
                    })?;
                }
                seq.end()
            }
            other => other.serialize(s),
        }
    }
}

/// `v` as JSON in Kubernetes' field order.
pub(crate) fn to_vec_ordered(v: &Value) -> Vec<u8> {
    serde_json::to_vec(&Ordered {
        value: v,
        order: None,
    })
    .unwrap_or_default()
}

pub(crate) fn error_response(e: &ApiError) -> Response<Body> {
    json_response(e.code, &e.to_status())
}

/// A streaming response fed by `rx`.
pub(crate) fn stream_response(rx: mpsc::Receiver<Bytes>, content_type: &str) -> Response<Body> {
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, content_type)
        .header(header::CACHE_CONTROL, "no-cache, private")
        .body(StreamBody::new(stream).boxed_unsync())
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed_unsync()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_is_written_in_the_real_servers_field_order() {
        let e = ApiError::invalid(
            "ConfigMap",
            "Bad_Name",
            vec![(
                "metadata.name".into(),
                "Invalid value: \"Bad_Name\": x".into(),
            )],
        );
        let text = String::from_utf8(to_vec_ordered(&e.to_status())).expect("utf8");
        assert_eq!(
            text,
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"ConfigMap \"Bad_Name\" is invalid: metadata.name: Invalid value: \"Bad_Name\": x","reason":"Invalid","details":{"name":"Bad_Name","kind":"ConfigMap","causes":[{"reason":"FieldValueInvalid","message":"Invalid value: \"Bad_Name\": x","field":"metadata.name"}]},"code":422}"#
        );
        let text = String::from_utf8(to_vec_ordered(
            &ApiError::not_found("apps", "deployments", "nope").to_status(),
        ))
        .expect("utf8");
        assert_eq!(
            text,
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"deployments.apps \"nope\" not found","reason":"NotFound","details":{"name":"nope","group":"apps","kind":"deployments"},"code":404}"#
        );
    }
}
