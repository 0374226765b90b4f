//! Supervision in one proc (invariants of `supervision`): errors and panics
//! stop the actor with an event, unhandled child failures climb to the
//! parent and then the sink, undeliverables return to their sender.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hostmesh_runtime::{
    Actor, ActorError, ActorRef, ActorStatus, Context, Handler, Handlers, Proc, RuntimeError,
    SupervisionEvent, Undeliverable,
};
use tokio::sync::mpsc;

const T: Duration = Duration::from_secs(10);

async fn proc_with_sink() -> (Proc, mpsc::UnboundedReceiver<SupervisionEvent>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let p = Proc::builder("sup")
        .supervision_sink(move |e| {
            let _ = tx.send(e);
        })
        .build()
        .await
        .unwrap();
    (p, rx)
}

async fn next_event(rx: &mut mpsc::UnboundedReceiver<SupervisionEvent>) -> SupervisionEvent {
    tokio::time::timeout(T, rx.recv())
        .await
        .expect("a supervision event")
        .unwrap()
}

/// Fails, panics or answers on command; counts cleanups.
struct Worker {
    cleanups: Arc<AtomicUsize>,
}

#[derive(serde::Serialize, serde::Deserialize)]
enum Cmd {
    Ok,
    Fail(String),
    Panic(String),
    SendToGhost,
    SpawnChild { handle_failure: bool },
    FailChild,
}

impl Actor for Worker {
    fn register(h: &mut Handlers<Self>) {
        h.handle::<Cmd>();
    }
    async fn cleanup(&mut self, _cx: &Context<Self>, status: &ActorStatus) {
        assert!(status.is_terminal());
        self.cleanups.fetch_add(1, Ordering::SeqCst);
    }
}

impl Handler<Cmd> for Worker {
    type Reply = String;
    async fn handle(&mut self, cx: &Context<Self>, cmd: Cmd) -> Result<String, ActorError> {
        match cmd {
            Cmd::Ok => Ok("ok".into()),
            Cmd::Fail(m) => Err(ActorError::new(m)),
            Cmd::Panic(m) => panic!("{m}"),
            Cmd::SendToGhost => {
                let ghost: ActorRef<Worker> = cx
                    .proc_ref()
                    .actor_ref(cx.proc_ref().id().actor("ghost", 0)?);
                ghost.send(cx, &Cmd::Ok).await.map_err(ActorError::new)?;
                Ok("sent".into())
            }
            Cmd::SpawnChild { handle_failure } => {
                let child = cx
                    .spawn_child(Parent {
                        handle_failure,
                        seen: Arc::new(AtomicUsize::new(0)),
                        child: None,
                    })
                    .await
                    .map_err(ActorError::new)?;
                Ok(child.id().to_string())
            }
            Cmd::FailChild => Ok("n/a".into()),
        }
    }
}

/// A parent that may handle its child's failure.
struct Parent {
    handle_failure: bool,
    seen: Arc<AtomicUsize>,
    child: Option<ActorRef<Worker>>,
}

impl Actor for Parent {
    fn register(h: &mut Handlers<Self>) {
        h.handle::<Cmd>();
    }
    async fn handle_supervision_event(
        &mut self,
        _cx: &Context<Self>,
        event: &SupervisionEvent,
    ) -> Result<bool, ActorError> {
        self.seen.fetch_add(1, Ordering::SeqCst);
        assert!(event.status.is_failure());
        Ok(self.handle_failure)
    }
}

impl Handler<Cmd> for Parent {
    type Reply = String;
    async fn handle(&mut self, cx: &Context<Self>, cmd: Cmd) -> Result<String, ActorError> {
        match cmd {
            Cmd::SpawnChild { .. } => {
                let c = cx
                    .spawn_child(Worker {
                        cleanups: Arc::new(AtomicUsize::new(0)),
                    })
                    .await
                    .map_err(ActorError::new)?;
                let id = c.id().to_string();
                self.child = Some(c);
                Ok(id)
            }
            Cmd::FailChild => {
                let c = self
                    .child
                    .clone()
                    .ok_or_else(|| ActorError::new("no child"))?;
                c.send(cx, &Cmd::Fail("child broke".into()))
                    .await
                    .map_err(ActorError::new)?;
                Ok("sent".into())
            }
            _ => Ok("ok".into()),
        }
    }
}

#[tokio::test]
async fn handler_error_stops_the_actor_with_an_event() {
    let (p, mut events) = proc_with_sink().await;
    let cleanups = Arc::new(AtomicUsize::new(0));
    let w = p
        .spawn(
            "w",
            Worker {
                cleanups: cleanups.clone(),
            },
        )
        .await
        .unwrap();
    assert_eq!(w.call(&p, &Cmd::Ok, T).await.unwrap(), "ok");
    let e = w
        .call(&p, &Cmd::Fail("disk full".into()), T)
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("disk full"),
        "the caller learns why: {e}"
    );
    let ev = next_event(&mut events).await;
    assert_eq!(&ev.actor, w.id());
    assert!(
        matches!(&ev.status, ActorStatus::Failed(m) if m.contains("disk full")),
        "{ev}"
    );
    assert_eq!(cleanups.load(Ordering::SeqCst), 1, "cleanup ran once");
    // The stopped actor is gone: later calls are undeliverable, not hung.
    let e = w
        .call(&p, &Cmd::Ok, Duration::from_secs(60))
        .await
        .unwrap_err();
    assert!(matches!(e, RuntimeError::CallFailed { .. }), "{e}");
}

#[tokio::test]
async fn panic_becomes_an_event_with_the_panic_message() {
    let (p, mut events) = proc_with_sink().await;
    let cleanups = Arc::new(AtomicUsize::new(0));
    let w = p
        .spawn(
            "w",
            Worker {
                cleanups: cleanups.clone(),
            },
        )
        .await
        .unwrap();
    let e = w
        .call(&p, &Cmd::Panic("kaboom 42".into()), T)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("kaboom 42"), "{e}");
    let ev = next_event(&mut events).await;
    assert!(
        matches!(&ev.status, ActorStatus::Failed(m) if m.contains("panicked") && m.contains("kaboom 42")),
        "{ev}"
    );
    assert_eq!(cleanups.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn unhandled_child_failure_escalates_through_the_parent_to_the_sink() {
    let (p, mut events) = proc_with_sink().await;
    let seen = Arc::new(AtomicUsize::new(0));
    let parent = p
        .spawn(
            "parent",
            Parent {
                handle_failure: false,
                seen: seen.clone(),
                child: None,
            },
        )
        .await
        .unwrap();
    let child_id = parent
        .call(
            &p,
            &Cmd::SpawnChild {
                handle_failure: false,
            },
            T,
        )
        .await
        .unwrap();
    assert_eq!(child_id, p.id().actor("parent", 1).unwrap().to_string());
    parent.call(&p, &Cmd::FailChild, T).await.unwrap();
    let ev = next_event(&mut events).await;
    assert_eq!(&ev.actor, parent.id(), "the parent failed: {ev}");
    assert!(ev.status.is_failure());
    let root = ev.root_cause();
    assert_eq!(root.actor.to_string(), child_id);
    assert!(
        matches!(&root.status, ActorStatus::Failed(m) if m.contains("child broke")),
        "{ev}"
    );
    assert_eq!(seen.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn handled_child_failure_keeps_the_parent_running() {
    let (p, mut events) = proc_with_sink().await;
    let seen = Arc::new(AtomicUsize::new(0));
    let parent = p
        .spawn(
            "parent",
            Parent {
                handle_failure: true,
                seen: seen.clone(),
                child: None,
            },
        )
        .await
        .unwrap();
    parent
        .call(
            &p,
            &Cmd::SpawnChild {
                handle_failure: true,
            },
            T,
        )
        .await
        .unwrap();
    parent.call(&p, &Cmd::FailChild, T).await.unwrap();
    // Poll until the parent has seen the event, then check it still answers.
    let deadline = tokio::time::Instant::now() + T;
    while seen.load(Ordering::SeqCst) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "parent never saw the event"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(parent.call(&p, &Cmd::Ok, T).await.unwrap(), "ok");
    assert!(events.try_recv().is_err(), "nothing escalated");
}

#[tokio::test]
async fn undeliverable_returns_to_the_sender_and_fails_it_by_default() {
    let (p, mut events) = proc_with_sink().await;
    let w = p
        .spawn(
            "w",
            Worker {
                cleanups: Arc::new(AtomicUsize::new(0)),
            },
        )
        .await
        .unwrap();
    assert_eq!(w.call(&p, &Cmd::SendToGhost, T).await.unwrap(), "sent");
    let ev = next_event(&mut events).await;
    assert_eq!(&ev.actor, w.id());
    assert!(
        matches!(&ev.status, ActorStatus::Failed(m) if m.contains("undeliverable") && m.contains("ghost")),
        "{ev}"
    );
}

/// Keeps undeliverables instead of failing.
struct Tolerant {
    returned: mpsc::UnboundedSender<Undeliverable>,
}

impl Actor for Tolerant {
    fn register(h: &mut Handlers<Self>) {
        h.handle::<u8>();
    }
    async fn handle_undeliverable(
        &mut self,
        _cx: &Context<Self>,
        m: Undeliverable,
    ) -> Result<(), ActorError> {
        let _ = self.returned.send(m);
        Ok(())
    }
}

impl Handler<u8> for Tolerant {
    type Reply = ();
    async fn handle(&mut self, cx: &Context<Self>, _: u8) -> Result<(), ActorError> {
        let ghost: ActorRef<Tolerant> = cx
            .proc_ref()
            .actor_ref(cx.proc_ref().id().actor("nobody", 7)?);
        ghost.send(cx, &1u8).await.map_err(ActorError::new)
    }
}

#[tokio::test]
async fn an_actor_can_handle_its_undeliverables() {
    let (p, mut events) = proc_with_sink().await;
    let (tx, mut returned) = mpsc::unbounded_channel();
    let t = p.spawn("t", Tolerant { returned: tx }).await.unwrap();
    t.send(&p, &0u8).await.unwrap();
    let u = tokio::time::timeout(T, returned.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(u.dest.actor().name(), "nobody");
    assert!(u.reason.contains("no actor"), "{u}");
    t.call(&p, &0u8, T).await.unwrap();
    assert!(events.try_recv().is_err());
}

#[tokio::test]
async fn proc_sends_that_bounce_reach_the_sink() {
    let (p, mut events) = proc_with_sink().await;
    let ghost: ActorRef<Tolerant> = p.actor_ref(p.id().actor("ghost", 0).unwrap());
    ghost.send(&p, &1u8).await.unwrap();
    let ev = next_event(&mut events).await;
    assert!(ev.to_string().contains("ghost"), "{ev}");
}
