//! SPDY/3.1 as Kubernetes uses it: `frame` (the wire format and header
//! compression) and `session` (streams multiplexed over one connection).
//!
//! Kubernetes' peer is moby/spdystream, which writes version-3 frames,
//! never enforces flow-control windows and ignores WINDOW_UPDATE; this
//! implementation does the same (it parses WINDOW_UPDATE and SETTINGS and
//! acts on neither), so neither side ever waits for window credit.

pub(crate) mod frame;
pub(crate) mod session;
