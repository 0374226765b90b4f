//! A request to a resource as the verbs see it (query, body, content
//! negotiation, admission warnings) and the URL parts every verb reads.

use std::collections::HashMap;

use bytes::Bytes;
use serde_json::Value;

use super::proto;
use super::registry::ResourceInfo;
use super::route::RouteTarget;
use super::selector::{FieldSelector, LabelSelector};
use super::status::ApiError;

/// A parsed request to a resource.
pub(crate) struct Request {
    pub(crate) query: HashMap<String, String>,
    pub(crate) content_type: String,
    pub(crate) accept: String,
    pub(crate) user_agent: String,
    pub(crate) body: Bytes,
    /// Who asks (recorded where the API records requesters, e.g. in a
    /// CertificateSigningRequest's spec).
    pub(crate) user: super::auth::User,
    /// Warnings admission gives the client (`Warning` response headers).
    pub(crate) warnings: std::sync::Mutex<Vec<String>>,
}

impl Request {
    /// Adds warnings for the response.
    pub(crate) fn warn(&self, w: Vec<String>) {
        if w.is_empty() {
            return;
        }
        self.warnings
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend(w);
    }

    /// A query parameter.
    pub(crate) fn q(&self, k: &str) -> Option<&str> {
        self.query.get(k).map(String::as_str)
    }

    /// Whether `dryRun=All` was asked.
    pub(crate) fn dry_run(&self) -> bool {
        self.q("dryRun").is_some_and(|d| d == "All")
    }

    /// The field manager: `fieldManager`, else the user agent's program.
    pub(crate) fn manager(&self) -> String {
        match self.q("fieldManager") {
            Some(m) if !m.is_empty() => m.to_string(),
            _ => {
                let ua = self.user_agent.split('/').next().unwrap_or("").trim();
                if ua.is_empty() {
                    "unknown".into()
                } else {
                    ua.to_string()
                }
            }
        }
    }

    /// Whether unknown fields are an error (`fieldValidation=Strict`).
    pub(crate) fn strict(&self) -> bool {
        self.q("fieldValidation") == Some("Strict")
    }

    /// Whether the client asked for metadata only (`PartialObjectMetadata`).
    pub(crate) fn wants_metadata(&self) -> bool {
        self.accept
            .split(',')
            .next()
            .is_some_and(|first| first.contains("as=PartialObjectMetadata"))
    }

    /// Whether the client asked for a Table.
    pub(crate) fn wants_table(&self) -> bool {
        self.accept
            .split(',')
            .next()
            .is_some_and(|first| first.contains("as=Table"))
    }

    /// The body as JSON (or YAML for apply and YAML content types).
    pub(crate) fn json_body(&self) -> Result<Value, ApiError> {
        if self.body.is_empty() {
            return Err(ApiError::bad_request(
                "the request body is empty: send the object as JSON",
            ));
        }
        if self.content_type.contains("protobuf") {
            return proto::decode_object(&self.body);
        }
        if self.content_type.contains("cbor") {
            return Err(ApiError::unsupported_media(format!(
                "the body content type {:?} is not supported: send application/json",
                self.content_type
            )));
        }
        if self.content_type.contains("yaml") {
            let text = std::str::from_utf8(&self.body)
                .map_err(|_| ApiError::bad_request("the YAML body is not valid UTF-8"))?;
            return serde_saphyr::from_str::<Value>(text)
                .map_err(|e| ApiError::bad_request(format!("the body is not valid YAML: {e}")));
        }
        serde_json::from_slice(&self.body)
            .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))
    }

    pub(crate) fn label_selector(&self) -> Result<LabelSelector, ApiError> {
        LabelSelector::parse(self.q("labelSelector").unwrap_or(""))
    }

    pub(crate) fn field_selector(&self, info: &ResourceInfo) -> Result<FieldSelector, ApiError> {
        FieldSelector::parse(self.q("fieldSelector").unwrap_or(""), Some(info))
    }
}

pub(crate) fn ns_of(t: &RouteTarget) -> &str {
    t.ns.as_deref().unwrap_or("")
}

pub(crate) fn name_of(t: &RouteTarget) -> Result<&str, ApiError> {
    t.name.as_deref().ok_or_else(ApiError::method_not_allowed)
}
