//! Connection handshake: exchanges proc ids and authenticates both sides,
//! in one of two modes chosen by what the proc holds ([`Keys`]).
//!
//! **Shared secret** (an agent's own proc and whoever speaks to it: the
//! operator): HMAC-SHA256 challenge-response over the secret both hold.
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
//! **Proc credential** (runtime-aware procs, the agent's proc desk,
//! clients of actors; [`super::credential`]): each side signs the
//! transcript with the key of a certificate its World's issuer signed for
//! its own proc name and epoch claim, and the session keys come from an
//! ephemeral X25519 exchange.
//!
//! ```text
//! dialer   -> acceptor  SignedOpen      { dialer proc id, nonce_d, claim_d, share_d }
//! acceptor -> dialer    SignedChallenge { acceptor proc id, nonce_a, claim_a, share_a, cert_a, sig_a }
//! dialer   -> acceptor  SignedProof     { cert_d, sig_d }
//! acceptor -> dialer    Welcome | Reject { reason }
//! sig_x = Ed25519(key of cert_x, label_x | dialer id | acceptor id | nonce_d | nonce_a | claim_d | claim_a | share_d | share_a)
//! ```
//!
//! `claim` is the optional rank epoch of each side ([`super::epoch`]).
//!
//! Invariants:
//! 1. No secret crosses the wire; only MACs or signatures over fresh
//!    nonces (and, signed, fresh key shares) do.
//! 2. MACs are checked with `ring::hmac::verify` (constant time).
//! 3. Different labels per direction, so a MAC or signature cannot be
//!    reflected back.
//! 4. A side with a secret refuses a peer without one, and vice versa; a
//!    side with a credential refuses a peer in the shared-secret mode, and
//!    vice versa, each with a `Reject` naming what the other must hold.
//! 5. Once the MAC or signature checks out, each side refuses a peer whose
//!    epoch claim is older than the epoch its table knows for that rank.
//! 6. A dialer of another wire protocol version ([`frame::VERSION`]) is
//!    refused before anything else, with a `Reject` framed in its own
//!    version: `Reject` is the fifth variant with one string in every
//!    version, so the older or newer peer reads why. New variants go
//!    after it.
//! 7. Both sides derive the connection's session keys once the peer proved
//!    itself, and every byte after `Welcome` is sealed ([`super::seal`]):
//!    from the shared secret and both nonces, or from the X25519 shared
//!    secret (forward secret: a key learned later opens no recorded
//!    connection) and both nonces.
//! 8. A signed peer is admitted only with a certificate this proc's
//!    credential admits (its issuer, or one its lineage links to:
//!    [`super::credential`] invariant 5), that names the peer's own proc name and its
//!    own epoch claim, and whose key signed this connection's transcript:
//!    a proc holding its credential can join only as itself.
//! 9. While a World's secret is rotated, a shared-secret dialer may hold
//!    the previous secret besides the current one: the acceptor proves
//!    itself first, so the dialer proves itself, and keys the session,
//!    with whichever of its secrets the acceptor's MAC verifies under.
//!    An acceptor uses only its current secret.

use bytes::BytesMut;
use ring::agreement::{self, EphemeralPrivateKey, X25519};
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::ChannelError;
use super::credential::{Certificate, Credential};
use super::epoch::{EpochClaim, Epochs};
use super::frame::{self, Frame};
use super::seal::{Role, Session};
use crate::id::ProcId;

/// What a transport authenticates (and seals) its connections with.
pub(crate) struct Keys {
    auth: Auth,
    /// Whether connections are sealed (false only for the benchmark
    /// baseline, see [`super::seal`] invariant 6).
    seal: bool,
}

/// The two modes of the module doc.
enum Auth {
    /// The current secret first, then any previous one (invariant 9).
    Shared(Vec<SharedKey>),
    Signed(Credential),
}

/// One shared secret and its MAC key.
struct SharedKey {
    mac: hmac::Key,
    secret: Vec<u8>,
}

impl SharedKey {
    fn new(secret: &[u8]) -> Self {
        SharedKey {
            mac: hmac::Key::new(hmac::HMAC_SHA256, secret),
            secret: secret.to_vec(),
        }
    }
}

impl Keys {
    /// Keys from the shared secret; `seal`: encrypt connections.
    pub(crate) fn new(secret: &[u8], seal: bool) -> Self {
        Self::rotating(secret, None, seal)
    }

    /// Keys from the current shared secret and, while it is rotated, the
    /// previous one a dialer may still meet (invariant 9).
    pub(crate) fn rotating(secret: &[u8], previous: Option<&[u8]>, seal: bool) -> Self {
        let keys = std::iter::once(secret)
            .chain(previous.filter(|p| *p != secret))
            .map(SharedKey::new)
            .collect();
        Keys {
            auth: Auth::Shared(keys),
            seal,
        }
    }

    /// Whether connections are sealed.
    pub(crate) fn seal(&self) -> bool {
        self.seal
    }

    /// This side's shared keys, current first (none in the signed mode).
    fn shared(&self) -> &[SharedKey] {
        match &self.auth {
            Auth::Shared(k) => k,
            Auth::Signed(_) => &[],
        }
    }

    /// Keys from a proc credential; `seal`: encrypt connections.
    pub(crate) fn signed(credential: Credential, seal: bool) -> Self {
        Keys {
            auth: Auth::Signed(credential),
            seal,
        }
    }

    /// The current secret's MAC key (what an acceptor proves with).
    fn mac(&self) -> Option<&hmac::Key> {
        self.shared().first().map(|k| &k.mac)
    }

    fn credential(&self) -> Option<&Credential> {
        match &self.auth {
            Auth::Signed(c) => Some(c),
            Auth::Shared(_) => None,
        }
    }
}

/// An established connection: the peer, any bytes read past the
/// handshake, the record layer (`None`: frames in the clear), and whether
/// the peer proved its proc name with a proc credential (invariant 8).
#[derive(Debug)]
pub(crate) struct Established {
    pub(crate) peer: ProcId,
    pub(crate) left: BytesMut,
    pub(crate) session: Option<Session>,
    pub(crate) attested: bool,
}

/// The session of a connection authenticated with the shared secret
/// `key` (invariant 7).
#[allow(clippy::too_many_arguments)]
fn session(
    keys: Option<&Keys>,
    key: Option<&SharedKey>,
    dialer: &ProcId,
    acceptor: &ProcId,
    nd: &[u8; 32],
    na: &[u8; 32],
    claims: EpochClaims,
    role: Role,
) -> Result<Option<Session>, ChannelError> {
    if !keys.is_some_and(|k| k.seal) {
        return Ok(None);
    }
    let Some(k) = key else {
        return Ok(None);
    };
    let t = transcript(SESSION, dialer, acceptor, nd, na, claims);
    Session::derive(&k.secret, nd, na, &t, role).map(Some)
}

/// Largest handshake frame accepted.
const MAX_HELLO: usize = 16 * 1024;

/// Handshake messages. Invariant 6: `Reject` stays the fifth variant
/// with a single string, in this and every later version; new variants
/// go after it.
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
    SignedOpen {
        proc: ProcId,
        nonce: [u8; 32],
        claim: Option<EpochClaim>,
        share: [u8; 32],
    },
    SignedChallenge {
        proc: ProcId,
        nonce: [u8; 32],
        claim: Option<EpochClaim>,
        share: [u8; 32],
        cert: Certificate,
        signature: Vec<u8>,
    },
    SignedProof {
        cert: Certificate,
        signature: Vec<u8>,
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
    let mut t = Vec::with_capacity(224);
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
const SIGNED_ACCEPTOR: &str = "hostmesh/5 signed acceptor";
const SIGNED_DIALER: &str = "hostmesh/5 signed dialer";
const SIGNED_SESSION: &str = "hostmesh/5 signed session";

/// What a signed side's `Reject` says to a shared-secret peer, and the
/// reverse (invariant 4).
const WANTS_CREDENTIAL: &str = "this proc admits only procs holding a proc credential of its World (runtime-aware procs get one from their agent in HOSTMESH_PROC_CREDENTIAL; clients issue one from the World's runtime key)";
const WANTS_SECRET: &str = "this proc admits only peers holding its World's shared secret (the operator's link to an agent), not a proc credential";

/// One signed side's handshake state: its ephemeral key and share.
struct Signer<'a> {
    credential: &'a Credential,
    ephemeral: EphemeralPrivateKey,
    share: [u8; 32],
}

impl<'a> Signer<'a> {
    fn new(credential: &'a Credential) -> Result<Self, ChannelError> {
        let no_rng = |_| ChannelError::Auth("no system randomness available".into());
        let ephemeral =
            EphemeralPrivateKey::generate(&X25519, &SystemRandom::new()).map_err(no_rng)?;
        let public = ephemeral.compute_public_key().map_err(no_rng)?;
        let mut share = [0u8; 32];
        share.copy_from_slice(public.as_ref());
        Ok(Signer {
            credential,
            ephemeral,
            share,
        })
    }

    /// The session from the X25519 exchange with `peer_share` (invariant 7).
    fn session(
        self,
        seal: bool,
        peer_share: &[u8; 32],
        nd: &[u8; 32],
        na: &[u8; 32],
        t: &[u8],
        role: Role,
    ) -> Result<Option<Session>, ChannelError> {
        if !seal {
            return Ok(None);
        }
        agreement::agree_ephemeral(
            self.ephemeral,
            &agreement::UnparsedPublicKey::new(&X25519, peer_share),
            |shared| Session::derive(shared, nd, na, t, role),
        )
        .map_err(|_| ChannelError::Auth("the peer's key share is not an X25519 key".into()))?
        .map(Some)
    }
}

/// The signed transcript: the shared-secret one plus both key shares.
#[allow(clippy::too_many_arguments)]
fn signed_transcript(
    label: &str,
    dialer: &ProcId,
    acceptor: &ProcId,
    nd: &[u8; 32],
    na: &[u8; 32],
    claims: EpochClaims,
    share_d: &[u8; 32],
    share_a: &[u8; 32],
) -> Vec<u8> {
    let mut t = transcript(label, dialer, acceptor, nd, na, claims);
    t.extend_from_slice(share_d);
    t.extend_from_slice(share_a);
    t
}

/// Invariant 8: `peer`, claiming `claim`, proved itself with `cert` and
/// `signature` over `t`.
fn check_signed_peer(
    ours: &Credential,
    peer: &ProcId,
    claim: Option<EpochClaim>,
    cert: &Certificate,
    t: &[u8],
    signature: &[u8],
) -> Result<(), String> {
    if let Err(e) = cert.admitted_by(ours) {
        return Err(format!(
            "{peer} presents a proc certificate not issued by this World (another World's, or one from before its secret changed without the lineage that links them): {e}"
        ));
    }
    if cert.name != peer.name() {
        return Err(format!(
            "{peer} presents the certificate of proc {:?}: a proc may join only as itself",
            cert.name
        ));
    }
    if cert.claim != claim {
        let show = |c: Option<EpochClaim>| {
            c.map(|c| format!("rank {} epoch {}", c.rank, c.epoch))
                .unwrap_or_else(|| "no epoch".into())
        };
        return Err(format!(
            "{peer} claims {} but its certificate is for {}",
            show(claim),
            show(cert.claim)
        ));
    }
    if !cert.verify_signature(t, signature) {
        return Err(format!(
            "{peer} failed authentication: it does not hold its certificate's key"
        ));
    }
    Ok(())
}

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

/// Best effort: tell the peer why, then fail with it.
async fn refuse<S: AsyncWrite + Unpin, T>(s: &mut S, reason: String) -> Result<T, ChannelError> {
    let _ = send(
        s,
        &Hello::Reject {
            reason: reason.clone(),
        },
    )
    .await;
    Err(ChannelError::Auth(reason))
}

fn mac(keys: Option<&Keys>, t: &[u8]) -> Vec<u8> {
    keys.and_then(Keys::mac)
        .map(|k| hmac::sign(k, t).as_ref().to_vec())
        .unwrap_or_default()
}

/// Dialer side.
pub(crate) async fn dial<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    local: &ProcId,
    keys: Option<&Keys>,
    epochs: &Epochs,
) -> Result<Established, ChannelError> {
    if let Some(k) = keys
        && let Some(c) = k.credential()
    {
        return dial_signed(s, local, c, k.seal, epochs).await;
    }
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
    let ours = keys.map(Keys::shared).unwrap_or_default();
    // Invariant 9: the secret the acceptor proved itself with.
    let key = if ours.is_empty() {
        if !mac_a.is_empty() {
            return Err(ChannelError::Auth(format!(
                "{peer} requires authentication: configure the shared secret on this proc"
            )));
        }
        None
    } else {
        let t = transcript(ACCEPTOR, local, &peer, &nd, &na, (epochs.own, claim_a));
        let found = ours
            .iter()
            .find(|k| hmac::verify(&k.mac, &t, &mac_a).is_ok());
        Some(found.ok_or_else(|| {
            ChannelError::Auth(format!(
                "{peer} failed authentication: it does not hold our shared secret"
            ))
        })?)
    };
    // Invariant 5.
    epochs
        .table
        .admit(claim_a.as_ref())
        .map_err(|why| ChannelError::Auth(format!("{peer} refused: {why}")))?;
    let proof = key
        .map(|k| {
            let t = transcript(DIALER, local, &peer, &nd, &na, (epochs.own, claim_a));
            hmac::sign(&k.mac, &t).as_ref().to_vec()
        })
        .unwrap_or_default();
    send(s, &Hello::Proof { mac: proof }).await?;
    match recv(s, &mut buf).await? {
        Hello::Welcome => {
            let claims = (epochs.own, claim_a);
            let session = session(keys, key, local, &peer, &nd, &na, claims, Role::Dialer)?;
            Ok(Established {
                peer,
                left: buf,
                session,
                attested: false,
            })
        }
        Hello::Reject { reason } => Err(ChannelError::Auth(format!("{peer} refused: {reason}"))),
        _ => Err(ChannelError::Protocol("expected welcome or reject".into())),
    }
}

/// Dialer side, signed.
async fn dial_signed<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    local: &ProcId,
    credential: &Credential,
    seal: bool,
    epochs: &Epochs,
) -> Result<Established, ChannelError> {
    let mut buf = BytesMut::with_capacity(4096);
    let nd = nonce()?;
    let signer = Signer::new(credential)?;
    send(
        s,
        &Hello::SignedOpen {
            proc: local.clone(),
            nonce: nd,
            claim: epochs.own,
            share: signer.share,
        },
    )
    .await?;
    let (peer, na, claim_a, share_a, cert_a, sig_a) = match recv(s, &mut buf).await? {
        Hello::SignedChallenge {
            proc,
            nonce,
            claim,
            share,
            cert,
            signature,
        } => (proc, nonce, claim, share, cert, signature),
        Hello::Reject { reason } => {
            return Err(ChannelError::Auth(format!("peer refused: {reason}")));
        }
        Hello::Challenge { proc, .. } => {
            return Err(ChannelError::Auth(format!(
                "{proc} authenticates with a shared secret, not proc credentials: it is not a proc of this World's runtime"
            )));
        }
        _ => return Err(ChannelError::Protocol("expected a challenge".into())),
    };
    let claims = (epochs.own, claim_a);
    let t = |label| {
        signed_transcript(
            label,
            local,
            &peer,
            &nd,
            &na,
            claims,
            &signer.share,
            &share_a,
        )
    };
    let verdict = check_signed_peer(
        credential,
        &peer,
        claim_a,
        &cert_a,
        &t(SIGNED_ACCEPTOR),
        &sig_a,
    )
    // Invariant 5.
    .and_then(|()| {
        epochs
            .table
            .admit(claim_a.as_ref())
            .map_err(|why| format!("{peer} refused: {why}"))
    });
    if let Err(reason) = verdict {
        return refuse(s, reason).await;
    }
    send(
        s,
        &Hello::SignedProof {
            cert: credential.certificate().clone(),
            signature: signer.credential.sign(&t(SIGNED_DIALER)),
        },
    )
    .await?;
    match recv(s, &mut buf).await? {
        Hello::Welcome => {
            let session_t = t(SIGNED_SESSION);
            let session = signer.session(seal, &share_a, &nd, &na, &session_t, Role::Dialer)?;
            Ok(Established {
                peer,
                left: buf,
                session,
                attested: true,
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
    let credential = keys.and_then(Keys::credential);
    let (peer, nd, claim_d) = match (open, credential) {
        (
            Hello::SignedOpen {
                proc,
                nonce,
                claim,
                share,
            },
            Some(c),
        ) => {
            let seal = keys.is_some_and(|k| k.seal);
            let open = SignedOpen {
                peer: proc,
                nd: nonce,
                claim_d: claim,
                share_d: share,
            };
            return accept_signed(s, buf, local, c, seal, epochs, open).await;
        }
        (Hello::SignedOpen { proc, .. }, None) => {
            return refuse(s, format!("{proc} refused: {WANTS_SECRET}")).await;
        }
        (Hello::Open { proc, .. }, Some(_)) => {
            return refuse(s, format!("{proc} refused: {WANTS_CREDENTIAL}")).await;
        }
        (Hello::Open { proc, nonce, claim }, None) => (proc, nonce, claim),
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
    let verdict = match keys.and_then(Keys::mac) {
        Some(k) => hmac::verify(
            k,
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
            let current = keys.and_then(|k| k.shared().first());
            let session = session(
                keys,
                current,
                &peer,
                local,
                &nd,
                &na,
                claims,
                Role::Acceptor,
            )?;
            send(s, &Hello::Welcome).await?;
            Ok(Established {
                peer,
                left: buf,
                session,
                attested: false,
            })
        }
        Err(reason) => refuse(s, reason).await,
    }
}

/// A dialer's `SignedOpen`, as the acceptor read it.
struct SignedOpen {
    peer: ProcId,
    nd: [u8; 32],
    claim_d: Option<EpochClaim>,
    share_d: [u8; 32],
}

/// Acceptor side, signed, after the dialer's `SignedOpen`.
async fn accept_signed<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    mut buf: BytesMut,
    local: &ProcId,
    credential: &Credential,
    seal: bool,
    epochs: &Epochs,
    open: SignedOpen,
) -> Result<Established, ChannelError> {
    let SignedOpen {
        peer,
        nd,
        claim_d,
        share_d,
    } = open;
    let na = nonce()?;
    let signer = Signer::new(credential)?;
    let claims = (claim_d, epochs.own);
    let t = |label| {
        signed_transcript(
            label,
            &peer,
            local,
            &nd,
            &na,
            claims,
            &share_d,
            &signer.share,
        )
    };
    send(
        s,
        &Hello::SignedChallenge {
            proc: local.clone(),
            nonce: na,
            claim: epochs.own,
            share: signer.share,
            cert: credential.certificate().clone(),
            signature: credential.sign(&t(SIGNED_ACCEPTOR)),
        },
    )
    .await?;
    let (cert_d, sig_d) = match recv(s, &mut buf).await? {
        Hello::SignedProof { cert, signature } => (cert, signature),
        Hello::Reject { reason } => {
            return Err(ChannelError::Auth(format!(
                "{peer} refused this proc: {reason}"
            )));
        }
        _ => return Err(ChannelError::Protocol("expected a signed proof".into())),
    };
    let verdict = check_signed_peer(
        credential,
        &peer,
        claim_d,
        &cert_d,
        &t(SIGNED_DIALER),
        &sig_d,
    )
    // Invariant 5.
    .and_then(|()| epochs.table.admit(claim_d.as_ref()));
    match verdict {
        Ok(()) => {
            let session_t = t(SIGNED_SESSION);
            let session = signer.session(seal, &share_d, &nd, &na, &session_t, Role::Acceptor)?;
            send(s, &Hello::Welcome).await?;
            Ok(Established {
                peer,
                left: buf,
                session,
                attested: true,
            })
        }
        Err(reason) => refuse(s, reason).await,
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

    /// Invariant 9: a dialer holding the current and the previous secret
    /// reaches acceptors of either and keys the session with the one the
    /// acceptor holds; an acceptor admits only its current secret.
    #[tokio::test]
    async fn a_rotating_dialer_answers_with_the_secret_its_acceptor_holds() {
        for held in [&b"new secret"[..], b"old secret"] {
            let (mut a, mut b) = tokio::io::duplex(1 << 16);
            let dk = Keys::rotating(b"new secret", Some(b"old secret"), true);
            let ak = Keys::new(held, true);
            let (d, acc) = (id("unbound:1/client"), id("tcp:127.0.0.1:9/server"));
            let e = Epochs::default();
            let (r1, r2) = tokio::join!(
                dial(&mut a, &d, Some(&dk), &e),
                accept(&mut b, &acc, Some(&ak), &e)
            );
            let (r1, r2) = (r1.unwrap(), r2.unwrap());
            // The sessions match: what one seals the other opens.
            let (mut ds, mut as_) = (r1.session.unwrap(), r2.session.unwrap());
            let mut wire = Vec::new();
            let mut frames = BytesMut::from(&b"after the rotation"[..]);
            ds.sealer.write(&mut wire, &mut frames, None).await.unwrap();
            let opened = as_.opener.open(BytesMut::from(&wire[..])).unwrap();
            assert_eq!(&opened[..], b"after the rotation");
        }
        // The acceptor uses only its current secret (each side owns its
        // stream, so a side that gives up closes it).
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let dk = Keys::new(b"old secret", true);
        let ak = Keys::rotating(b"new secret", Some(b"old secret"), true);
        let (d, acc) = (id("unbound:1/client"), id("tcp:127.0.0.1:9/server"));
        let (r1, r2) = tokio::join!(
            async move { dial(&mut a, &d, Some(&dk), &Epochs::default()).await },
            async move { accept(&mut b, &acc, Some(&ak), &Epochs::default()).await }
        );
        assert!(matches!(r1, Err(ChannelError::Auth(_))), "{r1:?}");
        assert!(r2.is_err());
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

    use super::super::credential::Issuer;

    fn issuer(world: &str) -> Issuer {
        Issuer::from_runtime_key(format!("runtime key of {world}").as_bytes())
    }

    /// Dials `acc` as `d` with the given keys and claims.
    async fn signed(
        d: (&str, Keys, Epochs),
        acc: (&str, Keys, Epochs),
    ) -> (
        Result<Established, ChannelError>,
        Result<Established, ChannelError>,
    ) {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let (did, aid) = (id(d.0), id(acc.0));
        tokio::join!(
            async move { dial(&mut a, &did, Some(&d.1), &d.2).await },
            async move { accept(&mut b, &aid, Some(&acc.1), &acc.2).await }
        )
    }

    fn cred(world: &str, name: &str, claim: Option<EpochClaim>) -> Keys {
        Keys::signed(issuer(world).issue(name, claim).unwrap(), true)
    }

    /// Invariants 7 and 8: procs holding credentials of one World for
    /// their own names and claims are admitted, and their connection is
    /// sealed under keys of that connection alone.
    #[tokio::test]
    async fn credentials_of_one_world_admit_each_proc_as_itself() {
        let claim = Some(EpochClaim { rank: 1, epoch: 4 });
        let (d, a) = signed(
            (
                "tcp:10.0.0.1:5/train-1",
                cred("w", "train-1", claim),
                claiming(1, 4),
            ),
            (
                "tcp:10.0.0.2:6/train-2",
                cred("w", "train-2", None),
                Epochs::default(),
            ),
        )
        .await;
        let (d, a) = (d.unwrap(), a.unwrap());
        assert_eq!(d.peer, id("tcp:10.0.0.2:6/train-2"));
        assert_eq!(a.peer, id("tcp:10.0.0.1:5/train-1"));
        let (mut ds, mut as_) = (d.session.unwrap(), a.session.unwrap());
        let mut wire = Vec::new();
        let mut frames = BytesMut::from(&b"to the acceptor"[..]);
        ds.sealer.write(&mut wire, &mut frames, None).await.unwrap();
        assert!(!wire.windows(6).any(|w| w == b"accept"), "sealed");
        let (_, other) = signed(
            (
                "tcp:10.0.0.1:5/train-1",
                cred("w", "train-1", None),
                Epochs::default(),
            ),
            (
                "tcp:10.0.0.2:6/train-2",
                cred("w", "train-2", None),
                Epochs::default(),
            ),
        )
        .await;
        let mut other = other.unwrap().session.unwrap();
        assert!(
            other.opener.open(BytesMut::from(&wire[..])).is_err(),
            "fresh keys"
        );
        assert_eq!(
            &as_.opener.open(BytesMut::from(&wire[..])).unwrap()[..],
            b"to the acceptor"
        );
        // The benchmark baseline: authenticated, not sealed.
        let plain = |name| Keys::signed(issuer("w").issue(name, None).unwrap(), false);
        let (d, a) = signed(
            ("unbound:1/c", plain("c"), Epochs::default()),
            ("tcp:10.0.0.2:6/s", plain("s"), Epochs::default()),
        )
        .await;
        assert!(d.unwrap().session.is_none() && a.unwrap().session.is_none());
    }

    /// Invariant 8: another World's credential, a credential for another
    /// proc's name or epoch, and a copied certificate without its key are
    /// each refused, by whichever side checks them.
    #[tokio::test]
    async fn a_proc_cannot_join_as_another_or_from_another_world() {
        let none = Epochs::default;
        let reason = |r: Result<Established, ChannelError>| match r {
            Err(ChannelError::Auth(m)) => m,
            other => panic!("expected a refusal, got {other:?}"),
        };
        // Another World's dialer: the acceptor refuses it.
        let (d, a) = signed(
            ("unbound:1/train-1", cred("other", "train-1", None), none()),
            ("tcp:10.0.0.2:6/train-2", cred("w", "train-2", None), none()),
        )
        .await;
        // (Each side checks the other's first: the dialer refuses the
        // acceptor, and tells it why.)
        assert!(reason(d).contains("not issued by this World"));
        assert!(reason(a).contains("not issued by this World"));
        // A dialer posing as train-3 with train-1's credential.
        let (d, a) = signed(
            ("unbound:1/train-3", cred("w", "train-1", None), none()),
            ("tcp:10.0.0.2:6/train-2", cred("w", "train-2", None), none()),
        )
        .await;
        let m = reason(a);
        assert!(m.contains("certificate of proc \"train-1\""), "{m}");
        assert!(reason(d).contains("join only as itself"));
        // An acceptor posing as train-2 with train-5's credential: the
        // dialer refuses it before it proves anything itself.
        let (d, a) = signed(
            ("unbound:1/train-1", cred("w", "train-1", None), none()),
            ("tcp:10.0.0.2:6/train-2", cred("w", "train-5", None), none()),
        )
        .await;
        assert!(reason(d).contains("join only as itself"));
        assert!(reason(a).contains("join only as itself"), "told why");
        // A claim the certificate does not carry.
        let (d, a) = signed(
            (
                "unbound:1/train-1",
                cred("w", "train-1", None),
                claiming(0, 9),
            ),
            ("tcp:10.0.0.2:6/train-2", cred("w", "train-2", None), none()),
        )
        .await;
        let m = reason(a);
        assert!(
            m.contains("claims rank 0 epoch 9 but its certificate is for no epoch"),
            "{m}"
        );
        assert!(d.is_err());
        // train-2's certificate copied, without train-2's key.
        let mine = issuer("w").issue("train-1", None).unwrap();
        let theirs = issuer("w").issue("train-2", None).unwrap();
        let (d, a) = signed(
            (
                "unbound:1/train-2",
                Keys::signed(mine.with_certificate_of(&theirs), true),
                none(),
            ),
            ("tcp:10.0.0.2:6/train-3", cred("w", "train-3", None), none()),
        )
        .await;
        assert!(reason(a).contains("does not hold its certificate's key"));
        assert!(d.is_err());
    }

    /// Invariant 4 across the modes: each side names what the other must
    /// hold.
    #[tokio::test]
    async fn a_credential_and_the_shared_secret_do_not_mix() {
        let (d, a) = signed(
            (
                "unbound:1/train-1",
                cred("w", "train-1", None),
                Epochs::default(),
            ),
            (
                "tcp:10.0.0.2:6/agent",
                Keys::new(b"world secret", true),
                Epochs::default(),
            ),
        )
        .await;
        assert!(
            matches!(&d, Err(ChannelError::Auth(m)) if m.contains("shared secret")),
            "{d:?}"
        );
        assert!(a.is_err());
        let (d, a) = signed(
            (
                "unbound:1/operator",
                Keys::new(b"world secret", true),
                Epochs::default(),
            ),
            (
                "tcp:10.0.0.2:6/train-2",
                cred("w", "train-2", None),
                Epochs::default(),
            ),
        )
        .await;
        assert!(
            matches!(&d, Err(ChannelError::Auth(m)) if m.contains("HOSTMESH_PROC_CREDENTIAL")),
            "{d:?}"
        );
        assert!(a.is_err());
    }
}
