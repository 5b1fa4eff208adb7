//! The process under load: a real manager (the release binary, with its store on) or a bare
//! tonic `AgentService` whose handler does nothing, each in a process of its own so that its
//! CPU and memory can be read from `/proc`.

use std::io::BufRead;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use converge_integration_tests::{free_local_addr, metric_value, scrape_metrics};

/// Which server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `converge-manager`, `--policy spread`, store on.
    Manager,
    /// `load bare-server`: answers `Register`, echoes probes, drops everything else.
    Bare,
}

/// A running server process (killed on drop).
pub struct Target {
    pub addr: SocketAddr,
    metrics: Option<SocketAddr>,
    child: Child,
    /// Started under `CONVERGE_LOAD_WRAP`: the child is the wrapper, the manager its child.
    wrapped: bool,
    /// Messages the bare server reports having read (its stdout).
    bare_count: Arc<AtomicU64>,
    _state: Option<tempfile::TempDir>,
}

/// What `/proc` says of a process.
#[derive(Debug, Clone, Copy)]
pub struct ProcSample {
    pub at: Instant,
    /// User + system CPU, seconds.
    pub cpu_s: f64,
    pub rss_bytes: u64,
    /// Private writable memory mapped (`VmData`): what the process holds from the OS for its
    /// heap, thread stacks and anonymous maps, whether its pages were touched yet or not.
    /// RSS counts only the touched ones, so RSS climbing below a flat `VmData` is memory
    /// already held being written for the first time, not more memory taken.
    pub data_bytes: u64,
    pub threads: u64,
    pub fds: u64,
}

impl Target {
    /// Starts `kind` on a free loopback port and waits until it accepts connections.
    pub async fn start(kind: Kind, extra: &[&str]) -> anyhow::Result<Self> {
        Self::start_at(kind, None, extra).await
    }

    /// [`Target::start`], with the manager binary at `manager` (another build, to compare in
    /// one run) instead of the one beside this harness.
    pub async fn start_at(
        kind: Kind,
        manager: Option<&Path>,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        let addr = free_local_addr();
        let mut wrapped = false;
        let (child, metrics, state, bare_count) = match kind {
            Kind::Manager => {
                let bin = match manager {
                    Some(bin) => bin.to_path_buf(),
                    None => sibling("converge-manager")?,
                };
                let state = tempfile::tempdir()?;
                let metrics = free_local_addr();
                // `CONVERGE_LOAD_WRAP` runs the manager under a profiler (e.g. "heaptrack -o
                // /tmp/manager"). The wrapper gets its own process group, so that stopping it
                // stops the manager too and lets the profiler finish its file.
                let mut cmd = match std::env::var("CONVERGE_LOAD_WRAP") {
                    Ok(wrap) if !wrap.trim().is_empty() => {
                        let mut words = wrap.split_whitespace();
                        let mut cmd = Command::new(words.next().unwrap_or_default());
                        cmd.args(words).arg(&bin);
                        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
                        wrapped = true;
                        cmd
                    }
                    _ => Command::new(&bin),
                };
                cmd.args(["--listen", &addr.to_string()])
                    .args(["--metrics-listen", &metrics.to_string()]);
                // A `--state-dir` among the extra arguments wins (clap takes the last).
                cmd.arg("--state-dir").arg(state.path());
                let child = cmd
                    .args(["--policy", "spread"])
                    // The harness is the only caller: no per-caller limits in the way.
                    .args(["--rate-limit", "100000000"])
                    .args(["--agent-message-rate", "100000000"])
                    .args(extra)
                    .env("RUST_LOG", "warn")
                    .stdout(Stdio::null())
                    .stderr(Stdio::inherit())
                    .spawn()
                    .with_context(|| format!("starting {}", bin.display()))?;
                (
                    child,
                    Some(metrics),
                    Some(state),
                    Arc::new(AtomicU64::new(0)),
                )
            }
            Kind::Bare => {
                let exe = std::env::current_exe()?;
                let mut child = Command::new(exe)
                    .args(["bare-server", "--listen", &addr.to_string()])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::inherit())
                    .spawn()?;
                let count = Arc::new(AtomicU64::new(0));
                let out = child.stdout.take().context("bare server stdout")?;
                let c = count.clone();
                std::thread::spawn(move || {
                    for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                        if let Some(n) = line.strip_prefix("handled ") {
                            c.store(n.trim().parse().unwrap_or(0), Ordering::Relaxed);
                        }
                    }
                });
                (child, None, None, count)
            }
        };
        let began = Instant::now();
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            if began.elapsed() > Duration::from_secs(20) {
                bail!("{kind:?} did not listen on {addr} within 20 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(Target {
            addr,
            metrics,
            child,
            wrapped,
            bare_count,
            _state: state,
        })
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The server's process: under a wrapper, the wrapper's child that runs the manager (so
    /// that CPU and RSS are the manager's, profiler included), else the child itself.
    pub fn pid(&self) -> u32 {
        let pid = self.child.id();
        if !self.wrapped {
            return pid;
        }
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        children
            .split_whitespace()
            .filter_map(|c| c.parse::<u32>().ok())
            .find(|c| {
                std::fs::read_to_string(format!("/proc/{c}/comm"))
                    .is_ok_and(|comm| comm.starts_with("converge-manage"))
            })
            .unwrap_or(pid)
    }

    /// Agent messages the server has handled: the manager's own counter (taken by its actor,
    /// after the decision core saw the message), or the bare handler's.
    pub async fn handled(&self) -> anyhow::Result<u64> {
        if self.metrics.is_none() {
            return Ok(self.bare_count.load(Ordering::Relaxed));
        }
        let text = self.scrape().await?;
        Ok(text
            .lines()
            .filter(|l| l.starts_with("converge_manager_messages_received_total"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64)
    }

    /// Progress messages the manager has handled.
    pub async fn progress_handled(&self) -> anyhow::Result<u64> {
        self.manager_metric(
            "converge_manager_messages_received_total",
            r#"kind="progress""#,
        )
        .await
    }

    /// The manager's `converge_manager_jobs{state=...}` gauge.
    pub async fn jobs_in(&self, state: &str) -> anyhow::Result<u64> {
        self.manager_metric("converge_manager_jobs", &format!("state=\"{state}\""))
            .await
    }

    /// The manager's `converge_manager_tasks` gauge (tokio tasks alive).
    pub async fn tasks(&self) -> anyhow::Result<u64> {
        self.manager_metric("converge_manager_tasks", "").await
    }

    async fn scrape(&self) -> anyhow::Result<String> {
        let m = self.metrics.context("only the manager serves metrics")?;
        scrape_metrics(m, false).await
    }

    /// One of the manager's metrics (0 until it appears).
    async fn manager_metric(&self, name: &str, labels: &str) -> anyhow::Result<u64> {
        Ok(metric_value(&self.scrape().await?, name, labels).unwrap_or(0.0) as u64)
    }

    pub fn sample(&self) -> anyhow::Result<ProcSample> {
        proc_sample(self.pid())
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if self.wrapped {
            // SIGTERM to the manager alone: it shuts down, and the profiler, still running,
            // finishes its file and exits (the whole group would take the profiler down
            // mid-write). Without a manager found, the group.
            let manager = self.pid();
            let target = if manager == self.child.id() {
                format!("-{manager}")
            } else {
                manager.to_string()
            };
            let _ = Command::new("kill").args(["-TERM", "--", &target]).status();
        } else {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// `/proc/PID` now.
pub fn proc_sample(pid: u32) -> anyhow::Result<ProcSample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) start at field 3.
    let rest = stat.rsplit_once(')').context("/proc/PID/stat")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>()? + f[12].parse::<f64>()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64);
    Ok(ProcSample {
        at: Instant::now(),
        cpu_s: ticks / clock_ticks(),
        rss_bytes: field("VmRSS:") * 1024,
        data_bytes: field("VmData:") * 1024,
        threads: field("Threads:"),
        fds,
    })
}

/// `sysconf(_SC_CLK_TCK)`, from `getconf` (100 on every Linux this runs on, but asked).
fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// A binary built beside this one (`target/release/NAME`).
fn sibling(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    // target/release/examples/load -> target/release/NAME
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .context("locating the target directory")?;
    let bin = dir.join(name);
    if !bin.exists() {
        bail!(
            "{} is missing: build it first with `cargo build --release -p {name}`",
            bin.display()
        );
    }
    Ok(bin)
}

/// The bare server: a tonic `AgentService` that answers `Register` (so that the same agent
/// sessions connect to it), echoes a probe's progress as a command (so that the probe measures
/// a round trip), and drops every other message. Prints `handled N` four times a second.
pub mod bare {
    use super::*;
    use converge_messenger::pb::{
        self, AgentMessage, ManagerMessage,
        agent_message::Kind as AgentKind,
        agent_service_server::{AgentService, AgentServiceServer},
        manager_message::Kind as ManagerKind,
    };
    use tokio_stream::wrappers::ReceiverStream;
    use tonic::{Request, Response, Status, Streaming};

    struct Bare {
        handled: Arc<AtomicU64>,
    }

    #[tonic::async_trait]
    impl AgentService for Bare {
        type ConnectStream = ReceiverStream<Result<ManagerMessage, Status>>;

        async fn connect(
            &self,
            request: Request<Streaming<AgentMessage>>,
        ) -> Result<Response<Self::ConnectStream>, Status> {
            let mut inbound = request.into_inner();
            let (tx, rx) = tokio::sync::mpsc::channel(1024);
            let handled = self.handled.clone();
            tokio::spawn(async move {
                while let Ok(Some(m)) = inbound.message().await {
                    handled.fetch_add(1, Ordering::Relaxed);
                    let reply = match m.kind {
                        Some(AgentKind::Register(_)) => {
                            Some(ManagerKind::Registered(pb::Registered {
                                manager_id: "bare".into(),
                                policy: "none".into(),
                                heartbeat_interval_ms: 1000,
                                ..Default::default()
                            }))
                        }
                        Some(AgentKind::Progress(b)) => b
                            .samples
                            .first()
                            .filter(|s| s.job_id.starts_with(crate::fleet::PROBE_PREFIX))
                            .map(|s| {
                                ManagerKind::Command(pb::Command {
                                    command_id: s.step.to_string(),
                                    job_id: s.job_id.clone(),
                                    ..Default::default()
                                })
                            }),
                        _ => None,
                    };
                    if let Some(kind) = reply
                        && tx
                            .send(Ok(ManagerMessage { kind: Some(kind) }))
                            .await
                            .is_err()
                    {
                        break;
                    }
                }
            });
            Ok(Response::new(ReceiverStream::new(rx)))
        }
    }

    pub async fn serve(listen: SocketAddr) -> anyhow::Result<()> {
        let handled = Arc::new(AtomicU64::new(0));
        let h = handled.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                println!("handled {}", h.load(Ordering::Relaxed));
            }
        });
        // The manager's transport settings, so that only the handler differs.
        tonic::transport::Server::builder()
            .initial_stream_window_size(converge_messenger::manager::WINDOW_BYTES)
            .initial_connection_window_size(converge_messenger::manager::WINDOW_BYTES)
            .add_service(
                AgentServiceServer::new(Bare { handled }).max_decoding_message_size(4 << 20),
            )
            .serve(listen)
            .await?;
        Ok(())
    }
}
