//! The streaming protocols behind `kubectl exec`, `attach`, `cp` and
//! `port-forward`, shared by the API server and the kubelet:
//!
//! - `channel`: the `*.channel.k8s.io` subprotocols (one byte of channel id
//!   per WebSocket message; the exit code as a `metav1.Status` on the error
//!   channel) and the names of the SPDY stream types.
//! - `spdy`: SPDY/3.1 framing with zlib-compressed header blocks (`frame`)
//!   and a multiplexed session over one upgraded connection (`session`),
//!   as moby/spdystream speaks it (kubectl's fallback, and what a real
//!   kube-apiserver speaks to a kubelet).
//! - `upgrade`: the HTTP/1.1 upgrade handshakes (WebSocket accept key,
//!   subprotocol choice, SPDY's `X-Stream-Protocol-Version`).

pub(crate) mod channel;
pub(crate) mod spdy;
pub(crate) mod upgrade;
