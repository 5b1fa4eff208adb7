//! The two faults a user found during drains, on real Docker with real trainer containers:
//! a job cancelled while its drain migration is under way must stay cancelled (it used to be
//! restored on the target), and a draining worker whose agent is killed must be declared lost,
//! and drain again once its agent is back. "Never two incarnations" is read from Docker's own
//! event stream.

use std::time::Duration;

use anyhow::Context;
use converge_integration_tests::{
    DockerEvents, TRAINER_IMAGE, TestAgent, TestManager, containers_of, eventually, job,
    require_docker, tempfile_dir, trainer_spec, unique, unix_nanos, wait_for_workers,
};
use converge_messenger::pb::{self, JobState, WorkerState};
use tonic::transport::Channel;

type Client = pb::control_service_client::ControlServiceClient<Channel>;

/// Long enough to still run when the test acts (cnn-digits, about 1.4 ms a step: some 40 s), short enough to finish within the test.
fn long_job() -> pb::JobSpec {
    trainer_spec("cnn-digits", 30_000, 50)
}

/// A manager, w1 with the job running at step 100 or more, then w2, both registered.
struct Setup {
    manager: TestManager,
    client: Client,
    w1: String,
    a1: TestAgent,
    _a2: TestAgent,
    id: String,
    docker: DockerEvents,
    _checkpoints: converge_integration_tests::TempDir,
}

async fn running_on_w1(prefix: &str) -> anyhow::Result<Setup> {
    require_docker(&[TRAINER_IMAGE]);
    let since = unix_nanos() / 1_000_000_000 - 1;
    let checkpoints = tempfile_dir(prefix)?;
    let manager = TestManager::start(|c| {
        c.heartbeat_interval = Duration::from_millis(250);
        // Recovery elsewhere is not what these tests look at: keep it out of the way.
        c.recover_lost_after = Duration::from_secs(600);
    })
    .await?;
    let (w1, w2) = (
        unique(&format!("it-{prefix}1")),
        unique(&format!("it-{prefix}2")),
    );
    let a1 = TestAgent::start(&manager.endpoint(), &w1, 1.0, checkpoints.path());
    let client = manager.control().await?;
    wait_for_workers(&client, 1).await?;
    let id = client
        .clone()
        .submit_job(pb::SubmitJobRequest {
            spec: Some(long_job()),
        })
        .await?
        .into_inner()
        .job_id;
    let docker = DockerEvents::watch(&id, since)?;
    eventually(Duration::from_secs(60), "the job to run on w1", || {
        let (mut c, id) = (client.clone(), id.clone());
        async move {
            let j = job(&mut c, &id, false).await?;
            Ok((j.state() == JobState::Running && j.step >= 100).then_some(()))
        }
    })
    .await?;
    let a2 = TestAgent::start(&manager.endpoint(), &w2, 1.0, checkpoints.path());
    wait_for_workers(&client, 2).await?;
    Ok(Setup {
        manager,
        client,
        w1,
        a1,
        _a2: a2,
        id,
        docker,
        _checkpoints: checkpoints,
    })
}

/// Waits for the first event of `job_id` that `pred` accepts, from the live stream.
async fn wait_event(
    client: &Client,
    job_id: &str,
    what: &str,
    pred: impl Fn(&pb::Event) -> bool,
) -> anyhow::Result<pb::Event> {
    let mut stream = client
        .clone()
        .watch_events(pb::WatchEventsRequest {
            job_id: job_id.into(),
            from_seq: 1,
        })
        .await?
        .into_inner();
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(e) = stream.message().await? {
            if pred(&e) {
                return Ok(e);
            }
        }
        anyhow::bail!("the event stream ended before {what}")
    })
    .await
    .with_context(|| format!("waiting for {what}"))?
}

/// Cancel at two points of a drain's move: right after the drain (the source is saving) and
/// once the save is done (the restore has been sent to the target). Either way the job stays
/// CANCELLED, no container of it is started after the cancel, none is left, and Docker never
/// ran two at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_during_drain_migration_stays_cancelled() -> anyhow::Result<()> {
    for when in ["saving", "restoring"] {
        let s = running_on_w1(&format!("cd{}", &when[..1])).await?;
        let mut client = s.client.clone();
        client
            .drain_worker(pb::DrainWorkerRequest {
                worker_id: s.w1.clone(),
            })
            .await?;
        if when == "saving" {
            wait_event(&client, &s.id, "the move to start", |e| {
                e.kind == pb::EventKind::Migration as i32 && e.reason.contains("saving")
            })
            .await?;
        } else {
            wait_event(&client, &s.id, "the save to finish", |e| {
                e.kind == pb::EventKind::Migration as i32 && e.reason.starts_with("saved at step")
            })
            .await?;
        }
        let cancelled_at = unix_nanos();
        let j = client
            .cancel_job(pb::CancelJobRequest {
                job_id: s.id.clone(),
            })
            .await?
            .into_inner();
        assert_eq!(j.state(), JobState::Cancelled, "{when}: {j:#?}");
        // Settled: no container of the job is left (the agents stop and remove them).
        let label = format!("converge.job={}", s.id);
        eventually(
            Duration::from_secs(60),
            "the job's containers to go",
            || {
                let label = label.clone();
                async move { Ok(containers_of(&label).is_empty().then_some(())) }
            },
        )
        .await
        .with_context(|| format!("after a cancel while {when}"))?;
        let j = job(&mut client, &s.id, false).await?;
        assert_eq!(
            j.state(),
            JobState::Cancelled,
            "{when}: came back as {j:#?}"
        );
        // A container may start after the cancel only if its Start went out before it: the
        // restore's (epoch 2) when the cancel came while restoring; never one while saving.
        let late = s.docker.starts_after(cancelled_at);
        assert!(
            late.iter().all(|e| when == "restoring" && e.epoch == "2"),
            "{when}: started after the cancel: {late:?}"
        );
        assert!(
            s.docker.max_running() <= 1,
            "{when}: two incarnations at once: {:?}",
            s.docker.events()
        );
        // What the manager says it did: never an incarnation after the first but the one the
        // move may have started before the cancel.
        assert!(j.epoch <= 2, "{when}: epoch {}", j.epoch);
        s.docker.stop().await;
        s.manager.stop().await;
    }
    Ok(())
}

/// Drain w1 and kill its agent at once (the in-process task is dropped mid-flight, like
/// SIGKILL; its container runs on, or ends its save unobserved): w1 is declared LOST after the
/// missed heartbeats, like any silent worker. Started again, the agent re-registers with what it
/// finds: the job is re-adopted and the drain resumes, or, if its container is gone, it restarts
/// from its checkpoint — either way on w2, where it completes, one incarnation at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_killed_during_drain_is_lost_then_drains_again() -> anyhow::Result<()> {
    let s = running_on_w1("kd").await?;
    let mut client = s.client.clone();
    client
        .drain_worker(pb::DrainWorkerRequest {
            worker_id: s.w1.clone(),
        })
        .await?;
    s.a1.kill();
    let worker_state = |c: Client, id: String| async move {
        let ws = c
            .clone()
            .list_workers(pb::ListWorkersRequest {})
            .await?
            .into_inner()
            .workers;
        anyhow::Ok(ws.into_iter().find(|w| w.id == id).map(|w| w.state()))
    };
    eventually(
        Duration::from_secs(30),
        "the draining worker to be lost",
        || {
            let f = worker_state(client.clone(), s.w1.clone());
            async move { Ok((f.await? == Some(WorkerState::Lost)).then_some(())) }
        },
    )
    .await?;
    let j = job(&mut client, &s.id, false).await?;
    assert!(
        j.state() == JobState::Lost || j.worker_id != s.w1,
        "a job on a lost worker is lost: {j:#?}"
    );
    // Its agent comes back: w1 is draining again.
    let again = TestAgent::start_with(s.a1.config.clone());
    eventually(Duration::from_secs(30), "w1 back, still draining", || {
        let f = worker_state(client.clone(), s.w1.clone());
        async move { Ok((f.await? == Some(WorkerState::Draining)).then_some(())) }
    })
    .await?;
    let done = eventually(Duration::from_secs(300), "the job to end", || {
        let (mut c, id) = (client.clone(), s.id.clone());
        async move {
            let j = job(&mut c, &id, false).await?;
            Ok(matches!(j.state(), JobState::Completed | JobState::Failed).then_some(j))
        }
    })
    .await?;
    let history: Vec<String> = converge_integration_tests::events_of(&mut client, &s.id)
        .await?
        .iter()
        .map(|e| format!("{} {}: {}", e.worker_id, e.epoch, e.reason))
        .collect();
    assert_eq!(done.state(), JobState::Completed, "{history:#?}");
    assert_ne!(
        done.worker_id, s.w1,
        "the drain moved it off w1: {history:#?}"
    );
    assert!(done.epoch >= 2, "{done:#?}");
    assert!(
        s.docker.max_running() <= 1,
        "two incarnations at once: {:?}",
        s.docker.events()
    );
    drop(again);
    s.docker.stop().await;
    s.manager.stop().await;
    Ok(())
}
