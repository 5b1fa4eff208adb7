//! The manager actor: the I/O shell around the decision core (`converge_core::cluster::Core`).
//!
//! Inputs arrive on two channels and a timer, handled one at a time: control requests from the
//! gRPC handlers ([`Request`], answered on a `oneshot`), agent stream events
//! ([`StreamEvent`]), and a tick every half heartbeat. Each becomes one [`Input`] to
//! [`Core::step`], and the actor carries out the effects: commands go out on the agents'
//! streams (with the job's full spec on a Start and the trace context on every command), events
//! are numbered into the [`EventLog`], metrics and spans follow from what happened, and the
//! reply goes back to the caller. Reads (GetJob, ListJobs, ListWorkers, WatchEvents) are
//! answered from the core's state without a step. No decision is made here.

mod trace;

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use converge_core::cluster::types::{JobId, Time};
use converge_core::cluster::{Core, Effect, Input, Refusal, Reply, RequestError};
use converge_messenger::manager::{AgentLink, ConnectionId, StreamEvent};
use converge_messenger::pb::{
    self, Event, JobSpec, JobState, manager_message::Kind as ManagerKind,
};
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{field, info, info_span, warn};

use crate::error::{Error, Result};
use crate::events::EventLog;
use crate::metrics::{ManagerMetrics, Round};
use crate::validate::{self, Limits};
use crate::wire;

/// Settings the actor runs with.
#[derive(Clone, Debug)]
pub struct ActorConfig {
    /// Identifies this manager process to agents (and prefixes its command ids).
    pub manager_id: String,
    /// The core's settings.
    pub core: converge_core::cluster::Config,
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

/// The actor's state: the core and what only I/O needs.
pub struct Actor {
    manager_id: String,
    tick_every: Duration,
    core: Core,
    /// The full spec of every job the core accepted (what a Start carries). Written once, at
    /// submission.
    specs: HashMap<JobId, JobSpec>,
    /// The outbound half of every live agent stream.
    links: HashMap<ConnectionId, AgentLink>,
    events: EventLog,
    metrics: ManagerMetrics,
    traces: trace::JobTraces,
}

/// Wall-clock time as the core counts it: Unix seconds.
fn now() -> Time {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl From<RequestError> for Error {
    fn from(e: RequestError) -> Self {
        match e {
            RequestError::JobNotFound(id) => Error::JobNotFound(id),
            RequestError::Invalid { field, message } => Error::InvalidArgument {
                field: field.to_string(),
                message,
            },
            RequestError::FailedPrecondition(m) => Error::FailedPrecondition(m),
        }
    }
}

impl Actor {
    /// A manager with no workers and no jobs, deciding with `core`, counting into `metrics`.
    pub fn new(config: ActorConfig, core: Core, metrics: ManagerMetrics) -> Self {
        Self {
            manager_id: config.manager_id,
            tick_every: Duration::from_secs_f64(config.core.heartbeat_interval / 2.0),
            core,
            specs: HashMap::new(),
            links: HashMap::new(),
            events: EventLog::default(),
            metrics,
            traces: trace::JobTraces::default(),
        }
    }

    /// Runs until `shutdown` is cancelled or every input channel is closed.
    pub async fn run(
        mut self,
        mut requests: mpsc::Receiver<Request>,
        mut streams: mpsc::Receiver<StreamEvent>,
        shutdown: CancellationToken,
    ) {
        let mut tick = tokio::time::interval(self.tick_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                Some(req) = requests.recv() => self.on_request(req),
                Some(ev) = streams.recv() => self.on_stream(ev),
                _ = tick.tick() => {
                    let _ = self.step(Input::Tick);
                }
                else => break,
            }
        }
        info!("manager actor stopped");
    }

    /// One step of the core, with its effects carried out; returns the step's reply, if any.
    fn step(&mut self, input: Input) -> Option<std::result::Result<Reply, RequestError>> {
        let round = match &input {
            Input::Submit { .. } => Some(Round::Placement),
            Input::Agent { message, .. } if message.name() == "migration_request" => {
                Some(Round::MigrationSelect)
            }
            Input::Tick => Some(Round::Rebalance),
            _ => None,
        };
        let began = std::time::Instant::now();
        let mut pending = vec![input];
        let mut reply = None;
        while let Some(input) = pending.pop() {
            let effects = self.core.step(now(), input);
            for effect in effects {
                match effect {
                    Effect::Send {
                        conn,
                        worker,
                        command,
                    } => {
                        if let Some(gone) = self.send(conn, &worker, command) {
                            pending.push(gone);
                        }
                    }
                    Effect::Registered { conn, registered } => {
                        let msg = wire::registered(registered, &self.manager_id);
                        if let Some(link) = self.links.get(&conn)
                            && link.send(ManagerKind::Registered(msg)).is_err()
                        {
                            pending.push(self.lost_link(conn));
                        }
                    }
                    Effect::Event(e) => self.record(e),
                    Effect::Reply(r) => reply = Some(r),
                    Effect::Refused { what, worker } => {
                        self.metrics.refused(what.as_str());
                        if what == Refusal::ForeignJob {
                            warn!(
                                worker = worker.as_deref().unwrap_or_default(),
                                "refused a message about another worker's job"
                            );
                        }
                    }
                }
            }
        }
        self.traces.end_step();
        if let Some(round) = round {
            self.metrics
                .round(self.core.policy_name(), round, began.elapsed());
        }
        reply
    }

    /// Sends a core command on stream `conn`. A closed stream means the agent is gone: the
    /// returned input tells the core.
    fn send(
        &mut self,
        conn: ConnectionId,
        worker: &str,
        command: converge_core::cluster::types::Command,
    ) -> Option<Input> {
        let mut cmd = wire::command(command, None);
        if let Some(pb::command::Action::Start(s)) = &mut cmd.action {
            s.spec = self.specs.get(&cmd.job_id).cloned();
        }
        let action = cmd.action.as_ref().map_or("none", |a| a.name());
        let span = self.traces.command_span(&cmd, worker);
        let _entered = span.enter();
        cmd.traceparent = converge_messenger::trace::inject();
        let link = self.links.get(&conn)?;
        if let Err(e) = link.send_command(cmd) {
            warn!(%worker, error = %e, "could not send command; dropping the stream");
            return Some(self.lost_link(e.0));
        }
        self.metrics.command_sent(action);
        None
    }

    fn lost_link(&mut self, conn: ConnectionId) -> Input {
        self.links.remove(&conn);
        Input::Disconnected {
            conn,
            reason: "send failed".into(),
        }
    }

    /// Numbers an event into the log, and counts and traces what it says.
    fn record(&mut self, e: converge_core::cluster::types::Event) {
        use converge_core::cluster::types::EventKind as K;
        let policy = self.core.policy_name();
        match e.kind {
            K::JobState => {
                for (k, v) in &e.attributes {
                    if let (Some(at), Ok(err)) = (k.strip_prefix("eta_error_"), v.parse::<f64>()) {
                        self.metrics.eta_error(static_quarter(at), err);
                    }
                }
                if let Some(to) = e.to {
                    self.metrics
                        .job_state(e.from.map(wire::job_state), wire::job_state(to));
                    if to == converge_core::cluster::types::JobState::Rejected {
                        self.metrics.rejected(policy, "policy");
                    }
                }
            }
            K::JobPlaced => self.metrics.placed(policy),
            K::Migration => {
                let attr = |k: &str| e.attributes.get(k).map(String::as_str);
                if let Some(outcome) = attr("outcome") {
                    let reason = static_reason(attr("reason"));
                    self.metrics.migration(reason, static_outcome(outcome));
                    if let Some(ms) = attr("downtime_ms").and_then(|d| d.parse().ok()) {
                        self.metrics
                            .migration_downtime(reason, Duration::from_millis(ms));
                    }
                }
            }
            K::WorkerState => {}
        }
        self.traces.on_event(&e);
        self.events.emit(wire::event(e));
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
                let _ = reply.send(self.job_pb(&id, include_progress));
            }
            Request::ListJobs {
                state,
                worker_id,
                reply,
            } => {
                let want = wire::job_state_from_pb(state);
                let mut jobs: Vec<_> = self
                    .core
                    .jobs()
                    .values()
                    .filter(|j| want.is_none_or(|s| j.state() == s))
                    .filter(|j| worker_id.is_empty() || j.shown_worker() == Some(&worker_id))
                    .collect();
                jobs.sort_by_key(|j| j.seq);
                let policy = self.core.policy_name();
                let now = now();
                let out = jobs
                    .into_iter()
                    .map(|j| {
                        let eta = self.core.eta(&j.id, now);
                        wire::job(j, self.specs.get(&j.id), policy, false, eta)
                    })
                    .collect();
                let _ = reply.send(out);
            }
            Request::Cancel { id, reply } => {
                let span = self
                    .traces
                    .job_span(&id, info_span!(parent: None, "cancel", job = %id));
                let _entered = span.enter();
                let r = self.answer(Input::Cancel { id: id.clone() });
                let _ = reply.send(r.and_then(|_| self.job_pb(&id, false)));
            }
            Request::ListWorkers { reply } => {
                let policy = self.core.policy_name();
                let ws = self
                    .core
                    .workers()
                    .values()
                    .map(|w| wire::worker(w, self.core.jobs(), policy))
                    .collect();
                let _ = reply.send(ws);
            }
            Request::Drain { worker_id, reply } => {
                let span = info_span!(parent: None, "drain", worker = %worker_id);
                let _entered = span.enter();
                let r = self.answer(Input::Drain {
                    worker: worker_id.clone(),
                });
                let _ = reply.send(r.map(|_| {
                    let w = self.core.worker(&worker_id).expect("drained worker exists");
                    wire::worker(w, self.core.jobs(), self.core.policy_name())
                }));
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

    /// A step whose reply is the answer to a request.
    fn answer(&mut self, input: Input) -> Result<Reply> {
        match self.step(input) {
            Some(r) => r.map_err(Error::from),
            None => Err(Error::FailedPrecondition(
                "the request had no answer".into(),
            )),
        }
    }

    fn job_pb(&self, id: &str, include_progress: bool) -> Result<pb::Job> {
        self.core
            .job(id)
            .map(|j| {
                let eta = self.core.eta(id, now());
                wire::job(
                    j,
                    self.specs.get(id),
                    self.core.policy_name(),
                    include_progress,
                    eta,
                )
            })
            .ok_or_else(|| Error::JobNotFound(id.to_string()))
    }

    fn submit(&mut self, spec: Option<Box<JobSpec>>) -> Result<pb::Job> {
        let policy = self.core.policy_name();
        // The root of the job's trace: everything the job goes through hangs below it.
        let span = info_span!(
            parent: None,
            "submit",
            job = field::Empty,
            image = field::Empty,
            policy
        );
        let _entered = span.enter();
        let (max_cpus, max_memory) = self.core.limits();
        // Validation happens before anything is recorded: a refused submission creates nothing.
        let spec = match validate::validate(
            spec.map(|s| *s),
            Limits {
                max_cpus,
                max_memory,
            },
        ) {
            Ok(s) => s,
            Err(e) => {
                info!(error = %e, "submission refused");
                self.metrics.rejected(policy, "validation");
                return Err(e);
            }
        };
        let id = uuid::Uuid::new_v4().to_string();
        span.record("job", id.as_str());
        span.record("image", spec.image.as_str());
        self.traces.submitted(&id, &span);
        let core_spec = wire::job_spec(&spec);
        self.specs.insert(id.clone(), spec);
        match self.answer(Input::Submit {
            id: id.clone(),
            spec: core_spec,
        }) {
            Ok(_) => {
                self.metrics.job_submitted();
                info!(job = %id, "job submitted");
                self.job_pb(&id, false)
            }
            Err(e) => {
                self.specs.remove(&id);
                info!(error = %e, "submission refused");
                self.metrics.rejected(policy, "validation");
                Err(e)
            }
        }
    }

    // ---- agent streams ----

    fn on_stream(&mut self, ev: StreamEvent) {
        match ev {
            StreamEvent::Connected {
                conn,
                register,
                link,
            } => {
                self.metrics.received("register");
                self.metrics
                    .registered(self.core.worker(&register.worker_id).is_some());
                self.links.insert(conn, link);
                let _ = self.step(Input::Connected {
                    conn,
                    register: wire::register(register),
                });
            }
            StreamEvent::Message { conn, kind } => {
                self.metrics.received(kind.name());
                if let Some(message) = wire::agent_message(kind) {
                    let _ = self.step(Input::Agent { conn, message });
                }
            }
            StreamEvent::Disconnected { conn, reason } => {
                self.metrics.disconnected();
                self.links.remove(&conn);
                let _ = self.step(Input::Disconnected { conn, reason });
            }
        }
    }
}

/// The points of a run at which predictions are measured.
fn static_quarter(q: &str) -> &'static str {
    match q {
        "25" => "25",
        "50" => "50",
        _ => "75",
    }
}

/// Metric labels are static: the core's move reasons and outcomes.
fn static_reason(r: Option<&str>) -> &'static str {
    match r {
        Some("speculative") => "speculative",
        Some("rebalance") => "rebalance",
        Some("drain") => "drain",
        _ => "unknown",
    }
}

fn static_outcome(o: &str) -> &'static str {
    match o {
        "started" => "started",
        "completed" => "completed",
        "aborted" => "aborted",
        "failed" => "failed",
        "abandoned" => "abandoned",
        "declined" => "declined",
        _ => "other",
    }
}
