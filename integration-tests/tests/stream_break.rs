//! A container's exit written to a stream that breaks before the manager got it (held in the
//! network, then lost with the connection). The agent's session keeps it until the manager
//! acknowledges it and sends it again after reconnecting; before, the manager never learnt
//! that the job had finished: its agent listed the container as exited, then removed it, and
//! the next registration had the finished job restarted. No Docker: a scripted agent (a real
//! session) behind a TCP proxy that the test holds and cuts.

use std::time::Duration;

use converge_integration_tests::proxy::Proxy;
use converge_integration_tests::{
    ScriptedAgent, TestManager, eventually, raw_agent_stream, unique,
};
use converge_messenger::pb::{self, agent_message::Kind};

/// The next state change of `job`, within 15 s.
async fn next_state(
    events: &mut tonic::Streaming<pb::Event>,
    job: &str,
) -> anyhow::Result<(pb::JobState, String)> {
    loop {
        let e = tokio::time::timeout(Duration::from_secs(15), events.message())
            .await
            .map_err(|_| anyhow::anyhow!("no state change of {job} within 15 s"))??
            .ok_or_else(|| anyhow::anyhow!("the event stream ended"))?;
        if e.kind == pb::EventKind::JobState as i32 && e.job_id == job {
            return Ok((e.to_state(), e.reason));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exit_lost_with_its_stream_is_sent_again_and_the_job_completes() -> anyhow::Result<()> {
    let manager = TestManager::start(|_| {}).await?;
    let proxy = Proxy::start(manager.addr).await?;
    let mut agent =
        ScriptedAgent::connect(&proxy.endpoint(), "w1", 1.0, Duration::from_millis(100)).await?;
    let mut client = manager.control().await?;
    let mut events = client
        .watch_events(pb::WatchEventsRequest::default())
        .await?
        .into_inner();
    let job = client
        .submit_job(pb::SubmitJobRequest {
            spec: Some(converge_integration_tests::one_core_spec()),
        })
        .await?
        .into_inner()
        .job_id;
    let container = unique("container");
    agent.answer_start(&job, &container).await?;
    while next_state(&mut events, &job).await?.0 != pb::JobState::Running {}

    // The job finishes; its exit goes out on a stream the network holds, and then drops.
    proxy.hold();
    agent
        .outbox
        .send(Kind::Exited(pb::ContainerExited {
            job_id: job.clone(),
            epoch: 1,
            container_id: container.clone(),
            exit_code: 0,
            done: true,
            ..Default::default()
        }))
        .await;
    eventually(Duration::from_secs(5), "the exit to be held", || async {
        Ok(proxy.holds(container.as_bytes()).then_some(()))
    })
    .await?;
    // As the real agent does until the manager has the exit: its container is listed, exited.
    agent.report(vec![pb::ContainerReport {
        job_id: job.clone(),
        epoch: 1,
        container_id: container.clone(),
        state: pb::ContainerState::Exited as i32,
        exit_code: Some(0),
        last_step: None,
        exit: None,
    }]);
    proxy.cut();

    let (state, why) = next_state(&mut events, &job).await?;
    assert_eq!(
        state,
        pb::JobState::Completed,
        "the exit sent again after the reconnect ends the job: {why}"
    );
    // And nothing starts it again.
    while let Ok(c) = agent.commands.try_recv() {
        assert!(
            !matches!(c.action, Some(pb::command::Action::Start(_))),
            "a finished job was started again: {c:?}"
        );
    }
    Ok(())
}

/// The manager says at registration that it acknowledges, and answers each heartbeat with an
/// ack of its number, through its store's commit path (a real SQLite store). That the ack
/// waits for the commit is not observable from here. A manager that did not acknowledge
/// would leave its agents re-sending everything after every reconnect, and waiting to remove
/// exited containers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manager_acknowledges_each_heartbeat() -> anyhow::Result<()> {
    let state = converge_integration_tests::tempfile_dir("acks")?;
    let dir = state.path().to_path_buf();
    let manager = TestManager::start(move |c| c.state_dir = Some(dir)).await?;
    let (tx, mut replies, registered) = raw_agent_stream(&manager.endpoint(), "w1").await?;
    assert!(
        registered.acknowledges,
        "Registered must say the manager acknowledges: {registered:?}"
    );
    for seq in [41, 42] {
        tx.send(pb::AgentMessage {
            kind: Some(Kind::Heartbeat(pb::Heartbeat {
                seq,
                ..Default::default()
            })),
        })
        .await?;
        let reply = tokio::time::timeout(Duration::from_secs(5), replies.message())
            .await
            .map_err(|_| anyhow::anyhow!("no ack of heartbeat {seq} within 5 s"))??;
        match reply.and_then(|m| m.kind) {
            Some(pb::manager_message::Kind::Ack(a)) => assert_eq!(a.heartbeat_seq, seq),
            other => panic!("expected the ack of heartbeat {seq}, got {other:?}"),
        }
    }
    Ok(())
}
