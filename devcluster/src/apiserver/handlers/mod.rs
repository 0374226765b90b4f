//! Owns the verbs on resources: get, list, create, update and
//! `pods/binding` here; patch (`patch`) and delete (`delete`) in
//! submodules. Each turns a routed request into a store write through
//! `lifecycle` and answers with the stored object.

mod delete;
mod patch;

pub(crate) use delete::{delete, delete_collection, delete_one, finalize_namespace};
pub(crate) use patch::patch;

use std::sync::Arc;

use serde_json::{Value, json};

use super::certs;
use super::convert;
use super::lifecycle::{self, Part};
use super::limits;
use super::meta::{self, meta_mut};
use super::podsecurity;
use super::registry::ResourceInfo;
use super::route::RouteTarget;
use super::serviceaccount;
use super::ssa::{self, FieldShape};
use super::status::{ApiError, success_status};
use super::store::{ObjKey, Store, check_namespace};
use super::table;
use super::times;

pub(crate) use super::request::{Request, name_of, ns_of};

/// An object reduced to `PartialObjectMetadata`.
pub(crate) fn metadata_only(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or(json!({})),
    })
}

/// A response body as a client that asked for metadata only
/// (`as=PartialObjectMetadata`) gets it, whatever the verb: objects become
/// `PartialObjectMetadata`, lists `PartialObjectMetadataList`; Status
/// objects and bodies already reduced pass unchanged.
pub(crate) fn as_metadata(body: Value) -> Value {
    let kind = body.get("kind").and_then(Value::as_str).unwrap_or("");
    if matches!(
        kind,
        "Status" | "PartialObjectMetadata" | "PartialObjectMetadataList" | "Table"
    ) {
        return body;
    }
    match body.get("items").and_then(Value::as_array) {
        Some(items) if kind.ends_with("List") => json!({
            "kind": "PartialObjectMetadataList",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": body.get("metadata").cloned().unwrap_or(json!({})),
            "items": items.iter().map(metadata_only).collect::<Vec<_>>(),
        }),
        _ => metadata_only(&body),
    }
}

/// The shape used for managedFields of a resource.
pub(crate) fn shape<'a>(info: &'a ResourceInfo, version: &str) -> FieldShape<'a> {
    FieldShape {
        builtin: info.builtin,
        schema: info.schemas.get(version),
    }
}

/// An object as served at `version` (CRDs with several versions share
/// storage; only `apiVersion` differs).
pub(crate) fn present(info: &ResourceInfo, version: &str, obj: &Value) -> Value {
    let av = info.api_version(version);
    let mut o = convert::to_view(info, version, obj);
    if o.get("apiVersion").and_then(Value::as_str) != Some(av.as_str()) {
        o["apiVersion"] = json!(av);
    }
    o
}

/// GET of one object.
pub(crate) fn get(store: &Store, t: &RouteTarget, req: &Request) -> Result<(u16, Value), ApiError> {
    let name = name_of(t)?;
    let obj = store
        .lock()
        .get(&t.info.key(), ns_of(t), name)
        .ok_or_else(|| ApiError::not_found(&t.info.group, &t.info.plural, name))?;
    let obj = present(&t.info, &t.version, &obj);
    if req.wants_table() {
        return Ok((
            200,
            table::table(
                &t.info,
                &t.version,
                &[obj],
                req.q("includeObject"),
                None,
                true,
            ),
        ));
    }
    if req.wants_metadata() {
        return Ok((200, metadata_only(&obj)));
    }
    Ok((200, obj))
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Continue {
    ns: String,
    name: String,
}

/// LIST with selectors, limit and continue.
pub(crate) fn list(
    store: &Store,
    t: &RouteTarget,
    req: &Request,
) -> Result<(u16, Value), ApiError> {
    use base64::Engine as _;
    let labels = req.label_selector()?;
    let fields = req.field_selector(&t.info)?;
    let limit = match req.q("limit") {
        Some(l) if !l.is_empty() => Some(l.parse::<usize>().map_err(|_| {
            ApiError::bad_request(format!("limit {l:?} is not a non-negative integer"))
        })?),
        _ => None,
    }
    .filter(|l| *l > 0);
    let after: Option<ObjKey> = match req.q("continue") {
        Some(c) if !c.is_empty() => {
            let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(c)
                .map_err(|_| ApiError::bad_request("the continue token is malformed: pass the metadata.continue of the previous page"))?;
            let c: Continue = serde_json::from_slice(&raw)
                .map_err(|_| ApiError::bad_request("the continue token is malformed: pass the metadata.continue of the previous page"))?;
            Some((c.ns, c.name))
        }
        _ => None,
    };
    let st = store.lock();
    let rv = st.rv();
    let mut items = Vec::new();
    let mut next = None;
    let mut remaining = 0usize;
    let key = t.info.key();
    for (k, obj) in st.scan(&key, t.ns.as_deref(), after.as_ref()) {
        if !labels.matches(obj) || !fields.matches(obj) {
            continue;
        }
        if let Some(l) = limit
            && items.len() == l
        {
            if next.is_none() {
                let (ns, name) = items_last_key(&items, k);
                next = Some(Continue { ns, name });
            }
            remaining += 1;
            continue;
        }
        items.push((k.clone(), obj.clone()));
    }
    drop(st);
    let objs: Vec<Value> = items
        .iter()
        .map(|(_, o)| present(&t.info, &t.version, o))
        .collect();
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if let Some(c) = next {
        let tok = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(serde_json::to_vec(&c).unwrap_or_default());
        metadata["continue"] = json!(tok);
        metadata["remainingItemCount"] = json!(remaining);
    }
    if req.wants_table() {
        let mut tbl = table::table(
            &t.info,
            &t.version,
            &objs,
            req.q("includeObject"),
            None,
            true,
        );
        tbl["metadata"] = metadata;
        return Ok((200, tbl));
    }
    if req.wants_metadata() {
        let items: Vec<Value> = objs.iter().map(metadata_only).collect();
        return Ok((
            200,
            json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": metadata, "items": items}),
        ));
    }
    Ok((
        200,
        json!({
            "kind": format!("{}List", t.info.kind),
            "apiVersion": t.info.api_version(&t.version),
            "metadata": metadata,
            "items": objs,
        }),
    ))
}

fn items_last_key(items: &[(ObjKey, Arc<Value>)], fallback: &ObjKey) -> (String, String) {
    items
        .last()
        .map(|(k, _)| k.clone())
        .unwrap_or_else(|| fallback.clone())
}

/// POST: create.
pub(crate) fn create(
    store: &Store,
    t: &RouteTarget,
    req: &Request,
) -> Result<(u16, Value), ApiError> {
    if t.name.is_some() {
        return Err(ApiError::method_not_allowed());
    }
    let mut obj = req.json_body()?;
    times::check_body(&t.info, &t.version, &mut obj)?;
    let ns = ns_of(t).to_string();
    lifecycle::check_identity(&t.info, &t.version, &mut obj, &ns, None)?;
    let manager = req.manager();
    let generated = meta::meta_str(&obj, "name").is_none_or(str::is_empty);
    let is_pod = t.info.builtin && t.info.group.is_empty() && t.info.plural == "pods";
    let security = podsecurity::Policy::lookup(store, &ns);
    if t.info.builtin {
        req.warn(security.warn_template(&t.info.plural, &obj));
    }
    for _ in 0..8 {
        let mut o = obj.clone();
        let mut warnings = Vec::new();
        lifecycle::prepare_create(&t.info, &t.version, &mut o, req.strict())?;
        if certs::is_csr(&t.info) {
            certs::set_requester(&mut o, &req.user);
        }
        if is_pod {
            let automount = serviceaccount::lookup(store, &ns, &o)?;
            serviceaccount::admit_pod(&mut o, automount);
            warnings = security.admit_pod(&o)?;
        }
        ssa::record_update(
            None,
            &mut o,
            &manager,
            &t.info.api_version(&t.version),
            "",
            shape(&t.info, &t.version),
        );
        let o = convert::to_storage(&t.info, o);
        match insert_new(store, &t.info, &ns, o, req.dry_run()) {
            Err(e) if e.code == 409 && generated => continue,
            r => {
                req.warn(warnings);
                return r.map(|v| (201, present(&t.info, &t.version, &v)));
            }
        }
    }
    Err(ApiError::internal(
        "could not generate a unique name: try again or give metadata.name",
    ))
}

/// Stores a prepared new object, failing with 409 if the name is taken.
pub(crate) fn insert_new(
    store: &Store,
    info: &ResourceInfo,
    ns: &str,
    obj: Value,
    dry_run: bool,
) -> Result<Value, ApiError> {
    let name = meta::name(&obj).to_string();
    limits::check(info, &obj)?;
    let mut st = store.lock();
    check_namespace(&st, info, ns, &name)?;
    if st.get(&info.key(), ns, &name).is_some() {
        return Err(ApiError::already_exists(&info.group, &info.plural, &name));
    }
    if dry_run {
        return Ok(obj);
    }
    let stored = st.put(&info.key(), ns, &name, obj);
    let is_ns = info.builtin && info.group.is_empty() && info.plural == "namespaces";
    if is_ns {
        serviceaccount::namespace_defaults(&mut st, &name, store.root_ca.get().map(String::as_str));
    }
    drop(st);
    store.wrote(false);
    Ok((*stored).clone())
}

/// PUT of the object or its status.
pub(crate) fn update(
    store: &Store,
    t: &RouteTarget,
    req: &Request,
    part: Part,
) -> Result<(u16, Value), ApiError> {
    let name = name_of(t)?.to_string();
    let mut obj = req.json_body()?;
    times::check_body(&t.info, &t.version, &mut obj)?;
    let ns = ns_of(t).to_string();
    lifecycle::check_identity(&t.info, &t.version, &mut obj, &ns, Some(&name))?;
    let manager = req.manager();
    let sub = part.subresource();
    let security = ephemeral_admission(store, &ns, part);
    write_existing(store, t, &name, req.dry_run(), |old| {
        let Some(old) = old else {
            return Err(ApiError::not_found(&t.info.group, &t.info.plural, &name));
        };
        let Some(mut new) =
            lifecycle::prepare_update(&t.info, &t.version, old, obj, part, req.strict())?
        else {
            return Ok(None);
        };
        if let Some(security) = &security {
            req.warn(security.admit_pod(&new)?);
        }
        track_update(
            old,
            &mut new,
            &manager,
            &t.info.api_version(&t.version),
            sub,
            shape(&t.info, &t.version),
        );
        Ok(Some(new))
    })
}

/// The PodSecurity policy a write to `pods/ephemeralcontainers` in `ns` is
/// admitted by (the pod with its new containers is checked as a new pod
/// is), read before the store lock is taken; `None` for other parts.
pub(crate) fn ephemeral_admission(
    store: &Store,
    ns: &str,
    part: Part,
) -> Option<podsecurity::Policy> {
    (part == Part::Ephemeral).then(|| podsecurity::Policy::lookup(store, ns))
}

/// Runs `f` on the live object under the store lock and stores its result
/// (`None`: unchanged). Answers with the stored object.
pub(crate) fn write_existing(
    store: &Store,
    t: &RouteTarget,
    name: &str,
    dry_run: bool,
    f: impl FnOnce(Option<&Value>) -> Result<Option<Value>, ApiError>,
) -> Result<(u16, Value), ApiError> {
    let ns = ns_of(t);
    let key = t.info.key();
    let mut st = store.lock();
    let old = st.get(&key, ns, name);
    let created = old.is_none();
    let view = old
        .as_deref()
        .map(|o| convert::to_view(&t.info, &t.version, o));
    let new = f(view.as_ref())?.map(|n| convert::to_storage(&t.info, n));
    let Some(new) = new else {
        let old = old.ok_or_else(|| ApiError::not_found(&t.info.group, &t.info.plural, name))?;
        return Ok((200, present(&t.info, &t.version, &old)));
    };
    limits::check(&t.info, &new)?;
    if created {
        check_namespace(&st, &t.info, ns, name)?;
    }
    if dry_run {
        return Ok((
            if created { 201 } else { 200 },
            present(&t.info, &t.version, &new),
        ));
    }
    let gc = meta::is_deleting(&new);
    let stored = st.put(&key, ns, name, new);
    if created && t.info.builtin && t.info.group.is_empty() && t.info.plural == "namespaces" {
        serviceaccount::namespace_defaults(&mut st, name, store.root_ca.get().map(String::as_str));
    }
    drop(st);
    store.wrote(gc);
    Ok((
        if created { 201 } else { 200 },
        present(&t.info, &t.version, &stored),
    ))
}

/// POST `pods/{name}/binding`: assigns the pod to a node.
pub(crate) fn bind(
    store: &Store,
    t: &RouteTarget,
    req: &Request,
) -> Result<(u16, Value), ApiError> {
    let name = name_of(t)?.to_string();
    let body = req.json_body()?;
    let node = body
        .pointer("/target/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            ApiError::invalid(
                "Binding",
                &name,
                vec![(
                    "target.name".into(),
                    "Required value: the node to bind to".into(),
                )],
            )
        })?
        .to_string();
    let manager = req.manager();
    write_existing(store, t, &name, req.dry_run(), |old| {
        let Some(old) = old else { return Err(ApiError::not_found("", "pods", &name)) };
        if meta::is_deleting(old) {
            return Err(ApiError::conflict(format!("pod {name} is being deleted, cannot be assigned to a host")));
        }
        if let Some(cur) = old.pointer("/spec/nodeName").and_then(Value::as_str).filter(|n| !n.is_empty()) {
            return Err(ApiError::conflict(format!("pod {name} is already assigned to node \"{cur}\"")));
        }
        let mut new = old.clone();
        meta::set_path(&mut new, &["spec", "nodeName"], json!(node));
        let conds = new.pointer("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default();
        let mut conds: Vec<Value> = conds.into_iter().filter(|c| c["type"] != "PodScheduled").collect();
        conds.push(json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": meta::now()}));
        meta::set_path(&mut new, &["status", "conditions"], json!(conds));
        ssa::record_update(Some(old), &mut new, &manager, "v1", "binding", shape(&t.info, &t.version));
        Ok(Some(new))
    })
    .map(|_| (201, success_status()))
}

/// Records field ownership of a non-apply write, unless the client set
/// `managedFields` itself (then they are taken as given, as the real
/// server does; kubectl migrates client-side apply ownership this way).
pub(crate) fn track_update(
    old: &Value,
    new: &mut Value,
    manager: &str,
    api_version: &str,
    sub: &str,
    shape: FieldShape<'_>,
) {
    let before = old.pointer("/metadata/managedFields");
    let after = new.pointer("/metadata/managedFields");
    if after.is_some() && after != before {
        if after
            .and_then(Value::as_array)
            .is_some_and(|a| a.is_empty())
        {
            meta_mut(new).remove("managedFields");
        }
        return;
    }
    ssa::record_update(Some(old), new, manager, api_version, sub, shape);
}
