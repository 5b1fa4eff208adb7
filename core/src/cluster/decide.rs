//! Asking the policy and carrying out its answers: settling after every step (departures,
//! drains, pending jobs), placement, preemption, limits, resumptions and drops.

use super::*;

/// Kinds of wait for room a pass keeps to give again ([`Core::schedule`]): a backlog of jobs
/// asking for a few sizes is answered by one question per size.
const ALIKE_KINDS: usize = 8;

impl Core {
    /// Offers departures to the policy, continues drains, places pending jobs; until nothing
    /// changes.
    pub(super) fn settle(&mut self) {
        for _ in 0..MAX_SETTLE_ROUNDS {
            while let Some((worker, job)) = self.departures.pop_front() {
                let view = policy_view!(self);
                let decisions = self.policy.on_departure(self.now, &worker, &job, view);
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
    /// has changed, a job that waits alike with one already told to wait for room in the
    /// same pass, at the same snapshots, gets its answer without a question
    /// ([`ClusterPolicy::waits_alike`]): in a full cluster, every job that ended had the
    /// policy asked about the whole backlog. The answers are the ones a full pass would give,
    /// so the decisions are too.
    pub(super) fn schedule(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        #[cfg(test)]
        if self.every_pass_full {
            self.waiting_for_room = None;
        }
        let after = match self.waiting_for_room {
            Some((seq, touches)) if touches == self.index.touches() => seq + 1,
            _ => 0,
        };
        let pending: Vec<JobId> = self
            .pending
            .range(after..)
            .map(|(_, id)| id.clone())
            .collect();
        // Whether every answer of this pass was a wait for room (then it changed nothing).
        let mut for_room_only = true;
        // The waits for room given in this pass, with a job each was given to, at the touch
        // count then: a job the policy says waits alike gets the same answer without asking
        // while the count stays ([`ClusterPolicy::waits_alike`]). A few kinds of request make
        // most backlogs; past `ALIKE_KINDS` the newest answer replaces the oldest.
        // Each asked job is kept as a copy: looking it up by id for every job of the backlog
        // was a third of a full cluster's pass.
        let mut alike: VecDeque<(Job, String)> = VecDeque::new();
        let mut alike_at = self.index.touches();
        for id in pending {
            if alike_at != self.index.touches() {
                alike.clear();
                alike_at = self.index.touches();
            }
            #[cfg(test)]
            if self.every_pass_full {
                alike.clear();
            }
            let job = &self.jobs[&id];
            if !matches!(job.phase, JobPhase::Pending) {
                continue;
            }
            let same = (alike.iter()).find(|(asked, _)| self.policy.waits_alike(asked, job));
            if let Some((_, reason)) = same {
                self.wait(&id, reason);
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
                    for_room_only = false;
                    // Victims first: their CPU is what the new job was promised.
                    for v in victims {
                        self.preempt(v);
                    }
                    self.start(&id, &worker, cpu_shares, reason, attributes);
                }
                Admission::Wait { reason, for_room } => {
                    for_room_only &= for_room;
                    if for_room {
                        if alike.len() == ALIKE_KINDS {
                            alike.pop_front();
                        }
                        alike.push_back((self.jobs[&id].clone(), reason.clone()));
                    }
                    self.wait(&id, &reason);
                }
                Admission::Reject { reason } => {
                    for_room_only = false;
                    info!(job = %id, %reason, "job rejected");
                    self.transition(&id, JobPhase::Rejected, reason);
                }
            }
        }
        // A pass of waits only touched nothing: the count is the one the answers were given at.
        self.waiting_for_room = if for_room_only {
            (self.pending.last_key_value()).map(|(&seq, _)| (seq, self.index.touches()))
        } else {
            None
        };
    }

    /// Pending job `id` waits, for `reason`. Its record changes only when the reason does: a
    /// pass that found a backlog waiting as before had the store write all of it again. Taken
    /// by reference: most jobs of a backlog already hold it, and copying it for each was a
    /// copy per job per pass.
    fn wait(&mut self, id: &str, reason: &str) {
        if self.jobs[id].reason != reason {
            debug!(job = %id, %reason, "job waits");
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
        let epoch = self.jobs[id].epoch + 1;
        attributes.insert("policy".into(), self.policy.name().into());
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
                    if self.transition(
                        &job,
                        JobPhase::Running {
                            worker: worker.clone(),
                        },
                        reason,
                    ) {
                        let epoch = self.jobs[&job].epoch;
                        self.send_to(&worker, &job, epoch, Action::Resume);
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
                    if let Some(w) = j.worker().cloned() {
                        let epoch = j.epoch;
                        self.send_to(
                            &w,
                            &job,
                            epoch,
                            Action::Stop {
                                reason: reason.clone(),
                            },
                        );
                    }
                    self.transition(&job, JobPhase::Rejected, reason);
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
                    self.send_to(&worker, &v.job, epoch, Action::Pause);
                }
            }
            Preempt::Stop => {
                self.send_to(
                    &worker,
                    &v.job,
                    epoch,
                    Action::Stop {
                        reason: v.reason.clone(),
                    },
                );
                self.transition(&v.job, JobPhase::Rejected, v.reason);
            }
        }
    }
}
