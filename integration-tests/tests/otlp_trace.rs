//! One job is one trace across the manager and its agents (issue 8), checked at a real OTLP
//! receiver: the OpenTelemetry collector's gRPC `TraceService` on loopback, fed by the real
//! exporters of a manager and agents running in this process on real Docker. First a job's
//! submission, placement and start; then another job's move by a drain (save on one agent,
//! restore on the other).
//!
//! The process has one global subscriber, so this file holds one test; the telemetry routes
//! each component's spans to its own `service.name`, as the two binaries would report them.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use converge_integration_tests::{
    TRAINER_IMAGE, TestAgent, TestManager, eventually, job, require_docker, tempfile_dir,
    trainer_spec, unique, wait_for_workers,
};
use converge_messenger::pb::{self, JobState};
use converge_messenger::telemetry::{LogFormat, SpanExport, Telemetry};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;

/// A span as received, with the service that sent it.
#[derive(Clone, Debug)]
struct Received {
    service: String,
    span: Span,
}

impl Received {
    fn attr(&self, key: &str) -> Option<String> {
        attr(&self.span.attributes, key)
    }
}

fn attr(attrs: &[KeyValue], key: &str) -> Option<String> {
    let v = attrs
        .iter()
        .find(|kv| kv.key == key)?
        .value
        .as_ref()?
        .value
        .as_ref()?;
    Some(match v {
        Value::StringValue(s) => s.clone(),
        Value::IntValue(i) => i.to_string(),
        Value::BoolValue(b) => b.to_string(),
        Value::DoubleValue(d) => d.to_string(),
        other => format!("{other:?}"),
    })
}

/// The receiving end: stores every span of every export request.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<Received>>>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().expect("receiver lock");
        for rs in request.into_inner().resource_spans {
            let service = rs
                .resource
                .as_ref()
                .and_then(|r| attr(&r.attributes, "service.name"))
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for span in ss.spans {
                    spans.push(Received {
                        service: service.clone(),
                        span,
                    });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl Receiver {
    fn snapshot(&self) -> Vec<Received> {
        self.spans.lock().expect("receiver lock").clone()
    }
}

/// The one span named `name` from `service` whose attributes include every `(key, value)`.
fn find<'a>(
    spans: &'a [Received],
    service: &str,
    name: &str,
    attrs: &[(&str, &str)],
) -> Option<&'a Received> {
    spans.iter().find(|r| {
        r.service == service
            && r.span.name == name
            && attrs.iter().all(|(k, v)| r.attr(k).as_deref() == Some(*v))
    })
}

/// The spans of one trace in start order, for a person reading the test's output.
fn print_trace(spans: &[Received], trace_id: &[u8]) {
    let mut in_trace: Vec<&Received> = spans
        .iter()
        .filter(|r| r.span.trace_id == trace_id)
        .collect();
    in_trace.sort_by_key(|r| r.span.start_time_unix_nano);
    println!("trace {}", hex(trace_id));
    for r in in_trace {
        println!(
            "{:>16} {:<18} span {} parent {}",
            r.service,
            r.span.name,
            hex(&r.span.span_id),
            hex(&r.span.parent_span_id)
        );
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_jobs_placement_start_and_migration_are_one_trace_across_manager_and_agents() -> Result<()>
{
    require_docker(&[TRAINER_IMAGE]);

    // A real OTLP/gRPC receiver on loopback.
    let receiver = Receiver::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let endpoint = format!("http://{}", listener.local_addr()?);
    let stop_receiver = CancellationToken::new();
    let server = tokio::spawn({
        let (receiver, stop) = (receiver.clone(), stop_receiver.clone());
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(receiver))
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), stop.cancelled_owned())
    });

    // The exporters both binaries use, pointed at it; each component reports as its service.
    let export = SpanExport::to_endpoint(&endpoint, "converge-test")
        .service(
            "converge-manager",
            &["converge_manager", "converge_messenger::manager"],
        )
        .service(
            "converge-agent",
            &["converge_agent", "converge_messenger::agent"],
        )
        .batch_delay(Duration::from_millis(200));
    let telemetry = Telemetry::new(LogFormat::Text)
        .default_filter("warn")
        .test_writer()
        .export(Some(export))
        .init()
        .context("this test installs the process's subscriber; run it in its own process")?;

    let checkpoints = tempfile_dir("otlp")?;
    let manager = TestManager::start(|c| c.heartbeat_interval = Duration::from_millis(250)).await?;
    let worker = unique("otlp");
    let agent = TestAgent::start(&manager.endpoint(), &worker, 1.0, checkpoints.path());
    let mut client = manager.control().await?;
    wait_for_workers(&client, 1).await?;

    let job_id = client
        .submit_job(pb::SubmitJobRequest {
            spec: Some(trainer_spec("logreg-wine", 60, 10)),
        })
        .await?
        .into_inner()
        .job_id;
    eventually(Duration::from_secs(120), "the job to complete", || {
        let (mut c, id) = (client.clone(), job_id.clone());
        async move {
            let j = job(&mut c, &id, false).await?;
            if j.state == JobState::Failed as i32 {
                bail!("job failed: {}", j.reason);
            }
            Ok((j.state == JobState::Completed as i32).then_some(()))
        }
    })
    .await?;

    // The exporters batch; push what they hold (blocking: the export runs on the runtime).
    let telemetry = Arc::new(telemetry);
    let spans = eventually(
        Duration::from_secs(20),
        "the job's spans at the receiver",
        || {
            let (t, r, id) = (telemetry.clone(), receiver.clone(), job_id.clone());
            async move {
                tokio::task::spawn_blocking(move || t.force_flush()).await?;
                let spans = r.snapshot();
                let have_agent = find(&spans, "converge-agent", "container_start", &[]).is_some()
                    && find(&spans, "converge-agent", "command", &[("job", &id)]).is_some();
                let have_manager =
                    find(&spans, "converge-manager", "placement", &[("job", &id)]).is_some();
                Ok((have_agent && have_manager).then_some(spans))
            }
        },
    )
    .await?;

    let id = job_id.as_str();
    let submit = find(&spans, "converge-manager", "submit", &[("job", id)])
        .context("the manager's submit span")?;
    let placement = find(
        &spans,
        "converge-manager",
        "placement",
        &[("job", id), ("policy", "spread"), ("worker", &worker)],
    )
    .context("the manager's placement span, naming policy and worker")?;
    let send = find(
        &spans,
        "converge-manager",
        "send_command",
        &[("job", id), ("action", "start")],
    )
    .context("the manager's span that sent Start")?;
    let command = find(
        &spans,
        "converge-agent",
        "command",
        &[("job", id), ("action", "start")],
    )
    .context("the agent's span for the Start command")?;
    let container_start = spans
        .iter()
        .find(|r| {
            r.service == "converge-agent"
                && r.span.name == "container_start"
                && r.span.parent_span_id == command.span.span_id
        })
        .context("the agent's container_start span under its command span")?;

    print_trace(&spans, &submit.span.trace_id);

    // One trace: the job's submission is its root...
    let trace = hex(&submit.span.trace_id);
    assert!(
        submit.span.parent_span_id.is_empty(),
        "submit is the root: {submit:?}"
    );
    for s in [placement, send, command, container_start] {
        assert_eq!(
            hex(&s.span.trace_id),
            trace,
            "{} ({}) is not in the job's trace",
            s.span.name,
            s.service
        );
    }
    // ...and every step hangs below the one that caused it, across the process boundary.
    assert_eq!(
        placement.span.parent_span_id, submit.span.span_id,
        "placement under submit"
    );
    assert_eq!(
        send.span.parent_span_id, placement.span.span_id,
        "send_command under placement"
    );
    assert_eq!(
        command.span.parent_span_id, send.span.span_id,
        "the agent's command span must be a child of the manager span that sent the command"
    );
    // The placement says what the policy compared.
    let scores = placement.attr("scores").unwrap_or_default();
    assert!(
        scores.contains(&worker),
        "placement scores name the worker: {scores:?}"
    );

    // A migration joins the job's trace too: a second job runs on the first worker, which is
    // drained once a second worker is there.
    let mut spec = trainer_spec("mlp-digits", 6000, 20);
    spec.args.extend(["--size".into(), "2".into()]);
    let moved = client
        .submit_job(pb::SubmitJobRequest { spec: Some(spec) })
        .await?
        .into_inner()
        .job_id;
    eventually(Duration::from_secs(60), "the second job to run", || {
        let (mut c, id) = (client.clone(), moved.clone());
        async move {
            let j = job(&mut c, &id, false).await?;
            Ok((j.state == JobState::Running as i32 && j.step >= 100).then_some(()))
        }
    })
    .await?;
    let worker2 = unique("otlp2");
    let agent2 = TestAgent::start(&manager.endpoint(), &worker2, 1.0, checkpoints.path());
    eventually(
        Duration::from_secs(20),
        "the second worker to register",
        || {
            let mut c = client.clone();
            async move {
                let n = c
                    .list_workers(pb::ListWorkersRequest {})
                    .await?
                    .into_inner()
                    .workers
                    .len();
                Ok((n == 2).then_some(()))
            }
        },
    )
    .await?;
    client
        .drain_worker(pb::DrainWorkerRequest {
            worker_id: worker.clone(),
        })
        .await?;
    eventually(
        Duration::from_secs(60),
        "the job to resume on the second worker",
        || {
            let (mut c, id) = (client.clone(), moved.clone());
            async move {
                let j = job(&mut c, &id, false).await?;
                Ok((j.migrations == 1 && j.state == JobState::Running as i32).then_some(()))
            }
        },
    )
    .await?;
    client
        .cancel_job(pb::CancelJobRequest {
            job_id: moved.clone(),
        })
        .await?;
    let spans = eventually(Duration::from_secs(20), "the migration's spans", || {
        let (t, r, id) = (telemetry.clone(), receiver.clone(), moved.clone());
        async move {
            tokio::task::spawn_blocking(move || t.force_flush()).await?;
            let spans = r.snapshot();
            let done = find(&spans, "converge-manager", "migration", &[("job", &id)]).is_some()
                && find(
                    &spans,
                    "converge-agent",
                    "command",
                    &[("job", &id), ("action", "start"), ("epoch", "2")],
                )
                .is_some();
            Ok(done.then_some(spans))
        }
    })
    .await?;
    let id = moved.as_str();
    let submit = find(&spans, "converge-manager", "submit", &[("job", id)])
        .context("the second job's submit span")?;
    let migration = find(
        &spans,
        "converge-manager",
        "migration",
        &[("job", id), ("reason", "drain"), ("outcome", "completed")],
    )
    .context("the manager's migration span, completed")?;
    let drain = find(&spans, "converge-manager", "drain", &[("worker", &worker)])
        .context("the manager's drain span")?;
    let child_of = |parent: &Received, service: &str, name: &str, attrs: &[(&str, &str)]| {
        spans
            .iter()
            .find(|r| {
                r.service == service
                    && r.span.name == name
                    && r.span.parent_span_id == parent.span.span_id
                    && attrs.iter().all(|(k, v)| r.attr(k).as_deref() == Some(*v))
            })
            .cloned()
            .with_context(|| format!("{name} ({service}) under {}", parent.span.name))
    };
    let save = child_of(migration, "converge-manager", "migration.save", &[])?;
    let send_save = child_of(
        &save,
        "converge-manager",
        "send_command",
        &[("action", "save")],
    )?;
    let agent_save = child_of(
        &send_save,
        "converge-agent",
        "command",
        &[("action", "save")],
    )?;
    let restore = child_of(migration, "converge-manager", "migration.restore", &[])?;
    let send_start = child_of(
        &restore,
        "converge-manager",
        "send_command",
        &[("action", "start")],
    )?;
    let agent_start = child_of(
        &send_start,
        "converge-agent",
        "command",
        &[("action", "start"), ("epoch", "2")],
    )?;
    let restart = child_of(&agent_start, "converge-agent", "container_start", &[])?;
    print_trace(&spans, &submit.span.trace_id);
    assert_eq!(
        migration.span.parent_span_id, submit.span.span_id,
        "migration under submit"
    );
    for s in [
        &save,
        &send_save,
        &agent_save,
        &restore,
        &send_start,
        &agent_start,
        &restart,
    ] {
        assert_eq!(
            s.span.trace_id, submit.span.trace_id,
            "{} ({}) is not in the moved job's trace",
            s.span.name, s.service
        );
    }
    assert!(
        migration
            .span
            .links
            .iter()
            .any(|l| l.span_id == drain.span.span_id),
        "the migration links to the drain that decided it"
    );

    drop(agent2);
    drop(agent);
    manager.stop().await;
    stop_receiver.cancel();
    let _ = server.await;
    // Flushing happens off the runtime's workers: the exporter needs them.
    if let Ok(t) = Arc::try_unwrap(telemetry) {
        t.shutdown().await;
    }
    Ok(())
}
