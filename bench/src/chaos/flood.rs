//! Scenario `unauth_flood`: 20,000 TCP connections that never
//! authenticate, each opened and reset at once, at most [`CONCURRENCY`] at
//! a time, against host 0's agent port (its pod IP and the World's port).
//!
//! Passes when the agent is the same live process afterwards, its VmRSS
//! (sampled every 20 ms during the flood and for 2 s after) stayed under
//! [`RSS_BOUND_KIB`], and the World stayed Running with both hosts Ready
//! (expiry is 2 s, so a starved agent would show) and no restart.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::StreamExt as _;
use hostmesh_e2e::always_for;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

use super::Timing;
use super::fixture::{self, Trail, WORLD_FAST_EXPIRY, check, count, mesh_up, world_up};

/// Connections per run.
pub(crate) const CONNECTIONS: usize = 20_000;

/// Connections open at once.
pub(crate) const CONCURRENCY: usize = 200;

/// The agent's VmRSS must stay under this (64 MiB; an idle agent uses
/// about 17 MB; the unbounded pre-authentication of issue 17 reached 97 MB).
pub(crate) const RSS_BOUND_KIB: u64 = 64 * 1024;

/// The agent's port (the World's default `spec.port`).
const PORT: u16 = 26602;

/// Runs the flood; the timing's extras are the peak RSS in MiB and the
/// connections per second.
pub(crate) async fn unauth_flood(run: &str) -> anyhow::Result<Timing> {
    let env = fixture::ready_world(run, WORLD_FAST_EXPIRY).await?;
    fixture::ready_mesh(&env).await?;
    let agents = env.agent_pids("w", 0);
    anyhow::ensure!(agents.len() == 1, "one agent for host 0: {agents:?}");
    let agent = agents[0];
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
    let ip: std::net::IpAddr = pods
        .get("w-host-0")
        .await?
        .status
        .and_then(|s| s.pod_ip)
        .context("w-host-0 has no pod IP")?
        .parse()
        .context("w-host-0's pod IP")?;
    let addr = std::net::SocketAddr::new(ip, PORT);
    let rss_before = vm_rss_kib(agent).context("the agent's VmRSS")?;

    let peak = Arc::new(AtomicU64::new(rss_before));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (peak.clone(), done.clone());
        tokio::spawn(async move {
            // Bounded: the flood is bounded, and so is this loop after it.
            let limit = Instant::now() + Duration::from_secs(600);
            while !done.load(Ordering::Relaxed) && Instant::now() < limit {
                if let Some(kib) = vm_rss_kib(agent) {
                    peak.fetch_max(kib, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let start = Instant::now();
    let why_failed = futures::stream::iter(0..CONNECTIONS)
        .map(|_| async move {
            match tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
                .await
            {
                // Opened, then reset at once: SO_LINGER 0 leaves no
                // TIME_WAIT behind, so consecutive runs against a reused
                // pod IP do not run this client out of ephemeral ports.
                Ok(Ok(stream)) => {
                    // Deprecated for a non-zero linger, which blocks on
                    // drop; a zero linger resets at once.
                    #[allow(deprecated)]
                    let _ = stream.set_linger(Some(Duration::ZERO));
                    None
                }
                Ok(Err(e)) => Some(format!("{:?}", e.kind())),
                Err(_) => Some("no answer within 5s".to_string()),
            }
        })
        .buffer_unordered(CONCURRENCY)
        .fold(
            BTreeMap::<String, u64>::new(),
            |mut kinds, why| async move {
                if let Some(why) = why {
                    *kinds.entry(why).or_default() += 1;
                }
                kinds
            },
        )
        .await;
    let failed: u64 = why_failed.values().sum();
    let flood_s = start.elapsed().as_secs_f64();
    let mut trail = Trail::default();
    let api = env.hostmesh_api("World");
    // Sampling continues while the World is watched for a while.
    always_for(
        "the World stays Running with both hosts Ready and no restart",
        Duration::from_secs(4),
        async || {
            let s = api.get("w").await?.data["status"].clone();
            trail.record("World", &s);
            let bad = !world_up(&s) || count(&s, "restarts") != 0;
            Ok(bad.then(|| s.to_string()))
        },
    )
    .await?;
    done.store(true, Ordering::Relaxed);
    let _ = sampler.await;
    let peak = peak.load(Ordering::Relaxed);
    let rss_after = vm_rss_kib(agent);
    check(
        rss_after.is_some() && env.agent_pids("w", 0) == vec![agent],
        format!("host 0's agent {agent} did not survive the flood"),
        &trail,
    )?;
    check(
        failed == 0,
        format!("{failed} of {CONNECTIONS} connections could not be opened ({why_failed:?})"),
        &trail,
    )?;
    check(
        peak < RSS_BOUND_KIB,
        format!(
            "agent VmRSS peaked at {peak} KiB (before {rss_before} KiB, after {rss_after:?} KiB), bound {RSS_BOUND_KIB} KiB"
        ),
        &trail,
    )?;
    let pm = fixture::status(&env, "ProcMesh", "pm").await?;
    check(
        mesh_up(&pm) && count(&pm, "restarts") == 0,
        format!("ProcMesh moved: {pm}"),
        &trail,
    )?;
    Ok(Timing {
        extra: vec![
            ("peak_rss_mib", peak as f64 / 1024.0, "MiB"),
            ("conn_per_s", CONNECTIONS as f64 / flood_s, "conn/s"),
        ],
        ..Timing::default()
    })
}

/// A process's resident set size in KiB (`VmRSS` in `/proc/<pid>/status`).
pub(crate) fn vm_rss_kib(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
