//! Identities: channel addresses, procs, actors and ports, each with a text
//! form that parses back.
//!
//! Text forms:
//! - [`ChannelAddr`]: `tcp:10.0.0.5:26602`, `tcp:[::1]:26602`,
//!   `unix:/run/hostmesh.sock`, or `unbound:<hex>` (a proc with no listener,
//!   reachable only over connections it opened itself; the random number
//!   keeps ids of such procs unique, since peers key connections by proc id);
//! - [`ProcId`]: `<addr>/<name>`, e.g. `tcp:10.0.0.5:26602/agent`;
//! - [`ActorId`]: `<proc>/<name>[<index>]`, e.g. `tcp:10.0.0.5:26602/agent/worker[3]`;
//! - [`PortId`]: `<actor>[<port>]`, e.g. `tcp:10.0.0.5:26602/agent/worker[3][17]`.
//!
//! Invariant: proc and actor names match `[A-Za-z0-9_.-]+` (checked by
//! [`check_name`]), so the separators above are unambiguous.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// An identity or address could not be parsed or is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// The text is not a valid identity; the reason says what form is expected.
    #[error("invalid {what} {input:?}: {reason}")]
    Invalid {
        /// What was being parsed (`channel address`, `proc id`, ...).
        what: &'static str,
        /// The input text.
        input: String,
        /// What is wrong and what the form should be.
        reason: String,
    },
}

fn invalid(what: &'static str, input: &str, reason: impl Into<String>) -> IdError {
    IdError::Invalid {
        what,
        input: input.to_string(),
        reason: reason.into(),
    }
}

/// The longest proc or actor name, in bytes (ProcMesh validation keeps
/// proc names within it: `hostmesh_crds::procmesh::MAX_PROC_NAME`).
pub const MAX_NAME: usize = 128;

/// Checks a proc or actor name: non-empty, at most [`MAX_NAME`] characters
/// of `[A-Za-z0-9_.-]`.
pub fn check_name(name: &str) -> Result<(), IdError> {
    if name.is_empty()
        || name.len() > MAX_NAME
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
    {
        return Err(invalid(
            "name",
            name,
            "use 1 to 128 characters of letters, digits, '_', '.' or '-'",
        ));
    }
    Ok(())
}

/// Where a proc listens.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ChannelAddr {
    /// A TCP socket address.
    Tcp(SocketAddr),
    /// A Unix domain socket path (same-host use).
    Unix(PathBuf),
    /// No listener: the proc is reachable only over connections it dialed.
    /// The number is random, so that two unbound procs never share an id.
    Unbound(u64),
}

impl ChannelAddr {
    /// Whether another proc can open a connection to this address.
    pub fn is_dialable(&self) -> bool {
        match self {
            ChannelAddr::Tcp(a) => a.port() != 0 && !a.ip().is_unspecified(),
            ChannelAddr::Unix(_) => true,
            ChannelAddr::Unbound(_) => false,
        }
    }
}

impl fmt::Display for ChannelAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChannelAddr::Tcp(a) => write!(f, "tcp:{a}"),
            ChannelAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            ChannelAddr::Unbound(n) => write!(f, "unbound:{n:016x}"),
        }
    }
}

impl FromStr for ChannelAddr {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        const WHAT: &str = "channel address";
        if let Some(hex) = s.strip_prefix("unbound:") {
            return u64::from_str_radix(hex, 16)
                .map(ChannelAddr::Unbound)
                .map_err(|_| invalid(WHAT, s, "expected unbound:<hex number>"));
        }
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() || path.contains([',', '@', '[']) {
                return Err(invalid(
                    WHAT,
                    s,
                    "a unix socket path must be non-empty and free of ',', '@' and '['",
                ));
            }
            return Ok(ChannelAddr::Unix(PathBuf::from(path)));
        }
        let tcp = s.strip_prefix("tcp:").unwrap_or(s);
        tcp.parse::<SocketAddr>().map(ChannelAddr::Tcp).map_err(|_| {
            invalid(
                WHAT,
                s,
                "expected tcp:IP:PORT (e.g. tcp:10.0.0.5:26602, tcp:[::1]:26602), unix:/path or unbound:<hex>",
            )
        })
    }
}

/// A proc: an address and a name, addressed directly. Cheap to clone.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcId(Arc<ProcIdInner>);

#[derive(Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
struct ProcIdInner {
    addr: ChannelAddr,
    name: String,
}

impl Serialize for ProcId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for ProcId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let inner = ProcIdInner::deserialize(d)?;
        check_name(&inner.name).map_err(serde::de::Error::custom)?;
        Ok(ProcId(Arc::new(inner)))
    }
}

impl fmt::Debug for ProcId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ProcId({self})")
    }
}

impl ProcId {
    /// A proc id; the name must pass [`check_name`].
    pub fn new(addr: ChannelAddr, name: impl Into<String>) -> Result<Self, IdError> {
        let name = name.into();
        check_name(&name)?;
        Ok(ProcId(Arc::new(ProcIdInner { addr, name })))
    }

    /// The proc's listening address.
    pub fn addr(&self) -> &ChannelAddr {
        &self.0.addr
    }

    /// The proc's name.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// The id of actor `name[index]` on this proc.
    pub fn actor(&self, name: impl Into<String>, index: u32) -> Result<ActorId, IdError> {
        ActorId::new(self.clone(), name, index)
    }
}

impl fmt::Display for ProcId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.0.addr, self.0.name)
    }
}

impl FromStr for ProcId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        let (addr, name) = s.rsplit_once('/').ok_or_else(|| {
            invalid(
                "proc id",
                s,
                "expected ADDR/NAME, e.g. tcp:10.0.0.5:26602/agent",
            )
        })?;
        ProcId::new(addr.parse()?, name)
    }
}

/// An actor: `name[index]` on a proc. Cheap to clone.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ActorId(Arc<ActorIdInner>);

#[derive(Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
struct ActorIdInner {
    proc: ProcId,
    name: String,
    index: u32,
}

impl Serialize for ActorId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for ActorId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let inner = ActorIdInner::deserialize(d)?;
        check_name(&inner.name).map_err(serde::de::Error::custom)?;
        Ok(ActorId(Arc::new(inner)))
    }
}

impl fmt::Debug for ActorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ActorId({self})")
    }
}

impl ActorId {
    /// An actor id; the name must pass [`check_name`].
    pub fn new(proc: ProcId, name: impl Into<String>, index: u32) -> Result<Self, IdError> {
        let name = name.into();
        check_name(&name)?;
        Ok(ActorId(Arc::new(ActorIdInner { proc, name, index })))
    }

    /// The proc hosting the actor.
    pub fn proc(&self) -> &ProcId {
        &self.0.proc
    }

    /// The actor's name.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// The actor's index among actors of the same name on its proc.
    pub fn index(&self) -> u32 {
        self.0.index
    }

    /// Port `port` of this actor.
    pub fn port(&self, port: u64) -> PortId {
        PortId {
            actor: self.clone(),
            port,
        }
    }
}

impl fmt::Display for ActorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}[{}]", self.0.proc, self.0.name, self.0.index)
    }
}

/// Splits `text[n]` into `text` and `n`.
fn split_index<T: FromStr>(s: &str) -> Option<(&str, T)> {
    let body = s.strip_suffix(']')?;
    let (head, n) = body.rsplit_once('[')?;
    Some((head, n.parse().ok()?))
}

impl FromStr for ActorId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        let form = "expected PROC/NAME[INDEX], e.g. tcp:10.0.0.5:26602/agent/worker[0]";
        let (head, index) = split_index::<u32>(s).ok_or_else(|| invalid("actor id", s, form))?;
        let (proc, name) = head
            .rsplit_once('/')
            .ok_or_else(|| invalid("actor id", s, form))?;
        ActorId::new(proc.parse()?, name, index)
    }
}

/// A port of an actor.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PortId {
    actor: ActorId,
    port: u64,
}

impl PortId {
    /// The actor owning the port.
    pub fn actor(&self) -> &ActorId {
        &self.actor
    }

    /// The port number.
    pub fn index(&self) -> u64 {
        self.port
    }
}

impl fmt::Display for PortId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}]", self.actor, self.port)
    }
}

impl FromStr for PortId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        let (head, port) = split_index::<u64>(s).ok_or_else(|| {
            invalid(
                "port id",
                s,
                "expected ACTOR[PORT], e.g. tcp:10.0.0.5:26602/agent/worker[0][17]",
            )
        })?;
        Ok(PortId {
            actor: head.parse()?,
            port,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<T>(s: &str)
    where
        T: FromStr<Err = IdError>
            + fmt::Display
            + PartialEq
            + fmt::Debug
            + Serialize
            + for<'de> Deserialize<'de>,
    {
        let v: T = s.parse().unwrap_or_else(|e| panic!("{s}: {e}"));
        assert_eq!(v.to_string(), s);
        assert_eq!(v.to_string().parse::<T>().unwrap(), v);
        let bytes = postcard::to_allocvec(&v).unwrap();
        assert_eq!(postcard::from_bytes::<T>(&bytes).unwrap(), v);
    }

    #[test]
    fn text_forms_round_trip() {
        round_trip::<ChannelAddr>("tcp:127.0.0.1:26602");
        round_trip::<ChannelAddr>("tcp:[::1]:80");
        round_trip::<ChannelAddr>("unix:/run/hm/a.sock");
        round_trip::<ChannelAddr>("unbound:00000000deadbeef");
        round_trip::<ProcId>("tcp:10.0.0.5:26602/agent");
        round_trip::<ProcId>("unix:/tmp/x.sock/p-1");
        round_trip::<ProcId>("unbound:0123456789abcdef/operator.7f3a");
        round_trip::<ActorId>("tcp:10.0.0.5:26602/agent/worker[3]");
        round_trip::<ActorId>("unix:/tmp/x.sock/p/w_2[0]");
        round_trip::<PortId>("tcp:10.0.0.5:26602/agent/worker[3][17]");
        assert_eq!(
            "10.0.0.5:1".parse::<ChannelAddr>().unwrap().to_string(),
            "tcp:10.0.0.5:1"
        );
    }

    #[test]
    fn bad_ids_say_what_is_expected() {
        for bad in ["", "tcp:1.2.3.4", "udp:1.2.3.4:5", "unix:"] {
            let e = bad.parse::<ChannelAddr>().unwrap_err().to_string();
            assert!(e.contains("channel address"), "{e}");
        }
        assert!("tcp:1.2.3.4:5".parse::<ProcId>().is_err());
        assert!("tcp:1.2.3.4:5/bad name".parse::<ProcId>().is_err());
        assert!("tcp:1.2.3.4:5/p/a".parse::<ActorId>().is_err());
        assert!("tcp:1.2.3.4:5/p/a[x]".parse::<ActorId>().is_err());
        assert!("tcp:1.2.3.4:5/p/a[1]".parse::<PortId>().is_err());
        assert!(!ChannelAddr::Unbound(1).is_dialable());
        assert!("unbound".parse::<ChannelAddr>().is_err());
        assert!(
            !"tcp:0.0.0.0:5"
                .parse::<ChannelAddr>()
                .unwrap()
                .is_dialable()
        );
        assert!(
            "tcp:127.0.0.1:5"
                .parse::<ChannelAddr>()
                .unwrap()
                .is_dialable()
        );
    }
}
