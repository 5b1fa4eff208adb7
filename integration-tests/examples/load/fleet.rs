//! Synthetic agents: real messenger sessions (the agent's own client code, real tonic over
//! loopback) that answer the manager's commands as a worker would and stream progress for
//! their containers, without Docker. Also the latency probe.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use converge_integration_tests::ScriptedAgent;
use converge_messenger::agent::{AgentState, Outbox, Session, SessionConfig};
use converge_messenger::pb::{self, agent_message::Kind, command::Action};
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

/// Job ids the bare server echoes (the probe's own job there).
pub const PROBE_PREFIX: &str = "probe-";

/// How each synthetic agent behaves.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    pub agents: usize,
    /// Cores each offers (the manager places 1-core jobs: this many per agent).
    pub cpus: f64,
    /// Progress messages per second per container; 0 = as fast as the stream takes them.
    pub rate: f64,
    /// Against the bare server: containers each agent invents (no manager places any).
    pub fake_containers: usize,
    /// A job stops reporting (but keeps running) after this many steps.
    pub quiet_after: Option<u64>,
    /// A job exits (code 0) after a number of steps in this range, picked from its id.
    pub finish_after: Option<(u64, u64)>,
    /// Worker ids start with this.
    pub prefix: String,
}

/// One container as its agent sees it.
#[derive(Debug, Clone)]
struct Container {
    epoch: u64,
    step: u64,
    total: Option<u64>,
    /// Exit code once exited (kept so that a re-registration reports it).
    exited: Option<(i32, Instant)>,
}

/// What an agent runs, shared by its session (registrations, heartbeats) and its task.
struct Worker {
    register: pb::Register,
    containers: Mutex<BTreeMap<String, Container>>,
}

/// How long an exited container is still reported at registration (as the real agent reports
/// exits the manager may not have heard of).
const EXITED_KEPT: Duration = Duration::from_secs(60);

impl AgentState for Worker {
    fn register(&self) -> impl std::future::Future<Output = pb::Register> + Send {
        let mut r = self.register.clone();
        let cs = self.containers.lock().expect("containers");
        r.containers = cs
            .iter()
            .filter(|(_, c)| c.exited.is_none_or(|(_, at)| at.elapsed() < EXITED_KEPT))
            .map(|(id, c)| pb::ContainerReport {
                job_id: id.clone(),
                epoch: c.epoch,
                container_id: container_id(id),
                state: if c.exited.is_some() {
                    pb::ContainerState::Exited as i32
                } else {
                    pb::ContainerState::Running as i32
                },
                exit_code: c.exited.map(|(code, _)| code),
                last_step: Some(c.step),
                exit: None,
            })
            .collect();
        std::future::ready(r)
    }

    fn heartbeat(&self) -> pb::Heartbeat {
        let cs = self.containers.lock().expect("containers");
        pb::Heartbeat {
            jobs: cs
                .iter()
                .filter(|(_, c)| c.exited.is_none())
                .map(|(id, c)| pb::JobStatus {
                    job_id: id.clone(),
                    epoch: c.epoch,
                    category: pb::Category::New as i32,
                    cpu_usage: 1.0,
                    state: pb::ContainerState::Running as i32,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }
}

fn container_id(job: &str) -> String {
    format!("synthetic-{job}")
}

/// Counters over the whole fleet.
#[derive(Debug, Default)]
pub struct Counts {
    /// Progress messages queued to the streams.
    pub sent: AtomicU64,
    /// Jobs that exited with code 0 on their own.
    pub finished: AtomicU64,
    /// Reconnects forced.
    pub reconnects: AtomicU64,
}

/// The synthetic agents.
pub struct Fleet {
    agents: Vec<Agent>,
    pub counts: Arc<Counts>,
    shutdown: CancellationToken,
    /// Job id -> exit code, for every job that exited on its own.
    pub exits: Arc<Mutex<BTreeMap<String, i32>>>,
}

struct Agent {
    reconnect: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Fleet {
    /// Connects `config.agents` agents to `endpoint` and waits until every one registered.
    pub async fn start(endpoint: &str, config: &FleetConfig) -> anyhow::Result<Self> {
        let counts = Arc::new(Counts::default());
        let shutdown = CancellationToken::new();
        let exits = Arc::new(Mutex::new(BTreeMap::new()));
        let mut agents = Vec::with_capacity(config.agents);
        let mut ready = Vec::with_capacity(config.agents);
        for i in 0..config.agents {
            let worker_id = format!("{}{i:05}", config.prefix);
            let mut containers = BTreeMap::new();
            for k in 0..config.fake_containers {
                containers.insert(
                    format!("fake-{worker_id}-{k}"),
                    Container {
                        epoch: 1,
                        step: 0,
                        total: None,
                        exited: None,
                    },
                );
            }
            let worker = Arc::new(Worker {
                register: ScriptedAgent::register(&worker_id, config.cpus),
                containers: Mutex::new(containers),
            });
            let (registered_tx, registered_rx) = tokio::sync::oneshot::channel();
            let reconnect = Arc::new(Notify::new());
            let task = tokio::spawn(run_agent(
                endpoint.to_string(),
                worker,
                config.clone(),
                counts.clone(),
                exits.clone(),
                reconnect.clone(),
                shutdown.child_token(),
                registered_tx,
            ));
            agents.push(Agent { reconnect, task });
            ready.push(registered_rx);
        }
        for r in ready {
            tokio::time::timeout(Duration::from_secs(120), r)
                .await
                .map_err(|_| anyhow::anyhow!("an agent did not register within 120 s"))??;
        }
        Ok(Fleet {
            agents,
            counts,
            shutdown,
            exits,
        })
    }

    /// Agent `i` drops its stream and connects again (same process: same instance id).
    pub fn reconnect(&self, i: usize) {
        self.agents[i % self.agents.len()].reconnect.notify_one();
    }

    pub async fn stop(self) {
        self.shutdown.cancel();
        for a in self.agents {
            let _ = a.task.await;
        }
    }
}

struct Link {
    outbox: Outbox,
    commands: mpsc::Receiver<pb::Command>,
    session: CancellationToken,
    status: tokio::sync::watch::Receiver<converge_messenger::agent::SessionStatus>,
}

fn connect(endpoint: &str, worker: &Arc<Worker>, parent: &CancellationToken) -> Link {
    let config = SessionConfig::new(endpoint);
    let (tx, commands) = mpsc::channel(1024);
    let session = parent.child_token();
    let (outbox, status, _task) = Session::spawn(config, worker.clone(), tx, session.clone());
    Link {
        outbox,
        commands,
        session,
        status,
    }
}

#[allow(clippy::too_many_arguments)]
async fn run_agent(
    endpoint: String,
    worker: Arc<Worker>,
    config: FleetConfig,
    counts: Arc<Counts>,
    exits: Arc<Mutex<BTreeMap<String, i32>>>,
    reconnect: Arc<Notify>,
    shutdown: CancellationToken,
    registered: tokio::sync::oneshot::Sender<()>,
) {
    let mut link = connect(&endpoint, &worker, &shutdown);
    if link.status.wait_for(|s| s.connected).await.is_ok() {
        let _ = registered.send(());
    }
    let period = (config.rate > 0.0).then(|| Duration::from_secs_f64(1.0 / config.rate));
    // Agents that started together would otherwise report in lockstep: each starts at its own
    // phase of the period, as independent workers do.
    let phase = period.map_or(Duration::ZERO, |p| {
        p.mul_f64(steps_for(&worker.register.instance_id, (0, 1_000_000)) as f64 / 1e6)
    });
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::now() + phase,
        period.unwrap_or(Duration::from_millis(1)),
    );
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            _ = reconnect.notified() => {
                link.session.cancel();
                link = connect(&endpoint, &worker, &shutdown);
                counts.reconnects.fetch_add(1, Ordering::Relaxed);
            }
            Some(c) = link.commands.recv() => answer(&worker, &link.outbox, c, config.finish_after).await,
            _ = tick.tick(), if period.is_some() => {
                round(&worker, &link.outbox, &config, &counts, &exits).await;
            }
            // As fast as the stream takes them: a round whenever nothing else is ready.
            _ = std::future::ready(()), if period.is_none() => {
                if round(&worker, &link.outbox, &config, &counts, &exits).await == 0 {
                    // Nothing to report yet: wait for a command rather than spin.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        }
    }
    link.session.cancel();
}

/// One progress message per running container; returns how many were sent.
async fn round(
    worker: &Worker,
    outbox: &Outbox,
    config: &FleetConfig,
    counts: &Counts,
    exits: &Mutex<BTreeMap<String, i32>>,
) -> usize {
    let unix_ms = converge_integration_tests::unix_nanos() / 1_000_000;
    let mut messages = Vec::new();
    {
        let mut cs = worker.containers.lock().expect("containers");
        for (id, c) in cs.iter_mut().filter(|(_, c)| c.exited.is_none()) {
            if config.quiet_after.is_some_and(|q| c.step >= q) {
                continue;
            }
            c.step += 1;
            messages.push(Kind::Progress(pb::ProgressBatch {
                samples: vec![pb::ProgressSample {
                    job_id: id.clone(),
                    epoch: c.epoch,
                    unix_ms,
                    step: c.step,
                    total_steps: c.total,
                    metric: "loss".into(),
                    // A loss computed in f32, as our trainer's and most frameworks' are.
                    value: Some(f64::from(1.0f32 / c.step as f32)),
                    ..Default::default()
                }],
                malformed: vec![],
            }));
            if c.total.is_some_and(|t| c.step >= t) {
                c.exited = Some((0, Instant::now()));
                exits.lock().expect("exits").insert(id.clone(), 0);
                counts.finished.fetch_add(1, Ordering::Relaxed);
                messages.push(Kind::Exited(pb::ContainerExited {
                    job_id: id.clone(),
                    epoch: c.epoch,
                    container_id: container_id(id),
                    exit_code: 0,
                    done: true,
                    last_step: Some(c.step),
                    ..Default::default()
                }));
            }
        }
        // Forget exits old enough that no registration reports them any more.
        cs.retain(|_, c| c.exited.is_none_or(|(_, at)| at.elapsed() < EXITED_KEPT));
    }
    let n = messages.len();
    for m in messages {
        if matches!(m, Kind::Progress(_)) {
            counts.sent.fetch_add(1, Ordering::Relaxed);
        }
        outbox.send(m).await;
    }
    n
}

/// Answers a command as the real agent would, minus Docker.
async fn answer(worker: &Worker, outbox: &Outbox, c: pb::Command, finish: Option<(u64, u64)>) {
    let mut result = pb::CommandResult {
        command_id: c.command_id.clone(),
        job_id: c.job_id.clone(),
        epoch: c.epoch,
        ok: true,
        ..Default::default()
    };
    let mut exited = None;
    match &c.action {
        Some(Action::Start(_)) => {
            let total = finish.map(|r| steps_for(&c.job_id, r));
            worker.containers.lock().expect("containers").insert(
                c.job_id.clone(),
                Container {
                    epoch: c.epoch,
                    step: 0,
                    total,
                    exited: None,
                },
            );
            result.detail = Some(pb::command_result::Detail::Started(pb::Started {
                container_id: container_id(&c.job_id),
                from_checkpoint: false,
            }));
        }
        Some(Action::Stop(_)) => {
            let mut cs = worker.containers.lock().expect("containers");
            if let Some(x) = cs.get_mut(&c.job_id).filter(|x| x.exited.is_none()) {
                x.exited = Some((143, Instant::now()));
                exited = Some(pb::ContainerExited {
                    job_id: c.job_id.clone(),
                    epoch: x.epoch,
                    container_id: container_id(&c.job_id),
                    exit_code: 143,
                    requested: true,
                    last_step: Some(x.step),
                    ..Default::default()
                });
            }
        }
        _ => {}
    }
    outbox.send(Kind::Result(result)).await;
    if let Some(e) = exited {
        outbox.send(Kind::Exited(e)).await;
    }
}

/// Picks a job's length from its id, so that a re-run of the same trace gives the same lengths.
pub fn steps_for(job: &str, (lo, hi): (u64, u64)) -> u64 {
    let h = job.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    lo + h % (hi - lo).max(1)
}

/// The latency probe: its own agent with one job of its own; every `period` it sends that
/// job's next step and times how long until the server shows it (the manager: `GetJob`
/// returns that step; the bare server: the echo arrives back on the stream).
pub struct Probe {
    worker: Arc<Worker>,
    link: Link,
    job: String,
    epoch: u64,
}

impl Probe {
    /// Connects as worker `probe` with one core.
    pub async fn connect(endpoint: &str, shutdown: &CancellationToken) -> anyhow::Result<Self> {
        let worker = Arc::new(Worker {
            register: ScriptedAgent::register("probe", 1.0),
            containers: Mutex::new(BTreeMap::new()),
        });
        let mut link = connect(endpoint, &worker, shutdown);
        tokio::time::timeout(
            Duration::from_secs(20),
            link.status.wait_for(|s| s.connected),
        )
        .await??;
        Ok(Probe {
            worker,
            link,
            job: format!("{PROBE_PREFIX}0"),
            epoch: 1,
        })
    }

    /// Waits for the manager's Start of `job` (the only job placed on the probe's worker).
    pub async fn take_start(&mut self) -> anyhow::Result<()> {
        loop {
            let c = tokio::time::timeout(Duration::from_secs(30), self.link.commands.recv())
                .await?
                .ok_or_else(|| anyhow::anyhow!("probe session closed"))?;
            let start = matches!(c.action, Some(Action::Start(_)));
            let (job, epoch) = (c.job_id.clone(), c.epoch);
            answer(&self.worker, &self.link.outbox, c, None).await;
            if start {
                self.job = job;
                self.epoch = epoch;
                return Ok(());
            }
        }
    }

    /// Samples latency every `period` for `length`; `read` returns the step the server shows
    /// (None for the bare server, whose echo is awaited instead).
    pub async fn measure(
        &mut self,
        mut client: Option<
            converge_messenger::pb::control_service_client::ControlServiceClient<
                tonic::transport::Channel,
            >,
        >,
        period: Duration,
        length: Duration,
    ) -> anyhow::Result<Vec<Duration>> {
        let mut out = Vec::new();
        let began = Instant::now();
        let mut step = 0u64;
        while began.elapsed() < length {
            step += 1;
            let sent = Instant::now();
            self.link
                .outbox
                .send(Kind::Progress(pb::ProgressBatch {
                    samples: vec![pb::ProgressSample {
                        job_id: self.job.clone(),
                        epoch: self.epoch,
                        unix_ms: converge_integration_tests::unix_nanos() / 1_000_000,
                        step,
                        metric: "loss".into(),
                        value: Some(1.0 / step as f64),
                        ..Default::default()
                    }],
                    malformed: vec![],
                }))
                .await;
            let deadline = sent + Duration::from_secs(30);
            loop {
                let seen = match &mut client {
                    Some(c) => {
                        let j = c
                            .get_job(pb::GetJobRequest {
                                job_id: self.job.clone(),
                                include_progress: false,
                            })
                            .await?
                            .into_inner();
                        j.step >= step
                    }
                    None => {
                        let c = tokio::time::timeout_at(deadline.into(), self.link.commands.recv())
                            .await?
                            .ok_or_else(|| anyhow::anyhow!("probe session closed"))?;
                        c.command_id == step.to_string()
                    }
                };
                if seen {
                    out.push(sent.elapsed());
                    break;
                }
                if Instant::now() > deadline {
                    anyhow::bail!("step {step} of the probe was not seen within 30 s");
                }
            }
            let next = sent + period;
            if next > Instant::now() {
                tokio::time::sleep_until(next.into()).await;
            }
        }
        Ok(out)
    }
}
