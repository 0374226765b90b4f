//! Owns DELETE of one object or a collection (options from the query or a
//! JSON/protobuf `DeleteOptions` body) and `namespaces/{name}/finalize`.

use serde_json::{Value, json};

use super::{Request, name_of, ns_of, present, write_existing};
use crate::apiserver::lifecycle::{self, DeleteOpts, DeleteStep, Propagation};
use crate::apiserver::meta;
use crate::apiserver::proto;
use crate::apiserver::registry::ResourceInfo;
use crate::apiserver::route::RouteTarget;
use crate::apiserver::status::{ApiError, success_status};
use crate::apiserver::store::Store;

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
pub(crate) fn delete(
    store: &Store,
    t: &RouteTarget,
    req: &Request,
) -> Result<(u16, Value), ApiError> {
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
    t: &RouteTarget,
    req: &Request,
) -> Result<(u16, Value), ApiError> {
    let labels = req.label_selector()?;
    let fields = req.field_selector(&t.info)?;
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

/// PUT `namespaces/{name}/finalize`: replaces `spec.finalizers`.
pub(crate) fn finalize_namespace(
    store: &Store,
    t: &RouteTarget,
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
