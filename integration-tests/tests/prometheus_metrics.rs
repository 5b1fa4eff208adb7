//! The manager's and the agent's `/metrics` endpoints (issue 8): real Prometheus tooling
//! (`promtool check metrics`, Debian's `prometheus` package) accepts what both serve, before
//! and after a real trainer job runs on real Docker, and the values move with the job.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use converge_integration_tests::{
    TRAINER_IMAGE, TestAgent, TestManager, eventually, free_local_addr, job, metric_value,
    promtool, promtool_check, require_docker, scrape_metrics, tempfile_dir, trainer_spec, unique,
    wait_for_workers,
};
use converge_messenger::pb::{self, JobState};

/// Scrapes `addr` in both formats, has promtool check the classic one (what it parses) and
/// returns it; the OpenMetrics one must be complete (`# EOF`).
async fn scrape_checked(addr: SocketAddr) -> Result<String> {
    let open = scrape_metrics(addr, true).await?;
    if !open.ends_with("# EOF\n") {
        bail!("OpenMetrics output from {addr} does not end with # EOF:\n{open}");
    }
    let classic = scrape_metrics(addr, false).await?;
    promtool_check(&classic).with_context(|| format!("metrics from {addr}:\n{classic}"))?;
    Ok(classic)
}

fn value(text: &str, name: &str, labels: &str) -> f64 {
    metric_value(text, name, labels).unwrap_or_else(|| panic!("no {name}{{{labels}}} in:\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_endpoints_pass_promtool_and_their_values_move_as_a_job_runs() -> Result<()> {
    require_docker(&[TRAINER_IMAGE]);
    promtool();
    let checkpoints = tempfile_dir("metrics")?;
    let manager_metrics = free_local_addr();
    let manager = TestManager::start(|c| {
        c.heartbeat_interval = Duration::from_millis(250);
        c.metrics_listen = Some(manager_metrics);
    })
    .await?;
    let agent_metrics = free_local_addr();
    let worker = unique("metrics");
    let mut config = converge_agent::config::Config::new(manager.endpoint(), &worker, 1.0);
    config.checkpoint_root = checkpoints.path().to_path_buf();
    config.heartbeat_interval = Duration::from_millis(250);
    config.usage_interval = Duration::from_millis(500);
    config.metrics_listen = Some(agent_metrics);
    let agent = TestAgent::start_with(config);
    let mut client = manager.control().await?;
    wait_for_workers(&client, 1).await?;

    // Before any job: valid output, zero counts.
    let m0 = scrape_checked(manager_metrics).await?;
    let a0 = scrape_checked(agent_metrics).await?;
    assert_eq!(
        value(&m0, "converge_manager_jobs", r#"state="completed""#),
        0.0
    );
    assert_eq!(value(&m0, "converge_manager_jobs_submitted_total", ""), 0.0);
    assert_eq!(
        value(
            &m0,
            "converge_manager_agent_registrations_total",
            r#"kind="first""#
        ),
        1.0
    );
    assert_eq!(
        value(
            &a0,
            "converge_agent_progress_lines_total",
            r#"result="parsed""#
        ),
        0.0
    );
    assert_eq!(value(&a0, "converge_agent_registrations_total", ""), 1.0);

    let id = client
        .submit_job(pb::SubmitJobRequest {
            spec: Some(trainer_spec("logreg-wine", 60, 10)),
        })
        .await?
        .into_inner()
        .job_id;
    eventually(Duration::from_secs(120), "the job to complete", || {
        let (mut c, id) = (client.clone(), id.clone());
        async move {
            let j = job(&mut c, &id, false).await?;
            if j.state == JobState::Failed as i32 {
                bail!("job failed: {}", j.reason);
            }
            Ok((j.state == JobState::Completed as i32).then_some(()))
        }
    })
    .await?;

    // After: still valid, and the job shows everywhere it went.
    let m1 = scrape_checked(manager_metrics).await?;
    let a1 = scrape_checked(agent_metrics).await?;
    println!("manager /metrics:\n{m1}\nagent /metrics:\n{a1}");
    assert_eq!(
        value(&m1, "converge_manager_jobs", r#"state="completed""#),
        1.0
    );
    assert_eq!(
        value(&m1, "converge_manager_jobs", r#"state="running""#),
        0.0
    );
    assert_eq!(value(&m1, "converge_manager_jobs_submitted_total", ""), 1.0);
    // The job left Pending when it was placed: nothing shows pending (each job counted once).
    assert_eq!(
        value(&m1, "converge_manager_jobs", r#"state="pending""#),
        0.0
    );
    assert_eq!(
        value(
            &m1,
            "converge_manager_placements_total",
            r#"policy="spread""#
        ),
        1.0
    );
    assert_eq!(
        value(
            &m1,
            "converge_manager_commands_sent_total",
            r#"action="start""#
        ),
        1.0
    );
    assert!(
        value(
            &m1,
            "converge_manager_policy_round_seconds_count",
            r#"policy="spread",round="placement""#
        ) >= 1.0
    );
    assert!(
        value(
            &m1,
            "converge_manager_messages_received_total",
            r#"kind="progress""#
        ) >= 1.0
    );
    assert!(
        value(
            &m1,
            "converge_manager_messages_received_total",
            r#"kind="exited""#
        ) >= 1.0
    );

    let parsed = value(
        &a1,
        "converge_agent_progress_lines_total",
        r#"result="parsed""#,
    );
    assert!(
        parsed >= 6.0,
        "60 steps reported every 10 give at least 6 lines: {parsed}"
    );
    assert_eq!(
        value(
            &a1,
            "converge_agent_progress_lines_total",
            r#"result="malformed""#
        ),
        0.0
    );
    assert_eq!(
        value(
            &a1,
            "converge_agent_commands_total",
            r#"action="start",outcome="ok""#
        ),
        1.0
    );
    assert!(
        value(
            &a1,
            "converge_agent_messages_sent_total",
            r#"kind="progress""#
        ) >= 1.0
    );
    assert!(
        value(
            &a1,
            "converge_agent_messages_sent_total",
            r#"kind="heartbeat""#
        ) >= 1.0
    );

    drop(agent);
    manager.stop().await;
    Ok(())
}
