//! From FlowCon's limits to Docker CPU quotas: the one way Converge applies limits.
//!
//! FlowCon decides each container's limit as a fraction of its worker
//! ([`crate::flowcon::LimitDecision::limit`]); Docker enforces cores (`--cpus`, a CFS quota
//! per container under the worker's parent quota). The agent applies [`cpu_quotas`] to a
//! round's decisions, and the simulator's CPU model caps each job at the very same numbers, so
//! the simulator measures the limits the live system enforces.
//!
//! - [`limit_to_cpus`]: one limit as cores, within the worker and above FlowCon's lower bound.
//! - [`work_conserving`]: scales the quotas up, keeping their ratios, when together they
//!   would leave part of the worker idle (Docker's quotas are hard, the papers' limits soft).
//! - [`cpu_quotas`]: a whole round, `limit_to_cpus` per job then `work_conserving`.
//! - [`clamp_cpus`]: a requested number of cores (a `Start`'s or `SetLimits`' cpus) as the
//!   quota Docker is given.

use crate::flowcon::LimitDecision;

/// Smallest CPU limit Docker accepts (`--cpus 0.01`: 1 ms per 100 ms period).
pub const MIN_CPUS: f64 = 0.01;

/// FlowCon's limit (a fraction of the worker) as Docker CPUs (cores).
///
/// `limit × capacity`, and whatever the policy says: never above the capacity (a limit above
/// the whole worker means nothing, and under cgroup v1 a child quota above its parent's is
/// refused), never below FlowCon's lower bound `floor × capacity` (ICPP'19 Alg. 1 line 22,
/// flowcon-icpp2019.txt:404-413), and never below Docker's smallest quota. A limit that is not
/// a number means "no limit".
pub fn limit_to_cpus(limit: f64, floor: f64, capacity: f64) -> f64 {
    let floor = if floor.is_finite() {
        floor.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let fraction = if limit.is_nan() { 1.0 } else { limit }.clamp(floor, 1.0);
    let capacity = capacity.max(MIN_CPUS);
    (fraction * capacity).clamp(MIN_CPUS, capacity)
}

/// Scales `cpus` up, keeping their ratios, when together they leave part of the worker idle.
///
/// Why: the papers treat `docker update` limits as soft ("the unused option will be utilized by
/// others", flowcon-icpp2019.txt:423-426), but Docker's `--cpus` is a hard CFS quota. With
/// every job held at FlowCon's lower bound `1/(β·n)` (three jobs, β = 2: 1/6 each), half the
/// worker would sit idle — measured on the testbed before this existed. Scaling the limits up
/// until they cover the capacity keeps FlowCon's priorities (the ratios) and keeps the worker
/// busy, as soft limits would. Scaling only ever raises a limit, so none falls below the lower
/// bound, and none exceeds the capacity.
pub fn work_conserving(cpus: &mut [f64], capacity: f64) {
    let total: f64 = cpus.iter().sum();
    if cpus.is_empty() || total.is_nan() || total <= 0.0 || total >= capacity {
        return;
    }
    let factor = capacity / total;
    for c in cpus.iter_mut() {
        *c = (*c * factor).min(capacity);
    }
}

/// A FlowCon round's limits as the Docker CPU quotas (cores) the agent applies, in the order
/// of `limits`.
///
/// `floor` is the round's lower bound as a fraction of the worker
/// ([`crate::flowcon::FlowCon::lower_bound`] of the number of containers), `capacity` the
/// worker's cores. Each limit goes through [`limit_to_cpus`], then the set through
/// [`work_conserving`]. The agent enforces exactly these numbers and the simulator caps each
/// job's CPU at them, so both see the same limits.
pub fn cpu_quotas(limits: &[LimitDecision], floor: f64, capacity: f64) -> Vec<f64> {
    let mut cpus: Vec<f64> = limits
        .iter()
        .map(|d| limit_to_cpus(d.limit, floor, capacity))
        .collect();
    work_conserving(&mut cpus, capacity);
    cpus
}

/// A requested number of cores (a `Start`'s or a `SetLimits`' cpus) as the quota Docker is
/// given: at most the worker's capacity (under cgroup v1 a child quota above its parent's is
/// refused), at least Docker's smallest quota; 0 or a value that is not a finite positive
/// number means "no limit", which under the worker's parent is the whole worker.
pub fn clamp_cpus(requested: f64, capacity: f64) -> f64 {
    if !requested.is_finite() || requested <= 0.0 {
        return capacity.max(MIN_CPUS);
    }
    requested.min(capacity).max(MIN_CPUS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Category;
    use proptest::prelude::*;

    fn decision(job: &str, limit: f64) -> LimitDecision {
        LimitDecision {
            job_id: job.into(),
            category: Category::New,
            growth_efficiency: None,
            limit,
        }
    }

    #[test]
    fn limits_map_to_cores_within_capacity_and_floor() {
        // Half of a 2-core worker.
        assert_eq!(limit_to_cpus(0.5, 0.25, 2.0), 1.0);
        // Above the worker: the whole worker, never more.
        assert_eq!(limit_to_cpus(1.7, 0.25, 2.0), 2.0);
        // Below FlowCon's lower bound: the bound.
        assert_eq!(limit_to_cpus(0.01, 0.25, 2.0), 0.5);
        // Not a number: no limit (the whole worker).
        assert_eq!(limit_to_cpus(f64::NAN, 0.25, 2.0), 2.0);
        // Docker's smallest quota wins over a tinier bound on a tiny worker.
        assert_eq!(limit_to_cpus(0.0, 0.0, 0.02), MIN_CPUS);
    }

    #[test]
    fn limits_that_leave_the_worker_idle_are_scaled_up_keeping_their_ratios() {
        // Three jobs at FlowCon's floor 1/6 on a 1-core worker would use half of it.
        let mut cpus = vec![1.0 / 6.0; 3];
        work_conserving(&mut cpus, 1.0);
        for c in &cpus {
            assert!((c - 1.0 / 3.0).abs() < 1e-12, "{cpus:?}");
        }
        // A newcomer at 0.5 beside a completing job at 0.125: 4:1 kept, the worker covered.
        let mut cpus = vec![0.5, 0.125];
        work_conserving(&mut cpus, 1.0);
        assert!(
            (cpus[0] - 0.8).abs() < 1e-12 && (cpus[1] - 0.2).abs() < 1e-12,
            "{cpus:?}"
        );
        // Limits that already cover the worker are left alone (the paper's 1 + 0.25).
        let mut cpus = vec![1.0, 0.25];
        work_conserving(&mut cpus, 1.0);
        assert_eq!(cpus, vec![1.0, 0.25]);
        // A lone job gets the whole worker, never more.
        let mut cpus = vec![0.3];
        work_conserving(&mut cpus, 2.0);
        assert_eq!(cpus, vec![2.0]);
    }

    #[test]
    fn a_round_is_mapped_then_made_work_conserving() {
        // The paper's example on a 2-core worker: a newcomer (1) beside a completing job held
        // at 1/(2·2) = 0.25 already covers the worker: 2 and 0.5 cores.
        let limits = [decision("new", 1.0), decision("old", 0.1)];
        assert_eq!(cpu_quotas(&limits, 0.25, 2.0), vec![2.0, 0.5]);
        // Three jobs all at the floor 1/6 of a 1-core worker share it evenly.
        let limits = [
            decision("a", 0.0),
            decision("b", 1.0 / 6.0),
            decision("c", 0.1),
        ];
        for c in cpu_quotas(&limits, 1.0 / 6.0, 1.0) {
            assert!((c - 1.0 / 3.0).abs() < 1e-12, "{c}");
        }
        assert!(cpu_quotas(&[], 0.5, 1.0).is_empty());
    }

    #[test]
    fn requested_cores_are_clamped_to_the_worker() {
        assert_eq!(clamp_cpus(4.0, 2.0), 2.0);
        assert_eq!(clamp_cpus(0.5, 2.0), 0.5);
        assert_eq!(clamp_cpus(0.0, 2.0), 2.0);
        assert_eq!(clamp_cpus(f64::NAN, 1.5), 1.5);
        assert_eq!(clamp_cpus(0.001, 2.0), MIN_CPUS);
    }

    proptest! {
        #[test]
        fn mapped_limits_never_exceed_capacity_nor_fall_below_the_bound(
            limit in prop_oneof![any::<f64>(), -1.0..2.0f64],
            beta in 1.0..8.0f64,
            n in 1usize..40,
            capacity in 0.01..64.0f64,
        ) {
            let floor = 1.0 / (beta * n as f64);
            let cpus = limit_to_cpus(limit, floor, capacity);
            prop_assert!(cpus <= capacity + 1e-12, "{cpus} > {capacity}");
            prop_assert!(cpus >= (floor * capacity).min(capacity) - 1e-12, "{cpus} < floor");
            prop_assert!(cpus >= MIN_CPUS - 1e-12);
        }

        /// Whatever the limits, a round's quotas stay within the worker, above the bound, keep
        /// the order of the limits, and cover the worker once they are scaled.
        #[test]
        fn round_quotas_stay_in_bounds_and_cover_the_worker(
            limits in prop::collection::vec(0.0..1.0f64, 1..12),
            beta in 1.0..4.0f64,
            capacity in 0.05..16.0f64,
        ) {
            let floor = 1.0 / (beta * limits.len() as f64);
            let decisions: Vec<LimitDecision> =
                limits.iter().map(|&l| decision("j", l)).collect();
            let cpus = cpu_quotas(&decisions, floor, capacity);
            prop_assert_eq!(cpus.len(), limits.len());
            for c in &cpus {
                prop_assert!(*c <= capacity + 1e-9);
                prop_assert!(*c >= (floor * capacity).max(MIN_CPUS).min(capacity) - 1e-9);
            }
            let total: f64 = cpus.iter().sum();
            prop_assert!(total >= capacity - 1e-9, "{total} < {capacity}");
        }
    }
}
