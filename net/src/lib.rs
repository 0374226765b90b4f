//! Host name resolution that does not go through the C library, so a static
//! `hostmesh` (the binary the init container copies into any image: no libc,
//! musl, an older glibc) resolves names the same way everywhere.
//!
//! Why: a glibc `getaddrinfo` linked statically answers from `/etc/hosts` and
//! DNS only as far as `/etc/nsswitch.conf` lets it. Without that file (scratch
//! and many minimal images) glibc asks DNS first and reads `/etc/hosts` only
//! when no DNS server answers, so the pod's own entries and `hostAliases` are
//! shadowed; and a service that is not built in (`mdns4_minimal`, `resolve`,
//! `myhostname`, `sss`, ...) is loaded with `dlopen` from the image's own libc,
//! which a static program cannot do safely. The resolver here does what musl
//! and Go do: the hosts file first, then the name servers, search list,
//! `ndots`, `timeout` and `attempts` of `resolv.conf` (through
//! `hickory-resolver`, pure Rust), whatever the image's libc.
//!
//! Module map:
//! - [`resolve`]: [`Resolver`] and [`lookup_host`] (`host:port` to socket
//!   addresses), used by the agent's `--supervisor` dial.
//! - [`hosts`]: the hosts file format.
//! - `kube` (feature `kube`): [`kube_client`] and [`kube_client_builder`],
//!   Kubernetes clients whose connections resolve the API server's name with
//!   [`Resolver`] (a kubeconfig naming its server by DNS).

pub mod hosts;
#[cfg(feature = "kube")]
mod kube;
pub mod resolve;

#[cfg(feature = "kube")]
pub use kube::{ClientService, HyperResolver, kube_client, kube_client_builder};
pub use resolve::{ResolveError, Resolver, lookup_host};
