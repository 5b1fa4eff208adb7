//! The agent's session (`messenger/src/agent.rs`) under a flood of commands, against a fake
//! manager on a real loopback gRPC server. No Docker.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use converge_messenger::agent::{AgentState, Session, SessionConfig};
use converge_messenger::backoff::Backoff;
use converge_messenger::pb::agent_message::Kind;
use converge_messenger::pb::agent_service_server::{AgentService, AgentServiceServer};
use converge_messenger::pb::manager_message::Kind as MKind;
use converge_messenger::pb::{self, AgentMessage, ManagerMessage};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

struct State;
impl AgentState for State {
    async fn register(&self) -> pb::Register {
        pb::Register {
            worker_id: "w1".into(),
            cpu_capacity: 1.0,
            instance_id: "i1".into(),
            ..Default::default()
        }
    }
    fn heartbeat(&self) -> pb::Heartbeat {
        pb::Heartbeat::default()
    }
}

fn registered() -> Result<ManagerMessage, Status> {
    Ok(ManagerMessage {
        kind: Some(MKind::Registered(pb::Registered {
            manager_id: "fake".into(),
            ..Default::default()
        })),
    })
}

/// What the fake manager does with each stream: registered, then `n` commands, and it reads
/// everything.
#[derive(Clone, Copy)]
enum Script {
    Flood(usize),
}

#[derive(Clone)]
struct Fake {
    script: Script,
    streams: Arc<AtomicUsize>,
    received: mpsc::UnboundedSender<(usize, Kind)>,
}

#[tonic::async_trait]
impl AgentService for Fake {
    type ConnectStream = ReceiverStream<Result<ManagerMessage, Status>>;
    async fn connect(
        &self,
        request: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        let n = self.streams.fetch_add(1, Ordering::SeqCst) + 1;
        let mut inbound = request.into_inner();
        let first = inbound.message().await?.and_then(|m| m.kind);
        assert!(
            matches!(first, Some(Kind::Register(_))),
            "first message: {first:?}"
        );
        let (tx, rx) = mpsc::channel(100_000);
        tx.send(registered()).await.unwrap();
        let received = self.received.clone();
        match self.script {
            Script::Flood(k) => {
                for i in 0..k {
                    tx.send(Ok(ManagerMessage {
                        kind: Some(MKind::Command(pb::Command {
                            command_id: format!("c{i}"),
                            job_id: "j".into(),
                            epoch: 1,
                            action: Some(pb::command::Action::Pause(pb::Pause {})),
                            ..Default::default()
                        })),
                    }))
                    .await
                    .unwrap();
                }
                tokio::spawn(read_all(n, inbound, received, tx));
            }
        }
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

async fn read_all(
    n: usize,
    mut inbound: Streaming<AgentMessage>,
    received: mpsc::UnboundedSender<(usize, Kind)>,
    _keep_open: mpsc::Sender<Result<ManagerMessage, Status>>,
) {
    while let Ok(Some(m)) = inbound.message().await {
        if let Some(k) = m.kind {
            let _ = received.send((n, k));
        }
    }
}

async fn serve(fake: Fake) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(AgentServiceServer::new(fake))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    format!("http://{addr}")
}

fn config(endpoint: String) -> SessionConfig {
    let mut c = SessionConfig::new(endpoint);
    c.heartbeat_interval = Duration::from_millis(100);
    c.backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(20));
    c
}

fn result(id: &str) -> Kind {
    Kind::Result(pb::CommandResult {
        command_id: id.into(),
        job_id: "j".into(),
        epoch: 1,
        ok: true,
        ..Default::default()
    })
}

/// More commands than the agent's queue holds, an executor that answers each through the
/// outbox, and monitors filling the outbox with progress. The session used to wait for room in
/// the command queue inside its loop, while the executor waited for room in the outbox that
/// loop drains: each waited for the other for good, with no result, no heartbeat and no
/// reconnect. Every result must arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_commands_while_progress_fills_the_outbox_does_not_wedge_the_session() {
    const N: usize = 600;
    let (rtx, mut rrx) = mpsc::unbounded_channel();
    let endpoint = serve(Fake {
        script: Script::Flood(N),
        streams: Arc::default(),
        received: rtx,
    })
    .await;
    let shutdown = CancellationToken::new();
    // The agent's own capacity (agent/src/lib.rs:155).
    let (cmd_tx, mut cmd_rx) = mpsc::channel::<pb::Command>(256);
    let (outbox, mut status, _task) =
        Session::spawn(config(endpoint), Arc::new(State), cmd_tx, shutdown.clone());
    status.wait_for(|s| s.connected).await.unwrap();
    // The monitors: progress with try_send, dropped when the outbox is full.
    let progress = outbox.clone();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        while !stop.is_cancelled() {
            let _ = progress.try_send(Kind::Progress(pb::ProgressBatch::default()));
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    });
    // The executor: one result per command, with Outbox::send (executor.rs:716); a Docker
    // call (docker update, create) takes some milliseconds.
    tokio::spawn(async move {
        while let Some(cmd) = cmd_rx.recv().await {
            tokio::time::sleep(Duration::from_millis(20)).await;
            outbox.send(result(&cmd.command_id)).await;
        }
    });
    let mut results = 0;
    let mut stalled = false;
    while results < N {
        // Heartbeats come every 100 ms: 3 s of nothing at all means the session is stuck.
        match tokio::time::timeout(Duration::from_secs(3), rrx.recv()).await {
            Ok(Some((_, Kind::Result(_)))) => results += 1,
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(_) => {
                stalled = true;
                break;
            }
        }
    }
    let connected = status.borrow().connected;
    shutdown.cancel();
    assert!(
        !stalled && results == N,
        "the session wedged: {results} of {N} results arrived, then no message at all (not even \
         a heartbeat) for 3 s, while the session still says connected = {connected}"
    );
}
