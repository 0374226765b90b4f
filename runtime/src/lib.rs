//! hostmesh actor runtime: identities, an authenticated, encrypted TCP transport,
//! procs, actors, typed ports, supervision and actor meshes. Shapes and
//! regions come from `hostmesh-mesh`.
//!
//! Modules, each owning one concern: [`id`] (addresses and ids), [`channel`] (framing, handshake,
//! encrypted records, links), [`proc`] (hosting and routing), [`actor`] (the actor model),
//! [`port`] (typed ports), [`payload`] (zero-copy byte fields), [`supervision`] (statuses and events),
//! [`actor_mesh`] (spawn, cast and gather over many procs).
//!
//! Two procs, one `call` over authenticated TCP:
//!
//! ```
//! use std::time::Duration;
//! use hostmesh_runtime::{Actor, ActorError, Context, Handler, Handlers, Proc};
//!
//! struct Echo;
//! impl Actor for Echo {
//!     fn register(h: &mut Handlers<Self>) {
//!         h.handle::<String>();
//!     }
//! }
//! impl Handler<String> for Echo {
//!     type Reply = String;
//!     async fn handle(&mut self, _cx: &Context<Self>, s: String) -> Result<String, ActorError> {
//!         Ok(s.to_uppercase())
//!     }
//! }
//!
//! # #[tokio::main] async fn main() -> Result<(), hostmesh_runtime::Error> {
//! // A server proc listening on loopback with a shared secret.
//! let server = Proc::builder("server")
//!     .listen("tcp:127.0.0.1:0".parse()?)
//!     .secret(*b"0123456789abcdef0123456789abcdef")
//!     .build()
//!     .await?;
//! let echo = server.spawn("echo", Echo).await?;
//!
//! // A client proc with no listener: replies come back over the connection
//! // it opens.
//! let client = Proc::builder("client")
//!     .secret(*b"0123456789abcdef0123456789abcdef")
//!     .build()
//!     .await?;
//! let reply = echo.call(&client, &"hi".to_string(), Duration::from_secs(5)).await?;
//! assert_eq!(reply, "HI");
//! # Ok(()) }
//! ```
//!
//! Messages are any serde types (postcard on the wire); an actor declares
//! the types it handles in [`Actor::register`].

pub mod actor;
pub mod actor_mesh;
mod bufpool;
pub mod channel;
mod error;
pub mod id;
pub mod payload;
pub mod port;
pub mod proc;
pub mod supervision;
pub mod testing;

pub use actor::{Actor, ActorRef, Context, Handler, Handlers, RemoteSpawn};
pub use channel::credential::{Credential, Issuer};
pub use channel::{ChannelConfig, batched};
pub use error::{ActorError, RuntimeError, StartError};
pub use id::{ActorId, ChannelAddr, PortId, ProcId};
pub use payload::Payload;
pub use port::{Message, OncePortRef, OnceReceiver, PortReceiver, PortRef};
pub use proc::{CanSend, Proc, ProcBuilder, ProcConfig};
pub use supervision::{ActorStatus, SupervisionEvent, Undeliverable};
