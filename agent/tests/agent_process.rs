//! The `converge-agent` binary as a process: killed with SIGKILL mid-job and started again, it
//! re-adopts the running container (no second one appears) and reports the exit of a container
//! that finished while no agent watched it. Also: invalid settings exit with code 64.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{Manager, Seen, TestWorker, command, require_docker_and_trainer, start_trainer};
use converge_messenger::pb;
use converge_messenger::pb::agent_message::Kind;
use converge_messenger::pb::command_result::Detail;

const T: Duration = Duration::from_secs(30);
const BIN: &str = env!("CARGO_BIN_EXE_converge-agent");

/// Kills the agent process when the test ends, however it ends.
struct AgentProcess(Child);

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_agent(worker: &TestWorker, manager: &str, cpus: f64) -> AgentProcess {
    let child = Command::new(BIN)
        .args(["--manager", manager, "--worker-id", &worker.id])
        .args(["--cpus", &cpus.to_string()])
        .args(["--cgroup-parent", &worker.cgroup_parent])
        .arg("--checkpoint-root")
        .arg(&worker.checkpoint_root)
        .args(["--heartbeat-interval", "200ms", "--usage-interval", "300ms"])
        .env("RUST_LOG", "converge_agent=debug")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting the converge-agent binary");
    AgentProcess(child)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_agent_is_replaced_and_the_new_one_readopts() {
    let docker = require_docker_and_trainer().await;
    let worker = TestWorker::new("sigkill");
    let mut m = Manager::start().await;

    let mut first = spawn_agent(&worker, &m.endpoint(), 2.0);
    m.registered(T).await;
    m.send(command(
        "k1",
        "job-long",
        1,
        start_trainer(5_000_000, 500, 1.0),
    ));
    let r = m.result("k1", T).await;
    let Some(Detail::Started(long)) = r.detail else {
        panic!("{r:?}")
    };
    // ~2500 steps/s on one core: this one finishes a few seconds after the kill.
    m.send(command("k2", "job-short", 4, start_trainer(8000, 500, 1.0)));
    let r = m.result("k2", T).await;
    let Some(Detail::Started(short)) = r.detail else {
        panic!("{r:?}")
    };
    m.samples("job-long", 2, T).await;

    // SIGKILL: no cleanup at all.
    first.0.kill().unwrap();
    first.0.wait().unwrap();
    m.wait_for("the first agent's disconnect", T, |s| {
        matches!(s, Seen::Disconnected(_)).then_some(())
    })
    .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let st = docker
            .inspect_container(&short.container_id, None)
            .await
            .unwrap()
            .state
            .unwrap();
        if st.running == Some(false) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "short job did not finish"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let _second = spawn_agent(&worker, &m.endpoint(), 2.0);
    let reg = m.registered(T).await;
    let running: Vec<&pb::ContainerReport> = reg
        .containers
        .iter()
        .filter(|c| c.state == pb::ContainerState::Running as i32)
        .collect();
    assert_eq!(running.len(), 1, "{reg:?}");
    assert_eq!(running[0].container_id, long.container_id);
    assert_eq!(running[0].job_id, "job-long");
    // The finished one is listed as exited, so the manager does not take it for lost before
    // the exit report arrives.
    let finished: Vec<&pb::ContainerReport> = reg
        .containers
        .iter()
        .filter(|c| c.state == pb::ContainerState::Exited as i32)
        .collect();
    assert_eq!(finished.len(), 1, "{reg:?}");
    assert_eq!(finished[0].job_id, "job-short");
    assert_eq!(finished[0].exit_code, Some(0));
    assert_eq!(finished[0].last_step, Some(8000));
    let exited = m.exited("job-short", T).await;
    assert_eq!(exited.epoch, 4);
    assert_eq!(exited.exit_code, 0);
    assert!(exited.done, "the done line is found in the log tail");
    assert_eq!(exited.last_step, Some(8000));

    // The adopted job keeps reporting; only its container remains (the finished one is
    // removed once reported), and nothing was started twice.
    m.wait_for("progress of the adopted job", T, |s| match s {
        Seen::Msg(Kind::Progress(b)) => b
            .samples
            .iter()
            .any(|x| x.job_id == "job-long")
            .then_some(()),
        _ => None,
    })
    .await;
    let deadline = tokio::time::Instant::now() + T;
    while worker.containers().len() > 1 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(worker.containers(), vec![long.container_id.clone()]);
}

/// The agent binary run with `args` alone (no `CONVERGE_*` setting from the environment):
/// its exit code and stderr.
fn agent_with(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(BIN)
        .args(args)
        .env_remove("CONVERGE_CPUS")
        .env_remove("CONVERGE_MANAGER")
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn invalid_settings_exit_with_64_and_name_the_setting() {
    let manager = ["--manager", "http://127.0.0.1:1", "--worker-id", "w"];
    let (code, err) = agent_with(&[&manager[..], &["--cpus", "0"]].concat());
    assert_eq!(code, Some(64));
    assert!(err.contains("--cpus"), "{err}");

    let (code, _) = agent_with(&["--worker-id", "w", "--cpus", "1"]);
    assert_eq!(code, Some(64), "a missing setting is a usage error");

    let (code, err) = agent_with(&["--manager", "tcp://x", "--worker-id", "w", "--cpus", "1"]);
    assert_eq!(code, Some(64));
    assert!(err.contains("--manager"), "{err}");

    // A setting from the settings file: the parser calls it a flag, and the file is named.
    let dir = std::env::temp_dir().join(format!("converge-agent-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("agent.toml");
    std::fs::write(&file, "cpu = 2\n").unwrap();
    let config = file.display().to_string();
    let (code, err) = agent_with(&[&manager[..], &["--cpus", "1", "--config", &config]].concat());
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(code, Some(64));
    assert!(
        err.contains(&format!("`cpu` is set in the settings file {config}")),
        "{err}"
    );
}
