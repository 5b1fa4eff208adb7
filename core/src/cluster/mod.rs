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
//! the shell answers them from [`Core::jobs`], [`Core::workers`] and [`Core::eta`].
//!
//! Files: this one holds the types, the step and the transition function; `control` the user's
//! requests; `agents` what agents say; `moves` checkpoint moves; `time` liveness and recovery;
//! `decide` placement and carrying out the policy's decisions. The records themselves are in
//! `lifecycle` (jobs and workers, kept in [`idmap::IdMap`]s: found by hash, walked in id order).

pub mod forecast;
pub mod idmap;
pub mod index;
pub mod lifecycle;
pub mod policy;
pub mod progress;
pub mod saved;
pub mod types;

mod agents;
mod control;
mod decide;
mod kinds;
mod moves;
mod pass;
mod reasons;
mod time;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap, VecDeque};

use converge_policy::estimate::Basis;
use tracing::{debug, info, warn};

use lifecycle::{
    Incarnation, Job, JobPhase, Jobs, Move, MovePhase, OptF64, Resuming, Worker, WorkerPhase,
    WorkerView, Workers,
};
use policy::{Admission, ClusterPolicy, ClusterView, Decision, Preempt, Report, Victim};
use progress::{Progress, ProgressPoint};
use types::*;

/// Progress points a job keeps by default: what its estimators read (the throughput over the
/// last 30 core-seconds and the curve fit of `converge_policy::estimate`) at a report a second,
/// and about 1.5 KB of a live job's memory. The manager and the simulator keep the same.
pub const PROGRESS_HISTORY: usize = 32;

/// The least time between two progress points a job keeps (its lines between are counted, and
/// move its step, but are not points): the heartbeat's default interval, which is when a
/// point's CPU time changes.
pub const POINT_EVERY_MS: i64 = 1_000;

/// Finished jobs a core keeps in memory by default ([`Config::keep_finished`]): enough for late
/// messages about recent jobs to be recognised, and a few hundred KB.
pub const KEEP_FINISHED: usize = 1_000;

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
    /// Finished jobs kept in memory (the most recently finished); older ones are archived:
    /// dropped from the core once stored ([`Core::archive`]), and the shell answers for them
    /// from its store. `usize::MAX` keeps every job (a manager without a store). The
    /// simulator keeps what the manager keeps, and the archived records themselves
    /// ([`Core::archive_records`]) for its report.
    pub keep_finished: usize,
    /// Command ids are `{id_prefix}-{n}`: unique per manager process (the shell passes its
    /// manager id), deterministic in the simulator.
    pub id_prefix: String,
    /// Whether the core notes which records each step changes ([`Core::take_changes`]), for a
    /// shell that stores them. A manager without a store and the simulator keep no notes:
    /// each heartbeat noted every job it reported on, in sets the simulator made and dropped
    /// at every step (dropping them alone was 4% of Docker Swarm's samples at 10,000 workers,
    /// `docs/performance.md`).
    pub record_changes: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            heartbeat_interval: 1.0,
            lost_after_missed: 3,
            recover_lost_after: 30.0,
            save_deadline: 30.0,
            progress_history: PROGRESS_HISTORY,
            keep_finished: KEEP_FINISHED,
            id_prefix: "cmd".into(),
            record_changes: true,
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
        /// Who, for the job's reason (a token's name); empty when the API is open.
        by: String,
    },
    /// The user drains a worker.
    Drain {
        /// The worker.
        worker: WorkerId,
    },
    /// The user undrains a worker: it takes jobs again.
    Undrain {
        /// The worker.
        worker: WorkerId,
    },
    /// The user forgets a lost worker that holds no jobs: it leaves the cluster's records (as
    /// `kubectl delete node`). An agent that registers under its id later is a new worker.
    Forget {
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
            Input::Undrain { .. } => "undrain",
            Input::Forget { .. } => "forget",
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
    /// Refuse the registration on stream `conn`, and close it saying `reason`.
    Rejected {
        /// The stream.
        conn: ConnId,
        /// The worker it registered as.
        worker: WorkerId,
        /// Why, for the agent to log.
        reason: String,
    },
    /// Close stream `conn`: the worker it spoke for was forgotten (`Input::Forget`). Its
    /// agent, should it still be there, connects again and registers as a new worker.
    Close {
        /// The stream.
        conn: ConnId,
        /// The worker it was.
        worker: WorkerId,
        /// Why, for the agent to log.
        reason: String,
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

impl Effect {
    /// Whether the effect leaves the manager (a command, an answer, an event a watcher sees):
    /// a durable shell stores what the step changed before carrying out any such effect. A
    /// step with none (most progress and heartbeats) may be stored later, with the next: losing
    /// it in a crash is the same as losing its message in transit, which the protocol survives.
    pub fn is_observable(&self) -> bool {
        !matches!(self, Effect::Refused { .. })
    }
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
    /// No such worker (never registered here, or forgotten).
    #[error("no worker `{0}` is registered")]
    WorkerNotFound(WorkerId),
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
    /// A second agent process registering as a worker whose agent is connected.
    SecondAgent,
}

impl Refusal {
    /// Every kind, for a metric's series shown before the first refusal.
    pub const ALL: [Refusal; 5] = [
        Refusal::ForeignJob,
        Refusal::UnknownJob,
        Refusal::StaleStream,
        Refusal::Transition,
        Refusal::SecondAgent,
    ];

    /// Label for metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::ForeignJob => "foreign_job",
            Refusal::UnknownJob => "unknown_job",
            Refusal::StaleStream => "stale_stream",
            Refusal::Transition => "transition",
            Refusal::SecondAgent => "second_agent",
        }
    }
}

/// The manager's decision core (module doc).
pub struct Core {
    config: Config,
    policy: Box<dyn ClusterPolicy>,
    workers: Workers,
    jobs: Jobs,
    /// Pending jobs by submission order.
    pending: BTreeMap<u64, JobId>,
    /// The pending jobs counted by kind, with the reason each kind's jobs hold
    /// ([`kinds::Kinds`]).
    kinds: kinds::Kinds,
    /// `(seq, touches)`: every pending job up to submission number `seq` was told to wait for
    /// room ([`Admission::Wait`]'s `for_room`) in a pass that changed nothing, when the
    /// placement index had been touched `touches` times. While that count stays, no worker's
    /// snapshot changed, and the next pass asks only the jobs after `seq` ([`Core::schedule`]).
    waiting_for_room: Option<(u64, u64)>,
    /// Tests: every pass asks the policy about every pending job, as before either shortcut
    /// of [`Core::schedule`] (the twin a property test holds the shortcuts to).
    #[cfg(test)]
    every_pass_full: bool,
    /// Tests: how many jobs in a row whose kinds hold their answers a pass visits before it
    /// skips ([`pass::RUN`]); the property tests skip at every such job, where their small
    /// backlogs would seldom make a run.
    #[cfg(test)]
    skip_after: usize,
    /// Which worker each live stream belongs to: every agent message looks its stream up
    /// here first, and a B-tree of 10,000 streams was a search of four nodes where a hash
    /// probe is one (never walked, so its order does not matter; ids are the shell's
    /// counters, chosen by no stranger).
    conns: HashMap<ConnId, WorkerId, foldhash::fast::RandomState>,
    next_seq: u64,
    next_command: u64,
    /// The time of the step being taken.
    now: Time,
    /// What the step being taken produced.
    out: Vec<Effect>,
    /// Jobs that left a worker in this step, for the policy; a worker without a job: room
    /// offered where no job left ([`Core::offer_room`]).
    departures: VecDeque<(WorkerId, Option<JobId>)>,
    /// Capacity appeared or a job became pending: place and drain again before returning.
    dirty: bool,
    /// Sizes of the jobs that completed (for estimates of jobs nothing else tells about).
    history: converge_policy::estimate::ServiceHistory,
    /// Records changed since the shell last took them (for the store; `saved`); `None` when
    /// the core keeps no notes ([`Config::record_changes`]).
    changes: Option<saved::Changes>,
    /// A restarted manager declares no worker lost before this (`saved`).
    grace_until: Time,
    /// Every worker's placement snapshot, refreshed where the core wrote (`index`).
    index: index::PlacementIndex,
    /// Jobs in memory that finished, oldest first (for archiving).
    finished: VecDeque<JobId>,
    /// The longest migration downtime of the archived jobs (what `last_migration_downtime`
    /// of every job still says, when some are no longer in memory).
    archived_downtime: Option<f64>,
    /// Jobs in phase Lost, kept by [`Core::transition`]: when there are none, the timer need
    /// not look every live job up for one to recover (a walk per tick that grows with the
    /// jobs, for what is almost always nothing).
    lost: usize,
    /// Live jobs with a value curve, kept where jobs enter (submit, restore) and end
    /// ([`Core::transition`]): `converge` walks every live job at each tick for value curves
    /// gone to zero, and on traces with none, finding that out walked them all (a tenth of a
    /// 1,000-worker simulation's samples).
    valued: usize,
}

/// Worker `id`, to change, with the store told ([`Core::worker_record_mut`]). Over the two
/// fields rather than the core, so that [`Core::worker_mut`] can touch the placement index
/// while it holds the worker.
fn worker_record<'a>(
    workers: &'a mut Workers,
    changes: &mut Option<saved::Changes>,
    id: &str,
) -> Option<&'a mut Worker> {
    let w = workers.get_mut(id)?;
    if let Some(changes) = changes {
        changes.worker(&w.id);
    }
    Some(w)
}

/// The longer of two migration downtimes, either of which may be unknown.
pub(crate) fn max_downtime(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// The policies' view of core `$core`, with its placement index brought up to date first.
/// (A macro, not a method: the view borrows some fields while the policy, another field, is
/// called mutably.)
macro_rules! policy_view {
    ($core:expr) => {{
        $core.index.refresh(&$core.workers, &$core.jobs);
        ClusterView {
            workers: &$core.workers,
            jobs: &$core.jobs,
            history: &$core.history,
            index: &$core.index,
            archived_downtime: $core.archived_downtime,
            valued: $core.valued,
        }
    }};
}
pub(crate) use policy_view;

impl Core {
    /// An empty cluster run by `policy`.
    pub fn new(config: Config, policy: Box<dyn ClusterPolicy>) -> Self {
        let record_changes = config.record_changes;
        Core {
            config,
            index: index::PlacementIndex::new(policy.placer_index(), policy.orders_by_crowd()),
            policy,
            workers: Workers::new(),
            jobs: Jobs::new(),
            pending: BTreeMap::new(),
            kinds: kinds::Kinds::default(),
            conns: HashMap::default(),
            next_seq: 0,
            next_command: 0,
            now: 0.0,
            out: Vec::new(),
            departures: VecDeque::new(),
            dirty: false,
            waiting_for_room: None,
            #[cfg(test)]
            every_pass_full: false,
            #[cfg(test)]
            skip_after: pass::RUN,
            history: Default::default(),
            changes: record_changes.then(Default::default),
            grace_until: Time::NEG_INFINITY,
            finished: VecDeque::new(),
            archived_downtime: None,
            lost: 0,
            valued: 0,
        }
    }

    /// One job.
    pub fn job(&self, id: &str) -> Option<&Job> {
        self.jobs.get(id)
    }

    /// Every job, by id.
    pub fn jobs(&self) -> &Jobs {
        &self.jobs
    }

    /// One worker.
    pub fn worker(&self, id: &str) -> Option<&Worker> {
        self.workers.get(id)
    }

    /// Every worker, by id.
    pub fn workers(&self) -> &Workers {
        &self.workers
    }

    /// The policy's name.
    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// Whether the policy reads jobs' value curves ([`ClusterPolicy::reads_value_curves`]).
    pub fn policy_reads_value_curves(&self) -> bool {
        self.policy.reads_value_curves()
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

    /// When job `id` will finish (and, pending, start), as far as its reports tell, at `now`:
    /// its worker's queue run forward under the policy's split ([`forecast`]).
    pub fn eta(&self, id: &str, now: Time) -> Option<Eta> {
        self.etas(now).eta(id)
    }

    /// ETAs of many jobs at `now`, each worker's queue forecast once (a listing asks for
    /// every job).
    pub fn etas(&self, now: Time) -> forecast::Etas<'_> {
        forecast::Etas::new(self, now)
    }

    /// Whether every placement snapshot equals one built afresh from the workers and jobs, and
    /// the counts of Lost and of live valued jobs are right (tests check it after every step:
    /// a write that bypassed the core's three doors would leave a stale snapshot or a wrong
    /// count), and every job's current incarnation, where it has a worker, is among its
    /// incarnations (what lets an agent's report about it be accepted without reading that
    /// list: `refusal`).
    #[cfg(test)]
    pub(crate) fn derived_state_is_fresh(&self) -> bool {
        let lost = self
            .jobs
            .values()
            .filter(|j| matches!(j.phase, JobPhase::Lost { .. }));
        let valued =
            (self.jobs.values()).filter(|j| !j.is_terminal() && j.spec.value_curve.is_some());
        let current_recorded =
            (self.jobs.values()).all(|j| j.worker().is_none_or(|w| j.ran_on(w, j.epoch)));
        // Each worker's sets of jobs, as its jobs' phases say: each job is in the sets its
        // phase names, and the sets hold no other.
        let (mut named, mut held) = (0, 0);
        let mut sets_follow_phases = true;
        for j in self.jobs.values() {
            if let Some(w) = j.phase.worker() {
                named += 1;
                sets_follow_phases &= (self.workers.get(w)).is_some_and(|w| w.jobs.contains(&j.id));
            }
            if let Some(w) = j.phase.inbound_to() {
                named += 1;
                sets_follow_phases &=
                    (self.workers.get(w)).is_some_and(|w| w.inbound.contains(&j.id));
            }
        }
        for w in self.workers.values() {
            held += w.jobs.len() + w.inbound.len();
        }
        sets_follow_phases &= named == held;
        let pending = (self.pending.iter()).map(|(&seq, id)| {
            let job = &self.jobs[id];
            (seq, self.policy.wait_kind(job), job.reason.as_str())
        });
        self.index.is_fresh(&self.workers, &self.jobs)
            && self.kinds.counts(pending)
            && lost.count() == self.lost
            && valued.count() == self.valued
            && current_recorded
            && sets_follow_phases
    }

    /// A read-only view for policies and shells (between steps its placement index is up to
    /// date: every step ends by refreshing it).
    pub fn view(&self) -> ClusterView<'_> {
        ClusterView {
            workers: &self.workers,
            jobs: &self.jobs,
            history: &self.history,
            index: &self.index,
            archived_downtime: self.archived_downtime,
            valued: self.valued,
        }
    }

    /// Consumes one input at time `now` and returns what to do (module doc).
    pub fn step(&mut self, now: Time, input: Input) -> Vec<Effect> {
        self.now = now;
        match input {
            Input::Submit { id, spec } => {
                let r = self.submit(id, spec);
                self.out.push(Effect::Reply(r));
            }
            Input::Cancel { id, by } => {
                let r = self.cancel(&id, &by);
                self.out.push(Effect::Reply(r));
            }
            Input::Drain { worker } => {
                let r = self.set_draining(&worker, true);
                self.out.push(Effect::Reply(r));
            }
            Input::Undrain { worker } => {
                let r = self.set_draining(&worker, false);
                self.out.push(Effect::Reply(r));
            }
            Input::Forget { worker } => {
                let r = self.forget_worker(&worker);
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
        self.index.refresh(&self.workers, &self.jobs);
        std::mem::take(&mut self.out)
    }

    /// Drops the oldest finished jobs beyond [`Config::keep_finished`] from memory and returns
    /// their ids. The shell calls it once everything it took with [`Core::take_changes`] is
    /// stored: a job changed since then (its final record not yet taken) stays. Archived jobs'
    /// records stay in the store, which answers for them from then on.
    pub fn archive(&mut self) -> Vec<JobId> {
        self.archive_records().into_iter().map(|j| j.id).collect()
    }

    /// [`Core::archive`], returning the dropped jobs' final records instead of their ids: for
    /// a shell without a store that still answers for them (the simulator's report), so that
    /// it runs the core with the manager's memory of finished jobs.
    #[allow(clippy::vec_box)] // as `drop_finished`
    pub fn archive_records(&mut self) -> Vec<Box<Job>> {
        self.drop_finished(|core, _| core.finished.len() > core.config.keep_finished)
    }

    /// Drops from memory the finished jobs that finished before `before` and returns their
    /// ids: the shell's retention (`--finished-retention`), after it deleted them from its
    /// store, so that memory and store forget a job together. Oldest first, under the same
    /// rule as [`Core::archive`] for jobs changed since the last [`Core::take_changes`].
    pub fn expire(&mut self, before: Time) -> Vec<JobId> {
        self.drop_finished(|core, id| {
            core.jobs
                .get(id)
                // No finish time counts as the oldest, as in the store and `from_saved`.
                .is_none_or(|j| j.finished_at.get().is_none_or(|t| t < before))
        })
        .into_iter()
        .map(|j| j.id)
        .collect()
    }

    /// Drops the oldest finished jobs from memory while `more(self, oldest)` holds, and
    /// returns their records (in the boxes the map held them in: a job's record is large, and
    /// moving it out of its box only to drop or keep it elsewhere would copy it).
    #[allow(clippy::vec_box)]
    fn drop_finished(&mut self, more: impl Fn(&Self, &str) -> bool) -> Vec<Box<Job>> {
        let mut dropped = Vec::new();
        while let Some(id) = self.finished.front() {
            if !more(self, id) || self.changes.as_ref().is_some_and(|c| c.jobs.contains(id)) {
                break;
            }
            let id = self.finished.pop_front().expect("non-empty");
            if let Some(j) = self.jobs.remove(&id) {
                self.archived_downtime =
                    max_downtime(self.archived_downtime, j.last_migration_downtime.get());
                dropped.push(j);
            }
        }
        dropped
    }

    /// Moves job `id` to `to`, if the lifecycle allows it; returns whether it did. Keeps the
    /// epoch, the incarnations, the pending queue, the per-worker index and the event log in
    /// step with the phase. A refused transition is counted and logged, never applied.
    pub fn transition(&mut self, id: &str, to: JobPhase, reason: impl Into<String>) -> bool {
        let now = self.now;
        let Some(job) = self.jobs.get(id) else {
            return false;
        };
        // It leaves its worker's CPU to the others, whose parts grow: what their uses show is
        // read now, against the split they were measured under.
        let leaves = job.phase.shares_cpu()
            && (!to.shares_cpu() || job.phase.worker() != to.worker())
            && lifecycle::allowed(&job.phase, &to);
        if leaves && let Some(w) = job.phase.worker().cloned() {
            self.read_caps(&w);
        }
        let job = self.jobs.get_mut(id).expect("just found");
        // The job's own id, shared by every set and queue that names it.
        let id = job.id.clone();
        if let Some(changes) = &mut self.changes {
            changes.job(&id);
        }
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
        let old_inbound = job.phase.inbound_to().cloned();
        let new_inbound = to.inbound_to().cloned();
        let new_incarnation = job.phase.starts_incarnation(&to);
        if new_incarnation {
            job.epoch += 1;
            job.use_most = OptF64::NONE;
            // Most jobs have one incarnation: a first push would make room for four
            // (128 bytes a job at 100,000 jobs under heaptrack; `docs/performance.md`).
            if job.incarnations.is_empty() {
                job.incarnations.reserve_exact(1);
            }
            job.incarnations.push(Incarnation {
                epoch: job.epoch,
                worker: new_worker.clone().expect("an incarnation has a worker"),
            });
            job.container_id.clear();
            job.view = WorkerView::default();
            job.view_at = OptF64::NONE;
            job.view_from = OptF64::NONE;
            job.cap_read = OptF64::NONE;
            job.assigned_cpus = OptF64::NONE;
        }
        if from_state == JobState::Pending {
            self.pending.remove(&job.seq);
            self.kinds
                .left(self.policy.wait_kind(job), job.seq, &job.reason);
        }
        if to.state() == JobState::Pending {
            self.pending.insert(job.seq, id.clone());
            self.kinds
                .joined(self.policy.wait_kind(job), job.seq, &reason);
            self.dirty = true;
        }
        if to.state() == JobState::Running {
            // Its first start, however it was learnt (the Start's result or, when that was
            // lost, its first progress line).
            if job.started_at.is_none() {
                job.started_at = now.into();
            }
        }
        if to.state().is_terminal() {
            job.finished_at = now.into();
            job.resuming = None;
            if !from_state.is_terminal() {
                self.finished.push_back(id.clone());
                self.valued -= usize::from(job.spec.value_curve.is_some());
            }
        }
        if to.state() == JobState::Completed {
            self.history.record(job.cpu_s);
            if let Some(changes) = &mut self.changes {
                changes.history = true;
            }
        }
        self.lost -= usize::from(matches!(job.phase, JobPhase::Lost { .. }));
        self.lost += usize::from(matches!(to, JobPhase::Lost { .. }));
        job.phase = to;
        job.reason = reason.clone();
        let (epoch, to_state) = (job.epoch, job.state());
        // A placement snapshot reads a job's worker, spec and view: a transition changes the
        // first when the job comes or goes, the last when an incarnation starts (its view is
        // reset). Any other (Starting to Running, a pause) leaves the snapshot as it was;
        // rebuilding it anyway walked every job of the worker for each Start's answer (29% of
        // a `store_bench` round's samples, 15% after; `docs/performance.md`).
        let moved = old_worker != new_worker;
        if leaves && let Some(w) = old_worker.as_ref().and_then(|w| self.workers.get_mut(w)) {
            w.shared_since = now;
        }
        // A job that comes to run on a draining worker (its Start answered after the drain
        // began) is one more for the drain to move: without another pass it stayed there.
        // (One back to running after a failed save is not: the drain tries it again at the
        // next pass, not at once and again at every step while saves fail.)
        if from_state == JobState::Starting
            && to_state == JobState::Running
            && new_worker
                .as_ref()
                .and_then(|w| self.workers.get(w))
                .is_some_and(|w| w.state.draining())
        {
            self.dirty = true;
        }
        if moved || new_incarnation {
            for w in old_worker.iter().chain(&new_worker) {
                self.index.touch(w);
            }
        }
        if old_inbound != new_inbound {
            if let Some(w) = old_inbound.as_ref().and_then(|w| self.workers.get_mut(w)) {
                w.inbound.remove(&id);
                self.index.touch(&w.id);
            }
            if let Some(w) = new_inbound.as_ref().and_then(|w| self.workers.get_mut(w)) {
                w.inbound.insert(id.clone());
                self.index.touch(&w.id);
            }
        }
        if moved {
            // The per-worker index is rebuilt from the phases on restore: no store write.
            if let Some(w) = old_worker.as_ref().and_then(|w| self.workers.get_mut(w)) {
                w.jobs.remove(&id);
            }
            if let Some(w) = new_worker.as_ref().and_then(|w| self.workers.get_mut(w)) {
                w.jobs.insert(id.clone());
            }
            if let Some(w) = old_worker.clone() {
                self.departures.push_back((w, Some(id.clone())));
                self.dirty = true;
            }
        }
        self.policy.on_transition(&id, old_worker.as_ref());
        let mut attributes = BTreeMap::new();
        if to_state == JobState::Completed {
            for (q, e) in ["25", "50", "75"].iter().zip(job.eta_errors()) {
                if let Some(e) = e {
                    attributes.insert(format!("eta_error_{q}"), format!("{e:.4}"));
                }
            }
        }
        if from_state != to_state {
            info!(job = %id, from = from_state.label(), to = to_state.label(), %reason, "job state");
            let mut e = Event::new(EventKind::JobState, reason);
            e.attributes = attributes;
            e.job = Some(id);
            e.worker = new_worker.or(old_worker);
            e.epoch = epoch;
            e.from = Some(from_state);
            e.to = Some(to_state);
            self.out.push(Effect::Event(e));
        }
        true
    }

    /// Job `id`, to change it: the one way the core writes a job outside [`Core::transition`],
    /// so that the store hears of every change.
    pub(super) fn job_mut(&mut self, id: &str) -> Option<&mut Job> {
        let j = self.jobs.get_mut(id)?;
        if let Some(changes) = &mut self.changes {
            changes.job(&j.id);
        }
        // No placement snapshot reads what a progress line changes; the job fields one does
        // read (its view) are written only in its worker's heartbeat, which touches the
        // worker, or by `transition` (`index`).
        Some(j)
    }

    /// Worker `id`, to change it (as [`Core::job_mut`]).
    pub(super) fn worker_mut(&mut self, id: &str) -> Option<&mut Worker> {
        let w = worker_record(&mut self.workers, &mut self.changes, id)?;
        self.index.touch(&w.id);
        Some(w)
    }

    /// Worker `id`, to change only what no placement snapshot shows (the store still hears):
    /// a heartbeat, which touches the placement index itself when what it wrote changes the
    /// worker's snapshot. Rebuilding the snapshot at every heartbeat was a sixth of the
    /// simulator at 10,000 workers (`docs/performance.md`); tests check after every step
    /// that every snapshot equals a fresh one.
    pub(super) fn worker_record_mut(&mut self, id: &str) -> Option<&mut Worker> {
        worker_record(&mut self.workers, &mut self.changes, id)
    }

    /// Worker `id`'s own id, shared: a phase, an incarnation or an effect that names the
    /// worker holds a clone of the registered id, not a copy of the text it was given (a
    /// copy per running job, 64 bytes at the allocator; `docs/performance.md`). A new one for
    /// a worker the core does not hold.
    pub(super) fn worker_id(&self, id: &str) -> WorkerId {
        self.workers
            .get_key_value(id)
            .map_or_else(|| id.into(), |(k, _)| k.clone())
    }

    pub(super) fn next_command_id(&mut self) -> CommandId {
        self.next_command += 1;
        format!("{}-{}", self.config.id_prefix, self.next_command).into()
    }

    /// The Save (checkpoint and stop) command `id` for incarnation `epoch` of `job`, with the
    /// configured deadline: a move's first step, a stop at convergence, and their re-sends.
    pub(super) fn save_command(&self, id: CommandId, job: &str, epoch: u64) -> Command {
        let deadline_ms = (self.config.save_deadline * 1000.0)
            .round()
            .clamp(0.0, u32::MAX as f64) as u32;
        Command {
            id,
            job: job.into(),
            epoch,
            action: Action::Save { deadline_ms },
        }
    }

    /// Changes `worker`'s owed stops ([`Worker::stops_owed`]) by `change`. A stopping
    /// container holds its room in the placement snapshot (`policy::snapshot`), which is
    /// rebuilt when the stops it holds change; a stop carried out frees room for the jobs
    /// that wait.
    pub(super) fn owed_stops(
        &mut self,
        worker: &str,
        change: impl FnOnce(&mut Vec<lifecycle::OwedStop>),
    ) {
        let Some(w) = self.workers.get_mut(worker) else {
            return;
        };
        let before = w.stops_owed.len();
        change(&mut w.stops_owed);
        let after = w.stops_owed.len();
        if after != before {
            let id = w.id.clone();
            self.index.touch(&id);
            self.dirty |= after < before;
        }
    }

    /// Sends `action` for `job`'s incarnation `epoch` to `worker`, under a new command id,
    /// which it returns.
    pub(super) fn send_to(
        &mut self,
        worker: &str,
        job: &str,
        epoch: u64,
        action: Action,
    ) -> CommandId {
        let id = self.next_command_id();
        let cmd = Command {
            id: id.clone(),
            job: job.into(),
            epoch,
            action,
        };
        self.send(worker, cmd);
        id
    }

    /// Sends job `job`'s container on `worker` a Pause (`pause`) or a Resume, remembered until
    /// it is answered ([`Job::freezing`]): sent without waiting, with the job's phase changed
    /// as it goes, one that failed left a job said to be paused running on (Docker's freezer
    /// failed a Pause on a new user's walk) with nothing but a warning in the log.
    pub(super) fn freeze(&mut self, worker: &str, job: &str, epoch: u64, pause: bool) {
        let action = if pause { Action::Pause } else { Action::Resume };
        let id = self.send_to(worker, job, epoch, action);
        // Not stored: no store write.
        if let Some(j) = self.jobs.get_mut(job) {
            j.freezing = Some(lifecycle::Freezing { command: id, pause });
        }
    }

    /// Job `id`, paused on `worker`, runs again for `why`: its phase, then its container.
    /// Whether it was resumed (its phase allowed it).
    pub(super) fn unpause(&mut self, id: &str, worker: &WorkerId, why: String) -> bool {
        let running = JobPhase::Running {
            worker: worker.clone(),
        };
        if !self.transition(id, running, why) {
            return false;
        }
        let epoch = self.jobs[id].epoch;
        self.freeze(worker, id, epoch, false);
        true
    }

    /// Sends `cmd` to `worker`'s stream. With no stream it is not sent: what must still happen
    /// when the agent comes back is re-sent by [`Core::reconcile`]. A Stop is noted as owed
    /// until its container is seen to exit ([`Worker::stops_owed`]), sent or not: a stream
    /// can break with the command unread.
    pub(super) fn send(&mut self, worker: &str, command: Command) {
        if let Action::Stop { .. } = command.action {
            let (job, epoch) = (&command.job, command.epoch);
            let j = self.jobs.get(job);
            let request = j.map_or(
                converge_policy::cluster::JobRequest {
                    cpus: 0.0,
                    memory_bytes: 0,
                },
                |j| policy::request(&j.spec),
            );
            let start = j.and_then(|j| match &j.phase {
                JobPhase::Starting { command, .. }
                | JobPhase::Migrating(Move {
                    phase: MovePhase::Restoring { command },
                    ..
                }) if j.epoch == epoch => Some(command.clone()),
                _ => None,
            });
            let live = self.workers.get(worker).is_some_and(|w| w.conn.is_some());
            self.owed_stops(worker, |owed| {
                match (owed.iter_mut()).find(|o| o.job == *job && o.epoch == epoch) {
                    Some(o) => {
                        o.command = command.id.clone();
                        o.start = start;
                        o.withdrawable = false;
                        o.sent |= live;
                    }
                    None => owed.push(lifecycle::OwedStop {
                        job: job.clone(),
                        epoch,
                        command: command.id.clone(),
                        request,
                        start,
                        withdrawable: false,
                        sent: live,
                    }),
                }
            });
        }
        match self.workers.get(worker).and_then(|w| w.conn) {
            Some(conn) => self.out.push(Effect::Send {
                conn,
                worker: self.worker_id(worker),
                command,
            }),
            None => {
                debug!(%worker, job = %command.job, action = command.action.name(), "no stream to worker; not sent")
            }
        }
    }

    pub(super) fn worker_event(&mut self, worker: &str, state: WorkerState, reason: String) {
        let mut e = Event::new(EventKind::WorkerState, reason);
        e.worker = Some(worker.into());
        e.worker_state = Some(state);
        self.out.push(Effect::Event(e));
    }

    /// Ends job `id`'s move, if it is moving, as `abandoned` (`why`): the job is cancelled,
    /// dropped or lost with its worker. A move that began ends in an outcome, in its events,
    /// metrics and trace, however it ends (a new user saw one `started` and never ended).
    pub(super) fn abandon_move(&mut self, id: &str, why: &str) {
        let Some(JobPhase::Migrating(m)) = self.jobs.get(id).map(|j| &j.phase) else {
            return;
        };
        let attributes = BTreeMap::from([
            ("outcome".to_string(), "abandoned".to_string()),
            ("reason".to_string(), m.reason.as_str().to_string()),
        ]);
        // Where its incarnation is: the source while it saves, the target once it restores.
        let worker = self.jobs[id]
            .worker()
            .cloned()
            .unwrap_or_else(|| m.from.clone());
        self.migration_event(id, &worker, format!("abandoned: {why}"), attributes);
    }

    pub(super) fn migration_event(
        &mut self,
        id: &str,
        worker: &str,
        reason: String,
        attributes: BTreeMap<String, String>,
    ) {
        self.job_event(EventKind::Migration, id, worker, reason, attributes);
    }

    /// Records an event of `kind` about job `id` on `worker`, at the job's epoch.
    pub(super) fn job_event(
        &mut self,
        kind: EventKind,
        id: &str,
        worker: &str,
        reason: String,
        attributes: BTreeMap<String, String>,
    ) {
        let epoch = self.jobs.get(id).map_or(0, |j| j.epoch);
        self.job_event_at(kind, id, worker, epoch, reason, attributes);
    }

    /// Records an event of `kind` about incarnation `epoch` of job `id` on `worker`.
    pub(super) fn job_event_at(
        &mut self,
        kind: EventKind,
        id: &str,
        worker: &str,
        epoch: u64,
        reason: String,
        attributes: BTreeMap<String, String>,
    ) {
        let mut e = Event::new(kind, reason);
        e.job = Some(id.into());
        e.worker = Some(worker.into());
        e.epoch = epoch;
        e.attributes = attributes;
        self.out.push(Effect::Event(e));
    }
}
