//! Owns what the server does to an object on each write, independent of
//! the wire: create (names, uid, timestamps, defaults), update (resource
//! version preconditions, status subresource split, generation), and the
//! first step of delete (grace periods, finalizers, propagation).
//!
//! Invariants:
//! 1. `metadata.generation` starts at 1 and bumps only when something
//!    outside `metadata` and `status` changes (for resources without a
//!    status subresource, outside `metadata`).
//! 2. Writes to the main resource never change `status` of a resource
//!    with a status subresource; writes to `/status` change only `status`.
//! 3. Server-owned metadata (uid, creationTimestamp, deletionTimestamp,
//!    generation) never comes from the client.
//! 4. No finalizer can be added to an object that is being deleted.

use serde_json::{Value, json};

use super::certs;
use super::defaults;
use super::ephemeral;
use super::meta::{self, is_deleting, meta_mut};
use super::registry::ResourceInfo;
use super::schema;
use super::status::ApiError;

/// Which part of an object a write targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Part {
    Main,
    Status,
    /// `pods/ephemeralcontainers`: only `spec.ephemeralContainers`.
    Ephemeral,
    /// `certificatesigningrequests/approval`: only `status.conditions`.
    Approval,
}

impl Part {
    /// The subresource a write to this part goes through (managedFields
    /// record it).
    pub(crate) fn subresource(self) -> &'static str {
        match self {
            Part::Main => "",
            Part::Status => "status",
            Part::Ephemeral => "ephemeralcontainers",
            Part::Approval => "approval",
        }
    }
}

/// Checks `apiVersion`, `kind`, name and namespace of a client object
/// against the request, filling in what is missing.
pub(crate) fn check_identity(
    info: &ResourceInfo,
    version: &str,
    obj: &mut Value,
    ns: &str,
    url_name: Option<&str>,
) -> Result<(), ApiError> {
    if !obj.is_object() {
        return Err(ApiError::bad_request(format!(
            "the body must be a {} object",
            info.kind
        )));
    }
    let av = info.api_version(version);
    match obj.get("apiVersion").and_then(Value::as_str) {
        None | Some("") => obj["apiVersion"] = json!(av),
        Some(a) if a == av || info.versions.iter().any(|v| info.api_version(v) == a) => {
            obj["apiVersion"] = json!(av)
        }
        Some(a) => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({a}) does not match the expected API version ({av})"
            )));
        }
    }
    match obj.get("kind").and_then(Value::as_str) {
        None | Some("") => obj["kind"] = json!(info.kind),
        Some(k) if k == info.kind => {}
        Some(k) => {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind ({}) for this URL",
                info.kind
            )));
        }
    }
    let m = meta_mut(obj);
    if info.namespaced {
        match m.get("namespace").and_then(Value::as_str) {
            None | Some("") => {
                m.insert("namespace".into(), json!(ns));
            }
            Some(n) if n == ns => {}
            Some(_) => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
        }
    } else {
        m.remove("namespace");
    }
    if let Some(url_name) = url_name {
        match m.get("name").and_then(Value::as_str) {
            None | Some("") => {
                m.insert("name".into(), json!(url_name));
            }
            Some(n) if n == url_name => {}
            Some(n) => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({url_name})"
                )));
            }
        }
    }
    Ok(())
}

/// Prepares a new object (after `check_identity`); `strict` makes unknown
/// fields of a custom resource an error instead of pruning them. The name is final
/// unless it is generated; the caller retries generated names on clash.
pub(crate) fn prepare_create(
    info: &ResourceInfo,
    version: &str,
    obj: &mut Value,
    strict: bool,
) -> Result<(), ApiError> {
    let kind = info.group_kind();
    let m = meta_mut(obj);
    let name = m
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let name = if name.is_empty() {
        match m.get("generateName").and_then(Value::as_str) {
            Some(g) if !g.is_empty() => {
                let n = format!("{}{}", truncate(g, 58), meta::name_suffix());
                m.insert("name".into(), json!(n));
                n
            }
            _ => {
                return Err(ApiError::invalid(
                    &kind,
                    "",
                    vec![(
                        "metadata.name".into(),
                        "Required value: name or generateName is required".into(),
                    )],
                ));
            }
        }
    } else {
        name
    };
    meta::check_name(&name)
        .map_err(|e| ApiError::invalid(&kind, &name, vec![("metadata.name".into(), e)]))?;
    for f in [
        "resourceVersion",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "selfLink",
    ] {
        m.remove(f);
    }
    m.insert("uid".into(), json!(meta::new_uid()));
    m.insert("creationTimestamp".into(), json!(meta::now()));
    m.insert("generation".into(), json!(1));
    if info.status
        && !(info.builtin && info.group.is_empty() && info.plural == "nodes")
        && let Some(o) = obj.as_object_mut()
    {
        o.remove("status");
    }
    if info.builtin && info.group.is_empty() && info.plural == "pods" {
        let causes = ephemeral::check_create(obj);
        if !causes.is_empty() {
            return Err(ApiError::invalid(&kind, &name, causes));
        }
    }
    if certs::is_csr(info) {
        let causes = certs::validate_spec(obj);
        if !causes.is_empty() {
            return Err(ApiError::invalid(&kind, &name, causes));
        }
    }
    defaults::on_create(info, obj);
    admit(info, version, obj, strict)
}

/// Validation and defaulting common to create and update.
fn admit(
    info: &ResourceInfo,
    version: &str,
    obj: &mut Value,
    strict: bool,
) -> Result<(), ApiError> {
    check_metadata(info, obj)?;
    if !info.builtin {
        schema::validate_and_default(info, version, obj, strict)?;
    } else {
        defaults::validate_builtin(info, obj)?;
    }
    Ok(())
}

fn check_metadata(info: &ResourceInfo, obj: &Value) -> Result<(), ApiError> {
    let name = meta::name(obj).to_string();
    let mut causes = Vec::new();
    for f in ["labels", "annotations"] {
        if let Some(v) = obj.pointer(&format!("/metadata/{f}")) {
            match v.as_object() {
                Some(m) => {
                    for (k, val) in m {
                        if !val.is_string() {
                            causes.push((
                                format!("metadata.{f}.{k}"),
                                "Invalid value: values must be strings".into(),
                            ));
                        }
                        if f == "labels"
                            && let Some(s) = val.as_str()
                            && s.len() > 63
                        {
                            causes.push((
                                format!("metadata.labels.{k}"),
                                "Invalid value: must be no more than 63 characters".into(),
                            ));
                        }
                    }
                }
                None if v.is_null() => {}
                None => causes.push((
                    format!("metadata.{f}"),
                    "Invalid value: must be a map of strings".into(),
                )),
            }
        }
    }
    if let Some(v) = obj.pointer("/metadata/finalizers")
        && !v.is_null()
        && !v.as_array().is_some_and(|a| a.iter().all(Value::is_string))
    {
        causes.push((
            "metadata.finalizers".into(),
            "Invalid value: must be a list of strings".into(),
        ));
    }
    if let Some(v) = obj
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
    {
        for (i, r) in v.iter().enumerate() {
            for f in ["apiVersion", "kind", "name", "uid"] {
                if r.get(f).and_then(Value::as_str).is_none_or(str::is_empty) {
                    causes.push((
                        format!("metadata.ownerReferences[{i}].{f}"),
                        "Required value".into(),
                    ));
                }
            }
        }
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(&info.group_kind(), &name, causes))
    }
}

fn truncate(s: &str, n: usize) -> &str {
    match s.char_indices().nth(n) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// Builds the object an update stores from the live object and the
/// client's object (invariants 1-4). Returns `None` when nothing changes.
pub(crate) fn prepare_update(
    info: &ResourceInfo,
    version: &str,
    old: &Value,
    mut new: Value,
    part: Part,
    strict: bool,
) -> Result<Option<Value>, ApiError> {
    let name = meta::name(old).to_string();
    if let Some(rv) = new
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        && !rv.is_empty()
        && Some(rv) != meta::meta_str(old, "resourceVersion")
    {
        return Err(conflict(info, &name));
    }
    if let Some(uid) = new.pointer("/metadata/uid").and_then(Value::as_str)
        && !uid.is_empty()
        && Some(uid) != meta::meta_str(old, "uid")
    {
        return Err(ApiError::conflict_on(
            &info.group,
            &info.plural,
            &name,
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                qualified(info),
                meta::meta_str(old, "uid").unwrap_or("")
            ),
        ));
    }
    match part {
        Part::Ephemeral => {
            // Everything but the ephemeral containers stays as stored.
            new = ephemeral::merge(old, &new);
            if let Some(spec) = new.get_mut("spec") {
                ephemeral::default(spec);
            }
            let causes = ephemeral::check_update(old, &new);
            if !causes.is_empty() {
                return Err(ApiError::invalid(&info.group_kind(), &name, causes));
            }
        }
        Part::Status | Part::Approval => {
            // Only status changes; metadata and spec stay as stored.
            let status = new.get("status").cloned();
            new = old.clone();
            match status {
                Some(s) => new["status"] = s,
                None => {
                    if let Some(o) = new.as_object_mut() {
                        o.remove("status");
                    }
                }
            }
        }
        Part::Main => {
            if info.status {
                match old.get("status") {
                    Some(s) => new["status"] = s.clone(),
                    None => {
                        if let Some(o) = new.as_object_mut() {
                            o.remove("status");
                        }
                    }
                }
            }
            let om = old.get("metadata").cloned().unwrap_or(json!({}));
            let m = meta_mut(&mut new);
            for f in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
                "name",
                "namespace",
            ] {
                match om.get(f) {
                    Some(v) => m.insert(f.into(), v.clone()),
                    None => m.remove(f),
                };
            }
            m.remove("selfLink");
            if is_deleting(old) {
                let before = meta::finalizers(old);
                let added: Vec<String> = meta::finalizers(&new)
                    .into_iter()
                    .filter(|f| !before.contains(f))
                    .collect();
                if !added.is_empty() {
                    return Err(ApiError::forbidden_on(
                        &info.group,
                        &info.plural,
                        &name,
                        &format!(
                            "no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"
                        ),
                    ));
                }
            }
            defaults::on_update(info, old, &mut new);
            defaults::check_update(info, old, &new)?;
        }
    }
    if certs::is_csr(info) {
        certs::prepare_update(old, &mut new, part)
            .map_err(|c| ApiError::invalid(&info.group_kind(), &name, c))?;
    }
    admit(info, version, &mut new, strict)?;
    if !info.builtin && part == Part::Main {
        super::transition::check_update(info, version, old, &new)?;
    }
    // The resourceVersion is assigned by the store.
    meta_mut(&mut new).insert(
        "resourceVersion".into(),
        old["metadata"]["resourceVersion"].clone(),
    );
    if same_ignoring_managed_time(old, &new) {
        return Ok(None);
    }
    if spec_changed(info, old, &new) {
        let g = old
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        meta_mut(&mut new).insert("generation".into(), json!(g + 1));
    }
    Ok(Some(new))
}

/// The 409 for a stale resourceVersion.
pub(crate) fn conflict(info: &ResourceInfo, name: &str) -> ApiError {
    ApiError::conflict_on(
        &info.group,
        &info.plural,
        name,
        format!(
            "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
            qualified(info)
        ),
    )
}

/// `plural` or `plural.group`, as messages name a resource.
fn qualified(info: &ResourceInfo) -> String {
    if info.group.is_empty() {
        info.plural.clone()
    } else {
        format!("{}.{}", info.plural, info.group)
    }
}

/// Whether anything outside metadata (and status, when it is a
/// subresource) differs.
pub(crate) fn spec_changed(info: &ResourceInfo, old: &Value, new: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(o) = v.as_object_mut() {
            o.remove("metadata");
            if info.status {
                o.remove("status");
            }
        }
        v
    };
    strip(old) != strip(new)
}

/// Equality that ignores the timestamps inside managedFields.
pub(crate) fn same_ignoring_managed_time(a: &Value, b: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(mf) = v
            .pointer_mut("/metadata/managedFields")
            .and_then(Value::as_array_mut)
        {
            for e in mf {
                if let Some(o) = e.as_object_mut() {
                    o.remove("time");
                }
            }
        }
        v
    };
    strip(a) == strip(b)
}

/// How dependents of a deleted object are treated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Propagation {
    Background,
    Foreground,
    Orphan,
}

impl Propagation {
    /// Parses `propagationPolicy`.
    pub(crate) fn parse(s: &str) -> Result<Self, ApiError> {
        match s {
            "Background" => Ok(Self::Background),
            "Foreground" => Ok(Self::Foreground),
            "Orphan" => Ok(Self::Orphan),
            other => Err(ApiError::bad_request(format!(
                "propagationPolicy {other:?} is not supported: use Background, Foreground or Orphan"
            ))),
        }
    }
}

/// Options of one delete.
#[derive(Clone, Debug, Default)]
pub(crate) struct DeleteOpts {
    pub(crate) grace: Option<i64>,
    pub(crate) propagation: Option<Propagation>,
    pub(crate) uid: Option<String>,
    pub(crate) resource_version: Option<String>,
}

/// What a delete does to the stored object.
pub(crate) enum DeleteStep {
    /// Remove it now.
    Remove,
    /// Keep it, marked for deletion (finalizers or grace period pending).
    Mark(Value),
    /// Already marked; nothing changes.
    Unchanged,
}

/// Decides the first step of deleting `obj`.
pub(crate) fn delete_step(
    info: &ResourceInfo,
    obj: &Value,
    opts: &DeleteOpts,
) -> Result<DeleteStep, ApiError> {
    let name = meta::name(obj).to_string();
    if let Some(uid) = &opts.uid
        && Some(uid.as_str()) != meta::meta_str(obj, "uid")
    {
        // The real server names the kind here, not the resource.
        let kind = info.group_kind();
        return Err(ApiError::conflict_on(
            &info.group,
            &info.kind,
            &name,
            format!(
                "Operation cannot be fulfilled on {kind} \"{name}\": the UID in the precondition ({uid}) does not match the UID in record ({}). The object might have been deleted and then recreated",
                meta::meta_str(obj, "uid").unwrap_or("")
            ),
        ));
    }
    if let Some(rv) = &opts.resource_version
        && Some(rv.as_str()) != meta::meta_str(obj, "resourceVersion")
    {
        return Err(conflict(info, &name));
    }
    let is_pod = info.builtin && info.group.is_empty() && info.plural == "pods";
    let is_ns = info.builtin && info.group.is_empty() && info.plural == "namespaces";
    if is_ns && matches!(name.as_str(), "default" | "kube-system" | "kube-public") {
        return Err(ApiError::forbidden_on(
            "",
            "namespaces",
            &name,
            "this namespace may not be deleted",
        ));
    }
    let mut grace = 0;
    if is_pod {
        let terminal = matches!(
            obj.pointer("/status/phase").and_then(Value::as_str),
            Some("Succeeded" | "Failed")
        );
        let scheduled = obj
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .is_some_and(|n| !n.is_empty());
        grace = opts
            .grace
            .or_else(|| {
                obj.pointer("/spec/terminationGracePeriodSeconds")
                    .and_then(Value::as_i64)
            })
            .unwrap_or(30)
            // Ten years is "forever"; larger values would overflow time math.
            .clamp(0, 315_360_000);
        if terminal || !scheduled {
            grace = 0;
        }
    }
    let mut fin = meta::finalizers(obj);
    if is_deleting(obj) {
        // A second delete may shorten a pending grace period.
        let pending = obj
            .pointer("/metadata/deletionGracePeriodSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        if is_pod && pending > 0 && grace < pending {
            let mut o = obj.clone();
            let m = meta_mut(&mut o);
            m.insert("deletionGracePeriodSeconds".into(), json!(grace));
            m.insert("deletionTimestamp".into(), json!(meta::in_secs(grace)));
            return Ok(if grace == 0 && fin.is_empty() {
                DeleteStep::Remove
            } else {
                DeleteStep::Mark(o)
            });
        }
        return Ok(DeleteStep::Unchanged);
    }
    match opts.propagation {
        Some(Propagation::Foreground) => push_unique(&mut fin, "foregroundDeletion"),
        Some(Propagation::Orphan) => push_unique(&mut fin, "orphan"),
        _ => {}
    }
    if fin.is_empty() && grace == 0 && !is_ns {
        return Ok(DeleteStep::Remove);
    }
    let mut o = obj.clone();
    meta::set_finalizers(&mut o, &fin);
    let m = meta_mut(&mut o);
    m.insert("deletionTimestamp".into(), json!(meta::in_secs(grace)));
    m.insert("deletionGracePeriodSeconds".into(), json!(grace));
    let g = m.get("generation").and_then(Value::as_i64).unwrap_or(0);
    m.insert("generation".into(), json!(g + 1));
    if is_ns {
        o["status"] = json!({"phase": "Terminating"});
    }
    Ok(DeleteStep::Mark(o))
}

fn push_unique(v: &mut Vec<String>, s: &str) {
    if !v.iter().any(|x| x == s) {
        v.push(s.to_string());
    }
}
