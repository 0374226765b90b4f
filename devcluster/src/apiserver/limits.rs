//! Owns Kubernetes' size limits on requests and stored objects:
//!
//! 1. A request body over 3 MiB (kube-apiserver's `MaxRequestBodyBytes`,
//!    3145728) is 413 `Request entity too large: limit is 3145728`,
//!    refused while it is read (`http`).
//! 2. The annotations of an object total at most 256 KiB (keys and values):
//!    more is 422 `metadata.annotations: Too long: must have at most 262144
//!    bytes`, as `ValidateObjectMeta` answers.
//! 3. The data of a ConfigMap or a Secret totals at most 1 MiB (422, as
//!    their validation answers).
//! 4. A stored object is at most 1.5 MiB, etcd's default request limit:
//!    larger is the error kube-apiserver passes on from etcd, a 500 with
//!    no reason and the message `etcdserver: request is too large`.

use serde_json::Value;

use super::registry::ResourceInfo;
use super::status::ApiError;

/// Largest request body kube-apiserver reads (invariant 1).
pub(crate) const MAX_REQUEST_BODY: usize = 3 * 1024 * 1024;
/// Largest total size of an object's annotations (invariant 2).
const MAX_ANNOTATIONS: usize = 256 * 1024;
/// Largest total size of a ConfigMap's or Secret's data (invariant 3).
const MAX_DATA: usize = 1024 * 1024;
/// etcd's default `--max-request-bytes` (invariant 4).
const MAX_OBJECT: usize = 1024 * 1024 * 3 / 2;

/// The 413 for a body over `limit` bytes (invariant 1).
pub(crate) fn body_too_large(limit: usize) -> ApiError {
    ApiError::entity_too_large(format!("Request entity too large: limit is {limit}"))
}

fn sum_map(v: Option<&Value>) -> usize {
    v.and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| k.len() + v.as_str().map_or(0, str::len))
                .sum()
        })
        .unwrap_or(0)
}

/// Checks an object before it is stored (invariants 2 to 4).
pub(crate) fn check(info: &ResourceInfo, obj: &Value) -> Result<(), ApiError> {
    let kind = &info.group_kind();
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    if sum_map(obj.pointer("/metadata/annotations")) > MAX_ANNOTATIONS {
        return Err(ApiError::invalid(
            kind,
            name,
            vec![(
                "metadata.annotations".into(),
                format!("Too long: must have at most {MAX_ANNOTATIONS} bytes"),
            )],
        ));
    }
    if info.builtin && info.group.is_empty() {
        let too_long = format!("Too long: must have at most {MAX_DATA} bytes");
        match info.plural.as_str() {
            "configmaps" => {
                // binaryData values are base64 in JSON: count the bytes.
                let binary: usize = obj
                    .get("binaryData")
                    .and_then(Value::as_object)
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| k.len() + v.as_str().map_or(0, |s| s.len() / 4 * 3))
                            .sum()
                    })
                    .unwrap_or(0);
                if sum_map(obj.get("data")) + binary > MAX_DATA {
                    return Err(ApiError::invalid(kind, name, vec![("[]".into(), too_long)]));
                }
            }
            "secrets" => {
                let data: usize = obj
                    .get("data")
                    .and_then(Value::as_object)
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| k.len() + v.as_str().map_or(0, |s| s.len() / 4 * 3))
                            .sum()
                    })
                    .unwrap_or(0);
                if data > MAX_DATA {
                    return Err(ApiError::invalid(
                        kind,
                        name,
                        vec![("data".into(), too_long)],
                    ));
                }
            }
            _ => {}
        }
    }
    let size = serde_json::to_vec(obj).map(|b| b.len()).unwrap_or(0);
    if size > MAX_OBJECT {
        return Err(ApiError::unknown(500, "etcdserver: request is too large"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn annotations_data_and_objects_are_bounded() {
        let reg = super::super::registry::Registry::new();
        let cms = reg.lookup("", "v1", "configmaps").expect("configmaps");
        let big = "x".repeat(MAX_ANNOTATIONS);
        let e = check(
            &cms,
            &json!({"metadata": {"name": "a", "annotations": {"k": big}}}),
        )
        .expect_err("annotations");
        assert_eq!(e.code, 422);
        assert!(
            e.message
                .ends_with("metadata.annotations: Too long: must have at most 262144 bytes"),
            "{}",
            e.message
        );
        let e = check(
            &cms,
            &json!({"metadata": {"name": "a"}, "data": {"k": "x".repeat(MAX_DATA)}}),
        )
        .expect_err("data");
        assert_eq!(e.code, 422);
        let leases = reg
            .lookup("coordination.k8s.io", "v1", "leases")
            .expect("leases");
        let e = check(
            &leases,
            &json!({"metadata": {"name": "a", "labels": {"k": "x".repeat(MAX_OBJECT)}}}),
        )
        .expect_err("object");
        assert_eq!(
            (e.code, e.reason, e.message.as_str()),
            (500, "", "etcdserver: request is too large")
        );
        check(
            &cms,
            &json!({"metadata": {"name": "a"}, "data": {"k": "v"}}),
        )
        .expect("small");
    }
}
