//! When each job of a worker will finish: the worker's queue run forward under the policy's own
//! split ([`super::policy::ClusterPolicy::forecast_weights`]).
//!
//! Why not "remaining work at the current share": under `converge` a job held back behind a
//! shorter one runs at its guard (a sixteenth of the worker, say) only until the shorter one
//! ends, then takes most of the worker. Its current share predicted finishes many times too
//! late (the demo showed "eta 8m00s" for a job that ended 40 s later). Under free competition
//! the same holds less sharply: every job speeds up when a neighbour ends.
//!
//! The forecast is a fluid model, the simulator's CPU model ([`converge_policy::share`]) with
//! no sharing costs: at each step the policy weighs the jobs still running given their
//! remaining work and attained service, capacity is water-filled over the weights (each job
//! capped at what it can use), and time advances to the next finish, or by a slice of the
//! horizon so that a policy whose order changes as jobs run (least attained service) is
//! followed. Arrivals, moves and the policy's later choices of placement are not foreseen.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use converge_policy::Ranked;
use converge_policy::estimate::Basis;
use converge_policy::share::weighted_water_fill_into;

use super::lifecycle::{Job, JobPhase, OptF64, Worker};
use super::types::{JobId, Time};
use super::{Core, Eta};

/// One job of the worker, as the forecast runs it.
#[derive(Debug, Clone, PartialEq)]
pub struct Load<'a> {
    /// The job.
    pub job: &'a str,
    /// Its incarnation (what a policy gave another, it did not give this one).
    pub epoch: u64,
    /// Reference core-seconds of work left; `None` when nothing tells (the job then keeps
    /// its share for the whole forecast and is given no finish).
    pub remaining: Option<f64>,
    /// Reference core-seconds it has had (least attained service orders by it).
    pub attained: f64,
    /// The most cores it can use (its parallelism); the worker's capacity when unknown.
    pub demand: f64,
}

/// Steps the horizon is cut into at least (so an order that changes as jobs run is followed).
const SLICES: f64 = 32.0;
/// Steps at most, whatever the jobs (bounds the cost of one forecast).
const MAX_STEPS: usize = 512;

/// Seconds from now until each of `loads` finishes on a worker of `capacity` cores that runs
/// `speed` reference core-seconds per core-second, in the order given; `None` for a job with
/// no known remaining work or one the forecast sees no end of.
///
/// `weights` is the policy's split for the jobs still running (one positive weight each, in
/// their order); `None` means the policy's limits cannot be foreseen, and every job keeps
/// `current` (its cores now, in the order of `loads`) to the end.
pub fn finish_in(
    capacity: f64,
    speed: f64,
    loads: &[Load<'_>],
    current: &[f64],
    mut weights: impl FnMut(&[Load<'_>]) -> Option<Vec<f64>>,
) -> Vec<Option<f64>> {
    let speed = speed.max(1e-6);
    let mut out = vec![None; loads.len()];
    // Still running, side by side: the index into `loads`, the job as it stands now, and the
    // rate it had at the last step (carried to its end should the steps run out). Buffers
    // kept across steps (the policy's weights aside): allocating them at every step of every
    // forecast was half of the allocator's samples in a profile of the simulator
    // (`docs/performance.md`, "Forecasts, progress lines, SpeCon's syncs").
    let mut at: Vec<usize> = (0..loads.len()).collect();
    let mut now: Vec<Load<'_>> = loads.to_vec();
    let mut rates: Vec<f64> = Vec::with_capacity(loads.len());
    let (mut caps, mut cores, mut order) = (Vec::new(), Vec::new(), Vec::new());
    // A slice of the time the known work takes at the first step's rates: a worker is followed
    // through about SLICES steps plus one per job, whether or not its jobs can fill it.
    let mut slice = None;
    let mut t = 0.0;
    for _ in 0..MAX_STEPS {
        if !now.iter().any(|l| l.remaining.is_some_and(|r| r > 0.0)) {
            break;
        }
        let held = match weights(&now) {
            Some(mut w) if w.len() == now.len() => {
                caps.clear();
                caps.extend(now.iter().map(|l| l.demand.min(capacity)));
                w.iter_mut().for_each(|x| *x = x.max(1e-9));
                weighted_water_fill_into(capacity, &caps, &w, &mut order, &mut cores);
                false
            }
            _ => {
                cores.clear();
                cores.extend(at.iter().map(|&i| current[i]));
                true
            }
        };
        // Reference core-seconds per second each job gets.
        rates.clear();
        rates.extend(cores.iter().map(|c| c * speed));
        let next = now
            .iter()
            .zip(&rates)
            .filter_map(|(l, &r)| Some(l.remaining? / r).filter(|_| r > 0.0))
            .fold(f64::INFINITY, f64::min);
        if !next.is_finite() {
            // Nobody with known work runs: nobody ends.
            rates.clear();
            break;
        }
        let slice = *slice.get_or_insert_with(|| {
            let known: f64 = now.iter().filter_map(|l| l.remaining).sum();
            known / rates.iter().sum::<f64>().max(1e-12) / SLICES
        });
        // Held shares do not change until a job ends: no slices needed.
        let dt = if held { next } else { next.min(slice) };
        t += dt;
        for (l, r) in now.iter_mut().zip(&rates) {
            l.attained += r * dt;
            if let Some(rem) = &mut l.remaining {
                *rem -= r * dt;
            }
        }
        // A job within a part in a million of its end has ended (rounding of the steps); the
        // others move up, in order.
        let mut kept = 0;
        for k in 0..now.len() {
            let i = at[k];
            match now[k].remaining {
                Some(rem) if rem <= 1e-6 * loads[i].remaining.unwrap_or(0.0).max(1e-9) => {
                    out[i] = Some(t);
                }
                _ => {
                    at.swap(kept, k);
                    now.swap(kept, k);
                    rates.swap(kept, k);
                    kept += 1;
                }
            }
        }
        at.truncate(kept);
        now.truncate(kept);
        rates.truncate(kept);
    }
    // Out of steps: whoever is left runs on at the rate it had last.
    for ((&i, l), r) in at.iter().zip(&now).zip(&rates) {
        if let (Some(rem), true) = (l.remaining, *r > 0.0) {
            out[i] = Some(t + rem / r);
        }
    }
    out
}

/// The queue of pending jobs run forward ([`Etas::chain`]).
struct Chain<'a> {
    /// Ends not yet taken, soonest first (the index is unused: equal ends are alike).
    ends: BinaryHeap<Reverse<Ranked>>,
    /// The queued jobs, in order.
    order: Vec<&'a str>,
    /// The start and finish of each of the first of them, as far as worked out.
    done: Vec<Option<(Time, Time)>>,
}

/// A job using less than this part of the share its weight gives it is held back by its own
/// parallelism, not by its neighbours: what it uses now is all it can use.
const CAPPED_BELOW: f64 = 0.8;

/// The smallest share (cores) whose use shows a cap: a job given less, starved by its
/// neighbours, uses next to nothing whatever it could use, and read as a cap that use would
/// hold it back long after they end (a new user saw `eta 482h` of a job that ran 37 s).
const READABLE_PART: f64 = 0.1;

/// ETAs at one moment, each worker's forecast run once and kept for the jobs asked after.
pub struct Etas<'a> {
    core: &'a Core,
    now: Time,
    /// Per worker: seconds until each of its running jobs ends.
    workers: BTreeMap<&'a str, BTreeMap<&'a str, Option<f64>>>,
    /// When running jobs end, soonest first: the k-th pending job starts at the k-th.
    ends: Option<Vec<Time>>,
    /// Each pending job's place in the queue.
    queue: Option<BTreeMap<&'a str, usize>>,
    /// The queued jobs in order, and their starts and finishes as far as worked out
    /// ([`Etas::chain`]); made with `queue`.
    chain: Option<Chain<'a>>,
    /// The schedulable (or expected) workers' sizes (cores, memory), those no other is as big
    /// as in both.
    shapes: Option<Vec<(f64, u64)>>,
}

impl<'a> Etas<'a> {
    pub(super) fn new(core: &'a Core, now: Time) -> Self {
        Etas {
            core,
            now,
            workers: BTreeMap::new(),
            ends: None,
            queue: None,
            chain: None,
            shapes: None,
        }
    }

    /// When job `id` will finish (and, pending, start), as far as its reports tell.
    pub fn eta(&mut self, id: &str) -> Option<Eta> {
        let core = self.core;
        let job = core.jobs.get(id)?;
        let view = core.view();
        let est = view.estimate(job);
        match &job.phase {
            JobPhase::Pending => {
                // FIFO: each pending job starts at the soonest end not yet taken, of a running
                // job or of a pending one before it, and then runs at the cores it asked for
                // ([`Etas::chain`]). Jobs no worker could hold even empty (accepted before any
                // worker joined, bigger than every one that did) are not in that queue: they
                // have no ETA, and hold no place before the others.
                if self.queue.is_none() {
                    let shapes = self.shapes().to_vec();
                    let fits = |j: &Job| {
                        let (cpus, memory) = (j.spec.cpus, j.spec.memory_bytes);
                        shapes.iter().any(|&(c, m)| cpus <= c + 1e-9 && memory <= m)
                    };
                    let order: Vec<&str> = (core.pending.values())
                        .filter(|id| core.jobs.get(id).is_some_and(fits))
                        .map(|id| id.as_str())
                        .collect();
                    self.queue = Some(order.iter().enumerate().map(|(k, &id)| (id, k)).collect());
                    let ends = self.ends().iter().map(|&t| Reverse(Ranked(t, 0))).collect();
                    self.chain = Some(Chain {
                        ends,
                        order,
                        done: Vec::new(),
                    });
                }
                let k = *self.queue.as_ref()?.get(id)?;
                let (start, finish) = self.chain(k)?;
                Some(Eta {
                    remaining_s: finish - self.now,
                    finish_at: finish,
                    start_at: Some(start),
                    basis: est.map_or(Basis::AttainedService, |e| e.basis),
                    confidence: est.map_or(0.05, |e| e.confidence * 0.5),
                })
            }
            p if p.state().is_terminal() => None,
            // It finishes once the value policy resumes it, which nothing foresees: at the
            // cores it had, a frozen job showed `eta 2s` for as long as it stayed frozen (a
            // new user's walk).
            JobPhase::Paused { .. } => None,
            // Its worker is not heard from: whether it still runs is not known, and the ETA
            // it had stood unchanged for as long as the worker was away (a walk).
            JobPhase::Lost { .. } => None,
            _ => {
                let est = est?;
                let w = core.workers.get(job.worker()?)?;
                // A job not running (moving), or one the forecast sees no end of: at the cores
                // it has.
                let remaining_s = self
                    .worker(w)
                    .get(id)
                    .copied()
                    .flatten()
                    .unwrap_or_else(|| est.seconds_at(cores_now(job), w.calibration));
                Some(Eta {
                    remaining_s,
                    finish_at: self.now + remaining_s,
                    start_at: None,
                    basis: est.basis,
                    confidence: est.confidence,
                })
            }
        }
    }

    /// The sizes of the schedulable workers (cores, and memory, unbounded where a worker
    /// gives none) that no other worker matches in both: a job fits one of them empty if it
    /// fits any worker empty. A restarted manager counts the workers it waits for: else no
    /// pending job had an ETA until the agents came back.
    fn shapes(&mut self) -> &[(f64, u64)] {
        let core = self.core;
        self.shapes.get_or_insert_with(|| {
            let mut all: Vec<(f64, u64)> = (core.workers.values())
                .filter(|w| core.schedulable_or_expected(w))
                .map(|w| (w.cpu_capacity, w.memory_capacity()))
                .collect();
            // Most cores first: each size kept has more memory than every one before it.
            all.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)));
            let mut most_memory = None;
            all.retain(|&(_, m)| {
                let kept = most_memory.is_none_or(|most| m > most);
                most_memory = most_memory.max(Some(m));
                kept
            });
            all
        })
    }

    /// The start and finish of the queued pending job at place `k`: the soonest end not yet
    /// taken by a job before it, whose own end is one the jobs after it may take. Only running
    /// jobs' ends counted, and the (n+1)-th pending job behind n running ones had no ETA (a
    /// walk: the third and fourth of a queue had none). A job of unknown size takes an end and
    /// gives none back. Worked out up to `k` only: a GetJob of a job near the head of a long
    /// queue does not pay for the rest.
    fn chain(&mut self, k: usize) -> Option<(Time, Time)> {
        let core = self.core;
        let view = core.view();
        let chain = self.chain.as_mut()?;
        while chain.done.len() <= k {
            let id = *chain.order.get(chain.done.len())?;
            let placed = chain.ends.pop().and_then(|Reverse(Ranked(start, _))| {
                let job = core.jobs.get(id)?;
                let work = view.estimate(job)?.work;
                let finish = start + work / job.spec.cpus.max(0.01);
                chain.ends.push(Reverse(Ranked(finish, 0)));
                Some((start, finish))
            });
            chain.done.push(placed);
        }
        chain.done[k]
    }

    fn ends(&mut self) -> &[Time] {
        if self.ends.is_none() {
            let core = self.core;
            let mut ends: Vec<Time> = Vec::new();
            for w in core.workers.values() {
                let now = self.now;
                ends.extend(self.worker(w).values().filter_map(|f| f.map(|s| now + s)));
            }
            ends.sort_by(f64::total_cmp);
            self.ends = Some(ends);
        }
        self.ends.as_deref().unwrap_or_default()
    }

    /// Seconds until each running (or starting) job of `w` ends.
    fn worker(&mut self, w: &'a Worker) -> &BTreeMap<&'a str, Option<f64>> {
        let core = self.core;
        self.workers.entry(w.id.as_str()).or_insert_with(|| {
            let (jobs, loads) = loads(core, w);
            let current: Vec<f64> = jobs.iter().map(|j| cores_now(j)).collect();
            let finish = finish_in(w.cpu_capacity, w.calibration, &loads, &current, |l| {
                core.policy.forecast_weights(w.cpu_capacity, l)
            });
            loads.iter().map(|l| l.job).zip(finish).collect()
        })
    }
}

/// The jobs sharing `w`'s CPU, and their loads, each job's demand read off its use
/// ([`infer_demand`]).
///
/// A use measured before a job left the worker (its report averages over a time when that
/// job still ran) is what it had of another split: read against the split it had then, when
/// that job left ([`Core::read_caps`], kept in [`Job::cap_read`]), not against the one it has
/// now.
/// Read against the one it has now, the use of a job held back by the one that left was
/// taken for all it can use: a new user saw an ETA of 24 s jump to 2 minutes, and back, as
/// a neighbour ended.
fn loads<'c>(core: &'c Core, w: &'c Worker) -> (Vec<&'c Job>, Vec<Load<'c>>) {
    let view = core.view();
    let jobs = view.sharing(w);
    let mut loads: Vec<Load<'_>> = jobs
        .iter()
        .map(|j| Load {
            job: j.id.as_str(),
            epoch: j.epoch,
            remaining: view.remaining_work(j),
            attained: j.cpu_s,
            demand: w.cpu_capacity,
        })
        .collect();
    if let Some(weights) = core.policy.forecast_weights(w.cpu_capacity, &loads) {
        // What the job once showed it can use ([`Job::use_most`]). A job that never showed
        // more than a starved use (held back from its first step on a busy host) is still
        // read at it: its uses cannot tell the host's load from its own parallelism (a walk:
        // ETAs 5 and 6 times the real end).
        let used: Vec<f64> = jobs
            .iter()
            .map(|j| match settled(j, w) {
                true => j.use_most.get().unwrap_or(j.view.cpu_usage),
                false => j.cap_read.get().unwrap_or(0.0),
            })
            .collect();
        infer_demand(w.cpu_capacity, &mut loads, &used, &weights);
    }
    (jobs, loads)
}

/// Whether `j`'s use was measured while `w`'s jobs were the ones it has now (its report
/// before the last came after the last job left). An incarnation's first report is never
/// read: it averages over the container's start, when a job uses less than it can.
fn settled(j: &Job, w: &Worker) -> bool {
    j.view_from.get().is_some_and(|t| t >= w.shared_since)
}

impl Core {
    /// Reads what the uses of worker `w`'s jobs show them to be able to use, as a job is about
    /// to leave it, against the split they have before it does: into [`Job::cap_read`] of
    /// each job whose use is of that split, the cores it is held to by its own parallelism
    /// (none when it is not).
    pub(super) fn read_caps(&mut self, w: &str) {
        let Some(worker) = self.workers.get(w) else {
            return;
        };
        let (jobs, loads) = loads(self, worker);
        let caps: Vec<(JobId, OptF64)> = (jobs.iter().zip(&loads))
            .filter(|(j, _)| settled(j, worker))
            .map(|(j, l)| {
                let capped = l.demand < worker.cpu_capacity;
                (j.id.clone(), capped.then_some(l.demand).into())
            })
            .collect();
        for (j, cap) in caps {
            if let Some(j) = self.jobs.get_mut(&j) {
                j.cap_read = cap;
            }
        }
    }
}

/// What each job can use, read off what it uses now (`used`: 0 where the use is not to be
/// read; [`loads`] says which). Worth it on the whole: measured on 2026-11-25, the simulator's
/// median ETA error at a quarter of each job's run under `converge` (`sim/CONVERGE.md`) was
/// 23.7% without this reading and 8.4% with it.
/// CFS gives a job its weight's part of the
/// worker, plus its part of what capped jobs leave, up to what it can use. So a job using
/// well under the part the water-fill gives it is held by its own parallelism, and that use is
/// all it can use; once it is capped, the others' parts grow, and the test is repeated. A job
/// using its part is taken to use whatever more it would get (its demand stays `capacity`).
fn infer_demand(capacity: f64, loads: &mut [Load<'_>], used: &[f64], weights: &[f64]) {
    if weights.len() != loads.len() {
        return;
    }
    let weights: Vec<f64> = weights.iter().map(|x| x.max(1e-9)).collect();
    // Kept across passes, as `finish_in` keeps its own.
    let (mut caps, mut order, mut parts) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..loads.len() {
        caps.clear();
        caps.extend(loads.iter().map(|l| l.demand));
        weighted_water_fill_into(capacity, &caps, &weights, &mut order, &mut parts);
        let mut changed = false;
        for ((l, &u), &part) in loads.iter_mut().zip(used).zip(&parts) {
            if u > 0.0 && u < l.demand && part >= READABLE_PART && u < CAPPED_BELOW * part {
                l.demand = u;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
}

/// The cores a job has now: its limit if the policy set one, else what it used at its last
/// report, else what it asked for.
fn cores_now(job: &Job) -> f64 {
    job.assigned_cpus
        .get()
        .or((job.view.cpu_usage > 0.0).then_some(job.view.cpu_usage))
        .unwrap_or(job.spec.cpus.max(0.01))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(job: &str, remaining: f64, demand: f64) -> Load<'_> {
        Load {
            job,
            epoch: 1,
            remaining: Some(remaining),
            attained: 0.0,
            demand,
        }
    }

    fn equal(l: &[Load<'_>]) -> Option<Vec<f64>> {
        Some(vec![1.0; l.len()])
    }

    fn close(got: Option<f64>, want: f64) {
        let got = got.expect("a finish");
        assert!((got - want).abs() < 1e-6 * want.max(1.0), "{got} != {want}");
    }

    #[test]
    fn free_competition_speeds_up_the_others_when_one_ends() {
        // 2 cores, 10 and 30 core-s: both at 1 core until the first ends at 10 s, then the
        // second alone at 2 cores: 20 left / 2 = 10 s more. At the current share it would be
        // 30 s.
        let f = finish_in(
            2.0,
            1.0,
            &[load("a", 10.0, 2.0), load("b", 30.0, 2.0)],
            &[1.0, 1.0],
            equal,
        );
        close(f[0], 10.0);
        close(f[1], 20.0);
    }

    #[test]
    fn a_job_capped_by_its_parallelism_leaves_the_rest_and_the_speed_counts() {
        // 4 cores at twice the reference speed; a can use 1 core: a gets 1, b 3.
        // a: 8 / (1·2) = 4 s; b: 60 - 3·2·4 = 36 left, then 4 cores: 36/8 = 4.5 s more.
        let f = finish_in(
            4.0,
            2.0,
            &[load("a", 8.0, 1.0), load("b", 60.0, 4.0)],
            &[1.0, 3.0],
            equal,
        );
        close(f[0], 4.0);
        close(f[1], 8.5);
    }

    #[test]
    fn a_held_back_job_is_forecast_to_run_once_the_one_ahead_ends() {
        // The policy gives the shorter job 15 of 16 parts of one core, the other 1.
        let srpt = |l: &[Load<'_>]| {
            let first = l
                .iter()
                .enumerate()
                .min_by(|a, b| a.1.remaining.unwrap().total_cmp(&b.1.remaining.unwrap()))
                .map(|(i, _)| i)?;
            Some(
                (0..l.len())
                    .map(|i| if i == first { 15.0 } else { 1.0 })
                    .collect(),
            )
        };
        let f = finish_in(
            1.0,
            1.0,
            &[load("long", 20.0, 1.0), load("short", 15.0, 1.0)],
            &[1.0 / 16.0, 15.0 / 16.0],
            srpt,
        );
        // short: 15 / (15/16) = 16 s; long has done 1 by then, 19 left at the whole core.
        close(f[1], 16.0);
        close(f[0], 35.0);
        // Held at its current share it would have been forecast at 320 s.
    }

    #[test]
    fn least_attained_service_is_followed_as_the_order_changes() {
        // Two equal jobs under "whoever had less gets almost everything": they take turns,
        // so both end near the time processor sharing would give (20 s each on one core),
        // not 10 and 20 as a fixed order would.
        let las = |l: &[Load<'_>]| {
            let least = l
                .iter()
                .enumerate()
                .min_by(|a, b| a.1.attained.total_cmp(&b.1.attained))
                .map(|(i, _)| i)?;
            Some(
                (0..l.len())
                    .map(|i| if i == least { 99.0 } else { 1.0 })
                    .collect(),
            )
        };
        let f = finish_in(
            1.0,
            1.0,
            &[load("a", 10.0, 1.0), load("b", 10.0, 1.0)],
            &[0.5, 0.5],
            las,
        );
        let (a, b) = (f[0].unwrap(), f[1].unwrap());
        assert!(a > 19.0 && b > 19.0, "{a} {b}");
        assert!((a.max(b) - 20.0).abs() < 1e-4, "{a} {b}");
    }

    #[test]
    fn unforeseeable_limits_keep_the_current_shares_and_unknown_work_never_ends() {
        let mut unknown = load("u", 0.0, 1.0);
        unknown.remaining = None;
        let f = finish_in(
            2.0,
            1.0,
            &[load("a", 10.0, 2.0), unknown],
            &[0.5, 1.5],
            |_| None,
        );
        close(f[0], 20.0);
        assert_eq!(f[1], None);
        // Under free competition the unknown job keeps taking its share: a never has 2 cores.
        let mut unknown = load("u", 0.0, 2.0);
        unknown.remaining = None;
        let f = finish_in(
            2.0,
            1.0,
            &[load("a", 10.0, 2.0), unknown],
            &[1.0, 1.0],
            equal,
        );
        close(f[0], 10.0);
    }

    #[test]
    fn demand_is_read_off_use_below_the_part_the_water_fill_gives() {
        let mut loads = vec![
            load("a", 1.0, 4.0),
            load("b", 1.0, 4.0),
            load("c", 1.0, 4.0),
        ];
        // Weights 6:3:1 of 4 cores give 2.4, 1.2, 0.4. a uses 1: held by itself. With a
        // capped, b's part is 2.25 and it uses 1: held by itself too. c uses the 2 left:
        // as far as anyone knows it could use more.
        infer_demand(4.0, &mut loads, &[1.0, 1.0, 2.0], &[6.0, 3.0, 1.0]);
        let demand: Vec<f64> = loads.iter().map(|l| l.demand).collect();
        assert_eq!(demand, vec![1.0, 1.0, 4.0]);
        // A job not reported yet (no use) is not capped at nothing.
        let mut loads = vec![load("a", 1.0, 4.0), load("b", 1.0, 4.0)];
        infer_demand(4.0, &mut loads, &[0.0, 4.0], &[1.0, 1.0]);
        assert_eq!(loads[0].demand, 4.0);
        // A job its weight starves (1 part in 1025 of a core, as `value` gives a job worth
        // little) uses next to nothing whatever it could use: no cap is read off that.
        let mut loads = vec![load("starved", 1.0, 1.0), load("b", 1.0, 1.0)];
        infer_demand(1.0, &mut loads, &[0.0005, 0.99], &[1.0, 1024.0]);
        assert_eq!(loads[0].demand, 1.0);
    }

    #[test]
    fn a_worker_its_jobs_cannot_fill_is_followed_to_every_end() {
        // 64 cores and one-thread jobs: the slices are cut from what the jobs can use, not
        // from the worker, so the forecast does not run out of steps; each job's end is its
        // work at one core.
        let loads: Vec<Load<'_>> = ["a", "b", "c"]
            .iter()
            .zip([10.0, 20.0, 30.0])
            .map(|(j, w)| load(j, w, 1.0))
            .collect();
        let f = finish_in(64.0, 1.0, &loads, &[1.0; 3], equal);
        close(f[0], 10.0);
        close(f[1], 20.0);
        close(f[2], 30.0);
    }

    #[test]
    fn no_running_job_or_no_cpu_gives_no_finish() {
        assert!(finish_in(1.0, 1.0, &[], &[], equal).is_empty());
        let f = finish_in(1.0, 1.0, &[load("a", 5.0, 0.0)], &[0.0], equal);
        assert_eq!(f, vec![None]);
    }
}
