//! The one interface every cluster policy implements, and the policies.
//!
//! The core asks a [`ClusterPolicy`] four things: where a pending job goes ([`ClusterPolicy::place`]),
//! where a job that must leave its worker goes ([`ClusterPolicy::place_move`]: drains, restore
//! retries), what it makes of a worker's report ([`ClusterPolicy::on_report`]) and of a job
//! leaving a worker ([`ClusterPolicy::on_departure`]), and what it does on a timer
//! ([`ClusterPolicy::on_tick`]). Answers are data ([`Admission`], [`Decision`]); the core carries
//! them out through its one transition function. A policy keeps its own state (SpeCon's
//! migrated/rebalanced marks, value shares) and never writes a job's or a worker's.
//!
//! - [`placing::Placing`]: a `converge_policy` placer and nothing else: `spread`,
//!   `least-allocated`, `round-robin`, and `flowcon` (Alg. 4 placement; FlowCon's limits run on
//!   the workers).
//! - [`specon::SpeConPolicy`]: SpeCon's Alg. 2 on agents' migration requests and Alg. 3 on a
//!   timer, around a placer: `specon` and `converge`.
//! - [`value::ValuePolicy`]: value-based allocation (DwoP, DwP): `value`, `value-dwop`.
//! - [`priority::PriorityPolicy`]: CPU split on every worker by a priority, set from here as
//!   CPU weights: `converge` (Converge's own: shortest predicted remaining work first, placement
//!   on the fewest jobs per reference core, then by the marginal sum of completion times) and `las`
//!   (Tiresias' least attained service, spread placement).
//!
//! [`by_name`] builds a policy from its `--policy` name.

pub mod placing;
pub mod priority;
pub mod specon;
pub mod value;

use std::collections::BTreeMap;

use converge_policy::Ranked;
use converge_policy::cluster::{JobRequest, JobSnapshot, Scores, WorkerSnapshot};
use converge_policy::estimate::{self, Estimate, Known, Point, ServiceHistory};

use super::forecast::Load;
use super::index::PlacementIndex;
use super::lifecycle::{Job, Jobs, Worker, Workers};
use super::types::{JobId, JobSpec, MoveReason, Time, WorkerId, WorkerMode};

/// What the policies see: the core's workers and jobs, read-only.
#[derive(Clone, Copy)]
pub struct ClusterView<'a> {
    /// Workers by id (sorted: every policy sees them in the same order).
    pub workers: &'a Workers,
    /// Jobs by id.
    pub jobs: &'a Jobs,
    /// Sizes of completed jobs.
    pub history: &'a ServiceHistory,
    /// Every worker's placement snapshot (`index`).
    pub index: &'a PlacementIndex,
    /// The longest migration downtime among archived jobs (no longer in `jobs`).
    pub archived_downtime: Option<f64>,
    /// How many live jobs have a value curve (what the value-aware decisions weigh; none on
    /// most clusters).
    pub valued: usize,
}

/// What a job's user said it needs (`estimated_runtime_s`), less the service it has had.
fn declared_left(job: &Job) -> Option<f64> {
    let declared = job.spec.estimated_runtime_s;
    (declared > 0.0).then(|| (declared - job.cpu_s).max(0.0))
}

/// What a placer sees of worker `w`: its reservations and its jobs' last reports.
///
/// A job a move is bringing here counts as placed here from the move's first step
/// ([`Worker::inbound`]), though it reports nothing here until it restores. A container told
/// to stop keeps its room until it is seen to stop ([`Worker::stops_owed`]), as a terminating
/// pod does in Kubernetes: a job placed in the room of a cancelled one ran beside it for up to
/// the stop's deadline (a new user's walk: 2 cores of containers on a 1-core worker). It does
/// not count among the jobs (`running`): its job has ended.
pub fn snapshot(w: &Worker, jobs: &Jobs) -> WorkerSnapshot {
    let here: Vec<&Job> = w.jobs.iter().filter_map(|id| jobs.get(id)).collect();
    // Walked for each sum rather than gathered: a rebuild is on the placement path, and
    // there is almost never a job on its way or stopping.
    let placed = || (here.iter().copied()).chain(w.inbound.iter().filter_map(|id| jobs.get(id)));
    let holding = || (placed().map(|j| request(&j.spec))).chain(w.stopping().map(|o| o.request));
    WorkerSnapshot {
        id: w.id.clone(),
        cpu_capacity: w.cpu_capacity,
        cpu_requested: holding().map(|r| r.cpus).sum(),
        memory_capacity: w.memory_capacity(),
        memory_requested: holding().map(|r| r.memory_bytes).sum(),
        cpu_requested_nonzero: holding().map(|r| r.nonzero().0).sum(),
        memory_requested_nonzero: holding().map(|r| r.nonzero().1).sum(),
        running: placed().count(),
        calibration: w.calibration,
        schedulable: w.schedulable(),
        jobs: here
            .iter()
            .filter_map(|j| {
                let (category, growth_efficiency, cpu_limit) = j.view.shown()?;
                Some(JobSnapshot {
                    job_id: j.id.clone(),
                    category,
                    growth_efficiency,
                    cpu_limit,
                })
            })
            .collect(),
    }
}

impl<'a> ClusterView<'a> {
    /// The jobs sharing `w`'s CPU: running or starting there (a starting job needs room
    /// too, though only a running one can be weighted).
    pub fn sharing(&self, w: &'a Worker) -> Vec<&'a Job> {
        let jobs = self.jobs;
        w.jobs
            .iter()
            .filter_map(|id| jobs.get(id))
            .filter(|j| j.phase.shares_cpu())
            .collect()
    }

    /// One snapshot per worker, in id order, with the worker ids (from the core's placement
    /// index: up to date, built only where something changed).
    pub fn snapshots(&self) -> (&'a [WorkerId], &'a [WorkerSnapshot]) {
        (self.index.ids(), self.index.snapshots())
    }

    /// What a placer sees of worker `w`, built afresh.
    pub fn snapshot(&self, w: &Worker) -> WorkerSnapshot {
        snapshot(w, self.jobs)
    }

    /// The longest migration downtime any job ever had (its last move's), archived or not.
    pub fn longest_downtime(&self) -> Option<f64> {
        self.jobs.values().fold(self.archived_downtime, |m, j| {
            crate::cluster::max_downtime(m, j.last_migration_downtime.get())
        })
    }

    /// Index of `worker` in [`ClusterView::snapshots`] order.
    pub fn index_of(&self, worker: &str) -> Option<usize> {
        self.index.position(worker)
    }

    /// The work `job` has left and what it rests on: what the job tells of itself before what
    /// other jobs tell of it (its points, else its user's declared runtime, else finished
    /// jobs' sizes; [`converge_policy::estimate`]). The decisions ([`ClusterView::remaining_work`])
    /// and the ETAs read this one order, so an ETA's basis is the one its number came from.
    pub fn estimate(&self, job: &Job) -> Option<Estimate> {
        self.points_estimate(job)
            .or_else(|| declared_left(job).map(estimate::declared))
            .or_else(|| estimate::from_attained(job.cpu_s, self.history))
    }

    /// Core-seconds of work `job` has left, by what is known of it: its progress points, else
    /// what its user declared (`estimated_runtime_s`, less the service it has had), else what
    /// finished jobs of its attained service needed. The user's word comes before the other
    /// jobs': it is about this job (placed by the others' median, a new job of the value study
    /// was counted ~460 s whatever its user said). Placement, the limits' order and the
    /// forecast of each worker's running jobs all read this, so the order a decision assumes
    /// is the order the weights give (a pending job's ETA still starts from its estimate).
    pub fn remaining_work(&self, job: &Job) -> Option<f64> {
        self.estimate(job).map(|e| e.work)
    }

    /// [`ClusterView::remaining_work`] when it comes from the job itself, not from other jobs,
    /// and can be trusted to shrink as the job runs: its points, or its user's estimate less
    /// the service it has had while that service is known (before its first start, or once a
    /// heartbeat reported its CPU use: an agent that reports none would leave it at the full
    /// estimate however long the job has run). What a job is turned away or given up on.
    pub fn own_remaining_work(&self, job: &Job) -> Option<f64> {
        let service_known = job.started_at.is_none() || job.view_at.is_some();
        self.points_estimate(job)
            .map(|e| e.work)
            .or_else(|| declared_left(job).filter(|_| service_known))
    }

    /// What the job's own progress points say of its remaining work, if they say anything
    /// ([`estimate::from_points`]); [`ClusterView::estimate`] falls back on finished jobs.
    pub fn points_estimate(&self, job: &Job) -> Option<Estimate> {
        // What the points say changes only with a new point (`Job::samples` counts them; the
        // budget comes with them); what attained service says changes with every heartbeat.
        match job.points_estimate.at(job.samples) {
            Some(e) => e,
            None => {
                let e = estimate::from_points(&Known {
                    points: &points(job),
                    total_steps: (job.total_steps > 0).then_some(job.total_steps),
                    stop: job.spec.stop,
                    maximize: job.spec.maximize,
                    attained: job.cpu_s,
                });
                job.points_estimate.keep(job.samples, e);
                e
            }
        }
    }

    /// Steps per core-second the job has shown lately, if it has.
    pub fn throughput(&self, job: &Job) -> Option<f64> {
        estimate::throughput(&points(job), estimate::THROUGHPUT_WINDOW).map(|t| t.steps_per_core_s)
    }

    /// Core-seconds of work `job` would lose if stopped now without a new checkpoint: its
    /// steps since the last checkpoint over its throughput (all of its steps when it has none).
    pub fn work_at_risk(&self, job: &Job) -> f64 {
        let since = job.step.saturating_sub(job.checkpoint_step.unwrap_or(0));
        self.throughput(job)
            .map_or(job.cpu_s, |r| since as f64 / r.max(1e-9))
    }
}

/// A job's kept progress as the estimators read it.
fn points(job: &Job) -> Vec<Point> {
    job.progress
        .iter()
        .map(|p| Point {
            time: p.unix_ms as f64 / 1000.0,
            step: p.step,
            value: p.value,
            cpu_s: p.cpu_s,
        })
        .collect()
}

/// What a job asks of a placer.
pub fn request(spec: &JobSpec) -> JobRequest {
    JobRequest {
        cpus: spec.cpus,
        memory_bytes: spec.memory_bytes,
    }
}

/// Jobs a policy tells to wait for room alike ([`ClusterPolicy::wait_kind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WaitKind {
    /// 0 for a request; a policy's own kinds from 1.
    class: u8,
    /// The request's CPUs, as bits (`+0.0` for `-0.0`, which `==` takes as equal).
    cpus: u64,
    memory_bytes: u64,
}

impl WaitKind {
    /// Jobs that ask for the same resources ([`request`]); `None` for a request of CPUs that
    /// are not a number, which `==` finds equal to none (the manager refuses one; the
    /// simulator and tests drive the core directly).
    pub fn request(spec: &JobSpec) -> Option<Self> {
        let r = request(spec);
        (!r.cpus.is_nan()).then(|| WaitKind {
            class: 0,
            cpus: (r.cpus + 0.0).to_bits(),
            memory_bytes: r.memory_bytes,
        })
    }

    /// A kind of a policy's own, whatever the jobs ask for; `class` tells its kinds apart
    /// (from 1: 0 is a request's).
    pub fn class(class: u8) -> Self {
        assert!(class > 0, "class 0 is a request's kind");
        WaitKind {
            class,
            cpus: 0,
            memory_bytes: 0,
        }
    }
}

/// Scores an event lists at most: a placement over 10,000 workers would otherwise write
/// 10,000 scores into every event (and the store, and the trace), which no one reads.
pub const SCORES_SHOWN: usize = 16;

/// `w1=0.5 w2=0.25`: the scores a placer compared, for events. Over [`SCORES_SHOWN`] workers,
/// the chosen one's and those of the eligible workers scored closest to it (its nearest rivals),
/// in worker order, then how many were left out.
pub fn scores_text(ids: &[WorkerId], scores: &[f64], chosen: usize) -> String {
    if ids.len() <= SCORES_SHOWN {
        return entries(ids, 0..ids.len(), |i| scores[i]);
    }
    shown_text(ids, shown_places(scores, chosen), |i| scores[i])
}

/// [`scores_text`] of a placer's [`Scores`]: where it scored only a few workers, the same
/// text without a score written for every other one.
pub fn placement_text(ids: &[WorkerId], scores: &Scores, chosen: usize) -> String {
    if let Scores::Few { scored, rest, .. } = scores {
        // What the sparse text assumes of the workers left out, and of the chosen one.
        debug_assert!(
            !rest.is_finite(),
            "the workers a placer left out are ineligible"
        );
        debug_assert!(
            scored.iter().any(|s| s.0 == chosen),
            "the chosen worker is scored"
        );
    }
    match scores {
        Scores::Every(s) => scores_text(ids, s, chosen),
        Scores::Few { scored, .. } if ids.len() > SCORES_SHOWN => {
            sparse_scores_text(ids, scored, chosen)
        }
        few => entries(ids, 0..ids.len(), |i| few[i]),
    }
}

/// The places an event lists of `scores` (one per worker): every one up to [`SCORES_SHOWN`]
/// workers, ineligible ones too; over that, the chosen one and the eligible scores nearest it.
pub fn shown_places(scores: &[f64], chosen: usize) -> Vec<usize> {
    if scores.len() <= SCORES_SHOWN {
        (0..scores.len()).collect()
    } else {
        let shown = nearest_rivals(scores.iter().copied().enumerate(), chosen, scores[chosen]);
        shown.into_iter().map(|(i, _)| i).collect()
    }
}

/// [`scores_text`] where only the workers in `scored` (place, score) have a score, every
/// other one being ineligible: the same text, for a placement that scored only a few of more
/// than [`SCORES_SHOWN`] workers.
pub fn sparse_scores_text(ids: &[WorkerId], scored: &[(usize, f64)], chosen: usize) -> String {
    let c = (scored.iter().find(|s| s.0 == chosen))
        .expect("the chosen worker is among the scored")
        .1;
    let shown = nearest_rivals(scored.iter().copied(), chosen, c);
    let score = |i: usize| {
        shown
            .iter()
            .find(|s| s.0 == i)
            .map_or(f64::INFINITY, |s| s.1)
    };
    shown_text(ids, shown.iter().map(|s| s.0).collect(), score)
}

/// The workers an event shows of `scores` ((place, score) pairs), with their scores: `chosen`
/// (whose score is `c`) and the [`SCORES_SHOWN`] - 1 eligible (finite) scores nearest it, by
/// distance then place, in no particular order.
fn nearest_rivals(
    scores: impl Iterator<Item = (usize, f64)>,
    chosen: usize,
    c: f64,
) -> Vec<(usize, f64)> {
    // One pass that keeps only the nearest so far: most workers are turned away by one
    // comparison with the farthest kept, where selecting among all of them moved every one (a
    // tenth of a 10,000-worker simulation; `docs/performance.md`).
    let mut nearest = std::collections::BinaryHeap::with_capacity(SCORES_SHOWN);
    for (i, s) in scores.filter(|&(i, s)| i != chosen && s.is_finite()) {
        // The score rides along as bits (places differ, so it never decides the order).
        let rival = (Ranked((s - c).abs(), i), s.to_bits());
        if nearest.len() < SCORES_SHOWN - 1 {
            nearest.push(rival);
        } else if nearest.peek().is_some_and(|far| rival.0 < far.0) {
            nearest.pop();
            nearest.push(rival);
        }
    }
    let mut shown: Vec<(usize, f64)> = (nearest.into_iter())
        .map(|(r, s)| (r.1, f64::from_bits(s)))
        .collect();
    shown.push((chosen, c));
    shown
}

/// The text of [`scores_text`] over more than [`SCORES_SHOWN`] workers, once the workers to
/// show (the chosen one and its nearest rivals) are known, in any order.
pub fn shown_text(ids: &[WorkerId], mut shown: Vec<usize>, score: impl Fn(usize) -> f64) -> String {
    shown.sort_unstable();
    let more = ids.len() - shown.len();
    format!("{} (+{more} more)", entries(ids, shown, score))
}

/// `w1=0.5 w2=0.25` for the workers `shown`, in the order given; each score to four decimals
/// (`walk-1=10.474373169020446` said nothing more to a reader than `10.4744`).
fn entries(
    ids: &[WorkerId],
    shown: impl IntoIterator<Item = usize>,
    score: impl Fn(usize) -> f64,
) -> String {
    // `+ 0.0`: a score rounded to nothing is 0, not -0.
    let shown_score = |x: f64| {
        if x.is_finite() {
            (x * 1e4).round() / 1e4 + 0.0
        } else {
            x
        }
    };
    (shown.into_iter())
        .map(|i| format!("{}={}", ids[i], shown_score(score(i))))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A policy's answer for a pending job.
#[derive(Debug, Clone, PartialEq)]
pub enum Admission {
    /// Start it on `worker`.
    Place {
        /// Where.
        worker: WorkerId,
        /// CPU weight to start with (0 = default).
        cpu_shares: u32,
        /// Jobs to preempt first (value-based allocation with preemption).
        victims: Vec<Victim>,
        /// Why, in words.
        reason: String,
        /// Details for the event (scores, expected value, ...).
        attributes: BTreeMap<String, String>,
    },
    /// Not now; tried again on the next change.
    Wait {
        /// Why, in words a user can act on.
        reason: String,
        /// The job waits only because no schedulable worker has room for it: the policy's
        /// promise that it gives this answer again, whatever the time, until a worker's
        /// placement snapshot changes ([`ClusterView::snapshots`]: its capacity, its state,
        /// the jobs on it). The core does not ask again until then (`Core::schedule`); a
        /// backlog of n such jobs made every submission ask n (`docs/performance.md`, "A
        /// backlog of waiting jobs").
        for_room: bool,
    },
    /// Never (value-based allocation).
    Reject {
        /// Why.
        reason: String,
    },
}

/// How a victim is preempted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preempt {
    /// Frozen in place, resumed later.
    Pause,
    /// Stopped for good (Dropped).
    Stop,
}

/// A job to preempt.
#[derive(Debug, Clone, PartialEq)]
pub struct Victim {
    /// The job.
    pub job: JobId,
    /// How.
    pub how: Preempt,
    /// Why.
    pub reason: String,
}

/// A decision about a job that is not pending.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Move it to `to` by checkpoint save/restore.
    Move {
        /// The job.
        job: JobId,
        /// Target.
        to: WorkerId,
        /// Why.
        reason: MoveReason,
        /// Details for the event.
        attributes: BTreeMap<String, String>,
    },
    /// It was considered for a move and stays (an event, no change).
    Keep {
        /// The job.
        job: JobId,
        /// Why, in words.
        reason: String,
        /// Details for the event.
        attributes: BTreeMap<String, String>,
    },
    /// Preempt it.
    Preempt(Victim),
    /// Resume a paused job with a new CPU weight.
    Resume {
        /// The job.
        job: JobId,
        /// Its CPU weight.
        cpu_shares: u32,
        /// Why.
        reason: String,
    },
    /// Limit a running job to `cpus` cores (a hard quota on its worker; 0: none) and set its
    /// CPU weight (0: leave it as it is).
    SetLimits {
        /// The job.
        job: JobId,
        /// Cores; 0 = no quota.
        cpus: f64,
        /// CFS shares; 0 = unchanged.
        cpu_shares: u32,
        /// Why, in words (the Limits event's reason).
        reason: String,
        /// The numbers behind it (the event's attributes).
        attributes: BTreeMap<String, String>,
    },
    /// Give it up (Dropped).
    Drop {
        /// The job.
        job: JobId,
        /// Why.
        reason: String,
    },
}

/// What a worker reported, as a policy sees it.
#[derive(Debug, Clone, Copy)]
pub enum Report<'a> {
    /// A heartbeat (the jobs' views are already updated in the cluster view).
    Heartbeat {
        /// From.
        worker: &'a WorkerId,
    },
    /// SpeCon Alg. 1 line 16: a converged job asks to be moved.
    MigrationRequest {
        /// From.
        worker: &'a WorkerId,
        /// The job (running on `worker`, checked by the core).
        job: &'a JobId,
        /// Why, in words.
        reason: &'a str,
    },
}

/// A submission the policy refuses, naming the field.
#[derive(Debug, Clone, PartialEq)]
pub struct Invalid {
    /// The field to fix.
    pub field: &'static str,
    /// What is wrong with it.
    pub message: String,
}

/// A cluster policy (module doc).
pub trait ClusterPolicy: Send {
    /// Its `--policy` name.
    fn name(&self) -> &'static str;

    /// What agents run on their workers.
    fn worker_mode(&self) -> WorkerMode {
        WorkerMode::Free
    }

    /// Whether agents run SpeCon's Alg. 1 and send migration requests.
    fn agent_migration(&self) -> bool {
        false
    }

    /// An empty index of its placer's own, which the core keeps up to date with every
    /// worker's snapshot ([`converge_policy::cluster::PlacerIndex`]); `None` when its placer
    /// has none.
    fn placer_index(&self) -> Option<Box<dyn converge_policy::cluster::PlacerIndex>> {
        None
    }

    /// Whether the core keeps the schedulable workers ordered by crowding for it
    /// ([`PlacementIndex::by_crowd`]).
    fn orders_by_crowd(&self) -> bool {
        false
    }

    /// Whether this policy reads jobs' value curves (`JobSpec::value_curve`): the manager warns
    /// a submission with one that this policy would ignore.
    fn reads_value_curves(&self) -> bool {
        false
    }

    /// Submission rules of this policy, beyond the general ones.
    fn check_submit(&self, _spec: &JobSpec) -> Result<(), Invalid> {
        Ok(())
    }

    /// Where pending job `job` goes now.
    fn place(&mut self, now: Time, job: &Job, view: ClusterView<'_>) -> Admission;

    /// The kind of pending job `job`: jobs of one kind get the same answer whenever
    /// [`ClusterPolicy::place`] tells one to wait for room ([`Admission::Wait`]'s
    /// `for_room`): the same reason, word for word, at the same placement snapshots and
    /// whatever the time. It reads only what a job keeps while it waits (its spec, its id).
    /// The core then asks about one job of a kind in a pass while no snapshot changes, gives
    /// the others its answer, and ends the pass once every kind has had its answer and every
    /// job of it holds that answer already (`Core::schedule`): once a worker had changed, a
    /// backlog of n jobs waiting for room cost n answers (`docs/performance.md`, "A backlog
    /// of waiting jobs"). `None`, the default, promises nothing: the job is asked each pass.
    fn wait_kind(&self, _job: &Job) -> Option<WaitKind> {
        None
    }

    /// Where a running job that must leave its worker goes (drain, restore retry); `None`
    /// when no worker can take it now.
    fn place_move(&mut self, now: Time, job: &Job, view: ClusterView<'_>) -> Option<WorkerId>;

    /// How this policy splits one worker of `capacity` cores among `jobs` from here on, as
    /// CFS weights (one per job, in their order), for the ETA forecast
    /// ([`crate::cluster::forecast`]). By default, what its worker mode says: under free
    /// competition every job has the same weight; FlowCon's limits follow each job's growth
    /// and cannot be foreseen from its work (`None`), so the forecast holds every job at its
    /// current cores.
    fn forecast_weights(&self, _capacity: f64, jobs: &[Load<'_>]) -> Option<Vec<f64>> {
        match self.worker_mode() {
            WorkerMode::Free => Some(vec![1.0; jobs.len()]),
            WorkerMode::FlowCon => None,
        }
    }

    /// The CPU weight a Start of `job` carries (a restore's: [`ClusterPolicy::restore_shares`]).
    fn start_shares(&self, _job: &str) -> u32 {
        0
    }

    /// The CPU weight the restore of `job` on `to` carries: by default what its Starts carry.
    /// The value policies choose a moved job's share again for where it goes
    /// ([`ClusterPolicy::place_move`]), and it becomes the job's here, as the restore is sent.
    fn restore_shares(&mut self, job: &str, _to: &WorkerId) -> u32 {
        self.start_shares(job)
    }

    /// A worker's report.
    fn on_report(
        &mut self,
        _now: Time,
        _report: Report<'_>,
        _view: ClusterView<'_>,
    ) -> Vec<Decision> {
        Vec::new()
    }

    /// `job`'s phase changed; `was_on` is the worker its phase named before
    /// ([`JobPhase::worker`]: where it ran or started; for a move, its source while saving and
    /// its target while restoring). Every change of phase comes here, as it happens, before
    /// any other call reads the view again: for a policy that keeps state by the jobs' phases
    /// and would otherwise have to walk every job to find what changed.
    fn on_transition(&mut self, _job: &JobId, _was_on: Option<&WorkerId>) {}

    /// Worker `id`, at `place` in the view's order, is forgotten ([`super::Input::Forget`]):
    /// it holds no jobs, and the workers after it move down one place once it is gone. Called
    /// while it is still in the view.
    fn on_worker_forgotten(&mut self, _place: usize, _id: &WorkerId) {}

    /// `job` left `worker` (it ended, or its worker was lost).
    fn on_departure(
        &mut self,
        _now: Time,
        _worker: &WorkerId,
        _job: &JobId,
        _view: ClusterView<'_>,
    ) -> Vec<Decision> {
        Vec::new()
    }

    /// Worker `worker` may have room that no departure offered: it was undrained, or its
    /// agent registered again with a paused job (the jobs it was paused for may have left
    /// meanwhile). A policy that pauses jobs resumes them here as after a departure.
    fn on_room(&mut self, _now: Time, _worker: &WorkerId, _view: ClusterView<'_>) -> Vec<Decision> {
        Vec::new()
    }

    /// The timer.
    fn on_tick(&mut self, _now: Time, _view: ClusterView<'_>) -> Vec<Decision> {
        Vec::new()
    }

    /// When the policy next wants a tick, if it keeps a timer of its own.
    fn next_due(&self) -> Option<Time> {
        None
    }
}

/// Settings a policy may need besides its name.
#[derive(Debug, Clone)]
pub struct PolicyConfig {
    /// SpeCon Alg. 3's period, in seconds.
    pub rebalance_interval: Time,
    /// Value-based allocation (`value`, `value-dwop`).
    pub value: Option<converge_policy::value::ValueConfig>,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            rebalance_interval: 30.0,
            value: None,
        }
    }
}

/// The names [`by_name`] accepts.
pub const POLICIES: &[&str] = &[
    "spread",
    "least-allocated",
    "round-robin",
    "flowcon",
    "specon",
    "flowcon-specon",
    "converge",
    "las",
    "value",
    "value-dwop",
];

/// The policy `name` runs (README "Policies"):
///
/// - `spread`: Docker Swarm's spread placement, free competition on workers (FlowCon's "DS").
/// - `least-allocated`: Kubernetes' default scoring, free competition.
/// - `round-robin`: even initial placement, free competition (SpeCon's "DS").
/// - `flowcon`: FlowCon Alg. 4 placement and Alg. 1-3 elastic limits on every worker.
/// - `specon`: even initial placement, free competition, SpeCon migration (Alg. 1 on the
///   agents, Alg. 2 on their requests, Alg. 3 rebalancing on a timer).
/// - `flowcon-specon`: FlowCon placement and limits together with SpeCon migration.
/// - `converge`: Converge's own policy: shortest predicted remaining work first on every
///   worker (with a guard against starvation), placement on the fewest jobs per reference core, then by
///   the marginal sum of completion times.
/// - `las`: least attained service first (Tiresias), spread placement.
/// - `value` / `value-dwop`: value-based allocation with / without preemption.
pub fn by_name(name: &str, config: &PolicyConfig) -> Result<Box<dyn ClusterPolicy>, String> {
    use converge_policy::baseline::{LeastAllocated, RoundRobin, Spread};
    use converge_policy::flowcon::FlowConPlacer;
    Ok(match name {
        "spread" => Box::new(placing::Placing::new(Box::new(Spread), WorkerMode::Free)),
        "least-allocated" => Box::new(placing::Placing::new(
            Box::new(LeastAllocated),
            WorkerMode::Free,
        )),
        "round-robin" => Box::new(placing::Placing::new(
            Box::new(RoundRobin::default()),
            WorkerMode::Free,
        )),
        "flowcon" => Box::new(placing::Placing::new(
            Box::new(FlowConPlacer),
            WorkerMode::FlowCon,
        )),
        "specon" => Box::new(specon::SpeConPolicy::new(
            "specon",
            Box::new(RoundRobin::default()),
            WorkerMode::Free,
            config.rebalance_interval,
        )),
        "converge" => Box::new(priority::PriorityPolicy::converge(
            config.rebalance_interval,
        )),
        "las" => Box::new(priority::PriorityPolicy::las()),
        "flowcon-specon" => Box::new(specon::SpeConPolicy::new(
            "flowcon-specon",
            Box::new(FlowConPlacer),
            WorkerMode::FlowCon,
            config.rebalance_interval,
        )),
        "value" | "value-dwop" => {
            let mut vc = config
                .value
                .ok_or_else(|| format!("policy `{name}` needs its value-allocation settings"))?;
            if name == "value-dwop" {
                vc.preemption = None;
            }
            let name: &'static str = if name == "value" {
                "value"
            } else {
                "value-dwop"
            };
            Box::new(value::ValuePolicy::new(name, vc).map_err(|e| e.to_string())?)
        }
        other => {
            return Err(format!(
                "unknown policy `{other}` (one of: {})",
                POLICIES.join(", ")
            ));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn few_workers_show_every_score() {
        let ids: Vec<WorkerId> = ["a", "b", "c"].map(WorkerId::from).to_vec();
        assert_eq!(
            scores_text(&ids, &[1.0, f64::INFINITY, 0.5], 2),
            "a=1 b=inf c=0.5"
        ); // To four decimals.
        assert_eq!(
            scores_text(&ids, &[10.474373169020446, 0.5, -0.00004], 0),
            "a=10.4744 b=0.5 c=0"
        );
    }

    /// A placer that scores only a few workers (round-robin) gets the text it would get had
    /// it written every other worker's score, over few workers and over many.
    #[test]
    fn scores_of_a_few_workers_read_as_scores_of_every_worker() {
        for n in [3, SCORES_SHOWN, SCORES_SHOWN + 1, 1000] {
            let ids: Vec<WorkerId> = (0..n).map(|i| format!("w{i:04}").into()).collect();
            for (scored, chosen) in [
                (vec![(n - 1, 0.0)], n - 1),
                (vec![(0, 2.0), (n / 2, 1.5)], 0),
            ] {
                for rest in [f64::INFINITY, f64::NEG_INFINITY] {
                    let few = Scores::Few {
                        scored: scored.clone(),
                        rest,
                        workers: n,
                    };
                    let every = few.to_vec();
                    assert_eq!(every.len(), n);
                    assert_eq!(
                        placement_text(&ids, &few, chosen),
                        scores_text(&ids, &every, chosen),
                        "{n} workers, {scored:?}"
                    );
                    assert_eq!(
                        placement_text(&ids, &Scores::Every(every.clone()), chosen),
                        scores_text(&ids, &every, chosen)
                    );
                }
            }
        }
    }

    #[test]
    fn many_workers_show_the_chosen_one_and_its_nearest_rivals() {
        let n = 1000;
        let ids: Vec<WorkerId> = (0..n).map(|i| format!("w{i:04}").into()).collect();
        // Worker i scores i; odd workers are ineligible; w0500 is chosen.
        let scores: Vec<f64> = (0..n)
            .map(|i| if i % 2 == 1 { f64::INFINITY } else { i as f64 })
            .collect();
        let text = scores_text(&ids, &scores, 500);
        let shown: Vec<&str> = text.split(' ').collect();
        assert_eq!(shown.len(), SCORES_SHOWN + 2, "{text}");
        assert!(text.contains("w0500=500"), "{text}");
        assert!(
            text.ends_with(&format!("(+{} more)", n - SCORES_SHOWN)),
            "{text}"
        );
        // The rivals are the eligible scores closest to 500, none of the ineligible ones.
        assert!(!text.contains("inf"), "{text}");
        for far in ["w0000=", "w0998=", "w0470="] {
            assert!(!text.contains(far), "{far} is not a near rival: {text}");
        }
        assert!(text.contains("w0486=") && text.contains("w0514="), "{text}");
        // The last place goes to the nearer in worker order of two rivals as near.
        assert!(
            text.contains("w0484=") && !text.contains("w0516="),
            "{text}"
        );
    }
}
