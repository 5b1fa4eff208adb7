//! SpeCon: speculative migration of converged jobs, and cluster rebalancing.
//!
//! One cluster-wide state machine, [`SpeCon`], run by the manager (or the simulator). Its step,
//! [`SpeCon::on_round`], runs, at each categorization interval:
//! 1. Alg. 1, the container monitor (specon-speculative-migration.txt:161-195): each job's
//!    normalized gain over the interval moves it between Progressing / Watching / Converged
//!    ([`Category::New`] / [`Category::Watching`] / [`Category::Completing`], see
//!    [`Category::PROGRESSING`]) and produces migration requests for converged jobs.
//! 2. Alg. 2, speculative scheduling (:227-256) for each request: [`worker_score`] and
//!    [`select_host`].
//! 3. Alg. 3, rebalancing (:290-332): [`rebalance_plan`].
//!
//! It returns [`SpeConDecisions`]: migrations as data; the driver saves and restores.
//!
//! ## Decisions where the paper is ambiguous
//! - Gain (Eq. 1, :152) is normalized by the job's initial metric and direction-respecting
//!   ([`crate::growth::normalized_gain`]): "α is a percentage value" (:203), so α = 0.01 means 1%
//!   of the job's starting loss gained in one interval.
//! - Alg. 1 lines 10-12 repeat lines 7-9; the text (:210) says a Watching job that keeps slowing
//!   moves to Converged. We follow the text (design.md).
//! - With no previous gain (the job's first measured interval) the "smaller than the last gain"
//!   test passes: there is nothing it slowed down from.
//! - Line 15's condition `|PC| + |WC| > 1` is read as the text and the issue put it: a converged
//!   job requests migration when it shares its worker with at least one other job (moving it
//!   cannot help anyone on a worker it has to itself).
//! - Migrated jobs leave Alg. 1 (line 3) and so stay in their category; the `migrated` flag
//!   travels with the job, which is why this is one cluster-wide state machine.
//! - Alg. 2's candidates are the schedulable workers; scores compare with a 1e-9 tolerance;
//!   among several candidates the lowest `R(w, t)` wins, then the lowest index. Moves decided
//!   earlier in the same round update the category counts used by later ones.
//! - Alg. 3: `d = t - t_converged` for converged jobs not yet rebalanced; `bf = ⌊Σ|w| / |W|⌋`
//!   over schedulable workers. Lines 26-29 would move one job to every target; we move the
//!   next-smallest-`d` job to each target in turn. A move must shrink the imbalance: its source
//!   holds at least two more jobs than its target. A job is rebalanced at most once, and never in
//!   the round Alg. 2 moved it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::cluster::Category;
use crate::error::{Error, Result};
use crate::growth::{Direction, ProgressTracker, Sample};

/// The category weights of Alg. 2 (`w_pc > w_wc > w_cc`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Weights {
    /// Progressing weight.
    pub pc: f64,
    /// Watching weight.
    pub wc: f64,
    /// Converged weight.
    pub cc: f64,
}

impl Default for Weights {
    /// The paper's `w_pc = 2, w_wc = 1.5, w_cc = 1` (specon-speculative-migration.txt:356).
    fn default() -> Self {
        Weights {
            pc: 2.0,
            wc: 1.5,
            cc: 1.0,
        }
    }
}

/// SpeCon's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SpeConConfig {
    /// Categorization threshold α on the normalized gain per interval.
    pub alpha: f64,
    /// Categorization interval `t_m - t_{m-1}`, seconds.
    pub interval: f64,
    /// Alg. 2 weights.
    pub weights: Weights,
    /// Whether Alg. 3 runs after Alg. 2 each round.
    pub rebalance: bool,
}

impl Default for SpeConConfig {
    /// The paper's evaluation setting: α = 0.01, interval 30 s (:385).
    fn default() -> Self {
        SpeConConfig {
            alpha: 0.01,
            interval: 30.0,
            weights: Weights::default(),
            rebalance: true,
        }
    }
}

impl SpeConConfig {
    /// Checks the parameters.
    pub fn validate(&self) -> Result<()> {
        let check = |name, value: f64, ok: bool, expected| {
            if ok {
                Ok(())
            } else {
                Err(Error::InvalidParameter {
                    name,
                    value,
                    expected,
                })
            }
        };
        check(
            "alpha",
            self.alpha,
            self.alpha >= 0.0 && self.alpha.is_finite(),
            "a finite threshold >= 0",
        )?;
        check(
            "interval",
            self.interval,
            self.interval > 0.0 && self.interval.is_finite(),
            "a positive number of seconds",
        )?;
        let w = self.weights;
        check(
            "weights.pc",
            w.pc,
            w.pc > w.wc && w.wc > w.cc && w.cc >= 0.0,
            "weights with pc > wc > cc >= 0",
        )
    }
}

/// One running job as the manager sees it at a round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobObservation {
    /// The job id.
    pub job_id: String,
    /// Index of its current worker in the `workers` slice of the same call.
    pub worker: usize,
    /// Its latest progress sample.
    pub sample: Option<Sample>,
    /// Its initial metric value, if known (otherwise the first sample's).
    pub initial_value: Option<f64>,
    /// The metric's direction.
    pub direction: Direction,
}

/// One worker as Alg. 2 and 3 need it. It names no worker: Alg. 2 and 3 know a worker by its
/// index in the slice of loads they are given, and their callers keep the ids in that order
/// (a driver hands every worker's load at every request; cloning every worker's shared id
/// into it was 6% of SpeCon's samples at 10,000 workers, `docs/performance.md`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct WorkerLoad {
    /// `R(w, t)`: its current resource consumption (e.g. CPU fraction in use).
    pub resource_use: f64,
    /// False when lost or draining: never a target.
    pub schedulable: bool,
}

/// One job's SpeCon state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpeConJob {
    /// Its category.
    pub category: Category,
    /// Its worker (index), as last observed or decided.
    pub worker: usize,
    /// The gain of the previous interval.
    pub last_gain: Option<f64>,
    /// Set by Alg. 2 (moved or deliberately kept): it never runs Alg. 1 or 2 again.
    pub migrated: bool,
    /// Set by Alg. 3.
    pub rebalanced: bool,
    /// When it was last marked converged (`t_{c_j}` of Alg. 3).
    pub converged_at: Option<f64>,
    /// Progress memory.
    pub tracker: ProgressTracker,
}

/// Why a job moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MigrationReason {
    /// Alg. 2: a converged job moved off a busy worker.
    Speculative,
    /// Alg. 3: moved to even out the cluster.
    Rebalance,
}

/// A decided move: save the job on `from`, restore it on `to`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Migration {
    /// The job.
    pub job_id: String,
    /// Source worker index.
    pub from: usize,
    /// Target worker index.
    pub to: usize,
    /// Which algorithm decided it.
    pub reason: MigrationReason,
    /// The worker scores Alg. 2 used (empty for Alg. 3).
    pub scores: Vec<f64>,
}

/// The output of one SpeCon round.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SpeConDecisions {
    /// Every running job's category after Alg. 1, by job id.
    pub categories: Vec<(String, Category)>,
    /// Jobs that requested reallocation (Alg. 1 line 16), in job-id order.
    pub requests: Vec<String>,
    /// Requests Alg. 2 answered by keeping the job where it is.
    pub kept: Vec<String>,
    /// Moves, in the order decided.
    pub migrations: Vec<Migration>,
    /// The balance factor Alg. 3 computed (None when it did not run).
    pub balance_factor: Option<usize>,
}

/// SpeCon's cluster-wide state machine.
#[derive(Debug, Clone)]
pub struct SpeCon {
    config: SpeConConfig,
    jobs: BTreeMap<String, SpeConJob>,
    /// `[PC, WC, CC]` of each worker (Alg. 2 line 3), by index: the jobs in `jobs` there, by
    /// category, kept as jobs come, go, move and change category ([`Tally`]). Alg. 2 reads
    /// every worker's at every request, and counting them walked every job SpeCon holds.
    tally: Tally,
}

/// Two SpeCons are alike when they hold the same jobs in the same states: the tally follows
/// from the jobs (however long it grew).
impl PartialEq for SpeCon {
    fn eq(&self, other: &Self) -> bool {
        self.config == other.config && self.jobs == other.jobs
    }
}

/// Jobs per worker and category ([`SpeCon::tally`]).
#[derive(Debug, Clone, Default)]
struct Tally(Vec<[usize; 3]>);

impl Tally {
    /// Counts `job` where it is.
    fn add(&mut self, job: &SpeConJob) {
        if self.0.len() <= job.worker {
            self.0.resize(job.worker + 1, [0; 3]);
        }
        self.0[job.worker][category_slot(job.category)] += 1;
    }

    /// Moves `job` to worker `to`, and its count with it.
    fn relocate(&mut self, job: &mut SpeConJob, to: usize) {
        self.remove(job);
        job.worker = to;
        self.add(job);
    }

    /// Stops counting `job` where it is (it leaves, or is about to move or change).
    fn remove(&mut self, job: &SpeConJob) {
        let n = &mut self.0[job.worker][category_slot(job.category)];
        *n = n
            .checked_sub(1)
            .expect("SpeCon's tally counts every job it holds where it is");
    }

    /// `[PC, WC, CC]` of worker `i` (a worker past the last counted has no jobs).
    fn at(&self, i: usize) -> [usize; 3] {
        self.0.get(i).copied().unwrap_or([0; 3])
    }

    /// The counts of every job in `jobs`, afresh.
    fn of<'a>(jobs: impl IntoIterator<Item = &'a SpeConJob>) -> Self {
        let mut tally = Tally::default();
        for j in jobs {
            tally.add(j);
        }
        tally
    }

    /// The counts by worker, padded with workers without jobs to at least `workers`.
    #[cfg(any(test, debug_assertions))]
    fn counts(&self, workers: usize) -> Vec<[usize; 3]> {
        let mut counts = self.0.clone();
        counts.resize(workers.max(counts.len()), [0; 3]);
        counts
    }
}

fn category_slot(c: Category) -> usize {
    match c {
        Category::New => 0,
        Category::Watching => 1,
        Category::Completing => 2,
    }
}

/// Alg. 2 line 3: `S_w = |PC|·w_pc + |WC|·w_wc + |CC|·w_cc`.
pub fn worker_score(pc: usize, wc: usize, cc: usize, w: &Weights) -> f64 {
    pc as f64 * w.pc + wc as f64 * w.wc + cc as f64 * w.cc
}

/// Alg. 2 lines 4-21: the host for a job now on `current`, given every worker's score and
/// resource use; `None` entries are not eligible. Returns `current` when it is a candidate.
pub fn select_host(current: usize, scores: &[Option<f64>], resource_use: &[f64]) -> Option<usize> {
    select(
        current,
        scores.len(),
        |i| scores[i],
        |i| resource_use.get(i).copied().unwrap_or(0.0),
    )
}

/// [`select_host`] over `workers` workers whose scores and uses are read where asked, without
/// a list of candidates: Alg. 2 runs at every migration request over every worker.
fn select(
    current: usize,
    workers: usize,
    score: impl Fn(usize) -> Option<f64>,
    resource_use: impl Fn(usize) -> f64,
) -> Option<usize> {
    let min = (0..workers)
        .filter_map(&score)
        .fold(f64::INFINITY, f64::min);
    if !min.is_finite() {
        return None;
    }
    // Lines 4-7: the candidate set T.
    let candidate = |i: usize| score(i).is_some_and(|s| s <= min + 1e-9);
    // Lines 8-10: stay put when the current host is a candidate.
    if current < workers && candidate(current) {
        return Some(current);
    }
    // Lines 12-21: the only candidate, or the one with the lowest R(w, t), then the lowest
    // index (the first met, in index order, of those with the lowest).
    let mut best: Option<(f64, usize)> = None;
    for i in (0..workers).filter(|&i| candidate(i)) {
        let r = resource_use(i);
        if best.is_none_or(|(b, _)| r.total_cmp(&b).is_lt()) {
            best = Some((r, i));
        }
    }
    best.map(|(_, i)| i)
}

/// A job Alg. 3 may move: its id, its worker, its converged duration `d`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RebalanceCandidate {
    /// The job.
    pub job_id: String,
    /// Its worker index.
    pub worker: usize,
    /// `d = t - t_converged`.
    pub converged_for: f64,
}

/// Alg. 3 (specon-speculative-migration.txt:290-332): moves `(job, from, to)` that even out the
/// active-job counts. `counts[w]` is the number of active jobs on worker `w`; `schedulable[w]`
/// says whether it may receive. Returns the moves and the balance factor.
pub fn rebalance_plan(
    counts: &[usize],
    schedulable: &[bool],
    candidates: &[RebalanceCandidate],
) -> (Vec<(String, usize, usize)>, usize) {
    let mut counts = counts.to_vec();
    let eligible = schedulable.iter().filter(|&&s| s).count();
    // Lines 2-3, 9: bf = ⌊sum / |W|⌋.
    let sum: usize = counts.iter().sum();
    let bf = sum.checked_div(eligible).unwrap_or(0);
    let mut pool: Vec<&RebalanceCandidate> = candidates.iter().collect();
    // Line 13/25: smallest d first; ties by job id for determinism.
    pool.sort_by(|a, b| {
        a.converged_for
            .total_cmp(&b.converged_for)
            .then_with(|| a.job_id.cmp(&b.job_id))
    });
    let is_target = |w: usize| schedulable.get(w).copied().unwrap_or(false);
    // Lines 7-8: idle workers; lines 19-22: workers below bf - 1 when none is idle.
    let idle: Vec<usize> = (0..counts.len())
        .filter(|&w| is_target(w) && counts[w] == 0)
        .collect();
    let (targets, limit): (Vec<usize>, usize) = if !idle.is_empty() {
        (idle, bf)
    } else {
        let lim = bf.saturating_sub(1);
        (
            (0..counts.len())
                .filter(|&w| is_target(w) && counts[w] < lim)
                .collect(),
            lim,
        )
    };
    let mut in_targets = vec![false; counts.len()];
    for &w in &targets {
        in_targets[w] = true;
    }
    let mut moves = Vec::new();
    for &w in &targets {
        // Lines 12 / 27: room below the limit.
        if counts[w] >= limit {
            continue;
        }
        // Lines 13 / 23-25: the smallest d on a worker that is not a target and holds at least
        // two more jobs than this one (so the move shrinks the imbalance).
        let Some(pos) = pool.iter().position(|c| {
            !in_targets.get(c.worker).copied().unwrap_or(true)
                && counts.get(c.worker).is_some_and(|&n| n > counts[w] + 1)
        }) else {
            continue;
        };
        let c = pool.remove(pos);
        counts[c.worker] -= 1;
        counts[w] += 1;
        moves.push((c.job_id.clone(), c.worker, w));
    }
    (moves, bf)
}

impl SpeCon {
    /// A fresh state machine.
    pub fn new(config: SpeConConfig) -> Result<Self> {
        config.validate()?;
        Ok(SpeCon {
            config,
            jobs: BTreeMap::new(),
            tally: Tally::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &SpeConConfig {
        &self.config
    }

    /// Per-job state, by id.
    pub fn jobs(&self) -> &BTreeMap<String, SpeConJob> {
        &self.jobs
    }

    /// One round at time `now` (every `config.interval` seconds): Alg. 1 over `observations`
    /// (the running jobs; a job missing from them is finished), then Alg. 2 for each request,
    /// then Alg. 3 if enabled. `workers` are indexed by `JobObservation::worker`.
    pub fn on_round(
        &mut self,
        now: f64,
        observations: &[JobObservation],
        workers: &[WorkerLoad],
    ) -> SpeConDecisions {
        let requests = self.categorize(now, observations);
        let mut decisions = SpeConDecisions {
            requests: requests.clone(),
            ..SpeConDecisions::default()
        };
        let mut moved: Vec<String> = Vec::new();
        // Each move updates the tally, which the next request's counts are read from.
        for job_id in &requests {
            match self.schedule(job_id, workers) {
                Some(m) => {
                    moved.push(m.job_id.clone());
                    decisions.migrations.push(m);
                }
                None => decisions.kept.push(job_id.clone()),
            }
        }
        if self.config.rebalance {
            let (ms, bf) = self.rebalance(now, workers, &moved);
            decisions.migrations.extend(ms);
            decisions.balance_factor = Some(bf);
        }
        decisions.categories = self
            .jobs
            .iter()
            .map(|(id, j)| (id.clone(), j.category))
            .collect();
        decisions
    }

    /// Records what a worker reported of a running job: its worker (an index into the
    /// `workers` of the next [`SpeCon::schedule`] or [`SpeCon::rebalance`] call) and the
    /// category its Alg. 1 gave it, when it gave one. For drivers where Alg. 1 runs on the
    /// workers (the manager and the simulator through the cluster core): a newcomer starts
    /// Progressing and not migrated (line 2); `t_c` (Alg. 3) is the first report of Converged
    /// and is forgotten when the job stops being converged.
    pub fn observe(&mut self, now: f64, job_id: &str, worker: usize, category: Option<Category>) {
        // Looked up before inserting: an entry by an owned key would copy the id at every
        // observation, and most observe a job SpeCon already holds; one search when it does.
        let job = match self.jobs.get_mut(job_id) {
            Some(job) => {
                self.tally.remove(job);
                job
            }
            None => self.jobs.entry(job_id.to_string()).or_insert(SpeConJob {
                category: Category::PROGRESSING,
                worker,
                last_gain: None,
                migrated: false,
                rebalanced: false,
                converged_at: None,
                tracker: ProgressTracker::new(Direction::Minimize, None),
            }),
        };
        job.worker = worker;
        if let Some(c) = category {
            job.category = c;
            if c == Category::CONVERGED {
                job.converged_at.get_or_insert(now);
            } else {
                job.converged_at = None;
            }
        }
        self.tally.add(job);
    }

    /// Forgets job `job_id` (it stopped running).
    pub fn forget(&mut self, job_id: &str) {
        if let Some(job) = self.jobs.remove(job_id) {
            self.tally.remove(&job);
        }
    }

    /// Worker `place` left the cluster: the workers after it move down one place, and their
    /// jobs and counts with them (SpeCon knows a worker by its place in its caller's order).
    /// A job still marked on `place` is forgotten; a caller removes only workers without jobs.
    pub fn remove_worker(&mut self, place: usize) {
        self.jobs.retain(|_, job| job.worker != place);
        for job in self.jobs.values_mut() {
            if job.worker > place {
                job.worker -= 1;
            }
        }
        self.tally = Tally::of(self.jobs.values());
    }

    /// Forgets every job for which `keep` is false (they finished).
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        let tally = &mut self.tally;
        self.jobs.retain(|id, job| {
            let kept = keep(id);
            if !kept {
                tally.remove(job);
            }
            kept
        });
    }

    /// Alg. 1 over every observed job; returns the reallocation requests (line 16).
    pub fn categorize(&mut self, now: f64, observations: &[JobObservation]) -> Vec<String> {
        // Finished jobs leave; line 2: newcomers start Progressing, not migrated.
        let observed: std::collections::BTreeSet<&str> =
            observations.iter().map(|o| o.job_id.as_str()).collect();
        self.jobs.retain(|id, _| observed.contains(id.as_str()));
        for o in observations {
            let job = self
                .jobs
                .entry(o.job_id.clone())
                .or_insert_with(|| SpeConJob {
                    category: Category::PROGRESSING,
                    worker: o.worker,
                    last_gain: None,
                    migrated: false,
                    rebalanced: false,
                    converged_at: None,
                    tracker: ProgressTracker::new(o.direction, o.initial_value),
                });
            job.worker = o.worker;
            if job.tracker.initial.is_none() {
                job.tracker.initial = o.initial_value;
            }
        }
        let mut per_worker: BTreeMap<usize, usize> = BTreeMap::new();
        for j in self.jobs.values() {
            *per_worker.entry(j.worker).or_default() += 1;
        }
        let alpha = self.config.alpha;
        let mut requests = Vec::new();
        for o in observations {
            let job = self.jobs.get_mut(&o.job_id).expect("inserted above");
            // Line 3: migrated jobs are no longer categorized.
            if job.migrated {
                continue;
            }
            // Lines 4-5: the gain over the interval.
            let Some(sample) = o.sample else { continue };
            let Some((gain, _dt)) = job.tracker.advance(sample) else {
                continue;
            };
            let slowing = job.last_gain.is_none_or(|prev| gain < prev);
            if slowing && gain < alpha {
                // Lines 6-14 (lines 10-12 as the text says: Watching -> Converged).
                job.category = match job.category {
                    Category::New => Category::Watching,
                    Category::Watching | Category::Completing => Category::Completing,
                };
                if job.category == Category::CONVERGED {
                    job.converged_at.get_or_insert(now);
                    // Lines 15-16: request when it shares its worker.
                    if per_worker.get(&job.worker).copied().unwrap_or(0) > 1 {
                        requests.push(o.job_id.clone());
                    }
                }
            } else if gain > alpha {
                // Lines 19-22: a sudden gain resets it to Progressing.
                job.category = Category::PROGRESSING;
                job.converged_at = None;
            }
            // Lines 17-18: otherwise (bouncing below α) it stays.
            job.last_gain = Some(gain);
        }
        // Jobs came, went, moved and changed category all over: counted again.
        self.tally = Tally::of(self.jobs.values());
        requests.sort();
        requests.dedup();
        requests
    }

    /// Debug and test builds check the tally against a count of every job wherever Alg. 2
    /// or 3 is about to read or move jobs: a tally that drifted would go on unnoticed.
    fn check_tally(&self) {
        #[cfg(any(test, debug_assertions))]
        {
            let fresh = Tally::of(self.jobs.values());
            let n = fresh.0.len().max(self.tally.0.len());
            assert_eq!(
                self.tally.counts(n),
                fresh.counts(n),
                "SpeCon's tally of jobs per worker differs from a count"
            );
        }
    }

    /// Alg. 2 for one request: marks the job migrated and returns the move, or `None` when it
    /// stays (its host is a candidate) or nothing is eligible. The counts of line 3 are read
    /// off the tally, and every worker's score where asked: no vector of every worker's
    /// counts, scores or uses is made unless the job moves (its migration carries the scores).
    pub fn schedule(&mut self, job_id: &str, workers: &[WorkerLoad]) -> Option<Migration> {
        let current = {
            let job = self.jobs.get(job_id)?;
            if job.migrated {
                return None;
            }
            job.worker
        };
        self.check_tally();
        let (weights, tally) = (&self.config.weights, &self.tally);
        // Lines 2-3.
        let score = |i: usize| {
            workers[i].schedulable.then(|| {
                let c = tally.at(i);
                worker_score(c[0], c[1], c[2], weights)
            })
        };
        let target = select(current, workers.len(), score, |i| workers[i].resource_use)
            .filter(|&to| to != current);
        // The scores before the move, as the migration reports them.
        let scores = target.map(|_| {
            (0..workers.len())
                .map(|i| score(i).unwrap_or(f64::INFINITY))
                .collect()
        });
        let job = self.jobs.get_mut(job_id).expect("checked above");
        // Lines 9, 15, 20: marked migrated whether it moves or stays.
        job.migrated = true;
        let (to, scores) = target.zip(scores)?;
        self.tally.relocate(job, to);
        Some(Migration {
            job_id: job_id.to_string(),
            from: current,
            to,
            reason: MigrationReason::Speculative,
            scores,
        })
    }

    /// Alg. 3 at `now`, skipping jobs in `exclude` (moved this round).
    pub fn rebalance(
        &mut self,
        now: f64,
        workers: &[WorkerLoad],
        exclude: &[String],
    ) -> (Vec<Migration>, usize) {
        self.check_tally();
        let excluded: std::collections::BTreeSet<&str> =
            exclude.iter().map(String::as_str).collect();
        // Active jobs per worker: the tally's, whatever their category.
        let counts: Vec<usize> = (0..workers.len())
            .map(|i| self.tally.at(i).iter().sum())
            .collect();
        // Lines 4-6: converged durations.
        let candidates: Vec<RebalanceCandidate> = self
            .jobs
            .iter()
            .filter(|(id, j)| !j.rebalanced && !excluded.contains(id.as_str()))
            .filter_map(|(id, j)| {
                j.converged_at.map(|t| RebalanceCandidate {
                    job_id: id.clone(),
                    worker: j.worker,
                    converged_for: now - t,
                })
            })
            .collect();
        let schedulable: Vec<bool> = workers.iter().map(|w| w.schedulable).collect();
        let (moves, bf) = rebalance_plan(&counts, &schedulable, &candidates);
        let migrations = moves
            .into_iter()
            .map(|(job_id, from, to)| {
                let job = self.jobs.get_mut(&job_id).expect("candidate exists");
                self.tally.relocate(job, to);
                job.rebalanced = true;
                Migration {
                    job_id,
                    from,
                    to,
                    reason: MigrationReason::Rebalance,
                    scores: Vec::new(),
                }
            })
            .collect();
        self.check_tally();
        (migrations, bf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(n: usize) -> Vec<WorkerLoad> {
        (0..n)
            .map(|_| WorkerLoad {
                resource_use: 0.5,
                schedulable: true,
            })
            .collect()
    }

    fn jo(id: &str, worker: usize, t: f64, v: f64) -> JobObservation {
        JobObservation {
            job_id: id.into(),
            worker,
            sample: Some(Sample { time: t, value: v }),
            initial_value: Some(1.0),
            direction: Direction::Minimize,
        }
    }

    #[test]
    fn a_removed_worker_moves_the_later_ones_down_a_place() {
        let config = SpeConConfig::default();
        let mut s = SpeCon::new(config).unwrap();
        s.observe(1.0, "a", 0, Some(Category::Watching));
        s.observe(1.0, "b", 2, Some(Category::Completing));
        s.observe(1.0, "c", 1, None);
        s.remove_worker(1);
        // As if the workers had always been in their new places.
        let mut fresh = SpeCon::new(config).unwrap();
        fresh.observe(1.0, "a", 0, Some(Category::Watching));
        fresh.observe(1.0, "b", 1, Some(Category::Completing));
        assert!(s == fresh, "{:?}", s.jobs());
        assert_eq!(s.jobs()["b"].worker, 1);
        assert_eq!(s.tally.counts(3), fresh.tally.counts(3));
        assert_eq!(s.tally.counts(3)[1], [0, 0, 1]);
    }

    /// SpeCon §VI-C (specon-speculative-migration.txt:403): Job-14 on Worker-2 converges; the
    /// scores of Worker-1..4 are 63, 88, 92, 72, so it goes to Worker-1.
    #[test]
    fn paper_scores_send_job_to_worker_1() {
        let scores = [Some(63.0), Some(88.0), Some(92.0), Some(72.0)];
        assert_eq!(select_host(1, &scores, &[0.9, 0.9, 0.9, 0.9]), Some(0));
    }

    #[test]
    fn score_weights_categories() {
        // 2·PC + 1.5·WC + 1·CC.
        assert_eq!(worker_score(3, 2, 4, &Weights::default()), 13.0);
    }

    #[test]
    fn stays_when_current_host_is_a_candidate() {
        let scores = [Some(5.0), Some(5.0), Some(7.0)];
        assert_eq!(select_host(1, &scores, &[0.9, 0.1, 0.0]), Some(1));
    }

    #[test]
    fn ties_go_to_lowest_resource_use_then_lowest_index() {
        let scores = [Some(9.0), Some(5.0), Some(5.0), Some(5.0)];
        assert_eq!(select_host(0, &scores, &[0.1, 0.7, 0.3, 0.3]), Some(2));
        assert_eq!(select_host(0, &[Some(9.0), None], &[0.0, 0.0]), Some(0));
        assert_eq!(select_host(0, &[None, None], &[0.0, 0.0]), None);
    }

    #[test]
    fn alg1_progressing_watching_converged_with_bounce() {
        let mut s = SpeCon::new(SpeConConfig {
            alpha: 0.05,
            rebalance: false,
            ..SpeConConfig::default()
        })
        .unwrap();
        let w = load(2);
        let cat = |s: &SpeCon| s.jobs()["a"].category;
        s.on_round(0.0, &[jo("a", 0, 0.0, 1.0), jo("b", 0, 0.0, 1.0)], &w);
        // Gain 0.3 > α: Progressing.
        s.on_round(30.0, &[jo("a", 0, 30.0, 0.7), jo("b", 0, 30.0, 0.7)], &w);
        assert_eq!(cat(&s), Category::PROGRESSING);
        // Gain 0.04 < 0.3 and < α: Watching.
        s.on_round(60.0, &[jo("a", 0, 60.0, 0.66), jo("b", 0, 60.0, 0.6)], &w);
        assert_eq!(cat(&s), Category::Watching);
        // Gain 0.045 >= 0.04 but < α: bounce, stays Watching (lines 17-18).
        s.on_round(90.0, &[jo("a", 0, 90.0, 0.615), jo("b", 0, 90.0, 0.5)], &w);
        assert_eq!(cat(&s), Category::Watching);
        // Gain 0.005 < 0.045 and < α: Converged; it shares worker 0 with b -> request; Alg. 2
        // scores: w0 = CC 1 + PC 2 = 3, w1 = 0 -> moves to w1.
        let d = s.on_round(
            120.0,
            &[jo("a", 0, 120.0, 0.61), jo("b", 0, 120.0, 0.4)],
            &w,
        );
        assert_eq!(cat(&s), Category::CONVERGED);
        assert_eq!(d.requests, vec!["a".to_string()]);
        assert_eq!(d.migrations.len(), 1);
        assert_eq!((d.migrations[0].from, d.migrations[0].to), (0, 1));
        assert_eq!(d.migrations[0].scores, vec![3.0, 0.0]);
        assert!(s.jobs()["a"].migrated);
        assert_eq!(s.jobs()["a"].converged_at, Some(120.0));
        // Migrated: never categorized or scheduled again, even if it slows further.
        let d = s.on_round(
            150.0,
            &[jo("a", 1, 150.0, 0.609), jo("b", 0, 150.0, 0.39)],
            &w,
        );
        assert!(d.migrations.is_empty());
    }

    #[test]
    fn sudden_gain_resets_to_progressing() {
        let mut s = SpeCon::new(SpeConConfig {
            alpha: 0.05,
            rebalance: false,
            ..SpeConConfig::default()
        })
        .unwrap();
        let w = load(1);
        s.on_round(0.0, &[jo("a", 0, 0.0, 1.0)], &w);
        s.on_round(30.0, &[jo("a", 0, 30.0, 0.99)], &w);
        s.on_round(60.0, &[jo("a", 0, 60.0, 0.985)], &w);
        assert_eq!(s.jobs()["a"].category, Category::CONVERGED);
        // Alone on its worker: no request.
        s.on_round(90.0, &[jo("a", 0, 90.0, 0.8)], &w);
        assert_eq!(s.jobs()["a"].category, Category::PROGRESSING);
        assert_eq!(s.jobs()["a"].converged_at, None);
    }

    #[test]
    fn rebalance_fills_idle_worker_with_most_recently_converged_job() {
        // Worker 0 has 3 jobs, worker 1 has 3, worker 2 is idle: sum 6, bf = 2.
        let cands = vec![
            RebalanceCandidate {
                job_id: "x".into(),
                worker: 0,
                converged_for: 50.0,
            },
            RebalanceCandidate {
                job_id: "y".into(),
                worker: 1,
                converged_for: 10.0,
            },
            RebalanceCandidate {
                job_id: "z".into(),
                worker: 0,
                converged_for: 20.0,
            },
        ];
        let (moves, bf) = rebalance_plan(&[3, 3, 0], &[true; 3], &cands);
        assert_eq!(bf, 2);
        assert_eq!(moves, vec![("y".to_string(), 1, 2)]);
    }

    #[test]
    fn rebalance_without_idle_uses_bf_minus_one() {
        // Counts 6, 1, 5: sum 12, bf = 4; targets below bf - 1 = 3: worker 1.
        let cands = vec![
            RebalanceCandidate {
                job_id: "a".into(),
                worker: 2,
                converged_for: 5.0,
            },
            RebalanceCandidate {
                job_id: "b".into(),
                worker: 0,
                converged_for: 7.0,
            },
        ];
        let (moves, bf) = rebalance_plan(&[6, 1, 5], &[true; 3], &cands);
        assert_eq!(bf, 4);
        assert_eq!(moves, vec![("a".to_string(), 2, 1)]);
        // Balanced enough: nothing to do.
        let (moves, _) = rebalance_plan(&[2, 2, 1], &[true; 3], &cands);
        assert!(moves.is_empty());
    }

    #[test]
    fn rebalance_skips_unschedulable_targets_and_pointless_moves() {
        let cands = vec![RebalanceCandidate {
            job_id: "a".into(),
            worker: 0,
            converged_for: 1.0,
        }];
        // Worker 1 idle but draining.
        let (moves, _) = rebalance_plan(&[3, 0], &[true, false], &cands);
        assert!(moves.is_empty());
        // Moving the only job of a worker to an idle one changes nothing.
        let (moves, _) = rebalance_plan(&[1, 0, 1], &[true; 3], &cands);
        assert!(moves.is_empty());
    }

    #[test]
    fn invalid_weights_are_rejected() {
        let e = SpeCon::new(SpeConConfig {
            weights: Weights {
                pc: 1.0,
                wc: 1.5,
                cc: 1.0,
            },
            ..SpeConConfig::default()
        })
        .unwrap_err();
        assert!(e.to_string().contains("pc > wc > cc"));
    }
}
