//! Wire format: frames with a versioned 8-byte header, and envelopes.
//!
//! ```text
//! frame    = magic "HM" (2) | version (1) | kind (1) | body length u32 BE (4) | body
//! envelope = header length u32 BE (4) | postcard(EnvelopeHeader) | payload (postcard message)
//! ack      = u64 BE: number of envelopes received on this connection so far
//! hello    = postcard(handshake message)
//! ```
//!
//! Envelopes carry no sequence number: each direction of a connection counts
//! the envelopes it carries, and acks are cumulative counts. A header length
//! of 0 means "the same header as the previous envelope on this connection"
//! (streams of messages between one sender and one receiver skip the ids:
//! a 64-byte message costs 77 bytes on the wire). On the receiving side a
//! stream of such frames becomes one [`Arrivals`]: payloads sliced from the
//! read buffer, sharing one copy of the header.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};

use super::ChannelError;
use crate::id::{ActorId, PortId};

/// The first two bytes of every frame.
pub(crate) const MAGIC: [u8; 2] = *b"HM";
/// The wire protocol version this build speaks. Bumped with every change
/// that an older build cannot read (2: rank epochs in the handshake,
/// `SetAddressBook` and the agent's pushes; 3: the address book's version
/// and `PatchAddressBook`; 4: frames after the handshake sealed in
/// records, `super::seal`). A peer of another version is
/// refused at its first frame ([`ChannelError::Version`]), and an acceptor
/// tells it why in its own version (the handshake's `Reject`, which every
/// version encodes alike).
pub(crate) const VERSION: u8 = 4;
/// Size of the frame header.
pub(crate) const HEADER_LEN: usize = 8;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FrameKind {
    /// A handshake message.
    Hello = 1,
    /// An envelope.
    Envelope = 2,
    /// A cumulative acknowledgement.
    Ack = 3,
}

impl FrameKind {
    fn from_u8(b: u8) -> Option<Self> {
        match b {
            1 => Some(FrameKind::Hello),
            2 => Some(FrameKind::Envelope),
            3 => Some(FrameKind::Ack),
            _ => None,
        }
    }
}

/// A message in transit: who sent it, where it goes, where a reply goes, and
/// the encoded message. `error` is set only on envelopes that tell a reply
/// port its message could not be delivered.
#[derive(Clone)]
pub(crate) struct Envelope {
    pub(crate) sender: ActorId,
    pub(crate) dest: PortId,
    pub(crate) reply_to: Option<PortId>,
    pub(crate) error: Option<String>,
    pub(crate) payload: Bytes,
}

impl std::fmt::Debug for Envelope {
    // Payloads stay out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Envelope")
            .field("sender", &self.sender.to_string())
            .field("dest", &self.dest.to_string())
            .field("payload_len", &self.payload.len())
            .finish_non_exhaustive()
    }
}

#[derive(Serialize)]
struct HeaderRef<'a> {
    sender: &'a ActorId,
    dest: &'a PortId,
    reply_to: &'a Option<PortId>,
    error: &'a Option<String>,
}

#[derive(Deserialize, Clone)]
pub(crate) struct HeaderOwned {
    sender: ActorId,
    dest: PortId,
    reply_to: Option<PortId>,
    error: Option<String>,
}

fn put_header(buf: &mut BytesMut, kind: FrameKind, len: usize) {
    buf.put_slice(&MAGIC);
    buf.put_u8(VERSION);
    buf.put_u8(kind as u8);
    buf.put_u32(len as u32);
}

/// The header of the last envelope written on a connection.
#[derive(Default)]
pub(crate) struct LastHeader(Option<(ActorId, PortId, Option<PortId>)>);

impl LastHeader {
    fn matches(&self, env: &Envelope) -> bool {
        env.error.is_none()
            && self
                .0
                .as_ref()
                .is_some_and(|(s, d, r)| s == &env.sender && d == &env.dest && r == &env.reply_to)
    }
}

/// Whether two envelopes share a header that can be elided (no error).
pub(crate) fn same_header(a: &Envelope, b: &Envelope) -> bool {
    a.error.is_none()
        && b.error.is_none()
        && a.sender == b.sender
        && a.dest == b.dest
        && a.reply_to == b.reply_to
}

/// Bytes a frame written by [`encode_repeat_with`] adds to its payload.
pub(crate) const REPEAT_OVERHEAD: usize = HEADER_LEN + 4;

/// Appends an envelope frame whose header repeats the previous frame's and
/// whose payload `encode` writes; `false` (and `buf` unchanged) if it fails.
pub(crate) fn encode_repeat_with(
    buf: &mut BytesMut,
    encode: impl FnOnce(&mut BytesMut) -> bool,
) -> bool {
    let start = buf.len();
    // The frame header and an empty envelope header, in one copy.
    let mut head = [0u8; REPEAT_OVERHEAD];
    head[..2].copy_from_slice(&MAGIC);
    head[2] = VERSION;
    head[3] = FrameKind::Envelope as u8;
    buf.extend_from_slice(&head);
    if !encode(buf) {
        buf.truncate(start);
        return false;
    }
    let body = (buf.len() - start - HEADER_LEN) as u32;
    buf[start + 4..start + 8].copy_from_slice(&body.to_be_bytes());
    true
}

/// Splits the first frame written by [`encode_repeat_with`] off `frames`
/// and returns its payload (a slice of the same buffer, no copy).
pub(crate) fn split_repeat(frames: &mut BytesMut) -> Bytes {
    let body = frames
        .get(4..8)
        .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize);
    let end = (HEADER_LEN + body).min(frames.len());
    let frame = frames.split_to(end).freeze();
    frame.slice((HEADER_LEN + 4).min(end)..)
}

/// Payloads larger than this are not copied into the write buffer: the
/// writer sends them straight from the envelope after the buffer.
pub(crate) const INLINE_PAYLOAD_MAX: usize = 64 * 1024;

/// Appends an envelope frame to `buf`, eliding the header when it repeats
/// the previous one (`last`). Returns `false` when the payload was left out
/// (larger than [`INLINE_PAYLOAD_MAX`]): the caller writes it right after
/// `buf`, before anything else.
pub(crate) fn encode_envelope(
    buf: &mut BytesMut,
    env: &Envelope,
    max_frame: usize,
    last: &mut LastHeader,
) -> Result<bool, ChannelError> {
    let inline = env.payload.len() <= INLINE_PAYLOAD_MAX;
    if last.matches(env) {
        let body_len = 4 + env.payload.len();
        if body_len > max_frame {
            return Err(ChannelError::FrameTooLarge {
                len: body_len,
                max: max_frame,
            });
        }
        put_header(buf, FrameKind::Envelope, body_len);
        buf.put_u32(0);
        if inline {
            buf.extend_from_slice(&env.payload);
        }
        return Ok(inline);
    }
    let header = HeaderRef {
        sender: &env.sender,
        dest: &env.dest,
        reply_to: &env.reply_to,
        error: &env.error,
    };
    let start = buf.len();
    // Reserve the frame header and the envelope-header length, fill later.
    buf.put_bytes(0, HEADER_LEN + 4);
    let hdr_start = buf.len();
    let mut writer = buf.writer();
    postcard::to_io(&header, &mut writer).map_err(|e| ChannelError::Encode(e.to_string()))?;
    let buf = writer.into_inner();
    let hdr_len = buf.len() - hdr_start;
    let body_len = 4 + hdr_len + env.payload.len();
    if body_len > max_frame {
        buf.truncate(start);
        return Err(ChannelError::FrameTooLarge {
            len: body_len,
            max: max_frame,
        });
    }
    if inline {
        buf.extend_from_slice(&env.payload);
    }
    let mut head = &mut buf[start..start + HEADER_LEN + 4];
    head.put_slice(&MAGIC);
    head.put_u8(VERSION);
    head.put_u8(FrameKind::Envelope as u8);
    head.put_u32(body_len as u32);
    head.put_u32(hdr_len as u32);
    last.0 = env
        .error
        .is_none()
        .then(|| (env.sender.clone(), env.dest.clone(), env.reply_to.clone()));
    Ok(inline)
}

/// Appends an ack frame to `buf`.
pub(crate) fn encode_ack(buf: &mut BytesMut, count: u64) {
    put_header(buf, FrameKind::Ack, 8);
    buf.put_u64(count);
}

/// Appends a handshake frame to `buf`.
pub(crate) fn encode_hello<T: Serialize>(buf: &mut BytesMut, msg: &T) -> Result<(), ChannelError> {
    encode_hello_as(buf, VERSION, msg)
}

/// [`encode_hello`] under another version's header: how an acceptor
/// refuses a peer of that version in words it can read.
pub(crate) fn encode_hello_as<T: Serialize>(
    buf: &mut BytesMut,
    version: u8,
    msg: &T,
) -> Result<(), ChannelError> {
    let body = postcard::to_allocvec(msg).map_err(|e| ChannelError::Encode(e.to_string()))?;
    let start = buf.len();
    put_header(buf, FrameKind::Hello, body.len());
    buf[start + 2] = version;
    buf.extend_from_slice(&body);
    Ok(())
}

/// Frames with a body at least this large are read into a buffer of their
/// own size ([`pending_large`]) rather than through the shared read buffer.
pub(crate) const LARGE_FRAME: usize = 64 * 1024;

/// The body length of the incomplete frame at the front of `buf`, if its
/// header is complete and the body is at least [`LARGE_FRAME`]. Call after
/// [`decode`] returned `Ok(None)` (which checked the header).
pub(crate) fn pending_large(buf: &BytesMut) -> Option<usize> {
    if buf.len() < HEADER_LEN {
        return None;
    }
    let len = u32::from_be_bytes([buf[4], buf[5], buf[6], buf[7]]) as usize;
    (len >= LARGE_FRAME && buf.len() < HEADER_LEN + len).then_some(len)
}

/// Envelopes received in a row on one connection that share one header:
/// an optional first payload, then payloads that are slices of one block of
/// the read buffer. The reader hands these to an actor without building an
/// envelope (and touching the ids' reference counts) per message; the
/// actor's mailbox builds each envelope as it takes it.
pub(crate) struct Arrivals {
    /// The shared header (its payload is unused).
    header: Envelope,
    first: Option<Bytes>,
    block: Bytes,
    /// Payload ranges within `block`, and the next one to hand out.
    spans: Vec<(u32, u32)>,
    next: usize,
    /// Whether an envelope was handed out already (see [`Arrivals::repeat`]).
    handed: bool,
}

impl Arrivals {
    /// One envelope.
    pub(crate) fn one(mut env: Envelope) -> Self {
        let first = std::mem::take(&mut env.payload);
        Arrivals {
            header: env,
            first: Some(first),
            block: Bytes::new(),
            spans: Vec::new(),
            next: 0,
            handed: false,
        }
    }

    /// The actor all of these go to.
    pub(crate) fn dest(&self) -> &PortId {
        &self.header.dest
    }

    /// How many envelopes are left.
    pub(crate) fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.spans.len() - self.next
    }

    /// Leaves the first `n` envelopes here and returns the others.
    pub(crate) fn split_off(&mut self, n: usize) -> Arrivals {
        let skip = n - usize::from(self.first.is_some());
        let at = self.next + skip;
        let rest = self.spans.split_off(at);
        Arrivals {
            header: Envelope {
                payload: Bytes::new(),
                ..self.header.clone()
            },
            first: None,
            block: self.block.clone(),
            spans: rest,
            next: 0,
            handed: false,
        }
    }

    /// The range in [`Arrivals::block`] of the next payload, if an envelope
    /// of this run was handed out before it (the taker knows the header
    /// from that envelope, and holds the block); else `None` (take it with
    /// [`Iterator::next`]).
    pub(crate) fn repeat(&mut self) -> Option<std::ops::Range<usize>> {
        if !self.handed || self.first.is_some() {
            return None;
        }
        let (off, len) = *self.spans.get(self.next)?;
        self.next += 1;
        Some(off as usize..(off + len) as usize)
    }

    /// The buffer the payloads after the first are slices of.
    pub(crate) fn block(&self) -> &Bytes {
        &self.block
    }

    fn payload(&mut self) -> Option<Bytes> {
        self.handed = true;
        match self.first.take() {
            Some(p) => Some(p),
            None => {
                let (off, len) = *self.spans.get(self.next)?;
                self.next += 1;
                Some(self.block.slice(off as usize..(off + len) as usize))
            }
        }
    }
}

impl Iterator for Arrivals {
    type Item = Envelope;
    fn next(&mut self) -> Option<Envelope> {
        let payload = self.payload()?;
        Some(Envelope {
            sender: self.header.sender.clone(),
            dest: self.header.dest.clone(),
            reply_to: self.header.reply_to.clone(),
            error: self.header.error.clone(),
            payload,
        })
    }
}

/// Takes the frames at the front of `buf` that repeat the previous header
/// (`header`, whose envelope must have no error) as one [`Arrivals`]; `None`
/// when the first frame is not such a frame or not complete. Anything else
/// (including a malformed frame) is left for [`decode`].
pub(crate) fn take_repeats(
    buf: &mut BytesMut,
    max_frame: usize,
    header: &Envelope,
) -> Option<Arrivals> {
    let mut pos = 0usize;
    let mut spans = Vec::new();
    while buf.len() - pos >= HEADER_LEN + 4 {
        let b = &buf[pos..];
        if b[0..2] != MAGIC || b[2] != VERSION || b[3] != FrameKind::Envelope as u8 {
            break;
        }
        let len = u32::from_be_bytes([b[4], b[5], b[6], b[7]]) as usize;
        if len > max_frame || len < 4 || b.len() < HEADER_LEN + len {
            break;
        }
        if b[8..12] != [0, 0, 0, 0] {
            break;
        }
        let start = pos + HEADER_LEN + 4;
        spans.push((start as u32, (len - 4) as u32));
        pos += HEADER_LEN + len;
        if pos > u32::MAX as usize / 2 {
            break;
        }
    }
    if spans.is_empty() {
        return None;
    }
    let block = buf.split_to(pos).freeze();
    Some(Arrivals {
        header: Envelope {
            payload: Bytes::new(),
            ..header.clone()
        },
        first: None,
        block,
        spans,
        next: 0,
        handed: false,
    })
}

/// A decoded frame.
// A frame is moved once from the decoder to its consumer; boxing the
// envelope would cost an allocation per message for nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Frame {
    Hello(Bytes),
    Envelope(Envelope),
    Ack(u64),
}

/// Takes one complete frame off the front of `buf`, if there is one;
/// `last` is the previous envelope header read on this connection.
/// Errors mean the stream is corrupt and the connection must close.
pub(crate) fn decode(
    buf: &mut BytesMut,
    max_frame: usize,
    last: &mut Option<HeaderOwned>,
) -> Result<Option<Frame>, ChannelError> {
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    if buf[0..2] != MAGIC {
        return Err(ChannelError::Protocol(format!(
            "bad magic {:02x}{:02x} (not a hostmesh peer?)",
            buf[0], buf[1]
        )));
    }
    if buf[2] != VERSION {
        return Err(ChannelError::Version {
            peer: buf[2],
            ours: VERSION,
        });
    }
    let kind = FrameKind::from_u8(buf[3])
        .ok_or_else(|| ChannelError::Protocol(format!("unknown frame kind {}", buf[3])))?;
    let len = u32::from_be_bytes([buf[4], buf[5], buf[6], buf[7]]) as usize;
    if len > max_frame {
        return Err(ChannelError::FrameTooLarge {
            len,
            max: max_frame,
        });
    }
    if buf.len() < HEADER_LEN + len {
        if len < LARGE_FRAME {
            buf.reserve(HEADER_LEN + len - buf.len());
        }
        return Ok(None);
    }
    buf.advance(HEADER_LEN);
    let mut body = buf.split_to(len).freeze();
    match kind {
        FrameKind::Hello => Ok(Some(Frame::Hello(body))),
        FrameKind::Ack => {
            if body.len() != 8 {
                return Err(ChannelError::Protocol(format!(
                    "ack frame of {} bytes, expected 8",
                    body.len()
                )));
            }
            Ok(Some(Frame::Ack(body.get_u64())))
        }
        FrameKind::Envelope => {
            if body.len() < 4 {
                return Err(ChannelError::Protocol("envelope frame too short".into()));
            }
            let hdr_len = body.get_u32() as usize;
            if hdr_len > body.len() {
                return Err(ChannelError::Protocol(format!(
                    "envelope header length {hdr_len} exceeds the frame"
                )));
            }
            let hdr = if hdr_len == 0 {
                last.clone().ok_or_else(|| {
                    ChannelError::Protocol("repeated header with no previous envelope".into())
                })?
            } else {
                let hdr: HeaderOwned = postcard::from_bytes(&body[..hdr_len])
                    .map_err(|e| ChannelError::Protocol(format!("bad envelope header: {e}")))?;
                body.advance(hdr_len);
                *last = hdr.error.is_none().then(|| hdr.clone());
                hdr
            };
            Ok(Some(Frame::Envelope(Envelope {
                sender: hdr.sender,
                dest: hdr.dest,
                reply_to: hdr.reply_to,
                error: hdr.error,
                payload: body,
            })))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(payload: &[u8]) -> Envelope {
        let a: ActorId = "tcp:127.0.0.1:1/p/a[0]".parse().unwrap();
        Envelope {
            sender: a.clone(),
            dest: a.port(5),
            reply_to: Some(a.port(9)),
            error: None,
            payload: Bytes::copy_from_slice(payload),
        }
    }

    #[test]
    fn envelope_round_trips_byte_by_byte() {
        let mut wire = BytesMut::new();
        let mut last = LastHeader::default();
        assert!(encode_envelope(&mut wire, &env(b"hello"), 1 << 20, &mut last).unwrap());
        let first_len = wire.len();
        encode_envelope(&mut wire, &env(b"again"), 1 << 20, &mut last).unwrap();
        assert!(wire.len() - first_len < 20, "a repeated header is elided");
        encode_ack(&mut wire, 42);
        // Feed one byte at a time: partial frames are never decoded.
        let mut buf = BytesMut::new();
        let mut frames = Vec::new();
        let mut prev = None;
        for b in wire.iter() {
            buf.put_u8(*b);
            while let Some(f) = decode(&mut buf, 1 << 20, &mut prev).unwrap() {
                frames.push(f);
            }
        }
        assert_eq!(frames.len(), 3);
        match &frames[1] {
            Frame::Envelope(e) => {
                assert_eq!(&e.payload[..], b"again");
                assert_eq!(e.dest.index(), 5);
            }
            _ => panic!("expected an envelope"),
        }
        match &frames[0] {
            Frame::Envelope(e) => {
                assert_eq!(&e.payload[..], b"hello");
                assert_eq!(e.dest.index(), 5);
                assert_eq!(e.reply_to.as_ref().unwrap().index(), 9);
            }
            _ => panic!("expected an envelope"),
        }
        assert!(matches!(frames[2], Frame::Ack(42)));
    }

    #[test]
    fn corrupt_input_is_an_error_not_a_panic() {
        let mut big = BytesMut::new();
        encode_envelope(
            &mut big,
            &env(&[0; 100]),
            1 << 20,
            &mut LastHeader::default(),
        )
        .unwrap();
        assert!(matches!(
            decode(&mut big.clone(), 50, &mut None),
            Err(ChannelError::FrameTooLarge { .. })
        ));
        assert!(
            encode_envelope(
                &mut BytesMut::new(),
                &env(&[0; 100]),
                50,
                &mut LastHeader::default()
            )
            .is_err()
        );
        let mut garbage = BytesMut::from(&b"GET / HTTP/1.1\r\n\r\n"[..]);
        assert!(matches!(
            decode(&mut garbage, 1 << 20, &mut None),
            Err(ChannelError::Protocol(_))
        ));
        let mut bad_version = big.clone();
        bad_version[2] = 9;
        assert!(decode(&mut bad_version, 1 << 20, &mut None).is_err());
        let mut bad_kind = big.clone();
        bad_kind[3] = 77;
        assert!(decode(&mut bad_kind, 1 << 20, &mut None).is_err());
        let mut bad_hdr = big.clone();
        bad_hdr[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&1_000u32.to_be_bytes());
        assert!(decode(&mut bad_hdr, 1 << 20, &mut None).is_err());
        // A repeated header with nothing to repeat.
        let mut orphan = BytesMut::new();
        put_header(&mut orphan, FrameKind::Envelope, 4);
        orphan.put_u32(0);
        assert!(matches!(
            decode(&mut orphan, 1 << 20, &mut None),
            Err(ChannelError::Protocol(_))
        ));
        // Random bytes after a valid header never panic.
        let mut x: u32 = 1;
        for len in 0..200usize {
            let mut b = BytesMut::new();
            put_header(&mut b, FrameKind::Envelope, len);
            for _ in 0..len {
                x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                b.put_u8((x >> 24) as u8);
            }
            let _ = decode(&mut b, 1 << 20, &mut None);
        }
    }
}
