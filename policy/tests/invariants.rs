//! Property tests for the invariants the issue names: limits within bounds, no job migrated twice
//! by SpeCon's Alg. 2, rebalancing never targets a worker already at the balance factor, and the
//! same inputs always give the same decisions.

use converge_policy::Category;
use converge_policy::flowcon::{FlowCon, FlowConConfig, FlowConDecisions, Observation};
use converge_policy::growth::{Direction, Sample, Usage};
use converge_policy::specon::{
    JobObservation, MigrationReason, RebalanceCandidate, SpeCon, SpeConConfig, SpeConDecisions,
    WorkerLoad, rebalance_plan,
};
use proptest::prelude::*;
use std::collections::BTreeMap;

/// A scripted trace: per round, per job slot, (present, loss decrement, cpu use).
fn trace() -> impl Strategy<Value = Vec<Vec<(bool, f64, f64)>>> {
    prop::collection::vec(
        prop::collection::vec(
            (
                any::<bool>(),
                0.0f64..0.2,
                prop_oneof![Just(0.0), 0.01f64..2.0],
            ),
            1..7,
        ),
        1..20,
    )
}

fn run_flowcon(config: FlowConConfig, trace: &[Vec<(bool, f64, f64)>]) -> Vec<FlowConDecisions> {
    let mut f = FlowCon::new(config).unwrap();
    let mut loss: BTreeMap<usize, f64> = BTreeMap::new();
    let mut out = Vec::new();
    for (r, round) in trace.iter().enumerate() {
        let t = r as f64 * 10.0;
        let obs: Vec<Observation> = round
            .iter()
            .enumerate()
            .filter(|(_, (present, _, _))| *present)
            .map(|(i, &(_, dec, cpu))| {
                let l = loss.entry(i).or_insert(2.0);
                *l = (*l - dec).max(0.0);
                Observation {
                    job_id: format!("job-{i}"),
                    sample: Some(Sample { time: t, value: *l }),
                    initial_value: Some(2.0),
                    direction: Direction::Minimize,
                    usage: Usage::cpu(cpu),
                }
            })
            .collect();
        out.push(f.on_round(t, &obs));
    }
    out
}

proptest! {
    #[test]
    fn flowcon_limits_in_unit_interval_and_above_lower_bound(
        trace in trace(),
        alpha in 0.0f64..0.05,
        beta in 1.0f64..4.0,
        adaptive in any::<bool>(),
    ) {
        let config = FlowConConfig { alpha, beta, adaptive, ..FlowConConfig::default() };
        for d in run_flowcon(config, &trace) {
            let n = d.limits.len();
            for l in &d.limits {
                prop_assert!(l.limit > 0.0 && l.limit <= 1.0, "limit {} out of (0,1]", l.limit);
                prop_assert!(l.limit >= 1.0 / (beta * n as f64) - 1e-12,
                    "limit {} below 1/(β·n) = {}", l.limit, 1.0 / (beta * n as f64));
            }
        }
    }

    #[test]
    fn flowcon_same_inputs_same_decisions(trace in trace(), adaptive in any::<bool>()) {
        let config = FlowConConfig { alpha: 0.01, adaptive, ..FlowConConfig::default() };
        prop_assert_eq!(run_flowcon(config, &trace), run_flowcon(config, &trace));
    }

    #[test]
    fn specon_never_migrates_a_job_twice_by_alg2(
        workers in 1usize..6,
        jobs in prop::collection::vec((0usize..6, 0.0f64..0.05, 0.0f64..1.0), 1..14),
        rounds in 2usize..25,
        rebalance in any::<bool>(),
    ) {
        let decisions = run_specon(workers, &jobs, rounds, rebalance);
        let mut speculative: BTreeMap<String, usize> = BTreeMap::new();
        let mut rebalanced: BTreeMap<String, usize> = BTreeMap::new();
        for d in &decisions {
            for m in &d.migrations {
                prop_assert_ne!(m.from, m.to);
                let counter = match m.reason {
                    MigrationReason::Speculative => &mut speculative,
                    MigrationReason::Rebalance => &mut rebalanced,
                };
                *counter.entry(m.job_id.clone()).or_default() += 1;
            }
            // Kept (stay-put) answers count as the job's one Alg. 2 decision too.
            for k in &d.kept {
                *speculative.entry(k.clone()).or_default() += 1;
            }
        }
        prop_assert!(speculative.values().all(|&n| n <= 1), "{speculative:?}");
        prop_assert!(rebalanced.values().all(|&n| n <= 1), "{rebalanced:?}");
    }

    #[test]
    fn specon_same_inputs_same_decisions(
        workers in 1usize..6,
        jobs in prop::collection::vec((0usize..6, 0.0f64..0.05, 0.0f64..1.0), 1..14),
        rounds in 2usize..25,
    ) {
        prop_assert_eq!(run_specon(workers, &jobs, rounds, true), run_specon(workers, &jobs, rounds, true));
    }

    #[test]
    fn rebalancing_never_targets_a_worker_at_bf(
        counts in prop::collection::vec(0usize..10, 1..8),
        schedulable in prop::collection::vec(any::<bool>(), 8),
        cands in prop::collection::vec((0usize..8, 0.0f64..100.0), 0..20),
    ) {
        let schedulable = &schedulable[..counts.len()];
        let candidates: Vec<RebalanceCandidate> = cands
            .iter()
            .enumerate()
            .filter(|(_, (w, _))| *w < counts.len())
            .map(|(i, &(w, d))| RebalanceCandidate { job_id: format!("j{i}"), worker: w, converged_for: d })
            .collect();
        let (moves, bf) = rebalance_plan(&counts, schedulable, &candidates);
        let mut now = counts.clone();
        let mut seen = std::collections::BTreeSet::new();
        for (job, from, to) in moves {
            prop_assert!(now[to] < bf, "moved onto worker {to} holding {} >= bf {bf}", now[to]);
            prop_assert!(schedulable[to]);
            prop_assert!(now[from] > now[to] + 1, "a move must shrink the imbalance");
            prop_assert!(seen.insert(job), "a job moved twice in one plan");
            now[from] -= 1;
            now[to] += 1;
        }
    }
}

/// Jobs: (initial worker, per-round decay rate, noise seed in [0,1)).
fn run_specon(
    workers: usize,
    jobs: &[(usize, f64, f64)],
    rounds: usize,
    rebalance: bool,
) -> Vec<SpeConDecisions> {
    let mut s = SpeCon::new(SpeConConfig {
        alpha: 0.01,
        rebalance,
        ..SpeConConfig::default()
    })
    .unwrap();
    let loads: Vec<WorkerLoad> = (0..workers)
        .map(|i| WorkerLoad {
            resource_use: (i as f64 * 0.37) % 1.0,
            schedulable: true,
        })
        .collect();
    let mut at: Vec<usize> = jobs.iter().map(|j| j.0 % workers).collect();
    let mut out = Vec::new();
    for r in 0..rounds {
        let t = r as f64 * 30.0;
        let obs: Vec<JobObservation> = jobs
            .iter()
            .enumerate()
            // Jobs finish at different rounds so the cluster unbalances.
            .filter(|(i, _)| r < rounds - (i % 3))
            .map(|(i, &(_, rate, noise))| {
                let bounce = if (r + (noise * 10.0) as usize).is_multiple_of(4) {
                    0.002
                } else {
                    0.0
                };
                JobObservation {
                    job_id: format!("job-{i}"),
                    worker: at[i],
                    sample: Some(Sample {
                        time: t,
                        value: (-(rate * 3.0 + 0.01) * r as f64).exp() + bounce,
                    }),
                    initial_value: Some(1.0),
                    direction: Direction::Minimize,
                }
            })
            .collect();
        let d = s.on_round(t, &obs, &loads);
        for m in &d.migrations {
            let i: usize = m.job_id[4..].parse().unwrap();
            at[i] = m.to;
        }
        // Every job's category is one of the three.
        assert!(
            d.categories.iter().all(|(_, c)| matches!(
                c,
                Category::New | Category::Watching | Category::Completing
            ))
        );
        out.push(d);
    }
    out
}
