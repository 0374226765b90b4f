//! Owns PATCH: JSON merge, JSON patch, strategic merge (built-in types)
//! and server-side apply, for the main resource and its status.

use serde_json::{Value, json};

use super::{Request, ephemeral_admission, name_of, ns_of, shape, track_update, write_existing};
use crate::apiserver::lifecycle::{self, Part};
use crate::apiserver::meta::meta_mut;
use crate::apiserver::patch as formats;
use crate::apiserver::podsecurity;
use crate::apiserver::route::RouteTarget;
use crate::apiserver::serviceaccount;
use crate::apiserver::ssa;
use crate::apiserver::status::ApiError;
use crate::apiserver::store::Store;
use crate::apiserver::times;

/// PATCH of the object or its status, in any supported patch format.
pub(crate) fn patch(
    store: &Store,
    t: &RouteTarget,
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
    let apply = ct == "application/apply-patch+yaml" || ct == "application/apply-patch+json";
    if apply && req.q("fieldManager").is_none_or(str::is_empty) {
        // As kube-apiserver: the client must name itself (kubectl
        // sends `fieldManager=kubectl`).
        return Err(ApiError::invalid_options(
            "PatchOptions",
            "fieldManager",
            "FieldValueRequired",
            "Required value: is required for apply patch",
        ));
    }
    if !apply && req.q("force").is_some() {
        return Err(ApiError::invalid_options(
            "PatchOptions",
            "force",
            "FieldValueForbidden",
            "Forbidden: may not be specified for non-apply patch",
        ));
    }
    let body = req.json_body()?;
    let manager = req.manager();
    let sub = part.subresource();
    let av = t.info.api_version(&t.version);
    let info = t.info.clone();
    let admission = ephemeral_admission(store, &ns, part);
    if apply {
        let force = req.q("force").is_some_and(|f| f == "true");
        let mut applied = body;
        times::check_patched(&info, &mut applied)?;
        lifecycle::check_identity(&info, &t.version, &mut applied, &ns, Some(&name))?;
        // ServiceAccount admission, should the apply create a pod (read
        // before `write_existing` takes the store lock).
        let is_pod = info.builtin && info.group.is_empty() && info.plural == "pods";
        let automount = is_pod.then(|| serviceaccount::lookup(store, &ns, &applied));
        let security = podsecurity::Policy::lookup(store, &ns);
        let mut warnings = Vec::new();
        let reply = write_existing(store, t, &name, req.dry_run(), |old| {
            if let Some(m) = applied.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("managedFields");
                m.remove("resourceVersion");
            }
            let applied_for_merge = if matches!(part, Part::Status | Part::Approval) {
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
                    if matches!(part, Part::Status | Part::Approval) {
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
                    if crate::apiserver::certs::is_csr(&info) {
                        crate::apiserver::certs::set_requester(&mut o, &req.user);
                    }
                    if let Some(automount) = automount {
                        serviceaccount::admit_pod(&mut o, automount?);
                        warnings = security.admit_pod(&o)?;
                    }
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
                    if let (Some(a), Some(n)) = (&admission, &new) {
                        warnings = a.admit_pod(n)?;
                    }
                    Ok(new.map(|mut n| {
                        if let Some(mf) = mf {
                            meta_mut(&mut n).insert("managedFields".into(), mf);
                        }
                        n
                    }))
                }
            }
        });
        if reply.is_ok() {
            req.warn(warnings);
        }
        return reply;
    }
    write_existing(store, t, &name, req.dry_run(), |old| {
        let Some(old) = old else {
            return Err(ApiError::not_found(&info.group, &info.plural, &name));
        };
        let mut target = old.clone();
        match ct.as_str() {
            "application/merge-patch+json" => formats::merge_patch(&mut target, &body)?,
            "application/json-patch+json" => formats::json_patch(&mut target, &body)?,
            "application/strategic-merge-patch+json" => {
                if !info.builtin {
                    return Err(ApiError::unsupported_media(
                        "strategic merge patch is not supported for custom resources: use application/merge-patch+json or server-side apply",
                    ));
                }
                formats::strategic_merge(&mut target, &body)?
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
        times::check_patched(&info, &mut target)?;
        lifecycle::check_identity(&info, &t.version, &mut target, &ns, Some(&name))?;
        let Some(mut new) =
            lifecycle::prepare_update(&info, &t.version, old, target, part, req.strict())?
        else {
            return Ok(None);
        };
        if let Some(a) = &admission {
            req.warn(a.admit_pod(&new)?);
        }
        track_update(old, &mut new, &manager, &av, sub, shape(&info, &t.version));
        Ok(Some(new))
    })
}
