//! The watch on the API server: reflectors (kube-runtime caches) of
//! Services, EndpointSlices and Pods in every namespace, and a task that
//! rebuilds the [`Zone`] after every change and publishes it.
//!
//! Invariants:
//! 1. Only Services, `discovery.k8s.io/v1` EndpointSlices and Pods are
//!    read, as CoreDNS reads them, so the server works the same on the
//!    embedded cluster (where `controllers::endpointslice` writes the
//!    slices) and on a real one (where kube-controller-manager does).
//! 2. No zone is published before all three caches have listed once; after
//!    that every change is followed by a rebuild (changes that arrive
//!    during a rebuild are coalesced into the next one).
//! 3. Watch errors are retried with kube's default back-off; the last
//!    published zone keeps answering meanwhile.

use std::sync::Arc;

use futures::{Stream, StreamExt as _};
use hickory_server::proto::rr::Name;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;

use super::records::{Objects, Zone};

/// Starts the reflectors and the rebuild task on `tasks`; zones go to
/// `publish`.
pub(super) fn spawn(
    client: &kube::Client,
    origin: Name,
    ttl: u32,
    publish: watch::Sender<Option<Arc<Zone>>>,
    tasks: &mut JoinSet<()>,
) {
    let changed = Arc::new(Notify::new());
    let services = cache::<Service>(client, "services", &changed, tasks);
    let slices = cache::<EndpointSlice>(client, "endpointslices", &changed, tasks);
    let pods = cache::<Pod>(client, "pods", &changed, tasks);
    tasks.spawn(async move {
        for ready in [
            services.wait_until_ready().await,
            slices.wait_until_ready().await,
            pods.wait_until_ready().await,
        ] {
            if ready.is_err() {
                return;
            }
        }
        tracing::info!(zone = %origin, "cluster DNS caches synced");
        let mut serial: u32 = 1;
        loop {
            let (svc, eps, pod) = (services.state(), slices.state(), pods.state());
            let svc: Vec<&Service> = svc.iter().map(AsRef::as_ref).collect();
            let eps: Vec<&EndpointSlice> = eps.iter().map(AsRef::as_ref).collect();
            let pod: Vec<&Pod> = pod.iter().map(AsRef::as_ref).collect();
            let zone = Zone::build(
                &origin,
                ttl,
                serial,
                Objects {
                    services: &svc,
                    slices: &eps,
                    pods: &pod,
                },
            );
            if publish.send(Some(Arc::new(zone))).is_err() {
                return;
            }
            serial = serial.wrapping_add(1);
            changed.notified().await;
        }
    });
}

/// A reflector of every `K` driven on `tasks`, waking `changed` on each
/// event.
fn cache<K>(
    client: &kube::Client,
    what: &'static str,
    changed: &Arc<Notify>,
    tasks: &mut JoinSet<()>,
) -> Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store::<K>();
    let stream = reflector::reflector(
        writer,
        hostmesh_net::watch::recovering(watcher(
            Api::<K>::all(client.clone()),
            watcher::Config::default(),
        )),
    );
    tasks.spawn(drive(stream, what, changed.clone()));
    reader
}

async fn drive<S, T>(stream: S, what: &'static str, changed: Arc<Notify>)
where
    S: Stream<Item = Result<T, watcher::Error>>,
{
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(_) => changed.notify_one(),
            Err(e) => {
                tracing::warn!(resource = what, error = %e, "cluster DNS watch failed; retrying")
            }
        }
    }
}
