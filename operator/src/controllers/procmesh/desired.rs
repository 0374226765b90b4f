//! The procs a ProcMesh asks of each host, as the agent protocol's
//! `CreateOrUpdate` requests, built as plain data.
//!
//! Invariants:
//! 1. proc rank = host_rank * perHostSize + local rank; the extent is the
//!    World's shape followed by `perHost` (the agent derives the environment
//!    contract, `RANK` .. `HOSTMESH_*`, from it and its address book).
//! 2. User `env` entries named like a contract variable are dropped, so the
//!    contract always holds (docs/api.md).
//! 3. Proc names carry the ProcMesh's uid and a hash of the proc spec
//!    ([`mesh_id`]).
//! 4. Procs see the World's `status.attempt` as `HOSTMESH_ATTEMPT`; it is
//!    not part of the hash, so a new attempt keeps the proc names (and the
//!    failure that caused it stays on record).

use hostmesh_agent::protocol::{Dim, ProcSpec};
use hostmesh_crds::Rank;
use hostmesh_crds::procmesh::DEFAULT_SPAWN_TIMEOUT;
use hostmesh_crds::{ProcMesh, World};
use kube::ResourceExt as _;

use crate::hub::{CreateOrUpdate, proc_name};

/// Variables of the environment contract (besides every `HOSTMESH_*`).
pub const CONTRACT_VARS: &[&str] = &[
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
];

/// Global rank of `local` on host `host_rank`.
pub fn proc_rank(host_rank: Rank, per_host: Rank, local: Rank) -> Rank {
    host_rank * per_host + local
}

/// `<name>.<first 8 characters of the uid>-`: the prefix of every mesh id
/// this ProcMesh ever had.
pub fn mesh_prefix(pm: &ProcMesh) -> String {
    let uid = pm.uid().unwrap_or_default();
    let short: String = uid
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(8)
        .collect();
    format!(
        "{}.{}-",
        pm.name_any(),
        if short.is_empty() { "0" } else { &short }
    )
}

/// `<mesh prefix><hash of the proc spec>`: the prefix of the proc names.
/// A spec change (command, env, extent, ...) makes new names, so the new
/// procs replace the old ones instead of conflicting with them.
pub fn mesh_id(pm: &ProcMesh, world: &World) -> String {
    let spec = serde_json::to_vec(&spec_of(pm, world)).unwrap_or_default();
    let digest = ring::digest::digest(&ring::digest::SHA256, &spec);
    let hash: String = digest.as_ref()[..4]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{}{hash}", mesh_prefix(pm))
}

/// The agent's spec for every proc of `pm` on `world`, with
/// `HOSTMESH_ATTEMPT` (the World's `status.attempt`, invariant 4).
pub fn proc_spec(pm: &ProcMesh, world: &World) -> ProcSpec {
    let mut spec = spec_of(pm, world);
    let attempt = world.status.as_ref().map_or(0, |s| s.attempt);
    spec.env
        .push(("HOSTMESH_ATTEMPT".to_owned(), attempt.to_string()));
    spec
}

/// The proc spec without the attempt: what names the procs.
fn spec_of(pm: &ProcMesh, world: &World) -> ProcSpec {
    let mut extent: Vec<Dim> = world.spec.full_shape().dims().to_vec();
    extent.extend(pm.spec.per_host.iter().cloned());
    let mut argv = pm.spec.command.iter().chain(&pm.spec.args).cloned();
    ProcSpec {
        command: argv.next().unwrap_or_default(),
        args: argv.collect(),
        env: pm
            .spec
            .env
            .iter()
            .filter(|e| {
                !CONTRACT_VARS.contains(&e.name.as_str()) && !e.name.starts_with("HOSTMESH_")
            })
            .map(|e| (e.name.clone(), e.value.clone()))
            .collect(),
        working_dir: pm.spec.working_dir.clone(),
        proc_mesh: pm.name_any(),
        extent,
        per_host_dims: pm.spec.per_host.len(),
        master_port: pm.spec.master_port,
        runtime_aware: pm.spec.runtime_aware,
        // The agent times a check-in out on the same clock as the plan's
        // spawnTimeout (an invalid value never gets here: validation
        // stops the mesh first).
        spawn_timeout_ms: pm
            .spec
            .runtime_aware
            .then(|| {
                hostmesh_crds::duration::parse(
                    "spec.spawnTimeout",
                    pm.spec
                        .spawn_timeout
                        .as_deref()
                        .unwrap_or(DEFAULT_SPAWN_TIMEOUT),
                )
                .ok()
            })
            .flatten()
            .map(hostmesh_agent::protocol::duration_ms),
        // Validated before any proc is asked for; unparseable means off.
        stall_timeout_ms: pm
            .spec
            .stall_timeout
            .as_deref()
            .and_then(|t| hostmesh_crds::duration::parse("spec.stallTimeout", t).ok())
            .map(hostmesh_agent::protocol::duration_ms),
        progress_pattern: pm.spec.progress_pattern.clone(),
    }
}

/// The requests for host `host_rank`; `incarnation(rank)` is each rank's.
pub fn host_procs(
    pm: &ProcMesh,
    world: &World,
    host_rank: Rank,
    incarnation: &dyn Fn(Rank) -> u32,
) -> Vec<CreateOrUpdate> {
    let per_host = pm.spec.per_host_shape().num_ranks();
    let spec = proc_spec(pm, world);
    let id = mesh_id(pm, world);
    (0..per_host)
        .map(|local| {
            let rank = proc_rank(host_rank, per_host, local);
            CreateOrUpdate {
                name: proc_name(&id, rank),
                rank,
                spec: spec.clone(),
                incarnation: incarnation(rank),
            }
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn mk_world() -> World {
        serde_saphyr::from_str(
            "apiVersion: hostmesh.dev/v1alpha1\nkind: World\nmetadata: {name: trainer, namespace: ns}\n\
             spec: {shape: [{name: replica, size: 2}, {name: host, size: 4}], template: {spec: {containers: [{name: host, image: x}]}}}\n",
        )
        .unwrap()
    }

    pub(crate) fn mk_pm(extra: &str) -> ProcMesh {
        serde_saphyr::from_str(&format!(
            "apiVersion: hostmesh.dev/v1alpha1\nkind: ProcMesh\nmetadata: {{name: train, namespace: ns, uid: 0f1e2d3c-aaaa}}\n\
             spec: {{world: trainer, perHost: [{{name: gpu, size: 8}}], command: [python, train.py], args: [--lr, '1'], env: [{{name: RANK, value: spoof}}, {{name: X, value: y}}]{extra}}}\n"
        ))
        .unwrap()
    }

    #[test]
    fn ranks_names_and_spec() {
        let reqs = host_procs(&mk_pm(""), &mk_world(), 5, &|r| (r % 2) as u32);
        assert_eq!(reqs.len(), 8);
        let r = &reqs[3];
        assert_eq!(r.rank, 43);
        let id = mesh_id(&mk_pm(""), &mk_world());
        assert!(
            id.starts_with("train.0f1e2d3c-") && id.len() == "train.0f1e2d3c-".len() + 8,
            "{id}"
        );
        assert_eq!(r.name, format!("{id}.43"));
        assert_eq!(r.incarnation, 1);
        assert_eq!(r.spec.command, "python");
        assert_eq!(r.spec.args, ["train.py", "--lr", "1"]);
        assert_eq!(
            r.spec.env,
            [
                ("X".to_string(), "y".to_string()),
                ("HOSTMESH_ATTEMPT".to_string(), "0".to_string())
            ],
            "contract names are dropped; the attempt is added"
        );
        assert_eq!(r.spec.world_size(), 64);
        assert_eq!(r.spec.local_world_size(), 8);
        assert_eq!(r.spec.per_host_dims, 1);
        assert_eq!(r.spec.proc_mesh, "train");
        assert_eq!(
            crate::hub::parse_proc_name(&r.name),
            Some((id.as_str(), 43))
        );
        assert_eq!(crate::hub::mesh_name(&id), "train");
        // A changed command is a new mesh id; the same spec is the same id.
        let mut changed = mk_pm("");
        changed.spec.args.push("--more".into());
        assert_ne!(mesh_id(&changed, &mk_world()), id);
        assert_eq!(mesh_id(&mk_pm(""), &mk_world()), id);
        // A new attempt keeps the names and tells the procs.
        let mut again = mk_world();
        again.status.get_or_insert_with(Default::default).attempt = 2;
        assert_eq!(mesh_id(&mk_pm(""), &again), id);
        let env = host_procs(&mk_pm(""), &again, 0, &|_| 0)[0]
            .spec
            .env
            .clone();
        assert!(env.contains(&("HOSTMESH_ATTEMPT".to_string(), "2".to_string())));
    }

    #[test]
    fn no_per_host_means_one_proc_per_host() {
        let mut pm = mk_pm("");
        pm.spec.per_host.clear();
        let reqs = host_procs(&pm, &mk_world(), 7, &|_| 0);
        assert_eq!(reqs.len(), 1);
        assert_eq!(reqs[0].rank, 7);
        assert_eq!(reqs[0].spec.local_world_size(), 1);
    }
    /// Issue 30: the longest name validation allows makes proc names the
    /// agent takes, to the byte (`hostmesh_crds::procmesh::max_name`); one
    /// byte more would not.
    #[test]
    fn the_longest_valid_name_makes_proc_names_the_agent_takes() {
        use hostmesh_crds::procmesh::{MAX_PROC_NAME, max_name};
        assert_eq!(MAX_PROC_NAME, hostmesh_runtime::id::MAX_NAME);
        let world = mk_world();
        let pm = mk_pm("");
        let total = 64;
        let mut long = pm.clone();
        long.metadata.name = Some("n".repeat(max_name(total - 1)));
        long.metadata.uid = Some("0f1e2d3c-aaaa-bbbb-cccc-ddddeeeeffff".into());
        assert!(
            hostmesh_crds::validate::proc_mesh_named(
                long.metadata.name.as_deref().unwrap(),
                &long.spec,
                Some(&world.spec)
            )
            .is_ok()
        );
        let last = host_procs(&long, &world, 7, &|_| 0).pop().unwrap();
        assert_eq!(last.rank, total - 1);
        assert_eq!(last.name.len(), MAX_PROC_NAME, "{}", last.name);
        assert!(hostmesh_runtime::id::check_name(&last.name).is_ok());
        long.metadata.name = Some("n".repeat(max_name(total - 1) + 1));
        let last = host_procs(&long, &world, 7, &|_| 0).pop().unwrap();
        assert!(hostmesh_runtime::id::check_name(&last.name).is_err());
    }
}
