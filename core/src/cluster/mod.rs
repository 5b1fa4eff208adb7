//! The manager's decision core: the cluster as a pure state machine.
//!
//! [`Core::step`] takes the time and one [`Input`] — a control request, an agent's
//! registration or message, a disconnect, a timer tick — and returns the [`Effect`]s: commands
//! for workers, the answer to a registration, events to record, the reply to a request. It
//! does no I/O, reads no clock and draws no random numbers, so the manager's actor and the
//! simulator drive the very same decisions, and a test can replay any interleaving.
//!
//! How a step flows:
//! 1. The input is checked: an agent may speak only of incarnations that were started on its
//!    own worker (as Kubernetes' NodeRestriction limits a kubelet); anything else is refused
//!    and counted ([`Effect::Refused`]).
//! 2. Jobs change phase only through [`Core::transition`], which consults the table in
//!    [`lifecycle::allowed`], bumps the epoch when an incarnation starts, and keeps the
//!    indices (pending queue, jobs per worker) and the event log in step.
//! 3. The policy ([`policy::ClusterPolicy`]) is asked where pending jobs go and what to make of
//!    reports, departures and ticks; its answers are carried out through the same functions.
//! 4. Before returning, the core settles: departures are offered to the policy, drains that
//!    were waiting for room continue, and pending jobs are placed.
//!
//! Reads (GetJob, ListJobs, ListWorkers, WatchEvents) are not inputs: they change nothing, and
//! the shell answers them from [`Core::jobs`] and [`Core::workers`].

pub mod lifecycle;
pub mod policy;
pub mod types;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, VecDeque};

use converge_policy::estimate::Basis;
use tracing::{debug, info, warn};

use lifecycle::{
    Incarnation, Job, JobPhase, Move, MovePhase, ProgressPoint, Resuming, Worker, WorkerPhase,
    WorkerView,
};
use policy::{Admission, ClusterPolicy, ClusterView, Decision, Preempt, Report, Victim};
use types::*;

/// Restores tried (source first, then elsewhere) before a job is declared failed.
pub const MAX_RESTORE_ATTEMPTS: u32 = 3;

/// Settling rounds per step: each round can only end or start jobs, so this bounds nothing in
/// practice but guards against a policy that keeps answering with new work.
const MAX_SETTLE_ROUNDS: usize = 64;

/// What the core runs with.
#[derive(Debug, Clone)]
pub struct Config {
    /// The heartbeat period agents are told to use, in seconds.
    pub heartbeat_interval: Time,
    /// Heartbeats a worker may miss before it is declared lost.
    pub lost_after_missed: u32,
    /// How long a job stays Lost before it restarts elsewhere from its checkpoint, in seconds.
    /// Must exceed the agents' self-fencing time, so the old incarnation has stopped by then.
    pub recover_lost_after: Time,
    /// How long a container may take to checkpoint and exit, in seconds.
    pub save_deadline: Time,
    /// Progress points kept per job.
    pub progress_history: usize,
    /// Command ids are `{id_prefix}-{n}`: unique per manager process (the shell passes its
    /// manager id), deterministic in the simulator.
    pub id_prefix: String,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            heartbeat_interval: 1.0,
            lost_after_missed: 3,
            recover_lost_after: 30.0,
            save_deadline: 30.0,
            progress_history: 256,
            id_prefix: "cmd".into(),
        }
    }
}

/// One thing that happened to the cluster.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// A validated submission; `id` is new (made by the shell).
    Submit {
        /// The new job's id.
        id: JobId,
        /// What the decisions need of it.
        spec: JobSpec,
    },
    /// The user cancels a job.
    Cancel {
        /// The job.
        id: JobId,
    },
    /// The user drains a worker.
    Drain {
        /// The worker.
        worker: WorkerId,
    },
    /// An agent opened stream `conn` and registered.
    Connected {
        /// The stream.
        conn: ConnId,
        /// What it said.
        register: Register,
    },
    /// A message on stream `conn`.
    Agent {
        /// The stream.
        conn: ConnId,
        /// The message.
        message: AgentMessage,
    },
    /// Stream `conn` ended (or a send on it failed).
    Disconnected {
        /// The stream.
        conn: ConnId,
        /// Why, for events.
        reason: String,
    },
    /// The timer: liveness, recovery of lost jobs, the policy's own timers.
    Tick,
}

impl Input {
    /// Short name for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Input::Submit { .. } => "submit",
            Input::Cancel { .. } => "cancel",
            Input::Drain { .. } => "drain",
            Input::Connected { .. } => "register",
            Input::Agent { message, .. } => message.name(),
            Input::Disconnected { .. } => "disconnected",
            Input::Tick => "tick",
        }
    }
}

/// What a step asks the shell to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Send `command` on stream `conn` (worker `worker`'s).
    Send {
        /// The stream.
        conn: ConnId,
        /// Its worker.
        worker: WorkerId,
        /// The command.
        command: Command,
    },
    /// Answer a registration on stream `conn`.
    Registered {
        /// The stream.
        conn: ConnId,
        /// The answer.
        registered: Registered,
    },
    /// Record an event.
    Event(Event),
    /// The answer to the step's control request.
    Reply(Result<Reply, RequestError>),
    /// Something was refused and counted (metrics, logs).
    Refused {
        /// What kind of thing.
        what: Refusal,
        /// The worker whose message it was, if any.
        worker: Option<WorkerId>,
    },
}

/// When a job will finish, for users.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Eta {
    /// Seconds from now to its finish.
    pub remaining_s: f64,
    /// When it will finish.
    pub finish_at: Time,
    /// When a pending job will start.
    pub start_at: Option<Time>,
    /// What the estimate rests on.
    pub basis: Basis,
    /// How far to trust it (0 to 1).
    pub confidence: f64,
}

/// What a control request produced.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// The job concerned (read it with [`Core::job`]).
    Job(JobId),
    /// The worker concerned (read it with [`Core::worker`]).
    Worker(WorkerId),
}

/// Why a control request was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RequestError {
    /// No such job.
    #[error("job {0} not found")]
    JobNotFound(JobId),
    /// A field is wrong.
    #[error("invalid {field}: {message}")]
    Invalid {
        /// The field to fix.
        field: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The request does not fit the job's or worker's state.
    #[error("{0}")]
    FailedPrecondition(String),
}

/// Kinds of refusal the core counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// An agent spoke of an incarnation that was never started on its worker.
    ForeignJob,
    /// An agent spoke of a job this manager does not know.
    UnknownJob,
    /// A message on a stream that is no longer its worker's.
    StaleStream,
    /// A transition the lifecycle table does not allow.
    Transition,
}

impl Refusal {
    /// Label for metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::ForeignJob => "foreign_job",
            Refusal::UnknownJob => "unknown_job",
            Refusal::StaleStream => "stale_stream",
            Refusal::Transition => "transition",
        }
    }
}

/// The manager's decision core (module doc).
pub struct Core {
    config: Config,
    policy: Box<dyn ClusterPolicy>,
    workers: BTreeMap<WorkerId, Worker>,
    jobs: BTreeMap<JobId, Job>,
    /// Pending jobs by submission order.
    pending: BTreeMap<u64, JobId>,
    /// Which worker each live stream belongs to.
    conns: BTreeMap<ConnId, WorkerId>,
    next_seq: u64,
    next_command: u64,
    /// The time of the step being taken.
    now: Time,
    /// What the step being taken produced.
    out: Vec<Effect>,
    /// Jobs that left a worker in this step, for the policy.
    departures: VecDeque<(WorkerId, JobId)>,
    /// Capacity appeared or a job became pending: place and drain again before returning.
    dirty: bool,
    /// Sizes of the jobs that completed (for estimates of jobs nothing else tells about).
    history: converge_policy::estimate::ServiceHistory,
}

impl Core {
    /// An empty cluster run by `policy`.
    pub fn new(config: Config, policy: Box<dyn ClusterPolicy>) -> Self {
        Core {
            config,
            policy,
            workers: BTreeMap::new(),
            jobs: BTreeMap::new(),
            pending: BTreeMap::new(),
            conns: BTreeMap::new(),
            next_seq: 0,
            next_command: 0,
            now: 0.0,
            out: Vec::new(),
            departures: VecDeque::new(),
            dirty: false,
            history: Default::default(),
        }
    }

    // ---- reads ----

    /// One job.
    pub fn job(&self, id: &str) -> Option<&Job> {
        self.jobs.get(id)
    }

    /// Every job, by id.
    pub fn jobs(&self) -> &BTreeMap<JobId, Job> {
        &self.jobs
    }

    /// One worker.
    pub fn worker(&self, id: &str) -> Option<&Worker> {
        self.workers.get(id)
    }

    /// Every worker, by id.
    pub fn workers(&self) -> &BTreeMap<WorkerId, Worker> {
        &self.workers
    }

    /// The policy's name.
    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// The settings.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The largest CPU capacity and memory of any registered worker: what a submission may
    /// ask for at most (the shell validates against them).
    pub fn limits(&self) -> (Option<f64>, Option<u64>) {
        (
            self.workers
                .values()
                .map(|w| w.cpu_capacity)
                .reduce(f64::max),
            self.workers
                .values()
                .map(|w| w.memory_bytes)
                .filter(|m| *m > 0)
                .max(),
        )
    }

    /// When the core next wants a [`Input::Tick`] at the latest: the policy's own timer, if
    /// it keeps one. The shell ticks at least every half heartbeat anyway.
    pub fn next_due(&self) -> Option<Time> {
        self.policy.next_due()
    }

    /// When job `id` will finish (and, pending, start), as far as its reports tell, at `now`.
    pub fn eta(&self, id: &str, now: Time) -> Option<Eta> {
        let view = self.view();
        let job = self.jobs.get(id)?;
        let est = view.estimate(job);
        match &job.phase {
            JobPhase::Pending => {
                // FIFO: the k-th pending job starts when the k-th running job ends.
                let k = self.pending.values().position(|p| p == id)?;
                let mut ends: Vec<Time> = self
                    .jobs
                    .values()
                    .filter(|j| matches!(j.phase, JobPhase::Running { .. }))
                    .filter_map(|j| self.eta(&j.id, now).map(|e| e.finish_at))
                    .collect();
                ends.sort_by(f64::total_cmp);
                let start = *ends.get(k)?;
                let work =
                    est.map(|e| e.work).or((job.spec.estimated_runtime_s > 0.0)
                        .then_some(job.spec.estimated_runtime_s))?;
                let run = work / job.spec.cpus.max(0.01);
                Some(Eta {
                    remaining_s: start - now + run,
                    finish_at: start + run,
                    start_at: Some(start),
                    basis: est.map_or(Basis::AttainedService, |e| e.basis),
                    confidence: est.map_or(0.05, |e| e.confidence * 0.5),
                })
            }
            p if p.state().is_terminal() => None,
            _ => {
                let est = est?;
                let w = self.workers.get(job.worker()?)?;
                let cores = job
                    .assigned_cpus
                    .or((job.view.cpu_usage > 0.0).then_some(job.view.cpu_usage))
                    .unwrap_or(job.spec.cpus.max(0.01));
                let remaining_s = est.seconds_at(cores, w.calibration);
                Some(Eta {
                    remaining_s,
                    finish_at: now + remaining_s,
                    start_at: None,
                    basis: est.basis,
                    confidence: est.confidence,
                })
            }
        }
    }

    /// A read-only view for policies and shells.
    pub fn view(&self) -> ClusterView<'_> {
        ClusterView {
            workers: &self.workers,
            jobs: &self.jobs,
            history: &self.history,
        }
    }

    // ---- the step ----

    /// Consumes one input at time `now` and returns what to do (module doc).
    pub fn step(&mut self, now: Time, input: Input) -> Vec<Effect> {
        self.now = now;
        match input {
            Input::Submit { id, spec } => {
                let r = self.submit(id, spec);
                self.out.push(Effect::Reply(r));
            }
            Input::Cancel { id } => {
                let r = self.cancel(&id);
                self.out.push(Effect::Reply(r));
            }
            Input::Drain { worker } => {
                let r = self.drain(&worker);
                self.out.push(Effect::Reply(r));
            }
            Input::Connected { conn, register } => self.register(conn, register),
            Input::Agent { conn, message } => match self.conns.get(&conn).cloned() {
                Some(worker) => self.agent_message(&worker, message),
                None => self.refuse(Refusal::StaleStream, None),
            },
            Input::Disconnected { conn, reason } => self.disconnected(conn, &reason),
            Input::Tick => self.tick(),
        }
        self.settle();
        std::mem::take(&mut self.out)
    }

    // ---- the one transition function ----

    /// Moves job `id` to `to`, if the lifecycle allows it; returns whether it did. Keeps the
    /// epoch, the incarnations, the pending queue, the per-worker index and the event log in
    /// step with the phase. A refused transition is counted and logged, never applied.
    pub fn transition(&mut self, id: &str, to: JobPhase, reason: impl Into<String>) -> bool {
        let now = self.now;
        let Some(job) = self.jobs.get_mut(id) else {
            return false;
        };
        if !lifecycle::allowed(&job.phase, &to) {
            warn!(job = %id, from = job.state().label(), to = to.state().label(), "transition refused");
            self.out.push(Effect::Refused {
                what: Refusal::Transition,
                worker: None,
            });
            return false;
        }
        let reason = reason.into();
        let from_state = job.state();
        let old_worker = job.phase.worker().cloned();
        let new_worker = to.worker().cloned();
        if job.phase.starts_incarnation(&to) {
            job.epoch += 1;
            job.incarnations.push(Incarnation {
                epoch: job.epoch,
                worker: new_worker.clone().expect("an incarnation has a worker"),
            });
            job.container_id.clear();
            job.view = WorkerView::default();
            job.view_at = None;
            job.assigned_cpus = None;
        }
        if from_state == JobState::Pending {
            self.pending.remove(&job.seq);
        }
        if to.state() == JobState::Pending {
            self.pending.insert(job.seq, id.to_string());
            self.dirty = true;
        }
        if to.state().is_terminal() {
            job.finished_at = Some(now);
            job.resuming = None;
        }
        if to.state() == JobState::Completed {
            self.history.record(job.cpu_s);
        }
        job.phase = to;
        job.reason = reason.clone();
        let (epoch, to_state) = (job.epoch, job.state());
        if old_worker != new_worker {
            if let Some(w) = old_worker.as_ref().and_then(|w| self.workers.get_mut(w)) {
                w.jobs.remove(id);
            }
            if let Some(w) = new_worker.as_ref().and_then(|w| self.workers.get_mut(w)) {
                w.jobs.insert(id.to_string());
            }
            if let Some(w) = old_worker.clone() {
                self.departures.push_back((w, id.to_string()));
                self.dirty = true;
            }
        }
        let mut attributes = BTreeMap::new();
        if to_state == JobState::Completed
            && let Some(started) = job.started_at
        {
            // How far the finish times predicted at 25/50/75% of its steps were off, as a
            // fraction of its run: what users were told against what happened.
            let run = (now - started).max(1e-9);
            for (q, p) in ["25", "50", "75"].iter().zip(job.predicted_at) {
                if let Some(p) = p {
                    attributes.insert(
                        format!("eta_error_{q}"),
                        format!("{:.4}", (p - now).abs() / run),
                    );
                }
            }
        }
        if from_state != to_state {
            info!(job = %id, from = from_state.label(), to = to_state.label(), %reason, "job state");
            let mut e = Event::new(EventKind::JobState, reason);
            e.attributes = attributes;
            e.job = Some(id.to_string());
            e.worker = new_worker.or(old_worker);
            e.epoch = epoch;
            e.from = Some(from_state);
            e.to = Some(to_state);
            self.out.push(Effect::Event(e));
        }
        true
    }

    // ---- control requests ----

    fn submit(&mut self, id: JobId, spec: JobSpec) -> Result<Reply, RequestError> {
        if let Err(e) = self.policy.check_submit(&spec) {
            return Err(RequestError::Invalid {
                field: e.field,
                message: e.message,
            });
        }
        if self.jobs.contains_key(&id) {
            return Err(RequestError::FailedPrecondition(format!(
                "job {id} exists already"
            )));
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.jobs.insert(
            id.clone(),
            Job {
                id: id.clone(),
                seq,
                spec,
                phase: JobPhase::Pending,
                reason: "waiting for a worker".into(),
                epoch: 0,
                incarnations: Vec::new(),
                container_id: String::new(),
                submitted_at: self.now,
                started_at: None,
                finished_at: None,
                step: 0,
                total_steps: 0,
                metric_value: None,
                samples: 0,
                malformed: 0,
                progress: VecDeque::new(),
                view: WorkerView::default(),
                view_at: None,
                cpu_s: 0.0,
                assigned_cpus: None,
                predicted_at: [None; 3],
                checkpoint_step: None,
                migrations: 0,
                last_migration_downtime: None,
                resuming: None,
                exit_code: None,
            },
        );
        self.pending.insert(seq, id.clone());
        self.dirty = true;
        let mut e = Event::new(EventKind::JobState, "submitted");
        e.job = Some(id.clone());
        e.to = Some(JobState::Pending);
        self.out.push(Effect::Event(e));
        Ok(Reply::Job(id))
    }

    /// Cancel is final: every incarnation that may run is told to stop, the job becomes
    /// Cancelled, and since nothing leaves a terminal phase, no later result (a save that
    /// completes, a restore that starts) can bring it back.
    fn cancel(&mut self, id: &str) -> Result<Reply, RequestError> {
        let job = self
            .jobs
            .get(id)
            .ok_or_else(|| RequestError::JobNotFound(id.to_string()))?;
        if job.is_terminal() {
            return Err(RequestError::FailedPrecondition(format!(
                "job {id} is already {}",
                job.state().label()
            )));
        }
        // The one incarnation that may run: the source while a move saves, the target once it
        // restores (the source has stopped by then).
        let (worker, epoch) = (job.worker().cloned(), job.epoch);
        if let Some(w) = worker {
            self.send_to(
                &w,
                id,
                epoch,
                Action::Stop {
                    reason: "cancelled by user".into(),
                },
            );
        }
        self.transition(id, JobPhase::Cancelled, "cancelled by user");
        Ok(Reply::Job(id.to_string()))
    }

    fn drain(&mut self, worker: &str) -> Result<Reply, RequestError> {
        let Some(w) = self.workers.get_mut(worker) else {
            return Err(RequestError::Invalid {
                field: "worker_id",
                message: format!("no worker `{worker}` is registered"),
            });
        };
        let before = w.state;
        w.state = match w.state {
            WorkerPhase::Ready | WorkerPhase::Draining => WorkerPhase::Draining,
            WorkerPhase::Lost { since, .. } => WorkerPhase::Lost {
                since,
                draining: true,
            },
        };
        if before != w.state {
            let state = w.state.state();
            self.worker_event(worker, state, "drained by user".into());
        }
        self.dirty = true;
        Ok(Reply::Worker(worker.to_string()))
    }

    /// Moves the running jobs of every draining, connected worker elsewhere, as far as the
    /// policy finds room; the others wait (and say so) until capacity appears.
    fn continue_drains(&mut self) {
        let draining: Vec<WorkerId> = self
            .workers
            .values()
            .filter(|w| w.state == WorkerPhase::Draining && w.conn.is_some())
            .map(|w| w.id.clone())
            .collect();
        for worker in draining {
            let jobs: Vec<JobId> = self.workers[&worker]
                .jobs
                .iter()
                .filter(|id| matches!(self.jobs[*id].phase, JobPhase::Running { .. }))
                .cloned()
                .collect();
            for id in jobs {
                let view = ClusterView {
                    workers: &self.workers,
                    jobs: &self.jobs,
                    history: &self.history,
                };
                match self.policy.place_move(self.now, &self.jobs[&id], view) {
                    Some(to) if to != worker => {
                        self.begin_move(&id, &to, MoveReason::Drain, BTreeMap::new());
                    }
                    _ => {
                        let why = format!("{worker} is draining; waiting for a worker with room");
                        if let Some(j) = self.jobs.get_mut(&id)
                            && j.reason != why
                        {
                            debug!(job = %id, %worker, "no worker can take the job; it stays while the worker drains");
                            j.reason = why;
                        }
                    }
                }
            }
        }
    }

    // ---- agent streams ----

    fn register(&mut self, conn: ConnId, reg: Register) {
        let id = reg.worker.clone();
        let now = self.now;
        let known = self.workers.contains_key(&id);
        if let Some(old) = self.workers.get(&id).and_then(|w| w.conn) {
            // Reconnected before the old stream's end reached us: the new stream wins, and
            // anything still arriving on the old one is refused.
            self.conns.remove(&old);
        }
        self.conns.insert(conn, id.clone());
        let restarted = self
            .workers
            .get(&id)
            .is_some_and(|w| w.instance_id != reg.instance_id);
        let w = self.workers.entry(id.clone()).or_insert_with(|| Worker {
            id: id.clone(),
            state: WorkerPhase::Ready,
            cpu_capacity: 0.0,
            memory_bytes: 0,
            calibration: 1.0,
            labels: BTreeMap::new(),
            conn: None,
            instance_id: String::new(),
            last_seen: now,
            alpha: None,
            interval_s: None,
            jobs: Default::default(),
        });
        w.cpu_capacity = reg.cpu_capacity;
        w.memory_bytes = reg.memory_bytes;
        w.calibration = if reg.calibration > 0.0 {
            reg.calibration
        } else {
            1.0
        };
        w.labels = reg.labels.clone();
        w.instance_id = reg.instance_id.clone();
        w.last_seen = now;
        w.conn = Some(conn);
        w.state = w.state.heard_from();
        let state = w.state.state();
        self.out.push(Effect::Registered {
            conn,
            registered: Registered {
                policy: self.policy.name(),
                mode: self.policy.worker_mode(),
                migration: self.policy.agent_migration(),
                heartbeat_interval: self.config.heartbeat_interval,
            },
        });
        info!(worker = %id, cpus = reg.cpu_capacity, containers = reg.containers.len(), reconnect = known, "worker registered");
        let reason = if known {
            format!(
                "re-registered with {} containers{}",
                reg.containers.len(),
                if restarted { " (agent restarted)" } else { "" }
            )
        } else {
            "registered".into()
        };
        self.worker_event(&id, state, reason);
        self.reconcile(&id, &reg.containers);
        self.dirty = true;
    }

    /// Brings the core's view of `worker` in line with what its agent says it runs.
    fn reconcile(&mut self, worker: &str, reported: &[ContainerReport]) {
        for c in reported {
            let Some(job) = self.jobs.get(&c.job) else {
                // A container from before this manager started: leave the user's work alone
                // rather than kill what we cannot account for.
                warn!(%worker, job = %c.job, "agent runs a container of an unknown job; leaving it alone");
                continue;
            };
            let current = c.epoch == job.epoch && job.worker().is_some_and(|w| w == worker);
            if !current || job.is_terminal() {
                if c.running {
                    let why = if job.is_terminal() {
                        format!("job is {}", job.state().label())
                    } else {
                        "superseded incarnation".into()
                    };
                    self.send_to(worker, &c.job, c.epoch, Action::Stop { reason: why });
                }
                continue;
            }
            let id = c.job.clone();
            match (&job.phase, c.running) {
                (JobPhase::Starting { .. } | JobPhase::Lost { .. }, true) => {
                    if let Some(j) = self.jobs.get_mut(&id) {
                        j.container_id = c.container_id.clone();
                        if let Some(s) = c.last_step {
                            j.step = j.step.max(s);
                        }
                    }
                    self.transition(
                        &id,
                        JobPhase::Running {
                            worker: worker.to_string(),
                        },
                        format!("re-adopted on {worker}"),
                    );
                }
                // A save may have been lost with the old stream: the same command again (the
                // agent answers a repeated id from its cache).
                (
                    JobPhase::Stopping { command, .. }
                    | JobPhase::Migrating(Move {
                        phase: MovePhase::Saving { command },
                        ..
                    }),
                    true,
                ) => {
                    let cmd = Command {
                        id: command.clone(),
                        job: id.clone(),
                        epoch: c.epoch,
                        action: Action::Save {
                            deadline_ms: self.save_deadline_ms(),
                        },
                    };
                    self.send(worker, cmd);
                }
                _ => {}
            }
        }
        // Current incarnations placed here that the agent does not report.
        let missing: Vec<JobId> = self.workers[worker]
            .jobs
            .iter()
            .filter(|id| {
                let j = &self.jobs[*id];
                !reported.iter().any(|c| c.job == j.id && c.epoch == j.epoch)
            })
            .cloned()
            .collect();
        for id in missing {
            let job = &self.jobs[&id];
            let epoch = job.epoch;
            match job.phase.clone() {
                JobPhase::Starting { command, .. }
                | JobPhase::Migrating(Move {
                    phase: MovePhase::Restoring { command },
                    ..
                }) => {
                    // The start may have been lost with the old stream: send the very same
                    // command again.
                    let cmd = Command {
                        id: command,
                        job: id.clone(),
                        epoch,
                        action: Action::Start {
                            cpu_shares: self.policy.start_shares(&id),
                        },
                    };
                    self.send(worker, cmd);
                }
                JobPhase::Migrating(Move {
                    phase: MovePhase::Saving { .. },
                    ..
                }) => {
                    // Its container is gone (saved and reported, or its agent restarted):
                    // nothing of it runs, so the move goes on from the checkpoint.
                    self.migration_event(
                        &id,
                        worker,
                        format!(
                            "its container is gone from {worker}; restoring from its checkpoint"
                        ),
                        BTreeMap::new(),
                    );
                    self.after_save(&id);
                }
                JobPhase::Stopping { why, .. } => {
                    // It was being stopped at convergence and its container is gone: it has
                    // stopped, from its last checkpoint on.
                    self.transition(
                        &id,
                        JobPhase::Completed,
                        format!("{why}; its container is gone from {worker}, its checkpoint kept"),
                    );
                }
                _ => {
                    // Nothing of it runs here any more, and how it ended was not reported:
                    // restart it from its checkpoint rather than lose it.
                    self.transition(
                        &id,
                        JobPhase::Pending,
                        format!(
                            "its container is no longer on {worker}; restarting from its checkpoint"
                        ),
                    );
                }
            }
        }
    }

    fn disconnected(&mut self, conn: ConnId, reason: &str) {
        let Some(worker) = self.conns.remove(&conn) else {
            return;
        };
        let Some(w) = self.workers.get_mut(&worker) else {
            return;
        };
        if w.conn == Some(conn) {
            w.conn = None;
            let state = w.state.state();
            warn!(%worker, %reason, "agent disconnected");
            self.worker_event(&worker, state, format!("disconnected: {reason}"));
        }
    }

    fn agent_message(&mut self, worker: &str, message: AgentMessage) {
        match message {
            AgentMessage::Heartbeat(hb) => self.heartbeat(worker, hb),
            AgentMessage::Progress(batch) => self.progress(worker, batch),
            AgentMessage::Result(r) => self.result(worker, r),
            AgentMessage::Exited(e) => self.exited(worker, e),
            AgentMessage::MigrationRequest { job, epoch, reason } => {
                self.migration_request(worker, &job, epoch, &reason)
            }
        }
    }

    /// Whether `worker` may speak of incarnation `epoch` of `job` (it was started there); if
    /// not, the message is refused and counted.
    fn may_speak(&mut self, worker: &str, job: &str, epoch: u64) -> bool {
        let what = match self.jobs.get(job) {
            None => Refusal::UnknownJob,
            Some(j) if j.ran_on(worker, epoch) => return true,
            Some(_) => Refusal::ForeignJob,
        };
        if what == Refusal::ForeignJob {
            warn!(%worker, %job, epoch, "refused: a message about a job this worker never ran");
        }
        self.refuse(what, Some(worker.to_string()));
        false
    }

    fn refuse(&mut self, what: Refusal, worker: Option<WorkerId>) {
        self.out.push(Effect::Refused { what, worker });
    }

    fn heartbeat(&mut self, worker: &str, hb: Heartbeat) {
        let Some(w) = self.workers.get_mut(worker) else {
            return;
        };
        w.last_seen = self.now;
        w.alpha = hb.alpha;
        w.interval_s = hb.interval_s;
        if matches!(w.state, WorkerPhase::Lost { .. }) {
            w.state = w.state.heard_from();
            let state = w.state.state();
            self.worker_event(worker, state, "heartbeats resumed".into());
            self.dirty = true;
        }
        let (now, speed) = (self.now, self.workers[worker].calibration);
        for s in hb.jobs {
            if !self.may_speak(worker, &s.job, s.epoch) {
                continue;
            }
            let j = self.jobs.get_mut(&s.job).expect("checked by may_speak");
            if s.epoch != j.epoch || j.worker().is_none_or(|w| w != worker) {
                continue;
            }
            // The service it had since the last report, at the reference speed.
            if let Some(t) = j.view_at {
                j.cpu_s += j.view.cpu_usage.max(0.0) * (now - t).max(0.0) * speed;
            }
            j.view_at = Some(now);
            j.view = WorkerView {
                category: s.category,
                growth_efficiency: s.growth_efficiency,
                cpu_limit: s.cpu_limit,
                cpu_usage: s.cpu_usage,
            };
            // Its worker is back and says the incarnation runs: it was never gone.
            if matches!(j.phase, JobPhase::Lost { .. }) {
                self.transition(
                    &s.job,
                    JobPhase::Running {
                        worker: worker.to_string(),
                    },
                    format!("{worker} is back and runs it"),
                );
            }
        }
        let worker = worker.to_string();
        let view = ClusterView {
            workers: &self.workers,
            jobs: &self.jobs,
            history: &self.history,
        };
        let decisions =
            self.policy
                .on_report(self.now, Report::Heartbeat { worker: &worker }, view);
        self.apply(decisions);
    }

    fn progress(&mut self, worker: &str, batch: ProgressBatch) {
        let cap = self.config.progress_history;
        for s in batch.samples {
            if !self.may_speak(worker, &s.job, s.epoch) {
                continue;
            }
            let j = self.jobs.get_mut(&s.job).expect("checked by may_speak");
            if j.is_terminal() {
                continue;
            }
            j.samples += 1;
            if cap > 0 {
                if j.progress.len() >= cap {
                    j.progress.pop_front();
                }
                j.progress.push_back(ProgressPoint {
                    unix_ms: s.unix_ms,
                    step: s.step,
                    value: s.value,
                    epoch: s.epoch,
                    cpu_s: j.cpu_s,
                });
            }
            if s.checkpointed {
                j.checkpoint_step = j.checkpoint_step.max(Some(s.step));
            }
            if s.epoch != j.epoch {
                continue;
            }
            j.step = j.step.max(s.step);
            if let Some(t) = s.total_steps {
                j.total_steps = t;
            }
            if s.value.is_some() {
                j.metric_value = s.value;
            }
            let resumed = j.resuming.take_if(|r| r.to == worker).map(|r| (r, j.step));
            let starting = matches!(j.phase, JobPhase::Starting { .. });
            if let Some((r, step)) = resumed {
                let downtime = self.now - r.started;
                // A move counts once the new incarnation has shown progress: until then it
                // may still fail to train on its new worker.
                let j = self.jobs.get_mut(&s.job).expect("exists");
                j.migrations += 1;
                j.last_migration_downtime = Some(downtime);
                let ms = (downtime * 1000.0).round() as u64;
                let attributes = BTreeMap::from([
                    ("downtime_ms".to_string(), ms.to_string()),
                    ("from".to_string(), r.from.clone()),
                    ("to".to_string(), r.to.clone()),
                    ("reason".to_string(), r.reason.as_str().to_string()),
                    ("step".to_string(), step.to_string()),
                    ("outcome".to_string(), "completed".to_string()),
                ]);
                self.migration_event(
                    &s.job,
                    worker,
                    format!("resumed on {worker} at step {step}; downtime {ms} ms"),
                    attributes,
                );
            } else if starting {
                self.transition(
                    &s.job,
                    JobPhase::Running {
                        worker: worker.to_string(),
                    },
                    format!("running on {worker}"),
                );
            }
            self.note_predictions(&s.job);
            self.check_stop_rule(&s.job);
        }
        for m in batch.malformed {
            if self.may_speak(worker, &m.job, m.epoch)
                && let Some(j) = self.jobs.get_mut(&m.job)
            {
                j.malformed += m.count;
            }
        }
    }

    /// Records the finish time predicted as the job passes 25%, 50% and 75% of its steps.
    fn note_predictions(&mut self, id: &str) {
        let Some(j) = self.jobs.get(id) else {
            return;
        };
        if j.total_steps == 0 {
            return;
        }
        let done = j.step as f64 / j.total_steps as f64;
        let due: Vec<usize> = [0.25, 0.5, 0.75]
            .iter()
            .enumerate()
            .filter(|(i, q)| done >= **q && j.predicted_at[*i].is_none())
            .map(|(i, _)| i)
            .collect();
        if due.is_empty() {
            return;
        }
        let Some(eta) = self.eta(id, self.now) else {
            return;
        };
        let j = self.jobs.get_mut(id).expect("exists");
        for i in due {
            j.predicted_at[i] = Some(eta.finish_at);
        }
    }

    /// Stop at convergence: when the job's rule fires on its reported metric, it is
    /// checkpointed and stopped, and ends Completed with what the rule saw.
    fn check_stop_rule(&mut self, id: &str) {
        let Some(j) = self.jobs.get(id) else {
            return;
        };
        let (Some(rule), JobPhase::Running { worker }) = (j.spec.stop, &j.phase) else {
            return;
        };
        let Some(last) = j.progress.back().filter(|p| p.epoch == j.epoch) else {
            return;
        };
        let (Some(_), Some(from)) = (last.value, last.step.checked_sub(rule.window_steps)) else {
            return;
        };
        // Best-so-far, as early stopping's patience rule: the best value up to a window ago
        // against the best up to now, so that a noisy evaluation neither fires the rule (an
        // uptick) nor hides a plateau. None while the history does not reach a window back.
        let sign = if j.spec.maximize { -1.0 } else { 1.0 };
        let best = |upto: u64| {
            j.progress
                .iter()
                .filter(|p| p.step <= upto)
                .filter_map(|p| p.value.map(|v| sign * v))
                .reduce(f64::min)
        };
        let (Some(a), Some(b)) = (best(from), best(last.step)) else {
            return;
        };
        if !rule.fires(a, b) {
            return;
        }
        let why = format!(
            "converged at step {}: best metric {:.4}, improved {:.2}% over the last {} steps",
            last.step,
            sign * b,
            100.0 * converge_policy::estimate::StopRule::improvement(a, b),
            rule.window_steps
        );
        let (worker, epoch) = (worker.clone(), j.epoch);
        let command = self.next_command_id();
        let to = JobPhase::Stopping {
            worker: worker.clone(),
            command: command.clone(),
            why: why.clone(),
        };
        if self.transition(id, to, format!("{why}; saving its checkpoint")) {
            self.send(
                &worker,
                Command {
                    id: command,
                    job: id.to_string(),
                    epoch,
                    action: Action::Save {
                        deadline_ms: self.save_deadline_ms(),
                    },
                },
            );
        }
    }

    fn result(&mut self, worker: &str, r: CommandResult) {
        if !self.may_speak(worker, &r.job, r.epoch) {
            return;
        }
        let job = &self.jobs[&r.job];
        if job.is_terminal() {
            debug!(job = %r.job, "result for a finished job ignored");
            return;
        }
        let id = r.job.clone();
        match job.phase.clone() {
            JobPhase::Migrating(m) => match &m.phase {
                MovePhase::Saving { command } if *command == r.command => {
                    self.saved(&id, worker, &m, &r)
                }
                MovePhase::Restoring { command } if *command == r.command => {
                    self.restored(&id, worker, &m, &r)
                }
                _ => self.other_result(worker, &r),
            },
            JobPhase::Stopping { command, why, .. } if command == r.command => {
                if r.ok {
                    let j = self.jobs.get_mut(&id).expect("exists");
                    j.exit_code = Some(0);
                    // Its last steps may be reported after this result: the save's step is
                    // where its checkpoint is.
                    if let ResultDetail::Saved { step, .. } = r.detail {
                        j.step = j.step.max(step);
                    }
                    self.transition(&id, JobPhase::Completed, format!("{why}; checkpoint kept"));
                } else {
                    warn!(job = %id, error = %r.error, "save at convergence failed; it runs on");
                    self.transition(
                        &id,
                        JobPhase::Running {
                            worker: worker.to_string(),
                        },
                        format!("could not stop at convergence: {}", r.error),
                    );
                }
            }
            JobPhase::Starting { command, .. } if command == r.command => {
                if r.ok {
                    self.started(&id, worker, &r.detail);
                } else {
                    self.transition(
                        &id,
                        JobPhase::Failed,
                        format!("could not start on {worker}: {}", r.error),
                    );
                }
            }
            _ => self.other_result(worker, &r),
        }
    }

    fn other_result(&mut self, worker: &str, r: &CommandResult) {
        if !r.ok {
            warn!(job = %r.job, %worker, error = %r.error, "command failed");
        }
    }

    fn started(&mut self, id: &str, worker: &str, detail: &ResultDetail) {
        let now = self.now;
        if let Some(j) = self.jobs.get_mut(id) {
            if let ResultDetail::Started { container_id } = detail {
                j.container_id = container_id.clone();
            }
            j.started_at.get_or_insert(now);
        }
        self.transition(
            id,
            JobPhase::Running {
                worker: worker.to_string(),
            },
            format!("running on {worker}"),
        );
    }

    fn saved(&mut self, id: &str, worker: &str, m: &Move, r: &CommandResult) {
        if !r.ok {
            // Nothing was saved and nothing stopped it: it runs on where it was.
            warn!(job = %id, error = %r.error, "save failed; the job stays where it is");
            let attributes = BTreeMap::from([
                ("outcome".to_string(), "aborted".to_string()),
                ("reason".to_string(), m.reason.as_str().to_string()),
            ]);
            self.migration_event(
                id,
                worker,
                format!("aborted: save failed: {}", r.error),
                attributes,
            );
            self.transition(
                id,
                JobPhase::Running {
                    worker: m.from.clone(),
                },
                format!("migration aborted; still on {}", m.from),
            );
            return;
        }
        let mut attributes = BTreeMap::new();
        let how = match &r.detail {
            ResultDetail::Saved {
                step,
                checkpoint_bytes,
                save_ms,
                killed,
            } => {
                attributes.insert("step".to_string(), step.to_string());
                attributes.insert("checkpoint_bytes".to_string(), checkpoint_bytes.to_string());
                attributes.insert("save_ms".to_string(), save_ms.to_string());
                attributes.insert("killed".to_string(), killed.to_string());
                if *killed {
                    "killed after ignoring SIGTERM; resuming from its last periodic checkpoint"
                        .to_string()
                } else {
                    format!("saved at step {step} ({checkpoint_bytes} bytes) in {save_ms} ms")
                }
            }
            _ => "saved".to_string(),
        };
        if let ResultDetail::Saved { step, killed, .. } = &r.detail
            && !killed
            && let Some(j) = self.jobs.get_mut(id)
        {
            j.checkpoint_step = j.checkpoint_step.max(Some(*step));
        }
        self.migration_event(id, worker, how, attributes);
        self.after_save(id);
    }

    /// The source incarnation has stopped with its checkpoint: restore on the target, or on
    /// another worker if the target can no longer take it, or wait.
    fn after_save(&mut self, id: &str) {
        let JobPhase::Migrating(m) = &self.jobs[id].phase else {
            return;
        };
        let to = m.to.clone();
        let target_ok = self.workers.get(&to).is_some_and(Worker::schedulable);
        let target = if target_ok {
            Some(to)
        } else {
            let view = ClusterView {
                workers: &self.workers,
                jobs: &self.jobs,
                history: &self.history,
            };
            self.policy.place_move(self.now, &self.jobs[id], view)
        };
        match target {
            Some(to) => self.restore(id, &to),
            None => {
                self.transition(
                    id,
                    JobPhase::Pending,
                    "saved; waiting for a worker (its checkpoint is kept)",
                );
            }
        }
    }

    /// A new incarnation on `to`, from the checkpoint. Only ever after the source saved (or
    /// its container is gone), never while the old incarnation may run.
    fn restore(&mut self, id: &str, to: &str) {
        let JobPhase::Migrating(m) = self.jobs[id].phase.clone() else {
            return;
        };
        let command = self.next_command_id();
        let mut next = m;
        next.to = to.to_string();
        next.restore_attempts += 1;
        next.phase = MovePhase::Restoring {
            command: command.clone(),
        };
        let reason = format!(
            "moving {} -> {to} ({}): restoring",
            next.from,
            next.reason.as_str()
        );
        if !self.transition(id, JobPhase::Migrating(next), reason) {
            return;
        }
        let epoch = self.jobs[id].epoch;
        let cmd = Command {
            id: command,
            job: id.to_string(),
            epoch,
            action: Action::Start {
                cpu_shares: self.policy.start_shares(&id.to_string()),
            },
        };
        self.send(to, cmd);
    }

    fn restored(&mut self, id: &str, worker: &str, m: &Move, r: &CommandResult) {
        if r.ok {
            if let Some(j) = self.jobs.get_mut(id) {
                j.resuming = Some(Resuming {
                    from: m.from.clone(),
                    to: worker.to_string(),
                    reason: m.reason,
                    started: m.started,
                });
                if let ResultDetail::Started { container_id } = &r.detail {
                    j.container_id = container_id.clone();
                }
            }
            self.transition(
                id,
                JobPhase::Running {
                    worker: worker.to_string(),
                },
                format!("restored on {worker}"),
            );
            return;
        }
        warn!(job = %id, %worker, error = %r.error, "restore failed");
        self.migration_event(
            id,
            worker,
            format!("restore on {worker} failed: {}", r.error),
            BTreeMap::new(),
        );
        if m.restore_attempts >= MAX_RESTORE_ATTEMPTS {
            let attributes = BTreeMap::from([
                ("outcome".to_string(), "failed".to_string()),
                ("reason".to_string(), m.reason.as_str().to_string()),
            ]);
            self.migration_event(id, worker, "restore failed; giving up".into(), attributes);
            self.transition(
                id,
                JobPhase::Failed,
                format!("restore failed {MAX_RESTORE_ATTEMPTS} times; its checkpoint is kept"),
            );
            return;
        }
        // The source first (it ran there a moment ago), then wherever the policy says.
        let request = policy::request(&self.jobs[id].spec);
        let source_ok = m.from != worker
            && self
                .workers
                .get(&m.from)
                .is_some_and(|w| w.schedulable() && self.view().snapshot(w).fits(&request));
        let next = if source_ok {
            Some(m.from.clone())
        } else {
            let view = ClusterView {
                workers: &self.workers,
                jobs: &self.jobs,
                history: &self.history,
            };
            self.policy
                .place_move(self.now, &self.jobs[id], view)
                .filter(|w| w != worker)
        };
        match next {
            Some(to) => self.restore(id, &to),
            None => {
                self.transition(
                    id,
                    JobPhase::Pending,
                    "restore failed; waiting for a worker (its checkpoint is kept)",
                );
            }
        }
    }

    fn exited(&mut self, worker: &str, e: ContainerExited) {
        if !self.may_speak(worker, &e.job, e.epoch) {
            return;
        }
        let job = &self.jobs[&e.job];
        // An older incarnation ended (superseded), or the job is over: nothing changes.
        if job.is_terminal() || e.epoch != job.epoch || job.worker().is_none_or(|w| w != worker) {
            return;
        }
        let id = e.job.clone();
        let saving = matches!(
            &job.phase,
            JobPhase::Migrating(Move {
                phase: MovePhase::Saving { .. },
                ..
            }) | JobPhase::Stopping { .. }
        );
        if let (Some(j), Some(s)) = (self.jobs.get_mut(&id), e.last_step) {
            j.step = j.step.max(s);
        }
        if saving {
            if e.exit_code == 0 && e.done {
                // It finished its last step as we asked it to save: nothing left to move.
                if matches!(self.jobs[&id].phase, JobPhase::Migrating(_)) {
                    let attributes =
                        BTreeMap::from([("outcome".to_string(), "aborted".to_string())]);
                    self.migration_event(
                        &id,
                        worker,
                        "completed while being saved".into(),
                        attributes,
                    );
                }
                self.jobs.get_mut(&id).expect("exists").exit_code = Some(0);
                self.transition(&id, JobPhase::Completed, "completed while being saved");
            }
            // Otherwise the Saved result (which waits for this exit) drives the next step.
            return;
        }
        if e.requested && !e.done {
            // Stopped on request before finishing and outside a move: its agent checkpointed
            // it while cut off from us (self-fencing). It is restartable from its checkpoint,
            // and that incarnation has stopped, so it can start again now.
            self.transition(
                &id,
                JobPhase::Pending,
                format!(
                    "checkpointed and stopped by {worker}'s agent; restarting from its checkpoint"
                ),
            );
            return;
        }
        let job = &self.jobs[&id];
        let short = job.total_steps == 0 || job.step < job.total_steps;
        if e.exit_code == 0 && !e.done && job.samples > 0 && short {
            // It keeps the progress contract but did not print its last line: by the contract
            // an exit 0 then is a checkpoint on SIGTERM (one whose request was not seen: its
            // agent restarted meanwhile), not the end of its training.
            self.transition(
                &id,
                JobPhase::Pending,
                format!(
                    "exited 0 at step {} of {} without finishing (checkpointed); restarting from its checkpoint",
                    job.step, job.total_steps
                ),
            );
            return;
        }
        self.jobs.get_mut(&id).expect("exists").exit_code = Some(e.exit_code);
        let (to, reason) = if e.exit_code == 0 {
            (JobPhase::Completed, "exited 0".to_string())
        } else if e.oom_killed {
            (JobPhase::Failed, "killed: out of memory".to_string())
        } else {
            (
                JobPhase::Failed,
                format!("exited with code {}", e.exit_code),
            )
        };
        self.transition(&id, to, reason);
    }

    fn migration_request(&mut self, worker: &str, job: &str, epoch: u64, reason: &str) {
        if !self.may_speak(worker, job, epoch) {
            return;
        }
        let j = &self.jobs[job];
        let running_here = matches!(&j.phase, JobPhase::Running { worker: w } if w == worker);
        if j.epoch != epoch || !running_here {
            debug!(%job, "migration request ignored (stale or not running)");
            return;
        }
        let (worker, job) = (worker.to_string(), job.to_string());
        let view = ClusterView {
            workers: &self.workers,
            jobs: &self.jobs,
            history: &self.history,
        };
        let decisions = self.policy.on_report(
            self.now,
            Report::MigrationRequest {
                worker: &worker,
                job: &job,
                reason,
            },
            view,
        );
        self.apply(decisions);
    }

    // ---- time ----

    fn tick(&mut self) {
        let now = self.now;
        let limit = self.config.heartbeat_interval * self.config.lost_after_missed as f64;
        // Liveness applies in every state, draining included.
        let silent: Vec<WorkerId> = self
            .workers
            .values()
            .filter(|w| !matches!(w.state, WorkerPhase::Lost { .. }) && now - w.last_seen > limit)
            .map(|w| w.id.clone())
            .collect();
        for id in silent {
            self.lose_worker(&id);
        }
        self.recover_lost();
        let view = ClusterView {
            workers: &self.workers,
            jobs: &self.jobs,
            history: &self.history,
        };
        let decisions = self.policy.on_tick(now, view);
        self.apply(decisions);
    }

    fn lose_worker(&mut self, id: &str) {
        let now = self.now;
        let w = self.workers.get_mut(id).expect("exists");
        let silent = now - w.last_seen;
        w.state = WorkerPhase::Lost {
            since: now,
            draining: w.state.draining(),
        };
        warn!(worker = %id, silent, "worker lost");
        let reason = format!(
            "no heartbeat for {silent:.1}s ({} missed)",
            self.config.lost_after_missed
        );
        let jobs: Vec<JobId> = w.jobs.iter().cloned().collect();
        self.worker_event(id, WorkerState::Lost, reason.clone());
        for j in jobs {
            let phase = self.jobs[&j].phase.clone();
            if matches!(phase, JobPhase::Lost { .. }) {
                continue;
            }
            if let JobPhase::Migrating(m) = &phase {
                let attributes = BTreeMap::from([
                    ("outcome".to_string(), "abandoned".to_string()),
                    ("reason".to_string(), m.reason.as_str().to_string()),
                ]);
                self.migration_event(&j, id, format!("abandoned: worker {id} lost"), attributes);
            }
            self.transition(
                &j,
                JobPhase::Lost {
                    worker: id.to_string(),
                    since: now,
                },
                format!("worker {id} lost: {reason}"),
            );
        }
    }

    /// Jobs Lost for longer than the grace period restart elsewhere from their checkpoints. By
    /// then the old incarnation has stopped: its agent fences itself when cut off, and one that
    /// is connected again is told to stop it.
    fn recover_lost(&mut self) {
        let now = self.now;
        let grace = self.config.recover_lost_after;
        let lost: Vec<(JobId, WorkerId, u64)> = self
            .workers
            .values()
            .flat_map(|w| w.jobs.iter())
            .filter_map(|id| {
                let j = &self.jobs[id];
                match &j.phase {
                    JobPhase::Lost { worker, since } if now - since >= grace => {
                        Some((id.clone(), worker.clone(), j.epoch))
                    }
                    _ => None,
                }
            })
            .collect();
        for (id, old, epoch) in lost {
            self.send_to(
                &old,
                &id,
                epoch,
                Action::Stop {
                    reason: "superseded: restarted elsewhere after its worker was lost".into(),
                },
            );
            info!(job = %id, %old, "restarting a lost job elsewhere from its checkpoint");
            self.transition(
                &id,
                JobPhase::Pending,
                format!("worker {old} lost for {grace:.0}s; restarting from its checkpoint"),
            );
        }
    }

    // ---- placement and policy decisions ----

    /// Offers departures to the policy, continues drains, places pending jobs; until nothing
    /// changes.
    fn settle(&mut self) {
        for _ in 0..MAX_SETTLE_ROUNDS {
            while let Some((worker, job)) = self.departures.pop_front() {
                let view = ClusterView {
                    workers: &self.workers,
                    jobs: &self.jobs,
                    history: &self.history,
                };
                let decisions = self.policy.on_departure(self.now, &worker, &job, view);
                self.apply(decisions);
            }
            if !self.dirty {
                return;
            }
            self.dirty = false;
            self.continue_drains();
            self.schedule();
        }
        warn!("the cluster did not settle after {MAX_SETTLE_ROUNDS} rounds");
    }

    /// Places pending jobs, oldest first, as long as the policy finds workers for them.
    fn schedule(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let pending: Vec<JobId> = self.pending.values().cloned().collect();
        for id in pending {
            if !matches!(self.jobs[&id].phase, JobPhase::Pending) {
                continue;
            }
            let view = ClusterView {
                workers: &self.workers,
                jobs: &self.jobs,
                history: &self.history,
            };
            match self.policy.place(self.now, &self.jobs[&id], view) {
                Admission::Place {
                    worker,
                    cpu_shares,
                    victims,
                    reason,
                    attributes,
                } => {
                    // Victims first: their CPU is what the new job was promised.
                    for v in victims {
                        self.preempt(v);
                    }
                    self.start(&id, &worker, cpu_shares, reason, attributes);
                }
                Admission::Wait { reason } => {
                    let j = self.jobs.get_mut(&id).expect("exists");
                    if j.reason != reason {
                        debug!(job = %id, %reason, "job waits");
                        j.reason = reason;
                    }
                }
                Admission::Reject { reason } => {
                    info!(job = %id, %reason, "job rejected");
                    self.transition(&id, JobPhase::Rejected, reason);
                }
            }
        }
    }

    fn start(
        &mut self,
        id: &str,
        worker: &str,
        cpu_shares: u32,
        reason: String,
        mut attributes: BTreeMap<String, String>,
    ) {
        let command = self.next_command_id();
        let to = JobPhase::Starting {
            worker: worker.to_string(),
            command: command.clone(),
        };
        let epoch = self.jobs[id].epoch + 1;
        attributes.insert("policy".into(), self.policy.name().into());
        let mut e = Event::new(EventKind::JobPlaced, reason);
        e.job = Some(id.to_string());
        e.worker = Some(worker.to_string());
        e.epoch = epoch;
        e.attributes = attributes;
        if !self.transition(id, to, format!("starting on {worker}")) {
            return;
        }
        info!(job = %id, %worker, epoch, policy = self.policy.name(), "job placed");
        self.out.push(Effect::Event(e));
        self.send(
            worker,
            Command {
                id: command,
                job: id.to_string(),
                epoch,
                action: Action::Start { cpu_shares },
            },
        );
    }

    /// Step 1 of a move: the job is Migrating and its source is told to save. Step 2
    /// ([`Core::restore`]) follows only the save's result.
    fn begin_move(
        &mut self,
        id: &str,
        to: &str,
        reason: MoveReason,
        mut attributes: BTreeMap<String, String>,
    ) -> bool {
        let from = match &self.jobs[id].phase {
            JobPhase::Running { worker } if worker != to => worker.clone(),
            _ => return false,
        };
        if !self.workers.get(to).is_some_and(Worker::schedulable) {
            return false;
        }
        let command = self.next_command_id();
        let m = Move {
            from: from.clone(),
            to: to.to_string(),
            reason,
            phase: MovePhase::Saving {
                command: command.clone(),
            },
            started: self.now,
            restore_attempts: 0,
        };
        if !self.transition(
            id,
            JobPhase::Migrating(m),
            format!("moving {from} -> {to} ({})", reason.as_str()),
        ) {
            return false;
        }
        info!(job = %id, %from, %to, reason = reason.as_str(), "migration started");
        attributes.insert("reason".into(), reason.as_str().into());
        attributes.insert("from".into(), from.clone());
        attributes.insert("to".into(), to.to_string());
        attributes.insert("outcome".into(), "started".into());
        self.migration_event(
            id,
            &from,
            format!("migrating {from} -> {to} ({}): saving", reason.as_str()),
            attributes,
        );
        let epoch = self.jobs[id].epoch;
        self.send(
            &from,
            Command {
                id: command,
                job: id.to_string(),
                epoch,
                action: Action::Save {
                    deadline_ms: self.save_deadline_ms(),
                },
            },
        );
        true
    }

    fn apply(&mut self, decisions: Vec<Decision>) {
        for d in decisions {
            match d {
                Decision::Move {
                    job,
                    to,
                    reason,
                    attributes,
                } => {
                    self.begin_move(&job, &to, reason, attributes);
                }
                Decision::Keep {
                    job,
                    reason,
                    mut attributes,
                } => {
                    let Some(worker) = self.jobs.get(&job).and_then(|j| j.worker().cloned()) else {
                        continue;
                    };
                    info!(%job, %reason, "migration declined");
                    attributes.insert("outcome".into(), "declined".into());
                    self.migration_event(&job, &worker, reason, attributes);
                }
                Decision::Preempt(v) => self.preempt(v),
                Decision::SetLimits { job, cpus } => {
                    let Some(j) = self.jobs.get_mut(&job) else {
                        continue;
                    };
                    let JobPhase::Running { worker } = &j.phase else {
                        continue;
                    };
                    let (worker, epoch) = (worker.clone(), j.epoch);
                    j.assigned_cpus = Some(cpus);
                    self.send_to(
                        &worker,
                        &job,
                        epoch,
                        Action::SetLimits {
                            cpus,
                            cpu_shares: 0,
                        },
                    );
                }
                Decision::Resume {
                    job,
                    cpu_shares,
                    reason,
                } => {
                    let Some(JobPhase::Paused { worker }) =
                        self.jobs.get(&job).map(|j| j.phase.clone())
                    else {
                        continue;
                    };
                    info!(%job, %worker, cpu_shares, "resuming");
                    if self.transition(
                        &job,
                        JobPhase::Running {
                            worker: worker.clone(),
                        },
                        reason,
                    ) {
                        let epoch = self.jobs[&job].epoch;
                        self.send_to(&worker, &job, epoch, Action::Resume);
                        // The share chosen for it now; cpus 0 keeps it unlimited within the
                        // worker, as it started.
                        self.send_to(
                            &worker,
                            &job,
                            epoch,
                            Action::SetLimits {
                                cpus: 0.0,
                                cpu_shares,
                            },
                        );
                    }
                }
                Decision::Drop { job, reason } => {
                    let Some(j) = self.jobs.get(&job) else {
                        continue;
                    };
                    if j.is_terminal() {
                        continue;
                    }
                    info!(%job, %reason, "dropping");
                    if let Some(w) = j.worker().cloned() {
                        let epoch = j.epoch;
                        self.send_to(
                            &w,
                            &job,
                            epoch,
                            Action::Stop {
                                reason: reason.clone(),
                            },
                        );
                    }
                    self.transition(&job, JobPhase::Rejected, reason);
                }
            }
        }
    }

    fn preempt(&mut self, v: Victim) {
        let Some(job) = self.jobs.get(&v.job) else {
            return;
        };
        let Some(worker) = job.worker().cloned() else {
            return;
        };
        let epoch = job.epoch;
        info!(job = %v.job, %worker, how = ?v.how, reason = %v.reason, "preempting");
        match v.how {
            Preempt::Pause => {
                if self.transition(
                    &v.job,
                    JobPhase::Paused {
                        worker: worker.clone(),
                    },
                    v.reason,
                ) {
                    self.send_to(&worker, &v.job, epoch, Action::Pause);
                }
            }
            Preempt::Stop => {
                self.send_to(
                    &worker,
                    &v.job,
                    epoch,
                    Action::Stop {
                        reason: v.reason.clone(),
                    },
                );
                self.transition(&v.job, JobPhase::Rejected, v.reason);
            }
        }
    }

    // ---- helpers ----

    fn next_command_id(&mut self) -> CommandId {
        self.next_command += 1;
        format!("{}-{}", self.config.id_prefix, self.next_command)
    }

    fn save_deadline_ms(&self) -> u32 {
        (self.config.save_deadline * 1000.0)
            .round()
            .clamp(0.0, u32::MAX as f64) as u32
    }

    /// A new command about incarnation `epoch` of `job`, to `worker`.
    fn send_to(&mut self, worker: &str, job: &str, epoch: u64, action: Action) {
        let cmd = Command {
            id: self.next_command_id(),
            job: job.to_string(),
            epoch,
            action,
        };
        self.send(worker, cmd);
    }

    /// Sends `cmd` to `worker`'s stream. With no stream it is not sent: what must still happen
    /// when the agent comes back is re-sent by [`Core::reconcile`].
    fn send(&mut self, worker: &str, command: Command) {
        match self.workers.get(worker).and_then(|w| w.conn) {
            Some(conn) => self.out.push(Effect::Send {
                conn,
                worker: worker.to_string(),
                command,
            }),
            None => {
                debug!(%worker, job = %command.job, action = command.action.name(), "no stream to worker; not sent")
            }
        }
    }

    fn worker_event(&mut self, worker: &str, state: WorkerState, reason: String) {
        let mut e = Event::new(EventKind::WorkerState, reason);
        e.worker = Some(worker.to_string());
        e.worker_state = Some(state);
        self.out.push(Effect::Event(e));
    }

    fn migration_event(
        &mut self,
        id: &str,
        worker: &str,
        reason: String,
        attributes: BTreeMap<String, String>,
    ) {
        let mut e = Event::new(EventKind::Migration, reason);
        e.job = Some(id.to_string());
        e.worker = Some(worker.to_string());
        e.epoch = self.jobs.get(id).map_or(0, |j| j.epoch);
        e.attributes = attributes;
        self.out.push(Effect::Event(e));
    }
}
