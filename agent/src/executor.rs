//! The executor: the actor that owns the worker's containers.
//!
//! One task owns the container table and receives, in order, the manager's commands and the
//! Docker events of this worker's containers. For every command it first consults the
//! [`CommandLedger`] (fencing by epoch, idempotency by command id), then acts through Docker
//! and answers with a `CommandResult`. Quick commands (Start, SetLimits, Pause, Resume) run
//! inline, so the table always reflects them before the next message; the ones that wait for a
//! container to exit (Stop, Save) run in their own task and report back, so a slow checkpoint
//! never holds up other jobs' commands.
//!
//! When a container dies, a finalizer task waits for its log follower to read the last lines,
//! flushes progress (so the manager sees the `done` line first), reads the exit code and OOM
//! flag, sends `ContainerExited`, removes the container (unless `--keep-exited`) and tells the
//! executor to forget it. The Docker container set is therefore the set of containers whose
//! exit has not been reported yet, which is what makes re-adoption after a restart simple.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bollard::Docker;
use bollard::models::{ContainerSummaryStateEnum, ContainerUpdateBody, EventMessage};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, EventsOptionsBuilder, KillContainerOptionsBuilder,
    ListContainersOptionsBuilder, LogsOptionsBuilder, RemoveContainerOptionsBuilder,
    StopContainerOptionsBuilder, WaitContainerOptionsBuilder,
};
use converge_messenger::agent::{Outbox, SessionStatus};
use converge_messenger::pb;
use converge_messenger::pb::agent_message::Kind;
use converge_messenger::pb::command::Action;
use converge_messenger::pb::command_result::Detail;
use futures::StreamExt;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::cgroup::{self, WorkerCgroup};
use crate::config::Config;
use crate::docker::{
    self, LABEL_CHECKPOINT_DIR, LABEL_EPOCH, LABEL_JOB, LABEL_METRIC, LABEL_WORKER,
};
use crate::monitor::{self, FollowSpec, ProgressHandle};
use crate::policy::{
    self, AppliedLimit, FlowConDriver, Mode, RoundReport, RoundTrigger, Running, SpeConDriver,
};
use crate::view::{ContainerView, JobPolicy, PolicyView, Views};
use converge_policy::growth::Direction;

/// Command results remembered for answering repeated command ids.
pub const RESULT_CACHE: usize = 4096;

/// Lines of an adopted container's log read back to recover its last step.
const ADOPT_TAIL_LINES: u32 = 64;

/// Save deadline when the command sets none.
const DEFAULT_SAVE_DEADLINE_MS: u64 = 30_000;

/// How long an exit report waits for the log follower to read the container's last lines.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(3);

/// What the ledger says about a command before it runs.
#[derive(Debug, PartialEq)]
pub enum Admission {
    /// New and current: execute it.
    Execute,
    /// Seen before and answered: send this again (marked `replayed`).
    Replay(pb::CommandResult),
    /// Seen before and still running: its result will be sent when it finishes.
    InFlight,
    /// Older than the newest epoch of its job: refused with this result (already recorded).
    Stale(pb::CommandResult),
}

/// Fencing and idempotency, as plain data: the newest epoch seen per job, the results of the
/// last [`RESULT_CACHE`] commands, and the commands still running.
#[derive(Debug)]
pub struct CommandLedger {
    epochs: HashMap<String, u64>,
    results: HashMap<String, pb::CommandResult>,
    order: VecDeque<String>,
    in_flight: HashSet<String>,
    capacity: usize,
}

impl Default for CommandLedger {
    fn default() -> Self {
        Self::with_capacity(RESULT_CACHE)
    }
}

impl CommandLedger {
    /// A ledger remembering the last `capacity` results.
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            epochs: HashMap::new(),
            results: HashMap::new(),
            order: VecDeque::new(),
            in_flight: HashSet::new(),
            capacity: capacity.max(1),
        }
    }

    /// Records an epoch seen outside a command (an adopted container's label).
    pub fn observe_epoch(&mut self, job: &str, epoch: u64) {
        let e = self.epochs.entry(job.to_string()).or_insert(epoch);
        *e = (*e).max(epoch);
    }

    /// The newest epoch seen for a job.
    pub fn epoch(&self, job: &str) -> Option<u64> {
        self.epochs.get(job).copied()
    }

    /// Decides what to do with a command; an admitted command is marked in flight.
    pub fn admit(&mut self, cmd: &pb::Command) -> Admission {
        if let Some(r) = self.results.get(&cmd.command_id) {
            let mut r = r.clone();
            r.replayed = true;
            return Admission::Replay(r);
        }
        if self.in_flight.contains(&cmd.command_id) {
            return Admission::InFlight;
        }
        if let Some(&newest) = self.epochs.get(&cmd.job_id)
            && cmd.epoch < newest
        {
            let r = result_of(cmd, Err(format!("stale epoch {} < {newest}", cmd.epoch)));
            self.record(r.clone());
            return Admission::Stale(r);
        }
        self.in_flight.insert(cmd.command_id.clone());
        Admission::Execute
    }

    /// Remembers a command's result (evicting the oldest beyond the capacity).
    ///
    /// A successful command's epoch becomes its job's newest. A failed one raises no fence:
    /// a Start of epoch 2 refused because epoch 1 still runs here must not make the Stop of
    /// epoch 1 that would clear the way "stale".
    pub fn record(&mut self, result: pb::CommandResult) {
        self.in_flight.remove(&result.command_id);
        if result.ok {
            self.observe_epoch(&result.job_id, result.epoch);
        }
        if self.results.contains_key(&result.command_id) {
            return;
        }
        self.order.push_back(result.command_id.clone());
        self.results.insert(result.command_id.clone(), result);
        while self.order.len() > self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.results.remove(&old);
            }
        }
    }
}

/// A `CommandResult` echoing the command's id, job and epoch.
pub fn result_of(cmd: &pb::Command, outcome: Result<Option<Detail>, String>) -> pb::CommandResult {
    let (ok, error, detail) = match outcome {
        Ok(d) => (true, String::new(), d),
        Err(e) => (false, e, None),
    };
    pb::CommandResult {
        command_id: cmd.command_id.clone(),
        job_id: cmd.job_id.clone(),
        epoch: cmd.epoch,
        ok,
        error,
        replayed: false,
        detail,
    }
}

/// One container the executor owns.
#[derive(Debug)]
struct Entry {
    job_id: String,
    epoch: u64,
    container_id: String,
    checkpoint_dir: String,
    follower_done: watch::Receiver<bool>,
    /// A Stop or Save asked for this exit: not a failure of the job.
    exit_requested: bool,
    /// Remove the container once its exit is reported, even with `--keep-exited`.
    remove_on_exit: bool,
    oom: bool,
    /// The die event arrived; a finalizer is reporting the exit.
    exiting: bool,
    /// The metric's direction as the job's spec gave it (None for adopted containers); a
    /// direction on the progress lines takes precedence.
    direction: Option<Direction>,
}

/// Messages from the executor's own helper tasks.
#[derive(Debug)]
pub(crate) enum Internal {
    Event(Box<EventMessage>),
    Done(pb::CommandResult),
    Finalized(String),
}

/// The executor actor's state.
pub(crate) struct Executor {
    cfg: Arc<Config>,
    docker: Docker,
    cgroup: Arc<WorkerCgroup>,
    views: Views,
    outbox: Outbox,
    session: watch::Receiver<SessionStatus>,
    progress: ProgressHandle,
    shutdown: CancellationToken,
    ledger: CommandLedger,
    containers: HashMap<String, Entry>,
    internal_tx: mpsc::Sender<Internal>,
    internal_rx: mpsc::Receiver<Internal>,
    /// The heartbeat's copy of the policy rounds' decisions (written only here).
    policy: Arc<PolicyView>,
    /// What the manager's last registration asked the worker to run.
    mode: Mode,
    /// FlowCon's executor state, while the worker policy is "flowcon".
    flowcon: Option<FlowConDriver>,
    /// SpeCon's Alg. 1 state, while the manager migrates.
    specon: Option<SpeConDriver>,
    /// Since when no stream to the manager has been up (None while connected).
    disconnected_since: Option<Instant>,
    metrics: crate::metrics::AgentMetrics,
    /// This disconnection already fenced the containers.
    fenced: bool,
}

impl Executor {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        cfg: Arc<Config>,
        docker: Docker,
        cgroup: Arc<WorkerCgroup>,
        views: Views,
        outbox: Outbox,
        session: watch::Receiver<SessionStatus>,
        progress: ProgressHandle,
        policy: Arc<PolicyView>,
        metrics: crate::metrics::AgentMetrics,
        shutdown: CancellationToken,
    ) -> Self {
        let (internal_tx, internal_rx) = mpsc::channel(1024);
        Self {
            cfg,
            docker,
            cgroup,
            views,
            outbox,
            session,
            progress,
            shutdown,
            ledger: CommandLedger::default(),
            containers: HashMap::new(),
            internal_tx,
            internal_rx,
            policy,
            mode: Mode::default(),
            flowcon: None,
            specon: None,
            // Never connected yet counts as disconnected: containers adopted while the manager
            // stays unreachable are fenced like any others.
            disconnected_since: Some(Instant::now()),
            fenced: false,
            metrics,
        }
    }

    /// Adopts what runs, signals `ready`, then serves commands and events until shutdown.
    /// Fails only when the worker's containers cannot be listed: registering without them
    /// would make the manager start running jobs a second time.
    pub(crate) async fn run(
        mut self,
        mut commands: mpsc::Receiver<pb::Command>,
        ready: watch::Sender<bool>,
    ) -> Result<(), bollard::errors::Error> {
        // Events are subscribed from a moment before the listing, so an exit between the
        // listing and the subscription is replayed rather than lost (duplicates are ignored).
        let since = unix_secs() - 1;
        tokio::spawn(
            watch_events(
                self.docker.clone(),
                self.cfg.worker_id.clone(),
                since,
                self.internal_tx.clone(),
                self.shutdown.clone(),
            )
            .in_current_span(),
        );
        let mut attempt = 0;
        while let Err(e) = self.adopt().await {
            attempt += 1;
            if attempt >= 5 {
                return Err(e);
            }
            warn!(error = %e, attempt, "could not list this worker's containers; retrying");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let _ = ready.send(true);
        let mut session = self.session.clone();
        let mut session_open = true;
        let status = session.borrow_and_update().clone();
        self.on_session(&status).await;
        loop {
            let flowcon_at = self.flowcon.as_ref().map(|f| f.next_round);
            let specon_at = self.specon.as_ref().map(|s| s.next_round);
            let fence_at = self.fence_at();
            tokio::select! {
                _ = self.shutdown.cancelled() => break,
                cmd = commands.recv() => match cmd {
                    Some(cmd) => self.on_command(cmd).await,
                    None => break,
                },
                Some(msg) = self.internal_rx.recv() => self.on_internal(msg).await,
                changed = session.changed(), if session_open => match changed {
                    Ok(()) => {
                        let status = session.borrow_and_update().clone();
                        self.on_session(&status).await;
                    }
                    // The session task is gone (shutdown): nothing will change any more.
                    Err(_) => session_open = false,
                },
                _ = sleep_until(flowcon_at) => {
                    self.flowcon_round(RoundTrigger::Interval, None).await;
                }
                _ = sleep_until(specon_at) => self.specon_round().await,
                _ = sleep_until(fence_at) => self.fence(),
            }
        }
        info!(
            containers = self.containers.len(),
            "executor stopped; containers keep running for the next agent to adopt"
        );
        Ok(())
    }

    // ---- re-adoption ----

    async fn adopt(&mut self) -> Result<(), bollard::errors::Error> {
        let filters: HashMap<&str, Vec<String>> = HashMap::from([(
            "label",
            vec![format!("{LABEL_WORKER}={}", self.cfg.worker_id)],
        )]);
        let list = self
            .docker
            .list_containers(Some(
                ListContainersOptionsBuilder::new()
                    .all(true)
                    .filters(&filters)
                    .build(),
            ))
            .await?;
        let now_ns = unix_ns();
        for c in list {
            let Some(id) = c.id.clone() else { continue };
            let labels = c.labels.clone().unwrap_or_default();
            let (Some(job), Some(epoch)) = (
                labels.get(LABEL_JOB).cloned(),
                labels.get(LABEL_EPOCH).and_then(|e| e.parse::<u64>().ok()),
            ) else {
                warn!(container = %id, "container has the worker label but no job/epoch labels; leaving it alone");
                continue;
            };
            let metric = labels.get(LABEL_METRIC).cloned();
            let checkpoint_dir = labels
                .get(LABEL_CHECKPOINT_DIR)
                .cloned()
                .unwrap_or_else(|| job.clone());
            self.ledger.observe_epoch(&job, epoch);
            let state = c.state.unwrap_or(ContainerSummaryStateEnum::EMPTY);
            match state {
                ContainerSummaryStateEnum::RUNNING
                | ContainerSummaryStateEnum::PAUSED
                | ContainerSummaryStateEnum::RESTARTING => {
                    let paused = state == ContainerSummaryStateEnum::PAUSED;
                    let mut view = ContainerView::new(
                        &job,
                        epoch,
                        &id,
                        if paused {
                            pb::ContainerState::Paused
                        } else {
                            pb::ContainerState::Running
                        },
                    );
                    view.last_step = self.last_step_from_tail(&id, metric.as_deref()).await;
                    view.cpu_limit = self
                        .docker
                        .inspect_container(&id, None)
                        .await
                        .ok()
                        .and_then(|i| i.host_config)
                        .and_then(|h| h.nano_cpus)
                        .filter(|n| *n > 0)
                        .map(|n| n as f64 / 1e9);
                    self.views.insert(id.clone(), view);
                    let follower_done = monitor::spawn_follower(
                        self.docker.clone(),
                        FollowSpec {
                            container_id: id.clone(),
                            job_id: job.clone(),
                            epoch,
                            metric,
                            history_until_ns: Some(now_ns),
                            tail: Some(ADOPT_TAIL_LINES),
                        },
                        self.views.clone(),
                        self.progress.clone(),
                        self.shutdown.clone(),
                    );
                    info!(%job, epoch, container = %id, "re-adopted a running container");
                    self.containers.insert(
                        id.clone(),
                        Entry {
                            job_id: job,
                            epoch,
                            container_id: id,
                            checkpoint_dir,
                            follower_done,
                            exit_requested: false,
                            remove_on_exit: false,
                            oom: false,
                            exiting: false,
                            direction: None,
                        },
                    );
                }
                ContainerSummaryStateEnum::CREATED => {
                    // A previous agent died between create and start: its Start was never
                    // answered, so the manager will ask again. Clear the name for it.
                    info!(%job, epoch, container = %id, "removing a container that was created but never started");
                    self.remove(&id).await;
                }
                _ => {
                    // Exited while no agent watched it: list it as exited in the registration
                    // (so the manager does not take it for lost) and report the exit.
                    let mut view = ContainerView::new(&job, epoch, &id, pb::ContainerState::Exited);
                    view.exit_code = self
                        .docker
                        .inspect_container(&id, None)
                        .await
                        .ok()
                        .and_then(|i| i.state)
                        .and_then(|s| s.exit_code)
                        .map(|c| c as i32);
                    view.last_step = self.last_step_from_tail(&id, metric.as_deref()).await;
                    view.done = self.done_in_tail(&id, metric.as_deref()).await;
                    self.views.insert(id.clone(), view);
                    info!(%job, epoch, container = %id, "found a container that exited while the agent was down");
                    let (tx, rx) = watch::channel(true);
                    drop(tx);
                    self.containers.insert(
                        id.clone(),
                        Entry {
                            job_id: job,
                            epoch,
                            container_id: id.clone(),
                            checkpoint_dir,
                            follower_done: rx,
                            exit_requested: false,
                            remove_on_exit: false,
                            oom: false,
                            exiting: false,
                            direction: None,
                        },
                    );
                    self.begin_exit(&id, None);
                }
            }
        }
        Ok(())
    }

    async fn tail_lines(&self, id: &str) -> Vec<String> {
        let opts = LogsOptionsBuilder::new()
            .stdout(true)
            .follow(false)
            .tail(&ADOPT_TAIL_LINES.to_string())
            .build();
        let mut out = Vec::new();
        let mut s = self.docker.logs(id, Some(opts));
        let mut buf = Vec::new();
        while let Some(Ok(chunk)) = s.next().await {
            buf.extend_from_slice(&chunk.into_bytes());
        }
        for line in String::from_utf8_lossy(&buf).lines() {
            out.push(line.to_string());
        }
        out
    }

    async fn last_step_from_tail(&self, id: &str, metric: Option<&str>) -> Option<u64> {
        self.tail_lines(id)
            .await
            .iter()
            .rev()
            .find_map(|l| converge_contract::parse_line(l, metric).ok().flatten())
            .map(|p| p.step)
    }

    async fn done_in_tail(&self, id: &str, metric: Option<&str>) -> bool {
        self.tail_lines(id)
            .await
            .iter()
            .any(|l| matches!(converge_contract::parse_line(l, metric), Ok(Some(p)) if p.done))
    }

    // ---- commands ----

    async fn on_command(&mut self, cmd: pb::Command) {
        let action = cmd.action.as_ref().map_or("none", |a| a.name());
        let span = info_span!(
            "command",
            action,
            id = %cmd.command_id,
            job = %cmd.job_id,
            epoch = cmd.epoch,
            traceparent = %cmd.traceparent
        );
        // The manager's span that sent the command is this span's parent: the job's trace
        // continues here (issue 8).
        converge_messenger::trace::set_remote_parent(&span, &cmd.traceparent);
        async {
            match self.ledger.admit(&cmd) {
                Admission::Replay(r) => {
                    debug!("repeated command id: answering with the earlier result");
                    self.metrics.command(action, "replayed");
                    self.outbox.send(Kind::Result(r)).await;
                }
                Admission::InFlight => {
                    debug!("repeated command id still running; its result follows");
                    self.metrics.command(action, "replayed");
                }
                Admission::Stale(r) => {
                    info!(error = %r.error, "refused a stale command");
                    self.metrics.command(action, "stale");
                    self.outbox.send(Kind::Result(r)).await;
                }
                Admission::Execute => {
                    if let Some(r) = self.execute(&cmd).await {
                        self.metrics
                            .command(action, if r.ok { "ok" } else { "failed" });
                        self.finish(r).await;
                    }
                }
            }
        }
        .instrument(span)
        .await
    }

    async fn finish(&mut self, r: pb::CommandResult) {
        if !r.ok {
            warn!(command = %r.command_id, job = %r.job_id, error = %r.error, "command failed");
        }
        self.ledger.record(r.clone());
        self.outbox.send(Kind::Result(r)).await;
    }

    /// Runs a command; `None` when it continues in a task that reports `Internal::Done`.
    async fn execute(&mut self, cmd: &pb::Command) -> Option<pb::CommandResult> {
        let Some(action) = cmd.action.as_ref() else {
            return Some(result_of(
                cmd,
                Err("command has no action (a newer manager?); nothing done".into()),
            ));
        };
        let outcome = match action {
            Action::Start(s) => {
                let span = info_span!("container_start", image = %s.spec.as_ref().map_or("", |j| j.image.as_str()));
                self.start(cmd, s).instrument(span).await
            }
            Action::SetLimits(l) => self.set_limits(cmd, l).await,
            Action::Pause(_) => self.pause(cmd, true).await,
            Action::Resume(_) => self.pause(cmd, false).await,
            Action::Stop(s) => return self.stop(cmd, s),
            Action::Save(s) => return self.save(cmd, s),
        };
        Some(result_of(cmd, outcome))
    }

    /// The job's live container on this worker.
    fn live(&self, job: &str) -> Option<&Entry> {
        self.containers
            .values()
            .filter(|e| e.job_id == job && !e.exiting)
            .max_by_key(|e| e.epoch)
    }

    fn no_container(&self, cmd: &pb::Command) -> String {
        format!(
            "no running container of job {} (epoch {}) on worker {}",
            cmd.job_id, cmd.epoch, self.cfg.worker_id
        )
    }

    async fn start(
        &mut self,
        cmd: &pb::Command,
        start: &pb::Start,
    ) -> Result<Option<Detail>, String> {
        if let Some(e) = self.live(&cmd.job_id) {
            if e.epoch == cmd.epoch {
                // Never start an incarnation twice (a re-sent Start after a reconnect).
                return Ok(Some(Detail::Started(pb::Started {
                    container_id: e.container_id.clone(),
                    from_checkpoint: false,
                })));
            }
            return Err(format!(
                "job {} already runs epoch {} in container {} on worker {}: stop or save it first",
                cmd.job_id, e.epoch, e.container_id, self.cfg.worker_id
            ));
        }
        let parent = self.cgroup.docker_parent();
        let plan = docker::plan_container(
            &docker::PlanContext {
                worker: &self.cfg.worker_id,
                capacity: self.cfg.cpus,
                cgroup_parent: &parent,
                checkpoint_root: &self.cfg.checkpoint_root,
            },
            &cmd.job_id,
            cmd.epoch,
            start,
        )?;
        std::fs::create_dir_all(&plan.host_checkpoint_dir).map_err(|e| {
            format!(
                "cannot create checkpoint directory {}: {e}",
                plan.host_checkpoint_dir.display()
            )
        })?;
        let from_checkpoint = std::fs::read_dir(&plan.host_checkpoint_dir)
            .map(|mut d| d.next().is_some())
            .unwrap_or(false);
        let opts = CreateContainerOptionsBuilder::new()
            .name(&plan.name)
            .build();
        let created = match self
            .docker
            .create_container(Some(opts.clone()), plan.body.clone())
            .await
        {
            Err(e) if docker::is_conflict(&e) => {
                // A leftover of this incarnation. A running one would be in the table; make
                // sure before removing anything, since a job must never run twice.
                let running = self
                    .docker
                    .inspect_container(&plan.name, None)
                    .await
                    .ok()
                    .and_then(|i| i.state)
                    .and_then(|s| s.running)
                    .unwrap_or(false);
                if running {
                    return Err(format!(
                        "container {} already runs on worker {} but is not adopted; \
                         not starting a second one (restart the agent to adopt it)",
                        plan.name, self.cfg.worker_id
                    ));
                }
                info!(name = %plan.name, "replacing a stopped leftover container with the same name");
                self.remove(&plan.name).await;
                self.docker
                    .create_container(Some(opts), plan.body.clone())
                    .await
            }
            other => other,
        }
        .map_err(|e| {
            if docker::is_not_found(&e) {
                let image = start.spec.as_ref().map(|s| s.image.as_str()).unwrap_or("");
                format!(
                    "image {image} is not on worker {}: build or load it there ({})",
                    self.cfg.worker_id,
                    docker::describe(&e)
                )
            } else {
                format!("cannot create the container: {}", docker::describe(&e))
            }
        })?;
        let id = created.id;
        if let Err(e) = self.docker.start_container(&id, None).await {
            self.remove(&id).await;
            return Err(format!(
                "cannot start the container: {}",
                docker::describe(&e)
            ));
        }
        let mut view = ContainerView::new(&cmd.job_id, cmd.epoch, &id, pb::ContainerState::Running);
        view.cpu_limit = Some(plan.cpus);
        self.views.insert(id.clone(), view);
        let metric = start
            .spec
            .as_ref()
            .map(|s| s.metric.clone())
            .filter(|m| !m.is_empty());
        let follower_done = monitor::spawn_follower(
            self.docker.clone(),
            FollowSpec {
                container_id: id.clone(),
                job_id: cmd.job_id.clone(),
                epoch: cmd.epoch,
                metric,
                history_until_ns: None,
                tail: None,
            },
            self.views.clone(),
            self.progress.clone(),
            self.shutdown.clone(),
        );
        self.containers.insert(
            id.clone(),
            Entry {
                job_id: cmd.job_id.clone(),
                epoch: cmd.epoch,
                container_id: id.clone(),
                checkpoint_dir: plan.checkpoint_dir,
                follower_done,
                exit_requested: false,
                remove_on_exit: false,
                oom: false,
                exiting: false,
                direction: start.spec.as_ref().and_then(|s| {
                    match pb::Direction::try_from(s.direction) {
                        Ok(pb::Direction::Maximize) => Some(Direction::Maximize),
                        Ok(pb::Direction::Minimize) => Some(Direction::Minimize),
                        _ => None,
                    }
                }),
            },
        );
        info!(container = %id, name = %plan.name, cpus = plan.cpus, from_checkpoint, "started");
        Ok(Some(Detail::Started(pb::Started {
            container_id: id,
            from_checkpoint,
        })))
    }

    async fn set_limits(
        &mut self,
        cmd: &pb::Command,
        l: &pb::SetLimits,
    ) -> Result<Option<Detail>, String> {
        let id = self
            .live(&cmd.job_id)
            .map(|e| e.container_id.clone())
            .ok_or_else(|| self.no_container(cmd))?;
        // Under cgroup v1 a child quota above the parent's is refused; 0 ("no limit") is the
        // whole worker, which under the parent is the same thing.
        let cpus = cgroup::clamp_cpus(l.cpus, self.cfg.cpus);
        let shares = (l.cpu_shares > 0).then(|| l.cpu_shares.max(2));
        let update = ContainerUpdateBody {
            nano_cpus: Some(cgroup::nano_cpus(cpus)),
            cpu_shares: shares.map(i64::from),
            ..Default::default()
        };
        let updated = self.docker.update_container(&id, update).await;
        self.metrics.limit_applied("command", updated.is_ok());
        updated.map_err(|e| format!("cannot update CPU limits: {}", docker::describe(&e)))?;
        if let Some(mut v) = self.views.get_mut(&id) {
            v.cpu_limit = Some(cpus);
        }
        debug!(cpus, ?shares, "limits applied");
        Ok(Some(Detail::Limits(pb::LimitsApplied {
            cpus,
            cpu_shares: shares.unwrap_or(0),
        })))
    }

    async fn pause(&mut self, cmd: &pb::Command, pause: bool) -> Result<Option<Detail>, String> {
        let id = self
            .live(&cmd.job_id)
            .map(|e| e.container_id.clone())
            .ok_or_else(|| self.no_container(cmd))?;
        let r = if pause {
            self.docker.pause_container(&id).await
        } else {
            self.docker.unpause_container(&id).await
        };
        match r {
            Ok(()) => {}
            // Already in the asked-for state: the command's intent holds.
            Err(e) if docker::is_conflict(&e) && self.state_is(&id, pause) => {}
            Err(e) => {
                return Err(format!(
                    "cannot {} the container: {}",
                    if pause { "pause" } else { "resume" },
                    docker::describe(&e)
                ));
            }
        }
        if let Some(mut v) = self.views.get_mut(&id) {
            v.state = if pause {
                pb::ContainerState::Paused
            } else {
                pb::ContainerState::Running
            };
        }
        Ok(None)
    }

    fn state_is(&self, id: &str, paused: bool) -> bool {
        self.views
            .get(id)
            .map(|v| (v.state == pb::ContainerState::Paused) == paused)
            .unwrap_or(false)
    }

    fn stop(&mut self, cmd: &pb::Command, s: &pb::Stop) -> Option<pb::CommandResult> {
        let Some(entry) = self
            .containers
            .values_mut()
            .filter(|e| e.job_id == cmd.job_id && !e.exiting)
            .max_by_key(|e| e.epoch)
        else {
            return Some(result_of(cmd, Err(self.no_container(cmd))));
        };
        entry.exit_requested = true;
        entry.remove_on_exit = s.remove;
        let id = entry.container_id.clone();
        let docker = self.docker.clone();
        let grace = self.cfg.stop_grace.as_secs().min(i32::MAX as u64) as i32;
        let internal = self.internal_tx.clone();
        let cmd = cmd.clone();
        let metrics = self.metrics.clone();
        info!(reason = %s.reason, container = %id, "stopping");
        tokio::spawn(
            async move {
                let paused = docker
                    .inspect_container(&id, None)
                    .await
                    .ok()
                    .and_then(|i| i.state)
                    .and_then(|s| s.paused)
                    .unwrap_or(false);
                if paused {
                    // A paused container cannot handle SIGTERM; let it run to receive it.
                    let _ = docker.unpause_container(&id).await;
                }
                // Docker sends SIGTERM, waits the grace period, then SIGKILL.
                let r = docker
                    .stop_container(
                        &id,
                        Some(StopContainerOptionsBuilder::new().t(grace).build()),
                    )
                    .await;
                let outcome = match r {
                    Ok(()) => Ok(None),
                    Err(e) if docker::is_not_modified(&e) || docker::is_not_found(&e) => Ok(None),
                    Err(e) => Err(format!(
                        "cannot stop the container: {}",
                        docker::describe(&e)
                    )),
                };
                metrics.command("stop", if outcome.is_ok() { "ok" } else { "failed" });
                let _ = internal
                    .send(Internal::Done(result_of(&cmd, outcome)))
                    .await;
            }
            .in_current_span(),
        );
        None
    }

    fn save(&mut self, cmd: &pb::Command, s: &pb::Save) -> Option<pb::CommandResult> {
        let Some(id) = self.live(&cmd.job_id).map(|e| e.container_id.clone()) else {
            return Some(result_of(cmd, Err(self.no_container(cmd))));
        };
        // The protocol gives no default; an unset deadline gets Docker's own stop timeout
        // scale rather than an immediate kill that would lose the checkpoint.
        let deadline = Duration::from_millis(if s.deadline_ms == 0 {
            DEFAULT_SAVE_DEADLINE_MS
        } else {
            u64::from(s.deadline_ms)
        });
        let Some(saving) = self.begin_save(&id, deadline) else {
            return Some(result_of(cmd, Err(self.no_container(cmd))));
        };
        let internal = self.internal_tx.clone();
        let cmd = cmd.clone();
        let metrics = self.metrics.clone();
        tokio::spawn(
            async move {
                let outcome = saving.await;
                metrics.command("save", if outcome.is_ok() { "ok" } else { "failed" });
                let _ = internal
                    .send(Internal::Done(result_of(&cmd, outcome)))
                    .await;
            }
            .in_current_span(),
        );
        None
    }

    /// Checkpoint-and-stop of one container (the Save path): SIGTERM, wait for the exit up to
    /// `deadline`, else kill. Marks the exit as requested and returns the work to run (its
    /// outcome is a `Saved` detail); `None` when the container is not in the table.
    fn begin_save(
        &mut self,
        id: &str,
        deadline: Duration,
    ) -> Option<impl Future<Output = Result<Option<Detail>, String>> + Send + 'static> {
        let entry = self.containers.get_mut(id)?;
        entry.exit_requested = true;
        let id = entry.container_id.clone();
        let mut follower_done = entry.follower_done.clone();
        let checkpoint_dir = entry.checkpoint_dir.clone();
        let host_dir = self.cfg.checkpoint_root.join(&checkpoint_dir);
        let docker = self.docker.clone();
        let views = self.views.clone();
        Some(async move {
            let t0 = Instant::now();
            let _ = docker.unpause_container(&id).await;
            match docker
                .kill_container(
                    &id,
                    Some(KillContainerOptionsBuilder::new().signal("SIGTERM").build()),
                )
                .await
            {
                Ok(()) => {}
                // Not running any more (409) or gone (404): it already exited.
                Err(e) if docker::is_conflict(&e) || docker::is_not_found(&e) => {}
                Err(e) => {
                    return Err(format!(
                        "cannot signal the container: {}",
                        docker::describe(&e)
                    ));
                }
            }
            let mut killed = false;
            if tokio::time::timeout(deadline, wait_exit(&docker, &id))
                .await
                .is_err()
            {
                warn!(
                    ?deadline,
                    "container ignored SIGTERM past the deadline; killing it"
                );
                killed = true;
                let _ = docker.kill_container(&id, None).await;
                let _ =
                    tokio::time::timeout(Duration::from_secs(10), wait_exit(&docker, &id)).await;
            }
            let save_ms = t0.elapsed().as_millis() as u64;
            // The checkpoint line is among the last the container printed.
            let _ = tokio::time::timeout(DRAIN_TIMEOUT, follower_done.wait_for(|d| *d)).await;
            let (step, line_bytes) = views
                .get(&id)
                .map(|v| (v.last_step.unwrap_or(0), v.checkpoint_bytes))
                .unwrap_or((0, None));
            let checkpoint_bytes = match line_bytes {
                Some(b) if !killed => b,
                _ => tokio::task::spawn_blocking(move || dir_size(&host_dir))
                    .await
                    .unwrap_or(0),
            };
            Ok(Some(Detail::Saved(pb::Saved {
                checkpoint_dir,
                checkpoint_bytes,
                step,
                killed,
                save_ms,
            })))
        })
    }

    // ---- worker policies (FlowCon, SpeCon) and self-fencing ----

    /// The session changed: track the disconnection clock, and follow the policy the manager
    /// asked for in its last `Registered`.
    async fn on_session(&mut self, status: &SessionStatus) {
        if status.connected {
            self.disconnected_since = None;
            self.fenced = false;
        } else if self.disconnected_since.is_none() {
            self.disconnected_since = Some(Instant::now());
        }
        let mode = Mode::from_registered(status.registered.as_ref());
        if status.registered.is_some() && mode != self.mode {
            self.set_mode(mode).await;
        }
    }

    async fn set_mode(&mut self, mode: Mode) {
        let now = Instant::now();
        info!(
            flowcon = mode.flowcon,
            migration = mode.migration,
            "worker policy from the manager"
        );
        self.mode = mode;
        if mode.flowcon && self.flowcon.is_none() {
            match FlowConDriver::new(self.cfg.flowcon(), self.cfg.cpus, now) {
                Ok(d) => self.flowcon = Some(d),
                Err(e) => warn!(error = %e, "FlowCon not started: invalid parameters"),
            }
            self.flowcon_round(RoundTrigger::PolicyChanged, None).await;
        } else if !mode.flowcon
            && let Some(d) = self.flowcon.take()
        {
            // "free": containers compete freely within the worker's capacity again.
            for id in d.limited {
                if self.containers.get(&id).is_some_and(|e| !e.exiting) {
                    let _ = self.apply_cpus(&id, self.cfg.cpus).await;
                }
            }
        }
        if mode.migration && self.specon.is_none() {
            match SpeConDriver::new(self.cfg.specon(), now) {
                Ok(d) => self.specon = Some(d),
                Err(e) => warn!(error = %e, "SpeCon not started: invalid parameters"),
            }
        } else if !mode.migration {
            self.specon = None;
        }
        self.publish();
    }

    /// The job containers on the worker (one per job, the newest epoch), as the rounds see them.
    fn running(&self) -> Vec<Running> {
        let mut by_job: BTreeMap<&str, &Entry> = BTreeMap::new();
        for e in self.containers.values().filter(|e| !e.exiting) {
            match by_job.get(e.job_id.as_str()) {
                Some(old) if old.epoch >= e.epoch => {}
                _ => {
                    by_job.insert(&e.job_id, e);
                }
            }
        }
        by_job
            .into_values()
            .filter_map(|e| {
                let v = self.views.get(&e.container_id)?;
                if !matches!(
                    v.state,
                    pb::ContainerState::Running | pb::ContainerState::Paused
                ) {
                    return None;
                }
                // The counter itself at this instant (~15 µs), so that the interval CPU use is
                // measured over exactly the round's interval; else the sampler's last reading.
                let cpu_ns = self
                    .cgroup
                    .container_usage_paths(&e.container_id)
                    .read()
                    .ok()
                    .map(|(cpu, _)| cpu)
                    .or((v.cpu_total_ns > 0).then_some(v.cpu_total_ns));
                let direction = match v.direction {
                    Some(converge_contract::Direction::Maximize) => Direction::Maximize,
                    Some(converge_contract::Direction::Minimize) => Direction::Minimize,
                    None => e.direction.unwrap_or_default(),
                };
                Some(Running {
                    job_id: e.job_id.clone(),
                    epoch: e.epoch,
                    container_id: e.container_id.clone(),
                    sample: v.last_value.zip(v.last_value_at).map(|(x, t)| (t, x)),
                    first_value: v.first_value,
                    direction,
                    cpu_ns,
                    cpu_limit: v.cpu_limit,
                })
            })
            .collect()
    }

    /// [`Self::run_flowcon_round`] in a span and timed.
    async fn flowcon_round(
        &mut self,
        trigger: RoundTrigger,
        event: Option<(Option<SystemTime>, Instant)>,
    ) {
        if self.flowcon.is_none() {
            return;
        }
        // Each round is a trace of its own (not a child of the agent's lifelong span); logs
        // still show it inside the agent's span.
        let span = info_span!("flowcon_round", trigger = ?trigger);
        converge_messenger::trace::set_remote_parent(&span, "");
        let began = Instant::now();
        self.run_flowcon_round(trigger, event)
            .instrument(span)
            .await;
        self.metrics.round("flowcon", began.elapsed());
    }

    /// One FlowCon round (TCC'22 Alg. 1-3) and its limits applied; `event` is the Docker
    /// event's own time and when the executor received it, for rounds an event started.
    async fn run_flowcon_round(
        &mut self,
        trigger: RoundTrigger,
        event: Option<(Option<SystemTime>, Instant)>,
    ) {
        if self.flowcon.is_none() {
            return;
        }
        let running = self.running();
        let Some(driver) = self.flowcon.as_mut() else {
            return;
        };
        let plan = driver.round(Instant::now(), &running);
        let current: HashMap<&str, Option<f64>> = running
            .iter()
            .map(|r| (r.container_id.as_str(), r.cpu_limit))
            .collect();
        // The updates are independent (each container's quota under the worker's), so they go
        // to Docker together: a round costs one update's latency, not one per container.
        let capacity = self.cfg.cpus;
        let docker = &self.docker;
        let updates = plan.targets.iter().map(|t| {
            let now = current.get(t.container_id.as_str()).copied().flatten();
            // Docker's quota has a 10 µs-per-100 ms grain; skip updates that change nothing.
            let changed = now.is_none_or(|c| (c - t.cpus).abs() > 1e-4);
            async move {
                let error = if changed {
                    update_cpus(docker, &t.container_id, t.cpus, capacity)
                        .await
                        .err()
                } else {
                    None
                };
                (t, now, changed, error)
            }
        });
        let results = futures::future::join_all(updates).await;
        let mut applied = Vec::with_capacity(results.len());
        for (t, now, changed, error) in results {
            if changed {
                self.metrics.limit_applied("flowcon", error.is_none());
            }
            if changed && error.is_none() {
                if let Some(mut v) = self.views.get_mut(&t.container_id) {
                    v.cpu_limit = Some(t.cpus);
                }
                if let Some(d) = self.flowcon.as_mut() {
                    d.limited.insert(t.container_id.clone());
                }
            }
            applied.push(AppliedLimit {
                job_id: t.job_id.clone(),
                container_id: t.container_id.clone(),
                cpus: if error.is_some() {
                    now.unwrap_or(capacity)
                } else {
                    t.cpus
                },
                changed,
                error,
            });
        }
        let event_to_applied =
            event.and_then(|(at, _)| at.and_then(|at| SystemTime::now().duration_since(at).ok()));
        let received_to_applied = event.map(|(_, received)| received.elapsed());
        debug!(
            ?trigger,
            alpha = plan.decisions.alpha,
            itval = plan.decisions.itval,
            ?event_to_applied,
            ?received_to_applied,
            limits = ?applied.iter().map(|a| (a.job_id.as_str(), a.cpus)).collect::<Vec<_>>(),
            "FlowCon round"
        );
        self.publish();
        if let Some(tx) = &self.cfg.round_reports {
            let _ = tx.try_send(RoundReport {
                trigger,
                decisions: plan.decisions,
                applied,
                usage: plan.usage,
                event_to_applied,
                received_to_applied,
            });
        }
    }

    /// Sets a container's CPU limit (cores) through the same Docker update as `SetLimits`.
    async fn apply_cpus(&mut self, id: &str, cpus: f64) -> Result<(), String> {
        let updated = update_cpus(&self.docker, id, cpus, self.cfg.cpus).await;
        self.metrics.limit_applied("flowcon", updated.is_ok());
        let cpus = updated?;
        if let Some(mut v) = self.views.get_mut(id) {
            v.cpu_limit = Some(cpus);
        }
        Ok(())
    }

    /// One SpeCon Alg. 1 categorization, and a MigrationRequest for each converged job it names.
    async fn specon_round(&mut self) {
        // A trace of its own, like FlowCon's rounds.
        let span = info_span!("specon_round");
        converge_messenger::trace::set_remote_parent(&span, "");
        let began = Instant::now();
        self.run_specon_round().instrument(span).await;
        self.metrics.round("specon", began.elapsed());
    }

    async fn run_specon_round(&mut self) {
        let running = self.running();
        let Some(driver) = self.specon.as_mut() else {
            return;
        };
        let requests = driver.round(Instant::now(), &running);
        self.publish();
        for r in requests {
            info!(job = %r.job_id, epoch = r.epoch, reason = %r.reason, "requesting migration");
            self.outbox.send(Kind::MigrationRequest(r)).await;
        }
    }

    /// Copies the rounds' decisions into the heartbeat's view: FlowCon's lists when it runs
    /// (also under `converge`, where SpeCon's categories only drive the requests), else
    /// SpeCon's categories.
    fn publish(&self) {
        let epochs: HashMap<&str, u64> = self
            .containers
            .values()
            .filter(|e| !e.exiting)
            .map(|e| (e.job_id.as_str(), e.epoch))
            .collect();
        let mut jobs: HashMap<String, JobPolicy> = HashMap::new();
        if let Some(d) = &self.flowcon {
            for s in d.flowcon().snapshots() {
                if let Some(&epoch) = epochs.get(s.job_id.as_str()) {
                    jobs.insert(
                        s.job_id,
                        JobPolicy {
                            epoch,
                            category: policy::category_to_pb(s.category),
                            growth_efficiency: s.growth_efficiency,
                        },
                    );
                }
            }
        } else if let Some(d) = &self.specon {
            for (id, c) in d.categories() {
                if let Some(&epoch) = epochs.get(id.as_str()) {
                    jobs.insert(
                        id.clone(),
                        JobPolicy {
                            epoch,
                            category: policy::category_to_pb(c),
                            growth_efficiency: None,
                        },
                    );
                }
            }
        }
        self.policy.jobs.retain(|id, _| jobs.contains_key(id));
        for (id, p) in jobs {
            self.policy.jobs.insert(id, p);
        }
        *self
            .policy
            .flowcon
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = self
            .flowcon
            .as_ref()
            .map(|d| (d.flowcon().alpha(), d.flowcon().itval()));
    }

    /// When this disconnection fences the containers (None: connected, fenced, or off).
    fn fence_at(&self) -> Option<Instant> {
        if self.cfg.fence_after.is_zero() || self.fenced {
            return None;
        }
        self.disconnected_since.map(|t| t + self.cfg.fence_after)
    }

    /// Self-fencing: no manager for `--fence-after`. The manager will declare this worker lost
    /// and restart its jobs elsewhere from their checkpoints (after its `--recover-lost-after`),
    /// so every job container here is checkpointed and stopped first: at most one incarnation
    /// of a job ever runs. Their exits are reported with the next registration.
    fn fence(&mut self) {
        self.fenced = true;
        let ids: Vec<(String, String, u64)> = self
            .containers
            .values()
            .filter(|e| !e.exiting && !e.exit_requested)
            .map(|e| (e.container_id.clone(), e.job_id.clone(), e.epoch))
            .collect();
        if ids.is_empty() {
            return;
        }
        warn!(
            containers = ids.len(),
            fence_after = ?self.cfg.fence_after,
            "no manager for longer than --fence-after: checkpointing and stopping every job \
             container, so that a job restarted elsewhere never runs twice"
        );
        let deadline = self.cfg.stop_grace.max(Duration::from_secs(1));
        for (id, job, epoch) in ids {
            let Some(saving) = self.begin_save(&id, deadline) else {
                continue;
            };
            tokio::spawn(
                async move {
                    match saving.await {
                        Ok(Some(Detail::Saved(s))) => info!(
                            %job, epoch, step = s.step, killed = s.killed, save_ms = s.save_ms,
                            "fenced: checkpointed and stopped"
                        ),
                        Ok(_) => info!(%job, epoch, "fenced: stopped"),
                        Err(e) => {
                            warn!(%job, epoch, error = %e, "fencing could not stop the container")
                        }
                    }
                }
                .in_current_span(),
            );
        }
    }

    // ---- events and exits ----

    async fn on_internal(&mut self, msg: Internal) {
        match msg {
            Internal::Done(r) => self.finish(r).await,
            Internal::Finalized(id) => {
                self.containers.remove(&id);
                self.views.remove(&id);
            }
            Internal::Event(ev) => self.on_event(*ev).await,
        }
    }

    async fn on_event(&mut self, ev: EventMessage) {
        let received = Instant::now();
        let at = policy::event_time(ev.time_nano);
        let Some(actor) = ev.actor else { return };
        let Some(id) = actor.id else { return };
        let attrs = actor.attributes.unwrap_or_default();
        if !self.containers.contains_key(&id) {
            return;
        }
        match ev.action.as_deref().unwrap_or("") {
            action @ ("start" | "unpause") => {
                if let Some(mut v) = self.views.get_mut(&id)
                    && v.state != pb::ContainerState::Exited
                {
                    v.state = pb::ContainerState::Running;
                }
                if action == "start" {
                    // FlowCon TCC'22 Alg. 2 lines 5-9: a new container joins NL and Alg. 1 runs
                    // now, not at the end of the interval.
                    let job_id = self.containers[&id].job_id.clone();
                    self.flowcon_round(RoundTrigger::Started { job_id }, Some((at, received)))
                        .await;
                }
            }
            "pause" => {
                if let Some(mut v) = self.views.get_mut(&id) {
                    v.state = pb::ContainerState::Paused;
                }
            }
            "oom" => {
                if let Some(e) = self.containers.get_mut(&id) {
                    e.oom = true;
                }
            }
            "die" => {
                let code = attrs.get("exitCode").and_then(|c| c.parse::<i32>().ok());
                let first = self.containers.get(&id).is_some_and(|e| !e.exiting);
                self.begin_exit(&id, code);
                if first {
                    // FlowCon TCC'22 Alg. 2 lines 10-17: a finished container leaves its list,
                    // releases its share, and Alg. 1 runs now.
                    let job_id = self.containers[&id].job_id.clone();
                    self.flowcon_round(RoundTrigger::Died { job_id }, Some((at, received)))
                        .await;
                }
            }
            other => debug!(action = other, "ignoring a container event"),
        }
    }

    /// Starts reporting a container's exit (once).
    fn begin_exit(&mut self, id: &str, code: Option<i32>) {
        let Some(e) = self.containers.get_mut(id) else {
            return;
        };
        if e.exiting {
            return;
        }
        e.exiting = true;
        if let Some(mut v) = self.views.get_mut(id) {
            v.state = pb::ContainerState::Exited;
            v.exit_code = code.or(v.exit_code);
        }
        let docker = self.docker.clone();
        let views = self.views.clone();
        let progress = self.progress.clone();
        let outbox = self.outbox.clone();
        let internal = self.internal_tx.clone();
        let mut follower_done = e.follower_done.clone();
        let (job_id, epoch, requested, oom_event) =
            (e.job_id.clone(), e.epoch, e.exit_requested, e.oom);
        let id = id.to_string();
        let remove = !self.cfg.keep_exited || e.remove_on_exit;
        let mut session = self.session.clone();
        let heartbeat = self.cfg.heartbeat_interval;
        tokio::spawn(
            async move {
                let _ = tokio::time::timeout(DRAIN_TIMEOUT, follower_done.wait_for(|d| *d)).await;
                progress.flush().await;
                let state = docker
                    .inspect_container(&id, None)
                    .await
                    .ok()
                    .and_then(|i| i.state);
                let exit_code = state
                    .as_ref()
                    .and_then(|s| s.exit_code)
                    .map(|c| c as i32)
                    .or(code)
                    .unwrap_or(-1);
                let oom_killed =
                    oom_event || state.as_ref().and_then(|s| s.oom_killed).unwrap_or(false);
                let (done, last_step) = views
                    .get(&id)
                    .map(|v| (v.done, v.last_step))
                    .unwrap_or((false, None));
                info!(%job_id, epoch, exit_code, oom_killed, done, requested, "container exited");
                outbox
                    .send(Kind::Exited(pb::ContainerExited {
                        job_id,
                        epoch,
                        container_id: id.clone(),
                        exit_code,
                        oom_killed,
                        done,
                        last_step,
                        requested,
                    }))
                    .await;
                if remove {
                    let _ = docker
                        .remove_container(
                            &id,
                            Some(RemoveContainerOptionsBuilder::new().force(true).build()),
                        )
                        .await;
                }
                // Until the report has gone out on a live stream, registrations keep listing
                // the container as exited: a manager that registers us in between must not
                // take a finished job for a lost one.
                wait_reported(&mut session, heartbeat).await;
                let _ = internal.send(Internal::Finalized(id)).await;
            }
            .in_current_span(),
        );
    }

    async fn remove(&self, id: &str) {
        if let Err(e) = self
            .docker
            .remove_container(
                id,
                Some(RemoveContainerOptionsBuilder::new().force(true).build()),
            )
            .await
            && !docker::is_not_found(&e)
        {
            warn!(container = %id, error = %docker::describe(&e), "could not remove container");
        }
    }
}

/// Follows this worker's container events into the executor, resubscribing (from the last
/// event's time) when the stream breaks, e.g. across a Docker restart.
async fn watch_events(
    docker: Docker,
    worker: String,
    mut since: i64,
    tx: mpsc::Sender<Internal>,
    shutdown: CancellationToken,
) {
    let filters: HashMap<&str, Vec<String>> = HashMap::from([
        ("type", vec!["container".to_string()]),
        ("label", vec![format!("{LABEL_WORKER}={worker}")]),
        (
            "event",
            ["start", "die", "oom", "pause", "unpause"]
                .map(String::from)
                .to_vec(),
        ),
    ]);
    loop {
        let opts = EventsOptionsBuilder::new()
            .since(&since.to_string())
            .filters(&filters)
            .build();
        let mut stream = docker.events(Some(opts));
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                item = stream.next() => match item {
                    Some(Ok(ev)) => {
                        if let Some(t) = ev.time {
                            since = t;
                        }
                        if tx.send(Internal::Event(Box::new(ev))).await.is_err() {
                            return;
                        }
                    }
                    Some(Err(e)) => {
                        warn!(error = %e, "Docker event stream failed; resubscribing");
                        break;
                    }
                    None => {
                        warn!("Docker event stream ended; resubscribing");
                        break;
                    }
                },
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// Returns once messages queued before the call have had time to go out on a stream that
/// stayed up (connected, with no re-registration, for two heartbeat periods), or when the
/// session is gone.
async fn wait_reported(session: &mut watch::Receiver<SessionStatus>, heartbeat: Duration) {
    let settle = (heartbeat * 2).max(Duration::from_millis(200));
    loop {
        if session.wait_for(|s| s.connected).await.is_err() {
            return;
        }
        let registrations = session.borrow().registrations;
        tokio::time::sleep(settle).await;
        let s = session.borrow();
        if s.connected && s.registrations == registrations {
            return;
        }
    }
}

/// Sets a container's CPU limit to `cpus` cores (clamped to the worker's capacity); returns
/// the limit now in force.
async fn update_cpus(docker: &Docker, id: &str, cpus: f64, capacity: f64) -> Result<f64, String> {
    let cpus = cgroup::clamp_cpus(cpus, capacity);
    let update = ContainerUpdateBody {
        nano_cpus: Some(cgroup::nano_cpus(cpus)),
        ..Default::default()
    };
    match docker.update_container(id, update).await {
        Ok(()) => Ok(cpus),
        Err(e) => {
            let why = format!("cannot update CPU limits: {}", docker::describe(&e));
            // The container may have exited since the round looked (its die event follows).
            debug!(container = %id, error = %why, "limit not applied");
            Err(why)
        }
    }
}

/// Sleeps until `at`; never returns for `None`.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Waits until a container is no longer running (or no longer exists).
async fn wait_exit(docker: &Docker, id: &str) {
    let opts = WaitContainerOptionsBuilder::new()
        .condition("not-running")
        .build();
    // bollard reports a non-zero exit code as an error item: either way the container stopped.
    let _ = docker.wait_container(id, Some(opts)).next().await;
}

/// Total size of the files under a directory (0 when unreadable).
fn dir_size(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack: Vec<PathBuf> = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => stack.push(e.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}

fn unix_secs() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

fn unix_ns() -> i128 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(id: &str, job: &str, epoch: u64) -> pb::Command {
        pb::Command {
            command_id: id.into(),
            job_id: job.into(),
            epoch,
            action: Some(Action::Pause(pb::Pause {})),
            ..Default::default()
        }
    }

    #[test]
    fn a_command_older_than_the_newest_epoch_is_refused() {
        let mut l = CommandLedger::default();
        assert_eq!(l.admit(&cmd("a", "j", 2)), Admission::Execute);
        l.record(result_of(&cmd("a", "j", 2), Ok(None)));
        match l.admit(&cmd("b", "j", 1)) {
            Admission::Stale(r) => {
                assert!(!r.ok);
                assert_eq!(r.error, "stale epoch 1 < 2");
                assert_eq!(r.epoch, 1);
            }
            other => panic!("expected stale, got {other:?}"),
        }
        // The same epoch and newer ones are accepted; other jobs are independent.
        assert_eq!(l.admit(&cmd("c", "j", 2)), Admission::Execute);
        assert_eq!(l.admit(&cmd("d", "j", 3)), Admission::Execute);
        l.record(result_of(&cmd("d", "j", 3), Ok(None)));
        assert_eq!(l.epoch("j"), Some(3));
        assert_eq!(l.admit(&cmd("e", "k", 1)), Admission::Execute);
    }

    #[test]
    fn a_failed_command_raises_no_fence() {
        let mut l = CommandLedger::default();
        l.observe_epoch("j", 1);
        // Start of epoch 2 fails (epoch 1 still runs here) ...
        assert_eq!(l.admit(&cmd("start2", "j", 2)), Admission::Execute);
        l.record(result_of(
            &cmd("start2", "j", 2),
            Err("already runs epoch 1".into()),
        ));
        // ... so the Stop of epoch 1 that clears the way is not stale.
        assert_eq!(l.admit(&cmd("stop1", "j", 1)), Admission::Execute);
        assert_eq!(l.epoch("j"), Some(1));
    }

    #[test]
    fn adopted_epochs_fence_commands() {
        let mut l = CommandLedger::default();
        l.observe_epoch("j", 5);
        l.observe_epoch("j", 4);
        assert!(matches!(l.admit(&cmd("a", "j", 4)), Admission::Stale(_)));
        assert_eq!(l.admit(&cmd("b", "j", 5)), Admission::Execute);
    }

    #[test]
    fn a_repeated_command_id_replays_the_earlier_result() {
        let mut l = CommandLedger::default();
        assert_eq!(l.admit(&cmd("a", "j", 1)), Admission::Execute);
        // While it runs, a repeat is neither executed nor answered twice.
        assert_eq!(l.admit(&cmd("a", "j", 1)), Admission::InFlight);
        l.record(result_of(&cmd("a", "j", 1), Err("boom".into())));
        match l.admit(&cmd("a", "j", 1)) {
            Admission::Replay(r) => {
                assert!(r.replayed);
                assert!(!r.ok);
                assert_eq!(r.error, "boom");
            }
            other => panic!("expected replay, got {other:?}"),
        }
        // A stale refusal is remembered too.
        l.observe_epoch("j", 9);
        assert!(matches!(l.admit(&cmd("s", "j", 1)), Admission::Stale(_)));
        assert!(matches!(l.admit(&cmd("s", "j", 1)), Admission::Replay(r) if r.replayed && !r.ok));
    }

    #[test]
    fn the_result_cache_is_bounded() {
        let mut l = CommandLedger::with_capacity(3);
        for i in 0..5 {
            let c = cmd(&format!("c{i}"), "j", 1);
            assert_eq!(l.admit(&c), Admission::Execute);
            l.record(result_of(&c, Ok(None)));
        }
        assert_eq!(l.results.len(), 3);
        // The oldest were forgotten: executing again is the only option left.
        assert_eq!(l.admit(&cmd("c0", "j", 1)), Admission::Execute);
        assert!(matches!(l.admit(&cmd("c4", "j", 1)), Admission::Replay(_)));
    }
}
