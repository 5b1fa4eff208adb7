//! Measures what one usage sample of one container costs, read from cgroup files and from the
//! Docker stats API (the numbers in `monitor`'s module doc come from here).
//!
//! `cargo test -p converge-agent --test usage_cost -- --ignored --nocapture`

mod common;

use std::time::{Duration, Instant};

use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{CreateContainerOptionsBuilder, RemoveContainerOptionsBuilder};
use common::{TRAINER_IMAGE, TestWorker, require_docker_and_trainer};
use converge_agent::cgroup::WorkerCgroup;
use converge_agent::monitor::stats_usage;

/// CPU time (user + system) of a process, from /proc/<pid>/stat, in clock ticks.
fn cpu_ticks(pid: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are the 14th and 15th.
    let rest = s.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
}

fn dockerd_pid() -> Option<String> {
    let out = std::process::Command::new("pidof")
        .arg("dockerd")
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .map(String::from)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, not a test: run with --ignored --nocapture"]
async fn usage_from_cgroup_files_vs_the_stats_api() {
    let docker = require_docker_and_trainer().await;
    let worker = TestWorker::new("bench");
    let cg = WorkerCgroup::detect("/sys/fs/cgroup".as_ref(), &worker.cgroup_parent).unwrap();
    let _lease = cg.create(1.0).unwrap();
    let name = format!("converge-{}-bench", worker.id);
    let body = ContainerCreateBody {
        image: Some(TRAINER_IMAGE.into()),
        cmd: Some(
            [
                "--model",
                "mlp-digits",
                "--threads",
                "1",
                "--steps",
                "100000000",
                "--report-every",
                "100000",
            ]
            .map(String::from)
            .to_vec(),
        ),
        labels: Some([("converge.worker".to_string(), worker.id.clone())].into()),
        host_config: Some(HostConfig {
            cgroup_parent: Some(cg.docker_parent()),
            nano_cpus: Some(200_000_000),
            ..Default::default()
        }),
        ..Default::default()
    };
    let id = docker
        .create_container(
            Some(CreateContainerOptionsBuilder::new().name(&name).build()),
            body,
        )
        .await
        .unwrap()
        .id;
    docker.start_container(&id, None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;

    let paths = cg.container_usage_paths(&id);
    let me = std::process::id().to_string();
    let dockerd = dockerd_pid();
    let ticks = |pid: &Option<String>| pid.as_deref().map(cpu_ticks).unwrap_or(0);

    const N_FILES: u32 = 5000;
    let (c0, d0, t0) = (cpu_ticks(&me), ticks(&dockerd), Instant::now());
    for _ in 0..N_FILES {
        std::hint::black_box(paths.read().unwrap());
    }
    let (files_wall, files_me, files_dockerd) = (
        t0.elapsed() / N_FILES,
        cpu_ticks(&me) - c0,
        ticks(&dockerd) - d0,
    );

    const N_STATS: u32 = 200;
    let (c0, d0, t0) = (cpu_ticks(&me), ticks(&dockerd), Instant::now());
    for _ in 0..N_STATS {
        std::hint::black_box(stats_usage(&docker, &id).await.unwrap());
    }
    let (stats_wall, stats_me, stats_dockerd) = (
        t0.elapsed() / N_STATS,
        cpu_ticks(&me) - c0,
        ticks(&dockerd) - d0,
    );

    // Clock ticks are 10 ms (USER_HZ 100).
    let per = |ticks: u64, n: u32| Duration::from_millis(ticks * 10) / n;
    println!("usage sample of one container ({N_FILES} cgroup reads, {N_STATS} stats calls):");
    println!(
        "  cgroup files : {files_wall:?} wall, {:?} agent CPU, {:?} dockerd CPU per sample",
        per(files_me, N_FILES),
        per(files_dockerd, N_FILES)
    );
    println!(
        "  stats API    : {stats_wall:?} wall, {:?} agent CPU, {:?} dockerd CPU per sample",
        per(stats_me, N_STATS),
        per(stats_dockerd, N_STATS)
    );
    println!(
        "  ratio (wall) : stats API costs {:.0}x the cgroup read",
        stats_wall.as_secs_f64() / files_wall.as_secs_f64()
    );
    let _ = docker
        .remove_container(
            &id,
            Some(RemoveContainerOptionsBuilder::new().force(true).build()),
        )
        .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    cg.remove_if_empty();
    assert!(
        files_wall < stats_wall,
        "cgroup files are the cheaper source"
    );
}
