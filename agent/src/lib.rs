//! The Converge agent: one per worker. It runs the worker's training containers through
//! Docker, watches them, and keeps the manager informed over one gRPC stream.
//!
//! ## Tour
//! - [`run`] is the whole agent: it connects to Docker (negotiating the API version down to
//!   the engine's), sets up the worker's cgroup parent so its CPU capacity is enforced, adopts
//!   the containers a previous agent left running, opens the session to the manager
//!   (`converge_messenger::agent::Session`: register, heartbeats, reconnects) and serves
//!   commands until the shutdown token is cancelled. Containers keep running after the agent
//!   stops; the next agent adopts them.
//! - [`config`]: the command line ([`Cli`]) and the validated [`Config`].
//! - `executor`: the I/O shell around the worker's decision core
//!   (`converge_core::node::NodeCore`, which the simulator drives too): the core decides
//!   (fencing by epoch, idempotency by command id, FlowCon's and SpeCon's rounds,
//!   self-fencing); the executor feeds it commands, Docker events, measurements and the
//!   session, and carries out its effects (Docker, results and requests for the manager, the
//!   heartbeat's policy view), plus re-adoption. Start reading here.
//! - `monitor`: log followers (progress lines), the progress batcher and the usage sampler,
//!   and the measurement behind reading usage from cgroup files rather than the stats API.
//! - [`cgroup`]: the worker's parent cgroup (v1 and v2), quota math and usage files.
//! - [`calibration`]: the worker's speed relative to the reference worker (the value-based
//!   allocation paper's calibration coefficient), measured at start with a reference trainer
//!   run unless `--calibration` gives it.
//! - [`docker`]: bollard connection, container names and labels, `Start` → container body.
//! - [`policy`]: the worker side of the manager's policy: FlowCon's elastic CPU limits
//!   (TCC'22 Alg. 1-3, rounds every `--flowcon-interval` and at once on a container start or
//!   die) and SpeCon's Alg. 1 (migration requests for converged jobs), decided by the node
//!   core from real progress and cgroup CPU time; the round reports and wire conversions.
//! - `view`: the read-mostly per-container view the heartbeat and registration read, and the
//!   policy rounds' categories, growth efficiencies and threshold.
//! - [`logs`]: a job's output for `convergectl logs`, read from Docker on the manager's
//!   request, and the last lines of the containers the agent removed.
//! - [`metrics`]: the agent's Prometheus metrics (its own registry), served at `/metrics`
//!   with `--metrics-listen`. Command spans continue the manager's trace from the command's
//!   `traceparent`; `docs/observability.md` describes traces, metrics and logs.
//!
//! ## Self-fencing
//! After `--fence-after` (30 s) without a manager the node core has every job container
//! checkpointed and stopped (see [`Config::fence_after`] for how this relates to the manager's
//! `--recover-lost-after`), so a job the manager restarts elsewhere never runs twice.
//!
//! ## Running an agent in-process
//! ```no_run
//! # async fn example() -> Result<(), converge_agent::Error> {
//! let mut config = converge_agent::Config::new("http://127.0.0.1:7070", "w1", 2.0);
//! config.checkpoint_root = "/tmp/converge-checkpoints".into();
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! let agent = tokio::spawn(converge_agent::run(config, shutdown.clone()));
//! // ... later
//! shutdown.cancel();
//! agent.await.expect("agent task")?;
//! # Ok(()) }
//! ```

use std::sync::Arc;

use converge_messenger::agent::{Session, SessionConfig};
use converge_messenger::pb;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, info_span, warn};

pub mod calibration;
pub mod cgroup;
pub mod config;
pub mod docker;
mod error;
pub mod executor;
pub mod logs;
pub mod metrics;
pub mod monitor;
pub mod policy;
mod view;

pub use config::{Cli, Config, UsageSource};
pub use error::{Error, Result};

/// Runs the agent until `shutdown` is cancelled.
///
/// Dropping the returned future (e.g. aborting its task) stops every task the agent started,
/// like a killed process: containers keep running and the worker cgroup stays.
///
/// Fails only on what stops the agent from starting: invalid settings, no Docker, no usable
/// cgroup filesystem, an uncreatable checkpoint root. An unreachable manager is not an error:
/// the session keeps retrying with backoff.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<()> {
    config.validate()?;
    let span = info_span!("agent", worker = %config.worker_id);
    run_inner(config, shutdown).instrument(span).await
}

async fn run_inner(config: Config, shutdown: CancellationToken) -> Result<()> {
    // Every task the agent spawns stops with this token. It is cancelled when the caller
    // cancels theirs, and also when this future is dropped (a test aborting the agent's task
    // to play SIGKILL): otherwise the session would live on, heartbeating for a dead agent.
    let shutdown = shutdown.child_token();
    let _stop_tasks_on_drop = shutdown.clone().drop_guard();
    // Checked before anything on the host changes, only to refuse unusable files at start:
    // each connection reads them again (a rotation needs no restart).
    let tls = config
        .tls
        .as_ref()
        .map(|(files, domain)| converge_messenger::tls::ClientTls {
            files: files.clone(),
            domain: domain.clone(),
        });
    if let Some(tls) = &tls {
        tls.check(&config.manager).map_err(|e| Error::Config {
            setting: tls.files.setting_of(&e),
            why: e.to_string(),
        })?;
    }
    let docker = docker::connect(config.docker_host.as_deref()).await?;
    let cgroup = Arc::new(cgroup::WorkerCgroup::detect(
        &config.cgroup_root,
        &config.cgroup_parent,
    )?);
    // The jobs run beside the agent, not inside it: the host's CPUs are what Docker says it
    // has, not what the agent's own process may use (an agent in a container limited to one
    // CPU still drives a worker of many).
    if let Ok(info) = docker.info().await
        && let Some(host) = info.ncpu.filter(|n| *n > 0)
        && config.cpus > host as f64
    {
        // Allowed (a test bed may overcommit on purpose), but the quota cannot be met: the
        // manager places by --cpus, and jobs here run slower than it plans.
        warn!(
            cpus = config.cpus,
            host,
            "--cpus is more than Docker's host has; the worker's jobs will get less CPU than the manager places for"
        );
    }
    let lease = cgroup.create(config.cpus)?;
    let served = serve(config, tls, docker, cgroup.clone(), shutdown).await;
    // Also when the agent failed to start (a checkpoint root it cannot make, no calibration
    // image): a cgroup left by an agent that never ran was the operator's to find.
    if cgroup.remove_if_empty() {
        info!(cgroup = %cgroup.docker_parent(), "removed the worker cgroup");
    } else {
        warn!(cgroup = %cgroup.docker_parent(), "worker cgroup left in place: containers still run in it");
    }
    drop(lease);
    served
}

/// The agent from its worker cgroup on: it checks the rest of its setup, connects (with `tls`,
/// its files checked already), and serves until `shutdown`.
async fn serve(
    config: Config,
    tls: Option<converge_messenger::tls::ClientTls>,
    docker: bollard::Docker,
    cgroup: Arc<cgroup::WorkerCgroup>,
    shutdown: CancellationToken,
) -> Result<()> {
    if config.memory_bytes > 0
        && let Err(e) = cgroup.set_memory_limit(config.memory_bytes)
    {
        // Memory is offered to the manager either way; enforcing it is a second line of
        // defence (it fails when the containers already use more than the new limit).
        warn!(error = %e, "worker memory capacity not enforced");
    }
    std::fs::create_dir_all(&config.checkpoint_root).map_err(|source| Error::Io {
        path: config.checkpoint_root.clone(),
        source,
    })?;
    info!(
        cpus = config.cpus,
        cgroup = %cgroup.docker_parent(),
        version = ?cgroup.version(),
        manager = %config.manager,
        "worker capacity enforced; connecting"
    );

    let calibration = if config.measure_calibration {
        calibration::calibrate(
            &docker,
            &config.worker_id,
            &config.checkpoint_root,
            &cgroup.docker_parent(),
            config.job_pids_limit,
        )
        .await?
    } else {
        config.calibration
    };

    let views: view::Views = Arc::default();
    let policy: Arc<view::PolicyView> = Arc::default();
    let (ready_tx, ready_rx) = watch::channel(false);
    let state = Arc::new(view::WorkerState {
        register: pb::Register {
            worker_id: config.worker_id.clone(),
            cpu_capacity: config.cpus,
            memory_bytes: config.memory_bytes,
            calibration,
            labels: config.labels.clone().into_iter().collect(),
            containers: Vec::new(),
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
            instance_id: uuid::Uuid::new_v4().to_string(),
        },
        capacity: config.cpus,
        views: views.clone(),
        policy: policy.clone(),
        ready: ready_rx,
    });
    let (cmd_tx, cmd_rx) = mpsc::channel(256);
    let mut session_config = SessionConfig::new(config.manager.clone());
    session_config.heartbeat_interval = config.heartbeat_interval;
    session_config.tls = tls;
    let metrics = metrics::AgentMetrics::new();
    session_config.metrics = metrics.session();
    let (logs_tx, logs_rx) = mpsc::channel(64);
    session_config.logs = Some(logs_tx);
    if let Some(addr) = config.metrics_listen {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| Error::MetricsListen { addr, source })?;
        info!(%addr, "metrics at /metrics");
        let (registry, token) = (metrics.registry(), shutdown.clone());
        tokio::spawn(
            async move {
                if let Err(e) =
                    converge_messenger::telemetry::serve_metrics(listener, registry, token).await
                {
                    warn!(error = %e, "metrics endpoint failed");
                }
            }
            .in_current_span(),
        );
    }
    let (outbox, status, session) = Session::spawn(session_config, state, cmd_tx, shutdown.clone());
    let kept = logs::Kept::default();
    logs::spawn(
        docker.clone(),
        config.worker_id.clone(),
        kept.clone(),
        outbox.clone(),
        logs_rx,
        shutdown.clone(),
    );

    let progress = monitor::spawn_batcher(outbox.clone(), metrics.clone(), shutdown.clone());
    monitor::spawn_usage_sampler(
        docker.clone(),
        cgroup.clone(),
        config.usage_source,
        config.usage_interval,
        views.clone(),
        outbox.clone(),
        shutdown.clone(),
    );
    let config = Arc::new(config);
    executor::Executor::new(
        config.clone(),
        docker,
        cgroup.clone(),
        views,
        outbox,
        status,
        progress,
        policy,
        metrics,
        kept,
        shutdown.clone(),
    )?
    .run(cmd_rx, ready_tx)
    .await?;
    let _ = session.await;
    Ok(())
}
