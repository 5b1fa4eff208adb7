//! Moving a job by checkpoint: save on the source, then (only after the save's result) a new
//! incarnation on the target; a failed save leaves it running, a failed restore is retried on
//! the source, then elsewhere, then the job fails with its checkpoint kept.

use super::*;

impl Core {
    /// Step 1 of a move: the job is Migrating and its source is told to save. Step 2
    /// ([`Core::restore`]) follows only the save's result.
    pub(super) fn begin_move(
        &mut self,
        id: &str,
        to: &str,
        reason: MoveReason,
        mut attributes: BTreeMap<String, String>,
    ) -> bool {
        let from = match &self.jobs[id].phase {
            JobPhase::Running { worker } if worker != to => worker.clone(),
            _ => return false,
        };
        if !self.workers.get(to).is_some_and(Worker::schedulable) {
            return false;
        }
        let command = self.next_command_id();
        let m = Move {
            from: from.clone(),
            to: self.worker_id(to),
            reason,
            phase: MovePhase::Saving {
                command: command.clone(),
            },
            started: self.now,
            restore_attempts: 0,
        };
        if !self.transition(
            id,
            JobPhase::Migrating(m),
            format!("moving {from} -> {to} ({})", reason.as_str()),
        ) {
            return false;
        }
        info!(job = %id, %from, %to, reason = reason.as_str(), "migration started");
        attributes.insert("reason".into(), reason.as_str().into());
        attributes.insert("from".into(), from.to_string());
        attributes.insert("to".into(), to.to_string());
        attributes.insert("outcome".into(), "started".into());
        self.migration_event(
            id,
            &from,
            format!("migrating {from} -> {to} ({}): saving", reason.as_str()),
            attributes,
        );
        let epoch = self.jobs[id].epoch;
        let save = self.save_command(command, id, epoch);
        self.send(&from, save);
        true
    }

    pub(super) fn saved(&mut self, id: &str, worker: &str, m: &Move, r: &CommandResult) {
        if !r.ok {
            // Nothing was saved and nothing stopped it: it runs on where it was.
            warn!(job = %id, error = %r.error, "save failed; the job stays where it is");
            let attributes = BTreeMap::from([
                ("outcome".to_string(), "aborted".to_string()),
                ("reason".to_string(), m.reason.as_str().to_string()),
            ]);
            self.migration_event(
                id,
                worker,
                format!("aborted: save failed: {}", r.error),
                attributes,
            );
            self.transition(
                id,
                JobPhase::Running {
                    worker: m.from.clone(),
                },
                format!("migration aborted; still on {}", m.from),
            );
            return;
        }
        let mut attributes = BTreeMap::new();
        let how = match &r.detail {
            ResultDetail::Saved {
                step,
                checkpoint_bytes,
                save_ms,
                killed,
            } => {
                attributes.insert("step".to_string(), step.to_string());
                attributes.insert("checkpoint_bytes".to_string(), checkpoint_bytes.to_string());
                attributes.insert("save_ms".to_string(), save_ms.to_string());
                attributes.insert("killed".to_string(), killed.to_string());
                let from = match self.jobs[id].checkpoint_step {
                    Some(s) => format!("its last checkpoint (step {s})"),
                    None => "the start (it has no checkpoint)".to_string(),
                };
                if *killed {
                    format!("killed after ignoring SIGTERM; resuming from {from}")
                } else if !wrote_checkpoint(&r.detail) {
                    format!(
                        "stopped in {save_ms} ms but wrote no checkpoint (0 bytes); resuming from {from}"
                    )
                } else {
                    format!("saved at step {step} ({checkpoint_bytes} bytes) in {save_ms} ms")
                }
            }
            _ => "saved".to_string(),
        };
        if let ResultDetail::Saved { step, .. } = &r.detail
            && wrote_checkpoint(&r.detail)
            && let Some(j) = self.job_mut(id)
        {
            j.checkpoint_step = j.checkpoint_step.max(Some(*step));
        }
        self.migration_event(id, worker, how, attributes);
        self.after_save(id);
    }

    /// The source incarnation has stopped with its checkpoint: restore on the target, or on
    /// another worker if the target can no longer take it, or wait.
    pub(super) fn after_save(&mut self, id: &str) {
        let JobPhase::Migrating(m) = &self.jobs[id].phase else {
            return;
        };
        let to = m.to.clone();
        // A restarted manager hears its workers register again in any order: a target that
        // has not yet is still the move's target until its grace period ends. The restore's
        // Start is sent when it registers (`reconcile`), and if it never does it is declared
        // lost and the job restarts elsewhere from the same checkpoint (`lose_worker`).
        let target_ok = self
            .workers
            .get(&to)
            .is_some_and(|w| self.schedulable_or_expected(w));
        let target = if target_ok {
            Some(to)
        } else {
            let view = policy_view!(self);
            self.policy.place_move(self.now, &self.jobs[id], view)
        };
        match target {
            Some(to) => self.restore(id, &to),
            None => {
                let why = match self.jobs[id].checkpoint_step {
                    Some(step) => format!("saved; waiting for a worker (its checkpoint at step {step} is kept)"),
                    None => "stopped; waiting for a worker (it has no checkpoint: it will start from the beginning)".to_string(),
                };
                self.transition(id, JobPhase::Pending, why);
            }
        }
    }

    /// Where job `id`, which must leave worker `leaving` (drained, or its restore there just
    /// failed), goes: the policy's [`ClusterPolicy::place_move`] with that worker hidden from
    /// it ([`index::PlacementIndex::hide`]). A worker whose restore failed was as good a
    /// choice as when it was chosen, and chosen again the job waited as a new one instead of
    /// trying the next best worker; each policy filtering it out its own way missed the
    /// placers' fast paths, which read the index's orders.
    pub(super) fn place_elsewhere(&mut self, id: &str, leaving: &str) -> Option<WorkerId> {
        // A drained worker is not schedulable already: nothing to hide.
        let hide = self.workers.get(leaving).is_some_and(|w| w.schedulable());
        self.index.refresh(&self.workers, &self.jobs);
        if hide {
            self.index.hide(leaving);
        }
        let view = policy_view!(self);
        let to = self.policy.place_move(self.now, &self.jobs[id], view);
        // Shown as it is again before anything else reads the index.
        if hide {
            self.index.unhide(leaving);
        }
        debug_assert!(to.as_deref() != Some(leaving), "a hidden worker was chosen");
        to
    }

    /// A new incarnation on `to`, from the checkpoint. Only ever after the source saved (or
    /// its container is gone), never while the old incarnation may run.
    pub(super) fn restore(&mut self, id: &str, to: &str) {
        let JobPhase::Migrating(m) = self.jobs[id].phase.clone() else {
            return;
        };
        let command = self.next_command_id();
        let mut next = m;
        next.to = self.worker_id(to);
        next.restore_attempts += 1;
        next.phase = MovePhase::Restoring {
            command: command.clone(),
        };
        let reason = format!(
            "moving {} -> {to} ({}): restoring",
            next.from,
            next.reason.as_str()
        );
        if !self.transition(id, JobPhase::Migrating(next), reason) {
            return;
        }
        // The phase changes within Migrating, which a state event does not show.
        let step = self.jobs[id].checkpoint_step.unwrap_or(0);
        let cpu_shares = self.policy.restore_shares(id, &self.worker_id(to));
        let mut attributes = BTreeMap::from([("phase".to_string(), "restoring".to_string())]);
        // A share chosen for where it goes (the value policies), said as a placement says it.
        if cpu_shares > 0 {
            attributes.insert("cpu_shares".to_string(), cpu_shares.to_string());
        }
        self.migration_event(
            id,
            to,
            format!("restoring on {to} from its checkpoint (step {step})"),
            attributes,
        );
        let epoch = self.jobs[id].epoch;
        let cmd = Command {
            id: command,
            job: id.into(),
            epoch,
            action: Action::Start { cpu_shares },
        };
        self.send(to, cmd);
    }

    pub(super) fn restored(&mut self, id: &str, worker: &str, m: &Move, r: &CommandResult) {
        if r.ok {
            let to = self.worker_id(worker);
            if let Some(j) = self.job_mut(id) {
                j.resuming = Some(Box::new(Resuming {
                    from: m.from.clone(),
                    to,
                    reason: m.reason,
                    started: m.started,
                }));
                if let ResultDetail::Started { container_id } = &r.detail {
                    j.container_id = container_id.clone();
                }
            }
            self.transition(
                id,
                JobPhase::Running {
                    worker: self.worker_id(worker),
                },
                format!("restored on {worker}"),
            );
            return;
        }
        warn!(job = %id, %worker, error = %r.error, "restore failed");
        self.migration_event(
            id,
            worker,
            format!("restore on {worker} failed: {}", r.error),
            BTreeMap::new(),
        );
        if m.restore_attempts >= MAX_RESTORE_ATTEMPTS {
            let attributes = BTreeMap::from([
                ("outcome".to_string(), "failed".to_string()),
                ("reason".to_string(), m.reason.as_str().to_string()),
            ]);
            self.migration_event(id, worker, "restore failed; giving up".into(), attributes);
            self.transition(
                id,
                JobPhase::Failed,
                format!("restore failed {MAX_RESTORE_ATTEMPTS} times; its checkpoint is kept"),
            );
            return;
        }
        // The source first (it ran there a moment ago), then wherever the policy says.
        let request = policy::request(&self.jobs[id].spec);
        let source_ok = m.from != worker
            && self
                .workers
                .get(&m.from)
                .is_some_and(|w| w.schedulable() && self.view().snapshot(w).fits(&request));
        let next = if source_ok {
            Some(m.from.clone())
        } else {
            self.place_elsewhere(id, worker)
        };
        match next {
            Some(to) => self.restore(id, &to),
            None => {
                self.transition(
                    id,
                    JobPhase::Pending,
                    "restore failed; waiting for a worker (its checkpoint is kept)",
                );
            }
        }
    }
}

/// Whether a Save's result holds a checkpoint of the step it names. A container killed after
/// ignoring SIGTERM did not save; one that exited on SIGTERM without writing anything (an image
/// that does not follow the checkpoint contract: the agent then measures the directory, 0
/// bytes) did not either. Either resumes from the checkpoint it had, or from the start: the
/// core must not believe a later step is kept, or a move would lose the steps between without
/// anyone being told.
pub(super) fn wrote_checkpoint(detail: &ResultDetail) -> bool {
    matches!(
        detail,
        ResultDetail::Saved { killed: false, checkpoint_bytes, .. } if *checkpoint_bytes > 0
    )
}
