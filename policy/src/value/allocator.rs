//! DwoP and DwP (value-based-allocation.txt:104-114): the greedy dynamic allocator, with
//! rejection, preemption, resumption and dropping. See the module doc of [`crate::value`] for the
//! decisions where the paper leaves a gap.

use serde::{Deserialize, Serialize};

use super::model::{
    NodeModel, Outcome, Slot, VictimCriterion, best_value, beta, clamp_shares, is_overloaded,
    select_victim, share_candidates,
};
use super::{Amount, Container, MAX_SHARES, NodeState, ValueJob};
use crate::error::{Error, Result};

/// Gains closer than this are equal (values are in the curves' units, typically 0..100).
const EPS: f64 = 1e-9;

/// What happens to a victim (:112: "suspended (using the docker pause command) or killed (using
/// the docker stop command)").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PreemptAction {
    /// `docker pause`: stays on its node using no CPU; resumed when capacity frees up there.
    Pause,
    /// `docker stop`: removed from the cluster; its value is lost.
    Stop,
}

/// DwP's parameters (:108-114).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PreemptionConfig {
    /// λ of Eq. 2, in (0, 1): a node with β_i < λ is overloaded.
    pub lambda: f64,
    /// How the one victim per overloaded node is chosen.
    pub criterion: VictimCriterion,
    /// Pause or stop the victim.
    pub action: PreemptAction,
}

impl Default for PreemptionConfig {
    /// The paper's main run (:148): λ = 0.5, minimal remaining value; pausing, so that a victim
    /// can still earn value later.
    fn default() -> Self {
        PreemptionConfig {
            lambda: 0.5,
            criterion: VictimCriterion::MinimalRemainingValue,
            action: PreemptAction::Pause,
        }
    }
}

/// The allocator's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ValueConfig {
    /// The CPU-share stride (:106): shares `1, 1+stride, … ≤ 1024` are examined.
    pub stride: u32,
    /// `None`: DwoP (:106). `Some`: DwP (:108-114).
    pub preemption: Option<PreemptionConfig>,
}

impl Default for ValueConfig {
    /// DwP as the paper's main run, stride 1.
    fn default() -> Self {
        ValueConfig {
            stride: 1,
            preemption: Some(PreemptionConfig::default()),
        }
    }
}

impl ValueConfig {
    /// Dynamic allocation without preemption with `stride`.
    pub fn dwop(stride: u32) -> Self {
        ValueConfig {
            stride,
            preemption: None,
        }
    }

    /// Dynamic allocation with preemption with `stride`.
    pub fn dwp(stride: u32, preemption: PreemptionConfig) -> Self {
        ValueConfig {
            stride,
            preemption: Some(preemption),
        }
    }

    /// Checks the parameters.
    pub fn validate(&self) -> Result<()> {
        if !(1..MAX_SHARES).contains(&self.stride) {
            return Err(Error::InvalidParameter {
                name: "stride",
                value: f64::from(self.stride),
                expected: "a CPU-share stride in 1..=1023",
            });
        }
        if let Some(p) = self.preemption
            && !(p.lambda > 0.0 && p.lambda < 1.0)
        {
            return Err(Error::InvalidParameter {
                name: "lambda",
                value: p.lambda,
                expected: "an overload threshold λ in (0, 1) (Eq. 2)",
            });
        }
        Ok(())
    }
}

/// A container preempted to make room (:112).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Preemption {
    /// The victim's job id.
    pub job: String,
    /// Its node (index into the `nodes` slice).
    pub node: usize,
    /// Pause or stop it.
    pub action: PreemptAction,
    /// For the user, e.g. "preempted for job j-7: minimal remaining value on worker-2 (β 0.41
    /// < λ 0.5)".
    pub reason: String,
}

/// The answer to an arrival.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ValueDecision {
    /// Run the job on `nodes[node]` with `cpu_shares`, after preempting `victims` (at most one,
    /// on the same node).
    Place {
        /// Index into the `nodes` slice.
        node: usize,
        /// ξ_j, in 1..=1024.
        cpu_shares: u32,
        /// The job's expected value there.
        expected_value: f64,
        /// Containers to pause or stop first.
        victims: Vec<Preemption>,
        /// For the user, e.g. "placed on worker-1 with 1024 CPU shares: expected value 100.0".
        reason: String,
    },
    /// Do not run it.
    Reject {
        /// For the user, e.g. "expected value 0 on every worker: ...".
        reason: String,
    },
}

/// What to do after a departure or on a tick.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ValueAction {
    /// Unpause a paused container and set its CPU share.
    Resume {
        /// The job id.
        job: String,
        /// Its node (index into `nodes`).
        node: usize,
        /// ξ_j to set, in 1..=1024.
        cpu_shares: u32,
        /// Its expected value once resumed.
        expected_value: f64,
        /// For the user.
        reason: String,
    },
    /// Stop and forget a job whose value reached zero (running or paused).
    Drop {
        /// The job id.
        job: String,
        /// Its node (index into `nodes`).
        node: usize,
        /// For the user, e.g. "dropped: value reached zero".
        reason: String,
    },
}

/// The best option found so far in one search.
#[derive(Debug, Clone, Copy)]
struct Best {
    node: usize,
    shares: u32,
    /// Slot position of the victim in the node's model.
    victim: Option<usize>,
    gain: f64,
    flow: f64,
    value: f64,
}

impl Best {
    /// Strictly better than `self` by the tie-breaking order of the module doc; candidates are
    /// offered in (node, no victim before victim, shares ascending) order, so "not better" keeps
    /// the earlier one.
    fn beaten_by(&self, gain: f64, flow: f64) -> bool {
        gain > self.gain + EPS || (gain >= self.gain - EPS && flow < self.flow - EPS)
    }

    /// Keeps `candidate` in `best` if it beats what `best` holds ([`Best::beaten_by`]).
    fn offer(best: &mut Option<Best>, candidate: Best) {
        if best.is_none_or(|b| b.beaten_by(candidate.gain, candidate.flow)) {
            *best = Some(candidate);
        }
    }
}

/// Value-based allocation: one type for DwoP and DwP, called by the manager or the simulator.
///
/// It keeps no state between calls: the driver owns the cluster (placements, shares, paused
/// containers, remaining work) and passes it in as [`NodeState`]s; every step returns its
/// decisions as data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ValueAllocator {
    config: ValueConfig,
}

impl ValueAllocator {
    /// An allocator with checked parameters.
    pub fn new(config: ValueConfig) -> Result<Self> {
        config.validate()?;
        Ok(ValueAllocator { config })
    }

    /// The configuration.
    pub fn config(&self) -> &ValueConfig {
        &self.config
    }

    /// `job` is released at `now` (normally `now == job.released_at`): DwoP (:104-106) examines
    /// every schedulable node × every CPU share (with the stride) and rejection, and takes the
    /// option with the greatest gain in total expected value; DwP (:108-114) also offers each
    /// overloaded node (Eq. 2) without its one victim.
    pub fn on_arrival(&self, now: f64, job: &ValueJob, nodes: &[NodeState]) -> ValueDecision {
        let mut best: Option<Best> = None;
        let mut victims_of: Vec<Option<(usize, f64)>> = vec![None; nodes.len()];
        for (i, node) in nodes.iter().enumerate() {
            if !usable(node) {
                continue;
            }
            let model = NodeModel::new(node);
            let base = model.evaluate(now, None, None, None);
            let mut variants = vec![None];
            if let Some(p) = self.config.preemption {
                let b = beta(now, node);
                if is_overloaded(b, p.lambda)
                    && let Some(v) = select_victim(now, node, p.criterion)
                {
                    let pos = model.index.iter().position(|&x| x == v).expect("running");
                    variants.push(Some(pos));
                    victims_of[i] = Some((v, b));
                }
            }
            for &skip in &variants {
                // A job expected to be worth nothing is never run (:72), even where
                // preempting the victim alone would raise the others' values.
                let at = Offer {
                    node: i,
                    model: &model,
                    base: &base,
                    skip,
                    worthless: false,
                };
                self.offer_shares(&mut best, now, &at, job, job.estimated_s);
            }
        }
        if !nodes.iter().any(usable) {
            return ValueDecision::Reject {
                reason: "no schedulable worker".into(),
            };
        }
        let Some(b) = best else {
            return ValueDecision::Reject {
                reason: worthless_reason(now, job, nodes),
            };
        };
        if b.gain <= EPS {
            return ValueDecision::Reject {
                reason: format!(
                    "running it would lower the total expected value on every worker \
                     (best: {} with a CPU share of {}, its value {} costs the others {})",
                    nodes[b.node].id,
                    b.shares,
                    Amount(b.value),
                    Amount(b.value - b.gain)
                ),
            };
        }
        let node = &nodes[b.node];
        let mut victims = Vec::new();
        if b.victim.is_some() {
            let p = self
                .config
                .preemption
                .expect("victims only with preemption");
            let (v, beta) = victims_of[b.node].expect("victim chosen for this node");
            victims.push(Preemption {
                job: node.containers[v].job.id.clone(),
                node: b.node,
                action: p.action,
                reason: format!(
                    "preempted for job {}: {} on {} (β {:.2} < λ {})",
                    job.id,
                    p.criterion.name(),
                    node.id,
                    beta,
                    p.lambda
                ),
            });
        }
        ValueDecision::Place {
            node: b.node,
            cpu_shares: b.shares,
            expected_value: b.value,
            reason: format!(
                "placed on {} with a CPU share of {}: expected value {} of {}",
                node.id,
                b.shares,
                Amount(b.value),
                Amount(job.curve.max_value)
            ),
            victims,
        }
    }

    /// Where a running job that must leave its node (a drain's) goes, and with what CPU
    /// share: the schedulable node × share (with the stride) where it, with `remaining_s` of
    /// work, adds the most to the total expected value, weighed as an arrival is (:104-106;
    /// ties by added flow time, then the first node, then the smaller share). Its share is
    /// chosen again because it meets other jobs there: one placed alone got the smallest share
    /// (every share is worth the same to a job alone), and kept beside a job of 1024 it was
    /// all but starved (a new user's walk: 15 s to start). Neither a rejection nor a victim:
    /// the job already runs, and its user or operator asked for it to leave, so it goes where
    /// it costs least even where that lowers the total (the allocator drops it later if it
    /// becomes worthless, :65). `nodes` must not hold the job. `None` when no node is usable.
    pub fn on_move(
        &self,
        now: f64,
        job: &ValueJob,
        remaining_s: f64,
        nodes: &[NodeState],
    ) -> Option<(usize, u32)> {
        let mut best: Option<Best> = None;
        for (i, node) in nodes.iter().enumerate().filter(|(_, n)| usable(n)) {
            let model = NodeModel::new(node);
            let base = model.evaluate(now, None, None, None);
            let at = Offer {
                node: i,
                model: &model,
                base: &base,
                skip: None,
                worthless: true,
            };
            self.offer_shares(&mut best, now, &at, job, remaining_s);
        }
        best.map(|b| (b.node, b.shares))
    }

    /// A container left `nodes[node]` at `now` (finished, stopped or dropped; `nodes` no longer
    /// holds it): drops the node's jobs whose value reached zero, then offers its paused jobs
    /// back (module doc, "Pause or stop").
    pub fn on_departure(&self, now: f64, node: usize, nodes: &[NodeState]) -> Vec<ValueAction> {
        let mut out = Vec::new();
        if let Some(n) = nodes.get(node) {
            self.settle(now, node, n, true, &mut out);
        }
        out
    }

    /// Periodically (e.g. every heartbeat): drops every job, running or paused, whose value
    /// reached zero (:65: "the job can be then dropped in order not to waste resources"); on a
    /// node where that freed CPU, offers its paused jobs back as [`Self::on_departure`] does.
    pub fn on_tick(&self, now: f64, nodes: &[NodeState]) -> Vec<ValueAction> {
        let mut out = Vec::new();
        for (i, n) in nodes.iter().enumerate() {
            self.settle(now, i, n, false, &mut out);
        }
        out
    }

    /// Drops, then (when `resume`, or when a running container was dropped) resumptions on one
    /// node.
    fn settle(
        &self,
        now: f64,
        index: usize,
        node: &NodeState,
        resume: bool,
        out: &mut Vec<ValueAction>,
    ) {
        let mut kept: Vec<Container> = Vec::with_capacity(node.containers.len());
        let mut freed = false;
        for c in &node.containers {
            if best_value(now, c, node.speed) <= 0.0 {
                freed |= !c.paused;
                out.push(ValueAction::Drop {
                    job: c.job.id.clone(),
                    node: index,
                    reason: drop_reason(now, c, node),
                });
            } else {
                kept.push(c.clone());
            }
        }
        if !(resume || freed) || !node.schedulable {
            return;
        }
        // The most valuable paused job first (by what it can still earn), ties by id.
        let mut paused: Vec<usize> = (0..kept.len()).filter(|&k| kept[k].paused).collect();
        paused.sort_by(|&a, &b| {
            best_value(now, &kept[b], node.speed)
                .total_cmp(&best_value(now, &kept[a], node.speed))
                .then_with(|| kept[a].job.id.cmp(&kept[b].job.id))
        });
        let mut state = NodeState {
            containers: kept,
            ..node.clone()
        };
        for k in paused {
            let Some((shares, gain, value)) = self.best_share(now, &state, k) else {
                continue;
            };
            if gain <= EPS {
                continue;
            }
            let c = &mut state.containers[k];
            c.paused = false;
            c.shares = shares;
            out.push(ValueAction::Resume {
                job: c.job.id.clone(),
                node: index,
                cpu_shares: shares,
                expected_value: value,
                reason: format!(
                    "resumed: {} has room again (expected value {} with a CPU share of {})",
                    node.id,
                    Amount(value),
                    shares
                ),
            });
        }
    }

    /// The CPU share that maximizes the gain of running paused container `k` on `node` again:
    /// (shares, gain, its expected value).
    fn best_share(&self, now: f64, node: &NodeState, k: usize) -> Option<(u32, f64, f64)> {
        let model = NodeModel::new(node);
        let base = model.evaluate(now, None, None, None);
        let c = &node.containers[k];
        let mut best: Option<Best> = None;
        let at = Offer {
            node: 0,
            model: &model,
            base: &base,
            skip: None,
            worthless: true,
        };
        self.offer_shares(&mut best, now, &at, &c.job, c.remaining_s);
        best.map(|b| (clamp_shares(b.shares), b.gain, b.value))
    }

    /// Offers `job`, with `work_s` of work left, on the node of `at` at every CPU share
    /// examined (:106, with the stride): the search on_arrival, on_move and a resumption
    /// each make on one node.
    fn offer_shares(
        &self,
        best: &mut Option<Best>,
        now: f64,
        at: &Offer<'_>,
        job: &ValueJob,
        work_s: f64,
    ) {
        for shares in share_candidates(self.config.stride) {
            let extra = Slot::new(work_s, shares, job.released_at, &job.curve);
            let o = at.model.evaluate(now, Some(&extra), at.skip, None);
            if !at.worthless && o.extra_value <= EPS {
                continue;
            }
            let (gain, flow) = gain_and_flow(&o, at.base);
            let candidate = Best {
                node: at.node,
                shares,
                victim: at.skip,
                gain,
                flow,
                value: o.extra_value,
            };
            Best::offer(best, candidate);
        }
    }
}

/// One node a job is offered on ([`ValueAllocator::offer_shares`]).
struct Offer<'a> {
    /// Its index.
    node: usize,
    /// Its model, and its outcome without the job.
    model: &'a NodeModel<'a>,
    base: &'a Outcome,
    /// The slot of a victim left out, if any.
    skip: Option<usize>,
    /// Whether an option where the job is expected to be worth nothing counts (a move or a
    /// resumption: the job runs already), or is never taken (an arrival, :72).
    worthless: bool,
}

/// A node that can take work: schedulable, with a positive speed.
fn usable(node: &NodeState) -> bool {
    node.schedulable && node.speed > 0.0 && node.speed.is_finite()
}

/// Gain in total expected value and added flow time of an option against the node as it is.
/// A skipped victim's value and flow are simply absent from `o`: its value counts as lost.
fn gain_and_flow(o: &Outcome, base: &Outcome) -> (f64, f64) {
    (
        o.existing_value + o.extra_value - base.existing_value,
        o.existing_flow + o.extra_flow - base.existing_flow,
    )
}

/// Why `job` is worth nothing on any worker: its work ends past its value's zero even alone on
/// the fastest, or it would with the jobs already there.
fn worthless_reason(now: f64, job: &ValueJob, nodes: &[NodeState]) -> String {
    let zero = job.curve.zero_value_at_s;
    let fastest = (nodes.iter().filter(|n| usable(n)))
        .map(|n| n.speed)
        .fold(0.0, f64::max);
    let alone = now - job.released_at + job.estimated_s / fastest.max(EPS);
    if alone >= zero {
        format!(
            "expected value 0 on every worker: even alone on the fastest it would finish \
             {alone:.1} s after submission (its estimated {:.0} s of work), and it is worth \
             nothing from {zero:.1} s",
            job.estimated_s
        )
    } else {
        format!(
            "expected value 0 on every worker: sharing with the jobs there, it would finish \
             after it is worth nothing ({zero:.1} s after submission; alone on the fastest, \
             {alone:.1} s)"
        )
    }
}

fn drop_reason(now: f64, c: &Container, node: &NodeState) -> String {
    let since = now - c.job.released_at;
    if since >= c.job.curve.zero_value_at_s {
        format!(
            "dropped: value reached zero ({since:.1} s after submission; zero from {:.1} s)",
            c.job.curve.zero_value_at_s
        )
    } else {
        format!(
            "dropped: value reached zero: even alone on {} it would finish {:.1} s after \
             submission, when it is worth nothing (from {:.1} s)",
            node.id,
            since + c.remaining_s.max(0.0) / node.speed,
            c.job.curve.zero_value_at_s
        )
    }
}
