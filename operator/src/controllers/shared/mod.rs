//! What the World and ProcMesh controllers share: the reconcile context
//! and the finalizer-wrapped reconcile ([`context`]), status-write pacing
//! ([`writes`]), planned Events with the restart backoff ([`events`]), and their
//! publication, one Event per distinct message ([`recorder`]), failure
//! scope by a named dimension ([`scope`]), whose fault a failure was
//! ([`cause`]), and their watches, each with its own bounded back-off
//! ([`watch`]).
//! Neither controller imports the other; both import this.

pub mod cause;
pub mod context;
pub mod events;
pub mod recorder;
pub mod scope;
pub mod watch;
pub mod writes;

pub use context::{ControllerContext, obj_ref, reconcile_finalized, requeue_on_error};
pub use events::{PlannedEvent, Severity, backoff_delay, event};
