//! The node core's plain data: its configuration, what goes in ([`NodeInput`]) and what comes
//! out ([`NodeEffect`]). The agent converts its protobuf messages to and from these; the
//! simulator builds them from its modelled containers.

use std::collections::BTreeMap;

use converge_policy::cluster::Category;
use converge_policy::flowcon::{FlowConConfig, FlowConDecisions};
use converge_policy::growth::Direction;
use converge_policy::specon::SpeConConfig;
use serde::{Deserialize, Serialize};

/// Seconds since an origin the shell picks (the agent: when its executor started; the
/// simulator: time zero). Only differences matter.
pub type Time = f64;

/// Command results remembered for answering repeated command ids.
pub const RESULT_CACHE: usize = 4096;

/// Save deadline when a `Save` command sets none, seconds. The protocol gives no default; an
/// unset deadline gets Docker's own stop timeout scale rather than an immediate kill that
/// would lose the checkpoint.
pub const DEFAULT_SAVE_DEADLINE: Time = 30.0;

/// What one worker's core runs with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeConfig {
    /// The worker's id (it appears in refusals, so a manager's log says which worker refused).
    pub worker_id: String,
    /// The worker's CPU capacity, in cores.
    pub capacity: f64,
    /// FlowCon's parameters, used while the manager asks for FlowCon.
    pub flowcon: FlowConConfig,
    /// SpeCon's parameters, used while the manager migrates.
    pub specon: SpeConConfig,
    /// Self-fencing: after this long without a manager, checkpoint and stop every job
    /// container, seconds; 0 = never.
    pub fence_after: Time,
    /// The deadline of a fencing checkpoint (SIGTERM, then kill), seconds.
    pub fence_deadline: Time,
    /// A `Stop`'s grace between SIGTERM and SIGKILL, seconds.
    pub stop_grace: Time,
    /// Keep exited containers (unless a `Stop` asked to remove them).
    pub keep_exited: bool,
    /// Command results remembered for repeated ids.
    pub result_cache: usize,
}

impl NodeConfig {
    /// A worker of `capacity` cores with the defaults the agent's command line has.
    pub fn new(worker_id: impl Into<String>, capacity: f64) -> Self {
        NodeConfig {
            worker_id: worker_id.into(),
            capacity,
            flowcon: FlowConConfig::default(),
            specon: SpeConConfig::default(),
            fence_after: 30.0,
            fence_deadline: 10.0,
            stop_grace: 10.0,
            keep_exited: false,
            result_cache: RESULT_CACHE,
        }
    }
}

/// What the worker runs, from the manager's last registration answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mode {
    /// FlowCon's elastic limits; otherwise containers compete freely within the capacity.
    pub flowcon: bool,
    /// SpeCon's Alg. 1 runs and converged jobs ask to be migrated.
    pub migration: bool,
}

/// A command from the manager, decoded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Command {
    /// Unique per command; a repeat is answered from the cache.
    pub id: String,
    /// The job.
    pub job_id: String,
    /// The incarnation the command is about.
    pub epoch: u64,
    /// What to do.
    pub action: Action,
}

/// What a command asks for (the parts the decisions read; the shell keeps the rest, e.g. the
/// image and environment of a `Start`, for the effect it carries out).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Action {
    /// Start the incarnation (from its checkpoint if there is one).
    Start {
        /// The metric's direction as the job's spec gives it (a direction on the progress
        /// lines takes precedence).
        direction: Option<Direction>,
        /// The cores it asks for (0 = no limit): the container starts with
        /// [`converge_policy::limits::clamp_cpus`] of it.
        cpus: f64,
    },
    /// Set the container's CPU limit.
    SetLimits {
        /// Cores; 0 = no limit.
        cpus: f64,
        /// CFS shares; 0 = leave as is.
        cpu_shares: u32,
    },
    /// Freeze the container.
    Pause,
    /// Unfreeze it.
    Resume,
    /// Stop it (SIGTERM, grace, SIGKILL).
    Stop {
        /// Remove the container once its exit is reported, even when exited ones are kept.
        remove: bool,
        /// Why, for the log.
        reason: String,
        /// SIGKILL at once, no grace: a superseded incarnation, which must write no checkpoint.
        discard: bool,
    },
    /// Checkpoint and stop it (SIGTERM, wait up to the deadline, then kill).
    Save {
        /// Seconds; `None` or 0 = [`DEFAULT_SAVE_DEADLINE`].
        deadline: Option<Time>,
    },
    /// A command with no action the agent knows (a newer manager): refused.
    Unknown,
}

impl Action {
    /// Short name for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Action::Start { .. } => "start",
            Action::SetLimits { .. } => "set_limits",
            Action::Pause => "pause",
            Action::Resume => "resume",
            Action::Stop { .. } => "stop",
            Action::Save { .. } => "save",
            Action::Unknown => "none",
        }
    }
}

/// What a successful command produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Detail {
    /// A `Start`.
    Started {
        /// The container.
        container_id: String,
        /// Whether it found a checkpoint to resume from.
        from_checkpoint: bool,
    },
    /// A `SetLimits`.
    Limits {
        /// Cores now in force.
        cpus: f64,
        /// Shares now in force (0 = unchanged).
        cpu_shares: u32,
    },
    /// A `Save`.
    Saved {
        /// The checkpoint's directory, relative to the checkpoint root.
        checkpoint_dir: String,
        /// Its size.
        checkpoint_bytes: u64,
        /// The step it holds.
        step: u64,
        /// The container ignored SIGTERM past the deadline and was killed.
        killed: bool,
        /// From SIGTERM to the exit.
        save_ms: u64,
    },
}

/// A command's outcome, echoing its id, job and epoch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommandResult {
    /// The command.
    pub command_id: String,
    /// Its job.
    pub job_id: String,
    /// Its epoch.
    pub epoch: u64,
    /// Whether it did what it asked.
    pub ok: bool,
    /// Why not.
    pub error: String,
    /// An answer from the cache to a repeated id.
    pub replayed: bool,
    /// What it produced.
    pub detail: Option<Detail>,
}

impl CommandResult {
    /// The result of `cmd` with this outcome.
    pub fn of(cmd: &Command, outcome: Result<Option<Detail>, String>) -> Self {
        Self::new(&cmd.id, &cmd.job_id, cmd.epoch, outcome)
    }

    /// A result from its parts.
    pub fn new(
        command_id: &str,
        job_id: &str,
        epoch: u64,
        outcome: Result<Option<Detail>, String>,
    ) -> Self {
        let (ok, error, detail) = match outcome {
            Ok(d) => (true, String::new(), d),
            Err(e) => (false, e, None),
        };
        CommandResult {
            command_id: command_id.to_string(),
            job_id: job_id.to_string(),
            epoch,
            ok,
            error,
            replayed: false,
            detail,
        }
    }
}

/// A container's state as the shell found it when (re)adopting it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Found {
    /// Running (or restarting).
    Running,
    /// Paused.
    Paused,
    /// Created but never started: a previous agent died between create and start.
    Created,
    /// Exited while no agent watched it.
    Exited,
}

/// One progress sample of a job: its metric at a time, and the step it reached.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ProgressSample {
    /// When it was observed (the agent: when it read the line).
    pub time: Time,
    /// The job's step.
    pub step: u64,
    /// The evaluation function's value.
    pub value: f64,
}

/// One thing that happened on the worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum NodeInput {
    /// A command from the manager.
    Command(Command),
    /// A Docker action an effect asked for with a command id finished.
    Done {
        /// The command.
        command_id: String,
        /// What it produced, or why it failed.
        outcome: Result<Option<Detail>, String>,
    },
    /// A container found on the worker at startup (labelled with this worker).
    Adopted {
        /// The container.
        container_id: String,
        /// Its job.
        job_id: String,
        /// Its epoch.
        epoch: u64,
        /// Its state.
        found: Found,
        /// The CPU limit it runs with, cores (None: none or unknown).
        cpu_limit: Option<f64>,
    },
    /// A container started (Docker's `start` event).
    Started {
        /// The container.
        container_id: String,
    },
    /// A container died (Docker's `die` event).
    Died {
        /// The container.
        container_id: String,
        /// Its exit code, if the event said.
        exit_code: Option<i32>,
    },
    /// A container's exit was reported and it is gone: forget it.
    Gone {
        /// The container.
        container_id: String,
    },
    /// A container's cumulative CPU time, read at the step's time.
    Usage {
        /// The container.
        container_id: String,
        /// CPU-seconds used since it started.
        cpu_seconds: f64,
    },
    /// A container's latest progress.
    Progress {
        /// The container.
        container_id: String,
        /// The sample.
        sample: ProgressSample,
        /// The metric's value at the start of this incarnation, which progress is normalized
        /// by (None: the first value given here).
        initial_value: Option<f64>,
        /// The metric's direction if the job said (overrides the spec's).
        direction: Option<Direction>,
    },
    /// A limit update an effect asked for (no command id) failed: the limit in force is
    /// unknown, so the next round sends it again.
    LimitFailed {
        /// The container.
        container_id: String,
    },
    /// The stream to the manager went up or down; `mode` is what its last registration
    /// answer asked for (None: not registered yet).
    Session {
        /// A stream is up.
        connected: bool,
        /// The worker policy asked for.
        mode: Option<Mode>,
    },
    /// The timer the last [`NodeEffect::Wake`] asked for (early or late ticks are harmless).
    Tick,
}

impl NodeInput {
    /// Short name for logs.
    pub fn name(&self) -> &'static str {
        match self {
            NodeInput::Command(_) => "command",
            NodeInput::Done { .. } => "done",
            NodeInput::Adopted { .. } => "adopted",
            NodeInput::Started { .. } => "started",
            NodeInput::Died { .. } => "died",
            NodeInput::Gone { .. } => "gone",
            NodeInput::Usage { .. } => "usage",
            NodeInput::Progress { .. } => "progress",
            NodeInput::LimitFailed { .. } => "limit_failed",
            NodeInput::Session { .. } => "session",
            NodeInput::Tick => "tick",
        }
    }
}

/// Something the shell does with Docker. Those with a `command` report back with
/// [`NodeInput::Done`]; the others do not (a failed limit update reports
/// [`NodeInput::LimitFailed`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum DockerAction {
    /// Create and start the command's incarnation (the shell has the full spec); the outcome
    /// is a [`Detail::Started`].
    Create {
        /// The `Start` command.
        command: String,
        /// The job.
        job_id: String,
        /// The epoch.
        epoch: u64,
    },
    /// Set a container's CPU quota.
    UpdateCpus {
        /// The `SetLimits` command, or None for a policy round's limit.
        command: Option<String>,
        /// The container.
        container_id: String,
        /// Cores (already within the worker and above Docker's minimum).
        cpus: f64,
        /// CFS shares to set too.
        cpu_shares: Option<u32>,
    },
    /// Freeze a container.
    Pause {
        /// The command.
        command: String,
        /// The container.
        container_id: String,
    },
    /// Unfreeze a container.
    Resume {
        /// The command.
        command: String,
        /// The container.
        container_id: String,
    },
    /// Stop a container: unpause it if paused, SIGTERM, SIGKILL after `grace`; with no grace
    /// (0), SIGKILL alone.
    Stop {
        /// The command.
        command: String,
        /// The container.
        container_id: String,
        /// Seconds between SIGTERM and SIGKILL.
        grace: Time,
    },
    /// Checkpoint and stop a container: unpause, SIGTERM, wait for the exit up to `deadline`,
    /// else kill; the outcome is a [`Detail::Saved`].
    Save {
        /// The command, or None when the worker fences itself.
        command: Option<String>,
        /// The container.
        container_id: String,
        /// Seconds.
        deadline: Time,
    },
    /// Remove a container that was created but never started.
    Remove {
        /// The container.
        container_id: String,
    },
}

/// What a command's arrival came to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Answer {
    /// Executed (now, or after its Docker action reported): send the result.
    Result(CommandResult),
    /// A repeated id: send the earlier result again (marked `replayed`).
    Replay(CommandResult),
    /// Older than its job's newest epoch: refused; send the result.
    Stale(CommandResult),
    /// A repeated id whose first arrival still runs: nothing to send, its result follows.
    InFlight {
        /// The command.
        command_id: String,
    },
}

/// What started a FlowCon round.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RoundTrigger {
    /// FlowCon's interval elapsed.
    Interval,
    /// A job's container started (Alg. 2 lines 5-9).
    Started {
        /// The job.
        job_id: String,
    },
    /// A job's container died (Alg. 2 lines 10-17).
    Died {
        /// The job.
        job_id: String,
    },
    /// The manager's registration turned FlowCon on.
    PolicyChanged,
}

/// One container's quota after a FlowCon round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Target {
    /// The job.
    pub job_id: String,
    /// Its container.
    pub container_id: String,
    /// Docker CPUs ([`converge_policy::limits::cpu_quotas`]).
    pub cpus: f64,
    /// Whether this differs from the limit in force (an `UpdateCpus` was emitted).
    pub changed: bool,
}

/// What one FlowCon round decided.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowConRound {
    /// What started it.
    pub trigger: RoundTrigger,
    /// The policy's decisions.
    pub decisions: FlowConDecisions,
    /// Every container's quota.
    pub targets: Vec<Target>,
    /// The CPU use each job was measured at over the interval, as a fraction of the worker.
    pub usage: BTreeMap<String, f64>,
}

/// A job's state in the worker's policy rounds, as heartbeats report it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobPolicy {
    /// The job.
    pub job_id: String,
    /// The incarnation.
    pub epoch: u64,
    /// FlowCon's list, or SpeCon's category when FlowCon does not run.
    pub category: Category,
    /// FlowCon's growth efficiency (None until measured, and under SpeCon alone).
    pub growth_efficiency: Option<f64>,
}

/// What heartbeats report of the policy rounds, whole (replaces the previous one).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PolicyStatus {
    /// By job, ordered by job id.
    pub jobs: Vec<JobPolicy>,
    /// FlowCon's threshold α and interval (seconds), while FlowCon runs.
    pub flowcon: Option<(f64, f64)>,
}

/// A container exit to report to the manager.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExitToReport {
    /// The container.
    pub container_id: String,
    /// Its job.
    pub job_id: String,
    /// Its epoch.
    pub epoch: u64,
    /// The exit code the die event gave (the shell may know better).
    pub exit_code: Option<i32>,
    /// A Stop, a Save or fencing asked for this exit: not a failure of the job.
    pub requested: bool,
    /// Remove the container once reported.
    pub remove: bool,
}

/// A converged job asking to be moved (SpeCon Alg. 1 line 16, "Request-Reallocation").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MigrationRequest {
    /// The job.
    pub job_id: String,
    /// Its incarnation.
    pub epoch: u64,
    /// Why, in words.
    pub reason: String,
}

/// Something the shell carries out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum NodeEffect {
    /// Act on Docker.
    Docker(DockerAction),
    /// Answer a command (send the result to the manager, unless in flight).
    Answer(Answer),
    /// Report a container's exit to the manager, then (if `remove`) remove the container,
    /// then tell the core with [`NodeInput::Gone`].
    ReportExit(ExitToReport),
    /// Ask the manager to move a converged job.
    RequestMigration(MigrationRequest),
    /// A FlowCon round ran (its `UpdateCpus` effects precede this one in the same step).
    Round(FlowConRound),
    /// A SpeCon categorization ran (for logs and metrics); its `RequestMigration` effects
    /// follow.
    SpeConRound {
        /// Migration requests it made.
        requests: usize,
    },
    /// The heartbeat's policy state changed.
    Publish(PolicyStatus),
    /// The worker fences itself: no manager for `fence_after` seconds. The `Save` effects of
    /// the containers follow.
    Fencing {
        /// Containers being checkpointed and stopped.
        containers: usize,
    },
    /// The worker policy changed.
    ModeChanged(Mode),
    /// The last effect of every step: when to send the next [`NodeInput::Tick`] (None: no
    /// timer needed until the next input).
    Wake {
        /// The time.
        at: Option<Time>,
    },
}
