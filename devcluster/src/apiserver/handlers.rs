//! Owns the verbs on resources: get, list, create, update, patch, delete,
//! deletecollection and `pods/binding`. Each turns a routed request into a
//! store write through `lifecycle` and answers with the stored object.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::{Value, json};

use super::convert;
use super::lifecycle::{self, DeleteOpts, DeleteStep, Part, Propagation};
use super::meta::{self, meta_mut};
use super::patch;
use super::proto;
use super::registry::ResourceInfo;
use super::route::Target;
use super::selector::{FieldSelector, LabelSelector};
use super::ssa::{self, Shape};
use super::status::{ApiError, success_status};
use super::store::{ObjKey, Store, check_namespace};
use super::table;

/// A parsed request to a resource.
pub(crate) struct Request {
    pub(crate) query: HashMap<String, String>,
    pub(crate) content_type: String,
    pub(crate) accept: String,
    pub(crate) user_agent: String,
    pub(crate) body: Bytes,
}

impl Request {
    /// A query parameter.
    pub(crate) fn q(&self, k: &str) -> Option<&str> {
        self.query.get(k).map(String::as_str)
    }

    /// Whether `dryRun=All` was asked.
    fn dry_run(&self) -> bool {
        self.q("dryRun").is_some_and(|d| d == "All")
    }

    /// The field manager: `fieldManager`, else the user agent's program.
    fn manager(&self) -> String {
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
    fn strict(&self) -> bool {
        self.q("fieldValidation") == Some("Strict")
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

    fn label_selector(&self) -> Result<LabelSelector, ApiError> {
        LabelSelector::parse(self.q("labelSelector").unwrap_or(""))
    }

    fn field_selector(&self) -> Result<FieldSelector, ApiError> {
        FieldSelector::parse(self.q("fieldSelector").unwrap_or(""))
    }
}

/// The shape used for managedFields of a resource.
pub(crate) fn shape<'a>(info: &'a ResourceInfo, version: &str) -> Shape<'a> {
    Shape {
        builtin: info.builtin,
        schema: info.schemas.get(version),
    }
}

/// An object as served at `version` (CRDs with several versions share
/// storage; only `apiVersion` differs).
pub(crate) fn present(info: &ResourceInfo, version: &str, obj: &Value) -> Value {
    let av = info.api_version(version);
    let mut o = convert::to_view(info, obj);
    if o.get("apiVersion").and_then(Value::as_str) != Some(av.as_str()) {
        o["apiVersion"] = json!(av);
    }
    o
}

fn ns_of(t: &Target) -> &str {
    t.ns.as_deref().unwrap_or("")
}

fn name_of(t: &Target) -> Result<&str, ApiError> {
    t.name
        .as_deref()
        .ok_or_else(|| ApiError::method_not_allowed("this verb needs an object name in the URL"))
}

/// GET of one object.
pub(crate) fn get(store: &Store, t: &Target, req: &Request) -> Result<(u16, Value), ApiError> {
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
    Ok((200, obj))
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Continue {
    ns: String,
    name: String,
}

/// LIST with selectors, limit and continue.
pub(crate) fn list(store: &Store, t: &Target, req: &Request) -> Result<(u16, Value), ApiError> {
    use base64::Engine as _;
    let labels = req.label_selector()?;
    let fields = req.field_selector()?;
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
pub(crate) fn create(store: &Store, t: &Target, req: &Request) -> Result<(u16, Value), ApiError> {
    if t.name.is_some() {
        return Err(ApiError::method_not_allowed(
            "POST creates objects: send it to the collection URL, without a name",
        ));
    }
    let mut obj = req.json_body()?;
    let ns = ns_of(t).to_string();
    lifecycle::check_identity(&t.info, &t.version, &mut obj, &ns, None)?;
    let manager = req.manager();
    let generated = meta::meta_str(&obj, "name").is_none_or(str::is_empty);
    for _ in 0..8 {
        let mut o = obj.clone();
        lifecycle::prepare_create(&t.info, &t.version, &mut o, req.strict())?;
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
            r => return r.map(|v| (201, present(&t.info, &t.version, &v))),
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
    let mut st = store.lock();
    check_namespace(&st, info, ns)?;
    if st.get(&info.key(), ns, &name).is_some() {
        return Err(ApiError::already_exists(&info.group, &info.plural, &name));
    }
    if dry_run {
        return Ok(obj);
    }
    let stored = st.put(&info.key(), ns, &name, obj);
    let is_ns = info.builtin && info.group.is_empty() && info.plural == "namespaces";
    if is_ns {
        default_service_account(&mut st, &name);
    }
    drop(st);
    store.wrote(false);
    Ok((*stored).clone())
}

/// Every namespace gets a `default` ServiceAccount, as the controller
/// manager would create.
fn default_service_account(st: &mut super::store::State, ns: &str) {
    if st.get("/serviceaccounts", ns, "default").is_some() {
        return;
    }
    let sa = json!({
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "default", "namespace": ns, "uid": meta::new_uid(), "creationTimestamp": meta::now()},
    });
    st.put("/serviceaccounts", ns, "default", sa);
}

/// PUT of the object or its status.
pub(crate) fn update(
    store: &Store,
    t: &Target,
    req: &Request,
    part: Part,
) -> Result<(u16, Value), ApiError> {
    let name = name_of(t)?.to_string();
    let mut obj = req.json_body()?;
    let ns = ns_of(t).to_string();
    lifecycle::check_identity(&t.info, &t.version, &mut obj, &ns, Some(&name))?;
    let manager = req.manager();
    let sub = if part == Part::Status { "status" } else { "" };
    write_existing(store, t, &name, req.dry_run(), |old| {
        let Some(old) = old else {
            return Err(ApiError::not_found(&t.info.group, &t.info.plural, &name));
        };
        let Some(mut new) =
            lifecycle::prepare_update(&t.info, &t.version, old, obj, part, req.strict())?
        else {
            return Ok(None);
        };
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

/// Runs `f` on the live object under the store lock and stores its result
/// (`None`: unchanged). Answers with the stored object.
fn write_existing(
    store: &Store,
    t: &Target,
    name: &str,
    dry_run: bool,
    f: impl FnOnce(Option<&Value>) -> Result<Option<Value>, ApiError>,
) -> Result<(u16, Value), ApiError> {
    let ns = ns_of(t);
    let key = t.info.key();
    let mut st = store.lock();
    let old = st.get(&key, ns, name);
    let created = old.is_none();
    let view = old.as_deref().map(|o| convert::to_view(&t.info, o));
    let new = f(view.as_ref())?.map(|n| convert::to_storage(&t.info, n));
    let Some(new) = new else {
        let old = old.ok_or_else(|| ApiError::not_found(&t.info.group, &t.info.plural, name))?;
        return Ok((200, present(&t.info, &t.version, &old)));
    };
    if created {
        check_namespace(&st, &t.info, ns)?;
    }
    if dry_run {
        return Ok((
            if created { 201 } else { 200 },
            present(&t.info, &t.version, &new),
        ));
    }
    let gc = meta::is_deleting(&new);
    let stored = st.put(&key, ns, name, new);
    drop(st);
    store.wrote(gc);
    Ok((
        if created { 201 } else { 200 },
        present(&t.info, &t.version, &stored),
    ))
}

/// PATCH of the object or its status, in any supported patch format.
pub(crate) fn patch(
    store: &Store,
    t: &Target,
    req: &Request,
    part: Part,
) -> Result<(u16, Value), ApiError> {
    let name = name_of(t)?.to_string();
    let ns = ns_of(t).to_string();
    let ct = req
        .content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_string();
    let body = req.json_body()?;
    let manager = req.manager();
    let sub = if part == Part::Status { "status" } else { "" };
    let av = t.info.api_version(&t.version);
    let info = t.info.clone();
    if ct == "application/apply-patch+yaml" || ct == "application/apply-patch+json" {
        if req.q("fieldManager").is_none_or(str::is_empty) {
            return Err(ApiError::bad_request(
                "fieldManager is required for apply requests: add ?fieldManager=<your controller name>",
            ));
        }
        let force = req.q("force").is_some_and(|f| f == "true");
        let mut applied = body;
        lifecycle::check_identity(&info, &t.version, &mut applied, &ns, Some(&name))?;
        return write_existing(store, t, &name, req.dry_run(), |old| {
            if let Some(m) = applied.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("managedFields");
                m.remove("resourceVersion");
            }
            let applied_for_merge = if part == Part::Status {
                // Only the status of a status apply counts.
                let mut a = json!({"apiVersion": applied["apiVersion"], "kind": applied["kind"], "metadata": {"name": name}});
                if let Some(s) = applied.get("status") {
                    a["status"] = s.clone();
                }
                a
            } else {
                let mut a = applied.clone();
                if info.status
                    && let Some(o) = a.as_object_mut()
                {
                    o.remove("status");
                }
                a
            };
            match old {
                None => {
                    if part == Part::Status {
                        return Err(ApiError::not_found(&info.group, &info.plural, &name));
                    }
                    let mut o = ssa::apply(
                        None,
                        &applied_for_merge,
                        &manager,
                        force,
                        &av,
                        sub,
                        shape(&info, &t.version),
                    )?;
                    if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
                        m.insert("namespace".into(), json!(ns));
                        m.insert("name".into(), json!(name));
                    }
                    if info.namespaced {
                        meta_mut(&mut o).insert("namespace".into(), json!(ns));
                    } else {
                        meta_mut(&mut o).remove("namespace");
                    }
                    let mf = o.pointer("/metadata/managedFields").cloned();
                    lifecycle::prepare_create(&info, &t.version, &mut o, req.strict())?;
                    if let Some(mf) = mf {
                        meta_mut(&mut o).insert("managedFields".into(), mf);
                    }
                    Ok(Some(o))
                }
                Some(old) => {
                    let mut merged = ssa::apply(
                        Some(old),
                        &applied_for_merge,
                        &manager,
                        force,
                        &av,
                        sub,
                        shape(&info, &t.version),
                    )?;
                    // The lifecycle step judges the merged object like a PUT
                    // without a resourceVersion precondition.
                    meta_mut(&mut merged).remove("resourceVersion");
                    let mf = merged.pointer("/metadata/managedFields").cloned();
                    let new = lifecycle::prepare_update(
                        &info,
                        &t.version,
                        old,
                        merged,
                        part,
                        req.strict(),
                    )?;
                    Ok(new.map(|mut n| {
                        if let Some(mf) = mf {
                            meta_mut(&mut n).insert("managedFields".into(), mf);
                        }
                        n
                    }))
                }
            }
        });
    }
    write_existing(store, t, &name, req.dry_run(), |old| {
        let Some(old) = old else {
            return Err(ApiError::not_found(&info.group, &info.plural, &name));
        };
        let mut target = old.clone();
        match ct.as_str() {
            "application/merge-patch+json" => patch::merge_patch(&mut target, &body)?,
            "application/json-patch+json" => patch::json_patch(&mut target, &body)?,
            "application/strategic-merge-patch+json" => {
                if !info.builtin {
                    return Err(ApiError::unsupported_media(
                        "strategic merge patch is not supported for custom resources: use application/merge-patch+json or server-side apply",
                    ));
                }
                patch::strategic_merge(&mut target, &body)?
            }
            other => {
                return Err(ApiError::unsupported_media(format!(
                    "the patch content type {other:?} is not supported: use application/merge-patch+json, application/json-patch+json, application/strategic-merge-patch+json or application/apply-patch+yaml"
                )));
            }
        }
        // A patch's own resourceVersion, if any, is a precondition; none
        // means "the live one".
        let patched_rv = body
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .map(str::to_string);
        match patched_rv {
            Some(rv) => meta_mut(&mut target).insert("resourceVersion".into(), json!(rv)),
            None => meta_mut(&mut target).remove("resourceVersion"),
        };
        lifecycle::check_identity(&info, &t.version, &mut target, &ns, Some(&name))?;
        let Some(mut new) =
            lifecycle::prepare_update(&info, &t.version, old, target, part, req.strict())?
        else {
            return Ok(None);
        };
        track_update(old, &mut new, &manager, &av, sub, shape(&info, &t.version));
        Ok(Some(new))
    })
}

/// Records field ownership of a non-apply write, unless the client set
/// `managedFields` itself (then they are taken as given, as the real
/// server does; kubectl migrates client-side apply ownership this way).
fn track_update(
    old: &Value,
    new: &mut Value,
    manager: &str,
    api_version: &str,
    sub: &str,
    shape: Shape<'_>,
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

/// Delete options from the query and the body.
fn delete_opts(req: &Request) -> Result<DeleteOpts, ApiError> {
    let body: Value = if req.body.is_empty() {
        Value::Null
    } else if req.content_type.contains("protobuf") {
        proto::decode_delete_options(&req.body)?
    } else {
        serde_json::from_slice(&req.body).map_err(|e| {
            ApiError::bad_request(format!("DeleteOptions body is not valid JSON: {e}"))
        })?
    };
    let grace = match req.q("gracePeriodSeconds") {
        Some(g) => Some(g.parse::<i64>().map_err(|_| {
            ApiError::bad_request(format!("gracePeriodSeconds {g:?} is not an integer"))
        })?),
        None => body.get("gracePeriodSeconds").and_then(Value::as_i64),
    };
    let prop = req
        .q("propagationPolicy")
        .map(str::to_string)
        .or_else(|| {
            body.get("propagationPolicy")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .or_else(
            || match body.get("orphanDependents").and_then(Value::as_bool) {
                Some(true) => Some("Orphan".into()),
                Some(false) => Some("Background".into()),
                None => None,
            },
        );
    let propagation = prop.as_deref().map(Propagation::parse).transpose()?;
    Ok(DeleteOpts {
        grace,
        propagation,
        uid: body
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            .map(str::to_string),
        resource_version: body
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .map(str::to_string),
    })
}

/// DELETE of one object.
pub(crate) fn delete(store: &Store, t: &Target, req: &Request) -> Result<(u16, Value), ApiError> {
    let name = name_of(t)?.to_string();
    let opts = delete_opts(req)?;
    delete_one(
        store,
        &t.info,
        &t.version,
        ns_of(t),
        &name,
        &opts,
        req.dry_run(),
    )
}

/// Deletes one object (also used by the garbage collector).
pub(crate) fn delete_one(
    store: &Store,
    info: &ResourceInfo,
    version: &str,
    ns: &str,
    name: &str,
    opts: &DeleteOpts,
    dry_run: bool,
) -> Result<(u16, Value), ApiError> {
    let key = info.key();
    let mut st = store.lock();
    let obj = st
        .get(&key, ns, name)
        .ok_or_else(|| ApiError::not_found(&info.group, &info.plural, name))?;
    let step = lifecycle::delete_step(info, &obj, opts)?;
    if dry_run {
        return Ok((200, present(info, version, &obj)));
    }
    let out = match step {
        DeleteStep::Unchanged => (*obj).clone(),
        DeleteStep::Remove => st
            .remove(&key, ns, name)
            .map(|o| (*o).clone())
            .unwrap_or_else(|| (*obj).clone()),
        DeleteStep::Mark(o) => (*st.put(&key, ns, name, o)).clone(),
    };
    drop(st);
    store.wrote(true);
    Ok((200, present(info, version, &out)))
}

/// DELETE of a collection (with selectors).
pub(crate) fn delete_collection(
    store: &Store,
    t: &Target,
    req: &Request,
) -> Result<(u16, Value), ApiError> {
    let labels = req.label_selector()?;
    let fields = req.field_selector()?;
    let opts = delete_opts(req)?;
    let names: Vec<(String, String)> = {
        let st = store.lock();
        st.scan(&t.info.key(), t.ns.as_deref(), None)
            .filter(|(_, o)| labels.matches(o) && fields.matches(o))
            .map(|(k, _)| k.clone())
            .collect()
    };
    let mut items = Vec::new();
    for (ns, name) in names {
        match delete_one(store, &t.info, &t.version, &ns, &name, &opts, req.dry_run()) {
            Ok((_, o)) => items.push(o),
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    if items.is_empty() {
        return Ok((200, success_status()));
    }
    Ok((
        200,
        json!({"kind": format!("{}List", t.info.kind), "apiVersion": t.info.api_version(&t.version), "metadata": {}, "items": items}),
    ))
}

/// POST `pods/{name}/binding`: assigns the pod to a node.
pub(crate) fn bind(store: &Store, t: &Target, req: &Request) -> Result<(u16, Value), ApiError> {
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

/// PUT `namespaces/{name}/finalize`: replaces `spec.finalizers`.
pub(crate) fn finalize_namespace(
    store: &Store,
    t: &Target,
    req: &Request,
) -> Result<(u16, Value), ApiError> {
    let name = name_of(t)?.to_string();
    let body = req.json_body()?;
    let fins = body
        .pointer("/spec/finalizers")
        .cloned()
        .unwrap_or(json!([]));
    if !fins.is_array() {
        return Err(ApiError::invalid(
            "Namespace",
            &name,
            vec![(
                "spec.finalizers".into(),
                "Invalid value: must be a list".into(),
            )],
        ));
    }
    let r = write_existing(store, t, &name, req.dry_run(), |old| {
        let Some(old) = old else {
            return Err(ApiError::not_found("", "namespaces", &name));
        };
        let mut new = old.clone();
        meta::set_path(&mut new, &["spec", "finalizers"], fins);
        Ok(if new == *old { None } else { Some(new) })
    });
    store.wrote(true);
    r
}
