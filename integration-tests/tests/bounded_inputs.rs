//! Inputs are bounded and refused naming what to fix, over real gRPC (issue 15): a 10 MB
//! environment value is refused by validation as `spec.env` (not by the decoder's size limit),
//! and nothing is created.

use converge_integration_tests::{TestManager, raw_agent_stream, raw_agent_stream_as};
use converge_messenger::pb;
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ten_megabyte_env_value_is_refused_naming_spec_env() -> anyhow::Result<()> {
    let manager = TestManager::start(|_| {}).await?;
    let mut client = manager.control().await?.max_encoding_message_size(64 << 20);
    let mut spec = converge_integration_tests::one_core_spec();
    spec.env.insert("DATA".into(), "x".repeat(10 << 20));
    let err = client
        .submit_job(pb::SubmitJobRequest { spec: Some(spec) })
        .await
        .expect_err("refused");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().starts_with("spec.env: entry `DATA`"),
        "{}",
        err.message()
    );
    let jobs = client
        .list_jobs(pb::ListJobsRequest::default())
        .await?
        .into_inner()
        .jobs;
    assert!(jobs.is_empty(), "nothing created: {jobs:?}");
    manager.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_streams_are_capped_and_freed_when_a_watcher_goes() -> anyhow::Result<()> {
    let manager = TestManager::start(|c| c.max_watchers = 2).await?;
    let mut client = manager.control().await?;
    let watch = |mut c: pb::control_service_client::ControlServiceClient<
        tonic::transport::Channel,
    >| async move { c.watch_events(pb::WatchEventsRequest::default()).await };
    let first = watch(client.clone()).await?;
    let _second = watch(client.clone()).await?;
    let e = watch(client.clone())
        .await
        .expect_err("a third is over the cap");
    assert_eq!(e.code(), Code::ResourceExhausted);
    assert!(e.message().contains("--max-watchers"), "{}", e.message());
    // The first watcher leaves: its slot comes back.
    drop(first);
    converge_integration_tests::eventually(
        std::time::Duration::from_secs(10),
        "a slot to be free again",
        || {
            let c = client.clone();
            async move { Ok(watch(c).await.ok().map(|_| ())) }
        },
    )
    .await?;
    client.list_jobs(pb::ListJobsRequest::default()).await?;
    manager.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_caller_has_its_own_request_rate() -> anyhow::Result<()> {
    let dir = converge_integration_tests::tempfile_dir("rate")?;
    let file = dir.path().join("tokens");
    std::fs::write(
        &file,
        "busy-caller-0123456789 viewer busy\nquiet-caller-0123456789 viewer quiet\n",
    )?;
    let manager = TestManager::start(|c| {
        c.tokens = Some(file.clone());
        c.rate_limit = std::num::NonZeroU32::new(5);
    })
    .await?;
    let channel = tonic::transport::Endpoint::from_shared(manager.endpoint())?
        .connect()
        .await?;
    let client = |token: &'static str| {
        pb::control_service_client::ControlServiceClient::with_interceptor(
            channel.clone(),
            move |mut r: tonic::Request<()>| {
                r.metadata_mut()
                    .insert("authorization", format!("Bearer {token}").parse().unwrap());
                Ok(r)
            },
        )
    };
    let mut busy = client("busy-caller-0123456789");
    // 5 a second with bursts of 10: a quick run of calls is cut off within a dozen.
    let mut refused = None;
    for i in 0..20 {
        if let Err(e) = busy.list_jobs(pb::ListJobsRequest::default()).await {
            refused = Some((i, e));
            break;
        }
    }
    let (i, e) = refused.expect("the busy caller is held back");
    assert!((10..=12).contains(&i), "refused after {i} calls");
    assert_eq!(e.code(), Code::ResourceExhausted);
    assert!(
        e.message().starts_with("busy is over its request rate"),
        "{}",
        e.message()
    );
    // Another caller is not.
    client("quiet-caller-0123456789")
        .list_jobs(pb::ListJobsRequest::default())
        .await?;
    manager.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_id_that_is_not_a_uuid_is_invalid_and_an_unknown_one_not_found() -> anyhow::Result<()>
{
    let manager = TestManager::start(|_| {}).await?;
    let mut client = manager.control().await?;
    for id in ["not-a-job", "../etc/passwd"] {
        let e = client
            .get_job(pb::GetJobRequest {
                job_id: id.into(),
                include_progress: false,
            })
            .await
            .expect_err("refused");
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().starts_with("job_id: `"), "{}", e.message());
        let e = client
            .cancel_job(pb::CancelJobRequest { job_id: id.into() })
            .await
            .expect_err("refused");
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().contains("is not a job id"), "{}", e.message());
    }
    let e = client
        .get_job(pb::GetJobRequest {
            job_id: "3f2b8a2e-8f1c-4c1e-9a43-2d1f0c9b7e11".into(),
            include_progress: false,
        })
        .await
        .expect_err("no such job");
    assert_eq!(e.code(), Code::NotFound);
    manager.stop().await;
    Ok(())
}

/// The same agent process (one instance id) on a new connection: the old stream is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_stream_of_a_worker_closes_the_older_one() -> anyhow::Result<()> {
    let manager = TestManager::start(|_| {}).await?;
    let register = converge_integration_tests::ScriptedAgent::register("w1", 1.0);
    let (old_tx, mut old, _) = raw_agent_stream_as(&manager.endpoint(), register.clone()).await?;
    let (new_tx, new, _) = raw_agent_stream_as(&manager.endpoint(), register).await?;
    let ended = tokio::time::timeout(std::time::Duration::from_secs(10), old.message())
        .await?
        .expect_err("the old stream ends with a status");
    assert_eq!(ended.code(), Code::Aborted);
    assert!(
        ended.message().contains("replaced by a newer stream"),
        "{}",
        ended.message()
    );
    // What an agent's session takes for another agent registered with its worker id (and
    // says so, at error level).
    assert!(converge_messenger::agent::SessionError::Stream(ended).is_replaced());
    // Streams left open would hold the server's graceful stop.
    drop((old_tx, old, new_tx, new));
    manager.stop().await;
    Ok(())
}

/// A second agent process with a connected worker's id (another instance id) is refused,
/// naming the flag to change, and the first keeps its stream: its heartbeat is still
/// acknowledged there. Before, each took the other's stream at every reconnect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_agent_process_is_refused_and_the_first_keeps_its_stream() -> anyhow::Result<()> {
    // Heard within two heartbeats is connected: 5 s heartbeats leave the test that long.
    let manager =
        TestManager::start(|c| c.heartbeat_interval = std::time::Duration::from_secs(5)).await?;
    let (old_tx, mut old, _) = raw_agent_stream(&manager.endpoint(), "w1").await?;
    let refused = raw_agent_stream(&manager.endpoint(), "w1")
        .await
        .expect_err("the second process is refused");
    let status = refused
        .downcast_ref::<tonic::Status>()
        .unwrap_or_else(|| panic!("a status: {refused:#}"))
        .clone();
    assert_eq!(status.code(), Code::AlreadyExists, "{status:?}");
    assert!(
        status.message().contains("--worker-id"),
        "{}",
        status.message()
    );
    // What the agent's session logs as such (and retries: it passes once the other ends).
    assert!(converge_messenger::agent::SessionError::Stream(status).is_second_agent());
    old_tx
        .send(pb::AgentMessage {
            kind: Some(pb::agent_message::Kind::Heartbeat(pb::Heartbeat {
                seq: 7,
                ..Default::default()
            })),
        })
        .await?;
    match old.message().await?.and_then(|m| m.kind) {
        Some(pb::manager_message::Kind::Ack(a)) => assert_eq!(a.heartbeat_seq, 7),
        other => panic!("the first stream ended or was answered otherwise: {other:?}"),
    }
    drop((old_tx, old));
    manager.stop().await;
    Ok(())
}

/// A new agent process whose worker's old stream has gone silent (its host crashed, say)
/// takes over: refused while the old one was heard from lately, as an agent retries, it
/// is taken once the old one has missed two heartbeats, and the old stream is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_agent_process_takes_over_a_silent_stream() -> anyhow::Result<()> {
    let manager =
        TestManager::start(|c| c.heartbeat_interval = std::time::Duration::from_millis(200))
            .await?;
    // Registered, then silent: no heartbeat is ever sent on it.
    let (old_tx, mut old, _) = raw_agent_stream(&manager.endpoint(), "w1").await?;
    let register = converge_integration_tests::ScriptedAgent::register("w1", 1.0);
    let endpoint = manager.endpoint();
    let (new_tx, new, _) = converge_integration_tests::eventually(
        std::time::Duration::from_secs(10),
        "the new process's registration to be taken",
        || {
            let (endpoint, register) = (endpoint.clone(), register.clone());
            async move { Ok(raw_agent_stream_as(&endpoint, register).await.ok()) }
        },
    )
    .await?;
    let ended = old.message().await.expect_err("the old stream is closed");
    assert_eq!(ended.code(), Code::Aborted, "{ended:?}");
    drop((old_tx, old, new_tx, new));
    manager.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_agent_is_read_no_faster_than_its_rate_and_others_get_through()
-> anyhow::Result<()> {
    const RATE: u32 = 50;
    let metrics = converge_integration_tests::free_local_addr();
    let manager = TestManager::start(|c| {
        c.agent_message_rate = std::num::NonZeroU32::new(RATE);
        c.metrics_listen = Some(metrics);
    })
    .await?;
    let (flood_tx, flood_replies, _) = raw_agent_stream(&manager.endpoint(), "flood").await?;
    let (quiet_tx, quiet_replies, _) = raw_agent_stream(&manager.endpoint(), "quiet").await?;
    let received = |text: &str, kind: &str| {
        converge_integration_tests::metric_value(
            text,
            "converge_manager_messages_received_total",
            &format!("kind=\"{kind}\""),
        )
        .unwrap_or(0.0)
    };
    // The flooder writes 300 messages as fast as its stream takes: unlimited, they would all
    // be read within a fraction of a second.
    let began = std::time::Instant::now();
    let flood = tokio::spawn(async move {
        for _ in 0..300 {
            let usage = pb::agent_message::Kind::Usage(pb::UsageBatch::default());
            if flood_tx
                .send(pb::AgentMessage { kind: Some(usage) })
                .await
                .is_err()
            {
                break;
            }
        }
    });
    // Meanwhile the other agent's twenty messages all arrive.
    for _ in 0..20 {
        let progress = pb::agent_message::Kind::Progress(pb::ProgressBatch::default());
        quiet_tx
            .send(pb::AgentMessage {
                kind: Some(progress),
            })
            .await?;
    }
    let scrape = |kind: &'static str, at_least: f64| async move {
        converge_integration_tests::eventually(
            std::time::Duration::from_secs(30),
            &format!("{at_least} {kind} messages to be read"),
            move || async move {
                let text = converge_integration_tests::scrape_metrics(metrics, false).await?;
                Ok((received(&text, kind) >= at_least).then_some(text))
            },
        )
        .await
    };
    let text = scrape("progress", 20.0).await?;
    assert!(
        received(&text, "usage") < 300.0,
        "the quiet agent was read while the flood was still held back"
    );
    // The flood is read at RATE a second after one second's burst: all of it takes at least
    // (300 - RATE) / RATE seconds. (A lower bound a slow machine only exceeds; without the
    // limit it all goes in a fraction of a second.)
    scrape("usage", 300.0).await?;
    let least = (300.0 - f64::from(RATE)) / f64::from(RATE);
    assert!(
        began.elapsed().as_secs_f64() >= least * 0.9,
        "the flooding agent's 300 messages were all read within {:?}, faster than its rate allows",
        began.elapsed()
    );
    flood.abort();
    // Streams left open would hold the server's graceful stop.
    drop((flood_replies, quiet_tx, quiet_replies));
    let _ = flood.await;
    manager.stop().await;
    Ok(())
}
