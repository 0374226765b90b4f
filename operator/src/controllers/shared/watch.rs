//! The controllers' watches, each with its own bounded back-off
//! ([`hostmesh_net::watch`]): after an API server restart or a `410 Gone`
//! every watch relists within seconds, one failing watch holds back no
//! other, and the hub's triggers (`reconcile_on`) are never paused behind a
//! watch error, as they were behind kube-rs' one trigger back-off (issue
//! 30: a World created after an API server restart was reconciled minutes
//! later).
//!
//! Use [`controller`] instead of `Controller::new`, and [`objects`] for the
//! streams given to `owns_stream` (of an `Api<PartialObjectMeta<_>>`: only
//! owner references are read, as `owns` does) and `watches_stream`.

use std::fmt::Debug;

use futures::Stream;
use hostmesh_net::watch::{NoBackoff, recovering};
use kube::runtime::reflector;
use kube::runtime::{Controller, WatchStreamExt as _, watcher};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

/// A controller of `api`'s objects (as `Controller::new(api, wc)`), whose
/// own watch recovers on its own and whose merged triggers are never
/// paused.
pub fn controller<K>(api: Api<K>, wc: watcher::Config) -> Controller<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    let objects = recovering(watcher(api, wc))
        .reflect(writer)
        .applied_objects();
    Controller::for_stream(objects, reader).trigger_backoff(NoBackoff)
}

/// Every object `api`'s watch touches (applied, listed or deleted), for
/// `owns_stream` and `watches_stream`: what `owns` and `watches` watch,
/// with the watch's own back-off.
pub fn objects<K>(
    api: Api<K>,
    wc: watcher::Config,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    recovering(watcher(api, wc)).touched_objects()
}
