//! The `converge/agent:dev` image run the way the compose testbed runs it: unprivileged, with
//! the Docker socket, the host's cgroup filesystem and the checkpoint root bind-mounted. It
//! must enforce the worker's capacity, run a job and read its usage from cgroup files.
//!
//! Needs `cargo xtask images agent trainer`.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{Manager, Seen, TestWorker, command, require_docker_and_trainer, start_trainer};
use converge_messenger::pb::agent_message::Kind;
use converge_messenger::pb::command_result::Detail;

const AGENT_IMAGE: &str = "converge/agent:dev";
const T: Duration = Duration::from_secs(30);

/// Removes the agent container however the test ends.
struct AgentContainer(String);

impl Drop for AgentContainer {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rm", "-f", &self.0]).output();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_image_runs_jobs_unprivileged_with_bind_mounts() {
    let docker = require_docker_and_trainer().await;
    if docker.inspect_image(AGENT_IMAGE).await.is_err() {
        panic!("image {AGENT_IMAGE} is missing: build it with `cargo xtask images agent`");
    }
    let worker = TestWorker::new("image");
    std::fs::create_dir_all(&worker.checkpoint_root).unwrap();
    let mut m = Manager::start().await;
    let name = format!("converge-agent-{}", worker.id);
    let root = worker.checkpoint_root.display().to_string();
    let out = Command::new("docker")
        .args(["run", "-d", "--name", &name, "--network", "host"])
        .args(["-v", "/var/run/docker.sock:/var/run/docker.sock"])
        .args(["-v", "/sys/fs/cgroup:/sys/fs/cgroup"])
        .args(["-v", &format!("{root}:{root}")])
        .args(["-e", &format!("CONVERGE_MANAGER={}", m.endpoint())])
        .args(["-e", &format!("CONVERGE_WORKER_ID={}", worker.id)])
        .args(["-e", "CONVERGE_CPUS=1"])
        .args([
            "-e",
            &format!("CONVERGE_CGROUP_PARENT={}", worker.cgroup_parent),
        ])
        .args(["-e", &format!("CONVERGE_CHECKPOINT_ROOT={root}")])
        .args(["-e", "CONVERGE_USAGE_INTERVAL=300ms"])
        .arg(AGENT_IMAGE)
        .output()
        .expect("docker CLI");
    assert!(
        out.status.success(),
        "docker run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _agent = AgentContainer(name.clone());

    let reg = m.registered(T).await;
    assert_eq!(reg.worker_id, worker.id);
    assert_eq!(
        std::fs::read_to_string(worker.cpu_cgroup_dir().join("cpu.cfs_quota_us"))
            .unwrap()
            .trim(),
        "100000",
        "the containerized agent set the worker's quota"
    );
    m.send(command(
        "i1",
        "job-i",
        1,
        start_trainer(5_000_000, 500, 0.5),
    ));
    let r = m.result("i1", T).await;
    assert!(matches!(r.detail, Some(Detail::Started(_))), "{r:?}");
    m.samples("job-i", 3, T).await;
    m.wait_for("usage with CPU use", T, |s| match s {
        Seen::Msg(Kind::Usage(u)) => u
            .samples
            .iter()
            .any(|x| x.job_id == "job-i" && x.cpu_cores > 0.05)
            .then_some(()),
        _ => None,
    })
    .await;
    let logs = Command::new("docker")
        .args(["logs", &name])
        .output()
        .unwrap();
    let logs = String::from_utf8_lossy(&logs.stderr);
    assert!(
        !logs.contains("using the Docker stats API"),
        "usage must come from cgroup files inside the container too: {logs}"
    );
    // SIGTERM (docker stop) ends the agent cleanly and leaves the job running.
    let out = Command::new("docker")
        .args(["stop", "-t", "10", &name])
        .output()
        .unwrap();
    assert!(out.status.success());
    let code = Command::new("docker")
        .args(["inspect", "-f", "{{.State.ExitCode}}", &name])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&code.stdout).trim(), "0");
    assert_eq!(worker.containers().len(), 1, "the job keeps running");
}
