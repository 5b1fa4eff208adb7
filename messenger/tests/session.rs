//! The agent's session (`messenger/src/agent.rs`) against a fake manager on a real loopback
//! gRPC server: under a flood of commands, and across streams that break before the manager
//! acknowledged what was written to them. No Docker.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
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

fn registered(acknowledges: bool) -> Result<ManagerMessage, Status> {
    Ok(ManagerMessage {
        kind: Some(MKind::Registered(pb::Registered {
            manager_id: "fake".into(),
            acknowledges,
            ..Default::default()
        })),
    })
}

/// What the fake manager does with each stream. It reads everything, and the test may break
/// any stream (`Fake::break_stream`).
#[derive(Clone, Copy)]
enum Script {
    /// Registered, then `n` commands.
    Flood(usize),
    /// Says it acknowledges; acknowledges every heartbeat from stream `from` on (the ones
    /// before stand for a manager that got the messages but stopped before storing them).
    Acknowledge { from: usize },
    /// A manager from before acknowledgements.
    Old,
}

/// What the fake manager sends on one stream.
type Outbound = mpsc::Sender<Result<ManagerMessage, Status>>;

#[derive(Clone)]
struct Fake {
    script: Script,
    streams: Arc<AtomicUsize>,
    received: mpsc::UnboundedSender<(usize, Kind)>,
    /// The outbound half of every stream, by number (from 1).
    outbound: Arc<Mutex<Vec<Outbound>>>,
}

impl Fake {
    fn new(script: Script) -> (Self, mpsc::UnboundedReceiver<(usize, Kind)>) {
        let (received, rx) = mpsc::unbounded_channel();
        let fake = Self {
            script,
            streams: Arc::default(),
            received,
            outbound: Arc::default(),
        };
        (fake, rx)
    }

    /// Ends stream `n` with an error, as a manager that went away does.
    async fn break_stream(&self, n: usize) {
        let tx = self.outbound.lock().unwrap()[n - 1].clone();
        tx.send(Err(Status::unavailable("broken by the test")))
            .await
            .unwrap();
    }
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
        self.outbound.lock().unwrap().push(tx.clone());
        let acknowledges = !matches!(self.script, Script::Old);
        tx.send(registered(acknowledges)).await.unwrap();
        let received = self.received.clone();
        let mut ack = false;
        match self.script {
            Script::Acknowledge { from } => ack = n >= from,
            Script::Old => {}
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
            }
        }
        tokio::spawn(read_all(n, inbound, received, tx, ack));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// Reads stream `n`, passing each message to the test; acknowledges every heartbeat if `ack`.
async fn read_all(
    n: usize,
    mut inbound: Streaming<AgentMessage>,
    received: mpsc::UnboundedSender<(usize, Kind)>,
    tx: Outbound,
    ack: bool,
) {
    while let Ok(Some(m)) = inbound.message().await {
        if let Some(k) = m.kind {
            if let (true, Kind::Heartbeat(hb)) = (ack, &k) {
                let ack = MKind::Ack(pb::Ack {
                    heartbeat_seq: hb.seq,
                });
                let _ = tx.send(Ok(ManagerMessage { kind: Some(ack) })).await;
            }
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
    let (fake, mut rrx) = Fake::new(Script::Flood(N));
    let endpoint = serve(fake).await;
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

/// Waits (at most 10 s) for the next message from the fake manager's streams.
async fn next(rx: &mut mpsc::UnboundedReceiver<(usize, Kind)>) -> (usize, Kind) {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("no message from the agent within 10 s")
        .expect("the fake manager is gone")
}

/// The id of a result (its command's) or of a migration request (its job's), `None` for any
/// other kind.
fn result_id(kind: &Kind) -> Option<&str> {
    match kind {
        Kind::Result(r) => Some(r.command_id.as_str()),
        Kind::MigrationRequest(m) => Some(m.job_id.as_str()),
        _ => None,
    }
}

/// Results and migration requests written to a stream whose manager never acknowledged them
/// (it got them, and went away before storing them: to the agent the same as a stream whose
/// buffers were lost) are sent again on the next stream, first and in order; what the next
/// manager acknowledged is not sent a third time; and `send_confirmed` resolves on the
/// acknowledgement, not before. The session used to count a message as sent once the stream
/// took it, and lost it with the stream (a migration request, until after stop 51: the node
/// asks once per incarnation, so a lost one was never asked again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_the_manager_did_not_acknowledge_are_sent_again_on_the_next_stream() {
    let (fake, mut rx) = Fake::new(Script::Acknowledge { from: 2 });
    let endpoint = serve(fake.clone()).await;
    let shutdown = CancellationToken::new();
    let (cmd_tx, _cmd_rx) = mpsc::channel::<pb::Command>(16);
    let (outbox, _status, _task) =
        Session::spawn(config(endpoint), Arc::new(State), cmd_tx, shutdown.clone());
    outbox.send(result("r1")).await;
    outbox
        .send(Kind::MigrationRequest(pb::MigrationRequest {
            job_id: "m1".into(),
            epoch: 1,
            reason: "converged".into(),
        }))
        .await;
    let mut confirmed = outbox.send_confirmed(result("r2")).await;
    // All three reach stream 1, and heartbeats follow them there: unacknowledged all the same.
    let mut on_first = Vec::new();
    let mut heartbeats_after = 0;
    while heartbeats_after < 3 {
        match next(&mut rx).await {
            (1, Kind::Heartbeat(_)) if on_first.len() == 3 => heartbeats_after += 1,
            (1, k) => on_first.extend(result_id(&k).map(str::to_string)),
            (n, k) => panic!("stream {n} before stream 1 broke: {k:?}"),
        }
    }
    assert_eq!(on_first, ["r1", "m1", "r2"]);
    assert!(
        confirmed.try_recv().is_err(),
        "confirmed although no manager acknowledged it"
    );
    fake.break_stream(1).await;
    let third = outbox.send_confirmed(result("r3")).await;
    // Stream 2: the three again, before anything newer.
    let mut on_second = Vec::new();
    while on_second.last().is_none_or(|id| id != "r3") {
        match next(&mut rx).await {
            (1, _) => {}
            (2, k) => on_second.extend(result_id(&k).map(str::to_string)),
            (n, k) => panic!("stream {n} before stream 2 broke: {k:?}"),
        }
    }
    assert_eq!(
        on_second,
        ["r1", "m1", "r2", "r3"],
        "what stream 1 lost must come first on stream 2"
    );
    tokio::time::timeout(Duration::from_secs(10), &mut confirmed)
        .await
        .expect("not confirmed within 10 s of a manager acknowledging heartbeats")
        .expect("the session is gone");
    tokio::time::timeout(Duration::from_secs(10), third)
        .await
        .expect("r3 not confirmed within 10 s")
        .expect("the session is gone");
    fake.break_stream(2).await;
    // Stream 3: whatever is sent again comes before its first heartbeat; nothing should be.
    loop {
        match next(&mut rx).await {
            (3, Kind::Heartbeat(_)) => break,
            (3, k) => panic!("stream 3 got again what stream 2's manager acknowledged: {k:?}"),
            _ => {}
        }
    }
    shutdown.cancel();
}

/// A manager from before acknowledgements: a message counts as delivered once its stream has
/// stayed up for two heartbeats after it, as the agent's exits did before (without that rule,
/// `send_confirmed` would wait for an ack that never comes, and the agent would never remove
/// an exited container).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manager_that_does_not_acknowledge_has_messages_confirmed_by_a_stream_that_stayed_up() {
    let (fake, _rx) = Fake::new(Script::Old);
    let endpoint = serve(fake).await;
    let shutdown = CancellationToken::new();
    let (cmd_tx, _cmd_rx) = mpsc::channel::<pb::Command>(16);
    let (outbox, _status, _task) =
        Session::spawn(config(endpoint), Arc::new(State), cmd_tx, shutdown.clone());
    let mut confirmed = outbox.send_confirmed(result("r1")).await;
    tokio::time::timeout(Duration::from_secs(10), &mut confirmed)
        .await
        .expect("never confirmed by a manager that does not acknowledge")
        .expect("the session is gone");
    shutdown.cancel();
}

/// A manager that says it acknowledges and never does, while more results than the session
/// keeps (4,096) pile up: results with nobody waiting are given up, oldest first, but one whose
/// delivery something waits for (an exit: the agent removes its container after) is kept, and
/// its confirmation neither resolves nor fails while the session runs. It used to fail, which
/// the executor takes for "the agent is stopping": it would have removed a container whose
/// exit no manager had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmation_is_kept_while_results_pile_up_unacknowledged() {
    let (fake, mut rx) = Fake::new(Script::Acknowledge { from: usize::MAX });
    let endpoint = serve(fake).await;
    let shutdown = CancellationToken::new();
    let (cmd_tx, _cmd_rx) = mpsc::channel::<pb::Command>(16);
    let (outbox, status, task) =
        Session::spawn(config(endpoint), Arc::new(State), cmd_tx, shutdown.clone());
    let mut first = outbox.send_confirmed(result("r0")).await;
    // Past 4,096: the session gives up the oldest result it may when it keeps r4096, before
    // it writes r4097, so once the last has arrived the choice has been made.
    const MORE: usize = 4100;
    for i in 1..=MORE {
        outbox.send(result(&format!("r{i}"))).await;
    }
    let last = format!("r{MORE}");
    while result_id(&next(&mut rx).await.1) != Some(last.as_str()) {}
    assert!(!task.is_finished() && status.borrow().connected);
    match first.try_recv() {
        Err(tokio::sync::oneshot::error::TryRecvError::Empty) => {}
        Ok(()) => panic!("r0 confirmed although nothing was acknowledged"),
        Err(tokio::sync::oneshot::error::TryRecvError::Closed) => {
            panic!("r0's confirmation failed while the session runs, with no acknowledgement")
        }
    }
    shutdown.cancel();
}
