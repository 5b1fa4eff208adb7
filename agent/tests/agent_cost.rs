//! What the agent costs while it watches 20 containers (design budget: under 1% of a core).
//!
//! Measured here (2 shared cores, release binary of the image, 20 trainers at 0.02 cores,
//! usage every 1 s, heartbeat every 1 s): 0.54% of a core relaying 34 progress lines/s
//! (`CONVERGE_COST_REPORT_EVERY=100`), 1.5% at 295 lines/s (every 10 steps); the debug build
//! takes about 3.5 times as much. Per line the agent spends ~50 µs (one HTTP chunk of the
//! log stream, JSON parse, batching, protobuf), so a job that prints progress many times a
//! second costs more than the 1 s usage and heartbeat rounds.
//!
//! `cargo test -p converge-agent --test agent_cost -- --ignored --nocapture`; set
//! `CONVERGE_AGENT_BIN` to measure another build (e.g. the release binary of the image).

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Manager, TestWorker, command, require_docker_and_trainer, start_trainer};

const BIN: &str = env!("CARGO_BIN_EXE_converge-agent");
const T: Duration = Duration::from_secs(60);

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn cpu_ticks(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = s.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, not a test: run with --ignored --nocapture"]
async fn agent_cpu_while_watching_twenty_containers() {
    require_docker_and_trainer().await;
    let worker = TestWorker::new("cost");
    let mut m = Manager::start().await;
    let agent = Kill(
        Command::new(std::env::var("CONVERGE_AGENT_BIN").unwrap_or_else(|_| BIN.to_string()))
            .args([
                "--manager",
                &m.endpoint(),
                "--worker-id",
                &worker.id,
                "--cpus",
                "1",
            ])
            .args(["--cgroup-parent", &worker.cgroup_parent])
            .arg("--checkpoint-root")
            .arg(&worker.checkpoint_root)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    m.registered(T).await;
    const N: usize = 20;
    let report_every: u64 = std::env::var("CONVERGE_COST_REPORT_EVERY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    for i in 0..N {
        // 0.02 cores each; a progress line every `report_every` steps.
        m.send(command(
            &format!("s{i}"),
            &format!("job-{i}"),
            1,
            start_trainer(100_000_000, report_every, 0.02),
        ));
        let r = m.result(&format!("s{i}"), T).await;
        assert!(r.ok, "{r:?}");
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pid = agent.0.id();
    let window = Duration::from_secs(20);
    let (c0, t0) = (cpu_ticks(pid), Instant::now());
    let mut samples = 0usize;
    m.wait_for(
        "the measurement window",
        window + Duration::from_secs(5),
        |s| {
            if let common::Seen::Msg(converge_messenger::pb::agent_message::Kind::Progress(b)) = s {
                samples += b.samples.len();
            }
            (t0.elapsed() >= window).then_some(())
        },
    )
    .await;
    let cpu = Duration::from_millis((cpu_ticks(pid) - c0) * 10);
    let share = cpu.as_secs_f64() / t0.elapsed().as_secs_f64();
    println!(
        "agent watching {N} containers for {:?}: {:?} CPU = {:.2}% of a core; {samples} progress samples relayed ({:.0}/s)",
        t0.elapsed(),
        cpu,
        share * 100.0,
        samples as f64 / t0.elapsed().as_secs_f64()
    );
}
