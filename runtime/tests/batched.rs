//! Sends staged per thread inside `batched` scopes (channel `stage`): they
//! keep per sender order across every send path, leave when the scope's
//! poll ends (not only when the run fills), and come back as undeliverable
//! when their peer cannot be reached (the queue bound is checked in
//! `backpressure.rs`).

use std::time::Duration;

use hostmesh_runtime::{
    Actor, ActorError, ActorRef, ChannelConfig, Context, Handler, Handlers, Payload, Proc,
    ProcConfig, SupervisionEvent, batched,
};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

const T: Duration = Duration::from_secs(20);

/// Checks that items arrive in sequence; counts them.
#[derive(Default)]
struct Ordered {
    next: u64,
    out_of_order: Vec<(u64, u64)>,
}

#[derive(Serialize, Deserialize)]
struct Item {
    seq: u64,
    pad: Payload,
}

/// Replies with (items seen, out-of-order arrivals).
#[derive(Serialize, Deserialize)]
struct Seen;

impl Actor for Ordered {
    fn register(h: &mut Handlers<Self>) {
        h.handle::<Item>().handle::<Seen>();
    }
}

impl Handler<Item> for Ordered {
    type Reply = ();
    async fn handle(&mut self, _cx: &Context<Self>, m: Item) -> Result<(), ActorError> {
        if m.seq != self.next {
            self.out_of_order.push((self.next, m.seq));
        }
        self.next = m.seq + 1;
        Ok(())
    }
}

impl Handler<Seen> for Ordered {
    type Reply = (u64, Vec<(u64, u64)>);
    async fn handle(
        &mut self,
        _cx: &Context<Self>,
        _: Seen,
    ) -> Result<(u64, Vec<(u64, u64)>), ActorError> {
        Ok((self.next, self.out_of_order.clone()))
    }
}

async fn pair(config: ProcConfig) -> (Proc, Proc, ActorRef<Ordered>) {
    let server = Proc::builder("server")
        .listen("tcp:127.0.0.1:0".parse().unwrap())
        .config(config.clone())
        .build()
        .await
        .unwrap();
    let o = server.spawn("o", Ordered::default()).await.unwrap();
    let client = Proc::builder("client")
        .config(config)
        .build()
        .await
        .unwrap();
    (server, client, o)
}

fn item(seq: u64, len: usize) -> Item {
    Item {
        seq,
        pad: vec![7u8; len].into(),
    }
}

#[tokio::test]
async fn staged_sends_keep_their_order_with_calls_and_large_messages() {
    let (_server, client, o) = pair(ProcConfig::default()).await;
    const N: u64 = 5_000;
    let (seen, wrong) = batched(async {
        for i in 0..N {
            // Small ones are staged; every 97th is too large to stage and
            // takes the envelope path, which must not overtake them.
            let len = if i % 97 == 0 { 10_000 } else { 16 };
            o.send(&client, &item(i, len)).await.unwrap();
            if i % 1_000 == 999 {
                // A call (another path) sees everything sent before it.
                let (seen, wrong) = o.call(&client, &Seen, T).await.unwrap();
                assert_eq!(seen, i + 1, "a call overtook staged sends");
                assert!(wrong.is_empty(), "out of order: {wrong:?}");
            }
        }
        o.call(&client, &Seen, T).await.unwrap()
    })
    .await;
    assert_eq!(seen, N);
    assert!(wrong.is_empty(), "out of order: {wrong:?}");
}

#[tokio::test]
async fn a_scope_flushes_when_its_poll_ends_not_when_the_run_fills() {
    let (_server, client, o) = pair(ProcConfig::default()).await;
    let (go, mut wait) = mpsc::channel::<()>(1);
    let sender = tokio::spawn({
        let (client, o) = (client.clone(), o.clone());
        batched(async move {
            for i in 0..3 {
                o.send(&client, &item(i, 8)).await.unwrap();
            }
            // Pending for as long as the test wants: three small messages
            // sit in no full run, yet they must be on their way.
            wait.recv().await;
        })
    });
    let observer = Proc::builder("observer").build().await.unwrap();
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let (seen, _) = o.call(&observer, &Seen, T).await.unwrap();
        if seen == 3 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "staged sends never left a pending scope ({seen} of 3 arrived)"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    go.send(()).await.unwrap();
    tokio::time::timeout(T, sender).await.unwrap().unwrap();
}

#[tokio::test]
async fn staged_sends_to_an_unreachable_peer_come_back_undeliverable() {
    // An address nobody listens on: the link gives up after its
    // reconnect timeout and bounces what it holds.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (tx, mut events) = mpsc::unbounded_channel::<SupervisionEvent>();
    let client = Proc::builder("client")
        .config(ProcConfig {
            channel: ChannelConfig {
                reconnect_timeout: Duration::from_millis(300),
                connect_timeout: Duration::from_millis(200),
                ..ChannelConfig::default()
            },
            ..ProcConfig::default()
        })
        .supervision_sink(move |e| {
            let _ = tx.send(e);
        })
        .build()
        .await
        .unwrap();
    let gone: hostmesh_runtime::ProcId = format!("tcp:127.0.0.1:{port}/gone").parse().unwrap();
    let o: ActorRef<Ordered> = client.actor_ref(gone.actor("o", 0).unwrap());
    const N: usize = 5;
    batched(async {
        for i in 0..N {
            o.send(&client, &item(i as u64, 8)).await.unwrap();
        }
    })
    .await;
    for i in 0..N {
        let ev = tokio::time::timeout(T, events.recv())
            .await
            .unwrap_or_else(|_| panic!("only {i} of {N} staged sends came back"))
            .unwrap();
        assert!(ev.to_string().contains("undeliverable"), "{ev}");
    }
}
