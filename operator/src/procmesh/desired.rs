//! The procs a ProcMesh asks of each host, with the environment contract
//! (docs/architecture.md, "Proc environment"), built as plain data.
//!
//! Invariants:
//! 1. proc rank = host_rank * perHostSize + local rank; the extent is the
//!    World's shape followed by `perHost`.
//! 2. Contract variables win over user `env` entries of the same name.
//! 3. Addresses come from the operator's address book (pod IPs), never DNS.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use hostmesh_crds::{ProcMesh, World};
use kube::ResourceExt as _;

use crate::hub::{ProcRequest, ProcSpec};
use crate::world::desired::SECRET_FILE;

/// Default `MASTER_PORT`.
pub const DEFAULT_MASTER_PORT: u16 = 29500;

/// Global rank of `local` on host `host_rank`.
pub fn proc_rank(host_rank: u64, per_host: u64, local: u64) -> u64 {
    host_rank * per_host + local
}

/// Name of the env variable holding the coordinate along `dim`.
pub fn coord_var(dim: &str) -> String {
    format!(
        "HOSTMESH_COORD_{}",
        dim.to_ascii_uppercase().replace('-', "_")
    )
}

/// The procs of `pm` on host `host_rank`; `book` maps host ranks to agent
/// addresses; `incarnation(rank)` is the spec incarnation of each rank.
pub fn host_procs(
    pm: &ProcMesh,
    world: &World,
    host_rank: u64,
    book: &BTreeMap<u64, SocketAddr>,
    incarnation: &dyn Fn(u64) -> u32,
) -> Vec<ProcRequest> {
    let world_extent = world.spec.extent();
    let per_host_extent = pm.spec.per_host_extent();
    let extent = world_extent.concat(&per_host_extent);
    let per_host = per_host_extent.num_ranks();
    let world_size = extent.num_ranks();
    let pm_name = pm.name_any();
    let master = book.get(&0).map(|a| a.ip().to_string()).unwrap_or_default();
    let master_port = pm.spec.master_port.unwrap_or(DEFAULT_MASTER_PORT);
    let agent = book
        .get(&host_rank)
        .map(|a| a.to_string())
        .unwrap_or_default();
    let mut argv = pm.spec.command.clone();
    argv.extend(pm.spec.args.iter().cloned());
    (0..per_host)
        .map(|local| {
            let rank = proc_rank(host_rank, per_host, local);
            let mut contract = vec![
                ("RANK".to_string(), rank.to_string()),
                ("WORLD_SIZE".to_string(), world_size.to_string()),
                ("LOCAL_RANK".to_string(), local.to_string()),
                ("LOCAL_WORLD_SIZE".to_string(), per_host.to_string()),
                ("GROUP_RANK".to_string(), host_rank.to_string()),
                ("MASTER_ADDR".to_string(), master.clone()),
                ("MASTER_PORT".to_string(), master_port.to_string()),
                ("HOSTMESH_WORLD".to_string(), world.name_any()),
                ("HOSTMESH_PROC_MESH".to_string(), pm_name.clone()),
                ("HOSTMESH_EXTENT".to_string(), extent.to_string()),
                ("HOSTMESH_AGENT_ADDR".to_string(), agent.clone()),
                ("HOSTMESH_SECRET_FILE".to_string(), SECRET_FILE.to_string()),
                (
                    "HOSTMESH_PROC_NAME".to_string(),
                    format!("{pm_name}-{rank}"),
                ),
            ];
            if let Some(coords) = extent.coords(rank) {
                for (d, c) in extent.dims().iter().zip(coords) {
                    contract.push((coord_var(&d.name), c.to_string()));
                }
            }
            let mut env: Vec<(String, String)> = pm
                .spec
                .env
                .iter()
                .filter(|e| !contract.iter().any(|(k, _)| *k == e.name))
                .map(|e| (e.name.clone(), e.value.clone()))
                .collect();
            env.extend(contract);
            ProcRequest {
                proc_mesh: pm_name.clone(),
                local_rank: local,
                rank,
                spec: ProcSpec {
                    argv: argv.clone(),
                    env,
                    working_dir: pm.spec.working_dir.clone(),
                    incarnation: incarnation(rank),
                },
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
            "apiVersion: hostmesh.dev/v1alpha1\nkind: ProcMesh\nmetadata: {{name: train, namespace: ns}}\n\
             spec: {{world: trainer, perHost: [{{name: gpu, size: 8}}], command: [python, train.py], args: [--lr, '1'], env: [{{name: RANK, value: spoof}}, {{name: X, value: y}}]{extra}}}\n"
        ))
        .unwrap()
    }

    fn book() -> BTreeMap<u64, SocketAddr> {
        (0..8)
            .map(|r| (r, SocketAddr::from(([127, 0, 1, r as u8 + 1], 26600))))
            .collect()
    }

    #[test]
    fn ranks_and_environment_contract() {
        let reqs = host_procs(&mk_pm(""), &mk_world(), 5, &book(), &|_| 0);
        assert_eq!(reqs.len(), 8);
        let r = &reqs[3];
        assert_eq!((r.rank, r.local_rank), (43, 3));
        assert_eq!(r.spec.argv, ["python", "train.py", "--lr", "1"]);
        let env: BTreeMap<_, _> = r.spec.env.iter().cloned().collect();
        assert_eq!(env["RANK"], "43");
        assert_eq!(env["WORLD_SIZE"], "64");
        assert_eq!(env["LOCAL_RANK"], "3");
        assert_eq!(env["LOCAL_WORLD_SIZE"], "8");
        assert_eq!(env["GROUP_RANK"], "5");
        assert_eq!(env["MASTER_ADDR"], "127.0.1.1");
        assert_eq!(env["MASTER_PORT"], "29500");
        assert_eq!(env["HOSTMESH_EXTENT"], "replica=2,host=4,gpu=8");
        assert_eq!(env["HOSTMESH_COORD_REPLICA"], "1");
        assert_eq!(env["HOSTMESH_COORD_HOST"], "1");
        assert_eq!(env["HOSTMESH_COORD_GPU"], "3");
        assert_eq!(env["HOSTMESH_AGENT_ADDR"], "127.0.1.6:26600");
        assert_eq!(env["HOSTMESH_PROC_NAME"], "train-43");
        assert_eq!(env["HOSTMESH_WORLD"], "trainer");
        assert_eq!(env["X"], "y");
        assert_eq!(
            r.spec.env.iter().filter(|(k, _)| k == "RANK").count(),
            1,
            "contract wins"
        );
    }

    #[test]
    fn no_per_host_means_one_proc_per_host() {
        let mut pm = mk_pm("");
        pm.spec.per_host.clear();
        let reqs = host_procs(&pm, &mk_world(), 7, &book(), &|r| r as u32);
        assert_eq!(reqs.len(), 1);
        assert_eq!(reqs[0].rank, 7);
        assert_eq!(reqs[0].spec.incarnation, 7);
        assert_eq!(coord_var("my-dim"), "HOSTMESH_COORD_MY_DIM");
    }
}
