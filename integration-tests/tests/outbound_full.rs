//! The manager's outbound queue to one agent overflows (`OUTBOUND_CAPACITY`): the actor
//! gives the link up, and must end its stream, so that the agent reconnects and registers
//! again. Left open, the stream went on carrying the agent's heartbeats and exits, each
//! refused as a stale stream's, while the worker was declared lost. No Docker: a raw agent
//! over loopback gRPC.

use std::time::Duration;

use converge_integration_tests::{ScriptedAgent, TestManager};
use converge_messenger::pb;
use converge_messenger::pb::agent_message::Kind;
use converge_messenger::pb::agent_service_client::AgentServiceClient;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_outbound_queue_overflowed_is_ended_so_its_agent_reconnects()
-> anyhow::Result<()> {
    let manager = TestManager::start(|_| {}).await?;
    let mut control = manager.control().await?;
    let mut events = control
        .watch_events(pb::WatchEventsRequest::default())
        .await?
        .into_inner();

    // A raw agent with a small receive window, so that what it does not read backs up.
    let channel = tonic::transport::Endpoint::from_shared(manager.endpoint())?
        .initial_stream_window_size(Some(16 * 1024))
        .connect()
        .await?;
    let mut client = AgentServiceClient::new(channel);
    let (tx, rx) = mpsc::channel::<pb::AgentMessage>(1024);
    let send = |k: Kind| pb::AgentMessage { kind: Some(k) };
    tx.send(send(Kind::Register(ScriptedAgent::register("w1", 1000.0))))
        .await?;
    let mut inbound = client.connect(ReceiverStream::new(rx)).await?.into_inner();
    let first = inbound.message().await?.and_then(|m| m.kind);
    assert!(matches!(
        first,
        Some(pb::manager_message::Kind::Registered(_))
    ));
    // Heartbeats all along, on the one stream.
    let hb = tx.clone();
    tokio::spawn(async move {
        let mut seq = 0;
        loop {
            seq += 1;
            let m = pb::AgentMessage {
                kind: Some(Kind::Heartbeat(pb::Heartbeat {
                    seq,
                    ..Default::default()
                })),
            };
            if hb.send(m).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });

    // Job 0 runs on w1.
    let spec = |cpus| pb::JobSpec {
        image: "trainer".into(),
        cpus,
        ..Default::default()
    };
    let j0 = control
        .submit_job(pb::SubmitJobRequest {
            spec: Some(spec(1.0)),
        })
        .await?
        .into_inner()
        .job_id;
    let start = loop {
        match inbound.message().await?.and_then(|m| m.kind) {
            Some(pb::manager_message::Kind::Command(c)) => break c,
            _ => continue,
        }
    };
    assert_eq!(start.job_id, j0);
    tx.send(send(Kind::Result(pb::CommandResult {
        command_id: start.command_id,
        job_id: j0.clone(),
        epoch: 1,
        ok: true,
        detail: Some(pb::command_result::Detail::Started(pb::Started {
            container_id: "c0".into(),
            from_checkpoint: false,
        })),
        ..Default::default()
    })))
    .await?;
    // Running on w1 (the wait fails otherwise).
    tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let e = events.message().await?.expect("event stream open");
            if e.job_id == j0 && e.to_state == pb::JobState::Running as i32 {
                return anyhow::Ok(());
            }
        }
    })
    .await??;

    // The agent reads nothing for a moment (a slow agent) while many jobs land on it.
    for _ in 0..1500 {
        control
            .submit_job(pb::SubmitJobRequest {
                spec: Some(spec(0.01)),
            })
            .await?;
    }
    let overflowed = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let e = events.message().await?.expect("event stream open");
            if e.worker_id == "w1" && e.reason.contains("send failed") {
                return anyhow::Ok(e.reason);
            }
        }
    })
    .await??;
    eprintln!("manager: {overflowed}");

    // Told at once: its stream ends without the commands still queued for it (it used to
    // end only once the agent had read all of them, 1,000 and more).
    let mut delivered = 0;
    let end = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match inbound.message().await {
                Ok(Some(_)) => delivered += 1,
                Ok(None) => return "ended".to_string(),
                Err(s) => return format!("ended with {s}"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| "still open after 20 s".into());
    assert!(
        end.starts_with("ended") && delivered < OUTBOUND_CAPACITY,
        "the stream given up {end} after {delivered} more messages"
    );
    Ok(())
}

/// `converge_messenger::manager`'s queue per agent stream.
const OUTBOUND_CAPACITY: usize = 1024;
