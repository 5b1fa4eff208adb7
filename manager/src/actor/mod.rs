//! The manager actor: the one task that owns cluster state and makes cluster-wide decisions.
//!
//! Inputs arrive on three channels, handled one at a time, so no decision ever races another:
//! control requests from the gRPC handlers ([`Request`], answered on a `oneshot`), stream
//! events from the agent streams ([`StreamEvent`]), and a timer that detects silent workers.
//! Placement is delegated to a [`Placer`] from `converge-policy`; the actor only builds the
//! snapshots it looks at and carries out its answer. Moving a job between workers (SpeCon's
//! migrations, rebalancing, draining, recovering a lost job) lives in `migrate`.
//!
//! Tracing: each job's submission span is the root of the job's trace; its context is kept on
//! the job, and every later span of the job (placement, each migration, every command sent)
//! is parented to it, whatever the actor happens to be handling when it occurs. Every command
//! carries its `send_command` span's context, so the agent's spans join the same trace.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use converge_messenger::manager::{AgentLink, ConnectionId, StreamEvent};
use converge_messenger::pb::{
    self, Command, ContainerExited, ContainerReport, ContainerState, Event, EventKind, JobSpec,
    JobState, Register, WorkerState, agent_message::Kind as AgentKind, command::Action,
    manager_message::Kind as ManagerKind,
};
use converge_messenger::unix_ms;
use converge_policy::cluster::{JobRequest, JobSnapshot, Placement, Placer, WorkerSnapshot};
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Span, debug, field, info, info_span, warn};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::error::{Error, Result};
use crate::events::EventLog;
use crate::metrics::{ManagerMetrics, Round};
use crate::state::{Cluster, Job, MovePhase, Worker};
use crate::validate::{self, Limits};

mod migrate;
mod value;

pub(crate) use value::ValuePlacer;

/// Settings the actor runs with.
#[derive(Clone, Debug)]
pub struct ActorConfig {
    /// Identifies this manager process to agents.
    pub manager_id: String,
    /// The heartbeat period agents are told to use (and loss is measured in).
    pub heartbeat_interval: Duration,
    /// Heartbeats a worker may miss before it is marked lost.
    pub lost_after_missed: u32,
    /// Progress points kept per job.
    pub progress_history: usize,
    /// What agents run on their workers.
    pub worker_policy: pb::WorkerMode,
    /// Whether SpeCon migrations (Alg. 2 on requests, Alg. 3 rebalancing) are on.
    pub migration: bool,
    /// How long a container may take to checkpoint and exit before it is killed.
    pub save_deadline: Duration,
    /// How often Alg. 3 rebalancing runs (when migration is on).
    pub rebalance_interval: Duration,
    /// How long a job may stay Lost before it is restarted elsewhere from its checkpoint.
    pub recover_lost_after: Duration,
    /// Value-based allocation (`--policy value` or `value-dwop`): jobs with a value curve are
    /// admitted by this allocator instead of the placer (see `value`).
    pub value: Option<converge_policy::value::ValueAllocator>,
}

/// A control request, answered on its `reply` channel.
#[derive(Debug)]
pub enum Request {
    /// Validate and queue a job.
    Submit {
        /// What the user sent (boxed: a spec is far larger than the other requests).
        spec: Option<Box<JobSpec>>,
        /// The new job.
        reply: oneshot::Sender<Result<pb::Job>>,
    },
    /// One job.
    GetJob {
        /// Its id.
        id: String,
        /// Include the progress samples.
        include_progress: bool,
        /// The job.
        reply: oneshot::Sender<Result<pb::Job>>,
    },
    /// Jobs, filtered.
    ListJobs {
        /// Only this state (Unspecified = all).
        state: JobState,
        /// Only this worker (empty = all).
        worker_id: String,
        /// The jobs, in submission order.
        reply: oneshot::Sender<Vec<pb::Job>>,
    },
    /// Cancel a job.
    Cancel {
        /// Its id.
        id: String,
        /// The job after cancelling.
        reply: oneshot::Sender<Result<pb::Job>>,
    },
    /// All workers.
    ListWorkers {
        /// The workers, by id.
        reply: oneshot::Sender<Vec<pb::Worker>>,
    },
    /// Stop placing on a worker and move its jobs away.
    Drain {
        /// The worker.
        worker_id: String,
        /// The worker after the request.
        reply: oneshot::Sender<Result<pb::Worker>>,
    },
    /// Event history plus a live feed.
    Watch {
        /// Only this job (empty = all).
        job_id: String,
        /// Replay from this sequence number (0 = live only).
        from_seq: u64,
        /// History and live receiver.
        reply: oneshot::Sender<(Vec<Event>, broadcast::Receiver<Event>)>,
    },
}

/// The actor's state.
pub struct Actor {
    config: ActorConfig,
    placer: Box<dyn Placer + Send>,
    cluster: Cluster,
    events: EventLog,
    /// Which worker each live stream belongs to.
    conns: HashMap<ConnectionId, String>,
    metrics: ManagerMetrics,
    /// Value-based allocation, with `--policy value`/`value-dwop`.
    value: Option<value::ValueDriver>,
}

impl Actor {
    /// A manager with no workers and no jobs, counting into `metrics`.
    pub fn new(
        config: ActorConfig,
        placer: Box<dyn Placer + Send>,
        metrics: ManagerMetrics,
    ) -> Self {
        let value = config.value.clone().map(value::ValueDriver::new);
        Self {
            value,
            config,
            placer,
            cluster: Cluster::default(),
            events: EventLog::default(),
            conns: HashMap::new(),
            metrics,
        }
    }

    /// A span of job `id`'s work, parented to the job's root (its submission span) so that it
    /// joins the job's trace whatever the actor is handling now. Create it with
    /// `parent: None`; it must not have been entered yet.
    fn job_span(&self, id: &str, span: Span) -> Span {
        if let Some(j) = self.cluster.jobs.get(id) {
            let _ = span.set_parent(j.trace.clone());
        }
        span
    }

    /// Runs until `shutdown` is cancelled or every input channel is closed.
    pub async fn run(
        mut self,
        mut requests: mpsc::Receiver<Request>,
        mut streams: mpsc::Receiver<StreamEvent>,
        shutdown: CancellationToken,
    ) {
        let mut tick = tokio::time::interval(self.config.heartbeat_interval / 2);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut rebalance = tokio::time::interval(self.config.rebalance_interval);
        rebalance.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                Some(req) = requests.recv() => self.on_request(req),
                Some(ev) = streams.recv() => self.on_stream(ev),
                _ = tick.tick() => self.on_tick(Instant::now()),
                _ = rebalance.tick(), if self.config.migration => self.rebalance(Instant::now()),
                else => break,
            }
        }
        info!("manager actor stopped");
    }

    // ---- control requests ----

    fn on_request(&mut self, req: Request) {
        match req {
            Request::Submit { spec, reply } => {
                let _ = reply.send(self.submit(spec));
            }
            Request::GetJob {
                id,
                include_progress,
                reply,
            } => {
                let r = self
                    .cluster
                    .jobs
                    .get(&id)
                    .map(|j| j.to_pb(include_progress))
                    .ok_or(Error::JobNotFound(id));
                let _ = reply.send(r);
            }
            Request::ListJobs {
                state,
                worker_id,
                reply,
            } => {
                let mut jobs: Vec<&Job> = self
                    .cluster
                    .jobs
                    .values()
                    .filter(|j| state == JobState::Unspecified || j.state == state)
                    .filter(|j| worker_id.is_empty() || j.worker_id.as_deref() == Some(&worker_id))
                    .collect();
                jobs.sort_by_key(|j| j.seq);
                let _ = reply.send(jobs.into_iter().map(|j| j.to_pb(false)).collect());
            }
            Request::Cancel { id, reply } => {
                let _ = reply.send(self.cancel(&id));
            }
            Request::ListWorkers { reply } => {
                let policy = self.placer.name();
                let ws = self
                    .cluster
                    .workers
                    .values()
                    .map(|w| self.cluster.worker_pb(w, policy))
                    .collect();
                let _ = reply.send(ws);
            }
            Request::Drain { worker_id, reply } => {
                let _ = reply.send(self.drain(&worker_id));
            }
            Request::Watch {
                job_id,
                from_seq,
                reply,
            } => {
                let _ = reply.send(self.events.watch(&job_id, from_seq));
            }
        }
    }

    fn submit(&mut self, spec: Option<Box<JobSpec>>) -> Result<pb::Job> {
        let limits = Limits {
            max_cpus: self
                .cluster
                .workers
                .values()
                .map(|w| w.cpu_capacity)
                .reduce(f64::max),
            max_memory: self
                .cluster
                .workers
                .values()
                .map(|w| w.memory_bytes)
                .filter(|m| *m > 0)
                .max(),
        };
        // The root of the job's trace: everything the job goes through hangs below it.
        let span = info_span!(
            parent: None,
            "submit",
            job = field::Empty,
            image = field::Empty,
            policy = self.placer.name()
        );
        let _entered = span.enter();
        // Validation happens before anything is recorded: a refused submission creates nothing.
        let spec = match validate::validate(spec.map(|s| *s), limits) {
            Ok(s) => s,
            Err(e) => {
                info!(error = %e, "submission refused");
                self.metrics.rejected(self.placer.name(), "validation");
                return Err(e);
            }
        };
        if let Err(e) = self.value_check_spec(&spec) {
            info!(error = %e, "submission refused");
            self.metrics.rejected(self.placer.name(), "validation");
            return Err(e);
        }
        let id = uuid::Uuid::new_v4().to_string();
        span.record("job", id.as_str());
        span.record("image", spec.image.as_str());
        let seq = self.cluster.next_job_seq;
        self.cluster.next_job_seq += 1;
        let job = Job {
            id: id.clone(),
            seq,
            spec,
            state: JobState::Pending,
            reason: "waiting for a worker".into(),
            worker_id: None,
            epoch: 0,
            container_id: String::new(),
            start_command_id: String::new(),
            submitted_unix_ms: now_ms(),
            started_unix_ms: 0,
            finished_unix_ms: 0,
            step: 0,
            total_steps: 0,
            metric_value: None,
            samples: 0,
            malformed: 0,
            progress: Default::default(),
            category: pb::Category::Unspecified,
            growth_efficiency: None,
            cpu_limit: None,
            migrations: 0,
            exit_code: None,
            policy: self.placer.name().to_string(),
            cpu_usage: 0.0,
            converged_since: None,
            migration_decided: false,
            rebalanced: false,
            migration: None,
            last_migration_downtime_ms: None,
            lost_since: None,
            trace: span.context(),
        };
        info!(job = %id, image = %job.spec.image, cpus = job.spec.cpus, "job submitted");
        self.cluster.jobs.insert(id.clone(), job);
        self.metrics.job_submitted();
        self.events.emit(Event {
            kind: EventKind::JobState as i32,
            job_id: id.clone(),
            from_state: JobState::Unspecified as i32,
            to_state: JobState::Pending as i32,
            reason: "submitted".into(),
            ..Default::default()
        });
        self.schedule();
        Ok(self.cluster.jobs[&id].to_pb(false))
    }

    fn cancel(&mut self, id: &str) -> Result<pb::Job> {
        let job = self
            .cluster
            .jobs
            .get(id)
            .ok_or_else(|| Error::JobNotFound(id.to_string()))?;
        if job.is_terminal() {
            return Err(Error::FailedPrecondition(format!(
                "job {id} is already {}",
                job.state.label()
            )));
        }
        let span = self.job_span(id, info_span!(parent: None, "cancel", job = %id));
        let _entered = span.enter();
        if job.occupies_worker()
            && let Some(w) = job.worker_id.clone()
        {
            let cmd = command(
                job,
                Action::Stop(pb::Stop {
                    reason: "cancelled by user".into(),
                    remove: true,
                }),
            );
            self.send(&w, cmd);
        }
        self.set_state(id, JobState::Cancelled, "cancelled by user");
        // Its place is free now.
        self.schedule();
        Ok(self.cluster.jobs[id].to_pb(false))
    }

    // ---- agent streams ----

    fn on_stream(&mut self, ev: StreamEvent) {
        match ev {
            StreamEvent::Connected {
                conn,
                register,
                link,
            } => self.on_register(conn, register, link),
            StreamEvent::Message { conn, kind } => {
                self.metrics.received(kind.name());
                let Some(worker) = self.conns.get(&conn).cloned() else {
                    debug!(conn, "message from a replaced stream ignored");
                    return;
                };
                self.on_agent_message(&worker, kind);
            }
            StreamEvent::Disconnected { conn, reason } => {
                self.metrics.disconnected();
                let Some(worker) = self.conns.remove(&conn) else {
                    return;
                };
                if let Some(w) = self.cluster.workers.get_mut(&worker)
                    && w.link.as_ref().map(AgentLink::conn) == Some(conn)
                {
                    w.link = None;
                    warn!(%worker, %reason, "agent disconnected");
                    self.events.emit(Event {
                        kind: EventKind::WorkerState as i32,
                        worker_id: worker.clone(),
                        worker_state: w.state as i32,
                        reason: format!("disconnected: {reason}"),
                        ..Default::default()
                    });
                }
            }
        }
    }

    fn on_register(&mut self, conn: ConnectionId, reg: Register, link: AgentLink) {
        let id = reg.worker_id.clone();
        let now = Instant::now();
        let reconnect = self.cluster.workers.contains_key(&id);
        self.metrics.registered(reconnect);
        self.metrics.received("register");
        if let Some(old) = self.cluster.workers.get(&id).and_then(|w| w.link.as_ref()) {
            // The agent reconnected before its old stream's end reached us: the new stream
            // wins, and anything still arriving on the old one is ignored.
            self.conns.remove(&old.conn());
        }
        self.conns.insert(conn, id.clone());
        let restarted = self
            .cluster
            .workers
            .get(&id)
            .is_some_and(|w| w.instance_id != reg.instance_id);
        let w = self
            .cluster
            .workers
            .entry(id.clone())
            .or_insert_with(|| Worker {
                id: id.clone(),
                state: WorkerState::Ready,
                cpu_capacity: 0.0,
                memory_bytes: 0,
                calibration: 1.0,
                labels: Default::default(),
                link: None,
                instance_id: String::new(),
                last_seen: now,
                last_seen_unix_ms: 0,
                alpha: None,
                interval_s: None,
            });
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
        w.last_seen_unix_ms = now_ms();
        // A drained worker stays drained across reconnects; a lost one is back.
        if w.state != WorkerState::Draining {
            w.state = WorkerState::Ready;
        }
        w.link = Some(link.clone());
        let _ = link.send(ManagerKind::Registered(pb::Registered {
            manager_id: self.config.manager_id.clone(),
            policy: self.placer.name().to_string(),
            heartbeat_interval_ms: self.config.heartbeat_interval.as_millis() as u64,
            worker_mode: self.config.worker_policy as i32,
            migration: self.config.migration,
        }));
        info!(worker = %id, cpus = reg.cpu_capacity, containers = reg.containers.len(), reconnect, "worker registered");
        self.events.emit(Event {
            kind: EventKind::WorkerState as i32,
            worker_id: id.clone(),
            worker_state: self.cluster.workers[&id].state as i32,
            reason: if reconnect {
                format!(
                    "re-registered with {} containers{}",
                    reg.containers.len(),
                    if restarted { " (agent restarted)" } else { "" }
                )
            } else {
                "registered".into()
            },
            ..Default::default()
        });
        self.reconcile(&id, &reg.containers);
        self.schedule();
    }

    /// Brings the manager's view of `worker` in line with what its agent says it runs.
    fn reconcile(&mut self, worker: &str, reported: &[ContainerReport]) {
        for c in reported {
            let Some(job) = self.cluster.jobs.get(&c.job_id) else {
                // A container from before this manager started (state is in memory): leave the
                // user's work alone rather than kill what we cannot account for.
                warn!(%worker, job = %c.job_id, "agent runs a container of an unknown job; leaving it alone");
                continue;
            };
            let stale = c.epoch < job.epoch || job.worker_id.as_deref() != Some(worker);
            let running = c.state != ContainerState::Exited as i32;
            if (stale || job.is_terminal()) && running {
                // An incarnation that must not run (superseded, or the job is over).
                let cmd = Command {
                    command_id: uuid::Uuid::new_v4().to_string(),
                    job_id: job.id.clone(),
                    epoch: c.epoch,
                    traceparent: String::new(),
                    action: Some(Action::Stop(pb::Stop {
                        reason: "superseded incarnation".into(),
                        remove: true,
                    })),
                };
                self.send(worker, cmd);
                continue;
            }
            if !stale && running && matches!(job.state, JobState::Lost | JobState::Starting) {
                let id = job.id.clone();
                if let Some(j) = self.cluster.jobs.get_mut(&id) {
                    j.container_id = c.container_id.clone();
                    if let Some(s) = c.last_step {
                        j.step = j.step.max(s);
                    }
                }
                self.set_state(&id, JobState::Running, &format!("re-adopted on {worker}"));
            }
        }
        // Jobs we placed here that the agent does not report.
        let missing: Vec<(String, JobState, String)> = self
            .cluster
            .jobs_on(worker)
            .filter(|j| {
                !reported
                    .iter()
                    .any(|c| c.job_id == j.id && c.epoch == j.epoch)
            })
            .map(|j| (j.id.clone(), j.state, j.start_command_id.clone()))
            .collect();
        for (id, state, start_id) in missing {
            if state == JobState::Starting {
                // The start may have been lost with the old stream: send the same command
                // again (same id, so an agent that did receive it answers from its cache).
                let job = &self.cluster.jobs[&id];
                let mut cmd = start_command(job);
                cmd.command_id = start_id;
                self.send(worker, cmd);
            } else {
                self.finish(
                    &id,
                    JobState::Failed,
                    &format!("its container is no longer on {worker}"),
                );
            }
        }
    }

    fn on_agent_message(&mut self, worker: &str, kind: AgentKind) {
        match kind {
            AgentKind::Register(_) => debug!(%worker, "ignoring a second Register on one stream"),
            AgentKind::Heartbeat(hb) => {
                let now = Instant::now();
                if let Some(w) = self.cluster.workers.get_mut(worker) {
                    w.last_seen = now;
                    w.last_seen_unix_ms = now_ms();
                    w.alpha = hb.alpha;
                    w.interval_s = hb.interval_s;
                    if w.state == WorkerState::Lost {
                        w.state = WorkerState::Ready;
                        self.events.emit(Event {
                            kind: EventKind::WorkerState as i32,
                            worker_id: worker.to_string(),
                            worker_state: WorkerState::Ready as i32,
                            reason: "heartbeats resumed".into(),
                            ..Default::default()
                        });
                    }
                }
                for s in hb.jobs {
                    if let Some(j) = self.cluster.jobs.get_mut(&s.job_id)
                        && j.epoch == s.epoch
                    {
                        j.category =
                            pb::Category::try_from(s.category).unwrap_or(pb::Category::Unspecified);
                        j.growth_efficiency = s.growth_efficiency;
                        j.cpu_limit = s.cpu_limit;
                        j.cpu_usage = s.cpu_usage;
                        // Alg. 3's converged duration counts from the first report of it.
                        if j.category == pb::Category::Completing {
                            j.converged_since.get_or_insert(now);
                        } else {
                            j.converged_since = None;
                        }
                    }
                }
            }
            AgentKind::Progress(batch) => self.on_progress(batch),
            AgentKind::Usage(_) => {
                // Usage feeds the FlowCon and SpeCon rounds of later issues; the spread
                // baseline places by reservation only.
            }
            AgentKind::Result(r) => self.on_result(worker, r),
            AgentKind::Exited(e) => self.on_exited(worker, e),
            AgentKind::MigrationRequest(m) => self.on_migration_request(worker, m),
        }
    }

    fn on_progress(&mut self, batch: pb::ProgressBatch) {
        let cap = self.config.progress_history;
        let mut restored = Vec::new();
        for s in batch.samples {
            let Some(j) = self.cluster.jobs.get_mut(&s.job_id) else {
                continue;
            };
            if s.epoch > j.epoch {
                continue; // cannot happen unless an agent invents epochs
            }
            j.samples += 1;
            if j.progress.len() == cap {
                j.progress.pop_front();
            }
            j.progress.push_back(pb::ProgressPoint {
                unix_ms: s.unix_ms,
                step: s.step,
                value: s.value,
                epoch: s.epoch,
            });
            if s.epoch == j.epoch
                && j.migration
                    .as_ref()
                    .is_some_and(|m| m.phase == MovePhase::Restoring)
            {
                restored.push(j.id.clone());
            }
            if s.epoch == j.epoch {
                j.step = j.step.max(s.step);
                if let Some(t) = s.total_steps {
                    j.total_steps = t;
                }
                if s.value.is_some() {
                    j.metric_value = s.value;
                }
            }
        }
        for m in batch.malformed {
            if let Some(j) = self.cluster.jobs.get_mut(&m.job_id) {
                j.malformed += m.count;
            }
        }
        for id in restored {
            self.migration_resumed(&id);
        }
    }

    fn on_result(&mut self, worker: &str, r: pb::CommandResult) {
        // Save and restore results of a move are the migration's to interpret (they carry the
        // old epoch, or the new one on the target).
        let moving = self
            .cluster
            .jobs
            .get(&r.job_id)
            .is_some_and(|j| j.migration.is_some());
        if moving && self.on_migration_result(worker, &r) {
            return;
        }
        let Some(job) = self.cluster.jobs.get(&r.job_id) else {
            return;
        };
        if r.epoch != job.epoch || job.worker_id.as_deref() != Some(worker) {
            debug!(job = %r.job_id, epoch = r.epoch, "result for an older incarnation ignored");
            return;
        }
        match (r.ok, &r.detail) {
            (true, Some(pb::command_result::Detail::Started(s))) => {
                let id = r.job_id.clone();
                let j = self.cluster.jobs.get_mut(&id).expect("checked above");
                j.container_id = s.container_id.clone();
                if j.started_unix_ms == 0 {
                    j.started_unix_ms = now_ms();
                }
                if j.state == JobState::Starting {
                    self.set_state(&id, JobState::Running, &format!("running on {worker}"));
                }
            }
            (true, _) => {}
            (false, _) if job.state == JobState::Starting => {
                let id = r.job_id.clone();
                self.finish(
                    &id,
                    JobState::Failed,
                    &format!("could not start on {worker}: {}", r.error),
                );
            }
            (false, _) => {
                warn!(job = %r.job_id, %worker, error = %r.error, "command failed");
            }
        }
    }

    fn on_exited(&mut self, worker: &str, e: ContainerExited) {
        let Some(job) = self.cluster.jobs.get(&e.job_id) else {
            return;
        };
        if e.epoch != job.epoch || job.worker_id.as_deref() != Some(worker) || job.is_terminal() {
            return;
        }
        let id = e.job_id.clone();
        if job.migration.is_some() && self.on_migration_exit(&e) {
            return;
        }
        if e.requested && !e.done {
            // Stopped on request before finishing and outside a migration: its agent
            // checkpointed it while cut off from us (self-fencing). It is restartable from its
            // checkpoint, and that incarnation has already stopped, so restart it now.
            if let Some(j) = self.cluster.jobs.get_mut(&id) {
                j.worker_id = None;
                j.lost_since = None;
            }
            self.set_state(
                &id,
                JobState::Pending,
                &format!(
                    "checkpointed and stopped by {worker}'s agent; restarting from its checkpoint"
                ),
            );
            self.schedule();
            return;
        }
        if let Some(j) = self.cluster.jobs.get_mut(&id) {
            j.exit_code = Some(e.exit_code);
            if let Some(s) = e.last_step {
                j.step = j.step.max(s);
            }
        }
        if e.exit_code == 0 {
            self.finish(&id, JobState::Completed, "exited 0");
        } else if e.oom_killed {
            self.finish(&id, JobState::Failed, "killed: out of memory");
        } else {
            self.finish(
                &id,
                JobState::Failed,
                &format!("exited with code {}", e.exit_code),
            );
        }
    }

    // ---- time ----

    fn on_tick(&mut self, now: Instant) {
        let limit = self.config.heartbeat_interval * self.config.lost_after_missed;
        let lost: Vec<String> = self
            .cluster
            .workers
            .values()
            .filter(|w| w.state == WorkerState::Ready && now.duration_since(w.last_seen) > limit)
            .map(|w| w.id.clone())
            .collect();
        for id in lost {
            let silent = now.duration_since(self.cluster.workers[&id].last_seen);
            warn!(worker = %id, ?silent, "worker lost");
            if let Some(w) = self.cluster.workers.get_mut(&id) {
                w.state = WorkerState::Lost;
            }
            let reason = format!(
                "no heartbeat for {:.1}s ({} missed)",
                silent.as_secs_f64(),
                self.config.lost_after_missed
            );
            self.events.emit(Event {
                kind: EventKind::WorkerState as i32,
                worker_id: id.clone(),
                worker_state: WorkerState::Lost as i32,
                reason: reason.clone(),
                ..Default::default()
            });
            let jobs: Vec<String> = self
                .cluster
                .jobs_on(&id)
                .filter(|j| j.state != JobState::Lost)
                .map(|j| j.id.clone())
                .collect();
            for j in jobs {
                if let Some(job) = self.cluster.jobs.get_mut(&j) {
                    // A move in flight is abandoned; the job is restartable from its checkpoint.
                    if let Some(m) = job.migration.take() {
                        m.span.record("outcome", "abandoned");
                        self.metrics.migration(m.reason.as_str(), "abandoned");
                    }
                    job.lost_since = Some(now);
                }
                self.set_state(&j, JobState::Lost, &format!("worker {id} lost: {reason}"));
            }
        }
        self.recover_lost(now);
        self.value_tick();
    }

    // ---- scheduling ----

    /// Places pending jobs, oldest first, as long as the policy finds workers for them.
    fn schedule(&mut self) {
        self.value_departures();
        let mut pending: Vec<(u64, String)> = self
            .cluster
            .jobs
            .values()
            .filter(|j| j.state == JobState::Pending)
            .map(|j| (j.seq, j.id.clone()))
            .collect();
        if pending.is_empty() {
            return;
        }
        pending.sort();
        for (_, id) in pending {
            if self.value_admit(&id) {
                continue;
            }
            let (ids, snapshots) = self.snapshots();
            let spec = &self.cluster.jobs[&id].spec;
            let request = JobRequest {
                cpus: spec.cpus,
                memory_bytes: spec.memory_bytes,
            };
            let policy = self.placer.name();
            let began = Instant::now();
            let placement = self.placer.place(&request, &snapshots);
            let took = began.elapsed();
            self.metrics.round(policy, Round::Placement, took);
            // The span is made once the outcome is known: a job waiting for room is tried again
            // on every tick, and only a new reason is worth a span.
            match placement {
                Placement::Worker { index, scores } => {
                    let worker = ids[index].clone();
                    let span = self.job_span(
                        &id,
                        info_span!(
                            parent: None,
                            "placement",
                            job = %id,
                            policy,
                            worker = %worker,
                            scores = %scores_text(&ids, &scores),
                            decision_us = took.as_micros() as u64
                        ),
                    );
                    let _entered = span.enter();
                    self.metrics.placed(policy);
                    self.start(&id, &worker, &ids, &scores);
                }
                Placement::Unschedulable { reason } => {
                    let j = self.cluster.jobs.get(&id).expect("pending job exists");
                    if j.reason != reason {
                        let span = self.job_span(
                            &id,
                            info_span!(
                                parent: None,
                                "placement",
                                job = %id,
                                policy,
                                worker = field::Empty,
                                decision_us = took.as_micros() as u64
                            ),
                        );
                        let _entered = span.enter();
                        debug!(%reason, "job waits");
                        self.metrics.rejected(policy, "placement");
                        let j = self.cluster.jobs.get_mut(&id).expect("pending job exists");
                        j.reason = reason;
                    }
                }
            }
        }
    }

    /// What the policy sees: one snapshot per worker, in id order.
    fn snapshots(&self) -> (Vec<String>, Vec<WorkerSnapshot>) {
        let mut ids = Vec::with_capacity(self.cluster.workers.len());
        let mut snaps = Vec::with_capacity(self.cluster.workers.len());
        for w in self.cluster.workers.values() {
            let jobs: Vec<&Job> = self.cluster.jobs_on(&w.id).collect();
            ids.push(w.id.clone());
            snaps.push(WorkerSnapshot {
                id: w.id.clone(),
                cpu_capacity: w.cpu_capacity,
                cpu_requested: jobs.iter().map(|j| j.spec.cpus).sum(),
                memory_capacity: if w.memory_bytes == 0 {
                    u64::MAX
                } else {
                    w.memory_bytes
                },
                memory_requested: jobs.iter().map(|j| j.spec.memory_bytes).sum(),
                running: jobs.len(),
                calibration: w.calibration,
                schedulable: w.schedulable(),
                jobs: jobs
                    .iter()
                    .filter_map(|j| {
                        Some(JobSnapshot {
                            job_id: j.id.clone(),
                            category: category_from_pb(j.category)?,
                            growth_efficiency: j.growth_efficiency,
                            cpu_limit: j.cpu_limit,
                        })
                    })
                    .collect(),
            });
        }
        (ids, snaps)
    }

    fn start(&mut self, id: &str, worker: &str, ids: &[String], scores: &[f64]) {
        let j = self.cluster.jobs.get_mut(id).expect("job exists");
        j.epoch += 1;
        j.worker_id = Some(worker.to_string());
        j.container_id.clear();
        let cmd = start_command(j);
        j.start_command_id = cmd.command_id.clone();
        let epoch = j.epoch;
        let mut attributes: HashMap<String, String> = ids
            .iter()
            .zip(scores)
            .map(|(w, s)| (format!("score.{w}"), format!("{s}")))
            .collect();
        attributes.insert("policy".into(), self.placer.name().into());
        info!(job = %id, %worker, epoch, policy = self.placer.name(), "job placed");
        self.events.emit(Event {
            kind: EventKind::JobPlaced as i32,
            job_id: id.to_string(),
            worker_id: worker.to_string(),
            epoch,
            reason: format!("placed on {worker} by {}", self.placer.name()),
            attributes,
            ..Default::default()
        });
        self.set_state(id, JobState::Starting, &format!("starting on {worker}"));
        self.send(worker, cmd);
    }

    // ---- helpers ----

    /// Sends `cmd` to `worker`'s agent. A closed link means the stream is gone: the worker
    /// stops being schedulable now, and its loss is decided by the heartbeat timer.
    fn send(&mut self, worker: &str, mut cmd: Command) {
        let action = cmd.action.as_ref().map_or("none", |a| a.name());
        let span = info_span!(
            "send_command",
            action,
            job = %cmd.job_id,
            epoch = cmd.epoch,
            %worker,
            command = %cmd.command_id
        );
        // Outside any span of the job (a reconcile, a cancel): hang it below the job's root.
        if Span::current().is_none()
            && let Some(j) = self.cluster.jobs.get(&cmd.job_id)
        {
            let _ = span.set_parent(j.trace.clone());
        }
        let _entered = span.enter();
        cmd.traceparent = converge_messenger::trace::inject();
        self.value_fill_shares(&mut cmd);
        let Some(w) = self.cluster.workers.get_mut(worker) else {
            return;
        };
        let Some(link) = &w.link else {
            debug!(%worker, job = %cmd.job_id, "no stream to worker; command will be re-sent on reconnect");
            return;
        };
        if let Err(e) = link.send_command(cmd) {
            warn!(%worker, error = %e, "could not send command; dropping the stream");
            self.conns.remove(&e.0);
            w.link = None;
        } else {
            self.metrics.command_sent(action);
        }
    }

    fn set_state(&mut self, id: &str, to: JobState, reason: &str) {
        let Some(j) = self.cluster.jobs.get_mut(id) else {
            return;
        };
        let from = j.state;
        j.state = to;
        j.reason = reason.to_string();
        let (worker, epoch) = (j.worker_id.clone().unwrap_or_default(), j.epoch);
        if from == to {
            return;
        }
        self.value_note_transition(id, from, to, &worker);
        self.metrics.job_state(Some(from), to);
        if to == JobState::Rejected {
            self.metrics.rejected(self.placer.name(), "policy");
        }
        info!(job = %id, from = from.label(), to = to.label(), %reason, "job state");
        self.events.emit(Event {
            kind: EventKind::JobState as i32,
            job_id: id.to_string(),
            worker_id: worker,
            epoch,
            from_state: from as i32,
            to_state: to as i32,
            reason: reason.to_string(),
            ..Default::default()
        });
    }

    /// Moves a job to a terminal state and lets waiting jobs use its place.
    fn finish(&mut self, id: &str, to: JobState, reason: &str) {
        if let Some(j) = self.cluster.jobs.get_mut(id) {
            j.finished_unix_ms = now_ms();
        }
        self.set_state(id, to, reason);
        self.schedule();
    }
}

fn start_command(j: &Job) -> Command {
    command(
        j,
        Action::Start(pb::Start {
            spec: Some(j.spec.clone()),
            checkpoint_dir: j.id.clone(),
            // The baselines let containers compete freely inside the worker's capacity (the
            // papers' "NA"/"DS"); elastic limits come from the worker's FlowCon rounds.
            cpus: 0.0,
            cpu_shares: 0,
        }),
    )
}

fn command(j: &Job, action: Action) -> Command {
    Command {
        command_id: uuid::Uuid::new_v4().to_string(),
        job_id: j.id.clone(),
        epoch: j.epoch,
        traceparent: String::new(),
        action: Some(action),
    }
}

/// `w1=0.5 w2=0.25`: the scores the policy compared, one per worker.
fn scores_text(ids: &[String], scores: &[f64]) -> String {
    ids.iter()
        .zip(scores)
        .map(|(w, s)| format!("{w}={s}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn category_from_pb(c: pb::Category) -> Option<converge_policy::cluster::Category> {
    use converge_policy::cluster::Category as C;
    match c {
        pb::Category::Unspecified => None,
        pb::Category::New => Some(C::New),
        pb::Category::Watching => Some(C::Watching),
        pb::Category::Completing => Some(C::Completing),
    }
}

fn now_ms() -> i64 {
    unix_ms(SystemTime::now())
}
