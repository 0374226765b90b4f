//! Host name resolution that does not go through the C library, so a static
//! `hostmesh` (the binary the init container copies into any image: no libc,
//! musl, an older glibc) resolves names the same way everywhere.
//!
//! Why: a static glibc (2.36 here) still resolves through NSS. Its `files`
//! and `dns` services are built in, so in a bare root filesystem it reads
//! `/etc/hosts` and `/etc/resolv.conf` fine (checked in an empty chroot, with
//! and without `/etc/nsswitch.conf`); but every other service the image's
//! `nsswitch.conf` names for `hosts` (`myhostname`, `resolve`,
//! `mdns4_minimal`, `sss`, ...) is loaded with `dlopen` from the image's own
//! libc. glibc supports that only when the image's glibc is the exact version
//! the binary was linked with (its own warning for static `dlopen`); in an
//! older- or newer-glibc image, or on a laptop running `hostmesh status`, it
//! puts a second, foreign libc into the process. The resolver here does what
//! musl and Go do instead: the hosts file first, then the name servers,
//! search list, `ndots`, `timeout` and `attempts` of `resolv.conf` (through
//! `hickory-resolver`, pure Rust), whatever the image's libc and
//! `nsswitch.conf`. Multicast DNS and other NSS-only sources are not
//! consulted.
//!
//! Module map:
//! - [`resolve`]: [`Resolver`] and [`lookup_host`] (`host:port` to socket
//!   addresses), used by the agent's `--supervisor` dial.
//! - [`hosts`]: the hosts file format.
//! - `kube` (feature `kube`): [`kube_client`] and [`kube_client_builder`],
//!   Kubernetes clients whose connections resolve the API server's name with
//!   [`Resolver`] (a kubeconfig naming its server by DNS).
//! - [`watch`] (feature `kube`): watch streams with their own bounded
//!   back-off, so every watcher of the operator and the embedded cluster
//!   relists within seconds of an API server restart or a `410 Gone`.

pub mod hosts;
#[cfg(feature = "kube")]
mod kube;
pub mod resolve;
#[cfg(feature = "kube")]
pub mod watch;

#[cfg(feature = "kube")]
pub use kube::{ClientService, HyperResolver, kube_client, kube_client_builder};
pub use resolve::{ResolveError, Resolver, lookup_host};
