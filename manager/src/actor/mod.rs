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
//!
//! With a store (`--state-dir`), what a step changed is written before any of its effects
//! leaves the process: a submission is stored before it is acknowledged, a command before it is
//! sent, an event before a watcher sees it. Steps are taken as their inputs arrive, but their
//! effects and answers are held; whatever is waiting in the channels when one arrives joins it,
//! and the lot is written in one transaction before the held effects are carried out (group
//! commit: one write per batch, not per request). A batch with no outward effect (most progress
//! and heartbeats) is written with the next, or within [`FLUSH_EVERY`]. A store that fails stops
//! the manager: it would otherwise act on decisions it could not keep.
//!
//! Every heartbeat is answered with an `Ack` of its sequence number once the batch it came in
//! is stored (at once without a store): the agent keeps each result, exit and migration request
//! until an ack covers it, and sends the uncovered ones again after a reconnect. An ack is the
//! promise that the results, exits and migration requests the agent sent before that heartbeat
//! survive a broken stream and a manager restart (what they changed is stored; progress,
//! written a share at a time as above, is not part of the promise).

mod logs;
mod specs;
mod trace;

#[cfg(test)]
mod tests;

pub use logs::LogStream;
pub use specs::Specs;

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant, SystemTime};

use converge_core::cluster::saved::Changes;
use converge_core::cluster::types::{JobId, JobState, Time};
use converge_core::cluster::{Core, Effect, Input, Reply, RequestError};
use converge_messenger::manager::{AgentLink, ConnectionId, StreamEvent};
use converge_messenger::pb::{self, Event, JobSpec, manager_message::Kind as ManagerKind};
use converge_store::{Batch, JobQuery, PendingBackup, Store, StoredEvent};
use prost::Message;
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{debug, field, info, info_span, warn};

use crate::error::{Error, Result};
use crate::events::EventLog;
use crate::metrics::{ManagerMetrics, Round};
use crate::validate::{self, Limits};
use crate::wire;

/// Changes of steps with no outward effect are written at least this often.
pub const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// Inputs already waiting that join one batch (one write), at most, per channel.
const BATCH: usize = 256;

/// Settings the actor runs with.
#[derive(Clone, Debug)]
pub struct ActorConfig {
    /// Identifies this manager process to agents (and prefixes its command ids).
    pub manager_id: String,
    /// The core's settings.
    pub core: converge_core::cluster::Config,
    /// Events kept in memory.
    pub events_in_memory: usize,
    /// How long the store keeps finished jobs (`None`: forever).
    pub finished_retention: Option<Duration>,
}

/// A control request, answered on its `reply` channel.
#[derive(Debug)]
pub enum Request {
    /// Validate and queue a job.
    Submit {
        /// What the user sent (boxed: a spec is far larger than the other requests).
        spec: Option<Box<JobSpec>>,
        /// The new job, and what of its spec the policy will not do.
        reply: oneshot::Sender<Result<Submitted>>,
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
    /// Jobs, filtered, a page at a time.
    ListJobs {
        /// What to list (its state a known one).
        request: pb::ListJobsRequest,
        /// The jobs, in submission order, and where the next page starts; an error when the
        /// store cannot give the archived ones asked for (a list missing them is no answer).
        reply: oneshot::Sender<Result<pb::ListJobsResponse>>,
    },
    /// Cancel a job.
    Cancel {
        /// Its id.
        id: String,
        /// The caller's name (its token's), empty when the API is open.
        by: String,
        /// The job after cancelling.
        reply: oneshot::Sender<Result<pb::Job>>,
    },
    /// All workers.
    ListWorkers {
        /// The workers, by id.
        reply: oneshot::Sender<Vec<pb::Worker>>,
    },
    /// Stop placing on a worker and move its jobs away (`draining`), or undo that.
    Drain {
        /// The worker.
        worker_id: String,
        /// Drain, or undrain.
        draining: bool,
        /// The worker after the request.
        reply: oneshot::Sender<Result<pb::Worker>>,
    },
    /// Forget a lost worker without jobs.
    Forget {
        /// The worker.
        worker_id: String,
        /// The worker as it was when forgotten.
        reply: oneshot::Sender<Result<pb::Worker>>,
    },
    /// Event history plus a live feed.
    Watch {
        /// Only this job (empty = all).
        job_id: String,
        /// Replay from this sequence number (0 = live only).
        from_seq: u64,
        /// History and live receiver; an error when the store cannot give the history asked
        /// for (a replay with a gap is no answer).
        reply: oneshot::Sender<Result<Watched>>,
    },
    /// A job's output, through the agents (`logs`).
    Logs {
        /// The job.
        id: String,
        /// Keep following it until it ends.
        follow: bool,
        /// Only the last lines of each incarnation (0 = all).
        tail: u32,
        /// The output as it comes.
        reply: oneshot::Sender<Result<LogStream>>,
    },
    /// A copy of the state store, in a new file beside it.
    Backup {
        /// The caller's turn among backups: held until the copy begun is written, or dropped
        /// unwritten (the caller gone), and not only until the caller stops waiting. While the
        /// copy is out the store's file is held for it, and the next backup would be made by
        /// `VACUUM INTO`, on this actor.
        turn: tokio::sync::OwnedMutexGuard<()>,
        /// The copy begun, for the caller to write.
        reply: oneshot::Sender<Result<converge_store::PendingBackup>>,
    },
}

/// `pending`, holding the caller's `turn` among backups until it is written or dropped
/// ([`Request::Backup`]).
pub(crate) fn in_turn(
    pending: PendingBackup,
    turn: tokio::sync::OwnedMutexGuard<()>,
) -> PendingBackup {
    PendingBackup::new(move || {
        let copy = pending.write();
        drop(turn);
        copy
    })
}

/// The actor's state: the core and what only I/O needs.
pub struct Actor {
    manager_id: String,
    tick_every: Duration,
    core: Core,
    /// The full spec of every job the core holds (what a Start carries). Written once, at
    /// submission.
    specs: Specs,
    /// The outbound half of every live agent stream.
    links: HashMap<ConnectionId, AgentLink>,
    events: EventLog,
    metrics: ManagerMetrics,
    traces: trace::JobTraces,
    /// Where the state is kept, if anywhere.
    store: Option<Box<dyn Store>>,
    /// What steps changed that is not stored yet.
    unsaved: Unsaved,
    /// The store failed: the actor stops with this.
    failed: Option<Error>,
    /// Effects of the batch's steps, waiting for the store.
    held: Vec<Held>,
    /// Answers to the batch's requests, waiting for the store.
    answers: Vec<Answer>,
    /// Heartbeats taken (stream, sequence number), waiting for the store to be acknowledged.
    acks_waiting: Vec<(ConnectionId, u64)>,
    /// Heartbeats whose batch is stored: acknowledged at the end of the flush.
    acks_due: Vec<(ConnectionId, u64)>,
    /// Open `JobLogs` readers.
    logs: logs::Readers,
    /// How long the store keeps finished jobs, and when it is next pruned of older ones.
    retention: Option<Duration>,
    prune_due: Instant,
}

/// One step's effects, held until what produced them is stored.
struct Held {
    effects: Vec<Effect>,
    /// Its events, numbered.
    events: VecDeque<Event>,
    /// The span the step was taken in (a drain's, a submission's), entered again to carry
    /// them out.
    span: tracing::Span,
}

/// A request's answer, sent once the batch is stored: `None` when it was, or why not.
type Answer = Box<dyn FnOnce(Option<&str>) + Send>;

/// Changes waiting for the store.
struct Unsaved {
    changes: Changes,
    specs: Vec<JobId>,
    events: Vec<StoredEvent>,
    since: Instant,
    /// A held effect leaves the process: write before carrying it out.
    observable: bool,
    /// Jobs with only [soft](Changes::soft) changes not yet written, and when soft records
    /// were last written.
    soft: std::collections::BTreeSet<JobId>,
    soft_written: Instant,
    /// The manager is stopping: write everything.
    closing: bool,
}

/// Soft records go out a tenth of them each second (each job's at most ~10 s late), all of
/// them when the manager stops: at 100,000 running jobs that is 10,000 records a second
/// instead of 100,000 (every running job's reports change its record every second).
const SOFT_SHARE: usize = 10;
const SOFT_MIN: usize = 1_000;

/// Finished jobs deleted from the store in one tick (`Actor::prune`).
const PRUNE_BATCH: usize = 1_000;

/// A watch's start: the events since the one asked for, the live ones after them, and the
/// log's name (`EventLog::name`).
#[derive(Debug)]
pub struct Watched {
    /// Recorded events from the one asked for, oldest first.
    pub history: Vec<Event>,
    /// Every event after them.
    pub live: broadcast::Receiver<Event>,
    /// The log's name.
    pub log: String,
}

/// What a manager with a store recovered besides the core: the specs the Starts carry and the
/// event log (at a first start, an empty log under the store's name).
pub struct Restored {
    /// The full spec of every job the core holds.
    pub specs: Specs,
    /// The event log, going on from the stored numbers.
    pub events: EventLog,
    /// How many stored jobs are in each state (`Recovered::job_states`).
    pub job_states: Vec<(String, u64)>,
}

/// A submission's answer: the new job, and the warnings about its spec
/// ([`crate::validate::warnings`]).
pub type Submitted = (pb::Job, Vec<String>);

/// The most bytes of jobs one ListJobs page holds (unless one job alone is more): half the
/// 4 MiB a gRPC client takes by default.
pub const LIST_PAGE_BYTES: usize = 2 << 20;

/// Wall-clock time as the core counts it: Unix seconds.
pub(crate) fn now() -> Time {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl From<RequestError> for Error {
    fn from(e: RequestError) -> Self {
        match e {
            RequestError::JobNotFound(id) => Error::JobNotFound(id.to_string()),
            RequestError::WorkerNotFound(id) => Error::WorkerNotFound(id.to_string()),
            RequestError::Invalid { field, message } => Error::InvalidArgument {
                field: field.to_string(),
                message,
            },
            RequestError::FailedPrecondition(m) => Error::FailedPrecondition(m),
        }
    }
}

impl Actor {
    /// A manager deciding with `core`, counting into `metrics`, keeping its state in `store`
    /// (if any); `restored` is what a restart recovered besides the core.
    pub fn new(
        config: ActorConfig,
        core: Core,
        metrics: ManagerMetrics,
        store: Option<Box<dyn Store>>,
        restored: Option<Restored>,
    ) -> Self {
        metrics.seed(core.policy_name());
        let (specs, events) = restored.map_or_else(
            || {
                (
                    Specs::default(),
                    EventLog::with_capacity(config.events_in_memory),
                )
            },
            |r| {
                // The gauges of jobs per state go on from what was stored: counted from 0, a
                // restored running job that ended took "running" below 0.
                for (state, count) in &r.job_states {
                    metrics.jobs_now(state, *count);
                }
                (r.specs, r.events)
            },
        );
        Self {
            manager_id: config.manager_id,
            tick_every: Duration::from_secs_f64(config.core.heartbeat_interval / 2.0),
            core,
            specs,
            links: HashMap::new(),
            events,
            metrics,
            traces: trace::JobTraces::default(),
            store,
            unsaved: Unsaved {
                changes: Changes::default(),
                specs: Vec::new(),
                events: Vec::new(),
                since: Instant::now(),
                observable: false,
                soft: Default::default(),
                soft_written: Instant::now(),
                closing: false,
            },
            failed: None,
            held: Vec::new(),
            answers: Vec::new(),
            acks_waiting: Vec::new(),
            acks_due: Vec::new(),
            logs: logs::Readers::default(),
            retention: config.finished_retention,
            prune_due: Instant::now(),
        }
    }

    /// Runs until `shutdown` is cancelled or every input channel is closed; fails when the
    /// store does.
    pub async fn run(
        mut self,
        mut requests: mpsc::Receiver<Request>,
        mut streams: mpsc::Receiver<StreamEvent>,
        shutdown: CancellationToken,
    ) -> Result<()> {
        let mut tick = tokio::time::interval(self.tick_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                Some(req) = requests.recv() => self.on_request(req),
                Some(ev) = streams.recv() => self.on_stream(ev),
                _ = tick.tick() => {
                    let _ = self.step(Input::Tick);
                    self.tick_logs();
                    self.prune();
                    // For soaks: a task leak shows as a count that keeps climbing.
                    self.metrics
                        .tasks(tokio::runtime::Handle::current().metrics().num_alive_tasks());
                }
                else => break,
            }
            // What is already waiting joins this batch and its one write.
            for _ in 0..BATCH {
                match requests.try_recv() {
                    Ok(req) => self.on_request(req),
                    Err(_) => break,
                }
            }
            for _ in 0..BATCH {
                match streams.try_recv() {
                    Ok(ev) => self.on_stream(ev),
                    Err(_) => break,
                }
            }
            self.flush();
            if let Some(e) = self.failed.take() {
                tracing::error!(error = %e, "the state store failed; the manager stops");
                return Err(e);
            }
        }
        // What the last steps changed quietly (progress) is kept too.
        self.flush();
        self.unsaved.closing = true;
        self.commit();
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        info!("manager actor stopped");
        Ok(())
    }

    /// One step of the core; its effects are held until the batch is stored ([`Actor::flush`]).
    /// Returns the step's reply, if any.
    fn step(&mut self, input: Input) -> Option<std::result::Result<Reply, RequestError>> {
        if self.failed.is_some() {
            return Some(Err(RequestError::FailedPrecondition(
                "the manager's state store failed; the manager is stopping".into(),
            )));
        }
        let round = match &input {
            Input::Submit { .. } => Some(Round::Placement),
            Input::Agent { message, .. } if message.name() == "migration_request" => {
                Some(Round::MigrationSelect)
            }
            Input::Tick => Some(Round::Rebalance),
            _ => None,
        };
        let began = std::time::Instant::now();
        let effects = self.core.step(now(), input);
        if let Some(round) = round {
            self.metrics
                .round(self.core.policy_name(), round, began.elapsed());
        }
        // Events are numbered now, so that they are stored with their numbers.
        let events: VecDeque<Event> = effects
            .iter()
            .filter_map(|e| match e {
                Effect::Event(e) => Some(self.events.number(wire::event(e.clone()))),
                _ => None,
            })
            .collect();
        self.note(&effects, &events);
        let reply = effects.iter().find_map(|e| match e {
            Effect::Reply(r) => Some(r.clone()),
            _ => None,
        });
        self.held.push(Held {
            effects,
            events,
            span: tracing::Span::current(),
        });
        reply
    }

    /// Stores what the batch changed when any of its effects is about to leave the process
    /// (module doc), then carries out the held effects and sends the held answers. A send
    /// that finds its stream gone is one more step, with its own effects: until none is left.
    fn flush(&mut self) {
        while !self.held.is_empty() || !self.answers.is_empty() {
            if self.unsaved.observable || self.unsaved.since.elapsed() >= FLUSH_EVERY {
                self.commit();
            }
            if let Some(e) = &self.failed {
                let why = e.to_string();
                self.held.clear();
                // Not stored: not acknowledged (the agents send it again to the next manager).
                self.acks_waiting.clear();
                self.acks_due.clear();
                for answer in self.answers.drain(..) {
                    answer(Some(&why));
                }
                return;
            }
            for held in std::mem::take(&mut self.held) {
                self.carry_out(held);
            }
            for answer in std::mem::take(&mut self.answers) {
                answer(None);
            }
            self.acknowledge();
        }
    }

    /// Acknowledges the heartbeats whose batch is stored (module doc). An ack that finds its
    /// stream gone is a disconnect, one more step for the flush to carry out.
    fn acknowledge(&mut self) {
        if self.store.is_none() {
            self.acks_due.append(&mut self.acks_waiting);
        }
        for (conn, heartbeat_seq) in std::mem::take(&mut self.acks_due) {
            // A stream closed or replaced since: its agent sends again what it is not sure of.
            let Some(link) = self.links.get(&conn) else {
                continue;
            };
            if link
                .send(ManagerKind::Ack(pb::Ack { heartbeat_seq }))
                .is_err()
            {
                let input = self.lost_link(conn);
                let _ = self.step(input);
            }
        }
    }

    /// Carries out one step's effects.
    fn carry_out(&mut self, held: Held) {
        let Held {
            effects,
            mut events,
            span,
        } = held;
        let _entered = span.enter();
        let mut gone = Vec::new();
        for effect in effects {
            match effect {
                Effect::Send {
                    conn,
                    worker,
                    command,
                } => gone.extend(self.send(conn, &worker, command)),
                Effect::Registered { conn, registered } => {
                    let msg = wire::registered(registered, &self.manager_id);
                    if let Some(link) = self.links.get(&conn)
                        && link.send(ManagerKind::Registered(msg)).is_err()
                    {
                        gone.push(self.lost_link(conn));
                    }
                }
                Effect::Rejected {
                    conn,
                    worker,
                    reason,
                } => {
                    // AlreadyExists: the agent's session tells it from a refusal of its setup
                    // (`SessionError::is_second_agent`), since it passes when the other ends.
                    self.close_link(conn, tonic::Status::already_exists(reason));
                    debug!(%worker, conn, "registration refused; stream closed");
                }
                Effect::Close {
                    conn,
                    worker,
                    reason,
                } => {
                    // Aborted: the agent's session ends and it connects and registers again.
                    self.close_link(conn, tonic::Status::aborted(reason));
                    debug!(%worker, conn, "worker forgotten; its stream closed");
                }
                Effect::Event(e) => {
                    let numbered = events.pop_front().expect("every event was numbered");
                    self.record(e, numbered);
                }
                Effect::Reply(_) => {}
                // Counted here; the core has logged it, naming the job (a second line
                // without it only doubled the log).
                Effect::Refused { what, .. } => self.metrics.refused(what.as_str()),
            }
        }
        self.traces.end_step();
        for input in gone {
            let _ = self.step(input);
        }
    }

    /// Answers `reply` with `value` once the batch is stored; drops it (the caller gets
    /// Unavailable) when the store failed.
    fn later<T: Send + 'static>(&mut self, reply: oneshot::Sender<T>, value: T) {
        self.answers.push(Box::new(move |failed: Option<&str>| {
            if failed.is_none() {
                let _ = reply.send(value);
            }
        }));
    }

    /// Answers `reply` with `r` once the batch is stored, or with why it could not be.
    fn answer_later<T: Send + 'static>(&mut self, reply: oneshot::Sender<Result<T>>, r: Result<T>) {
        self.answers.push(Box::new(move |failed: Option<&str>| {
            let r = match failed {
                None => r,
                Some(why) => Err(Error::StoreFailed(why.to_string())),
            };
            let _ = reply.send(r);
        }));
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
            s.spec = self.specs.get(&cmd.job_id);
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

    /// Ends stream `conn` with `status` (the agent reads why) and forgets it.
    fn close_link(&mut self, conn: ConnectionId, status: tonic::Status) {
        if let Some(link) = self.links.remove(&conn) {
            link.close_with(status);
        }
    }

    fn lost_link(&mut self, conn: ConnectionId) -> Input {
        self.links.remove(&conn);
        Input::Disconnected {
            conn,
            reason: "send failed".into(),
        }
    }

    /// Notes what a step changed, for the batch's write.
    fn note(&mut self, effects: &[Effect], events: &VecDeque<Event>) {
        let changes = self.core.take_changes();
        if self.store.is_none() {
            return;
        }
        self.unsaved.changes.merge(changes);
        self.unsaved
            .events
            .extend(events.iter().map(|e| StoredEvent {
                seq: e.seq,
                job: (!e.job_id.is_empty()).then(|| e.job_id.clone()),
                bytes: e.encode_to_vec(),
            }));
        self.unsaved.observable |= effects.iter().any(Effect::is_observable);
    }

    /// Writes everything unsaved in one transaction.
    fn commit(&mut self) {
        let Some(store) = self.store.as_mut() else {
            return;
        };
        let unsaved = &mut self.unsaved;
        unsaved.since = Instant::now();
        unsaved.observable = false;
        let specs: Vec<(JobId, Vec<u8>)> = unsaved
            .specs
            .drain(..)
            .filter(|id| self.core.job(id).is_some())
            .filter_map(|id| {
                let bytes = self.specs.encoded(&id)?.to_vec();
                Some((id, bytes))
            })
            .collect();
        let mut changes = std::mem::take(&mut unsaved.changes);
        for id in &changes.jobs {
            unsaved.soft.remove(id);
        }
        let soft = std::mem::take(&mut changes.soft);
        unsaved
            .soft
            .extend(soft.into_iter().filter(|id| !changes.jobs.contains(id)));
        let due = if unsaved.closing {
            unsaved.soft.len()
        } else if unsaved.soft_written.elapsed() >= FLUSH_EVERY {
            (unsaved.soft.len() / SOFT_SHARE).max(SOFT_MIN)
        } else {
            0
        };
        if due > 0 {
            unsaved.soft_written = Instant::now();
            for _ in 0..due {
                let Some(id) = unsaved.soft.pop_first() else {
                    break;
                };
                changes.jobs.insert(id);
            }
        }
        let counters = self.core.counters();
        let batch = Batch {
            jobs: changes
                .jobs
                .iter()
                .filter_map(|j| self.core.job(j))
                .collect(),
            workers: changes
                .workers
                .iter()
                .filter_map(|w| self.core.worker(w))
                .collect(),
            forgotten_workers: changes.forgotten.iter().map(|w| w.as_ref()).collect(),
            counters: Some(&counters),
            history_changed: changes.history,
            specs: specs
                .iter()
                .map(|(id, b)| (id.as_str(), b.as_slice()))
                .collect(),
            events: &unsaved.events,
        };
        let began = Instant::now();
        let result = store.commit(&batch);
        self.metrics.store_commit(began.elapsed());
        unsaved.events.clear();
        match result {
            // Stored: finished jobs beyond what is kept leave memory, the store answers for them.
            Ok(()) => {
                self.acks_due.append(&mut self.acks_waiting);
                let archived = self.core.archive();
                self.metrics.archived(archived.len());
                for id in archived {
                    self.specs.remove(&id);
                }
            }
            Err(e) => self.failed = Some(Error::Store(e)),
        }
    }

    /// Deletes from the store the finished jobs past `--finished-retention`: at most
    /// [`PRUNE_BATCH`] per tick, so that a first pass over a long history does not hold the
    /// actor; the next tick goes on while there are more. Memory forgets them too (the newest
    /// `--keep-finished` may be older than the retention on a quiet cluster).
    fn prune(&mut self) {
        let (Some(retention), Some(store)) = (self.retention, self.store.as_mut()) else {
            return;
        };
        if Instant::now() < self.prune_due {
            return;
        }
        let before = now() - retention.as_secs_f64();
        match store.prune_finished(before, PRUNE_BATCH) {
            Ok(states) => {
                let n = states.len();
                // Gone from the store, they leave the gauge of jobs per state, which a
                // restart would start from the store's count (`Recovered::job_states`).
                for state in &states {
                    self.metrics.job_pruned(state);
                }
                if n < PRUNE_BATCH {
                    // The store holds no job older than `before` now: memory forgets the same
                    // ones (while a backlog is pruned, memory keeps them, as the store does).
                    for id in self.core.expire(before) {
                        self.specs.remove(&id);
                    }
                }
                self.metrics.pruned(n);
                if n > 0 {
                    info!(
                        jobs = n,
                        ?retention,
                        "pruned finished jobs from the state store"
                    );
                }
                if n < PRUNE_BATCH {
                    // A tenth of the retention late at most, and not more often than each
                    // second nor less than each minute.
                    let every =
                        (retention / 10).clamp(Duration::from_secs(1), Duration::from_secs(60));
                    self.prune_due = Instant::now() + every;
                }
            }
            Err(e) => self.failed = Some(Error::Store(e)),
        }
    }

    /// ListJobs: the jobs in memory and those archived in the store that `request` asks for,
    /// in submission order (`Job::seq`), at most `page_size` of them (0: all) and
    /// [`LIST_PAGE_BYTES`] of them, from where its `page_token` says. A token is the submission number of a page's last job: later pages
    /// hold the jobs submitted after it, whatever finished or was archived meanwhile.
    fn list_jobs(&mut self, request: pb::ListJobsRequest) -> Result<pb::ListJobsResponse> {
        let pb::ListJobsRequest {
            state,
            worker_id,
            name,
            page_size,
            page_token,
            not_ended,
        } = request;
        let want = wire::job_state_from_pb(pb::JobState::try_from(state).unwrap_or_default());
        let after =
            match page_token.as_str() {
                "" => None,
                t => Some(t.parse::<u64>().map_err(|_| {
                    Error::invalid("page_token", "not a token a ListJobs answer gave")
                })?),
            };
        // One more than a page from each source: whether there is a next page.
        let take = (page_size > 0).then(|| page_size as usize + 1);
        let fits = |j: &converge_core::cluster::lifecycle::Job| {
            want.is_none_or(|s| j.state() == s)
                && !(not_ended && j.is_terminal())
                && after.is_none_or(|a| j.seq > a)
                && (worker_id.is_empty() || j.shown_worker().is_some_and(|w| *w == worker_id))
        };
        let named = |spec: &Option<pb::JobSpec>| {
            name.is_empty() || spec.as_ref().is_some_and(|s| s.name == name)
        };
        // A name is looked up in the specs' index (the store's jobs are filtered as read);
        // specs are decoded only for the page.
        let held: Box<dyn Iterator<Item = &converge_core::cluster::lifecycle::Job>> =
            if name.is_empty() {
                Box::new(self.core.jobs().values())
            } else {
                Box::new((self.specs.named(&name).iter()).filter_map(|id| self.core.job(id)))
            };
        let mut jobs: Vec<(_, Option<pb::JobSpec>)> =
            held.filter(|j| fits(j)).map(|j| (j, None)).collect();
        jobs.sort_by_key(|(j, _)| j.seq);
        jobs.truncate(take.unwrap_or(usize::MAX));
        for (j, spec) in jobs.iter_mut() {
            if spec.is_none() {
                *spec = self.specs.get(&j.id);
            }
        }
        let policy = self.core.policy_name();
        // One forecast per worker, whatever the number of its jobs listed.
        let mut etas = self.core.etas(now());
        let mut out: Vec<(u64, pb::Job)> = (jobs.into_iter())
            .map(|(j, spec)| {
                let eta = etas.eta(&j.id);
                (j.seq, wire::job(j, spec.as_ref(), policy, false, eta))
            })
            .collect();
        if want.is_none_or(|s| s.is_terminal()) && !not_ended {
            let query = JobQuery {
                state: want.map(|s| s.label()),
                after_seq: after,
                ..JobQuery::default()
            };
            let archived = self.archived_where(query, take, |j, spec| fits(j) && named(spec))?;
            out.extend(archived.iter().map(|a| (a.0.seq, self.archived_pb(a))));
            out.sort_by_key(|(seq, _)| *seq);
        }
        // A page ends at `page_size` jobs, or sooner at LIST_PAGE_BYTES: a job's spec may
        // be 200 KB, and a page of them past the 4 MiB a client takes would be no answer.
        let mut next_page_token = String::new();
        if page_size > 0 {
            let mut bytes = 0;
            let fits = (out.iter().take(page_size as usize))
                .take_while(|(_, j)| {
                    let first = bytes == 0;
                    bytes += j.encoded_len();
                    first || bytes <= LIST_PAGE_BYTES
                })
                .count();
            if fits < out.len() {
                out.truncate(fits);
                next_page_token = (out.last())
                    .map(|(seq, _)| seq.to_string())
                    .unwrap_or_default();
            }
        }
        Ok(pb::ListJobsResponse {
            jobs: out.into_iter().map(|(_, j)| j).collect(),
            next_page_token,
        })
    }

    /// Jobs the core archived, from the store, with their specs: job `id` when given, in
    /// `state` when given.
    fn archived(
        &mut self,
        id: Option<&str>,
        state: Option<converge_core::cluster::types::JobState>,
    ) -> Result<Vec<(converge_core::cluster::lifecycle::Job, Option<JobSpec>)>> {
        let query = JobQuery {
            id,
            state: state.map(|s| s.label()),
            ..JobQuery::default()
        };
        self.archived_where(query, None, |_, _| true)
    }

    /// The first `take` (or every) job the core archived that `query` finds in the store and
    /// `keep` keeps, with their specs. Read a page at a time when `take` is given, so that the
    /// first page of a long history reads little more than itself.
    fn archived_where(
        &mut self,
        mut query: JobQuery<'_>,
        take: Option<usize>,
        keep: impl Fn(&converge_core::cluster::lifecycle::Job, &Option<JobSpec>) -> bool,
    ) -> Result<Vec<(converge_core::cluster::lifecycle::Job, Option<JobSpec>)>> {
        let Some(store) = self.store.as_mut() else {
            return Ok(Vec::new());
        };
        let location = store.location();
        let mut out = Vec::new();
        loop {
            // Rows read at once: most are kept (a filter by worker or name may keep few).
            query.limit = take.map(|t| (t - out.len()).max(256));
            let rows = store.jobs(query).map_err(Error::Store)?;
            let read = rows.len();
            query.after_seq = rows.last().map(|s| s.job.seq).or(query.after_seq);
            for s in rows {
                // Those in memory are the core's to answer for (their stored record may lag).
                if !s.job.is_terminal() || self.core.job(&s.job.id).is_some() {
                    continue;
                }
                let spec = (s.spec)
                    .map(|b| {
                        JobSpec::decode(b.as_slice()).map_err(|e| {
                            damaged(location.clone(), format!("spec of job {}", s.job.id), e)
                        })
                    })
                    .transpose()?;
                if keep(&s.job, &spec) {
                    out.push((s.job, spec));
                    if take.is_some_and(|t| out.len() == t) {
                        return Ok(out);
                    }
                }
            }
            if query.limit.is_none_or(|l| read < l) {
                return Ok(out);
            }
        }
    }

    /// An archived job as the control API shows it.
    fn archived_pb(
        &self,
        (job, spec): &(converge_core::cluster::lifecycle::Job, Option<JobSpec>),
    ) -> pb::Job {
        wire::job(job, spec.as_ref(), self.core.policy_name(), false, None)
    }

    /// Counts and traces what an event says, and records it (numbered) in the log.
    fn record(&mut self, e: converge_core::cluster::types::Event, numbered: Event) {
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
            K::Stray => self.metrics.stray(),
            K::WorkerState | K::Limits => {}
        }
        self.traces.on_event(&e);
        self.events.publish(numbered);
    }

    // ---- control requests ----

    fn on_request(&mut self, req: Request) {
        match req {
            Request::Submit { spec, reply } => {
                let r = self.submit(spec);
                self.answer_later(reply, r);
            }
            Request::GetJob {
                id,
                include_progress,
                reply,
            } => {
                // Reads too wait for the batch's write: nobody sees state a crash could undo.
                let r = self.job_pb(&id, include_progress);
                self.answer_later(reply, r);
            }
            Request::ListJobs { request, reply } => {
                let r = self.list_jobs(request);
                self.answer_later(reply, r);
            }
            Request::Cancel { id, by, reply } => {
                let span = self
                    .traces
                    .job_span(&id, info_span!(parent: None, "cancel", job = %id));
                let _entered = span.enter();
                let r = match self.answer(Input::Cancel {
                    id: id.clone().into(),
                    by,
                }) {
                    // Archived: finished long ago, as the core would say of a finished job
                    // (and, for a cancelled one, as the first cancel was answered).
                    Err(Error::JobNotFound(_)) => match self.archived(Some(&id), None) {
                        Ok(a)
                            if (a.first()).is_some_and(|a| a.0.state() == JobState::Cancelled) =>
                        {
                            Ok(Reply::Job(id.clone().into()))
                        }
                        Ok(a) if !a.is_empty() => Err(Error::FailedPrecondition(format!(
                            "job {id} is already {}",
                            a[0].0.state().label()
                        ))),
                        Ok(_) => Err(Error::JobNotFound(id.clone())),
                        Err(e) => Err(e),
                    },
                    r => r,
                };
                let r = r.and_then(|_| self.job_pb(&id, false));
                self.answer_later(reply, r);
            }
            Request::ListWorkers { reply } => {
                let policy = self.core.policy_name();
                let ws = self
                    .core
                    .workers()
                    .values()
                    .map(|w| wire::worker(w, self.core.jobs(), policy))
                    .collect();
                self.later(reply, ws);
            }
            Request::Drain {
                worker_id,
                draining,
                reply,
            } => {
                let span = if draining {
                    info_span!(parent: None, "drain", worker = %worker_id)
                } else {
                    info_span!(parent: None, "undrain", worker = %worker_id)
                };
                let _entered = span.enter();
                let worker = worker_id.clone().into();
                let r = self.answer(if draining {
                    Input::Drain { worker }
                } else {
                    Input::Undrain { worker }
                });
                let r = r.map(|_| {
                    let w = self
                        .core
                        .worker(&worker_id)
                        .expect("the worker just answered for exists");
                    wire::worker(w, self.core.jobs(), self.core.policy_name())
                });
                self.answer_later(reply, r);
            }
            Request::Forget { worker_id, reply } => {
                let span = info_span!(parent: None, "forget", worker = %worker_id);
                let _entered = span.enter();
                let policy = self.core.policy_name();
                let before = (self.core.worker(&worker_id))
                    .map(|w| wire::worker(w, self.core.jobs(), policy));
                let r = self.answer(Input::Forget {
                    worker: worker_id.into(),
                });
                let r = r.map(|_| before.expect("the worker just forgotten existed"));
                self.answer_later(reply, r);
            }
            Request::Watch {
                job_id,
                from_seq,
                reply,
            } => {
                // A number past the next one names an event this log has not made: a typo, or
                // a watcher resuming against a manager restarted without its state (numbered
                // from 1 again). Refused, rather than waited on in silence.
                let next = self.events.next_seq();
                if from_seq > next {
                    let newest = match next - 1 {
                        0 => "there is no event yet".to_string(),
                        n => format!("the newest event is {n}"),
                    };
                    let e = Error::invalid(
                        "from_seq",
                        format!(
                            "{from_seq} is past the end of the event log ({newest}): {next} waits \
                             for the next event, 0 watches live events only"
                        ),
                    );
                    self.answer_later(reply, Err(e));
                    return;
                }
                let (mut history, live) = self.events.watch(&job_id, from_seq);
                // What memory no longer holds, from the store (the newest of it, up to the
                // replay limit).
                let oldest = self.events.oldest_seq();
                let room = crate::events::REPLAY.saturating_sub(history.len());
                let mut r = Ok(());
                if from_seq > 0
                    && from_seq < oldest
                    && room > 0
                    && let Some(store) = self.store.as_mut()
                {
                    let job = (!job_id.is_empty()).then_some(job_id.as_str());
                    r = stored_events(store.as_mut(), from_seq, oldest, job, room).map(
                        |mut older| {
                            older.append(&mut history);
                            history = older;
                        },
                    );
                }
                let log = self.events.name().to_string();
                self.answer_later(reply, r.map(|()| Watched { history, live, log }));
            }
            Request::Backup { turn, reply } => {
                // The copy is what the last commit left, and every answer given so far waited
                // for its commit: nothing a client has seen is missing from it. The actor
                // waits only for the copy to begin; the caller writes it, off the actor.
                let r = match self.store.as_mut() {
                    None => Err(Error::FailedPrecondition(
                        "this manager keeps no state (--state-dir none): there is nothing to back \
                         up"
                        .into(),
                    )),
                    Some(store) => {
                        (store.backup().map_err(Error::Store)).map(|pending| in_turn(pending, turn))
                    }
                };
                // A copy nobody will read (the batch's write failed, or the caller went away
                // meanwhile) is dropped on the way, and its file with it.
                self.answer_later(reply, r);
            }
            Request::Logs {
                id,
                follow,
                tail,
                reply,
            } => {
                // Output is read, not state: nothing here waits for the store.
                let _ = reply.send(self.open_logs(&id, follow, tail));
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

    fn job_pb(&mut self, id: &str, include_progress: bool) -> Result<pb::Job> {
        if let Some(j) = self.core.job(id) {
            let eta = self.core.eta(id, now());
            return Ok(wire::job(
                j,
                self.specs.get(id).as_ref(),
                self.core.policy_name(),
                include_progress,
                eta,
            ));
        }
        let archived = self.archived(Some(id), None)?;
        archived
            .first()
            .map(|a| self.archived_pb(a))
            .ok_or_else(|| Error::JobNotFound(id.to_string()))
    }

    /// A warning for a job `id` named `name` when other jobs not ended have the name: a
    /// command given the name will ask which it means (names are not unique here, as Slurm's
    /// are not; Kubernetes refuses a second).
    fn same_name(&self, id: &str, name: &str) -> Option<String> {
        let others: Vec<&str> = (self.specs.named(name).iter())
            .filter(|o| o.as_str() != id)
            .filter(|o| self.core.job(o).is_some_and(|j| !j.is_terminal()))
            .map(|o| o.as_str())
            .collect();
        let first = others.first()?;
        let more = match others.len() {
            1 => String::new(),
            n => format!(" and {} more", n - 1),
        };
        Some(format!(
            "spec.name `{name}` is also the name of job {first}{more}, not ended: a command \
             given the name will ask which job it means; give this one's id"
        ))
    }

    fn submit(&mut self, spec: Option<Box<JobSpec>>) -> Result<Submitted> {
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
        // Time-ordered (UUIDv7, RFC 9562): a new job's key lands at the end of the store's
        // id-keyed B-trees instead of on a random page of each, so a commit of several
        // submissions writes a few pages, not several per job (`docs/performance.md`, "The
        // state store"); listing by id lists by submission. The millisecond of submission it
        // shows is what GetJob says anyway.
        // One id, shared by the core's records, the specs and the store's queue.
        let id = JobId::from(uuid::Uuid::now_v7().to_string());
        span.record("job", id.as_str());
        span.record("image", spec.image.as_str());
        self.traces.submitted(&id, &span);
        let core_spec = wire::job_spec(&spec);
        self.specs.insert(id.clone(), &spec);
        if self.store.is_some() {
            self.unsaved.specs.push(id.clone());
        }
        match self.answer(Input::Submit {
            id: id.clone(),
            spec: core_spec,
        }) {
            Ok(_) => {
                self.metrics.job_submitted();
                info!(job = %id, "job submitted");
                let reads = self.core.policy_reads_value_curves();
                let mut warnings = validate::warnings(&spec, policy, reads);
                warnings.extend(self.same_name(&id, &spec.name));
                for w in &warnings {
                    info!(job = %id, warning = %w, "submission warned");
                }
                Ok((self.job_pb(&id, false)?, warnings))
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
                // The worker's stream until now, if it still has one: the new one replaces it
                // if the core takes the registration.
                let id = register.worker_id.clone();
                let worker = self.core.worker(&id);
                let worker_known = worker.is_some();
                let old = worker.and_then(|w| w.conn).filter(|old| *old != conn);
                let old_instance = worker.map(|w| w.instance_id.clone());
                let instance = register.instance_id.clone();
                self.links.insert(conn, link);
                let _ = self.step(Input::Connected {
                    conn,
                    register: wire::register(register),
                });
                // Refused (a second agent process while the first is connected), the new
                // stream was closed by the step (`Effect::Rejected`) and the old one stays.
                let taken = self.core.worker(&id).is_some_and(|w| w.conn == Some(conn));
                if taken {
                    self.metrics.registered(worker_known);
                }
                if let (true, Some(old)) = (taken, old) {
                    if old_instance.is_some_and(|i| i != instance) {
                        // The old process went silent (its host crashed, its network broke).
                        info!(worker = %id, new = %instance, "a new agent process registered as this worker while the old one's stream was silent; the new stream replaces it");
                    }
                    // Close it rather than keep reading it (the core refuses what still comes
                    // on it): one stream, and one message budget, per worker.
                    self.close_link(
                        old,
                        tonic::Status::aborted(converge_messenger::agent::REPLACED),
                    );
                }
            }
            StreamEvent::Message {
                conn,
                kind: pb::agent_message::Kind::Logs(chunk),
            } => {
                self.metrics.received("logs");
                self.on_log_chunk(conn, chunk);
            }
            StreamEvent::Message { conn, kind } => {
                self.metrics.received(kind.name());
                let heartbeat = match &kind {
                    pb::agent_message::Kind::Heartbeat(hb) => Some(hb.seq),
                    _ => None,
                };
                if let Some(message) = wire::agent_message(kind) {
                    let _ = self.step(Input::Agent { conn, message });
                }
                // Everything before it on this stream has been taken, in order.
                if let Some(seq) = heartbeat {
                    self.acks_waiting.push((conn, seq));
                }
            }
            StreamEvent::Disconnected { conn, reason } => {
                self.metrics.disconnected();
                self.links.remove(&conn);
                self.logs_disconnected(conn);
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
    (crate::metrics::MIGRATION_OUTCOMES.iter())
        .find(|known| **known == o)
        .copied()
        .unwrap_or("other")
}

/// Stored events `from_seq..before_seq` (of `job` when given, the newest `limit`), decoded.
/// One that cannot be decoded is an error naming it, as at a restart (`recover`): a replay
/// that skipped it would look complete.
fn stored_events(
    store: &mut dyn Store,
    from_seq: u64,
    before_seq: u64,
    job: Option<&str>,
    limit: usize,
) -> Result<Vec<Event>> {
    store
        .events(from_seq, before_seq, job, limit)
        .map_err(Error::Store)?
        .iter()
        .map(|e| {
            Event::decode(e.bytes.as_slice())
                .map_err(|err| damaged(store.location(), format!("event {}", e.seq), err))
        })
        .collect()
}

/// A stored record that the store gave back but that does not decode.
fn damaged(path: String, what: String, why: prost::DecodeError) -> Error {
    Error::Store(converge_store::Error::Record {
        path: path.into(),
        what,
        why: why.to_string(),
    })
}
