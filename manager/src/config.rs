//! Command line and environment settings, parsed into a validated [`Config`].

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use converge_policy::value::{PreemptAction, VictimCriterion};

/// `converge-manager` settings; every flag has a `CONVERGE_*` environment fallback.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "converge-manager",
    version,
    about = "The Converge manager",
    // A flag given again wins: settings from --config come first, the command line after.
    args_override_self = true
)]
pub struct Cli {
    /// A TOML file of settings, keys named as the flags (`policy = "converge"`); the command
    /// line and `CONVERGE_*` variables win over it.
    #[arg(long, env = "CONVERGE_CONFIG")]
    pub config: Option<std::path::PathBuf>,
    /// Address serving the agent streams, the control API, reflection and health.
    #[arg(long, env = "CONVERGE_LISTEN", default_value = "0.0.0.0:7070")]
    pub listen: SocketAddr,
    /// Policy: `spread` (Docker Swarm, the baseline), `least-allocated`, `round-robin`,
    /// `flowcon`, `specon`, `flowcon-specon` (the two together), `converge` (shortest
    /// predicted remaining time first, with ETAs), `las` (least attained service first,
    /// Tiresias), `value` (value-based allocation with preemption, DwP) or `value-dwop`
    /// (without preemption). The README's table says what each does.
    #[arg(long, env = "CONVERGE_POLICY", default_value = "spread")]
    pub policy: String,
    /// Heartbeat period agents use; loss is counted in these.
    #[arg(long, env = "CONVERGE_HEARTBEAT_INTERVAL", default_value = "1s", value_parser = humantime::parse_duration)]
    pub heartbeat_interval: Duration,
    /// Missed heartbeats after which a worker is marked lost.
    #[arg(long, env = "CONVERGE_LOST_AFTER", default_value_t = 3)]
    pub lost_after: u32,
    /// Progress points kept per job (the estimators read the last 30 core-seconds and fit the
    /// curve through what is kept).
    #[arg(long, env = "CONVERGE_PROGRESS_HISTORY", default_value_t = converge_core::cluster::PROGRESS_HISTORY)]
    pub progress_history: usize,
    /// Finished jobs kept in memory; older ones are answered for from the state store (all
    /// are kept with `--state-dir none`).
    #[arg(long, env = "CONVERGE_KEEP_FINISHED", default_value_t = converge_core::cluster::KEEP_FINISHED)]
    pub keep_finished: usize,
    /// Events kept in memory for WatchEvents replay; a durable manager replays older ones from
    /// its store.
    #[arg(long, env = "CONVERGE_EVENTS_IN_MEMORY", default_value_t = crate::events::HISTORY)]
    pub events_in_memory: usize,
    /// How long a job may take to checkpoint and exit when it is moved before it is killed
    /// (it then resumes from its last periodic checkpoint).
    #[arg(long, env = "CONVERGE_SAVE_DEADLINE", default_value = "10s", value_parser = humantime::parse_duration)]
    pub save_deadline: Duration,
    /// How often SpeCon's rebalancing (Alg. 3) runs, with `specon` and `converge`.
    #[arg(long, env = "CONVERGE_REBALANCE_INTERVAL", default_value = "30s", value_parser = humantime::parse_duration)]
    pub rebalance_interval: Duration,
    /// How long a job whose worker was lost waits before it restarts elsewhere from its
    /// checkpoint. Keep it above the agents' fencing delay, so the old incarnation has
    /// stopped itself before the new one starts.
    #[arg(long, env = "CONVERGE_RECOVER_LOST_AFTER", default_value = "60s", value_parser = humantime::parse_duration)]
    pub recover_lost_after: Duration,
    /// Address serving Prometheus metrics at `/metrics` (off when unset).
    #[arg(long, env = "CONVERGE_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Directory of the state store (`converge.db`, SQLite): every job, worker and event
    /// survives a restart. `none` keeps the state in memory only (it is lost on exit).
    #[arg(long, env = "CONVERGE_STATE_DIR", default_value = "converge-state")]
    pub state_dir: String,
    /// How long the state store keeps a finished job (and its spec) after it finished; older
    /// ones are deleted, and GetJob answers NotFound for them. `forever` keeps every job.
    #[arg(long, env = "CONVERGE_FINISHED_RETENTION", default_value = "30d")]
    pub finished_retention: String,
    /// After a restart from the store, how long workers have to register again before any is
    /// declared lost (their jobs run on meanwhile).
    #[arg(long, env = "CONVERGE_RECOVERY_GRACE", default_value = "15s", value_parser = humantime::parse_duration)]
    pub recovery_grace: Duration,
    /// Bearer tokens of the control API, one `TOKEN ROLE NAME` per line (ROLE: `viewer` or
    /// `operator`). Unset: the control API is open to anyone who reaches it.
    #[arg(long, env = "CONVERGE_TOKENS")]
    pub tokens: Option<std::path::PathBuf>,
    /// The manager's TLS certificate (PEM). With --tls-key and --tls-ca, the port speaks TLS
    /// and agents must present a client certificate of that CA naming their worker
    /// (`cargo xtask certs` makes a set).
    #[arg(long, env = "CONVERGE_TLS_CERT")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// The manager's TLS key (PEM).
    #[arg(long, env = "CONVERGE_TLS_KEY")]
    pub tls_key: Option<std::path::PathBuf>,
    /// The cluster CA (PEM) that signs agents' certificates.
    #[arg(long, env = "CONVERGE_TLS_CA")]
    pub tls_ca: Option<std::path::PathBuf>,
    /// Control requests per second one caller (token name, or address without tokens) may
    /// make; bursts of twice that pass. 0 = no limit.
    #[arg(long, env = "CONVERGE_RATE_LIMIT", default_value_t = 1000)]
    pub rate_limit: u32,
    /// WatchEvents, JobLogs and Backup streams open at once, over all callers.
    #[arg(long, env = "CONVERGE_MAX_WATCHERS", default_value_t = 256)]
    pub max_watchers: usize,
    /// Messages per second read from one agent's stream (a flood is held back on its own
    /// stream). 0 = no limit.
    #[arg(long, env = "CONVERGE_AGENT_MESSAGE_RATE", default_value_t = 20_000)]
    pub agent_message_rate: u32,
    /// Log lines as `text` (for people) or `json` (one object per line, with span fields).
    /// Traces go to the OTLP endpoint in `OTEL_EXPORTER_OTLP_ENDPOINT`, when set.
    #[arg(long, env = "CONVERGE_LOG_FORMAT", default_value = "text")]
    pub log_format: converge_messenger::telemetry::LogFormat,
    /// With `value`: the overload threshold λ of Eq. 2, in (0, 1); a worker whose running
    /// jobs expect less than λ of their maximum value may lose one of them to a new job.
    #[arg(long, env = "CONVERGE_VALUE_LAMBDA", default_value_t = 0.5)]
    pub value_lambda: f64,
    /// With `value` and `value-dwop`: CPU shares examined are 1, 1+stride, … ≤ 1024 (1 = all).
    #[arg(long, env = "CONVERGE_VALUE_STRIDE", default_value_t = 1)]
    pub value_stride: u32,
    /// With `value`: how the one victim on an overloaded worker is chosen: `mrv` (minimal
    /// remaining value), `lvd` (lowest value density) or `lev` (lowest expected value).
    #[arg(long, env = "CONVERGE_VALUE_CRITERION", default_value = "mrv")]
    pub value_criterion: String,
    /// With `value`: what happens to a victim: `pause` (docker pause; resumed when its worker
    /// has room again) or `stop` (stopped for good; the job ends DROPPED).
    #[arg(long, env = "CONVERGE_VALUE_PREEMPT", default_value = "pause")]
    pub value_preempt: String,
}

/// The placement policies the manager can run.
pub use converge_core::cluster::policy::POLICIES;

/// Validated settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Listen address.
    pub listen: SocketAddr,
    /// Placement policy name (one of [`POLICIES`]).
    pub policy: String,
    /// Heartbeat period.
    pub heartbeat_interval: Duration,
    /// Missed heartbeats before loss.
    pub lost_after: u32,
    /// Progress points kept per job.
    pub progress_history: usize,
    /// Finished jobs kept in memory (with a store).
    pub keep_finished: usize,
    /// Events kept in memory.
    pub events_in_memory: usize,
    /// Save deadline for moves.
    pub save_deadline: Duration,
    /// Rebalancing period.
    pub rebalance_interval: Duration,
    /// Grace before a lost job restarts elsewhere.
    pub recover_lost_after: Duration,
    /// Where `/metrics` is served, if anywhere.
    pub metrics_listen: Option<SocketAddr>,
    /// The state store's directory (`None`: in memory only).
    pub state_dir: Option<std::path::PathBuf>,
    /// How long the store keeps finished jobs (`None`: forever).
    pub finished_retention: Option<Duration>,
    /// Time for workers to register again after a restart.
    pub recovery_grace: Duration,
    /// The control API's token file (`None`: open).
    pub tokens: Option<std::path::PathBuf>,
    /// TLS with client certificates for agents (`None`: plaintext).
    pub tls: Option<converge_messenger::tls::TlsFiles>,
    /// Control requests per second per caller (`None`: no limit).
    pub rate_limit: Option<std::num::NonZeroU32>,
    /// WatchEvents streams open at once.
    pub max_watchers: usize,
    /// Messages per second per agent stream (`None`: no limit).
    pub agent_message_rate: Option<std::num::NonZeroU32>,
    /// λ of Eq. 2 (value-based allocation with preemption).
    pub value_lambda: f64,
    /// CPU-share stride of value-based allocation.
    pub value_stride: u32,
    /// Victim criterion of value-based allocation with preemption.
    pub value_criterion: VictimCriterion,
    /// Pause or stop a victim.
    pub value_preempt: PreemptAction,
}

/// `--value-criterion` names: the short form and the criterion's own name with dashes.
pub fn parse_criterion(s: &str) -> Option<VictimCriterion> {
    match s.trim().to_ascii_lowercase().as_str() {
        "mrv" | "minimal-remaining-value" => Some(VictimCriterion::MinimalRemainingValue),
        "lvd" | "lowest-value-density" => Some(VictimCriterion::LowestValueDensity),
        "lev" | "lowest-expected-value" => Some(VictimCriterion::LowestExpectedValue),
        _ => None,
    }
}

/// `--value-preempt` names.
pub fn parse_preempt(s: &str) -> Option<PreemptAction> {
    match s.trim().to_ascii_lowercase().as_str() {
        "pause" => Some(PreemptAction::Pause),
        "stop" => Some(PreemptAction::Stop),
        _ => None,
    }
}

/// A setting that cannot work, naming the flag.
#[derive(Debug, thiserror::Error)]
#[error("invalid --{flag}: {message}")]
pub struct ConfigError {
    /// The flag.
    pub flag: &'static str,
    /// What is wrong.
    pub message: String,
}

impl Cli {
    /// Checks the settings.
    pub fn validate(self) -> Result<Config, ConfigError> {
        if !POLICIES.contains(&self.policy.as_str()) {
            return Err(ConfigError {
                flag: "policy",
                message: format!("`{}` is not one of {}", self.policy, POLICIES.join(", ")),
            });
        }
        if self.heartbeat_interval < Duration::from_millis(10) {
            return Err(ConfigError {
                flag: "heartbeat-interval",
                message: "must be at least 10ms".into(),
            });
        }
        if self.lost_after == 0 {
            return Err(ConfigError {
                flag: "lost-after",
                message: "must be at least 1".into(),
            });
        }
        if self.progress_history == 0 {
            return Err(ConfigError {
                flag: "progress-history",
                message: "must be at least 1".into(),
            });
        }
        if self.save_deadline < Duration::from_millis(100)
            || self.save_deadline > Duration::from_secs(3600)
        {
            return Err(ConfigError {
                flag: "save-deadline",
                message: "must be between 100ms and 1h".into(),
            });
        }
        if self.rebalance_interval < Duration::from_secs(1) {
            return Err(ConfigError {
                flag: "rebalance-interval",
                message: "must be at least 1s".into(),
            });
        }
        if !(self.value_lambda > 0.0 && self.value_lambda < 1.0) {
            return Err(ConfigError {
                flag: "value-lambda",
                message: format!("must be in (0, 1) (Eq. 2), got {}", self.value_lambda),
            });
        }
        if !(1..1024).contains(&self.value_stride) {
            return Err(ConfigError {
                flag: "value-stride",
                message: format!("must be in 1..=1023, got {}", self.value_stride),
            });
        }
        let value_criterion =
            parse_criterion(&self.value_criterion).ok_or_else(|| ConfigError {
                flag: "value-criterion",
                message: format!("`{}` is not one of mrv, lvd, lev", self.value_criterion),
            })?;
        let value_preempt = parse_preempt(&self.value_preempt).ok_or_else(|| ConfigError {
            flag: "value-preempt",
            message: format!("`{}` is not pause or stop", self.value_preempt),
        })?;
        let tls = converge_messenger::tls::TlsFiles::from_settings(
            self.tls_cert,
            self.tls_key,
            self.tls_ca,
        )
        .map_err(|message| ConfigError {
            flag: "tls-cert",
            message: message.into(),
        })?;
        let state_dir = match self.state_dir.trim() {
            "" => {
                return Err(ConfigError {
                    flag: "state-dir",
                    message: "is empty: give a directory, or `none` to keep state in memory only"
                        .into(),
                });
            }
            "none" => None,
            dir => Some(std::path::PathBuf::from(dir)),
        };
        let finished_retention = match self.finished_retention.trim() {
            "forever" => None,
            d => match humantime::parse_duration(d) {
                Ok(d) if d >= Duration::from_secs(1) => Some(d),
                Ok(_) => {
                    return Err(ConfigError {
                        flag: "finished-retention",
                        message: "must be at least 1s, or `forever`".into(),
                    });
                }
                Err(e) => {
                    return Err(ConfigError {
                        flag: "finished-retention",
                        message: format!(
                            "`{d}` is not a duration (`30d`, `12h`) or `forever`: {e}"
                        ),
                    });
                }
            },
        };
        Ok(Config {
            listen: self.listen,
            state_dir,
            finished_retention,
            recovery_grace: self.recovery_grace,
            tokens: self.tokens,
            tls,
            rate_limit: std::num::NonZeroU32::new(self.rate_limit),
            max_watchers: self.max_watchers.max(1),
            agent_message_rate: std::num::NonZeroU32::new(self.agent_message_rate),
            policy: self.policy,
            heartbeat_interval: self.heartbeat_interval,
            lost_after: self.lost_after,
            progress_history: self.progress_history,
            keep_finished: self.keep_finished,
            events_in_memory: self.events_in_memory,
            save_deadline: self.save_deadline,
            rebalance_interval: self.rebalance_interval,
            recover_lost_after: self.recover_lost_after,
            metrics_listen: self.metrics_listen,
            value_lambda: self.value_lambda,
            value_stride: self.value_stride,
            value_criterion,
            value_preempt,
        })
    }
}

impl Config {
    /// Settings for tests and embedding: spread, 1 s heartbeats, loss after 3, on `listen`.
    pub fn for_listen(listen: SocketAddr) -> Self {
        Self {
            listen,
            policy: "spread".into(),
            heartbeat_interval: Duration::from_secs(1),
            lost_after: 3,
            progress_history: converge_core::cluster::PROGRESS_HISTORY,
            keep_finished: converge_core::cluster::KEEP_FINISHED,
            events_in_memory: crate::events::HISTORY,
            save_deadline: Duration::from_secs(10),
            rebalance_interval: Duration::from_secs(30),
            recover_lost_after: Duration::from_secs(60),
            metrics_listen: None,
            state_dir: None,
            finished_retention: None,
            recovery_grace: Duration::from_secs(15),
            tokens: None,
            tls: None,
            // Tests and embedders drive the manager hard from one address: no rate limit
            // unless they ask for one.
            rate_limit: None,
            max_watchers: 256,
            agent_message_rate: None,
            value_lambda: 0.5,
            value_stride: 1,
            value_criterion: VictimCriterion::MinimalRemainingValue,
            value_preempt: PreemptAction::Pause,
        }
    }

    /// The value-based allocator's parameters for `policy` (`value`: DwP, `value-dwop`), or
    /// `None` for the other policies.
    pub fn value_config(&self) -> Option<converge_policy::value::ValueConfig> {
        use converge_policy::value::{PreemptionConfig, ValueConfig};
        match self.policy.as_str() {
            "value" => Some(ValueConfig::dwp(
                self.value_stride,
                PreemptionConfig {
                    lambda: self.value_lambda,
                    criterion: self.value_criterion,
                    action: self.value_preempt,
                },
            )),
            "value-dwop" => Some(ValueConfig::dwop(self.value_stride)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `converge-manager ARGS` with the settings file `toml`.
    fn with_toml(toml: &str, args: &[&str]) -> Result<Config, String> {
        let dir = std::env::temp_dir().join(format!("converge-cfg-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("manager.toml");
        std::fs::write(&file, toml).unwrap();
        let mut line: Vec<std::ffi::OsString> = vec![
            "converge-manager".into(),
            "--config".into(),
            file.clone().into(),
        ];
        line.extend(args.iter().map(Into::into));
        let r = converge_messenger::config_file::with_file(line)
            .map_err(|e| e.to_string())
            .and_then(|a| Cli::try_parse_from(a).map_err(|e| e.to_string()))
            .and_then(|c| c.validate().map_err(|e| e.to_string()));
        std::fs::remove_dir_all(dir).unwrap();
        r
    }

    #[test]
    fn a_settings_file_is_read_with_the_flags_rules_and_the_command_line_wins() {
        let c = with_toml("policy = \"converge\"\nlost-after = 5\n", &[]).unwrap();
        assert_eq!((c.policy.as_str(), c.lost_after), ("converge", 5));
        let c = with_toml("policy = \"converge\"\n", &["--policy", "spread"]).unwrap();
        assert_eq!(c.policy, "spread");
        // The same message as the flag's.
        let from_file = with_toml("lost-after = 0\n", &[]).unwrap_err();
        let from_flag = Cli::parse_from(["converge-manager", "--lost-after", "0"])
            .validate()
            .unwrap_err()
            .to_string();
        assert_eq!(from_file, from_flag);
        let unknown = with_toml("polcy = \"converge\"\n", &[]).unwrap_err();
        assert!(unknown.contains("--polcy"), "{unknown}");
    }

    #[test]
    fn every_accepted_policy_is_runnable_and_others_are_refused() {
        let config = converge_core::cluster::policy::PolicyConfig {
            value: Some(converge_policy::value::ValueConfig::default()),
            ..Default::default()
        };
        for p in POLICIES {
            let policy = converge_core::cluster::policy::by_name(p, &config)
                .unwrap_or_else(|e| panic!("{p} accepted but not runnable: {e}"));
            assert_eq!(policy.name(), *p);
        }
        let flowcon = converge_core::cluster::policy::by_name("flowcon", &config).unwrap();
        assert_eq!(
            flowcon.worker_mode(),
            converge_core::cluster::types::WorkerMode::FlowCon
        );
        let cli = Cli::parse_from(["converge-manager", "--policy", "fastest"]);
        let err = cli.validate().unwrap_err();
        assert_eq!(err.flag, "policy");
        assert!(err.to_string().contains("spread, least-allocated"), "{err}");
    }

    #[test]
    fn log_format_and_metrics_address_are_parsed() {
        let cli = Cli::parse_from([
            "converge-manager",
            "--log-format",
            "json",
            "--metrics-listen",
            "127.0.0.1:9464",
        ]);
        assert_eq!(
            cli.log_format,
            converge_messenger::telemetry::LogFormat::Json
        );
        let config = cli.validate().unwrap();
        assert_eq!(
            config.metrics_listen,
            Some("127.0.0.1:9464".parse().unwrap())
        );
        let bad = Cli::try_parse_from(["converge-manager", "--log-format", "xml"]).unwrap_err();
        assert!(bad.to_string().contains("text"), "{bad}");
    }

    #[test]
    fn value_settings_default_to_the_papers_main_run_and_bad_ones_are_named() {
        use converge_policy::value::{PreemptAction, VictimCriterion};
        let c = Cli::parse_from(["converge-manager", "--policy", "value"])
            .validate()
            .unwrap();
        let v = c.value_config().expect("value runs the allocator");
        let p = v.preemption.expect("value is DwP");
        assert_eq!((p.lambda, v.stride), (0.5, 1));
        assert_eq!(p.criterion, VictimCriterion::MinimalRemainingValue);
        assert_eq!(p.action, PreemptAction::Pause);
        let c = Cli::parse_from([
            "converge-manager",
            "--policy",
            "value-dwop",
            "--value-stride",
            "18",
        ])
        .validate()
        .unwrap();
        let v = c.value_config().unwrap();
        assert!(v.preemption.is_none());
        assert_eq!(v.stride, 18);
        assert!(Config::for_listen(c.listen).value_config().is_none());
        for (flag, value) in [
            ("--value-lambda", "1"),
            ("--value-stride", "1024"),
            ("--value-criterion", "oldest"),
            ("--value-preempt", "kill"),
        ] {
            let err = Cli::parse_from(["converge-manager", flag, value])
                .validate()
                .unwrap_err();
            assert_eq!(format!("--{}", err.flag), flag, "{err}");
        }
    }
}
