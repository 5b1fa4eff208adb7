//! The plain data the cluster core consumes and produces: what an agent says, what a worker
//! is told, what is recorded. The manager converts its wire types to and from these
//! (`converge_manager::wire`); the simulator builds them directly.

use std::collections::BTreeMap;

use converge_policy::cluster::Category;
use converge_policy::value::ValueCurve;
use serde::{Deserialize, Serialize};

/// A job's id: a UUID made by the shell (the manager) or a name (the simulator).
pub type JobId = Id;
/// A worker's id, as its agent registered it.
pub type WorkerId = Id;
/// A command's id: unique per manager incarnation (see [`super::Config::id_prefix`]).
pub type CommandId = Id;

/// Ids are shared, not copied ([`converge_policy::Id`]).
pub use converge_policy::Id;
/// One agent stream, numbered by the shell. A reconnecting agent gets a new one.
pub type ConnId = u64;
/// Time in seconds: Unix time for the manager, virtual time for the simulator.
pub type Time = f64;

/// What the decisions need to know of a job. The shell keeps the rest of what the user
/// submitted (image, args, env) and adds it to the `Start` commands it sends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct JobSpec {
    /// Human-readable name (may be empty).
    pub name: String,
    /// CPU cores requested (the reservation placement counts).
    pub cpus: f64,
    /// Memory requested, in bytes (0 = none).
    pub memory_bytes: u64,
    /// Value curve (value-based allocation), when the user gave one.
    pub value_curve: Option<ValueCurve>,
    /// Estimated run time on the reference worker, in seconds (0 = unknown).
    pub estimated_runtime_s: f64,
    /// Whether the metric is maximized (an accuracy) rather than minimized (a loss).
    pub maximize: bool,
    /// Stop at convergence: when the metric improves by less than this over a window, the job
    /// is checkpointed and stopped, and ends Completed.
    pub stop: Option<converge_policy::estimate::StopRule>,
}

/// Why a job is being moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MoveReason {
    /// SpeCon Alg. 2: converged on a shared worker.
    Speculative,
    /// SpeCon Alg. 3: evening out the cluster.
    Rebalance,
    /// The user drained its worker.
    Drain,
}

impl MoveReason {
    /// Short name for events, metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            MoveReason::Speculative => "speculative",
            MoveReason::Rebalance => "rebalance",
            MoveReason::Drain => "drain",
        }
    }

    /// Every reason, for a metric's series shown before the first move.
    pub const ALL: [MoveReason; 3] = [
        MoveReason::Speculative,
        MoveReason::Rebalance,
        MoveReason::Drain,
    ];
}

/// What the agent runs on its worker, decided by the cluster policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WorkerMode {
    /// No limits: containers compete freely within the worker's capacity.
    Free,
    /// FlowCon's elastic limits.
    FlowCon,
}

// ---- manager -> agent ----

/// A command to one worker's agent about one incarnation of a job.
#[derive(Debug, Clone, PartialEq)]
pub struct Command {
    /// Unique id; a repeated id is answered from the agent's cache, not acted on twice.
    pub id: CommandId,
    /// The job.
    pub job: JobId,
    /// The incarnation it is about; agents refuse stale epochs.
    pub epoch: u64,
    /// What to do.
    pub action: Action,
}

/// What a command asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Start an incarnation (a restore when its checkpoint directory holds a checkpoint).
    Start {
        /// CPU weight (Docker `--cpu-shares`); 0 = default.
        cpu_shares: u32,
    },
    /// Change the CPU limits of a running incarnation.
    SetLimits {
        /// Cores (0 = no limit).
        cpus: f64,
        /// CPU weight (0 = leave as is).
        cpu_shares: u32,
    },
    /// Checkpoint and stop (SIGTERM, killed past the deadline).
    Save {
        /// Milliseconds the container has to exit.
        deadline_ms: u32,
    },
    /// Freeze the container.
    Pause,
    /// Unfreeze it.
    Resume,
    /// Stop (and remove) the container.
    Stop {
        /// Why, for the agent's logs.
        reason: String,
        /// Kill it with no grace: an incarnation superseded by a newer one (restarted after
        /// its worker was lost), whose checkpoint on SIGTERM would overwrite the newer one's.
        discard: bool,
    },
}

impl Action {
    /// Short name for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Action::Start { .. } => "start",
            Action::SetLimits { .. } => "set_limits",
            Action::Save { .. } => "save",
            Action::Pause => "pause",
            Action::Resume => "resume",
            Action::Stop { .. } => "stop",
        }
    }
}

/// The answer to a registration: what the worker is to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Registered {
    /// The cluster policy's name.
    pub policy: &'static str,
    /// The worker-side algorithm.
    pub mode: WorkerMode,
    /// Whether the agent runs SpeCon's Alg. 1 and asks for migrations.
    pub migration: bool,
    /// How often the agent must send heartbeats, in seconds.
    pub heartbeat_interval: f64,
}

// ---- agent -> manager ----

/// The first message of an agent stream.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Register {
    /// Worker id.
    pub worker: WorkerId,
    /// Cores offered.
    pub cpu_capacity: f64,
    /// Memory offered (0 = unknown).
    pub memory_bytes: u64,
    /// Speed relative to the reference worker (≤ 0 means 1.0).
    pub calibration: f64,
    /// Free-form labels.
    pub labels: BTreeMap<String, String>,
    /// Changes when the agent process restarts.
    pub instance_id: String,
    /// Containers the agent runs (or that exited and are not yet reported).
    pub containers: Vec<ContainerReport>,
}

/// One container an agent found at registration.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerReport {
    /// Its job.
    pub job: JobId,
    /// Its incarnation.
    pub epoch: u64,
    /// Docker's id.
    pub container_id: String,
    /// Whether it still runs (created, running or paused).
    pub running: bool,
    /// Whether it is paused (frozen by its agent for a value policy's preemption).
    pub paused: bool,
    /// Last progress step the agent saw from it.
    pub last_step: Option<u64>,
    /// How it ended, when it has and its agent has said so (the `ContainerExited` that
    /// follows the registration, read with it: [`Core::reconcile`](super::Core)).
    pub exit: Option<ContainerExited>,
}

/// A message on an agent's stream after its `Register`.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentMessage {
    /// Alive, with its policy view of each job.
    Heartbeat(Heartbeat),
    /// Progress lines read from containers.
    Progress(ProgressBatch),
    /// The answer to a command.
    Result(CommandResult),
    /// A container ended.
    Exited(ContainerExited),
    /// SpeCon Alg. 1 line 16 on the worker: a converged job asks to be moved.
    MigrationRequest {
        /// The job.
        job: JobId,
        /// Its incarnation.
        epoch: u64,
        /// Why, in words.
        reason: String,
    },
}

impl AgentMessage {
    /// Short name for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            AgentMessage::Heartbeat(_) => "heartbeat",
            AgentMessage::Progress(_) => "progress",
            AgentMessage::Result(_) => "result",
            AgentMessage::Exited(_) => "exited",
            AgentMessage::MigrationRequest { .. } => "migration_request",
        }
    }
}

/// A heartbeat.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Heartbeat {
    /// The worker's policy view of each job it runs.
    pub jobs: Vec<JobStatus>,
    /// The worker's FlowCon threshold, when FlowCon runs there.
    pub alpha: Option<f64>,
    /// The worker's FlowCon interval, when FlowCon runs there.
    pub interval_s: Option<f64>,
}

/// One job as its worker's policy sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct JobStatus {
    /// The job.
    pub job: JobId,
    /// Its incarnation.
    pub epoch: u64,
    /// FlowCon/SpeCon category, if categorized yet.
    pub category: Option<Category>,
    /// Growth efficiency of the last round.
    pub growth_efficiency: Option<f64>,
    /// CPU limit as a fraction of the worker (None = unlimited).
    pub cpu_limit: Option<f64>,
    /// Cores used on average over the last interval.
    pub cpu_usage: f64,
}

/// Progress read from containers since the last batch.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ProgressBatch {
    /// Samples, in the order read.
    pub samples: Vec<ProgressSample>,
    /// Lines that could not be read, counted per job.
    pub malformed: Vec<Malformed>,
}

/// One progress line.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ProgressSample {
    /// The job.
    pub job: JobId,
    /// Its incarnation.
    pub epoch: u64,
    /// When the agent read it (Unix milliseconds, for users).
    pub unix_ms: i64,
    /// The step.
    pub step: u64,
    /// The job's step budget, when it says.
    pub total_steps: Option<u64>,
    /// The metric's value.
    pub value: Option<f64>,
    /// The line reports a checkpoint saved (or restored) at `step`.
    pub checkpointed: bool,
}

/// Malformed progress lines of one incarnation.
#[derive(Debug, Clone, PartialEq)]
pub struct Malformed {
    /// The job.
    pub job: JobId,
    /// Its incarnation.
    pub epoch: u64,
    /// How many.
    pub count: u64,
}

/// The answer to a command.
#[derive(Debug, Clone, PartialEq)]
pub struct CommandResult {
    /// The command answered.
    pub command: CommandId,
    /// Its job.
    pub job: JobId,
    /// Its epoch.
    pub epoch: u64,
    /// Whether it was carried out.
    pub ok: bool,
    /// What failed, when not ok.
    pub error: String,
    /// What it produced.
    pub detail: ResultDetail,
}

/// What a successful command produced.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum ResultDetail {
    /// Nothing to report.
    #[default]
    None,
    /// A container was started.
    Started {
        /// Docker's id.
        container_id: String,
    },
    /// A checkpoint was saved and the container stopped.
    Saved {
        /// The step saved.
        step: u64,
        /// Checkpoint size.
        checkpoint_bytes: u64,
        /// From the Save to the container's exit, in milliseconds.
        save_ms: u64,
        /// The container ignored SIGTERM and was killed: it resumes from its last periodic
        /// checkpoint.
        killed: bool,
    },
}

/// A container ended.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ContainerExited {
    /// The job.
    pub job: JobId,
    /// Its incarnation.
    pub epoch: u64,
    /// Exit code.
    pub exit_code: i32,
    /// Killed for memory.
    pub oom_killed: bool,
    /// The job printed its final `done` line.
    pub done: bool,
    /// Its last step.
    pub last_step: Option<u64>,
    /// The exit was asked for (save, stop, the agent's self-fencing).
    pub requested: bool,
    /// When it failed: the last lines of its stderr (bounded by the agent).
    pub stderr_tail: String,
}

// ---- what is recorded ----

/// A job's lifecycle state, without its data (for events, filters and the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum JobState {
    /// Waiting to be placed.
    Pending,
    /// A Start was sent; no answer yet.
    Starting,
    /// An incarnation runs.
    Running,
    /// Being saved on one worker to be restored on another.
    Migrating,
    /// Its worker stopped answering.
    Lost,
    /// Frozen by a value policy.
    Paused,
    /// Converged by its stopping rule: being checkpointed and stopped.
    Stopping,
    /// Exited 0 (terminal).
    Completed,
    /// Ended in error (terminal).
    Failed,
    /// Cancelled by the user (terminal).
    Cancelled,
    /// Refused at admission by a value policy (terminal).
    Rejected,
    /// Admitted (queued, or run), then given up by a value policy: its value reached zero,
    /// it was preempted for good, or, lost with its worker, it was turned away when placed
    /// again (terminal). Told apart from `Rejected`, refused at submission: a walk read a job
    /// that had run for minutes as "rejected".
    Dropped,
}

impl JobState {
    /// Whether nothing can follow.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Completed
                | JobState::Failed
                | JobState::Cancelled
                | JobState::Rejected
                | JobState::Dropped
        )
    }

    /// Lower-case name.
    pub fn label(self) -> &'static str {
        match self {
            JobState::Pending => "pending",
            JobState::Starting => "starting",
            JobState::Running => "running",
            JobState::Migrating => "migrating",
            JobState::Lost => "lost",
            JobState::Paused => "paused",
            JobState::Stopping => "stopping",
            JobState::Completed => "completed",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
            JobState::Rejected => "rejected",
            JobState::Dropped => "dropped",
        }
    }
}

/// A worker's state, without its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WorkerState {
    /// Takes new work.
    Ready,
    /// Takes no new work; its jobs move away.
    Draining,
    /// Missed its heartbeats.
    Lost,
}

impl WorkerState {
    /// Lower-case name, as the CLI shows it.
    pub fn label(self) -> &'static str {
        match self {
            WorkerState::Ready => "ready",
            WorkerState::Draining => "draining",
            WorkerState::Lost => "lost",
        }
    }
}

/// What kind of thing an [`Event`] records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    /// A job changed state.
    JobState,
    /// A job was given a worker.
    JobPlaced,
    /// A step of a move.
    Migration,
    /// A job's CPU limit or weight was set (by `converge` or `las`), and why.
    Limits,
    /// A worker changed state or connection.
    WorkerState,
    /// A container found running where its job no longer runs was stopped (its epoch is the
    /// stray's).
    Stray,
}

/// One entry of the event log (the shell numbers them).
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// What happened.
    pub kind: EventKind,
    /// The job, if about one.
    pub job: Option<JobId>,
    /// The worker, if about one.
    pub worker: Option<WorkerId>,
    /// The job's epoch then.
    pub epoch: u64,
    /// The job's state before (JobState events).
    pub from: Option<JobState>,
    /// The job's state after (JobState events).
    pub to: Option<JobState>,
    /// The worker's state after (WorkerState events).
    pub worker_state: Option<WorkerState>,
    /// Why, in words a user reads.
    pub reason: String,
    /// Structured details (scores, step, downtime, outcome, ...).
    pub attributes: BTreeMap<String, String>,
}

impl Event {
    /// An event of `kind` with nothing filled in.
    pub fn new(kind: EventKind, reason: impl Into<String>) -> Self {
        Event {
            kind,
            job: None,
            worker: None,
            epoch: 0,
            from: None,
            to: None,
            worker_state: None,
            reason: reason.into(),
            attributes: BTreeMap::new(),
        }
    }
}
