//! The timer: liveness in every worker state, recovery of jobs lost for longer than the grace
//! period, the policy's own timers.

use super::*;

impl Core {
    pub(super) fn tick(&mut self) {
        let now = self.now;
        let limit = self.config.heartbeat_interval * self.config.lost_after_missed as f64;
        // Liveness applies in every state, draining included; a restarted manager first gives
        // every worker its grace period to register again (`saved`).
        let recovering = self.recovering();
        let silent: Vec<WorkerId> = self
            .workers
            .values()
            .filter(|w| {
                !recovering
                    && !matches!(w.state, WorkerPhase::Lost { .. })
                    && now - w.alive_at() > limit
            })
            .map(|w| w.id.clone())
            .collect();
        for id in silent {
            self.lose_worker(&id);
        }
        if !recovering {
            self.recover_lost();
        }
        let view = policy_view!(self);
        let decisions = self.policy.on_tick(now, view);
        self.apply(decisions);
    }

    /// Whether a restarted manager is still giving its workers time to register again
    /// ([`Core::from_saved`]'s grace period).
    pub(super) fn recovering(&self) -> bool {
        self.now < self.grace_until
    }

    /// Whether `w` takes jobs, or will once its agent registers again: while a restarted
    /// manager gives its workers time to come back, a ready worker that has not is still
    /// counted on (a move's target, a size in the ETA queue's forecast).
    pub(super) fn schedulable_or_expected(&self, w: &Worker) -> bool {
        w.schedulable() || (self.recovering() && w.conn.is_none() && w.state == WorkerPhase::Ready)
    }

    pub(super) fn lose_worker(&mut self, id: &str) {
        let (now, missed) = (self.now, self.config.lost_after_missed);
        let w = self.worker_mut(id).expect("exists");
        let silent = now - w.alive_at();
        w.state = WorkerPhase::Lost {
            since: now,
            draining: w.state.draining(),
        };
        warn!(worker = %id, silent, "worker lost");
        let reason = format!("no heartbeat for {silent:.1}s ({missed} missed)");
        let jobs: Vec<JobId> = w.jobs.iter().cloned().collect();
        self.worker_event(id, WorkerState::Lost, reason.clone());
        for j in jobs {
            let phase = self.jobs[&j].phase.clone();
            if matches!(phase, JobPhase::Lost { .. }) {
                continue;
            }
            self.abandon_move(&j, &format!("worker {id} lost"));
            self.transition(
                &j,
                JobPhase::Lost {
                    worker: self.worker_id(id),
                    since: now,
                },
                format!("worker {id} lost: {reason}"),
            );
        }
    }

    /// Jobs Lost for longer than the grace period restart elsewhere from their checkpoints. By
    /// then the old incarnation has stopped: its agent fences itself when cut off, and one that
    /// is connected again is told to stop it.
    pub(super) fn recover_lost(&mut self) {
        if self.lost == 0 {
            return;
        }
        let now = self.now;
        let grace = self.config.recover_lost_after;
        let lost: Vec<(JobId, WorkerId, u64)> = self
            .workers
            .values()
            .flat_map(|w| w.jobs.iter())
            .filter_map(|id| {
                let j = &self.jobs[id];
                match &j.phase {
                    JobPhase::Lost { worker, since } if now - since >= grace => {
                        Some((id.clone(), worker.clone(), j.epoch))
                    }
                    _ => None,
                }
            })
            .collect();
        for (id, old, epoch) in lost {
            let unsent = self.workers.get(&old).is_some_and(|w| w.conn.is_none());
            self.send_to(
                &old,
                &id,
                epoch,
                Action::Stop {
                    reason: "superseded: restarted elsewhere after its worker was lost".into(),
                    // Whenever it arrives, a newer incarnation may be running from the
                    // checkpoint: this one must not write over it.
                    discard: true,
                },
            );
            if unsent {
                self.owed_stops(&old, |owed| {
                    (owed.iter_mut())
                        .filter(|o| o.job == id && o.epoch == epoch)
                        .for_each(|o| o.withdrawable = true)
                });
            }
            info!(job = %id, %old, "restarting a lost job elsewhere");
            self.restart(&id, &format!("worker {old} lost for {grace:.0}s"), true);
        }
    }
}
