//! The exact outcome of a static plan: the fitness of the GA baseline (value-based-allocation
//! .txt:100-102), where the whole workload is known in advance and each container is given a node
//! (or rejected) and a CPU share once, at its release.
//!
//! Unlike [`super::completion_offsets`], which predicts from one instant with no further
//! arrivals, this plays the whole plan: containers join their node at release and share it by
//! weighted processor sharing (:59) until they finish. Per node this is a virtual-time
//! simulation (as in weighted fair queueing): every running container's work per unit share
//! grows at `speed/Ξ` per second, so a container finishes when that virtual time reaches its
//! start tag plus `ET_j/ξ_j`. O(m log m) per node of m containers.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use serde::{Deserialize, Serialize};

use super::ValueCurve;
use super::model::clamp_shares;
use crate::Ranked;

/// One container of a static workload.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OfflineJob {
    /// AT_j.
    pub release: f64,
    /// ET_j, reference seconds.
    pub work: f64,
    /// VC_j.
    pub curve: ValueCurve,
}

/// Completion time of every job under `plan` (`plan[j] = Some((node, shares))` or `None` for
/// rejected) on nodes of the given speeds; `None` for rejected jobs. Jobs on a node with an
/// index out of range are treated as rejected.
pub fn offline_completions(
    speeds: &[f64],
    jobs: &[OfflineJob],
    plan: &[Option<(usize, u32)>],
) -> Vec<Option<f64>> {
    let mut out = vec![None; jobs.len()];
    let mut per_node: Vec<Vec<usize>> = vec![Vec::new(); speeds.len()];
    for (j, p) in plan.iter().enumerate().take(jobs.len()) {
        if let Some((n, _)) = p
            && *n < speeds.len()
        {
            per_node[*n].push(j);
        }
    }
    for (n, mut list) in per_node.into_iter().enumerate() {
        list.sort_by(|&a, &b| jobs[a].release.total_cmp(&jobs[b].release).then(a.cmp(&b)));
        let speed = speeds[n];
        let mut heap: BinaryHeap<Reverse<Ranked>> = BinaryHeap::new();
        // Virtual time (work per unit share done by every running container) and total share.
        let (mut v, mut w, mut t) = (0.0_f64, 0.0_f64, f64::NEG_INFINITY);
        let mut next = 0;
        loop {
            let arrival = list.get(next).map(|&j| jobs[j].release);
            let finish = heap
                .peek()
                .map(|Reverse(Ranked(f, _))| t + (f - v).max(0.0) * w / speed);
            match (arrival, finish) {
                (None, None) => break,
                (Some(a), f) if f.is_none_or(|f| a <= f) => {
                    if w > 0.0 {
                        v += (a - t) * speed / w;
                    }
                    t = a;
                    let j = list[next];
                    next += 1;
                    let s = f64::from(clamp_shares(plan[j].expect("planned").1));
                    heap.push(Reverse(Ranked(v + jobs[j].work.max(0.0) / s, j)));
                    w += s;
                }
                (_, Some(f)) => {
                    let Reverse(Ranked(tag, j)) = heap.pop().expect("peeked");
                    v = tag;
                    t = f;
                    out[j] = Some(f);
                    w -= f64::from(clamp_shares(plan[j].expect("planned").1));
                    if heap.is_empty() {
                        // Avoid drift: an idle node has no running share.
                        w = 0.0;
                    }
                }
                (Some(_), None) => unreachable!("an arrival with nothing running is taken above"),
            }
        }
    }
    out
}

/// Total value of `plan` (:88: `Σ V_j`, rejected jobs are worth 0).
pub fn offline_value(speeds: &[f64], jobs: &[OfflineJob], plan: &[Option<(usize, u32)>]) -> f64 {
    offline_completions(speeds, jobs, plan)
        .iter()
        .zip(jobs)
        .map(|(c, j)| c.map_or(0.0, |t| j.curve.value_at(t - j.release)))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(release: f64, work: f64) -> OfflineJob {
        OfflineJob {
            release,
            work,
            curve: ValueCurve::new(100.0, 300.0, 600.0).unwrap(),
        }
    }

    #[test]
    fn arrivals_share_the_node_by_weight() {
        // Reference node. j0 (300 s) alone from 0 to 100 (200 s left); j1 (100 s, equal
        // shares) joins at 100: both at 1/2, j1 done at 300; j0 has 100 s left, done at 400.
        let jobs = [job(0.0, 300.0), job(100.0, 100.0)];
        let c = offline_completions(&[1.0], &jobs, &[Some((0, 1024)), Some((0, 1024))]);
        assert!((c[0].unwrap() - 400.0).abs() < 1e-9, "{c:?}");
        assert!((c[1].unwrap() - 300.0).abs() < 1e-9, "{c:?}");
        // Values: j0 at 400 s: 100·200/300 = 66.7; j1 after 200 s: 100.
        let v = offline_value(&[1.0], &jobs, &[Some((0, 1024)), Some((0, 1024))]);
        assert!((v - (100.0 + 200.0 / 3.0)).abs() < 1e-9);
    }

    #[test]
    fn rejected_jobs_are_worth_nothing_and_gaps_idle_the_node() {
        let jobs = [job(0.0, 100.0), job(500.0, 150.0), job(10.0, 50.0)];
        let plan = [Some((1, 1)), Some((1, 1024)), None];
        let c = offline_completions(&[1.0, 1.5], &jobs, &plan);
        assert!((c[0].unwrap() - 100.0 / 1.5).abs() < 1e-9);
        assert!((c[1].unwrap() - 600.0).abs() < 1e-9);
        assert_eq!(c[2], None);
        assert!((offline_value(&[1.0, 1.5], &jobs, &plan) - 200.0).abs() < 1e-9);
    }

    #[test]
    fn matches_the_prediction_when_everyone_starts_together() {
        let jobs = [job(0.0, 300.0), job(0.0, 100.0), job(0.0, 50.0)];
        let plan = [Some((0, 100)), Some((0, 700)), Some((0, 5))];
        let c = offline_completions(&[1.2], &jobs, &plan);
        let p = super::super::completion_offsets(1.2, &[(300.0, 100), (100.0, 700), (50.0, 5)]);
        for (a, b) in c.iter().zip(p) {
            assert!((a.unwrap() - b).abs() < 1e-9);
        }
    }
}
