//! SPDY/3 frames and their codec.
//!
//! Invariants:
//! 1. Header blocks are zlib streams with the SPDY/3 dictionary, one
//!    compression context per direction per connection: every block is
//!    compressed (and inflated) in order with the state the previous one
//!    left, ending in a sync flush, exactly as spdystream's Go `zlib`
//!    writer does. A codec therefore belongs to one connection.
//! 2. Nothing from the peer can make the decoder allocate without bound:
//!    frames are at most 2^24 - 1 bytes by the format, and an inflated
//!    header block larger than [`MAX_HEADER_BLOCK`] is an error.
//! 3. Header names are lowercase on the wire; several values of one name
//!    are joined with NUL.

use bytes::{Buf as _, BufMut as _, Bytes, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

/// The SPDY version this codec writes (spdystream's).
pub(crate) const VERSION: u16 = 3;
/// Largest inflated header block accepted.
pub(crate) const MAX_HEADER_BLOCK: usize = 256 * 1024;
/// Largest DATA payload this side writes (frames may carry up to 2^24 - 1).
pub(crate) const MAX_DATA: usize = 32 * 1024;

/// FIN flag (control and data frames).
pub(crate) const FLAG_FIN: u8 = 0x01;

/// RST_STREAM status: REFUSED_STREAM.
pub(crate) const RST_REFUSED: u32 = 3;
/// RST_STREAM status: CANCEL.
pub(crate) const RST_CANCEL: u32 = 5;

/// Header name/value pairs (lowercase names).
pub(crate) type Headers = Vec<(String, String)>;

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SpdyFrame {
    /// Opens a stream.
    SynStream {
        /// Stream id (odd from the client, even from the server).
        id: u32,
        /// Associated stream (0: none).
        associated: u32,
        /// Priority 0 (highest) to 7.
        priority: u8,
        /// Flags (`FLAG_FIN`; 0x02 is UNIDIRECTIONAL).
        flags: u8,
        /// Headers.
        headers: Headers,
    },
    /// Accepts a stream.
    SynReply {
        /// Stream id.
        id: u32,
        /// Flags (`FLAG_FIN`).
        flags: u8,
        /// Headers.
        headers: Headers,
    },
    /// Aborts a stream.
    RstStream {
        /// Stream id.
        id: u32,
        /// Reason.
        status: u32,
    },
    /// Settings (flags, id, value); parsed and ignored.
    Settings {
        /// Frame flags.
        flags: u8,
        /// `(flags, id, value)` entries.
        entries: Vec<(u8, u32, u32)>,
    },
    /// Ping (echoed when it came from the peer).
    Ping(u32),
    /// The peer stops opening streams.
    GoAway {
        /// Last stream the sender accepted.
        last_good: u32,
        /// Reason.
        status: u32,
    },
    /// More headers for a stream.
    Headers {
        /// Stream id.
        id: u32,
        /// Flags (`FLAG_FIN`).
        flags: u8,
        /// Headers.
        headers: Headers,
    },
    /// Flow-control credit; parsed and ignored (see the module docs).
    WindowUpdate {
        /// Stream id (0: the session).
        id: u32,
        /// Added window.
        delta: u32,
    },
    /// Stream data.
    Data {
        /// Stream id.
        id: u32,
        /// Flags (`FLAG_FIN`).
        flags: u8,
        /// Payload.
        data: Bytes,
    },
}

/// A malformed frame or header block.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FrameError {
    /// The bytes do not form a valid frame.
    #[error("invalid SPDY frame: {0}")]
    Invalid(String),
    /// The header block cannot be inflated.
    #[error("invalid SPDY header block: {0}")]
    Compression(String),
    /// Reading or writing the connection failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

fn invalid(m: impl Into<String>) -> FrameError {
    FrameError::Invalid(m.into())
}

/// The SPDY/3 header dictionary (1423 bytes, zlib dictionary id
/// 0xe3c6a7c2): length-prefixed header names and values, then common
/// header text.
pub(crate) fn dictionary() -> &'static [u8] {
    static DICT: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    DICT.get_or_init(|| {
        const WORDS: &[&str] = &[
            "options",
            "head",
            "post",
            "put",
            "delete",
            "trace",
            "accept",
            "accept-charset",
            "accept-encoding",
            "accept-language",
            "accept-ranges",
            "age",
            "allow",
            "authorization",
            "cache-control",
            "connection",
            "content-base",
            "content-encoding",
            "content-language",
            "content-length",
            "content-location",
            "content-md5",
            "content-range",
            "content-type",
            "date",
            "etag",
            "expect",
            "expires",
            "from",
            "host",
            "if-match",
            "if-modified-since",
            "if-none-match",
            "if-range",
            "if-unmodified-since",
            "last-modified",
            "location",
            "max-forwards",
            "pragma",
            "proxy-authenticate",
            "proxy-authorization",
            "range",
            "referer",
            "retry-after",
            "server",
            "te",
            "trailer",
            "transfer-encoding",
            "upgrade",
            "user-agent",
            "vary",
            "via",
            "warning",
            "www-authenticate",
            "method",
            "get",
            "status",
            "200 OK",
            "version",
            "HTTP/1.1",
            "url",
            "public",
            "set-cookie",
            "keep-alive",
            "origin",
        ];
        const TAIL: &str = "100101201202205206300302303304305306307402405406407408409410411\
412413414415416417502504505203 Non-Authoritative Information204 No Content301 Moved \
Permanently400 Bad Request401 Unauthorized403 Forbidden404 Not Found500 Internal Server \
Error501 Not Implemented503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov \
Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,\
image/gif,application/xml,application/xhtml+xml,text/plain,text/javascript,publicprivate\
max-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.";
        let mut d = Vec::with_capacity(1423);
        for w in WORDS {
            d.extend_from_slice(&(w.len() as u32).to_be_bytes());
            d.extend_from_slice(w.as_bytes());
        }
        d.extend_from_slice(TAIL.as_bytes());
        d
    })
}

/// Encodes and decodes the frames of one connection (invariant 1).
pub(crate) struct Codec {
    deflate: Compress,
    inflate: Decompress,
    deflate_started: bool,
}

impl Default for Codec {
    fn default() -> Self {
        Self::new()
    }
}

impl Codec {
    /// A codec with fresh compression contexts.
    pub(crate) fn new() -> Self {
        Self {
            deflate: Compress::new(Compression::default(), true),
            inflate: Decompress::new(true),
            deflate_started: false,
        }
    }

    fn compress(&mut self, headers: &Headers) -> Result<Vec<u8>, FrameError> {
        if !self.deflate_started {
            self.deflate
                .set_dictionary(dictionary())
                .map_err(|e| FrameError::Compression(e.to_string()))?;
            self.deflate_started = true;
        }
        let mut raw = Vec::new();
        raw.put_u32(headers.len() as u32);
        for (k, v) in headers {
            let k = k.to_ascii_lowercase();
            raw.put_u32(k.len() as u32);
            raw.extend_from_slice(k.as_bytes());
            raw.put_u32(v.len() as u32);
            raw.extend_from_slice(v.as_bytes());
        }
        let mut out = Vec::with_capacity(raw.len() + 64);
        let mut input = &raw[..];
        loop {
            if out.capacity() - out.len() < 64 {
                out.reserve(out.capacity().max(256));
            }
            let before = self.deflate.total_in();
            self.deflate
                .compress_vec(input, &mut out, FlushCompress::Sync)
                .map_err(|e| FrameError::Compression(e.to_string()))?;
            input = &input[(self.deflate.total_in() - before) as usize..];
            // A sync flush is complete once input is consumed and the
            // output buffer was not filled.
            if input.is_empty() && out.len() < out.capacity() {
                return Ok(out);
            }
        }
    }

    fn decompress(&mut self, block: &[u8]) -> Result<Headers, FrameError> {
        let mut out: Vec<u8> = Vec::with_capacity(block.len() * 4 + 64);
        let mut input = block;
        loop {
            if out.capacity() - out.len() < 256 {
                if out.len() >= MAX_HEADER_BLOCK {
                    return Err(FrameError::Compression(format!(
                        "inflates to more than {MAX_HEADER_BLOCK} bytes"
                    )));
                }
                out.reserve(out.capacity().max(1024));
            }
            let before = self.inflate.total_in();
            let r = self
                .inflate
                .decompress_vec(input, &mut out, FlushDecompress::Sync);
            input = &input[(self.inflate.total_in() - before) as usize..];
            match r {
                Ok(Status::Ok | Status::BufError) => {
                    if input.is_empty() && out.len() < out.capacity() {
                        break;
                    }
                }
                Ok(Status::StreamEnd) => break,
                Err(e) if e.needs_dictionary().is_some() => {
                    self.inflate
                        .set_dictionary(dictionary())
                        .map_err(|e| FrameError::Compression(e.to_string()))?;
                }
                Err(e) => return Err(FrameError::Compression(e.to_string())),
            }
        }
        if out.len() > MAX_HEADER_BLOCK {
            return Err(FrameError::Compression(format!(
                "inflates to more than {MAX_HEADER_BLOCK} bytes"
            )));
        }
        parse_headers(&out)
    }

    /// Appends `frame` to `out`.
    pub(crate) fn encode(
        &mut self,
        frame: &SpdyFrame,
        out: &mut BytesMut,
    ) -> Result<(), FrameError> {
        let control = |out: &mut BytesMut, kind: u16, flags: u8, len: usize| {
            out.put_u16(0x8000 | VERSION);
            out.put_u16(kind);
            out.put_u32((u32::from(flags) << 24) | (len as u32 & 0x00ff_ffff));
        };
        match frame {
            SpdyFrame::SynStream {
                id,
                associated,
                priority,
                flags,
                headers,
            } => {
                let block = self.compress(headers)?;
                control(out, 1, *flags, 10 + block.len());
                out.put_u32(id & 0x7fff_ffff);
                out.put_u32(associated & 0x7fff_ffff);
                out.put_u8((priority & 7) << 5);
                out.put_u8(0);
                out.extend_from_slice(&block);
            }
            SpdyFrame::SynReply { id, flags, headers }
            | SpdyFrame::Headers { id, flags, headers } => {
                let kind = if matches!(frame, SpdyFrame::SynReply { .. }) {
                    2
                } else {
                    8
                };
                let block = self.compress(headers)?;
                control(out, kind, *flags, 4 + block.len());
                out.put_u32(id & 0x7fff_ffff);
                out.extend_from_slice(&block);
            }
            SpdyFrame::RstStream { id, status } => {
                control(out, 3, 0, 8);
                out.put_u32(id & 0x7fff_ffff);
                out.put_u32(*status);
            }
            SpdyFrame::Settings { flags, entries } => {
                control(out, 4, *flags, 4 + 8 * entries.len());
                out.put_u32(entries.len() as u32);
                for (f, id, v) in entries {
                    out.put_u32((u32::from(*f) << 24) | (id & 0x00ff_ffff));
                    out.put_u32(*v);
                }
            }
            SpdyFrame::Ping(id) => {
                control(out, 6, 0, 4);
                out.put_u32(*id);
            }
            SpdyFrame::GoAway { last_good, status } => {
                control(out, 7, 0, 8);
                out.put_u32(last_good & 0x7fff_ffff);
                out.put_u32(*status);
            }
            SpdyFrame::WindowUpdate { id, delta } => {
                control(out, 9, 0, 8);
                out.put_u32(id & 0x7fff_ffff);
                out.put_u32(delta & 0x7fff_ffff);
            }
            SpdyFrame::Data { id, flags, data } => {
                if data.len() > 0x00ff_ffff {
                    return Err(invalid("a DATA frame holds at most 2^24 - 1 bytes"));
                }
                out.put_u32(id & 0x7fff_ffff);
                out.put_u32((u32::from(*flags) << 24) | data.len() as u32);
                out.extend_from_slice(data);
            }
        }
        Ok(())
    }

    /// Takes one frame off the front of `buf`; `None` until one is complete.
    pub(crate) fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<SpdyFrame>, FrameError> {
        if buf.len() < 8 {
            return Ok(None);
        }
        let len = (u32::from_be_bytes([0, buf[5], buf[6], buf[7]])) as usize;
        if buf.len() < 8 + len {
            buf.reserve(8 + len - buf.len());
            return Ok(None);
        }
        let mut head = buf.split_to(8);
        let mut body = buf.split_to(len).freeze();
        let first = head.get_u32();
        let flags = head[0];
        if first & 0x8000_0000 == 0 {
            let id = first & 0x7fff_ffff;
            if id == 0 {
                return Err(invalid("DATA frame on stream 0"));
            }
            return Ok(Some(SpdyFrame::Data {
                id,
                flags,
                data: body,
            }));
        }
        let version = ((first >> 16) & 0x7fff) as u16;
        if version != VERSION {
            return Err(invalid(format!("version {version}, expected {VERSION}")));
        }
        let kind = (first & 0xffff) as u16;
        let need = |body: &Bytes, n: usize, what: &str| {
            if body.len() < n {
                Err(invalid(format!(
                    "{what} frame of {} bytes is too short",
                    body.len()
                )))
            } else {
                Ok(())
            }
        };
        let frame = match kind {
            1 => {
                need(&body, 10, "SYN_STREAM")?;
                let id = body.get_u32() & 0x7fff_ffff;
                let associated = body.get_u32() & 0x7fff_ffff;
                let priority = body.get_u8() >> 5;
                let _slot = body.get_u8();
                if id == 0 {
                    return Err(invalid("SYN_STREAM with stream id 0"));
                }
                let headers = self.decompress(&body)?;
                SpdyFrame::SynStream {
                    id,
                    associated,
                    priority,
                    flags,
                    headers,
                }
            }
            2 | 8 => {
                need(&body, 4, "SYN_REPLY/HEADERS")?;
                let id = body.get_u32() & 0x7fff_ffff;
                let headers = self.decompress(&body)?;
                if kind == 2 {
                    SpdyFrame::SynReply { id, flags, headers }
                } else {
                    SpdyFrame::Headers { id, flags, headers }
                }
            }
            3 => {
                need(&body, 8, "RST_STREAM")?;
                SpdyFrame::RstStream {
                    id: body.get_u32() & 0x7fff_ffff,
                    status: body.get_u32(),
                }
            }
            4 => {
                need(&body, 4, "SETTINGS")?;
                let n = body.get_u32() as usize;
                if body.len() != n * 8 {
                    return Err(invalid(format!(
                        "SETTINGS with {n} entries in {} bytes",
                        body.len()
                    )));
                }
                let entries = (0..n)
                    .map(|_| {
                        let fid = body.get_u32();
                        ((fid >> 24) as u8, fid & 0x00ff_ffff, body.get_u32())
                    })
                    .collect();
                SpdyFrame::Settings { flags, entries }
            }
            6 => {
                need(&body, 4, "PING")?;
                SpdyFrame::Ping(body.get_u32())
            }
            7 => {
                need(&body, 8, "GOAWAY")?;
                SpdyFrame::GoAway {
                    last_good: body.get_u32() & 0x7fff_ffff,
                    status: body.get_u32(),
                }
            }
            9 => {
                need(&body, 8, "WINDOW_UPDATE")?;
                SpdyFrame::WindowUpdate {
                    id: body.get_u32() & 0x7fff_ffff,
                    delta: body.get_u32() & 0x7fff_ffff,
                }
            }
            other => return Err(invalid(format!("unknown control frame type {other}"))),
        };
        Ok(Some(frame))
    }
}

fn parse_headers(mut b: &[u8]) -> Result<Headers, FrameError> {
    let take = |n: usize, b: &mut &[u8]| -> Result<Vec<u8>, FrameError> {
        if b.len() < n {
            return Err(invalid("header block ends early"));
        }
        let (head, rest) = b.split_at(n);
        *b = rest;
        Ok(head.to_vec())
    };
    let num = |b: &mut &[u8]| -> Result<usize, FrameError> {
        if b.len() < 4 {
            return Err(invalid("header block ends early"));
        }
        let n = u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
        *b = &b[4..];
        Ok(n)
    };
    let count = num(&mut b)?;
    let mut out = Vec::with_capacity(count.min(64));
    for _ in 0..count {
        let n = num(&mut b)?;
        let name = take(n, &mut b)?;
        let n = num(&mut b)?;
        let value = take(n, &mut b)?;
        let name = String::from_utf8_lossy(&name).to_ascii_lowercase();
        for v in value.split(|c| *c == 0) {
            out.push((name.clone(), String::from_utf8_lossy(v).into_owned()));
        }
    }
    Ok(out)
}

/// The first value of header `name` (lowercase).
pub(crate) fn header<'a>(headers: &'a Headers, name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

impl tokio_util::codec::Decoder for Codec {
    type Item = SpdyFrame;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<SpdyFrame>, FrameError> {
        Codec::decode(self, src)
    }
}

impl tokio_util::codec::Encoder<SpdyFrame> for Codec {
    type Error = FrameError;

    fn encode(&mut self, item: SpdyFrame, dst: &mut BytesMut) -> Result<(), FrameError> {
        Codec::encode(self, &item, dst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adler32(d: &[u8]) -> u32 {
        let (mut a, mut b) = (1u32, 0u32);
        for x in d {
            a = (a + u32::from(*x)) % 65521;
            b = (b + a) % 65521;
        }
        (b << 16) | a
    }

    #[test]
    fn the_dictionary_is_spdy3s() {
        let d = dictionary();
        assert_eq!(d.len(), 1423);
        assert_eq!(adler32(d), 0xe3c6_a7c2);
    }

    fn hdrs(pairs: &[(&str, &str)]) -> Headers {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn every_frame_round_trips_through_one_context_per_direction() {
        let frames = vec![
            SpdyFrame::SynStream {
                id: 1,
                associated: 0,
                priority: 0,
                flags: 0,
                headers: hdrs(&[
                    ("streamtype", "error"),
                    ("port", "8080"),
                    ("requestid", "0"),
                ]),
            },
            SpdyFrame::SynStream {
                id: 3,
                associated: 0,
                priority: 0,
                flags: FLAG_FIN,
                headers: hdrs(&[("streamtype", "data"), ("port", "8080"), ("requestid", "0")]),
            },
            SpdyFrame::SynReply {
                id: 1,
                flags: 0,
                headers: vec![],
            },
            SpdyFrame::Headers {
                id: 3,
                flags: FLAG_FIN,
                headers: hdrs(&[("a", "b"), ("a", "c")]),
            },
            SpdyFrame::Data {
                id: 3,
                flags: FLAG_FIN,
                data: Bytes::from_static(b"hello"),
            },
            SpdyFrame::Data {
                id: 1,
                flags: 0,
                data: Bytes::new(),
            },
            SpdyFrame::RstStream {
                id: 3,
                status: RST_CANCEL,
            },
            SpdyFrame::Settings {
                flags: 0,
                entries: vec![(0, 7, 65536)],
            },
            SpdyFrame::Ping(2),
            SpdyFrame::GoAway {
                last_good: 3,
                status: 0,
            },
            SpdyFrame::WindowUpdate { id: 1, delta: 1024 },
        ];
        let (mut tx, mut rx) = (Codec::new(), Codec::new());
        let mut wire = BytesMut::new();
        for f in &frames {
            tx.encode(f, &mut wire).unwrap();
        }
        // Fed one byte at a time, the decoder waits for whole frames.
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        for b in wire.iter() {
            buf.put_u8(*b);
            while let Some(f) = rx.decode(&mut buf).unwrap() {
                got.push(f);
            }
        }
        assert_eq!(got, frames);
    }

    /// A SYN_STREAM as spdystream writes it for kubectl's port-forward
    /// error stream: the header block deflated by C zlib with the SPDY/3
    /// dictionary and a sync flush (an independent implementation).
    #[test]
    fn decodes_a_header_block_from_another_implementation() {
        let block = const_hex(ZLIB_BLOCK);
        let mut wire = BytesMut::new();
        wire.put_u16(0x8003);
        wire.put_u16(1);
        wire.put_u32(10 + block.len() as u32);
        wire.put_u32(1);
        wire.put_u32(0);
        wire.put_u16(0);
        wire.extend_from_slice(&block);
        let f = Codec::new().decode(&mut wire).unwrap().unwrap();
        assert_eq!(
            f,
            SpdyFrame::SynStream {
                id: 1,
                associated: 0,
                priority: 0,
                flags: 0,
                headers: hdrs(&[
                    ("port", "8080"),
                    ("requestid", "0"),
                    ("streamtype", "error")
                ]),
            }
        );
        assert!(wire.is_empty());
    }

    // Python: c = zlib.compressobj(zdict=DICT); c.compress(block) + c.flush(zlib.Z_SYNC_FLUSH)
    const ZLIB_BLOCK: &str = include_str!("testdata/syn_stream_block.hex");

    fn const_hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let mut c = Codec::new();
        let mut b = BytesMut::from(
            &[
                0x80, 0x03, 0x00, 0x01, 0, 0, 0, 12, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 2,
            ][..],
        );
        assert!(c.decode(&mut b).is_err());
        let mut b = BytesMut::from(&[0x80, 0x02, 0x00, 0x01, 0, 0, 0, 0][..]);
        assert!(Codec::new().decode(&mut b).is_err());
        let mut b = BytesMut::from(&[0x80, 0x03, 0x00, 0x06, 0, 0, 0, 1, 0][..]);
        assert!(Codec::new().decode(&mut b).is_err());
    }
}
