//! The Converge manager: the single actor that owns cluster state and makes cluster-wide
//! decisions, behind two gRPC services on one port.
//!
//! - [`actor`]: the I/O shell around the decision core (`converge_core::cluster::Core`, where
//!   every decision is made). Every input — user requests, agent stream events, the heartbeat
//!   timer — becomes one step of the core, handled one at a time; the actor carries out the
//!   effects. Start reading here, then in `converge-core`.
//! - [`control`]: `ControlService` handlers (thin: wire → actor request → wire) and the
//!   [`ManagerHandle`] they use.
//! - [`validate`]: submission rules; every rejection names the field to fix.
//! - [`wire`]: the one place that converts between the wire types and the core's plain data.
//! - [`events`]: the numbered event log WatchEvents streams.
//! - [`error`]: the crate's errors and their one conversion into `tonic::Status`.
//! - [`metrics`]: the manager's Prometheus metrics, served at `/metrics` with
//!   `--metrics-listen`. Traces and logs are set up by the binary
//!   (`converge_messenger::telemetry`); `docs/observability.md` describes all three.
//!
//! [`serve`] wires it together: the actor task, the agent streams (`converge-messenger`), the
//! control API, gRPC reflection (v1 and v1alpha, so grpcurl 1.8 works) and health.

pub mod actor;
pub mod auth;
pub mod config;
pub mod control;
pub mod error;
pub mod events;
pub mod metrics;
pub mod validate;
pub mod wire;

use converge_core::cluster::Core;
use converge_messenger::manager::AgentStreams;
use converge_messenger::pb;
use converge_messenger::pb::FILE_DESCRIPTOR_SET;
use converge_messenger::pb::agent_service_server::AgentServiceServer;
use converge_messenger::pb::control_service_server::ControlServiceServer;
use converge_store::{Sqlite, Store};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::info;

pub use config::Config;
pub use control::ManagerHandle;
pub use error::{Error, Result};

/// Largest agent message decoded (a progress batch of thousands of samples fits).
pub const MAX_AGENT_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// Serves the manager on `listener` until `shutdown` is cancelled.
pub async fn serve(
    config: Config,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<()> {
    let manager_id = format!("manager-{}", uuid::Uuid::new_v4());
    let policy_config = converge_core::cluster::policy::PolicyConfig {
        rebalance_interval: config.rebalance_interval.as_secs_f64(),
        value: config.value_config(),
    };
    let policy = converge_core::cluster::policy::by_name(&config.policy, &policy_config)
        .map_err(|e| Error::invalid("policy", e))?;
    let core_config = converge_core::cluster::Config {
        heartbeat_interval: config.heartbeat_interval.as_secs_f64(),
        lost_after_missed: config.lost_after,
        recover_lost_after: config.recover_lost_after.as_secs_f64(),
        save_deadline: config.save_deadline.as_secs_f64(),
        progress_history: config.progress_history,
        // Archived jobs are answered for from the store: without one, every job stays.
        keep_finished: if config.state_dir.is_some() {
            config.keep_finished
        } else {
            usize::MAX
        },
        id_prefix: manager_id.clone(),
        // Only a store reads which records a step changed.
        record_changes: config.state_dir.is_some(),
    };
    let actor_config = actor::ActorConfig {
        manager_id,
        core: core_config.clone(),
        events_in_memory: config.events_in_memory,
        finished_retention: config.finished_retention,
    };
    let (req_tx, req_rx) = mpsc::channel(1024);
    let (stream_tx, stream_rx) = mpsc::channel(8192);
    let metrics = metrics::ManagerMetrics::new();
    if let Some(addr) = config.metrics_listen {
        let listener = TcpListener::bind(addr).await.map_err(|e| {
            Error::invalid("--metrics-listen", format!("cannot listen on {addr}: {e}"))
        })?;
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
    let Started {
        core,
        store,
        restored,
    } = match &config.state_dir {
        None => {
            info!("no state store: the state is lost when the manager exits");
            Started {
                core: Core::new(core_config, policy),
                store: None,
                restored: None,
            }
        }
        Some(dir) => recover(
            dir,
            core_config,
            policy,
            config.recovery_grace,
            config.events_in_memory,
        )?,
    };
    let actor = actor::Actor::new(actor_config, core, metrics, store, restored);
    let actor_task = {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let r = actor.run(req_rx, stream_rx, shutdown.clone()).await;
            // A manager whose store failed must not keep serving (health would say SERVING
            // while every call fails): stop the server too, so that a supervisor restarts it.
            if r.is_err() {
                shutdown.cancel();
            }
            r
        })
    };

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
    // Before "listening": a tokens file that cannot be used stops the manager first.
    let auth = match &config.tokens {
        Some(path) => {
            let tokens = auth::TokensFile::open(path).map_err(|e| Error::invalid("--tokens", e))?;
            info!(path = %path.display(), "control API requires bearer tokens (the file is read again when it changes)");
            Some(auth::AuthLayer::new(tokens))
        }
        None => {
            tracing::warn!(
                "no --tokens: anyone who reaches the control API may submit, cancel, drain, undrain and back up"
            );
            None
        }
    };
    let addr = listener.local_addr()?;
    let builder = tonic::transport::Server::builder();
    let mut agents = AgentStreams::new(stream_tx);
    if let Some(rate) = config.agent_message_rate {
        agents = agents.per_agent_rate(rate);
    }
    // With TLS, connections come through our own listener, which takes new certificate files
    // without a restart (`converge_messenger::tls::listen`).
    use futures::future::Either;
    let tls = match &config.tls {
        Some(files) => {
            let incoming =
                converge_messenger::tls::listen(listener, files.clone(), shutdown.clone())
                    .map_err(|e| {
                        Error::invalid(format!("--{}", files.setting_of(&e)), e.to_string())
                    })?;
            agents = agents.require_certificates();
            info!("TLS on; agents need a client certificate naming their worker");
            Either::Left(incoming)
        }
        None => Either::Right(plain_incoming(listener)),
    };
    // Only now, with its tokens and TLS files read: a manager that says it listens does.
    info!(%addr, policy = %config.policy, "manager listening");
    if config.tokens.is_some() && config.tls.is_none() {
        tracing::warn!(
            "--tokens without TLS: tokens travel in clear text, and agents are not authenticated \
             (anyone who reaches the port can register as a worker); add --tls-cert, --tls-key and --tls-ca"
        );
    }
    let router = builder
        .layer(tower::util::option_layer(auth))
        // Find dead agent connections even when no heartbeat would fail to send.
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(std::time::Duration::from_secs(5)))
        // Backpressure: a manager behind on its agents holds a bounded window per connection.
        .initial_stream_window_size(converge_messenger::manager::WINDOW_BYTES)
        .initial_connection_window_size(converge_messenger::manager::WINDOW_BYTES)
        .add_service(health_service)
        .add_service(reflection().build_v1()?)
        .add_service(reflection().build_v1alpha()?)
        // Explicit bounds on what is decoded: an agent's batches are far smaller than this; a
        // control request's fields are limited by validation, well below its bound, so that
        // an oversized field is refused naming the field.
        .add_service(
            AgentServiceServer::new(agents).max_decoding_message_size(MAX_AGENT_MESSAGE_BYTES),
        )
        .add_service(
            ControlServiceServer::new(ManagerHandle::new(
                req_tx,
                config.rate_limit,
                config.max_watchers,
            ))
            .max_decoding_message_size(validate::MAX_REQUEST_BYTES),
        );
    match tls {
        Either::Left(incoming) => {
            router
                .serve_with_incoming_shutdown(incoming, shutdown.cancelled())
                .await?
        }
        Either::Right(plain) => {
            router
                .serve_with_incoming_shutdown(plain, shutdown.cancelled())
                .await?
        }
    }
    match actor_task.await {
        Ok(result) => result,
        Err(e) => Err(Error::FailedPrecondition(format!(
            "the manager actor panicked: {e}"
        ))),
    }
}

/// What the actor starts from.
struct Started {
    core: Core,
    store: Option<Box<dyn Store>>,
    restored: Option<actor::Restored>,
}

/// Opens the store in `dir` and rebuilds what it holds: the core (with `grace` for the
/// workers to come back), the job specs and the event log. A store that cannot be read, or
/// whose records do not make a consistent cluster, stops the manager (never an empty start).
fn recover(
    dir: &std::path::Path,
    core_config: converge_core::cluster::Config,
    policy: Box<dyn converge_core::cluster::policy::ClusterPolicy>,
    grace: std::time::Duration,
    events_in_memory: usize,
) -> Result<Started> {
    use prost::Message;
    let mut store = Sqlite::open(dir)?;
    let path = store.location();
    let got = store.load(events_in_memory, core_config.keep_finished)?;
    if got.is_empty() {
        info!(%path, "state store is empty: a new cluster");
        // Nothing to restore but the event log's name, kept from the first start on.
        let events = events::EventLog::recovered(
            Vec::new(),
            got.next_event_seq,
            events_in_memory,
            got.event_log,
        );
        return Ok(Started {
            core: Core::new(core_config, policy),
            store: Some(Box::new(store)),
            restored: Some(actor::Restored {
                specs: actor::Specs::default(),
                events,
                job_states: Vec::new(),
            }),
        });
    }
    let bad = |why: String| Error::Recovery {
        path: path.clone(),
        why,
    };
    // Only the jobs the core will hold come back (`Store::load`), and so only their specs.
    let mut specs = actor::Specs::default();
    for (id, bytes) in got.specs {
        specs
            .insert_encoded(id.clone().into(), bytes)
            .map_err(|e| bad(format!("the spec of job {id} cannot be decoded: {e}")))?;
    }
    let mut history = Vec::with_capacity(got.events.len());
    for e in got.events {
        history.push(
            pb::Event::decode(e.bytes.as_slice())
                .map_err(|err| bad(format!("event {} cannot be decoded: {err}", e.seq)))?,
        );
    }
    let (jobs, workers) = (got.saved.jobs.len(), got.saved.workers.len());
    let live = got.saved.jobs.iter().filter(|j| !j.is_terminal()).count();
    let now = actor::now();
    let core = Core::from_saved(core_config, policy, got.saved, now, grace.as_secs_f64())
        .map_err(|e| bad(e.to_string()))?;
    info!(
        %path, jobs, live, workers, next_event = got.next_event_seq, grace_s = grace.as_secs_f64(),
        "recovered the cluster from the state store; waiting for the agents to register again"
    );
    let restored = actor::Restored {
        specs,
        events: events::EventLog::recovered(
            history,
            got.next_event_seq,
            events_in_memory,
            got.event_log,
        ),
        job_states: got.job_states,
    };
    Ok(Started {
        core,
        store: Some(Box::new(store)),
        restored: Some(restored),
    })
}

/// Plain TCP connections as the server takes them, with Nagle's algorithm off, as tonic's own
/// listener and the TLS listener (`converge_messenger::tls`) set it. `serve_with_incoming`
/// leaves a socket as it comes: an answer written in more than one piece then waited for the
/// client's delayed ACK, and a GetJob at rest took 43 ms where it takes under one
/// (`docs/performance.md`, "Answers that waited for an ACK").
fn plain_incoming(listener: TcpListener) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true))
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use tokio::net::{TcpListener, TcpStream};

    #[tokio::test]
    async fn plain_connections_are_taken_with_nagles_algorithm_off() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let incoming = super::plain_incoming(listener);
        tokio::pin!(incoming);
        let _client = TcpStream::connect(addr).await.unwrap();
        let accepted = incoming.next().await.unwrap().unwrap();
        assert!(
            accepted.nodelay().unwrap(),
            "an accepted connection has Nagle's algorithm on: small answers wait for an ACK"
        );
    }
}
