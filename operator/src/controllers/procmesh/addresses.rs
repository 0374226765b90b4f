//! The runtime addresses of a runtime-aware ProcMesh's procs, published
//! for clients of their actors in the ConfigMap `<procmesh>-runtime`
//! (docs/api.md, "Runtime addresses"): what a client reads, with its own
//! RBAC, beside the World's runtime credential (`<world>-runtime`).
//!
//! Invariants:
//! 1. Only a runtime-aware mesh has one; it is owned by the ProcMesh, so it
//!    goes with it.
//! 2. It lists, one line `<rank> <address> <proc name> <incarnation>` each
//!    in rank order (the address and name make the proc's runtime id; the
//!    incarnation tells a client which restart of the rank it is), every rank
//!    whose current incarnation runs with the address its agent reported
//!    at check-in: a restarted rank, or one on a replaced host, is listed
//!    once its new proc checked in, and not before.
//! 3. It is written only when its content changes (read, compared, then
//!    created or replaced); a conflict is left to the next reconcile.
//! 4. It stays within [`MAX_BYTES`]: ranks past it are left out and counted
//!    in `truncated`.

use hostmesh_crds::Rank;
use std::collections::BTreeMap;
use std::fmt::Write as _;

use hostmesh_crds::ProcMesh;
use hostmesh_crds::procmesh::ProcState;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use kube::{Resource as _, ResourceExt as _};

use crate::hub::ProcObs;

/// Most bytes of the addresses (the API's object limit is 1 MiB).
pub const MAX_BYTES: usize = 900 * 1024;
/// Data key: the address lines.
pub const ADDRESSES: &str = "addresses";
/// Data key: the mesh's extent (`host=2,gpu=4`), to read ranks as
/// coordinates.
pub const EXTENT: &str = "extent";
/// Data key: the Secret holding the runtime key clients authenticate with.
pub const CREDENTIALS: &str = "credentials";
/// Data key: ranks left out for size (invariant 4), when any.
pub const TRUNCATED: &str = "truncated";

/// Name of the addresses ConfigMap of ProcMesh `name`.
pub fn configmap_name(name: &str) -> String {
    format!("{name}-runtime")
}

/// The ConfigMap's data (invariants 2 and 4): ranks of mesh `mesh_id`
/// whose incarnation is at least `incarnation(rank)` and that run with a
/// reported address.
pub fn data(
    mesh_id: &str,
    states: &BTreeMap<Rank, ProcObs>,
    incarnation: impl Fn(Rank) -> u32,
    extent: &str,
    credentials: &str,
) -> BTreeMap<String, String> {
    let mut lines = String::new();
    let mut left_out = 0usize;
    for (rank, o) in states {
        let Some(addr) = o.addr.as_deref() else {
            continue;
        };
        if o.state != ProcState::Running || o.incarnation < incarnation(*rank) {
            continue;
        }
        let name = crate::hub::proc_name(mesh_id, *rank);
        if lines.len() + addr.len() + name.len() + 34 > MAX_BYTES {
            left_out += 1;
            continue;
        }
        let _ = writeln!(lines, "{rank} {addr} {name} {}", o.incarnation);
    }
    let mut out = BTreeMap::from([
        (ADDRESSES.to_string(), lines),
        (EXTENT.to_string(), extent.to_string()),
        (CREDENTIALS.to_string(), credentials.to_string()),
    ]);
    if left_out > 0 {
        out.insert(TRUNCATED.to_string(), left_out.to_string());
    }
    out
}

/// Writes `<pm>-runtime` with `data` unless it already holds it
/// (invariants 1 and 3).
pub async fn publish(
    client: &kube::Client,
    pm: &ProcMesh,
    data: BTreeMap<String, String>,
) -> Result<(), kube::Error> {
    let ns = pm.namespace().unwrap_or_default();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let name = configmap_name(&pm.name_any());
    let existing = api.get_opt(&name).await?;
    if existing.as_ref().and_then(|c| c.data.as_ref()) == Some(&data) {
        return Ok(());
    }
    let cm = owned_configmap(pm, &name, None, data);
    match create_or_replace(&api, existing, cm).await {
        Ok(_) => Ok(()),
        // Someone wrote it meanwhile: the next reconcile compares again.
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// ConfigMap `name` of `pm`'s namespace, owned by `pm` and labelled with
/// it, holding `data` (and `annotations`): the shape of every ConfigMap
/// a ProcMesh has (its stacks, its runtime addresses).
pub(super) fn owned_configmap(
    pm: &ProcMesh,
    name: &str,
    annotations: Option<BTreeMap<String, String>>,
    data: BTreeMap<String, String>,
) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: pm.namespace(),
            labels: Some(BTreeMap::from([
                (
                    "app.kubernetes.io/managed-by".to_string(),
                    "hostmesh".to_string(),
                ),
                ("hostmesh.dev/procmesh".to_string(), pm.name_any()),
            ])),
            annotations,
            owner_references: pm.controller_owner_ref(&()).map(|o| vec![o]),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    }
}

/// Writes `cm`: replaces `existing` (at its resource version), else
/// creates it.
pub(super) async fn create_or_replace(
    api: &Api<ConfigMap>,
    existing: Option<ConfigMap>,
    mut cm: ConfigMap,
) -> Result<ConfigMap, kube::Error> {
    match existing {
        Some(old) => {
            cm.metadata.resource_version = old.metadata.resource_version;
            api.replace(&cm.name_any(), &PostParams::default(), &cm)
                .await
        }
        None => api.create(&PostParams::default(), &cm).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(state: ProcState, inc: u32, addr: Option<&str>) -> ProcObs {
        ProcObs {
            state,
            incarnation: inc,
            addr: addr.map(Into::into),
            ..Default::default()
        }
    }

    #[test]
    fn lists_running_current_incarnations_with_an_address_in_rank_order() {
        let states = BTreeMap::from([
            (0, obs(ProcState::Running, 0, Some("tcp:10.0.0.1:4000"))),
            (1, obs(ProcState::Running, 0, Some("tcp:10.0.0.1:4001"))),
            // Restarted: the old incarnation still reports, not listed.
            (2, obs(ProcState::Running, 0, Some("tcp:10.0.0.2:4000"))),
            (3, obs(ProcState::Starting, 1, None)),
            (4, obs(ProcState::Failed, 0, Some("tcp:10.0.0.3:4000"))),
            (5, obs(ProcState::Running, 0, None)),
        ]);
        let d = data(
            "m",
            &states,
            |r| u32::from(r == 2),
            "host=3,gpu=2",
            "w-runtime",
        );
        assert_eq!(
            d[ADDRESSES],
            "0 tcp:10.0.0.1:4000 m.0 0\n1 tcp:10.0.0.1:4001 m.1 0\n"
        );
        assert_eq!(d[EXTENT], "host=3,gpu=2");
        assert_eq!(d[CREDENTIALS], "w-runtime");
        assert!(!d.contains_key(TRUNCATED));
    }

    #[test]
    fn stays_within_its_bound() {
        let long = format!("tcp:{}:1", "x".repeat(1000));
        let states: BTreeMap<Rank, ProcObs> = (0..2000)
            .map(|r| (r, obs(ProcState::Running, 0, Some(&long))))
            .collect();
        let d = data("m", &states, |_| 0, "host=2000", "w-runtime");
        assert!(d[ADDRESSES].len() <= MAX_BYTES);
        let kept = d[ADDRESSES].lines().count();
        assert_eq!(kept + d[TRUNCATED].parse::<usize>().unwrap(), 2000);
    }
}
