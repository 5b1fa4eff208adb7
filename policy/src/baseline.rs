//! The baselines the papers measure against, as policies.
//!
//! - [`Spread`]: Docker Swarm's spread strategy (FlowCon's placement baseline, "DS" in the TCC'22
//!   multi-worker experiments): the schedulable worker with room and the fewest running tasks.
//! - [`LeastAllocated`]: the Kubernetes default scheduler's `NodeResourcesLeastAllocated`
//!   scoring (SpeCon's "DS" baseline: even initial placement, no migration).
//! - [`RoundRobin`]: SpeCon's "fixed initial container placement, where workload are evenly
//!   distributed based on the number of containers" (specon-speculative-migration.txt:356, :401:
//!   containers 1-4 on workers 1-4, then 5-8 rotate again), used for both SpeCon and its baseline.
//! - [`FreeCompetition`]: FlowCon's "NA" baseline: no CPU limits at all; every container
//!   competes under the kernel's fair share.

use crate::cluster::{JobRequest, Placement, Placer, Scores, WorkerSnapshot, unschedulable_reason};

/// Docker Swarm spread: among schedulable workers with room (`cpu_requested + job.cpus <=
/// cpu_capacity`, same for memory), the one with the fewest running jobs; ties go to the lowest
/// index. Scores are the running counts (lower is better; ineligible workers get `INFINITY`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Spread;

impl Placer for Spread {
    fn name(&self) -> &'static str {
        "spread"
    }

    fn place(&mut self, job: &JobRequest, workers: &[WorkerSnapshot]) -> Placement {
        let mut best: Option<usize> = None;
        let mut scores = Vec::with_capacity(workers.len());
        for (i, w) in workers.iter().enumerate() {
            if !(w.schedulable && w.fits(job)) {
                scores.push(f64::INFINITY);
                continue;
            }
            scores.push(w.running as f64);
            // Strictly fewer wins, so ties keep the lowest index.
            if best.is_none_or(|b| w.running < workers[b].running) {
                best = Some(i);
            }
        }
        match best {
            Some(index) => Placement::Worker {
                index,
                scores: Scores::Every(scores),
            },
            None => Placement::Unschedulable {
                reason: unschedulable_reason(job, workers),
            },
        }
    }

    fn ranks_by_running(&self) -> bool {
        true
    }
}

/// Kubernetes `NodeResourcesLeastAllocated` scoring: for each fitting node,
/// `score = mean over {cpu, memory} of (capacity - requested_after) / capacity * 100`;
/// the highest score wins, ties to the lowest index (kube-scheduler breaks ties at random; we
/// stay deterministic). Ineligible workers score `NEG_INFINITY`.
#[derive(Debug, Clone, Copy, Default)]
pub struct LeastAllocated;

impl LeastAllocated {
    /// The score of `w` for `job` (0..=100), assuming it fits. Requests are counted as
    /// kube-scheduler counts them when scoring: a job that requests nothing counts the default
    /// request ([`JobRequest::nonzero`]), so that jobs without reservations still spread
    /// instead of all scoring alike and landing on the first worker.
    pub fn score(job: &JobRequest, w: &WorkerSnapshot) -> f64 {
        let (cpus, memory) = job.nonzero();
        let cpu = if w.cpu_capacity > 0.0 {
            (w.cpu_capacity - w.cpu_requested_nonzero - cpus) / w.cpu_capacity
        } else {
            0.0
        };
        let mem = if w.memory_capacity > 0 {
            (w.memory_capacity as f64 - w.memory_requested_nonzero as f64 - memory as f64)
                / w.memory_capacity as f64
        } else {
            0.0
        };
        (cpu.max(0.0) + mem.max(0.0)) / 2.0 * 100.0
    }
}

impl Placer for LeastAllocated {
    fn name(&self) -> &'static str {
        "least-allocated"
    }

    fn place(&mut self, job: &JobRequest, workers: &[WorkerSnapshot]) -> Placement {
        let mut best: Option<(usize, f64)> = None;
        let mut scores = Vec::with_capacity(workers.len());
        for (i, w) in workers.iter().enumerate() {
            if !(w.schedulable && w.fits(job)) {
                scores.push(f64::NEG_INFINITY);
                continue;
            }
            let s = Self::score(job, w);
            scores.push(s);
            if best.is_none_or(|(_, b)| s > b) {
                best = Some((i, s));
            }
        }
        match best {
            Some((index, _)) => Placement::Worker {
                index,
                scores: Scores::Every(scores),
            },
            None => Placement::Unschedulable {
                reason: unschedulable_reason(job, workers),
            },
        }
    }
}

/// Rotating placement: the next schedulable worker with room after the last one chosen.
#[derive(Debug, Clone, Copy, Default)]
pub struct RoundRobin {
    next: usize,
}

impl Placer for RoundRobin {
    fn name(&self) -> &'static str {
        "round-robin"
    }

    fn place(&mut self, job: &JobRequest, workers: &[WorkerSnapshot]) -> Placement {
        let n = workers.len();
        for k in 0..n {
            let i = (self.next + k) % n;
            let w = &workers[i];
            if w.schedulable && w.fits(job) {
                self.next = (i + 1) % n;
                // It compares no two workers: its choice scores 0, every other worker is
                // ranked after it.
                return Placement::Worker {
                    index: i,
                    scores: Scores::Few {
                        scored: vec![(i, 0.0)],
                        rest: f64::INFINITY,
                        workers: n,
                    },
                };
            }
        }
        Placement::Unschedulable {
            reason: unschedulable_reason(job, workers),
        }
    }
}

/// FlowCon's "NA" baseline: no limits. A driver running this policy leaves every container
/// unlimited; [`FreeCompetition::limits`] returns `None` for each job so that callers can treat
/// it like any other limit policy.
#[derive(Debug, Clone, Copy, Default)]
pub struct FreeCompetition;

impl FreeCompetition {
    /// One `None` (no limit) per job.
    pub fn limits(&self, jobs: usize) -> Vec<Option<f64>> {
        vec![None; jobs]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::test_support::worker;
    use crate::cluster::{DEFAULT_CPU_REQUEST, DEFAULT_MEMORY_REQUEST};

    fn job(cpus: f64) -> JobRequest {
        JobRequest {
            cpus,
            memory_bytes: 1 << 30,
        }
    }

    #[test]
    fn spread_picks_fewest_running() {
        let mut ws = vec![worker("w0", 4.0), worker("w1", 4.0), worker("w2", 4.0)];
        ws[0].running = 2;
        ws[1].running = 1;
        ws[2].running = 3;
        let p = Spread.place(&job(1.0), &ws);
        assert_eq!(p.index(), Some(1));
        if let Placement::Worker { scores, .. } = p {
            assert_eq!(scores.to_vec(), vec![2.0, 1.0, 3.0]);
        }
    }

    #[test]
    fn spread_breaks_ties_by_lowest_index() {
        let mut ws = vec![worker("w0", 4.0), worker("w1", 4.0), worker("w2", 4.0)];
        ws[0].running = 2;
        ws[1].running = 1;
        ws[2].running = 1;
        assert_eq!(Spread.place(&job(1.0), &ws).index(), Some(1));
    }

    #[test]
    fn spread_skips_full_and_unschedulable_workers() {
        let mut ws = vec![worker("w0", 4.0), worker("w1", 4.0), worker("w2", 4.0)];
        ws[0].cpu_requested = 3.5; // no room for 1 cpu
        ws[1].schedulable = false;
        ws[2].running = 5;
        let p = Spread.place(&job(1.0), &ws);
        assert_eq!(p.index(), Some(2));
        if let Placement::Worker { scores, .. } = p {
            assert!(scores[0].is_infinite() && scores[1].is_infinite());
        }
    }

    #[test]
    fn spread_checks_memory_too() {
        let mut ws = vec![worker("w0", 4.0), worker("w1", 4.0)];
        ws[0].memory_requested = 8 << 30;
        ws[1].running = 3;
        assert_eq!(Spread.place(&job(1.0), &ws).index(), Some(1));
    }

    #[test]
    fn spread_exact_fit_is_allowed() {
        let mut ws = vec![worker("w0", 2.0)];
        ws[0].cpu_requested = 0.1 + 0.2 + 0.7; // 1.0 with rounding error
        assert_eq!(Spread.place(&job(1.0), &ws).index(), Some(0));
    }

    #[test]
    fn unschedulable_names_largest_free_cpu() {
        let mut ws = vec![worker("worker-1", 4.0), worker("worker-2", 4.0)];
        ws[0].cpu_requested = 3.5;
        ws[1].cpu_requested = 3.0;
        match Spread.place(&job(2.0), &ws) {
            Placement::Unschedulable { reason } => assert_eq!(
                reason,
                "no schedulable worker has 2.0 free CPUs (largest free: 1.0 on worker-2)"
            ),
            p => panic!("expected unschedulable, got {p:?}"),
        }
    }

    /// Requests and free cores as a user wrote them: a quarter core is not "0.2".
    #[test]
    fn unschedulable_says_fractions_of_a_core_unrounded() {
        let mut ws = vec![worker("worker-1", 1.0)];
        ws[0].cpu_requested = 0.76;
        match Spread.place(&job(0.25), &ws) {
            Placement::Unschedulable { reason } => assert_eq!(
                reason,
                "no schedulable worker has 0.25 free CPUs (largest free: 0.24 on worker-1)"
            ),
            p => panic!("expected unschedulable, got {p:?}"),
        }
    }

    #[test]
    fn unschedulable_names_memory_when_cpu_fits() {
        let mut ws = vec![worker("worker-1", 4.0)];
        ws[0].memory_requested = 7 << 30;
        let j = JobRequest {
            cpus: 1.0,
            memory_bytes: 2 << 30,
        };
        match Spread.place(&j, &ws) {
            Placement::Unschedulable { reason } => assert_eq!(
                reason,
                "no schedulable worker has 2.0 GiB free memory (largest free: 1.0 GiB on worker-1)"
            ),
            p => panic!("expected unschedulable, got {p:?}"),
        }
    }

    #[test]
    fn unschedulable_when_no_workers_or_all_draining() {
        let reason = |ws: &[WorkerSnapshot]| match Spread.place(&job(1.0), ws) {
            Placement::Unschedulable { reason } => reason,
            p => panic!("{p:?}"),
        };
        assert_eq!(reason(&[]), "no workers are registered");
        let mut ws = vec![worker("w0", 4.0), worker("w1", 4.0)];
        ws[0].schedulable = false;
        ws[1].schedulable = false;
        assert_eq!(
            reason(&ws),
            "none of the 2 workers is schedulable (all lost or draining)"
        );
    }

    #[test]
    fn least_allocated_prefers_emptiest() {
        let mut ws = vec![worker("w0", 4.0), worker("w1", 4.0)];
        ws[0].cpu_requested_nonzero = 2.0;
        ws[1].cpu_requested_nonzero = 1.0;
        let p = LeastAllocated.place(&job(1.0), &ws);
        assert_eq!(p.index(), Some(1));
        if let Placement::Worker { scores, .. } = p {
            // w1: cpu (4-1-1)/4 = 0.5, mem (8-1)/8 = 0.875 -> 68.75
            assert!((scores[1] - 68.75).abs() < 1e-9);
            assert!((scores[0] - 56.25).abs() < 1e-9);
        }
    }

    #[test]
    fn least_allocated_counts_a_job_without_requests_as_kube_scheduler_does() {
        // Two workers, one already holding a job that reserved nothing: a second such job goes
        // to the other worker (the first's non-zero request is 0.1 core and 200 MiB), rather
        // than scoring both alike and taking the lowest index.
        let mut ws = vec![worker("w0", 4.0), worker("w1", 4.0)];
        let none = JobRequest {
            cpus: 0.0,
            memory_bytes: 0,
        };
        assert_eq!(
            none.nonzero(),
            (DEFAULT_CPU_REQUEST, DEFAULT_MEMORY_REQUEST)
        );
        ws[0].cpu_requested_nonzero = none.nonzero().0;
        ws[0].memory_requested_nonzero = none.nonzero().1;
        ws[0].running = 1;
        assert_eq!(LeastAllocated.place(&none, &ws).index(), Some(1));
        // Fitting still uses the real requests: the emptier worker by score, full by
        // reservation, refuses a job that asks for a core.
        ws[1].cpu_requested = 4.0;
        let one = JobRequest {
            cpus: 1.0,
            memory_bytes: 0,
        };
        assert_eq!(LeastAllocated.place(&one, &ws).index(), Some(0));
    }

    #[test]
    fn round_robin_rotates_and_skips_full_workers() {
        let mut ws = vec![worker("w0", 4.0), worker("w1", 4.0), worker("w2", 4.0)];
        let mut rr = RoundRobin::default();
        let picks: Vec<_> = (0..4).map(|_| rr.place(&job(1.0), &ws).index()).collect();
        assert_eq!(picks, vec![Some(0), Some(1), Some(2), Some(0)]);
        ws[1].cpu_requested = 4.0;
        let p = rr.place(&job(1.0), &ws);
        assert_eq!(p.index(), Some(2));
        // Its choice scores 0 and every other worker ranks after it.
        let Placement::Worker { scores, .. } = p else {
            panic!("{p:?}")
        };
        assert_eq!(scores.to_vec(), vec![f64::INFINITY, f64::INFINITY, 0.0]);
    }

    #[test]
    fn free_competition_sets_no_limits() {
        assert_eq!(FreeCompetition.limits(3), vec![None, None, None]);
    }
}
