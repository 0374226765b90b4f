//! Bounded queues (channel invariants 3 and 7): a sender to a blocked actor
//! stops after a bounded number of messages instead of growing memory,
//! whether it sends the waiting way or stages its sends, and every message
//! is handled once the actor resumes.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hostmesh_runtime::{
    Actor, ActorError, ChannelConfig, Context, Handler, Handlers, Proc, ProcConfig, batched,
};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

const T: Duration = Duration::from_secs(20);

struct Gated {
    gate: Arc<Semaphore>,
    seen: u64,
}

#[derive(Serialize, Deserialize)]
struct Item(u64);

#[derive(Serialize, Deserialize)]
struct Seen;

impl Actor for Gated {
    fn register(h: &mut Handlers<Self>) {
        h.handle::<Item>().handle::<Seen>();
    }
}

impl Handler<Item> for Gated {
    type Reply = ();
    async fn handle(&mut self, _cx: &Context<Self>, _: Item) -> Result<(), ActorError> {
        // Each message needs a permit: closed gate, blocked actor.
        self.gate.acquire().await.map_err(ActorError::new)?.forget();
        self.seen += 1;
        Ok(())
    }
}

impl Handler<Seen> for Gated {
    type Reply = u64;
    async fn handle(&mut self, _cx: &Context<Self>, _: Seen) -> Result<u64, ActorError> {
        Ok(self.seen)
    }
}

fn small() -> ProcConfig {
    ProcConfig {
        channel: ChannelConfig {
            queue_capacity: 4,
            window: 8,
            ..ChannelConfig::default()
        },
        mailbox_capacity: 4,
        port_capacity: 4,
    }
}

#[tokio::test]
async fn a_blocked_receiver_bounds_what_a_sender_can_queue() {
    blocked_receiver_bounds_the_sender(false).await;
}

#[tokio::test]
async fn a_blocked_receiver_bounds_what_a_staging_sender_can_queue() {
    blocked_receiver_bounds_the_sender(true).await;
}

/// Sends to a gated actor until the sender blocks, checking the bound at
/// every poll; `staged`: from a `batched` scope (sends staged per thread).
async fn blocked_receiver_bounds_the_sender(staged: bool) {
    let server = Proc::builder("server")
        .listen("tcp:127.0.0.1:0".parse().unwrap())
        .config(small())
        .build()
        .await
        .unwrap();
    let gate = Arc::new(Semaphore::new(0));
    let g = server
        .spawn(
            "g",
            Gated {
                gate: gate.clone(),
                seen: 0,
            },
        )
        .await
        .unwrap();
    let client = Proc::builder("client")
        .config(small())
        .build()
        .await
        .unwrap();
    const N: usize = 2_000;
    let sent = Arc::new(AtomicUsize::new(0));
    let send_all = {
        let (client, g, sent) = (client.clone(), g.clone(), sent.clone());
        async move {
            for i in 0..N {
                g.send(&client, &Item(i as u64)).await.unwrap();
                sent.fetch_add(1, Ordering::SeqCst);
            }
        }
    };
    let sender = if staged {
        tokio::spawn(batched(send_all))
    } else {
        tokio::spawn(send_all)
    };
    // Poll until the sender is blocked: it has made progress, then stopped
    // making any (the same count over many polls). Whatever the timing, the
    // count can never pass the sum of the queues: link queue + unacked
    // window + mailbox + the handler's message (+ slack for the reader's
    // batch and the one being enqueued), plus, for a staging sender, one
    // staged run of at most the queue's capacity (queue invariant 4); it
    // is checked at every poll.
    let bound = 4 + 8 + 4 + 2 + 4 + if staged { 4 } else { 0 };
    let deadline = tokio::time::Instant::now() + T;
    let (mut last, mut stable) = (0, 0);
    loop {
        let queued = sent.load(Ordering::SeqCst);
        assert!(
            queued <= bound,
            "{queued} messages queued past a blocked receiver (bound {bound})"
        );
        if queued >= 4 && queued == last {
            stable += 1;
            if stable >= 20 {
                break;
            }
        } else {
            (last, stable) = (queued, 0);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the sender never blocked ({queued} sent)"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(!sender.is_finished());
    // Open the gate: everything arrives, nothing was dropped.
    gate.add_permits(N);
    tokio::time::timeout(T, sender).await.unwrap().unwrap();
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let seen = g.call(&client, &Seen, T).await.unwrap();
        if seen == N as u64 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {seen} of {N} handled"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
