//! Measuring the worker's calibration coefficient at start (value-based-allocation.txt:57: ζ_i
//! is "a ratio between empirically measured execution time of a set of container benchmarks on
//! node N_i divided by the execution time of the same set of container benchmarks on a
//! reference unit"; :120 has the DockerWorker report that ratio).
//!
//! The benchmark is the reference workload itself: [`REFERENCE_ARGS`] of the trainer image,
//! one thread, run [`REPETITIONS`] times one after the other in a container under the worker's
//! cgroup parent, so it gets what a job here gets (the worker's CPU capacity and the host's
//! speed). Each run's seconds per step come from the trainer's own final progress line
//! (`elapsed_s`, training time only: no container start-up, no data loading). The wire carries a
//! speed (1.0 = reference, 1.5 = 50% faster, ζ = 1/speed): `REFERENCE_S_PER_STEP / s_per_step`
//! of the fastest run. The fastest, because everything else on the host can only add time; the
//! spread (slowest over fastest, minus one) is logged so a noisy measurement is visible. On a
//! host shared with other work the measurement sees that load too: pass `--calibration` there.
//!
//! An agent restarting on a worker whose jobs still run would measure under their load, so
//! [`calibrate`] keeps the last measurement in the checkpoint root and reuses it then.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bollard::Docker;
use bollard::models::ContainerCreateBody;
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, ListContainersOptionsBuilder, LogsOptionsBuilder,
    RemoveContainerOptionsBuilder, WaitContainerOptionsBuilder,
};
use futures::StreamExt;
use tracing::{info, warn};

/// The image the benchmark runs (`cargo xtask images trainer` builds it).
pub const REFERENCE_IMAGE: &str = "converge/trainer:dev";

/// The benchmark: `mlp-digits --size 8` (about 3 ms of CPU a step) for 300 steps, reporting
/// (and so evaluating the held-out loss) every 1% of the run as the trainer's calibration table
/// does, on one thread. About 1 s of CPU.
pub const REFERENCE_ARGS: &[&str] = &[
    "--model",
    "mlp-digits",
    "--size",
    "8",
    "--steps",
    "300",
    "--report-every",
    "3",
    "--threads",
    "1",
];

/// Seconds per step of the benchmark on the reference worker: the CPU seconds per step of
/// `mlp-digits --size 8` at one thread in trainer/README.md ("Calibration", table "--size 8"),
/// measured on the project's 2-core VM. That VM at one core is the reference worker (speed 1).
pub const REFERENCE_S_PER_STEP: f64 = 0.003230;

/// Runs of the benchmark.
pub const REPETITIONS: usize = 3;

/// How long one run may take before the measurement is abandoned (30× its reference time).
const RUN_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a measurement failed.
#[derive(Debug, thiserror::Error)]
pub enum CalibrationError {
    /// A Docker request failed.
    #[error("{what}: {source}")]
    Docker {
        /// The request.
        what: &'static str,
        /// Docker's answer.
        #[source]
        source: bollard::errors::Error,
    },
    /// The benchmark image is not on this host.
    #[error(
        "image {REFERENCE_IMAGE} is not on this host: build it (`cargo xtask images trainer`) \
         or set --calibration to a number"
    )]
    NoImage,
    /// A run did not end in time.
    #[error("a benchmark run took over {RUN_TIMEOUT:?}")]
    Timeout,
    /// A run ended without its final progress line.
    #[error("a benchmark run printed no final progress line with its time (exit: {0})")]
    NoResult(String),
}

/// A finished measurement.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    /// Speed relative to the reference worker (what `Register.calibration` carries).
    pub speed: f64,
    /// Seconds per step of each run, in run order.
    pub s_per_step: Vec<f64>,
    /// Slowest run over fastest run, minus one (0.05 = the runs differ by 5%).
    pub spread: f64,
}

impl Measurement {
    /// The measurement from each run's seconds per step (none empty, all positive).
    pub fn from_runs(s_per_step: Vec<f64>) -> Option<Self> {
        let fastest = s_per_step.iter().copied().reduce(f64::min)?;
        let slowest = s_per_step.iter().copied().reduce(f64::max)?;
        if !(fastest > 0.0 && slowest.is_finite()) {
            return None;
        }
        Some(Measurement {
            speed: REFERENCE_S_PER_STEP / fastest,
            spread: slowest / fastest - 1.0,
            s_per_step,
        })
    }
}

/// Where the last measurement of `worker_id` is kept (one small text file per worker in the
/// checkpoint root, which survives agent restarts).
pub fn saved_path(checkpoint_root: &Path, worker_id: &str) -> PathBuf {
    checkpoint_root.join(format!(".converge-calibration-{worker_id}"))
}

/// The worker's speed: measured, or the last measurement when jobs of this worker already run
/// (an agent restart) and one is kept.
pub async fn calibrate(
    docker: &Docker,
    worker_id: &str,
    checkpoint_root: &Path,
    cgroup_parent: &str,
    pids_limit: i64,
) -> Result<f64, CalibrationError> {
    let path = saved_path(checkpoint_root, worker_id);
    let filters: HashMap<&str, Vec<String>> = HashMap::from([
        (
            "label",
            vec![format!("{}={worker_id}", crate::docker::LABEL_WORKER)],
        ),
        ("status", vec!["running".to_string(), "paused".to_string()]),
    ]);
    let busy = docker
        .list_containers(Some(
            ListContainersOptionsBuilder::new()
                .filters(&filters)
                .build(),
        ))
        .await
        .map_err(|source| CalibrationError::Docker {
            what: "listing the worker's containers",
            source,
        })?
        .len();
    if busy > 0 {
        let saved = std::fs::read_to_string(&path)
            .ok()
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s > 0.0);
        if let Some(speed) = saved {
            info!(
                speed,
                busy,
                file = %path.display(),
                "jobs already run on this worker: reusing its last calibration instead of \
                 measuring under their load"
            );
            return Ok(speed);
        }
        warn!(
            busy,
            "jobs already run on this worker and no earlier calibration is kept: measuring \
             under their load (the speed will be low; consider --calibration)"
        );
    }
    info!(
        image = REFERENCE_IMAGE,
        "measuring the worker's calibration"
    );
    let m = measure(docker, worker_id, cgroup_parent, pids_limit).await?;
    log(&m);
    if let Err(e) = std::fs::write(&path, format!("{}\n", m.speed)) {
        warn!(file = %path.display(), error = %e, "calibration not kept for restarts");
    }
    Ok(m.speed)
}

/// Runs the benchmark [`REPETITIONS`] times under `cgroup_parent`, each run restricted as a
/// job is (`pids_limit` processes), and returns the measurement.
pub async fn measure(
    docker: &Docker,
    worker_id: &str,
    cgroup_parent: &str,
    pids_limit: i64,
) -> Result<Measurement, CalibrationError> {
    let mut runs = Vec::with_capacity(REPETITIONS);
    for i in 0..REPETITIONS {
        let name = format!("converge-calibrate-{worker_id}-{i}");
        // A leftover of an agent that died mid-measurement.
        remove(docker, &name).await;
        let r = run_once(docker, &name, cgroup_parent, pids_limit).await;
        remove(docker, &name).await;
        runs.push(r?);
    }
    let m = Measurement::from_runs(runs.clone())
        .ok_or_else(|| CalibrationError::NoResult(format!("unusable times {runs:?}")))?;
    if m.spread > 0.2 {
        // The spread as a percentage in the message: as a structured field next to the flag's
        // name it read as the value to pass.
        warn!(
            "calibration runs differ by {:.0}% (over 20%): the host is busy, and the measured \
             speed {:.2} may be off; pass --calibration SPEED to set the worker's speed by hand",
            m.spread * 100.0,
            m.speed
        );
    }
    Ok(m)
}

/// The benchmark's container.
fn benchmark(cgroup_parent: &str, pids_limit: i64) -> ContainerCreateBody {
    ContainerCreateBody {
        image: Some(REFERENCE_IMAGE.into()),
        cmd: Some(REFERENCE_ARGS.iter().map(|s| s.to_string()).collect()),
        // Under the worker's parent, so the run gets the worker's capacity, and with a job's
        // restrictions: it runs what a job runs, and gets no more than a job gets.
        host_config: Some(crate::docker::unprivileged(cgroup_parent, pids_limit)),
        attach_stdout: Some(true),
        ..Default::default()
    }
}

/// One run: seconds per step from the trainer's final progress line.
async fn run_once(
    docker: &Docker,
    name: &str,
    cgroup_parent: &str,
    pids_limit: i64,
) -> Result<f64, CalibrationError> {
    let body = benchmark(cgroup_parent, pids_limit);
    let opts = CreateContainerOptionsBuilder::new().name(name).build();
    let created = docker
        .create_container(Some(opts), body)
        .await
        .map_err(|e| {
            if crate::docker::is_not_found(&e) {
                CalibrationError::NoImage
            } else {
                CalibrationError::Docker {
                    what: "creating the benchmark container",
                    source: e,
                }
            }
        })?;
    docker
        .start_container(&created.id, None)
        .await
        .map_err(|source| CalibrationError::Docker {
            what: "starting the benchmark container",
            source,
        })?;
    let wait = WaitContainerOptionsBuilder::new()
        .condition("not-running")
        .build();
    let exit = tokio::time::timeout(
        RUN_TIMEOUT,
        docker.wait_container(&created.id, Some(wait)).next(),
    )
    .await
    .map_err(|_| CalibrationError::Timeout)?;
    let logs = LogsOptionsBuilder::new().stdout(true).follow(false).build();
    let mut stream = docker.logs(&created.id, Some(logs));
    let mut buf = Vec::new();
    while let Some(Ok(chunk)) = stream.next().await {
        buf.extend_from_slice(&chunk.into_bytes());
    }
    let text = String::from_utf8_lossy(&buf);
    text.lines()
        .filter_map(|l| converge_contract::parse_line(l, None).ok().flatten())
        .find(|p| p.done && p.step > 0)
        .and_then(|p| Some(p.elapsed_s? / p.step as f64))
        .ok_or_else(|| CalibrationError::NoResult(format!("{exit:?}")))
}

async fn remove(docker: &Docker, name: &str) {
    let opts = RemoveContainerOptionsBuilder::new().force(true).build();
    let _ = docker.remove_container(name, Some(opts)).await;
}

/// Logs a measurement for people.
pub fn log(m: &Measurement) {
    info!(
        speed = format!("{:.3}", m.speed),
        zeta = format!("{:.3}", 1.0 / m.speed),
        spread = format!("{:.1}%", m.spread * 100.0),
        runs_ms_per_step = ?m.s_per_step.iter().map(|s| (s * 1e5).round() / 100.0).collect::<Vec<_>>(),
        reference_ms_per_step = REFERENCE_S_PER_STEP * 1e3,
        "calibration measured"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `unprivileged` holds is asserted on a job's container
    /// (`docker::tests::a_start_becomes_a_labelled_container_under_the_worker_parent`); here,
    /// that the benchmark gets all of it, under the worker's parent and with the agent's limit.
    #[test]
    fn the_benchmark_runs_as_unprivileged_as_a_job() {
        let hc = benchmark("/worker-1", 64).host_config;
        assert_eq!(hc, Some(crate::docker::unprivileged("/worker-1", 64)));
        let hc = hc.expect("a host config");
        assert_eq!(hc.cgroup_parent.as_deref(), Some("/worker-1"));
        assert_eq!((hc.readonly_rootfs, hc.pids_limit), (Some(true), Some(64)));
    }

    #[test]
    fn speed_comes_from_the_fastest_run_and_the_spread_from_both_ends() {
        let m = Measurement::from_runs(vec![0.00400, 0.00323 * 2.0, 0.00380]).unwrap();
        assert!((m.speed - REFERENCE_S_PER_STEP / 0.0038).abs() < 1e-12);
        assert!((m.spread - (0.00646 / 0.0038 - 1.0)).abs() < 1e-12);
        let reference = Measurement::from_runs(vec![REFERENCE_S_PER_STEP]).unwrap();
        assert_eq!((reference.speed, reference.spread), (1.0, 0.0));
    }

    #[test]
    fn no_runs_or_a_zero_time_is_no_measurement() {
        assert_eq!(Measurement::from_runs(vec![]), None);
        assert_eq!(Measurement::from_runs(vec![0.0, 0.003]), None);
    }
}
