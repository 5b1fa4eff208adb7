//! The agent against real Docker and a scripted manager over real gRPC.
//!
//! These tests need Docker and the trainer image (`cargo xtask images trainer`); without them
//! they fail with a message saying so.

mod common;

use std::time::Duration;

use common::{
    Manager, Seen, TestWorker, agent_for, command, require_docker_and_trainer, start_trainer,
};
use converge_messenger::pb;
use converge_messenger::pb::agent_message::Kind;
use converge_messenger::pb::command::Action;
use converge_messenger::pb::command_result::Detail;
use tokio_util::sync::CancellationToken;

const T: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_report_limit_and_readopt_after_an_agent_restart() {
    let docker = require_docker_and_trainer().await;
    let worker = TestWorker::new("readopt");
    let mut m = Manager::start().await;

    // First agent.
    let token1 = CancellationToken::new();
    let mut config = worker.config(&m.endpoint(), 1.0);
    config.memory_bytes = 1 << 30;
    let agent1 = tokio::spawn(converge_agent::run(config, token1.clone()));
    let reg = m.registered(T).await;
    assert_eq!(reg.worker_id, worker.id);
    assert_eq!(reg.cpu_capacity, 1.0);
    assert!(
        reg.containers.is_empty(),
        "a fresh worker runs nothing: {reg:?}"
    );
    // The worker's capacity is its parent cgroup's quota.
    let parent = worker.cpu_cgroup_dir();
    assert_eq!(
        std::fs::read_to_string(parent.join("cpu.cfs_quota_us"))
            .unwrap()
            .trim(),
        "100000"
    );
    let memory_parent = std::path::Path::new("/sys/fs/cgroup/memory")
        .join(worker.cgroup_parent.trim_start_matches('/'));
    assert_eq!(
        std::fs::read_to_string(memory_parent.join("memory.limit_in_bytes"))
            .unwrap()
            .trim(),
        "1073741824",
        "the worker's memory capacity is enforced too"
    );

    m.send(command(
        "c1",
        "job-a",
        1,
        start_trainer(5_000_000, 500, 0.5),
    ));
    let r = m.result("c1", T).await;
    assert!(r.ok, "start failed: {}", r.error);
    let Some(Detail::Started(started)) = r.detail else {
        panic!("no Started detail: {r:?}")
    };
    let cid = started.container_id;

    let samples = m.samples("job-a", 5, T).await;
    assert!(
        samples
            .iter()
            .all(|s| s.epoch == 1 && s.metric == "loss" && s.value.is_some())
    );
    assert!(
        samples.windows(2).all(|w| w[0].step < w[1].step),
        "steps increase"
    );

    let cores = m
        .wait_for("a usage sample with CPU use", T, |s| match s {
            Seen::Msg(Kind::Usage(u)) => u
                .samples
                .iter()
                .find(|x| x.job_id == "job-a" && x.cpu_cores > 0.05)
                .map(|x| (x.cpu_cores, x.memory_bytes)),
            _ => None,
        })
        .await;
    assert!(
        cores.0 < 0.75,
        "the 0.5-core limit holds (saw {} cores)",
        cores.0
    );
    assert!(cores.1 > 0, "memory is reported");

    // A limit above the worker's capacity is clamped to it.
    m.send(command(
        "c2",
        "job-a",
        1,
        Action::SetLimits(pb::SetLimits {
            cpus: 3.0,
            cpu_shares: 512,
        }),
    ));
    let r = m.result("c2", T).await;
    assert!(r.ok, "set limits failed: {}", r.error);
    assert_eq!(
        r.detail,
        Some(Detail::Limits(pb::LimitsApplied {
            cpus: 1.0,
            cpu_shares: 512
        }))
    );
    let hc = docker
        .inspect_container(&cid, None)
        .await
        .unwrap()
        .host_config
        .unwrap();
    assert_eq!(hc.nano_cpus, Some(1_000_000_000));
    assert_eq!(hc.cpu_shares, Some(512));
    assert_eq!(
        hc.cgroup_parent.as_deref(),
        Some(worker.cgroup_parent.as_str())
    );
    assert_eq!(
        std::fs::read_to_string(parent.join(&cid).join("cpu.cfs_quota_us"))
            .unwrap()
            .trim(),
        "100000"
    );

    // Idempotency and fencing.
    m.send(command(
        "c2",
        "job-a",
        1,
        Action::SetLimits(pb::SetLimits {
            cpus: 0.2,
            cpu_shares: 0,
        }),
    ));
    let r = m.result("c2", T).await;
    assert!(r.replayed && r.ok, "a repeated id is replayed: {r:?}");
    assert_eq!(
        docker
            .inspect_container(&cid, None)
            .await
            .unwrap()
            .host_config
            .unwrap()
            .nano_cpus,
        Some(1_000_000_000),
        "a replayed command is not executed again"
    );
    m.send(command("c3", "job-a", 0, Action::Pause(pb::Pause {})));
    let r = m.result("c3", T).await;
    assert!(!r.ok);
    assert_eq!(r.error, "stale epoch 0 < 1");

    // The agent dies mid-job (its task is aborted, as a test plays SIGKILL): its session goes
    // with it, and the container keeps running.
    agent1.abort();
    let _ = agent1.await;
    m.wait_for("the dead agent's stream to end", T, |s| {
        matches!(s, Seen::Disconnected(_)).then_some(())
    })
    .await;
    drop(token1);
    assert_eq!(worker.containers(), vec![cid.clone()]);
    let running = docker
        .inspect_container(&cid, None)
        .await
        .unwrap()
        .state
        .unwrap()
        .running;
    assert_eq!(running, Some(true));

    // A new agent re-adopts it and reports it in its registration.
    let token2 = CancellationToken::new();
    let agent2 = tokio::spawn(converge_agent::run(
        worker.config(&m.endpoint(), 1.0),
        token2.clone(),
    ));
    let reg = m.registered(T).await;
    assert_eq!(reg.containers.len(), 1, "{reg:?}");
    let c = &reg.containers[0];
    assert_eq!(
        (c.job_id.as_str(), c.epoch, c.container_id.as_str()),
        ("job-a", 1, cid.as_str())
    );
    assert_eq!(c.state, pb::ContainerState::Running as i32);
    let adopted_step = c.last_step.expect("last step recovered from the log tail");

    // Progress continues from where it was, without replaying the old log.
    let after = m.samples("job-a", 3, T).await;
    assert!(
        after[0].step >= adopted_step,
        "old lines are not sent again: {} < {adopted_step}",
        after[0].step
    );

    // A repeated Start of the same incarnation never starts a second container.
    m.send(command(
        "c4",
        "job-a",
        1,
        start_trainer(5_000_000, 500, 0.5),
    ));
    let r = m.result("c4", T).await;
    assert!(r.ok, "{r:?}");
    assert_eq!(
        r.detail,
        Some(Detail::Started(pb::Started {
            container_id: cid.clone(),
            from_checkpoint: false
        }))
    );
    assert_eq!(
        worker.containers(),
        vec![cid.clone()],
        "no second container"
    );

    // The adopted epoch fences older commands in the new agent too.
    m.send(command("c5", "job-a", 0, Action::Pause(pb::Pause {})));
    assert_eq!(m.result("c5", T).await.error, "stale epoch 0 < 1");

    // Save: SIGTERM, the trainer checkpoints and exits 0.
    let (saved, exited) = m.save(("c6", "job-a", 1), 10_000, T).await;
    assert!(!saved.killed);
    assert!(saved.checkpoint_bytes > 0);
    assert!(saved.step >= adopted_step);
    assert_eq!(saved.checkpoint_dir, "job-a");
    assert!(
        worker
            .checkpoint_root
            .join("job-a")
            .read_dir()
            .unwrap()
            .next()
            .is_some()
    );
    assert_eq!(exited.exit_code, 0);
    assert!(exited.requested, "a saved job's exit was asked for");
    assert!(!exited.done);

    // The reported container is removed; the empty worker cgroup goes on shutdown.
    let deadline = tokio::time::Instant::now() + T;
    while !worker.containers().is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        worker.containers().is_empty(),
        "exited container removed after its report"
    );
    token2.cancel();
    agent2.await.unwrap().expect("second agent ends cleanly");
    assert!(!parent.exists(), "worker cgroup removed on clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_job_reports_done_then_its_exit() {
    require_docker_and_trainer().await;
    let worker = TestWorker::new("done");
    let (mut m, token, agent) = agent_for(&worker, 1.0, T).await;

    m.send(command("s1", "job-d", 3, start_trainer(3000, 100, 0.0)));
    let r = m.result("s1", T).await;
    assert!(r.ok, "{r:?}");
    let mut samples = Vec::new();
    let exited = m
        .wait_for("the exit of job-d", T, |s| match s {
            Seen::Msg(Kind::Progress(b)) => {
                samples.extend(b.samples.iter().filter(|x| x.job_id == "job-d").cloned());
                None
            }
            Seen::Msg(Kind::Exited(e)) if e.job_id == "job-d" => Some(e.clone()),
            _ => None,
        })
        .await;
    assert_eq!(exited.exit_code, 0);
    assert!(
        exited.done,
        "the done line was seen before the exit was reported"
    );
    assert!(!exited.requested);
    assert_eq!(exited.epoch, 3);
    assert_eq!(exited.last_step, Some(3000));
    assert!(
        samples.len() >= 5,
        "every progress line arrives: {}",
        samples.len()
    );
    assert!(
        samples.last().unwrap().done,
        "the done sample precedes the exit"
    );

    // This manager never acknowledges the exit: after a break the agent lists the container
    // exited with that exit (it is sent again next), so that a manager reads the exit with
    // the registration, before it decides anything about a job that no longer runs.
    m.cut();
    let reg = m.registered(T).await;
    let listed = (reg.containers.iter())
        .find(|c| c.job_id == "job-d")
        .expect("the exited container is listed until its exit is acknowledged");
    assert_eq!(listed.state, pb::ContainerState::Exited as i32);
    assert_eq!(listed.exit.as_ref(), Some(&exited), "{listed:?}");

    token.cancel();
    agent.await.unwrap().unwrap();
}

/// A job that names its own user runs as that user, not as root, and can still write its
/// checkpoint: the agent gives the job's checkpoint directory to that user before the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_with_its_own_user_runs_as_that_user_and_checkpoints() {
    use std::os::unix::fs::MetadataExt;
    let docker = require_docker_and_trainer().await;
    let worker = TestWorker::new("user");
    let (mut m, token, agent) = agent_for(&worker, 1.0, T).await;

    let mut start = start_trainer(1_000_000, 100, 0.0);
    if let Action::Start(s) = &mut start {
        s.spec.as_mut().unwrap().user = "1000:1000".into();
    }
    m.send(command("u1", "job-u", 1, start));
    let r = m.result("u1", T).await;
    assert!(r.ok, "{r:?}");
    m.samples("job-u", 1, T).await;

    let ids = worker.containers();
    assert_eq!(ids.len(), 1, "{ids:?}");
    let inspect = docker
        .inspect_container(&ids[0], None)
        .await
        .expect("inspect the job's container");
    let user = inspect.config.and_then(|c| c.user);
    assert_eq!(user.as_deref(), Some("1000:1000"));

    let (saved, exited) = m.save(("u2", "job-u", 1), 10_000, T).await;
    assert!(!saved.killed, "the trainer saved in time: {saved:?}");
    assert!(saved.checkpoint_bytes > 0, "{saved:?}");
    assert_eq!(exited.exit_code, 0, "{exited:?}");

    // The directory was given to the job's user, and what is in it was written by that user.
    let dir = worker.checkpoint_root.join("job-u");
    let meta = std::fs::metadata(&dir).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (1000, 1000));
    let files: Vec<_> = dir.read_dir().unwrap().flatten().collect();
    assert!(!files.is_empty(), "a checkpoint was written");
    for f in files {
        let meta = f.metadata().unwrap();
        assert_eq!(
            meta.uid(),
            1000,
            "{} written by uid {}",
            f.path().display(),
            meta.uid()
        );
    }

    token.cancel();
    agent.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_resume_and_stop() {
    let docker = require_docker_and_trainer().await;
    let worker = TestWorker::new("stop");
    let (mut m, token, agent) = agent_for(&worker, 0.5, T).await;

    m.send(command(
        "p1",
        "job-p",
        1,
        start_trainer(5_000_000, 1000, 0.5),
    ));
    let r = m.result("p1", T).await;
    let Some(Detail::Started(s)) = r.detail else {
        panic!("{r:?}")
    };
    m.samples("job-p", 1, T).await;

    m.send(command("p2", "job-p", 1, Action::Pause(pb::Pause {})));
    assert!(m.result("p2", T).await.ok);
    let st = docker
        .inspect_container(&s.container_id, None)
        .await
        .unwrap()
        .state
        .unwrap();
    assert_eq!(st.paused, Some(true));
    m.send(command("p3", "job-p", 1, Action::Resume(pb::Resume {})));
    assert!(m.result("p3", T).await.ok);
    let st = docker
        .inspect_container(&s.container_id, None)
        .await
        .unwrap()
        .state
        .unwrap();
    assert_eq!(st.paused, Some(false));

    // Commands for a job the worker does not run say so.
    m.send(command("p4", "job-nope", 1, Action::Pause(pb::Pause {})));
    let r = m.result("p4", T).await;
    assert!(
        !r.ok && r.error.contains("no running container of job job-nope"),
        "{r:?}"
    );

    m.send(command(
        "p5",
        "job-p",
        1,
        Action::Stop(pb::Stop {
            reason: "test".into(),
            remove: true,
            discard: false,
        }),
    ));
    let (r, exited) = m.result_and_exit("p5", "job-p", T).await;
    assert!(r.ok, "{r:?}");
    assert!(exited.requested);
    assert!(!exited.done);

    token.cancel();
    agent.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_image_is_an_error_a_person_can_act_on() {
    require_docker_and_trainer().await;
    let worker = TestWorker::new("noimage");
    let (mut m, token, agent) = agent_for(&worker, 1.0, T).await;
    let mut action = start_trainer(10, 1, 1.0);
    if let Action::Start(s) = &mut action {
        s.spec.as_mut().unwrap().image = "converge/does-not-exist:dev".into();
    }
    m.send(command("x1", "job-x", 1, action));
    let r = m.result("x1", T).await;
    assert!(!r.ok);
    assert!(
        r.error.contains("converge/does-not-exist:dev") && r.error.contains("build or load"),
        "{}",
        r.error
    );
    assert!(worker.containers().is_empty());
    token.cancel();
    agent.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_save_past_its_deadline_kills_the_container() {
    require_docker_and_trainer().await;
    let worker = TestWorker::new("kill");
    let (mut m, token, agent) = agent_for(&worker, 1.0, T).await;
    // The trainer's fault injection makes it ignore SIGTERM, as a misbehaving image would, so
    // the kill is certain (a well-behaved trainer can finish its save inside any short
    // deadline and exit 0 before the kill lands).
    let mut start = start_trainer(5_000_000, 500, 0.1);
    if let Action::Start(s) = &mut start {
        s.spec
            .as_mut()
            .unwrap()
            .args
            .push("--ignore-sigterm".into());
    }
    m.send(command("k1", "job-k", 2, start));
    let started = m.result("k1", T).await;
    assert!(started.ok, "the Start failed: {}", started.error);
    m.samples("job-k", 1, T).await;
    let (saved, exited) = m.save(("k2", "job-k", 2), 500, T).await;
    assert!(saved.killed, "{saved:?}");
    assert!(exited.requested);
    assert_ne!(exited.exit_code, 0, "a killed container does not exit 0");
    token.cancel();
    agent.await.unwrap().unwrap();
}

/// A job process with no SIGTERM handler (an image that never installs one, or any job
/// stopped while it starts) stops at the stop's SIGTERM: an init is its PID 1 and passes the
/// signal on. As PID 1 itself the kernel would drop the signal and the job would hold its CPU
/// until the deadline's SIGKILL (exit 137), which is what a new user saw of a job cancelled
/// as it started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_without_a_sigterm_handler_ends_at_the_stops_sigterm() {
    require_docker_and_trainer().await;
    let worker = TestWorker::new("unhandled");
    let (mut m, token, agent) = agent_for(&worker, 1.0, T).await;
    let mut start = start_trainer(5_000_000, 500, 0.5);
    if let Action::Start(s) = &mut start {
        let args = &mut s.spec.as_mut().unwrap().args;
        args.push("--unhandled-sigterm".into());
    }
    m.send(command("u1", "job-u", 1, start));
    let started = m.result("u1", T).await;
    assert!(started.ok, "the Start failed: {}", started.error);
    m.samples("job-u", 1, T).await;
    m.send(command(
        "u2",
        "job-u",
        1,
        Action::Stop(pb::Stop {
            reason: "test".into(),
            remove: true,
            discard: false,
        }),
    ));
    let (r, exited) = m.result_and_exit("u2", "job-u", T).await;
    assert!(r.ok, "{r:?}");
    assert!(exited.requested);
    assert_eq!(
        exited.exit_code, 143,
        "ended by SIGTERM (128 + 15), not by the deadline's SIGKILL (137)"
    );
    token.cancel();
    agent.await.unwrap().unwrap();
}

/// An agent that fails to start after it made its worker cgroup (here, a checkpoint root it
/// cannot create) removes the cgroup again: a new user found one left for every failed start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_fails_to_start_leaves_no_cgroup() {
    require_docker_and_trainer().await;
    let worker = TestWorker::new("failed-start");
    let mut config = worker.config("http://127.0.0.1:9", 1.0);
    config.checkpoint_root = "/proc/converge-cannot-be-made".into();
    let failed = converge_agent::run(config, CancellationToken::new()).await;
    let e = failed.expect_err("a checkpoint root under /proc cannot be made");
    assert!(
        e.to_string().contains("/proc/converge-cannot-be-made"),
        "{e}"
    );
    assert!(
        !worker.cpu_cgroup_dir().exists(),
        "the worker cgroup {} was left behind",
        worker.cpu_cgroup_dir().display()
    );
}
