//! Value-based allocation on the cluster (`value`, `value-dwop`): the core drives
//! `converge_policy::value::ValueAllocator` (value-based-allocation.txt, DwoP :104-106, DwP
//! :108-114) through this policy.
//!
//! - **Which jobs.** A job with a value curve and an estimated runtime is admitted by the
//!   allocator when it is released (:104): placed with a CPU share, perhaps after preempting
//!   one victim there, or rejected. A job without one is placed by spread and is invisible to
//!   the allocator (it neither counts in a worker's β, Eq. 1, nor can be preempted).
//! - **The cluster as the allocator sees it** ([`node_states`]): one `NodeState` per worker in
//!   id order; speed = calibration (ζ = 1/speed, :57); its containers = its value jobs that
//!   occupy it or that a move is bringing there, each with its share and remaining work
//!   `ET × (1 − step/total_steps)` in reference seconds; paused when Paused, pinned (no
//!   victim) when it cannot be paused; release AT_j = submission (:63).
//! - **Decisions.** Victims are paused (or stopped: Dropped) (:112); after a value job leaves
//!   a worker, [`ValueAllocator::on_departure`] offers its paused jobs back or drops worthless
//!   ones; on every tick [`ValueAllocator::on_tick`] drops jobs whose value reached zero (:65).
//! - **Time** is the core's: Unix seconds on the manager, virtual seconds in the simulator.

use std::collections::BTreeMap;

use converge_policy::baseline::Spread;
use converge_policy::value::{
    Container, NodeState, PreemptAction, ValueAction, ValueAllocator, ValueConfig, ValueDecision,
    ValueJob,
};

use super::placing::Placing;
use super::{Admission, ClusterPolicy, ClusterView, Decision, Invalid, Preempt, Victim, WaitKind};
use crate::cluster::forecast::Load;
use crate::cluster::lifecycle::{Job, JobPhase};
use crate::cluster::types::{JobId, JobSpec, Time, WorkerId, WorkerMode};

/// Docker's `--cpu-shares` default: what a container gets when nobody chose its share.
const DEFAULT_SHARES: u32 = 1024;

/// Value-based allocation, with spread for jobs without a value curve.
pub struct ValuePolicy {
    name: &'static str,
    allocator: ValueAllocator,
    fallback: Placing,
    /// Given shares, and those chosen for moves under way.
    shares: Shares,
}

impl ValuePolicy {
    /// `name` running `config`.
    pub fn new(name: &'static str, config: ValueConfig) -> converge_policy::Result<Self> {
        Ok(ValuePolicy {
            name,
            allocator: ValueAllocator::new(config)?,
            fallback: Placing::new(Box::new(Spread), WorkerMode::Free),
            shares: Shares::default(),
        })
    }

    /// The allocator's resumptions and drops as decisions, remembering resumed jobs' shares.
    fn actions(&mut self, actions: Vec<ValueAction>) -> Vec<Decision> {
        actions
            .into_iter()
            .map(|a| match a {
                ValueAction::Resume {
                    job,
                    cpu_shares,
                    reason,
                    ..
                } => {
                    let job: JobId = job.into();
                    self.shares.given.insert(job.clone(), cpu_shares);
                    Decision::Resume {
                        job,
                        cpu_shares,
                        reason,
                    }
                }
                ValueAction::Drop { job, reason, .. } => Decision::Drop {
                    job: job.into(),
                    reason,
                },
            })
            .collect()
    }
}

/// Whether the allocator weighs `job`: it has a value curve and an estimated runtime. An
/// estimate that is not a number counts, as it always has here (the manager refuses one at
/// submission; the simulator and tests drive the core directly).
fn valued(job: &Job) -> bool {
    let no_estimate = job.spec.estimated_runtime_s <= 0.0;
    job.spec.value_curve.is_some() && !no_estimate
}

/// The job as the allocator sees it, when it has a value curve and an estimated runtime.
pub fn value_job(job: &Job) -> Option<ValueJob> {
    let curve = job.spec.value_curve.filter(|_| valued(job))?;
    Some(ValueJob {
        id: job.id.to_string(),
        // AT_j: the curve's origin is the job's release (:65), its submission here.
        released_at: job.submitted_at,
        estimated_s: job.spec.estimated_runtime_s,
        curve,
    })
}

/// Work left in reference seconds: `ET × (1 − step/total_steps)`, ET until the job says its
/// total.
fn remaining_s(job: &Job) -> f64 {
    let et = job.spec.estimated_runtime_s;
    if job.total_steps == 0 {
        return et;
    }
    let done = (job.step as f64 / job.total_steps as f64).clamp(0.0, 1.0);
    et * (1.0 - done)
}

/// The shares of value jobs: those given, and those chosen for moves under way.
#[derive(Debug, Default)]
pub struct Shares {
    /// ξ_j of each value job that holds a place (given at placement or resumption).
    given: BTreeMap<JobId, u32>,
    /// The share chosen for a value job's move, with the worker it was chosen for: the job's
    /// share only once its restore is sent there ([`ClusterPolicy::restore_shares`]). Taken
    /// at the answer, it stayed the job's though the move never happened (its save failed)
    /// and the job ran on at its old share (a review).
    moving: BTreeMap<JobId, (WorkerId, u32)>,
}

impl Shares {
    /// Job `j`'s share as counted on worker `w`: on the worker a move takes it to, the one
    /// chosen for there from the move's start (its room is held there from then: a job placed
    /// beside it during the save was sized against its old share, a review); elsewhere the
    /// one it was given; Docker's default for a job given none.
    pub fn on(&self, j: &Job, w: &WorkerId) -> u32 {
        let moving =
            (self.moving.get(&j.id)).filter(|(to, _)| to == w && j.phase.inbound_to() == Some(w));
        match moving {
            Some(&(_, shares)) => shares,
            None => self.given.get(&j.id).copied().unwrap_or(DEFAULT_SHARES),
        }
    }
}

/// The cluster as the allocator sees it, in worker id order.
pub fn node_states(view: ClusterView<'_>, shares: &Shares) -> Vec<NodeState> {
    let snaps = view.snapshots().1;
    (view.workers.values().zip(snaps))
        .map(|(w, snap)| {
            // With the jobs a move is bringing here: their room is held from the move's start
            // (a job placed beside one was sized as if alone). They cannot be paused, and
            // are pinned below.
            let mut jobs: Vec<&Job> = w.placed().filter_map(|id| view.jobs.get(id)).collect();
            // Ordered by submission so decisions are deterministic.
            jobs.sort_by_key(|j| j.seq);
            NodeState {
                id: w.id.to_string(),
                speed: w.calibration,
                // The snapshot's: what every placer reads, and where the core hides a worker
                // a job must leave.
                schedulable: snap.schedulable,
                containers: jobs
                    .into_iter()
                    .filter_map(|j| {
                        Some(Container {
                            job: value_job(j)?,
                            shares: shares.on(j, &w.id),
                            remaining_s: remaining_s(j),
                            paused: matches!(j.phase, JobPhase::Paused { .. }),
                            // Only a running job can be paused (`lifecycle::allowed`); a job
                            // on its way here is migrating.
                            pinned: !matches!(
                                j.phase,
                                JobPhase::Running { .. } | JobPhase::Paused { .. }
                            ),
                        })
                    })
                    .collect(),
            }
        })
        .collect()
}

impl ClusterPolicy for ValuePolicy {
    fn name(&self) -> &'static str {
        self.name
    }

    fn reads_value_curves(&self) -> bool {
        true
    }

    fn check_submit(&self, spec: &JobSpec) -> Result<(), Invalid> {
        if spec.value_curve.is_some() && spec.estimated_runtime_s <= 0.0 {
            return Err(Invalid {
                field: "spec.estimated_runtime_s",
                message: "is needed with a value curve under the value policies: the allocator \
                          predicts when the job completes from it (seconds alone on a reference \
                          worker)"
                    .into(),
            });
        }
        Ok(())
    }

    fn place(&mut self, now: Time, job: &Job, view: ClusterView<'_>) -> Admission {
        let Some(vj) = value_job(job) else {
            return self.fallback.admit(job, view);
        };
        let nodes = node_states(view, &self.shares);
        if !nodes.iter().any(|n| n.schedulable) {
            return Admission::Wait {
                reason: "waiting for a schedulable worker".into(),
                for_room: true,
            };
        }
        let ids: Vec<&WorkerId> = view.workers.keys().collect();
        match self.allocator.on_arrival(now, &vj, &nodes) {
            ValueDecision::Place {
                node,
                cpu_shares,
                expected_value,
                victims,
                reason,
            } => {
                self.shares.given.insert(job.id.clone(), cpu_shares);
                Admission::Place {
                    worker: ids[node].clone(),
                    cpu_shares,
                    victims: victims
                        .into_iter()
                        .map(|p| Victim {
                            job: p.job.into(),
                            how: match p.action {
                                PreemptAction::Pause => Preempt::Pause,
                                PreemptAction::Stop => Preempt::Stop,
                            },
                            reason: p.reason,
                        })
                        .collect(),
                    reason,
                    attributes: BTreeMap::from([
                        ("cpu_shares".to_string(), cpu_shares.to_string()),
                        ("expected_value".to_string(), format!("{expected_value:.3}")),
                    ]),
                }
            }
            ValueDecision::Reject { reason } => Admission::Reject { reason },
        }
    }

    /// Jobs with a value curve wait for room alike (for a schedulable worker, whatever they
    /// ask); the others as the fallback placer has them wait.
    fn wait_kind(&self, job: &Job) -> Option<WaitKind> {
        // Without making a `ValueJob`: this is asked for every job of a backlog.
        if valued(job) {
            Some(WaitKind::class(1))
        } else {
            Placing::wait_kind(job)
        }
    }

    /// A value job goes where the allocator says it costs least ([`ValueAllocator::on_move`]),
    /// whatever it asks in `cpus`, as it was placed: by spread's room for its `cpus` it
    /// waited for ever on a draining worker while the allocator kept placing new value jobs
    /// beside the others (a new user's walk). Other jobs go where spread has room.
    fn place_move(&mut self, now: Time, job: &Job, view: ClusterView<'_>) -> Option<WorkerId> {
        let Some(vj) = value_job(job) else {
            return self.fallback.target(job, view);
        };
        // Sized as if it were not there yet. The worker it leaves is hidden from this view
        // by the core (`Core::place_elsewhere`).
        let mut nodes = node_states(view, &self.shares);
        for n in &mut nodes {
            n.containers.retain(|c| c.job.id != vj.id);
        }
        let (node, shares) = (self.allocator).on_move(now, &vj, remaining_s(job), &nodes)?;
        let to = view.workers.keys().nth(node).cloned()?;
        self.shares
            .moving
            .insert(job.id.clone(), (to.clone(), shares));
        Some(to)
    }

    fn start_shares(&self, job: &str) -> u32 {
        self.shares.given.get(job).copied().unwrap_or(0)
    }

    fn restore_shares(&mut self, job: &str, to: &WorkerId) -> u32 {
        match self.shares.moving.remove(job) {
            Some((chosen, shares)) if chosen == *to => {
                self.shares.given.insert(job.into(), shares);
                shares
            }
            _ => self.start_shares(job),
        }
    }

    fn forecast_weights(&self, _capacity: f64, jobs: &[Load<'_>]) -> Option<Vec<f64>> {
        // Each value job keeps the ξ_j it was given; the others run at Docker's default.
        Some(
            jobs.iter()
                .map(|l| {
                    f64::from(
                        self.shares
                            .given
                            .get(l.job)
                            .copied()
                            .unwrap_or(DEFAULT_SHARES),
                    )
                })
                .collect(),
        )
    }

    fn on_departure(
        &mut self,
        now: Time,
        worker: &WorkerId,
        job: &JobId,
        view: ClusterView<'_>,
    ) -> Vec<Decision> {
        let ended = view.jobs.get(job).is_none_or(|j| j.is_terminal());
        if ended {
            self.shares.given.remove(job);
            self.shares.moving.remove(job);
        }
        self.on_room(now, worker, view)
    }

    fn on_room(&mut self, now: Time, worker: &WorkerId, view: ClusterView<'_>) -> Vec<Decision> {
        let Some(index) = view.index_of(worker) else {
            return Vec::new();
        };
        let nodes = node_states(view, &self.shares);
        // :112 leaves a paused victim's future open; it resumes when its worker has room.
        let actions = self.allocator.on_departure(now, index, &nodes);
        self.actions(actions)
    }

    fn on_tick(&mut self, now: Time, view: ClusterView<'_>) -> Vec<Decision> {
        let nodes = node_states(view, &self.shares);
        let actions = self.allocator.on_tick(now, &nodes);
        self.actions(actions)
    }
}
