//! Procs and actors over real loopback TCP in one process: authenticated
//! calls, pushes back over an accepted connection, same-proc delivery,
//! refused secrets.

use std::time::Duration;

use hostmesh_runtime::{
    Actor, ActorError, Context, Handler, Handlers, PortRef, Proc, RuntimeError,
};
use serde::{Deserialize, Serialize};

const SECRET: &[u8] = b"test-secret-0123456789abcdef";
const T: Duration = Duration::from_secs(10);

struct Echo;

#[derive(Serialize, Deserialize)]
struct Subscribe {
    port: PortRef<u32>,
    count: u32,
}

impl Actor for Echo {
    fn register(h: &mut Handlers<Self>) {
        h.handle::<String>().handle::<Subscribe>();
    }
}

impl Handler<String> for Echo {
    type Reply = String;
    async fn handle(&mut self, cx: &Context<Self>, s: String) -> Result<String, ActorError> {
        Ok(format!("{} says {s}", cx.actor_id().name()))
    }
}

impl Handler<Subscribe> for Echo {
    type Reply = ();
    async fn handle(&mut self, cx: &Context<Self>, s: Subscribe) -> Result<(), ActorError> {
        for i in 0..s.count {
            s.port.send(cx, &i).await.map_err(ActorError::new)?;
        }
        Ok(())
    }
}

async fn server() -> Proc {
    Proc::builder("server")
        .listen("tcp:127.0.0.1:0".parse().unwrap())
        .secret(SECRET)
        .build()
        .await
        .unwrap()
}

#[tokio::test]
async fn authenticated_call_between_two_procs() {
    let server = server().await;
    let echo = server.spawn("echo", Echo).await.unwrap();
    let client = Proc::builder("client")
        .secret(SECRET)
        .build()
        .await
        .unwrap();
    assert!(client.id().addr().to_string().starts_with("unbound:"));
    for i in 0..100 {
        let r = echo.call(&client, &format!("hi {i}"), T).await.unwrap();
        assert_eq!(r, format!("echo says hi {i}"));
    }
}

#[tokio::test]
async fn pushes_travel_back_over_the_dialed_connection() {
    let server = server().await;
    let echo = server.spawn("echo", Echo).await.unwrap();
    // The client has no listener: the server can only reach it over the
    // connection the client opened.
    let client = Proc::builder("client")
        .secret(SECRET)
        .build()
        .await
        .unwrap();
    let found = client.connect(server.id().addr()).await.unwrap();
    assert_eq!(&found, server.id());
    let (port, mut rx) = client.open_port::<u32>();
    echo.send(&client, &Subscribe { port, count: 500 })
        .await
        .unwrap();
    for i in 0..500 {
        assert_eq!(rx.recv().await.unwrap(), i, "pushes arrive in order");
    }
}

#[tokio::test]
async fn same_proc_call_needs_no_listener() {
    let p = Proc::builder("solo").build().await.unwrap();
    let echo = p.spawn("echo", Echo).await.unwrap();
    assert_eq!(
        echo.call(&p, &"x".to_string(), T).await.unwrap(),
        "echo says x"
    );
}

#[tokio::test]
async fn wrong_secret_fails_the_call_quickly() {
    let server = server().await;
    let echo = server.spawn("echo", Echo).await.unwrap();
    let intruder = Proc::builder("intruder")
        .secret(*b"wrong")
        .build()
        .await
        .unwrap();
    let e = echo
        .call(&intruder, &"x".to_string(), Duration::from_secs(60))
        .await
        .unwrap_err();
    assert!(matches!(e, RuntimeError::CallFailed { .. }), "{e}");
    assert!(e.to_string().contains("authentication"), "{e}");
    let nosecret = Proc::builder("anon").build().await.unwrap();
    let e = nosecret.connect(server.id().addr()).await.unwrap_err();
    assert!(
        e.to_string().contains("authentication") || e.to_string().contains("refused"),
        "{e}"
    );
}

#[tokio::test]
async fn unknown_actor_is_undeliverable_not_a_hang() {
    let server = server().await;
    let client = Proc::builder("client")
        .secret(SECRET)
        .build()
        .await
        .unwrap();
    let ghost = client.actor_ref::<Echo>(server.id().actor("ghost", 0).unwrap());
    let e = ghost
        .call(&client, &"x".to_string(), Duration::from_secs(60))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no actor"), "{e}");
}

#[tokio::test]
async fn large_and_small_messages_interleave_intact() {
    use hostmesh_runtime::testing::{Blob, Count, TestActor};
    let server = server().await;
    let t = server.spawn("t", TestActor::with_label("")).await.unwrap();
    let client = Proc::builder("client")
        .secret(SECRET)
        .build()
        .await
        .unwrap();
    // Sizes around the inline limit and frames with repeated headers.
    for (i, size) in [10usize, 65_536, 65_537, 3 << 20, 1, 200_000]
        .iter()
        .enumerate()
    {
        let n = t
            .call(&client, &Blob(vec![i as u8; *size].into()), T)
            .await
            .unwrap();
        assert_eq!(n, *size as u64);
        t.send(&client, &Blob(vec![0; *size].into())).await.unwrap();
        t.send(&client, &Blob(vec![1; 3].into())).await.unwrap();
    }
    assert_eq!(t.call(&client, &Count, T).await.unwrap(), 18);
}

#[tokio::test]
async fn unix_socket_procs_talk() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.sock");
    let addr: hostmesh_runtime::ChannelAddr = format!("unix:{}", path.display()).parse().unwrap();
    let server = Proc::builder("userver")
        .listen(addr)
        .secret(SECRET)
        .build()
        .await
        .unwrap();
    let echo = server.spawn("echo", Echo).await.unwrap();
    let client = Proc::builder("client")
        .secret(SECRET)
        .build()
        .await
        .unwrap();
    assert_eq!(
        echo.call(&client, &"u".to_string(), T).await.unwrap(),
        "echo says u"
    );
}

#[tokio::test]
async fn link_reconnects_to_a_restarted_peer() {
    let first = server().await;
    let addr = first.id().addr().clone();
    let echo = first.spawn("echo", Echo).await.unwrap();
    let client = Proc::builder("client")
        .secret(SECRET)
        .build()
        .await
        .unwrap();
    assert_eq!(
        echo.call(&client, &"1".to_string(), T).await.unwrap(),
        "echo says 1"
    );
    first.shutdown();
    // A new proc with the same address and name: the same actor id.
    // The listener closes once the accept task sees the shutdown.
    let deadline = tokio::time::Instant::now() + T;
    let second = loop {
        match Proc::builder("server")
            .listen(addr.clone())
            .secret(SECRET)
            .build()
            .await
        {
            Ok(p) => break p,
            Err(e) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "port never freed: {e}"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    second.spawn("echo", Echo).await.unwrap();
    // The client's link notices the old connection closing and redials; a
    // call may fail while the old connection is torn down, never hang.
    let deadline = tokio::time::Instant::now() + T;
    loop {
        match echo.call(&client, &"2".to_string(), T).await {
            Ok(r) => {
                assert_eq!(r, "echo says 2");
                break;
            }
            Err(e) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "never reconnected: {e}"
                );
            }
        }
    }
}
