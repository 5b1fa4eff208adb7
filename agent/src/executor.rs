//! The executor: the I/O shell around the worker's decision core.
//!
//! Every decision about the worker's containers is made by `converge_core::node::NodeCore`
//! (pure, clock-free, the same core the simulator drives): fencing by epoch and idempotency by
//! command id, which incarnations exist, what each command does, FlowCon's and SpeCon's rounds
//! and when they are due, self-fencing. This actor is its one owner. It turns the outside
//! world into the core's inputs (decoded commands, Docker events, the session's status, cgroup
//! CPU time and progress lines read from the shared view, the timer the core asks for), calls
//! `step`, and carries out the effects: Docker actions, results and requests for the manager,
//! the heartbeat's copy of the policy state.
//!
//! Quick Docker actions (create and start, limit updates, pause, resume) are awaited inline,
//! so the core learns their outcome before the next message; the ones that wait for a
//! container to exit (Stop, Save) run in their own task and report back, so a slow checkpoint
//! never holds up other jobs' commands. A round's limit updates go to Docker together.
//!
//! When a container dies, a finalizer task waits for its log follower to read the last lines,
//! flushes progress (so the manager sees the `done` line first), reads the exit code and OOM
//! flag, sends `ContainerExited`, and once the manager has acknowledged it removes the
//! container (unless `--keep-exited`) and tells the core to forget it. The Docker container set
//! is therefore the set of containers whose exit the manager may not have yet, which is what
//! makes re-adoption after a restart simple: an agent that dies before the acknowledgement
//! finds the container again and reports its exit.

use std::collections::{HashMap, VecDeque};
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
use converge_core::node::{
    self, Answer, DockerAction, Found, NodeConfig, NodeCore, NodeEffect, NodeInput, ProgressSample,
};
use converge_messenger::agent::{Outbox, SessionStatus};
use converge_messenger::pb;
use converge_messenger::pb::agent_message::Kind;
use converge_messenger::pb::command::Action;
use converge_messenger::pb::command_result::Detail;
use converge_policy::growth::Direction;
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
use crate::policy::{self, AppliedLimit, RoundReport};
use crate::view::{ContainerView, JobPolicy, PolicyView, Views};

/// Lines of an adopted container's log read back to recover its last step.
const ADOPT_TAIL_LINES: u32 = 64;

/// How long an exit report waits for the log follower to read the container's last lines.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(3);

/// The I/O side of one container the core knows of: what the shell needs to carry out its
/// effects (decisions about it are the core's).
#[derive(Debug)]
struct Io {
    follower_done: watch::Receiver<bool>,
    /// Relative to the checkpoint root.
    checkpoint_dir: String,
    /// Docker sent an `oom` event.
    oom: bool,
}

/// Messages from the executor's own helper tasks.
#[derive(Debug)]
pub(crate) enum Internal {
    Event(Box<EventMessage>),
    /// A Docker action that waits for an exit (Stop, Save) finished.
    Done {
        command_id: String,
        action: &'static str,
        outcome: Result<Option<node::Detail>, String>,
    },
    Finalized(String),
}

/// What a step's effects are carried out for.
#[derive(Clone, Copy, Default)]
struct Ctx<'a> {
    /// The command being received (a `Create` needs its full spec).
    cmd: Option<&'a pb::Command>,
    /// The action name of the command whose result may be answered, for metrics.
    action: Option<&'static str>,
    /// The Docker event's own time and when the executor received it, for rounds an event
    /// started.
    event: Option<(Option<SystemTime>, Instant)>,
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
    /// The decisions.
    core: NodeCore,
    /// Time zero of the core's clock.
    origin: Instant,
    /// When the core wants its next tick (core time).
    wake: Option<f64>,
    /// Per container, what carrying out effects needs.
    io: HashMap<String, Io>,
    internal_tx: mpsc::Sender<Internal>,
    internal_rx: mpsc::Receiver<Internal>,
    /// The heartbeat's copy of the policy rounds' decisions (written only here, from the
    /// core's `Publish` effects).
    policy: Arc<PolicyView>,
    metrics: crate::metrics::AgentMetrics,
    /// The last lines of removed containers, for `convergectl logs`.
    kept: crate::logs::Kept,
}

/// The core's configuration from the agent's.
fn node_config(cfg: &Config) -> NodeConfig {
    NodeConfig {
        worker_id: cfg.worker_id.clone(),
        capacity: cfg.cpus,
        flowcon: cfg.flowcon(),
        specon: cfg.specon(),
        fence_after: cfg.fence_after.as_secs_f64(),
        fence_deadline: cfg.stop_grace.max(Duration::from_secs(1)).as_secs_f64(),
        stop_grace: cfg.stop_grace.as_secs_f64(),
        keep_exited: cfg.keep_exited,
        result_cache: node::RESULT_CACHE,
    }
}

impl Executor {
    /// Fails on FlowCon or SpeCon parameters the policy refuses.
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
        kept: crate::logs::Kept,
        shutdown: CancellationToken,
    ) -> crate::Result<Self> {
        let (internal_tx, internal_rx) = mpsc::channel(1024);
        // Never connected yet counts as disconnected (the core's clock starts now): containers
        // adopted while the manager stays unreachable are fenced like any others.
        // `Config::validate` has checked these settings already; this only guards a caller
        // that skipped it.
        let core = NodeCore::new(node_config(&cfg), 0.0).map_err(|e| crate::Error::Config {
            setting: "flowcon-alpha",
            why: format!("FlowCon or SpeCon refuses its parameters: {e}"),
        })?;
        Ok(Self {
            cfg,
            docker,
            cgroup,
            views,
            outbox,
            session,
            progress,
            shutdown,
            core,
            origin: Instant::now(),
            wake: None,
            io: HashMap::new(),
            internal_tx,
            internal_rx,
            policy,
            metrics,
            kept,
        })
    }

    /// The core's time now.
    fn now(&self) -> f64 {
        self.origin.elapsed().as_secs_f64()
    }

    /// A moment as the core's time.
    fn core_time(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.origin).as_secs_f64()
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
            let wake = self
                .wake
                .map(|t| self.origin + Duration::from_secs_f64(t.max(0.0)));
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
                _ = sleep_until(wake) => self.on_tick().await,
            }
        }
        info!(
            containers = self.io.len(),
            "executor stopped; containers keep running for the next agent to adopt"
        );
        Ok(())
    }

    // ---- feeding the core ----

    /// One step of the core at the current time, its effects carried out.
    async fn step(&mut self, input: NodeInput, ctx: Ctx<'_>) {
        let now = self.now();
        self.step_at(now, input, ctx).await;
    }

    async fn step_at(&mut self, now: f64, input: NodeInput, ctx: Ctx<'_>) {
        let effects = self.core.step(now, input);
        self.carry_out(effects, ctx).await;
    }

    /// Fresh measurements of every live container, for a round the next input may run:
    /// cumulative CPU time read from the cgroup at this instant (~15 µs each), so the interval
    /// CPU use is measured over exactly the round's interval (else the sampler's last
    /// reading), and the latest progress sample the log follower recorded.
    fn observe(&mut self) {
        let now = self.now();
        let live: Vec<String> = self
            .core
            .containers()
            .filter(|c| !c.exiting)
            .map(|c| c.container_id.clone())
            .collect();
        for id in live {
            let Some(v) = self.views.get(&id).map(|v| v.clone()) else {
                continue;
            };
            let cpu_ns = self
                .cgroup
                .container_usage_paths(&id)
                .read()
                .ok()
                .map(|(cpu, _)| cpu)
                .or((v.cpu_total_ns > 0).then_some(v.cpu_total_ns));
            // These inputs only record data: their effects are a `Wake` the next step repeats.
            if let Some(ns) = cpu_ns {
                self.core.step(
                    now,
                    NodeInput::Usage {
                        container_id: id.clone(),
                        cpu_seconds: ns as f64 / 1e9,
                    },
                );
            }
            if let (Some(value), Some(at)) = (v.last_value, v.last_value_at) {
                self.core.step(
                    now,
                    NodeInput::Progress {
                        container_id: id,
                        sample: ProgressSample {
                            time: self.core_time(at),
                            step: v.last_step.unwrap_or(0),
                            value,
                        },
                        initial_value: v.first_value,
                        direction: v.direction.map(|d| match d {
                            converge_contract::Direction::Maximize => Direction::Maximize,
                            converge_contract::Direction::Minimize => Direction::Minimize,
                        }),
                    },
                );
            }
        }
    }

    async fn on_tick(&mut self) {
        // Never before the time the core asked for (a timer's rounding must not make a due
        // round look early).
        let now = self.now().max(self.wake.unwrap_or(0.0));
        self.observe();
        self.step_at(now, NodeInput::Tick, Ctx::default()).await;
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
            let state = c.state.unwrap_or(ContainerSummaryStateEnum::EMPTY);
            let (found, cpu_limit) = match state {
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
                    let cpu_limit = view.cpu_limit;
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
                    self.io.insert(
                        id.clone(),
                        Io {
                            follower_done,
                            checkpoint_dir,
                            oom: false,
                        },
                    );
                    let found = if paused {
                        Found::Paused
                    } else {
                        Found::Running
                    };
                    (found, cpu_limit)
                }
                ContainerSummaryStateEnum::CREATED => {
                    info!(%job, epoch, container = %id, "removing a container that was created but never started");
                    (Found::Created, None)
                }
                _ => {
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
                    let (tx, follower_done) = watch::channel(true);
                    drop(tx);
                    self.io.insert(
                        id.clone(),
                        Io {
                            follower_done,
                            checkpoint_dir,
                            oom: false,
                        },
                    );
                    (Found::Exited, None)
                }
            };
            self.step(
                NodeInput::Adopted {
                    container_id: id,
                    job_id: job,
                    epoch,
                    found,
                    cpu_limit,
                },
                Ctx::default(),
            )
            .await;
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
        let input = NodeInput::Command(decode(&cmd));
        let ctx = Ctx {
            cmd: Some(&cmd),
            action: Some(action),
            event: None,
        };
        self.step(input, ctx).instrument(span).await
    }

    /// Carries out one step's effects in order (and those of the steps their outcomes feed
    /// back, e.g. a `Done` after an inline Docker action).
    async fn carry_out(&mut self, effects: Vec<NodeEffect>, ctx: Ctx<'_>) {
        let began = Instant::now();
        let mut queue: VecDeque<NodeEffect> = effects.into();
        // Why each of this step's round limit updates failed, for the round's report.
        let mut failed: HashMap<String, String> = HashMap::new();
        while let Some(effect) = queue.pop_front() {
            match effect {
                NodeEffect::Docker(DockerAction::UpdateCpus {
                    command: None,
                    container_id,
                    cpus,
                    ..
                }) => {
                    // A round's updates (or the release when FlowCon is turned off) come
                    // together and are independent (each container's quota under the
                    // worker's): they go to Docker together, so a round costs one update's
                    // latency, not one per container.
                    let mut batch = vec![(container_id, cpus)];
                    while let Some(NodeEffect::Docker(DockerAction::UpdateCpus {
                        command: None,
                        ..
                    })) = queue.front()
                    {
                        if let Some(NodeEffect::Docker(DockerAction::UpdateCpus {
                            container_id,
                            cpus,
                            ..
                        })) = queue.pop_front()
                        {
                            batch.push((container_id, cpus));
                        }
                    }
                    let trigger = queue.iter().find_map(|e| match e {
                        NodeEffect::Round(r) => Some(r.trigger.clone()),
                        _ => None,
                    });
                    // Each round is a trace of its own (not a child of the agent's lifelong
                    // span); logs still show it inside the agent's span.
                    let span = info_span!("flowcon_round", trigger = ?trigger);
                    converge_messenger::trace::set_remote_parent(&span, "");
                    let docker = &self.docker;
                    let updates = batch.iter().map(|(id, cpus)| async move {
                        (id, *cpus, update_cpus(docker, id, *cpus).await)
                    });
                    let results = futures::future::join_all(updates).instrument(span).await;
                    let mut feedback = Vec::new();
                    for (id, cpus, result) in results {
                        self.metrics.limit_applied("flowcon", result.is_ok());
                        match result {
                            Ok(()) => {
                                if let Some(mut v) = self.views.get_mut(id) {
                                    v.cpu_limit = Some(cpus);
                                }
                            }
                            Err(why) => {
                                failed.insert(id.clone(), why);
                                feedback.push(NodeInput::LimitFailed {
                                    container_id: id.clone(),
                                });
                            }
                        }
                    }
                    for input in feedback {
                        let now = self.now();
                        queue.extend(self.core.step(now, input));
                    }
                }
                NodeEffect::Docker(action) => {
                    if let Some(input) = self.docker_action(action, ctx).await {
                        let now = self.now();
                        queue.extend(self.core.step(now, input));
                    }
                }
                NodeEffect::Answer(answer) => self.answer(answer, ctx).await,
                NodeEffect::ReportExit(exit) => self.begin_exit(exit),
                NodeEffect::RequestMigration(r) => {
                    info!(job = %r.job_id, epoch = r.epoch, reason = %r.reason, "requesting migration");
                    self.outbox
                        .send(Kind::MigrationRequest(pb::MigrationRequest {
                            job_id: r.job_id,
                            epoch: r.epoch,
                            reason: r.reason,
                        }))
                        .await;
                }
                NodeEffect::Round(round) => {
                    let applied: Vec<AppliedLimit> = round
                        .targets
                        .iter()
                        .map(|t| {
                            let error = failed.get(&t.container_id).cloned();
                            // A failed update leaves the previous limit in force.
                            let cpus = if error.is_some() {
                                self.views
                                    .get(&t.container_id)
                                    .and_then(|v| v.cpu_limit)
                                    .unwrap_or(self.cfg.cpus)
                            } else {
                                t.cpus
                            };
                            AppliedLimit {
                                job_id: t.job_id.clone(),
                                container_id: t.container_id.clone(),
                                cpus,
                                changed: t.changed,
                                error,
                            }
                        })
                        .collect();
                    let event_to_applied = ctx.event.and_then(|(at, _)| {
                        at.and_then(|at| SystemTime::now().duration_since(at).ok())
                    });
                    let received_to_applied = ctx.event.map(|(_, received)| received.elapsed());
                    debug!(
                        trigger = ?round.trigger,
                        alpha = round.decisions.alpha,
                        itval = round.decisions.itval,
                        ?event_to_applied,
                        ?received_to_applied,
                        limits = ?applied.iter().map(|a| (a.job_id.as_str(), a.cpus)).collect::<Vec<_>>(),
                        "FlowCon round"
                    );
                    self.metrics.round("flowcon", began.elapsed());
                    if let Some(tx) = &self.cfg.round_reports {
                        let _ = tx.try_send(RoundReport {
                            trigger: round.trigger,
                            decisions: round.decisions,
                            applied,
                            usage: round.usage,
                            event_to_applied,
                            received_to_applied,
                        });
                    }
                }
                NodeEffect::SpeConRound { requests } => {
                    debug!(requests, "SpeCon categorization");
                    self.metrics.round("specon", began.elapsed());
                }
                NodeEffect::Publish(status) => self.publish(status),
                NodeEffect::Fencing { containers } => warn!(
                    containers,
                    fence_after = ?self.cfg.fence_after,
                    "no manager for longer than --fence-after: checkpointing and stopping every \
                     job container, so that a job restarted elsewhere never runs twice"
                ),
                NodeEffect::ModeChanged(mode) => info!(
                    flowcon = mode.flowcon,
                    migration = mode.migration,
                    "worker policy from the manager"
                ),
                NodeEffect::Wake { at } => self.wake = at,
            }
        }
    }

    async fn answer(&mut self, answer: Answer, ctx: Ctx<'_>) {
        let action = ctx.action.unwrap_or("none");
        match answer {
            Answer::Replay(r) => {
                debug!("repeated command id: answering with the earlier result");
                self.metrics.command(action, "replayed");
                self.outbox.send(Kind::Result(encode(r))).await;
            }
            Answer::InFlight { .. } => {
                debug!("repeated command id still running; its result follows");
                self.metrics.command(action, "replayed");
            }
            Answer::Stale(r) => {
                info!(error = %r.error, "refused a stale command");
                self.metrics.command(action, "stale");
                self.outbox.send(Kind::Result(encode(r))).await;
            }
            Answer::Result(r) => {
                self.metrics
                    .command(action, if r.ok { "ok" } else { "failed" });
                if !r.ok {
                    warn!(command = %r.command_id, job = %r.job_id, error = %r.error, "command failed");
                }
                self.outbox.send(Kind::Result(encode(r))).await;
            }
        }
    }

    /// Carries out one Docker action. An inline one that answers a command returns the
    /// core's `Done` input; those that wait for an exit report it later through `Internal`.
    async fn docker_action(&mut self, action: DockerAction, ctx: Ctx<'_>) -> Option<NodeInput> {
        match action {
            DockerAction::Create { command, .. } => {
                let start = ctx.cmd.and_then(|c| match &c.action {
                    Some(Action::Start(s)) if c.command_id == command => Some((c, s)),
                    _ => None,
                });
                let outcome = match start {
                    Some((cmd, s)) => {
                        let span = info_span!("container_start", image = %s.spec.as_ref().map_or("", |j| j.image.as_str()));
                        self.start(cmd, s).instrument(span).await.map(Some)
                    }
                    // Only a Start's own step asks for a Create.
                    None => Err("internal: Create without its Start command".into()),
                };
                Some(NodeInput::Done {
                    command_id: command,
                    outcome,
                })
            }
            DockerAction::UpdateCpus {
                command,
                container_id,
                cpus,
                cpu_shares,
            } => {
                let update = ContainerUpdateBody {
                    nano_cpus: Some(cgroup::nano_cpus(cpus)),
                    cpu_shares: cpu_shares.map(i64::from),
                    ..Default::default()
                };
                let updated = self.docker.update_container(&container_id, update).await;
                self.metrics.limit_applied("command", updated.is_ok());
                let outcome = match updated {
                    Ok(()) => {
                        if let Some(mut v) = self.views.get_mut(&container_id) {
                            v.cpu_limit = Some(cpus);
                        }
                        debug!(cpus, ?cpu_shares, "limits applied");
                        Ok(Some(node::Detail::Limits {
                            cpus,
                            cpu_shares: cpu_shares.unwrap_or(0),
                        }))
                    }
                    Err(e) => Err(format!(
                        "cannot update CPU limits: {}",
                        docker::describe(&e)
                    )),
                };
                command.map(|command_id| NodeInput::Done {
                    command_id,
                    outcome,
                })
            }
            DockerAction::Pause {
                command,
                container_id,
            } => Some(NodeInput::Done {
                command_id: command,
                outcome: self.pause(&container_id, true).await,
            }),
            DockerAction::Resume {
                command,
                container_id,
            } => Some(NodeInput::Done {
                command_id: command,
                outcome: self.pause(&container_id, false).await,
            }),
            DockerAction::Stop {
                command,
                container_id,
                grace,
            } => {
                let reason = match ctx.cmd.and_then(|c| c.action.as_ref()) {
                    Some(Action::Stop(s)) => s.reason.as_str(),
                    _ => "",
                };
                info!(%reason, container = %container_id, "stopping");
                self.stop(command, container_id, grace);
                None
            }
            DockerAction::Save {
                command,
                container_id,
                deadline,
            } => {
                self.save(command, &container_id, deadline);
                None
            }
            DockerAction::Remove { container_id } => {
                self.remove(&container_id).await;
                None
            }
        }
    }

    /// Creates and starts a `Start`'s container (the core has checked that no incarnation of
    /// the job runs here).
    async fn start(
        &mut self,
        cmd: &pb::Command,
        start: &pb::Start,
    ) -> Result<node::Detail, String> {
        let parent = self.cgroup.docker_parent();
        let plan = docker::plan_container(
            &docker::PlanContext {
                worker: &self.cfg.worker_id,
                capacity: self.cfg.cpus,
                cgroup_parent: &parent,
                checkpoint_root: &self.cfg.checkpoint_root,
                pids_limit: self.cfg.job_pids_limit,
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
        // A job running as its own user must be able to write its checkpoints.
        let user = start.spec.as_ref().map_or("", |s| s.user.as_str());
        if let Some((uid, gid)) = docker::parse_user(user)? {
            std::os::unix::fs::chown(&plan.host_checkpoint_dir, Some(uid), gid).map_err(|e| {
                format!(
                    "cannot give checkpoint directory {} to user {user}: {e}",
                    plan.host_checkpoint_dir.display()
                )
            })?;
        }
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
            let why = docker::describe(&e);
            let fix = docker::start_fix(&why);
            return Err(format!("cannot start the container: {why}{fix}"));
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
        self.io.insert(
            id.clone(),
            Io {
                follower_done,
                checkpoint_dir: plan.checkpoint_dir,
                oom: false,
            },
        );
        info!(container = %id, name = %plan.name, cpus = plan.cpus, from_checkpoint, "started");
        Ok(node::Detail::Started {
            container_id: id,
            from_checkpoint,
        })
    }

    async fn pause(&mut self, id: &str, pause: bool) -> Result<Option<node::Detail>, String> {
        let r = if pause {
            self.docker.pause_container(id).await
        } else {
            self.docker.unpause_container(id).await
        };
        match r {
            Ok(()) => {}
            // Already in the asked-for state: the command's intent holds.
            Err(e) if docker::is_conflict(&e) && self.state_is(id, pause) => {}
            Err(e) => {
                return Err(format!(
                    "cannot {} the container: {}",
                    if pause { "pause" } else { "resume" },
                    docker::describe(&e)
                ));
            }
        }
        if let Some(mut v) = self.views.get_mut(id) {
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

    /// A Stop, in its own task: it waits for the exit.
    fn stop(&mut self, command_id: String, id: String, grace: f64) {
        let docker = self.docker.clone();
        let grace = grace.clamp(0.0, i32::MAX as f64) as i32;
        let internal = self.internal_tx.clone();
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
                // Docker sends SIGTERM, waits the grace period, then SIGKILL. With no grace,
                // SIGKILL alone: a stop with t=0 still sends SIGTERM first, and a trainer's
                // checkpoint on SIGTERM is what a discarded incarnation must not write.
                let r = if grace == 0 {
                    let kill = KillContainerOptionsBuilder::new().signal("SIGKILL").build();
                    docker.kill_container(&id, Some(kill)).await
                } else {
                    let stop = StopContainerOptionsBuilder::new().t(grace).build();
                    docker.stop_container(&id, Some(stop)).await
                };
                let outcome = match r {
                    Ok(()) => Ok(None),
                    Err(e) if docker::is_not_modified(&e) || docker::is_not_found(&e) => Ok(None),
                    Err(e) => Err(format!(
                        "cannot stop the container: {}",
                        docker::describe(&e)
                    )),
                };
                let _ = internal
                    .send(Internal::Done {
                        command_id,
                        action: "stop",
                        outcome,
                    })
                    .await;
            }
            .in_current_span(),
        );
    }

    /// A Save (a command's, or self-fencing's when `command` is None), in its own task.
    fn save(&mut self, command: Option<String>, id: &str, deadline: f64) {
        let deadline = Duration::from_secs_f64(deadline.max(0.0));
        let Some(saving) = self.begin_save(id, deadline) else {
            // The core knows a container the shell does not: never happens, but a command
            // must be answered.
            if let Some(command_id) = command {
                let internal = self.internal_tx.clone();
                let why = format!("container {id} is not known to the executor");
                tokio::spawn(async move {
                    let _ = internal
                        .send(Internal::Done {
                            command_id,
                            action: "save",
                            outcome: Err(why),
                        })
                        .await;
                });
            }
            return;
        };
        let internal = self.internal_tx.clone();
        let (job, epoch) = self
            .core
            .container(id)
            .map(|c| (c.job_id.clone(), c.epoch))
            .unwrap_or_default();
        tokio::spawn(
            async move {
                let outcome = saving.await;
                match command {
                    Some(command_id) => {
                        let _ = internal
                            .send(Internal::Done {
                                command_id,
                                action: "save",
                                outcome,
                            })
                            .await;
                    }
                    None => match outcome {
                        Ok(Some(node::Detail::Saved {
                            step,
                            killed,
                            save_ms,
                            ..
                        })) => info!(
                            %job, epoch, step, killed, save_ms,
                            "fenced: checkpointed and stopped"
                        ),
                        Ok(_) => info!(%job, epoch, "fenced: stopped"),
                        Err(e) => {
                            warn!(%job, epoch, error = %e, "fencing could not stop the container")
                        }
                    },
                }
            }
            .in_current_span(),
        );
    }

    /// Checkpoint-and-stop of one container: SIGTERM, wait for the exit up to `deadline`, else
    /// kill. Returns the work to run (its outcome is a `Saved` detail); `None` when the
    /// container is not known.
    fn begin_save(
        &mut self,
        id: &str,
        deadline: Duration,
    ) -> Option<impl Future<Output = Result<Option<node::Detail>, String>> + Send + 'static> {
        let io = self.io.get(id)?;
        let id = id.to_string();
        let mut follower_done = io.follower_done.clone();
        let checkpoint_dir = io.checkpoint_dir.clone();
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
            Ok(Some(node::Detail::Saved {
                checkpoint_dir,
                checkpoint_bytes,
                step,
                killed,
                save_ms,
            }))
        })
    }

    // ---- the session, the heartbeat's policy view ----

    /// The session changed: the core tracks the disconnection clock (self-fencing) and
    /// follows the policy the manager asked for in its last `Registered`.
    async fn on_session(&mut self, status: &SessionStatus) {
        self.observe();
        let mode = status.registered.as_ref().map(|r| policy::mode(Some(r)));
        self.step(
            NodeInput::Session {
                connected: status.connected,
                mode,
            },
            Ctx::default(),
        )
        .await;
    }

    /// Copies the rounds' decisions into the heartbeat's view.
    fn publish(&self, status: node::PolicyStatus) {
        self.policy
            .jobs
            .retain(|id, _| status.jobs.iter().any(|j| &j.job_id == id));
        for j in status.jobs {
            self.policy.jobs.insert(
                j.job_id,
                JobPolicy {
                    epoch: j.epoch,
                    category: policy::category_to_pb(j.category),
                    growth_efficiency: j.growth_efficiency,
                },
            );
        }
        *self
            .policy
            .flowcon
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = status.flowcon;
    }

    // ---- events and exits ----

    async fn on_internal(&mut self, msg: Internal) {
        match msg {
            Internal::Done {
                command_id,
                action,
                outcome,
            } => {
                let ctx = Ctx {
                    action: Some(action),
                    ..Ctx::default()
                };
                self.step(
                    NodeInput::Done {
                        command_id,
                        outcome,
                    },
                    ctx,
                )
                .await;
            }
            Internal::Finalized(id) => {
                self.io.remove(&id);
                self.views.remove(&id);
                self.step(NodeInput::Gone { container_id: id }, Ctx::default())
                    .await;
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
        if self.core.container(&id).is_none() {
            return;
        }
        let ctx = Ctx {
            event: Some((at, received)),
            ..Ctx::default()
        };
        match ev.action.as_deref().unwrap_or("") {
            action @ ("start" | "unpause") => {
                if let Some(mut v) = self.views.get_mut(&id)
                    && v.state != pb::ContainerState::Exited
                {
                    v.state = pb::ContainerState::Running;
                }
                if action == "start" {
                    // FlowCon's Alg. 2: the core runs a round now.
                    self.observe();
                    self.step(NodeInput::Started { container_id: id }, ctx)
                        .await;
                }
            }
            "pause" => {
                if let Some(mut v) = self.views.get_mut(&id) {
                    v.state = pb::ContainerState::Paused;
                }
            }
            "oom" => {
                if let Some(io) = self.io.get_mut(&id) {
                    io.oom = true;
                }
            }
            "die" => {
                let exit_code = attrs.get("exitCode").and_then(|c| c.parse::<i32>().ok());
                self.observe();
                self.step(
                    NodeInput::Died {
                        container_id: id,
                        exit_code,
                    },
                    ctx,
                )
                .await;
            }
            other => debug!(action = other, "ignoring a container event"),
        }
    }

    /// Reports a container's exit (the core asks once per container).
    fn begin_exit(&mut self, exit: node::ExitToReport) {
        let node::ExitToReport {
            container_id: id,
            job_id,
            epoch,
            exit_code: code,
            requested,
            remove,
        } = exit;
        let Some(io) = self.io.get(&id) else {
            return;
        };
        if let Some(mut v) = self.views.get_mut(&id) {
            v.state = pb::ContainerState::Exited;
            v.exit_code = code.or(v.exit_code);
        }
        let docker = self.docker.clone();
        let views = self.views.clone();
        let progress = self.progress.clone();
        let outbox = self.outbox.clone();
        let internal = self.internal_tx.clone();
        let mut follower_done = io.follower_done.clone();
        let oom_event = io.oom;
        let kept = self.kept.clone();
        let name = crate::docker::container_name(&self.cfg.worker_id, &job_id, epoch);
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
                // Its last output, read once before the container (and its log) is removed:
                // a failure's reason says why from its stderr, and `convergectl logs` shows
                // what was kept of it once it is gone.
                let failed = exit_code != 0 && !requested;
                let last = if failed || remove {
                    crate::logs::last_output(&docker, &id).await
                } else {
                    Vec::new()
                };
                let stderr_tail = if failed {
                    stderr_tail(&last)
                } else {
                    String::new()
                };
                let exit = pb::ContainerExited {
                    job_id,
                    epoch,
                    container_id: id.clone(),
                    exit_code,
                    oom_killed,
                    done,
                    last_step,
                    requested,
                    stderr_tail,
                };
                if let Some(mut v) = views.get_mut(&id) {
                    v.exit = Some(exit.clone());
                }
                let delivered = outbox.send_confirmed(Kind::Exited(exit)).await;
                // Until the manager has it, registrations keep listing the container as
                // exited (its view stays): a manager that registers us in between must not
                // take a finished job for a lost one. The session sends it again on a new
                // stream. An error means the session is gone (the agent is stopping): the
                // container stays, so the next agent finds it and reports its exit.
                let delivered = delivered.await.is_ok();
                if remove && delivered {
                    // Docker's log goes with the container: keep its last lines for
                    // `convergectl logs` (a migrated job's earlier parts, a finished job).
                    kept.keep(&name, last);
                    let _ = docker
                        .remove_container(
                            &id,
                            Some(RemoveContainerOptionsBuilder::new().force(true).build()),
                        )
                        .await;
                }
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

/// A command from the wire as the core's plain data.
pub fn decode(cmd: &pb::Command) -> node::Command {
    let action = match &cmd.action {
        None => node::Action::Unknown,
        Some(Action::Start(s)) => node::Action::Start {
            direction: s
                .spec
                .as_ref()
                .and_then(|j| match pb::Direction::try_from(j.direction) {
                    Ok(pb::Direction::Maximize) => Some(Direction::Maximize),
                    Ok(pb::Direction::Minimize) => Some(Direction::Minimize),
                    _ => None,
                }),
            cpus: s.cpus,
        },
        Some(Action::SetLimits(l)) => node::Action::SetLimits {
            cpus: l.cpus,
            cpu_shares: l.cpu_shares,
        },
        Some(Action::Pause(_)) => node::Action::Pause,
        Some(Action::Resume(_)) => node::Action::Resume,
        Some(Action::Stop(s)) => node::Action::Stop {
            remove: s.remove,
            reason: s.reason.clone(),
            discard: s.discard,
        },
        Some(Action::Save(s)) => node::Action::Save {
            deadline: (s.deadline_ms > 0).then(|| f64::from(s.deadline_ms) / 1000.0),
        },
    };
    node::Command {
        id: cmd.command_id.clone(),
        job_id: cmd.job_id.clone(),
        epoch: cmd.epoch,
        action,
    }
}

/// A result from the core as a wire message.
pub fn encode(r: node::CommandResult) -> pb::CommandResult {
    pb::CommandResult {
        command_id: r.command_id,
        job_id: r.job_id,
        epoch: r.epoch,
        ok: r.ok,
        error: r.error,
        replayed: r.replayed,
        detail: r.detail.map(|d| match d {
            node::Detail::Started {
                container_id,
                from_checkpoint,
            } => Detail::Started(pb::Started {
                container_id,
                from_checkpoint,
            }),
            node::Detail::Limits { cpus, cpu_shares } => {
                Detail::Limits(pb::LimitsApplied { cpus, cpu_shares })
            }
            node::Detail::Saved {
                checkpoint_dir,
                checkpoint_bytes,
                step,
                killed,
                save_ms,
            } => Detail::Saved(pb::Saved {
                checkpoint_dir,
                checkpoint_bytes,
                step,
                killed,
                save_ms,
            }),
        }),
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

/// Sets a container's CPU quota to `cpus` cores (the core's round already kept it within the
/// worker).
async fn update_cpus(docker: &Docker, id: &str, cpus: f64) -> Result<(), String> {
    let update = ContainerUpdateBody {
        nano_cpus: Some(cgroup::nano_cpus(cpus)),
        ..Default::default()
    };
    docker.update_container(id, update).await.map_err(|e| {
        let why = format!("cannot update CPU limits: {}", docker::describe(&e));
        // The container may have exited since the round looked (its die event follows).
        debug!(container = %id, error = %why, "limit not applied");
        why
    })
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

    fn cmd(action: Option<Action>) -> pb::Command {
        pb::Command {
            command_id: "c1".into(),
            job_id: "j".into(),
            epoch: 3,
            action,
            ..Default::default()
        }
    }

    #[test]
    fn commands_decode_to_the_cores_plain_data() {
        let start = pb::Start {
            spec: Some(pb::JobSpec {
                direction: pb::Direction::Maximize as i32,
                ..Default::default()
            }),
            cpus: 1.5,
            ..Default::default()
        };
        let c = decode(&cmd(Some(Action::Start(start))));
        assert_eq!((c.id.as_str(), c.job_id.as_str(), c.epoch), ("c1", "j", 3));
        assert_eq!(
            c.action,
            node::Action::Start {
                direction: Some(Direction::Maximize),
                cpus: 1.5
            }
        );
        let save = decode(&cmd(Some(Action::Save(pb::Save { deadline_ms: 2500 }))));
        assert_eq!(
            save.action,
            node::Action::Save {
                deadline: Some(2.5)
            }
        );
        let save = decode(&cmd(Some(Action::Save(pb::Save { deadline_ms: 0 }))));
        assert_eq!(save.action, node::Action::Save { deadline: None });
        assert_eq!(decode(&cmd(None)).action, node::Action::Unknown);
    }

    #[test]
    fn results_encode_with_their_detail() {
        let r = node::CommandResult {
            command_id: "c1".into(),
            job_id: "j".into(),
            epoch: 3,
            ok: true,
            error: String::new(),
            replayed: true,
            detail: Some(node::Detail::Saved {
                checkpoint_dir: "j".into(),
                checkpoint_bytes: 7,
                step: 120,
                killed: false,
                save_ms: 40,
            }),
        };
        let pb = encode(r);
        assert!(pb.ok && pb.replayed);
        assert_eq!((pb.command_id.as_str(), pb.epoch), ("c1", 3));
        match pb.detail {
            Some(Detail::Saved(s)) => assert_eq!((s.step, s.checkpoint_bytes), (120, 7)),
            other => panic!("{other:?}"),
        }
    }
}

/// Lines of a failed container's stderr kept in its job's reason.
const STDERR_TAIL_LINES: usize = 20;
/// Bytes of them kept (the end, where the error is).
const STDERR_TAIL_BYTES: usize = 2048;

/// The last [`STDERR_TAIL_LINES`] stderr lines among a container's last `output`, at most
/// [`STDERR_TAIL_BYTES`] (cut at the start, on a character boundary), joined by " | ".
fn stderr_tail(output: &[pb::LogLine]) -> String {
    let stderr: Vec<&pb::LogLine> = output.iter().filter(|l| l.stderr).collect();
    let last = &stderr[stderr.len().saturating_sub(STDERR_TAIL_LINES)..];
    let text: Vec<u8> = last.iter().flat_map(|l| l.data.iter().copied()).collect();
    bound_tail(&String::from_utf8_lossy(&text))
}

fn bound_tail(text: &str) -> String {
    let joined = text
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" | ");
    if joined.len() <= STDERR_TAIL_BYTES {
        return joined;
    }
    let mut start = joined.len() - STDERR_TAIL_BYTES;
    while !joined.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &joined[start..])
}

#[cfg(test)]
mod stderr_tests {
    use super::*;

    #[test]
    fn a_stderr_tail_is_bounded_and_keeps_the_end() {
        assert_eq!(
            bound_tail("error: bad\n\n  hint: x  \n"),
            "error: bad |   hint: x"
        );
        let long = "é".repeat(3000);
        let t = bound_tail(&format!("{long}\nlast line"));
        assert!(t.len() <= STDERR_TAIL_BYTES + "…".len(), "{}", t.len());
        assert!(t.starts_with('…') && t.ends_with("last line"));
        // From a container's last output: its stderr lines only, the last twenty of them.
        let output: Vec<pb::LogLine> = (0..30)
            .map(|i| pb::LogLine {
                data: format!("{} {i}\n", if i % 2 == 0 { "err" } else { "out" }).into_bytes(),
                stderr: i % 2 == 0,
            })
            .collect();
        let t = stderr_tail(&output);
        assert!(!t.contains("out"), "{t}");
        assert!(t.starts_with("err 0 |") && t.ends_with("err 28"), "{t}");
        let many: Vec<pb::LogLine> = (0..30)
            .map(|i| pb::LogLine {
                data: format!("e{i}\n").into_bytes(),
                stderr: true,
            })
            .collect();
        assert!(stderr_tail(&many).starts_with("e10 |"), "the last twenty");
    }
}
