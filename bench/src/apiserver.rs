//! Suite `apiserver`: the embedded API server under kube-rs load, in
//! process, over real TLS on loopback.
//!
//! - `create_per_s`: ConfigMaps created per second (32 in flight); baseline:
//!   `GET /healthz` requests per second on the same client and concurrency
//!   (the cost of a TLS request with no storage work).
//! - `get_p99_ms`: p99 latency of single-object GETs (one in flight);
//!   baseline: p99 of `GET /healthz`.
//! - `list_10k_ms`: one LIST of 10,000 objects.
//! - `watch_fanout_100_p99_ms`: p99 delay from a create's response to each
//!   of 100 watchers receiving its event.
//! - `bytes_per_object`: resident memory growth per stored object; baseline:
//!   the object's JSON size.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt as _, TryStreamExt as _};
use hostmesh_devcluster::apiserver::{ApiServer, ApiServerConfig};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};

use crate::report::emit;

const N: usize = 10_000;
const IN_FLIGHT: usize = 32;
const WATCHERS: usize = 100;
const FANOUT_EVENTS: usize = 200;

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {"bench": "apiserver"}},
        "data": {"key": "value", "n": name},
    }))
    .expect("a valid ConfigMap")
}

fn p99(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 * 0.99).ceil() as usize)
        .saturating_sub(1)
        .min(v.len() - 1)]
}

fn rss_bytes() -> Option<f64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: f64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096.0)
}

async fn healthz(client: &kube::Client) -> anyhow::Result<()> {
    let req = http::Request::get("/healthz").body(Vec::new())?;
    client.request_text(req).await?;
    Ok(())
}

/// Runs the suite.
pub(crate) fn run() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(suite())
}

async fn suite() -> anyhow::Result<()> {
    let server = ApiServer::start(ApiServerConfig::default()).await?;
    let client = server.client()?;
    let api: Api<ConfigMap> = Api::default_namespaced(client.clone());

    // Baseline throughput: healthz at the same concurrency.
    let start = Instant::now();
    futures::stream::iter(0..N)
        .map(|_| healthz(&client))
        .buffer_unordered(IN_FLIGHT)
        .try_for_each(|()| async { Ok(()) })
        .await?;
    let healthz_per_s = N as f64 / start.elapsed().as_secs_f64();

    let rss_before = rss_bytes();
    let start = Instant::now();
    futures::stream::iter(0..N)
        .map(|i| {
            let api = api.clone();
            async move {
                // Responses are dropped as they arrive: only the server's
                // memory grows.
                api.create(&PostParams::default(), &cm(&format!("bench-{i:05}")))
                    .await
                    .map(drop)
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .try_for_each(|()| async { Ok(()) })
        .await?;
    let create_per_s = N as f64 / start.elapsed().as_secs_f64();
    emit("create_per_s", create_per_s, "ops/s", Some(healthz_per_s));
    let rss_after = rss_bytes();

    let mut base = Vec::with_capacity(N);
    for _ in 0..N {
        let t = Instant::now();
        healthz(&client).await?;
        base.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let mut gets = Vec::with_capacity(N);
    for i in 0..N {
        let t = Instant::now();
        api.get(&format!("bench-{i:05}")).await?;
        gets.push(t.elapsed().as_secs_f64() * 1e3);
    }
    emit("get_p99_ms", p99(gets), "ms", Some(p99(base)));

    let t = Instant::now();
    let list = api
        .list(&ListParams::default().labels("bench=apiserver"))
        .await?;
    let list_ms = t.elapsed().as_secs_f64() * 1e3;
    anyhow::ensure!(
        list.items.len() == N,
        "listed {} objects, expected {N}",
        list.items.len()
    );
    emit("list_10k_ms", list_ms, "ms", None);

    // Watch fan-out: 100 watchers from the current resourceVersion.
    let rv = api
        .list(&ListParams::default().limit(1))
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let sent: Arc<std::sync::Mutex<std::collections::HashMap<String, Instant>>> = Arc::default();
    let mut tasks = Vec::new();
    for _ in 0..WATCHERS {
        let stream = api
            .watch(
                &WatchParams::default().labels("fanout=yes").timeout(120),
                &rv,
            )
            .await?;
        let sent = sent.clone();
        tasks.push(tokio::spawn(async move {
            let mut delays = Vec::with_capacity(FANOUT_EVENTS);
            let mut s = std::pin::pin!(stream);
            while delays.len() < FANOUT_EVENTS {
                match tokio::time::timeout(Duration::from_secs(60), s.try_next()).await {
                    Ok(Ok(Some(WatchEvent::Added(o)))) => {
                        let now = Instant::now();
                        let name = o.metadata.name.unwrap_or_default();
                        // The create's response may land after the event:
                        // wait for the send time to be recorded.
                        for _ in 0..1000 {
                            if let Some(t) = sent.lock().ok().and_then(|m| m.get(&name).copied()) {
                                delays.push(now.saturating_duration_since(t).as_secs_f64() * 1e3);
                                break;
                            }
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                    }
                    Ok(Ok(Some(_))) => {}
                    _ => break,
                }
            }
            delays
        }));
    }
    for i in 0..FANOUT_EVENTS {
        let name = format!("fanout-{i:04}");
        let mut o = cm(&name);
        o.metadata.labels = Some([("fanout".to_string(), "yes".to_string())].into());
        let t = Instant::now();
        sent.lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?
            .insert(name.clone(), t);
        api.create(&PostParams::default(), &o).await?;
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await?);
    }
    anyhow::ensure!(
        all.len() == WATCHERS * FANOUT_EVENTS,
        "watchers saw {} of {} events",
        all.len(),
        WATCHERS * FANOUT_EVENTS
    );
    emit("watch_fanout_100_p99_ms", p99(all), "ms", None);

    let json_size = serde_json::to_vec(&api.get("bench-00000").await?)?.len() as f64;
    if let (Some(a), Some(b)) = (rss_before, rss_after) {
        emit(
            "bytes_per_object",
            (b - a).max(0.0) / N as f64,
            "bytes",
            Some(json_size),
        );
    }
    server.shutdown().await;
    Ok(())
}
