//! Certificate rotations that go wrong, over real TLS on loopback: an agent whose files cannot
//! be used keeps reconnecting with the last ones that worked, and a CA left from before a
//! rotation is named as the file to fix. No Docker.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use converge_messenger::agent::{AgentState, Session, SessionConfig, SessionError, SessionStatus};
use converge_messenger::backoff::Backoff;
use converge_messenger::pb::agent_service_server::{AgentService, AgentServiceServer};
use converge_messenger::pb::manager_message::Kind as MKind;
use converge_messenger::pb::{self, AgentMessage, ManagerMessage};
use converge_messenger::tls::{self, ClientTls, Mismatch, TlsFiles};
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

type Outbound = mpsc::Sender<Result<ManagerMessage, Status>>;

/// A manager that registers every stream and can break the one open.
#[derive(Clone, Default)]
struct Fake {
    open: Arc<Mutex<Option<Outbound>>>,
}

impl Fake {
    async fn break_stream(&self) {
        let tx = self.open.lock().unwrap().take().expect("a stream is open");
        let _ = tx
            .send(Err(Status::unavailable("broken by the test")))
            .await;
    }
}

#[tonic::async_trait]
impl AgentService for Fake {
    type ConnectStream = ReceiverStream<Result<ManagerMessage, Status>>;
    async fn connect(
        &self,
        request: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(16);
        tx.send(Ok(ManagerMessage {
            kind: Some(MKind::Registered(pb::Registered {
                manager_id: "fake".into(),
                acknowledges: true,
                ..Default::default()
            })),
        }))
        .await
        .unwrap();
        *self.open.lock().unwrap() = Some(tx);
        // Read what the agent sends (heartbeats), so that its stream never fills.
        tokio::spawn(async move { while let Ok(Some(_)) = inbound.message().await {} });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

fn temp_dir(what: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("converge-{what}-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn provider() {
    let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
}

/// A manager with `dir`'s files on a loopback port, serving `fake` until `stop`.
async fn manager(dir: &Path, fake: Fake, stop: CancellationToken) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let incoming = tls::listen(listener, TlsFiles::manager(dir), stop.clone()).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(AgentServiceServer::new(fake))
            .serve_with_incoming_shutdown(incoming, stop.cancelled_owned()),
    );
    format!("https://127.0.0.1:{port}")
}

/// Worker w1's agent session with `files`, against `endpoint`, beating and retrying fast: its
/// status, its task, and the receiver of its commands (kept while it runs).
fn agent_w1(
    endpoint: String,
    files: &TlsFiles,
    stop: &CancellationToken,
) -> (
    tokio::sync::watch::Receiver<SessionStatus>,
    tokio::task::JoinHandle<()>,
    mpsc::Receiver<pb::Command>,
) {
    let mut config = SessionConfig::new(endpoint);
    config.heartbeat_interval = Duration::from_millis(50);
    config.backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(50));
    config.tls = Some(ClientTls {
        files: files.clone(),
        domain: "localhost".into(),
    });
    let (commands, received) = mpsc::channel(16);
    let (_outbox, status, task) = Session::spawn(config, Arc::new(State), commands, stop.clone());
    (status, task, received)
}

/// A rotation gone wrong (worker w2's key written over w1's: the key does not go with the
/// certificate), then a reconnect: the agent registers again with the last files that
/// worked instead of failing until someone fixes them (its workers lost meanwhile), and takes
/// the files once they are fixed.
#[tokio::test]
async fn an_agent_reconnects_with_the_last_files_that_worked() {
    provider();
    let dir = temp_dir("kept-tls");
    tls::generate(&dir, &["localhost".into()], &["w1".into(), "w2".into()]).unwrap();
    let stop = CancellationToken::new();
    let fake = Fake::default();
    let endpoint = manager(&dir, fake.clone(), stop.clone()).await;
    let files = TlsFiles::worker(&dir, "w1");
    let (status, task, _commands) = agent_w1(endpoint, &files, &stop);
    let registrations = |n: u64| {
        let (mut status, last) = (status.clone(), status.clone());
        async move {
            let got = tokio::time::timeout(
                Duration::from_secs(20),
                status.wait_for(|s| s.connected && s.registrations >= n),
            )
            .await;
            match got {
                Ok(s) => s.unwrap().registrations,
                Err(_) => panic!(
                    "registration {n} never came; last error: {:?}",
                    last.borrow().last_error
                ),
            }
        }
    };
    assert_eq!(registrations(1).await, 1);

    let good_key = std::fs::read_to_string(&files.key).unwrap();
    let other_key = std::fs::read_to_string(TlsFiles::worker(&dir, "w2").key).unwrap();
    tls::write_private(&files.key, &other_key).unwrap();
    assert!(
        files.client("localhost").is_err(),
        "the files must be unusable"
    );
    fake.break_stream().await;
    assert_eq!(registrations(2).await, 2, "reconnected with the kept files");

    // Fixed: the heartbeat sees the change, and the agent reconnects with the files.
    tls::write_private(&files.key, &good_key).unwrap();
    assert_eq!(registrations(3).await, 3, "the fixed files were not taken");

    stop.cancel();
    task.await.unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}

/// Files that cannot be used, and a connection with the last ones that worked that fails
/// too (here, the manager gone): the error the agent reports names the files, which are what
/// to fix, not only the connection's failure.
#[tokio::test]
async fn a_failure_with_the_kept_files_names_the_files_that_cannot_be_used() {
    provider();
    let dir = temp_dir("stale-tls");
    tls::generate(&dir, &["localhost".into()], &["w1".into(), "w2".into()]).unwrap();
    let (stop, manager_stop) = (CancellationToken::new(), CancellationToken::new());
    let fake = Fake::default();
    let endpoint = manager(&dir, fake.clone(), manager_stop.clone()).await;
    let files = TlsFiles::worker(&dir, "w1");
    let (mut status, task, _commands) = agent_w1(endpoint, &files, &stop);
    tokio::time::timeout(Duration::from_secs(20), status.wait_for(|s| s.connected))
        .await
        .expect("registered")
        .unwrap();
    let other_key = std::fs::read_to_string(TlsFiles::worker(&dir, "w2").key).unwrap();
    tls::write_private(&files.key, &other_key).unwrap();
    // The manager gone: no new connection, and the open stream broken.
    manager_stop.cancel();
    fake.break_stream().await;
    let said = tokio::time::timeout(
        Duration::from_secs(20),
        status.wait_for(|s| (s.last_error.as_deref()).is_some_and(|e| e.contains("last ones"))),
    )
    .await
    .expect("a failure naming the files")
    .unwrap()
    .last_error
    .clone()
    .unwrap();
    assert!(
        said.contains("the TLS files cannot be used") && said.contains("does not go with"),
        "{said}"
    );
    stop.cancel();
    task.await.unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}

/// After a rotation, a CA file left from before it: every testbed CA has the same name, so
/// rustls says `BadSignature`, not `UnknownIssuer`. Both are the same mistake, and get the
/// same hint (give the cluster CA's ca.pem), in the agent and in convergectl.
#[tokio::test]
async fn a_stale_ca_of_the_same_name_is_named_as_the_ca_to_fix() {
    provider();
    let (now, before) = (temp_dir("ca-now"), temp_dir("ca-before"));
    for dir in [&now, &before] {
        tls::generate(dir, &["localhost".into()], &["w1".into()]).unwrap();
    }
    let stop = CancellationToken::new();
    let endpoint = manager(&now, Fake::default(), stop.clone()).await;
    let mut stale = TlsFiles::worker(&now, "w1");
    stale.ca = TlsFiles::worker(&before, "w1").ca;
    let err = tonic::transport::Endpoint::from_shared(endpoint.clone())
        .unwrap()
        .tls_config(stale.client("localhost").unwrap())
        .unwrap()
        .connect()
        .await
        .expect_err("a CA that did not sign the manager's certificate");
    let chain = format!("{:?}", anyhow_chain(&err));
    assert!(chain.contains("BadSignature"), "{chain}");
    assert_eq!(Mismatch::of(&err), Some(Mismatch::UnknownIssuer), "{chain}");
    let hint = SessionError::Connect(err).hint(&endpoint);
    assert!(hint.is_some_and(|h| h.contains("ca.pem")), "{hint:?}");
    stop.cancel();
    for dir in [now, before] {
        std::fs::remove_dir_all(dir).unwrap();
    }
}

/// Every cause's words, for a failure message.
fn anyhow_chain(e: &(dyn std::error::Error + 'static)) -> Vec<String> {
    let mut out = Vec::new();
    let mut cause = Some(e);
    while let Some(c) = cause {
        out.push(c.to_string());
        cause = c.source();
    }
    out
}
