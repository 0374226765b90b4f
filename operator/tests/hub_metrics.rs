//! Heartbeat metrics fed by the supervision hub: heartbeats of known agents
//! are counted and the gap since each host's previous heartbeat is observed;
//! pushes from unknown pods are not.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hostmesh_operator::hub::sim::{SimConnector, connector};
use hostmesh_operator::hub::{HostKey, HostReport, Hub, WorldAgents, WorldKey};
use hostmesh_operator::metrics::Metrics;

fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

#[tokio::test]
async fn heartbeats_and_their_gaps_are_recorded() {
    let sim = Arc::new(SimConnector::default());
    let hub = Hub::new(connector(&sim));
    let metrics = Arc::new(Metrics::new());
    hub.set_metrics(metrics.clone());
    let world = WorldKey {
        namespace: "ns".into(),
        name: "w".into(),
    };
    let hosts: BTreeMap<hostmesh_crds::Rank, (String, SocketAddr)> = (0..2)
        .map(|r| {
            (
                r,
                (
                    format!("uid-{r}"),
                    SocketAddr::from(([127, 0, 1, r as u8], 26602)),
                ),
            )
        })
        .collect();
    hub.sync_world(
        &world,
        WorldAgents {
            secret: Arc::from(&b"secret"[..]),
            previous: None,
            trust: None,
            health_timeout: Duration::from_secs(10),
            heartbeat_interval: hostmesh_crds::validate::DEFAULT_HEARTBEAT_INTERVAL,
            hosts,
            epochs: BTreeMap::new(),
        },
    )
    .await;
    let beat = |rank: hostmesh_crds::Rank, uid: &str| HostReport::Heartbeat {
        host: HostKey {
            world: world.clone(),
            rank,
        },
        pod_uid: uid.into(),
        clock: None,
        digest: None,
    };
    let t0 = Instant::now();
    hub.handle_push(beat(0, "uid-0"), t0);
    hub.handle_push(beat(0, "uid-0"), t0 + Duration::from_millis(1500));
    hub.handle_push(beat(1, "uid-1"), t0 + Duration::from_millis(1500));
    // A pod the hub does not know (replaced, stale): not a heartbeat.
    hub.handle_push(beat(1, "old-pod"), t0 + Duration::from_secs(2));

    let text = metrics.encode();
    assert_eq!(
        sample(&text, "hostmesh_heartbeats_total"),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "hostmesh_heartbeat_lag_seconds_count"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "hostmesh_heartbeat_lag_seconds_sum"),
        Some(1.5),
        "{text}"
    );
}
