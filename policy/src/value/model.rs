//! The system model of value-based-allocation.txt §III: expected execution times under CPU
//! shares and calibration (:57-59, :74), expected values, β_i (Eq. 1, :76-80), the overload test
//! (Eq. 2, :82-86), and the victim criteria of DwP (:112-114, :152).

use serde::{Deserialize, Serialize};

use super::{Container, MAX_SHARES, MIN_SHARES, NodeState, ValueCurve};

/// A CPU share as the model uses it (paper :59: ξ_j ∈ {1, …, 1024}).
pub(crate) fn clamp_shares(shares: u32) -> u32 {
    shares.clamp(MIN_SHARES, MAX_SHARES)
}

/// The CPU shares DwoP and DwP examine with `stride` (:106, :161): `1, 1+stride, … ≤ 1024`.
/// Stride 1 gives all 1024 values, stride 18 the paper's 57. A stride of 0 is taken as 1.
pub fn share_candidates(stride: u32) -> impl Iterator<Item = u32> + Clone {
    (MIN_SHARES..=MAX_SHARES).step_by(stride.max(1) as usize)
}

/// Expected completion offsets (seconds from now) of containers sharing a node of `speed`
/// (= 1/ζ_i) by weighted processor sharing (module doc): `work[k] = (r_k, ξ_k)` with `r_k` the
/// remaining work in reference seconds. Paper :59 (share ξ_j/Ξ_i), :74 (EET).
///
/// Sorted by `x = r/ξ`, the k-th container finishes after `Σ_{l≤k} (x_l − x_{l−1})·W_l/speed`,
/// `W_l` the shares of the containers still running in phase l. Returned in input order.
pub fn completion_offsets(speed: f64, work: &[(f64, u32)]) -> Vec<f64> {
    let mut order: Vec<(f64, f64, usize)> = work
        .iter()
        .enumerate()
        .map(|(i, &(r, s))| {
            let w = f64::from(clamp_shares(s));
            (r.max(0.0) / w, w, i)
        })
        .collect();
    order.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.2.cmp(&b.2)));
    let mut left: f64 = order.iter().map(|o| o.1).sum();
    let mut out = vec![0.0; work.len()];
    let (mut c, mut prev) = (0.0, 0.0);
    for (x, w, i) in order {
        c += (x - prev) * left / speed;
        prev = x;
        out[i] = c;
        left -= w;
    }
    out
}

/// What the model expects of one running container.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Expectation {
    /// Expected completion, absolute time.
    pub completion_at: f64,
    /// `V_j = VC_j(completion − AT_j)` (:74).
    pub value: f64,
}

/// The expected completion and value of every container on `node` at `now`, in container order;
/// `None` for paused containers (they use no CPU and are not predicted). Paper :74, :76.
pub fn expected_values(now: f64, node: &NodeState) -> Vec<Option<Expectation>> {
    let running: Vec<usize> = (0..node.containers.len())
        .filter(|&i| !node.containers[i].paused)
        .collect();
    let work: Vec<(f64, u32)> = running
        .iter()
        .map(|&i| {
            let c = &node.containers[i];
            (c.remaining_s, c.shares)
        })
        .collect();
    let offsets = completion_offsets(node.speed, &work);
    let mut out = vec![None; node.containers.len()];
    for (&i, c) in running.iter().zip(offsets) {
        let job = &node.containers[i].job;
        out[i] = Some(Expectation {
            completion_at: now + c,
            value: job.value_if_done_at(now + c),
        });
    }
    out
}

/// β_i (Eq. 1, :76-80): the expected values of the node's running containers over the sum of
/// their maximum values; 0 for a node with none. In [0, 1] because `0 <= V_j <= Vmax_j`.
pub fn beta(now: f64, node: &NodeState) -> f64 {
    let (mut v, mut vmax) = (0.0, 0.0);
    for (c, e) in node.containers.iter().zip(expected_values(now, node)) {
        if let Some(e) = e {
            v += e.value;
            vmax += c.job.curve.max_value;
        }
    }
    if vmax > 0.0 {
        (v / vmax).clamp(0.0, 1.0)
    } else {
        0.0
    }
}

/// Eq. 2 (:82-84): a node is overloaded when `β_i < λ`.
pub fn is_overloaded(beta: f64, lambda: f64) -> bool {
    beta < lambda
}

/// The most `container` can still be worth: its curve at the completion it would reach alone on
/// a node of `speed` from `now` (`VC_j(now + r_j·ζ_i − AT_j)`). The *minimal remaining value*
/// criterion ranks by it; a job for which it is 0 is dropped (:65).
pub fn best_value(now: f64, container: &Container, speed: f64) -> f64 {
    let alone = container.remaining_s.max(0.0) / speed;
    container.job.value_if_done_at(now + alone)
}

/// How DwP picks the one victim on an overloaded node (:112-114, :152; module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VictimCriterion {
    /// The lowest expected value `V_j` under the node's current sharing (:114).
    LowestExpectedValue,
    /// LVD: the lowest `V_j` per second of the node it still needs alone, `V_j/(r_j·ζ_i)`
    /// (:114, :152).
    LowestValueDensity,
    /// MRV: the lowest value it could still earn, alone on the node from now ([`best_value`])
    /// (:114, :152; the paper's main run).
    MinimalRemainingValue,
}

impl VictimCriterion {
    /// A short name for reasons and tables.
    pub fn name(self) -> &'static str {
        match self {
            VictimCriterion::LowestExpectedValue => "lowest expected value",
            VictimCriterion::LowestValueDensity => "lowest value density",
            VictimCriterion::MinimalRemainingValue => "minimal remaining value",
        }
    }
}

/// The victim `criterion` names among the running containers of `node` at `now` (container
/// index), or `None` when nothing runs. Ties go to the smaller job id. Paper :112-114.
pub fn select_victim(now: f64, node: &NodeState, criterion: VictimCriterion) -> Option<usize> {
    let expected = expected_values(now, node);
    let score = |i: usize| -> f64 {
        let c = &node.containers[i];
        let v = expected[i].map_or(0.0, |e| e.value);
        match criterion {
            VictimCriterion::LowestExpectedValue => v,
            VictimCriterion::LowestValueDensity => {
                let need = c.remaining_s.max(0.0) / node.speed;
                // A container about to finish needs no time: never the victim.
                if need > 0.0 { v / need } else { f64::INFINITY }
            }
            VictimCriterion::MinimalRemainingValue => best_value(now, c, node.speed),
        }
    };
    (0..node.containers.len())
        .filter(|&i| expected[i].is_some() && !node.containers[i].pinned)
        .map(|i| (score(i), i))
        .min_by(|a, b| {
            a.0.total_cmp(&b.0).then_with(|| {
                node.containers[a.1]
                    .job
                    .id
                    .cmp(&node.containers[b.1].job.id)
            })
        })
        .map(|(_, i)| i)
}

/// One running container in the allocator's inner loop.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Slot<'a> {
    /// `r/ξ`: the order in which containers finish.
    pub x: f64,
    /// ξ as a float.
    pub w: f64,
    /// AT_j.
    pub release: f64,
    /// VC_j.
    pub curve: &'a ValueCurve,
}

impl<'a> Slot<'a> {
    pub(crate) fn new(remaining: f64, shares: u32, release: f64, curve: &'a ValueCurve) -> Self {
        let w = f64::from(clamp_shares(shares));
        Slot {
            x: remaining.max(0.0) / w,
            w,
            release,
            curve,
        }
    }
}

/// A node's running containers sorted by finishing order, evaluated many times per decision
/// (every CPU share × with/without victim) without allocating.
#[derive(Debug, Clone)]
pub(crate) struct NodeModel<'a> {
    pub speed: f64,
    /// Sorted by `x`, then by container index.
    pub slots: Vec<Slot<'a>>,
    /// `slots[k]` is `node.containers[index[k]]`.
    pub index: Vec<usize>,
    total_w: f64,
}

/// The outcome of one evaluation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Outcome {
    /// Sum of the expected values of the node's containers (the skipped one excluded).
    pub existing_value: f64,
    /// Sum of their expected completion offsets.
    pub existing_flow: f64,
    /// The extra container's expected value (0 without one).
    pub extra_value: f64,
    /// Its expected completion offset.
    pub extra_flow: f64,
}

impl<'a> NodeModel<'a> {
    pub(crate) fn new(node: &'a NodeState) -> Self {
        let mut pairs: Vec<(Slot<'a>, usize)> = node
            .containers
            .iter()
            .enumerate()
            .filter(|(_, c)| !c.paused)
            .map(|(i, c)| {
                (
                    Slot::new(c.remaining_s, c.shares, c.job.released_at, &c.job.curve),
                    i,
                )
            })
            .collect();
        pairs.sort_by(|a, b| a.0.x.total_cmp(&b.0.x).then(a.1.cmp(&b.1)));
        let total_w = pairs.iter().map(|p| p.0.w).sum();
        NodeModel {
            speed: node.speed,
            slots: pairs.iter().map(|p| p.0).collect(),
            index: pairs.iter().map(|p| p.1).collect(),
            total_w,
        }
    }

    /// Weighted processor sharing over the slots (minus `skip`, a slot position) plus `extra`,
    /// from `now`. Calls `each(slot position, completion offset, value)` for the slots when
    /// given. O(slots).
    pub(crate) fn evaluate(
        &self,
        now: f64,
        extra: Option<&Slot<'_>>,
        skip: Option<usize>,
        mut each: Option<&mut dyn FnMut(usize, f64, f64)>,
    ) -> Outcome {
        // Phase k lasts (x_k − x_{k−1})·W_k/speed, W_k the shares still running in it.
        let mut left =
            self.total_w - skip.map_or(0.0, |k| self.slots[k].w) + extra.map_or(0.0, |e| e.w);
        let (mut c, mut prev) = (0.0, 0.0);
        let mut out = Outcome {
            existing_value: 0.0,
            existing_flow: 0.0,
            extra_value: 0.0,
            extra_flow: 0.0,
        };
        let mut pending = extra;
        let mut step = |s: &Slot<'_>, left: &mut f64| -> (f64, f64) {
            c += (s.x - prev) * *left / self.speed;
            prev = s.x;
            *left -= s.w;
            (c, s.curve.value_at(now + c - s.release))
        };
        for (k, s) in self.slots.iter().enumerate() {
            if Some(k) == skip {
                continue;
            }
            if let Some(e) = pending.take_if(|e| e.x < s.x) {
                (out.extra_flow, out.extra_value) = step(e, &mut left);
            }
            let (ck, v) = step(s, &mut left);
            out.existing_value += v;
            out.existing_flow += ck;
            if let Some(f) = each.as_mut() {
                f(k, ck, v);
            }
        }
        if let Some(e) = pending {
            (out.extra_flow, out.extra_value) = step(e, &mut left);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::{ValueCurve, ValueJob};

    pub(crate) fn container(id: &str, remaining: f64, shares: u32, curve: ValueCurve) -> Container {
        Container {
            job: ValueJob {
                id: id.into(),
                released_at: 0.0,
                estimated_s: remaining,
                curve,
            },
            shares,
            remaining_s: remaining,
            paused: false,
            pinned: false,
        }
    }

    fn node(speed: f64, containers: Vec<Container>) -> NodeState {
        NodeState {
            id: "worker-1".into(),
            speed,
            schedulable: true,
            containers,
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn equal_shares_split_then_the_survivor_gets_the_node() {
        // 100 s and 300 s of reference work, equal shares, reference node: both run at 1/2
        // until the short one finishes at 200 s (100 s of work each); the long one has 200 s
        // left, alone: done at 400 s.
        let c = completion_offsets(1.0, &[(300.0, 1024), (100.0, 1024)]);
        assert!(close(c[0], 400.0) && close(c[1], 200.0), "{c:?}");
    }

    #[test]
    fn shares_weight_the_split_and_calibration_scales_time() {
        // Shares 3:1, 300 s each, on a node 50% faster (ζ = 2/3). Phase 1: the heavy one does
        // 300 s of work at 3/4 · 1.5 = 1.125 per s: 266.67 s; meanwhile the light one does
        // 266.67 · 0.375 = 100 s. Phase 2: its 200 s alone at 1.5 per s: 133.33 s more.
        let c = completion_offsets(1.5, &[(300.0, 768), (300.0, 256)]);
        assert!(close(c[0], 800.0 / 3.0), "{c:?}");
        assert!(close(c[1], 400.0), "{c:?}");
    }

    #[test]
    fn alone_the_expected_time_is_et_times_zeta() {
        // Paper :57: ζ is a time ratio; a 50%-faster node has ζ = 2/3.
        let n = node(1.5, vec![]);
        assert!(close(n.zeta(), 2.0 / 3.0));
        for shares in [1, 512, 1024] {
            let c = completion_offsets(1.5, &[(600.0, shares)]);
            assert!(close(c[0], 400.0));
        }
    }

    #[test]
    fn paper_example_beta_is_0_6_and_overloaded_at_0_7() {
        // value-based-allocation.txt:86: Vmax 100 and 50, expected 50 and 40 -> β = 0.6;
        // overloaded at λ = 0.7. 50 s and 125 s of work at equal shares on a reference node:
        // C1 is done at 100 s (both at half speed), C2 at 100 + 75 = 175 s.
        // C1: Vmax 100, full until 50, zero at 150 -> at 100 s: 100·50/100 = 50.
        // C2: Vmax 50, full until 150, zero at 275 -> at 175 s: 50·100/125 = 40.
        let n = node(
            1.0,
            vec![
                container(
                    "c1",
                    50.0,
                    1024,
                    ValueCurve::new(100.0, 50.0, 150.0).unwrap(),
                ),
                container(
                    "c2",
                    125.0,
                    1024,
                    ValueCurve::new(50.0, 150.0, 275.0).unwrap(),
                ),
            ],
        );
        let e = expected_values(0.0, &n);
        assert!(close(e[0].unwrap().completion_at, 100.0));
        assert!(close(e[1].unwrap().completion_at, 175.0));
        assert!(close(e[0].unwrap().value, 50.0));
        assert!(close(e[1].unwrap().value, 40.0));
        let b = beta(0.0, &n);
        assert!(close(b, 0.6), "{b}");
        assert!(is_overloaded(b, 0.7));
        assert!(!is_overloaded(b, 0.5));
    }

    #[test]
    fn beta_of_an_empty_node_is_zero_and_paused_containers_do_not_count() {
        assert_eq!(beta(0.0, &node(1.0, vec![])), 0.0);
        let mut p = container("p", 10.0, 1024, ValueCurve::new(100.0, 1.0, 2.0).unwrap());
        p.paused = true;
        let ok = container(
            "ok",
            10.0,
            1024,
            ValueCurve::new(100.0, 50.0, 60.0).unwrap(),
        );
        let n = node(1.0, vec![p, ok]);
        assert_eq!(beta(0.0, &n), 1.0);
        assert_eq!(expected_values(0.0, &n)[0], None);
    }

    /// Three running containers on a reference node, equal shares, now = 0, released at 0:
    /// - a: 100 s of work, Vmax 100, full until 120, zero at 900: done at 3 × 100 = 300 s,
    ///   V = 100·600/780 ≈ 76.9.
    /// - b: 200 s, Vmax 100, full until 400, zero at 1000: done at 300 + 2 × 100 = 500 s,
    ///   V = 100·500/600 ≈ 83.3.
    /// - c: 300 s, Vmax 50, full until 600, zero at 700: done at 500 + 100 = 600 s, V = 50.
    fn three() -> NodeState {
        node(
            1.0,
            vec![
                container(
                    "a",
                    100.0,
                    1024,
                    ValueCurve::new(100.0, 120.0, 900.0).unwrap(),
                ),
                container(
                    "b",
                    200.0,
                    1024,
                    ValueCurve::new(100.0, 400.0, 1000.0).unwrap(),
                ),
                container(
                    "c",
                    300.0,
                    1024,
                    ValueCurve::new(50.0, 600.0, 700.0).unwrap(),
                ),
            ],
        )
    }

    #[test]
    fn three_containers_expected_as_computed_by_hand() {
        let e = expected_values(0.0, &three());
        let got: Vec<(f64, f64)> = e
            .iter()
            .map(|x| (x.unwrap().completion_at, x.unwrap().value))
            .collect();
        assert!(close(got[0].0, 300.0) && close(got[0].1, 100.0 * 600.0 / 780.0));
        assert!(close(got[1].0, 500.0) && close(got[1].1, 100.0 * 500.0 / 600.0));
        assert!(close(got[2].0, 600.0) && close(got[2].1, 50.0));
    }

    #[test]
    fn each_criterion_picks_the_victim_it_names() {
        // Lowest expected value vs lowest density vs minimal remaining value, on one node
        // (reference speed, now = 0, all released at 0, equal shares):
        // - x: 10 s of work, Vmax 100, full until 5, zero at 40. Done first, at 30 s (3 × 10):
        //   V = 100·10/35 ≈ 28.6 (lowest expected value); density 28.6/10 = 2.86; alone done
        //   at 10 s: 100·30/35 ≈ 85.7.
        // - z: 50 s, Vmax 60, full until 1000, zero at 2000: done at 30 + 2·40 = 110 s, V = 60;
        //   density 60/50 = 1.2; alone done at 50 s: 60 (minimal remaining value).
        // - y: 400 s, Vmax 100, full until 2000, zero at 3000: done at 110 + 350 = 460 s,
        //   V = 100; density 100/400 = 0.25 (lowest density); alone: 100.
        let n = node(
            1.0,
            vec![
                container("x", 10.0, 1024, ValueCurve::new(100.0, 5.0, 40.0).unwrap()),
                container(
                    "y",
                    400.0,
                    1024,
                    ValueCurve::new(100.0, 2000.0, 3000.0).unwrap(),
                ),
                container(
                    "z",
                    50.0,
                    1024,
                    ValueCurve::new(60.0, 1000.0, 2000.0).unwrap(),
                ),
            ],
        );
        let e = expected_values(0.0, &n);
        assert!(close(e[0].unwrap().completion_at, 30.0));
        assert!(close(e[0].unwrap().value, 100.0 * 10.0 / 35.0));
        assert!(close(e[1].unwrap().value, 100.0));
        assert!(close(e[2].unwrap().value, 60.0));
        assert!(close(
            best_value(0.0, &n.containers[0], 1.0),
            100.0 * 30.0 / 35.0
        ));
        assert_eq!(
            select_victim(0.0, &n, VictimCriterion::LowestExpectedValue),
            Some(0)
        );
        assert_eq!(
            select_victim(0.0, &n, VictimCriterion::LowestValueDensity),
            Some(1)
        );
        assert_eq!(
            select_victim(0.0, &n, VictimCriterion::MinimalRemainingValue),
            Some(2)
        );
    }

    #[test]
    fn victims_are_running_containers_and_ties_go_to_the_smaller_id() {
        let curve = ValueCurve::new(100.0, 1000.0, 2000.0).unwrap();
        let mut paused = container("a", 10.0, 1024, ValueCurve::new(1.0, 0.0, 1.0).unwrap());
        paused.paused = true;
        let n = node(
            1.0,
            vec![
                paused,
                container("c", 10.0, 1024, curve),
                container("b", 10.0, 1024, curve),
            ],
        );
        for k in [
            VictimCriterion::LowestExpectedValue,
            VictimCriterion::LowestValueDensity,
            VictimCriterion::MinimalRemainingValue,
        ] {
            assert_eq!(select_victim(0.0, &n, k), Some(2), "{k:?}");
        }
        assert_eq!(
            select_victim(0.0, &node(1.0, vec![]), VictimCriterion::LowestValueDensity),
            None
        );
        // A pinned one (still starting: it cannot be paused) is passed over for the next.
        let mut n = n;
        n.containers[2].pinned = true;
        assert_eq!(
            select_victim(0.0, &n, VictimCriterion::LowestExpectedValue),
            Some(1)
        );
        n.containers[1].pinned = true;
        assert_eq!(
            select_victim(0.0, &n, VictimCriterion::LowestExpectedValue),
            None
        );
    }

    #[test]
    fn stride_18_examines_the_papers_57_shares() {
        assert_eq!(share_candidates(1).count(), 1024);
        let s: Vec<u32> = share_candidates(18).collect();
        assert_eq!(s.len(), 57);
        assert_eq!((s[0], s[1], *s.last().unwrap()), (1, 19, 1009));
        assert_eq!(share_candidates(0).count(), 1024);
    }

    #[test]
    fn node_model_matches_completion_offsets_with_extra_and_skip() {
        let n = three();
        let m = NodeModel::new(&n);
        let curve = ValueCurve::new(100.0, 50.0, 500.0).unwrap();
        let extra = Slot::new(150.0, 300, 0.0, &curve);
        // Skip b (slot 1 in x-order: a=100/1024, b=200/1024, c=300/1024).
        assert_eq!(m.index, vec![0, 1, 2]);
        let mut seen = Vec::new();
        let o = m.evaluate(
            0.0,
            Some(&extra),
            Some(1),
            Some(&mut |k, c, _v| seen.push((k, c))),
        );
        let c = completion_offsets(1.0, &[(100.0, 1024), (300.0, 1024), (150.0, 300)]);
        assert_eq!(seen.len(), 2);
        assert!(close(seen[0].1, c[0]) && close(seen[1].1, c[1]));
        assert!(close(o.extra_flow, c[2]));
        assert!(close(o.extra_value, curve.value_at(c[2])));
        assert!(close(o.existing_flow, c[0] + c[1]));
    }
}
