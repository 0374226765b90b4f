//! Owns PodDisruptionBudgets: their status (what kube-controller-manager's
//! disruption controller keeps) and the `pods/eviction` subresource
//! (policy/v1 `Eviction`) that honours them, as kube-apiserver's eviction
//! REST handler does.
//!
//! Invariants:
//! 1. A PDB's status counts the pods its selector matches in its
//!    namespace: `expectedPods`, `currentHealthy` (Ready, not being
//!    deleted, not recently evicted), `desiredHealthy` (from
//!    `minAvailable` or `maxUnavailable`, percentages rounded up) and
//!    `disruptionsAllowed = max(0, currentHealthy - desiredHealthy)`,
//!    with the `DisruptionAllowed` condition; `run` keeps it current.
//! 2. An eviction of a pod that no PDB covers, or that is Pending,
//!    Succeeded, Failed or already being deleted, deletes it.
//! 3. With one covering PDB, the eviction is refused with 429
//!    TooManyRequests and a `DisruptionBudget` cause when no disruption is
//!    allowed; otherwise the PDB records the pod in `disruptedPods`, its
//!    `disruptionsAllowed` drops by one, and the pod is deleted. An
//!    unhealthy pod may be evicted when the budget is met
//!    (`unhealthyPodEvictionPolicy` IfHealthyBudget) or always
//!    (AlwaysAllow).
//! 4. A pod covered by more than one PDB cannot be evicted (500, as the
//!    real server answers).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::handlers::{Request, delete_one, name_of, ns_of};
use super::lifecycle::{DeleteOpts, Propagation};
use super::meta;
use super::route::RouteTarget;
use super::status::ApiError;
use super::store::{Store, StoreState};

const PDBS: &str = "policy/poddisruptionbudgets";
const PODS: &str = "/pods";
/// How long an evicted pod counts as disrupted while it is not gone yet
/// (the disruption controller's deletion timeout).
const DISRUPTED_TIMEOUT: chrono::TimeDelta = chrono::TimeDelta::minutes(2);

fn selects(sel: &Value, labels: Option<&Value>) -> bool {
    if sel.as_object().is_none_or(Map::is_empty) {
        // An empty selector matches every pod of the namespace (policy/v1).
        return sel.is_object();
    }
    let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
    let labels_ok = sel
        .get("matchLabels")
        .and_then(Value::as_object)
        .is_none_or(|m| m.iter().all(|(k, v)| get(k) == v.as_str()));
    labels_ok
        && sel
            .get("matchExpressions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .all(|e| {
                let key = e.get("key").and_then(Value::as_str).unwrap_or("");
                let vals: Vec<&str> = e
                    .get("values")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect();
                match e.get("operator").and_then(Value::as_str).unwrap_or("") {
                    "In" => get(key).is_some_and(|v| vals.contains(&v)),
                    "NotIn" => get(key).is_none_or(|v| !vals.contains(&v)),
                    "Exists" => get(key).is_some(),
                    "DoesNotExist" => get(key).is_none(),
                    _ => false,
                }
            })
}

fn covers(pdb: &Value, pod: &Value) -> bool {
    pdb.pointer("/spec/selector")
        .is_some_and(|s| selects(s, pod.pointer("/metadata/labels")))
}

fn is_ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

/// An int-or-percent scaled to `total`, rounded up.
fn scaled(v: &Value, total: i64) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => match s.strip_suffix('%') {
            Some(p) => p.parse::<i64>().ok().map(|p| (p * total + 99) / 100),
            None => s.parse().ok(),
        },
        _ => None,
    }
}

/// The status a PDB should have now (invariant 1).
fn status(pdb: &Value, pods: &[Arc<Value>], now: chrono::DateTime<chrono::Utc>) -> Value {
    let matching: Vec<&Arc<Value>> = pods.iter().filter(|p| covers(pdb, p)).collect();
    let mut disrupted = Map::new();
    if let Some(d) = pdb
        .pointer("/status/disruptedPods")
        .and_then(Value::as_object)
    {
        for (name, at) in d {
            let fresh = at
                .as_str()
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                .is_some_and(|t| now.signed_duration_since(t) < DISRUPTED_TIMEOUT);
            let alive = matching
                .iter()
                .any(|p| meta::name(p) == name && !meta::is_deleting(p));
            if fresh && alive {
                disrupted.insert(name.clone(), at.clone());
            }
        }
    }
    let expected = matching.len() as i64;
    let healthy = matching
        .iter()
        .filter(|p| !meta::is_deleting(p) && is_ready(p) && !disrupted.contains_key(meta::name(p)))
        .count() as i64;
    let spec = pdb.get("spec").cloned().unwrap_or(json!({}));
    let desired = if let Some(min) = spec.get("minAvailable") {
        scaled(min, expected).unwrap_or(0)
    } else if let Some(max) = spec.get("maxUnavailable") {
        (expected - scaled(max, expected).unwrap_or(0)).max(0)
    } else {
        0
    };
    let allowed = (healthy - desired).max(0);
    let generation = pdb
        .pointer("/metadata/generation")
        .cloned()
        .unwrap_or(json!(1));
    let (cond_status, reason) = if allowed > 0 {
        ("True", "SufficientPods")
    } else {
        ("False", "InsufficientPods")
    };
    let old_cond = pdb
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == "DisruptionAllowed"));
    let transition = match old_cond {
        Some(c) if c["status"] == cond_status => c["lastTransitionTime"].clone(),
        _ => json!(meta::now()),
    };
    json!({
        "observedGeneration": generation,
        "disruptedPods": disrupted,
        "disruptionsAllowed": allowed,
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "expectedPods": expected,
        "conditions": [{
            "type": "DisruptionAllowed", "status": cond_status, "reason": reason, "message": "",
            "observedGeneration": generation, "lastTransitionTime": transition,
        }],
    })
}

fn pods_of(st: &StoreState, ns: &str) -> Vec<Arc<Value>> {
    st.scan(PODS, Some(ns), None)
        .map(|(_, p)| p.clone())
        .collect()
}

/// Writes every PDB whose status is out of date (invariant 1).
fn refresh(store: &Store) {
    let mut st = store.lock();
    let pdbs: Vec<Arc<Value>> = st.scan(PDBS, None, None).map(|(_, o)| o.clone()).collect();
    let now = chrono::Utc::now();
    let mut wrote = false;
    for pdb in pdbs {
        let ns = meta::namespace(&pdb).to_string();
        let new = status(&pdb, &pods_of(&st, &ns), now);
        if pdb.get("status") == Some(&new) {
            continue;
        }
        let mut o = (*pdb).clone();
        o["status"] = new;
        st.put(PDBS, &ns, meta::name(&pdb), o);
        wrote = true;
    }
    drop(st);
    if wrote {
        store.wrote(false);
    }
}

/// The disruption controller: refreshes PDB statuses after writes.
pub(crate) async fn run(store: Arc<Store>, shutdown: CancellationToken) {
    let mut seen = u64::MAX;
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let rv = store.lock().rv();
        if rv != seen {
            refresh(&store);
            seen = store.lock().rv();
        }
    }
}

fn delete_opts(body: &Value) -> Result<DeleteOpts, ApiError> {
    let d = body.get("deleteOptions").cloned().unwrap_or(Value::Null);
    Ok(DeleteOpts {
        grace: d.get("gracePeriodSeconds").and_then(Value::as_i64),
        propagation: d
            .get("propagationPolicy")
            .and_then(Value::as_str)
            .map(Propagation::parse)
            .transpose()?,
        uid: d
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            .map(str::to_string),
        resource_version: d
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .map(str::to_string),
    })
}

fn too_many(message: String) -> ApiError {
    let mut e = ApiError::too_many_requests(
        "Cannot evict pod as it would violate the pod's disruption budget.",
    );
    e.details = Some(json!({"causes": [{"reason": "DisruptionBudget", "message": message}]}));
    e
}

/// POST `pods/{name}/eviction` (invariants 2 to 4).
pub(crate) fn evict(
    store: &Store,
    t: &RouteTarget,
    req: &Request,
) -> Result<(u16, Value), ApiError> {
    let name = name_of(t)?.to_string();
    let ns = ns_of(t).to_string();
    let body = req.json_body()?;
    if let Some(n) = body.pointer("/metadata/name").and_then(Value::as_str)
        && n != name
    {
        return Err(ApiError::bad_request(format!(
            "name in URL does not match name in Eviction object: {name} vs {n}"
        )));
    }
    let opts = delete_opts(&body)?;
    let dry_run = req.dry_run()
        || body
            .pointer("/deleteOptions/dryRun")
            .and_then(Value::as_array)
            .is_some_and(|d| d.iter().any(|x| x == "All"));
    {
        let mut st = store.lock();
        let pod = st
            .get(PODS, &ns, &name)
            .ok_or_else(|| ApiError::not_found("", "pods", &name))?;
        let phase = pod
            .pointer("/status/phase")
            .and_then(Value::as_str)
            .unwrap_or("");
        let ignore_pdb =
            matches!(phase, "Pending" | "Succeeded" | "Failed" | "") || meta::is_deleting(&pod);
        let pdbs: Vec<Arc<Value>> = st
            .scan(PDBS, Some(&ns), None)
            .map(|(_, o)| o.clone())
            .filter(|p| covers(p, &pod))
            .collect();
        if !ignore_pdb {
            match pdbs.as_slice() {
                [] => {}
                [pdb] => {
                    let now = chrono::Utc::now();
                    let pods = pods_of(&st, &ns);
                    let mut s = status(pdb, &pods, now);
                    let healthy = s["currentHealthy"].as_i64().unwrap_or(0);
                    let desired = s["desiredHealthy"].as_i64().unwrap_or(0);
                    let policy = pdb
                        .pointer("/spec/unhealthyPodEvictionPolicy")
                        .and_then(Value::as_str)
                        .unwrap_or("IfHealthyBudget");
                    let unhealthy_ok = !is_ready(&pod)
                        && (policy == "AlwaysAllow" || (healthy >= desired && desired > 0));
                    if !unhealthy_ok {
                        let allowed = s["disruptionsAllowed"].as_i64().unwrap_or(0);
                        if allowed <= 0 {
                            return Err(too_many(format!(
                                "The disruption budget {} needs {desired} healthy pods and has {healthy} currently",
                                meta::name(pdb)
                            )));
                        }
                        if !dry_run {
                            s["disruptionsAllowed"] = json!(allowed - 1);
                            s["disruptedPods"][name.as_str()] = json!(meta::now());
                            let mut o = (**pdb).clone();
                            o["status"] = s;
                            st.put(PDBS, &ns, meta::name(pdb), o);
                        }
                    }
                }
                _ => {
                    return Err(ApiError::internal(
                        "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
                    ));
                }
            }
        }
    }
    delete_one(store, &t.info, &t.version, &ns, &name, &opts, dry_run)?;
    Ok((
        201,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, ready: bool) -> Arc<Value> {
        Arc::new(json!({"metadata": {"name": name, "labels": {"app": "a"}},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}}))
    }

    #[test]
    fn budgets_count_healthy_pods() {
        let pods = vec![pod("a", true), pod("b", true), pod("c", false)];
        let now = chrono::Utc::now();
        let min = json!({"metadata": {"generation": 1}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "a"}}}});
        let s = status(&min, &pods, now);
        assert_eq!(
            (
                s["currentHealthy"].as_i64(),
                s["disruptionsAllowed"].as_i64()
            ),
            (Some(2), Some(1))
        );
        let pct =
            json!({"spec": {"maxUnavailable": "34%", "selector": {"matchLabels": {"app": "a"}}}});
        let s = status(&pct, &pods, now);
        assert_eq!(
            (
                s["desiredHealthy"].as_i64(),
                s["disruptionsAllowed"].as_i64()
            ),
            (Some(1), Some(1))
        );
        let none =
            json!({"spec": {"minAvailable": "100%", "selector": {"matchLabels": {"app": "a"}}}});
        assert_eq!(status(&none, &pods, now)["disruptionsAllowed"], 0);
    }
}
