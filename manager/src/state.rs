//! The cluster state the manager actor owns: workers and jobs. Plain data; the actor is the
//! only writer, and the wire views (`to_pb`) are copies.

use std::collections::{BTreeMap, VecDeque};

use converge_messenger::manager::AgentLink;
use converge_messenger::pb::{self, JobSpec, JobState, WorkerState};
use tokio::time::Instant;

/// One worker, as registered by its agent.
#[derive(Debug)]
pub struct Worker {
    /// Worker id (from the agent's configuration).
    pub id: String,
    /// Ready, Lost or Draining.
    pub state: WorkerState,
    /// CPU cores offered.
    pub cpu_capacity: f64,
    /// Memory offered, in bytes.
    pub memory_bytes: u64,
    /// Speed relative to the reference worker.
    pub calibration: f64,
    /// Free-form labels.
    pub labels: std::collections::HashMap<String, String>,
    /// The live stream, if any. Commands go here.
    pub link: Option<AgentLink>,
    /// The agent process behind the stream (changes when the agent restarts).
    pub instance_id: String,
    /// Last heartbeat or registration.
    pub last_seen: Instant,
    /// Wall-clock time of `last_seen`, for users.
    pub last_seen_unix_ms: i64,
    /// The worker's FlowCon threshold and interval, when reported.
    pub alpha: Option<f64>,
    /// The worker's FlowCon interval, when reported.
    pub interval_s: Option<f64>,
}

impl Worker {
    /// Whether new work may be placed here now.
    pub fn schedulable(&self) -> bool {
        self.state == WorkerState::Ready && self.link.is_some()
    }
}

/// Progress points kept per job.
pub type ProgressHistory = VecDeque<pb::ProgressPoint>;

/// One job and its current incarnation.
#[derive(Debug)]
pub struct Job {
    /// Job id (a UUID).
    pub id: String,
    /// Submission order, for FIFO scheduling.
    pub seq: u64,
    /// What the user submitted (validated, defaults filled in).
    pub spec: JobSpec,
    /// Lifecycle state.
    pub state: JobState,
    /// Why the job is in its state.
    pub reason: String,
    /// Worker of the current incarnation.
    pub worker_id: Option<String>,
    /// Current incarnation number (0 = never started).
    pub epoch: u64,
    /// Container of the current incarnation.
    pub container_id: String,
    /// Id of the Start command of the current incarnation, so a reconnecting agent that lost
    /// it can be sent the very same command (idempotent by id).
    pub start_command_id: String,
    /// Timestamps (Unix ms; 0 = not yet).
    pub submitted_unix_ms: i64,
    /// First start.
    pub started_unix_ms: i64,
    /// Terminal state reached.
    pub finished_unix_ms: i64,
    /// Latest progress.
    pub step: u64,
    /// Total steps, when the job says.
    pub total_steps: u64,
    /// Latest metric value.
    pub metric_value: Option<f64>,
    /// Progress samples received in all.
    pub samples: u64,
    /// Malformed progress lines reported by agents.
    pub malformed: u64,
    /// The most recent progress points.
    pub progress: ProgressHistory,
    /// The worker's policy view (from heartbeats).
    pub category: pb::Category,
    /// Growth efficiency, from heartbeats.
    pub growth_efficiency: Option<f64>,
    /// CPU limit fraction, from heartbeats.
    pub cpu_limit: Option<f64>,
    /// Migrations so far.
    pub migrations: u32,
    /// Exit code of the last incarnation.
    pub exit_code: Option<i32>,
    /// The placement policy that placed it.
    pub policy: String,
    /// CPU cores the job used on average over its worker's last report.
    pub cpu_usage: f64,
    /// When its worker first reported it converged (Completing) in this incarnation.
    pub converged_since: Option<Instant>,
    /// SpeCon Alg. 2 has decided about it (moved or kept): it is never considered again.
    pub migration_decided: bool,
    /// SpeCon Alg. 3 has moved it: never again.
    pub rebalanced: bool,
    /// The migration under way, if any.
    pub migration: Option<Migration>,
    /// Downtime of the last finished migration, in ms.
    pub last_migration_downtime_ms: Option<u64>,
    /// When the job became Lost.
    pub lost_since: Option<Instant>,
    /// The trace context of the job's submission span: every later span of the job is its
    /// child, so the job is one trace (empty when traces are not exported).
    pub trace: opentelemetry::Context,
}

/// Why a job is being moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoveReason {
    /// SpeCon Alg. 2: converged on a shared worker.
    Speculative,
    /// SpeCon Alg. 3: evening out the cluster.
    Rebalance,
    /// The user drained its worker.
    Drain,
}

impl MoveReason {
    /// Short name for events and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            MoveReason::Speculative => "speculative",
            MoveReason::Rebalance => "rebalance",
            MoveReason::Drain => "drain",
        }
    }
}

/// Where a migration is: save on the source, then restore (a new incarnation) elsewhere.
#[derive(Debug, Clone, PartialEq)]
pub enum MovePhase {
    /// Save sent to the source; waiting for `Saved`. No restore is sent before it.
    Saving {
        /// The Save command's id (its result ends this phase).
        command_id: String,
    },
    /// Start of the new incarnation sent to `to`; waiting for its first progress line.
    Restoring,
}

/// A migration in flight.
#[derive(Debug, Clone)]
pub struct Migration {
    /// Source worker.
    pub from: String,
    /// Target worker (changes if a restore is retried elsewhere).
    pub to: String,
    /// Why.
    pub reason: MoveReason,
    /// Phase.
    pub phase: MovePhase,
    /// When the save was sent (downtime is measured from here).
    pub started: Instant,
    /// Restores tried so far.
    pub restore_attempts: u32,
    /// The move's span, from the decision to the first progress on the target (or its
    /// abandonment): dropping the migration ends it. Each step is a child span.
    pub span: tracing::Span,
}

impl Job {
    /// Whether the job is over (no container of it should run).
    pub fn is_terminal(&self) -> bool {
        matches!(
            self.state,
            JobState::Completed | JobState::Failed | JobState::Cancelled | JobState::Rejected
        )
    }

    /// Whether the job holds a place on its worker (counts towards the worker's load).
    pub fn occupies_worker(&self) -> bool {
        matches!(
            self.state,
            JobState::Starting
                | JobState::Running
                | JobState::Migrating
                | JobState::Paused
                | JobState::Lost
        )
    }

    /// The wire view.
    pub fn to_pb(&self, include_progress: bool) -> pb::Job {
        pb::Job {
            id: self.id.clone(),
            spec: Some(self.spec.clone()),
            state: self.state as i32,
            reason: self.reason.clone(),
            worker_id: self.worker_id.clone().unwrap_or_default(),
            epoch: self.epoch,
            container_id: self.container_id.clone(),
            submitted_unix_ms: self.submitted_unix_ms,
            started_unix_ms: self.started_unix_ms,
            finished_unix_ms: self.finished_unix_ms,
            step: self.step,
            total_steps: self.total_steps,
            metric_value: self.metric_value,
            samples: self.samples,
            malformed_lines: self.malformed,
            category: self.category as i32,
            growth_efficiency: self.growth_efficiency,
            cpu_limit: self.cpu_limit,
            migrations: self.migrations,
            exit_code: self.exit_code,
            progress: if include_progress {
                self.progress.iter().cloned().collect()
            } else {
                Vec::new()
            },
            policy: self.policy.clone(),
            last_migration_downtime_ms: self.last_migration_downtime_ms,
            cpu_usage: self.cpu_usage,
        }
    }
}

/// Workers by id (sorted, so every policy sees them in the same order) and jobs by id.
#[derive(Default, Debug)]
pub struct Cluster {
    /// Registered workers.
    pub workers: BTreeMap<String, Worker>,
    /// Every job ever submitted (this manager process).
    pub jobs: std::collections::HashMap<String, Job>,
    /// Next submission number.
    pub next_job_seq: u64,
}

impl Cluster {
    /// Jobs that occupy `worker_id`.
    pub fn jobs_on<'a>(&'a self, worker_id: &'a str) -> impl Iterator<Item = &'a Job> + 'a {
        self.jobs
            .values()
            .filter(move |j| j.occupies_worker() && j.worker_id.as_deref() == Some(worker_id))
    }

    /// The wire view of a worker.
    pub fn worker_pb(&self, w: &Worker, policy: &str) -> pb::Worker {
        let mut job_ids: Vec<String> = self.jobs_on(&w.id).map(|j| j.id.clone()).collect();
        job_ids.sort();
        pb::Worker {
            id: w.id.clone(),
            state: w.state as i32,
            cpu_capacity: w.cpu_capacity,
            memory_bytes: w.memory_bytes,
            calibration: w.calibration,
            labels: w.labels.clone(),
            cpu_requested: self.jobs_on(&w.id).map(|j| j.spec.cpus).sum(),
            job_ids,
            last_heartbeat_unix_ms: w.last_seen_unix_ms,
            policy: policy.to_string(),
            alpha: w.alpha,
            interval_s: w.interval_s,
        }
    }
}
