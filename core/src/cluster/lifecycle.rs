//! Lifecycles as enums that carry their data, and the one function that decides which
//! transitions are allowed.
//!
//! A job is [`JobPhase::Pending`], `Starting{worker, command}`, `Running{worker}`,
//! `Migrating(Move)` (with `from`, `to` and the phase: `Saving{command}` or
//! `Restoring{command}`), `Lost{worker, since}`, `Paused{worker}`, or one of the terminal
//! phases. The worker an incarnation runs on is part of the phase, so a job cannot be "Running
//! with no worker" or "Migrating with no target". [`allowed`] is the whole transition table:
//! the core refuses (and counts) anything else, and nothing leaves a terminal phase.
//!
//! A worker is `Ready`, `Draining` or `Lost{since, draining}`; liveness applies in every state
//! (a draining worker that stops answering is lost, and when it comes back it drains again).

use std::cell::Cell;
use std::collections::BTreeMap;

use converge_policy::cluster::Category;
use converge_policy::estimate::Estimate;
use serde::{Deserialize, Serialize};

use super::idmap::{IdMap, Keyed};
use super::progress::Progress;
use super::types::{CommandId, JobId, JobSpec, JobState, MoveReason, Time, WorkerId, WorkerState};

/// A move between workers in flight.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Move {
    /// Source worker.
    pub from: WorkerId,
    /// Target worker (changes when a restore is retried elsewhere).
    pub to: WorkerId,
    /// Why.
    pub reason: MoveReason,
    /// Where it is.
    pub phase: MovePhase,
    /// When the save was sent (downtime is measured from here).
    pub started: Time,
    /// Restores tried so far.
    pub restore_attempts: u32,
}

/// Where a move is: save on the source, then a new incarnation on the target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum MovePhase {
    /// Save sent to `from`; no restore is sent before its result.
    Saving {
        /// The Save command, whose result ends this phase.
        command: CommandId,
    },
    /// Start of the new incarnation sent to `to`.
    Restoring {
        /// The Start command (re-sent with the same id after a reconnect).
        command: CommandId,
    },
}

/// A job's lifecycle phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum JobPhase {
    /// Waiting for a worker.
    Pending,
    /// Start sent to `worker`.
    Starting {
        /// Where.
        worker: WorkerId,
        /// The Start (re-sent with the same id after a reconnect).
        command: CommandId,
    },
    /// Runs on `worker`.
    Running {
        /// Where.
        worker: WorkerId,
    },
    /// Being moved.
    Migrating(Move),
    /// Its worker stopped answering at `since`.
    Lost {
        /// The worker.
        worker: WorkerId,
        /// When the worker was declared lost.
        since: Time,
    },
    /// Frozen on `worker` by a value policy.
    Paused {
        /// Where.
        worker: WorkerId,
    },
    /// Its stopping rule fired: being checkpointed and stopped on `worker`, to end Completed.
    Stopping {
        /// Where.
        worker: WorkerId,
        /// The Save, whose result ends it.
        command: CommandId,
        /// What the rule saw, for the final reason.
        why: String,
    },
    /// Exited 0.
    Completed,
    /// Ended in error.
    Failed,
    /// Cancelled by the user.
    Cancelled,
    /// Refused at admission by a value policy.
    Rejected,
    /// Admitted (queued, or run), then given up by a value policy.
    Dropped,
}

impl JobPhase {
    /// The phase without its data.
    pub fn state(&self) -> JobState {
        match self {
            JobPhase::Pending => JobState::Pending,
            JobPhase::Starting { .. } => JobState::Starting,
            JobPhase::Running { .. } => JobState::Running,
            JobPhase::Migrating(_) => JobState::Migrating,
            JobPhase::Lost { .. } => JobState::Lost,
            JobPhase::Paused { .. } => JobState::Paused,
            JobPhase::Stopping { .. } => JobState::Stopping,
            JobPhase::Completed => JobState::Completed,
            JobPhase::Failed => JobState::Failed,
            JobPhase::Cancelled => JobState::Cancelled,
            JobPhase::Rejected => JobState::Rejected,
            JobPhase::Dropped => JobState::Dropped,
        }
    }

    /// The worker the current incarnation is on (or is being started on): the source while a
    /// move saves, the target once it restores.
    pub fn worker(&self) -> Option<&WorkerId> {
        match self {
            JobPhase::Starting { worker, .. }
            | JobPhase::Running { worker }
            | JobPhase::Lost { worker, .. }
            | JobPhase::Paused { worker }
            | JobPhase::Stopping { worker, .. } => Some(worker),
            JobPhase::Migrating(m) => Some(match m.phase {
                MovePhase::Saving { .. } => &m.from,
                MovePhase::Restoring { .. } => &m.to,
            }),
            _ => None,
        }
    }

    /// The worker a move is taking the job to while the job still saves on its source: the
    /// job holds room there from the move's first step ([`Worker::inbound`]).
    pub fn inbound_to(&self) -> Option<&WorkerId> {
        match self {
            JobPhase::Migrating(Move {
                to,
                phase: MovePhase::Saving { .. },
                ..
            }) => Some(to),
            _ => None,
        }
    }

    /// Whether this phase waits for the result of command `id` (the Start, Save or restore
    /// sent to [`JobPhase::worker`] for the current incarnation) to move on.
    pub fn awaits(&self, id: &str) -> bool {
        let awaited = match self {
            JobPhase::Starting { command, .. }
            | JobPhase::Stopping { command, .. }
            | JobPhase::Migrating(Move {
                phase: MovePhase::Saving { command } | MovePhase::Restoring { command },
                ..
            }) => command,
            _ => return false,
        };
        awaited == id
    }

    /// Whether the job shares its worker's CPU in this phase: it runs, or is starting there.
    pub fn shares_cpu(&self) -> bool {
        matches!(self, JobPhase::Running { .. } | JobPhase::Starting { .. })
    }

    /// Whether a phase change to `to` starts a new incarnation (the epoch goes up): a Start,
    /// or a restore with a command other than the one in flight.
    pub fn starts_incarnation(&self, to: &JobPhase) -> bool {
        fn restoring(p: &JobPhase) -> Option<&CommandId> {
            match p {
                JobPhase::Migrating(Move {
                    phase: MovePhase::Restoring { command },
                    ..
                }) => Some(command),
                _ => None,
            }
        }
        match to {
            JobPhase::Starting { .. } => true,
            JobPhase::Migrating(_) => restoring(to).is_some() && restoring(to) != restoring(self),
            _ => false,
        }
    }
}

/// The transition table. Everything not listed is refused; nothing leaves a terminal state.
pub fn allowed(from: &JobPhase, to: &JobPhase) -> bool {
    use JobState as S;
    let (f, t) = (from.state(), to.state());
    if f.is_terminal() {
        return false;
    }
    match (f, t) {
        // Anything live can be cancelled, can fail, or (under a value policy) be turned
        // away or given up.
        (_, S::Cancelled | S::Failed | S::Rejected | S::Dropped) => true,
        (S::Pending, S::Starting) => true,
        // A lost worker's job, still running there when the worker came back before it had
        // started elsewhere (`OwedStop::withdrawable`); paused if its container was (a value
        // policy's victim, frozen).
        (S::Pending, S::Running | S::Paused) => true,
        (S::Starting, S::Running | S::Lost | S::Completed | S::Pending) => true,
        (
            S::Running,
            S::Migrating | S::Lost | S::Paused | S::Stopping | S::Completed | S::Pending,
        ) => true,
        // Saved and stopped (Completed), or the save failed and it runs on (Running).
        (S::Stopping, S::Completed | S::Running | S::Lost) => true,
        // Saving -> Restoring, a retried restore, or back to Running (save failed, restored).
        (S::Migrating, S::Migrating | S::Running | S::Lost | S::Completed | S::Pending) => true,
        (S::Lost, S::Running | S::Paused | S::Pending | S::Completed) => true,
        (S::Paused, S::Running | S::Lost | S::Completed | S::Pending) => true,
        _ => false,
    }
}

/// The worker's last policy view of a job (from heartbeats).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct WorkerView {
    /// FlowCon/SpeCon category.
    pub category: Option<Category>,
    /// Growth efficiency.
    pub growth_efficiency: Option<f64>,
    /// CPU limit (fraction of the worker).
    pub cpu_limit: Option<f64>,
    /// Cores used.
    pub cpu_usage: f64,
}

impl WorkerView {
    /// What a placement snapshot shows of it ([`super::policy::snapshot`]): nothing for a job
    /// with no category yet, and never its CPU use, which changes at nearly every heartbeat (a
    /// heartbeat touches its worker's snapshot only when this changes).
    pub fn shown(&self) -> Option<(Category, Option<f64>, Option<f64>)> {
        Some((self.category?, self.growth_efficiency, self.cpu_limit))
    }
}

/// One incarnation: which worker an epoch was started on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Incarnation {
    /// The epoch.
    pub epoch: u64,
    /// Its worker.
    pub worker: WorkerId,
}

/// A finished move waiting for the first progress line on its target (for its downtime).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Resuming {
    /// The move.
    pub from: WorkerId,
    /// Where it resumed.
    pub to: WorkerId,
    /// Why it moved.
    pub reason: MoveReason,
    /// When the save was sent.
    pub started: Time,
}

/// Every job the core holds, by id ([`IdMap`]: found by hash, walked in id order).
pub type Jobs = IdMap<Job>;

/// Every worker the core knows, by id ([`IdMap`]).
pub type Workers = IdMap<Worker>;

impl Keyed for Job {
    fn key(&self) -> &JobId {
        &self.id
    }
}

impl Keyed for Worker {
    fn key(&self) -> &WorkerId {
        &self.id
    }
}

/// A cache of what a job's points say, with the sample count it was read at
/// ([`Job::points_estimate`]). A cache, not state: it prints as nothing, so a job that only
/// had its estimate read is not a changed job.
#[derive(Clone, Default)]
pub struct Memo(Cell<Option<(u64, Option<Estimate>)>>);

impl Memo {
    /// The estimate kept for `samples` samples, or `None` when it was made at another count
    /// (or never).
    pub fn at(&self, samples: u64) -> Option<Option<Estimate>> {
        self.0
            .get()
            .filter(|(at, _)| *at == samples)
            .map(|(_, e)| e)
    }

    /// Keeps `estimate`, made at `samples` samples.
    pub fn keep(&self, samples: u64, estimate: Option<Estimate>) {
        self.0.set(Some((samples, estimate)));
    }
}

impl std::fmt::Debug for Memo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Memo")
    }
}

/// An `Option<f64>` in the eight bytes of its `f64`: NaN stands for none. A job keeps nine
/// of them (times, durations, a core count, its metric, its predicted finishes), each 16 bytes
/// as an `Option`: 144 of the 704 bytes every live job took, the most of any field, in a
/// manager that keeps 100,000 of them under its 2 KB a job (docs/performance.md, "Memory per
/// live job"). None of them is ever NaN: times and durations come from the core's clock,
/// predicted finishes from the forecast (which clamps its rates, `forecast.rs`), core counts
/// from the policies' splits (only when above zero), and the contract refuses non-finite
/// metrics. A NaN given to it reads back as none, as `Some(NaN)` would not. It stores and
/// prints as the `Option` it stands for, so stored records are as they were (a record without
/// the field reads it as none, as serde reads a missing `Option`), and compares as that
/// `Option` too: none equals none, which two NaNs would not.
#[derive(Clone, Copy)]
pub struct OptF64(f64);

impl OptF64 {
    /// None.
    pub const NONE: OptF64 = OptF64(f64::NAN);

    /// The value, if any.
    pub fn get(self) -> Option<f64> {
        (!self.0.is_nan()).then_some(self.0)
    }

    /// Whether it holds a value.
    pub fn is_some(self) -> bool {
        !self.0.is_nan()
    }

    /// Whether it holds none.
    pub fn is_none(self) -> bool {
        self.0.is_nan()
    }
}

impl PartialEq for OptF64 {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl Default for OptF64 {
    fn default() -> Self {
        OptF64::NONE
    }
}

impl From<Option<f64>> for OptF64 {
    fn from(v: Option<f64>) -> Self {
        OptF64(v.unwrap_or(f64::NAN))
    }
}

impl From<f64> for OptF64 {
    fn from(v: f64) -> Self {
        OptF64(v)
    }
}

impl std::fmt::Debug for OptF64 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.get().fmt(f)
    }
}

impl Serialize for OptF64 {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.get().serialize(s)
    }
}

impl<'de> Deserialize<'de> for OptF64 {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Option::<f64>::deserialize(d).map(OptF64::from)
    }
}

/// One job.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Job {
    /// Its id.
    pub id: JobId,
    /// Submission order (FIFO among pending jobs).
    pub seq: u64,
    /// What the decisions need of its spec.
    pub spec: JobSpec,
    /// Lifecycle phase.
    pub phase: JobPhase,
    /// Why it is in its phase, in words.
    pub reason: String,
    /// Current incarnation (0 = never started). Only ever goes up.
    pub epoch: u64,
    /// Every incarnation's worker, oldest first.
    pub incarnations: Vec<Incarnation>,
    /// Container of the current incarnation, once started.
    pub container_id: String,
    /// Submitted.
    pub submitted_at: Time,
    /// First started.
    pub started_at: OptF64,
    /// Reached a terminal phase.
    pub finished_at: OptF64,
    /// Latest step.
    pub step: u64,
    /// Step budget, when the job says.
    pub total_steps: u64,
    /// Latest metric value.
    pub metric_value: OptF64,
    /// Progress samples received in all.
    pub samples: u64,
    /// Malformed progress lines reported.
    pub malformed: u64,
    /// The most recent progress points. A store keeps only the last
    /// [`STORED_PROGRESS`](super::progress::STORED_PROGRESS): enough for the estimates and the
    /// stopping rule to go on after a restart, and a record of bounded size however long the
    /// history kept in memory.
    pub progress: Progress,
    /// The estimate its points give ([`converge_policy::estimate::from_points`]) and the
    /// sample count it was made at: kept until the next point arrives. Placement and
    /// rebalancing ask for every live job's estimate, and decoding every job's points each
    /// time was most of `converge`'s time in the simulator. Not stored.
    #[serde(skip)]
    pub points_estimate: Memo,
    /// What its worker last reported of it.
    pub view: WorkerView,
    /// When `view` was last reported (its CPU use counts from then).
    pub view_at: OptF64,
    /// When the report before it was: `view`'s CPU use is the average since about then
    /// (the ETA's forecast reads it only if the worker's jobs were the same all that time).
    /// Not stored.
    #[serde(skip)]
    pub view_from: OptF64,
    /// The cores `view`'s use showed it can use (none: not held by itself), read against the
    /// split it was measured under when a job left its worker since (the forecast's
    /// `Core::read_caps`). Read only while that use is the newest. Not stored.
    #[serde(skip)]
    pub cap_read: OptF64,
    /// The most cores a report of its incarnation showed it use, of the reports the forecast
    /// reads (`forecast::settled`: none that averages over a change of its worker's jobs):
    /// what the forecast reads as the least it can use, whatever its neighbours and the host
    /// leave it now. A new incarnation starts afresh (another worker, another start). One
    /// report's use dips with the host's load, a job's parallelism does not: read off the last
    /// report alone, every job on a busy host was taken, at one sample in two, for one that
    /// can use no more than it then did (a walk: ETAs of 7 min and 63 min, 5 s apart); read off
    /// the reports since its worker's jobs last changed, a job held back on a busy host as one
    /// ended and a shorter one came ahead was read as able to use only its starved use (a
    /// walk: ETAs 10 times too long). Stored: a restart would forget it too.
    pub use_most: OptF64,
    /// The Pause or Resume last sent to its container, until it is answered
    /// ([`Core::freeze`](super::Core)): one that fails leaves the container as it was, and
    /// the job's phase goes back to say so. Not stored: a restarted manager reads the
    /// container's state from its agent's registration.
    #[serde(skip)]
    pub freezing: Option<Freezing>,
    /// Reference core-seconds used in all incarnations (heartbeats' CPU use × time × the
    /// worker's speed): the service the job has had.
    pub cpu_s: f64,
    /// The CPU limit (cores) the policy last gave it, if it sets limits.
    pub assigned_cpus: OptF64,
    /// The latest step a checkpoint of it holds (what a move or a kill would resume from).
    pub checkpoint_step: Option<u64>,
    /// The finish time predicted when it passed 25%, 50% and 75% of its steps (to measure the
    /// predictions against the real finish).
    pub predicted_at: [OptF64; 3],
    /// Finished moves.
    pub migrations: u32,
    /// Downtime of the last finished move, in seconds.
    pub last_migration_downtime: OptF64,
    /// A move waiting for its first progress line (measurement only; decides nothing). Boxed:
    /// rare, and 64 bytes inline in every job.
    pub resuming: Option<Box<Resuming>>,
    /// Exit code of the last incarnation.
    pub exit_code: Option<i32>,
}

impl Job {
    /// Its service (reference core-seconds) as of time `t`: what heartbeats have counted
    /// (`cpu_s`), and since the last (`view_at`) its CPU use then at a worker of `speed`, as
    /// the next heartbeat counts it. A progress point takes it as of its line's time, not its
    /// arrival: lines buffered across a gap (a manager's restart, a cut connection) came with
    /// the service of before the gap against the steps made during it, and the rate read over
    /// them was several times off either way (a walk: ETAs of 57 min, 2 h and 4 min within
    /// 30 s of a manager's restart).
    pub fn service_at(&self, t: f64, speed: f64) -> f64 {
        match self.view_at.get() {
            Some(at) => self.cpu_s + self.view.cpu_usage.max(0.0) * (t - at).max(0.0) * speed,
            None => self.cpu_s,
        }
    }

    /// Keeps [`Job::use_most`] with the use `used` of the report just read (`view_from` is the
    /// time of the one before), its worker's jobs having been the same since `shared_since`:
    /// a report that averages over a change of them is not read.
    pub(super) fn note_use(&mut self, used: f64, shared_since: f64) {
        if self.view_from.get().is_some_and(|t| t >= shared_since) {
            self.use_most = self.use_most.get().map_or(used, |m| m.max(used)).into();
        }
    }

    /// How far the finish times predicted at 25%, 50% and 75% of its steps were off, each as
    /// a fraction of its run (first start to finish): what users were told against what
    /// happened. `None` unless it completed, and for a quarter it never reported past.
    pub fn eta_errors(&self) -> [Option<f64>; 3] {
        let (Some(started), Some(finished)) = (self.started_at.get(), self.finished_at.get())
        else {
            return [None; 3];
        };
        // A job that failed or was given up did not finish when predicted or otherwise.
        if !matches!(self.phase, JobPhase::Completed) {
            return [None; 3];
        }
        let run = (finished - started).max(1e-9);
        self.predicted_at
            .map(|p| p.get().map(|p| (p - finished).abs() / run))
    }

    /// The phase without its data.
    pub fn state(&self) -> JobState {
        self.phase.state()
    }

    /// Whether it is over.
    pub fn is_terminal(&self) -> bool {
        self.state().is_terminal()
    }

    /// The worker of the current incarnation.
    pub fn worker(&self) -> Option<&WorkerId> {
        self.phase.worker()
    }

    /// Whether incarnation `epoch` on `worker` is the job's current one: the one its phase
    /// runs, starts or waits for there.
    pub fn is_current(&self, worker: &str, epoch: u64) -> bool {
        self.epoch == epoch && self.worker().is_some_and(|w| w == worker)
    }

    /// Where the job is, for users: the worker of the current incarnation, or for a finished
    /// job, where its last incarnation ran (a pending job has none).
    pub fn shown_worker(&self) -> Option<&WorkerId> {
        self.worker().or_else(|| {
            self.is_terminal()
                .then(|| self.incarnations.last().map(|i| &i.worker))
                .flatten()
        })
    }

    /// Whether incarnation `epoch` was started on `worker`: what an agent may speak about.
    pub fn ran_on(&self, worker: &str, epoch: u64) -> bool {
        self.incarnations
            .iter()
            .any(|i| i.epoch == epoch && i.worker == worker)
    }
}

/// One worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Worker {
    /// Its id.
    pub id: WorkerId,
    /// Lifecycle state.
    pub state: WorkerPhase,
    /// Cores offered.
    pub cpu_capacity: f64,
    /// Memory offered (0 = unknown).
    pub memory_bytes: u64,
    /// Speed relative to the reference worker.
    pub calibration: f64,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// The live stream, if any (not stored: a restarted manager has no streams yet).
    #[serde(skip)]
    pub conn: Option<super::types::ConnId>,
    /// The agent process behind it.
    pub instance_id: String,
    /// Last registration or heartbeat.
    pub last_seen: Time,
    /// Last message of any kind: under load a heartbeat can wait behind progress in the same
    /// stream, and a manager slow to read must not declare a worker that keeps talking lost.
    /// Not stored (it changes with every message; a restarted manager gives every worker a
    /// grace period instead).
    #[serde(skip)]
    pub last_heard: Time,
    /// FlowCon threshold, when reported.
    pub alpha: Option<f64>,
    /// FlowCon interval, when reported.
    pub interval_s: Option<f64>,
    /// Jobs whose current incarnation is here (kept by the core's one transition function).
    /// Not stored: it follows from the jobs' phases, and a record that grew with every job
    /// placed would be rewritten in full at every placement.
    #[serde(skip)]
    pub jobs: JobSet,
    /// Jobs a move is bringing here that still save on their source
    /// ([`JobPhase::inbound_to`]). Their requests count here as well as on the source
    /// (`policy::snapshot`): counted only once their incarnation came, the room a move was
    /// going to looked free for the whole save, and a pending job placed in it overbooked the
    /// target (a drain's move and a new job, 1.5 cores of requests on 1 core). Not stored,
    /// like `jobs`.
    #[serde(skip)]
    pub inbound: JobSet,
    /// When a job last stopped sharing its CPU (moved, paused, ended): the others' parts grew
    /// then, and a job's CPU use measured before says what it had of the old split, not what
    /// it can use. (A job that comes shrinks the others' parts: a use below the new part was
    /// below the old one too, and still shows a cap.) Not stored (a restarted manager reads
    /// every use as it comes).
    #[serde(skip)]
    pub shared_since: Time,
    /// Stops sent here that no answer or exit has shown to be carried out: a Stop sent to a
    /// stream that was gone, or that broke before its agent read it. Kept apart from the jobs
    /// because a stopped job may be archived (`Core::archive`) before its agent is back, and
    /// an agent that reports a running container of a job the core no longer holds is
    /// otherwise left alone (`Core::reconcile`). An entry goes with an answer to its Stop (the
    /// agent answers once the container has stopped, or that there was none), its
    /// container's exit, or a registration that does not report the container running. Not
    /// stored: a restarted manager reloads the newest finished jobs, and reconcile stops
    /// their containers from those.
    #[serde(skip)]
    pub stops_owed: Vec<OwedStop>,
}

/// A Pause or Resume sent and not yet answered ([`Job::freezing`]). Its answer is read by
/// what it was, not by the job's phase when it comes: an agent sends unacknowledged results
/// again after a reconnection, and a failed Pause that came back after the job had been
/// re-adopted running was read as a failed Resume, and paused a job that trained on (a
/// review).
#[derive(Debug, Clone, PartialEq)]
pub struct Freezing {
    /// The command.
    pub command: super::types::CommandId,
    /// A Pause (else a Resume).
    pub pause: bool,
}

/// A Stop sent to a worker and not yet shown to be carried out ([`Worker::stops_owed`]).
#[derive(Debug, Clone, PartialEq)]
pub struct OwedStop {
    /// The job.
    pub job: JobId,
    /// The incarnation told to stop.
    pub epoch: u64,
    /// The latest Stop sent for it.
    pub command: CommandId,
    /// What its container holds until it stops: the job's request when the stop was sent
    /// (kept here: the job may be archived before its container stops).
    pub request: converge_policy::cluster::JobRequest,
    /// The Start (or restore) that was under way when the stop was sent: its container may
    /// come after the stop found none.
    pub start: Option<CommandId>,
    /// A lost worker's job restarted elsewhere, whose stop never left: its worker had no
    /// stream. If the worker comes back with the container still running before the job
    /// has started anywhere else, the stop is withdrawn and the job re-adopted there
    /// (`Core::reconcile`): killing it lost every step since its checkpoint (a new user's
    /// walk: 259,640 steps of a job without checkpoints) to save a restart that had not
    /// begun. Not kept across a manager's restart: a restarted manager stops it as before.
    pub withdrawable: bool,
    /// A Stop for it went down a live stream: a container of it still listed running when its
    /// worker registers again is stopping, not a stray (a review: a stop in flight across a
    /// reconnection was said and counted as one).
    pub sent: bool,
}

/// A worker's jobs, in id order: a sorted `Vec`. Every heartbeat walks its worker's jobs (the
/// weights, the snapshot placement reads), and a worker holds a few tens of them: a sorted
/// slice is read in one pass over adjacent ids, where a B-tree set went through its node and
/// kept room for eleven. Adding or removing one moves the ids after it: a few tens on a real
/// worker, up to 16 KB of ids at the harness's 1,000 jobs to an agent (`load memory`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobSet(Vec<JobId>);

impl JobSet {
    /// Where `id` is, or would go.
    fn find(&self, id: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|o| o.as_str().cmp(id))
    }

    /// Adds `id`; false if it was there.
    pub fn insert(&mut self, id: JobId) -> bool {
        match self.find(&id) {
            Ok(_) => false,
            Err(k) => {
                self.0.insert(k, id);
                true
            }
        }
    }

    /// Removes `id`; false if it was not there.
    pub fn remove(&mut self, id: &str) -> bool {
        match self.find(id) {
            Ok(k) => {
                self.0.remove(k);
                true
            }
            Err(_) => false,
        }
    }

    /// Whether `id` is here.
    pub fn contains(&self, id: &str) -> bool {
        self.find(id).is_ok()
    }

    /// The ids, in order.
    pub fn iter(&self) -> std::slice::Iter<'_, JobId> {
        self.0.iter()
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Removes them all.
    pub fn clear(&mut self) {
        self.0.clear();
    }
}

impl<'a> IntoIterator for &'a JobSet {
    type Item = &'a JobId;
    type IntoIter = std::slice::Iter<'a, JobId>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

/// A worker's lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum WorkerPhase {
    /// Takes new work.
    Ready,
    /// Takes no new work; its jobs move away as capacity allows.
    Draining,
    /// Missed its heartbeats since `since`; `draining` says what it returns to.
    Lost {
        /// When it was declared lost.
        since: Time,
        /// It was draining: when it comes back, it drains again.
        draining: bool,
    },
}

impl WorkerPhase {
    /// The state without its data.
    pub fn state(self) -> WorkerState {
        match self {
            WorkerPhase::Ready => WorkerState::Ready,
            WorkerPhase::Draining => WorkerState::Draining,
            WorkerPhase::Lost { .. } => WorkerState::Lost,
        }
    }

    /// What a worker in this phase is when it is heard from again: a lost worker returns to
    /// what it was (a drained one stays drained); the others stay as they are.
    pub fn heard_from(self) -> WorkerPhase {
        match self {
            WorkerPhase::Lost { draining: true, .. } => WorkerPhase::Draining,
            WorkerPhase::Lost { .. } => WorkerPhase::Ready,
            other => other,
        }
    }

    /// Whether it is draining (also while lost).
    pub fn draining(self) -> bool {
        matches!(
            self,
            WorkerPhase::Draining | WorkerPhase::Lost { draining: true, .. }
        )
    }
}

impl Worker {
    /// The jobs placed here: those whose incarnation is here ([`Worker::jobs`]), then those a
    /// move is bringing ([`Worker::inbound`]). What the placement snapshot counts and what
    /// `converge` predicts a worker's finishes from: a job on its way will run here.
    pub fn placed(&self) -> impl Iterator<Item = &JobId> {
        self.jobs.iter().chain(self.inbound.iter())
    }

    /// The containers here told to stop and not yet seen to, one per job, of jobs not placed
    /// here ([`Worker::stops_owed`]): a job here is counted once, as placed. What the
    /// placement snapshot holds room for and what `workers` lists as stopping.
    pub fn stopping(&self) -> impl Iterator<Item = &OwedStop> {
        (self.stops_owed.iter().enumerate())
            .filter(|&(i, o)| {
                !self.jobs.contains(&o.job) && !self.stops_owed[..i].iter().any(|s| s.job == o.job)
            })
            .map(|(_, o)| o)
    }

    /// When the worker last showed it is alive.
    pub fn alive_at(&self) -> Time {
        self.last_seen.max(self.last_heard)
    }

    /// Whether new work may be placed here now.
    pub fn schedulable(&self) -> bool {
        self.state == WorkerPhase::Ready && self.conn.is_some()
    }

    /// The memory jobs may reserve here: unbounded when its agent gave none.
    pub fn memory_capacity(&self) -> u64 {
        if self.memory_bytes == 0 {
            u64::MAX
        } else {
            self.memory_bytes
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running() -> JobPhase {
        JobPhase::Running {
            worker: "w1".into(),
        }
    }

    #[test]
    fn nothing_leaves_a_terminal_phase() {
        for t in [
            JobPhase::Completed,
            JobPhase::Failed,
            JobPhase::Cancelled,
            JobPhase::Rejected,
            JobPhase::Dropped,
        ] {
            for to in [
                JobPhase::Pending,
                running(),
                JobPhase::Cancelled,
                JobPhase::Completed,
            ] {
                assert!(!allowed(&t, &to), "{t:?} -> {to:?}");
            }
        }
    }

    /// A pending job starts a new incarnation, or (a lost worker's job re-adopted where it
    /// still runs) runs on as the incarnation it was.
    #[test]
    fn pending_starts_a_new_incarnation_or_runs_on_as_the_old_one() {
        let starting = JobPhase::Starting {
            worker: "w1".into(),
            command: "c".into(),
        };
        assert!(allowed(&JobPhase::Pending, &starting));
        assert!(JobPhase::Pending.starts_incarnation(&starting));
        assert!(allowed(&JobPhase::Pending, &running()));
        assert!(!JobPhase::Pending.starts_incarnation(&running()));
    }

    #[test]
    fn a_move_can_only_begin_from_running() {
        let m = JobPhase::Migrating(Move {
            from: "w1".into(),
            to: "w2".into(),
            reason: MoveReason::Drain,
            phase: MovePhase::Saving {
                command: "s".into(),
            },
            started: 0.0,
            restore_attempts: 0,
        });
        assert!(allowed(&running(), &m));
        assert!(!allowed(&JobPhase::Pending, &m));
        assert!(!allowed(
            &JobPhase::Paused {
                worker: "w1".into()
            },
            &m
        ));
        assert!(!allowed(
            &JobPhase::Lost {
                worker: "w1".into(),
                since: 0.0
            },
            &m
        ));
    }

    /// `OptF64` is stored and read back as the `Option<f64>` it stands for, and takes the
    /// eight bytes it exists to save (a job's record: `a_stored_job_keeps_its_optional_times`).
    #[test]
    fn an_opt_f64_stores_as_the_option_it_stands_for() {
        assert_eq!(std::mem::size_of::<OptF64>(), 8);
        for v in [None, Some(0.0), Some(-2.5), Some(1.0e300)] {
            let text = serde_json::to_string(&OptF64::from(v)).unwrap();
            assert_eq!(text, serde_json::to_string(&v).unwrap());
            assert_eq!(serde_json::from_str::<OptF64>(&text).unwrap().get(), v);
            assert_eq!(OptF64::from(v).is_some(), v.is_some());
            assert_eq!(format!("{:?}", OptF64::from(v)), format!("{v:?}"));
        }
        // Compared as the `Option`: none is none (two NaNs are unequal as floats), a value
        // is itself and not none, and a NaN given in reads as none.
        let values = [None, Some(0.0), Some(-0.0), Some(1.5)];
        for a in values {
            for b in values {
                assert_eq!(OptF64::from(a) == OptF64::from(b), a == b, "{a:?} == {b:?}");
            }
        }
        assert_eq!(OptF64::from(f64::NAN), OptF64::NONE);
    }

    /// A worker's jobs are walked in id order, whatever order they came in (the weights and
    /// placement's sums and ties depend on it), and each is held once.
    #[test]
    fn a_job_set_keeps_its_ids_once_and_in_order() {
        let mut set = JobSet::default();
        for id in ["c", "a", "d", "b", "a"] {
            set.insert(id.into());
        }
        assert!(!set.insert("c".into()), "c was there");
        let ids = |set: &JobSet| set.iter().map(|i| i.to_string()).collect::<Vec<_>>();
        assert_eq!(ids(&set), ["a", "b", "c", "d"]);
        assert!(set.remove("b") && !set.remove("b") && !set.remove("e"));
        assert!(set.contains("d") && !set.contains("b"));
        assert_eq!(
            (ids(&set), set.len()),
            (vec!["a".into(), "c".into(), "d".into()], 3)
        );
        set.clear();
        assert!(set.is_empty());
    }
}
