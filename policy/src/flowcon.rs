//! FlowCon: per-worker elastic CPU limits from growth efficiency, and growth-efficiency placement.
//!
//! - [`FlowCon`] is one worker's executor state (run by the agent, or by the simulator per
//!   worker). Its step, [`FlowCon::on_round`], runs Alg. 2 (listeners: a container appearing or
//!   finishing resets `itval`), Alg. 3 (adaptive threshold, optional) and Alg. 1 (categorize into
//!   New/Watching/Completing lists and set limits) and returns [`FlowConDecisions`] as data.
//! - [`FlowConPlacer`] is Alg. 4 (placement on the manager), a [`Placer`].
//!
//! Paper references are to the TCC'22 extended paper (flowcon-tcc2022-extended.txt) unless they
//! name the ICPP'19 paper (flowcon-icpp2019.txt), which has the same Alg. 1 with the lower bound
//! `1/(β·|c|)` that TCC'22 prints as `1/|c|`.
//!
//! ## Decisions where the papers leave a gap (see also design.md)
//! - Lower bound `1/(β·n)`, `β` configurable (default 2), n = containers on the worker
//!   (ICPP'19 Alg. 1 line 22, flowcon-icpp2019.txt:404-413). We apply it as a floor to *every*
//!   limit we compute, not only Completing ones: a New job's limit below a Completing job's floor
//!   would invert the priority the lists express. A Watching limit is kept unchanged (line 24)
//!   unless the floor rose because a container left; then it is raised to the floor.
//! - A New container with no growth efficiency yet (it just started, Alg. 2) gets limit 1, as in
//!   the papers' worked example (MNIST at 40 s, flowcon-icpp2019.txt:755-760). In `ΣG` it counts
//!   with a presumed `G = max(α, largest measured G on the worker)`: a job in NL is by definition
//!   at or above α. This is what makes a completing VAE fall to its floor (0.25 of a worker
//!   shared by two) the moment MNIST arrives.
//! - A container whose G is undefined this round (no new sample, no CPU use) keeps its category
//!   (design.md) and its last measured G counts in `ΣG`.
//! - Alg. 2 compares the *sets* of container ids, not only their count (lines 3-5 compare counts,
//!   which misses one arrival and one departure in the same interval).
//! - Alg. 3 averages G, not P (design.md). Its pseudo-code (lines 8-13) averages NL and WL, its
//!   text (flowcon-tcc2022-extended.txt:241) says NL and CL; we follow the pseudo-code, with an
//!   empty list contributing 0 as line 13 literally gives. With α = -1 (all completing) a new
//!   container makes Alg. 3 recompute; when no NL/WL job has a measured G yet, α returns to the
//!   last positive threshold so Alg. 1 runs and the newcomer is prioritized.
//! - Alg. 4 counts jobs placed on a worker but not yet in its report (`running - jobs.len()`) as
//!   New with no G: that is the paper's "NL is temporarily added 1" against stale heartbeats
//!   (flowcon-tcc2022-extended.txt:422). A worker with only Completing jobs (or none) is an
//!   "all in CL" worker; among those the fewest containers wins (lines 2-5); otherwise the
//!   minimum score wins (lines 10-13). The paper does not break ties; we prefer the worker with
//!   more capacity (cores × calibration), then the lowest index, so that in a heterogeneous
//!   cluster an empty 16-core worker is chosen before an empty 2-core one.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::cluster::{
    Category, JobRequest, JobSnapshot, Placement, Placer, PlacerIndex, Scores, WorkerSnapshot,
};
use crate::error::{Error, Result};
use crate::growth::{Direction, ProgressTracker, Resource, Sample, Usage, growth_efficiency};
use crate::ranked::Ranked;

/// FlowCon's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct FlowConConfig {
    /// Threshold α on growth efficiency (fraction of the initial metric per second per unit of
    /// resource). With `adaptive`, the starting value.
    pub alpha: f64,
    /// The algorithm interval `itval`, seconds (the initial value Alg. 2 resets to).
    pub itval: f64,
    /// β of the lower bound `1/(β·n)`.
    pub beta: f64,
    /// Run Alg. 3 (adaptive threshold) before each Alg. 1 round.
    pub adaptive: bool,
    /// The resource G is computed against.
    pub resource: Resource,
}

impl Default for FlowConConfig {
    /// ICPP'19's setting for the 3-job figures (α = 5%, itval = 20 s), β = 2, not adaptive.
    fn default() -> Self {
        FlowConConfig {
            alpha: 0.05,
            itval: 20.0,
            beta: 2.0,
            adaptive: false,
            resource: Resource::Cpu,
        }
    }
}

impl FlowConConfig {
    /// Checks the parameters.
    pub fn validate(&self) -> Result<()> {
        if !(self.alpha >= 0.0 && self.alpha.is_finite()) {
            return Err(Error::InvalidParameter {
                name: "alpha",
                value: self.alpha,
                expected: "a finite threshold >= 0",
            });
        }
        if !(self.itval > 0.0 && self.itval.is_finite()) {
            return Err(Error::InvalidParameter {
                name: "itval",
                value: self.itval,
                expected: "a positive number of seconds",
            });
        }
        if !(self.beta >= 1.0 && self.beta.is_finite()) {
            return Err(Error::InvalidParameter {
                name: "beta",
                value: self.beta,
                expected: "a finite number >= 1 (lower bound 1/(beta*n) must not exceed a fair share)",
            });
        }
        Ok(())
    }
}

/// What the worker's container monitor reports for one running container at a round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// The job (container) id.
    pub job_id: String,
    /// The latest progress sample, if the job reported any.
    pub sample: Option<Sample>,
    /// The job's initial metric value, if known (otherwise its first sample's value is used).
    pub initial_value: Option<f64>,
    /// The metric's direction.
    pub direction: Direction,
    /// Average resource use since the previous round.
    pub usage: Usage,
}

/// One job's state in a worker's FlowCon executor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobState {
    /// The job's list.
    pub category: Category,
    /// Last measured growth efficiency.
    pub growth: Option<f64>,
    /// Current limit, fraction of the worker (1 = unlimited).
    pub limit: f64,
    /// Progress memory.
    pub tracker: ProgressTracker,
    /// Whether G was measured in the current round (only measured jobs change lists).
    pub fresh: bool,
}

/// The limit decided for one container.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LimitDecision {
    /// The job id.
    pub job_id: String,
    /// Its list after this round.
    pub category: Category,
    /// Its growth efficiency (this round's, or the last measured).
    pub growth_efficiency: Option<f64>,
    /// Its CPU limit as a fraction of the worker, in (0, 1].
    pub limit: f64,
}

/// The output of one FlowCon round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowConDecisions {
    /// One limit per running container, ordered by job id.
    pub limits: Vec<LimitDecision>,
    /// The threshold in force after this round (-1 = Alg. 1 deactivated by Alg. 3).
    pub alpha: f64,
    /// The interval in force after this round.
    pub itval: f64,
    /// When the driver should call [`FlowCon::on_round`] next (absent an event).
    pub next_round_at: f64,
    /// Whether Alg. 2 saw containers appear or finish this round.
    pub event: bool,
    /// Whether every container was Completing (limits all 1, itval doubled).
    pub all_completing: bool,
}

/// One worker's FlowCon executor: Alg. 1, 2 and 3 as a state machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowCon {
    config: FlowConConfig,
    alpha: f64,
    last_positive_alpha: f64,
    itval: f64,
    jobs: BTreeMap<String, JobState>,
}

impl FlowCon {
    /// A fresh executor with no containers.
    pub fn new(config: FlowConConfig) -> Result<Self> {
        config.validate()?;
        Ok(FlowCon {
            config,
            alpha: config.alpha,
            last_positive_alpha: config.alpha,
            itval: config.itval,
            jobs: BTreeMap::new(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &FlowConConfig {
        &self.config
    }

    /// The current threshold α (-1 when Alg. 3 deactivated Alg. 1).
    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    /// The current interval.
    pub fn itval(&self) -> f64 {
        self.itval
    }

    /// The per-job states, by job id.
    pub fn jobs(&self) -> &BTreeMap<String, JobState> {
        &self.jobs
    }

    /// What the agent reports to the manager (for Alg. 4), ordered by job id.
    pub fn snapshots(&self) -> Vec<JobSnapshot> {
        self.jobs
            .iter()
            .map(|(id, j)| JobSnapshot {
                job_id: id.clone().into(),
                category: j.category,
                growth_efficiency: j.growth,
                cpu_limit: Some(j.limit),
            })
            .collect()
    }

    /// The lower bound `1/(β·n)` for `n` containers (ICPP'19 Alg. 1 line 22,
    /// flowcon-icpp2019.txt:404-413).
    pub fn lower_bound(&self, n: usize) -> f64 {
        1.0 / (self.config.beta * n.max(1) as f64)
    }

    /// One round at time `now` over the containers currently on the worker.
    ///
    /// Call it when `now >= next_round_at` of the previous decisions, and also at once whenever
    /// a container appears or finishes (Alg. 2 detects that from `observations` and resets
    /// `itval`). Deterministic: same state and inputs, same decisions.
    pub fn on_round(&mut self, now: f64, observations: &[Observation]) -> FlowConDecisions {
        let event = self.listen(observations);
        self.measure(observations);
        if self.config.adaptive {
            self.adapt_threshold();
        }
        let all_completing = self.allocate();
        FlowConDecisions {
            limits: self
                .jobs
                .iter()
                .map(|(id, j)| LimitDecision {
                    job_id: id.clone(),
                    category: j.category,
                    growth_efficiency: j.growth,
                    limit: j.limit,
                })
                .collect(),
            alpha: self.alpha,
            itval: self.itval,
            next_round_at: now + self.itval,
            event,
            all_completing,
        }
    }

    /// Alg. 2 (flowcon-tcc2022-extended.txt:213-232): new containers join NL with limit 1,
    /// finished ones leave every list and release their resources; either resets itval.
    fn listen(&mut self, observations: &[Observation]) -> bool {
        let mut changed = false;
        // Lines 10-15: containers that are no longer on the worker.
        let before = self.jobs.len();
        let observed: std::collections::BTreeSet<&str> =
            observations.iter().map(|o| o.job_id.as_str()).collect();
        self.jobs.retain(|id, _| observed.contains(id.as_str()));
        changed |= self.jobs.len() != before;
        // Lines 5-7: containers in no list join NL.
        for o in observations {
            if !self.jobs.contains_key(&o.job_id) {
                self.jobs.insert(
                    o.job_id.clone(),
                    JobState {
                        category: Category::New,
                        growth: None,
                        limit: 1.0,
                        tracker: ProgressTracker::new(o.direction, o.initial_value),
                        fresh: false,
                    },
                );
                changed = true;
            }
        }
        if changed {
            // Lines 8 and 16: break the exponential back-off.
            self.itval = self.config.itval;
        }
        changed
    }

    /// Alg. 1 line 3: G for each container from its samples (Eq. 1-2) and its usage.
    fn measure(&mut self, observations: &[Observation]) {
        for job in self.jobs.values_mut() {
            job.fresh = false;
        }
        for o in observations {
            let Some(job) = self.jobs.get_mut(&o.job_id) else {
                continue;
            };
            if job.tracker.initial.is_none() {
                job.tracker.initial = o.initial_value;
            }
            let Some(sample) = o.sample else { continue };
            if let Some((gain, dt)) = job.tracker.advance(sample) {
                // G undefined (no use of the resource): keep the category (design.md).
                if let Some(g) = growth_efficiency(gain / dt, o.usage.of(self.config.resource)) {
                    job.growth = Some(g);
                    job.fresh = true;
                }
            }
        }
    }

    /// Alg. 3 (flowcon-tcc2022-extended.txt:250-270), computed from G (design.md).
    fn adapt_threshold(&mut self) {
        let n = self.jobs.len();
        if n == 0 {
            return;
        }
        let count = |c: Category| self.jobs.values().filter(|j| j.category == c).count();
        // Lines 2-4: everything completing deactivates Alg. 1.
        if count(Category::Completing) == n {
            self.alpha = -1.0;
            return;
        }
        let computed = if n == 1 {
            // Lines 5-7: half the single container's own rate.
            self.jobs
                .values()
                .next()
                .and_then(|j| j.growth)
                .map(|g| g / 2.0)
        } else {
            // Lines 8-13: mean of the NL and WL averages (an empty list contributes 0).
            let avg = |c: Category| {
                let gs: Vec<f64> = self
                    .jobs
                    .values()
                    .filter(|j| j.category == c)
                    .filter_map(|j| j.growth)
                    .collect();
                (!gs.is_empty()).then(|| gs.iter().sum::<f64>() / gs.len() as f64)
            };
            match (avg(Category::New), avg(Category::Watching)) {
                (None, None) => None,
                (nl, wl) => Some((nl.unwrap_or(0.0) + wl.unwrap_or(0.0)) / 2.0),
            }
        };
        match computed {
            Some(a) => {
                self.alpha = a;
                if a > 0.0 {
                    self.last_positive_alpha = a;
                }
            }
            // Nothing measured in NL/WL yet (a newcomer): return to the last positive threshold
            // so that Alg. 1 runs again.
            None if self.alpha < 0.0 => self.alpha = self.last_positive_alpha,
            None => {}
        }
    }

    /// Alg. 1 (flowcon-tcc2022-extended.txt:116-146; lower bound from flowcon-icpp2019.txt:413).
    /// Returns whether every container is Completing.
    fn allocate(&mut self) -> bool {
        let alpha = self.alpha;
        // Lines 2-13: categorize (skipped while α = -1, line 2).
        if alpha >= 0.0 {
            for job in self.jobs.values_mut().filter(|j| j.fresh) {
                let g = job.growth.expect("fresh jobs have G");
                job.category = match (g < alpha, job.category) {
                    // Lines 4-6.
                    (true, Category::New) => Category::Watching,
                    // Lines 7-9.
                    (true, Category::Watching) => Category::Completing,
                    (true, Category::Completing) => Category::Completing,
                    // Lines 10-13.
                    (false, _) => Category::New,
                };
            }
        }
        let n = self.jobs.len();
        if n == 0 {
            return false;
        }
        // Lines 14-17: all completing -> free competition and exponential back-off.
        if self
            .jobs
            .values()
            .all(|j| j.category == Category::Completing)
        {
            for job in self.jobs.values_mut() {
                job.limit = 1.0;
            }
            self.itval *= 2.0;
            return true;
        }
        // Lines 18-26.
        let floor = self.lower_bound(n);
        let max_measured = self
            .jobs
            .values()
            .filter_map(|j| j.growth)
            .fold(0.0_f64, f64::max);
        let presumed = max_measured.max(self.last_positive_alpha.max(alpha));
        let effective = |j: &JobState| match (j.growth, j.category) {
            (Some(g), _) => g,
            (None, Category::New) => presumed,
            (None, _) => 0.0,
        };
        let sum: f64 = self.jobs.values().map(effective).sum();
        let share = |g: f64| {
            if sum > 0.0 { g / sum } else { 1.0 / n as f64 }
        };
        let updates: Vec<f64> = self
            .jobs
            .values()
            .map(|j| {
                let raw = match (j.category, j.growth) {
                    // Lines 20-22: share of growth, at least the lower bound.
                    (Category::Completing, _) => share(effective(j)),
                    // Lines 23-24: unchanged.
                    (Category::Watching, _) => j.limit,
                    // A newcomer with no G yet: limit 1 (the papers' example).
                    (Category::New, None) => 1.0,
                    // Lines 25-26.
                    (Category::New, Some(g)) => share(g),
                };
                raw.clamp(floor, 1.0)
            })
            .collect();
        for (job, limit) in self.jobs.values_mut().zip(updates) {
            job.limit = limit;
        }
        false
    }
}

/// FlowCon Alg. 4 (flowcon-tcc2022-extended.txt:280-305, text :309-324): growth-efficiency
/// placement on the manager, from the workers' last reports.
#[derive(Debug, Clone, Copy, Default)]
pub struct FlowConPlacer;

/// The per-worker quantities Alg. 4 computes.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct PlacementScore {
    /// |NL| including jobs placed but not yet reported (and not the incoming one).
    pub nl: usize,
    /// |WL|.
    pub wl: usize,
    /// |CL|.
    pub cl: usize,
    /// `S = (|NL|+1)·D_NL + |WL|·D_WL + |CL|·D_CL` (line 10).
    pub score: f64,
}

impl FlowConPlacer {
    /// Alg. 4 lines 7-10 for one worker.
    pub fn score(worker: &WorkerSnapshot) -> PlacementScore {
        let mut s = PlacementScore::default();
        let (mut d_nl, mut d_wl, mut d_cl) = (0.0, 0.0, 0.0);
        for j in &worker.jobs {
            let g = j.growth_efficiency.unwrap_or(0.0);
            match j.category {
                Category::New => {
                    s.nl += 1;
                    d_nl += g;
                }
                Category::Watching => {
                    s.wl += 1;
                    d_wl += g;
                }
                Category::Completing => {
                    s.cl += 1;
                    d_cl += g;
                }
            }
        }
        // Placed but not yet reported: New with no G (the paper's temporary NL + 1, :422).
        s.nl += worker.running.saturating_sub(worker.jobs.len());
        s.score = (s.nl + 1) as f64 * d_nl + s.wl as f64 * d_wl + s.cl as f64 * d_cl;
        s
    }
}

impl Placer for FlowConPlacer {
    fn name(&self) -> &'static str {
        "flowcon"
    }

    fn index(&self) -> Option<Box<dyn PlacerIndex>> {
        Some(Box::new(FlowConIndex::default()))
    }

    fn place(&mut self, job: &JobRequest, workers: &[WorkerSnapshot]) -> Placement {
        let mut scores = Vec::with_capacity(workers.len());
        // (index, containers) of the best all-completing worker; (index, S) of the best other.
        let mut best_all_cl: Option<(usize, usize)> = None;
        let mut best_score: Option<(usize, f64)> = None;
        for (i, w) in workers.iter().enumerate() {
            if !(w.schedulable && w.fits(job)) {
                scores.push(f64::INFINITY);
                continue;
            }
            let s = Self::score(w);
            scores.push(s.score);
            if s.nl + s.wl == 0 {
                // Lines 3-5: every container completing (or none): fewest containers wins.
                if best_all_cl.is_none_or(|(b, c)| {
                    s.cl < c || (s.cl == c && power(&workers[i]) > power(&workers[b]))
                }) {
                    best_all_cl = Some((i, s.cl));
                }
            } else if best_score.is_none_or(|(b, v)| lower(s.score, v, &workers[i], &workers[b])) {
                // Lines 11-13: minimum score.
                best_score = Some((i, s.score));
            }
        }
        match best_all_cl.map(|(i, _)| i).or(best_score.map(|(i, _)| i)) {
            Some(index) => Placement::Worker {
                index,
                scores: Scores::Every(scores),
            },
            None => Placement::Unschedulable {
                reason: crate::cluster::unschedulable_reason(job, workers),
            },
        }
    }
}

/// A worker's power, what ties go to: cores × calibration.
fn power(w: &WorkerSnapshot) -> f64 {
    w.cpu_capacity * w.calibration
}

/// Whether score `s` of worker `w` beats the best so far, `v` of worker `b`, in Alg. 4's scan
/// (lines 11-13): lower by more than 10⁻¹², or within 10⁻¹² on a more powerful worker. Not a
/// total order (ties chain), so the result depends on the order of the scan: worker order.
fn lower(s: f64, v: f64, w: &WorkerSnapshot, b: &WorkerSnapshot) -> bool {
    s < v - 1e-12 || ((s - v).abs() <= 1e-12 && power(w) > power(b))
}

/// [`FlowConPlacer`]'s [`PlacerIndex`]: the schedulable workers ordered by Alg. 4's score, and
/// the all-completing ones by containers then power, so that a placement reads the first that
/// fit instead of scoring every worker (a third of a 10,000-worker FlowCon simulation, with
/// the nearest scores its events list another fifth; `docs/performance.md`).
///
/// The scan's ties within 10⁻¹² chain, so its choice among the other workers is not the
/// minimum of any order. It is found exactly in the run of scores that starts at the least
/// eligible one and goes up while the gaps between neighbours are within the slack of a tie:
/// every score in the run beats every score past the gap that ends it by more than a tie, so
/// whatever the scan held before it met the run, the run's first worker replaces it, and no
/// worker past the gap replaces a worker of the run. That run, scanned in worker order, gives
/// the scan's answer. It is usually a few workers wide, but all the workers whose jobs have
/// not reported a growth efficiency yet score 0 alike, and a burst of placements makes it as
/// wide as the burst (still exact; read in its length).
#[derive(Debug, Default, Clone)]
pub struct FlowConIndex {
    /// By place: the worker's score and power, `None` when it is not schedulable.
    entries: Vec<Option<(PlacementScore, f64)>>,
    /// Every schedulable worker, by score then place.
    by_score: BTreeSet<Ranked>,
    /// The all-completing schedulable workers (lines 3-5), by containers, then power
    /// (highest first), then place: the scan's order of preference among them.
    all_completing: BTreeSet<(usize, Ranked)>,
    /// Schedulable workers whose score or power is not finite: the scan's comparisons with
    /// NaN are no order an index could keep, so the index does not answer while there are any.
    non_finite: usize,
}

impl FlowConIndex {
    fn entry(&self, place: usize) -> (PlacementScore, f64) {
        self.entries[place].expect("only schedulable workers are in the index's orders")
    }

    fn remove(&mut self, place: usize) {
        let Some(Some((s, power))) = self.entries.get_mut(place).map(Option::take) else {
            return;
        };
        self.by_score.remove(&Ranked(s.score, place));
        if s.nl + s.wl == 0 {
            self.all_completing
                .remove(&(s.cl, Ranked(0.0 - power, place)));
        }
        if !(s.score.is_finite() && power.is_finite()) {
            self.non_finite -= 1;
        }
    }

    /// The scan's choice among the eligible workers that are not all-completing (module doc
    /// of [`FlowConIndex`]).
    fn least_score(&self, job: &JobRequest, workers: &[WorkerSnapshot]) -> Option<usize> {
        let mut run = Vec::new();
        let mut last: Option<f64> = None;
        for &Ranked(score, place) in &self.by_score {
            let (s, _) = self.entry(place);
            if s.nl + s.wl == 0 || !workers[place].fits(job) {
                continue;
            }
            if let Some(last) = last {
                // A tie is 10⁻¹²; `v - 1e-12` in `lower` rounds by under an ulp, and only
                // where an ulp is under 2·10⁻¹² (wider, it rounds back to `v`): a worker that
                // does not replace the best is never 2·10⁻¹² or more below it.
                if score - last > 2e-12 {
                    break;
                }
            }
            last = Some(score);
            run.push(place);
        }
        run.sort_unstable();
        let mut best: Option<(usize, f64)> = None;
        for i in run {
            let s = self.entry(i).0.score;
            if best.is_none_or(|(b, v)| lower(s, v, &workers[i], &workers[b])) {
                best = Some((i, s));
            }
        }
        best.map(|(i, _)| i)
    }

    /// Up to `rivals` eligible places other than `chosen` whose scores are nearest its score
    /// `c`, by distance then place: the nearest distance on either side of `c` in the score
    /// order, then every place at that distance, in place order, then the next distance. The
    /// places with one score are a range of the order, by place, so a distance many workers
    /// share (a cluster of idle workers scores alike) costs the few places taken from it.
    fn nearest(
        &self,
        chosen: usize,
        job: &JobRequest,
        workers: &[WorkerSnapshot],
        rivals: usize,
    ) -> Vec<usize> {
        use std::ops::Bound::{Excluded, Included, Unbounded};
        let c = self.entry(chosen).0.score;
        let fits = |r: &&Ranked| workers[r.1].fits(job);
        let distance = |r: &Ranked| (r.0 - c).abs();
        // What is left to walk: below `low`, above `high` (both start at the choice).
        let (mut low, mut high) = (Ranked(c, chosen), Ranked(c, chosen));
        let below = |low: Ranked| self.by_score.range(..low).rev().find(fits).copied();
        let above = |high: Ranked| {
            (self.by_score.range((Excluded(high), Unbounded)))
                .find(fits)
                .copied()
        };
        let mut shown = Vec::with_capacity(rivals);
        let mut tied = Vec::new();
        while shown.len() < rivals {
            let wanted = rivals - shown.len();
            let (mut b, mut a) = (below(low), above(high));
            let d = match (b, a) {
                (None, None) => break,
                (Some(b), None) => distance(&b),
                (None, Some(a)) => distance(&a),
                (Some(b), Some(a)) => distance(&b).min(distance(&a)),
            };
            let at_d = |r: &Ranked| distance(r).total_cmp(&d).is_eq();
            // Each score at distance `d` (one, unless rounding makes two alike), side by side.
            while let Some(Ranked(v, _)) = b.filter(at_d) {
                let from = Ranked(v, 0);
                tied.extend(
                    self.by_score
                        .range(from..low)
                        .filter(fits)
                        .take(wanted)
                        .map(|r| r.1),
                );
                low = from;
                b = below(low);
            }
            while let Some(Ranked(v, _)) = a.filter(at_d) {
                let to = Ranked(v, usize::MAX);
                let range = self.by_score.range((Excluded(high), Included(to)));
                tied.extend(range.filter(fits).take(wanted).map(|r| r.1));
                high = to;
                a = above(high);
            }
            tied.sort_unstable();
            shown.extend(tied.drain(..).take(wanted));
        }
        shown
    }
}

impl PlacerIndex for FlowConIndex {
    fn set(&mut self, place: usize, worker: &WorkerSnapshot) {
        self.remove(place);
        if self.entries.len() <= place {
            self.entries.resize(place + 1, None);
        }
        if !worker.schedulable {
            return;
        }
        let (s, power) = (FlowConPlacer::score(worker), power(worker));
        self.by_score.insert(Ranked(s.score, place));
        if s.nl + s.wl == 0 {
            // `0.0 - power`, not `-power`: a power of zero must not sort as -0.0.
            self.all_completing
                .insert((s.cl, Ranked(0.0 - power, place)));
        }
        if !(s.score.is_finite() && power.is_finite()) {
            self.non_finite += 1;
        }
        self.entries[place] = Some((s, power));
    }

    fn truncate(&mut self, len: usize) {
        for place in len..self.entries.len() {
            self.remove(place);
        }
        self.entries.truncate(len);
    }

    fn place(
        &self,
        job: &JobRequest,
        workers: &[WorkerSnapshot],
        rivals: usize,
    ) -> Option<Vec<usize>> {
        if self.non_finite > 0 {
            return None;
        }
        let chosen = (self.all_completing.iter())
            .map(|(_, r)| r.1)
            .find(|&i| workers[i].fits(job))
            .or_else(|| self.least_score(job, workers))?;
        let mut shown = vec![chosen];
        shown.extend(self.nearest(chosen, job, workers, rivals));
        Some(shown)
    }

    fn score(&self, place: usize) -> f64 {
        self.entry(place).0.score
    }

    fn agrees_with(&self, workers: &[WorkerSnapshot]) -> bool {
        let mut fresh = FlowConIndex::default();
        for (i, w) in workers.iter().enumerate() {
            fresh.set(i, w);
        }
        // Compared as text: a NaN score (which the index holds, and stands aside for) is
        // unequal to itself as a number.
        format!("{self:?}") == format!("{fresh:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::test_support::worker;
    use proptest::prelude::*;

    fn obs(id: &str, t: f64, value: f64, cpu: f64) -> Observation {
        Observation {
            job_id: id.to_string(),
            sample: Some(Sample { time: t, value }),
            initial_value: None,
            direction: Direction::Minimize,
            usage: Usage::cpu(cpu),
        }
    }

    fn limit(d: &FlowConDecisions, id: &str) -> f64 {
        d.limits.iter().find(|l| l.job_id == id).unwrap().limit
    }

    fn category(d: &FlowConDecisions, id: &str) -> Category {
        d.limits.iter().find(|l| l.job_id == id).unwrap().category
    }

    fn flowcon(alpha: f64) -> FlowCon {
        FlowCon::new(FlowConConfig {
            alpha,
            ..FlowConConfig::default()
        })
        .unwrap()
    }

    /// ICPP'19 §5.3 (flowcon-icpp2019.txt:755-760): at 40 s, MNIST (PyTorch) joins a worker
    /// where VAE is completing: VAE's limit falls to 0.25, MNIST's is 1.
    #[test]
    fn completing_vae_held_to_quarter_while_new_mnist_gets_one() {
        let mut f = flowcon(0.05);
        // VAE alone; loss 100 -> 99 -> 98.5: G = 0.01/20/1 = 0.0005, then 0.00025 (< α = 0.05).
        let d = f.on_round(0.0, &[obs("vae", 0.0, 100.0, 1.0)]);
        assert_eq!(limit(&d, "vae"), 1.0);
        assert!(d.event);
        let d = f.on_round(20.0, &[obs("vae", 20.0, 99.0, 1.0)]);
        assert_eq!(category(&d, "vae"), Category::Watching);
        // MNIST arrives at 40 s (Alg. 2 event), no sample yet.
        let mut mnist = obs("mnist", 40.0, 2.3, 0.0);
        mnist.sample = None;
        let d = f.on_round(40.0, &[obs("vae", 40.0, 98.5, 1.0), mnist]);
        assert!(d.event);
        assert_eq!(category(&d, "vae"), Category::Completing);
        assert_eq!(category(&d, "mnist"), Category::New);
        assert_eq!(limit(&d, "vae"), 0.25, "1/(β·n) with β = 2, n = 2");
        assert_eq!(limit(&d, "mnist"), 1.0);
        assert_eq!(d.itval, 20.0);
        assert_eq!(d.next_round_at, 60.0);
    }

    #[test]
    fn lists_follow_alg1_transitions() {
        let mut f = flowcon(0.01);
        f.on_round(0.0, &[obs("a", 0.0, 1.0, 1.0)]);
        // 1.0 -> 0.5 in 10 s on 1 core: G = 0.05 >= 0.01 -> New.
        let d = f.on_round(10.0, &[obs("a", 10.0, 0.5, 1.0)]);
        assert_eq!(category(&d, "a"), Category::New);
        // 0.5 -> 0.45 on 1 core: G = 0.005 < 0.01 -> Watching.
        let d = f.on_round(20.0, &[obs("a", 20.0, 0.45, 1.0)]);
        assert_eq!(category(&d, "a"), Category::Watching);
        // Same gain on 0.25 cores: G = 0.02 >= 0.01 -> back to New (lines 10-13).
        let d = f.on_round(30.0, &[obs("a", 30.0, 0.40, 0.25)]);
        assert_eq!(category(&d, "a"), Category::New);
        let d = f.on_round(40.0, &[obs("a", 40.0, 0.39, 1.0)]);
        assert_eq!(category(&d, "a"), Category::Watching);
        let d = f.on_round(50.0, &[obs("a", 50.0, 0.38, 1.0)]);
        assert!(d.all_completing);
        assert_eq!(category(&d, "a"), Category::Completing);
    }

    #[test]
    fn limits_are_growth_shares_with_lower_bound_and_watching_unchanged() {
        let mut f = flowcon(0.01);
        let start = [
            obs("a", 0.0, 1.0, 1.0),
            obs("b", 0.0, 1.0, 1.0),
            obs("c", 0.0, 1.0, 1.0),
        ];
        f.on_round(0.0, &start);
        // Gains over 10 s on 0.5 cores each: a 0.3, b 0.1, c 0.02.
        // G = gain/10/0.5: a 0.06, b 0.02, c 0.004 (< α -> Watching).
        let d = f.on_round(
            10.0,
            &[
                obs("a", 10.0, 0.7, 0.5),
                obs("b", 10.0, 0.9, 0.5),
                obs("c", 10.0, 0.98, 0.5),
            ],
        );
        assert_eq!(category(&d, "c"), Category::Watching);
        // ΣG = 0.084; a: 0.06/0.084 = 0.714..., b: 0.238..., c unchanged (1.0).
        assert!((limit(&d, "a") - 0.06 / 0.084).abs() < 1e-9);
        assert!((limit(&d, "b") - 0.02 / 0.084).abs() < 1e-9);
        assert_eq!(limit(&d, "c"), 1.0);
        // Next: c keeps falling slowly -> Completing; its share is tiny -> 1/(2·3).
        let d = f.on_round(
            20.0,
            &[
                obs("a", 20.0, 0.4, 0.5),
                obs("b", 20.0, 0.8, 0.5),
                obs("c", 20.0, 0.979, 0.5),
            ],
        );
        assert_eq!(category(&d, "c"), Category::Completing);
        assert!((limit(&d, "c") - 1.0 / 6.0).abs() < 1e-12);
    }

    #[test]
    fn all_completing_frees_limits_and_doubles_itval_until_an_event() {
        let mut f = flowcon(0.5);
        f.on_round(0.0, &[obs("a", 0.0, 1.0, 1.0)]);
        f.on_round(20.0, &[obs("a", 20.0, 0.99, 1.0)]);
        let d = f.on_round(40.0, &[obs("a", 40.0, 0.98, 1.0)]);
        assert!(d.all_completing);
        assert_eq!(limit(&d, "a"), 1.0);
        assert_eq!(d.itval, 40.0);
        let d = f.on_round(80.0, &[obs("a", 80.0, 0.97, 1.0)]);
        assert_eq!(d.itval, 80.0);
        assert_eq!(d.next_round_at, 160.0);
        // A container finishing is an event too: itval resets (Alg. 2 lines 10-17).
        let d = f.on_round(90.0, &[]);
        assert!(d.event);
        assert_eq!(d.itval, 20.0);
        assert!(d.limits.is_empty());
    }

    #[test]
    fn no_cpu_use_keeps_category() {
        let mut f = flowcon(0.01);
        f.on_round(0.0, &[obs("a", 0.0, 1.0, 1.0)]);
        f.on_round(10.0, &[obs("a", 10.0, 0.99, 1.0)]); // G = 0.001 -> Watching
        let d = f.on_round(20.0, &[obs("a", 20.0, 0.98, 0.0)]); // no use: G undefined
        assert_eq!(category(&d, "a"), Category::Watching);
        assert!((d.limits[0].growth_efficiency.unwrap() - 0.001).abs() < 1e-12);
    }

    #[test]
    fn adaptive_threshold_is_mean_of_nl_and_wl_averages() {
        let mut f = FlowCon::new(FlowConConfig {
            alpha: 0.01,
            adaptive: true,
            ..FlowConConfig::default()
        })
        .unwrap();
        f.on_round(0.0, &[obs("a", 0.0, 1.0, 1.0)]);
        // Single container: α = G/2 (lines 5-6). G = 0.4/10 = 0.04 -> α = 0.02.
        let d = f.on_round(10.0, &[obs("a", 10.0, 0.6, 1.0)]);
        assert!((d.alpha - 0.02).abs() < 1e-12);
        assert_eq!(category(&d, "a"), Category::New);
        // b arrives: no G yet, a's G from last round still counts: NL avg = 0.04, WL none.
        // α = (0.04 + 0) / 2 = 0.02.
        let d = f.on_round(15.0, &[obs("a", 15.0, 0.55, 1.0), obs("b", 15.0, 2.0, 1.0)]);
        // a's G over [10,15] = 0.05/5 = 0.01, measured before Alg. 3: NL avg = 0.01 -> α = 0.005.
        assert!((d.alpha - 0.005).abs() < 1e-12);
        assert_eq!(category(&d, "a"), Category::New);
    }

    #[test]
    fn adaptive_threshold_deactivates_when_all_completing_and_recovers_on_arrival() {
        let mut f = FlowCon::new(FlowConConfig {
            alpha: 0.05,
            adaptive: true,
            ..FlowConConfig::default()
        })
        .unwrap();
        // Force a into Completing by hand (white-box): the lists are plain data.
        f.on_round(0.0, &[obs("a", 0.0, 1.0, 1.0)]);
        f.jobs.get_mut("a").unwrap().category = Category::Completing;
        f.jobs.get_mut("a").unwrap().growth = Some(0.001);
        let d = f.on_round(20.0, &[obs("a", 20.0, 0.999, 1.0)]);
        assert_eq!(d.alpha, -1.0);
        assert!(d.all_completing);
        let mut b = obs("b", 30.0, 2.0, 0.0);
        b.sample = None;
        let d = f.on_round(30.0, &[obs("a", 30.0, 0.998, 1.0), b]);
        assert!(d.alpha > 0.0, "back to the last positive threshold");
        assert_eq!(limit(&d, "a"), 0.25);
        assert_eq!(limit(&d, "b"), 1.0);
    }

    #[test]
    fn invalid_config_is_rejected() {
        let e = FlowCon::new(FlowConConfig {
            beta: 0.5,
            ..FlowConConfig::default()
        })
        .unwrap_err();
        assert!(e.to_string().contains("beta"));
    }

    fn snap(id: &str, c: Category, g: f64) -> JobSnapshot {
        JobSnapshot {
            job_id: id.into(),
            category: c,
            growth_efficiency: Some(g),
            cpu_limit: None,
        }
    }

    #[test]
    fn alg4_scores_by_weighted_growth_with_incoming_job_in_nl() {
        let mut w0 = worker("w0", 4.0);
        w0.jobs = vec![
            snap("a", Category::New, 0.1),
            snap("b", Category::Watching, 0.05),
        ];
        w0.running = 2;
        let mut w1 = worker("w1", 4.0);
        w1.jobs = vec![
            snap("c", Category::New, 0.04),
            snap("d", Category::New, 0.02),
        ];
        w1.running = 2;
        // w0: (1+1)·0.1 + 1·0.05 = 0.25. w1: (2+1)·0.06 = 0.18 -> w1.
        let p = FlowConPlacer.place(
            &JobRequest {
                cpus: 1.0,
                memory_bytes: 0,
            },
            &[w0, w1],
        );
        match p {
            Placement::Worker { index, scores } => {
                assert_eq!(index, 1);
                assert!((scores[0] - 0.25).abs() < 1e-12);
                assert!((scores[1] - 0.18).abs() < 1e-12);
            }
            p => panic!("{p:?}"),
        }
    }

    #[test]
    fn alg4_breaks_ties_by_capacity_then_index() {
        let small = worker("small", 2.0);
        let big = worker("big", 16.0);
        let mut fast = worker("fast", 8.0);
        fast.calibration = 3.0;
        let job = JobRequest {
            cpus: 1.0,
            memory_bytes: 0,
        };
        let p = FlowConPlacer.place(&job, &[small.clone(), big.clone(), fast]);
        assert_eq!(p.index(), Some(2), "8 cores at speed 3 beat 16 at speed 1");
        assert_eq!(
            FlowConPlacer.place(&job, &[small.clone(), small]).index(),
            Some(0)
        );
    }

    #[test]
    fn alg4_prefers_all_completing_worker_with_fewest_containers() {
        let mut w0 = worker("w0", 4.0);
        w0.jobs = vec![snap("a", Category::New, 0.0001)];
        w0.running = 1;
        let mut w1 = worker("w1", 4.0);
        w1.jobs = vec![
            snap("b", Category::Completing, 0.001),
            snap("c", Category::Completing, 0.001),
        ];
        w1.running = 2;
        let mut w2 = worker("w2", 4.0);
        w2.jobs = vec![snap("d", Category::Completing, 0.001)];
        w2.running = 1;
        let job = JobRequest {
            cpus: 1.0,
            memory_bytes: 0,
        };
        assert_eq!(
            FlowConPlacer
                .place(&job, &[w0.clone(), w1.clone(), w2.clone()])
                .index(),
            Some(2)
        );
        // A job placed on w2 but not yet in its report counts as New: w2 is no longer all-CL.
        w2.running = 2;
        assert_eq!(FlowConPlacer.place(&job, &[w0, w1, w2]).index(), Some(1));
    }

    /// A worker drawn to make Alg. 4's ties: growth efficiencies from a few values 10⁻¹³
    /// apart (ties within 10⁻¹² that chain), or an ulp apart at 10⁴ (where an ulp is wider
    /// than 10⁻¹²); powers from three, one of them zero (no cores: only a job that asks for
    /// none fits); room for a job or none.
    fn arb_worker() -> impl Strategy<Value = WorkerSnapshot> {
        let job = (0usize..3, 0u32..5, 0u32..3).prop_map(|(c, g, nudge)| {
            let category = [Category::New, Category::Watching, Category::Completing][c];
            let g = match g {
                4 => 1e4 + nudge as f64 * 1e4 * f64::EPSILON,
                g => [0.0, 0.01, 0.02, 0.03][g as usize] + nudge as f64 * 3e-13,
            };
            snap("j", category, g)
        });
        (
            prop::collection::vec(job, 0..4),
            0usize..2,
            prop::bool::weighted(0.9),
            prop::bool::weighted(0.9),
            0usize..3,
        )
            .prop_map(|(jobs, unreported, schedulable, room, power)| {
                let mut w = worker("w", [4.0, 4.0, 0.0][power]);
                w.running = jobs.len() + unreported;
                w.jobs = jobs;
                w.schedulable = schedulable;
                w.cpu_requested = if room { 0.0 } else { w.cpu_capacity };
                w.calibration = [1.0, 2.0, 1.0][power];
                w
            })
    }

    /// What the index must show for the scan's `placement`: the choice, then the `rivals`
    /// eligible places nearest its score, by distance then place.
    fn scanned(placement: &Placement, rivals: usize) -> Option<Vec<usize>> {
        let Placement::Worker { index, scores } = placement else {
            return None;
        };
        let c = scores[*index];
        let mut others: Vec<Ranked> = (0..scores.len())
            .filter(|&i| i != *index && scores[i].is_finite())
            .map(|i| Ranked((scores[i] - c).abs(), i))
            .collect();
        others.sort();
        let mut shown = vec![*index];
        shown.extend(others.iter().take(rivals).map(|r| r.1));
        Some(shown)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// The index answers as Alg. 4's scan of every worker does (choice and the nearest
        /// scores an event shows), after any sequence of changed snapshots.
        #[test]
        fn index_places_as_the_scan_of_every_worker(
            first in prop::collection::vec(arb_worker(), 1..24),
            changes in prop::collection::vec((0usize..24, arb_worker()), 0..24),
            rivals in 1usize..6,
            cpus in prop_oneof![Just(0.0), Just(1.0)],
            forgotten in 0usize..24,
        ) {
            let mut workers = first;
            let mut index = FlowConIndex::default();
            for (i, w) in workers.iter().enumerate() {
                index.set(i, w);
            }
            let job = JobRequest { cpus, memory_bytes: 0 };
            let check = |index: &FlowConIndex, workers: &[WorkerSnapshot]| {
                prop_assert!(index.agrees_with(workers));
                let scan = FlowConPlacer.place(&job, workers);
                let expected = scanned(&scan, rivals);
                prop_assert_eq!(index.place(&job, workers, rivals), expected);
                if let Placement::Worker { index: chosen, scores } = scan {
                    prop_assert_eq!(index.score(chosen), scores[chosen]);
                }
                Ok(())
            };
            check(&index, &workers)?;
            for (i, w) in changes {
                let i = i % workers.len();
                workers[i] = w;
                index.set(i, &workers[i]);
                check(&index, &workers)?;
            }
            // A worker leaves: the places after it move down, and are set again.
            if workers.len() > 1 {
                workers.remove(forgotten % workers.len());
                index.truncate(workers.len());
                for (i, w) in workers.iter().enumerate() {
                    index.set(i, w);
                }
                check(&index, &workers)?;
            }
        }
    }

    #[test]
    fn index_stands_aside_while_a_score_is_not_finite() {
        let mut w0 = worker("w0", 4.0);
        w0.jobs = vec![snap("a", Category::New, f64::NAN)];
        w0.running = 1;
        let w1 = worker("w1", 4.0);
        let mut index = FlowConIndex::default();
        index.set(0, &w0);
        index.set(1, &w1);
        let job = JobRequest {
            cpus: 1.0,
            memory_bytes: 0,
        };
        assert_eq!(index.place(&job, &[w0.clone(), w1.clone()], 3), None);
        // Once the worker's score is finite again, the index answers.
        w0.jobs[0].growth_efficiency = Some(0.5);
        index.set(0, &w0);
        assert_eq!(index.place(&job, &[w0, w1], 3), Some(vec![1, 0]));
    }
}
