//! The two faults a user found during drains, on real Docker with real trainer containers:
//! a job cancelled while its drain migration is under way must stay cancelled (it used to be
//! restored on the target), and a draining worker whose agent is killed must be declared lost
//! like any silent worker (it never was), after which its job restarts from its checkpoint on
//! another worker, or drains again once its agent is back. "Never two incarnations" and
//! "nothing started after the cancel" are read from Docker's own event stream.

use std::time::Duration;

use anyhow::{Context, bail};
use converge_contract::{CheckpointEvent, parse_line};
use converge_integration_tests::{
    DockerEvents, TRAINER_IMAGE, TestAgent, TestManager, containers_of, events_of, eventually, job,
    require_docker, tempfile_dir, trainer_spec, unique, unix_nanos, wait_for_workers,
};
use converge_manager::Config;
use converge_messenger::pb::{self, EventKind, JobState, WorkerState};
use tonic::transport::Channel;

type Client = pb::control_service_client::ControlServiceClient<Channel>;

/// Long enough to still run when the test acts (cnn-digits, about 1.4 ms a step: some 40 s), short enough to finish within the test.
fn long_job() -> pb::JobSpec {
    trainer_spec("cnn-digits", 30_000, 50)
}

/// A manager, w1 with the job running at `min_step` or more, then w2, both registered; Docker's
/// events recorded from before the submission.
struct Setup {
    manager: TestManager,
    client: Client,
    w1: String,
    w2: String,
    a1: TestAgent,
    _a2: TestAgent,
    id: String,
    docker: DockerEvents,
    _checkpoints: converge_integration_tests::TempDir,
}

async fn running_on_w1(
    prefix: &str,
    spec: pb::JobSpec,
    min_step: u64,
    tweak: impl FnOnce(&mut Config),
) -> anyhow::Result<Setup> {
    require_docker(&[TRAINER_IMAGE]);
    let docker = DockerEvents::watch().await?;
    let checkpoints = tempfile_dir(prefix)?;
    let manager = TestManager::start(|c| {
        c.heartbeat_interval = Duration::from_millis(250);
        tweak(c);
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
        .submit_job(pb::SubmitJobRequest { spec: Some(spec) })
        .await?
        .into_inner()
        .job_id;
    eventually(Duration::from_secs(60), "the job to run on w1", || {
        let (mut c, id) = (client.clone(), id.clone());
        async move {
            let j = job(&mut c, &id, false).await?;
            Ok((j.state() == JobState::Running && j.step >= min_step).then_some(()))
        }
    })
    .await?;
    let a2 = TestAgent::start(&manager.endpoint(), &w2, 1.0, checkpoints.path());
    wait_for_workers(&client, 2).await?;
    Ok(Setup {
        manager,
        client,
        w1,
        w2,
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

/// The state `worker` is in by ListWorkers, if it is listed.
async fn worker_state(client: &Client, worker: &str) -> anyhow::Result<Option<WorkerState>> {
    let ws = client
        .clone()
        .list_workers(pb::ListWorkersRequest {})
        .await?
        .into_inner()
        .workers;
    Ok(ws.into_iter().find(|w| w.id == worker).map(|w| w.state()))
}

/// Waits until ListWorkers shows `worker` in `state`.
async fn wait_worker_state(
    client: &Client,
    worker: &str,
    state: WorkerState,
    what: &str,
) -> anyhow::Result<()> {
    eventually(Duration::from_secs(30), what, || {
        let (c, w) = (client.clone(), worker.to_string());
        async move { Ok((worker_state(&c, &w).await? == Some(state)).then_some(())) }
    })
    .await
}

/// One line per recorded event of the job, for failure messages.
async fn history(client: &mut Client, job_id: &str) -> anyhow::Result<Vec<String>> {
    Ok(events_of(client, job_id)
        .await?
        .iter()
        .map(|e| {
            format!(
                "{} {:?} {} epoch {}: {}",
                e.unix_ms,
                e.kind(),
                e.worker_id,
                e.epoch,
                e.reason
            )
        })
        .collect())
}

/// Cancel at two points of a drain's move: right after the drain (the source is saving) and
/// once the save is done (the restore has been sent to the target). Either way the job stays
/// CANCELLED, nothing of it is restored, no container of it is started after the cancel (but
/// the restore's own, already sent, when the cancel came while restoring), none is left, and
/// Docker never ran two at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_during_drain_migration_stays_cancelled() -> anyhow::Result<()> {
    for when in ["saving", "restoring"] {
        let s = running_on_w1(&format!("cd{}", &when[..1]), long_job(), 100, |c| {
            // Recovery elsewhere is not what this test looks at: keep it out of the way.
            c.recover_lost_after = Duration::from_secs(600);
        })
        .await?;
        let mut client = s.client.clone();
        client
            .drain_worker(pb::DrainWorkerRequest {
                worker_id: s.w1.clone(),
            })
            .await?;
        if when == "saving" {
            wait_event(&client, &s.id, "the move to start", |e| {
                e.kind() == EventKind::Migration && e.reason.contains("saving")
            })
            .await?;
        } else {
            wait_event(&client, &s.id, "the save to finish", |e| {
                e.kind() == EventKind::Migration && e.reason.starts_with("saved at step")
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

        // The move would carry on once the source's save finished: wait for Docker to show
        // the source container's exit, then give a wrongly sent restore a bounded while to
        // show up as a start on the event stream. The one start allowed after the cancel is
        // the restore's (epoch 2) when the cancel came while restoring: it went out before.
        let allowed = |e: &converge_integration_tests::ContainerEvent| {
            e.time_nano < cancelled_at || (when == "restoring" && e.epoch == "2")
        };
        s.docker
            .wait_for(
                &s.id,
                "the source container's exit",
                Duration::from_secs(60),
                |e| e.action == "die" && e.epoch == "1",
            )
            .await
            .with_context(|| format!("after a cancel while {when}"))?;
        if let Ok(late) = s
            .docker
            .wait_for(
                &s.id,
                "a start after the cancel",
                Duration::from_secs(3),
                |e| e.action == "start" && !allowed(e),
            )
            .await
        {
            bail!(
                "{when}: a container of the cancelled job started after the cancel: {late:#?}\n{:#?}",
                history(&mut client, &s.id).await?
            );
        }
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
            "{when}: came back as {j:#?}\n{:#?}",
            history(&mut client, &s.id).await?
        );
        let late: Vec<_> = s
            .docker
            .starts_after(&s.id, cancelled_at)
            .into_iter()
            .filter(|e| !allowed(e))
            .collect();
        assert!(
            late.is_empty(),
            "{when}: started after the cancel: {late:#?}"
        );
        s.docker
            .assert_one_incarnation_at_a_time(&s.id)
            .with_context(|| format!("cancelled while {when}"))?;
        // What the manager says it did: never an incarnation after the first but the one the
        // move may have started before the cancel.
        assert!(j.epoch <= 2, "{when}: epoch {}", j.epoch);
        s.docker.stop().await;
        s.manager.stop().await;
    }
    Ok(())
}

/// Drain w1 and kill its agent (SIGKILL: the in-process task is dropped mid-flight) the moment
/// Docker shows the drain's SIGTERM reaching the job's container. The container finishes its
/// step, saves its checkpoint and exits 0, but no agent sees it, so the manager never hears
/// that the save finished. A draining worker is still a worker: it must be declared LOST after
/// its missed heartbeats and its job LOST with it; `recover_lost_after` later the job restarts
/// on w2 from the checkpoint the save left, at the saved step, and completes. One incarnation
/// at a time throughout, and the restart not before the grace has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_killed_during_drain_recovers_job_from_checkpoint() -> anyhow::Result<()> {
    const RECOVER: Duration = Duration::from_secs(3);
    // Steps of a few tenths of a second (size 24): after its SIGTERM the trainer finishes the
    // step under way before it saves and exits, which leaves the test the time to kill the
    // agent before that agent can see the exit and report the save. 200 of them: with 50, on a
    // slow machine the job had finished before the drain reached it (CI, 2026-11-25).
    let mut spec = trainer_spec("cnn-digits", 200, 1);
    spec.args.extend(["--size".into(), "24".into()]);
    let s = running_on_w1("kr", spec, 3, |c| {
        // Twelve missed heartbeats (3 s), not three: with this file's three tests and their
        // trainers on a loaded 2-core machine, w1's agent was once heard only 2.3 s apart,
        // declared lost before the drain, and the test went down another path (CI,
        // 2026-11-25). The loss this test waits for comes from the kill, not from a gap.
        c.lost_after = 12;
        c.recover_lost_after = RECOVER;
        // The restart's first report is read from the job's kept progress: keep all of it
        // (the default keeps the last 32 points, fewer than this job reports).
        c.progress_history = 4096;
    })
    .await?;
    let mut client = s.client.clone();
    client
        .drain_worker(pb::DrainWorkerRequest {
            worker_id: s.w1.clone(),
        })
        .await?;
    let sigterm = s
        .docker
        .wait_for(
            &s.id,
            "the drain's SIGTERM reaching the job's container",
            Duration::from_secs(30),
            |e| e.epoch == "1" && e.is_sigterm(),
        )
        .await?;
    // Follow the source's log from now: the container is still alive (finishing its step and
    // saving), and the agent's exit watcher, a task of its own that aborting the agent does
    // not stop, may remove it as soon as it exits (CI saw `docker logs` find it gone).
    let source_log = std::process::Command::new("docker")
        .args(["logs", "--follow", &sigterm.container])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("docker logs --follow")?;
    s.a1.kill();

    wait_worker_state(
        &client,
        &s.w1,
        WorkerState::Lost,
        "the draining worker to be declared lost",
    )
    .await
    .with_context(|| {
        format!(
            "w1's agent was killed {}s ago",
            (unix_nanos() - sigterm.time_nano) / 1_000_000_000
        )
    })?;
    let done = eventually(Duration::from_secs(180), "the job to end", || {
        let (mut c, id) = (client.clone(), s.id.clone());
        async move {
            let j = job(&mut c, &id, true).await?;
            Ok(matches!(
                j.state(),
                JobState::Completed | JobState::Failed | JobState::Cancelled
            )
            .then_some(j))
        }
    })
    .await?;
    let events = events_of(&mut client, &s.id).await?;
    let hist = history(&mut client, &s.id).await?;

    // The job was lost with its worker (had the killed agent reported the save first, the move
    // would have simply gone on: the history then shows the save from w1).
    let lost = events
        .iter()
        .find(|e| e.kind() == EventKind::JobState && e.to_state() == JobState::Lost)
        .with_context(|| format!("the job was never LOST: {hist:#?}"))?;
    assert_eq!(done.state(), JobState::Completed, "{hist:#?}");
    assert_eq!(
        done.worker_id, s.w2,
        "restarted on the other worker: {hist:#?}"
    );

    // Docker's view: the source saved on its SIGTERM and left on its own (exit 0), then
    // exactly one more incarnation started, on w2, not before `recover_lost_after` had
    // passed since the job was lost, and never alongside another.
    let died = s
        .docker
        .wait_for(
            &s.id,
            "the source container's exit",
            Duration::from_secs(30),
            |e| e.action == "die" && e.container == sigterm.container,
        )
        .await?;
    assert_eq!(died.detail, "0", "the source's exit code: {died:#?}");
    let starts: Vec<_> = s
        .docker
        .of(&s.id)
        .into_iter()
        .filter(|e| e.action == "start")
        .collect();
    assert_eq!(starts.len(), 2, "one restart: {starts:#?}\n{hist:#?}");
    let restart = &starts[1];
    assert_eq!(restart.worker, s.w2, "{restart:#?}");
    // The event's millisecond timestamp may trail the core's own moment of loss by a little.
    let earliest = (lost.unix_ms + RECOVER.as_millis() as i64 - 100) * 1_000_000;
    assert!(
        restart.time_nano >= earliest,
        "restarted {} ms after the job was lost, before recover_lost_after ({RECOVER:?}): {hist:#?}",
        (restart.time_nano / 1_000_000) - lost.unix_ms
    );
    s.docker.assert_one_incarnation_at_a_time(&s.id)?;
    assert!(
        s.docker.running(&s.id).is_empty(),
        "{:#?}",
        s.docker.of(&s.id)
    );

    // The restart continued from the checkpoint the unobserved save wrote: its first report
    // is at the step the source saved (read from the source's own log), not at 0.
    let saved_step = saved_step_in_log(&sigterm.container, source_log)?;
    assert!(saved_step > 0, "saved at step {saved_step}");
    let first_new = done
        .progress
        .iter()
        .filter(|p| p.epoch == done.epoch && p.value.is_some())
        .min_by_key(|p| p.step)
        .with_context(|| format!("no progress of epoch {}", done.epoch))?;
    assert_eq!(
        first_new.step, saved_step,
        "resumed at a different step than the source saved: {hist:#?}"
    );
    s.docker.stop().await;
    s.manager.stop().await;
    Ok(())
}

/// The step of the last "checkpoint saved" progress line in a container's log, read by
/// `follower` (`docker logs --follow`, which ends when the container stops).
fn saved_step_in_log(container: &str, follower: std::process::Child) -> anyhow::Result<u64> {
    let out = follower
        .wait_with_output()
        .context("docker logs --follow")?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .rev()
        .filter_map(|l| parse_line(l, None).ok().flatten())
        .find(|p| p.checkpoint == Some(CheckpointEvent::Saved))
        .map(|p| p.step)
        .with_context(|| format!("no checkpoint-saved line in the log of {container}"))
}

/// Drain w1 and kill its agent at once (the in-process task is dropped mid-flight, like
/// SIGKILL; its container runs on, or ends its save unobserved): w1 is declared LOST after the
/// missed heartbeats, like any silent worker. Recovery elsewhere is held off (a long
/// `recover_lost_after`), so what runs on w1 without an agent never overlaps a second
/// incarnation. Started again, the agent re-registers with what it finds: the job is
/// re-adopted and the drain resumes, or, if its container is gone, it restarts from its
/// checkpoint — either way on w2, where it completes, one incarnation at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_killed_during_drain_is_lost_then_drains_again() -> anyhow::Result<()> {
    let s = running_on_w1("kd", long_job(), 100, |c| {
        c.recover_lost_after = Duration::from_secs(600);
    })
    .await?;
    let mut client = s.client.clone();
    client
        .drain_worker(pb::DrainWorkerRequest {
            worker_id: s.w1.clone(),
        })
        .await?;
    s.a1.kill();
    wait_worker_state(
        &client,
        &s.w1,
        WorkerState::Lost,
        "the draining worker to be lost",
    )
    .await?;
    let j = job(&mut client, &s.id, false).await?;
    assert!(
        j.state() == JobState::Lost || j.worker_id == s.w2,
        "a job on a lost worker is lost: {j:#?}"
    );
    // Its agent comes back: w1 is draining again.
    let again = TestAgent::start_with(s.a1.config.clone());
    wait_worker_state(
        &client,
        &s.w1,
        WorkerState::Draining,
        "w1 back, still draining",
    )
    .await?;
    let done = eventually(Duration::from_secs(300), "the job to end", || {
        let (mut c, id) = (client.clone(), s.id.clone());
        async move {
            let j = job(&mut c, &id, false).await?;
            Ok(matches!(j.state(), JobState::Completed | JobState::Failed).then_some(j))
        }
    })
    .await?;
    let hist = history(&mut client, &s.id).await?;
    assert_eq!(done.state(), JobState::Completed, "{hist:#?}");
    assert_eq!(done.worker_id, s.w2, "the drain moved it off w1: {hist:#?}");
    assert!(done.epoch >= 2, "{done:#?}");
    s.docker.assert_one_incarnation_at_a_time(&s.id)?;
    drop(again);
    s.docker.stop().await;
    s.manager.stop().await;
    Ok(())
}
