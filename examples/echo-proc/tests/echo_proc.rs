//! The example proc under a real agent: it checks in (Ready with its
//! address), hosts an `Echo` spawned by type, answers calls, and exits 0 on
//! a stop.

use std::time::Duration;

use hostmesh_agent::protocol::{CreateOrUpdate, Dim, ProcPhase, ProcSpec};
use hostmesh_agent::{Agent, AgentClient, AgentConfig, ClientConfig, SpawnFor, mesh_ref};
use hostmesh_echo_proc::{Echo, Fail, echo_type_name};
use hostmesh_runtime::{ActorRef, ChannelAddr, Proc, ProcId};
use hostmesh_testkit::eventually_ok;

const SECRET: &[u8] = b"echo-proc-test-secret-0123456789";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_proc_joins_its_host_and_echoes() {
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("token");
    std::fs::write(&secret_file, SECRET).unwrap();
    let agent = Agent::start(AgentConfig::loopback("w", secret_file))
        .await
        .unwrap();
    let addr = agent.addr();
    let (tx, _rx) = tokio::sync::mpsc::channel(1024);
    let client = AgentClient::new("test", SECRET, ClientConfig::default(), tx)
        .await
        .unwrap();

    let mut spec = ProcSpec::command(env!("CARGO_BIN_EXE_hostmesh-echo-proc"), &[]);
    spec.runtime_aware = true;
    spec.extent = vec![Dim::new("host", 1), Dim::new("proc", 2)];
    client
        .create_or_update(
            addr,
            CreateOrUpdate {
                name: "echo-1".into(),
                rank: 1,
                spec,
                incarnation: 0,
            },
        )
        .await
        .unwrap();
    let proc_addr = eventually_ok(
        "the echo proc Ready with its address",
        async || match client.get_state(addr, "echo-1").await.unwrap().status {
            ProcPhase::Ready { addr: Some(a), .. } => Ok(a),
            s if s.is_terminal() => panic!("echo proc ended: {s:?}"),
            s => Err(s),
        },
    )
    .await;

    let proc_id = ProcId::new(proc_addr.parse::<ChannelAddr>().unwrap(), "echo-1").unwrap();
    // The proc's runtime admits credentials of the World's issuer (its
    // agent gave it one; a client issues its own from the runtime key),
    // not the World secret the agent client holds.
    let rt = Proc::builder("test-rt")
        .issued_by(hostmesh_runtime::Issuer::from_runtime_key(
            hostmesh_agent::keys::runtime_key(SECRET).bytes(),
        ))
        .build()
        .await
        .unwrap();
    let timeout = Duration::from_secs(10);
    let id = mesh_ref(&proc_id)
        .unwrap()
        .call(
            &rt,
            &SpawnFor {
                type_name: echo_type_name().into(),
                name: "echo".into(),
                params: postcard::to_allocvec(&()).unwrap(),
                client: "test".into(),
                keepalive_ms: 60_000,
                owner: None,
            },
            timeout,
        )
        .await
        .unwrap()
        .unwrap();
    let echo: ActorRef<Echo> = ActorRef::attest(id);
    let reply = echo.call(&rt, &"ping".to_string(), timeout).await.unwrap();
    assert_eq!(reply, "1:ping");

    // A failing actor reaches the agent's state of its proc (and from
    // there every subscriber), with its name and reason; the proc runs on.
    echo.send(&rt, &Fail("out of widgets".to_string()))
        .await
        .unwrap();
    let st = eventually_ok("the actor failure in the proc's state", async || {
        let st = client.get_state(addr, "echo-1").await.unwrap();
        match &st.actor_failure {
            Some(_) => Ok(st.clone()),
            None => Err(st),
        }
    })
    .await;
    let f = st.actor_failure.clone().unwrap();
    assert!(f.actor.ends_with("echo[0]"), "{f:?}");
    assert!(f.reason.contains("out of widgets"), "{f:?}");
    assert_eq!(st.actor_failures, 1);
    assert!(matches!(st.status, ProcPhase::Ready { .. }), "{st:?}");

    client
        .stop(addr, "echo-1", Duration::from_secs(10))
        .await
        .unwrap();
    let st = eventually_ok("the echo proc to stop", async || {
        let st = client.get_state(addr, "echo-1").await.unwrap();
        if st.status.is_terminal() {
            Ok(st)
        } else {
            Err(st)
        }
    })
    .await;
    assert!(
        matches!(st.status, ProcPhase::Stopped { exit_code: 0, .. }),
        "{st:?}"
    );
}
