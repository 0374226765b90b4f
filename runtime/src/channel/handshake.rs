//! Connection handshake: exchanges proc ids and, when a shared secret is
//! configured, authenticates both sides with HMAC-SHA256 challenge-response.
//!
//! ```text
//! dialer   -> acceptor  Open      { dialer proc id, nonce_d, claim_d }
//! acceptor -> dialer    Challenge { acceptor proc id, nonce_a, mac_a, claim_a }
//! dialer   -> acceptor  Proof     { mac_d }
//! acceptor -> dialer    Welcome | Reject { reason }
//! mac_a = HMAC(secret, "hostmesh/1 acceptor" | dialer id | acceptor id | nonce_d | nonce_a | claim_d | claim_a)
//! mac_d = HMAC(secret, "hostmesh/1 dialer"   | dialer id | acceptor id | nonce_d | nonce_a | claim_d | claim_a)
//! ```
//!
//! `claim` is the optional rank epoch of each side ([`super::epoch`]).
//!
//! Invariants:
//! 1. The secret never crosses the wire; only MACs over fresh nonces do.
//! 2. MACs are checked with `ring::hmac::verify` (constant time).
//! 3. Different labels per direction, so a MAC cannot be reflected back.
//! 4. A side with a secret refuses a peer without one, and vice versa.
//! 5. Once the MAC checks out, each side refuses a peer whose epoch claim
//!    is older than the epoch its table knows for that rank.
//! 6. A dialer of another wire protocol version ([`frame::VERSION`]) is
//!    refused before anything else, with a `Reject` framed in its own
//!    version: `Reject` is the fifth variant with one string in every
//!    version, so the older or newer peer reads why.
//! 7. With a shared secret, both sides derive the connection's session
//!    keys from it and both nonces once the peer proved it holds the
//!    secret, and every byte after `Welcome` is sealed ([`super::seal`]).

use bytes::BytesMut;
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::ChannelError;
use super::epoch::{EpochClaim, Epochs};
use super::frame::{self, Frame};
use super::seal::{Role, Session};
use crate::id::ProcId;

/// What a transport authenticates (and seals) its connections with.
pub(crate) struct Keys {
    mac: hmac::Key,
    secret: Vec<u8>,
    /// Whether connections are sealed (false only for the benchmark
    /// baseline, see [`super::seal`] invariant 6).
    seal: bool,
}

impl Keys {
    /// Keys from the shared secret; `seal`: encrypt connections.
    pub(crate) fn new(secret: &[u8], seal: bool) -> Self {
        Keys {
            mac: hmac::Key::new(hmac::HMAC_SHA256, secret),
            secret: secret.to_vec(),
            seal,
        }
    }
}

/// An established connection: the peer, any bytes read past the
/// handshake, and the record layer (`None`: frames in the clear).
#[derive(Debug)]
pub(crate) struct Established {
    pub(crate) peer: ProcId,
    pub(crate) left: BytesMut,
    pub(crate) session: Option<Session>,
}

/// The session of a connection authenticated with `keys` (invariant 7).
fn session(
    keys: Option<&Keys>,
    dialer: &ProcId,
    acceptor: &ProcId,
    nd: &[u8; 32],
    na: &[u8; 32],
    claims: EpochClaims,
    role: Role,
) -> Result<Option<Session>, ChannelError> {
    let Some(k) = keys.filter(|k| k.seal) else {
        return Ok(None);
    };
    let t = transcript(SESSION, dialer, acceptor, nd, na, claims);
    Session::derive(&k.secret, nd, na, &t, role).map(Some)
}

/// Largest handshake frame accepted.
const MAX_HELLO: usize = 16 * 1024;

/// Handshake messages. Invariant 6: `Reject` stays the fifth variant
/// with a single string, in this and every later version.
#[derive(Serialize, Deserialize)]
enum Hello {
    Open {
        proc: ProcId,
        nonce: [u8; 32],
        claim: Option<EpochClaim>,
    },
    Challenge {
        proc: ProcId,
        nonce: [u8; 32],
        mac: Vec<u8>,
        claim: Option<EpochClaim>,
    },
    Proof {
        mac: Vec<u8>,
    },
    Welcome,
    Reject {
        reason: String,
    },
}

fn nonce() -> Result<[u8; 32], ChannelError> {
    let mut n = [0u8; 32];
    SystemRandom::new()
        .fill(&mut n)
        .map_err(|_| ChannelError::Auth("no system randomness available".into()))?;
    Ok(n)
}

/// The two sides' epoch claims, dialer's first.
type EpochClaims = (Option<EpochClaim>, Option<EpochClaim>);

fn transcript(
    label: &str,
    dialer: &ProcId,
    acceptor: &ProcId,
    nd: &[u8; 32],
    na: &[u8; 32],
    claims: EpochClaims,
) -> Vec<u8> {
    let mut t = Vec::with_capacity(160);
    for part in [label.to_string(), dialer.to_string(), acceptor.to_string()] {
        t.extend_from_slice(&(part.len() as u32).to_be_bytes());
        t.extend_from_slice(part.as_bytes());
    }
    t.extend_from_slice(nd);
    t.extend_from_slice(na);
    for c in [claims.0, claims.1] {
        match c {
            None => t.push(0),
            Some(c) => {
                t.push(1);
                t.extend_from_slice(&c.rank.to_be_bytes());
                t.extend_from_slice(&c.epoch.to_be_bytes());
            }
        }
    }
    t
}

const ACCEPTOR: &str = "hostmesh/1 acceptor";
const DIALER: &str = "hostmesh/1 dialer";
const SESSION: &str = "hostmesh/4 session";

async fn send<S: AsyncWrite + Unpin>(s: &mut S, msg: &Hello) -> Result<(), ChannelError> {
    let mut buf = BytesMut::new();
    frame::encode_hello(&mut buf, msg)?;
    s.write_all(&buf).await.map_err(ChannelError::Io)?;
    s.flush().await.map_err(ChannelError::Io)
}

async fn recv<S: AsyncRead + Unpin>(s: &mut S, buf: &mut BytesMut) -> Result<Hello, ChannelError> {
    loop {
        match frame::decode(buf, MAX_HELLO, &mut None)? {
            Some(Frame::Hello(body)) => {
                return postcard::from_bytes(&body)
                    .map_err(|e| ChannelError::Protocol(format!("bad handshake message: {e}")));
            }
            Some(_) => {
                return Err(ChannelError::Protocol(
                    "expected a handshake frame before any other".into(),
                ));
            }
            None => {}
        }
        if s.read_buf(buf).await.map_err(ChannelError::Io)? == 0 {
            return Err(ChannelError::Protocol(
                "peer closed the connection during the handshake".into(),
            ));
        }
    }
}

fn mac(keys: Option<&Keys>, t: &[u8]) -> Vec<u8> {
    keys.map(|k| hmac::sign(&k.mac, t).as_ref().to_vec())
        .unwrap_or_default()
}

/// Dialer side.
pub(crate) async fn dial<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    local: &ProcId,
    keys: Option<&Keys>,
    epochs: &Epochs,
) -> Result<Established, ChannelError> {
    let mut buf = BytesMut::with_capacity(4096);
    let nd = nonce()?;
    send(
        s,
        &Hello::Open {
            proc: local.clone(),
            nonce: nd,
            claim: epochs.own,
        },
    )
    .await?;
    let (peer, na, mac_a, claim_a) = match recv(s, &mut buf).await? {
        Hello::Challenge {
            proc,
            nonce,
            mac,
            claim,
        } => (proc, nonce, mac, claim),
        Hello::Reject { reason } => {
            return Err(ChannelError::Auth(format!("peer refused: {reason}")));
        }
        _ => return Err(ChannelError::Protocol("expected a challenge".into())),
    };
    match keys {
        Some(k) => {
            let t = transcript(ACCEPTOR, local, &peer, &nd, &na, (epochs.own, claim_a));
            hmac::verify(&k.mac, &t, &mac_a).map_err(|_| {
                ChannelError::Auth(format!(
                    "{peer} failed authentication: it does not hold our shared secret"
                ))
            })?;
        }
        None if !mac_a.is_empty() => {
            return Err(ChannelError::Auth(format!(
                "{peer} requires authentication: configure the shared secret on this proc"
            )));
        }
        None => {}
    }
    // Invariant 5.
    epochs
        .table
        .admit(claim_a.as_ref())
        .map_err(|why| ChannelError::Auth(format!("{peer} refused: {why}")))?;
    let proof = mac(
        keys,
        &transcript(DIALER, local, &peer, &nd, &na, (epochs.own, claim_a)),
    );
    send(s, &Hello::Proof { mac: proof }).await?;
    match recv(s, &mut buf).await? {
        Hello::Welcome => {
            let claims = (epochs.own, claim_a);
            let session = session(keys, local, &peer, &nd, &na, claims, Role::Dialer)?;
            Ok(Established {
                peer,
                left: buf,
                session,
            })
        }
        Hello::Reject { reason } => Err(ChannelError::Auth(format!("{peer} refused: {reason}"))),
        _ => Err(ChannelError::Protocol("expected welcome or reject".into())),
    }
}

/// Acceptor side.
pub(crate) async fn accept<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    local: &ProcId,
    keys: Option<&Keys>,
    epochs: &Epochs,
) -> Result<Established, ChannelError> {
    let mut buf = BytesMut::with_capacity(4096);
    let open = match recv(s, &mut buf).await {
        // Invariant 6.
        Err(ChannelError::Version { peer, ours }) => {
            let reason = format!(
                "{local} speaks hostmesh wire protocol {ours}, the dialer {peer}: both ends must run compatible hostmesh builds"
            );
            let mut out = BytesMut::new();
            if frame::encode_hello_as(&mut out, peer, &Hello::Reject { reason }).is_ok() {
                // Best effort, like any refusal.
                let _ = s.write_all(&out).await;
                let _ = s.flush().await;
            }
            return Err(ChannelError::Version { peer, ours });
        }
        r => r?,
    };
    let (peer, nd, claim_d) = match open {
        Hello::Open { proc, nonce, claim } => (proc, nonce, claim),
        _ => return Err(ChannelError::Protocol("expected an open message".into())),
    };
    let na = nonce()?;
    let claims = (claim_d, epochs.own);
    let mac_a = mac(keys, &transcript(ACCEPTOR, &peer, local, &nd, &na, claims));
    send(
        s,
        &Hello::Challenge {
            proc: local.clone(),
            nonce: na,
            mac: mac_a,
            claim: epochs.own,
        },
    )
    .await?;
    let proof = match recv(s, &mut buf).await? {
        Hello::Proof { mac } => mac,
        _ => return Err(ChannelError::Protocol("expected a proof".into())),
    };
    let verdict = match keys {
        Some(k) => hmac::verify(
            &k.mac,
            &transcript(DIALER, &peer, local, &nd, &na, claims),
            &proof,
        )
        .map_err(|_| format!("{peer} failed authentication: wrong or missing shared secret")),
        None if !proof.is_empty() => Err(format!(
            "{peer} sent a proof but this proc has no shared secret configured"
        )),
        None => Ok(()),
    }
    // Invariant 5.
    .and_then(|()| epochs.table.admit(claim_d.as_ref()));
    match verdict {
        Ok(()) => {
            let session = session(keys, &peer, local, &nd, &na, claims, Role::Acceptor)?;
            send(s, &Hello::Welcome).await?;
            Ok(Established {
                peer,
                left: buf,
                session,
            })
        }
        Err(reason) => {
            // Best effort: tell the peer why, then fail.
            let _ = send(
                s,
                &Hello::Reject {
                    reason: reason.clone(),
                },
            )
            .await;
            Err(ChannelError::Auth(reason))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> ProcId {
        s.parse().unwrap()
    }

    async fn run(
        dk: Option<&[u8]>,
        ak: Option<&[u8]>,
    ) -> (Result<ProcId, ChannelError>, Result<ProcId, ChannelError>) {
        run_with(dk, ak, Epochs::default(), Epochs::default()).await
    }

    async fn run_with(
        dk: Option<&[u8]>,
        ak: Option<&[u8]>,
        de: Epochs,
        ae: Epochs,
    ) -> (Result<ProcId, ChannelError>, Result<ProcId, ChannelError>) {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let dk = dk.map(|k| Keys::new(k, true));
        let ak = ak.map(|k| Keys::new(k, true));
        let d = id("unbound:1/client");
        let acc = id("tcp:127.0.0.1:9/server");
        // Each side owns its stream, so a side that gives up closes it.
        let (r1, r2) = tokio::join!(
            async move { dial(&mut a, &d, dk.as_ref(), &de).await },
            async move { accept(&mut b, &acc, ak.as_ref(), &ae).await }
        );
        (r1.map(|r| r.peer), r2.map(|r| r.peer))
    }

    #[tokio::test]
    async fn same_secret_authenticates_both_sides() {
        let (d, a) = run(Some(b"s3cret"), Some(b"s3cret")).await;
        assert_eq!(d.unwrap(), id("tcp:127.0.0.1:9/server"));
        assert_eq!(a.unwrap(), id("unbound:1/client"));
        let (d, a) = run(None, None).await;
        assert!(d.is_ok() && a.is_ok());
    }

    #[tokio::test]
    async fn wrong_or_missing_secret_is_refused() {
        let (d, a) = run(Some(b"one"), Some(b"two")).await;
        assert!(matches!(d, Err(ChannelError::Auth(_))));
        assert!(a.is_err());
        let (d, a) = run(None, Some(b"two")).await;
        // The dialer sees the acceptor demands a secret and gives up first.
        assert!(
            matches!(d, Err(ChannelError::Auth(ref m)) if m.contains("configure the shared secret")),
            "{d:?}"
        );
        assert!(a.is_err(), "acceptor never admits a dialer without secret");
        let (d, _a) = run(Some(b"one"), None).await;
        assert!(
            matches!(d, Err(ChannelError::Auth(_))),
            "dialer refuses an unauthenticated acceptor"
        );
    }

    async fn established(keys: Option<Keys>) -> (Established, Established) {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let (d, acc) = (id("unbound:1/client"), id("tcp:127.0.0.1:9/server"));
        let (de, ae) = (Epochs::default(), Epochs::default());
        let (r1, r2) = tokio::join!(
            dial(&mut a, &d, keys.as_ref(), &de),
            accept(&mut b, &acc, keys.as_ref(), &ae)
        );
        (r1.unwrap(), r2.unwrap())
    }

    /// Invariant 7: with the secret both sides derive one session per
    /// connection (what one seals the other opens, in each direction, and
    /// another connection's keys open nothing); without it there is none,
    /// nor in the benchmark baseline.
    #[tokio::test]
    async fn a_shared_secret_keys_a_fresh_session_per_connection() {
        let (d, a) = established(Some(Keys::new(b"s3cret", true))).await;
        let (mut ds, mut as_) = (d.session.unwrap(), a.session.unwrap());
        let mut wire = Vec::new();
        let mut frames = BytesMut::from(&b"to the acceptor"[..]);
        ds.sealer.write(&mut wire, &mut frames, None).await.unwrap();
        let rec = BytesMut::from(&wire[..]);
        let (_, mut other) = established(Some(Keys::new(b"s3cret", true))).await;
        let mut other = other.session.take().unwrap();
        assert!(other.opener.open(rec.clone()).is_err(), "fresh keys");
        assert_eq!(&as_.opener.open(rec).unwrap()[..], b"to the acceptor");
        let mut wire = Vec::new();
        let mut frames = BytesMut::from(&b"to the dialer"[..]);
        as_.sealer
            .write(&mut wire, &mut frames, None)
            .await
            .unwrap();
        assert_eq!(
            &ds.opener.open(BytesMut::from(&wire[..])).unwrap()[..],
            b"to the dialer"
        );
        let (d, a) = established(None).await;
        assert!(d.session.is_none() && a.session.is_none());
        let (d, a) = established(Some(Keys::new(b"s3cret", false))).await;
        assert!(d.session.is_none() && a.session.is_none());
    }

    /// Invariant 6: a dialer of another version gets a `Reject` in its
    /// own version's frame, which names both versions, and the acceptor
    /// fails with the typed error.
    #[tokio::test]
    async fn a_dialer_of_another_version_is_told_in_its_own_version() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let acc = id("tcp:127.0.0.1:9/server");
        let server = tokio::spawn(async move {
            accept(&mut b, &acc, None, &Epochs::default())
                .await
                .map(|r| r.peer)
        });
        // A future version's Open (its body does not matter).
        let mut open = BytesMut::new();
        frame::encode_hello_as(&mut open, frame::VERSION + 1, &"an open of v+1").unwrap();
        a.write_all(&open).await.unwrap();
        let mut reply = Vec::new();
        a.read_to_end(&mut reply).await.unwrap();
        assert_eq!(
            &reply[..4],
            [b'H', b'M', frame::VERSION + 1, 1],
            "{reply:?}"
        );
        // The fifth variant, one string: what any version decodes as Reject.
        let body = &reply[frame::HEADER_LEN..];
        assert_eq!(body[0], 4, "Reject is variant 4");
        let (reason, rest): (String, _) = postcard::take_from_bytes(&body[1..]).unwrap();
        assert!(rest.is_empty());
        let ours = frame::VERSION;
        assert!(
            reason.contains(&format!("wire protocol {ours}, the dialer {}", ours + 1)),
            "{reason}"
        );
        let e = server.await.unwrap().unwrap_err();
        assert!(
            matches!(e, ChannelError::Version { peer, ours: o } if peer == ours + 1 && o == ours),
            "{e:?}"
        );
        assert!(e.to_string().contains("compatible hostmesh builds"), "{e}");
    }

    /// A dialer that meets an acceptor of another version says which.
    #[tokio::test]
    async fn an_acceptor_of_another_version_is_named_by_the_dialer() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let d = id("unbound:1/client");
        let client = tokio::spawn(async move {
            dial(&mut a, &d, None, &Epochs::default())
                .await
                .map(|r| r.peer)
        });
        let mut first = vec![0u8; 1];
        b.read_exact(&mut first).await.unwrap();
        let mut challenge = BytesMut::new();
        frame::encode_hello_as(&mut challenge, 9, &"a challenge of v9").unwrap();
        b.write_all(&challenge).await.unwrap();
        let e = client.await.unwrap().unwrap_err();
        assert!(matches!(e, ChannelError::Version { peer: 9, .. }), "{e:?}");
    }

    fn claiming(rank: hostmesh_mesh::Rank, epoch: u64) -> Epochs {
        Epochs {
            own: Some(EpochClaim { rank, epoch }),
            table: super::super::epoch::EpochTable::default(),
        }
    }

    /// Invariant 5, both ways: whoever knows a newer epoch for the peer's
    /// rank refuses it; current claims and unclaimed peers pass.
    #[tokio::test]
    async fn a_stale_epoch_claim_is_refused() {
        let k = Some(&b"s3cret"[..]);
        let knows = claiming(0, 1);
        knows.table.raise(1, 6);
        let (d, a) = run_with(k, k, claiming(1, 5), knows.clone()).await;
        assert!(
            matches!(&a, Err(ChannelError::Auth(m)) if m.contains("stale peer")),
            "{a:?}"
        );
        assert!(d.is_err(), "the stale dialer is told: {d:?}");
        let (d, a) = run_with(k, k, knows.clone(), claiming(1, 5)).await;
        assert!(
            matches!(&d, Err(ChannelError::Auth(m)) if m.contains("stale peer")),
            "{d:?}"
        );
        assert!(a.is_err());
        let (d, a) = run_with(k, k, claiming(1, 6), knows.clone()).await;
        assert!(d.is_ok() && a.is_ok(), "{d:?} {a:?}");
        let (d, a) = run_with(k, k, Epochs::default(), knows).await;
        assert!(d.is_ok() && a.is_ok(), "{d:?} {a:?}");
    }
}
