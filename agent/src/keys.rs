//! Who holds which key on a host: the World secret stays with the agent
//! (and the operator); the World's runtime key, derived from it one way,
//! stays with the agent too (and clients of actors, through the Secret
//! `<world>-runtime`): it is the seed of the World's proc issuer
//! (`hostmesh_runtime::Issuer`), from which each runtime-aware proc gets a
//! credential of its own, for its own name and its host's epoch; plain
//! procs get nothing.
//!
//! Invariants:
//! 1. The runtime key is HKDF-SHA256 of the World secret under a fixed
//!    label: every agent of a World derives the same one (and so the same
//!    issuer), and nothing that holds only the runtime key can compute the
//!    World secret; nothing that holds only a proc credential can compute
//!    either.
//! 2. The agent takes the World secret out of its environment
//!    ([`SECRET_ENV`]) before any thread starts, so no child inherits it.
//! 3. The agent process is not dumpable: without `CAP_SYS_PTRACE` (which
//!    container runtimes do not grant by default, and restricted pods
//!    drop), a proc of the same user cannot read the agent's
//!    `/proc/<pid>/environ` or memory, where the original environment
//!    still lies. Procs are exec'd, which makes them dumpable again.
//! 4. Neither key is ever printed: [`Secret`]'s `Debug` hides it.
//! 5. A rotated World secret reaches a running agent over its operator's
//!    link (`Rekey`, [`rekey`]): from then on the agent's proc accepts only
//!    the new secret, its desk holds a credential of the new issuer, and
//!    procs spawned later get theirs from it, with the lineage that links
//!    the old issuer to the new one. Established connections keep their
//!    sessions, so nothing running notices.

use std::sync::{Arc, RwLock};

use hostmesh_runtime::{Issuer, Proc};
use ring::hkdf;

use super::agent::Secret;
use super::config::secret_key;
use super::contract::env::SECRET as SECRET_ENV;
use super::error::HostError;

/// The HKDF label of the runtime key (invariant 1).
const RUNTIME_LABEL: &[u8] = b"hostmesh runtime key v1";

/// Fewest bytes a World secret has.
pub const MIN_SECRET_LEN: usize = 16;

/// The World's runtime key: what the World's proc issuer is derived from
/// (agents issue their procs' credentials with it; clients of actors issue
/// their own). It cannot dial the agent itself.
pub fn runtime_key(world_secret: &[u8]) -> Secret {
    struct Len;
    impl hkdf::KeyType for Len {
        fn len(&self) -> usize {
            32
        }
    }
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, RUNTIME_LABEL).extract(world_secret);
    let mut out = vec![0u8; 32];
    // `expand` fails only for lengths above 255 * 32 bytes.
    if let Ok(okm) = prk.expand(&[RUNTIME_LABEL], Len) {
        let _ = okm.fill(&mut out);
    }
    Secret::new(out)
}

/// A key as a proc's environment carries it: lowercase hex.
pub fn to_hex(key: &[u8]) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of a hex key from `var`, with an error naming the variable.
pub fn from_hex(var: &'static str, text: &str) -> Result<Vec<u8>, HostError> {
    let text = text.trim();
    let bad = |why: &str| HostError::config(var, format!("{why}: set by the hostmesh agent"));
    if !text.len().is_multiple_of(2) || text.len() < 2 * MIN_SECRET_LEN {
        return Err(bad("not a key of at least 16 bytes in hex"));
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).map_err(|_| bad("not hex")))
        .collect()
}

/// Takes the World secret out of [`SECRET_ENV`] (invariant 2): `None`
/// when it is not set. Call before any other thread runs.
pub fn take_env_secret() -> Result<Option<Secret>, HostError> {
    let Some(value) = std::env::var_os(SECRET_ENV) else {
        return Ok(None);
    };
    // SAFETY: the agent's entry point calls this before it starts its
    // runtime or any other thread, so nothing reads the environment
    // concurrently.
    unsafe { std::env::remove_var(SECRET_ENV) };
    let key = secret_key(value.as_encoded_bytes());
    if key.len() < MIN_SECRET_LEN {
        return Err(HostError::config(
            SECRET_ENV,
            format!(
                "holds {} bytes; a secret needs at least {MIN_SECRET_LEN} (the operator writes 64 random hex digits into the World's `<world>-agent` Secret)",
                key.len()
            ),
        ));
    }
    Ok(Some(Secret::new(key.to_vec())))
}

/// The World's proc issuer as the agent holds it now: replaced when the
/// World's secret is rotated (invariant 5).
#[derive(Clone, Debug)]
pub struct IssuerCell(Arc<RwLock<Issuer>>);

impl IssuerCell {
    /// Holds `issuer`.
    pub fn new(issuer: Issuer) -> Self {
        IssuerCell(Arc::new(RwLock::new(issuer)))
    }

    /// The issuer procs spawned now get their credentials from.
    pub fn current(&self) -> Issuer {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set(&self, issuer: Issuer) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = issuer;
    }
}

/// Takes on a rotated World secret (invariant 5): `secret` for connections
/// to the agent's proc from now on, and the proc issuer of its runtime key,
/// with `lineage`, for the desk and for procs spawned from now on. Nothing
/// changes when either is refused.
pub fn rekey(
    secret: &[u8],
    lineage: &str,
    agent: &Proc,
    desk: &Proc,
    issuer: &IssuerCell,
) -> Result<(), HostError> {
    if secret.len() < MIN_SECRET_LEN {
        return Err(HostError::Runtime(format!(
            "Rekey refused: the new World secret holds {} bytes, at least {MIN_SECRET_LEN} are needed",
            secret.len()
        )));
    }
    let refused = |e: hostmesh_runtime::channel::credential::CredentialError| {
        HostError::Runtime(format!("Rekey refused: the lineage {e}"))
    };
    let next = Issuer::from_runtime_key(runtime_key(secret).bytes())
        .with_lineage_text(lineage)
        .map_err(refused)?;
    desk.reissue(&next).map_err(|e| {
        HostError::Runtime(format!("Rekey: cannot reissue the desk's credential: {e}"))
    })?;
    agent.set_secret(secret);
    issuer.set(next);
    tracing::info!("the World's secret was rotated: connections from now on use the new one");
    Ok(())
}

/// Makes this process non-dumpable (invariant 3).
pub fn become_undumpable() -> std::io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    let rc = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtime_key_is_fixed_per_secret_and_differs_from_it() {
        let a = runtime_key(b"0123456789abcdef0123456789abcdef");
        let b = runtime_key(b"0123456789abcdef0123456789abcdef");
        let c = runtime_key(b"0123456789abcdef0123456789abcdeX");
        assert_eq!(a.bytes(), b.bytes());
        assert_ne!(a.bytes(), c.bytes());
        assert_eq!(a.bytes().len(), 32);
        assert_ne!(a.bytes(), b"0123456789abcdef0123456789abcdef");
        assert_eq!(format!("{a:?}"), "Secret(..)");
    }

    #[test]
    fn hex_round_trips_and_names_the_variable_when_bad() {
        let k = runtime_key(b"0123456789abcdef");
        let text = to_hex(k.bytes());
        assert_eq!(text.len(), 64);
        assert_eq!(from_hex("V", &text).unwrap(), k.bytes());
        for bad in [
            "",
            "abc",
            "zz".repeat(16).as_str(),
            "ab".repeat(15).as_str(),
        ] {
            let e = from_hex("RUNTIME_SECRET_KEY", bad).unwrap_err().to_string();
            assert!(e.contains("RUNTIME_SECRET_KEY"), "{e}");
        }
    }
}
