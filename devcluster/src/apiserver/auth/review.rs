//! Owns the review endpoints, answered from RBAC for the asking user (or
//! the user named in a `SubjectAccessReview`): `SelfSubjectAccessReview`
//! (`kubectl auth can-i`), `SubjectAccessReview`, `SelfSubjectRulesReview`
//! (`kubectl auth can-i --list`) and `SelfSubjectReview` (`kubectl auth
//! whoami`); and `TokenReview`, answered by the authenticator. They store
//! nothing.

use serde_json::{Value, json};

use super::User;
use super::attrs::Attributes;
use crate::apiserver::handlers::Request;
use crate::apiserver::proto;
use crate::apiserver::route::RouteTarget;
use crate::apiserver::status::ApiError;
use crate::apiserver::store::Store;

fn str_at<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

/// The attributes an access review asks about.
fn asked(spec: &Value) -> Result<Attributes, ApiError> {
    if let Some(r) = spec.get("resourceAttributes") {
        let mut a = Attributes::resource(
            str_at(r, "/verb"),
            str_at(r, "/group"),
            str_at(r, "/resource"),
            str_at(r, "/subresource"),
            str_at(r, "/namespace"),
            str_at(r, "/name"),
        );
        a.version = str_at(r, "/version").to_string();
        return Ok(a);
    }
    if let Some(n) = spec.get("nonResourceAttributes") {
        return Ok(Attributes::non_resource(
            str_at(n, "/verb"),
            str_at(n, "/path"),
        ));
    }
    Err(ApiError::invalid(
        "SelfSubjectAccessReview",
        "",
        vec![(
            "spec.resourceAttributes".into(),
            "Invalid value: exactly one of nonResourceAttributes or resourceAttributes must be specified".into(),
        )],
    ))
}

/// POST of a review by `user`.
pub(crate) fn review(
    store: &Store,
    user: &User,
    t: &RouteTarget,
    req: &Request,
) -> Result<(u16, Value), ApiError> {
    let mut body = if req.content_type.contains("protobuf") {
        proto::decode_review(&req.body)?
    } else {
        req.json_body()?
    };
    if !body.is_object() {
        return Err(ApiError::bad_request(format!(
            "the body must be a {} object",
            t.info.kind
        )));
    }
    body["apiVersion"] = json!(t.info.api_version(&t.version));
    body["kind"] = json!(t.info.kind);
    if body.get("metadata").is_none() {
        body["metadata"] = json!({});
    }
    let spec = body.get("spec").cloned().unwrap_or(json!({}));
    let index = store.lock().rbac_index();
    body["status"] = match t.info.plural.as_str() {
        "selfsubjectreviews" => json!({
            "userInfo": {"username": user.name, "uid": user.uid, "groups": user.groups},
        }),
        "selfsubjectrulesreviews" => {
            let ns = str_at(&spec, "/namespace");
            if user.is_superuser() {
                json!({
                    "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}],
                    "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
                    "incomplete": false,
                })
            } else {
                let rules = index.rules_for(user, ns);
                let (non, res): (Vec<_>, Vec<_>) =
                    rules.iter().partition(|r| !r.non_resource_urls.is_empty());
                json!({
                    "resourceRules": res.iter().map(|r| r.to_json()).collect::<Vec<_>>(),
                    "nonResourceRules": non.iter().map(|r| r.to_json()).collect::<Vec<_>>(),
                    "incomplete": false,
                })
            }
        }
        plural => {
            let subject = if plural == "subjectaccessreviews" {
                let groups = spec
                    .get("groups")
                    .and_then(Value::as_array)
                    .map(|g| {
                        g.iter()
                            .filter_map(|x| x.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default();
                User {
                    name: str_at(&spec, "/user").to_string(),
                    uid: str_at(&spec, "/uid").to_string(),
                    groups,
                    extra: Vec::new(),
                }
            } else {
                user.clone()
            };
            let a = asked(&spec)?;
            if index.allows(&subject, &a) {
                let reason = if subject.is_superuser() {
                    "the user is in system:masters"
                } else {
                    "allowed by a RoleBinding or ClusterRoleBinding"
                };
                json!({"allowed": true, "reason": reason})
            } else {
                json!({"allowed": false})
            }
        }
    };
    Ok((201, body))
}

/// POST of a `TokenReview`: whether `spec.token` is a token this server
/// accepts (for `spec.audiences`, else the API server's), and whose.
pub(crate) fn token_review(
    auth: &super::Authenticator,
    store: &Store,
    t: &RouteTarget,
    req: &Request,
) -> Result<(u16, Value), ApiError> {
    let mut body = req.json_body()?;
    if !body.is_object() {
        return Err(ApiError::bad_request(
            "the body must be a TokenReview object",
        ));
    }
    body["apiVersion"] = json!(t.info.api_version(&t.version));
    body["kind"] = json!("TokenReview");
    if body.get("metadata").is_none() {
        body["metadata"] = json!({});
    }
    let token = str_at(&body, "/spec/token").to_string();
    if token.is_empty() {
        return Err(ApiError::invalid(
            "TokenReview",
            "",
            vec![(
                "spec.token".into(),
                "Required value: token must be specified".into(),
            )],
        ));
    }
    let asked: Vec<String> = body
        .pointer("/spec/audiences")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let audiences: Vec<&str> = if asked.is_empty() {
        vec![super::token::API_AUDIENCE]
    } else {
        asked.iter().map(String::as_str).collect()
    };
    body["status"] = match auth.token_user(store, &token, &audiences) {
        Ok((user, matched)) => {
            let mut u = json!({"username": user.name, "uid": user.uid, "groups": user.groups});
            if !user.extra.is_empty() {
                let extra: serde_json::Map<String, Value> = user
                    .extra
                    .iter()
                    .map(|(k, v)| (k.clone(), json!([v])))
                    .collect();
                u["extra"] = Value::Object(extra);
            }
            json!({"authenticated": true, "user": u, "audiences": matched})
        }
        Err(why) => json!({"user": {}, "error": format!("[invalid bearer token, {why}]")}),
    };
    Ok((201, body))
}
