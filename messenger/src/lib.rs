//! SpeCon's *Messenger*: everything that crosses the wire between agents and the manager.
//!
//! - [`pb`]: the generated `converge.v1` types and services (`proto/converge/v1/*.proto`), and
//!   the descriptor set server reflection serves.
//! - [`agent`]: the agent's side of its one bidirectional stream: connect, register, heartbeat
//!   every interval, forward what the agent's components queue, deliver commands, and on any
//!   failure reconnect with exponential backoff and jitter, registering again with the
//!   containers it runs now.
//! - [`manager`]: the manager's side: a tonic `AgentService` that turns each stream into a task
//!   and every stream's life into [`manager::StreamEvent`]s on one channel — including the
//!   disconnect, which is an event, not a log line.
//! - [`backoff`]: the reconnect schedule. [`trace`]: W3C trace context carried in commands.
//! - [`telemetry`]: logs, OTLP trace export and the `/metrics` endpoint both binaries use.
//! - [`config_file`]: how the binaries read their settings (flags, `CONVERGE_*` variables, a
//!   TOML file), shared here as `telemetry` is, by the manager, the agent and `convergectl`.
//!
//! Start with [`agent::Session`] and [`manager::AgentStreams`]: they are the two ends of one
//! stream.

pub mod agent;
pub mod backoff;
pub mod config_file;
pub mod manager;
pub mod telemetry;
pub mod tls;
pub mod trace;

/// Generated protocol types (`package converge.v1`).
#[allow(missing_docs, clippy::all)]
pub mod pb {
    tonic::include_proto!("converge.v1");

    /// Encoded descriptors of every converge.v1 file, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("converge_descriptor");
}

impl pb::agent_message::Kind {
    /// The kind's name, as metrics label it (`heartbeat`, `progress`, ...).
    pub fn name(&self) -> &'static str {
        use pb::agent_message::Kind as K;
        match self {
            K::Register(_) => "register",
            K::Heartbeat(_) => "heartbeat",
            K::Progress(_) => "progress",
            K::Usage(_) => "usage",
            K::Result(_) => "result",
            K::Exited(_) => "exited",
            K::MigrationRequest(_) => "migration_request",
            K::Logs(_) => "logs",
        }
    }
}

impl pb::command::Action {
    /// The action's name, as metrics and spans label it (`start`, `save`, ...).
    pub fn name(&self) -> &'static str {
        use pb::command::Action as A;
        match self {
            A::Start(_) => "start",
            A::SetLimits(_) => "set_limits",
            A::Save(_) => "save",
            A::Pause(_) => "pause",
            A::Resume(_) => "resume",
            A::Stop(_) => "stop",
        }
    }
}

impl pb::JobState {
    /// The short name people read in logs, tables and events ("running", "completed").
    pub fn label(self) -> &'static str {
        match self {
            Self::Unspecified => "unspecified",
            Self::Pending => "pending",
            Self::Starting => "starting",
            Self::Running => "running",
            Self::Migrating => "migrating",
            Self::Paused => "paused",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
            Self::Lost => "lost",
            Self::Rejected => "rejected",
            Self::Stopping => "stopping",
            Self::Dropped => "dropped",
        }
    }

    /// Whether a job in wire state `state` has ended for good (nothing will run it again).
    pub fn ended(state: i32) -> bool {
        matches!(
            Self::try_from(state),
            Ok(Self::Completed | Self::Failed | Self::Cancelled | Self::Rejected | Self::Dropped)
        )
    }

    /// [`pb::JobState::label`] of a wire value; an unknown one is shown as its number.
    pub fn label_of(state: i32) -> String {
        Self::try_from(state).map_or_else(|_| state.to_string(), |s| s.label().to_string())
    }
}

/// The response header of a `WatchEvents` stream that names the manager's event log: kept
/// across restarts with a state store, new at every start without one. A watcher that finds
/// another name after a reconnect knows the events were numbered from 1 again.
pub const EVENT_LOG_HEADER: &str = "converge-event-log";

/// Milliseconds since the Unix epoch, the wire's timestamp unit.
pub fn unix_ms(t: std::time::SystemTime) -> i64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
