//! Worker liveness over real gRPC: a silent agent is marked lost after N missed heartbeats
//! (and its job with it), while an agent that keeps heartbeating is not.

use std::time::Duration;

use converge_integration_tests::{ScriptedAgent, TestManager, eventually};
use converge_messenger::pb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_agent_is_marked_lost_after_missed_heartbeats() -> anyhow::Result<()> {
    let manager = TestManager::start(|c| {
        c.heartbeat_interval = Duration::from_millis(200);
        c.lost_after = 3;
    })
    .await?;
    let endpoint = manager.endpoint();
    // Registers, then never heartbeats: its stream stays open, it just goes quiet.
    let mut silent =
        ScriptedAgent::connect(&endpoint, "silent", 1.0, Duration::from_secs(3600)).await?;
    let mut client = manager.control().await?;
    let mut events = client
        .watch_events(pb::WatchEventsRequest::default())
        .await?
        .into_inner();
    // A job lands on the silent worker (the only one so far) and is told to start.
    let job = client
        .submit_job(pb::SubmitJobRequest {
            spec: Some(converge_integration_tests::one_core_spec()),
        })
        .await?
        .into_inner()
        .job_id;
    let start = tokio::time::timeout(Duration::from_secs(5), silent.commands.recv())
        .await?
        .expect("a start command");
    assert!(matches!(start.action, Some(pb::command::Action::Start(_))));
    assert_eq!((start.job_id.as_str(), start.epoch), (job.as_str(), 1));

    // A second, healthy worker joins after the first went quiet.
    let _healthy =
        ScriptedAgent::connect(&endpoint, "healthy", 1.0, Duration::from_millis(100)).await?;

    let lost = eventually(
        Duration::from_secs(10),
        "the silent worker to be lost",
        || {
            let mut c = client.clone();
            async move {
                let ws = c
                    .list_workers(pb::ListWorkersRequest {})
                    .await?
                    .into_inner()
                    .workers;
                Ok(ws
                    .iter()
                    .find(|w| w.id == "silent" && w.state == pb::WorkerState::Lost as i32)
                    .cloned()
                    .map(|_| ws))
            }
        },
    )
    .await?;
    let healthy = lost
        .iter()
        .find(|w| w.id == "healthy")
        .expect("healthy worker listed");
    assert_eq!(
        healthy.state,
        pb::WorkerState::Ready as i32,
        "a heartbeating worker was marked lost"
    );

    // The loss is an event naming the missed heartbeats, and the job is lost with its worker.
    let mut saw_worker_lost = false;
    let mut saw_job_lost = false;
    while !(saw_worker_lost && saw_job_lost) {
        let e = tokio::time::timeout(Duration::from_secs(5), events.message())
            .await??
            .expect("event stream open");
        if e.kind == pb::EventKind::WorkerState as i32
            && e.worker_id == "silent"
            && e.worker_state == pb::WorkerState::Lost as i32
        {
            assert!(e.reason.contains("3 missed"), "reason: {}", e.reason);
            saw_worker_lost = true;
        }
        if e.kind == pb::EventKind::JobState as i32
            && e.job_id == job
            && e.to_state == pb::JobState::Lost as i32
        {
            assert!(e.reason.contains("silent"), "reason: {}", e.reason);
            saw_job_lost = true;
        }
        assert!(
            !(e.kind == pb::EventKind::WorkerState as i32
                && e.worker_id == "healthy"
                && e.worker_state == pb::WorkerState::Lost as i32),
            "the healthy worker was marked lost"
        );
    }
    let j = client
        .get_job(pb::GetJobRequest {
            job_id: job.clone(),
            include_progress: false,
        })
        .await?
        .into_inner();
    assert_eq!(j.state, pb::JobState::Lost as i32);
    manager.stop().await;
    Ok(())
}

/// A lost worker's job started elsewhere leaves its container there told to stop: the worker
/// lists it as stopping, and the cores it requested stay counted until the worker comes back
/// and stops it. A worker of no jobs showed cores requested, with nothing that said why (a
/// new user's walk).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_workers_restarted_job_is_listed_as_stopping_there() -> anyhow::Result<()> {
    let manager = TestManager::start(|c| {
        c.heartbeat_interval = Duration::from_millis(200);
        c.lost_after = 3;
        c.recover_lost_after = Duration::from_millis(300);
    })
    .await?;
    let endpoint = manager.endpoint();
    let mut silent =
        ScriptedAgent::connect(&endpoint, "silent", 1.0, Duration::from_secs(3600)).await?;
    let mut client = manager.control().await?;
    let spec = converge_integration_tests::one_core_spec();
    let cpus = spec.cpus;
    let job = (client
        .submit_job(pb::SubmitJobRequest { spec: Some(spec) })
        .await?)
        .into_inner()
        .job_id;
    silent.answer_start(&job, "c1").await?;
    let mut healthy =
        ScriptedAgent::connect(&endpoint, "healthy", 1.0, Duration::from_millis(100)).await?;
    // Once the silent worker is lost and the wait for it is over, the job starts again here.
    let restart = tokio::time::timeout(Duration::from_secs(10), healthy.commands.recv())
        .await?
        .expect("a start command");
    assert!(matches!(
        restart.action,
        Some(pb::command::Action::Start(_))
    ));
    assert_eq!(restart.job_id, job);

    let ws = client
        .list_workers(pb::ListWorkersRequest {})
        .await?
        .into_inner()
        .workers;
    let of = |id: &str| ws.iter().find(|w| w.id == id).expect("listed").clone();
    let (silent_w, healthy_w) = (of("silent"), of("healthy"));
    assert_eq!(silent_w.state, pb::WorkerState::Lost as i32, "{silent_w:?}");
    assert!(silent_w.job_ids.is_empty(), "{silent_w:?}");
    assert_eq!(silent_w.stopping_job_ids, vec![job.clone()], "{silent_w:?}");
    assert_eq!(silent_w.cpu_requested, cpus, "{silent_w:?}");
    assert_eq!(healthy_w.job_ids, vec![job.clone()], "{healthy_w:?}");
    assert!(healthy_w.stopping_job_ids.is_empty(), "{healthy_w:?}");
    manager.stop().await;
    Ok(())
}
