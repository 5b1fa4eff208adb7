//! What agents say: registration and reconciliation, heartbeats, progress (with ETAs and the
//! stopping rule), command results, exits and migration requests. An agent may speak only of
//! incarnations started on its own worker ([`Core::may_speak`]).

use super::*;

impl Core {
    pub(super) fn register(&mut self, conn: ConnId, reg: Register) {
        let id = reg.worker.clone();
        let now = self.now;
        if let Some(reason) = self.second_agent(&reg) {
            warn!(worker = %id, instance = %reg.instance_id, "refused a second agent process registering as a connected worker");
            self.out.push(Effect::Rejected {
                conn,
                worker: id.clone(),
                reason,
            });
            self.refuse(Refusal::SecondAgent, Some(id));
            return;
        }
        let known = self.workers.contains_key(&id);
        if let Some(old) = self.workers.get(&id).and_then(|w| w.conn) {
            // Reconnected before the old stream's end reached us: the new stream wins, and
            // anything still arriving on the old one is refused.
            self.conns.remove(&old);
        }
        self.conns.insert(conn, id.clone());
        let restarted = self
            .workers
            .get(&id)
            .is_some_and(|w| w.instance_id != reg.instance_id);
        self.workers.get_or_insert_with(&id, || Worker {
            id: id.clone(),
            state: WorkerPhase::Ready,
            cpu_capacity: 0.0,
            memory_bytes: 0,
            calibration: 1.0,
            labels: BTreeMap::new(),
            conn: None,
            instance_id: String::new(),
            last_seen: now,
            last_heard: now,
            alpha: None,
            interval_s: None,
            jobs: Default::default(),
            inbound: Default::default(),
            shared_since: now,
            stops_owed: Vec::new(),
        });
        // Written through the one door, new or not: the store and the placement index hear.
        let w = self.worker_mut(&id).expect("just inserted");
        w.cpu_capacity = reg.cpu_capacity;
        w.memory_bytes = reg.memory_bytes;
        w.calibration = if reg.calibration > 0.0 {
            reg.calibration
        } else {
            1.0
        };
        w.labels = reg.labels.clone();
        w.instance_id = reg.instance_id.clone();
        w.last_seen = now;
        w.conn = Some(conn);
        w.state = w.state.heard_from();
        let state = w.state.state();
        self.out.push(Effect::Registered {
            conn,
            registered: Registered {
                policy: self.policy.name(),
                mode: self.policy.worker_mode(),
                migration: self.policy.agent_migration(),
                heartbeat_interval: self.config.heartbeat_interval,
            },
        });
        info!(worker = %id, cpus = reg.cpu_capacity, containers = reg.containers.len(), reconnect = known, "worker registered");
        let reason = if known {
            // How many still run: a fenced worker comes back with its containers exited. A
            // paused one is said apart (a new user's walk read "1 running" of a frozen job).
            let n = reg.containers.len();
            let live = reg.containers.iter().filter(|c| c.running);
            let paused = live.clone().filter(|c| c.paused).count();
            format!(
                "re-registered with {n} container{}, {} running{}{}",
                if n == 1 { "" } else { "s" },
                live.count() - paused,
                if paused > 0 {
                    format!(", {paused} paused")
                } else {
                    String::new()
                },
                if restarted { " (agent restarted)" } else { "" }
            )
        } else {
            "registered".into()
        };
        self.worker_event(&id, state, reason);
        self.reconcile(&id, &reg.containers, restarted);
        self.dirty = true;
    }

    /// Why `reg` comes from a second agent process with a connected worker's id, if it does:
    /// another instance, while the worker's stream is open and was heard from within two
    /// heartbeats. Two agents with one `--worker-id` took the stream from each other at every
    /// reconnect; now the first keeps it. A restarted agent's old stream has ended by then
    /// (its process is gone) or fallen silent (its host crashed), and is taken over as
    /// before; so is one re-registering as the same instance (a new connection of the same
    /// process). A registration without an instance id cannot be told apart, and is taken.
    fn second_agent(&self, reg: &Register) -> Option<String> {
        let w = self.workers.get(&reg.worker)?;
        let heard = self.now - w.alive_at();
        let other = !reg.instance_id.is_empty()
            && !w.instance_id.is_empty()
            && w.instance_id != reg.instance_id;
        (other
            && w.conn.is_some()
            && !matches!(w.state, WorkerPhase::Lost { .. })
            && heard <= 2.0 * self.config.heartbeat_interval)
            .then(|| {
                format!(
                    "worker {} is connected from another agent process (heard {heard:.1}s ago): \
                     give each agent its own --worker-id, or stop the other",
                    reg.worker
                )
            })
    }

    /// Brings the core's view of `worker` in line with what its agent says it runs.
    /// `restarted`: its agent is a new process (its instance id changed), which knows nothing
    /// of the commands the old one was sent.
    pub(super) fn reconcile(
        &mut self,
        worker: &str,
        reported: &[ContainerReport],
        restarted: bool,
    ) {
        for c in reported {
            if c.running && self.readopt(worker, c) {
                continue;
            }
            let Some(job) = self.jobs.get(&c.job) else {
                let owed = (self.workers[worker].stops_owed.iter())
                    .any(|o| o.job == c.job && o.epoch == c.epoch);
                if c.running && owed {
                    // Told to stop while its agent was away, and archived since (a job
                    // cancelled then, and enough others finished after it): stopped all the
                    // same, or a job every API calls ended would run on, unaccounted for.
                    info!(%worker, job = %c.job, epoch = c.epoch, "stopping the container of an archived job that was told to stop");
                    let reason = "its job has ended (stopped while its agent was away)".into();
                    let stop = Action::Stop {
                        reason,
                        discard: false,
                    };
                    self.send_to(worker, &c.job, c.epoch, stop);
                    continue;
                }
                // A container from before this manager started: leave the user's work alone
                // rather than kill what we cannot account for. An exited one is most likely
                // a finished job's, archived since (`Core::archive`): nothing to say.
                if c.running {
                    warn!(%worker, job = %c.job, "agent runs a container of an unknown job; leaving it alone");
                } else {
                    debug!(%worker, job = %c.job, "agent reports an exited container of an unknown or archived job");
                }
                continue;
            };
            let current = job.is_current(worker, c.epoch);
            if !current || job.is_terminal() {
                if c.running {
                    let (why, said) = if job.is_terminal() {
                        let state = job.state().label();
                        let said = format!(
                            "its container on {worker} ran on after it was {state}, while \
                             {worker} was away: stopped"
                        );
                        (format!("job is {state}"), said)
                    } else {
                        let now_on = (job.worker()).map_or(String::new(), |w| format!(" on {w}"));
                        let said = format!(
                            "incarnation {} still ran on {worker} beside incarnation {}{now_on} \
                             (its worker was lost, and nothing stopped it there): stopped, its \
                             checkpoint discarded",
                            c.epoch, job.epoch
                        );
                        ("superseded incarnation".into(), said)
                    };
                    // A Stop that went down a live stream is on its way: the container is
                    // stopping, not astray (a review).
                    let stopping = (self.workers[worker].stops_owed.iter())
                        .any(|o| o.job == c.job && o.epoch == c.epoch && o.sent);
                    // A superseded incarnation is killed: its checkpoint would overwrite the
                    // current one's (the walk's find: the job later resumed from it).
                    let stop = Action::Stop {
                        reason: why,
                        discard: !current,
                    };
                    self.send_to(worker, &c.job, c.epoch, stop);
                    self.stop_no_longer_waits(&c.job, worker, "was told to stop");
                    // Said where users look, not only in the agent's log (a walk: two copies
                    // ran for 28 s and only the agent's log said so).
                    if !stopping {
                        let attributes = BTreeMap::new();
                        self.job_event_at(
                            EventKind::Stray,
                            &c.job,
                            worker,
                            c.epoch,
                            said,
                            attributes,
                        );
                    }
                }
                continue;
            }
            if let (false, Some(e)) = (c.running, &c.exit) {
                // Its exit, read now rather than when the message that follows comes (then
                // it changes nothing): until then the job was held as running, or paused, on
                // a worker where nothing of it ran, and the policies acted on it. A walk: an
                // agent that fenced its jobs while the manager was down came back; the first
                // exit read freed the worker, and the value policy resumed the other job (its
                // container already gone) and paused it again before its exit was read.
                self.exited(worker, e.clone());
            }
            let Some(job) = self.jobs.get(&c.job) else {
                continue;
            };
            let id = c.job.clone();
            match (&job.phase, c.running) {
                (JobPhase::Starting { .. } | JobPhase::Lost { .. }, true) => {
                    if let Some(j) = self.job_mut(&id) {
                        j.container_id = c.container_id.clone();
                        if let Some(s) = c.last_step {
                            j.step = j.step.max(s);
                        }
                    }
                    self.adopt(worker, c, format!("re-adopted on {worker}"));
                }
                // A save, or its result, may have been lost with the old stream: the same
                // command again (the agent answers a repeated id from its cache, or when the
                // save ends). Its container may have exited since: the agent that got the
                // Save still answers it. A restarted agent never got it, and will answer it
                // with an error (no container) while it reports the exit it did not ask for,
                // which decides (`exited`).
                (
                    JobPhase::Stopping { command, .. }
                    | JobPhase::Migrating(Move {
                        phase: MovePhase::Saving { command },
                        ..
                    }),
                    running,
                ) if running || !restarted => {
                    let cmd = self.save_command(command.clone(), &id, c.epoch);
                    self.send(worker, cmd);
                }
                // A Pause or Resume may have been lost with the old stream (each is sent
                // without waiting for an answer, the job's phase changed as it was sent): sent
                // again, or a job said to run stayed frozen (a review).
                (JobPhase::Running { .. }, true) if c.paused => {
                    self.freeze(worker, &id, c.epoch, false);
                }
                (JobPhase::Paused { .. }, true) if !c.paused => {
                    self.freeze(worker, &id, c.epoch, true);
                }
                // The jobs it was paused for may have left while its worker was away, or
                // while the manager was down (a new user's walk: paused on an idle worker
                // after a restart, until its value ran out).
                (JobPhase::Paused { .. }, true) => self.offer_room(worker),
                // The restore runs but its result may have been lost with the old stream (or
                // the old manager): the same Start again, answered from the agent's cache.
                (
                    JobPhase::Migrating(Move {
                        phase: MovePhase::Restoring { command },
                        ..
                    }),
                    true,
                ) => {
                    let cmd = Command {
                        id: command.clone(),
                        job: id.clone(),
                        epoch: c.epoch,
                        action: Action::Start {
                            cpu_shares: self.policy.start_shares(&id),
                        },
                    };
                    self.send(worker, cmd);
                }
                _ => {}
            }
        }
        // What the agent does not report running has exited: no stop is owed for it.
        let mut stopped = Vec::new();
        self.owed_stops(worker, |owed| {
            owed.retain(|o| {
                let running =
                    (reported.iter()).any(|c| c.running && c.job == o.job && c.epoch == o.epoch);
                if !running {
                    stopped.push(o.job.clone());
                }
                running
            })
        });
        for id in stopped {
            self.stop_no_longer_waits(&id, worker, "had stopped");
        }
        // Current incarnations placed here that the agent does not report.
        let missing: Vec<JobId> = self.workers[worker]
            .jobs
            .iter()
            .filter(|id| {
                let j = &self.jobs[*id];
                !reported.iter().any(|c| c.job == j.id && c.epoch == j.epoch)
            })
            .cloned()
            .collect();
        for id in missing {
            let job = &self.jobs[&id];
            let epoch = job.epoch;
            match job.phase.clone() {
                JobPhase::Starting { command, .. }
                | JobPhase::Migrating(Move {
                    phase: MovePhase::Restoring { command },
                    ..
                }) => {
                    // The start may have been lost with the old stream: send the very same
                    // command again.
                    let cmd = Command {
                        id: command,
                        job: id.clone(),
                        epoch,
                        action: Action::Start {
                            cpu_shares: self.policy.start_shares(&id),
                        },
                    };
                    self.send(worker, cmd);
                }
                JobPhase::Migrating(Move {
                    phase: MovePhase::Saving { .. },
                    ..
                })
                | JobPhase::Stopping { .. } => {
                    // Its container is gone (saved and reported, or its agent restarted):
                    // nothing of it runs.
                    self.saving_ended(&id, worker, &format!("its container is gone from {worker}"));
                }
                _ => {
                    // Nothing of it runs here any more, and how it ended was not reported:
                    // restart it from its checkpoint rather than lose it.
                    self.restart(
                        &id,
                        &format!("its container is no longer on {worker}"),
                        false,
                    );
                }
            }
        }
    }

    /// Re-adopts the running container `c` of a lost worker's job that comes back before
    /// the job has started anywhere else, if its stop never left ([`OwedStop::withdrawable`]):
    /// the stop is withdrawn and the job runs on where it was, with the steps it made.
    /// Returns whether it did.
    fn readopt(&mut self, worker: &str, c: &ContainerReport) -> bool {
        let Some(job) = self.jobs.get(&c.job) else {
            return false;
        };
        let waiting = matches!(job.phase, JobPhase::Pending)
            && job.epoch == c.epoch
            && job.incarnations.last().is_some_and(|i| i.worker == worker);
        let withdrawable = (self.workers[worker].stops_owed.iter())
            .any(|o| o.job == c.job && o.epoch == c.epoch && o.withdrawable);
        if !(waiting && withdrawable) {
            return false;
        }
        let was_at = job.step;
        self.owed_stops(worker, |owed| {
            owed.retain(|o| !(o.job == c.job && o.epoch == c.epoch))
        });
        if let Some(j) = self.job_mut(&c.job) {
            j.container_id = c.container_id.clone();
            if let Some(s) = c.last_step {
                j.step = j.step.max(s);
            }
        }
        info!(%worker, job = %c.job, epoch = c.epoch, "re-adopting a lost worker's job: it had not restarted elsewhere");
        let at = (c.last_step)
            .filter(|&s| s > was_at)
            .map_or(String::new(), |s| {
                format!(" (its agent last read step {s})")
            });
        self.adopt(
            worker,
            c,
            format!(
                "re-adopted on {worker}{at}: its worker came back before it restarted elsewhere; no steps lost"
            ),
        )
    }

    /// Adopts the job of container `c` on `worker` again: paused if its agent reports it
    /// paused (a value policy's victim), else running. Taken for running, a frozen container
    /// stayed frozen with its job said to run (a review). A paused one is offered the
    /// worker's room ([`Core::offer_room`]): the jobs it
    /// was paused for may have left while it was away, and no departure would come to
    /// resume it (a review: it stayed paused on an empty worker until its value ran out).
    fn adopt(&mut self, worker: &str, c: &ContainerReport, reason: String) -> bool {
        let id = self.worker_id(worker);
        let paused = c.paused
            && (self.jobs.get(&c.job))
                .is_some_and(|j| !matches!(j.phase, JobPhase::Starting { .. }));
        let phase = if paused {
            JobPhase::Paused { worker: id.clone() }
        } else {
            JobPhase::Running { worker: id.clone() }
        };
        let adopted = self.transition(&c.job, phase, reason);
        if adopted && paused {
            self.offer_room(worker);
        }
        adopted
    }

    /// Job `id`, cancelled while `worker` was unreachable, said that its container stops when
    /// the worker is back ([`reasons::stop_waits`]); now it is back, and the container `how`
    /// ("was told to stop", "had stopped"). A walk read the waiting reason long after the stop.
    fn stop_no_longer_waits(&mut self, id: &str, worker: &str, how: &str) {
        let waited = reasons::stop_waits(worker);
        if let Some(j) = self.job_mut(id)
            && let Some(cancelled) = j.reason.strip_suffix(&waited)
        {
            j.reason =
                format!("{cancelled}; its container on {worker} {how} when {worker} came back");
        }
    }

    /// Offers `worker`'s room to its paused jobs ([`ClusterPolicy::on_room`]), once per step:
    /// where no job leaves, nothing else would resume them.
    pub(super) fn offer_room(&mut self, worker: &str) {
        let worker = self.worker_id(worker);
        if !(self.departures.iter()).any(|(w, job)| *w == worker && job.is_none()) {
            self.departures.push_back((worker, None));
        }
        self.dirty = true;
    }

    /// Job `id`, of which nothing runs, waits to start again from its checkpoint (or from
    /// the start), and says so, `why` first, with the steps lost. Its step is where it starts
    /// again: a job without a checkpoint was said to restart "from its checkpoint", and
    /// listed at the lost copy's step until its new copy's first line set it back to 0.
    /// `cut_off`: its worker was lost, and its agent, if only cut off from this manager (not
    /// dead or paused), has checkpointed it before stopping it (`--fence-after`): the new copy
    /// resumes from the newest checkpoint in its directory, which may be later than any known
    /// here (a walk: told "from the start, 20090 steps lost" of a job that resumed at step
    /// 81471).
    pub(super) fn restart(&mut self, id: &str, why: &str, cut_off: bool) {
        let Some(j) = self.jobs.get(id) else {
            return;
        };
        let lost = j.step.saturating_sub(j.checkpoint_step.unwrap_or(0));
        let why = match (j.checkpoint_step, cut_off) {
            (Some(c), false) => {
                format!("{why}; restarting from its checkpoint at step {c}, {lost} steps lost")
            }
            (None, false) => format!(
                "{why}; restarting from the start (it has no checkpoint), {lost} steps lost"
            ),
            (known, true) => format!(
                "{why}; restarting from its newest checkpoint: {}, but an agent cut off from \
                 the manager saves one before it stops its jobs; up to {lost} steps lost",
                known.map_or("none is known here".to_string(), |c| {
                    format!("step {c} is known here")
                })
            ),
        };
        if self.transition(id, JobPhase::Pending, why)
            && let Some(j) = self.job_mut(id)
        {
            j.step = j.checkpoint_step.unwrap_or(0);
        }
    }

    pub(super) fn disconnected(&mut self, conn: ConnId, reason: &str) {
        let Some(worker) = self.conns.remove(&conn) else {
            return;
        };
        let Some(w) = self.worker_mut(&worker) else {
            return;
        };
        if w.conn == Some(conn) {
            w.conn = None;
            let state = w.state.state();
            warn!(%worker, %reason, "agent disconnected");
            self.worker_event(&worker, state, format!("disconnected: {reason}"));
        }
    }

    pub(super) fn agent_message(&mut self, worker: &str, message: AgentMessage) {
        if let Some(w) = self.workers.get_mut(worker) {
            // Liveness only (`Worker::last_heard`): not a change the store or placement sees.
            w.last_heard = self.now;
        }
        match message {
            AgentMessage::Heartbeat(hb) => self.heartbeat(worker, hb),
            AgentMessage::Progress(batch) => self.progress(worker, batch),
            AgentMessage::Result(r) => self.result(worker, r),
            AgentMessage::Exited(e) => self.exited(worker, e),
            AgentMessage::MigrationRequest { job, epoch, reason } => {
                self.migration_request(worker, &job, epoch, &reason)
            }
        }
    }

    /// Whether `worker` may speak of incarnation `epoch` of `job` (it was started there); if
    /// not, the message is refused and counted.
    pub(super) fn may_speak(&mut self, worker: &str, job: &str, epoch: u64) -> bool {
        match refusal(self.jobs.get(job), worker, epoch) {
            None => true,
            Some(what) => {
                self.out.push(refused_speaker(what, worker, job, epoch));
                false
            }
        }
    }

    /// The job of a report (a heartbeat's job or a progress line), to record what its agent
    /// says (progress, usage, the worker's view: a [soft](saved::Changes::soft) change), if
    /// `worker` may speak of it ([`Core::may_speak`]). Anything the decisions stand on goes
    /// through [`Core::job_mut`] or [`Core::transition`]. One lookup where checking and
    /// then fetching took two: every reported job comes this way, which makes it the core's
    /// busiest lookup (the profile at 10,000 workers in `docs/performance.md`).
    fn reported_job(&mut self, worker: &str, job: &str, epoch: u64) -> Option<&mut Job> {
        let found = match self.jobs.get_mut(job) {
            Some(j) => match refusal(Some(j), worker, epoch) {
                None => Ok(j),
                Some(what) => Err(what),
            },
            None => Err(Refusal::UnknownJob),
        };
        match found {
            Ok(j) => {
                if let Some(changes) = &mut self.changes {
                    changes.soft(&j.id);
                }
                Some(j)
            }
            // Fields, not `refuse`: the job's borrow is returned above, so only the other
            // fields of `self` are free here.
            Err(what) => {
                self.out.push(refused_speaker(what, worker, job, epoch));
                None
            }
        }
    }

    pub(super) fn refuse(&mut self, what: Refusal, worker: Option<WorkerId>) {
        self.out.push(Effect::Refused { what, worker });
    }

    pub(super) fn heartbeat(&mut self, worker: &str, hb: Heartbeat) {
        let now = self.now;
        // What placement sees of the worker changes only if it comes back from Lost or a
        // job's view changes what its snapshot shows: only then is the index touched.
        let Some(w) = self.worker_record_mut(worker) else {
            return;
        };
        // Read while the record is at hand: looking the worker up again by its text, twice
        // per heartbeat, was a measurable part of the simulator at 10,000 workers.
        let (speed, id, shared_since) = (w.calibration, w.id.clone(), w.shared_since);
        w.last_seen = now;
        w.alpha = hb.alpha;
        w.interval_s = hb.interval_s;
        let mut reindex = false;
        if matches!(w.state, WorkerPhase::Lost { .. }) {
            w.state = w.state.heard_from();
            let state = w.state.state();
            reindex = true;
            self.worker_event(worker, state, "heartbeats resumed".into());
            self.dirty = true;
        }
        for s in hb.jobs {
            let Some(j) = self.reported_job(worker, &s.job, s.epoch) else {
                continue;
            };
            if !j.is_current(worker, s.epoch) {
                continue;
            }
            // The service it had since the last report, at the reference speed.
            j.cpu_s = j.service_at(now, speed);
            j.view_from = j.view_at;
            j.view_at = now.into();
            j.note_use(s.cpu_usage, shared_since);
            let view = WorkerView {
                category: s.category,
                growth_efficiency: s.growth_efficiency,
                cpu_limit: s.cpu_limit,
                cpu_usage: s.cpu_usage,
            };
            reindex |= j.view.shown() != view.shown();
            j.view = view;
            // Its worker is back and says the incarnation runs: it was never gone.
            if matches!(j.phase, JobPhase::Lost { .. }) {
                self.transition(
                    &s.job,
                    JobPhase::Running { worker: id.clone() },
                    format!("{worker} is back and runs it"),
                );
            }
        }
        if reindex {
            self.index.touch(&id);
        }
        let view = policy_view!(self);
        let decisions = self
            .policy
            .on_report(self.now, Report::Heartbeat { worker: &id }, view);
        self.apply(decisions);
    }

    pub(super) fn progress(&mut self, worker: &str, batch: ProgressBatch) {
        let cap = self.config.progress_history;
        let (now, speed) = (
            self.now,
            self.workers.get(worker).map_or(1.0, |w| w.calibration),
        );
        for s in batch.samples {
            let Some(j) = self.reported_job(worker, &s.job, s.epoch) else {
                continue;
            };
            if j.is_terminal() {
                continue;
            }
            j.samples += 1;
            // The first line of an incarnation: none of its epoch came before.
            let newest = j.progress.back();
            let first = newest.as_ref().is_none_or(|p| p.epoch != s.epoch);
            // Kept as a point at most every POINT_EVERY_MS (the first line of an incarnation,
            // a checkpoint's and the last step's always): a job that prints hundreds of lines a second would
            // otherwise fill its history in a fraction of a second, between two heartbeats
            // (the points' CPU time), and its estimates would read no CPU or one heartbeat's
            // against a few hundred steps (a new user saw ETAs jump between 5 s and 10
            // minutes every second).
            // A job with a stop rule keeps every line: its rule reads the best metric a window
            // of steps back, and points a second apart would widen the window it asked for.
            let spaced = j.spec.stop.is_some()
                || newest.is_none_or(|p| s.unix_ms - p.unix_ms >= POINT_EVERY_MS);
            let last = s.total_steps.is_some_and(|t| s.step >= t);
            // Lines of an incarnation before the current one (a lost worker's agent flushing
            // them after the job restarted elsewhere) are no points of the current run: among
            // its points they read as its steps, and its rate as theirs (a review). Their
            // checkpoint still counts, below.
            let current = s.epoch == j.epoch;
            if current && (first || spaced || s.checkpointed || last) {
                let point = ProgressPoint {
                    unix_ms: s.unix_ms,
                    step: s.step,
                    value: s.value,
                    epoch: s.epoch,
                    // As of its line, not its arrival (`Job::service_at`).
                    cpu_s: j.service_at((s.unix_ms as f64 / 1000.0).min(now), speed),
                };
                j.progress.push(point, cap);
            }
            if s.checkpointed {
                j.checkpoint_step = j.checkpoint_step.max(Some(s.step));
            }
            if s.epoch != j.epoch {
                continue;
            }
            let starting = matches!(j.phase, JobPhase::Starting { .. });
            let resumed = j.resuming.take_if(|r| r.to == worker);
            // An incarnation's first line says where it really starts: from its checkpoint,
            // or from 0 if it had none, whether or not its Start's answer came first (a job
            // restarted after its worker was lost, with no checkpoint, kept showing the old
            // copy's step). Within one the step only goes up (lines may arrive out of order
            // across a reconnect).
            j.step = if starting || resumed.is_some() || first {
                s.step
            } else {
                j.step.max(s.step)
            };
            if let Some(t) = s.total_steps {
                j.total_steps = t;
            }
            if s.value.is_some() {
                j.metric_value = s.value.into();
            }
            // Read while the job is at hand: most lines pass no quarter of the steps and most
            // jobs have no stop rule, and looking the job up again for each made three lookups
            // of every progress line.
            let (due, has_rule) = (due_predictions(j), j.spec.stop.is_some());
            let resumed = resumed.map(|r| (r, j.step));
            if let Some((r, step)) = resumed {
                let downtime = self.now - r.started;
                // A move counts once the new incarnation has shown progress: until then it
                // may still fail to train on its new worker.
                let j = self.job_mut(&s.job).expect("exists");
                j.migrations += 1;
                j.last_migration_downtime = downtime.into();
                let ms = (downtime * 1000.0).round() as u64;
                let attributes = BTreeMap::from([
                    ("downtime_ms".to_string(), ms.to_string()),
                    ("from".to_string(), r.from.to_string()),
                    ("to".to_string(), r.to.to_string()),
                    ("reason".to_string(), r.reason.as_str().to_string()),
                    ("step".to_string(), step.to_string()),
                    ("outcome".to_string(), "completed".to_string()),
                ]);
                self.migration_event(
                    &s.job,
                    worker,
                    format!("resumed on {worker} at step {step}; downtime {ms} ms"),
                    attributes,
                );
            } else if starting {
                self.transition(
                    &s.job,
                    JobPhase::Running {
                        worker: self.worker_id(worker),
                    },
                    reasons::running_on(worker),
                );
            }
            if due.iter().any(|&d| d) {
                self.note_predictions(&s.job, due);
            }
            if has_rule {
                self.check_stop_rule(&s.job);
            }
        }
        for m in batch.malformed {
            if self.may_speak(worker, &m.job, m.epoch)
                && let Some(j) = self.job_mut(&m.job)
            {
                j.malformed = j.malformed.saturating_add(m.count);
            }
        }
    }

    /// Records the finish time predicted now for the quarters of its steps the job has just
    /// passed (`due`, [`due_predictions`]).
    pub(super) fn note_predictions(&mut self, id: &str, due: [bool; 3]) {
        let Some(eta) = self.eta(id, self.now) else {
            return;
        };
        let j = self.job_mut(id).expect("exists");
        for (at, _) in j.predicted_at.iter_mut().zip(due).filter(|(_, d)| *d) {
            *at = eta.finish_at.into();
        }
    }

    /// Stop at convergence: when the job's rule fires on its reported metric, it is
    /// checkpointed and stopped, and ends Completed with what the rule saw.
    pub(super) fn check_stop_rule(&mut self, id: &str) {
        let Some(j) = self.jobs.get(id) else {
            return;
        };
        let (Some(rule), JobPhase::Running { worker }) = (j.spec.stop, &j.phase) else {
            return;
        };
        let Some(last) = j.progress.back().filter(|p| p.epoch == j.epoch) else {
            return;
        };
        let (Some(_), Some(from)) = (last.value, last.step.checked_sub(rule.window_steps)) else {
            return;
        };
        // Best-so-far, as early stopping's patience rule: the best value up to a window ago
        // against the best up to now, so that a noisy evaluation neither fires the rule (an
        // uptick) nor hides a plateau. None while the history does not reach a window back.
        let sign = if j.spec.maximize { -1.0 } else { 1.0 };
        let best = |upto: u64| {
            j.progress
                .iter()
                .filter(|p| p.step <= upto)
                .filter_map(|p| p.value.map(|v| sign * v))
                .reduce(f64::min)
        };
        let (Some(a), Some(b)) = (best(from), best(last.step)) else {
            return;
        };
        if !rule.fires(a, b) {
            return;
        }
        let why = format!(
            "converged at step {}: best metric {:.4}, improved {:.2}% over the last {} steps",
            last.step,
            sign * b,
            100.0 * converge_policy::estimate::StopRule::improvement(a, b),
            rule.window_steps
        );
        let (worker, epoch) = (worker.clone(), j.epoch);
        let command = self.next_command_id();
        let to = JobPhase::Stopping {
            worker: worker.clone(),
            command: command.clone(),
            why: why.clone(),
        };
        if self.transition(id, to, format!("{why}; saving its checkpoint")) {
            let save = self.save_command(command, id, epoch);
            self.send(&worker, save);
        }
    }

    pub(super) fn result(&mut self, worker: &str, r: CommandResult) {
        // A Stop answered ok was carried out: the agent answers once Docker has stopped the
        // container. One answered with an error found no container: settled, unless a
        // Start was under way when it was sent (a job cancelled while starting), whose
        // container may yet come (its success gets another Stop, below; freed at the error,
        // the room went to another job while the container started and ran on). That
        // Start's failure settles it: no container will come.
        self.owed_stops(worker, |owed| {
            owed.retain(|o| {
                if o.command == r.command {
                    !r.ok && o.start.is_some()
                } else {
                    r.ok || o.start.as_ref() != Some(&r.command)
                }
            })
        });
        if !self.may_speak(worker, &r.job, r.epoch) {
            return;
        }
        let job = &self.jobs[&r.job];
        if job.is_terminal() {
            // The Start of this very container was taken before the job ended: this is the
            // same result again (an agent sends again what its manager had not acknowledged
            // when the stream broke), and the container's exit is known or on its way.
            if let (true, ResultDetail::Started { container_id }) = (r.ok, &r.detail)
                && !(r.epoch == job.epoch
                    && !container_id.is_empty()
                    && *container_id == job.container_id)
            {
                // Ended while its Start was under way (cancelled while starting): the agent
                // found no container to stop then, and has started one now. Stop it, or it
                // trains on for a job every API calls ended.
                let reason = format!("job is {}", job.state().label());
                let stop = Action::Stop {
                    reason,
                    discard: false,
                };
                self.send_to(worker, &r.job, r.epoch, stop);
            } else {
                debug!(job = %r.job, "result for a finished job ignored");
            }
            return;
        }
        // Only the current incarnation, on the worker it was sent to, may answer the command
        // its phase waits for. A worker that ran an older incarnation may speak of that one
        // (`may_speak`), and command ids are easy to guess (a prefix and a counter): taken as
        // the answer, its result would move the job onto it, or start a restore while the
        // real source still runs unsaved. Late answers to older commands fall through to
        // `other_result`, as before.
        if !job.is_current(worker, r.epoch) && job.phase.awaits(&r.command) {
            self.out.push(refused_speaker(
                Refusal::ForeignJob,
                worker,
                &r.job,
                r.epoch,
            ));
            return;
        }
        let id = r.job.clone();
        // Only the incarnation it was sent to, on its worker, answers a Pause or Resume (a
        // command's id is never used twice: it names the incarnation too).
        let freeze = (job.freezing.as_ref())
            .filter(|fz| fz.command == r.command)
            .filter(|_| job.is_current(worker, r.epoch))
            .map(|fz| fz.pause);
        if let Some(pause) = freeze {
            self.frozen(worker, &r, pause);
            return;
        }
        match job.phase.clone() {
            JobPhase::Migrating(m) => match &m.phase {
                MovePhase::Saving { command } if *command == r.command => {
                    self.saved(&id, worker, &m, &r)
                }
                MovePhase::Restoring { command } if *command == r.command => {
                    self.restored(&id, worker, &m, &r)
                }
                _ => self.other_result(worker, &r),
            },
            JobPhase::Stopping { command, why, .. } if command == r.command => {
                if r.ok {
                    let j = self.job_mut(&id).expect("exists");
                    j.exit_code = Some(0);
                    // Its last steps may be reported after this result: the save's step is
                    // where its checkpoint is.
                    if let ResultDetail::Saved { step, .. } = r.detail {
                        j.step = j.step.max(step);
                    }
                    let kept = if super::moves::wrote_checkpoint(&r.detail) {
                        "checkpoint kept"
                    } else {
                        "it wrote no checkpoint"
                    };
                    self.transition(&id, JobPhase::Completed, format!("{why}; {kept}"));
                } else {
                    warn!(job = %id, error = %r.error, "save at convergence failed; it runs on");
                    self.transition(
                        &id,
                        JobPhase::Running {
                            worker: self.worker_id(worker),
                        },
                        format!("could not stop at convergence: {}", r.error),
                    );
                }
            }
            JobPhase::Starting { command, .. } if command == r.command => {
                if r.ok {
                    self.started(&id, worker, &r.detail);
                } else {
                    self.transition(
                        &id,
                        JobPhase::Failed,
                        format!("could not start on {worker}: {}", r.error),
                    );
                }
            }
            _ => self.other_result(worker, &r),
        }
    }

    /// The answer to job `r.job`'s last Pause (`pause`) or Resume ([`Core::freeze`]). One
    /// that failed left its container as it was: a job paused for another runs on beside it,
    /// and one resumed stays frozen, until the policy decides again (a value policy pauses a
    /// victim or resumes a job when room changes). Only the phase the command set is put back.
    fn frozen(&mut self, worker: &str, r: &CommandResult, pause: bool) {
        if let Some(j) = self.jobs.get_mut(&r.job) {
            j.freezing = None;
        }
        if r.ok {
            return;
        }
        warn!(job = %r.job, %worker, error = %r.error, "pause or resume failed");
        let id = self.worker_id(worker);
        let (to, why) = match &self.jobs[&r.job].phase {
            JobPhase::Paused { worker: on } if pause && *on == id => (
                JobPhase::Running { worker: id },
                format!("could not pause on {worker}: {}; it runs on", r.error),
            ),
            JobPhase::Running { worker: on } if !pause && *on == id => (
                JobPhase::Paused { worker: id },
                format!("could not resume on {worker}: {}; it stays paused", r.error),
            ),
            _ => return,
        };
        self.transition(&r.job, to, why);
    }

    pub(super) fn other_result(&mut self, worker: &str, r: &CommandResult) {
        if !r.ok {
            warn!(job = %r.job, %worker, error = %r.error, "command failed");
        }
    }

    pub(super) fn started(&mut self, id: &str, worker: &str, detail: &ResultDetail) {
        if let (Some(j), ResultDetail::Started { container_id }) = (self.job_mut(id), detail) {
            j.container_id = container_id.clone();
        }
        self.transition(
            id,
            JobPhase::Running {
                worker: self.worker_id(worker),
            },
            reasons::running_on(worker),
        );
    }

    pub(super) fn exited(&mut self, worker: &str, e: ContainerExited) {
        // A job told to stop or save left the split when it was told (the others' uses were
        // read then, against the split with it) but ran on until now: only now is its CPU
        // free. (One that still shares leaves it in the transition this exit makes.)
        let sharing = (self.jobs.get(&e.job))
            .is_some_and(|j| j.phase.shares_cpu() && j.worker().is_some_and(|w| w == worker));
        let now = self.now;
        let mut owed = false;
        self.owed_stops(worker, |stops| {
            let before = stops.len();
            stops.retain(|o| o.job != e.job || o.epoch != e.epoch);
            owed = stops.len() < before;
        });
        // Only an exit of what still held CPU here: the same exit read again (a registration
        // carried it, its message followed) started the split anew, and every other job's
        // use was read from scratch (a review).
        let held = owed || (self.jobs.get(&e.job)).is_some_and(|j| j.is_current(worker, e.epoch));
        if !sharing
            && held
            && let Some(w) = self.workers.get_mut(worker)
        {
            w.shared_since = now;
        }
        if !self.may_speak(worker, &e.job, e.epoch) {
            return;
        }
        let job = &self.jobs[&e.job];
        // An older incarnation ended (superseded), or the job is over: nothing changes.
        if job.is_terminal() || !job.is_current(worker, e.epoch) {
            return;
        }
        let id = e.job.clone();
        let saving = matches!(
            &job.phase,
            JobPhase::Migrating(Move {
                phase: MovePhase::Saving { .. },
                ..
            }) | JobPhase::Stopping { .. }
        );
        if let (Some(j), Some(s)) = (self.job_mut(&id), e.last_step) {
            j.step = j.step.max(s);
        }
        if saving {
            if e.exit_code == 0 && e.done {
                // It finished its last step as we asked it to save: nothing left to move.
                if matches!(self.jobs[&id].phase, JobPhase::Migrating(_)) {
                    let attributes =
                        BTreeMap::from([("outcome".to_string(), "aborted".to_string())]);
                    self.migration_event(
                        &id,
                        worker,
                        "completed while being saved".into(),
                        attributes,
                    );
                }
                self.job_mut(&id).expect("exists").exit_code = Some(0);
                self.transition(&id, JobPhase::Completed, "completed while being saved");
            } else if !e.requested {
                // An exit its agent did not ask for: the container died before the Save
                // reached it, or its agent restarted since (a new agent reports the exits it
                // finds, asked for by no one). Either way no Saved result will say more, and
                // nothing of it runs: the move goes on from its checkpoint, the stop ends.
                let how = format!(
                    "its container exited (code {}) on {worker} with no save reported",
                    e.exit_code
                );
                self.saving_ended(&id, worker, &how);
            }
            // Otherwise the Saved result (which waits for this exit) drives the next step.
            return;
        }
        if e.requested && !e.done {
            // Stopped on request before finishing and outside a move: its agent checkpointed
            // it while cut off from us (self-fencing). It is restartable from its checkpoint,
            // and that incarnation has stopped, so it can start again now.
            self.transition(
                &id,
                JobPhase::Pending,
                format!(
                    "checkpointed and stopped by {worker}'s agent; restarting from its checkpoint"
                ),
            );
            return;
        }
        let job = &self.jobs[&id];
        let short = job.total_steps == 0 || job.step < job.total_steps;
        if e.exit_code == 0 && !e.done && job.samples > 0 && short {
            // It keeps the progress contract but did not print its last line: by the contract
            // an exit 0 then is a checkpoint on SIGTERM (one whose request was not seen: its
            // agent restarted meanwhile), not the end of its training.
            self.transition(
                &id,
                JobPhase::Pending,
                format!(
                    "exited 0 at step {} of {} without finishing (checkpointed); restarting from its checkpoint",
                    job.step, job.total_steps
                ),
            );
            return;
        }
        let now = self.now;
        let j = self.job_mut(&id).expect("exists");
        j.exit_code = Some(e.exit_code);
        // Its container ran, whether or not its Start's result or a progress line said so
        // (its agent restarted meanwhile): it started by now at the latest.
        if j.started_at.is_none() {
            j.started_at = now.into();
        }
        let (to, reason) = if e.exit_code == 0 {
            (JobPhase::Completed, "exited 0".to_string())
        } else if e.oom_killed {
            (JobPhase::Failed, "killed: out of memory".to_string())
        } else if e.stderr_tail.trim().is_empty() {
            (
                JobPhase::Failed,
                format!("exited with code {}", e.exit_code),
            )
        } else {
            (
                JobPhase::Failed,
                format!(
                    "exited with code {}; its stderr ends: {}",
                    e.exit_code,
                    e.stderr_tail.trim_end()
                ),
            )
        };
        self.transition(&id, to, reason);
    }

    /// Job `id` was being saved (a move, or a stop at convergence) and its container has
    /// ended with no Saved result to come (`how`, for its events): a move goes on from its
    /// checkpoint, a stop has stopped from its last checkpoint on.
    fn saving_ended(&mut self, id: &str, worker: &str, how: &str) {
        match self.jobs[id].phase.clone() {
            JobPhase::Migrating(_) => {
                let reason = format!("{how}; restoring from its checkpoint");
                self.migration_event(id, worker, reason, BTreeMap::new());
                self.after_save(id);
            }
            JobPhase::Stopping { why, .. } => {
                let reason = format!("{why}; {how}, its checkpoint kept");
                self.transition(id, JobPhase::Completed, reason);
            }
            _ => {}
        }
    }

    pub(super) fn migration_request(&mut self, worker: &str, job: &str, epoch: u64, reason: &str) {
        if !self.may_speak(worker, job, epoch) {
            return;
        }
        let j = &self.jobs[job];
        let running_here = matches!(&j.phase, JobPhase::Running { worker: w } if w == worker);
        if j.epoch != epoch || !running_here {
            debug!(%job, "migration request ignored (stale or not running)");
            return;
        }
        let (worker, job) = (self.worker_id(worker), j.id.clone());
        let view = policy_view!(self);
        let decisions = self.policy.on_report(
            self.now,
            Report::MigrationRequest {
                worker: &worker,
                job: &job,
                reason,
            },
            view,
        );
        self.apply(decisions);
    }
}

/// Why an agent on `worker` may not speak of incarnation `epoch` of `job`, if it may not.
fn refusal(job: Option<&Job>, worker: &str, epoch: u64) -> Option<Refusal> {
    match job {
        None => Some(Refusal::UnknownJob),
        // The current incarnation first: nearly every report is about it, and its epoch and
        // worker are in the job's record, where the list of incarnations is one more cache
        // miss per reported job (a tenth of the simulator's time at 10,000 workers;
        // `docs/performance.md`). The current incarnation is always in that list.
        Some(j) if j.is_current(worker, epoch) => None,
        Some(j) if j.ran_on(worker, epoch) => None,
        Some(_) => Some(Refusal::ForeignJob),
    }
}

/// The refusal of what an agent on `worker` said about incarnation `epoch` of `job`.
fn refused_speaker(what: Refusal, worker: &str, job: &str, epoch: u64) -> Effect {
    if what == Refusal::ForeignJob {
        warn!(%worker, %job, epoch, "refused: a message about a job this worker never ran");
    }
    Effect::Refused {
        what,
        worker: Some(worker.into()),
    }
}

/// Which of 25%, 50% and 75% of its steps `j` has passed with no finish predicted there yet:
/// the ETA is scored against the real finish at each (`Job::eta_errors`).
fn due_predictions(j: &Job) -> [bool; 3] {
    if j.total_steps == 0 {
        return [false; 3];
    }
    let done = j.step as f64 / j.total_steps as f64;
    let mut due = [false; 3];
    for ((d, q), at) in due.iter_mut().zip([0.25, 0.5, 0.75]).zip(&j.predicted_at) {
        *d = done >= q && at.is_none();
    }
    due
}
