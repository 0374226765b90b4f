//! Messages and ports: typed references to ports ([`PortRef`],
//! [`OncePortRef`]) and their receivers, and message encoding (small
//! messages into a per-thread arena, large ones into reused buffers).
//!
//! Port numbers:
//! 1. `0` is every actor's undeliverable port (returned messages);
//! 2. numbers with the top bit set are ports opened with
//!    [`Proc::open_port`] / [`Proc::open_once_port`], unique per proc;
//! 3. every other number is an actor's handler port for one message type:
//!    a stable FNV-1a hash of the type's Rust path (`std::any::type_name`),
//!    so both sides must use the same message type (the same crate path).

use std::marker::PhantomData;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use crate::RuntimeError;
use crate::channel::Envelope;
use crate::id::{ActorId, PortId};
use crate::proc::{CanSend, Proc};

/// A message: any serde type that can cross threads. Encoded with postcard.
pub trait Message: Serialize + DeserializeOwned + Send + 'static {}
impl<T: Serialize + DeserializeOwned + Send + 'static> Message for T {}

/// The undeliverable port of every actor.
pub(crate) const UNDELIVERABLE_PORT: u64 = 0;
/// The bit marking opened (not handler) ports.
pub(crate) const OPEN_PORT_BIT: u64 = 1 << 63;

/// The handler port of message type `M`.
pub(crate) fn handler_port<M: 'static>() -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in std::any::type_name::<M>().bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let p = h & !OPEN_PORT_BIT;
    if p == UNDELIVERABLE_PORT { 1 } else { p }
}

/// Messages up to this size are encoded into a per-thread arena.
const ARENA_MAX: usize = 4 * 1024;
/// Size of each arena block.
const ARENA_BLOCK: usize = 64 * 1024;

thread_local! {
    /// Small messages are encoded into one shared block per thread, each
    /// message a reference-counted slice of it, instead of one allocation
    /// per message; a block is freed when its last message is.
    static ARENA: std::cell::RefCell<bytes::BytesMut> =
        std::cell::RefCell::new(bytes::BytesMut::new());

    /// Large messages are encoded into a few buffers per thread, reused once
    /// the message is written (see [`crate::bufpool`]).
    static LARGE: std::cell::RefCell<crate::bufpool::BufPool> =
        std::cell::RefCell::new(crate::bufpool::BufPool::default());
}

/// Postcard output appended straight to a `BytesMut` (no `io::Write`
/// layer between the serializer and the buffer).
struct IntoBuf<'a>(&'a mut bytes::BytesMut);

impl postcard::ser_flavors::Flavor for IntoBuf<'_> {
    type Output = ();
    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(data);
        Ok(())
    }
    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        bytes::BufMut::put_u8(self.0, data);
        Ok(())
    }
    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

/// Appends `msg`, postcard-encoded, to `buf` (on error, `buf` may hold part
/// of it: the caller truncates).
pub(crate) fn encode_into<M: Serialize + ?Sized>(
    msg: &M,
    buf: &mut bytes::BytesMut,
) -> Result<(), postcard::Error> {
    postcard::serialize_with_flavor(msg, IntoBuf(buf))
}

pub(crate) fn encode<M: Serialize>(msg: &M) -> Result<Bytes, RuntimeError> {
    // Size first, so a large message is written once into an exact buffer
    // instead of being copied as a growing vector doubles.
    let size = postcard::experimental::serialized_size(msg)
        .map_err(|e| RuntimeError::Encode(e.to_string()))?;
    if size > ARENA_MAX {
        // Large: into a reused buffer of this thread (no fresh pages).
        return LARGE.with(|pool| {
            let mut pool = pool.borrow_mut();
            let buf = pool.get(size);
            if let Err(e) = encode_into(msg, buf) {
                buf.clear();
                return Err(RuntimeError::Encode(e.to_string()));
            }
            Ok(buf.split().freeze())
        });
    }
    ARENA.with(|arena| {
        let mut arena = arena.borrow_mut();
        if arena.capacity() - arena.len() < size {
            // Reuses the block in place once every message cut from it is
            // gone, else starts a new one.
            arena.reserve(ARENA_BLOCK);
        }
        if let Err(e) = encode_into(msg, &mut arena) {
            arena.clear();
            return Err(RuntimeError::Encode(e.to_string()));
        }
        Ok(arena.split().freeze())
    })
}

pub(crate) fn decode<M: DeserializeOwned>(env: &Envelope) -> Result<M, RuntimeError> {
    crate::payload::decode_shared(crate::payload::Src::Own(env.payload.clone())).map_err(|e| {
        RuntimeError::Decode {
            from: env.sender.to_string(),
            reason: e.to_string(),
        }
    })
}

/// A typed reference to a port that accepts any number of `M`s.
#[derive(Serialize, Deserialize)]
#[serde(bound = "")]
pub struct PortRef<M> {
    id: PortId,
    #[serde(skip)]
    _m: PhantomData<fn(M)>,
}

impl<M> Clone for PortRef<M> {
    fn clone(&self) -> Self {
        PortRef {
            id: self.id.clone(),
            _m: PhantomData,
        }
    }
}

impl<M> PartialEq for PortRef<M> {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl<M: Message> PortRef<M> {
    /// A typed reference to an existing port; the caller vouches for the type.
    pub fn attest(id: PortId) -> Self {
        PortRef {
            id,
            _m: PhantomData,
        }
    }

    /// The port's id.
    pub fn id(&self) -> &PortId {
        &self.id
    }

    /// Sends `msg` to the port (fire and forget; failures come back to the
    /// sender as undeliverable).
    pub async fn send(&self, cx: &impl CanSend, msg: &M) -> Result<(), RuntimeError> {
        let payload = encode(msg)?;
        cx.proc()
            .post(cx.sender_id(), self.id.clone(), None, payload)
            .await;
        Ok(())
    }
}

/// A typed reference to a port that accepts one `M` (a reply port).
#[derive(Serialize, Deserialize)]
#[serde(bound = "")]
pub struct OncePortRef<M> {
    id: PortId,
    #[serde(skip)]
    _m: PhantomData<fn(M)>,
}

impl<M: Message> OncePortRef<M> {
    /// The port's id.
    pub fn id(&self) -> &PortId {
        &self.id
    }

    /// Sends the one message.
    pub async fn send(self, cx: &impl CanSend, msg: &M) -> Result<(), RuntimeError> {
        let payload = encode(msg)?;
        cx.proc().post(cx.sender_id(), self.id, None, payload).await;
        Ok(())
    }
}

/// Receives the messages sent to a [`PortRef`]; dropping it closes the port.
pub struct PortReceiver<M> {
    rx: mpsc::Receiver<Envelope>,
    proc: Proc,
    port: u64,
    _m: PhantomData<fn() -> M>,
}

impl<M: Message> PortReceiver<M> {
    /// The next message; `Err(PortClosed)` when the proc shuts down.
    pub async fn recv(&mut self) -> Result<M, RuntimeError> {
        let env = self.recv_envelope().await?;
        decode(&env)
    }

    /// The next message and its sender.
    pub async fn recv_from(&mut self) -> Result<(ActorId, M), RuntimeError> {
        let env = self.recv_envelope().await?;
        Ok((env.sender.clone(), decode(&env)?))
    }

    pub(crate) async fn recv_envelope(&mut self) -> Result<Envelope, RuntimeError> {
        self.rx.recv().await.ok_or(RuntimeError::PortClosed)
    }
}

impl<M> Drop for PortReceiver<M> {
    fn drop(&mut self) {
        self.proc.close_port(self.port);
    }
}

/// Receives the one message sent to a [`OncePortRef`].
pub struct OnceReceiver<M> {
    rx: Option<oneshot::Receiver<Envelope>>,
    proc: Proc,
    port: u64,
    _m: PhantomData<fn() -> M>,
}

impl<M: Message> OnceReceiver<M> {
    /// Waits for the message. An undeliverable bounce or a failed handler
    /// arrives as `Err(CallFailed)`.
    pub async fn recv(mut self) -> Result<M, RuntimeError> {
        let env = self.recv_envelope().await?;
        decode(&env)
    }

    pub(crate) async fn recv_envelope(&mut self) -> Result<Envelope, RuntimeError> {
        let rx = self.rx.as_mut().ok_or(RuntimeError::PortClosed)?;
        let env = rx.await.map_err(|_| RuntimeError::PortClosed)?;
        self.rx = None;
        if let Some(reason) = &env.error {
            return Err(RuntimeError::CallFailed {
                dest: env.sender.to_string(),
                reason: reason.clone(),
            });
        }
        Ok(env)
    }
}

impl<M> Drop for OnceReceiver<M> {
    fn drop(&mut self) {
        if self.rx.is_some() {
            self.proc.close_port(self.port);
        }
    }
}

pub(crate) fn port_pair<M>(
    proc: &Proc,
    owner: &ActorId,
    capacity: usize,
) -> (PortRef<M>, PortReceiver<M>) {
    let (tx, rx) = mpsc::channel(capacity.max(1));
    let port = proc.register_port(crate::proc::PortSink::Many(tx));
    (
        PortRef {
            id: owner.port(port),
            _m: PhantomData,
        },
        PortReceiver {
            rx,
            proc: proc.clone(),
            port,
            _m: PhantomData,
        },
    )
}

pub(crate) fn once_pair<M>(proc: &Proc, owner: &ActorId) -> (OncePortRef<M>, OnceReceiver<M>) {
    let (tx, rx) = oneshot::channel();
    let port = proc.register_port(crate::proc::PortSink::Once(tx));
    (
        OncePortRef {
            id: owner.port(port),
            _m: PhantomData,
        },
        OnceReceiver {
            rx: Some(rx),
            proc: proc.clone(),
            port,
            _m: PhantomData,
        },
    )
}

impl<T> std::fmt::Debug for PortRef<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("PortRef")
            .field(&format_args!("{}", self.id))
            .finish()
    }
}

impl<T> std::fmt::Debug for OncePortRef<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("OncePortRef")
            .field(&format_args!("{}", self.id))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handler_ports_are_stable_and_distinct() {
        let a = handler_port::<String>();
        assert_eq!(a, handler_port::<String>());
        assert_ne!(a, handler_port::<u64>());
        assert_eq!(a & OPEN_PORT_BIT, 0);
        assert_ne!(a, UNDELIVERABLE_PORT);
    }
}
