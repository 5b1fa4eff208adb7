//! The manager's state store over real gRPC and a real SQLite file, without Docker: a manager
//! started again on the same `--state-dir` knows every job, re-adopts what its agents still
//! run without starting it again, stops what belongs to a finished job, and numbers its events
//! on from where the last one stopped. A store it cannot read stops it, saying what to do.
//! (Killing the manager with SIGKILL at the moments that matter, against real containers, is
//! `durable_docker.rs`.)

use std::time::Duration;

use converge_integration_tests::{ScriptedAgent, TestManager, eventually, job, tempfile_dir};
use converge_messenger::pb::{self, agent_message::Kind};
use tokio_stream::StreamExt;

fn tweak(state: &std::path::Path) -> impl FnOnce(&mut converge_manager::Config) + use<> {
    let state = state.to_path_buf();
    move |c| {
        c.heartbeat_interval = Duration::from_millis(200);
        c.state_dir = Some(state);
        c.recovery_grace = Duration::from_secs(5);
    }
}

/// Every event from `from_seq` on, until none comes for a while.
async fn events(
    client: &mut pb::control_service_client::ControlServiceClient<tonic::transport::Channel>,
) -> anyhow::Result<Vec<pb::Event>> {
    let mut stream = client
        .watch_events(pb::WatchEventsRequest {
            from_seq: 1,
            ..Default::default()
        })
        .await?
        .into_inner();
    let mut out = Vec::new();
    while let Ok(Some(e)) = tokio::time::timeout(Duration::from_millis(500), stream.next()).await {
        out.push(e?);
    }
    Ok(out)
}

/// The next command the agent gets, within 10 s.
async fn next_command(agent: &mut ScriptedAgent) -> anyhow::Result<pb::Command> {
    Ok(
        tokio::time::timeout(Duration::from_secs(10), agent.commands.recv())
            .await?
            .expect("the session is open"),
    )
}

fn is_start(c: &pb::Command) -> bool {
    matches!(c.action, Some(pb::command::Action::Start(_)))
}

/// Submits a one-core job; its id.
async fn submit(
    client: &mut pb::control_service_client::ControlServiceClient<tonic::transport::Channel>,
) -> anyhow::Result<String> {
    submit_named(client, "").await
}

/// [`submit`], the job named `name`.
async fn submit_named(
    client: &mut pb::control_service_client::ControlServiceClient<tonic::transport::Channel>,
    name: &str,
) -> anyhow::Result<String> {
    let spec = pb::JobSpec {
        name: name.into(),
        ..converge_integration_tests::one_core_spec()
    };
    Ok(client
        .submit_job(pb::SubmitJobRequest { spec: Some(spec) })
        .await?
        .into_inner()
        .job_id)
}

/// A manager on `state` (`tweak`ed, then `keep`), in which `n` jobs ran on a scripted agent,
/// gone since, and completed: job `k` in container `ctr-k`, its last step `10 + k`. The manager
/// and the jobs' ids, in submission order.
async fn with_completed_jobs(
    state: &std::path::Path,
    keep: impl FnOnce(&mut converge_manager::Config),
    n: u64,
) -> anyhow::Result<(TestManager, Vec<String>)> {
    let manager = TestManager::start(|c| {
        tweak(state)(c);
        keep(c);
    })
    .await?;
    let mut agent =
        ScriptedAgent::connect(&manager.endpoint(), "w1", 8.0, Duration::from_millis(100)).await?;
    let mut client = manager.control().await?;
    let mut ids = Vec::new();
    for k in 0..n {
        ids.push(complete_one(&mut client, &mut agent, k).await?);
    }
    Ok((manager, ids))
}

/// Submits job number `k` (named `job-k`), has `agent` start it in container `ctr-k` and report it exited 0 at
/// step `10 + k`, and waits until the manager has it Completed; its id.
async fn complete_one(
    client: &mut pb::control_service_client::ControlServiceClient<tonic::transport::Channel>,
    agent: &mut ScriptedAgent,
    k: u64,
) -> anyhow::Result<String> {
    let id = submit_named(client, &format!("job-{k}")).await?;
    agent.answer_start(&id, &format!("ctr-{k}")).await?;
    agent
        .outbox
        .send(Kind::Exited(pb::ContainerExited {
            job_id: id.clone(),
            epoch: 1,
            container_id: format!("ctr-{k}"),
            exit_code: 0,
            done: true,
            last_step: Some(10 + k),
            ..Default::default()
        }))
        .await;
    eventually(Duration::from_secs(10), "the job to complete", || {
        let mut c = client.clone();
        let id = id.clone();
        async move {
            let j = job(&mut c, &id, false).await?;
            Ok((j.state == pb::JobState::Completed as i32).then_some(()))
        }
    })
    .await?;
    Ok(id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_manager_knows_every_job_readopts_what_runs_and_numbers_events_on()
-> anyhow::Result<()> {
    let state = tempfile_dir("durable")?;
    let first = TestManager::start(tweak(state.path())).await?;
    let addr = first.addr;
    let mut agent =
        ScriptedAgent::connect(&first.endpoint(), "w1", 2.0, Duration::from_millis(100)).await?;
    let mut client = first.control().await?;

    // One job runs and reports step 7; another is cancelled after it started.
    let running = submit(&mut client).await?;
    agent.answer_start(&running, "ctr-running").await?;
    agent
        .outbox
        .send(Kind::Progress(pb::ProgressBatch {
            samples: vec![pb::ProgressSample {
                job_id: running.clone(),
                epoch: 1,
                step: 7,
                total_steps: Some(100),
                ..Default::default()
            }],
            malformed: vec![],
        }))
        .await;
    let cancelled = submit(&mut client).await?;
    assert!(is_start(&next_command(&mut agent).await?));
    client
        .cancel_job(pb::CancelJobRequest {
            job_id: cancelled.clone(),
        })
        .await?;
    eventually(Duration::from_secs(10), "the job to report step 7", || {
        let mut c = client.clone();
        let id = running.clone();
        async move {
            let j = job(&mut c, &id, false).await?;
            Ok((j.state == pb::JobState::Running as i32 && j.step == 7).then_some(()))
        }
    })
    .await?;
    let before = events(&mut client).await?;
    assert!(!before.is_empty());
    drop(client);
    first.stop().await;
    agent.disconnect();

    // The same directory, a new manager process on the same address.
    let second = TestManager::start_at(addr, tweak(state.path())).await?;
    let mut client = second.control().await?;
    let r = job(&mut client, &running, false).await?;
    assert_eq!(
        (r.state, r.epoch, r.worker_id.as_str(), r.step),
        (pb::JobState::Running as i32, 1, "w1", 7),
        "the running job as it was"
    );
    let c = job(&mut client, &cancelled, false).await?;
    assert_eq!(
        c.state,
        pb::JobState::Cancelled as i32,
        "cancelled stays cancelled"
    );

    // w1's agent comes back still running both containers.
    let mut register = ScriptedAgent::register("w1", 2.0);
    register.containers = [(&running, "ctr-running"), (&cancelled, "ctr-cancelled")]
        .into_iter()
        .map(|(job, ctr)| pb::ContainerReport {
            job_id: job.clone(),
            epoch: 1,
            container_id: ctr.into(),
            state: pb::ContainerState::Running as i32,
            exit_code: None,
            last_step: Some(7),
            exit: None,
        })
        .collect();
    let mut agent =
        ScriptedAgent::connect_with(&second.endpoint(), register, Duration::from_millis(100))
            .await?;
    // The cancelled job's container is stopped; then a new job's Start is the next command:
    // nothing was started again in between.
    let stop = next_command(&mut agent).await?;
    assert!(
        matches!(stop.action, Some(pb::command::Action::Stop(_))) && stop.job_id == cancelled,
        "{stop:?}"
    );
    // Its agent answers once Docker has stopped it: the room it held is free for the next.
    agent
        .outbox
        .send(Kind::Result(pb::CommandResult {
            command_id: stop.command_id.clone(),
            job_id: cancelled.clone(),
            epoch: 1,
            ok: true,
            ..Default::default()
        }))
        .await;
    let third = submit(&mut client).await?;
    loop {
        let c = next_command(&mut agent).await?;
        assert!(
            !(is_start(&c) && c.job_id == running),
            "the running job was started again: {c:?}"
        );
        if is_start(&c) && c.job_id == third {
            break;
        }
    }
    let r = job(&mut client, &running, false).await?;
    assert_eq!((r.state, r.epoch), (pb::JobState::Running as i32, 1));

    // The event log goes on: the old events as they were, the new ones numbered after them,
    // no gap and no number twice.
    let after = events(&mut client).await?;
    let seqs: Vec<u64> = after.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    assert!(after.len() > before.len());
    for (a, b) in before.iter().zip(&after) {
        assert_eq!((a.seq, &a.job_id, &a.reason), (b.seq, &b.job_id, &b.reason));
    }
    second.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_is_not_a_database_stops_the_manager_saying_what_to_do() -> anyhow::Result<()>
{
    let state = tempfile_dir("corrupt")?;
    std::fs::write(
        state.path().join("converge.db"),
        b"this is not a database at all, no no",
    )?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let mut config = converge_manager::Config::for_listen(listener.local_addr()?);
    config.state_dir = Some(state.path().to_path_buf());
    let err = converge_manager::serve(config, listener, Default::default())
        .await
        .expect_err("the manager must not start on a store it cannot read");
    let text = err.to_string();
    assert!(text.contains("not an SQLite database"), "{text}");
    assert!(text.contains("restore the file from a backup"), "{text}");
    assert!(text.contains("converge.db"), "{text}");
    Ok(())
}

/// A page at a time while jobs finish and leave memory for the store between pages: every
/// job is listed once, in submission order, wherever it is when its page is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paging_goes_on_across_jobs_archived_between_pages() -> anyhow::Result<()> {
    let state = tempfile_dir("paging")?;
    let manager = TestManager::start(|c| {
        tweak(state.path())(c);
        c.keep_finished = 2;
    })
    .await?;
    let mut agent =
        ScriptedAgent::connect(&manager.endpoint(), "w1", 8.0, Duration::from_millis(100)).await?;
    let mut client = manager.control().await?;
    let mut ids = Vec::new();
    for k in 0..5 {
        ids.push(complete_one(&mut client, &mut agent, k).await?);
    }
    let lister = client.clone();
    let page = |token: String| {
        let mut c = lister.clone();
        async move {
            let page = c
                .list_jobs(pb::ListJobsRequest {
                    page_size: 2,
                    page_token: token,
                    ..Default::default()
                })
                .await?
                .into_inner();
            let jobs: Vec<String> = page.jobs.into_iter().map(|j| j.id).collect();
            anyhow::Ok((jobs, page.next_page_token))
        }
    };
    // The first page: jobs 0 and 1 (archived). Then job 5 completes, and job 3 leaves memory
    // for the store; the pages after go on from job 1.
    let (mut listed, mut token) = page(String::new()).await?;
    ids.push(complete_one(&mut client, &mut agent, 5).await?);
    while !token.is_empty() {
        let (jobs, next) = page(token).await?;
        listed.extend(jobs);
        token = next;
    }
    assert_eq!(listed, ids, "every job once, in submission order");
    manager.stop().await;
    Ok(())
}

/// A manager keeps `--keep-finished` finished jobs and `--events-in-memory` events in memory
/// and answers for older ones from its store, before and after a restart: GetJob, ListJobs and
/// CancelJob say the same of an archived job as of one in memory, and a watcher replays every
/// event from the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_jobs_beyond_those_kept_are_answered_for_from_the_store() -> anyhow::Result<()> {
    let state = tempfile_dir("archive")?;
    let metrics = converge_integration_tests::free_local_addr();
    let keep = move |c: &mut converge_manager::Config| {
        c.keep_finished = 2;
        c.events_in_memory = 3;
        c.metrics_listen = Some(metrics);
    };
    let (first, ids) = with_completed_jobs(state.path(), keep, 5).await?;
    let addr = first.addr;
    let client = first.control().await?;
    let check = |mut client: pb::control_service_client::ControlServiceClient<
        tonic::transport::Channel,
    >,
                 ids: Vec<String>| async move {
        // The oldest is long archived: the same answers as for a job in memory.
        let oldest = job(&mut client, &ids[0], false).await?;
        assert_eq!(oldest.state, pb::JobState::Completed as i32);
        assert_eq!(oldest.step, 10, "its last step, from the store");
        assert_eq!(oldest.spec.as_ref().map(|s| s.cpus), Some(1.0), "its spec");
        let listed = client
            .list_jobs(pb::ListJobsRequest {
                state: pb::JobState::Completed as i32,
                ..Default::default()
            })
            .await?
            .into_inner()
            .jobs;
        let listed: Vec<&str> = listed.iter().map(|j| j.id.as_str()).collect();
        assert_eq!(listed, ids.iter().map(String::as_str).collect::<Vec<_>>());
        // A page at a time, across the store and memory: the same jobs in the same order.
        let mut paged = Vec::new();
        let mut pages = 0;
        let mut token = String::new();
        loop {
            let page = client
                .list_jobs(pb::ListJobsRequest {
                    page_size: 2,
                    page_token: token.clone(),
                    ..Default::default()
                })
                .await?
                .into_inner();
            pages += 1;
            assert!(page.jobs.len() <= 2, "a page of {}", page.jobs.len());
            paged.extend(page.jobs.into_iter().map(|j| j.id));
            token = page.next_page_token;
            if token.is_empty() {
                break;
            }
        }
        assert_eq!(paged, ids, "every job once, in submission order");
        assert_eq!(pages, ids.len().div_ceil(2));
        let refused = client
            .list_jobs(pb::ListJobsRequest {
                page_token: "not-a-token".into(),
                ..Default::default()
            })
            .await
            .expect_err("a token no answer gave");
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused}");
        // Not ended: none (every job completed), and the store is not read for them.
        let live = client
            .list_jobs(pb::ListJobsRequest {
                not_ended: true,
                ..Default::default()
            })
            .await?
            .into_inner()
            .jobs;
        assert!(live.is_empty(), "{live:?}");
        // By name: an archived job and one in memory, each alone.
        for k in [0, ids.len() - 1] {
            let named = client
                .list_jobs(pb::ListJobsRequest {
                    name: format!("job-{k}"),
                    ..Default::default()
                })
                .await?
                .into_inner()
                .jobs;
            let named: Vec<&str> = named.iter().map(|j| j.id.as_str()).collect();
            assert_eq!(named, [ids[k].as_str()], "the jobs named job-{k}");
        }
        let refused = client
            .cancel_job(pb::CancelJobRequest {
                job_id: ids[0].clone(),
            })
            .await
            .expect_err("a finished job cannot be cancelled");
        assert_eq!(
            refused.code(),
            tonic::Code::FailedPrecondition,
            "{refused:?}"
        );
        assert!(
            refused.message().contains("already completed"),
            "{refused:?}"
        );
        anyhow::Ok(())
    };
    // Three of the five left memory (the answers above came from the store).
    let text = converge_integration_tests::scrape_metrics(metrics, false).await?;
    assert_eq!(
        converge_integration_tests::metric_value(&text, "converge_manager_jobs_archived_total", ""),
        Some(3.0),
        "{text}"
    );
    // Every submission was written before it was answered: at least one commit was timed.
    let commits = converge_integration_tests::metric_value(
        &text,
        "converge_manager_store_commit_seconds_count",
        "",
    );
    assert!(commits.is_some_and(|n| n >= 1.0), "{text}");
    check(client.clone(), ids.clone()).await?;
    first.stop().await;

    let second_metrics = converge_integration_tests::free_local_addr();
    let second = TestManager::start_at(addr, |c| {
        tweak(state.path())(c);
        c.keep_finished = 2;
        c.events_in_memory = 3;
        // Its own port: the first manager's metrics task may not have let go of its own yet.
        c.metrics_listen = Some(second_metrics);
    })
    .await?;
    check(second.control().await?, ids).await?;
    // The gauge of jobs per state goes on from the store: all five completed, the three
    // archived ones too, and none running (it went below 0 when counted from nothing).
    let text = converge_integration_tests::scrape_metrics(second_metrics, false).await?;
    let jobs = |state: &str| {
        converge_integration_tests::metric_value(
            &text,
            "converge_manager_jobs",
            &format!("state=\"{state}\""),
        )
    };
    assert_eq!(jobs("completed"), Some(5.0), "{text}");
    assert_eq!(jobs("running"), Some(0.0), "{text}");
    second.stop().await;
    Ok(())
}

/// A cancel asked again is answered as the first (a client whose answer was lost retries),
/// from memory and once the job has left it for the store alike; a completed job's is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_asked_again_is_answered_as_the_first_from_the_store_too() -> anyhow::Result<()> {
    let state = tempfile_dir("cancel-again")?;
    let manager = TestManager::start(|c| {
        tweak(state.path())(c);
        c.keep_finished = 1;
    })
    .await?;
    let mut client = manager.control().await?;
    // No worker yet: it waits, and is cancelled there.
    let id = submit(&mut client).await?;
    let cancel = |mut client: pb::control_service_client::ControlServiceClient<_>| {
        let id = id.clone();
        async move { client.cancel_job(pb::CancelJobRequest { job_id: id }).await }
    };
    for _ in 0..2 {
        let j = cancel(client.clone()).await?.into_inner();
        assert_eq!(j.state, pb::JobState::Cancelled as i32, "{j:?}");
    }
    // Two jobs finish after it: it leaves memory (one finished job is kept).
    let mut agent =
        ScriptedAgent::connect(&manager.endpoint(), "w1", 8.0, Duration::from_millis(100)).await?;
    let done = complete_one(&mut client, &mut agent, 0).await?;
    complete_one(&mut client, &mut agent, 1).await?;
    let j = cancel(client.clone()).await?.into_inner();
    assert_eq!(
        j.state,
        pb::JobState::Cancelled as i32,
        "from the store: {j:?}"
    );
    let refused = client
        .cancel_job(pb::CancelJobRequest { job_id: done })
        .await
        .expect_err("a completed job cannot be cancelled");
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    manager.stop().await;
    Ok(())
}

/// `--finished-retention`: a job finished longer ago than it is forgotten by memory and store
/// together (and then answered for as unknown, saying why it may be), while a live job,
/// however old, stays. Memory keeps finished jobs here, so a GetJob that still finds the job in
/// either place fails the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_jobs_past_the_retention_are_pruned_and_live_ones_stay() -> anyhow::Result<()> {
    let state = tempfile_dir("retention")?;
    let metrics = converge_integration_tests::free_local_addr();
    let manager = TestManager::start(|c| {
        tweak(state.path())(c);
        c.finished_retention = Some(Duration::from_secs(2));
        c.metrics_listen = Some(metrics);
    })
    .await?;
    let mut client = manager.control().await?;
    // No worker: both stay pending until one is cancelled.
    let (gone, live) = (submit(&mut client).await?, submit(&mut client).await?);
    client
        .cancel_job(pb::CancelJobRequest {
            job_id: gone.clone(),
        })
        .await?;
    let cancelled = job(&mut client, &gone, false).await?;
    assert_eq!(cancelled.state, pb::JobState::Cancelled as i32);

    let refused = eventually(
        Duration::from_secs(20),
        "the cancelled job to be pruned",
        || {
            let mut c = client.clone();
            let id = gone.clone();
            async move {
                match c
                    .get_job(pb::GetJobRequest {
                        job_id: id,
                        ..Default::default()
                    })
                    .await
                {
                    Ok(_) => Ok(None),
                    Err(s) => Ok(Some(s)),
                }
            }
        },
    )
    .await?;
    assert_eq!(refused.code(), tonic::Code::NotFound, "{refused:?}");
    assert!(
        refused.message().contains("--finished-retention"),
        "the refusal says why a job may be unknown: {refused:?}"
    );
    let text = converge_integration_tests::scrape_metrics(metrics, false).await?;
    assert_eq!(
        converge_integration_tests::metric_value(&text, "converge_manager_jobs_pruned_total", ""),
        Some(1.0),
        "{text}"
    );
    // Pruned, it left the gauge of its state too (a restart counts the store's jobs).
    assert_eq!(
        converge_integration_tests::metric_value(
            &text,
            "converge_manager_jobs",
            "state=\"cancelled\""
        ),
        Some(0.0),
        "{text}"
    );
    // The pending job, submitted before the pruned one finished, is untouched.
    let pending = job(&mut client, &live, false).await?;
    assert_eq!(pending.state, pb::JobState::Pending as i32);
    let listed = client
        .list_jobs(pb::ListJobsRequest::default())
        .await?
        .into_inner()
        .jobs;
    let listed: Vec<&str> = listed.iter().map(|j| j.id.as_str()).collect();
    assert_eq!(listed, [live.as_str()]);
    manager.stop().await;
    Ok(())
}

/// A record of the store damaged while the manager was stopped (a disk error, a hand edit) that
/// a restart does not load, the oldest archived job's and the first event's, is found when a
/// request needs it: a watcher replaying from event 1 and a ListJobs of finished jobs get an
/// error naming the record and what to do, not an answer silently missing it. Both used to
/// answer without it (the store's error only logged, an undecodable event skipped), and the
/// restart itself used to fail on the job's record with SQLite's "malformed JSON" alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_record_is_an_error_naming_it_not_a_gap_in_the_answer() -> anyhow::Result<()> {
    let state = tempfile_dir("damaged")?;
    let keep = |c: &mut converge_manager::Config| {
        c.keep_finished = 1;
        c.events_in_memory = 3;
    };
    let (first, ids) = with_completed_jobs(state.path(), keep, 3).await?;
    let addr = first.addr;
    first.stop().await;

    // The oldest job's record is no longer JSON, and event 1 is no longer an Event.
    {
        let db = rusqlite::Connection::open(state.path().join("converge.db"))?;
        let jobs = db.execute(
            "UPDATE jobs SET record = '{\"id\": damaged' WHERE id = ?1",
            [&ids[0]],
        )?;
        let events = db.execute("UPDATE events SET event = x'ffffffff' WHERE seq = 1", [])?;
        assert_eq!((jobs, events), (1, 1), "the records to damage exist");
    }

    let second = TestManager::start_at(addr, |c| {
        tweak(state.path())(c);
        keep(c);
    })
    .await?;
    let mut client = second.control().await?;
    // The damage stays with its record: the job in memory and the other archived one are
    // answered as before, the damaged one with an error naming it.
    for id in &ids[1..] {
        let j = job(&mut client, id, false).await?;
        assert_eq!(j.state, pb::JobState::Completed as i32);
    }
    let err = client
        .get_job(pb::GetJobRequest {
            job_id: ids[0].clone(),
            ..Default::default()
        })
        .await
        .expect_err("a damaged record is not a job");
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert!(
        err.message().contains(&format!("job {}", ids[0])),
        "{err:?}"
    );

    let listed = client
        .list_jobs(pb::ListJobsRequest {
            state: pb::JobState::Completed as i32,
            ..Default::default()
        })
        .await;
    let err = listed.expect_err("a list missing a job it cannot read must not be an answer");
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert!(
        err.message().contains(&format!("job {}", ids[0])),
        "{err:?}"
    );
    assert!(
        err.message().contains("restore the file from a backup"),
        "{err:?}"
    );

    let watched = client
        .watch_events(pb::WatchEventsRequest {
            from_seq: 1,
            ..Default::default()
        })
        .await;
    let err = match watched {
        Err(status) => status,
        Ok(stream) => {
            let got: Vec<_> = stream.into_inner().take(3).collect().await;
            panic!("a replay from event 1 that cannot read event 1 must fail; it gave {got:?}")
        }
    };
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert!(err.message().contains("event 1"), "{err:?}");
    assert!(
        err.message().contains("restore the file from a backup"),
        "{err:?}"
    );
    second.stop().await;
    Ok(())
}
