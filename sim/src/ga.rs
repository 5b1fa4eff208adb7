//! The value-based allocation paper's offline baseline: a genetic algorithm over static plans
//! (value-based-allocation.txt:100-102).
//!
//! A chromosome holds, per container, a node-or-reject gene `N_{C_j} ∈ {∅, N_1, …, N_k}` and a
//! CPU-share gene `ξ_j ∈ {1, …, 1024}` (:102; we keep each container's two genes side by side
//! rather than in two halves, which changes nothing but the indexing). Its fitness is the exact
//! total value of running the plan ([`offline_value`]): every container joins its node at its
//! release, with full knowledge of the workload. The paper gives no operators or sizes; ours:
//! - initial population: one Spread-like plan (round-robin, share 1024, nobody rejected), the
//!   rest random, each random chromosome drawing its own rejection probability uniformly in
//!   [0, 1] so that heavy and light workloads both start from some sensible density;
//! - tournament selection of 3, uniform crossover per container (rate 0.9), per-gene mutation
//!   with probability 1/n (a fresh random node-or-reject, a fresh random share), two elites;
//! - a fixed number of generations (the paper: "finding the right termination criterion is
//!   problematic", :150).
//!
//! Deterministic given the generator passed in; it lives in the simulator because only the
//! simulator (with the whole workload in hand) can run it.

use converge_policy::value::{MAX_SHARES, MIN_SHARES, OfflineJob, offline_value};
use rand::Rng;
use serde::{Deserialize, Serialize};

/// The GA's sizes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GaConfig {
    /// Chromosomes per generation (at least 2).
    pub population: usize,
    /// Generations after the initial one.
    pub generations: usize,
}

const ELITES: usize = 2;
const TOURNAMENT: usize = 3;
const CROSSOVER: f64 = 0.9;

/// Per container: node index (`k` = rejected) and CPU share.
type Chromosome = Vec<(u32, u32)>;

/// A static plan: `Some((node, shares))` or `None` (rejected) per job.
pub type Plan = Vec<Option<(usize, u32)>>;

fn decode(c: &Chromosome, k: usize) -> Plan {
    c.iter()
        .map(|&(n, s)| ((n as usize) < k).then_some((n as usize, s)))
        .collect()
}

/// Runs the GA for `jobs` on nodes of `speeds`; returns the best plan found and its value.
pub fn plan<R: Rng>(
    speeds: &[f64],
    jobs: &[OfflineJob],
    config: GaConfig,
    rng: &mut R,
) -> (Plan, f64) {
    let (n, k) = (jobs.len(), speeds.len());
    if n == 0 || k == 0 {
        return (vec![None; n], 0.0);
    }
    let size = config.population.max(ELITES + 1);
    let fitness = |c: &Chromosome| offline_value(speeds, jobs, &decode(c, k));
    let mut pop: Vec<(Chromosome, f64)> = Vec::with_capacity(size);
    let spread: Chromosome = (0..n).map(|j| ((j % k) as u32, MAX_SHARES)).collect();
    let f = fitness(&spread);
    pop.push((spread, f));
    while pop.len() < size {
        let p_reject: f64 = rng.random();
        let c: Chromosome = (0..n)
            .map(|_| {
                let node = if rng.random::<f64>() < p_reject {
                    k
                } else {
                    rng.random_range(0..k)
                };
                (node as u32, rng.random_range(MIN_SHARES..=MAX_SHARES))
            })
            .collect();
        let f = fitness(&c);
        pop.push((c, f));
    }
    let mutation = 1.0 / n as f64;
    for _ in 0..config.generations {
        // Best first; the sort is stable, so equal fitness keeps the older order.
        pop.sort_by(|a, b| b.1.total_cmp(&a.1));
        let mut next: Vec<(Chromosome, f64)> = pop[..ELITES].to_vec();
        while next.len() < size {
            let a = tournament(&pop, rng);
            let b = tournament(&pop, rng);
            let mut child = pop[a].0.clone();
            if rng.random::<f64>() < CROSSOVER {
                for (g, other) in child.iter_mut().zip(&pop[b].0) {
                    if rng.random::<bool>() {
                        *g = *other;
                    }
                }
            }
            for g in &mut child {
                if rng.random::<f64>() < mutation {
                    g.0 = rng.random_range(0..=k) as u32;
                }
                if rng.random::<f64>() < mutation {
                    g.1 = rng.random_range(MIN_SHARES..=MAX_SHARES);
                }
            }
            let f = fitness(&child);
            next.push((child, f));
        }
        pop = next;
    }
    let best = pop
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.1.total_cmp(&b.1.1).then(b.0.cmp(&a.0)))
        .map(|(i, _)| i)
        .expect("non-empty population");
    (decode(&pop[best].0, k), pop[best].1)
}

/// The index of the fittest of `TOURNAMENT` random chromosomes.
fn tournament<R: Rng>(pop: &[(Chromosome, f64)], rng: &mut R) -> usize {
    let mut best = rng.random_range(0..pop.len());
    for _ in 1..TOURNAMENT {
        let c = rng.random_range(0..pop.len());
        if pop[c].1 > pop[best].1 {
            best = c;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use converge_policy::value::ValueCurve;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn jobs() -> Vec<OfflineJob> {
        // Six 100-s jobs released together, worth 100 only if done within 150 s (0 from 151 s),
        // on two reference nodes: a node cannot finish two in 150 s, so the optimum is 200 (one
        // job per node on time; the others rejected or given tiny shares). Spread (three per
        // node, equal shares: all done at 300 s) gets 0.
        (0..6)
            .map(|_| OfflineJob {
                release: 0.0,
                work: 100.0,
                curve: ValueCurve::new(100.0, 150.0, 151.0).unwrap(),
            })
            .collect()
    }

    #[test]
    fn finds_better_than_spread_and_is_deterministic() {
        let cfg = GaConfig {
            population: 20,
            generations: 30,
        };
        let (p1, v1) = plan(&[1.0, 1.0], &jobs(), cfg, &mut ChaCha8Rng::seed_from_u64(3));
        let (p2, v2) = plan(&[1.0, 1.0], &jobs(), cfg, &mut ChaCha8Rng::seed_from_u64(3));
        assert_eq!((p1.clone(), v1), (p2, v2));
        assert!(v1 >= 200.0 - 1e-9, "{v1}");
        assert!((offline_value(&[1.0, 1.0], &jobs(), &p1) - v1).abs() < 1e-9);
        for (_, s) in p1.iter().flatten() {
            assert!((MIN_SHARES..=MAX_SHARES).contains(s));
        }
    }
}
