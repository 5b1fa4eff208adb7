//! The agent's end of its stream to the manager.
//!
//! A [`Session`] is one task that owns the connection. The rest of the agent talks to it
//! through two channels: an [`Outbox`] for what goes to the manager (progress, usage, results,
//! exits) and a `commands` sender it was given for what comes back. Each (re)connect asks the
//! agent's [`AgentState`] for a fresh [`Register`] (the containers it runs *now*), so after a
//! manager restart or a partition the manager reconciles from the truth, not from history.
//!
//! What the manager must not miss (command results, container exits) is kept after it is
//! written until the manager acknowledges it (`Ack`, answering a heartbeat sent after it), and
//! sent again first thing on the next stream if the stream broke before then: a message
//! written to a stream is not a message received, and HTTP/2's buffers, or a manager that
//! stopped before storing it, lose it with the stream.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use rand::SeedableRng;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, error, info, warn};

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
    /// A connection with the last TLS files that worked, those on disk being unusable, failed
    /// too: the files are what to fix, whatever the connection says.
    #[error(
        "the TLS files cannot be used ({files}), and the last ones that worked failed: {source}"
    )]
    Stale {
        /// Why the files on disk cannot be used.
        files: String,
        /// How the connection with the previous ones failed.
        #[source]
        source: Box<SessionError>,
    },
}

/// The words the manager closes a worker's stream with when another stream of the same worker
/// replaced it ([`SessionError::is_replaced`]).
pub const REPLACED: &str = "replaced by a newer stream of the same worker";

impl SessionError {
    /// Whether the manager refused this agent as it is set up (its certificate's identity,
    /// its registration): trying again changes nothing until someone changes its setup.
    pub fn is_refusal(&self) -> bool {
        use tonic::Code;
        matches!(self, SessionError::Stream(s) if matches!(
            s.code(),
            Code::PermissionDenied
                | Code::Unauthenticated
                | Code::InvalidArgument
                | Code::FailedPrecondition
        ))
    }

    /// Whether this agent's own setup cannot be used: its manager address, or its TLS files
    /// before any connection registered with them (read again at every connection; after
    /// one did, files that cannot be used are stood in for by the last ones that worked).
    pub fn is_own_setup(&self) -> bool {
        matches!(
            self,
            SessionError::Endpoint { .. } | SessionError::Tls(_) | SessionError::Stale { .. }
        )
    }

    /// What to change when the failure's own words name nothing the operator set: TLS on
    /// one side only, or a CA that did not sign the manager's certificate (read from the
    /// whole chain of causes, where the layers below say it).
    pub fn hint(&self, manager: &str) -> Option<&'static str> {
        use crate::tls::Mismatch;
        if let SessionError::Stale { .. } = self {
            // Not the CA the old files trusted: the new ones, which cannot be read.
            return Some("fix the --tls-* files (the error says why they cannot be used)");
        }
        match Mismatch::of(self)? {
            Mismatch::TlsServer if manager.starts_with("http://") => {
                Some("if the manager speaks TLS, give an https:// --manager and the --tls-* files")
            }
            Mismatch::TlsServer => None,
            Mismatch::PlaintextServer => Some(
                "the manager does not speak TLS at this address: use an http:// --manager, \
                 without the --tls-* files",
            ),
            Mismatch::UnknownIssuer => Some(
                "the manager's certificate is not signed by --tls-ca: give the cluster CA's ca.pem (after a rotation, the new one)",
            ),
        }
    }

    /// Whether the manager refused this registration because another agent process is
    /// connected as the same worker: it passes once that one's stream ends, or the operator
    /// gives one of them another `--worker-id`.
    pub fn is_second_agent(&self) -> bool {
        matches!(self, SessionError::Stream(s) if s.code() == tonic::Code::AlreadyExists)
    }

    /// Whether the manager closed this stream because another stream of the same worker
    /// replaced it: on the stream the agent still uses, that is another agent process
    /// registered with the same worker id.
    pub fn is_replaced(&self) -> bool {
        matches!(self, SessionError::Stream(s) if s.code() == tonic::Code::Aborted && s.message() == REPLACED)
    }
}

/// What the session counts, for the agent's `/metrics` (see [`SessionMetrics::register`]).
#[derive(Clone, Debug, Default)]
pub struct SessionMetrics {
    sent: Family<KindLabel, Counter>,
    registrations: Counter,
    disconnects: Counter,
    resent: Counter,
    unacknowledged_dropped: Counter,
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
        registry.register(
            "messages_resent",
            "Results, exits and migration requests sent again on a new stream: the stream they were written to broke before the manager acknowledged them",
            self.resent.clone(),
        );
        registry.register(
            "unacknowledged_dropped",
            "Command results given up unacknowledged, the oldest first, past 4,096 messages waiting for an acknowledgement (exits never are)",
            self.unacknowledged_dropped.clone(),
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
    /// are read at each connection, and a change to them makes the session reconnect; files
    /// that cannot be used are stood in for by the last ones that registered.
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
    tx: mpsc::Sender<Outgoing>,
}

/// A message for the manager, and whom to tell once the manager has it.
#[derive(Debug)]
struct Outgoing {
    message: AgentMessage,
    delivered: Option<oneshot::Sender<()>>,
}

impl Outbox {
    /// Queues a message that must not be lost (results, exits); waits for room. Results and
    /// exits are kept until the manager acknowledges them, and sent again after a reconnect
    /// (module doc).
    pub async fn send(&self, kind: AgentKind) {
        // The receiver lives as long as the session; after shutdown nothing is delivered anyway.
        let _ = self.tx.send(Outgoing::new(kind, None)).await;
    }

    /// Queues a message as [`Outbox::send`] does, and returns what resolves once the manager
    /// has acknowledged it (or, from a manager that does not acknowledge, once its stream has
    /// stayed up for two heartbeats after it). It fails only when the session has ended.
    pub async fn send_confirmed(&self, kind: AgentKind) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        let _ = self.tx.send(Outgoing::new(kind, Some(tx))).await;
        rx
    }

    /// Queues a message that may be dropped when the queue is full (progress and usage are
    /// superseded by the next batch); returns false when it was dropped.
    pub fn try_send(&self, kind: AgentKind) -> bool {
        self.tx.try_send(Outgoing::new(kind, None)).is_ok()
    }
}

impl Outgoing {
    fn new(kind: AgentKind, delivered: Option<oneshot::Sender<()>>) -> Self {
        Self {
            message: AgentMessage { kind: Some(kind) },
            delivered,
        }
    }

    /// Whether the manager must get it even if the stream it is written to breaks: a lost
    /// result or exit leaves the manager waiting for an answer, or restarting a job that had
    /// finished; a lost migration request is never asked again (the node asks once per
    /// incarnation), so the job misses its move. A duplicate of any of them is harmless: the
    /// core takes a result or exit it has as the same again, and SpeCon decides a job's
    /// request at most once.
    fn must_arrive(&self) -> bool {
        self.delivered.is_some()
            || matches!(
                self.message.kind,
                Some(AgentKind::Result(_) | AgentKind::Exited(_) | AgentKind::MigrationRequest(_))
            )
    }
}

/// Results, exits and migration requests written to a stream and not yet acknowledged, oldest
/// first.
#[derive(Debug, Default)]
struct Unacknowledged {
    waiting: VecDeque<Written>,
}

/// One message in [`Unacknowledged`].
#[derive(Debug)]
struct Written {
    message: AgentMessage,
    /// The sequence number of the last heartbeat written before it: an ack of any later
    /// heartbeat covers it.
    after: u64,
    delivered: Option<oneshot::Sender<()>>,
}

/// Unacknowledged messages kept before results are given up, oldest first (and counted), so
/// that a manager that stopped acknowledging cannot make the agent grow without end.
const UNACKNOWLEDGED_MAX: usize = 4096;

impl Unacknowledged {
    /// Keeps a message just written after heartbeat `after`.
    fn keep(
        &mut self,
        message: AgentMessage,
        delivered: Option<oneshot::Sender<()>>,
        after: u64,
        metrics: &SessionMetrics,
    ) {
        if self.waiting.len() >= UNACKNOWLEDGED_MAX {
            // Only a result or a migration request with nobody waiting for it may go: the
            // manager recovers a lost result by sending its command again (reconcile), which
            // the agent answers from its cache, and a lost request costs one move, not a job.
            // An exit is never given up: there is one per container, whose removal waits for
            // it, and nothing else would tell the manager the job ended.
            let result = self.waiting.iter().position(|w| {
                w.delivered.is_none()
                    && matches!(
                        w.message.kind,
                        Some(AgentKind::Result(_) | AgentKind::MigrationRequest(_))
                    )
            });
            if let Some(i) = result {
                self.waiting.remove(i);
                metrics.unacknowledged_dropped.inc();
            }
        }
        self.waiting.push_back(Written {
            message,
            after,
            delivered,
        });
    }

    /// The manager has everything written before heartbeat `seq`.
    fn acknowledged(&mut self, seq: u64) {
        // In the order written, so `after` never decreases.
        while self.waiting.front().is_some_and(|w| w.after < seq) {
            if let Some(tx) = self.waiting.pop_front().and_then(|w| w.delivered) {
                let _ = tx.send(());
            }
        }
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
    mut outbox: mpsc::Receiver<Outgoing>,
    status: watch::Sender<SessionStatus>,
    shutdown: CancellationToken,
) {
    let mut rng = rand::rngs::StdRng::from_os_rng();
    let mut seq = 0u64;
    // A message taken from the outbox when the stream broke is sent first after reconnecting
    // (after the unacknowledged ones, written before it was taken).
    let mut carry: Option<Outgoing> = None;
    let mut unacknowledged = Unacknowledged::default();
    // Commands read from the manager that the executor has not taken yet: kept across
    // reconnects, handed over as the executor makes room (`connect_and_serve`).
    let mut waiting: VecDeque<Command> = VecDeque::new();
    // The reason the last attempt failed, while none has succeeded since: the same failure
    // again is logged at debug, a new one as a warning.
    let mut failing: Option<String> = None;
    // The TLS configuration of the last stream that registered, for a reconnect while the
    // files cannot be used (`connect_and_serve`).
    let mut kept = KeptTls::default();
    loop {
        let result = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = connect_and_serve(&config, &*state, &commands, &mut waiting, &mut outbox, &status, &mut seq, &mut carry, &mut unacknowledged, &mut kept, &shutdown) => r,
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
            Err(e) => match e.hint(&config.manager_endpoint) {
                Some(hint) => format!("{e}; {hint}"),
                None => e.to_string(),
            },
        };
        status.send_modify(|s| {
            s.connected = false;
            s.last_error = Some(reason.clone());
        });
        let delay = config.backoff.next_delay(&mut rng);
        let error = result.as_ref().err();
        // A failure said once: the same reason again, while nothing succeeds, at debug.
        let again = failing.as_ref() == Some(&reason) && !was_connected;
        if matches!(error, Some(SessionError::Rotated)) {
            // Planned: the operator rotated the files, and nothing is wrong (a warning for it
            // read as a fault in the logs of every rotation).
            info!(?delay, "reconnecting with the rotated certificate files");
        } else if error.is_some_and(SessionError::is_replaced) {
            // Each of two agents with one worker id takes the stream from the other when it
            // reconnects: without this, the only sign was the manager's registrations.
            error!(%reason, ?delay, "another agent process registered with this agent's --worker-id and took its stream; give each agent its own --worker-id");
        } else if error.is_some_and(SessionError::is_second_agent) && !again {
            error!(%reason, ?delay, "another agent process is connected with this agent's --worker-id; retrying until its stream ends; give each agent its own --worker-id");
        } else if again {
            debug!(%reason, ?delay, "still failing; retrying");
        } else if error.is_some_and(SessionError::is_refusal) {
            // A wrong certificate or registration: logged at debug as "unreachable", every
            // such refusal looked like a manager that was down.
            error!(%reason, ?delay, "the manager refused this agent; retrying, but its setup must change first");
        } else if error.is_some_and(SessionError::is_own_setup) {
            error!(%reason, ?delay, "this agent's manager address or TLS files cannot be used; retrying");
        } else if was_connected {
            warn!(%reason, ?delay, "disconnected from manager; reconnecting");
        } else {
            warn!(%reason, ?delay, "manager unreachable; retrying");
        }
        failing = Some(reason);
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

/// The TLS configuration the last registered stream used, and the error about the files last
/// logged while it stands in for them (each said once).
#[derive(Default)]
struct KeptTls {
    config: Option<tonic::transport::ClientTlsConfig>,
    told: Option<String>,
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
    unacknowledged: &mut Unacknowledged,
) {
    drop(tx);
    let _ = tokio::time::timeout(CLOSE_WAIT, async {
        while let Ok(Some(m)) = inbound.message().await {
            match m.kind {
                Some(ManagerKind::Command(cmd)) => waiting.push_back(cmd),
                Some(ManagerKind::Ack(ack)) => unacknowledged.acknowledged(ack.heartbeat_seq),
                _ => {}
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
    outbox: &mut mpsc::Receiver<Outgoing>,
    status: &watch::Sender<SessionStatus>,
    seq: &mut u64,
    carry: &mut Option<Outgoing>,
    unacknowledged: &mut Unacknowledged,
    kept: &mut KeptTls,
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
    let mut using = None;
    // Why the files on disk cannot be used, when the last ones that worked stand in.
    let mut standing_in: Option<String> = None;
    let (endpoint, mut stamp) = match &config.tls {
        Some(tls) => {
            let (read, stamp) = tls.config();
            let tls_config = match (read, &kept.config) {
                (Ok(c), _) => {
                    kept.told = None;
                    c
                }
                // A rotation caught half-written, or one gone wrong: the agent goes on with
                // what worked, as an open stream does, rather than lose its manager (and its
                // jobs, once the manager counts the worker lost) over files it can wait for.
                (Err(e), Some(previous)) => {
                    let reason = e.to_string();
                    if kept.told.as_ref() != Some(&reason) {
                        warn!(error = %reason, "the TLS files cannot be used; connecting with the last ones that worked until the files change again");
                        kept.told = Some(reason.clone());
                    }
                    standing_in = Some(reason);
                    previous.clone()
                }
                (Err(e), None) => return Err(SessionError::Tls(e)),
            };
            let endpoint = tls
                .with(endpoint, tls_config.clone())
                .map_err(SessionError::Tls)?;
            using = Some(tls_config);
            (endpoint, Some(stamp))
        }
        None => (endpoint, None),
    };
    // A failure to connect or register with stand-in files is told as theirs.
    let stale = |e: SessionError| match &standing_in {
        Some(files) => SessionError::Stale {
            files: files.clone(),
            source: Box::new(e),
        },
        None => e,
    };
    let channel = (endpoint.connect().await)
        .map_err(SessionError::Connect)
        .map_err(stale)?;
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
    let mut inbound = (client.connect(ReceiverStream::new(rx)).await)
        .map_err(|s| stale(s.into()))?
        .into_inner();
    let registered = match tokio::time::timeout(config.register_timeout, inbound.message()).await {
        Err(_) => return Err(SessionError::RegisterTimeout(config.register_timeout)),
        Ok(Err(status)) => return Err(stale(status.into())),
        Ok(Ok(None)) => return Err(SessionError::Closed),
        Ok(Ok(Some(m))) => match m.kind {
            Some(ManagerKind::Registered(r)) => r,
            _ => return Err(SessionError::Protocol),
        },
    };
    info!(%worker, containers, manager = %registered.manager_id, policy = %registered.policy, "registered with manager");
    let acknowledges = registered.acknowledges;
    let metrics = &config.metrics;
    metrics.registrations.inc();
    metrics.sent(Some("register"));
    if let Some(worked) = using {
        kept.config = Some(worked);
    }
    status.send_modify(|s| {
        s.connected = true;
        s.registrations += 1;
        s.registered = Some(registered);
        s.last_error = None;
    });

    // What the last stream may have lost, in the order it was written, before anything
    // newer: the manager takes a repeated one as the late duplicate it is.
    for w in unacknowledged.waiting.iter_mut() {
        if tx.send(w.message.clone()).await.is_err() {
            return Err(SessionError::Closed);
        }
        w.after = *seq;
        metrics.resent.inc();
    }
    if !unacknowledged.waiting.is_empty() {
        info!(
            messages = unacknowledged.waiting.len(),
            "sent again what the manager had not acknowledged"
        );
    }
    if let Some(out) = carry.take() {
        write(&tx, out, *seq, unacknowledged, carry, metrics).await?;
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
                            close_gently(tx, &mut inbound, waiting, unacknowledged).await;
                            return Err(SessionError::Rotated);
                        }
                        Err(e) => {
                            warn!(error = %e, "certificate files changed but cannot be used; keeping the connection and the previous ones");
                            *seen = now;
                        }
                    }
                }
                *seq += 1;
                if !acknowledges {
                    // An older manager: a stream that stayed up for two heartbeats after a
                    // message is taken to have delivered it.
                    unacknowledged.acknowledged(seq.saturating_sub(2));
                }
                let mut hb = state.heartbeat();
                hb.seq = *seq;
                hb.unix_ms = crate::unix_ms(SystemTime::now());
                if tx.send(AgentMessage { kind: Some(AgentKind::Heartbeat(hb)) }).await.is_err() {
                    return Err(SessionError::Closed);
                }
                metrics.sent(Some("heartbeat"));
            }
            Some(out) = outbox.recv() => write(&tx, out, *seq, unacknowledged, carry, metrics).await?,
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
                    Some(ManagerKind::Ack(ack)) => unacknowledged.acknowledged(ack.heartbeat_seq),
                    Some(ManagerKind::Registered(_)) => debug!("ignoring a repeated Registered"),
                    None => debug!("ignoring an empty or newer manager message"),
                },
            },
        }
    }
}

/// Writes one message to the stream, after heartbeat `seq`; one the manager must get is kept
/// until acknowledged. A message the stream would not take is kept in `carry` for the next.
async fn write(
    tx: &mpsc::Sender<AgentMessage>,
    out: Outgoing,
    seq: u64,
    unacknowledged: &mut Unacknowledged,
    carry: &mut Option<Outgoing>,
    metrics: &SessionMetrics,
) -> Result<(), SessionError> {
    let kind = out.message.kind.as_ref().map(AgentKind::name);
    let kept = out.must_arrive().then(|| out.message.clone());
    if let Err(e) = tx.send(out.message).await {
        *carry = Some(Outgoing {
            message: e.0,
            delivered: out.delivered,
        });
        return Err(SessionError::Closed);
    }
    if let Some(message) = kept {
        unacknowledged.keep(message, out.delivered, seq, metrics);
    }
    metrics.sent(kind);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Status;

    /// A refusal of the agent's setup is told apart from a manager that cannot be reached,
    /// which all failures were logged as (at debug), so that an agent with a wrong
    /// certificate said nothing at its default level.
    #[test]
    fn a_refusal_is_told_apart_from_an_unreachable_manager() {
        let stream = SessionError::Stream;
        assert!(
            stream(Status::permission_denied(
                "this certificate is for worker w1"
            ))
            .is_refusal()
        );
        assert!(stream(Status::invalid_argument("worker_id: required")).is_refusal());
        assert!(!stream(Status::unavailable("connection refused")).is_refusal());
        assert!(!SessionError::Closed.is_refusal());
        let endpoint = tonic::transport::Endpoint::from_shared("not a uri").expect_err("bad");
        let own = SessionError::Endpoint {
            endpoint: "not a uri".into(),
            source: endpoint,
        };
        assert!(own.is_own_setup() && !own.is_refusal());
        assert!(!stream(Status::aborted(REPLACED)).is_refusal());
        assert!(stream(Status::aborted(REPLACED)).is_replaced());
        assert!(!stream(Status::aborted("something else")).is_replaced());
        // The layers below say TLS on one side only in their own words (checked against a
        // real manager by hand; here as they read).
        let frame = stream(Status::internal(
            "transport error: http2 error: connection error detected: frame with invalid size",
        ));
        assert!(
            frame
                .hint("http://m:7070")
                .is_some_and(|h| h.contains("https://"))
        );
        assert_eq!(frame.hint("https://m:7070"), None);
        let plain = stream(Status::unavailable(
            "received corrupt message of type InvalidContentType",
        ));
        assert!(
            plain
                .hint("https://m:7070")
                .is_some_and(|h| h.contains("http://"))
        );
        assert_eq!(
            stream(Status::unavailable("connection refused")).hint("http://m"),
            None
        );
        let second = stream(Status::already_exists(
            "worker w1 is connected from another agent",
        ));
        assert!(second.is_second_agent() && !second.is_refusal());
    }
}
