//! Stop at convergence on real Docker with a real trainer: a job given a step budget far past
//! its plateau and a stopping rule is checkpointed and stopped when its held-out loss flattens,
//! ends COMPLETED saying where and why, and its checkpoint resumes at the step it saved, where the loss was.

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};
use converge_integration_tests::{
    TRAINER_IMAGE, TestAgent, TestManager, eventually, job, require_docker, tempfile_dir,
    trainer_spec, unique, wait_for_workers,
};
use converge_messenger::pb::{self, JobState};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_past_its_plateau_stops_with_its_checkpoint_which_resumes() -> anyhow::Result<()> {
    require_docker(&[TRAINER_IMAGE]);
    let checkpoints = tempfile_dir("converged")?;
    let manager = TestManager::start(|c| {
        c.heartbeat_interval = Duration::from_millis(250);
        c.progress_history = 4096;
    })
    .await?;
    let worker = unique("it-conv");
    let _agent = TestAgent::start(&manager.endpoint(), &worker, 1.0, checkpoints.path());
    let mut client = manager.control().await?;
    wait_for_workers(&client, 1).await?;
    // mlp-digits plateaus within a few thousand steps; the budget is a million.
    let budget = 1_000_000;
    let mut spec = trainer_spec("mlp-digits", budget, 20);
    spec.stop_rule = Some(pb::StopRule {
        min_improvement: 0.01,
        window_steps: 300,
    });
    let id = client
        .submit_job(pb::SubmitJobRequest { spec: Some(spec) })
        .await?
        .into_inner()
        .job_id;
    let done = eventually(
        Duration::from_secs(180),
        "the job to stop at convergence",
        || {
            let (mut c, id) = (client.clone(), id.clone());
            async move {
                let j = job(&mut c, &id, true).await?;
                let terminal = ![
                    JobState::Pending,
                    JobState::Starting,
                    JobState::Running,
                    JobState::Stopping,
                ]
                .contains(&j.state());
                Ok(terminal.then_some(j))
            }
        },
    )
    .await?;
    assert_eq!(done.state(), JobState::Completed, "{done:#?}");
    assert!(
        done.reason.starts_with("converged at step") && done.reason.contains("checkpoint kept"),
        "{}",
        done.reason
    );
    assert!(done.step < budget / 10, "stopped at step {}", done.step);
    // The rule held on what the job reported when it fired (it trains on a little while the
    // save is delivered): its best loss improved by less than 1% over the last 300 steps.
    let fired: u64 = done
        .reason
        .trim_start_matches("converged at step ")
        .split(':')
        .next()
        .and_then(|n| n.parse().ok())
        .context("the step in the reason")?;
    let best = |upto: u64| {
        done.progress
            .iter()
            .filter(|p| p.step <= upto)
            .filter_map(|p| p.value)
            .reduce(f64::min)
    };
    let (then, now) = (
        best(fired - 300).context("the best metric a window before")?,
        best(fired).context("the best metric when it fired")?,
    );
    assert!((then - now) / then < 0.01, "{then} -> {now}");
    // And not before: the window before it still improved by 1% or more.
    let before = best(fired - 320).zip(best(fired - 20));
    assert!(
        before.is_none_or(|(t, n)| (t - n) / t >= 0.01),
        "it could have stopped a report earlier: {before:?}"
    );

    // The checkpoint the save left resumes at the step it stopped at, with the same loss.
    let dir = checkpoints.path().join(&id);
    assert!(
        dir.join("converge-trainer.ckpt").exists(),
        "no checkpoint in {dir:?}"
    );
    let name = unique("it-conv-resume");
    let out = Command::new("docker")
        .args(["run", "--rm", "--name", &name, "-v"])
        .arg(format!("{}:/ckpt", dir.display()))
        .args([
            TRAINER_IMAGE,
            "--model",
            "mlp-digits",
            "--steps",
            &(done.step + 100).to_string(),
            "--report-every",
            "20",
            "--threads",
            "1",
            "--checkpoint-dir",
            "/ckpt",
        ])
        .output()
        .context("docker run of the resumed trainer")?;
    if !out.status.success() {
        bail!(
            "resumed trainer failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let first = String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| converge_contract::parse_line(l, None).ok().flatten())
        .context("no progress line from the resumed trainer")?;
    assert_eq!(
        first.checkpoint,
        Some(converge_contract::CheckpointEvent::Restored),
        "{first:?}"
    );
    // The job's last line was its `saved` line: the resumed run starts exactly there.
    assert_eq!(first.step, done.step, "{first:?}");
    // About the losses it reported last, not a restart (a fresh run starts at 2.49).
    let loss = first.value.context("the restored line carries the loss")?;
    let recent: Vec<f64> = done
        .progress
        .iter()
        .rev()
        .filter_map(|p| p.value)
        .take(10)
        .collect();
    let (lo, hi) = recent
        .iter()
        .fold((f64::INFINITY, 0.0f64), |(l, h), v| (l.min(*v), h.max(*v)));
    assert!(
        loss >= lo * 0.8 && loss <= hi * 1.2,
        "resumed loss {loss}, last reported {recent:?}"
    );
    manager.stop().await;
    Ok(())
}
