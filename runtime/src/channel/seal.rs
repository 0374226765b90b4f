//! Record layer: once the handshake authenticated both sides with the
//! shared secret, every byte a connection carries is sealed with
//! AES-256-GCM under session keys of that connection alone.
//!
//! ```text
//! record  = sealed length u32 BE (4) | AES-256-GCM(frames) | tag (16)
//! key     = HKDF-SHA256(salt = nonce_d | nonce_a, ikm = shared secret,
//!                       info = "hostmesh/4 dialer to acceptor" | transcript)   (and "acceptor to dialer")
//! nonce_i = 0u32 | i as u64 BE       (i: records sealed before it in this direction)
//! aad     = the record's length prefix
//! ```
//!
//! `transcript` is the handshake's (proc ids, both nonces, both epoch
//! claims). AES-256-GCM rather than ChaCha20-Poly1305: with AES-NI it is
//! the faster of the two on our nodes (the runtime bench prints both).
//!
//! Invariants:
//! 1. Fresh keys per connection: both sides' handshake nonces go into the
//!    derivation, so bytes recorded from another connection (or an earlier
//!    one between the same procs) fail at their first record.
//! 2. One key per direction: a record reflected back to its sender fails.
//! 3. A record's nonce is its position in its direction and is never sent:
//!    a flipped bit, a dropped, replayed or reordered record, or a record
//!    cut short fails to open ([`ChannelError::Record`]), and the reader
//!    closes the connection (transport invariant 5). Nothing of a record
//!    is used before its tag checked out.
//! 4. A record holds whole frames: a link seals each write batch as one
//!    record (in place, in its write buffer), a batch with a large payload
//!    as one record (copied once into the sealer's buffer, as the payload
//!    belongs to its sender), so a reader slices frames out of the opened
//!    record without copying. Only a batch whose frames before the large
//!    payload exceed [`RECORD_SLACK`] is cut into several records.
//! 5. A reader refuses a record longer than its `max_frame_len` plus
//!    [`RECORD_SLACK`] before reading it.
//! 6. Links are sealed whenever both sides hold the shared secret (there
//!    is no key otherwise; such links are neither authenticated nor
//!    encrypted). The one exception is the benchmark baseline
//!    (`ProcBuilder::plaintext_benchmark_baseline`, feature
//!    `bench-baseline`), which no binary, flag, variable or resource sets.

use std::io::IoSlice;

use bytes::{Buf, Bytes, BytesMut};
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::hkdf;
use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::ChannelError;

/// Bytes a record adds to its frames: the length prefix and the tag.
pub(crate) const RECORD_OVERHEAD: usize = PREFIX + TAG;
const PREFIX: usize = 4;
const TAG: usize = 16;
/// Most bytes of frames sealed into one record ahead of a large payload
/// (a write batch stops growing at 256 KiB, plus one run or envelope), and
/// what a reader accepts on top of its `max_frame_len`.
pub(crate) const RECORD_SLACK: usize = 1 << 20;
/// The sealer's buffer is kept between batches up to this size (and
/// dropped by [`Sealer::shrink`] when the link goes quiet).
const SCRATCH_KEEP: usize = 4 << 20;

/// HKDF labels, one per direction (invariant 2).
const DIALER_TO_ACCEPTOR: &[u8] = b"hostmesh/4 dialer to acceptor";
const ACCEPTOR_TO_DIALER: &[u8] = b"hostmesh/4 acceptor to dialer";

/// Which side of the handshake this end was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Dialer,
    Acceptor,
}

/// The two halves of an established connection's record layer.
pub(crate) struct Session {
    pub(crate) sealer: Sealer,
    pub(crate) opener: Opener,
}

impl std::fmt::Debug for Session {
    // Keys stay out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Session")
    }
}

fn direction_key(
    prk: &hkdf::Prk,
    label: &[u8],
    transcript: &[u8],
) -> Result<LessSafeKey, ChannelError> {
    let info = [label, transcript];
    let okm = prk
        .expand(&info, &AES_256_GCM)
        .map_err(|_| ChannelError::Auth("cannot derive the session keys".into()))?;
    Ok(LessSafeKey::new(UnboundKey::from(okm)))
}

impl Session {
    /// Derives the keys of a connection from the shared secret, both
    /// handshake nonces and the handshake transcript (invariants 1, 2).
    pub(crate) fn derive(
        secret: &[u8],
        nonce_d: &[u8; 32],
        nonce_a: &[u8; 32],
        transcript: &[u8],
        role: Role,
    ) -> Result<Session, ChannelError> {
        let mut salt = [0u8; 64];
        salt[..32].copy_from_slice(nonce_d);
        salt[32..].copy_from_slice(nonce_a);
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, &salt).extract(secret);
        let d2a = direction_key(&prk, DIALER_TO_ACCEPTOR, transcript)?;
        let a2d = direction_key(&prk, ACCEPTOR_TO_DIALER, transcript)?;
        let (out, inn) = match role {
            Role::Dialer => (d2a, a2d),
            Role::Acceptor => (a2d, d2a),
        };
        Ok(Session {
            sealer: Sealer {
                key: out,
                next: 0,
                scratch: BytesMut::new(),
                seals: Vec::new(),
            },
            opener: Opener {
                key: inn,
                next: 0,
                max_record: usize::MAX,
            },
        })
    }
}

/// The nonce of record `i` (invariant 3).
fn nonce(i: u64) -> Nonce {
    let mut n = [0u8; NONCE_LEN];
    n[4..].copy_from_slice(&i.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

fn next_counter(next: &mut u64) -> Result<u64, ChannelError> {
    let i = *next;
    *next = i.checked_add(1).ok_or_else(|| {
        ChannelError::Record("record counter exhausted: reconnect to get fresh keys".into())
    })?;
    Ok(i)
}

/// Seals what a connection writes.
pub(crate) struct Sealer {
    key: LessSafeKey,
    next: u64,
    /// Holds a batch and its large payload for sealing (invariant 4).
    scratch: BytesMut,
    /// Each record's prefix and tag, for the vectored write.
    seals: Vec<([u8; PREFIX], [u8; TAG])>,
}

impl Sealer {
    /// Seals `buf` (whole frames, but for a last frame whose payload is
    /// `tail`) followed by `tail`, and writes the records. `buf` is sealed
    /// in place: its contents are ciphertext afterwards (clear it).
    pub(crate) async fn write<W: AsyncWrite + Unpin + ?Sized>(
        &mut self,
        w: &mut W,
        buf: &mut BytesMut,
        tail: Option<&Bytes>,
    ) -> Result<(), ChannelError> {
        let tail_len = tail.map_or(0, Bytes::len);
        let data: &mut BytesMut = match tail {
            None => buf,
            Some(t) => {
                if self.scratch.capacity() > SCRATCH_KEEP {
                    self.scratch = BytesMut::new();
                }
                self.scratch.clear();
                self.scratch.reserve(buf.len() + t.len());
                self.scratch.extend_from_slice(buf);
                self.scratch.extend_from_slice(t);
                &mut self.scratch
            }
        };
        // Record boundaries: at most RECORD_SLACK of frames ahead of the
        // large payload in one record (invariant 4).
        let mut cuts = Vec::with_capacity(2);
        let head = data.len() - tail_len;
        let mut start = 0;
        while head - start > RECORD_SLACK {
            cuts.push((start, start + RECORD_SLACK));
            start += RECORD_SLACK;
        }
        cuts.push((start, data.len()));
        self.seals.clear();
        for &(a, b) in &cuts {
            let prefix = ((b - a + TAG) as u32).to_be_bytes();
            let i = next_counter(&mut self.next)?;
            let tag = self
                .key
                .seal_in_place_separate_tag(nonce(i), Aad::from(prefix), &mut data[a..b])
                .map_err(|_| ChannelError::Record("sealing a record failed".into()))?;
            let mut t = [0u8; TAG];
            t.copy_from_slice(tag.as_ref());
            self.seals.push((prefix, t));
        }
        let mut slices = Vec::with_capacity(3 * cuts.len());
        for (&(a, b), (prefix, tag)) in cuts.iter().zip(&self.seals) {
            slices.push(IoSlice::new(prefix));
            slices.push(IoSlice::new(&data[a..b]));
            slices.push(IoSlice::new(tag));
        }
        write_all_vectored(w, &mut slices).await?;
        Ok(())
    }

    /// Drops the buffer used for batches with a large payload: a quiet
    /// connection holds none (a supervisor holds one per agent).
    pub(crate) fn shrink(&mut self) {
        if self.scratch.capacity() > 0 {
            self.scratch = BytesMut::new();
        }
    }
}

async fn write_all_vectored<W: AsyncWrite + Unpin + ?Sized>(
    w: &mut W,
    mut slices: &mut [IoSlice<'_>],
) -> std::io::Result<()> {
    IoSlice::advance_slices(&mut slices, 0);
    while !slices.is_empty() {
        let n = w.write_vectored(slices).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut slices, n);
    }
    Ok(())
}

/// Opens what a connection reads.
pub(crate) struct Opener {
    key: LessSafeKey,
    next: u64,
    max_record: usize,
}

impl Opener {
    /// Refuses records longer than `max_frame` plus [`RECORD_SLACK`]
    /// (invariant 5).
    pub(crate) fn limit(&mut self, max_frame: usize) {
        self.max_record = max_frame
            .saturating_add(RECORD_SLACK)
            .saturating_add(RECORD_OVERHEAD);
    }

    /// The length (prefix included) of the record at the front of `raw`,
    /// once its prefix is there.
    pub(crate) fn record_len(&self, raw: &[u8]) -> Result<Option<usize>, ChannelError> {
        let Some(p) = raw.get(..PREFIX) else {
            return Ok(None);
        };
        let sealed = u32::from_be_bytes([p[0], p[1], p[2], p[3]]) as usize;
        if sealed < TAG {
            return Err(ChannelError::Record(format!(
                "record of {sealed} bytes is shorter than its tag"
            )));
        }
        let len = PREFIX + sealed;
        if len > self.max_record {
            return Err(ChannelError::Record(format!(
                "record of {len} bytes exceeds the maximum of {} bytes (raise ChannelConfig::max_frame_len on both sides or send less)",
                self.max_record
            )));
        }
        Ok(Some(len))
    }

    /// Opens the complete record `rec` (prefix included) in place and
    /// returns its frames (a slice of the same buffer).
    pub(crate) fn open(&mut self, mut rec: BytesMut) -> Result<BytesMut, ChannelError> {
        let mut prefix = [0u8; PREFIX];
        prefix.copy_from_slice(&rec[..PREFIX]);
        rec.advance(PREFIX);
        let i = next_counter(&mut self.next)?;
        let n = self
            .key
            .open_in_place(nonce(i), Aad::from(prefix), &mut rec[..])
            .map_err(|_| {
                ChannelError::Record(format!(
                    "record {i} failed authentication: altered, replayed, reordered or cut short in transit, or not sealed by this connection's peer"
                ))
            })?
            .len();
        rec.truncate(n);
        Ok(rec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (Session, Session) {
        let (nd, na) = ([1u8; 32], [2u8; 32]);
        let d = Session::derive(b"s3cret", &nd, &na, b"t", Role::Dialer).unwrap();
        let a = Session::derive(b"s3cret", &nd, &na, b"t", Role::Acceptor).unwrap();
        (d, a)
    }

    async fn seal(s: &mut Sealer, frames: &[u8], tail: Option<&[u8]>) -> Vec<u8> {
        let mut out = Vec::new();
        let mut buf = BytesMut::from(frames);
        let tail = tail.map(Bytes::copy_from_slice);
        s.write(&mut out, &mut buf, tail.as_ref()).await.unwrap();
        out
    }

    /// Splits `wire` into records and opens each.
    fn open_all(o: &mut Opener, wire: &[u8]) -> Result<Vec<u8>, ChannelError> {
        let mut raw = BytesMut::from(wire);
        let mut out = Vec::new();
        while let Some(len) = o.record_len(&raw)? {
            if raw.len() < len {
                return Err(ChannelError::Record("truncated".into()));
            }
            out.extend_from_slice(&o.open(raw.split_to(len))?);
        }
        Ok(out)
    }

    #[tokio::test]
    async fn records_round_trip_and_hide_their_frames() {
        let (mut d, mut a) = pair();
        let w1 = seal(&mut d.sealer, b"hello frames", None).await;
        let w2 = seal(&mut d.sealer, b"head", Some(b"large payload")).await;
        assert!(!w1.windows(5).any(|w| w == b"hello"), "ciphertext only");
        assert_eq!(w1.len(), 12 + RECORD_OVERHEAD);
        let got = open_all(&mut a.opener, &[w1, w2].concat()).unwrap();
        assert_eq!(&got[..], b"hello framesheadlarge payload");
        // And the other direction, with its own key.
        let back = seal(&mut a.sealer, b"reply", None).await;
        assert_eq!(open_all(&mut d.opener, &back).unwrap(), b"reply");
    }

    /// Invariant 3: a flipped bit anywhere, a replay, a reordering and a
    /// dropped record all fail.
    #[tokio::test]
    async fn altered_replayed_or_reordered_records_fail() {
        let (mut d, _) = pair();
        let r1 = seal(&mut d.sealer, b"first", None).await;
        let r2 = seal(&mut d.sealer, b"second", None).await;
        for i in PREFIX..r1.len() {
            let mut bad = r1.clone();
            bad[i] ^= 0x01;
            let (_, mut a) = pair();
            let e = open_all(&mut a.opener, &bad).unwrap_err();
            assert!(e.to_string().contains("failed authentication"), "{e}");
        }
        let (_, mut a) = pair();
        assert!(open_all(&mut a.opener, &[r1.clone(), r1.clone()].concat()).is_err());
        let (_, mut a) = pair();
        assert!(open_all(&mut a.opener, &[r2.clone(), r1.clone()].concat()).is_err());
        let (_, mut a) = pair();
        assert!(open_all(&mut a.opener, &r2).is_err(), "r1 dropped");
        let (_, mut a) = pair();
        assert_eq!(
            open_all(&mut a.opener, &[r1, r2].concat()).unwrap(),
            b"firstsecond"
        );
    }

    /// Invariants 1 and 2: another connection's nonces, or the other
    /// direction's key, open nothing.
    #[tokio::test]
    async fn other_connections_and_reflections_fail() {
        let (mut d, _) = pair();
        let wire = seal(&mut d.sealer, b"frames", None).await;
        let mut reflected = pair().0;
        assert!(open_all(&mut reflected.opener, &wire).is_err());
        let mut other =
            Session::derive(b"s3cret", &[1u8; 32], &[3u8; 32], b"t", Role::Acceptor).unwrap();
        assert!(open_all(&mut other.opener, &wire).is_err());
        let mut wrong =
            Session::derive(b"other", &[1u8; 32], &[2u8; 32], b"t", Role::Acceptor).unwrap();
        assert!(open_all(&mut wrong.opener, &wire).is_err());
    }

    /// A batch with a large payload leaves its buffer with the sealer
    /// until the link goes quiet.
    #[tokio::test]
    async fn a_quiet_sealer_holds_no_buffer() {
        let (mut d, mut a) = pair();
        let wire = seal(&mut d.sealer, b"head", Some(&[9u8; 100_000])).await;
        assert!(d.sealer.scratch.capacity() >= 100_004);
        d.sealer.shrink();
        assert_eq!(d.sealer.scratch.capacity(), 0);
        let again = seal(&mut d.sealer, b"head", Some(&[8u8; 10])).await;
        let got = open_all(&mut a.opener, &[wire, again].concat()).unwrap();
        assert_eq!(got.len(), 100_004 + 14);
    }

    /// Invariants 4 and 5: frames ahead of a large payload past the slack
    /// are cut into several records; a reader bounds a record's length.
    #[tokio::test]
    async fn long_batches_are_cut_and_lengths_bounded() {
        let (mut d, mut a) = pair();
        let head = vec![5u8; RECORD_SLACK + 10];
        let wire = seal(&mut d.sealer, &head, Some(&[6u8; 100])).await;
        assert_eq!(wire.len(), head.len() + 100 + 2 * RECORD_OVERHEAD);
        a.opener.limit(1000);
        let got = open_all(&mut a.opener, &wire).unwrap();
        assert_eq!(got.len(), head.len() + 100);
        let mut huge = BytesMut::new();
        huge.extend_from_slice(&(u32::MAX).to_be_bytes());
        let e = a.opener.record_len(&huge).unwrap_err();
        assert!(e.to_string().contains("max_frame_len"), "{e}");
        let e = a.opener.record_len(&[0, 0, 0, 3]).unwrap_err();
        assert!(e.to_string().contains("shorter than its tag"), "{e}");
    }
}
