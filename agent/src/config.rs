//! Command line and environment (`CONVERGE_*`), parsed into a validated [`Config`].
//!
//! The binary parses a [`Cli`] and turns it into a [`Config`] with [`Cli::into_config`]; code
//! that runs an agent in-process (tests, the testbed) builds a [`Config`] with [`Config::new`]
//! and adjusts its public fields. Either way [`Config::validate`] runs before the agent starts,
//! and its error names the setting at fault.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use crate::error::{Error, Result};

/// `converge-agent`: runs one worker's training containers and reports to the manager.
#[derive(Debug, Parser)]
#[command(
    name = "converge-agent",
    version,
    about,
    long_about = None,
    // A flag given again wins: settings from --config come first, the command line after.
    args_override_self = true
)]
pub struct Cli {
    /// A TOML file of settings, keys named as the flags (`cpus = 2`); the command line and
    /// `CONVERGE_*` variables win over it.
    #[arg(long, env = "CONVERGE_CONFIG")]
    pub config: Option<std::path::PathBuf>,
    /// The manager's agent endpoint, e.g. http://127.0.0.1:7070.
    #[arg(long, env = "CONVERGE_MANAGER")]
    pub manager: String,
    /// This worker's id (unique in the cluster; letters, digits, `-`, `_`, `.`).
    #[arg(long, env = "CONVERGE_WORKER_ID")]
    pub worker_id: String,
    /// CPU capacity in cores (fractional allowed), enforced through the worker's cgroup parent.
    #[arg(long, env = "CONVERGE_CPUS")]
    pub cpus: f64,
    /// Memory capacity offered to the manager: bytes, or with a k/m/g suffix (e.g. 4g).
    #[arg(long, env = "CONVERGE_MEMORY", default_value = "0")]
    pub memory: String,
    /// Speed relative to the reference worker (1.0 = reference, 1.5 = 50% faster), or `measure`:
    /// run the reference trainer benchmark at start (a few seconds) and report what it finds
    /// (value-based allocation's calibration coefficient; see the agent's `calibration` module).
    #[arg(long, env = "CONVERGE_CALIBRATION", default_value = "measure")]
    pub calibration: String,
    /// Heartbeat period, e.g. 1s or 500ms.
    #[arg(long, env = "CONVERGE_HEARTBEAT_INTERVAL", default_value = "1s")]
    pub heartbeat_interval: String,
    /// Host directory holding every job's checkpoint directory (created if missing).
    #[arg(
        long,
        env = "CONVERGE_CHECKPOINT_ROOT",
        default_value = "/var/lib/converge/checkpoints"
    )]
    pub checkpoint_root: PathBuf,
    /// Cgroup parent of this worker's containers; default `/converge/<worker-id>`.
    #[arg(long, env = "CONVERGE_CGROUP_PARENT")]
    pub cgroup_parent: Option<String>,
    /// Where the cgroup filesystem is mounted (the host's, when the agent runs in a container).
    #[arg(long, env = "CONVERGE_CGROUP_ROOT", default_value = "/sys/fs/cgroup")]
    pub cgroup_root: PathBuf,
    /// Docker endpoint (unix:///var/run/docker.sock, tcp://host:port); default: DOCKER_HOST or
    /// the local socket.
    #[arg(long, env = "CONVERGE_DOCKER_HOST")]
    pub docker_host: Option<String>,
    /// How often container CPU and memory usage is sampled and sent, e.g. 1s.
    #[arg(long, env = "CONVERGE_USAGE_INTERVAL", default_value = "1s")]
    pub usage_interval: String,
    /// Where usage is read from (auto: cgroup files when readable, else the Docker stats API).
    #[arg(long, env = "CONVERGE_USAGE_SOURCE", value_enum, default_value_t = UsageSource::Auto)]
    pub usage_source: UsageSource,
    /// Grace period between SIGTERM and SIGKILL for Stop, e.g. 10s.
    #[arg(long, env = "CONVERGE_STOP_GRACE", default_value = "10s")]
    pub stop_grace: String,
    /// Keep containers after their exit was reported (for debugging; default removes them).
    #[arg(long, env = "CONVERGE_KEEP_EXITED", default_value_t = false)]
    pub keep_exited: bool,
    /// Worker labels `key=value` (repeat the flag, or comma-separate in the variable).
    #[arg(long = "label", env = "CONVERGE_LABELS", value_delimiter = ',')]
    pub labels: Vec<String>,
    /// FlowCon's algorithm interval `itval` (when the manager's policy runs FlowCon), e.g. 20s.
    #[arg(long, env = "CONVERGE_FLOWCON_INTERVAL", default_value = "20s")]
    pub flowcon_interval: String,
    /// A fixed FlowCon threshold α (turns the adaptive threshold, Alg. 3, off). α is in
    /// fractions of the job's initial metric gained per second per worker of CPU.
    #[arg(long, env = "CONVERGE_FLOWCON_ALPHA")]
    pub flowcon_alpha: Option<f64>,
    /// β of FlowCon's lower bound 1/(β·n) on a limit (n = containers on the worker).
    #[arg(long, env = "CONVERGE_FLOWCON_BETA", default_value_t = 2.0)]
    pub flowcon_beta: f64,
    /// SpeCon's categorization interval (when the manager migrates jobs), e.g. 30s.
    #[arg(long, env = "CONVERGE_SPECON_INTERVAL", default_value = "30s")]
    pub specon_interval: String,
    /// SpeCon's categorization threshold α: fraction of the job's initial metric gained in one
    /// categorization interval.
    #[arg(long, env = "CONVERGE_SPECON_ALPHA", default_value_t = 0.01)]
    pub specon_alpha: f64,
    /// Checkpoint and stop every job container after this long without the manager (0 = never).
    /// Keep it below the manager's --recover-lost-after minus --stop-grace and the ~15 s a
    /// silent network takes to be noticed, so a job restarted elsewhere never runs twice.
    #[arg(long, env = "CONVERGE_FENCE_AFTER", default_value = "30s")]
    pub fence_after: String,
    /// Most processes (threads included) one job container may have.
    #[arg(long, env = "CONVERGE_JOB_PIDS_LIMIT", default_value_t = 1024)]
    pub job_pids_limit: i64,
    /// This worker's TLS certificate (PEM, naming the worker id; `cargo xtask certs`). With
    /// --tls-key and --tls-ca the agent speaks mutual TLS to an `https://` manager.
    #[arg(long, env = "CONVERGE_TLS_CERT")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// This worker's TLS key (PEM).
    #[arg(long, env = "CONVERGE_TLS_KEY")]
    pub tls_key: Option<std::path::PathBuf>,
    /// The cluster CA (PEM) the manager's certificate must come from.
    #[arg(long, env = "CONVERGE_TLS_CA")]
    pub tls_ca: Option<std::path::PathBuf>,
    /// The name the manager's certificate must carry (default: the manager URL's host).
    #[arg(long, env = "CONVERGE_TLS_DOMAIN")]
    pub tls_domain: Option<String>,
    /// Address serving Prometheus metrics at `/metrics` (off when unset).
    #[arg(long, env = "CONVERGE_METRICS_LISTEN")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Log lines as `text` (for people) or `json` (one object per line, with span fields).
    /// Traces go to the OTLP endpoint in `OTEL_EXPORTER_OTLP_ENDPOINT`, when set.
    #[arg(long, env = "CONVERGE_LOG_FORMAT", default_value = "text")]
    pub log_format: converge_messenger::telemetry::LogFormat,
}

/// Where per-container usage is read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum UsageSource {
    /// Cgroup files when the container's cgroup is readable, else the stats API.
    Auto,
    /// Cgroup files (`cpuacct.usage`/`memory.usage_in_bytes`, or `cpu.stat`/`memory.current`).
    Cgroup,
    /// The Docker stats API (one-shot requests).
    Stats,
}

/// A validated agent configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// Manager endpoint (`http://host:port`).
    pub manager: String,
    /// Worker id.
    pub worker_id: String,
    /// CPU capacity in cores.
    pub cpus: f64,
    /// Memory capacity in bytes (0 = not stated).
    pub memory_bytes: u64,
    /// Speed relative to the reference worker (what the agent reports when it does not
    /// measure it).
    pub calibration: f64,
    /// Measure the speed at start (the binary's default) instead of reporting `calibration`.
    /// Off in [`Config::new`], so agents run in-process (tests) skip the benchmark.
    pub measure_calibration: bool,
    /// Heartbeat period.
    pub heartbeat_interval: Duration,
    /// Host directory under which each job's checkpoint directory lives.
    pub checkpoint_root: PathBuf,
    /// Cgroup parent of the worker's containers (e.g. `/converge/w1`).
    pub cgroup_parent: String,
    /// Mount point of the cgroup filesystem.
    pub cgroup_root: PathBuf,
    /// Docker endpoint; `None` = DOCKER_HOST or the local socket.
    pub docker_host: Option<String>,
    /// Usage sampling period.
    pub usage_interval: Duration,
    /// Where usage is read from.
    pub usage_source: UsageSource,
    /// SIGTERM → SIGKILL grace period of Stop.
    pub stop_grace: Duration,
    /// Keep containers after reporting their exit.
    pub keep_exited: bool,
    /// Worker labels sent with the registration.
    pub labels: BTreeMap<String, String>,
    /// FlowCon's initial algorithm interval `itval` (FlowCon TCC'22 Alg. 1 line 1).
    pub flowcon_interval: Duration,
    /// A fixed FlowCon threshold α; `None` runs the adaptive threshold (TCC'22 Alg. 3).
    pub flowcon_alpha: Option<f64>,
    /// β of FlowCon's lower bound `1/(β·n)` (ICPP'19 Alg. 1 line 22).
    pub flowcon_beta: f64,
    /// SpeCon's categorization interval `t_m - t_{m-1}` (SpeCon Alg. 1 line 1).
    pub specon_interval: Duration,
    /// SpeCon's categorization threshold α (SpeCon Alg. 1 line 1).
    pub specon_alpha: f64,
    /// Self-fencing: after this long disconnected from the manager, every job container is
    /// checkpointed and stopped (the Save path, with `stop_grace` as its deadline); zero = off.
    ///
    /// This is what makes "at most one incarnation of a job, ever" hold across a partition. The
    /// manager declares a silent worker lost and, after its `--recover-lost-after` (60 s by
    /// default), restarts the worker's jobs elsewhere from their checkpoints. The agent has to
    /// have stopped them first, so the timeouts must satisfy
    /// `fence_after + detection + stop_grace < recover_lost_after`, where detection is how long
    /// the agent takes to notice a dead stream: at once when the manager's process ends, at
    /// most ~15 s (HTTP/2 keep-alive: ping every 10 s, 5 s timeout) when the network goes
    /// silent. The defaults give 30 + 15 + 10 = 55 s < 60 s.
    pub fence_after: Duration,
    /// Most processes (threads included) one job container may have.
    pub job_pids_limit: i64,
    /// Mutual TLS with the manager: the files and the name its certificate must carry.
    pub tls: Option<(converge_messenger::tls::TlsFiles, String)>,
    /// Where the executor reports each FlowCon round it ran (for tests and benchmarks that
    /// measure the time from a container event to the applied limits). Reports are dropped,
    /// never waited for, when the channel is full.
    pub round_reports: Option<tokio::sync::mpsc::Sender<crate::policy::RoundReport>>,
    /// Where `/metrics` is served, if anywhere.
    pub metrics_listen: Option<std::net::SocketAddr>,
}

impl Config {
    /// A configuration with every optional setting at its default.
    pub fn new(manager: impl Into<String>, worker_id: impl Into<String>, cpus: f64) -> Self {
        let worker_id = worker_id.into();
        Self {
            manager: manager.into(),
            cgroup_parent: default_cgroup_parent(&worker_id),
            worker_id,
            cpus,
            memory_bytes: 0,
            calibration: 1.0,
            measure_calibration: false,
            heartbeat_interval: Duration::from_secs(1),
            checkpoint_root: PathBuf::from("/var/lib/converge/checkpoints"),
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
            docker_host: None,
            usage_interval: Duration::from_secs(1),
            usage_source: UsageSource::Auto,
            stop_grace: Duration::from_secs(10),
            keep_exited: false,
            labels: BTreeMap::new(),
            flowcon_interval: Duration::from_secs(20),
            flowcon_alpha: None,
            flowcon_beta: 2.0,
            specon_interval: Duration::from_secs(30),
            specon_alpha: 0.01,
            fence_after: Duration::from_secs(30),
            job_pids_limit: 1024,
            tls: None,
            round_reports: None,
            metrics_listen: None,
        }
    }

    /// FlowCon's parameters as the policy takes them.
    pub fn flowcon(&self) -> converge_policy::flowcon::FlowConConfig {
        let default = converge_policy::flowcon::FlowConConfig::default();
        converge_policy::flowcon::FlowConConfig {
            alpha: self.flowcon_alpha.unwrap_or(default.alpha),
            itval: self.flowcon_interval.as_secs_f64(),
            beta: self.flowcon_beta,
            adaptive: self.flowcon_alpha.is_none(),
            resource: converge_policy::growth::Resource::Cpu,
        }
    }

    /// SpeCon's parameters as the policy takes them (only Alg. 1 runs on the agent).
    pub fn specon(&self) -> converge_policy::specon::SpeConConfig {
        converge_policy::specon::SpeConConfig {
            alpha: self.specon_alpha,
            interval: self.specon_interval.as_secs_f64(),
            ..Default::default()
        }
    }

    /// Checks every setting; the error names the one at fault.
    pub fn validate(&self) -> Result<()> {
        let bad = |setting: &'static str, why: String| Err(Error::Config { setting, why });
        match self.manager.split_once("://") {
            Some(("http" | "https", rest)) if !rest.is_empty() => {}
            _ => {
                return bad(
                    "manager",
                    format!(
                        "`{}` is not an http://host:port or https://host:port endpoint",
                        self.manager
                    ),
                );
            }
        }
        // TLS on one side only never connects, and says so only as a transport error.
        match (self.manager.starts_with("https://"), self.tls.is_some()) {
            (true, false) => {
                return bad(
                    "manager",
                    format!(
                        "`{}` speaks TLS: give --tls-cert and --tls-key (this worker's \
                         certificate) and --tls-ca (the cluster CA)",
                        self.manager
                    ),
                );
            }
            (false, true) => {
                return bad(
                    "manager",
                    format!(
                        "`{}` is plaintext but --tls-cert, --tls-key and --tls-ca are given: \
                         use https://",
                        self.manager
                    ),
                );
            }
            _ => {}
        }
        if self.worker_id.is_empty()
            || self.worker_id.len() > 64
            || !self
                .worker_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return bad(
                "worker-id",
                format!(
                    "`{}` must be 1 to 64 letters, digits, `-`, `_` or `.` (it names containers and cgroups)",
                    self.worker_id
                ),
            );
        }
        if !(self.cpus.is_finite()
            && self.cpus >= 0.01
            && self.cpus <= converge_contract::MAX_WORKER_CPUS)
        {
            return bad(
                "cpus",
                format!(
                    "must be between 0.01 and {} cores, got {}",
                    converge_contract::MAX_WORKER_CPUS,
                    self.cpus
                ),
            );
        }
        if !(self.calibration.is_finite() && self.calibration > 0.0 && self.calibration <= 1000.0) {
            return bad(
                "calibration",
                format!("must be in (0, 1000], got {}", self.calibration),
            );
        }
        within(
            "heartbeat-interval",
            self.heartbeat_interval,
            Duration::from_millis(10),
            Duration::from_secs(3600),
        )?;
        within(
            "usage-interval",
            self.usage_interval,
            Duration::from_millis(10),
            Duration::from_secs(3600),
        )?;
        if self.stop_grace > Duration::from_secs(3600) {
            return bad(
                "stop-grace",
                format!("must be at most 1h, got {:?}", self.stop_grace),
            );
        }
        if !self.checkpoint_root.is_absolute() {
            return bad(
                "checkpoint-root",
                format!(
                    "`{}` must be an absolute host path (Docker bind-mounts below it)",
                    self.checkpoint_root.display()
                ),
            );
        }
        let parent = self.cgroup_parent.trim_matches('/');
        if parent.is_empty()
            || parent
                .split('/')
                .any(|seg| seg.is_empty() || seg == "." || seg == "..")
        {
            return bad(
                "cgroup-parent",
                format!(
                    "`{}` must be a cgroup path like /converge/w1 (no empty, `.` or `..` parts)",
                    self.cgroup_parent
                ),
            );
        }
        if !self.cgroup_root.is_absolute() {
            return bad(
                "cgroup-root",
                format!("`{}` must be an absolute path", self.cgroup_root.display()),
            );
        }
        for k in self.labels.keys() {
            if k.is_empty() {
                return bad("label", "label keys must not be empty".into());
            }
        }
        within(
            "flowcon-interval",
            self.flowcon_interval,
            Duration::from_millis(100),
            Duration::from_secs(3600),
        )?;
        if let Some(a) = self.flowcon_alpha
            && !(a.is_finite() && a >= 0.0)
        {
            return bad(
                "flowcon-alpha",
                format!("must be a finite threshold >= 0, got {a}"),
            );
        }
        if !(self.flowcon_beta.is_finite() && self.flowcon_beta >= 1.0) {
            return bad(
                "flowcon-beta",
                format!(
                    "must be a finite number >= 1 (the lower bound 1/(beta*n) must not exceed a fair share), got {}",
                    self.flowcon_beta
                ),
            );
        }
        within(
            "specon-interval",
            self.specon_interval,
            Duration::from_millis(100),
            Duration::from_secs(3600),
        )?;
        if !(self.specon_alpha.is_finite() && self.specon_alpha >= 0.0) {
            return bad(
                "specon-alpha",
                format!("must be a finite threshold >= 0, got {}", self.specon_alpha),
            );
        }
        if self.fence_after > Duration::from_secs(24 * 3600) {
            return bad(
                "fence-after",
                format!("must be at most 24h (0 = off), got {:?}", self.fence_after),
            );
        }
        Ok(())
    }
}

impl Cli {
    /// Parses the text settings and validates the result.
    pub fn into_config(self) -> Result<Config> {
        let mut c = Config::new(self.manager, self.worker_id, self.cpus);
        c.memory_bytes = parse_bytes(&self.memory).map_err(|why| Error::Config {
            setting: "memory",
            why,
        })?;
        match self.calibration.trim() {
            "measure" => c.measure_calibration = true,
            n => {
                c.calibration = n.parse().map_err(|_| Error::Config {
                    setting: "calibration",
                    why: format!("`{n}` is not a speed (e.g. 1.0, 1.5) or `measure`"),
                })?;
            }
        }
        c.heartbeat_interval =
            parse_duration(&self.heartbeat_interval).map_err(|why| Error::Config {
                setting: "heartbeat-interval",
                why,
            })?;
        c.usage_interval = parse_duration(&self.usage_interval).map_err(|why| Error::Config {
            setting: "usage-interval",
            why,
        })?;
        c.stop_grace = parse_duration(&self.stop_grace).map_err(|why| Error::Config {
            setting: "stop-grace",
            why,
        })?;
        c.checkpoint_root = self.checkpoint_root;
        if let Some(p) = self.cgroup_parent {
            c.cgroup_parent = p;
        }
        c.cgroup_root = self.cgroup_root;
        c.docker_host = self.docker_host.filter(|h| !h.is_empty());
        c.usage_source = self.usage_source;
        c.keep_exited = self.keep_exited;
        c.metrics_listen = self.metrics_listen;
        c.flowcon_interval =
            parse_duration(&self.flowcon_interval).map_err(|why| Error::Config {
                setting: "flowcon-interval",
                why,
            })?;
        c.flowcon_alpha = self.flowcon_alpha;
        c.flowcon_beta = self.flowcon_beta;
        c.specon_interval = parse_duration(&self.specon_interval).map_err(|why| Error::Config {
            setting: "specon-interval",
            why,
        })?;
        c.specon_alpha = self.specon_alpha;
        if !(16..=1_000_000).contains(&self.job_pids_limit) {
            return Err(Error::Config {
                setting: "job-pids-limit",
                why: format!("must be in 16..=1000000, got {}", self.job_pids_limit),
            });
        }
        c.job_pids_limit = self.job_pids_limit;
        let files = converge_messenger::tls::TlsFiles::from_settings(
            self.tls_cert,
            self.tls_key,
            self.tls_ca,
        )
        .map_err(|why| Error::Config {
            setting: "tls-cert",
            why: why.into(),
        })?;
        c.tls = files.map(|files| {
            // The manager's certificate must carry the name the agent reaches it by.
            let host = c
                .manager
                .split("://")
                .nth(1)
                .and_then(|rest| rest.split([':', '/']).next())
                .unwrap_or_default()
                .to_string();
            (files, self.tls_domain.clone().unwrap_or(host))
        });
        c.fence_after = parse_duration(&self.fence_after).map_err(|why| Error::Config {
            setting: "fence-after",
            why,
        })?;
        for l in self.labels.iter().filter(|l| !l.is_empty()) {
            let Some((k, v)) = l.split_once('=') else {
                return Err(Error::Config {
                    setting: "label",
                    why: format!("`{l}` is not key=value"),
                });
            };
            c.labels.insert(k.trim().to_string(), v.trim().to_string());
        }
        c.validate()?;
        Ok(c)
    }
}

/// The cgroup parent a worker gets when none is configured.
pub fn default_cgroup_parent(worker_id: &str) -> String {
    format!("/converge/{worker_id}")
}

/// Parses `1s`, `250ms`, `2m`, `1.5s` or a bare number of seconds.
pub fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    let t = s.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else {
        (t, 1.0)
    };
    match num.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(Duration::from_secs_f64(v * scale)),
        _ => Err(format!("`{s}` is not a duration (examples: 1s, 250ms, 2m)")),
    }
}

/// Parses a byte count: `1073741824`, `512k`, `512m`, `4g` (binary multiples, case-insensitive,
/// an optional trailing `b` or `i` accepted: `4GiB`, `4gb`).
pub fn parse_bytes(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let t = t.trim_end_matches('b').trim_end_matches('i');
    let (num, mult) = match t.chars().last() {
        Some('k') => (&t[..t.len() - 1], 1u64 << 10),
        Some('m') => (&t[..t.len() - 1], 1 << 20),
        Some('g') => (&t[..t.len() - 1], 1 << 30),
        Some('t') => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    match num.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 && v * (mult as f64) < u64::MAX as f64 => {
            Ok((v * mult as f64).round() as u64)
        }
        _ => Err(format!(
            "`{s}` is not a byte size (examples: 4g, 512m, 1073741824)"
        )),
    }
}

/// A duration setting within `[min, max]`, or a [`Error::Config`] naming the setting and the
/// allowed range.
fn within(setting: &'static str, value: Duration, min: Duration, max: Duration) -> Result<()> {
    if value < min || value > max {
        return Err(Error::Config {
            setting,
            why: format!("must be between {min:?} and {max:?}, got {value:?}"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli(args: &[&str]) -> Cli {
        let mut v = vec!["converge-agent"];
        v.extend_from_slice(args);
        Cli::try_parse_from(v).expect("parses")
    }

    #[test]
    fn defaults_follow_the_worker_id() {
        let c = cli(&[
            "--manager",
            "http://m:7070",
            "--worker-id",
            "w1",
            "--cpus",
            "1.5",
        ])
        .into_config()
        .unwrap();
        assert_eq!(c.cgroup_parent, "/converge/w1");
        assert_eq!(c.heartbeat_interval, Duration::from_secs(1));
        assert_eq!(c.usage_interval, Duration::from_secs(1));
        assert!(c.measure_calibration, "the binary measures by default");
        assert_eq!(c.cpus, 1.5);
    }

    #[test]
    fn text_settings_are_parsed() {
        let c = cli(&[
            "--manager",
            "http://m:7070",
            "--worker-id",
            "w1",
            "--cpus",
            "2",
            "--memory",
            "4g",
            "--heartbeat-interval",
            "250ms",
            "--label",
            "zone=a",
            "--label",
            "disk=ssd",
        ])
        .into_config()
        .unwrap();
        assert_eq!(c.memory_bytes, 4 << 30);
        assert_eq!(c.heartbeat_interval, Duration::from_millis(250));
        assert_eq!(c.labels.get("zone").map(String::as_str), Some("a"));
        assert_eq!(c.labels.len(), 2);
    }

    #[test]
    fn policy_settings_default_to_the_papers_and_parse() {
        let base = [
            "--manager",
            "http://m:7070",
            "--worker-id",
            "w1",
            "--cpus",
            "1",
        ];
        let c = cli(&base).into_config().unwrap();
        assert_eq!(c.flowcon_interval, Duration::from_secs(20));
        assert!(c.flowcon().adaptive, "Alg. 3 on by default");
        assert_eq!(c.flowcon().beta, 2.0);
        assert_eq!(c.specon_interval, Duration::from_secs(30));
        assert_eq!(c.specon_alpha, 0.01);
        assert_eq!(c.fence_after, Duration::from_secs(30));
        let mut v = base.to_vec();
        v.extend([
            "--flowcon-interval",
            "2s",
            "--flowcon-alpha",
            "0.02",
            "--flowcon-beta",
            "4",
            "--specon-interval",
            "5s",
            "--fence-after",
            "0",
        ]);
        let c = cli(&v).into_config().unwrap();
        let f = c.flowcon();
        assert!(!f.adaptive, "a fixed alpha turns Alg. 3 off");
        assert_eq!((f.alpha, f.itval, f.beta), (0.02, 2.0, 4.0));
        assert_eq!(c.specon().interval, 5.0);
        assert!(c.fence_after.is_zero());
        let mut bad = base.to_vec();
        bad.extend(["--flowcon-beta", "0.5"]);
        assert_eq!(setting_of(cli(&bad).into_config()), "flowcon-beta");
        let mut bad = base.to_vec();
        bad.extend(["--flowcon-alpha=-1"]);
        assert_eq!(setting_of(cli(&bad).into_config()), "flowcon-alpha");
        let mut bad = base.to_vec();
        bad.extend(["--specon-interval", "never"]);
        assert_eq!(setting_of(cli(&bad).into_config()), "specon-interval");
    }

    fn setting_of(r: Result<Config>) -> &'static str {
        match r {
            Err(Error::Config { setting, .. }) => setting,
            other => panic!("expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn invalid_settings_are_named() {
        let base = ["--manager", "http://m:7070", "--worker-id", "w1"];
        let with = |extra: &[&str]| {
            let mut v = base.to_vec();
            v.extend_from_slice(extra);
            cli(&v).into_config()
        };
        assert_eq!(setting_of(with(&["--cpus", "0"])), "cpus");
        assert_eq!(setting_of(with(&["--cpus", "NaN"])), "cpus");
        assert_eq!(
            setting_of(with(&["--cpus", "1", "--memory", "lots"])),
            "memory"
        );
        assert_eq!(
            setting_of(with(&["--cpus", "1", "--heartbeat-interval", "soon"])),
            "heartbeat-interval"
        );
        assert_eq!(
            setting_of(with(&["--cpus", "1", "--calibration=-1"])),
            "calibration"
        );
        assert_eq!(
            setting_of(with(&["--cpus", "1", "--calibration", "fast"])),
            "calibration"
        );
        let given = with(&["--cpus", "1", "--calibration", "1.5"]).unwrap();
        assert_eq!((given.calibration, given.measure_calibration), (1.5, false));
        assert!(!Config::new("http://m:1", "w1", 1.0).measure_calibration);
        assert_eq!(
            setting_of(with(&["--cpus", "1", "--cgroup-parent", "/a/../b"])),
            "cgroup-parent"
        );
        assert_eq!(
            setting_of(with(&["--cpus", "1", "--checkpoint-root", "rel/dir"])),
            "checkpoint-root"
        );
        assert_eq!(
            setting_of(with(&["--cpus", "1", "--label", "novalue"])),
            "label"
        );
        let mut c = Config::new("localhost:7070", "w1", 1.0);
        assert_eq!(setting_of(c.validate().map(|_| c.clone())), "manager");
        c.manager = "http://m:1".into();
        c.worker_id = "bad id".into();
        assert_eq!(setting_of(c.validate().map(|_| c.clone())), "worker-id");
        // TLS on one side only: an https:// manager without the files, or files for http://.
        let mut c = Config::new("https://m:1", "w1", 1.0);
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("--manager") && e.contains("--tls-ca"), "{e}");
        c.manager = "http://m:1".into();
        let files = converge_messenger::tls::TlsFiles::worker(std::path::Path::new("/certs"), "w1");
        c.tls = Some((files, "m".into()));
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("--manager") && e.contains("use https://"), "{e}");
    }

    #[test]
    fn durations_and_sizes_parse() {
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("-1s").is_err());
        assert_eq!(parse_bytes("512m"), Ok(512 << 20));
        assert_eq!(parse_bytes("4GiB"), Ok(4 << 30));
        assert_eq!(parse_bytes("100"), Ok(100));
        assert!(parse_bytes("x").is_err());
    }
}
