//! Value-based allocation: value curves, expected execution times under CPU shares, the overload
//! test, and greedy dynamic allocation without (DwoP) and with preemption (DwP).
//!
//! Paper: *Value-Based Allocation of Docker Containers* (value-based-allocation.txt). Every job
//! carries a [`ValueCurve`] (its worth to the user as a function of its completion time, Fig. 1)
//! and an estimated execution time on a reference worker; each node has a calibration
//! coefficient ζ_i (here its `speed` = 1/ζ_i) and runs its containers in proportion to their CPU
//! shares ξ_j/Ξ_i. The manager calls one type, [`ValueAllocator`]:
//! - [`ValueAllocator::on_arrival`]: a job was released; returns a [`ValueDecision`] (place it on a
//!   node with a CPU share, maybe preempting one victim there, or reject it with a reason).
//! - [`ValueAllocator::on_departure`]: a container left a node (finished, stopped, dropped);
//!   returns [`ValueAction`]s (drop jobs whose value reached zero, resume paused ones).
//! - [`ValueAllocator::on_tick`]: periodically; drops zero-value jobs cluster-wide.
//!
//! The kernels are public for drivers and tests: [`completion_offsets`] (expected execution time),
//! [`beta`] (Eq. 1), [`is_overloaded`] (Eq. 2), [`select_victim`], [`best_value`], and
//! [`offline_completions`] (the exact outcome of a static plan, the GA baseline's fitness).
//!
//! ## Decisions where the paper leaves a gap
//! - **Expected execution time** (:74 says only that EET "considers the influence from other
//!   containers allocated to the same node and CPU share ξ_j"). We predict with weighted processor
//!   sharing: each running container gets `ξ_j/Ξ_i` of the node (:59) and Ξ_i shrinks as
//!   containers finish, so the time freed by a finished container goes to the others, as CFS
//!   does for CPU-bound containers. No further arrivals are assumed. A container's remaining
//!   work `r_j` is in reference seconds (seconds it would take alone on the reference worker);
//!   on node i alone it needs `r_j·ζ_i` seconds. Sorting containers by `r_j/ξ_j`, the k-th finishes
//!   after `Σ_{l≤k} (r_l/ξ_l − r_{l−1}/ξ_{l−1})·W_l·ζ_i` seconds with `W_l` the shares of those
//!   not yet finished ([`completion_offsets`]). The simpler reading "current share held to the
//!   end" (`r_j·ζ_i·Ξ_i/ξ_j`) overestimates every completion but the first and would make a
//!   container with share 1 look like it never finishes. The value of a container is its curve
//!   at its completion measured from its release (:65, :74): `V_j = VC_j(now + c_j − AT_j)`.
//! - **Which containers count.** Paused containers use no CPU: they are left out of the
//!   prediction, of β_i and of victim selection. Eq. 1 gives β = 0 for a node with no running
//!   container, so Eq. 2 calls an empty node overloaded; that is moot, it has no victim.
//! - **DwoP's objective** (:106, "maximising the overall value at the given time point"): only the
//!   chosen node changes, so we maximize the *gain* = (expected values on the node with the job)
//!   − (expected values on the node without it). Rejection is the option with gain 0 (:96: not
//!   allocated when the value with it is inferior to the value without it); a placement must
//!   gain strictly more than 0, so a job whose every placement yields 0 is rejected (:72).
//! - **Ties** (the paper has none): the greater gain; then the smaller added flow time (sum of
//!   expected completion offsets on the node after minus before), so that in a light load the
//!   job goes to an idle or faster node rather than packing the first one; then the lower node
//!   index; then no victim before a victim; then the smaller CPU share (taking no more priority
//!   than the value needs leaves room for later arrivals). Gains closer than 1e-9 are equal.
//! - **Stride** (:106): the shares examined are `1, 1+s, 1+2s, … ≤ 1024`; s = 18 gives the paper's
//!   57 values (:161).
//! - **DwP** (:108-114): a node is overloaded when Eq. 2 holds *before* the new job is added
//!   (β_i describes "all the containers executed on node N_i"). On an overloaded node its one
//!   victim (by the configured [`VictimCriterion`]) is chosen on that state, and the node is
//!   offered both with and without the victim; the victim's expected value counts as lost. A
//!   victim is therefore preempted only when that raises the total expected value: the paper's
//!   stated objective (:106) and its reason for preemption, "the resources regained … may be used
//!   in a more beneficial way" (:110). At most one victim per decision: only the chosen node's.
//! - **Victim criteria** (:114 names lowest expected value and lowest value density, :152
//!   evaluates lowest value density and minimal remaining value, defined in the paper's ref. 13,
//!   which we do not have). Ours: *lowest expected value* = `V_j` under the current sharing; *lowest value
//!   density* = `V_j` per second of the node the container still needs alone (`V_j/(r_j·ζ_i)`);
//!   *minimal remaining value* = the most it could still earn, its curve at the completion it
//!   would reach alone on the node from now (`VC_j(now + r_j·ζ_i − AT_j)`). Ties by job id.
//! - **Pause or stop** (:112): configurable. A stopped job is gone (its value is 0). A paused job
//!   stays on its node; when capacity frees up there (a container finishes, is stopped or
//!   dropped: [`ValueAllocator::on_departure`]) paused jobs are offered back, the most valuable
//!   first (by remaining value), with the same test as an arrival: resumed with the CPU share
//!   that maximizes the gain if the gain is positive. Only a departure triggers resumption, so a
//!   job just paused is not resumed in the same instant by a periodic tick.
//! - **Dropping** (:65, "the job can be then dropped"): a job (running or paused) is dropped as
//!   soon as even the best case, alone on its node from now, would complete at value 0.
//! - **Calibration**: the paper's ζ_i is a time ratio (:57, smaller is faster); the wire and
//!   [`crate::WorkerSnapshot`] carry a speed (1.5 = 50% faster). [`NodeState::speed`] is that
//!   speed, ζ_i = 1/speed.

mod allocator;
mod curve;
mod model;
mod offline;

pub use allocator::{
    PreemptAction, Preemption, PreemptionConfig, ValueAction, ValueAllocator, ValueConfig,
    ValueDecision,
};
pub use curve::{Amount, ValueCurve};
pub use model::{
    Expectation, VictimCriterion, best_value, beta, completion_offsets, expected_values,
    is_overloaded, select_victim, share_candidates,
};
pub use offline::{OfflineJob, offline_completions, offline_value};

use serde::{Deserialize, Serialize};

/// The smallest CPU share Docker accepts here (paper :59: ξ_j ∈ {1, …, 1024}).
pub const MIN_SHARES: u32 = 1;
/// The largest CPU share the paper considers (Docker's default `--cpu-shares`, :59).
pub const MAX_SHARES: u32 = 1024;

/// A job as value-based allocation sees it: C_j with AT_j, ET_j and VC_j (paper :63-65).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ValueJob {
    /// The job's id (for decisions and reasons).
    pub id: String,
    /// AT_j: its release (arrival) time, seconds on the driver's clock; the curve's origin.
    pub released_at: f64,
    /// ET_j: its estimated execution time alone on the reference worker, seconds.
    pub estimated_s: f64,
    /// VC_j.
    pub curve: ValueCurve,
}

impl ValueJob {
    /// Its value if it completes at absolute time `t` (paper :74: `V_j = VC_j(EET_j)`).
    pub fn value_if_done_at(&self, t: f64) -> f64 {
        self.curve.value_at(t - self.released_at)
    }
}

/// A container placed on a node (running or paused).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Container {
    /// Its job.
    pub job: ValueJob,
    /// Its CPU share ξ_j (clamped to 1..=1024 when used).
    pub shares: u32,
    /// Work left, in reference seconds (ET_j at start; the driver lowers it with progress, e.g.
    /// `ET_j · (1 − step/total_steps)`).
    pub remaining_s: f64,
    /// Paused (docker pause): on the node, using no CPU.
    pub paused: bool,
    /// Not to be preempted now: only a running container can be paused, and one still
    /// starting (or stopping) cannot. It runs and counts as the others do. Picked as a
    /// victim, its pause was refused and the new job started with a share sized for its
    /// absence.
    #[serde(default)]
    pub pinned: bool,
}

/// One node N_i as the allocator sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeState {
    /// The node's id (for reasons).
    pub id: String,
    /// Speed relative to the reference worker (the wire's `calibration`): ζ_i = 1/speed.
    pub speed: f64,
    /// False when lost or draining: never chosen for a new job.
    pub schedulable: bool,
    /// Its containers, running and paused.
    pub containers: Vec<Container>,
}

impl NodeState {
    /// ζ_i (paper :57): execution time here divided by execution time on the reference.
    pub fn zeta(&self) -> f64 {
        1.0 / self.speed
    }
}

#[cfg(test)]
mod tests;
