//! Shared pieces of the agent's Docker tests: a scripted manager over real gRPC, Docker and
//! image checks that fail loudly, and cleanup guards.
#![allow(dead_code, missing_docs)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use converge_messenger::manager::{AgentLink, AgentStreams, StreamEvent};
use converge_messenger::pb;
use converge_messenger::pb::agent_message::Kind;
use converge_messenger::pb::agent_service_server::AgentServiceServer;
use converge_messenger::pb::manager_message::Kind as ManagerKind;
use tokio::sync::mpsc;
use tokio_stream::wrappers::TcpListenerStream;

pub const TRAINER_IMAGE: &str = "converge/trainer:dev";

/// Fails the test (never skips) when Docker or the trainer image is missing.
pub async fn require_docker_and_trainer() -> bollard::Docker {
    let docker = match bollard::Docker::connect_with_defaults() {
        Ok(d) => d,
        Err(e) => panic!("these tests need Docker: cannot connect ({e})"),
    };
    let docker = docker
        .negotiate_version()
        .await
        .unwrap_or_else(|e| panic!("these tests need a running Docker engine: {e}"));
    if docker.inspect_image(TRAINER_IMAGE).await.is_err() {
        panic!(
            "image {TRAINER_IMAGE} is missing: build it with \
             `cargo xtask images trainer` (from the workspace root)"
        );
    }
    docker
}

/// What the scripted manager saw, in order.
#[derive(Debug)]
pub enum Seen {
    Connected(pb::Register),
    Msg(Kind),
    Disconnected(String),
}

/// A manager that only records what agents send and sends what the test says.
pub struct Manager {
    pub addr: SocketAddr,
    rx: mpsc::Receiver<Seen>,
    link: Arc<Mutex<Option<AgentLink>>>,
    /// Everything seen so far (for failure messages).
    pub log: Vec<String>,
}

impl Manager {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (ev_tx, mut ev_rx) = mpsc::channel::<StreamEvent>(4096);
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(AgentServiceServer::new(AgentStreams::new(ev_tx)))
                .serve_with_incoming(TcpListenerStream::new(listener))
                .await
                .unwrap();
        });
        let (tx, rx) = mpsc::channel(65536);
        let link: Arc<Mutex<Option<AgentLink>>> = Arc::default();
        let link2 = link.clone();
        tokio::spawn(async move {
            while let Some(ev) = ev_rx.recv().await {
                let seen = match ev {
                    StreamEvent::Connected { register, link, .. } => {
                        let _ = link.send(ManagerKind::Registered(pb::Registered {
                            manager_id: "scripted".into(),
                            policy: "none".into(),
                            heartbeat_interval_ms: 200,
                            ..Default::default()
                        }));
                        *link2.lock().unwrap() = Some(link);
                        Seen::Connected(register)
                    }
                    StreamEvent::Message { kind, .. } => Seen::Msg(kind),
                    StreamEvent::Disconnected { reason, .. } => Seen::Disconnected(reason),
                };
                if tx.send(seen).await.is_err() {
                    return;
                }
            }
        });
        Self {
            addr,
            rx,
            link,
            log: Vec::new(),
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn send(&self, cmd: pb::Command) {
        self.link
            .lock()
            .unwrap()
            .as_ref()
            .expect("no agent connected")
            .send_command(cmd)
            .expect("agent link open");
    }

    /// Ends the agent's stream with an error, as a manager that went away: the agent
    /// registers again.
    pub fn cut(&self) {
        (self.link.lock().unwrap().as_ref())
            .expect("no agent connected")
            .close_with(tonic::Status::unavailable("cut by the test"));
    }

    /// Waits for the first message `f` accepts, panicking after `timeout` with a summary.
    pub async fn wait_for<T>(
        &mut self,
        what: &str,
        timeout: Duration,
        mut f: impl FnMut(&Seen) -> Option<T>,
    ) -> T {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(seen)) => {
                    if let Some(t) = f(&seen) {
                        return t;
                    }
                    let line = summarize(&seen);
                    if !line.is_empty() {
                        self.log.push(line);
                    }
                }
                Ok(None) => panic!("manager event channel closed while waiting for {what}"),
                Err(_) => {
                    let tail: Vec<&String> = self.log.iter().rev().take(15).collect();
                    panic!(
                        "timed out after {timeout:?} waiting for {what}; last messages (newest first): {tail:#?}"
                    )
                }
            }
        }
    }

    pub async fn registered(&mut self, timeout: Duration) -> pb::Register {
        self.wait_for("a registration", timeout, |s| match s {
            Seen::Connected(r) => Some(r.clone()),
            _ => None,
        })
        .await
    }

    pub async fn result(&mut self, command_id: &str, timeout: Duration) -> pb::CommandResult {
        let id = command_id.to_string();
        self.wait_for(
            &format!("the result of {command_id}"),
            timeout,
            move |s| match s {
                Seen::Msg(Kind::Result(r)) if r.command_id == id => Some(r.clone()),
                _ => None,
            },
        )
        .await
    }

    pub async fn exited(&mut self, job: &str, timeout: Duration) -> pb::ContainerExited {
        let job = job.to_string();
        self.wait_for(&format!("the exit of {job}"), timeout, move |s| match s {
            Seen::Msg(Kind::Exited(e)) if e.job_id == job => Some(e.clone()),
            _ => None,
        })
        .await
    }

    /// Waits for a command's result and its job's exit, which may arrive in either order.
    pub async fn result_and_exit(
        &mut self,
        command_id: &str,
        job: &str,
        timeout: Duration,
    ) -> (pb::CommandResult, pb::ContainerExited) {
        let (mut result, mut exit) = (None, None);
        self.wait_for(
            &format!("the result of {command_id} and the exit of {job}"),
            timeout,
            |s| {
                match s {
                    Seen::Msg(Kind::Result(r)) if r.command_id == command_id => {
                        result = Some(r.clone())
                    }
                    Seen::Msg(Kind::Exited(e)) if e.job_id == job => exit = Some(e.clone()),
                    _ => {}
                }
                (result.is_some() && exit.is_some()).then_some(())
            },
        )
        .await;
        (result.unwrap(), exit.unwrap())
    }

    /// Sends a Save of incarnation `epoch` of `job` with `deadline_ms`, and waits for its
    /// result, which must be a success with its Saved detail, and for the job's exit.
    pub async fn save(
        &mut self,
        (command_id, job, epoch): (&str, &str, u64),
        deadline_ms: u32,
        timeout: Duration,
    ) -> (pb::Saved, pb::ContainerExited) {
        self.send(command(
            command_id,
            job,
            epoch,
            pb::command::Action::Save(pb::Save { deadline_ms }),
        ));
        let (r, exited) = self.result_and_exit(command_id, job, timeout).await;
        assert!(r.ok, "{r:?}");
        let Some(pb::command_result::Detail::Saved(saved)) = r.detail else {
            panic!("no Saved detail: {r:?}")
        };
        (saved, exited)
    }

    /// Collects progress samples of a job until `n` have arrived.
    pub async fn samples(
        &mut self,
        job: &str,
        n: usize,
        timeout: Duration,
    ) -> Vec<pb::ProgressSample> {
        let mut got = Vec::new();
        let job = job.to_string();
        self.wait_for(&format!("{n} progress samples of {job}"), timeout, |s| {
            if let Seen::Msg(Kind::Progress(b)) = s {
                got.extend(b.samples.iter().filter(|x| x.job_id == job).cloned());
            }
            (got.len() >= n).then_some(())
        })
        .await;
        got
    }
}

fn summarize(s: &Seen) -> String {
    match s {
        Seen::Connected(r) => format!("register {} containers={:?}", r.worker_id, r.containers),
        Seen::Msg(Kind::Heartbeat(_)) => String::new(),
        Seen::Msg(Kind::Progress(b)) => format!(
            "progress {} samples (last step {:?}), malformed {:?}",
            b.samples.len(),
            b.samples.last().map(|s| s.step),
            b.malformed
        ),
        Seen::Msg(Kind::Usage(u)) => format!(
            "usage {:?}",
            u.samples.iter().map(|s| s.cpu_cores).collect::<Vec<_>>()
        ),
        Seen::Msg(k) => format!("{k:?}"),
        Seen::Disconnected(r) => format!("disconnected: {r}"),
    }
}

pub fn command(id: &str, job: &str, epoch: u64, action: pb::command::Action) -> pb::Command {
    pb::Command {
        command_id: id.into(),
        job_id: job.into(),
        epoch,
        traceparent: String::new(),
        action: Some(action),
    }
}

/// A Start of a trainer job that runs `steps` steps at ~2500 steps/s per core.
pub fn start_trainer(steps: u64, report_every: u64, cpus: f64) -> pb::command::Action {
    pb::command::Action::Start(pb::Start {
        spec: Some(pb::JobSpec {
            name: "test".into(),
            image: TRAINER_IMAGE.into(),
            args: [
                "--model",
                "mlp-digits",
                "--threads",
                "1",
                "--steps",
                &steps.to_string(),
                "--report-every",
                &report_every.to_string(),
            ]
            .map(String::from)
            .to_vec(),
            metric: "loss".into(),
            cpus,
            ..Default::default()
        }),
        checkpoint_dir: String::new(),
        cpus,
        cpu_shares: 0,
    })
}

/// A real agent for `worker` with `cpus` cores, registered with a new scripted manager within
/// `timeout`. Cancel the token and await the handle to stop it.
pub async fn agent_for(
    worker: &TestWorker,
    cpus: f64,
    timeout: Duration,
) -> (
    Manager,
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<converge_agent::Result<()>>,
) {
    let mut m = Manager::start().await;
    let token = tokio_util::sync::CancellationToken::new();
    let agent = tokio::spawn(converge_agent::run(
        worker.config(&m.endpoint(), cpus),
        token.clone(),
    ));
    m.registered(timeout).await;
    (m, token, agent)
}

/// A worker id unique to this test run, and the guard that removes everything it made.
pub struct TestWorker {
    pub id: String,
    pub cgroup_parent: String,
    pub checkpoint_root: PathBuf,
}

impl TestWorker {
    pub fn new(name: &str) -> Self {
        let id = format!(
            "t{}-{name}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        Self {
            cgroup_parent: format!("/converge-test/{id}"),
            checkpoint_root: std::env::temp_dir().join(format!("converge-agent-test-{id}")),
            id,
        }
    }

    pub fn config(&self, manager: &str, cpus: f64) -> converge_agent::Config {
        let mut c = converge_agent::Config::new(manager, &self.id, cpus);
        c.cgroup_parent = self.cgroup_parent.clone();
        c.checkpoint_root = self.checkpoint_root.clone();
        c.heartbeat_interval = Duration::from_millis(200);
        c.usage_interval = Duration::from_millis(300);
        c.stop_grace = Duration::from_secs(5);
        c
    }

    /// Container ids (all states) carrying this worker's label.
    pub fn containers(&self) -> Vec<String> {
        let out = std::process::Command::new("docker")
            .args(["ps", "-aq", "--no-trunc", "--filter"])
            .arg(format!("label=converge.worker={}", self.id))
            .output()
            .expect("docker CLI");
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(String::from)
            .collect()
    }

    /// The v1 cpu directory of the worker's parent cgroup.
    pub fn cpu_cgroup_dir(&self) -> PathBuf {
        PathBuf::from("/sys/fs/cgroup/cpu").join(self.cgroup_parent.trim_start_matches('/'))
    }
}

impl Drop for TestWorker {
    fn drop(&mut self) {
        let ids = self.containers();
        if !ids.is_empty() {
            let _ = std::process::Command::new("docker")
                .args(["rm", "-f"])
                .args(&ids)
                .output();
        }
        let parent = self.cgroup_parent.trim_start_matches('/');
        if let Ok(rd) = std::fs::read_dir("/sys/fs/cgroup") {
            for h in rd.flatten() {
                let leaf = h.path().join(parent);
                let _ = std::fs::remove_dir(&leaf);
                let _ = std::fs::remove_dir(h.path().join("converge-test"));
            }
        }
        let _ = std::fs::remove_dir_all(&self.checkpoint_root);
    }
}
