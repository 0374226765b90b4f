//! Suite `operator`: the supervision hub fed by simulated agents (in
//! memory, through the hub's real push queue and run loop).
//!
//! - `status_writes_per_world_per_s`: status-write triggers per object per
//!   second while 1,000 hosts of one World storm the hub with heartbeats and
//!   proc state churn (target at most 1.5; baseline null).
//! - `expiry_detection_s`: from a host's last heartbeat to the World's
//!   trigger carrying it as Expired (baseline: `healthTimeout`).
//! - `operator_rss_10k_pods`: resident memory with 1,000 Worlds of 10 hosts
//!   held in the operator's caches (reflector stores of Worlds and their
//!   pods, and the hub's view of every agent).

use hostmesh_crds::Rank;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hostmesh_crds::World;
use hostmesh_operator::controllers::world::desired;
use hostmesh_operator::hub::Liveness;
use hostmesh_operator::hub::protocol::{ProcPhase, ProcSpec};
use hostmesh_operator::hub::sim::{SimConnector, connector};
use hostmesh_operator::hub::{
    CreateOrUpdate, HostKey, HostReport, Hub, WorldAgents, WorldKey, proc_name,
};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::store;
use kube::runtime::watcher;
use tokio::sync::mpsc;

use crate::report::emit;

const HOSTS: Rank = 1_000;

fn world_key(i: usize) -> WorldKey {
    WorldKey {
        namespace: "bench".into(),
        name: format!("w{i}"),
    }
}

fn agents(n: Rank, timeout: Duration) -> WorldAgents {
    WorldAgents {
        secret: Arc::from(&b"bench-secret-0123456789"[..]),
        previous: None,
        trust: None,
        health_timeout: timeout,
        heartbeat_interval: hostmesh_crds::validate::DEFAULT_HEARTBEAT_INTERVAL,
        epochs: Default::default(),
        hosts: (0..n)
            .map(|r| {
                let ip = [127, 1, (r / 250) as u8, (r % 250) as u8 + 1];
                (r, (format!("uid-{r}"), SocketAddr::from((ip, 26602))))
            })
            .collect(),
    }
}

/// Runs the suite.
pub(crate) fn run() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        status_writes().await?;
        expiry().await?;
        anyhow::Ok(())
    })?;
    drop(rt);
    rss()
}

async fn status_writes() -> anyhow::Result<()> {
    let sim = Arc::new(SimConnector::default());
    let hub = Hub::new(connector(&sim));
    let (tw, mut rw) = mpsc::unbounded_channel();
    let (tm, mut rm) = mpsc::unbounded_channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(hub.clone().run(tw, tm, async move {
        let _ = stop_rx.await;
    }));
    let wk = world_key(0);
    hub.sync_world(&wk, agents(HOSTS, Duration::from_secs(2)))
        .await;
    for h in 0..HOSTS {
        let req = CreateOrUpdate {
            name: proc_name("train.bench", h),
            rank: h,
            spec: ProcSpec::command("sleep", &["1000"]),
            incarnation: 0,
        };
        hub.ensure_procs(&wk, h, vec![req], Duration::from_secs(1))
            .await
            .map_err(anyhow::Error::msg)?;
    }
    // Let the spawn settle, then count only the storm.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    while rw.try_recv().is_ok() || rm.try_recv().is_ok() {}

    let tx = hub.push_sender();
    let storm = Duration::from_secs(5);
    let start = Instant::now();
    let mut pushes = 0u64;
    let mut round: Rank = 0;
    while start.elapsed() < storm {
        for h in 0..HOSTS {
            let host = HostKey {
                world: wk.clone(),
                rank: h,
            };
            tx.send(HostReport::Heartbeat {
                host: host.clone(),
                pod_uid: format!("uid-{h}"),
                clock: None,
                digest: None,
            })
            .await?;
            pushes += 1;
            // Proc churn on a tenth of the hosts each round (not failures).
            if (h + round).is_multiple_of(10) {
                let status = if (round / 10).is_multiple_of(2) {
                    ProcPhase::Starting
                } else {
                    ProcPhase::Ready { pid: 1, addr: None }
                };
                if let Some(p) = sim.set_status(&host, &proc_name("train.bench", h), status) {
                    tx.send(p).await?;
                    pushes += 1;
                }
            }
        }
        round += 1;
        tokio::task::yield_now().await;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let mut per_object: HashMap<String, u64> = HashMap::new();
    while let Ok(k) = rw.try_recv() {
        *per_object.entry(format!("world/{}", k.name)).or_default() += 1;
    }
    while let Ok(k) = rm.try_recv() {
        *per_object
            .entry(format!("procmesh/{}", k.name))
            .or_default() += 1;
    }
    let worst = per_object.values().copied().max().unwrap_or(0) as f64 / elapsed;
    emit("status_writes_per_world_per_s", worst, "writes/s", None);
    emit(
        "hub_pushes_per_s",
        pushes as f64 / elapsed,
        "pushes/s",
        None,
    );
    let _ = stop_tx.send(());
    let _ = run.await;
    Ok(())
}

async fn expiry() -> anyhow::Result<()> {
    let timeout = Duration::from_secs(2);
    let sim = Arc::new(SimConnector::default());
    let hub = Hub::new(connector(&sim));
    let (tw, mut rw) = mpsc::unbounded_channel();
    let (tm, _rm) = mpsc::unbounded_channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(hub.clone().run(tw, tm, async move {
        let _ = stop_rx.await;
    }));
    let wk = world_key(0);
    // The agents' Snapshots on connect are their first heartbeats. Everyone
    // then beats every 200 ms, except host 7, which stays silent.
    let mut last_silent_beat = Instant::now();
    hub.sync_world(&wk, agents(HOSTS, timeout)).await;
    let tx = hub.push_sender();
    let silent: Rank = 7;
    let deadline = Instant::now() + timeout * 5;
    let mut seen = None;
    while Instant::now() < deadline && seen.is_none() {
        for h in 0..HOSTS {
            if h == silent && hub.liveness(&wk, h, "uid-7") != Liveness::Unknown {
                continue;
            }
            if h == silent {
                last_silent_beat = Instant::now();
            }
            let host = HostKey {
                world: wk.clone(),
                rank: h,
            };
            tx.send(HostReport::Heartbeat {
                host,
                pod_uid: format!("uid-{h}"),
                clock: None,
                digest: None,
            })
            .await?;
        }
        let tick = Instant::now() + Duration::from_millis(200);
        while Instant::now() < tick {
            if let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(10), rw.recv()).await
                && hub.liveness(&wk, silent, "uid-7") == Liveness::Expired
            {
                seen = Some(last_silent_beat.elapsed());
                break;
            }
        }
    }
    let _ = stop_tx.send(());
    let _ = run.await;
    match seen {
        Some(d) => emit(
            "expiry_detection_s",
            d.as_secs_f64(),
            "s",
            Some(timeout.as_secs_f64()),
        ),
        None => anyhow::bail!("host {silent} never expired within {:?}", timeout * 5),
    }
    Ok(())
}

fn rss_bytes() -> anyhow::Result<f64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no VmRSS in /proc/self/status"))?;
    Ok(kb * 1024.0)
}

fn mk_world(i: usize) -> anyhow::Result<World> {
    let yaml = format!(
        "apiVersion: hostmesh.dev/v1alpha1\nkind: World\nmetadata: {{name: w{i}, namespace: bench, uid: u{i}, generation: 1}}\n\
         spec:\n  shape: [{{name: host, size: 10}}]\n  template:\n    metadata: {{labels: {{team: ml}}}}\n    spec:\n      containers:\n      - {{name: host, image: 'trainer:1.4', resources: {{limits: {{cpu: '8', memory: 64Gi}}}}}}\n"
    );
    Ok(serde_saphyr::from_str(&yaml)?)
}

fn rss() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let hub = Hub::new(connector(&Arc::new(SimConnector::default())));
    let (tw, _rw) = mpsc::unbounded_channel();
    let (tm, _rm) = mpsc::unbounded_channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let run = rt.spawn(hub.clone().run(tw, tm, async move {
        let _ = stop_rx.await;
    }));
    // What the operator keeps: the World store and the hub's view of every
    // agent. Owned pods are watched for triggers only (no pod cache).
    let (worlds_r, mut worlds_w) = store::<World>();
    let worlds: Vec<World> = (0..1_000).map(mk_world).collect::<anyhow::Result<_>>()?;
    let before = rss_bytes()?;
    rt.block_on(async {
        for (i, w) in worlds.iter().enumerate() {
            hub.sync_world(&world_key(i), agents(10, Duration::from_secs(10)))
                .await;
            worlds_w.apply_watcher_event(&watcher::Event::Apply(w.clone()));
        }
    });
    let operator = rss_bytes()?;
    anyhow::ensure!(worlds_r.state().len() == 1_000, "World cache not filled");
    emit("operator_rss_10k_pods", operator, "bytes", None);
    emit(
        "operator_cache_growth_10k_pods",
        operator - before,
        "bytes",
        None,
    );
    // For comparison: a full pod cache (what a pod reflector would hold).
    let (pods_r, mut pods_w) = store::<Pod>();
    for w in &worlds {
        let hash = desired::template_hash(w, "ghcr.io/hostmesh/hostmesh:0.1.0");
        for r in 0..10 {
            let pod = desired::pod(w, r, "ghcr.io/hostmesh/hostmesh:0.1.0", &hash, None)?;
            pods_w.apply_watcher_event(&watcher::Event::Apply(pod));
        }
    }
    anyhow::ensure!(pods_r.state().len() == 10_000, "pod cache not filled");
    emit(
        "full_pod_cache_growth_10k_pods",
        rss_bytes()? - operator,
        "bytes",
        None,
    );
    let _ = stop_tx.send(());
    let _ = rt.block_on(run);
    Ok(())
}
