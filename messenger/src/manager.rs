//! The manager's end of the agent streams.
//!
//! [`AgentStreams`] implements the tonic `AgentService`. For every `Connect` it waits for the
//! agent's `Register`, gives the stream a [`ConnectionId`] and an outbound [`AgentLink`], and
//! spawns one task that forwards every inbound message as a [`StreamEvent`] on a single
//! channel to the manager actor. When the stream ends — closed, broken, or the task's send
//! failing — the task sends [`StreamEvent::Disconnected`]: the actor learns of every
//! disconnect explicitly and in order with the stream's other messages.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};
use tracing::{Instrument, debug, info_span, warn};

use crate::pb::agent_message::Kind as AgentKind;
use crate::pb::agent_service_server::AgentService;
use crate::pb::manager_message::Kind as ManagerKind;
use crate::pb::{AgentMessage, Command, ManagerMessage, Register};

/// Identifies one stream; a reconnecting agent gets a new one, so a late message from its old
/// stream can be told apart from the new stream's.
pub type ConnectionId = u64;

/// How long a new stream may take to send its `Register`.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(10);

/// HTTP/2 flow-control window of each agent connection and stream, in bytes: what one agent
/// may have in flight to a manager that is not reading yet. hyper's default (1 MiB each) let a
/// manager behind on 1,000 saturating agents buffer 1.9 GB; 64 KiB holds ~1,000 progress
/// messages per agent, keeps loopback throughput (measured in `docs/performance.md`), and
/// makes a busy manager slow its agents down instead of growing.
pub const WINDOW_BYTES: u32 = 64 * 1024;

/// Outbound messages per stream that may wait for a slow agent before sends fail.
const OUTBOUND_CAPACITY: usize = 1024;

/// What happens on the agent streams, in order per stream.
#[derive(Debug)]
pub enum StreamEvent {
    /// An agent opened a stream and registered; `link` sends to it.
    Connected {
        /// This stream.
        conn: ConnectionId,
        /// What the agent said about itself.
        register: Register,
        /// Outbound half of the stream.
        link: AgentLink,
    },
    /// A message other than `Register` arrived.
    Message {
        /// The stream it came on.
        conn: ConnectionId,
        /// The message kind.
        kind: AgentKind,
    },
    /// The stream ended; nothing more will come from `conn`.
    Disconnected {
        /// The stream that ended.
        conn: ConnectionId,
        /// Why, for a person.
        reason: String,
    },
}

/// Sends to one agent's stream.
#[derive(Clone, Debug)]
pub struct AgentLink {
    conn: ConnectionId,
    tx: mpsc::Sender<Result<ManagerMessage, Status>>,
    /// Ends the stream both ways: the commands still queued are not sent, nothing more is
    /// read. A link given up (its queue full) must end its stream: left open, the agent
    /// would go on talking into a stream whose every message the core refuses as stale, and
    /// be declared lost while it heartbeats.
    ended: CancellationToken,
}

/// The agent's stream is gone (or so backed up that it is as good as gone).
#[derive(Debug, thiserror::Error)]
#[error("agent stream {0} is closed or full")]
pub struct LinkClosed(pub ConnectionId);

impl AgentLink {
    /// A link for stream `conn` holding up to `capacity` messages, and what it sends as it
    /// comes: [`AgentStreams`] answers a stream with the receiver; a manager's tests read it
    /// as the agent would.
    pub fn channel(
        conn: ConnectionId,
        capacity: usize,
    ) -> (Self, mpsc::Receiver<Result<ManagerMessage, Status>>) {
        let (tx, rx) = mpsc::channel(capacity);
        let link = Self {
            conn,
            tx,
            ended: CancellationToken::new(),
        };
        (link, rx)
    }

    /// The stream this link sends on.
    pub fn conn(&self) -> ConnectionId {
        self.conn
    }

    /// Sends a command without waiting: the manager actor must never block on one slow agent.
    pub fn send_command(&self, cmd: Command) -> Result<(), LinkClosed> {
        self.send(ManagerKind::Command(cmd))
    }

    /// Sends any manager message without waiting. When the stream's queue is full the link
    /// is given up, and its stream ended: the agent reconnects and registers again.
    pub fn send(&self, kind: ManagerKind) -> Result<(), LinkClosed> {
        self.tx
            .try_send(Ok(ManagerMessage { kind: Some(kind) }))
            .map_err(|_| {
                self.ended.cancel();
                LinkClosed(self.conn)
            })
    }

    /// Ends the stream with an error status the agent will see (e.g. a duplicate worker id),
    /// after what is queued; with no room for the status, at once.
    pub fn close_with(&self, status: Status) {
        if self.tx.try_send(Err(status)).is_err() {
            self.ended.cancel();
        }
    }
}

/// The tonic service: hand it to a `Server` with `AgentServiceServer::new(streams)`.
#[derive(Clone)]
pub struct AgentStreams {
    events: mpsc::Sender<StreamEvent>,
    next_conn: Arc<AtomicU64>,
    /// Refuse streams without a client certificate, and `Register`s for a worker the
    /// certificate does not name (`crate::tls`).
    require_certificate: bool,
    /// Most messages per second taken from one agent's stream: past it the stream is read
    /// more slowly (HTTP/2 flow control holds that agent back), so that one agent's flood
    /// cannot fill the queue every agent shares.
    per_agent_rate: Option<std::num::NonZeroU32>,
}

impl AgentStreams {
    /// A service that reports every stream's life on `events`.
    pub fn new(events: mpsc::Sender<StreamEvent>) -> Self {
        Self {
            events,
            next_conn: Arc::new(AtomicU64::new(1)),
            require_certificate: false,
            per_agent_rate: None,
        }
    }

    /// Reads at most `per_second` messages a second from each agent (burst: one second's).
    pub fn per_agent_rate(mut self, per_second: std::num::NonZeroU32) -> Self {
        self.per_agent_rate = Some(per_second);
        self
    }

    /// Only agents with a client certificate of the cluster CA, each for the worker it names.
    pub fn require_certificates(mut self) -> Self {
        self.require_certificate = true;
        self
    }
}

#[tonic::async_trait]
impl AgentService for AgentStreams {
    type ConnectStream =
        std::pin::Pin<Box<dyn Stream<Item = Result<ManagerMessage, Status>> + Send + 'static>>;

    async fn connect(
        &self,
        request: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        let peer = request
            .remote_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        // Before any message is read: who the TLS handshake says this is.
        let names = if self.require_certificate {
            let leaf = request
                .peer_certs()
                .and_then(|certs| certs.first().map(|c| crate::tls::names(c.as_ref())));
            match leaf {
                Some(names) if !names.is_empty() => Some(names),
                _ => {
                    warn!(%peer, "agent stream refused: no client certificate");
                    return Err(Status::unauthenticated(
                        "agents must present a client certificate of the cluster CA naming their worker",
                    ));
                }
            }
        } else {
            None
        };
        let mut inbound = request.into_inner();
        let register = match tokio::time::timeout(REGISTER_TIMEOUT, inbound.message()).await {
            Err(_) => {
                return Err(Status::deadline_exceeded(
                    "send Register as the first message of the stream",
                ));
            }
            Ok(Err(status)) => return Err(status),
            Ok(Ok(None)) => return Err(Status::cancelled("stream closed before Register")),
            Ok(Ok(Some(AgentMessage {
                kind: Some(AgentKind::Register(r)),
            }))) => r,
            Ok(Ok(Some(_))) => {
                return Err(Status::failed_precondition(
                    "the first message of the stream must be Register",
                ));
            }
        };
        if register.worker_id.is_empty() {
            return Err(Status::invalid_argument(
                "Register.worker_id must not be empty",
            ));
        }
        if let Some(names) = &names
            && !names.contains(&register.worker_id)
        {
            warn!(%peer, worker = %register.worker_id, certificate = ?names, "agent stream refused: registering as a worker its certificate does not name");
            return Err(Status::permission_denied(format!(
                "this certificate is for worker {}; it may not register as {}",
                names[0], register.worker_id
            )));
        }
        let conn = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let (link, rx) = AgentLink::channel(conn, OUTBOUND_CAPACITY);
        let ended = link.ended.clone();
        let span = info_span!("agent_stream", conn, worker = %register.worker_id, %peer);
        let events = self.events.clone();
        events
            .send(StreamEvent::Connected {
                conn,
                register,
                link,
            })
            .await
            .map_err(|_| Status::unavailable("manager is shutting down"))?;
        let limiter = self
            .per_agent_rate
            .map(|r| governor::RateLimiter::direct(governor::Quota::per_second(r)));
        let reading = ended.clone();
        tokio::spawn(
            async move {
                let reason = loop {
                    if let Some(l) = &limiter {
                        l.until_ready().await;
                    }
                    let message = tokio::select! {
                        _ = reading.cancelled() => break "ended by the manager".to_string(),
                        m = inbound.message() => m,
                    };
                    match message {
                        Ok(Some(AgentMessage { kind: Some(kind) })) => {
                            if events
                                .send(StreamEvent::Message { conn, kind })
                                .await
                                .is_err()
                            {
                                return; // the manager is gone; nobody to tell
                            }
                        }
                        Ok(Some(AgentMessage { kind: None })) => {
                            debug!("ignoring an empty or newer agent message");
                        }
                        // Also what a connection cut or a paused agent ends in (its keepalive times
                        // out): "the agent closed it" blamed an agent that did nothing.
                        Ok(None) => break "the stream ended (the agent closed it, or its connection was lost)".to_string(),
                        Err(status) => break format!("stream error: {}", status.message()),
                    }
                };
                let _ = events
                    .send(StreamEvent::Disconnected { conn, reason })
                    .await;
            }
            .instrument(span),
        );
        let outbound = ReceiverStream::new(rx).take_until(ended.cancelled_owned());
        Ok(Response::new(Box::pin(outbound)))
    }
}
