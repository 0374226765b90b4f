//! [`Payload`]: a byte-string message field that decodes without a copy
//! (when larger than 256 bytes).
//!
//! On the wire a `Payload` is an ordinary byte string (the same encoding as a
//! `Vec<u8>` field, so the two are interchangeable between peers). When a
//! message is decoded from an envelope, a `Payload` field is a slice of the
//! envelope's buffer (for a message from another proc: of the connection's
//! read buffer) instead of a fresh copy; anywhere else it decodes as a copy.
//!
//! Invariants:
//! 1. Decoding never copies a `Payload` of more than `COPY_MAX` (256)
//!    bytes that lies inside the buffer being decoded (`decode_shared`
//!    marks that buffer for the current thread). Smaller ones are copied:
//!    a small allocation costs less than counting references on a buffer
//!    that the reading thread touches too, and a message that small is
//!    decoded straight from its bytes, with no thread-local involved.
//! 2. The slice keeps its buffer alive (reference counted), so a payload kept
//!    by a handler pins at most the buffer it arrived in.

use std::cell::RefCell;
use std::ops::Deref;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

thread_local! {
    /// The buffer being decoded on this thread, if any.
    static SOURCE: RefCell<Option<Bytes>> = const { RefCell::new(None) };
}

/// Where a message's encoded bytes are: a buffer of their own, or a range
/// of a block shared with the messages received with it.
pub(crate) enum Src<'b> {
    Own(Bytes),
    Range(&'b mut Bytes, std::ops::Range<usize>),
}

impl Src<'_> {
    /// The bytes as a buffer of their own (a slice of the block).
    pub(crate) fn into_bytes(self) -> Bytes {
        match self {
            Src::Own(b) => b,
            Src::Range(block, r) => block
                .get(r.clone())
                .map_or_else(Bytes::new, |_| block.slice(r)),
        }
    }
}

/// `Payload`s of at most this many bytes are copied, not shared.
const COPY_MAX: usize = 256;

/// Decodes `src` as postcard `T`, letting [`Payload`] fields borrow from
/// its buffer (invariant 1). The buffer moves into a thread-local for the
/// decode and back out (no reference count traffic).
pub(crate) fn decode_shared<T: DeserializeOwned>(src: Src<'_>) -> Result<T, postcard::Error> {
    /// Puts the previous thread-local back, and the block where it was.
    struct Restore<'b> {
        prev: Option<Bytes>,
        block: Option<&'b mut Bytes>,
    }
    impl Drop for Restore<'_> {
        fn drop(&mut self) {
            let prev = self.prev.take();
            let ours = SOURCE.with(|s| match s.try_borrow_mut() {
                Ok(mut s) => std::mem::replace(&mut *s, prev),
                Err(_) => None,
            });
            if let (Some(block), Some(ours)) = (self.block.take(), ours) {
                *block = ours;
            }
        }
    }
    // Small: every `Payload` in it is copied anyway (no thread-local).
    match &src {
        Src::Own(b) if b.len() <= COPY_MAX => return postcard::from_bytes(b),
        Src::Range(block, range) if range.len() <= COPY_MAX => {
            return block
                .get(range.clone())
                .ok_or(postcard::Error::DeserializeUnexpectedEnd)
                .and_then(postcard::from_bytes);
        }
        _ => {}
    }
    let (buf, range, block) = match src {
        Src::Own(b) => {
            let len = b.len();
            (b, 0..len, None)
        }
        Src::Range(block, range) => (std::mem::take(block), range, Some(block)),
    };
    // A nested decode (a Deserialize impl that decodes again) finds the
    // thread-local borrowed and copies instead.
    let prev = SOURCE.with(move |s| match s.try_borrow_mut() {
        Ok(mut s) => Ok(s.replace(buf)),
        Err(_) => Err(buf),
    });
    let prev = match prev {
        Ok(prev) => prev,
        Err(buf) => {
            let r = buf
                .get(range)
                .ok_or(postcard::Error::DeserializeUnexpectedEnd)
                .and_then(postcard::from_bytes);
            if let Some(block) = block {
                *block = buf;
            }
            return r;
        }
    };
    let _restore = Restore { prev, block };
    SOURCE.with(|s| {
        let src = s.borrow();
        let bytes = src.as_deref().unwrap_or_default();
        match bytes.get(range) {
            Some(b) => postcard::from_bytes(b),
            None => Err(postcard::Error::DeserializeUnexpectedEnd),
        }
    })
}

/// An immutable byte string carried by a message (see the module docs).
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Payload(Bytes);

impl Payload {
    /// An empty payload.
    pub fn new() -> Self {
        Payload(Bytes::new())
    }

    /// The bytes as a [`Bytes`] (cheap: reference counted).
    pub fn into_bytes(self) -> Bytes {
        self.0
    }
}

impl Deref for Payload {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl AsRef<[u8]> for Payload {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl From<Bytes> for Payload {
    fn from(b: Bytes) -> Self {
        Payload(b)
    }
}

impl From<Vec<u8>> for Payload {
    fn from(v: Vec<u8>) -> Self {
        Payload(Bytes::from(v))
    }
}

impl From<&'static [u8]> for Payload {
    fn from(v: &'static [u8]) -> Self {
        Payload(Bytes::from_static(v))
    }
}

impl std::fmt::Debug for Payload {
    // Payloads stay out of logs: only the length.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Payload({} bytes)", self.0.len())
    }
}

impl Serialize for Payload {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for Payload {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Payload;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("bytes")
            }
            fn visit_borrowed_bytes<E: serde::de::Error>(self, v: &'de [u8]) -> Result<Payload, E> {
                Ok(Payload(share_or_copy(v)))
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Payload, E> {
                Ok(Payload(share_or_copy(v)))
            }
            fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Payload, E> {
                Ok(Payload(Bytes::from(v)))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Payload, A::Error> {
                let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
                while let Some(b) = seq.next_element::<u8>()? {
                    v.push(b);
                }
                Ok(Payload(Bytes::from(v)))
            }
        }
        d.deserialize_bytes(V)
    }
}

/// A slice of the buffer being decoded when `v` lies inside it and is
/// larger than [`COPY_MAX`], else a copy.
fn share_or_copy(v: &[u8]) -> Bytes {
    if v.len() <= COPY_MAX {
        return Bytes::copy_from_slice(v);
    }
    SOURCE.with(|s| {
        let Ok(src) = s.try_borrow() else {
            return Bytes::copy_from_slice(v);
        };
        match src.as_ref() {
            Some(src)
                if !v.is_empty()
                    && v.as_ptr() as usize >= src.as_ptr() as usize
                    && v.as_ptr() as usize + v.len() <= src.as_ptr() as usize + src.len() =>
            {
                src.slice_ref(v)
            }
            _ => Bytes::copy_from_slice(v),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize, Deserialize)]
    struct Msg {
        id: u32,
        data: Payload,
    }

    #[test]
    fn payloads_decode_as_slices_of_the_buffer() {
        let wire = Bytes::from(
            postcard::to_allocvec(&Msg {
                id: 7,
                data: vec![1u8; 1000].into(),
            })
            .unwrap(),
        );
        let m: Msg = decode_shared(Src::Own(wire.clone())).unwrap();
        assert_eq!(m.id, 7);
        assert_eq!(&m.data[..], &[1u8; 1000][..]);
        let inside = wire.as_ptr() as usize..wire.as_ptr() as usize + wire.len();
        assert!(inside.contains(&(m.data.as_ptr() as usize)), "no copy");
        // Outside `decode_shared`, a copy; the encoding matches Vec<u8>.
        let m: Msg = postcard::from_bytes(&wire).unwrap();
        assert!(!inside.contains(&(m.data.as_ptr() as usize)));
        let v: (u32, Vec<u8>) = postcard::from_bytes(&wire).unwrap();
        assert_eq!(v.1, vec![1u8; 1000]);
    }
}
