//! `cargo xtask demo`: the main job, end to end on this machine.
//!
//! Builds the images, starts the compose testbed (a manager, two 1-CPU workers), submits a mix
//! of trainer jobs through the control API, shows each job's progress live, prints completion
//! times, and tears everything down — also when something fails on the way.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use converge_messenger::pb;

use crate::cluster::{connect, terminal, wait_for_workers};
use crate::testbed::Testbed;

/// The demo's job mix: (model, size, steps). Sized (trainer/README.md calibration) so the run
/// takes a couple of minutes on two 1-CPU workers, with jobs that converge at different times.
const JOBS: &[(&str, u32, u64)] = &[
    ("mlp-digits", 8, 3000),
    ("cnn-digits", 4, 1500),
    ("logreg-wine", 1, 20000),
    ("vae-digits", 16, 3000),
    ("gru-co2", 2, 800),
];

/// Runs the demo.
pub fn run(root: &Path, policy: &str, port: u16) -> Result<()> {
    crate::images::build(root, &[])?;
    let testbed = Testbed::up(root, policy, port)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let result = rt.block_on(drive(port));
    if result.is_err() {
        testbed.print_logs();
    }
    drop(testbed);
    result
}

async fn drive(port: u16) -> Result<()> {
    let mut client = connect(port).await?;
    wait_for_workers(&mut client, 2).await?;

    let mut ids = Vec::new();
    for (model, size, steps) in JOBS {
        let spec = pb::JobSpec {
            name: model.to_string(),
            image: "converge/trainer:dev".into(),
            args: [
                "--model",
                model,
                "--size",
                &size.to_string(),
                "--steps",
                &steps.to_string(),
                "--report-every",
                "20",
                "--threads",
                "1",
                "--checkpoint-every",
                "200",
            ]
            .map(String::from)
            .to_vec(),
            cpus: 0.5,
            metric: "loss".into(),
            ..Default::default()
        };
        let r = client
            .submit_job(pb::SubmitJobRequest { spec: Some(spec) })
            .await
            .map_err(|s| anyhow::anyhow!("submitting {model}: {}", s.message()))?
            .into_inner();
        println!("submitted {model:<12} as {}", r.job_id);
        ids.push(r.job_id);
    }

    let started = Instant::now();
    let deadline = Duration::from_secs(30 * 60);
    let jobs = loop {
        let jobs = client
            .list_jobs(pb::ListJobsRequest::default())
            .await?
            .into_inner()
            .jobs;
        let mine: Vec<pb::Job> = jobs.into_iter().filter(|j| ids.contains(&j.id)).collect();
        print_progress(&mine, started.elapsed());
        if mine.iter().all(|j| terminal(j.state)) {
            break mine;
        }
        if started.elapsed() > deadline {
            bail!("jobs did not finish within {deadline:?}");
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
    };
    print_summary(&jobs);
    if let Some(j) = jobs
        .iter()
        .find(|j| j.state != pb::JobState::Completed as i32)
    {
        bail!(
            "job {} ended {}: {}",
            j.id,
            pb::JobState::label_of(j.state),
            j.reason
        );
    }
    Ok(())
}

fn name(j: &pb::Job) -> &str {
    j.spec.as_ref().map(|s| s.name.as_str()).unwrap_or("")
}

fn print_progress(jobs: &[pb::Job], elapsed: Duration) {
    println!("--- t = {:>5.0}s", elapsed.as_secs_f64());
    for j in jobs {
        let pct = if j.total_steps > 0 {
            100.0 * j.step as f64 / j.total_steps as f64
        } else {
            0.0
        };
        let bar_len = (pct / 5.0).round() as usize;
        println!(
            "  {:<12} {:<10} {:<9} [{:<20}] {:>5}/{:<5} loss {}",
            name(j),
            pb::JobState::label_of(j.state),
            j.worker_id,
            "#".repeat(bar_len.min(20)),
            j.step,
            j.total_steps,
            j.metric_value
                .map(|v| format!("{v:.4}"))
                .unwrap_or_else(|| "-".into())
        );
    }
}

fn print_summary(jobs: &[pb::Job]) {
    println!();
    println!(
        "{:<12}  {:<10}  {:<9}  {:>14}  {:>11}  {:>8}",
        "JOB", "STATE", "WORKER", "COMPLETION (s)", "FINAL LOSS", "SAMPLES"
    );
    let first_submit = jobs.iter().map(|j| j.submitted_unix_ms).min().unwrap_or(0);
    let mut per_worker: HashMap<&str, usize> = HashMap::new();
    let mut jct = Vec::new();
    for j in jobs {
        let secs = (j.finished_unix_ms - j.submitted_unix_ms) as f64 / 1000.0;
        jct.push(secs);
        *per_worker.entry(j.worker_id.as_str()).or_default() += 1;
        println!(
            "{:<12}  {:<10}  {:<9}  {:>14.1}  {:>11}  {:>8}",
            name(j),
            pb::JobState::label_of(j.state),
            j.worker_id,
            secs,
            j.metric_value
                .map(|v| format!("{v:.4}"))
                .unwrap_or_else(|| "-".into()),
            j.samples
        );
    }
    let makespan = jobs
        .iter()
        .map(|j| j.finished_unix_ms)
        .max()
        .unwrap_or(0)
        .saturating_sub(first_submit) as f64
        / 1000.0;
    let avg = jct.iter().sum::<f64>() / jct.len().max(1) as f64;
    println!();
    println!(
        "average completion time {avg:.1}s, makespan {makespan:.1}s, jobs per worker {per_worker:?}"
    );
}
