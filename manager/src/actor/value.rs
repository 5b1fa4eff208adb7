//! Value-based allocation on the live cluster (`--policy value`, `value-dwop`): the manager
//! drives `converge_policy::value::ValueAllocator` (value-based-allocation.txt, DwoP :104-106,
//! DwP :108-114) with the cluster it owns and carries out its decisions through the agents.
//!
//! - **Which jobs.** A job with a value curve and an estimated runtime is admitted by the
//!   allocator when it is released (submitted, :104): placed on a worker with a CPU share
//!   (`Start.cpu_shares`), perhaps after preempting one victim there, or rejected. A job
//!   without a value curve is placed by spread as under `--policy spread` and is invisible to
//!   the allocator: it neither counts in a worker's β (Eq. 1) nor can be preempted. Mixing both
//!   kinds on one cluster therefore makes the allocator's predictions optimistic (it does not
//!   see the CPU those jobs take); run value jobs on their own workers when that matters. A value
//!   curve without `estimated_runtime_s` is refused at submission, naming the field: the
//!   allocator cannot predict a completion without it.
//! - **The cluster as the allocator sees it** ([`node_states`]): one `NodeState` per registered
//!   worker in id order; speed = the worker's calibration (measured by its agent, ζ_i = 1/speed,
//!   :57); its containers = its value jobs that occupy it (starting, running, migrating, paused),
//!   each with the CPU share it was given, its remaining work `ET × (1 − step/total_steps)` in
//!   reference seconds (ET alone until the job reports its total), paused when PAUSED; its
//!   release time AT_j = its submission time (:63).
//! - **Carrying out decisions.** Place → `Start` with the chosen share; a victim → `Pause`
//!   (state PAUSED, the allocator's reason "preempted for job X: …") or, with
//!   `--value-preempt stop`, `Stop` (state REJECTED: the policy gave up on it, as on a job it
//!   never started; CANCELLED stays the user's word and FAILED the job's own fault). Reject →
//!   REJECTED with the allocator's reason, nothing started. After a value job leaves a worker
//!   (completed, failed, cancelled, rejected) `on_departure` offers that worker's paused jobs
//!   back (`Resume`, then `SetLimits` with the share chosen for it; state RUNNING); on every
//!   timer tick `on_tick` drops jobs whose value reached zero (:65; `Stop`, state REJECTED with
//!   "dropped: value reached zero …"). Every decision is an event whose reason is the
//!   allocator's.
//! - **Time** is wall-clock seconds (Unix), the clock submission times are kept in.
//! - **Workers with no agent stream** are not schedulable; a value job submitted while no
//!   worker is schedulable waits (PENDING) as any job does, and is decided when one registers;
//!   its value keeps falling meanwhile since the curve starts at its release.

use std::collections::HashMap;

use converge_messenger::pb::{self, Command, Event, EventKind, JobSpec, JobState, command::Action};
use converge_policy::baseline::Spread;
use converge_policy::cluster::{JobRequest, Placement, Placer, WorkerSnapshot};
use converge_policy::value::{
    Container, NodeState, PreemptAction, Preemption, ValueAction, ValueAllocator, ValueCurve,
    ValueDecision, ValueJob,
};
use tokio::time::Instant;
use tracing::{field, info, info_span, warn};

use super::{Actor, command, now_ms, start_command};
use crate::error::{Error, Result};
use crate::metrics::Round;
use crate::state::{Cluster, Job};

/// Docker's `--cpu-shares` default: what a container gets when nobody chose its share.
const DEFAULT_SHARES: u32 = 1024;

/// Rounds of departure handling in one go; each round can only end jobs, so this bounds
/// nothing in practice but guards against a loop.
const MAX_SETTLE_ROUNDS: usize = 16;

/// The placer of `value` and `value-dwop` for jobs without a value curve: spread, under the
/// policy's own name (jobs, workers and metrics say `value`).
pub(crate) struct ValuePlacer {
    name: &'static str,
    inner: Spread,
}

impl ValuePlacer {
    /// A placer reporting itself as `name`.
    pub(crate) fn new(name: &'static str) -> Self {
        Self {
            name,
            inner: Spread,
        }
    }
}

impl Placer for ValuePlacer {
    fn name(&self) -> &'static str {
        self.name
    }

    fn place(&mut self, job: &JobRequest, workers: &[WorkerSnapshot]) -> Placement {
        self.inner.place(job, workers)
    }
}

/// The actor's value-allocation state: the allocator (stateless) and what the cluster state
/// does not hold.
pub(crate) struct ValueDriver {
    allocator: ValueAllocator,
    /// The CPU share ξ_j each value job was given (at placement or resumption).
    shares: HashMap<String, u32>,
    /// Workers a value job left since departures were last handled.
    departed: Vec<String>,
}

impl ValueDriver {
    pub(crate) fn new(allocator: ValueAllocator) -> Self {
        Self {
            allocator,
            shares: HashMap::new(),
            departed: Vec::new(),
        }
    }
}

/// The job as the allocator sees it, when it has a value curve and an estimated runtime.
pub(crate) fn value_job(job: &Job) -> Option<ValueJob> {
    let vc = job.spec.value_curve.as_ref()?;
    if job.spec.estimated_runtime_s <= 0.0 {
        return None;
    }
    Some(ValueJob {
        id: job.id.clone(),
        // AT_j: the curve's origin is the job's release (:65), its submission here.
        released_at: job.submitted_unix_ms as f64 / 1000.0,
        estimated_s: job.spec.estimated_runtime_s,
        curve: ValueCurve {
            max_value: vc.max_value,
            full_value_until_s: vc.full_value_until_s,
            zero_value_at_s: vc.zero_value_at_s,
        },
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

/// The cluster as the allocator sees it: worker ids and their `NodeState`s, in id order.
pub(crate) fn node_states(
    cluster: &Cluster,
    shares: &HashMap<String, u32>,
) -> (Vec<String>, Vec<NodeState>) {
    let mut ids = Vec::with_capacity(cluster.workers.len());
    let mut nodes = Vec::with_capacity(cluster.workers.len());
    for w in cluster.workers.values() {
        let mut jobs: Vec<&Job> = cluster.jobs_on(&w.id).collect();
        // Jobs live in a hash map: order them by submission so decisions are deterministic.
        jobs.sort_by_key(|j| j.seq);
        let containers = jobs
            .into_iter()
            .filter_map(|j| {
                Some(Container {
                    job: value_job(j)?,
                    shares: shares.get(&j.id).copied().unwrap_or(DEFAULT_SHARES),
                    remaining_s: remaining_s(j),
                    paused: j.state == JobState::Paused,
                })
            })
            .collect();
        ids.push(w.id.clone());
        nodes.push(NodeState {
            id: w.id.clone(),
            speed: w.calibration,
            schedulable: w.schedulable(),
            containers,
        });
    }
    (ids, nodes)
}

fn now_s() -> f64 {
    now_ms() as f64 / 1000.0
}

fn is_terminal(s: JobState) -> bool {
    matches!(
        s,
        JobState::Completed | JobState::Failed | JobState::Cancelled | JobState::Rejected
    )
}

impl Actor {
    /// Submission rule of the value policies: a value curve needs an estimated runtime.
    pub(super) fn value_check_spec(&self, spec: &JobSpec) -> Result<()> {
        if self.value.is_some() && spec.value_curve.is_some() && spec.estimated_runtime_s <= 0.0 {
            return Err(Error::invalid(
                "spec.estimated_runtime_s",
                "is needed with a value curve under the value policies: the allocator predicts \
                 when the job completes from it (seconds alone on a reference worker)",
            ));
        }
        Ok(())
    }

    /// Admits pending job `id` by value when the policy and the job call for it (module doc);
    /// returns false to leave it to the placer.
    pub(super) fn value_admit(&mut self, id: &str) -> bool {
        let Some(driver) = &self.value else {
            return false;
        };
        let Some(vj) = self.cluster.jobs.get(id).and_then(value_job) else {
            return false;
        };
        let (ids, nodes) = node_states(&self.cluster, &driver.shares);
        if !nodes.iter().any(|n| n.schedulable) {
            let why = "waiting for a schedulable worker";
            if let Some(j) = self.cluster.jobs.get_mut(id)
                && j.reason != why
            {
                j.reason = why.into();
            }
            return true;
        }
        let policy = self.placer.name();
        let began = Instant::now();
        // DwoP/DwP on the job's release (value-based-allocation.txt:104-114).
        let decision = driver.allocator.on_arrival(now_s(), &vj, &nodes);
        let took = began.elapsed();
        self.metrics.round(policy, Round::Placement, took);
        let span = self.job_span(
            id,
            info_span!(
                parent: None,
                "value_admission",
                job = %id,
                policy,
                decision = field::Empty,
                decision_us = took.as_micros() as u64
            ),
        );
        let _entered = span.enter();
        match &decision {
            ValueDecision::Place { reason, .. } | ValueDecision::Reject { reason } => {
                span.record("decision", reason.as_str());
            }
        }
        self.apply_arrival(id, &ids, decision);
        true
    }

    /// Carries out the allocator's answer to job `id`'s arrival; `ids` names the nodes.
    pub(super) fn apply_arrival(&mut self, id: &str, ids: &[String], decision: ValueDecision) {
        match decision {
            ValueDecision::Place {
                node,
                cpu_shares,
                expected_value,
                victims,
                reason,
            } => {
                // Victims first (:110): their CPU is what the new job was promised.
                for p in &victims {
                    self.preempt(p, &ids[p.node]);
                }
                self.start_with_shares(id, &ids[node], cpu_shares, expected_value, &reason);
            }
            ValueDecision::Reject { reason } => {
                info!(job = %id, %reason, "job rejected by value");
                // A rejected job is never started (:72, :96).
                if let Some(j) = self.cluster.jobs.get_mut(id) {
                    j.finished_unix_ms = now_ms();
                }
                self.set_state(id, JobState::Rejected, &reason);
            }
        }
    }

    /// Pauses or stops a victim (:112).
    fn preempt(&mut self, p: &Preemption, worker: &str) {
        let Some(job) = self.cluster.jobs.get(&p.job) else {
            return;
        };
        info!(job = %p.job, %worker, action = ?p.action, reason = %p.reason, "preempting");
        match p.action {
            PreemptAction::Pause => {
                let cmd = command(job, Action::Pause(pb::Pause {}));
                self.send(worker, cmd);
                self.set_state(&p.job, JobState::Paused, &p.reason);
            }
            PreemptAction::Stop => {
                let cmd = command(
                    job,
                    Action::Stop(pb::Stop {
                        reason: p.reason.clone(),
                        remove: true,
                    }),
                );
                self.send(worker, cmd);
                if let Some(j) = self.cluster.jobs.get_mut(&p.job) {
                    j.finished_unix_ms = now_ms();
                }
                self.set_state(&p.job, JobState::Rejected, &p.reason);
            }
        }
    }

    /// Starts a new incarnation of `id` on `worker` with CPU share `shares` (:59).
    fn start_with_shares(
        &mut self,
        id: &str,
        worker: &str,
        shares: u32,
        expected_value: f64,
        reason: &str,
    ) {
        let policy = self.placer.name();
        let Some(j) = self.cluster.jobs.get_mut(id) else {
            return;
        };
        j.epoch += 1;
        j.worker_id = Some(worker.to_string());
        j.container_id.clear();
        let mut cmd = start_command(j);
        if let Some(Action::Start(s)) = &mut cmd.action {
            s.cpu_shares = shares;
        }
        j.start_command_id = cmd.command_id.clone();
        let epoch = j.epoch;
        if let Some(v) = &mut self.value {
            v.shares.insert(id.to_string(), shares);
        }
        info!(job = %id, %worker, epoch, shares, expected_value, "job placed by value");
        self.metrics.placed(policy);
        self.events.emit(Event {
            kind: EventKind::JobPlaced as i32,
            job_id: id.to_string(),
            worker_id: worker.to_string(),
            epoch,
            reason: reason.to_string(),
            attributes: HashMap::from([
                ("policy".to_string(), policy.to_string()),
                ("cpu_shares".to_string(), shares.to_string()),
                ("expected_value".to_string(), format!("{expected_value:.3}")),
            ]),
            ..Default::default()
        });
        self.set_state(
            id,
            JobState::Starting,
            &format!("starting on {worker} with {shares} CPU shares"),
        );
        self.send(worker, cmd);
    }

    /// Every Start of a value job carries the share the allocator gave it, whoever sends it: a
    /// placement, a Start re-sent after a reconnect, or a restore after a drain (the share is
    /// the job's, not the incarnation's, so the allocator's model matches the cgroup).
    pub(super) fn value_fill_shares(&self, cmd: &mut Command) {
        if let (Some(v), Some(Action::Start(s))) = (&self.value, &mut cmd.action)
            && s.cpu_shares == 0
            && let Some(&shares) = v.shares.get(&cmd.job_id)
        {
            s.cpu_shares = shares;
        }
    }

    /// Called on every state change: remembers the worker a value job left.
    pub(super) fn value_note_transition(
        &mut self,
        id: &str,
        from: JobState,
        to: JobState,
        worker: &str,
    ) {
        let Some(v) = &mut self.value else {
            return;
        };
        let occupied = matches!(
            from,
            JobState::Starting | JobState::Running | JobState::Migrating | JobState::Paused
        );
        if is_terminal(to) {
            v.shares.remove(id);
            if occupied && !worker.is_empty() && !v.departed.iter().any(|w| w == worker) {
                v.departed.push(worker.to_string());
            }
        }
    }

    /// Offers the workers value jobs left their paused jobs back (and drops worthless ones).
    pub(super) fn value_departures(&mut self) {
        for _ in 0..MAX_SETTLE_ROUNDS {
            let Some(v) = &mut self.value else {
                return;
            };
            if v.departed.is_empty() {
                return;
            }
            let departed = std::mem::take(&mut v.departed);
            for worker in departed {
                let Some(v) = &self.value else {
                    return;
                };
                let (ids, nodes) = node_states(&self.cluster, &v.shares);
                let Some(index) = ids.iter().position(|w| *w == worker) else {
                    continue;
                };
                // :112 leaves a paused victim's future open; we resume it when its worker has
                // room again (policy::value module doc, "Pause or stop").
                let actions = v.allocator.on_departure(now_s(), index, &nodes);
                self.apply_actions(&ids, actions);
            }
        }
        warn!("value departures still pending after {MAX_SETTLE_ROUNDS} rounds");
    }

    /// On the actor's timer: drops jobs whose value reached zero (:65).
    pub(super) fn value_tick(&mut self) {
        let Some(v) = &self.value else {
            return;
        };
        let (ids, nodes) = node_states(&self.cluster, &v.shares);
        let actions = v.allocator.on_tick(now_s(), &nodes);
        if actions.is_empty() {
            return;
        }
        self.apply_actions(&ids, actions);
        // A drop frees room: resumptions elsewhere and waiting jobs.
        self.schedule();
    }

    /// Carries out resumptions and drops; `ids` names the nodes.
    pub(super) fn apply_actions(&mut self, ids: &[String], actions: Vec<ValueAction>) {
        for a in actions {
            match a {
                ValueAction::Resume {
                    job,
                    node,
                    cpu_shares,
                    expected_value,
                    reason,
                } => {
                    let Some(j) = self.cluster.jobs.get(&job) else {
                        continue;
                    };
                    if j.state != JobState::Paused {
                        continue;
                    }
                    let worker = &ids[node];
                    info!(%job, %worker, cpu_shares, expected_value, "resuming");
                    let resume = command(j, Action::Resume(pb::Resume {}));
                    // The share the allocator chose for it now; cpus 0 keeps it unlimited
                    // within the worker, as it started.
                    let limits = command(
                        j,
                        Action::SetLimits(pb::SetLimits {
                            cpus: 0.0,
                            cpu_shares,
                        }),
                    );
                    let worker = worker.clone();
                    self.send(&worker, resume);
                    self.send(&worker, limits);
                    if let Some(v) = &mut self.value {
                        v.shares.insert(job.clone(), cpu_shares);
                    }
                    self.set_state(&job, JobState::Running, &reason);
                }
                ValueAction::Drop { job, node, reason } => {
                    let Some(j) = self.cluster.jobs.get(&job) else {
                        continue;
                    };
                    if j.is_terminal() {
                        continue;
                    }
                    info!(%job, worker = %ids[node], %reason, "dropping");
                    if j.occupies_worker() {
                        let cmd = command(
                            j,
                            Action::Stop(pb::Stop {
                                reason: reason.clone(),
                                remove: true,
                            }),
                        );
                        let worker = ids[node].clone();
                        self.send(&worker, cmd);
                    }
                    if let Some(j) = self.cluster.jobs.get_mut(&job) {
                        j.finished_unix_ms = now_ms();
                    }
                    self.set_state(&job, JobState::Rejected, &reason);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
