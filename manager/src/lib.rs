//! The Converge manager: the single actor that owns cluster state and makes cluster-wide
//! decisions, behind two gRPC services on one port.
//!
//! - [`actor`]: the state owner. Every input — user requests, agent stream events, the
//!   heartbeat timer — is a message it handles one at a time. Start reading here.
//! - [`control`]: `ControlService` handlers (thin: wire → actor request → wire) and the
//!   [`ManagerHandle`] they use.
//! - [`validate`]: submission rules; every rejection names the field to fix.
//! - [`state`], [`events`]: the data the actor owns and the numbered event log WatchEvents
//!   streams.
//! - [`error`]: the crate's errors and their one conversion into `tonic::Status`.
//! - [`metrics`]: the manager's Prometheus metrics, served at `/metrics` with
//!   `--metrics-listen`. Traces and logs are set up by the binary
//!   (`converge_messenger::telemetry`); `docs/observability.md` describes all three.
//!
//! [`serve`] wires it together: the actor task, the agent streams (`converge-messenger`), the
//! control API, gRPC reflection (v1 and v1alpha, so grpcurl 1.8 works) and health.

pub mod actor;
pub mod config;
pub mod control;
pub mod error;
pub mod events;
pub mod metrics;
pub mod state;
pub mod validate;

use converge_messenger::manager::AgentStreams;
use converge_messenger::pb::{FILE_DESCRIPTOR_SET, WorkerMode};
use converge_messenger::pb::agent_service_server::AgentServiceServer;
use converge_messenger::pb::control_service_server::ControlServiceServer;
use converge_policy::cluster::Placer;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tracing::info;

pub use config::Config;
pub use control::ManagerHandle;
pub use error::{Error, Result};

/// What a `--policy` name means: how jobs are placed, and what agents run on their workers.
pub struct PolicySet {
    /// Placement (manager side).
    pub placer: Box<dyn Placer + Send>,
    /// The worker-side algorithm agents are told to run.
    pub worker_policy: WorkerMode,
    /// Whether SpeCon migrations and rebalancing run.
    pub migration: bool,
}

/// The policies `--policy` accepts, with what each runs (README "Policies").
///
/// - `spread`: Docker Swarm's spread placement, free competition on workers (FlowCon's "DS").
/// - `least-allocated`: Kubernetes' default scoring, free competition.
/// - `round-robin`: even initial placement, free competition (SpeCon's "DS").
/// - `flowcon`: FlowCon Alg. 4 placement and Alg. 1-3 elastic limits on every worker.
/// - `specon`: even initial placement, free competition, SpeCon migration (Alg. 1 on the
///   agents, Alg. 2 on their requests, Alg. 3 rebalancing on a timer).
/// - `converge`: FlowCon placement and limits together with SpeCon migration.
/// - `value`: value-based allocation with preemption (DwP): jobs with a value curve are
///   admitted, placed with a CPU share, preempted, resumed, dropped or rejected by
///   `converge_policy::value::ValueAllocator`; jobs without one are placed by spread. Free
///   competition (weighted by the CPU shares) on the workers.
/// - `value-dwop`: the same without preemption (DwoP).
pub fn policy_set(name: &str) -> Option<PolicySet> {
    use converge_policy::baseline::{LeastAllocated, RoundRobin, Spread};
    use converge_policy::flowcon::FlowConPlacer;
    let (placer, worker_policy, migration): (Box<dyn Placer + Send>, _, _) = match name {
        "spread" => (Box::new(Spread), WorkerMode::Free, false),
        "least-allocated" => (Box::new(LeastAllocated), WorkerMode::Free, false),
        "round-robin" => (Box::new(RoundRobin::default()), WorkerMode::Free, false),
        "flowcon" => (Box::new(FlowConPlacer), WorkerMode::Flowcon, false),
        "specon" => (Box::new(RoundRobin::default()), WorkerMode::Free, true),
        "converge" => (Box::new(FlowConPlacer), WorkerMode::Flowcon, true),
        "value" => (Box::new(actor::ValuePlacer::new("value")), WorkerMode::Free, false),
        "value-dwop" => (
            Box::new(actor::ValuePlacer::new("value-dwop")),
            WorkerMode::Free,
            false,
        ),
        _ => return None,
    };
    Some(PolicySet {
        placer,
        worker_policy,
        migration,
    })
}

/// Serves the manager on `listener` until `shutdown` is cancelled.
pub async fn serve(
    config: Config,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<()> {
    let policies = policy_set(&config.policy)
        .ok_or_else(|| Error::invalid("policy", format!("unknown policy `{}`", config.policy)))?;
    // Checked here too: embedders build a `Config` without the command line's validation.
    let value = config
        .value_config()
        .map(converge_policy::value::ValueAllocator::new)
        .transpose()
        .map_err(|e| Error::invalid("value", e.to_string()))?;
    let actor_config = actor::ActorConfig {
        manager_id: format!("manager-{}", uuid::Uuid::new_v4()),
        heartbeat_interval: config.heartbeat_interval,
        lost_after_missed: config.lost_after,
        progress_history: config.progress_history,
        worker_policy: policies.worker_policy,
        migration: policies.migration,
        save_deadline: config.save_deadline,
        rebalance_interval: config.rebalance_interval,
        recover_lost_after: config.recover_lost_after,
        value,
    };
    let (req_tx, req_rx) = mpsc::channel(1024);
    let (stream_tx, stream_rx) = mpsc::channel(8192);
    let metrics = metrics::ManagerMetrics::new();
    if let Some(addr) = config.metrics_listen {
        let listener = TcpListener::bind(addr).await?;
        info!(addr = %listener.local_addr()?, "metrics at /metrics");
        let (registry, token) = (metrics.registry(), shutdown.clone());
        tokio::spawn(async move {
            if let Err(e) =
                converge_messenger::telemetry::serve_metrics(listener, registry, token).await
            {
                tracing::error!(error = %e, "metrics endpoint failed");
            }
        });
    }
    let actor = actor::Actor::new(actor_config, policies.placer, metrics);
    let actor_task = tokio::spawn(actor.run(req_rx, stream_rx, shutdown.clone()));

    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<ControlServiceServer<ManagerHandle>>()
        .await;
    health
        .set_serving::<AgentServiceServer<AgentStreams>>()
        .await;
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let addr = listener.local_addr()?;
    info!(%addr, policy = %config.policy, "manager listening");
    tonic::transport::Server::builder()
        // Find dead agent connections even when no heartbeat would fail to send.
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(std::time::Duration::from_secs(5)))
        .add_service(health_service)
        .add_service(reflection().build_v1()?)
        .add_service(reflection().build_v1alpha()?)
        .add_service(AgentServiceServer::new(AgentStreams::new(stream_tx)))
        .add_service(ControlServiceServer::new(ManagerHandle::new(req_tx)))
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown.cancelled())
        .await?;
    let _ = actor_task.await;
    Ok(())
}
