//! Owns server-side apply and `managedFields`: which field manager owns
//! which fields, the merge of an applied configuration into the live
//! object, conflicts, `force`, and removal of fields a manager stopped
//! applying.
//!
//! Invariants:
//! 1. A field set is a set of paths; a path is a list of elements written
//!    as in `fieldsV1`: `f:<name>`, `k:<json key>` (keyed list item),
//!    `v:<json value>` (set item). Item paths stand for the whole item.
//! 2. Apply by manager M of config C: conflicts are the leaves of C whose
//!    live value differs from C's and that another manager owns; with
//!    force they are taken from their owners. Fields M applied before and
//!    no longer applies are removed unless another manager owns them.
//! 3. A non-apply write by M makes M the owner of every leaf it changed and
//!    takes those leaves from other managers.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use super::lists::{ListKind, child_schema, has_key, item_key, item_schema, list_kind};
use super::meta::now;
use super::status::ApiError;

/// A path in an object (invariant 1).
pub(crate) type Path = Vec<String>;

/// Context for walking an object: built-in merge keys or a CRD schema.
#[derive(Clone, Copy)]
pub(crate) struct FieldShape<'a> {
    pub(crate) builtin: bool,
    pub(crate) schema: Option<&'a Value>,
}

const SKIP_TOP: &[&str] = &["apiVersion", "kind"];
const META_TRACKED: &[&str] = &["labels", "annotations", "finalizers", "ownerReferences"];

/// The leaf and item paths of `obj`.
pub(crate) fn fields_of(obj: &Value, shape: FieldShape<'_>) -> BTreeSet<Path> {
    let mut out = BTreeSet::new();
    if let Some(m) = obj.as_object() {
        for (k, v) in m {
            if SKIP_TOP.contains(&k.as_str()) {
                continue;
            }
            if k == "metadata" {
                let Some(mm) = v.as_object() else { continue };
                for (mk, mv) in mm {
                    if META_TRACKED.contains(&mk.as_str()) {
                        walk(
                            mv,
                            mk,
                            vec!["f:metadata".into(), format!("f:{mk}")],
                            shape.builtin,
                            None,
                            &mut out,
                        );
                    }
                }
                continue;
            }
            walk(
                v,
                k,
                vec![format!("f:{k}")],
                shape.builtin,
                child_schema(shape.schema, k),
                &mut out,
            );
        }
    }
    out
}

fn walk(
    v: &Value,
    field: &str,
    path: Path,
    builtin: bool,
    schema: Option<&Value>,
    out: &mut BTreeSet<Path>,
) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, c) in m {
                let mut p = path.clone();
                p.push(format!("f:{k}"));
                walk(c, k, p, builtin, child_schema(schema, k), out);
            }
        }
        Value::Array(items) => match list_kind(builtin, field, schema, items) {
            ListKind::Atomic => {
                out.insert(path);
            }
            ListKind::Set => {
                for i in items {
                    let mut p = path.clone();
                    p.push(format!("v:{i}"));
                    out.insert(p);
                }
            }
            ListKind::Map(keys) => {
                for i in items {
                    let Some(key) = item_key(i, &keys) else {
                        continue;
                    };
                    let mut p = path.clone();
                    p.push(format!("k:{}", Value::Object(key)));
                    out.insert(p.clone());
                    if let Some(m) = i.as_object() {
                        for (k, c) in m {
                            let mut cp = p.clone();
                            cp.push(format!("f:{k}"));
                            walk(c, k, cp, builtin, child_schema(item_schema(schema), k), out);
                        }
                    }
                }
            }
        },
        _ => {
            out.insert(path);
        }
    }
}

/// Renders a field set as `fieldsV1`.
pub(crate) fn to_fields_v1(set: &BTreeSet<Path>) -> Value {
    let mut root = Map::new();
    for path in set {
        let mut node = &mut root;
        for (i, el) in path.iter().enumerate() {
            let entry = node
                .entry(el.clone())
                .or_insert_with(|| Value::Object(Map::new()));
            let m = entry.as_object_mut().expect("fieldsV1 nodes are objects");
            if i == path.len() - 1 && el.starts_with("k:") {
                m.insert(".".into(), json!({}));
            }
            node = m;
        }
    }
    Value::Object(root)
}

/// Parses `fieldsV1` back into a field set.
pub(crate) fn from_fields_v1(v: &Value) -> BTreeSet<Path> {
    fn go(v: &Value, path: &mut Path, out: &mut BTreeSet<Path>) {
        let Some(m) = v.as_object() else { return };
        let children: Vec<_> = m.iter().filter(|(k, _)| k.as_str() != ".").collect();
        if (children.is_empty() || m.contains_key(".")) && !path.is_empty() {
            out.insert(path.clone());
        }
        for (k, c) in children {
            path.push(k.clone());
            go(c, path, out);
            path.pop();
        }
    }
    let mut out = BTreeSet::new();
    go(v, &mut Vec::new(), &mut out);
    out
}

fn step<'a>(v: &'a Value, el: &str) -> Option<&'a Value> {
    if let Some(f) = el.strip_prefix("f:") {
        v.get(f)
    } else if let Some(k) = el.strip_prefix("k:") {
        let key: Map<String, Value> = serde_json::from_str(k).ok()?;
        v.as_array()?.iter().find(|i| has_key(i, &key))
    } else if let Some(x) = el.strip_prefix("v:") {
        let x: Value = serde_json::from_str(x).ok()?;
        v.as_array()?.iter().find(|i| **i == x)
    } else {
        None
    }
}

/// The value at `path`.
pub(crate) fn get_path<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(v, |cur, el| step(cur, el))
}

/// Removes the value at `path` (and empties its parents no further).
pub(crate) fn remove_path(v: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = v;
    for el in parents {
        let next = if let Some(f) = el.strip_prefix("f:") {
            cur.get_mut(f)
        } else if let Some(k) = el.strip_prefix("k:") {
            let Ok(key) = serde_json::from_str::<Map<String, Value>>(k) else {
                return;
            };
            cur.as_array_mut()
                .and_then(|a| a.iter_mut().find(|i| has_key(i, &key)))
        } else {
            None
        };
        match next {
            Some(n) => cur = n,
            None => return,
        }
    }
    if let Some(f) = last.strip_prefix("f:") {
        if let Some(m) = cur.as_object_mut() {
            m.remove(f);
        }
    } else if let Some(k) = last.strip_prefix("k:") {
        if let (Ok(key), Some(a)) = (
            serde_json::from_str::<Map<String, Value>>(k),
            cur.as_array_mut(),
        ) {
            a.retain(|i| !has_key(i, &key));
        }
    } else if let Some(x) = last.strip_prefix("v:")
        && let (Ok(x), Some(a)) = (serde_json::from_str::<Value>(x), cur.as_array_mut())
    {
        a.retain(|i| *i != x);
    }
}

/// Merges an applied configuration into the live object (maps deep, keyed
/// lists by key, sets by union, atomic lists replaced).
pub(crate) fn merge_applied(live: &mut Value, applied: &Value, shape: FieldShape<'_>) {
    merge_value(live, applied, "", shape.builtin, shape.schema);
}

fn merge_value(
    live: &mut Value,
    applied: &Value,
    field: &str,
    builtin: bool,
    schema: Option<&Value>,
) {
    match applied {
        Value::Object(am) => {
            if !live.is_object() {
                *live = Value::Object(Map::new());
            }
            let lm = live.as_object_mut().expect("made an object above");
            for (k, v) in am {
                if v.is_null() {
                    // Applying null means "I have no opinion": keep the live value.
                    continue;
                }
                let e = lm.entry(k.clone()).or_insert(Value::Null);
                merge_value(e, v, k, builtin, child_schema(schema, k));
            }
        }
        Value::Array(items) => {
            let live_items = live.as_array().cloned().unwrap_or_default();
            let mut all = live_items.clone();
            all.extend(items.iter().cloned());
            match list_kind(builtin, field, schema, &all) {
                ListKind::Atomic => *live = applied.clone(),
                ListKind::Set => {
                    let mut out = live_items;
                    for i in items {
                        if !out.contains(i) {
                            out.push(i.clone());
                        }
                    }
                    *live = Value::Array(out);
                }
                ListKind::Map(keys) => {
                    let mut out = live_items;
                    for i in items {
                        match item_key(i, &keys)
                            .and_then(|k| out.iter().position(|o| has_key(o, &k)))
                        {
                            Some(pos) => {
                                merge_value(&mut out[pos], i, "", builtin, item_schema(schema))
                            }
                            None => out.push(i.clone()),
                        }
                    }
                    *live = Value::Array(out);
                }
            }
        }
        _ => *live = applied.clone(),
    }
}

/// One `managedFields` entry.
#[derive(Clone, Debug)]
pub(crate) struct ManagedEntry {
    pub(crate) manager: String,
    pub(crate) operation: String,
    pub(crate) api_version: String,
    pub(crate) subresource: String,
    pub(crate) time: String,
    pub(crate) fields: BTreeSet<Path>,
}

/// Reads `metadata.managedFields`.
pub(crate) fn read_entries(obj: &Value) -> Vec<ManagedEntry> {
    let s = |e: &Value, k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    obj.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|e| ManagedEntry {
                    manager: s(e, "manager"),
                    operation: s(e, "operation"),
                    api_version: s(e, "apiVersion"),
                    subresource: s(e, "subresource"),
                    time: s(e, "time"),
                    fields: e.get("fieldsV1").map(from_fields_v1).unwrap_or_default(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Writes `metadata.managedFields` (dropping entries that own nothing).
pub(crate) fn write_entries(obj: &mut Value, entries: &[ManagedEntry]) {
    let list: Vec<Value> = entries
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            let mut v = json!({
                "manager": e.manager,
                "operation": e.operation,
                "apiVersion": e.api_version,
                "time": e.time,
                "fieldsType": "FieldsV1",
                "fieldsV1": to_fields_v1(&e.fields),
            });
            if !e.subresource.is_empty() {
                v["subresource"] = json!(e.subresource);
            }
            v
        })
        .collect();
    let meta = super::meta::meta_mut(obj);
    if list.is_empty() {
        meta.remove("managedFields");
    } else {
        meta.insert("managedFields".into(), Value::Array(list));
    }
}

/// Whether `p` is `owner` or below it.
fn covers(owner: &Path, p: &Path) -> bool {
    p.starts_with(owner)
}

/// Server-side apply of `applied` by `manager` onto `live` (None: create).
/// Returns the new object with its managedFields.
pub(crate) fn apply(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    api_version: &str,
    subresource: &str,
    shape: FieldShape<'_>,
) -> Result<Value, ApiError> {
    let mut entries = live.map(read_entries).unwrap_or_default();
    let new_set = fields_of(applied, shape);
    let live_v = live.cloned().unwrap_or(Value::Null);
    let is_me = |e: &ManagedEntry| {
        e.manager == manager && e.operation == "Apply" && e.subresource == subresource
    };

    let mut conflicts = Vec::new();
    for e in entries.iter_mut().filter(|e| !is_me(e)) {
        let mut taken = Vec::new();
        for p in &new_set {
            // Keyed items are co-owned; only their leaves can conflict.
            if p.last().is_some_and(|el| el.starts_with("k:")) || !e.fields.contains(p) {
                continue;
            }
            if get_path(&live_v, p) != get_path(applied, p) {
                if force {
                    taken.push(p.clone());
                } else {
                    conflicts.push(format!(
                        "conflict with \"{}\" using {}: {}",
                        e.manager,
                        e.api_version,
                        display(p)
                    ));
                }
            }
        }
        for t in taken {
            e.fields.remove(&t);
        }
    }
    if !conflicts.is_empty() {
        conflicts.sort();
        conflicts.dedup();
        return Err(ApiError::conflict(format!(
            "Apply failed with {} conflict{}: {}. Re-apply with force (kubectl --force-conflicts, kube-rs PatchParams::force()) to take ownership, or drop these fields from your configuration",
            conflicts.len(),
            if conflicts.len() == 1 { "" } else { "s" },
            conflicts.join("; ")
        )));
    }

    let prev: BTreeSet<Path> = entries
        .iter()
        .filter(|e| is_me(e))
        .flat_map(|e| e.fields.iter().cloned())
        .collect();
    let mut obj = live_v.clone();
    merge_applied(&mut obj, applied, shape);
    for p in prev.difference(&new_set) {
        // Owning a map does not own its entries: only the same path or a
        // path below it keeps a field alive.
        let still_applied = new_set.iter().any(|n| covers(p, n));
        let owned_by_other = entries
            .iter()
            .filter(|e| !is_me(e))
            .any(|e| e.fields.iter().any(|o| covers(p, o)));
        if !still_applied && !owned_by_other {
            remove_path(&mut obj, p);
        }
    }
    entries.retain(|e| !is_me(e));
    entries.push(ManagedEntry {
        manager: manager.to_string(),
        operation: "Apply".into(),
        api_version: api_version.to_string(),
        subresource: subresource.to_string(),
        time: now(),
        fields: new_set,
    });
    write_entries(&mut obj, &entries);
    Ok(obj)
}

/// Records a non-apply write by `manager` (invariant 3).
pub(crate) fn record_update(
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    api_version: &str,
    subresource: &str,
    shape: FieldShape<'_>,
) {
    let mut entries = old.map(read_entries).unwrap_or_default();
    let new_fields = fields_of(new, shape);
    let changed: BTreeSet<Path> = match old {
        None => new_fields,
        Some(o) => {
            let old_fields = fields_of(o, shape);
            let mut c: BTreeSet<Path> = new_fields
                .iter()
                .filter(|p| get_path(o, p) != get_path(new, p))
                .cloned()
                .collect();
            // Removed fields leave every owner.
            for p in old_fields.difference(&new_fields) {
                for e in entries.iter_mut() {
                    e.fields.remove(p);
                }
            }
            c.retain(|p| !p.is_empty());
            c
        }
    };
    if changed.is_empty() {
        write_entries(new, &entries);
        return;
    }
    for e in entries.iter_mut() {
        if !(e.manager == manager && e.operation == "Update" && e.subresource == subresource) {
            e.fields.retain(|o| !changed.contains(o));
        }
    }
    match entries
        .iter_mut()
        .find(|e| e.manager == manager && e.operation == "Update" && e.subresource == subresource)
    {
        Some(e) => {
            e.fields.extend(changed);
            e.time = now();
            e.api_version = api_version.to_string();
        }
        None => entries.push(ManagedEntry {
            manager: manager.to_string(),
            operation: "Update".into(),
            api_version: api_version.to_string(),
            subresource: subresource.to_string(),
            time: now(),
            fields: changed,
        }),
    }
    write_entries(new, &entries);
}

fn display(p: &Path) -> String {
    p.iter()
        .map(|el| match el.split_once(':') {
            Some(("f", f)) => format!(".{f}"),
            Some((_, x)) => format!("[{x}]"),
            None => el.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUILTIN: FieldShape<'static> = FieldShape {
        builtin: true,
        schema: None,
    };

    #[test]
    fn fields_v1_round_trips_and_uses_keys_for_containers() {
        let obj = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "labels": {"a": "b"}, "finalizers": ["x"]},
            "spec": {"containers": [{"name": "c", "image": "i"}], "tolerations": [{"key": "k"}]},
        });
        let set = fields_of(&obj, BUILTIN);
        let v1 = to_fields_v1(&set);
        assert_eq!(
            v1["f:spec"]["f:containers"]["k:{\"name\":\"c\"}"]["."],
            json!({})
        );
        assert_eq!(
            v1["f:spec"]["f:tolerations"],
            json!({}),
            "lists without keys are atomic"
        );
        assert_eq!(v1["f:metadata"]["f:finalizers"]["v:\"x\""], json!({}));
        assert!(
            v1["f:metadata"].get("f:name").is_none(),
            "names are not owned"
        );
        assert_eq!(from_fields_v1(&v1), set);
    }

    #[test]
    fn apply_conflicts_only_on_differing_leaves_and_force_takes_them() {
        let live = apply(
            None,
            &json!({"data": {"a": "1"}}),
            "m1",
            false,
            "v1",
            "",
            BUILTIN,
        )
        .expect("create");
        // Same value: shared, no conflict.
        let shared = apply(
            Some(&live),
            &json!({"data": {"a": "1"}}),
            "m2",
            false,
            "v1",
            "",
            BUILTIN,
        )
        .expect("share");
        assert_eq!(read_entries(&shared).len(), 2);
        let err = apply(
            Some(&shared),
            &json!({"data": {"a": "2"}}),
            "m3",
            false,
            "v1",
            "",
            BUILTIN,
        )
        .expect_err("conflict");
        assert_eq!(err.code, 409);
        assert!(
            err.message.contains("m1") && err.message.contains("m2"),
            "{}",
            err.message
        );
        let forced = apply(
            Some(&shared),
            &json!({"data": {"a": "2"}}),
            "m3",
            true,
            "v1",
            "",
            BUILTIN,
        )
        .expect("force");
        let owners: Vec<String> = read_entries(&forced)
            .into_iter()
            .map(|e| e.manager)
            .collect();
        assert_eq!(owners, ["m3"], "forced fields leave their previous owners");
    }

    #[test]
    fn update_takes_ownership_of_changed_leaves() {
        let live = apply(
            None,
            &json!({"data": {"a": "1", "b": "1"}}),
            "applier",
            false,
            "v1",
            "",
            BUILTIN,
        )
        .expect("create");
        let mut new = live.clone();
        new["data"]["a"] = json!("2");
        record_update(Some(&live), &mut new, "editor", "v1", "", BUILTIN);
        let entries = read_entries(&new);
        let editor = entries
            .iter()
            .find(|e| e.manager == "editor")
            .expect("editor entry");
        assert!(
            editor
                .fields
                .contains(&vec!["f:data".to_string(), "f:a".to_string()])
        );
        let applier = entries
            .iter()
            .find(|e| e.manager == "applier")
            .expect("applier entry");
        assert!(
            !applier
                .fields
                .contains(&vec!["f:data".to_string(), "f:a".to_string()])
        );
        assert!(
            applier
                .fields
                .contains(&vec!["f:data".to_string(), "f:b".to_string()])
        );
    }
}
