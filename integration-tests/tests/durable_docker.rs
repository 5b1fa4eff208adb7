//! The fault matrix of a durable manager (issue 14), on real Docker with real trainer
//! containers: the manager image runs as its own process and is killed with SIGKILL (a) right
//! after SubmitJob returns, (b) while the job runs, (c) during a Save, (d) during a Restore, (e)
//! right after CancelJob returns, (f) during a value-based preemption, and started again on the
//! same state directory each time. After each restart every job is known; a running job keeps
//! its container and its steps; a move completes from its checkpoint; a cancelled job stays
//! cancelled; event numbers go on. Docker's event stream, recorded throughout, must never show
//! two containers of a job running at once.

use std::time::Duration;

use converge_integration_tests::{
    DockerEvents, MANAGER_IMAGE, ManagerContainer, TRAINER_IMAGE, TestAgent, events_of, eventually,
    high_value_spec, job, low_value_spec, require_docker, tempfile_dir, trainer_spec, unique,
    unix_nanos,
};
use converge_messenger::pb::{self, JobState, control_service_client::ControlServiceClient};
use tokio_stream::StreamExt;
use tonic::transport::Channel;

type Client = ControlServiceClient<Channel>;

async fn submit(c: &mut Client, spec: pb::JobSpec) -> anyhow::Result<String> {
    Ok(c.submit_job(pb::SubmitJobRequest { spec: Some(spec) })
        .await?
        .into_inner()
        .job_id)
}

/// Waits for job `id` to satisfy `pred`, showing its last state when it does not.
async fn until(
    c: &Client,
    id: &str,
    what: &str,
    timeout: Duration,
    pred: impl Fn(&pb::Job) -> bool,
) -> anyhow::Result<pb::Job> {
    let last = std::sync::Mutex::new(None);
    let r = eventually(timeout, what, || {
        let mut c = c.clone();
        let id = id.to_string();
        let (pred, last) = (&pred, &last);
        async move {
            let j = job(&mut c, &id, false).await?;
            let ok = pred(&j);
            *last.lock().unwrap() = Some(j.clone());
            Ok(ok.then_some(j))
        }
    })
    .await;
    r.map_err(|e| anyhow::anyhow!("{e}; the job was {:#?}", last.lock().unwrap()))
}

/// Kills the manager with SIGKILL, starts it again, and returns a client of the new process.
async fn kill_and_restart(m: &ManagerContainer, when: &str) -> anyhow::Result<Client> {
    m.kill().await?;
    m.restart()?;
    let mut c = m.control().await?;
    // What the new process found, for the log of a run (the assertions come after).
    let jobs = c
        .list_jobs(pb::ListJobsRequest::default())
        .await?
        .into_inner()
        .jobs;
    for j in jobs {
        eprintln!(
            "{when}: after the restart job {} is {:?} (epoch {}, step {}): {}",
            &j.id[..8],
            JobState::try_from(j.state).unwrap_or_default(),
            j.epoch,
            j.step,
            j.reason
        );
    }
    Ok(c)
}

/// The steps of the job's moves, in order: (the step its old incarnation saved, the step its
/// new one first reported). A move resumes from its checkpoint when the two agree; a restart
/// from 0 would show a first step of 0.
fn moves(events: &[pb::Event]) -> anyhow::Result<Vec<(u64, u64)>> {
    let step = |e: &pb::Event| -> anyhow::Result<u64> {
        Ok(e.attributes
            .get("step")
            .ok_or_else(|| anyhow::anyhow!("no step in {e:?}"))?
            .parse()?)
    };
    let mut saved = None;
    let mut out = Vec::new();
    for e in events {
        if e.kind != pb::EventKind::Migration as i32 {
            continue;
        }
        if e.reason.contains("saved at step") {
            saved = Some(step(e)?);
        } else if e.reason.starts_with("resumed on") {
            let s = saved
                .take()
                .ok_or_else(|| anyhow::anyhow!("resumed without a save: {events:#?}"))?;
            out.push((s, step(e)?));
        }
    }
    Ok(out)
}

/// All events from number 1 on: their numbers must run 1, 2, 3, … with no gap or repeat.
async fn assert_events_continuous(c: &mut Client) -> anyhow::Result<u64> {
    // Every job's (an empty job id): the whole log.
    let seqs: Vec<u64> = events_of(c, "").await?.iter().map(|e| e.seq).collect();
    assert!(!seqs.is_empty());
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "event numbers go on across restarts"
    );
    Ok(seqs.len() as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_any_moment_loses_no_job_and_never_runs_one_twice() -> anyhow::Result<()> {
    require_docker(&[TRAINER_IMAGE, MANAGER_IMAGE]);
    let state = tempfile_dir("durable-state")?;
    let checkpoints = tempfile_dir("durable-ckpt")?;
    let docker = DockerEvents::watch().await?;
    let manager = ManagerContainer::start(
        state.path(),
        &[
            ("CONVERGE_POLICY", "value"),
            // As in value_docker.rs: a 1-CPU worker with one low-value job counts as
            // overloaded early enough for a short test.
            ("CONVERGE_VALUE_LAMBDA", "0.9"),
            ("CONVERGE_HEARTBEAT_INTERVAL", "250ms"),
            ("CONVERGE_RECOVERY_GRACE", "10s"),
        ],
    )?;
    let mut client = manager.control().await?;
    let workers: Vec<String> = (1..=3).map(|i| unique(&format!("it-d{i}"))).collect();
    let _agents: Vec<TestAgent> = workers
        .iter()
        .map(|w| TestAgent::start(&manager.endpoint(), w, 1.0, checkpoints.path()))
        .collect();
    eventually(Duration::from_secs(20), "three workers", || {
        let mut c = client.clone();
        async move {
            let n = c
                .list_workers(pb::ListWorkersRequest {})
                .await?
                .into_inner();
            Ok((n.workers.len() == 3).then_some(()))
        }
    })
    .await?;

    // (a) Killed right after SubmitJob returned: the job is known and runs, once.
    // mlp-digits size 8 at ~3 ms a step: far longer than this test; it is cancelled in (e).
    let mut spec = trainer_spec("mlp-digits", 1_000_000, 50);
    spec.args.extend([
        "--size".into(),
        "8".into(),
        "--checkpoint-every".into(),
        "200".into(),
    ]);
    let a = submit(&mut client, spec).await?;
    client = kill_and_restart(&manager, "(a) right after SubmitJob").await?;
    let running = until(
        &client,
        &a,
        "(a) the job to run",
        Duration::from_secs(60),
        |j| j.state == JobState::Running as i32 && j.step >= 300,
    )
    .await?;
    assert_eq!(running.epoch, 1, "(a) started once");
    assert_eq!(docker.starts_after(&a, 0).len(), 1, "(a) one container");

    // (b) Killed while it runs: the same container goes on from where it was.
    let before = job(&mut client, &a, false).await?;
    let killed_at = unix_nanos();
    client = kill_and_restart(&manager, "(b) while the job runs").await?;
    let after = until(
        &client,
        &a,
        "(b) the job to go on",
        Duration::from_secs(60),
        |j| j.state == JobState::Running as i32 && j.step >= before.step + 200,
    )
    .await?;
    assert_eq!(
        (after.epoch, &after.worker_id),
        (1, &before.worker_id),
        "(b)"
    );
    docker.assert_no_start_after(&a, killed_at)?;

    // (c) Killed during a Save: its worker is drained and the manager killed as the Drain
    // returns (the Save was stored and sent). The move completes from the checkpoint.
    let from = after.worker_id.clone();
    let step_before_move = job(&mut client, &a, false).await?.step;
    client
        .drain_worker(pb::DrainWorkerRequest {
            worker_id: from.clone(),
        })
        .await?;
    client = kill_and_restart(&manager, "(c) during a Save").await?;
    let moved = until(
        &client,
        &a,
        "(c) the move to complete",
        Duration::from_secs(90),
        |j| j.state == JobState::Running as i32 && j.worker_id != from && j.step > step_before_move,
    )
    .await?;
    assert!(moved.epoch >= 2, "(c) a new incarnation: {moved:?}");
    docker.assert_one_incarnation_at_a_time(&a)?;
    let events = events_of(&mut client, &a).await?;
    let Some(&(saved, resumed)) = moves(&events)?.first() else {
        panic!("(c) no save and resume in the job's events: {events:#?}");
    };
    assert!(
        saved >= step_before_move,
        "(c) saved at {saved}, ran to {step_before_move}"
    );
    assert_eq!(resumed, saved, "(c) resumed from its checkpoint");

    // (d) Killed during a Restore: drain its new worker and kill the manager as soon as the
    // job's restore is announced.
    let from = moved.worker_id.clone();
    let mut watch = client
        .watch_events(pb::WatchEventsRequest {
            job_id: a.clone(),
            from_seq: 0,
        })
        .await?
        .into_inner();
    client
        .drain_worker(pb::DrainWorkerRequest {
            worker_id: from.clone(),
        })
        .await?;
    let seen = tokio::time::timeout(Duration::from_secs(60), async {
        let mut seen = Vec::new();
        while let Some(e) = watch.next().await {
            let e = e?;
            seen.push(e.reason.clone());
            if e.attributes.get("phase").is_some_and(|p| p == "restoring") {
                return anyhow::Ok(seen);
            }
        }
        anyhow::bail!("the event stream ended: {seen:?}")
    })
    .await;
    if !matches!(seen, Ok(Ok(_))) {
        let j = job(&mut client, &a, false).await?;
        anyhow::bail!(
            "(d) no restore announced ({seen:?}); the job: {j:#?}\nmanager logs:\n{}",
            manager.logs()
        );
    }
    drop(watch);
    client = kill_and_restart(&manager, "(d) during a Restore").await?;
    let last = workers
        .iter()
        .find(|w| **w != from && **w != running.worker_id)
        .expect("a third worker")
        .clone();
    let restored = until(
        &client,
        &a,
        "(d) the restore to finish",
        Duration::from_secs(90),
        |j| j.state == JobState::Running as i32 && j.worker_id == last && j.step > moved.step,
    )
    .await?;
    assert!(restored.epoch > moved.epoch, "(d) {restored:?}");
    docker.assert_one_incarnation_at_a_time(&a)?;
    let both = moves(&events_of(&mut client, &a).await?)?;
    assert_eq!(both.len(), 2, "(d) two moves: {both:?}");
    let (saved, resumed) = both[1];
    assert!(
        saved >= moved.step,
        "(d) saved at {saved}, ran to {}",
        moved.step
    );
    assert_eq!(resumed, saved, "(d) resumed from its checkpoint");

    // (e) Killed right after CancelJob returned: cancelled it stays, and its container goes.
    client
        .cancel_job(pb::CancelJobRequest { job_id: a.clone() })
        .await?;
    let cancelled_at = unix_nanos();
    client = kill_and_restart(&manager, "(e) right after CancelJob").await?;
    let c = job(&mut client, &a, false).await?;
    assert_eq!(c.state, JobState::Cancelled as i32, "(e) {c:?}");
    eventually(
        Duration::from_secs(30),
        "(e) its container to stop",
        || async { Ok(docker.running(&a).is_empty().then_some(())) },
    )
    .await?;
    docker.assert_no_start_after(&a, cancelled_at)?;

    // (f) Killed during a value-based preemption: on the last worker, a high-value arrival
    // pauses a low-value job; the manager dies as SubmitJob returns (the Pause and the Start
    // stored and sent). Both finish, each in one container, the low one paused and resumed.
    let low = submit(&mut client, low_value_spec()).await?;
    until(
        &client,
        &low,
        "(f) L to run",
        Duration::from_secs(30),
        |j| j.state == JobState::Running as i32 && j.step >= 100,
    )
    .await?;
    let high = submit(&mut client, high_value_spec()).await?;
    client = kill_and_restart(&manager, "(f) during a preemption").await?;
    let h = until(
        &client,
        &high,
        "(f) H to complete",
        Duration::from_secs(90),
        |j| j.state == JobState::Completed as i32,
    )
    .await?;
    assert_eq!((h.step, h.epoch), (1500, 1), "(f) H once, to the end");
    let l = until(
        &client,
        &low,
        "(f) L to complete",
        Duration::from_secs(120),
        |j| j.state == JobState::Completed as i32,
    )
    .await?;
    assert_eq!(
        (l.step, l.epoch),
        (4000, 1),
        "(f) L once, paused and resumed"
    );
    let paused = docker.of(&low).iter().any(|e| e.action == "pause");
    assert!(paused, "(f) Docker paused L: {:#?}", docker.of(&low));
    for j in [&low, &high] {
        assert_eq!(
            docker.starts_after(j, 0).len(),
            1,
            "(f) one container of {j}"
        );
    }

    // Every job known, with its history; events numbered without a gap across six restarts.
    let jobs = client
        .list_jobs(pb::ListJobsRequest::default())
        .await?
        .into_inner()
        .jobs;
    assert_eq!(jobs.len(), 3);
    assert!(assert_events_continuous(&mut client).await? > 20);
    // A's own history, read after six restarts, tells its whole life in order: placed,
    // running, two moves, cancelled.
    let told = events_of(&mut client, &a).await?;
    // Its life in order: submitted, placed, running (from the Start's answer, or re-adopted
    // when (a)'s kill came first), two moves, cancelled.
    type Is = fn(&pb::Event) -> bool;
    let saved: Is =
        |e| e.kind == pb::EventKind::Migration as i32 && e.reason.contains("saved at step");
    let resumed: Is =
        |e| e.kind == pb::EventKind::Migration as i32 && e.reason.contains("resumed on");
    let life: [(&str, Is); 7] = [
        ("placed", |e| e.kind == pb::EventKind::JobPlaced as i32),
        ("running", |e| e.to_state == JobState::Running as i32),
        ("saved", saved),
        ("resumed", resumed),
        ("saved again", saved),
        ("resumed again", resumed),
        ("cancelled", |e| e.to_state == JobState::Cancelled as i32),
    ];
    let mut at = 0;
    for e in &told {
        if at < life.len() && (life[at].1)(e) {
            at += 1;
        }
    }
    assert_eq!(
        at,
        life.len(),
        "A's history lacks {:?}: {told:#?}",
        life.get(at).map(|l| l.0)
    );
    for j in [&a, &low, &high] {
        docker.assert_one_incarnation_at_a_time(j)?;
    }
    Ok(())
}
