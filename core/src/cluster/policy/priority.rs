//! Policies that split each worker's CPU by a priority, as CPU weights set from the manager:
//!
//! - `converge` (Converge's own): shortest predicted remaining work first
//!   ([`converge_policy::estimate`]); placement on the workers with the fewest jobs per
//!   reference core,
//!   and among them where the job adds least to the sum of completion times.
//! - `las` (Tiresias' discretization-free form, Gu et al., NSDI'19): least attained service
//!   first, no knowledge of durations, spread placement. The strongest peer that needs no hooks
//!   into the training framework.
//!
//! Under both, the job a worker serves first keeps its place until another's key is
//! [`HOLD`] below its own.
//!
//! The split ([`split`]) is the same for both: every job gets a guard of `capacity / (β·n)`
//! cores (FlowCon's lower bound, flowcon-icpp2019.txt Alg. 1 line 22), so no job starves;
//! a job with no estimate (no progress lines, no finished jobs to compare with) gets a fair
//! share `capacity / n`; what is left goes down the priority order, each rank [`LADDER`] times
//! less than the one before. The split is sent as CFS weights in proportion to it, with no
//! quota: while every job of the worker runs flat out each gets its split, and what one cannot
//! use (a one-thread job on a big worker) goes to the others by weight, mostly to the next in
//! line, instead of idling. Hard quotas, which the first version set from each job's observed
//! use, left about a fifth of the CPU idle on the simulator's heterogeneous traces and
//! oscillated when a job's use changed between heartbeats.
//! Weights are recomputed for a worker on each of its heartbeats and sent only when they
//! change by more than [`SHARE_CHANGE`], so a steady worker sees no commands.

use std::collections::{BTreeMap, HashMap};

use converge_policy::baseline::Spread;
use converge_policy::value::Amount;

use super::placing::Placing;
use super::{
    Admission, ClusterPolicy, ClusterView, Decision, Report, WaitKind, request, scores_text,
};
use crate::cluster::forecast::Load;
use crate::cluster::lifecycle::{Job, JobPhase, Worker, WorkerPhase};
use crate::cluster::types::{JobId, Time, WorkerId, WorkerMode};

/// The guard is `1/(β·n)` of the worker (FlowCon's lower bound, with its β). FlowCon's own
/// β = 2 spread half of every worker evenly and held `converge` to a small part of the oracle's
/// gain; β = 4, 8 and 16 met the same goals in `sim/CONVERGE.md` within one check of each
/// other, so the middle one stands.
pub const BETA: f64 = 8.0;
/// Weights that move by less than this fraction are not sent again.
pub const SHARE_CHANGE: f64 = 0.1;
/// How much more CPU weight each rank of the priority order has than the next (above the
/// guard): enough that what the first cannot use goes mostly to the second.
pub const LADDER: f64 = 8.0;
/// The job a worker serves first keeps its place until another's key is this fraction below
/// its own. Under `converge` two alike jobs swapped the first place at every heartbeat (a new
/// user's walk: 59 of 143 events were new limits): their predictions differ by less than what
/// each one's throughput, measured at 0.83 or at 0.17 of a core, wavers. Under `las` the job
/// served first has the most service at once, and two jobs of about equal service swapped
/// every 3 to 4 s (another walk), their ETAs swinging by 3 to 7 times; Tiresias discretizes
/// its queues against the same churn.
pub const HOLD: f64 = 0.1;

/// What orders a worker's jobs (smaller first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    /// Predicted remaining work (SRPT).
    Remaining,
    /// Service had so far (LAS).
    Attained,
}

/// One job of a worker, for [`split`]. The job is borrowed: the forecast asks for a split at
/// every step of every worker's queue it follows, and an owned id there was a new allocation
/// for each job at each step.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim<'a> {
    /// The job.
    pub job: &'a str,
    /// Its priority key (smaller first); `None` when unknown.
    pub key: Option<f64>,
}

/// The order [`split`] serves keyed claims in: smaller key first, then job id.
fn priority(a: &Claim<'_>, b: &Claim<'_>) -> std::cmp::Ordering {
    a.key
        .unwrap_or(f64::INFINITY)
        .total_cmp(&b.key.unwrap_or(f64::INFINITY))
        .then_with(|| a.job.cmp(b.job))
}

/// Splits `capacity` cores among `claims` (module doc): each job with a key gets the guard
/// `capacity / (β·n)`, each job without one the fair share `capacity / n`; what is left goes
/// down the keyed jobs in priority order, each rank [`LADDER`] times less than the one before
/// (the last takes the remainder). Returns each job's cores, in the order given. These are the
/// parts each job gets while every job of the worker runs flat out; sent as CPU weights, what
/// one cannot use flows to the others by weight, so the next in line gets most of it.
pub fn split(capacity: f64, claims: &[Claim<'_>], beta: f64) -> Vec<f64> {
    let n = claims.len();
    if n == 0 {
        return Vec::new();
    }
    let floor = capacity / (beta * n as f64);
    let fair = capacity / n as f64;
    let mut cores: Vec<f64> = claims
        .iter()
        .map(|c| if c.key.is_some() { floor } else { fair })
        .collect();
    let mut left = (capacity - cores.iter().sum::<f64>()).max(0.0);
    let mut order: Vec<usize> = (0..n).filter(|&i| claims[i].key.is_some()).collect();
    order.sort_by(|&a, &b| priority(&claims[a], &claims[b]));
    for (rank, &i) in order.iter().enumerate() {
        let add = if rank + 1 == order.len() {
            left
        } else {
            left * (1.0 - 1.0 / LADDER)
        };
        cores[i] += add;
        left -= add;
    }
    cores
}

/// The work each live job will need ([`ClusterView::remaining_work`]), for one decision:
/// placement and moves ask for every job of every worker.
struct Works<'a> {
    view: ClusterView<'a>,
    /// What a job nothing is known of counts as: the median of the known (1 when none is
    /// known, so that placement counts jobs per core, as least-allocated does), never nothing:
    /// a worker of jobs that have not reported yet is not empty. Found at the first job that
    /// needs it ([`Works::typical`]).
    typical: std::cell::OnceCell<f64>,
}

impl<'a> Works<'a> {
    /// The works of `view`'s live jobs, each read where asked ([`Works::get`]): the view finds
    /// a job by hash and keeps its estimate until it reports again, and a map of every live
    /// job's work, sorted by id and built at each placement, made `converge` 1.8 times as slow
    /// at 100,000 jobs (docs/performance.md, "Works read where asked").
    fn of(view: ClusterView<'a>) -> Self {
        Works {
            view,
            typical: std::cell::OnceCell::new(),
        }
    }

    /// The median of the known works, read from every live job, once per decision and only
    /// if a job's work is unknown: once any job has completed, the completed jobs' sizes give
    /// every job an estimate ([`ClusterView::remaining_work`]), and the walk was most of a
    /// 1,000-worker simulation's placements for a median no one read (docs/performance.md).
    /// The view does not change during a decision, so the median is the one an eager walk
    /// found.
    fn typical(&self) -> f64 {
        *self.typical.get_or_init(|| {
            let view = self.view;
            let mut known: Vec<f64> = (view.jobs.values())
                .filter(|j| !j.is_terminal())
                .filter_map(|j| view.remaining_work(j))
                .collect();
            if known.is_empty() {
                return 1.0;
            }
            // The element a sort would put in the middle, found without sorting.
            let mid = known.len() / 2;
            known
                .select_nth_unstable_by(mid, f64::total_cmp)
                .1
                .max(1e-3)
        })
    }

    fn get(&self, job: &str) -> f64 {
        self.view
            .jobs
            .get(job)
            .filter(|j| !j.is_terminal())
            .and_then(|j| self.view.remaining_work(j))
            .unwrap_or_else(|| self.typical())
    }

    /// The work of each of `w`'s jobs, in the order of its job set (what [`queue`] walks:
    /// rebalancing walks each worker once per job it considers moving, so it reads the works
    /// once).
    fn of_worker(&self, w: &Worker) -> Vec<f64> {
        w.placed().map(|id| self.get(id)).collect()
    }
}

/// The work of the jobs in `works` (one worker's, [`Works::of_worker`]) no longer than `x`
/// (served before a job of work `x` under shortest-remaining-first), and how many are longer.
/// `skip` leaves one job out by its place (the one being moved).
fn queue(works: impl IntoIterator<Item = f64>, x: f64, skip: Option<usize>) -> (f64, usize) {
    let (mut ahead, mut behind) = (0.0, 0usize);
    for (k, y) in works.into_iter().enumerate() {
        if Some(k) == skip {
            continue;
        }
        if y <= x {
            ahead += y;
        } else {
            behind += 1;
        }
    }
    (ahead, behind)
}

/// What a job of work `x` adds to the sum of completion times on `w` (whose jobs' works are
/// `works`) under shortest-remaining-first: its own completion, behind the jobs shorter than
/// it, plus `x` for each longer job it delays; in seconds at `w`'s capacity and speed.
fn marginal(w: &Worker, works: impl IntoIterator<Item = f64>, x: f64, skip: Option<usize>) -> f64 {
    marginal_at(speed(w), works, x, skip)
}

/// [`marginal`] on a worker of `speed` reference core-seconds per second.
fn marginal_at(
    speed: f64,
    works: impl IntoIterator<Item = f64>,
    x: f64,
    skip: Option<usize>,
) -> f64 {
    let (ahead, behind) = queue(works, x, skip);
    (ahead + x + behind as f64 * x) / speed
}

/// What placing a job with a value curve on a worker is worth ([`value_net`]).
#[derive(Debug, Clone, Copy)]
struct ValueNet {
    /// Seconds from now until it would finish there.
    finish_in: f64,
    /// Its value at that finish.
    gain: f64,
    /// The value the jobs it would delay there lose by the delay.
    loss: f64,
}

/// The work of `w`'s jobs that shortest-remaining-first serves before a job of work `x` and
/// id `id`: no more work than it, ties broken by id (as [`split`] orders them), so that a job
/// placed and the job it is placed beside agree on which of them goes first.
fn served_before(w: &Worker, works: &Works<'_>, (x, id): (f64, &str)) -> f64 {
    w.placed()
        .filter(|o| o.as_str() != id)
        .map(|o| (works.get(o), o.as_str()))
        .filter(|&other| other <= (x, id))
        .map(|(y, _)| y)
        .sum()
}

/// Placing job `job`, whose value curve, age and work are `new`, on `w`: under
/// shortest-remaining-first each job there finishes after the work of the jobs served before
/// it ([`served_before`]), at `w`'s speed (the guards aside). The new job finishes after those
/// served before it and its own work; each one served after it is delayed by its work, and the
/// value that one loses by the delay is counted against the new job's (a job without a curve
/// loses nothing by this measure).
fn value_net(
    now: Time,
    w: &Worker,
    view: ClusterView<'_>,
    works: &Works<'_>,
    (job, curve, age, x): (&str, converge_policy::value::ValueCurve, f64, f64),
) -> ValueNet {
    let ahead = served_before(w, works, (x, job));
    let finish_in = (ahead + x) / speed(w);
    ValueNet {
        finish_in,
        gain: curve.value_at(age + finish_in),
        loss: value_loss(now, w, view, works, (job, x)),
    }
}

/// The value `w`'s jobs with value curves lose when job `job` of work `x` joins them: each one
/// served after it ([`served_before`]: by work, ties by id) finishes `x` later. One sort of
/// the worker's jobs gives each its own finish (the work served before it, its own included).
fn value_loss(
    now: Time,
    w: &Worker,
    view: ClusterView<'_>,
    works: &Works<'_>,
    (job, x): (&str, f64),
) -> f64 {
    let speed = speed(w);
    let mut order: Vec<(f64, &str)> = w
        .placed()
        .filter(|o| o.as_str() != job)
        .map(|o| (works.get(o), o.as_str()))
        .collect();
    order.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(b.1)));
    let (mut done, mut loss) = (0.0, 0.0);
    for (y, other) in order {
        done += y;
        if (y, other) <= (x, job) {
            continue;
        }
        if let Some(c) = view
            .jobs
            .get(other)
            .and_then(|j| Some((j.spec.value_curve?, j)))
        {
            let finish = now - c.1.submitted_at + done / speed;
            loss += c.0.value_at(finish) - c.0.value_at(finish + x / speed);
        }
    }
    loss
}

/// Jobs per reference core on worker `w` with `extra` more: what placement fills first and
/// what a move may not raise ([`PriorityPolicy::place`], [`PriorityPolicy::even_out`]). A
/// slow core counts for what it does: on `hetero-heavy-tail-6w-50job` jobs per core alone sent
/// two short four-thread jobs to an empty 2-core worker at 0.6 speed (1.2 reference cores)
/// rather than to an 8-core one holding four jobs, and they took 2.3 and 3.3 times as long as
/// under least-allocated (sim/CONVERGE.md's worst-job column). Read from the worker's
/// placement snapshot, which counts its jobs and holds its capacity and speed: the snapshots
/// lie side by side, where each worker's record is behind a pointer of its own (reading the
/// records was a fifth of `converge`'s placements at 10,000 workers, `docs/performance.md`).
pub(crate) fn per_core_of(w: &converge_policy::cluster::WorkerSnapshot, extra: usize) -> f64 {
    (w.running + extra) as f64 / reference_speed(w.cpu_capacity, w.calibration)
}

/// [`per_core_of`] from the worker's own record: what test and debug builds check the
/// snapshots' crowding against.
#[cfg(any(test, debug_assertions))]
fn per_core(w: &Worker, extra: usize) -> f64 {
    (w.placed().count() + extra) as f64 / speed(w)
}

/// Crowding (jobs per reference core, as placement counts them) within this fraction of
/// another's counts as the same: a worker's speed is a measurement (the agent's calibration
/// benchmark), and a worker measured a few percent faster than its twin is not less crowded.
/// Without it, placement ties between alike workers on the testbed would be decided by the
/// benchmark's noise instead of by the sum of completion times.
pub const SAME_CROWD: f64 = 0.05;

/// Whether crowding `a` is beyond `b` by more than [`SAME_CROWD`].
fn more_crowded(a: f64, b: f64) -> bool {
    a > b * (1.0 + SAME_CROWD) + 1e-9
}

/// Reference core-seconds a worker does per second.
fn speed(w: &Worker) -> f64 {
    reference_speed(w.cpu_capacity, w.calibration)
}

/// Reference core-seconds per second of `cores` cores at `calibration`.
fn reference_speed(cores: f64, calibration: f64) -> f64 {
    cores * calibration.max(1e-6)
}

/// A priority-split policy (module doc).
pub struct PriorityPolicy {
    name: &'static str,
    key: Key,
    /// `las` places by spread; `converge` on the fewest jobs per reference core, then by the
    /// marginal sum of completion times.
    spread: Option<Placing>,
    /// `converge` evens out predicted finish times across workers every this many seconds.
    rebalance: Option<Time>,
    next_rebalance: Option<Time>,
    /// Jobs moved once: never again (a move costs a save and a restore).
    moved: std::collections::BTreeSet<JobId>,
    /// The CFS weight each running job was last given, with the incarnation it was sent to (a
    /// new incarnation starts at the default weight and must be sent its own). Looked up for
    /// every job of every heartbeat and never walked: a hash map (foldhash, as the core's
    /// records), where a B-tree of 100,000 ids compared each lookup with a dozen others.
    given: HashMap<JobId, (u64, u32), foldhash::fast::RandomState>,
}

/// What a move costs before the job trains again, in seconds, when no move was measured yet:
/// a save and a restore of a trainer checkpoint on the shared volume (design.md budgets
/// under a second; the margin covers a slow worker).
const MOVE_COST_S: f64 = 5.0;

/// A target whose calibration is above a move's source's by no more than this fraction is
/// weighed at the source's calibration (its cores still count). A calibration is the agent's
/// benchmark, which differs by about a tenth between twins on one host (a walk: 0.327 against
/// 0.298); without the band a job alone on the twin measured slower was moved to the other,
/// empty one, for a gain that was the benchmark's noise. Only faster targets are read so: a
/// move is never made more attractive than its numbers say, and workers of one calibration,
/// as in most of the simulator's traces, are weighed as before.
pub const SAME_SPEED: f64 = 0.15;

/// The speed (reference core-seconds per second) a move from `src` weighs target `dst` at:
/// its own, or its cores at `src`'s calibration where the two are alike ([`SAME_SPEED`]).
fn counted_speed(src: &Worker, dst: &Worker) -> f64 {
    let (from, to) = (src.calibration, dst.calibration);
    if to > from && to <= from * (1.0 + SAME_SPEED) {
        reference_speed(dst.cpu_capacity, from)
    } else {
        speed(dst)
    }
}

impl PriorityPolicy {
    /// `converge`: SRPT limits, placement on the fewest jobs per reference core, then by the
    /// marginal sum of completion times.
    pub fn converge(rebalance_interval: Time) -> Self {
        PriorityPolicy {
            name: "converge",
            key: Key::Remaining,
            spread: None,
            rebalance: Some(rebalance_interval),
            next_rebalance: None,
            moved: Default::default(),
            given: HashMap::default(),
        }
    }

    /// `las`: least-attained-service limits, spread placement.
    pub fn las() -> Self {
        PriorityPolicy {
            name: "las",
            key: Key::Attained,
            spread: Some(Placing::new(Box::new(Spread), WorkerMode::Free)),
            rebalance: None,
            next_rebalance: None,
            moved: Default::default(),
            given: HashMap::default(),
        }
    }

    /// One move that lowers the sum of completion times by more than it costs, if there is
    /// one: for every running job and every other worker that would not then hold more jobs
    /// per core than the job's own does now ([`per_core`]), what the job adds where it is
    /// ([`marginal`]) less what it would add there (at the source's calibration where the two
    /// are alike, [`SAME_SPEED`]), less the move's downtime. The best such move is made; among
    /// equal gains, the one with the least work since its last checkpoint (what a move loses
    /// if its save fails and the job restarts from that checkpoint). That work is not charged
    /// as a cost: a move saves at the current step, and charging it held back every move of a
    /// job that had never checkpointed (most of the simulator's, and makespan suffered).
    fn even_out(
        &mut self,
        now: Time,
        view: ClusterView<'_>,
        works: &Works<'_>,
    ) -> Option<Decision> {
        let cost = view.longest_downtime().unwrap_or(MOVE_COST_S);
        let live: Vec<&Worker> = view
            .workers
            .values()
            .filter(|w| w.schedulable() && w.cpu_capacity > 0.0)
            .collect();
        // The placement index holds every worker's snapshot already.
        let all = view.snapshots().1;
        let snaps: Vec<_> = live
            .iter()
            .map(|w| &all[view.index_of(&w.id).expect("every worker is indexed")])
            .collect();
        let lists: Vec<Vec<f64>> = live.iter().map(|w| works.of_worker(w)).collect();
        let valued = view.valued > 0;
        // Never onto a worker that would then hold more jobs per core than the source holds
        // now: placement's first rule, kept by the moves. The marginal sees a big worker as
        // one fast server, but a job uses only its threads' cores there, and jobs crowding a
        // worker slow each other down (sim/README.md, "co-location"). Without this rule the
        // moves undid placement's spreading: on the simulator's heterogeneous traces they
        // gathered most jobs onto the big workers (sim/CONVERGE.md).
        // Which workers a source may send to depends on the source alone, so it is found once
        // per source, from the workers sorted by crowding (a prefix of them), and not for every
        // job and every worker: at 10,000 workers that pairing was most of `converge`'s time
        // (docs/performance.md, "Placements read the least crowded"). The targets are
        // visited in worker order, as before, so ties between equal moves fall alike.
        let crowd_with_one: Vec<f64> = snaps.iter().map(|s| per_core_of(s, 1)).collect();
        let fastest = live.iter().map(|w| speed(w)).fold(0.0, f64::max);
        let mut by_crowd: Vec<usize> = (0..live.len()).collect();
        by_crowd.sort_by(|&a, &b| crowd_with_one[a].total_cmp(&crowd_with_one[b]));
        let mut targets_at: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
        let mut best: Option<(f64, f64, &Job, &Worker, f64, f64)> = None;
        for (s, (src, here_works)) in live.iter().zip(&lists).enumerate() {
            // Positions in `src.jobs` are positions in `here_works` too: `placed()` lists the
            // jobs here before those on their way.
            let on_src = (src.jobs.iter().enumerate())
                .filter_map(|(k, id)| Some((k, view.jobs.get(id)?)))
                .filter(|(_, j)| {
                    matches!(j.phase, JobPhase::Running { .. }) && !self.moved.contains(&j.id)
                });
            let crowd = per_core_of(snaps[s], 0);
            for (k, j) in on_src {
                let x = here_works[k];
                let here = marginal(src, here_works.iter().copied(), x, Some(k));
                // No target adds less than the job's own work at the fastest worker's speed
                // (an empty one): a job whose move could not gain even that much, or not as
                // much as the best move found so far, is passed over unweighed. Such a job
                // would not have replaced the best (its gain would be at most `bound`), so
                // the move chosen is the one weighing every job finds.
                let bound = here - x / fastest - cost;
                if bound <= 0.0 || best.is_some_and(|(g, ..)| bound <= g - 1e-9) {
                    continue;
                }
                // Found at the first job of the source that is weighed: where the bound
                // passes over every job, no list is made.
                let targets = targets_at.entry(crowd.to_bits()).or_insert_with(|| {
                    let n = by_crowd.partition_point(|&d| !more_crowded(crowd_with_one[d], crowd));
                    let mut t = by_crowd[..n].to_vec();
                    t.sort_unstable();
                    t
                });
                let risk = view.work_at_risk(j);
                for &d in targets.iter() {
                    let (dst, snap, there_works) = (live[d], snaps[d], &lists[d]);
                    if d == s || !snap.fits(&request(&j.spec)) {
                        continue;
                    }
                    let counted = counted_speed(src, dst);
                    let there = marginal_at(counted, there_works.iter().copied(), x, None);
                    let gain = here - there - cost;
                    if gain > 0.0
                        && valued
                        && !Self::keeps_value(now, view, works, (j, x), (src, dst), cost)
                    {
                        continue;
                    }
                    if gain > 0.0
                        && best.is_none_or(|(g, r, ..)| {
                            gain > g + 1e-9 || (gain > g - 1e-9 && risk < r)
                        })
                    {
                        best = Some((gain, risk, j, dst, here, there));
                    }
                }
            }
        }
        let (gain, risk, j, dst, here, there) = best?;
        let from = j.worker().cloned().unwrap_or_default();
        let alike = (view.workers.get(&from)).is_some_and(|s| counted_speed(s, dst) < speed(dst));
        self.moved.insert(j.id.clone());
        Some(Decision::Move {
            job: j.id.clone(),
            to: dst.id.clone(),
            reason: crate::cluster::types::MoveReason::Rebalance,
            attributes: BTreeMap::from([
                (
                    "why".into(),
                    format!(
                        "it adds {here:.0} s to the sum of completion times on {from} and would add {there:.0} s on {}{}: moving it saves {gain:.0} s net of a {cost:.1} s move; {risk:.1} s of work since its last checkpoint (the least among equal moves)",
                        dst.id,
                        if alike {
                            format!(
                                " (at {from}'s calibration: the two are measured within {:.0}%)",
                                SAME_SPEED * 100.0
                            )
                        } else {
                            String::new()
                        }
                    ),
                ),
                ("work_at_risk_s".into(), format!("{risk:.2}")),
            ]),
        })
    }

    /// Whether moving job `j` (work `x`) from `src` to `dst`, a move of `cost` seconds, costs
    /// no value: the value the target's jobs lose by it going ahead of them ([`value_loss`]) is
    /// no more than what `j` gains by finishing elsewhere. What the source's jobs gain is not
    /// counted: a move it would pay for is not made, but no move loses value.
    fn keeps_value(
        now: Time,
        view: ClusterView<'_>,
        works: &Works<'_>,
        (j, x): (&Job, f64),
        (src, dst): (&Worker, &Worker),
        cost: f64,
    ) -> bool {
        let finish = |w: &Worker| (served_before(w, works, (x, &j.id)) + x) / speed(w);
        let own = j.spec.value_curve.map_or(0.0, |c| {
            let age = now - j.submitted_at;
            c.value_at(age + cost + finish(dst)) - c.value_at(age + finish(src))
        });
        value_loss(now, dst, view, works, (&j.id, x)) <= own
    }

    /// A job's place in the order, from its work left and the service it has had (the
    /// limits it is sent and the forecast of its ETA both order by this). The work left is
    /// asked for only when the key reads it: working it out from the job's progress points
    /// at every heartbeat was half of `las`'s limits, which order by service alone.
    fn key_of(&self, remaining: impl FnOnce() -> Option<f64>, attained: f64) -> Option<f64> {
        match self.key {
            Key::Remaining => remaining(),
            Key::Attained => Some(attained),
        }
    }

    /// The CFS weight incarnation `epoch` of `job` was last given; 0 if none (one given an
    /// earlier incarnation is not its: a job restarted on the worker starts afresh).
    fn given_to(&self, job: &str, epoch: u64) -> u32 {
        (self.given.get(job))
            .filter(|&&(e, _)| e == epoch)
            .map_or(0, |&(_, shares)| shares)
    }

    /// Whether job `j` was given another weight than `shares`, or none for its incarnation
    /// ([`SHARE_CHANGE`]).
    fn weight_changed(&self, j: &Job, shares: u32) -> bool {
        self.given.get(&j.id).is_none_or(|&(epoch, old)| {
            epoch != j.epoch
                || (f64::from(shares) - f64::from(old)).abs() > SHARE_CHANGE * f64::from(old)
        })
    }

    /// Whether [`PriorityPolicy::limits`] would send nothing to `j`, the only job of a worker
    /// of `capacity` cores, found without its key. A job that is not running (starting) is
    /// never weighted. A lone job's split does not depend on what its key is, only on whether
    /// it has one (the guard and all that is left, or the fair share: the whole worker either
    /// way, to rounding), so where both give a weight within [`SHARE_CHANGE`] of the one last
    /// given to this incarnation, its key is not needed. Working the key out reads the job's
    /// progress points (`converge`'s remaining work, [`ClusterView::remaining_work`]), new at
    /// each heartbeat, and most workers of a large cluster with short jobs run one job at a
    /// time: at 10,000 workers the weights were a sixth of `converge`'s samples with those
    /// keys and are a tenth without them (docs/performance.md, "Empty workers scored from
    /// their snapshots, lone jobs' weights").
    fn lone_weight_stays(&self, j: &Job, capacity: f64) -> bool {
        if !matches!(j.phase, JobPhase::Running { .. }) {
            return true;
        }
        let claim = |key| {
            let claim = Claim {
                job: j.id.as_str(),
                key,
            };
            shares_for(split(capacity, &[claim], BETA)[0], capacity)
        };
        let shares = claim(None);
        shares == claim(Some(0.0)) && !self.weight_changed(j, shares)
    }

    /// The weights of `worker`'s jobs, as decisions for those that changed.
    fn limits(&mut self, view: ClusterView<'_>, worker: &WorkerId) -> Vec<Decision> {
        let Some(w) = view.workers.get(worker) else {
            return Vec::new();
        };
        let jobs = view.sharing(w);
        let lone_stays = matches!(jobs[..], [lone] if self.lone_weight_stays(lone, w.cpu_capacity));
        // Test and debug builds go on, and check below that the weights send nothing.
        #[cfg(not(any(test, debug_assertions)))]
        if lone_stays {
            return Vec::new();
        }
        let mut claims: Vec<Claim<'_>> = jobs
            .iter()
            .map(|j| Claim {
                job: j.id.as_str(),
                key: self.key_of(|| view.remaining_work(j), j.cpu_s),
            })
            .collect();
        // The held job and its own key, which its event says.
        let held = hold_first(&mut claims, |i| self.given_to(&jobs[i].id, jobs[i].epoch));
        let cores = split(w.cpu_capacity, &claims, BETA);
        let fair = w.cpu_capacity / jobs.len().max(1) as f64;
        let mut out = Vec::new();
        for (i, ((j, c), claim)) in jobs.iter().zip(cores).zip(&claims).enumerate() {
            let key = match held {
                Some((h, own)) if h == i => Some(own),
                _ => claim.key,
            };
            if !matches!(j.phase, JobPhase::Running { .. }) {
                continue;
            }
            let shares = shares_for(c, fair);
            if self.weight_changed(j, shares) {
                self.given.insert(j.id.clone(), (j.epoch, shares));
                // "las by service had" read as no sentence (a new user's walk).
                let (what, order, unit) = match self.key {
                    Key::Remaining => ("predicted work left", "least predicted work left", "left"),
                    Key::Attained => ("service had", "least service had", "had"),
                };
                let reason = match key {
                    Some(k) => {
                        // Its place in split's order, counted only when a weight is sent.
                        let keyed = claims.iter().filter(|o| o.key.is_some());
                        let rank = 1 + keyed.clone().filter(|o| priority(o, claim).is_lt()).count();
                        format!(
                            "{}, {order} first: rank {rank} of {} on {worker} ({k:.1} core-s {unit}), {c:.2} of its {:.2} cores while all run",
                            self.name,
                            keyed.count(),
                            w.cpu_capacity
                        )
                    }
                    None => format!(
                        "{}: nothing tells its {what} yet, a fair share ({c:.2} of {:.2} cores on {worker})",
                        self.name, w.cpu_capacity
                    ),
                };
                let mut attributes = BTreeMap::from([("cores".into(), format!("{c:.2}"))]);
                if let Some(k) = key {
                    attributes.insert("key_core_s".into(), format!("{k:.1}"));
                }
                out.push(Decision::SetLimits {
                    job: j.id.clone(),
                    cpus: 0.0,
                    cpu_shares: shares,
                    reason,
                    attributes,
                });
            }
        }
        #[cfg(any(test, debug_assertions))]
        assert!(
            !lone_stays || out.is_empty(),
            "a lone job's weight was found to stay, and its key changed it: {out:?}"
        );
        out
    }
}

/// Keeps the job a worker serves first there ([`HOLD`]): of `claims`, whose jobs were last
/// given the CFS weights `given(i)` (0: none yet), the one given the most, alone, orders as
/// if its key were [`HOLD`] smaller. Returns its place and its own key (what its event says).
/// Read through `given`, not gathered: `limits` runs at every heartbeat.
fn hold_first(claims: &mut [Claim<'_>], given: impl Fn(usize) -> u32) -> Option<(usize, f64)> {
    let top = (0..claims.len()).map(&given).max()?;
    let mut firsts = (0..claims.len()).filter(|&i| given(i) == top);
    let (Some(first), None) = (firsts.next(), firsts.next()) else {
        return None;
    };
    let key = claims[first].key.as_mut().filter(|_| top > 0)?;
    let own = *key;
    *key *= 1.0 - HOLD;
    Some((first, own))
}

/// The CFS weight that gives a job `cores` of its worker while every job there competes,
/// when a job given the fair share `fair` weighs the default 1024. Within the kernel's range.
fn shares_for(cores: f64, fair: f64) -> u32 {
    (1024.0 * cores / fair.max(1e-9))
        .round()
        .clamp(2.0, 262_144.0) as u32
}

/// `converge`'s placement on `ids[i]`, of crowding `crowd`, where the job adds `marginal` to
/// the sum of completion times; `scores` is the event's text of the workers' marginals;
/// `known`, whether anything tells the job's work (else it counts as a typical job's, and a
/// walk read `(1.1 s)` as a measured delay).
fn placed_least_marginal(
    ids: &[WorkerId],
    i: usize,
    (crowd, marginal): (f64, f64),
    scores: String,
    known: bool,
) -> Admission {
    let guess = if known {
        ""
    } else {
        ", its own work not yet known and counted as a typical job's"
    };
    Admission::Place {
        worker: ids[i].clone(),
        cpu_shares: 0,
        victims: Vec::new(),
        reason: format!(
            "placed on {} by converge: of the workers with the fewest jobs per reference core ({crowd:.2} with it), it adds the least to the sum of completion times there ({marginal:.1} s{guess})",
            ids[i]
        ),
        attributes: BTreeMap::from([("scores".into(), scores)]),
    }
}

impl PriorityPolicy {
    /// `converge`'s placement (see [`ClusterPolicy::place`]) read off the core's order by
    /// crowding ([`PlacementIndex::by_crowd`](crate::cluster::index::PlacementIndex::by_crowd)):
    /// the least crowded workers the job fits, those within [`SAME_CROWD`] of the least, are
    /// the first in the order, and only they are scored, without a pass over every worker
    /// (four such passes, and the nearest scores among every worker's, were most of a
    /// 10,000-worker simulation's placements; `docs/performance.md`), and of empty workers
    /// alike to the bit only the first [`SCORES_SHOWN`](super::SCORES_SHOWN) in id order,
    /// the most of them the answer can name. `None` where that is not
    /// the answer [`PriorityPolicy::place_scanning`] would give in as little: over few workers
    /// (an event lists them all), for a job with a value curve (the scan weighs those on every
    /// worker at their first placement; all of them go to the scan, which is simpler and rare),
    /// when a marginal is not finite (its worker is ruled out and the band moves), or when
    /// nothing fits (the scan says why).
    pub(crate) fn place_in_band(&self, job: &Job, view: ClusterView<'_>) -> Option<Admission> {
        let (ids, snaps) = view.snapshots();
        if ids.len() <= super::SCORES_SHOWN || job.spec.value_curve.is_some() {
            return None;
        }
        let need = request(&job.spec);
        let works = Works::of(view);
        // Its work, once: whether it is known is said in the placement's reason.
        let own = view.remaining_work(job);
        let new = own.unwrap_or_else(|| works.typical());
        // Of alike empty workers, only as many as an event lists can be chosen or listed
        // (`PlacementIndex::by_crowd`): the rest of each such group is not visited.
        let mut order = view
            .index
            .by_crowd(super::SCORES_SHOWN)?
            .filter(|&(i, _)| snaps[i].fits(&need));
        let (first, least) = order.next()?;
        // (place, marginal, crowding) of each worker in the band.
        let mut band = Vec::new();
        for (i, crowd) in std::iter::once((first, least)).chain(order) {
            if more_crowded(crowd, least) {
                break;
            }
            let snap = &snaps[i];
            let on_record = || {
                let w = (view.workers.get(&ids[i]))
                    .expect("the placement index holds only workers the core has");
                marginal(w, w.placed().map(|id| works.get(id)), new, None)
            };
            // An empty worker adds only the job's own work at its speed, which its snapshot
            // holds: its record, found by hash and read behind a pointer of its own, is not
            // needed. Most of a band is empty workers where jobs are short (at 10,000 workers
            // and 100,000 jobs, thousands per placement, all empty), and finding each one's
            // record was over half of `converge`'s placements (docs/performance.md, "Empty
            // workers scored from their snapshots, lone jobs' weights").
            let score = if snap.running == 0 {
                let at = reference_speed(snap.cpu_capacity, snap.calibration);
                let score = marginal_at(at, std::iter::empty(), new, None);
                // Test and debug builds check the snapshot's score against the record's.
                #[cfg(any(test, debug_assertions))]
                {
                    let afresh = on_record();
                    assert!(
                        afresh.to_bits() == score.to_bits() || (afresh.is_nan() && score.is_nan()),
                        "{}'s snapshot scores {score}, its record {afresh}",
                        ids[i]
                    );
                }
                score
            } else {
                on_record()
            };
            if !score.is_finite() {
                return None;
            }
            band.push((i, score, crowd));
        }
        // As the scan's `min_by`: least marginal, then least crowded, then the first worker.
        // Within a crowding the order is not by place (workers with jobs, then empty ones
        // group by group), so the place is compared here.
        let &(i, score, crowd) = (band.iter()).min_by(|a, b| {
            (a.1.total_cmp(&b.1))
                .then(a.2.total_cmp(&b.2))
                .then(a.0.cmp(&b.0))
        })?;
        let scored: Vec<(usize, f64)> = band.iter().map(|&(i, s, _)| (i, s)).collect();
        Some(placed_least_marginal(
            ids,
            i,
            (crowd, score),
            super::sparse_scores_text(ids, &scored, i),
            own.is_some(),
        ))
    }

    /// `converge`'s placement by a pass over every worker (see [`ClusterPolicy::place`]).
    pub(crate) fn place_scanning(&self, now: Time, job: &Job, view: ClusterView<'_>) -> Admission {
        let (ids, snaps) = view.snapshots();
        let need = request(&job.spec);
        let works = Works::of(view);
        // Its work, once: whether it is known is said in the placement's reason.
        let own = view.remaining_work(job);
        let new = own.unwrap_or_else(|| works.typical());
        let workers: Vec<&Worker> = view.workers.values().collect();
        let fits: Vec<bool> = (snaps.iter())
            .map(|s| s.schedulable && s.fits(&need) && s.cpu_capacity > 0.0)
            .collect();
        // What the job adds to the sum of completion times on worker `i` ([`marginal`]).
        let marginal_on = |i: usize| {
            let w = workers[i];
            marginal(w, w.placed().map(|id| works.get(id)), new, None)
        };
        // Fewest jobs per reference core first (counting this one; [`SAME_CROWD`] apart counts
        // as the same), and only among those the marginal:
        // the marginal sees a worker as one server that runs its jobs one after another at its
        // whole capacity, but a job uses only as many cores as its threads (the simulator's
        // models 0.8 to 4), and jobs sharing a worker slow each other down (measured:
        // sim/README.md, "co-location"). By the marginal alone, big workers looked fast and
        // took most jobs: on the simulator's `hetero-8w-40job` `converge` was level with
        // Kubernetes' least-allocated spreading, and 5.8% ahead of it with this rule
        // (sim/CONVERGE.md); the other traces moved by about a point either way.
        let crowd: Vec<f64> = snaps.iter().map(|s| per_core_of(s, 1)).collect();
        #[cfg(any(test, debug_assertions))]
        assert!(
            (workers.iter().zip(&crowd)).all(|(w, c)| per_core(w, 1).to_bits() == c.to_bits()),
            "a placement snapshot counts other jobs, or another speed, than its worker"
        );
        let least_among = |among: &dyn Fn(usize) -> bool| {
            (0..workers.len())
                .filter(|&i| among(i))
                .map(|i| crowd[i])
                .fold(f64::INFINITY, f64::min)
        };
        // The marginal is worked out only on the least crowded workers, the ones the rule lets
        // it decide between: reading every worker's jobs at each placement made a placement
        // cost what the live jobs number (docs/performance.md, "Placements read the least
        // crowded"). A worker it is not worked out on scores infinite, as one the job does not
        // fit on. An event lists every score when it lists every worker ([`SCORES_SHOWN`]).
        // A job with a value curve is placed where it adds the most value net of what it
        // costs the jobs it delays, and turned away where that is nothing anywhere
        // ([`value_net`]): the value paper's admission (value-based-allocation.txt :104:
        // place where the expected value is highest, reject when it is not positive), with
        // converge's own predictions of the finishes. Checked at its first placement only: a
        // job placed again (restored, drained) is not turned away.
        // Weighed only on what is known of the job itself (its user's estimate, before it
        // reports): turned away on other jobs' median it would be turned away on nothing.
        let value_rule = match (
            job.spec.value_curve,
            self.key,
            job.epoch,
            view.own_remaining_work(job),
        ) {
            (Some(curve), Key::Remaining, 0, Some(x)) => Some((curve, x)),
            _ => None,
        };
        let mut scores = vec![f64::INFINITY; workers.len()];
        let least_fitting = least_among(&|i| fits[i]);
        let all = workers.len() <= super::SCORES_SHOWN;
        let (mut unscored, mut odd) = (Vec::new(), false);
        for i in (0..workers.len()).filter(|&i| fits[i]) {
            if all || !more_crowded(crowd[i], least_fitting) {
                scores[i] = marginal_on(i);
                odd |= !scores[i].is_finite();
            } else {
                unscored.push(i);
            }
        }
        // A marginal that is not finite (a work estimate that is not) rules its worker out,
        // and the least crowded are then found among the others: in that rare case, and for
        // the value rule, which weighs every worker, every score is worked out.
        if value_rule.is_some() || odd {
            for i in unscored {
                scores[i] = marginal_on(i);
            }
        }
        let least = least_among(&|i| scores[i].is_finite());
        let best = scores
            .iter()
            .enumerate()
            .filter(|&(i, s)| s.is_finite() && !more_crowded(crowd[i], least))
            .min_by(|a, b| a.1.total_cmp(b.1).then(crowd[a.0].total_cmp(&crowd[b.0])))
            .map(|(i, _)| i);
        if let Some((curve, x)) = value_rule {
            let age = now - job.submitted_at;
            let nets: Vec<Option<ValueNet>> = (workers.iter().zip(&fits))
                .map(|(w, &f)| f.then(|| value_net(now, w, view, &works, (&job.id, curve, age, x))))
                .collect();
            let top = nets
                .iter()
                .enumerate()
                .filter_map(|(i, n)| Some((i, (*n)?)))
                .max_by(|a, b| {
                    (a.1.gain - a.1.loss)
                        .total_cmp(&(b.1.gain - b.1.loss))
                        .then_with(|| scores[b.0].total_cmp(&scores[a.0]))
                });
            if let Some((i, n)) = top {
                let terms = format!(
                    "it would finish {:.0} s after submission, worth {} of its value {}, and the jobs it would go ahead of there would lose {} of theirs",
                    age + n.finish_in,
                    Amount(n.gain),
                    Amount(curve.max_value),
                    Amount(n.loss)
                );
                let attributes = BTreeMap::from([("scores".into(), scores_text(ids, &scores, i))]);
                return if n.gain - n.loss <= 0.0 {
                    Admission::Reject {
                        reason: format!(
                            "rejected by converge: it adds no value net of what it costs the jobs it delays on any worker; at best (on {}) {terms}",
                            ids[i]
                        ),
                    }
                } else {
                    Admission::Place {
                        worker: ids[i].clone(),
                        cpu_shares: 0,
                        victims: Vec::new(),
                        reason: format!(
                            "placed on {} by converge: the most value net of what it costs the jobs it delays; {terms}",
                            ids[i]
                        ),
                        attributes,
                    }
                };
            }
        }
        match best {
            Some(i) => placed_least_marginal(
                ids,
                i,
                (crowd[i], scores[i]),
                scores_text(ids, &scores, i),
                own.is_some(),
            ),
            None => Admission::Wait {
                reason: converge_policy::cluster::unschedulable_reason(&need, snaps),
                // Not when it fits somewhere whose marginal is not finite: that reads the
                // works of other jobs, which a submission changes (their median).
                for_room: !fits.contains(&true),
            },
        }
    }
}

impl ClusterPolicy for PriorityPolicy {
    fn name(&self) -> &'static str {
        self.name
    }

    fn reads_value_curves(&self) -> bool {
        // Ordered by remaining work, a job whose value is gone is dropped; rebalancing, a move
        // that would cost a job with a curve more than it gains is not made. `las` does
        // neither.
        matches!(self.key, Key::Remaining) || self.rebalance.is_some()
    }

    fn orders_by_crowd(&self) -> bool {
        // `converge` places by crowding; `las` places with Spread, by running jobs.
        self.spread.is_none()
    }

    fn forecast_weights(&self, capacity: f64, jobs: &[Load<'_>]) -> Option<Vec<f64>> {
        // The split `limits` sends as weights, with each job's key as the forecast has it,
        // and the first job held first as `limits` holds it: forecast without the hold, a
        // job held second read as one that cannot use more than its part (a review).
        let mut claims: Vec<Claim<'_>> = jobs
            .iter()
            .map(|l| Claim {
                job: l.job,
                key: self.key_of(|| l.remaining, l.attained),
            })
            .collect();
        hold_first(&mut claims, |i| self.given_to(jobs[i].job, jobs[i].epoch));
        Some(split(capacity, &claims, BETA))
    }

    fn place(&mut self, now: Time, job: &Job, view: ClusterView<'_>) -> Admission {
        if let Some(spread) = &mut self.spread {
            return spread.admit(job, view);
        }
        // Under shortest-remaining-first on the worker, placing a job of work x adds its own
        // completion (the work of the jobs shorter than it, then its own) and x to every
        // longer job's: the marginal increase of the sum of completion times, the greedy rule
        // for minimising it. In seconds at the worker's capacity and speed, so small and slow
        // workers count as such; a job whose work is unknown counts as a typical one.
        if let Some(placed) = self.place_in_band(job, view) {
            #[cfg(any(test, debug_assertions))]
            {
                assert_eq!(
                    placed,
                    self.place_scanning(now, job, view),
                    "converge's placement from the crowding order and its scan"
                );
            }
            return placed;
        }
        self.place_scanning(now, job, view)
    }

    /// `las` waits as Spread does; `converge` waits for room only when no schedulable worker
    /// fits the request, and says so in the words of the placers (`place_scanning`).
    fn wait_kind(&self, job: &Job) -> Option<WaitKind> {
        Placing::wait_kind(job)
    }

    fn place_move(&mut self, now: Time, job: &Job, view: ClusterView<'_>) -> Option<WorkerId> {
        match self.place(now, job, view) {
            Admission::Place { worker, .. } => Some(worker),
            _ => None,
        }
    }

    fn on_report(
        &mut self,
        _now: Time,
        report: Report<'_>,
        view: ClusterView<'_>,
    ) -> Vec<Decision> {
        match report {
            Report::Heartbeat { worker } => self.limits(view, worker),
            Report::MigrationRequest { .. } => Vec::new(),
        }
    }

    fn on_tick(&mut self, now: Time, view: ClusterView<'_>) -> Vec<Decision> {
        // A job whose value curve has reached zero, or will have by the soonest it can
        // finish, is given up (value-based-allocation.txt :65): what it would still compute is
        // worth nothing to its user, and its CPU goes to jobs it can still earn for. The
        // soonest is shortest-remaining-first's: after the jobs served before it on its worker
        // ([`served_before`]), at the worker's speed, so a later arrival that overtakes it can
        // only make it later. Judged early only on what is known of the job itself
        // ([`ClusterView::own_remaining_work`]), and only while it waits, runs or starts (one
        // waiting as if it started now, alone on the fastest worker): a job being saved (a
        // move, a stop at convergence) is left to finish that.
        let mut out = Vec::new();
        // Read once for the drops and the rebalancing, and only if either is due.
        let mut works = None;
        if self.key == Key::Remaining && view.valued > 0 {
            let works = works.get_or_insert_with(|| Works::of(view));
            let mut fastest = None;
            for j in view.jobs.values().filter(|j| !j.is_terminal()) {
                let Some(curve) = j.spec.value_curve else {
                    continue;
                };
                if matches!(j.phase, JobPhase::Stopping { .. }) {
                    continue;
                }
                let since = now - j.submitted_at;
                let soonest = match (&j.phase, view.own_remaining_work(j)) {
                    (
                        JobPhase::Running { worker } | JobPhase::Starting { worker, .. },
                        Some(own),
                    ) => view
                        .workers
                        .get(worker)
                        .filter(|w| speed(w) > 0.0)
                        .map(|w| {
                            let ahead = served_before(w, works, (own, &j.id));
                            let at = since + (ahead + own) / speed(w);
                            (
                                at,
                                "with the work it has left and the jobs served before it",
                            )
                        }),
                    // Waiting: were it started now alone on the fastest worker (a walk saw a
                    // queued job wait out its value, its own ETA long past its zero).
                    (JobPhase::Pending, Some(own)) => {
                        // Ready workers, connected or not: a drop is final, and a worker's
                        // stream that blinked for a second (or a restarted manager's wait
                        // for its agents) dropped a job that could still make it (a review).
                        let fastest = *fastest.get_or_insert_with(|| {
                            (view.workers.values())
                                .filter(|w| w.state == WorkerPhase::Ready)
                                .map(speed)
                                .fold(0.0, f64::max)
                        });
                        let how = "waiting, with the work it has left, were it started now alone on the fastest worker";
                        (fastest > 0.0).then(|| (since + own / fastest, how))
                    }
                    _ => None,
                };
                let reason = if curve.value_at(since) <= 0.0 {
                    format!(
                        "dropped by converge: its value curve reached zero {since:.0} s after submission"
                    )
                } else if let Some((at, how)) = soonest.filter(|&(at, _)| curve.value_at(at) <= 0.0)
                {
                    format!(
                        "dropped by converge: it cannot finish before its value curve reaches zero ({:.0} s after submission): {how}, it would finish {at:.0} s after submission at the soonest",
                        curve.zero_value_at_s
                    )
                } else {
                    continue;
                };
                out.push(Decision::Drop {
                    job: j.id.clone(),
                    reason,
                });
            }
        }
        let Some(every) = self.rebalance else {
            return out;
        };
        let due = *self.next_rebalance.get_or_insert(now + every);
        if now < due {
            return out;
        }
        self.next_rebalance = Some(now + every);
        // Not a job given up this tick: the move would find it gone and spend the turn.
        let dropped: Vec<JobId> = out
            .iter()
            .filter_map(|d| match d {
                Decision::Drop { job, .. } => Some(job.clone()),
                _ => None,
            })
            .collect();
        out.extend(
            self.even_out(now, view, works.get_or_insert_with(|| Works::of(view)))
                .filter(|d| !matches!(d, Decision::Move { job, .. } if dropped.contains(job))),
        );
        out
    }

    fn next_due(&self) -> Option<Time> {
        self.next_rebalance
    }

    fn on_departure(
        &mut self,
        _now: Time,
        worker: &WorkerId,
        job: &JobId,
        view: ClusterView<'_>,
    ) -> Vec<Decision> {
        self.given.remove(job);
        // The room it left goes to the next in line at once, not a heartbeat later.
        self.limits(view, worker)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(job: &str, key: Option<f64>) -> Claim<'_> {
        Claim { job, key }
    }

    /// The job served first stays first until another's key is [`HOLD`] below its own; with
    /// no weight given yet, or two given alike, the keys alone decide.
    #[test]
    fn the_first_job_keeps_its_place_until_another_is_clearly_shorter() {
        let first = |given: &[u32], keys: [f64; 2]| {
            let mut claims = [claim("a", Some(keys[0])), claim("b", Some(keys[1]))];
            hold_first(&mut claims, |i| given[i]);
            let c = split(1.0, &claims, BETA);
            if c[0] > c[1] { "a" } else { "b" }
        };
        // a is first; b is 5% shorter: a stays; 15% shorter: b goes first.
        assert_eq!(first(&[1800, 250], [100.0, 95.0]), "a");
        assert_eq!(first(&[1800, 250], [100.0, 85.0]), "b");
        // Nothing given yet, or alike: the shorter.
        assert_eq!(first(&[0, 0], [100.0, 95.0]), "b");
        assert_eq!(first(&[1024, 1024], [100.0, 95.0]), "b");
    }

    /// The forecast splits a worker as `limits` does, the first job held first, under
    /// `converge` (by work left) and `las` (by service had).
    #[test]
    fn the_forecast_splits_as_the_held_limits_do() {
        for mut p in [PriorityPolicy::converge(60.0), PriorityPolicy::las()] {
            p.given.insert("a".into(), (1, 1800));
            p.given.insert("b".into(), (1, 250));
            // a's key 100, b's 95: a held first.
            let load = |job, epoch, key| Load {
                job,
                epoch,
                remaining: Some(key),
                attained: key,
                demand: 1.0,
            };
            let loads = [load("a", 1, 100.0), load("b", 1, 95.0)];
            let forecast = (p.forecast_weights(1.0, &loads)).unwrap();
            let mut claims = [claim("a", Some(100.0)), claim("b", Some(95.0))];
            hold_first(&mut claims, |i| [1800, 250][i]);
            assert_eq!(forecast, split(1.0, &claims, BETA), "{}", p.name);
            assert!(
                forecast[0] > forecast[1],
                "{}: a held first: {forecast:?}",
                p.name
            );
            // a restarted since (its incarnation 2): what its first was given holds nothing,
            // as in `limits`, and b, with the smaller key, comes first.
            let loads = [load("a", 2, 100.0), load("b", 1, 95.0)];
            let forecast = (p.forecast_weights(1.0, &loads)).unwrap();
            assert!(forecast[1] > forecast[0], "{}: {forecast:?}", p.name);
        }
    }

    #[test]
    fn the_shortest_job_gets_most_of_what_the_guard_leaves() {
        // One core, three jobs: guards 1/6 each; of the rest the shortest gets 7/8, the next
        // 1/8 of what remains... and the last the remainder.
        let c = split(
            1.0,
            &[
                claim("long", Some(100.0)),
                claim("short", Some(5.0)),
                claim("mid", Some(20.0)),
            ],
            2.0,
        );
        let sixth = 1.0 / 6.0;
        let rest = 1.0 - 3.0 * sixth;
        assert!((c[1] - (sixth + rest * 7.0 / 8.0)).abs() < 1e-9, "{c:?}");
        assert!(
            (c[2] - (sixth + rest / 8.0 * 7.0 / 8.0)).abs() < 1e-9,
            "{c:?}"
        );
        assert!(c[1] > c[2] && c[2] > c[0], "{c:?}");
        assert!((c.iter().sum::<f64>() - 1.0).abs() < 1e-9);
    }

    #[test]
    fn no_job_starves_under_the_guard() {
        let names: Vec<String> = (0..8).map(|i| format!("j{i}")).collect();
        let claims: Vec<Claim<'_>> = (names.iter().enumerate())
            .map(|(i, name)| claim(name, Some(i as f64)))
            .collect();
        let c = split(2.0, &claims, 2.0);
        for x in &c {
            assert!(*x >= 2.0 / 16.0 - 1e-9, "{c:?}");
        }
    }

    #[test]
    fn equal_keys_are_served_in_job_id_order() {
        // Given out of id order: a stable sort alone would serve "b" first.
        let c = split(1.0, &[claim("b", Some(5.0)), claim("a", Some(5.0))], 2.0);
        assert!(c[1] > c[0], "{c:?}");
    }

    #[test]
    fn a_job_without_progress_lines_still_gets_a_fair_share() {
        let c = split(
            1.0,
            &[
                claim("silent", None),
                claim("a", Some(1.0)),
                claim("b", Some(9.0)),
            ],
            2.0,
        );
        assert!((c[0] - 1.0 / 3.0).abs() < 1e-9, "{c:?}");
    }

    #[test]
    fn weights_are_in_proportion_to_the_split() {
        // Two jobs, fair share half a core: the default weight is the fair share's.
        assert_eq!(shares_for(0.5, 0.5), 1024);
        assert_eq!(shares_for(0.75, 0.5), 1536);
        // Within the kernel's range at both ends.
        assert_eq!(shares_for(0.0, 0.5), 2);
        assert_eq!(shares_for(1e6, 0.5), 262_144);
    }
}
