//! Owns the OpenAPI documents kubectl reads: `/openapi/v2` and the
//! `/openapi/v3` index with one document per group/version. Custom
//! resources are described by their CRD schema; every operation lists the
//! `fieldValidation` parameter so kubectl validates on the server.
//!
//! Built-in kinds are described by permissive object schemas: kubectl
//! merges built-in types with its compiled-in patch metadata, and the
//! server validates what it stores.

use serde_json::{Map, Value, json};

use super::registry::{Registry, ResourceInfo};

fn definition_name(r: &ResourceInfo, version: &str) -> String {
    let group = if r.group.is_empty() {
        "core".to_string()
    } else {
        r.group.split('.').rev().collect::<Vec<_>>().join(".")
    };
    format!("io.k8s.{group}.{version}.{}", r.kind)
}

fn schema_of(r: &ResourceInfo, version: &str) -> Value {
    let gvk = json!([{"group": r.group, "version": version, "kind": r.kind}]);
    let mut s = match r.schemas.get(version) {
        Some(s) => s.clone(),
        None => json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
    };
    if let Some(m) = s.as_object_mut() {
        let props = m.entry("properties").or_insert_with(|| json!({}));
        if let Some(p) = props.as_object_mut() {
            p.entry("apiVersion").or_insert(json!({"type": "string"}));
            p.entry("kind").or_insert(json!({"type": "string"}));
            p.insert(
                "metadata".into(),
                json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
            );
        }
        m.insert("x-kubernetes-group-version-kind".into(), gvk);
    }
    s
}

fn params(names: &[&str]) -> Value {
    Value::Array(
        names
            .iter()
            .map(|n| json!({"name": n, "in": "query", "uniqueItems": true, "schema": {"type": "string"}, "type": "string"}))
            .collect(),
    )
}

fn paths_for(r: &ResourceInfo, version: &str, def_ref: &str) -> Map<String, Value> {
    let prefix = if r.group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{}/{version}", r.group)
    };
    let base = if r.namespaced {
        format!("{prefix}/namespaces/{{namespace}}/{}", r.plural)
    } else {
        format!("{prefix}/{}", r.plural)
    };
    let gvk = json!({"group": r.group, "version": version, "kind": r.kind});
    let op = |verb: &str, action: &str, ps: &[&str]| {
        json!({
            "operationId": format!("{verb}{}", r.kind),
            "x-kubernetes-action": action,
            "x-kubernetes-group-version-kind": gvk,
            "parameters": params(ps),
            "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": {"$ref": def_ref}}}, "schema": {"$ref": def_ref}}},
        })
    };
    let write = ["dryRun", "fieldManager", "fieldValidation"];
    let mut m = Map::new();
    m.insert(
        base.clone(),
        json!({
            "get": op("list", "list", &["labelSelector", "fieldSelector", "limit", "continue", "watch", "resourceVersion"]),
            "post": op("create", "post", &write),
            "delete": op("deleteCollection", "deletecollection", &["labelSelector", "fieldSelector"]),
        }),
    );
    let mut patch_params = write.to_vec();
    patch_params.push("force");
    m.insert(
        format!("{base}/{{name}}"),
        json!({
            "get": op("read", "get", &[]),
            "put": op("replace", "put", &write),
            "patch": op("patch", "patch", &patch_params),
            "delete": op("delete", "delete", &["gracePeriodSeconds", "propagationPolicy", "dryRun"]),
        }),
    );
    if r.status {
        m.insert(
            format!("{base}/{{name}}/status"),
            json!({"get": op("read", "get", &[]), "put": op("replace", "put", &write), "patch": op("patch", "patch", &patch_params)}),
        );
    }
    m
}

/// `/openapi/v2`.
pub(crate) fn v2(reg: &Registry) -> Value {
    let mut defs = Map::new();
    let mut paths = Map::new();
    for r in reg.all() {
        for v in &r.versions {
            let name = definition_name(r, v);
            paths.extend(paths_for(r, v, &format!("#/definitions/{name}")));
            defs.insert(name, schema_of(r, v));
        }
    }
    json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0"},
        "paths": paths,
        "definitions": defs,
    })
}

/// `/openapi/v3`: the index of per-group-version documents.
pub(crate) fn v3_index(reg: &Registry) -> Value {
    let mut paths = Map::new();
    for (g, versions) in reg.groups() {
        for v in versions {
            let p = if g.is_empty() {
                format!("api/{v}")
            } else {
                format!("apis/{g}/{v}")
            };
            let url = format!("/openapi/v3/{p}?hash=0");
            paths.insert(p, json!({"serverRelativeURL": url}));
        }
    }
    json!({"paths": paths})
}

/// `/openapi/v3/api/<v>` or `/openapi/v3/apis/<group>/<v>`.
pub(crate) fn v3_doc(reg: &Registry, group: &str, version: &str) -> Value {
    let mut schemas = Map::new();
    let mut paths = Map::new();
    for r in reg
        .all()
        .filter(|r| r.group == group && r.versions.iter().any(|v| v == version))
    {
        let name = definition_name(r, version);
        paths.extend(paths_for(
            r,
            version,
            &format!("#/components/schemas/{name}"),
        ));
        schemas.insert(name, schema_of(r, version));
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    })
}

/// `/openapi/v2` in protobuf form: a document with only `swagger: "2.0"`
/// (field 1).
pub(crate) fn v2_protobuf() -> bytes::Bytes {
    fn field(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![tag, body.len() as u8];
        out.extend_from_slice(body);
        out
    }
    bytes::Bytes::from(field(0x0a, b"2.0"))
}
