//! Moving a job between workers by checkpoint save/restore, on real Docker with real trainer
//! containers: the step counter continues, the loss does not jump back, and Docker never shows
//! two running containers of the job.

use std::time::Duration;

use converge_integration_tests::{
    TRAINER_IMAGE, TestAgent, TestManager, containers_of, eventually, job, require_docker,
    tempfile_dir, trainer_spec, unique, wait_for_workers,
};
use converge_messenger::pb::{self, JobState};

/// What a drain scenario leaves for the test to inspect.
struct Moved {
    manager: TestManager,
    /// The target worker.
    w2: String,
    /// The job once it reached a terminal state, with its progress samples.
    done: pb::Job,
    /// The job's events from its submission on.
    events: Vec<pb::Event>,
    /// What `JobLogs --follow` streamed, opened while the job ran on w1; it ends by itself
    /// when the job does.
    followed: Vec<pb::JobLogsResponse>,
    _agents: (TestAgent, TestAgent),
    _checkpoints: converge_integration_tests::TempDir,
}

/// The scenario both tests share: only w1 exists when `spec` is placed, so it runs there; once
/// it reports `running_step`, w2 joins and w1 is drained. Docker is polled until the job ends
/// and must never show two running containers of it.
async fn drain_while_running(
    prefix: &str,
    tweak: impl FnOnce(&mut converge_manager::Config),
    spec: pb::JobSpec,
    running_step: u64,
) -> anyhow::Result<Moved> {
    require_docker(&[TRAINER_IMAGE]);
    let checkpoints = tempfile_dir(prefix)?;
    let manager = TestManager::start(|c| {
        c.heartbeat_interval = Duration::from_millis(250);
        // Keep both incarnations' reports for the comparisons the tests make.
        c.progress_history = 4096;
        tweak(c);
    })
    .await?;
    let (w1, w2) = (
        unique(&format!("it-{prefix}1")),
        unique(&format!("it-{prefix}2")),
    );
    let a1 = TestAgent::start(&manager.endpoint(), &w1, 1.0, checkpoints.path());
    let mut client = manager.control().await?;
    wait_for_workers(&client, 1).await?;
    let id = client
        .submit_job(pb::SubmitJobRequest { spec: Some(spec) })
        .await?
        .into_inner()
        .job_id;
    let running = eventually(Duration::from_secs(60), "the job to run on w1", || {
        let mut c = client.clone();
        let id = id.clone();
        async move {
            let j = job(&mut c, &id, false).await?;
            Ok((j.state == JobState::Running as i32 && j.step >= running_step).then_some(j))
        }
    })
    .await?;
    // The job runs without privileges (and, below, still checkpoints and resumes).
    let container = match converge_integration_tests::running_container_of(&id) {
        Ok(c) => c,
        Err(e) => {
            let now = job(&mut client, &id, false).await;
            anyhow::bail!("{e}; the job when seen running: {running:?}; now: {now:?}");
        }
    };
    let (caps, readonly, security, pids, tmpfs) =
        converge_integration_tests::inspect_privileges(&container)?;
    assert_eq!(caps, r#"["ALL"]"#);
    assert_eq!(readonly, "true");
    assert_eq!(security, r#"["no-new-privileges:true"]"#);
    assert_eq!(pids, "1024");
    assert!(tmpfs.contains("\"/tmp\""), "{tmpfs}");
    // A follower of its output from here on, across the move.
    let follower = tokio::spawn(read_logs(client.clone(), id.clone(), true));
    let a2 = TestAgent::start(&manager.endpoint(), &w2, 1.0, checkpoints.path());
    wait_for_workers(&client, 2).await?;
    let drained = client
        .drain_worker(pb::DrainWorkerRequest {
            worker_id: w1.clone(),
        })
        .await?
        .into_inner();
    assert_eq!(drained.state, pb::WorkerState::Draining as i32);

    let label = format!("converge.job={id}");
    let done = eventually(Duration::from_secs(180), "the moved job to end", || {
        let mut c = client.clone();
        let id = id.clone();
        let label = label.clone();
        async move {
            let running: Vec<_> = containers_of(&label)
                .into_iter()
                .filter(|(_, state)| state == "running")
                .collect();
            assert!(
                running.len() <= 1,
                "two incarnations running at once: {running:?}"
            );
            let j = job(&mut c, &id, true).await?;
            Ok(matches!(
                JobState::try_from(j.state)?,
                JobState::Completed | JobState::Failed
            )
            .then_some(j))
        }
    })
    .await?;
    // The whole event history of the job, replayed from the manager's log.
    let mut stream = client
        .watch_events(pb::WatchEventsRequest {
            job_id: id,
            from_seq: 1,
        })
        .await?
        .into_inner();
    let mut events = Vec::new();
    while let Ok(Some(e)) = tokio::time::timeout(Duration::from_millis(300), stream.message())
        .await
        .map(|r| r.ok().flatten())
    {
        events.push(e);
    }
    let followed = tokio::time::timeout(Duration::from_secs(30), follower)
        .await
        .map_err(|_| anyhow::anyhow!("the --follow reader did not end with the job"))???;
    Ok(Moved {
        manager,
        w2,
        done,
        events,
        followed,
        _agents: (a1, a2),
        _checkpoints: checkpoints,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drained_worker_moves_its_job_which_resumes_at_the_saved_step() -> anyhow::Result<()> {
    let mut spec = trainer_spec("mlp-digits", 6000, 20);
    spec.args.extend(["--size".into(), "2".into()]);
    let Moved {
        manager,
        w2,
        done,
        events,
        followed,
        // Alive until the end: `logs` reads through them.
        _agents: agents,
        ..
    } = drain_while_running("m", |_| {}, spec, 200).await?;
    assert_eq!(done.state, JobState::Completed as i32, "{done:#?}");
    assert_eq!(done.worker_id, w2, "finished on the target");
    assert_eq!(done.epoch, 2, "exactly one new incarnation");
    assert_eq!(done.migrations, 1);
    assert_eq!(done.step, 6000);
    let downtime = done.last_migration_downtime_ms.expect("downtime recorded");

    // Every step of the move was an event the user could watch, in order.
    let mut reasons = Vec::new();
    let mut saved_step = None;
    for e in &events {
        if e.kind == pb::EventKind::Migration as i32 {
            reasons.push(e.reason.clone());
            if e.reason.contains("saved at step") {
                saved_step = Some(e.attributes["step"].parse::<u64>()?);
            }
            if let Some(d) = e.attributes.get("downtime_ms") {
                assert_eq!(*d, downtime.to_string());
            }
        }
    }
    let order = ["saving", "saved at step", "resumed on"];
    let mut pos = 0;
    for r in &reasons {
        if pos < order.len() && r.contains(order[pos]) {
            pos += 1;
        }
    }
    assert_eq!(
        pos,
        order.len(),
        "migration events out of order or missing: {reasons:#?}"
    );

    // The new incarnation's first report is at exactly the step the old one saved.
    let saved_step = saved_step.expect("a Saved event with its step");
    let first_new = done
        .progress
        .iter()
        .filter(|p| p.epoch == 2 && p.value.is_some())
        .min_by_key(|p| p.step)
        .expect("epoch 2 samples");
    assert_eq!(
        first_new.step, saved_step,
        "resumed at a different step than saved"
    );
    // And its loss continues the curve: within 10% of the highest of the last five reports
    // before the move (the held-out loss wobbles a few percent near convergence), and nowhere
    // near the untrained loss a fresh start would report.
    let old: Vec<&pb::ProgressPoint> = done
        .progress
        .iter()
        .filter(|p| p.epoch == 1 && p.value.is_some())
        .collect();
    let recent_max = old
        .iter()
        .rev()
        .take(5)
        .map(|p| p.value.unwrap())
        .fold(f64::MIN, f64::max);
    let first_loss = first_new.value.unwrap();
    assert!(
        first_loss <= recent_max * 1.10,
        "loss jumped back: {recent_max} -> {first_loss}"
    );
    let initial = old.first().unwrap().value.unwrap();
    assert!(
        first_loss < initial / 5.0,
        "looks like a fresh start: {initial} -> {first_loss}"
    );
    println!("migration downtime: {downtime} ms");

    // `logs` shows each incarnation's part, in order, from where it ran: read after the end
    // (both containers are removed by now: what their agents kept of them), and followed
    // live across the move.
    let after = read_logs(manager.control().await?, done.id.clone(), false).await?;
    for (how, parts) in [("after the end", &after), ("followed", &followed)] {
        assert_the_output_tells_the_move(how, parts, &w2, saved_step);
    }
    manager.stop().await;
    drop(agents);
    Ok(())
}

/// Every part `JobLogs` sends for job `id`, until the stream ends.
async fn read_logs(
    mut client: pb::control_service_client::ControlServiceClient<tonic::transport::Channel>,
    id: String,
    follow: bool,
) -> anyhow::Result<Vec<pb::JobLogsResponse>> {
    let mut s = client
        .job_logs(pb::JobLogsRequest {
            job_id: id,
            follow,
            tail: 0,
        })
        .await?
        .into_inner();
    let mut parts = Vec::new();
    while let Some(p) = s.message().await? {
        parts.push(p);
    }
    Ok(parts)
}

/// Both incarnations' parts, in epoch order and from different workers: the first saves at
/// `saved_step`, the second (on `w2`) restores there and ends with the final line.
fn assert_the_output_tells_the_move(
    how: &str,
    parts: &[pb::JobLogsResponse],
    w2: &str,
    saved_step: u64,
) {
    use converge_contract::{CheckpointEvent, parse_line};
    let gaps: Vec<_> = parts.iter().filter(|p| !p.unavailable.is_empty()).collect();
    assert!(gaps.is_empty(), "{how}: parts missing: {gaps:#?}");
    let epochs: Vec<u64> = parts.iter().map(|p| p.epoch).collect();
    assert!(
        epochs.windows(2).all(|w| w[0] <= w[1])
            && epochs.first() == Some(&1)
            && epochs.last() == Some(&2),
        "{how}: parts out of order: {epochs:?}"
    );
    let progress = |epoch: u64| -> Vec<converge_contract::ProgressLine> {
        parts
            .iter()
            .filter(|p| p.epoch == epoch)
            .flat_map(|p| &p.lines)
            .filter_map(|l| {
                parse_line(&String::from_utf8_lossy(&l.data), None)
                    .ok()
                    .flatten()
            })
            .collect()
    };
    let workers = |epoch: u64| -> Vec<&str> {
        let mut w: Vec<&str> = parts
            .iter()
            .filter(|p| p.epoch == epoch)
            .map(|p| p.worker_id.as_str())
            .collect();
        w.dedup();
        w
    };
    assert_eq!(workers(2), [w2], "{how}: epoch 2 ran on the target");
    assert!(
        workers(1).len() == 1 && workers(1)[0] != w2,
        "{how}: epoch 1 ran on the source: {:?}",
        workers(1)
    );
    let (old, new) = (progress(1), progress(2));
    assert!(
        old.iter()
            .any(|p| p.checkpoint == Some(CheckpointEvent::Saved) && p.step == saved_step),
        "{how}: epoch 1's output ends with its save at step {saved_step}: {:?}",
        old.last()
    );
    let first = new.first().expect("epoch 2 wrote progress");
    assert_eq!(
        (first.checkpoint, first.step),
        (Some(CheckpointEvent::Restored), saved_step),
        "{how}: epoch 2's output starts with the restore"
    );
    assert!(
        new.last().is_some_and(|p| p.done),
        "{how}: epoch 2 ends with the final line"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_ignoring_sigterm_is_killed_and_resumes_from_its_last_periodic_checkpoint()
-> anyhow::Result<()> {
    // Long enough (size 4: ~2 ms a step) that it cannot finish within the save deadline, so
    // the exit really is the agent's kill.
    let mut spec = trainer_spec("mlp-digits", 8000, 20);
    spec.args.extend(
        [
            "--size",
            "4",
            "--checkpoint-every",
            "100",
            "--ignore-sigterm",
        ]
        .map(String::from),
    );
    // A short save deadline, so the test does not wait long for the kill.
    let Moved {
        manager,
        w2,
        done,
        events,
        ..
    } = drain_while_running("k", |c| c.save_deadline = Duration::from_secs(2), spec, 250).await?;
    assert_eq!(done.state, JobState::Completed as i32, "{done:#?}");
    assert_eq!((done.worker_id.as_str(), done.epoch), (w2.as_str(), 2));
    assert_eq!(done.step, 8000);

    // The save was a kill, and the new incarnation resumed from a periodic checkpoint at or
    // before the last step the old one reported.
    let mut killed = None;
    for e in &events {
        if let Some(k) = e.attributes.get("killed") {
            killed = Some(k == "true");
        }
    }
    assert_eq!(killed, Some(true), "the agent had to kill the container");
    let last_old = done
        .progress
        .iter()
        .filter(|p| p.epoch == 1)
        .map(|p| p.step)
        .max()
        .unwrap();
    let first_new = done
        .progress
        .iter()
        .filter(|p| p.epoch == 2)
        .map(|p| p.step)
        .min()
        .unwrap();
    assert!(
        first_new <= last_old,
        "resumed ahead of where it was: {last_old} -> {first_new}"
    );
    assert_eq!(
        first_new % 100,
        0,
        "resumed from a periodic checkpoint (every 100 steps): {first_new}"
    );
    assert!(
        first_new >= 200,
        "a periodic checkpoint, not a fresh start: {first_new}"
    );
    manager.stop().await;
    Ok(())
}
