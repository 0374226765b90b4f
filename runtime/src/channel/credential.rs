//! Proc credentials: what binds a runtime-aware proc to its own name (and
//! its host's epoch) in the handshake, so that a proc of a World cannot
//! pose as another proc of it.
//!
//! A World's [`Issuer`] is an Ed25519 key derived from the World's runtime
//! key. It signs a [`Certificate`] per proc: the proc's name, its epoch
//! claim and a public key whose private half only that proc holds (a
//! fresh one per certificate). The proc gets a [`Credential`]: its
//! certificate, its private key and the issuer's public key, nothing
//! that lets it sign another certificate.
//!
//! Invariants:
//! 1. The issuer's signing key is a one-way function of the runtime key
//!    (HKDF-SHA256 under a fixed label): whoever holds the runtime key
//!    (agents, clients of actors) can issue; whoever holds a credential
//!    cannot.
//! 2. A certificate's signature covers a length-prefixed encoding of
//!    every field under a fixed label, so no field can be moved into
//!    another or reused by another kind of signature.
//! 3. [`Credential`]'s `Debug` and [`Issuer`]'s hide their keys; the text
//!    form of a credential ([`Credential::to_text`]) is for the proc's
//!    environment only and never logged.
//! 4. A credential is checked when it is read: its certificate must carry
//!    its own public key and verify under the issuer it names, and its
//!    lineage must lead to that issuer.
//! 5. Succession ([`Lineage`]): when a World's secret is rotated, its old
//!    issuer signs the new one's public key (an [`Endorsement`]), and
//!    certificates of the new issuer carry the chain of such endorsements.
//!    A proc admits a peer's certificate when its issuer, or any key of its
//!    verified lineage, is a key the proc trusts: its own issuer or one of
//!    its own lineage. So procs issued before a rotation and after it admit
//!    each other (only a holder of a trusted issuer's key can endorse), and
//!    trust in the old issuer ends when the lineage is dropped and the
//!    procs that carry it are gone. A lineage keeps at most
//!    [`MAX_LINEAGE`] endorsements, the newest.

use ring::hkdf;
use ring::rand::{SecureRandom, SystemRandom};
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};
use serde::{Deserialize, Serialize};

use super::epoch::EpochClaim;

/// The HKDF label of the issuer's seed (invariant 1).
const ISSUER_LABEL: &[u8] = b"hostmesh proc issuer v1";
/// The label a certificate's signature covers (invariant 2).
const CERT_LABEL: &str = "hostmesh proc certificate v1";
/// The label an endorsement's signature covers (invariant 5).
const SUCCESSION_LABEL: &str = "hostmesh issuer succession v1";
/// Most endorsements a lineage keeps (invariant 5).
pub const MAX_LINEAGE: usize = 16;

/// Why a credential cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    /// The text is not a credential (bad hex or encoding).
    #[error("not a hostmesh proc credential ({0}): it is written by the hostmesh agent")]
    Malformed(String),
    /// The certificate does not verify (invariant 4).
    #[error("the proc credential does not verify: {0}")]
    Invalid(&'static str),
    /// A proc was given a credential issued for another proc or epoch.
    #[error("{0}: a proc credential is valid only for the proc name and epoch it was issued for")]
    NotThisProc(String),
    /// No system randomness for a fresh key.
    #[error("no system randomness available for a proc key")]
    Random,
}

/// Signs proc certificates for one World (invariant 1).
#[derive(Clone)]
pub struct Issuer {
    key: std::sync::Arc<Ed25519KeyPair>,
    /// Endorsements leading to this issuer (invariant 5).
    lineage: Lineage,
}

impl std::fmt::Debug for Issuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issuer")
            .field("public", &hex(&self.public()))
            .field("lineage", &self.lineage.0.len())
            .finish_non_exhaustive()
    }
}

impl Issuer {
    /// The issuer of the World whose runtime key is `runtime_key`.
    pub fn from_runtime_key(runtime_key: &[u8]) -> Self {
        struct Len;
        impl hkdf::KeyType for Len {
            fn len(&self) -> usize {
                32
            }
        }
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, ISSUER_LABEL).extract(runtime_key);
        let mut seed = [0u8; 32];
        // `expand` fails only for lengths above 255 * 32 bytes.
        if let Ok(okm) = prk.expand(&[ISSUER_LABEL], Len) {
            let _ = okm.fill(&mut seed);
        }
        let key = Ed25519KeyPair::from_seed_unchecked(&seed)
            .unwrap_or_else(|_| unreachable!("every 32-byte seed is an Ed25519 key"));
        Issuer {
            key: std::sync::Arc::new(key),
            lineage: Lineage::default(),
        }
    }

    /// This issuer, whose certificates carry `lineage` (invariant 5); the
    /// lineage must lead to this issuer.
    pub fn with_lineage(mut self, lineage: Lineage) -> Result<Self, CredentialError> {
        lineage.check(&self.public())?;
        self.lineage = lineage;
        Ok(self)
    }

    /// This issuer with the lineage of text `text` (empty: none), as
    /// Secrets and messages carry it ([`Lineage::to_text`]).
    pub fn with_lineage_text(self, text: &str) -> Result<Self, CredentialError> {
        self.with_lineage(Lineage::from_text(text)?)
    }

    /// The endorsements this issuer's certificates carry.
    pub fn lineage(&self) -> &Lineage {
        &self.lineage
    }

    /// The lineage of `next`, the issuer that succeeds this one: this
    /// issuer's lineage and this issuer's endorsement of `next`, keeping
    /// the newest [`MAX_LINEAGE`] (invariant 5).
    pub fn endorse(&self, next: &Issuer) -> Lineage {
        let to = next.public();
        let mut chain = self.lineage.0.clone();
        if to != self.public() {
            chain.push(Endorsement {
                by: self.public(),
                signature: self.key.sign(&succession_bytes(&to)).as_ref().to_vec(),
            });
        }
        let drop = chain.len().saturating_sub(MAX_LINEAGE);
        chain.drain(..drop);
        Lineage(chain)
    }

    /// The public key certificates verify under.
    pub fn public(&self) -> [u8; 32] {
        let mut p = [0u8; 32];
        p.copy_from_slice(self.key.public_key().as_ref());
        p
    }

    /// A credential for the proc named `name` claiming `claim`, with a
    /// fresh key pair.
    pub fn issue(
        &self,
        name: &str,
        claim: Option<EpochClaim>,
    ) -> Result<Credential, CredentialError> {
        let mut seed = [0u8; 32];
        SystemRandom::new()
            .fill(&mut seed)
            .map_err(|_| CredentialError::Random)?;
        let own = Ed25519KeyPair::from_seed_unchecked(&seed)
            .unwrap_or_else(|_| unreachable!("every 32-byte seed is an Ed25519 key"));
        let mut key = [0u8; 32];
        key.copy_from_slice(own.public_key().as_ref());
        let mut cert = Certificate {
            name: name.to_owned(),
            claim,
            key,
            signature: Vec::new(),
            issuer: self.public(),
            lineage: self.lineage.clone(),
        };
        cert.signature = self.key.sign(&cert.signed_bytes()).as_ref().to_vec();
        Ok(Credential { seed, cert })
    }
}

/// What an endorsement signs: the successor's public key (invariant 5).
fn succession_bytes(next: &[u8; 32]) -> Vec<u8> {
    let mut t = Vec::with_capacity(68);
    t.extend_from_slice(&(SUCCESSION_LABEL.len() as u32).to_be_bytes());
    t.extend_from_slice(SUCCESSION_LABEL.as_bytes());
    t.extend_from_slice(next);
    t
}

/// One issuer's signature over the public key of the issuer after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endorsement {
    /// The endorsing (older) issuer's public key.
    by: [u8; 32],
    signature: Vec<u8>,
}

/// A chain of endorsements, oldest first: each one's successor is the
/// next one's `by`, and the last one's is the issuer the lineage leads to
/// (invariant 5). Endorsements are signatures, not keys: a lineage is
/// public.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lineage(Vec<Endorsement>);

impl Lineage {
    /// No endorsements: the issuer stands alone.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many endorsements it holds.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Checks every signature, each over the next endorser's key, the
    /// last one over `issuer` (invariant 5).
    pub fn check(&self, issuer: &[u8; 32]) -> Result<(), CredentialError> {
        for (i, e) in self.0.iter().enumerate() {
            let next = self.0.get(i + 1).map(|n| &n.by).unwrap_or(issuer);
            UnparsedPublicKey::new(&ED25519, &e.by)
                .verify(&succession_bytes(next), &e.signature)
                .map_err(|_| CredentialError::Invalid("its issuer lineage does not verify"))?;
        }
        Ok(())
    }

    /// The keys of its endorsers, oldest first.
    fn endorsers(&self) -> impl Iterator<Item = &[u8; 32]> {
        self.0.iter().map(|e| &e.by)
    }

    /// The lineage as text (hex), as Secrets and messages carry it.
    pub fn to_text(&self) -> String {
        postcard::to_stdvec(self)
            .map(|b| hex(&b))
            .unwrap_or_default()
    }

    /// A lineage from its text (not yet checked against an issuer).
    pub fn from_text(text: &str) -> Result<Self, CredentialError> {
        let text = text.trim();
        if text.is_empty() {
            return Ok(Lineage::default());
        }
        let bytes = from_hex(text)?;
        postcard::from_bytes(&bytes).map_err(|e| CredentialError::Malformed(e.to_string()))
    }
}

/// What an issuer vouches for: a proc name, its epoch claim and its
/// public key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Certificate {
    /// The proc's name (the name part of its `ProcId`).
    pub name: String,
    /// The host rank and epoch the proc claims in its handshakes.
    pub claim: Option<EpochClaim>,
    key: [u8; 32],
    signature: Vec<u8>,
    /// The issuer that signed it.
    issuer: [u8; 32],
    /// The endorsements that lead to that issuer (invariant 5).
    lineage: Lineage,
}

impl Certificate {
    /// What the issuer signs (invariant 2).
    fn signed_bytes(&self) -> Vec<u8> {
        let mut t = Vec::with_capacity(96 + self.name.len());
        for part in [CERT_LABEL, self.name.as_str()] {
            t.extend_from_slice(&(part.len() as u32).to_be_bytes());
            t.extend_from_slice(part.as_bytes());
        }
        match self.claim {
            None => t.push(0),
            Some(c) => {
                t.push(1);
                t.extend_from_slice(&(c.rank as u64).to_be_bytes());
                t.extend_from_slice(&c.epoch.to_be_bytes());
            }
        }
        t.extend_from_slice(&self.key);
        t
    }

    /// Whether `issuer` signed this certificate.
    pub fn verify(&self, issuer: &[u8; 32]) -> Result<(), CredentialError> {
        UnparsedPublicKey::new(&ED25519, issuer)
            .verify(&self.signed_bytes(), &self.signature)
            .map_err(|_| CredentialError::Invalid("its certificate is not signed by its issuer"))
    }

    /// Whether a proc holding `ours` admits this certificate (invariant 5):
    /// it verifies under the issuer it names, its lineage leads to that
    /// issuer, and that issuer or a key of its lineage is one `ours`
    /// trusts.
    pub fn admitted_by(&self, ours: &Credential) -> Result<(), CredentialError> {
        self.verify(&self.issuer)?;
        self.lineage.check(&self.issuer)?;
        let trusted = std::iter::once(&self.issuer)
            .chain(self.lineage.endorsers())
            .any(|k| ours.trusts(k));
        if trusted {
            Ok(())
        } else {
            Err(CredentialError::Invalid(
                "its issuer is not this World's, nor endorsed by it",
            ))
        }
    }

    /// Whether the holder of this certificate's key signed `message`.
    pub(crate) fn verify_signature(&self, message: &[u8], signature: &[u8]) -> bool {
        UnparsedPublicKey::new(&ED25519, &self.key)
            .verify(message, signature)
            .is_ok()
    }
}

/// A proc's own credential: its certificate (which names its issuer and
/// that issuer's lineage, the keys it trusts) and its private key.
#[derive(Clone, Serialize, Deserialize)]
pub struct Credential {
    seed: [u8; 32],
    cert: Certificate,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("name", &self.cert.name)
            .field("claim", &self.cert.claim)
            .finish_non_exhaustive()
    }
}

impl Credential {
    /// The certificate this credential presents.
    pub fn certificate(&self) -> &Certificate {
        &self.cert
    }

    /// The issuer's public key.
    pub fn issuer(&self) -> &[u8; 32] {
        &self.cert.issuer
    }

    /// Whether peers' certificates may lead to `key`: this credential's
    /// issuer or a key of its lineage (invariant 5).
    pub fn trusts(&self, key: &[u8; 32]) -> bool {
        self.cert.issuer == *key || self.cert.lineage.endorsers().any(|k| k == key)
    }

    /// Signs `message` with the proc's own key.
    pub(crate) fn sign(&self, message: &[u8]) -> Vec<u8> {
        Ed25519KeyPair::from_seed_unchecked(&self.seed)
            .unwrap_or_else(|_| unreachable!("every 32-byte seed is an Ed25519 key"))
            .sign(message)
            .as_ref()
            .to_vec()
    }

    /// The credential as a proc's environment carries it: lowercase hex.
    pub fn to_text(&self) -> String {
        postcard::to_stdvec(self)
            .map(|b| hex(&b))
            .unwrap_or_default()
    }

    /// A credential from its text, checked (invariant 4).
    pub fn from_text(text: &str) -> Result<Self, CredentialError> {
        let bytes = from_hex(text.trim())?;
        let cred: Credential =
            postcard::from_bytes(&bytes).map_err(|e| CredentialError::Malformed(e.to_string()))?;
        cred.check()?;
        Ok(cred)
    }

    /// This credential's key with `other`'s certificate: what a proc that
    /// copied another's certificate (but not its key) would present.
    #[cfg(test)]
    pub(crate) fn with_certificate_of(&self, other: &Credential) -> Credential {
        Credential {
            seed: self.seed,
            cert: other.cert.clone(),
        }
    }

    /// Invariant 4.
    fn check(&self) -> Result<(), CredentialError> {
        let own = Ed25519KeyPair::from_seed_unchecked(&self.seed)
            .map_err(|_| CredentialError::Invalid("its private key is not an Ed25519 seed"))?;
        if own.public_key().as_ref() != self.cert.key {
            return Err(CredentialError::Invalid(
                "its certificate is for another key than its own",
            ));
        }
        self.cert.verify(&self.cert.issuer)?;
        self.cert.lineage.check(&self.cert.issuer)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(text: &str) -> Result<Vec<u8>, CredentialError> {
    if !text.len().is_multiple_of(2) {
        return Err(CredentialError::Malformed(
            "odd number of hex digits".into(),
        ));
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16))
        .collect::<Result<Vec<u8>, _>>()
        .map_err(|_| CredentialError::Malformed("not hex".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_issued_credential_verifies_under_its_issuer_only() {
        let world = Issuer::from_runtime_key(b"runtime key of world a.........");
        let again = Issuer::from_runtime_key(b"runtime key of world a.........");
        let other = Issuer::from_runtime_key(b"runtime key of world b.........");
        assert_eq!(world.public(), again.public(), "fixed per runtime key");
        assert_ne!(world.public(), other.public());
        let claim = Some(EpochClaim { rank: 3, epoch: 7 });
        let c = world.issue("train-5", claim).unwrap();
        assert_eq!(c.certificate().name, "train-5");
        assert_eq!(c.certificate().claim, claim);
        c.certificate().verify(&world.public()).unwrap();
        assert!(c.certificate().verify(&other.public()).is_err());
        let round = Credential::from_text(&c.to_text()).unwrap();
        assert_eq!(round.certificate(), c.certificate());
        let msg = b"a transcript";
        assert!(c.certificate().verify_signature(msg, &round.sign(msg)));
        let d = world.issue("train-5", claim).unwrap();
        assert!(
            !c.certificate().verify_signature(msg, &d.sign(msg)),
            "a fresh key per certificate"
        );
    }

    /// Invariant 2 and 4: a certificate whose name or claim was changed,
    /// or a credential holding another proc's certificate, does not verify.
    #[test]
    fn an_altered_certificate_or_a_borrowed_one_is_refused() {
        let world = Issuer::from_runtime_key(b"runtime key of world a.........");
        let c = world.issue("train-5", None).unwrap();
        let mut renamed = c.cert.clone();
        renamed.name = "train-6".into();
        assert!(renamed.verify(&world.public()).is_err());
        let mut reclaimed = c.cert.clone();
        reclaimed.claim = Some(EpochClaim { rank: 0, epoch: 1 });
        assert!(reclaimed.verify(&world.public()).is_err());
        let other = world.issue("train-6", None).unwrap();
        let borrowed = Credential {
            seed: c.seed,
            cert: other.cert.clone(),
        };
        let e = Credential::from_text(&borrowed.to_text()).unwrap_err();
        assert!(e.to_string().contains("another key"), "{e}");
        for bad in ["", "abc", "zz", "00"] {
            assert!(Credential::from_text(bad).is_err(), "{bad:?}");
        }
        let shown = format!("{c:?} {world:?}");
        assert!(!shown.contains(&hex(&c.seed)), "{shown}");
        assert!(shown.contains("train-5"), "{shown}");
    }

    /// Invariant 5: procs issued before and after a rotation admit each
    /// other through the lineage, across two rotations too; another
    /// World's, or a lineage whose endorsement was forged, is refused.
    #[test]
    fn a_lineage_lets_procs_of_succeeding_issuers_admit_each_other() {
        let a = Issuer::from_runtime_key(b"runtime key of world a, first..");
        let b0 = Issuer::from_runtime_key(b"runtime key of world a, second.");
        let c0 = Issuer::from_runtime_key(b"runtime key of world a, third..");
        let b = b0.clone().with_lineage(a.endorse(&b0)).unwrap();
        let c = c0.clone().with_lineage(b.endorse(&c0)).unwrap();
        assert_eq!(c.lineage().len(), 2);
        let (pa, pb, pc) = (
            a.issue("p-0", None).unwrap(),
            b.issue("p-1", None).unwrap(),
            c.issue("p-2", None).unwrap(),
        );
        for x in [&pa, &pb, &pc] {
            for y in [&pa, &pb, &pc] {
                y.certificate().admitted_by(x).unwrap();
            }
        }
        // Text round trip keeps the lineage, and it is checked on read.
        let round = Credential::from_text(&pc.to_text()).unwrap();
        pa.certificate().admitted_by(&round).unwrap();
        let text = c.lineage().to_text();
        assert_eq!(&Lineage::from_text(&text).unwrap(), c.lineage());
        assert!(Lineage::from_text("").unwrap().is_empty());
        // Not a lineage that leads elsewhere.
        assert!(c0.clone().with_lineage(a.endorse(&b0)).is_err());
        // Without the lineage, the old and new issuers do not mix.
        let bare = c0.issue("p-3", None).unwrap();
        assert!(bare.certificate().admitted_by(&pa).is_err());
        assert!(pa.certificate().admitted_by(&bare).is_err());
        // Another World is refused; so is a lineage another World's
        // issuer signed in place of ours.
        let other = Issuer::from_runtime_key(b"runtime key of world b.........");
        let po = other.issue("p-0", None).unwrap();
        assert!(po.certificate().admitted_by(&pc).is_err());
        let mut forged = po.certificate().clone();
        forged.lineage = other.endorse(&other);
        forged.lineage.0.push(Endorsement {
            by: a.public(),
            signature: vec![0; 64],
        });
        let e = forged.admitted_by(&pa).unwrap_err();
        assert!(e.to_string().contains("lineage"), "{e}");
        // A lineage keeps the newest MAX_LINEAGE endorsements.
        let mut last = a.clone();
        for i in 0..MAX_LINEAGE + 3 {
            let next =
                Issuer::from_runtime_key(format!("key {i} .........................").as_bytes());
            let l = last.endorse(&next);
            last = next.with_lineage(l).unwrap();
        }
        assert_eq!(last.lineage().len(), MAX_LINEAGE);
    }
}
