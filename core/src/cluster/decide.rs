//! Asking the policy and carrying out its answers: settling after every step (departures,
//! drains, pending jobs), placement, preemption, limits, resumptions and drops.

use super::pass::Pass;
use super::policy::WaitKind;
use super::*;

impl Core {
    /// Offers departures to the policy, continues drains, places pending jobs; until nothing
    /// changes.
    pub(super) fn settle(&mut self) {
        for _ in 0..MAX_SETTLE_ROUNDS {
            while let Some((worker, job)) = self.departures.pop_front() {
                let view = policy_view!(self);
                let decisions = match job {
                    Some(job) => self.policy.on_departure(self.now, &worker, &job, view),
                    None => self.policy.on_room(self.now, &worker, view),
                };
                self.apply(decisions);
            }
            if !self.dirty {
                return;
            }
            self.dirty = false;
            self.continue_drains();
            self.schedule();
        }
        warn!("the cluster did not settle after {MAX_SETTLE_ROUNDS} rounds");
    }

    /// Places pending jobs, oldest first, as long as the policy finds workers for them.
    ///
    /// Jobs told to wait for room are not asked again while no worker's placement snapshot
    /// changes (`waiting_for_room`): the policy promised the same answer until one does, and
    /// asking every pending job whenever one became pending made a backlog of n jobs cost n
    /// answers a submission (`docs/performance.md`, "A backlog of waiting jobs"). Once one
    /// has changed, a job of a kind ([`ClusterPolicy::wait_kind`]) already told to wait for
    /// room in the same pass, at the same snapshots, gets that answer without a question; and
    /// once every kind has had its answer and every job of each holds it already
    /// ([`kinds::Kinds`]), the pass ends: in a full cluster, every job that ended had the
    /// policy asked about the whole backlog, then every waiting job visited. Before that, a
    /// run of jobs whose kinds hold their answers is skipped to the next job of another kind
    /// ([`kinds::Kinds::next_unheld`]): a kind whose first job waits far back in the queue
    /// had every job before it visited. The answers are the ones a full pass would give, so
    /// the decisions are too.
    pub(super) fn schedule(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        #[cfg(test)]
        let (full, run_of) = (self.every_pass_full, self.skip_after);
        #[cfg(not(test))]
        let (full, run_of) = (false, super::pass::RUN);
        if full {
            self.waiting_for_room = None;
        }
        let after = match self.waiting_for_room {
            Some((seq, touches)) if touches == self.index.touches() => seq + 1,
            _ => 0,
        };
        // The jobs pending now; one that comes while the pass runs waits for the next.
        let Some(last) = self.pending.last_key_value().map(|(&seq, _)| seq) else {
            return;
        };
        let mut pass = Pass::new(after == 0, full, run_of, &self.kinds, self.index.touches());
        let mut from = after;
        // In chunks: the queue changes as jobs are placed, and a pass may end long before the
        // end of it.
        'pass: while from <= last {
            let chunk: Vec<(u64, JobId)> = (self.pending.range(from..=last))
                .take(256)
                .map(|(&seq, id)| (seq, id.clone()))
                .collect();
            let Some(&(seq, _)) = chunk.last() else {
                break;
            };
            from = seq + 1;
            // Jobs of this chunk before it are skipped ([`Pass::in_a_run`]).
            let mut skip_to = 0;
            for (seq, id) in chunk {
                if seq < skip_to {
                    continue;
                }
                let job = &self.jobs[&id];
                if !matches!(job.phase, JobPhase::Pending) {
                    continue;
                }
                let kind = self.policy.wait_kind(job);
                if let Some(reason) = pass.known(kind, self.index.touches()) {
                    self.wait(&id, kind, reason);
                    if pass.in_a_run(kind, &self.kinds) {
                        // Visiting the jobs of kinds that hold their answers changes nothing:
                        // on to the next of another kind, far back in a backlog of two kinds.
                        let holds = |k| pass.holds(k, &self.kinds);
                        match self.kinds.next_unheld(seq + 1, last, holds) {
                            Some(next) if next < from => skip_to = next,
                            Some(next) => {
                                from = next;
                                continue 'pass;
                            }
                            // Every job left holds its kind's answer: the pass is over, and
                            // gave every job its answer, as one that visits them all does.
                            None => break 'pass,
                        }
                    }
                    continue;
                }
                let view = policy_view!(self);
                match self.policy.place(self.now, &self.jobs[&id], view) {
                    Admission::Place {
                        worker,
                        cpu_shares,
                        victims,
                        reason,
                        attributes,
                    } => {
                        pass.acted();
                        // Victims first: their CPU is what the new job was promised.
                        for v in victims {
                            self.preempt(v);
                        }
                        self.start(&id, &worker, cpu_shares, reason, attributes);
                    }
                    Admission::Wait { reason, for_room } => {
                        self.wait(&id, kind, &reason);
                        pass.waits(kind, &reason);
                        if !for_room {
                            pass.acted();
                        } else if let Some(k) = kind
                            && pass.waits_for_room(k, reason, &self.kinds)
                        {
                            break 'pass;
                        }
                    }
                    Admission::Reject { reason } => {
                        pass.acted();
                        // A job that ran (its worker lost, it waits to be placed again) is
                        // given up, not refused: REJECTED says it never ran.
                        let ran = self.jobs.get(&id).is_some_and(|j| j.epoch > 0);
                        let to = if ran {
                            info!(job = %id, %reason, "job dropped: it can no longer earn anything");
                            JobPhase::Dropped
                        } else {
                            info!(job = %id, %reason, "job rejected");
                            JobPhase::Rejected
                        };
                        self.transition(&id, to, reason);
                    }
                }
            }
        }
        // A pass of waits only touched nothing: the count is the one the answers were given at.
        self.waiting_for_room = if pass.for_room_only() {
            (self.pending.last_key_value()).map(|(&seq, _)| (seq, self.index.touches()))
        } else {
            None
        };
        pass.end(&mut self.kinds);
    }

    /// Pending job `id`, of `kind`, waits, for `reason`. Its record changes only when the
    /// reason does: a pass that found a backlog waiting as before had the store write all of
    /// it again. Taken by reference: most jobs of a backlog already hold it, and copying it
    /// for each was a copy per job per pass.
    fn wait(&mut self, id: &str, kind: Option<WaitKind>, reason: &str) {
        let held = &self.jobs[id].reason;
        if held != reason {
            debug!(job = %id, %reason, "job waits");
            self.kinds.reasoned(kind, held, reason);
            self.job_mut(id).expect("exists").reason = reason.to_owned();
        }
    }

    pub(super) fn start(
        &mut self,
        id: &str,
        worker: &str,
        cpu_shares: u32,
        reason: String,
        mut attributes: BTreeMap<String, String>,
    ) {
        let command = self.next_command_id();
        let to = JobPhase::Starting {
            worker: self.worker_id(worker),
            command: command.clone(),
        };
        let job = &self.jobs[id];
        let epoch = job.epoch + 1;
        attributes.insert("policy".into(), self.policy.name().into());
        // Why its first start waited, if a pass said so (`why` shows it once the job has left
        // the queue). A job pending again holds why it stopped until a pass answers it, so
        // only the first start's reason is surely a wait's.
        if job.epoch == 0 && job.reason != reasons::SUBMITTED {
            let waited = format!("{:.0}s: {}", self.now - job.submitted_at, job.reason);
            attributes.insert("waited".into(), waited);
        }
        let mut e = Event::new(EventKind::JobPlaced, reason);
        e.job = Some(id.into());
        e.worker = Some(worker.into());
        e.epoch = epoch;
        e.attributes = attributes;
        if !self.transition(id, to, format!("starting on {worker}")) {
            return;
        }
        info!(job = %id, %worker, epoch, policy = self.policy.name(), "job placed");
        self.out.push(Effect::Event(e));
        self.send(
            worker,
            Command {
                id: command,
                job: id.into(),
                epoch,
                action: Action::Start { cpu_shares },
            },
        );
    }

    pub(super) fn apply(&mut self, decisions: Vec<Decision>) {
        for d in decisions {
            match d {
                Decision::Move {
                    job,
                    to,
                    reason,
                    attributes,
                } => {
                    self.begin_move(&job, &to, reason, attributes);
                }
                Decision::Keep {
                    job,
                    reason,
                    mut attributes,
                } => {
                    let Some(worker) = self.jobs.get(&job).and_then(|j| j.worker().cloned()) else {
                        continue;
                    };
                    info!(%job, %reason, "migration declined");
                    attributes.insert("outcome".into(), "declined".into());
                    self.migration_event(&job, &worker, reason, attributes);
                }
                Decision::Preempt(v) => self.preempt(v),
                Decision::SetLimits {
                    job,
                    cpus,
                    cpu_shares,
                    reason,
                    mut attributes,
                } => {
                    let Some(j) = self.job_mut(&job) else {
                        continue;
                    };
                    let JobPhase::Running { worker } = &j.phase else {
                        continue;
                    };
                    let (worker, epoch) = (worker.clone(), j.epoch);
                    j.assigned_cpus = (cpus > 0.0).then_some(cpus).into();
                    self.send_to(&worker, &job, epoch, Action::SetLimits { cpus, cpu_shares });
                    // Recorded, so `why` can say what the job was given and why.
                    attributes.insert("cpu_shares".into(), cpu_shares.to_string());
                    if cpus > 0.0 {
                        attributes.insert("cpus".into(), format!("{cpus:.2}"));
                    }
                    self.job_event(EventKind::Limits, &job, &worker, reason, attributes);
                }
                Decision::Resume {
                    job,
                    cpu_shares,
                    reason,
                } => {
                    let Some(JobPhase::Paused { worker }) =
                        self.jobs.get(&job).map(|j| j.phase.clone())
                    else {
                        continue;
                    };
                    info!(%job, %worker, cpu_shares, "resuming");
                    if self.unpause(&job, &worker, reason) {
                        let epoch = self.jobs[&job].epoch;
                        // The share chosen for it now; cpus 0 keeps it unlimited within the
                        // worker, as it started.
                        self.send_to(
                            &worker,
                            &job,
                            epoch,
                            Action::SetLimits {
                                cpus: 0.0,
                                cpu_shares,
                            },
                        );
                    }
                }
                Decision::Drop { job, reason } => {
                    let Some(j) = self.jobs.get(&job) else {
                        continue;
                    };
                    if j.is_terminal() {
                        continue;
                    }
                    info!(%job, %reason, "dropping");
                    self.abandon_move(&job, &reason);
                    let j = &self.jobs[&job];
                    if let Some(w) = j.worker().cloned() {
                        let epoch = j.epoch;
                        self.send_to(
                            &w,
                            &job,
                            epoch,
                            Action::Stop {
                                reason: reason.clone(),
                                discard: false,
                            },
                        );
                    }
                    self.transition(&job, JobPhase::Dropped, reason);
                }
            }
        }
    }

    pub(super) fn preempt(&mut self, v: Victim) {
        let Some(job) = self.jobs.get(&v.job) else {
            return;
        };
        let Some(worker) = job.worker().cloned() else {
            return;
        };
        let epoch = job.epoch;
        info!(job = %v.job, %worker, how = ?v.how, reason = %v.reason, "preempting");
        match v.how {
            Preempt::Pause => {
                if self.transition(
                    &v.job,
                    JobPhase::Paused {
                        worker: worker.clone(),
                    },
                    v.reason,
                ) {
                    self.freeze(&worker, &v.job, epoch, true);
                }
            }
            Preempt::Stop => {
                self.send_to(
                    &worker,
                    &v.job,
                    epoch,
                    Action::Stop {
                        reason: v.reason.clone(),
                        discard: false,
                    },
                );
                self.transition(&v.job, JobPhase::Dropped, v.reason);
            }
        }
    }
}
