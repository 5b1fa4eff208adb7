//! Policies that split each worker's CPU by a priority, as hard limits set from the manager:
//!
//! - `converge` (Converge's own): shortest predicted remaining work first
//!   ([`converge_policy::estimate`]), placement by predicted load per core.
//! - `las` (Tiresias' discretization-free form, Gu et al., NSDI'19): least attained service
//!   first, no knowledge of durations, spread placement. The strongest peer that needs no hooks
//!   into the training framework.
//!
//! The split ([`split`]) is the same for both: every job gets a guard of `capacity / (β·n)`
//! cores (FlowCon's lower bound, flowcon-icpp2019.txt Alg. 1 line 22, β = 2), so no job starves;
//! a job with no estimate (no progress lines, no finished jobs to compare with) gets a fair
//! share `capacity / n`; what is left goes to the jobs in priority order, each up to what it
//! can use (`usable`). Limits are recomputed for a worker on each of its heartbeats and sent only when
//! they change by more than [`MIN_CHANGE`] cores, so a steady worker sees no commands.

use std::collections::BTreeMap;

use converge_policy::baseline::Spread;

use super::placing::Placing;
use super::{Admission, ClusterPolicy, ClusterView, Decision, Report, request, scores_text};
use crate::cluster::lifecycle::{Job, JobPhase};
use crate::cluster::types::{JobId, Time, WorkerId, WorkerMode};

/// FlowCon's β: the guard is `1/(β·n)` of the worker.
pub const BETA: f64 = 2.0;
/// Limits that move by less than this many cores are not sent again.
pub const MIN_CHANGE: f64 = 0.02;
/// Docker's smallest quota.
const MIN_CPUS: f64 = 0.01;

/// What orders a worker's jobs (smaller first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    /// Predicted remaining work (SRPT).
    Remaining,
    /// Service had so far (LAS).
    Attained,
}

/// One job of a worker, for [`split`].
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    /// The job.
    pub job: JobId,
    /// Its priority key (smaller first); `None` when unknown.
    pub key: Option<f64>,
    /// The most cores it can use.
    pub max: f64,
}

/// Splits `capacity` cores among `claims` (module doc). Returns each job's cores, in the order
/// given.
pub fn split(capacity: f64, claims: &[Claim], beta: f64) -> Vec<f64> {
    let n = claims.len();
    if n == 0 {
        return Vec::new();
    }
    let floor = capacity / (beta * n as f64);
    let fair = capacity / n as f64;
    let mut cores: Vec<f64> = claims
        .iter()
        .map(|c| {
            let base = if c.key.is_some() { floor } else { fair };
            base.min(c.max.max(MIN_CPUS))
        })
        .collect();
    let mut left = (capacity - cores.iter().sum::<f64>()).max(0.0);
    let mut order: Vec<usize> = (0..n).filter(|&i| claims[i].key.is_some()).collect();
    order.sort_by(|&a, &b| {
        claims[a]
            .key
            .unwrap_or(f64::INFINITY)
            .total_cmp(&claims[b].key.unwrap_or(f64::INFINITY))
            .then_with(|| claims[a].job.cmp(&claims[b].job))
    });
    for i in order {
        if left <= 0.0 {
            break;
        }
        let add = (claims[i].max - cores[i]).clamp(0.0, left);
        cores[i] += add;
        left -= add;
    }
    cores
}

/// The most cores `job` is given a chance to use on a worker of `capacity`: the whole worker,
/// unless it left a fifth of its last limit unused (it cannot go faster: one thread, or it
/// waits on something else): then a quarter more than it used, so it can grow back.
fn usable(job: &Job, capacity: f64) -> f64 {
    match job.assigned_cpus {
        Some(a) if job.view.cpu_usage < 0.8 * a => (job.view.cpu_usage * 1.25).max(MIN_CPUS),
        _ => capacity,
    }
}

/// A priority-split policy (module doc).
pub struct PriorityPolicy {
    name: &'static str,
    key: Key,
    /// `las` places by spread; `converge` by predicted load per core.
    spread: Option<Placing>,
    /// `converge` evens out predicted finish times across workers every this many seconds.
    rebalance: Option<Time>,
    next_rebalance: Option<Time>,
    /// Jobs moved once: never again (a move costs a save and a restore).
    moved: std::collections::BTreeSet<JobId>,
}

/// What a move costs before the job trains again, in seconds, when no move was measured yet:
/// a save and a restore of a trainer checkpoint on the shared volume (design.md budgets
/// under a second; the margin covers a slow worker).
const MOVE_COST_S: f64 = 5.0;

impl PriorityPolicy {
    /// `converge`: SRPT limits, placement by predicted load per core.
    pub fn converge(rebalance_interval: Time) -> Self {
        PriorityPolicy {
            name: "converge",
            key: Key::Remaining,
            spread: None,
            rebalance: Some(rebalance_interval),
            next_rebalance: None,
            moved: Default::default(),
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
        }
    }

    /// One move that evens out predicted finish times, if one is worth its cost: from the
    /// worker that will drain last to the one that drains first, the job whose move shortens
    /// the later of the two the most, net of the move's downtime and of the work it would lose
    /// since its last checkpoint (checkpoint-aware: among equal gains, the one losing least).
    fn even_out(&mut self, view: ClusterView<'_>) -> Option<Decision> {
        let drain = |w: &crate::cluster::lifecycle::Worker| {
            let work: f64 = w
                .jobs
                .iter()
                .filter_map(|id| view.jobs.get(id))
                .map(|j| Self::work(view, j))
                .sum();
            work / (w.cpu_capacity * w.calibration).max(1e-9)
        };
        let live: Vec<(&crate::cluster::lifecycle::Worker, f64)> = view
            .workers
            .values()
            .filter(|w| w.schedulable() && w.cpu_capacity > 0.0)
            .map(|w| (w, drain(w)))
            .collect();
        let (hi, d_hi) = live.iter().max_by(|a, b| a.1.total_cmp(&b.1))?;
        let (lo, d_lo) = live.iter().min_by(|a, b| a.1.total_cmp(&b.1))?;
        if hi.id == lo.id {
            return None;
        }
        let measured = view
            .jobs
            .values()
            .filter_map(|j| j.last_migration_downtime)
            .fold(None, |m: Option<f64>, d| Some(m.map_or(d, |m| m.max(d))));
        let cost = measured.unwrap_or(MOVE_COST_S);
        let lo_snap = view.snapshot(lo);
        let mut best: Option<(f64, f64, &Job)> = None;
        for j in hi.jobs.iter().filter_map(|id| view.jobs.get(id)) {
            if !matches!(j.phase, JobPhase::Running { .. })
                || self.moved.contains(&j.id)
                || !lo_snap.fits(&request(&j.spec))
            {
                continue;
            }
            let w = Self::work(view, j);
            let after = (d_hi - w / (hi.cpu_capacity * hi.calibration))
                .max(d_lo + w / (lo.cpu_capacity * lo.calibration));
            let risk = view.work_at_risk(j);
            let gain = d_hi - after - cost - risk;
            if gain > 0.0
                && best.is_none_or(|(g, r, _)| gain > g + 1e-9 || (gain > g - 1e-9 && risk < r))
            {
                best = Some((gain, risk, j));
            }
        }
        let (gain, risk, j) = best?;
        self.moved.insert(j.id.clone());
        Some(Decision::Move {
            job: j.id.clone(),
            to: lo.id.clone(),
            reason: crate::cluster::types::MoveReason::Rebalance,
            attributes: BTreeMap::from([
                (
                    "why".into(),
                    format!(
                        "{} drains in {d_hi:.0} s, {} in {d_lo:.0} s: moving it saves {gain:.0} s net of a {cost:.1} s move and {risk:.1} s of work since its last checkpoint",
                        hi.id, lo.id
                    ),
                ),
                ("work_at_risk_s".into(), format!("{risk:.2}")),
            ]),
        })
    }

    /// Work a job will need, for placement: its estimate, else its user's estimate, else what
    /// finished jobs needed on average.
    fn work(view: ClusterView<'_>, job: &Job) -> f64 {
        view.estimate(job)
            .map(|e| e.work)
            .or((job.spec.estimated_runtime_s > 0.0).then_some(job.spec.estimated_runtime_s))
            .or_else(|| view.history.expected_remaining(0.0))
            .unwrap_or(0.0)
    }

    /// The limits of `worker`'s jobs, as decisions for those that changed.
    fn limits(&self, view: ClusterView<'_>, worker: &WorkerId) -> Vec<Decision> {
        let Some(w) = view.workers.get(worker) else {
            return Vec::new();
        };
        // Jobs starting here need room too, though only running ones can be limited.
        let jobs: Vec<&Job> = w
            .jobs
            .iter()
            .filter_map(|id| view.jobs.get(id))
            .filter(|j| {
                matches!(
                    j.phase,
                    JobPhase::Running { .. } | JobPhase::Starting { .. }
                )
            })
            .collect();
        let claims: Vec<Claim> = jobs
            .iter()
            .map(|j| Claim {
                job: j.id.clone(),
                key: match self.key {
                    Key::Remaining => view.estimate(j).map(|e| e.work),
                    Key::Attained => Some(j.cpu_s),
                },
                max: usable(j, w.cpu_capacity),
            })
            .collect();
        let cores = split(w.cpu_capacity, &claims, BETA);
        jobs.iter()
            .zip(cores)
            .filter(|(j, c)| {
                matches!(j.phase, JobPhase::Running { .. })
                    && j.assigned_cpus.is_none_or(|a| (a - c).abs() > MIN_CHANGE)
            })
            .map(|(j, c)| Decision::SetLimits {
                job: j.id.clone(),
                cpus: (c * 100.0).round() / 100.0,
            })
            .collect()
    }
}

impl ClusterPolicy for PriorityPolicy {
    fn name(&self) -> &'static str {
        self.name
    }

    fn place(&mut self, _now: Time, job: &Job, view: ClusterView<'_>) -> Admission {
        if let Some(spread) = &mut self.spread {
            return spread.admit(job, view);
        }
        // Predicted load per core after placing the job: small workers do not collect as many
        // jobs as big ones, and a worker holding long jobs looks as full as it is.
        let (ids, snaps) = view.snapshots();
        let need = request(&job.spec);
        let new = Self::work(view, job);
        let scores: Vec<f64> = view
            .workers
            .values()
            .zip(&snaps)
            .map(|(w, s)| {
                if !(s.schedulable && s.fits(&need)) || w.cpu_capacity <= 0.0 {
                    return f64::INFINITY;
                }
                let queued: f64 = w
                    .jobs
                    .iter()
                    .filter_map(|id| view.jobs.get(id))
                    .map(|j| Self::work(view, j))
                    .sum();
                (queued + new) / (w.cpu_capacity * w.calibration.max(1e-6))
            })
            .collect();
        let best = scores
            .iter()
            .enumerate()
            .filter(|(_, s)| s.is_finite())
            .min_by(|a, b| a.1.total_cmp(b.1))
            .map(|(i, _)| i);
        match best {
            Some(i) => Admission::Place {
                worker: ids[i].clone(),
                cpu_shares: 0,
                victims: Vec::new(),
                reason: format!(
                    "placed on {} by converge: least predicted work per core ({:.1} s)",
                    ids[i], scores[i]
                ),
                attributes: BTreeMap::from([("scores".into(), scores_text(&ids, &scores))]),
            },
            None => Admission::Wait {
                reason: converge_policy::cluster::unschedulable_reason(&need, &snaps),
            },
        }
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
        let Some(every) = self.rebalance else {
            return Vec::new();
        };
        let due = *self.next_rebalance.get_or_insert(now + every);
        if now < due {
            return Vec::new();
        }
        self.next_rebalance = Some(now + every);
        self.even_out(view).into_iter().collect()
    }

    fn next_due(&self) -> Option<Time> {
        self.next_rebalance
    }

    fn on_departure(
        &mut self,
        _now: Time,
        worker: &WorkerId,
        _job: &JobId,
        view: ClusterView<'_>,
    ) -> Vec<Decision> {
        // The room it left goes to the next in line at once, not a heartbeat later.
        self.limits(view, worker)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(job: &str, key: Option<f64>, max: f64) -> Claim {
        Claim {
            job: job.into(),
            key,
            max,
        }
    }

    #[test]
    fn the_shortest_job_gets_what_the_guard_leaves() {
        // One core, three single-core jobs: guards 1/6 each, the rest to the shortest.
        let c = split(
            1.0,
            &[
                claim("long", Some(100.0), 1.0),
                claim("short", Some(5.0), 1.0),
                claim("mid", Some(20.0), 1.0),
            ],
            2.0,
        );
        let sixth = 1.0 / 6.0;
        assert!(
            (c[0] - sixth).abs() < 1e-9 && (c[2] - sixth).abs() < 1e-9,
            "{c:?}"
        );
        assert!((c[1] - (1.0 - 2.0 * sixth)).abs() < 1e-9, "{c:?}");
        assert!((c.iter().sum::<f64>() - 1.0).abs() < 1e-9);
    }

    #[test]
    fn no_job_starves_under_the_guard() {
        let claims: Vec<Claim> = (0..8)
            .map(|i| claim(&format!("j{i}"), Some(i as f64), 1.0))
            .collect();
        let c = split(2.0, &claims, 2.0);
        for x in &c {
            assert!(*x >= 2.0 / 16.0 - 1e-9, "{c:?}");
        }
    }

    #[test]
    fn a_job_without_progress_lines_still_gets_a_fair_share() {
        let c = split(
            1.0,
            &[
                claim("silent", None, 1.0),
                claim("a", Some(1.0), 1.0),
                claim("b", Some(9.0), 1.0),
            ],
            2.0,
        );
        assert!((c[0] - 1.0 / 3.0).abs() < 1e-9, "{c:?}");
    }

    #[test]
    fn the_leftover_passes_down_when_a_job_cannot_use_more() {
        // Two cores; the shortest can use half a core only: the next gets the rest.
        let c = split(
            2.0,
            &[claim("a", Some(1.0), 0.5), claim("b", Some(2.0), 4.0)],
            2.0,
        );
        assert!(
            (c[0] - 0.5).abs() < 1e-9 && (c[1] - 1.5).abs() < 1e-9,
            "{c:?}"
        );
    }
}
