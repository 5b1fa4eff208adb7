//! The user's requests that change the cluster: submit, cancel (final in every phase), drain
//! (and drains that wait for room), undrain.

use super::reasons::{SUBMITTED, running_on, stop_waits};
use super::*;

impl Core {
    pub(super) fn submit(&mut self, id: JobId, spec: JobSpec) -> Result<Reply, RequestError> {
        if let Err(e) = self.policy.check_submit(&spec) {
            return Err(RequestError::Invalid {
                field: e.field,
                message: e.message,
            });
        }
        if self.jobs.contains_key(&id) {
            return Err(RequestError::FailedPrecondition(format!(
                "job {id} exists already"
            )));
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        if let Some(changes) = &mut self.changes {
            changes.job(&id);
        }
        self.valued += usize::from(spec.value_curve.is_some());
        self.jobs.insert(Box::new(Job {
            id: id.clone(),
            seq,
            spec,
            phase: JobPhase::Pending,
            reason: SUBMITTED.into(),
            epoch: 0,
            incarnations: Vec::new(),
            container_id: String::new(),
            submitted_at: self.now,
            started_at: OptF64::NONE,
            finished_at: OptF64::NONE,
            step: 0,
            total_steps: 0,
            metric_value: OptF64::NONE,
            samples: 0,
            malformed: 0,
            progress: Progress::default(),
            points_estimate: Default::default(),
            view: WorkerView::default(),
            view_at: OptF64::NONE,
            view_from: OptF64::NONE,
            cap_read: OptF64::NONE,
            use_most: OptF64::NONE,
            freezing: None,
            cpu_s: 0.0,
            assigned_cpus: OptF64::NONE,
            predicted_at: [OptF64::NONE; 3],
            checkpoint_step: None,
            migrations: 0,
            last_migration_downtime: OptF64::NONE,
            resuming: None,
            exit_code: None,
        }));
        self.pending.insert(seq, id.clone());
        let job = &self.jobs[&id];
        self.kinds
            .joined(self.policy.wait_kind(job), seq, &job.reason);
        self.dirty = true;
        let mut e = Event::new(EventKind::JobState, "submitted");
        e.job = Some(id.clone());
        e.to = Some(JobState::Pending);
        self.out.push(Effect::Event(e));
        Ok(Reply::Job(id))
    }

    /// Cancel is final: every incarnation that may run is told to stop, the job becomes
    /// Cancelled, and since nothing leaves a terminal phase, no later result (a save that
    /// completes, a restore that starts) can bring it back.
    /// `by` names the caller in the job's reason (`cancelled by ana`), as Slurm's accounting
    /// says who cancelled a job; "user" when the API is open.
    pub(super) fn cancel(&mut self, id: &str, by: &str) -> Result<Reply, RequestError> {
        let job = self
            .jobs
            .get(id)
            .ok_or_else(|| RequestError::JobNotFound(id.into()))?;
        // Asking again changes nothing and is answered as the first time: a client whose
        // answer was lost retries, and was told it had failed.
        if job.state() == JobState::Cancelled {
            return Ok(Reply::Job(id.into()));
        }
        if job.is_terminal() {
            return Err(RequestError::FailedPrecondition(format!(
                "job {id} is already {}",
                job.state().label()
            )));
        }
        // The one incarnation that may run: the source while a move saves, the target once it
        // restores (the source has stopped by then).
        let (worker, epoch) = (job.worker().cloned(), job.epoch);
        let reason = format!("cancelled by {}", if by.is_empty() { "user" } else { by });
        self.abandon_move(id, &reason);
        // Its Stop waits for the worker's agent: said, or the container a user still sees
        // running looked like a cancel that failed (a walk: 35 s, until the agent came back).
        let said = match &worker {
            Some(w) if (self.workers.get(w)).is_some_and(|w| w.conn.is_none()) => {
                format!("{reason}{}", stop_waits(w))
            }
            _ => reason.clone(),
        };
        if let Some(w) = worker {
            let stop = Action::Stop {
                reason,
                discard: false,
            };
            self.send_to(&w, id, epoch, stop);
        }
        self.transition(id, JobPhase::Cancelled, said);
        Ok(Reply::Job(id.into()))
    }

    /// Drains a worker (`draining`: nothing new is placed on it, and [`Core::continue_drains`]
    /// moves its running jobs away) or undrains it, Kubernetes' uncordon: it takes jobs again,
    /// a move its drain already began goes on (a save on its way, or a restore elsewhere), and
    /// the jobs still waiting to leave stay. Asking for the state a worker is in changes
    /// nothing.
    pub(super) fn set_draining(
        &mut self,
        worker: &str,
        draining: bool,
    ) -> Result<Reply, RequestError> {
        let Some(w) = self.worker_mut(worker) else {
            return Err(RequestError::WorkerNotFound(worker.into()));
        };
        let before = w.state;
        w.state = match w.state {
            WorkerPhase::Ready | WorkerPhase::Draining if draining => WorkerPhase::Draining,
            WorkerPhase::Ready | WorkerPhase::Draining => WorkerPhase::Ready,
            WorkerPhase::Lost { since, .. } => WorkerPhase::Lost { since, draining },
        };
        if before != w.state {
            let state = w.state.state();
            let jobs = (!draining).then(|| w.jobs.clone());
            let why = if draining { "drained" } else { "undrained" };
            self.worker_event(worker, state, format!("{why} by user"));
            // The jobs the drain could not move yet said so; they now simply run here.
            let waiting = draining_reason(worker);
            for id in jobs.iter().flatten() {
                if self.jobs.get(id).is_some_and(|j| j.reason == waiting)
                    && let Some(j) = self.job_mut(id)
                {
                    j.reason = running_on(worker);
                }
                // A paused job is offered the room again: a departure while the worker
                // drained offered it none (a new user's walk: paused on an undrained, idle
                // worker until its value ran out).
                if (self.jobs.get(id)).is_some_and(|j| matches!(j.phase, JobPhase::Paused { .. })) {
                    self.offer_room(worker);
                }
            }
        }
        // A drain to begin, or room for pending jobs.
        self.dirty = true;
        Ok(Reply::Worker(worker.into()))
    }

    /// Forgets worker `worker` ([`Input::Forget`]): only a lost one (its agent is gone; one
    /// still connected would register it again at once) and only once no job is on it (the
    /// jobs lost with it leave when they restart elsewhere, `Config::recover_lost_after` after
    /// the loss). Its record leaves the store too. The policy hears first, while the worker
    /// still has its place (SpeCon knows workers by place).
    pub(super) fn forget_worker(&mut self, worker: &str) -> Result<Reply, RequestError> {
        let Some(w) = self.workers.get(worker) else {
            return Err(RequestError::WorkerNotFound(worker.into()));
        };
        let what_to_do = match w.state {
            WorkerPhase::Lost { .. } => None,
            WorkerPhase::Ready => Some("drain it to move its jobs away, then stop its agent"),
            WorkerPhase::Draining => Some("stop its agent once its jobs have moved away"),
        };
        if let Some(what_to_do) = what_to_do {
            return Err(RequestError::FailedPrecondition(format!(
                "worker {worker} is {}: only a lost worker is forgotten ({what_to_do})",
                w.state.state().label()
            )));
        }
        if !w.jobs.is_empty() {
            let jobs: Vec<&str> = w.jobs.iter().map(|j| j.as_ref()).collect();
            return Err(RequestError::FailedPrecondition(format!(
                "worker {worker} still holds {} job(s), lost with it: {}; they restart \
                 elsewhere {:.0}s after the loss, and it can be forgotten then",
                jobs.len(),
                jobs.join(", "),
                self.config.recover_lost_after
            )));
        }
        // A move saving toward it names it (its restore finds it gone and goes elsewhere):
        // forgotten now, a restart found a job moving to a worker it does not know.
        if !w.inbound.is_empty() {
            let jobs: Vec<&str> = w.inbound.iter().map(|j| j.as_ref()).collect();
            return Err(RequestError::FailedPrecondition(format!(
                "worker {worker} is the target of a move that is saving: {}; once the save \
                 ends the job goes elsewhere, and the worker can be forgotten then",
                jobs.join(", ")
            )));
        }
        let id = self.worker_id(worker);
        let place = self
            .index
            .position(worker)
            .expect("every worker is indexed");
        self.policy.on_worker_forgotten(place, &id);
        if let Some(conn) = self.workers.remove(worker).and_then(|w| w.conn) {
            // A silent stream the loss did not end (an agent stalled while its connection
            // lived): closed, so that an agent that wakes up registers again rather than
            // speak on a stream no worker owns.
            self.conns.remove(&conn);
            self.out.push(Effect::Close {
                conn,
                worker: id.clone(),
                reason: format!("worker {worker} was forgotten; register again"),
            });
        }
        if let Some(changes) = &mut self.changes {
            changes.forgotten(&id);
        }
        self.index.touch(&id);
        info!(%worker, "worker forgotten");
        self.worker_event(worker, WorkerState::Lost, "forgotten by user".into());
        Ok(Reply::Worker(id))
    }

    /// Moves the running and paused jobs of every draining, connected worker elsewhere, as far
    /// as the policy finds room; the others wait (and say so) until capacity appears. A paused
    /// job (a value policy's victim) was left where it was: it held the drain for ever, and
    /// could not be resumed there (a new user's walk). It is moved as a running one is,
    /// resumed first: a move begins from a running job (its agent unpauses a container to
    /// save it anyway).
    pub(super) fn continue_drains(&mut self) {
        self.index.refresh(&self.workers, &self.jobs);
        let draining: Vec<WorkerId> = self
            .index
            .draining()
            .filter(|id| self.workers[*id].conn.is_some())
            .cloned()
            .collect();
        for worker in draining {
            let jobs: Vec<JobId> = self.workers[&worker]
                .jobs
                .iter()
                .filter(|id| {
                    let phase = &self.jobs[*id].phase;
                    matches!(phase, JobPhase::Running { .. } | JobPhase::Paused { .. })
                })
                .cloned()
                .collect();
            for id in jobs {
                match self.place_elsewhere(&id, &worker) {
                    Some(to) => {
                        let paused = matches!(self.jobs[&id].phase, JobPhase::Paused { .. });
                        let why = || format!("resumed to be moved off {worker}, which drains");
                        if paused && !self.unpause(&id, &worker, why()) {
                            continue;
                        }
                        self.begin_move(&id, &to, MoveReason::Drain, BTreeMap::new());
                    }
                    _ => {
                        let why = draining_reason(&worker);
                        // A paused job keeps saying why it is paused.
                        let running = matches!(self.jobs[&id].phase, JobPhase::Running { .. });
                        let mut said = false;
                        if running
                            && let Some(j) = self.job_mut(&id)
                            && j.reason != why
                        {
                            j.reason = why;
                            said = true;
                        }
                        if said {
                            debug!(job = %id, %worker, "no worker can take the job; it stays while the worker drains");
                            // In `why` too, once: a reason changes no event, and a drain that
                            // could move nothing left no trace there (a walk).
                            // Declined, as Alg. 2's kept jobs are: counted, and shown as
                            // no move in `why`.
                            let attributes = BTreeMap::from([
                                ("reason".to_string(), "drain".to_string()),
                                ("outcome".to_string(), "declined".to_string()),
                            ]);
                            let reason = format!(
                                "not moved off {worker}, which drains: no other worker has room \
                                 for it yet; it runs on here until one has"
                            );
                            self.migration_event(&id, &worker, reason, attributes);
                        }
                    }
                }
            }
        }
    }
}

/// What a job that a drain could not move yet says.
fn draining_reason(worker: &str) -> String {
    format!("{worker} is draining; waiting for a worker with room")
}
