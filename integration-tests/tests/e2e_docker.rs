//! The whole path on real Docker: a manager and agents over real gRPC on loopback, real
//! trainer containers, the user API. Needs Docker and `converge/trainer:dev`
//! (`cargo xtask test` builds it first).

use std::collections::BTreeMap;
use std::time::Duration;

use converge_integration_tests::{
    TRAINER_IMAGE, TestAgent, TestManager, containers_of, eventually, job, require_docker,
    tempfile_dir, trainer_spec, unique, wait_for_workers,
};
use converge_messenger::pb::{self, JobState};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_jobs_on_two_workers_complete_with_every_transition_in_order() -> anyhow::Result<()> {
    require_docker(&[TRAINER_IMAGE]);
    let checkpoints = tempfile_dir("e2e4")?;
    let manager = TestManager::start(|c| c.heartbeat_interval = Duration::from_millis(250)).await?;
    let (w1, w2) = (unique("it-a"), unique("it-b"));
    let _a1 = TestAgent::start(&manager.endpoint(), &w1, 1.0, checkpoints.path());
    let _a2 = TestAgent::start(&manager.endpoint(), &w2, 1.0, checkpoints.path());
    let mut client = manager.control().await?;
    wait_for_workers(&client, 2).await?;
    // Watch from before the first submission: the live stream must carry every transition.
    let mut events = client
        .watch_events(pb::WatchEventsRequest::default())
        .await?
        .into_inner();

    let mut ids = Vec::new();
    for model in ["mlp-digits", "logreg-wine", "gru-co2", "cnn-digits"] {
        let mut spec = trainer_spec(model, 150, 10);
        spec.cpus = 0.5;
        ids.push(
            client
                .submit_job(pb::SubmitJobRequest { spec: Some(spec) })
                .await?
                .into_inner()
                .job_id,
        );
    }

    // Collect events until every job has reached a terminal state.
    let mut seen: Vec<pb::Event> = Vec::new();
    let mut finished = 0;
    while finished < ids.len() {
        let e = tokio::time::timeout(Duration::from_secs(180), events.message())
            .await
            .map_err(|_| anyhow::anyhow!("no event for 180s; saw {seen:#?}"))??
            .expect("event stream stays open");
        if e.kind == pb::EventKind::JobState as i32 && ids.contains(&e.job_id) {
            let to = JobState::try_from(e.to_state)?;
            if matches!(
                to,
                JobState::Completed | JobState::Failed | JobState::Cancelled
            ) {
                finished += 1;
            }
        }
        seen.push(e);
    }
    // Sequence numbers are consecutive: nothing was dropped between the actor and us.
    for pair in seen.windows(2) {
        assert_eq!(
            pair[1].seq,
            pair[0].seq + 1,
            "gap in event stream: {pair:#?}"
        );
    }
    let mut placed: BTreeMap<String, usize> = BTreeMap::new();
    for id in &ids {
        let transitions: Vec<(JobState, JobState)> = seen
            .iter()
            .filter(|e| e.kind == pb::EventKind::JobState as i32 && &e.job_id == id)
            .map(|e| {
                (
                    JobState::try_from(e.from_state).unwrap(),
                    JobState::try_from(e.to_state).unwrap(),
                )
            })
            .collect();
        assert_eq!(
            transitions,
            vec![
                (JobState::Unspecified, JobState::Pending),
                (JobState::Pending, JobState::Starting),
                (JobState::Starting, JobState::Running),
                (JobState::Running, JobState::Completed),
            ],
            "job {id} transitions"
        );
        let j = job(&mut client, id, true).await?;
        assert_eq!(j.state, JobState::Completed as i32, "{j:#?}");
        assert_eq!(j.exit_code, Some(0));
        // Every line counted; a point kept a second, and the first and the last (a job of
        // 150 steps may run in under a second).
        assert!(
            j.progress.len() >= 2,
            "job {id} has only {} progress points",
            j.progress.len()
        );
        assert!(j.samples >= 5);
        assert_eq!(j.malformed_lines, 0);
        assert_eq!(j.step, 150, "final step");
        // The loss the manager last heard is below the first one it heard.
        let first = j.progress.iter().find_map(|p| p.value).unwrap();
        let last = j.progress.iter().rev().find_map(|p| p.value).unwrap();
        assert!(last < first, "job {id}: loss {first} -> {last}");
        *placed.entry(j.worker_id.clone()).or_default() += 1;
    }
    // Spread puts two of the four on each worker.
    assert_eq!(
        placed.values().copied().collect::<Vec<_>>(),
        vec![2, 2],
        "{placed:?}"
    );
    manager.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_agent_readopts_its_running_container() -> anyhow::Result<()> {
    require_docker(&[TRAINER_IMAGE]);
    let checkpoints = tempfile_dir("readopt")?;
    let manager = TestManager::start(|c| c.heartbeat_interval = Duration::from_millis(250)).await?;
    let worker = unique("it-r");
    let agent = TestAgent::start(&manager.endpoint(), &worker, 1.0, checkpoints.path());
    let mut client = manager.control().await?;
    eventually(Duration::from_secs(20), "the worker to register", || {
        let mut c = client.clone();
        async move {
            Ok((!c
                .list_workers(pb::ListWorkersRequest {})
                .await?
                .into_inner()
                .workers
                .is_empty())
            .then_some(()))
        }
    })
    .await?;
    let id = client
        .submit_job(pb::SubmitJobRequest {
            // Size 8 (~3 ms a step): still running when the new agent starts.
            spec: Some({
                let mut s = trainer_spec("mlp-digits", 4000, 20);
                s.args.extend(["--size".into(), "8".into()]);
                s
            }),
        })
        .await?
        .into_inner()
        .job_id;
    let label = format!("converge.job={id}");
    let running = eventually(
        Duration::from_secs(60),
        "the job to run and report progress",
        || {
            let mut c = client.clone();
            let id = id.clone();
            async move {
                let j = job(&mut c, &id, false).await?;
                Ok((j.state == JobState::Running as i32 && j.step >= 20).then_some(j))
            }
        },
    )
    .await?;
    let before = containers_of(&label);
    assert_eq!(before.len(), 1, "{before:?}");

    // Kill the agent mid-job; its container keeps running.
    agent.kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(containers_of(&label).len(), 1);
    let config = agent.config.clone();
    std::mem::forget(agent); // its Drop would remove the container we are about to re-adopt
    let agent = TestAgent::start_with(config);
    let cs = containers_of(&label);
    assert!(
        cs.len() == 1 && cs[0].1 == "running",
        "the job must still be running when the new agent starts, else nothing is re-adopted: {cs:?}"
    );
    let step_at_restart = job(&mut client, &id, false).await?.step;
    // The new agent follows the old container: progress keeps arriving while it runs.
    eventually(
        Duration::from_secs(30),
        "progress from the re-adopted container",
        || {
            let mut c = client.clone();
            let id = id.clone();
            let label = label.clone();
            async move {
                let j = job(&mut c, &id, false).await?;
                let cs = containers_of(&label);
                assert!(cs.len() <= 1, "a second container appeared: {cs:?}");
                Ok(
                    (j.state == JobState::Running as i32 && j.step > step_at_restart + 100)
                        .then_some(()),
                )
            }
        },
    )
    .await?;

    // From here until the job completes, Docker never shows a second container of the job.
    let done = eventually(
        Duration::from_secs(180),
        "the job to complete after re-adoption",
        || {
            let mut c = client.clone();
            let id = id.clone();
            let label = label.clone();
            async move {
                let cs = containers_of(&label);
                assert!(cs.len() <= 1, "a second container appeared: {cs:?}");
                let j = job(&mut c, &id, false).await?;
                Ok(
                    (j.state == JobState::Completed as i32 || j.state == JobState::Failed as i32)
                        .then_some(j),
                )
            }
        },
    )
    .await?;
    assert_eq!(done.state, JobState::Completed as i32, "{done:#?}");
    assert_eq!(done.epoch, 1, "the job was never restarted");
    assert_eq!(done.container_id, running.container_id, "same container");
    assert_eq!(done.step, 4000);
    // The re-adoption was announced: the worker re-registered with its container.
    let mut events = client
        .watch_events(pb::WatchEventsRequest {
            job_id: String::new(),
            from_seq: 1,
        })
        .await?
        .into_inner();
    let mut reregistered = false;
    while let Ok(Some(e)) = tokio::time::timeout(Duration::from_millis(500), events.message())
        .await
        .map(|r| r.ok().flatten())
    {
        if e.kind == pb::EventKind::WorkerState as i32
            && e.worker_id == worker
            && e.reason.contains("re-registered with 1 container")
        {
            reregistered = true;
        }
    }
    assert!(
        reregistered,
        "no re-registration event naming the container"
    );
    drop(agent);
    manager.stop().await;
    Ok(())
}

/// A job that fails says why: the last lines of its stderr are in its reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_job_carries_the_end_of_its_stderr_in_its_reason() -> anyhow::Result<()> {
    require_docker(&[TRAINER_IMAGE]);
    let checkpoints = tempfile_dir("e2e-fail")?;
    let manager = TestManager::start(|c| c.heartbeat_interval = Duration::from_millis(250)).await?;
    let w = unique("it-f");
    let _agent = TestAgent::start(&manager.endpoint(), &w, 1.0, checkpoints.path());
    let mut client = manager.control().await?;
    wait_for_workers(&client, 1).await?;
    let spec = trainer_spec("no-such-model", 10, 10);
    let id = client
        .submit_job(pb::SubmitJobRequest { spec: Some(spec) })
        .await?
        .into_inner()
        .job_id;
    let failed = eventually(Duration::from_secs(60), "the job to fail", || {
        let mut c = client.clone();
        let id = id.clone();
        async move {
            let j = job(&mut c, &id, false).await?;
            Ok((j.state == JobState::Failed as i32).then_some(j))
        }
    })
    .await?;
    assert!(
        failed
            .reason
            .starts_with("exited with code 64; its stderr ends: ")
            && failed.reason.contains("unknown model `no-such-model`"),
        "{}",
        failed.reason
    );
    manager.stop().await;
    Ok(())
}
