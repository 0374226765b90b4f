//! Transport: framed, authenticated, encrypted, bidirectional connections
//! between procs.
//!
//! This module owns the wire ([`frame`]), the handshake ([`handshake`]),
//! the record layer that seals every frame after it ([`seal`]),
//! the per-peer links (`link`), their outgoing queues (`queue`), the
//! connection readers (`reader`) and the proc's `transport` that holds them. A
//! proc has one [`Transport`]; everything a proc sends to another proc goes
//! through the one link for that peer. Streams of small messages are
//! batched at every step: senders frame repeated-header envelopes as they
//! queue them, the link writes everything queued in one system call, and
//! the reader hands a read buffer's worth of envelopes for one actor over
//! in one wake-up, as slices of that buffer.
//!
//! Invariants:
//! 1. One link per peer proc, shared by all of the proc's actors. A link
//!    writes over exactly one connection at a time, so messages from one
//!    sender to one receiver arrive in send order.
//! 2. Connections are bidirectional: a connection accepted from a peer is
//!    attached to that peer's link, so replies and pushes to a dialer travel
//!    back over the connection it opened (a dialer needs no listener). A
//!    newer connection dialed by the same peer replaces the older one it
//!    dialed (the peer gave that one up: it restarted under the same proc
//!    id, or lost the connection while this side did not notice); the old
//!    one closes as on any loss. When both procs dial each other at once,
//!    each writes on its own connection and reads from both, and the other
//!    connection takes over if the one written on fails.
//! 3. Queues are bounded: each link queues at most `queue_capacity`
//!    envelopes (and at most 4 MiB of large payloads, one message always
//!    fitting) and writes whole runs of them (envelopes sharing a header)
//!    while at most `window` are unacknowledged on the connection (a single
//!    run larger than the window is written alone); senders wait when the
//!    queue is full (backpressure reaches the TCP socket, and the reader
//!    waits for room in the destination actor's mailbox).
//! 4. Nothing is dropped silently: an envelope that cannot be written, or was
//!    written but not acknowledged when its connection failed, is handed back
//!    to the proc as undeliverable (it may or may not have been processed).
//!    One exception: unacknowledged envelopes to *opened ports* (replies,
//!    subscription pushes) are logged, not bounced, when a connection fails:
//!    their receivers observe the loss themselves (a pending call fails with
//!    `ConnectionLost`), and failing a responder because its caller went
//!    away would be wrong.
//! 5. A bad header, an oversize frame or garbage closes only the connection
//!    it came on, with the reason logged; a failed handshake, and a record
//!    that fails to open (`seal`), likewise.
//! 6. Links to dialable peers reconnect with exponential backoff, up to
//!    `reconnect_timeout`, before queued envelopes become undeliverable.

mod admit;
pub mod credential;
pub mod epoch;
pub(crate) mod frame;
pub(crate) mod handshake;
mod link;
mod queue;
mod reader;
pub(crate) mod seal;
pub mod stage;
mod transport;

use std::time::Duration;

pub(crate) use frame::{Arrivals, Envelope};
/// The wire protocol version this build speaks (the third byte of every
/// frame header).
pub const WIRE_VERSION: u8 = frame::VERSION;
pub use stage::{Batched, batched};
pub(crate) use transport::{Inbound, Listener, Transport};

/// Tunables of the transport. The defaults suit a pod network.
#[derive(Debug, Clone)]
pub struct ChannelConfig {
    /// Largest frame body accepted or sent, in bytes (default 64 MiB).
    pub max_frame_len: usize,
    /// Envelopes queued per peer before senders wait (default 4096).
    pub queue_capacity: usize,
    /// Envelopes in flight unacknowledged per connection (default 8192).
    pub window: usize,
    /// Time allowed for a connection's handshake (default 5 s).
    pub handshake_timeout: Duration,
    /// Time allowed for one TCP connect attempt (default 2 s).
    pub connect_timeout: Duration,
    /// How long a link keeps redialing a peer before queued envelopes
    /// become undeliverable (default 5 s).
    pub reconnect_timeout: Duration,
    /// Inbound connections still in their handshake at once; more are
    /// closed at once (default 256).
    pub max_pending_handshakes: usize,
    /// Of those, from one source address (default 32).
    pub max_pending_per_source: usize,
}

impl Default for ChannelConfig {
    fn default() -> Self {
        ChannelConfig {
            max_frame_len: 64 << 20,
            queue_capacity: 4096,
            window: 8192,
            handshake_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
            reconnect_timeout: Duration::from_secs(5),
            max_pending_handshakes: 256,
            max_pending_per_source: 32,
        }
    }
}

/// Transport failures. They reach users as the reason of an undeliverable
/// message or as the error of `Proc::connect` / `ProcBuilder::build`.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    /// An I/O error on a socket.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// The peer broke the wire protocol (bad magic, version, kind or body).
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The peer speaks another version of the wire protocol (a frame
    /// header's version byte): both ends must run compatible builds.
    #[error(
        "the peer speaks hostmesh wire protocol {peer}, this build speaks {ours}: both ends must run compatible hostmesh builds"
    )]
    Version {
        /// The version in the peer's frame header.
        peer: u8,
        /// The version this build speaks ([`WIRE_VERSION`]).
        ours: u8,
    },
    /// A frame is larger than `max_frame_len`.
    #[error(
        "frame of {len} bytes exceeds the maximum of {max} bytes (raise ChannelConfig::max_frame_len on both sides or send less)"
    )]
    FrameTooLarge {
        /// Size of the frame body.
        len: usize,
        /// The configured maximum.
        max: usize,
    },
    /// Authentication failed; the message says which side and why.
    #[error("authentication failed: {0}")]
    Auth(String),
    /// An encrypted record failed to open (altered, replayed, reordered or
    /// cut short in transit) or could not be sealed ([`seal`]).
    #[error("encrypted link broken: {0}")]
    Record(String),
    /// A message could not be encoded.
    #[error("cannot encode message: {0}")]
    Encode(String),
    /// The address reached a different proc than the one asked for.
    #[error("address {addr} is served by proc {found}, not {wanted}")]
    WrongProc {
        /// The address dialed.
        addr: String,
        /// The proc the caller wanted.
        wanted: String,
        /// The proc that answered.
        found: String,
    },
    /// The address cannot be dialed (an `unbound` proc, port 0, ...).
    #[error("address {0} cannot be dialed")]
    NotDialable(String),
    /// Dialing or the handshake took too long.
    #[error("timed out {0}")]
    Timeout(&'static str),
}
