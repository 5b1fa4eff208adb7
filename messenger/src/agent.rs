//! The agent's end of its stream to the manager.
//!
//! A [`Session`] is one task that owns the connection. The rest of the agent talks to it
//! through two channels: an [`Outbox`] for what goes to the manager (progress, usage, results,
//! exits) and a `commands` sender it was given for what comes back. Each (re)connect asks the
//! agent's [`AgentState`] for a fresh [`Register`] (the containers it runs *now*), so after a
//! manager restart or a partition the manager reconciles from the truth, not from history.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use rand::SeedableRng;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, warn};

use crate::backoff::Backoff;
use crate::pb::agent_message::Kind as AgentKind;
use crate::pb::agent_service_client::AgentServiceClient;
use crate::pb::manager_message::Kind as ManagerKind;
use crate::pb::{AgentMessage, Command, Heartbeat, LogChunk, LogsRequest, Register, Registered};

/// Why a connection attempt or a live stream ended.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The manager address is not a valid URI.
    #[error("invalid manager endpoint `{endpoint}`: {source}")]
    Endpoint {
        /// The address given.
        endpoint: String,
        /// Why it is invalid.
        #[source]
        source: tonic::transport::Error,
    },
    /// No TCP/HTTP2 connection could be made.
    #[error("cannot connect to the manager: {0}")]
    Connect(#[source] tonic::transport::Error),
    /// The manager refused or broke the stream.
    #[error("stream to the manager failed: {0}")]
    Stream(#[from] tonic::Status),
    /// The manager did not acknowledge the registration in time.
    #[error("the manager did not acknowledge registration within {0:?}")]
    RegisterTimeout(Duration),
    /// The manager closed the stream.
    #[error("the manager closed the stream")]
    Closed,
    /// The manager's first message was not `Registered`.
    #[error("the manager answered registration with an unexpected message")]
    Protocol,
    /// The TLS files cannot be used.
    #[error("the TLS files cannot be used: {0}")]
    Tls(#[source] crate::tls::TlsError),
    /// The TLS files changed: the session reconnects with the new ones.
    #[error("the TLS files changed; reconnecting with them")]
    Rotated,
}

/// What the session counts, for the agent's `/metrics` (see [`SessionMetrics::register`]).
#[derive(Clone, Debug, Default)]
pub struct SessionMetrics {
    sent: Family<KindLabel, Counter>,
    registrations: Counter,
    disconnects: Counter,
}

/// A message kind, as a label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

impl SessionMetrics {
    /// Adds the session's metrics to `registry` (under the caller's prefix).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "messages_sent",
            "Messages written to the manager stream, by kind",
            self.sent.clone(),
        );
        registry.register(
            "registrations",
            "Successful registrations with the manager (the first, then one per reconnect)",
            self.registrations.clone(),
        );
        registry.register(
            "disconnects",
            "Streams to the manager that ended or could not be set up, before a retry",
            self.disconnects.clone(),
        );
    }

    /// Counts a message once the stream took it (a send that failed is retried, not lost).
    fn sent(&self, kind: Option<&'static str>) {
        if let Some(kind) = kind {
            self.sent.get_or_create(&KindLabel { kind }).inc();
        }
    }
}

/// How the session connects and how often it reports.
#[derive(Clone, Debug)]
pub struct SessionConfig {
    /// The manager's agent endpoint, e.g. `http://127.0.0.1:7070`.
    pub manager_endpoint: String,
    /// Heartbeat period (default 1 s).
    pub heartbeat_interval: Duration,
    /// Reconnect schedule.
    pub backoff: Backoff,
    /// How long to wait for the manager's `Registered`.
    pub register_timeout: Duration,
    /// Counters the session keeps (unregistered by default: counted, never shown).
    pub metrics: SessionMetrics,
    /// Mutual TLS with the manager (`crate::tls`), when the endpoint is `https://`: the files
    /// are read at each connection, and a change to them makes the session reconnect.
    pub tls: Option<crate::tls::ClientTls>,
    /// Where the manager's requests for a job's output go. Without one, the session answers
    /// each request itself, saying this agent serves no logs (the manager's reader is told
    /// rather than left waiting).
    pub logs: Option<mpsc::Sender<LogsControl>>,
}

/// The manager's requests about job output (`convergectl logs`), for the agent's log reader.
#[derive(Debug)]
pub enum LogsControl {
    /// Send the output of one incarnation.
    Read(LogsRequest),
    /// Stop sending for this request id.
    Cancel(u64),
    /// The stream the requests came on ended: every request on it is void (the manager
    /// forgot them), so readers stop.
    StreamEnded,
}

impl SessionConfig {
    /// Defaults for everything but the endpoint.
    pub fn new(manager_endpoint: impl Into<String>) -> Self {
        Self {
            manager_endpoint: manager_endpoint.into(),
            heartbeat_interval: Duration::from_secs(1),
            backoff: Backoff::default(),
            register_timeout: Duration::from_secs(10),
            metrics: SessionMetrics::default(),
            tls: None,
            logs: None,
        }
    }
}

/// What the session needs from the agent.
pub trait AgentState: Send + Sync + 'static {
    /// The registration to send on this (re)connect, listing the containers running now.
    fn register(&self) -> impl Future<Output = Register> + Send;
    /// The body of the next heartbeat; the session fills in `seq` and `unix_ms`.
    fn heartbeat(&self) -> Heartbeat;
}

/// The session's view of the connection, for the agent's logs, metrics and tests.
#[derive(Clone, Debug, Default)]
pub struct SessionStatus {
    /// True while a registered stream is up.
    pub connected: bool,
    /// Successful registrations so far (1 after the first connect; +1 per reconnect).
    pub registrations: u64,
    /// What the manager said when it acknowledged the last registration.
    pub registered: Option<Registered>,
    /// Why the last stream ended, if one did.
    pub last_error: Option<String>,
}

/// The agent's handle for sending to the manager; messages wait here while disconnected.
#[derive(Clone, Debug)]
pub struct Outbox {
    tx: mpsc::Sender<AgentMessage>,
}

impl Outbox {
    /// Queues a message that must not be lost (results, exits); waits for room.
    pub async fn send(&self, kind: AgentKind) {
        // The receiver lives as long as the session; after shutdown nothing is delivered anyway.
        let _ = self.tx.send(AgentMessage { kind: Some(kind) }).await;
    }

    /// Queues a message that may be dropped when the queue is full (progress and usage are
    /// superseded by the next batch); returns false when it was dropped.
    pub fn try_send(&self, kind: AgentKind) -> bool {
        self.tx.try_send(AgentMessage { kind: Some(kind) }).is_ok()
    }
}

/// The agent's connection to the manager, as a task.
pub struct Session;

impl Session {
    /// Starts the session task. Commands from the manager go to `commands`; the returned
    /// [`Outbox`] sends to the manager. The task ends when `shutdown` is cancelled.
    pub fn spawn<S: AgentState>(
        config: SessionConfig,
        state: Arc<S>,
        commands: mpsc::Sender<Command>,
        shutdown: CancellationToken,
    ) -> (
        Outbox,
        watch::Receiver<SessionStatus>,
        tokio::task::JoinHandle<()>,
    ) {
        let (out_tx, out_rx) = mpsc::channel(1024);
        let (status_tx, status_rx) = watch::channel(SessionStatus::default());
        let task = tokio::spawn(
            run(config, state, commands, out_rx, status_tx, shutdown).in_current_span(),
        );
        (Outbox { tx: out_tx }, status_rx, task)
    }
}

async fn run<S: AgentState>(
    mut config: SessionConfig,
    state: Arc<S>,
    commands: mpsc::Sender<Command>,
    mut outbox: mpsc::Receiver<AgentMessage>,
    status: watch::Sender<SessionStatus>,
    shutdown: CancellationToken,
) {
    let mut rng = rand::rngs::StdRng::from_os_rng();
    let mut seq = 0u64;
    // A message taken from the outbox when the stream broke is sent first after reconnecting.
    let mut carry: Option<AgentMessage> = None;
    // Commands read from the manager that the executor has not taken yet: kept across
    // reconnects, handed over as the executor makes room (`connect_and_serve`).
    let mut waiting: VecDeque<Command> = VecDeque::new();
    loop {
        let result = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = connect_and_serve(&config, &*state, &commands, &mut waiting, &mut outbox, &status, &mut seq, &mut carry, &shutdown) => r,
        };
        if shutdown.is_cancelled() {
            return;
        }
        config.metrics.disconnects.inc();
        if let Some(logs) = &config.logs {
            let _ = logs.send(LogsControl::StreamEnded).await;
        }
        let was_connected = status.borrow().connected;
        if was_connected {
            // The stream worked for a while: start the schedule over.
            config.backoff.reset();
        }
        let reason = match &result {
            Ok(()) => "closed".to_string(),
            Err(e) => e.to_string(),
        };
        status.send_modify(|s| {
            s.connected = false;
            s.last_error = Some(reason.clone());
        });
        let delay = config.backoff.next_delay(&mut rng);
        if was_connected {
            warn!(%reason, ?delay, "disconnected from manager; reconnecting");
        } else {
            debug!(%reason, ?delay, "manager unreachable; retrying");
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

/// How long a stream closed on purpose waits for the manager to read what was queued on it.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// Commands read from the manager and not yet taken by the executor, at most, before the
/// session stops reading its stream.
const WAITING_MAX: usize = 256;

/// Ends a stream without losing what was queued on it: the sending side ends after the queued
/// messages, and the manager's side is read (commands passed on) until the manager ends it too,
/// for at most [`CLOSE_WAIT`].
async fn close_gently(
    tx: mpsc::Sender<AgentMessage>,
    inbound: &mut tonic::Streaming<crate::pb::ManagerMessage>,
    waiting: &mut VecDeque<Command>,
) {
    drop(tx);
    let _ = tokio::time::timeout(CLOSE_WAIT, async {
        while let Ok(Some(m)) = inbound.message().await {
            if let Some(ManagerKind::Command(cmd)) = m.kind {
                waiting.push_back(cmd);
            }
        }
    })
    .await;
}

#[allow(clippy::too_many_arguments)]
async fn connect_and_serve<S: AgentState>(
    config: &SessionConfig,
    state: &S,
    commands: &mpsc::Sender<Command>,
    waiting: &mut VecDeque<Command>,
    outbox: &mut mpsc::Receiver<AgentMessage>,
    status: &watch::Sender<SessionStatus>,
    seq: &mut u64,
    carry: &mut Option<AgentMessage>,
    shutdown: &CancellationToken,
) -> Result<(), SessionError> {
    let endpoint = tonic::transport::Endpoint::from_shared(config.manager_endpoint.clone())
        .map_err(|source| SessionError::Endpoint {
            endpoint: config.manager_endpoint.clone(),
            source,
        })?
        .connect_timeout(Duration::from_secs(3))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5));
    let plain = endpoint.clone();
    let (endpoint, mut stamp) = match &config.tls {
        Some(tls) => {
            let (endpoint, stamp) = tls.endpoint(endpoint).map_err(SessionError::Tls)?;
            (endpoint, Some(stamp))
        }
        None => (endpoint, None),
    };
    let channel = endpoint.connect().await.map_err(SessionError::Connect)?;
    let mut client = AgentServiceClient::new(channel);

    let (tx, rx) = mpsc::channel::<AgentMessage>(256);
    let register = state.register().await;
    let worker = register.worker_id.clone();
    let containers = register.containers.len();
    // The channel is fresh and has room: the send cannot block or fail.
    let _ = tx
        .send(AgentMessage {
            kind: Some(AgentKind::Register(register)),
        })
        .await;
    let mut inbound = client.connect(ReceiverStream::new(rx)).await?.into_inner();
    let registered = match tokio::time::timeout(config.register_timeout, inbound.message()).await {
        Err(_) => return Err(SessionError::RegisterTimeout(config.register_timeout)),
        Ok(Err(status)) => return Err(status.into()),
        Ok(Ok(None)) => return Err(SessionError::Closed),
        Ok(Ok(Some(m))) => match m.kind {
            Some(ManagerKind::Registered(r)) => r,
            _ => return Err(SessionError::Protocol),
        },
    };
    info!(%worker, containers, manager = %registered.manager_id, policy = %registered.policy, "registered with manager");
    let metrics = &config.metrics;
    metrics.registrations.inc();
    metrics.sent(Some("register"));
    status.send_modify(|s| {
        s.connected = true;
        s.registrations += 1;
        s.registered = Some(registered);
        s.last_error = None;
    });

    if let Some(msg) = carry.take() {
        let kind = msg.kind.as_ref().map(AgentKind::name);
        if let Err(e) = tx.send(msg).await {
            *carry = Some(e.0);
            return Err(SessionError::Closed);
        }
        metrics.sent(kind);
    }
    let mut heartbeat = tokio::time::interval(config.heartbeat_interval);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = heartbeat.tick() => {
                if let (Some(tls), Some(seen)) = (&config.tls, &mut stamp)
                    && tls.changed(seen)
                {
                    let now = tls.files.stamp();
                    match tls.endpoint(plain.clone()) {
                        Ok(_) => {
                            // Running containers are not touched: the next Register lists them.
                            info!("certificate files changed: reconnecting with them");
                            close_gently(tx, &mut inbound, waiting).await;
                            return Err(SessionError::Rotated);
                        }
                        Err(e) => {
                            warn!(error = %e, "certificate files changed but cannot be used; keeping the connection and the previous ones");
                            *seen = now;
                        }
                    }
                }
                *seq += 1;
                let mut hb = state.heartbeat();
                hb.seq = *seq;
                hb.unix_ms = crate::unix_ms(SystemTime::now());
                if tx.send(AgentMessage { kind: Some(AgentKind::Heartbeat(hb)) }).await.is_err() {
                    return Err(SessionError::Closed);
                }
                metrics.sent(Some("heartbeat"));
            }
            Some(msg) = outbox.recv() => {
                let kind = msg.kind.as_ref().map(AgentKind::name);
                if let Err(e) = tx.send(msg).await {
                    *carry = Some(e.0);
                    return Err(SessionError::Closed);
                }
                metrics.sent(kind);
            }
            // Commands go to the executor as it makes room, never awaited here: the executor
            // answers each through the outbox this loop drains, and a loop waiting for the
            // executor while the executor waits for the outbox (filled by progress) stood
            // still for good, heartbeats and all.
            permit = commands.reserve(), if !waiting.is_empty() => match permit {
                Ok(permit) => permit.send(waiting.pop_front().expect("not empty")),
                // The agent's executor is gone: the agent is shutting down.
                Err(_) => return Ok(()),
            },
            // Read on only while few commands wait: past that, HTTP/2 flow control holds
            // the manager back.
            msg = inbound.message(), if waiting.len() < WAITING_MAX => match msg? {
                None => return Err(SessionError::Closed),
                Some(m) => match m.kind {
                    Some(ManagerKind::Command(cmd)) => waiting.push_back(cmd),
                    Some(ManagerKind::Logs(request)) => match &config.logs {
                        Some(logs) => {
                            let _ = logs.send(LogsControl::Read(request)).await;
                        }
                        None => {
                            let refusal = LogChunk {
                                request_id: request.request_id,
                                end: true,
                                error: "this agent does not serve job output".into(),
                                ..Default::default()
                            };
                            if tx.send(AgentMessage { kind: Some(AgentKind::Logs(refusal)) }).await.is_err() {
                                return Err(SessionError::Closed);
                            }
                        }
                    },
                    Some(ManagerKind::LogsCancel(c)) => {
                        if let Some(logs) = &config.logs {
                            let _ = logs.send(LogsControl::Cancel(c.request_id)).await;
                        }
                    }
                    Some(ManagerKind::Registered(_)) => debug!("ignoring a repeated Registered"),
                    None => debug!("ignoring an empty or newer manager message"),
                },
            },
        }
    }
}
