//! The proc environment contract (docs/architecture.md, "Proc environment"):
//! computes every variable a proc gets from its rank, its mesh extent, the
//! agent's identity and the address book, and validates the request on the
//! way (a rank outside the extent or on another host is an error).

use hostmesh_mesh::Rank;
use std::net::SocketAddr;

use super::error::HostError;
use super::protocol::{CreateOrUpdate, ProcSpec};

/// What the agent contributes to every proc's environment.
#[derive(Debug, Clone)]
pub struct AgentIdentity {
    /// World name.
    pub world: String,
    /// This host's rank.
    pub host_rank: Rank,
    /// The agent's runtime address (the operator's side).
    pub addr: SocketAddr,
    /// The agent's proc desk: where runtime-aware procs check in.
    pub desk: SocketAddr,
    /// The World's proc issuer (derived from its runtime key, `keys.rs`):
    /// each runtime-aware proc gets a credential of its own from it.
    pub issuer: super::keys::IssuerCell,
}

/// A runtime-aware proc's credential: a certificate for its own name and
/// its host's epoch, and its own key, in hex
/// (`hostmesh_runtime::channel::credential`). Plain procs get none.
pub const PROC_CREDENTIAL_VAR: &str = "HOSTMESH_PROC_CREDENTIAL";

/// Default `MASTER_PORT`.
pub const DEFAULT_MASTER_PORT: u16 = 29500;

/// The progress file of a proc with stall detection: touching it (any
/// change of its mtime) is progress (`stall.rs`).
pub const PROGRESS_FILE_VAR: &str = "HOSTMESH_PROGRESS_FILE";

/// The proc's name: runtime-aware procs check in with it, and the agent
/// tells a proc's adopted descendants apart by it (`descendants.rs`).
pub(crate) const PROC_NAME_VAR: &str = "HOSTMESH_PROC_NAME";

/// Checks a request's shape: name, command, extent, rank.
pub(crate) fn validate(req: &CreateOrUpdate, host_rank: Rank) -> Result<(), HostError> {
    let name = &req.name;
    if name.is_empty()
        || name.len() > 128
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
    {
        return Err(HostError::spec(
            name,
            "name",
            "use 1 to 128 characters from [A-Za-z0-9._-]",
        ));
    }
    let spec = &req.spec;
    if spec.command.is_empty() {
        return Err(HostError::spec(name, "spec.command", "must not be empty"));
    }
    if spec.extent.is_empty() || spec.extent.iter().any(|d| d.size == 0 || d.name.is_empty()) {
        return Err(HostError::spec(
            name,
            "spec.extent",
            "needs at least one dimension, each with a name and a size of at least 1",
        ));
    }
    if spec.per_host_dims > spec.extent.len() {
        return Err(HostError::spec(
            name,
            "spec.per_host_dims",
            format!(
                "is {} but the extent has only {} dimensions",
                spec.per_host_dims,
                spec.extent.len()
            ),
        ));
    }
    for (i, d) in spec.extent.iter().enumerate() {
        if spec.extent[..i].iter().any(|e| e.name == d.name) {
            return Err(HostError::spec(
                name,
                "spec.extent",
                format!("dimension {:?} appears twice", d.name),
            ));
        }
    }
    if spec.stall_timeout_ms == Some(0) {
        return Err(HostError::spec(
            name,
            "spec.stall_timeout_ms",
            "is 0; give a timeout of at least 1 ms, or none to turn stall detection off",
        ));
    }
    if let Some(p) = &spec.progress_pattern
        && let Err(e) = crate::stall::pattern(p)
    {
        return Err(HostError::spec(
            name,
            "spec.progress_pattern",
            format!("is not a valid regular expression: {e}"),
        ));
    }
    for (k, _) in &spec.env {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(HostError::spec(
                name,
                "spec.env",
                format!("{k:?} is not a valid variable name"),
            ));
        }
    }
    let world_size = spec.world_size();
    if req.rank >= world_size {
        return Err(HostError::spec(
            name,
            "rank",
            format!(
                "{} is outside the extent (world size {world_size})",
                req.rank
            ),
        ));
    }
    let group = req.rank / spec.local_world_size();
    if group != host_rank {
        return Err(HostError::spec(
            name,
            "rank",
            format!(
                "rank {} belongs to host {group}, but this agent is host {host_rank}",
                req.rank
            ),
        ));
    }
    Ok(())
}

/// The coordinates of `rank` in `spec.extent` (row-major: the last
/// dimension varies fastest).
pub fn coordinates(spec: &ProcSpec, rank: Rank) -> Vec<usize> {
    let mut rest = rank;
    let mut coords = vec![0; spec.extent.len()];
    for (i, d) in spec.extent.iter().enumerate().rev() {
        coords[i] = rest % d.size as usize;
        rest /= d.size as usize;
    }
    coords
}

/// The environment of a proc, contract variables first, then the spec's own.
///
/// `claim` is the host's epoch claim, which a runtime-aware proc's
/// credential carries.
pub(crate) fn proc_env(
    agent: &AgentIdentity,
    address_book: &[String],
    req: &CreateOrUpdate,
    claim: Option<hostmesh_runtime::channel::epoch::EpochClaim>,
) -> Result<Vec<(String, String)>, HostError> {
    let spec = &req.spec;
    let local = spec.local_world_size();
    let master_addr = if agent.host_rank == 0 {
        agent.addr.ip().to_string()
    } else if let Some(h0) = address_book.first().filter(|h| !h.trim().is_empty()) {
        host_of(h0).to_owned()
    } else {
        return Err(HostError::spec(
            &req.name,
            "MASTER_ADDR",
            "this host is not rank 0 and the address book has no host 0; send SetAddressBook with host 0's address first",
        ));
    };
    let extent = spec
        .extent
        .iter()
        .map(|d| format!("{}={}", d.name, d.size))
        .collect::<Vec<_>>()
        .join(",");
    let mut env = vec![
        ("RANK".to_owned(), req.rank.to_string()),
        ("WORLD_SIZE".to_owned(), spec.world_size().to_string()),
        ("LOCAL_RANK".to_owned(), (req.rank % local).to_string()),
        ("LOCAL_WORLD_SIZE".to_owned(), local.to_string()),
        ("GROUP_RANK".to_owned(), (req.rank / local).to_string()),
        ("MASTER_ADDR".to_owned(), master_addr),
        (
            "MASTER_PORT".to_owned(),
            spec.master_port.unwrap_or(DEFAULT_MASTER_PORT).to_string(),
        ),
        ("HOSTMESH_WORLD".to_owned(), agent.world.clone()),
        ("HOSTMESH_PROC_MESH".to_owned(), spec.proc_mesh.clone()),
        (PROC_NAME_VAR.to_owned(), req.name.clone()),
        ("HOSTMESH_EXTENT".to_owned(), extent),
        ("HOSTMESH_AGENT_ADDR".to_owned(), agent.desk.to_string()),
    ];
    if spec.runtime_aware {
        let credential = agent
            .issuer
            .current()
            .issue(&req.name, claim)
            .map_err(|e| HostError::Runtime(format!("cannot issue a proc credential: {e}")))?;
        env.push((PROC_CREDENTIAL_VAR.to_owned(), credential.to_text()));
    }
    for (d, c) in spec.extent.iter().zip(coordinates(spec, req.rank)) {
        let suffix = env_suffix(&d.name);
        env.push((format!("HOSTMESH_COORD_{suffix}"), c.to_string()));
        // `HOSTMESH_RANK_EPOCH(S)` are the rank epoch's (`fence`): a
        // dimension of that name keeps its `HOSTMESH_COORD_` only.
        if !matches!(suffix.as_str(), "EPOCH" | "EPOCHS") {
            env.push((format!("HOSTMESH_RANK_{suffix}"), c.to_string()));
        }
        env.extend([
            (format!("HOSTMESH_SIZE_{suffix}"), d.size.to_string()),
            // Monarch's own names (`monarch exec`, `Job._rank_env`): the
            // dimension as written.
            (format!("MONARCH_RANK_{}", d.name), c.to_string()),
            (format!("MONARCH_SIZE_{}", d.name), d.size.to_string()),
        ]);
    }
    env.extend(spec.env.iter().cloned());
    Ok(env)
}

/// `ip` of `ip:port`, or the text itself when it has no port.
fn host_of(addr: &str) -> &str {
    match addr.parse::<SocketAddr>() {
        Ok(_) => addr
            .rsplit_once(':')
            .map(|(h, _)| h.trim_start_matches('[').trim_end_matches(']'))
            .unwrap_or(addr),
        Err(_) => addr,
    }
}

/// Upper-cased dimension name with every non-alphanumeric byte as `_`.
fn env_suffix(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Dim;

    fn req(rank: Rank) -> CreateOrUpdate {
        let mut spec = ProcSpec::command("true", &[]);
        spec.extent = vec![
            Dim::new("replica", 2),
            Dim::new("host", 4),
            Dim::new("gpu", 8),
        ];
        spec.per_host_dims = 1;
        spec.proc_mesh = "train".into();
        spec.env = vec![("FOO".into(), "bar".into())];
        CreateOrUpdate {
            name: format!("train-{rank}"),
            rank,
            spec,
            incarnation: 0,
        }
    }

    fn agent(host_rank: Rank) -> AgentIdentity {
        AgentIdentity {
            world: "trainer".into(),
            host_rank,
            addr: "127.0.0.9:26602".parse().unwrap(),
            desk: "127.0.0.9:40000".parse().unwrap(),
            issuer: crate::keys::IssuerCell::new(hostmesh_runtime::Issuer::from_runtime_key(
                crate::keys::runtime_key(b"0123456789abcdef").bytes(),
            )),
        }
    }

    #[test]
    fn contract_variables() {
        let r = req(5 * 8 + 3);
        validate(&r, 5).unwrap();
        let book = vec!["127.0.0.2:26602".to_owned()];
        let env: std::collections::HashMap<_, _> = proc_env(&agent(5), &book, &r, None)
            .unwrap()
            .into_iter()
            .collect();
        assert_eq!(env["RANK"], "43");
        assert_eq!(env["WORLD_SIZE"], "64");
        assert_eq!(env["LOCAL_RANK"], "3");
        assert_eq!(env["LOCAL_WORLD_SIZE"], "8");
        assert_eq!(env["GROUP_RANK"], "5");
        assert_eq!(env["MASTER_ADDR"], "127.0.0.2");
        assert_eq!(env["MASTER_PORT"], "29500");
        assert_eq!(env["HOSTMESH_COORD_REPLICA"], "1");
        assert_eq!(env["HOSTMESH_COORD_HOST"], "1");
        assert_eq!(env["HOSTMESH_COORD_GPU"], "3");
        assert_eq!(env["HOSTMESH_EXTENT"], "replica=2,host=4,gpu=8");
        // Per dimension, hostmesh's and Monarch's names for rank and size.
        for (dim, rank, size) in [("replica", 1, 2), ("host", 1, 4), ("gpu", 3, 8)] {
            let up = dim.to_ascii_uppercase();
            assert_eq!(env[&format!("HOSTMESH_RANK_{up}")], rank.to_string());
            assert_eq!(env[&format!("HOSTMESH_SIZE_{up}")], size.to_string());
            assert_eq!(env[&format!("MONARCH_RANK_{dim}")], rank.to_string());
            assert_eq!(env[&format!("MONARCH_SIZE_{dim}")], size.to_string());
        }
        assert_eq!(env["HOSTMESH_AGENT_ADDR"], "127.0.0.9:40000");
        // A plain proc gets no key or credential.
        assert!(
            !env.keys()
                .any(|k| k.contains("SECRET") || k.contains("KEY"))
        );
        assert_eq!(env["HOSTMESH_PROC_NAME"], "train-43");
        assert_eq!(env["FOO"], "bar");
    }

    #[test]
    fn only_a_runtime_aware_proc_gets_a_credential_of_its_own() {
        let mut r = req(5 * 8 + 3);
        r.spec.runtime_aware = true;
        let a = agent(5);
        let claim = Some(hostmesh_runtime::channel::epoch::EpochClaim { rank: 5, epoch: 2 });
        let env: std::collections::HashMap<_, _> = proc_env(&a, &["127.0.0.2:1".into()], &r, claim)
            .unwrap()
            .into_iter()
            .collect();
        let c = hostmesh_runtime::Credential::from_text(&env[PROC_CREDENTIAL_VAR]).unwrap();
        assert_eq!(c.certificate().name, "train-43");
        assert_eq!(c.certificate().claim, claim);
        c.certificate()
            .verify(&a.issuer.current().public())
            .unwrap();
        assert_eq!(c.issuer(), &a.issuer.current().public());
        assert!(
            !env.keys()
                .any(|k| k.contains("SECRET") || k.contains("KEY")),
            "{env:?}"
        );
    }

    #[test]
    fn rank_on_another_host_is_refused() {
        let e = validate(&req(3), 1).unwrap_err().to_string();
        assert!(e.contains("belongs to host 0"), "{e}");
        let e = validate(&req(64), 8).unwrap_err().to_string();
        assert!(e.contains("outside the extent"), "{e}");
    }

    #[test]
    fn master_addr_needs_address_book_off_rank_zero() {
        let e = proc_env(&agent(1), &[], &req(9), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("SetAddressBook"), "{e}");
        let e = proc_env(
            &agent(1),
            &[String::new(), "127.0.0.3:1".into()],
            &req(9),
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("host 0"), "{e}");
        let env = proc_env(&agent(0), &[], &req(1), None).unwrap();
        assert!(env.contains(&("MASTER_ADDR".into(), "127.0.0.9".into())));
    }

    #[test]
    fn bad_names_are_refused() {
        let mut r = req(0);
        r.name = "a b".into();
        assert!(validate(&r, 0).unwrap_err().to_string().contains("name"));
    }
}
