//! Plain data the drivers (manager, agent, simulator) fill in and hand to the policies.
//!
//! Nothing here knows where the numbers came from: the manager builds [`WorkerSnapshot`]s from
//! agent heartbeats, the simulator from its own model. Placement policies implement [`Placer`].

use crate::Id;
use serde::{Deserialize, Serialize};

/// What a job asks for when it is placed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct JobRequest {
    /// CPU cores requested (a reservation for placement; the running limit is elastic).
    pub cpus: f64,
    /// Memory requested, in bytes.
    pub memory_bytes: u64,
}

/// What scoring counts for a job that requests no CPU: 0.1 core (kube-scheduler's
/// `DefaultMilliCPURequest`, pkg/scheduler/util/pod_resources.go: "such pods will not see
/// zero-request pods as consuming no resources whatsoever").
pub const DEFAULT_CPU_REQUEST: f64 = 0.1;
/// What scoring counts for a job that requests no memory: 200 MiB (`DefaultMemoryRequest`).
pub const DEFAULT_MEMORY_REQUEST: u64 = 200 * 1024 * 1024;

impl JobRequest {
    /// The request as scoring sees it: each resource the job leaves at zero counts as the
    /// default request. Fitting still uses the real request.
    pub fn nonzero(&self) -> (f64, u64) {
        (
            if self.cpus > 0.0 {
                self.cpus
            } else {
                DEFAULT_CPU_REQUEST
            },
            if self.memory_bytes > 0 {
                self.memory_bytes
            } else {
                DEFAULT_MEMORY_REQUEST
            },
        )
    }
}

/// The state of one job as its worker last reported it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSnapshot {
    /// The job's id.
    pub job_id: Id,
    /// The job's category in the worker's last policy round.
    pub category: Category,
    /// The job's last growth efficiency, if it has one yet.
    pub growth_efficiency: Option<f64>,
    /// The job's current CPU limit as a fraction of the worker (None = unlimited).
    pub cpu_limit: Option<f64>,
}

/// A job's category: one enum for both papers.
///
/// FlowCon (ICPP'19 §IV, flowcon-icpp2019.txt) names the lists New / Watching / Completing;
/// SpeCon (specon-speculative-migration.txt, Alg. 1) names them Progressing / Watching /
/// Converged. They play the same roles (still learning fast / slowing / barely moving), so we use
/// one enum with FlowCon's names; [`Category::PROGRESSING`] and [`Category::CONVERGED`] are the
/// SpeCon aliases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Category {
    /// FlowCon's New list / SpeCon's Progressing: still gaining fast.
    New,
    /// Gaining less than the threshold, under observation.
    Watching,
    /// FlowCon's Completing / SpeCon's Converged: barely gaining any more.
    Completing,
}

impl Category {
    /// SpeCon's name for [`Category::New`].
    pub const PROGRESSING: Category = Category::New;
    /// SpeCon's name for [`Category::Completing`].
    pub const CONVERGED: Category = Category::Completing;
}

/// One worker as the placing side sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerSnapshot {
    /// The worker's id (for messages).
    pub id: Id,
    /// CPU capacity, in cores.
    pub cpu_capacity: f64,
    /// Sum of the cpus requested by jobs placed there (a job a move is bringing there counts
    /// from the move's start: its room is taken).
    pub cpu_requested: f64,
    /// Memory capacity, in bytes.
    pub memory_capacity: u64,
    /// Sum of the memory requested by jobs placed there.
    pub memory_requested: u64,
    /// Sum of [`JobRequest::nonzero`] CPU over the jobs placed there: what scoring counts
    /// (a job that reserves nothing still occupies the worker).
    pub cpu_requested_nonzero: f64,
    /// Sum of [`JobRequest::nonzero`] memory over the jobs placed there.
    pub memory_requested_nonzero: u64,
    /// Jobs placed there and not finished (including ones still starting, and ones a move is
    /// bringing there).
    pub running: usize,
    /// Speed relative to the reference worker (1.0).
    pub calibration: f64,
    /// False when the worker is lost or draining.
    pub schedulable: bool,
    /// What the worker last reported per job; may be empty.
    pub jobs: Vec<JobSnapshot>,
}

impl WorkerSnapshot {
    /// Free CPU cores by reservation (never negative).
    pub fn cpu_free(&self) -> f64 {
        (self.cpu_capacity - self.cpu_requested).max(0.0)
    }

    /// Free memory bytes by reservation.
    pub fn memory_free(&self) -> u64 {
        self.memory_capacity.saturating_sub(self.memory_requested)
    }

    /// Whether `job` fits in what is left of this worker's reservations.
    ///
    /// A small epsilon absorbs float rounding in sums of requests (0.1 + 0.2 cores).
    pub fn fits(&self, job: &JobRequest) -> bool {
        self.cpu_requested + job.cpus <= self.cpu_capacity + 1e-9
            && self.memory_requested.saturating_add(job.memory_bytes) <= self.memory_capacity
    }

    /// Count of reported jobs in `category`.
    pub fn count(&self, category: Category) -> usize {
        self.jobs.iter().filter(|j| j.category == category).count()
    }
}

/// Where a placer puts a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Placement {
    /// Place on `workers[index]`. `scores` gives every worker in the input a score (the
    /// policy's, for explanation and tracing; `f64::INFINITY` / `NEG_INFINITY` for workers
    /// that were not eligible, whichever the policy ranks last), one each or a few
    /// ([`Scores`]).
    Worker {
        /// Index into the `workers` slice passed to [`Placer::place`].
        index: usize,
        /// Per-worker scores (same order as the input).
        scores: Scores,
    },
    /// No worker can take the job now; `reason` tells a user what is wrong.
    Unschedulable {
        /// Human-readable explanation, e.g. "no schedulable worker has 2.0 free CPUs (largest
        /// free: 1.0 on worker-2)".
        reason: String,
    },
}

impl Placement {
    /// The chosen worker index, if any.
    pub fn index(&self) -> Option<usize> {
        match self {
            Placement::Worker { index, .. } => Some(*index),
            Placement::Unschedulable { .. } => None,
        }
    }
}

/// A placer's score of each worker it was given, in their order: one per worker, or, for a
/// placer that scores only a few, those few and what every other worker scores.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Scores {
    /// One score per worker.
    Every(Vec<f64>),
    /// Only the workers at these places have a score of their own (place, score, in place
    /// order; the chosen worker among them); every other one of the `workers` is ineligible
    /// and scores `rest` (`f64::INFINITY` or `NEG_INFINITY`). For a placer that compares no
    /// two workers ([`crate::baseline::RoundRobin`]): writing every worker's score at every
    /// placement, and reading them all for the event, was 5% of SpeCon's samples at 10,000
    /// workers (`docs/performance.md`).
    Few {
        /// The places scored, with their scores.
        scored: Vec<(usize, f64)>,
        /// What every other worker scores: ineligible (not finite).
        rest: f64,
        /// How many workers were scored.
        workers: usize,
    },
}

impl Scores {
    /// How many workers were scored.
    pub fn len(&self) -> usize {
        match self {
            Scores::Every(s) => s.len(),
            Scores::Few { workers, .. } => *workers,
        }
    }

    /// Whether no worker was scored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// One score per worker.
    pub fn to_vec(&self) -> Vec<f64> {
        (0..self.len()).map(|i| self[i]).collect()
    }
}

impl std::ops::Index<usize> for Scores {
    type Output = f64;

    fn index(&self, place: usize) -> &f64 {
        match self {
            Scores::Every(s) => &s[place],
            Scores::Few {
                scored,
                rest,
                workers,
            } => {
                assert!(place < *workers, "place {place} of {workers} workers");
                scored.iter().find(|s| s.0 == place).map_or(rest, |s| &s.1)
            }
        }
    }
}

/// A placement policy.
pub trait Placer {
    /// Short stable name (for configs, logs, experiment tables).
    fn name(&self) -> &'static str;
    /// Choose a worker for `job`. Deterministic: the same inputs give the same answer.
    fn place(&mut self, job: &JobRequest, workers: &[WorkerSnapshot]) -> Placement;
    /// Whether this placer chooses, among the schedulable workers `job` fits on, the one with
    /// the fewest running jobs, ties to the lowest index, and scores each such worker with its
    /// running count (what [`crate::baseline::Spread`] does). A caller that keeps the workers
    /// in that order may then find the answer without calling [`Placer::place`], which
    /// compares every worker: the first workers in the order that fit are the choice and its
    /// nearest rivals.
    fn ranks_by_running(&self) -> bool {
        false
    }
    /// An empty index of this placer's own, for a caller that keeps one snapshot per worker
    /// and hands it every one it changes ([`PlacerIndex`]); `None` for a placer without one.
    /// A placer with an index keeps no state in [`Placer::place`]: its caller may answer
    /// from the index instead, and test builds call both and compare.
    fn index(&self) -> Option<Box<dyn PlacerIndex>> {
        None
    }
}

/// A placer's index of the workers, kept up to date by its caller one changed snapshot at a
/// time, so that a placement need not score every worker. Its answers are the placer's own:
/// [`PlacerIndex::place`] chooses what [`Placer::place`] over the same snapshots would, and
/// shows the rivals [`Placer::place`]'s scores would put nearest the choice.
pub trait PlacerIndex: Send + std::fmt::Debug {
    /// Records the snapshot of the worker at `place` (new, changed, or another worker's now
    /// that the places moved; an unschedulable worker leaves the index). When places move,
    /// the caller sets every one again.
    fn set(&mut self, place: usize, worker: &WorkerSnapshot);
    /// Forgets every place from `len` on: workers left the cluster (an operator forgot them),
    /// and the caller sets the `len` that remain again.
    fn truncate(&mut self, len: usize);
    /// The choice for `job` among `workers` (the snapshots the index was told of), then up to
    /// `rivals` other eligible places whose scores are nearest the choice's, nearest first,
    /// ties to the lower place. `None` when nothing fits or the index cannot answer exactly
    /// (the caller then asks [`Placer::place`], which also says why nothing fits).
    fn place(
        &self,
        job: &JobRequest,
        workers: &[WorkerSnapshot],
        rivals: usize,
    ) -> Option<Vec<usize>>;
    /// The placer's score of the worker at `place` (what [`Placement::Worker`]'s scores hold).
    fn score(&self, place: usize) -> f64;
    /// Whether the index is the one that setting each of `workers` at its place, afresh,
    /// would build (what the caller's tests check after every change).
    fn agrees_with(&self, workers: &[WorkerSnapshot]) -> bool;
}

/// Explains why no worker fits `job`, naming the tightest resource and the best candidate.
///
/// Shared by every placer so that users see the same wording whatever the policy.
pub fn unschedulable_reason(job: &JobRequest, workers: &[WorkerSnapshot]) -> String {
    let schedulable: Vec<&WorkerSnapshot> = workers.iter().filter(|w| w.schedulable).collect();
    if workers.is_empty() {
        return "no workers are registered".to_string();
    }
    if schedulable.is_empty() {
        return format!(
            "none of the {} workers is schedulable (all lost or draining)",
            workers.len()
        );
    }
    let cpu_ok = schedulable
        .iter()
        .any(|w| w.cpu_requested + job.cpus <= w.cpu_capacity + 1e-9);
    if !cpu_ok {
        // Largest free CPU; ties -> first worker.
        let best = schedulable
            .iter()
            .fold(None::<&&WorkerSnapshot>, |acc, w| match acc {
                Some(b) if b.cpu_free() >= w.cpu_free() => Some(b),
                _ => Some(w),
            })
            .expect("non-empty");
        return format!(
            "no schedulable worker has {} free CPUs (largest free: {} on {})",
            fmt_cpus(job.cpus),
            fmt_cpus(best.cpu_free()),
            best.id
        );
    }
    let mem_ok = schedulable
        .iter()
        .any(|w| w.memory_requested.saturating_add(job.memory_bytes) <= w.memory_capacity);
    let best = schedulable
        .iter()
        .fold(None::<&&WorkerSnapshot>, |acc, w| match acc {
            Some(b) if b.memory_free() >= w.memory_free() => Some(b),
            _ => Some(w),
        })
        .expect("non-empty");
    if !mem_ok {
        return format!(
            "no schedulable worker has {} free memory (largest free: {} on {})",
            fmt_bytes(job.memory_bytes),
            fmt_bytes(best.memory_free()),
            best.id
        );
    }
    format!(
        "no schedulable worker has both {} free CPUs and {} free memory",
        fmt_cpus(job.cpus),
        fmt_bytes(job.memory_bytes)
    )
}

/// Cores as a user writes them: to the thousandth, without trailing zeros (`0.25`, `2.0`).
/// One decimal said a 0.25-core job waited for "0.2 free CPUs", and 0.24 free as 0.2.
fn fmt_cpus(cores: f64) -> String {
    let text = format!("{cores:.3}");
    let text = text.trim_end_matches('0');
    if text.ends_with('.') {
        format!("{text}0")
    } else {
        text.to_string()
    }
}

fn fmt_bytes(b: u64) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    if b >= 1024 * 1024 * 1024 {
        format!("{:.1} GiB", b as f64 / (1024.0 * MIB))
    } else {
        format!("{:.0} MiB", b as f64 / MIB)
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    use super::*;

    /// A worker with `cpus` cores, 8 GiB, nothing placed.
    pub fn worker(id: &str, cpus: f64) -> WorkerSnapshot {
        WorkerSnapshot {
            id: id.into(),
            cpu_capacity: cpus,
            cpu_requested: 0.0,
            memory_capacity: 8 << 30,
            memory_requested: 0,
            cpu_requested_nonzero: 0.0,
            memory_requested_nonzero: 0,
            running: 0,
            calibration: 1.0,
            schedulable: true,
            jobs: Vec::new(),
        }
    }
}
