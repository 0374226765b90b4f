//! Procs and actors over real loopback TCP in one process: authenticated
//! calls, pushes back over an accepted connection, same-proc delivery,
//! refused secrets.

use std::time::Duration;

use hostmesh_runtime::{Actor, ActorError, Context, Error, Handler, Handlers, PortRef, Proc};
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
    assert!(matches!(e, Error::CallFailed { .. }), "{e}");
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
