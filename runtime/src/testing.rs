//! Test and benchmark support: a registered test actor and a child-process
//! proc server (`hostmesh-runtime-testproc`, also re-used by the benchmark),
//! so tests talk to real procs in real processes over loopback.
//!
//! The server prints `READY <proc id>` on stdout once it listens and exits
//! when its stdin closes (so it never outlives the test that started it).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::actor::{Actor, ActorRef, Context, Handler, Handlers, RemoteSpawn};
use crate::error::{ActorError, RuntimeError};
use crate::id::{ActorId, ChannelAddr};
use crate::payload::Payload;
use crate::proc::{Proc, ProcConfig};

/// Replies with the same text.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EchoText(pub String);

/// Replies with the actor's id.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WhoAmI;

/// Panics with the message.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PanicNow(pub String);

/// Sleeps this many milliseconds, then replies.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sleep(pub u64);

/// A payload; the reply is its length. The bytes arrive as a slice of the
/// receive buffer ([`Payload`]), not a copy.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Blob(pub Payload);

/// Adds to the actor's counter (usually sent, not called).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Tell(pub u64);

/// Replies with the counter.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Count;

/// Calls `to` with `EchoText(text)` and replies with its answer (proc to proc).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Forward {
    /// The actor to call.
    pub to: ActorRef<TestActor>,
    /// The text to echo.
    pub text: String,
}

/// An actor with a handler for each test message.
pub struct TestActor {
    label: String,
    count: u64,
}

impl Actor for TestActor {
    fn register(h: &mut Handlers<Self>) {
        h.handle::<EchoText>()
            .handle::<WhoAmI>()
            .handle::<PanicNow>()
            .handle::<Sleep>()
            .handle::<Blob>()
            .handle::<Tell>()
            .handle::<Count>()
            .handle::<Forward>();
    }
}

/// A label the test actors of this process refuse, on top of `"refuse"`
/// (which every process refuses): set once, by `--refuse` of
/// `hostmesh-runtime-testproc`, so that one proc of a mesh fails a spawn the
/// others accept.
static REFUSED_HERE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Makes the test actors of this process refuse `label` (see
/// [`REFUSED_HERE`]); a second call is ignored.
pub fn refuse_label_in_this_process(label: String) {
    let _ = REFUSED_HERE.set(label);
}

impl RemoteSpawn for TestActor {
    type Params = String;
    async fn new(label: String) -> Result<Self, ActorError> {
        if label == "refuse" || REFUSED_HERE.get() == Some(&label) {
            return Err(ActorError::new(format!(
                "this test actor refuses the label {label:?}"
            )));
        }
        Ok(TestActor::with_label(label))
    }
}

impl TestActor {
    /// A test actor with a label (echo replies are prefixed with it).
    pub fn with_label(label: impl Into<String>) -> Self {
        TestActor {
            label: label.into(),
            count: 0,
        }
    }
}

impl Handler<EchoText> for TestActor {
    type Reply = String;
    async fn handle(&mut self, _cx: &Context<Self>, m: EchoText) -> Result<String, ActorError> {
        Ok(if self.label.is_empty() {
            m.0
        } else {
            format!("{}:{}", self.label, m.0)
        })
    }
}

impl Handler<WhoAmI> for TestActor {
    type Reply = ActorId;
    async fn handle(&mut self, cx: &Context<Self>, _: WhoAmI) -> Result<ActorId, ActorError> {
        Ok(cx.actor_id().clone())
    }
}

impl Handler<PanicNow> for TestActor {
    type Reply = ();
    async fn handle(&mut self, _cx: &Context<Self>, m: PanicNow) -> Result<(), ActorError> {
        panic!("{}", m.0)
    }
}

impl Handler<Sleep> for TestActor {
    type Reply = ();
    async fn handle(&mut self, _cx: &Context<Self>, m: Sleep) -> Result<(), ActorError> {
        tokio::time::sleep(Duration::from_millis(m.0)).await;
        Ok(())
    }
}

impl Handler<Blob> for TestActor {
    type Reply = u64;
    async fn handle(&mut self, _cx: &Context<Self>, m: Blob) -> Result<u64, ActorError> {
        self.count += 1;
        Ok(m.0.len() as u64)
    }
}

impl Handler<Tell> for TestActor {
    type Reply = ();
    async fn handle(&mut self, _cx: &Context<Self>, m: Tell) -> Result<(), ActorError> {
        self.count += m.0;
        Ok(())
    }
}

impl Handler<Count> for TestActor {
    type Reply = u64;
    async fn handle(&mut self, _cx: &Context<Self>, _: Count) -> Result<u64, ActorError> {
        Ok(self.count)
    }
}

impl Handler<Forward> for TestActor {
    type Reply = String;
    async fn handle(&mut self, cx: &Context<Self>, m: Forward) -> Result<String, ActorError> {
        m.to.call(cx, &EchoText(m.text), Duration::from_secs(30))
            .await
            .map_err(ActorError::new)
    }
}

/// Settings of a test proc server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Proc name.
    pub name: String,
    /// Listen address (`tcp:127.0.0.1:0` picks a port).
    pub listen: ChannelAddr,
    /// Shared secret, if any.
    pub secret: Option<Vec<u8>>,
    /// `secret` is a World's runtime key: the proc issues itself a proc
    /// credential from it (what runtime-aware procs join with) instead of
    /// taking it as a shared secret.
    pub issue_from_secret: bool,
    /// Largest frame accepted.
    pub max_frame_len: usize,
    /// Test actors to spawn at start, named `<prefix>0..n`.
    pub actors: usize,
}

/// Starts a proc that registers [`TestActor`] and spawns
/// `config.actors` of them.
pub async fn start_server(config: &ServerConfig) -> Result<Proc, RuntimeError> {
    let mut pc = ProcConfig::default();
    pc.channel.max_frame_len = config.max_frame_len;
    let mut b = Proc::builder(config.name.clone())
        .listen(config.listen.clone())
        .config(pc)
        .register::<TestActor>();
    match &config.secret {
        Some(s) if config.issue_from_secret => {
            b = b.issued_by(crate::Issuer::from_runtime_key(s));
        }
        Some(s) => b = b.secret(s.clone()),
        None => {}
    }
    let proc = b.build().await?;
    for i in 0..config.actors {
        proc.spawn(&format!("t{i}"), TestActor::with_label(""))
            .await?;
    }
    Ok(proc)
}
