//! The actor-mesh example (`examples/actors/README.md`): a client of a
//! runtime-aware ProcMesh running `hostmesh echo-proc` spawns an `Echo` on
//! every rank, gathers one reply from each, calls a slice, ends the last
//! rank's proc and waits for that end to reach it as a supervision event.

use std::time::Duration;

use hostmesh_agent::echo::{Echo, Exit};
use hostmesh_client::{ClientOptions, MeshClient, MeshEvent};

/// What a run saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// One reply per rank, in rank order.
    pub replies: Vec<String>,
    /// The replies of the slice `host=0` (ranks of host 0).
    pub slice: Vec<String>,
    /// The rank whose proc was ended, and the event that reported it.
    pub ended: (usize, MeshEvent),
}

/// Runs the example against ProcMesh `namespace/name`; `say` gets each
/// line to print.
pub async fn run(
    kube: kube::Client,
    namespace: &str,
    name: &str,
    mut say: impl FnMut(String),
) -> anyhow::Result<Seen> {
    let client = MeshClient::connect(kube, namespace, name, ClientOptions::default()).await?;
    let ranks = client.region().num_ranks();
    say(format!(
        "connected to ProcMesh {namespace}/{name}: {ranks} ranks"
    ));
    let echo = client.spawn::<Echo>("echo", &()).await?;
    let timeout = Duration::from_secs(30);
    let replies: Vec<String> = echo
        .call_all(client.proc(), &"hello".to_string(), timeout)
        .await?
        .iter()
        .map(|(_, r)| r.clone())
        .collect();
    say(format!("replies: {}", replies.join(" ")));
    let first = client
        .region()
        .extent()
        .labels()
        .first()
        .cloned()
        .unwrap_or_default();
    let slice: Vec<String> = echo
        .range(&first, 0..1)?
        .call_all(client.proc(), &"slice".to_string(), timeout)
        .await?
        .iter()
        .map(|(_, r)| r.clone())
        .collect();
    say(format!("{first}=0 replies: {}", slice.join(" ")));
    let last = ranks - 1;
    let actor = echo
        .get(last)
        .ok_or_else(|| anyhow::anyhow!("no actor on rank {last}"))?;
    actor.send(client.proc(), &Exit(3)).await?;
    say(format!("asked rank {last}'s proc to exit with code 3"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "no event for rank {last}'s proc within 120s"
        );
        if let Some(ev) = client.next_event(Duration::from_secs(1)).await {
            say(format!("event: {ev:?}"));
            if matches!(&ev, MeshEvent::ProcEnded { rank, .. } if *rank == last) {
                return Ok(Seen {
                    replies,
                    slice,
                    ended: (last, ev),
                });
            }
        }
    }
}
