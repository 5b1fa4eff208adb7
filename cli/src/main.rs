//! `convergectl`: submit, inspect, cancel and watch jobs; list workers.
//!
//! A thin client of `ControlService`; everything it shows, grpcurl can show too. Start at
//! [`Cmd`].

use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use converge_cli::client::{Bearer, Client};
use converge_cli::view::{self, Board};
use converge_messenger::pb::{self, control_service_client::ControlServiceClient};

#[derive(Parser)]
#[command(name = "convergectl", version, about = "Drive a Converge cluster")]
struct Cli {
    /// The manager's address.
    #[arg(
        long,
        env = "CONVERGE_MANAGER",
        default_value = "http://127.0.0.1:7070",
        global = true
    )]
    manager: String,
    /// The cluster CA (PEM) to check an `https://` manager against (`cargo xtask certs`
    /// writes target/certs/ca.pem).
    #[arg(long, env = "CONVERGE_CA", global = true)]
    ca: Option<std::path::PathBuf>,
    /// Bearer token for the control API (when the manager runs with --tokens).
    #[arg(long, env = "CONVERGE_TOKEN", global = true, hide_env_values = true)]
    token: Option<String>,
    /// `table` for people, `json` (one object, or one per line for `watch`) for scripts.
    #[arg(short, long, global = true, default_value = "table")]
    output: Output,
    #[command(subcommand)]
    cmd: Cmd,
}

/// How results are printed.
#[derive(Clone, Copy, PartialEq, clap::ValueEnum)]
enum Output {
    Table,
    Json,
}

/// Exit codes a script can tell apart (clap itself exits 2 for a wrong command line).
mod exit {
    /// The manager cannot be reached, or another failure.
    pub const FAILED: i32 = 1;
    /// No such job or worker.
    pub const NOT_FOUND: i32 = 3;
    /// The request is wrong (the message names the field).
    pub const INVALID: i32 = 4;
    /// No token, a token that is not accepted, or a role that may not.
    pub const DENIED: i32 = 5;
    /// The manager is busy (a rate limit) or shutting down: try again.
    pub const UNAVAILABLE: i32 = 6;
    /// The job was created but turned away at admission (a value policy, or `converge`,
    /// found its result worth nothing): its id is printed, the reason said.
    pub const REJECTED: i32 = 7;
    /// Whoever read the output stopped (`convergectl top | head`): 128 + SIGPIPE, what a
    /// shell reports for a tool the closed pipe killed.
    pub const CLOSED_PIPE: i32 = 141;
}

/// `e` with its causes, each said once: the transport's errors repeat their source in their
/// own words ("tcp connect error: tcp connect error: Connection refused").
fn causes(e: &anyhow::Error) -> String {
    let mut out: Vec<String> = Vec::new();
    for c in e.chain() {
        let text = c.to_string();
        if !out.last().is_some_and(|last| last.contains(&text)) {
            out.push(text);
        }
    }
    out.join(": ")
}

/// `e` in one short line: what failed, then its root cause, without the links between (a
/// tonic status printed whole, the transport's wrappers, Debug-printed structs). `top` shows
/// it in its header every second and `watch` on each loss: the whole chain ran to several
/// lines of h2 and rustls internals.
fn brief(e: &anyhow::Error) -> String {
    let first = e.to_string();
    let root = e.root_cause().to_string();
    if first.contains(&root) {
        first
    } else {
        format!("{first}: {root}")
    }
}

/// Whether a panic's `message` is `println!` finding stdout's reader gone.
fn closed_pipe(message: &str) -> bool {
    message.starts_with("failed printing to stdout") && message.contains("Broken pipe")
}

/// Stdout whose reader went away (`convergectl logs | head`): what [`Stdout`] turns a broken
/// pipe into, told apart from a broken connection to the manager.
#[derive(Debug)]
struct ClosedStdout;

impl std::fmt::Display for ClosedStdout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stdout was closed")
    }
}

impl std::error::Error for ClosedStdout {}

/// Stdout, locked, saying [`ClosedStdout`] when its reader has gone.
struct Stdout(std::io::StdoutLock<'static>);

impl Stdout {
    fn closed(e: std::io::Error) -> std::io::Error {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::io::Error::new(std::io::ErrorKind::BrokenPipe, ClosedStdout)
        } else {
            e
        }
    }
}

impl std::io::Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf).map_err(Self::closed)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush().map_err(Self::closed)
    }
}

/// Whether `e` is stdout's reader gone ([`ClosedStdout`]).
fn stdout_closed(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .is_some_and(|inner| inner.is::<ClosedStdout>())
    })
}

#[derive(Subcommand)]
enum Cmd {
    /// Submit a job; prints its id.
    Submit {
        /// Docker image.
        #[arg(long)]
        image: String,
        /// CPU cores requested.
        // A negative number is a value (the manager says what is wrong with it), not a flag.
        #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
        cpus: f64,
        /// Name shown in listings.
        #[arg(long, default_value = "")]
        name: String,
        /// The metric the job reports.
        #[arg(long, default_value = "loss")]
        metric: String,
        /// Whether the metric should go down or up.
        #[arg(long, default_value = "minimize", value_parser = ["minimize", "min", "maximize", "max"])]
        direction: String,
        /// Environment variable `KEY=VALUE` (repeatable).
        #[arg(long = "env", value_parser = key_value)]
        env: Vec<(String, String)>,
        /// Label `KEY=VALUE` (repeatable).
        #[arg(long = "label", value_parser = key_value)]
        labels: Vec<(String, String)>,
        /// Memory limit: bytes, or with a unit (`512m`, `4g` as Docker reads them, `512MiB`,
        /// `1GB`); none by default.
        // A negative number is a value (said to be one below), not a flag: clap's tip for it
        // would pass it to the job.
        #[arg(long, value_parser = bytes, allow_negative_numbers = true)]
        memory: Option<u64>,
        /// What the result is worth over time, `MAX,FULL_UNTIL_S,ZERO_AT_S`: MAX until
        /// FULL_UNTIL_S seconds after submission, falling to nothing at ZERO_AT_S (the value
        /// policies read it, and need --estimated-runtime beside it; `converge` reads it too).
        // A curve may begin with a minus (refused by the manager, naming the field): a value,
        // not a flag.
        #[arg(long, value_parser = value_curve, allow_hyphen_values = true)]
        value: Option<pb::ValueCurve>,
        /// Seconds the job takes alone on a reference worker (what the value policies admit
        /// by; a guess for the ETA until the job reports its own steps).
        // A negative number is a value (refused by the manager, naming the field), not a flag:
        // clap's tip for it would pass it to the job.
        #[arg(
            long,
            default_value_t = 0.0,
            hide_default_value = true,
            allow_negative_numbers = true
        )]
        estimated_runtime: f64,
        /// Arguments for the image's entrypoint (after `--`).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Show one job.
    Get {
        /// Job id, or its name (when one job alone has it).
        job: String,
        /// Also print its progress samples.
        #[arg(long)]
        progress: bool,
    },
    /// List jobs.
    List {
        /// Only jobs in these states (`--state running,migrating`, or the flag again).
        #[arg(long, ignore_case = true, value_delimiter = ',', value_parser = [
            "pending", "starting", "running", "migrating", "paused", "stopping", "lost",
            "completed", "failed", "cancelled", "rejected", "dropped",
        ])]
        state: Vec<String>,
        /// Only jobs on this worker.
        #[arg(long, default_value = "", hide_default_value = true)]
        worker: String,
        /// Only jobs of this name (`submit --name`).
        #[arg(long, default_value = "", hide_default_value = true)]
        name: String,
    },
    /// Cancel a job.
    Cancel {
        /// Job id, or its name (when one job alone has it).
        job: String,
    },
    /// List workers.
    Workers,
    /// Drain a worker: nothing new is placed on it, and its running jobs move to other
    /// workers through their checkpoints (operator role).
    Drain {
        /// Worker id.
        worker: String,
    },
    /// Undrain a worker (Kubernetes' uncordon): it takes jobs again. A move its drain began
    /// goes on; the jobs not moved yet stay (operator role).
    Undrain {
        /// Worker id.
        worker: String,
    },
    /// Forget a lost worker once no job is on it (`kubectl delete node`): it leaves the list
    /// and the manager's store; its agent, should it come back, registers as a new worker
    /// (operator role).
    Forget {
        /// Worker id.
        worker: String,
    },
    /// Why a job is where it is: every decision recorded about it (placement and its scores,
    /// CPU weights or limits given and why, moves and their trigger, preemption, pending and
    /// failure reasons), oldest first.
    Why {
        /// Job id, or its name (when one job alone has it).
        job: String,
    },
    /// A live view: a progress bar per job with its state, worker, CPU and ETA, redrawn on
    /// every event and once a second while jobs run (progress is not an event). Without
    /// `--job`: every job not ended yet, and those that end while it watches.
    Top {
        /// Only this job: its id, or its name (repeatable).
        #[arg(long = "job")]
        jobs: Vec<String>,
        /// Exit once every job shown has ended (0 if all completed, 1 otherwise).
        #[arg(long)]
        until_done: bool,
    },
    /// A job's output (its containers' stdout and stderr), read through the agents: each
    /// incarnation's part in order, headed on stderr by its epoch and worker when there is more
    /// than one. A finished job's output is read from its containers while they exist, then from the
    /// last 1,000 lines its agent kept of each (until that agent restarts).
    Logs {
        /// Job id, or its name (when one job alone has it).
        job: String,
        /// Keep printing new output as the job writes it, across migrations, until it ends.
        #[arg(short, long)]
        follow: bool,
        /// Only the last N lines of each incarnation.
        // A negative number is a value clap refuses naming the flag, not an unknown flag (whose
        // tip, `-- -5`, would pass it as a job).
        #[arg(long, allow_negative_numbers = true)]
        tail: Option<u32>,
    },
    /// Write a consistent copy of the manager's state store, taken while it runs, to a file
    /// (restore it by putting it in place as `converge.db` in a stopped manager's state
    /// directory). Needs the operator role.
    Backup {
        /// Where to write it; refused if it exists. Written beside as `FILE.part` first and
        /// renamed when whole, so that a cut-off copy is never taken for a backup.
        file: std::path::PathBuf,
    },
    /// Print events as they happen.
    Watch {
        /// Only this job's events.
        #[arg(long, default_value = "")]
        job: String,
        /// Replay recorded events from this sequence number first; 0 replays nothing (only new
        /// events), 1 everything still recorded.
        #[arg(long, default_value_t = 0)]
        from_seq: u64,
    },
}

fn key_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("`{s}` is not KEY=VALUE"))
}

/// `--memory`: bytes, or a number with a unit: Docker's `b`, `k`, `m`, `g` (powers of 1024, as
/// `docker run --memory` and the agent's `--memory` read them), `KiB`, `MiB`, `GiB` the same,
/// and `KB`, `MB`, `GB` powers of 1000.
fn bytes(s: &str) -> Result<u64, String> {
    if s.starts_with('-') {
        return Err(format!(
            "`{s}` is negative: a memory limit is a number of bytes (e.g. 512m), or leave it out for none"
        ));
    }
    let at = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(at);
    let n: f64 = number
        .parse()
        .map_err(|_| format!("`{s}` is not a number of bytes (e.g. 512m)"))?;
    let scale: u64 = match unit.trim() {
        "" | "b" | "B" => 1,
        "k" | "K" | "KiB" => 1 << 10,
        "m" | "M" | "MiB" => 1 << 20,
        "g" | "G" | "GiB" => 1 << 30,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => {
            return Err(format!(
                "`{other}` is not a unit: b, k, m, g (KiB, MiB, GiB), or KB, MB, GB"
            ));
        }
    };
    let bytes = n * scale as f64;
    // Said as typed: past u64 the conversion would saturate, and under a byte round to 0,
    // which means no limit at all.
    if bytes >= u64::MAX as f64 {
        return Err(format!("`{s}` is more bytes than a limit can hold"));
    }
    if n > 0.0 && bytes < 1.0 {
        return Err(format!("`{s}` is less than a byte"));
    }
    Ok(bytes.round() as u64)
}

/// `--value MAX,FULL_UNTIL_S,ZERO_AT_S`.
fn value_curve(s: &str) -> Result<pb::ValueCurve, String> {
    let parts: Vec<f64> = (s.split(','))
        .map(|p| p.trim().parse::<f64>())
        .collect::<Result<_, _>>()
        .map_err(|_| format!("`{s}` is not MAX,FULL_UNTIL_S,ZERO_AT_S (e.g. 10,60,300)"))?;
    let [max_value, full_value_until_s, zero_value_at_s] = parts[..] else {
        return Err(format!(
            "`{s}` is not three numbers MAX,FULL_UNTIL_S,ZERO_AT_S (e.g. 10,60,300)"
        ));
    };
    Ok(pb::ValueCurve {
        max_value,
        full_value_until_s,
        zero_value_at_s,
    })
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    // An empty CONVERGE_* variable is unset (`CONVERGE_CA= convergectl list`).
    let cli = converge_messenger::config_file::parse::<Cli>(std::env::args_os())
        .unwrap_or_else(|e| e.exit());
    let manager = cli.manager.clone();
    // Rust ignores SIGPIPE, so `println!` panics when the reader of stdout has gone (and
    // `unsafe_code` is forbidden here, which restoring the signal would need): end quietly
    // as other tools do, with the code a shell gives one the signal ended.
    let panicked = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = (info.payload().downcast_ref::<String>().map(String::as_str))
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if closed_pipe(message) {
            std::process::exit(exit::CLOSED_PIPE);
        }
        panicked(info);
    }));
    if let Err(e) = run(cli).await {
        if stdout_closed(&e) {
            std::process::exit(exit::CLOSED_PIPE);
        }
        if e.downcast_ref::<Rejected>().is_some() {
            eprintln!("convergectl: {e}");
            std::process::exit(exit::REJECTED);
        }
        let code = e.downcast_ref::<tonic::Status>().map(tonic::Status::code);
        // A refused call is said in one line (its code and message); anything else with its
        // causes.
        let text = if code.is_some() {
            format!("{e}")
        } else {
            causes(&e)
        };
        let chain = format!("{e:#}");
        // A plaintext request to a TLS port fails in more than one way (a frame too big, a
        // broken pipe), depending on who closes first: asked directly instead.
        let tls = manager.starts_with("http://")
            && (chain.contains("transport error") || chain.contains("h2 protocol error"))
            && speaks_tls(&manager).await;
        let mismatch = converge_messenger::tls::Mismatch::of(e.as_ref());
        // What to fix first, then what failed (whose words, an HTTP/2 error for a plaintext
        // request to a TLS port, name nothing a user set).
        match connection_hint(&manager, mismatch, tls) {
            // Said as what the connection showed: read as a second error, the HTTP/2 words
            // after the hint misled a new user.
            Some(hint) => {
                eprintln!("convergectl: {hint}");
                eprintln!("convergectl: (the connection failed with: {text})");
            }
            None => eprintln!("convergectl: {text}"),
        }
        let code = match code {
            Some(tonic::Code::NotFound) => exit::NOT_FOUND,
            Some(tonic::Code::InvalidArgument | tonic::Code::FailedPrecondition) => exit::INVALID,
            Some(tonic::Code::Unauthenticated | tonic::Code::PermissionDenied) => exit::DENIED,
            Some(tonic::Code::Unavailable | tonic::Code::ResourceExhausted) => exit::UNAVAILABLE,
            _ => exit::FAILED,
        };
        std::process::exit(code);
    }
}

async fn run(cli: Cli) -> Result<()> {
    let json = cli.output == Output::Json;
    if !cli.manager.contains("://") {
        bail!(
            "--manager `{0}` needs a scheme: http://{0}, or https://{0} with --ca",
            cli.manager
        );
    }
    let mut endpoint = tonic::transport::Endpoint::from_shared(cli.manager.clone())
        .with_context(|| format!("--manager `{}` is not a URL", cli.manager))?;
    if cli.manager.starts_with("https://") {
        // An IPv6 address is bracketed in the URL but not in a certificate.
        let host = endpoint.uri().host().unwrap_or("localhost");
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let ca = cli.ca.as_deref().context(
            "an https:// manager needs --ca (or CONVERGE_CA): the cluster CA's PEM file",
        )?;
        let tls =
            converge_messenger::tls::control_client(ca, &host).context("--ca (or CONVERGE_CA)")?;
        endpoint = endpoint.tls_config(tls)?;
    }
    let channel = endpoint
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .with_context(|| format!("cannot reach the manager at {}", cli.manager))?;
    let authorization = cli
        .token
        .as_deref()
        .map(|t| tonic::metadata::MetadataValue::try_from(format!("Bearer {}", t.trim())))
        .transpose()
        .context("--token must be printable ASCII")?;
    let mut client = ControlServiceClient::with_interceptor(channel, Bearer(authorization));
    match cli.cmd {
        Cmd::Submit {
            image,
            cpus,
            name,
            metric,
            direction,
            env,
            labels,
            memory,
            value,
            estimated_runtime,
            args,
        } => {
            let direction = match direction.as_str() {
                "minimize" | "min" => pb::Direction::Minimize,
                // The parser took nothing else.
                _ => pb::Direction::Maximize,
            };
            let spec = pb::JobSpec {
                name,
                image,
                args,
                env: env.into_iter().collect(),
                cpus,
                metric,
                direction: direction as i32,
                labels: labels.into_iter().collect(),
                memory_bytes: memory.unwrap_or(0),
                value_curve: value,
                estimated_runtime_s: estimated_runtime,
                ..Default::default()
            };
            let r = client
                .submit_job(pb::SubmitJobRequest { spec: Some(spec) })
                .await
                .map_err(status)?
                .into_inner();
            for w in &r.warnings {
                eprintln!("convergectl: warning: {w}");
            }
            // A job turned away at admission was created (its id names it in `get` and
            // `why`), but it will never run: a script waiting on it must hear so.
            let rejected = (r.job.as_ref())
                .filter(|j| j.state == pb::JobState::Rejected as i32)
                .map(|j| j.reason.clone());
            if json {
                let mut out = serde_json::json!({ "job_id": r.job_id, "warnings": r.warnings });
                if let Some(reason) = &rejected {
                    out["rejected"] = reason.clone().into();
                }
                println!("{out}");
            } else {
                println!("{}", r.job_id);
            }
            if let Some(reason) = rejected {
                return Err(Rejected {
                    job: r.job_id,
                    reason,
                }
                .into());
            }
        }
        Cmd::Get { job, progress } => {
            let job = resolve(&mut client, job).await?;
            let j = get_job(&mut client, job, progress).await?;
            if json {
                println!("{}", job_json(&j));
                return Ok(());
            }
            print_job(&j);
            for p in &j.progress {
                println!(
                    "  step {:>8}  value {:>12}  epoch {}",
                    p.step,
                    p.value.map(|v| format!("{v:.6}")).unwrap_or_default(),
                    p.epoch
                );
            }
        }
        Cmd::List {
            state,
            worker,
            name,
        } => {
            // The parser took only the states' names.
            let mut states: Vec<pb::JobState> = (state.iter())
                .map(|s| {
                    pb::JobState::from_str_name(&format!("JOB_STATE_{}", s.to_uppercase()))
                        .expect("--state is one of the states")
                })
                .collect();
            states.sort_unstable();
            states.dedup();
            // ListJobs filters by one state: one listing per state asked for, merged in the
            // order of submission, as one listing answers.
            let mut jobs = Vec::new();
            for state in states
                .iter()
                .copied()
                .chain(states.is_empty().then_some(pb::JobState::Unspecified))
            {
                let request = pb::ListJobsRequest {
                    state: state as i32,
                    worker_id: worker.clone(),
                    name: name.clone(),
                    ..Default::default()
                };
                jobs.extend(all_jobs(&mut client, request).await?);
            }
            if states.len() > 1 {
                jobs.sort_by(|a, b| {
                    (a.submitted_unix_ms, &a.id).cmp(&(b.submitted_unix_ms, &b.id))
                });
                // A job that changed state between two listings is in both: once. (One that
                // changed the other way is in neither: a listing of several states is not
                // one moment's, as one state's is.)
                jobs.dedup_by(|a, b| a.id == b.id);
            }
            // A manager older than the name filter ignores it and answers with every job.
            if !name.is_empty() {
                jobs.retain(|j| j.spec.as_ref().is_some_and(|s| s.name == name));
            }
            if json {
                let all: Vec<_> = jobs.iter().map(job_json).collect();
                println!("{}", serde_json::Value::Array(all));
                return Ok(());
            }
            println!(
                "{:<36}  {:<18}  {:<10}  {:<10}  {:>13}  {:>10}  {:>9}",
                "ID", "NAME", "STATE", "WORKER", "STEP", "METRIC", "ETA"
            );
            for j in jobs {
                println!(
                    "{:<36}  {:<18}  {:<10}  {:<10}  {:>13}  {:>10}  {:>9}",
                    j.id,
                    j.spec.as_ref().map(|s| s.name.as_str()).unwrap_or(""),
                    pb::JobState::label_of(j.state),
                    j.worker_id,
                    view::steps(j.step, j.total_steps),
                    j.metric_value
                        .map(|v| format!("{v:.4}"))
                        .unwrap_or_default(),
                    j.eta.as_ref().map(view::eta).unwrap_or_else(|| "-".into())
                );
            }
        }
        Cmd::Cancel { job } => {
            let job = resolve_or(&mut client, job, true).await?;
            let j = client
                .cancel_job(pb::CancelJobRequest { job_id: job })
                .await
                .map_err(status)?
                .into_inner();
            if json {
                println!("{}", job_json(&j));
            } else {
                print_job(&j);
            }
        }
        Cmd::Workers => {
            let ws = client
                .list_workers(pb::ListWorkersRequest {})
                .await
                .map_err(status)?
                .into_inner()
                .workers;
            print_workers(&ws, json);
        }
        Cmd::Drain { worker } => {
            let w = client
                .drain_worker(pb::DrainWorkerRequest { worker_id: worker })
                .await
                .map_err(status)?
                .into_inner();
            print_workers(&[w], json);
        }
        Cmd::Undrain { worker } => {
            let w = client
                .undrain_worker(pb::UndrainWorkerRequest { worker_id: worker })
                .await
                .map_err(status)?
                .into_inner();
            print_workers(&[w], json);
        }
        Cmd::Forget { worker } => {
            let w = client
                .forget_worker(pb::ForgetWorkerRequest { worker_id: worker })
                .await
                .map_err(status)?
                .into_inner();
            if json {
                // The worker as it was when forgotten.
                print_workers(&[w], json);
            } else {
                println!("worker {} forgotten", w.id);
            }
        }
        Cmd::Top { jobs, until_done } => {
            let mut ids = Vec::with_capacity(jobs.len());
            for job in jobs {
                ids.push(resolve(&mut client, job).await?);
            }
            return top(&mut client, &cli.manager, ids, until_done, json).await;
        }
        Cmd::Logs { job, follow, tail } => {
            let job = resolve(&mut client, job).await?;
            return logs(&mut client, job, follow, tail, json).await;
        }
        Cmd::Backup { file: out } => {
            let bytes = backup(&mut client, &out).await?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({ "file": out.display().to_string(), "bytes": bytes })
                );
            } else {
                println!("{}: {bytes} bytes", out.display());
            }
        }
        Cmd::Watch { job, from_seq } => {
            let job = resolve(&mut client, job).await?;
            return watch(&mut client, job, from_seq, json).await;
        }
        Cmd::Why { job } => {
            let job = resolve(&mut client, job).await?;
            // Its state first: a job that does not exist is NotFound, not an empty story.
            let j = get_job(&mut client, job.clone(), false).await?;
            let mut events = client
                .watch_events(pb::WatchEventsRequest {
                    job_id: job,
                    from_seq: 1,
                })
                .await
                .map_err(status)?
                .into_inner();
            // The recorded events come at once, then the stream waits for new ones: stop when
            // it goes quiet.
            let mut recorded = Vec::new();
            while let Ok(next) =
                tokio::time::timeout(Duration::from_millis(500), events.message()).await
            {
                match next.map_err(status)? {
                    Some(e) => recorded.push(e),
                    None => break,
                }
            }
            if json {
                let all: Vec<_> = recorded.iter().map(event_json).collect();
                println!(
                    "{}",
                    serde_json::json!({ "job": job_json(&j), "decisions": all })
                );
                return Ok(());
            }
            println!(
                "{} is {}: {}",
                j.id,
                pb::JobState::label_of(j.state),
                j.reason
            );
            for e in &recorded {
                println!("  {}", why_line(e));
            }
        }
    }
    Ok(())
}

/// `convergectl backup` ([`Cmd::Backup`]): the copy into `out`, through `out.part`; its size.
async fn backup(client: &mut Client, out: &std::path::Path) -> Result<u64> {
    use std::io::Write;
    if out.exists() {
        bail!(
            "{} exists: name a new file (a backup never overwrites one)",
            out.display()
        );
    }
    let mut part = out.as_os_str().to_owned();
    part.push(".part");
    let part = std::path::PathBuf::from(part);
    let mut chunks = client
        .backup(pb::BackupRequest {})
        .await
        .map_err(status)?
        .into_inner();
    // Readable by its owner alone, as the store it copies: it holds every job's environment.
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file =
        (options.open(&part)).with_context(|| format!("cannot write {}", part.display()))?;
    let mut bytes = 0u64;
    let copied = async {
        while let Some(c) = chunks.message().await.map_err(status)? {
            file.write_all(&c.data)?;
            bytes += c.data.len() as u64;
        }
        file.sync_all()?;
        anyhow::Ok(())
    }
    .await;
    if let Err(e) = copied {
        let _ = std::fs::remove_file(&part);
        return Err(e.context("the backup was cut off; nothing was written"));
    }
    std::fs::rename(&part, out)?;
    Ok(bytes)
}

/// `convergectl logs` ([`Cmd::Logs`]).
async fn logs(
    client: &mut Client,
    job: String,
    follow: bool,
    tail: Option<u32>,
    json: bool,
) -> Result<()> {
    use std::io::Write;
    // What the job is first: one that never ran has no output to look for, and one that ran
    // more than once has each part headed, its first included.
    let j = get_job(client, job.clone(), false).await?;
    if pb::JobState::ended(j.state) && j.started_unix_ms == 0 {
        eprintln!(
            "convergectl: job {job} never ran ({}): it has no output",
            j.reason
        );
        return Ok(());
    }
    let head_every_part = j.epoch > 1;
    let mut output = client
        .job_logs(pb::JobLogsRequest {
            job_id: job,
            follow,
            tail: tail.unwrap_or(0),
        })
        .await
        .map_err(status)?
        .into_inner();
    let (mut out, mut err) = (Stdout(std::io::stdout().lock()), std::io::stderr().lock());
    // The incarnation being printed, to head each new one.
    let mut shown: Option<u64> = None;
    let mut gaps = 0;
    while let Some(part) = output.message().await.map_err(status)? {
        if json {
            for l in &part.lines {
                let line = String::from_utf8_lossy(&l.data);
                let o = serde_json::json!({
                    "epoch": part.epoch,
                    "worker": part.worker_id,
                    "stream": if l.stderr { "stderr" } else { "stdout" },
                    "line": line.strip_suffix('\n').unwrap_or(&line),
                });
                writeln!(out, "{o}")?;
            }
            if !part.unavailable.is_empty() {
                let o = serde_json::json!({
                    "epoch": part.epoch,
                    "worker": part.worker_id,
                    "unavailable": part.unavailable,
                });
                writeln!(out, "{o}")?;
            }
        } else {
            if shown != Some(part.epoch) {
                // A job that ran once needs no heading; after a move, each part has one.
                if head_every_part || shown.is_some() || part.epoch > 1 {
                    out.flush()?;
                    writeln!(err, "── epoch {} on {} ──", part.epoch, part.worker_id)?;
                }
                shown = Some(part.epoch);
            }
            for l in &part.lines {
                if l.stderr {
                    out.flush()?;
                    err.write_all(&l.data)?;
                } else {
                    out.write_all(&l.data)?;
                }
            }
            if !part.unavailable.is_empty() {
                out.flush()?;
                writeln!(
                    err,
                    "── epoch {} on {}: {} ──",
                    part.epoch, part.worker_id, part.unavailable
                )?;
            }
        }
        gaps += usize::from(!part.unavailable.is_empty());
        out.flush()?;
    }
    if gaps > 0 {
        bail!("the output of {gaps} incarnation(s) could not be read (said above)");
    }
    Ok(())
}

/// How long `watch` and `top` wait for a manager that went away (it restarted, or the
/// connection broke) before they give up.
const RECONNECT_FOR: Duration = Duration::from_secs(60);

/// A manager away, for `watch` and `top`: since when, why, and whether that is too long.
#[derive(Default)]
struct Away {
    since: Option<std::time::Instant>,
    /// Why the last attempt failed.
    why: String,
    /// Say nothing on stderr: `top` on a terminal shows it in its header, and a line written
    /// below its frame would be drawn over at the next refresh.
    quiet: bool,
}

impl Away {
    /// The manager answered.
    fn back(&mut self) {
        self.since = None;
    }

    /// A call failed with `e`, or the manager ended a stream (`e` None). A refusal (NotFound,
    /// PermissionDenied, ...) is returned; a manager gone (Unavailable, a broken connection)
    /// is waited for, until [`RECONNECT_FOR`] has passed.
    fn lost(&mut self, e: Option<anyhow::Error>, what: &str) -> Result<()> {
        let code = (e.as_ref()).map(|e| e.downcast_ref::<tonic::Status>().map(|s| s.code()));
        use tonic::Code as C;
        if let Some(code) = code
            && !code.is_some_and(|c| {
                matches!(
                    c,
                    C::Unavailable | C::Unknown | C::Cancelled | C::Aborted | C::Internal
                )
            })
        {
            return Err(e.expect("an error"));
        }
        // Why, in each message: a manager that is back but refuses the connection (its CA
        // rotated, say) looks gone, and only the cause tells the two apart.
        let why = (e.as_ref()).map_or("it ended the stream".to_string(), brief);
        let since = match self.since {
            Some(since) => since,
            None => {
                if !self.quiet {
                    eprintln!("convergectl: lost the manager ({why}); reconnecting ({what})");
                }
                *self.since.insert(std::time::Instant::now())
            }
        };
        self.why.clone_from(&why);
        if since.elapsed() >= RECONNECT_FOR {
            let gone = format!(
                "the manager has not come back for {}s (the last attempt: {why})",
                RECONNECT_FOR.as_secs()
            );
            return Err(match e {
                Some(e) => e.context(gone),
                None => anyhow::anyhow!("{gone}"),
            });
        }
        Ok(())
    }
}

/// `convergectl watch` ([`Cmd::Watch`]): every event as it comes. When the manager goes away
/// (a restart keeps its event numbers), it reconnects and goes on after the last event it
/// printed, so none is missed or said twice; from the first event the new stream sends if
/// none was printed yet.
async fn watch(client: &mut Client, job: String, from_seq: u64, json: bool) -> Result<()> {
    let mut next = from_seq;
    let mut away = Away::default();
    let mut connected = false;
    // The name of the log the events shown were read from ([`converge_messenger::EVENT_LOG_HEADER`]).
    let mut log: Option<String> = None;
    loop {
        let request = pb::WatchEventsRequest {
            job_id: job.clone(),
            from_seq: next,
        };
        match client.watch_events(request).await {
            Ok(events) => {
                away.back();
                connected = true;
                let named = (events.metadata().get(converge_messenger::EVENT_LOG_HEADER))
                    .and_then(|v| v.to_str().ok())
                    .map(String::from);
                // Another log: the manager was restarted without its state, and its numbers
                // began again; those from `next` on may be past events it made since. Read
                // from its first event instead (a manager that names no log is not judged).
                if let (Some(was), Some(now)) = (&log, &named)
                    && was != now
                    && next > 1
                {
                    eprintln!(
                        "convergectl: the manager's event log is a new one (restarted without \
                         its state); the events after {} not shown are gone; going on from its \
                         first event",
                        next - 1
                    );
                    log = named;
                    next = 1;
                    continue;
                }
                log = named.or(log);
                let mut events = events.into_inner();
                let ended = loop {
                    match events.message().await {
                        Ok(Some(e)) => {
                            next = e.seq + 1;
                            if json {
                                println!("{}", event_json(&e));
                            } else {
                                println!("{}", describe_event(&e));
                            }
                        }
                        Ok(None) => break None,
                        Err(s) => break Some(s),
                    }
                };
                // A watcher that fell behind is dropped with ResourceExhausted and told to
                // watch again after the last event it saw: what `next` holds.
                if ended
                    .as_ref()
                    .is_some_and(|s| s.code() == tonic::Code::ResourceExhausted)
                {
                    eprintln!(
                        "convergectl: fell behind the manager's events; going on from event {next}"
                    );
                    continue;
                }
                away.lost(ended.map(status), &format!("from event {next}"))?;
            }
            // A manager never reached is a wrong address, not one to wait for.
            Err(s) if !connected => return Err(status(s)),
            // Back, but its log ends before the event to resume from: it was restarted from
            // an older backup (or without its state, by a manager that names no log). Shown
            // from its first event it has: some may have been shown before.
            Err(s) if s.code() == tonic::Code::InvalidArgument && next > 1 => {
                eprintln!(
                    "convergectl: the manager's event log starts again (restarted without its \
                     state, or from an older backup) before event {next}; the events after {} \
                     not shown are gone; going on from its first event",
                    next - 1
                );
                next = 1;
                continue;
            }
            Err(s) => away.lost(Some(status(s)), &format!("from event {next}"))?,
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// `convergectl top` ([`Cmd::Top`]).
async fn top(
    client: &mut Client,
    manager: &str,
    wanted: Vec<String>,
    until_done: bool,
    json: bool,
) -> Result<()> {
    // Subscribed before the first listing, so no change falls between the two.
    let mut events = Some(subscribe_all(client).await?);
    let mut board = Board::new(&format!("convergectl top {manager}"));
    let mut shown = Shown::default();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut away = Away {
        quiet: board.on_terminal() && !json,
        ..Away::default()
    };
    let mut last: Vec<pb::Job> = Vec::new();
    loop {
        // A manager gone (restarted): the last frame stays, saying so, until it is back.
        if events.is_none() {
            match subscribe_all(client).await {
                Ok(s) => events = Some(s),
                // A refusal (a role that may not watch, too many watchers) ends `top`.
                Err(e) => away.lost(Some(e), "events")?,
            }
        }
        let now = converge_messenger::unix_ms(std::time::SystemTime::now());
        let jobs = match top_jobs(client, &wanted, &mut shown).await {
            Ok(jobs) if events.is_some() => {
                away.back();
                jobs
            }
            Ok(_) => {
                away.lost(None, "events")?;
                last.clone()
            }
            Err(e) => {
                away.lost(Some(e), "every second")?;
                last.clone()
            }
        };
        let running = jobs
            .iter()
            .filter(|j| !pb::JobState::ended(j.state))
            .count();
        if json {
            let all: Vec<_> = jobs.iter().map(job_json).collect();
            println!("{}", serde_json::json!({ "unix_ms": now, "jobs": all }));
        } else {
            let status = match away.since {
                // What and why on a line of their own: after the title and the clock, an
                // 80-column header was cut before them.
                Some(since) => format!(
                    "reconnecting\n  the manager is unreachable for {}s: {}",
                    since.elapsed().as_secs(),
                    away.why
                ),
                None => format!("{running} of {} jobs not ended", jobs.len()),
            };
            board.update(&jobs, now, &format!("at {}: ", clock(now)), &status);
        }
        let current = away.since.is_none();
        if until_done && current && jobs.is_empty() {
            // Nothing to wait for (no job not ended yet, none asked for by --job).
            board.finish();
            eprintln!("convergectl: no job to wait for");
            return Ok(());
        }
        if until_done && current && running == 0 {
            board.finish();
            let failed = jobs
                .iter()
                .filter(|j| j.state != pb::JobState::Completed as i32)
                .count();
            if failed > 0 {
                bail!("{failed} of {} jobs ended without completing", jobs.len());
            }
            return Ok(());
        }
        last = jobs;
        // The next redraw: on an event, or on the tick while something may progress.
        let Some(stream) = events.as_mut() else {
            tick.tick().await;
            continue;
        };
        tokio::select! {
            e = stream.message() => {
                match e {
                    Ok(Some(_)) => {
                        // A burst of events (a placement round) is one redraw, not one per
                        // event: wait a moment, then take whatever else has arrived.
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        while let Ok(e) = tokio::time::timeout(Duration::ZERO, stream.message()).await {
                            if !matches!(e, Ok(Some(_))) {
                                events = None;
                                break;
                            }
                        }
                    }
                    // The manager ended the stream (a restart) or the connection broke:
                    // subscribed again at the next redraw.
                    _ => events = None,
                }
            }
            _ = tick.tick() => {}
        }
    }
}

/// Every event from now on, for `top`'s redraws.
async fn subscribe_all(client: &mut Client) -> Result<tonic::Streaming<pb::Event>> {
    let request = pb::WatchEventsRequest {
        job_id: String::new(),
        from_seq: 0,
    };
    Ok((client.watch_events(request).await)
        .map_err(status)?
        .into_inner())
}

/// What `top` has shown: the ids of jobs not ended at the last frame, and the final record of
/// each that ended since (asked for once: an ended job does not change).
#[derive(Default)]
struct Shown {
    live: std::collections::BTreeSet<String>,
    ended: std::collections::BTreeMap<String, pb::Job>,
}

/// The jobs one frame of `top` shows: those `wanted`, else every job not ended and those shown
/// before that ended since.
async fn top_jobs(
    client: &mut Client,
    wanted: &[String],
    shown: &mut Shown,
) -> Result<Vec<pb::Job>> {
    let mut jobs = Vec::new();
    if wanted.is_empty() {
        // From the manager's memory: a list of every job would read its whole history at
        // every redraw. (A manager older than `not_ended` lists every job: filtered here.)
        let live = pb::ListJobsRequest {
            not_ended: true,
            ..Default::default()
        };
        jobs = (all_jobs(client, live).await?.into_iter())
            .filter(|j| !pb::JobState::ended(j.state))
            .collect();
        let listed: std::collections::HashSet<String> = jobs.iter().map(|j| j.id.clone()).collect();
        for id in std::mem::take(&mut shown.live) {
            if listed.contains(&id) || shown.ended.contains_key(&id) {
                continue;
            }
            match get_job(client, id, false).await {
                Ok(j) => {
                    shown.ended.insert(j.id.clone(), j);
                }
                // Gone since (a manager without a store restarted, or it was pruned).
                Err(e)
                    if e.downcast_ref::<tonic::Status>()
                        .is_some_and(|s| s.code() == tonic::Code::NotFound) => {}
                Err(e) => return Err(e),
            }
        }
        shown.live = listed.into_iter().collect();
        jobs.extend(shown.ended.values().cloned());
        jobs.sort_by(|a, b| (a.submitted_unix_ms, &a.id).cmp(&(b.submitted_unix_ms, &b.id)));
    } else {
        // One by one: a job that is not known is NotFound, and an archived one is still
        // answered; one that ended is asked for no more.
        for id in wanted {
            let j = match shown.ended.get(id) {
                Some(j) => j.clone(),
                None => get_job(client, id.clone(), false).await?,
            };
            if pb::JobState::ended(j.state) {
                shown.ended.insert(id.clone(), j.clone());
            }
            jobs.push(j);
        }
    }
    Ok(jobs)
}

/// The id of the job `given` names: its id, or its name (`--name`) when one job alone has
/// it, a job not ended yet before an ended one (a name is often given again to a new job
/// once the old one ended). None is NotFound (exit 3); several is a wrong request (exit 4)
/// listing them. Ids are not matched by their start: they begin with their submission time
/// (UUIDv7), so jobs submitted together share it.
async fn resolve(client: &mut Client, given: String) -> Result<String> {
    resolve_or(client, given, false).await
}

/// [`resolve`], but where no job of the name is live and several ended ones have it, the
/// newest of them if `newest_ended`: what `cancel` retried after its answer was lost means
/// (the first cancel ended the one live job; refused as ambiguous, the retry failed).
async fn resolve_or(client: &mut Client, given: String, newest_ended: bool) -> Result<String> {
    let is_id = given.len() == 36 && given.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
    if is_id || given.is_empty() {
        return Ok(given);
    }
    // The jobs not ended first: answered from the manager's memory, where a list of every
    // job reads its whole history from the store.
    let mut matches = named_jobs(client, true, &given).await?;
    if matches.is_empty() {
        matches = named_jobs(client, false, &given).await?;
        // Listed in submission order.
        if newest_ended && let Some(newest) = matches.pop() {
            return Ok(newest.id);
        }
    }
    match matches.as_slice() {
        [one] => Ok(one.id.clone()),
        [] => Err(status(tonic::Status::not_found(format!(
            "no job has the id or name `{given}`"
        )))),
        many => Err(status(tonic::Status::invalid_argument(format!(
            "{} jobs are named `{given}`; give one of their ids: {}",
            many.len(),
            many.iter()
                .map(|j| format!("{} ({})", j.id, pb::JobState::label_of(j.state)))
                .collect::<Vec<_>>()
                .join(", ")
        )))),
    }
}

/// The jobs named `name` (those not ended only, if `not_ended`).
async fn named_jobs(client: &mut Client, not_ended: bool, name: &str) -> Result<Vec<pb::Job>> {
    // The jobs not ended one state at a time: every manager answers a live state from memory,
    // where one older than `not_ended` and paging would send its whole history at once.
    let states: Vec<pb::JobState> = if not_ended {
        live_states().collect()
    } else {
        vec![pb::JobState::Unspecified]
    };
    let mut jobs = Vec::new();
    for state in states {
        let request = pb::ListJobsRequest {
            state: state as i32,
            name: name.to_string(),
            ..Default::default()
        };
        jobs.extend(all_jobs(client, request).await?);
    }
    // A manager older than the name filter ignores it and answers with every job.
    jobs.retain(|j| j.spec.as_ref().is_some_and(|s| s.name == name));
    Ok(jobs)
}

/// The states of jobs not ended (every state the wire has but those [`pb::JobState::ended`]).
fn live_states() -> impl Iterator<Item = pb::JobState> {
    (1..)
        .map_while(|n| pb::JobState::try_from(n).ok())
        .filter(|s| !pb::JobState::ended(*s as i32))
}

/// Jobs a ListJobs answer holds at most ([`all_jobs`]): a few hundred KiB of jobs, far below
/// the 4 MiB a gRPC client takes.
const LIST_PAGE: u32 = 500;

/// Every job `request` asks for, a page at a time: one answer with a long history would be
/// more than a client takes.
async fn all_jobs(client: &mut Client, mut request: pb::ListJobsRequest) -> Result<Vec<pb::Job>> {
    request.page_size = LIST_PAGE;
    let mut jobs = Vec::new();
    loop {
        let page = (client.list_jobs(request.clone()).await)
            .map_err(status)?
            .into_inner();
        jobs.extend(page.jobs);
        if page.next_page_token.is_empty() {
            return Ok(jobs);
        }
        request.page_token = page.next_page_token;
    }
}

/// GetJob; a refusal is kept as its status (for the exit code).
async fn get_job(client: &mut Client, job_id: String, include_progress: bool) -> Result<pb::Job> {
    Ok(client
        .get_job(pb::GetJobRequest {
            job_id,
            include_progress,
        })
        .await
        .map_err(status)?
        .into_inner())
}

/// What to fix when a connection failed in a way whose own words name nothing a user set:
/// TLS on one side only, or a CA that did not sign the manager's certificate. `tls`: the
/// http:// manager answered in TLS ([`speaks_tls`]), however the failure showed.
fn connection_hint(
    manager: &str,
    mismatch: Option<converge_messenger::tls::Mismatch>,
    tls: bool,
) -> Option<String> {
    use converge_messenger::tls::Mismatch;
    if tls {
        return Some(format!(
            "the manager speaks TLS: use --manager {} with --ca (or CONVERGE_CA)",
            manager.replacen("http://", "https://", 1)
        ));
    }
    match mismatch? {
        Mismatch::PlaintextServer => Some(format!(
            "the manager at {manager} does not speak TLS: use --manager {}",
            manager.replacen("https://", "http://", 1)
        )),
        Mismatch::UnknownIssuer => Some(
            "the manager's certificate is not signed by the --ca file (or CONVERGE_CA): give \
             the cluster CA's ca.pem"
                .into(),
        ),
        // Asked of the port directly (`tls`): the words do not always say it.
        Mismatch::TlsServer => None,
    }
}

/// Whether the server at `manager` (an http:// URL) speaks TLS: to the HTTP/2 preface a
/// plaintext client opens with, a TLS server answers with an alert record (type 21).
async fn speaks_tls(manager: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Some(authority) = manager
        .parse::<tonic::transport::Uri>()
        .ok()
        .and_then(|u| u.authority().cloned())
    else {
        return false;
    };
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    let port = authority.port_u16().unwrap_or(80);
    let probe = async {
        let mut s = tokio::net::TcpStream::connect((host, port)).await.ok()?;
        s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .ok()?;
        let mut first = [0u8; 1];
        s.read_exact(&mut first).await.ok()?;
        Some(first[0] == 0x15)
    };
    tokio::time::timeout(Duration::from_secs(2), probe)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

/// A submitted job turned away at admission ([`exit::REJECTED`]).
#[derive(Debug)]
struct Rejected {
    job: String,
    reason: String,
}

impl std::fmt::Display for Rejected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "job {} was rejected at admission: {}",
            self.job, self.reason
        )
    }
}

impl std::error::Error for Rejected {}

/// A failed call, kept as the status so that `main` can pick the exit code.
fn status(s: tonic::Status) -> anyhow::Error {
    let text = format!("{:?}: {}", s.code(), s.message());
    anyhow::Error::new(s).context(text)
}

/// `JOB_STATE_RUNNING` → `running`.
fn label(name: &str, prefix: &str) -> String {
    name.trim_start_matches(prefix).to_lowercase()
}

fn job_json(j: &pb::Job) -> serde_json::Value {
    serde_json::json!({
        "id": j.id,
        "name": j.spec.as_ref().map(|s| s.name.clone()).unwrap_or_default(),
        "image": j.spec.as_ref().map(|s| s.image.clone()).unwrap_or_default(),
        "state": pb::JobState::label_of(j.state),
        "reason": j.reason,
        "worker": j.worker_id,
        "epoch": j.epoch,
        "step": j.step,
        "total_steps": j.total_steps,
        "metric": j.metric_value,
        "migrations": j.migrations,
        "exit_code": j.exit_code,
        "submitted_unix_ms": j.submitted_unix_ms,
        "started_unix_ms": (j.started_unix_ms > 0).then_some(j.started_unix_ms),
        "finished_unix_ms": (j.finished_unix_ms > 0).then_some(j.finished_unix_ms),
        "eta": j.eta.as_ref().map(|e| serde_json::json!({
            "remaining_s": e.remaining_s,
            "finish_unix_ms": e.finish_unix_ms,
            "start_unix_ms": e.start_unix_ms,
            "basis": e.basis,
            "confidence": e.confidence,
        })),
        "progress": j.progress.iter().map(|p| serde_json::json!({
            "step": p.step, "value": p.value, "epoch": p.epoch,
        })).collect::<Vec<_>>(),
    })
}

fn event_json(e: &pb::Event) -> serde_json::Value {
    serde_json::json!({
        "seq": e.seq,
        "unix_ms": e.unix_ms,
        "kind": label(pb::EventKind::try_from(e.kind).map(|k| k.as_str_name()).unwrap_or(""), "EVENT_KIND_"),
        "job": e.job_id,
        "worker": e.worker_id,
        "epoch": e.epoch,
        "from": (e.kind == pb::EventKind::JobState as i32).then(|| pb::JobState::label_of(e.from_state)),
        "to": (e.kind == pb::EventKind::JobState as i32).then(|| pb::JobState::label_of(e.to_state)),
        // A worker's event says what it is now (ready, draining, lost).
        "worker_state": (e.kind == pb::EventKind::WorkerState as i32).then(|| worker_state_label(e.worker_state)),
        "reason": e.reason,
        "attributes": e.attributes,
    })
}

/// One decision about a job, in words: when, what, why, and the numbers behind it.
fn why_line(e: &pb::Event) -> String {
    let what = match pb::EventKind::try_from(e.kind) {
        Ok(pb::EventKind::JobState) => format!(
            "{} -> {}",
            from_label(e.from_state),
            pb::JobState::label_of(e.to_state)
        ),
        Ok(pb::EventKind::JobPlaced) => format!("placed on {}", e.worker_id),
        // A move's steps by its outcome: a declined one (Alg. 2 kept the job, or a drain found
        // no room) moved nothing, and a walk read "move" beside "not moved off w2".
        Ok(pb::EventKind::Migration) => match e.attributes.get("outcome").map(String::as_str) {
            Some("started") => "move started",
            Some("completed") => "moved",
            Some("declined") => "not moved",
            Some("aborted") => "move aborted",
            Some("failed") => "move failed",
            Some("abandoned") => "move abandoned",
            _ => "move",
        }
        .to_string(),
        Ok(pb::EventKind::Stray) => format!("stray copy (incarnation {}) stopped", e.epoch),
        Ok(pb::EventKind::Limits) => match e.attributes.get("cpus") {
            Some(cpus) => format!("cpu limit {cpus} cores"),
            None => format!(
                "cpu weight {}",
                e.attributes.get("cpu_shares").map_or("-", String::as_str)
            ),
        },
        _ => "event".to_string(),
    };
    let mut details: Vec<String> = e
        .attributes
        .iter()
        .filter(|(k, _)| !k.starts_with("eta_error"))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    details.sort();
    let details = if details.is_empty() {
        String::new()
    } else {
        format!(" [{}]", details.join(", "))
    };
    format!(
        "{} #{:<4} {:<22} {}{}",
        clock(e.unix_ms),
        e.seq,
        what,
        e.reason,
        details
    )
}

fn print_job(j: &pb::Job) {
    println!("id:       {}", j.id);
    if let Some(s) = &j.spec {
        println!("name:     {}", s.name);
        println!("image:    {}", s.image);
        if !s.args.is_empty() {
            println!("args:     {}", s.args.join(" "));
        }
        // What the value policies and `converge` decide by, which only grpcurl showed (a
        // walk).
        if let Some(v) = &s.value_curve {
            println!(
                "value:    {} until {}s after submission, falling to 0 at {}s",
                v.max_value, v.full_value_until_s, v.zero_value_at_s
            );
        }
        if s.estimated_runtime_s > 0.0 {
            println!(
                "runtime:  {}s estimated, alone on a reference worker",
                s.estimated_runtime_s
            );
        }
    }
    println!(
        "state:    {} ({})",
        pb::JobState::label_of(j.state),
        j.reason
    );
    let mut times = vec![format!("submitted {}", date_time(j.submitted_unix_ms))];
    for (what, at) in [
        ("started", j.started_unix_ms),
        ("ended", j.finished_unix_ms),
    ] {
        if at > 0 {
            times.push(format!("{what} {}", date_time(at)));
        }
    }
    println!("times:    {}", times.join(", "));
    if j.worker_id.is_empty() {
        println!("worker:   - (epoch {})", j.epoch);
    } else {
        println!("worker:   {} (epoch {})", j.worker_id, j.epoch);
    }
    println!(
        "progress: step {}  metric {}  ({} samples, {} malformed lines)",
        view::steps(j.step, j.total_steps),
        j.metric_value
            .map(|v| format!("{v:.6}"))
            .unwrap_or("-".into()),
        j.samples,
        j.malformed_lines
    );
    match &j.eta {
        Some(e) => println!(
            "eta:      {} left, finishing at {} ({}{}, confidence {:.0}%)",
            view::eta(e),
            date_time(e.finish_unix_ms),
            e.basis,
            if e.start_unix_ms > 0 {
                format!("; starting at {}", date_time(e.start_unix_ms))
            } else {
                String::new()
            },
            e.confidence * 100.0
        ),
        // An ended job has no ETA to wait for: "nothing tells yet" read as if it might.
        None if pb::JobState::ended(j.state) => println!("eta:      - (ended)"),
        // A paused job finishes once its policy resumes it, which nothing foresees.
        None if j.state == pb::JobState::Paused as i32 => {
            println!("eta:      - (paused: it finishes once resumed)")
        }
        None if j.state == pb::JobState::Lost as i32 => {
            println!("eta:      - (lost: its worker is not heard from)")
        }
        None => println!("eta:      - (nothing tells yet)"),
    }
}

/// A Unix-ms time as `YYYY-MM-DD HH:MM:SS UTC`: what `get` shows, of a job that may be days
/// old or days from its end.
fn date_time(unix_ms: i64) -> String {
    let at = std::time::UNIX_EPOCH + Duration::from_millis(unix_ms.max(0) as u64);
    // RFC 3339, `2026-11-29T11:40:00Z`, as people read it.
    let rfc = humantime::format_rfc3339_seconds(at).to_string();
    format!("{} UTC", rfc.trim_end_matches('Z').replacen('T', " ", 1))
}

/// A Unix-ms time as `HH:MM:SS` UTC: what `top` and `watch` show, of what happens now.
fn clock(unix_ms: i64) -> String {
    let s = (unix_ms / 1000).rem_euclid(86_400);
    format!("{:02}:{:02}:{:02} UTC", s / 3600, (s % 3600) / 60, s % 60)
}

/// A job event's earlier state: none (`new`) for its submission.
fn from_label(state: i32) -> String {
    if state == pb::JobState::Unspecified as i32 {
        "new".into()
    } else {
        pb::JobState::label_of(state)
    }
}

fn describe_event(e: &pb::Event) -> String {
    let kind = pb::EventKind::try_from(e.kind)
        .map(|k| {
            k.as_str_name()
                .trim_start_matches("EVENT_KIND_")
                .to_lowercase()
        })
        .unwrap_or_default();
    let what = if e.kind == pb::EventKind::JobState as i32 {
        format!(
            "{} -> {}",
            from_label(e.from_state),
            pb::JobState::label_of(e.to_state)
        )
    } else {
        String::new()
    };
    format!(
        "#{:<5} {:<12} job={} worker={} {} {}",
        e.seq,
        kind,
        e.job_id,
        if e.worker_id.is_empty() {
            "-"
        } else {
            &e.worker_id
        },
        what,
        e.reason
    )
}

/// A worker state's lower-case name (`ready`), empty for one this build does not know.
fn worker_state_label(state: i32) -> String {
    pb::WorkerState::try_from(state)
        .map(|s| label(s.as_str_name(), "WORKER_STATE_"))
        .unwrap_or_default()
}

/// Workers as a table, or as a JSON array.
fn print_workers(ws: &[pb::Worker], json: bool) {
    let state = |w: &pb::Worker| worker_state_label(w.state);
    if json {
        let all: Vec<_> = ws
            .iter()
            .map(|w| {
                serde_json::json!({
                    "id": w.id,
                    "state": state(w),
                    "cpu_capacity": w.cpu_capacity,
                    "cpu_requested": w.cpu_requested,
                    "jobs": w.job_ids,
                    "stopping": w.stopping_job_ids,
                    "policy": w.policy,
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(all));
        return;
    }
    // STOPPING: containers told to stop and not yet seen to (a lost worker's, until it comes
    // back): REQUESTED counts their room, so a worker of no jobs can show cores requested.
    println!(
        "{:<12}  {:<8}  {:>6}  {:>9}  {:>5}  {:>8}  POLICY",
        "ID", "STATE", "CPUS", "REQUESTED", "JOBS", "STOPPING"
    );
    for w in ws {
        println!(
            "{:<12}  {:<8}  {:>6.2}  {:>9.2}  {:>5}  {:>8}  {}",
            w.id,
            state(w),
            w.cpu_capacity,
            w.cpu_requested,
            w.job_ids.len(),
            w.stopping_job_ids.len(),
            w.policy
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stdout's reader gone is told apart from a broken pipe to the manager, which is an
    /// error to say, not an end to keep quiet.
    #[test]
    fn a_closed_stdout_is_told_from_a_broken_connection() {
        let pipe = || std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        let stdout = anyhow::Error::new(Stdout::closed(pipe())).context("writing the logs");
        assert!(stdout_closed(&stdout));
        let manager = anyhow::Error::new(pipe()).context("cannot reach the manager");
        assert!(!stdout_closed(&manager));
        let other = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        assert_eq!(
            Stdout::closed(other).kind(),
            std::io::ErrorKind::PermissionDenied
        );
        assert!(closed_pipe(
            "failed printing to stdout: Broken pipe (os error 32)"
        ));
        assert!(!closed_pipe("transport error: Broken pipe (os error 32)"));
    }

    /// A cause the one before it already says is not said again.
    #[test]
    fn memory_and_value_flags_read_what_their_help_says() {
        assert_eq!(bytes("512MiB"), Ok(512 << 20));
        assert_eq!(bytes("1GB"), Ok(1_000_000_000));
        assert_eq!(bytes("1.5GiB"), Ok(3 << 29));
        assert_eq!(bytes("4096"), Ok(4096));
        assert_eq!(bytes("4g"), Ok(4 << 30));
        assert_eq!(bytes("512m"), Ok(512 << 20));
        assert!(
            bytes("99999999999999999999")
                .unwrap_err()
                .contains("more bytes")
        );
        assert!(bytes("0.4").unwrap_err().contains("less than a byte"));
        assert!(bytes("-5").unwrap_err().contains("is negative"));
        assert!(bytes("2 parsecs").unwrap_err().contains("not a unit"));
        assert!(bytes("lots").unwrap_err().contains("not a number"));
        let curve = value_curve("10, 60,300").unwrap();
        assert_eq!(
            (
                curve.max_value,
                curve.full_value_until_s,
                curve.zero_value_at_s
            ),
            (10.0, 60.0, 300.0)
        );
        assert!(value_curve("10,60").unwrap_err().contains("three numbers"));
        assert!(
            value_curve("a,b,c")
                .unwrap_err()
                .contains("MAX,FULL_UNTIL_S,ZERO_AT_S")
        );
    }

    /// A move's events say which step they are; a declined one does not read as a move.
    #[test]
    fn why_names_a_move_by_its_outcome() {
        let event = |outcome: Option<&str>| pb::Event {
            kind: pb::EventKind::Migration as i32,
            reason: "r".into(),
            attributes: outcome
                .map(|o| ("outcome".to_string(), o.to_string()))
                .into_iter()
                .collect(),
            ..Default::default()
        };
        let what = |outcome| why_line(&event(outcome));
        assert!(
            what(Some("declined")).contains(" not moved "),
            "{}",
            what(Some("declined"))
        );
        assert!(what(Some("started")).contains(" move started "));
        assert!(what(Some("completed")).contains(" moved "));
        assert!(what(Some("abandoned")).contains(" move abandoned "));
        assert!(what(None).contains(" move "));
    }

    #[test]
    fn get_shows_the_date_and_watch_the_time_of_day() {
        // 2026-11-29 11:40:05.5 UTC.
        let at = 1_795_952_405_500;
        assert_eq!(date_time(at), "2026-11-29 11:40:05 UTC");
        assert_eq!(clock(at), "11:40:05 UTC");
    }

    #[test]
    fn causes_are_said_once() {
        #[derive(Debug)]
        struct Repeats(&'static str, Option<std::io::Error>);
        impl std::fmt::Display for Repeats {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.0)
            }
        }
        impl std::error::Error for Repeats {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                self.1.as_ref().map(|e| e as _)
            }
        }
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let e = anyhow::Error::new(Repeats("tcp connect error", Some(refused)))
            .context("tcp connect error")
            .context("cannot reach the manager");
        assert_eq!(
            causes(&e),
            "cannot reach the manager: tcp connect error: connection refused"
        );
        assert_eq!(brief(&e), "cannot reach the manager: connection refused");
        let alone = anyhow::anyhow!("it ended the stream");
        assert_eq!(brief(&alone), "it ended the stream");
    }
}
