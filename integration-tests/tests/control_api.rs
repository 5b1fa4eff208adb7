//! The user API over real gRPC: validation that names the field and creates nothing, and the
//! real grpcurl binary driving the manager through server reflection alone.

use std::time::Duration;

use converge_integration_tests::{ScriptedAgent, TestManager, run_grpcurl};
use converge_messenger::pb;
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_submissions_name_the_field_and_create_nothing() -> anyhow::Result<()> {
    let manager = TestManager::start(|_| {}).await?;
    // A worker of 2 cores, so "above any worker's capacity" has a capacity to exceed.
    let _agent =
        ScriptedAgent::connect(&manager.endpoint(), "w1", 2.0, Duration::from_millis(200)).await?;
    let mut client = manager.control().await?;
    let valid = pb::JobSpec {
        image: "converge/trainer:dev".into(),
        cpus: 1.0,
        ..Default::default()
    };
    let cases: Vec<(&str, Option<pb::JobSpec>)> = vec![
        ("spec", None),
        (
            "spec.image",
            Some(pb::JobSpec {
                image: String::new(),
                ..valid.clone()
            }),
        ),
        (
            "spec.cpus",
            Some(pb::JobSpec {
                cpus: 0.0,
                ..valid.clone()
            }),
        ),
        (
            "spec.cpus",
            Some(pb::JobSpec {
                cpus: -2.0,
                ..valid.clone()
            }),
        ),
        (
            "spec.cpus",
            Some(pb::JobSpec {
                cpus: 3.0,
                ..valid.clone()
            }),
        ),
        (
            "spec.direction",
            Some(pb::JobSpec {
                direction: 42,
                ..valid.clone()
            }),
        ),
        (
            "spec.name",
            Some(pb::JobSpec {
                name: "x".repeat(10_000),
                ..valid.clone()
            }),
        ),
        (
            "spec.image",
            Some(pb::JobSpec {
                image: "i".repeat(100_000),
                ..valid.clone()
            }),
        ),
    ];
    for (field, spec) in cases {
        let err = client
            .submit_job(pb::SubmitJobRequest { spec })
            .await
            .expect_err(&format!("a submission with a bad {field} was accepted"));
        assert_eq!(err.code(), Code::InvalidArgument, "{field}: {err:?}");
        assert!(
            err.message().starts_with(&format!("{field}:")),
            "message should name {field}: {}",
            err.message()
        );
    }
    let jobs = client
        .list_jobs(pb::ListJobsRequest::default())
        .await?
        .into_inner()
        .jobs;
    assert!(
        jobs.is_empty(),
        "rejected submissions created jobs: {jobs:?}"
    );
    // Nor did they emit any job event: replaying the whole log shows only the worker.
    let mut events = client
        .watch_events(pb::WatchEventsRequest {
            job_id: String::new(),
            from_seq: 1,
        })
        .await?
        .into_inner();
    let first = events.message().await?.expect("the worker's registration");
    assert_eq!(first.kind, pb::EventKind::WorkerState as i32);
    // The same valid spec is accepted, so the rules above were what refused the others.
    client
        .submit_job(pb::SubmitJobRequest { spec: Some(valid) })
        .await?;
    let next = events.message().await?.expect("the submission event");
    assert_eq!(next.kind, pb::EventKind::JobState as i32);
    assert_eq!(next.to_state, pb::JobState::Pending as i32);
    manager.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcurl_lists_describes_submits_and_reads_back() -> anyhow::Result<()> {
    let manager = TestManager::start(|_| {}).await?;
    let addr = manager.addr.to_string();
    let addr = addr.as_str();
    // Each grpcurl call blocks; run them off the async workers.
    let a = addr.to_string();
    let list =
        tokio::task::spawn_blocking(move || run_grpcurl(&["-plaintext", &a, "list"])).await??;
    assert!(
        list.lines().any(|l| l == "converge.v1.ControlService"),
        "list: {list}"
    );
    assert!(
        list.lines().any(|l| l == "converge.v1.AgentService"),
        "list: {list}"
    );

    let a = addr.to_string();
    let describe = tokio::task::spawn_blocking(move || {
        run_grpcurl(&["-plaintext", &a, "describe", "converge.v1.ControlService"])
    })
    .await??;
    for rpc in [
        "SubmitJob",
        "GetJob",
        "ListJobs",
        "CancelJob",
        "ListWorkers",
        "WatchEvents",
    ] {
        assert!(
            describe.contains(&format!("rpc {rpc} ")),
            "describe lacks {rpc}: {describe}"
        );
    }

    let body = r#"{"spec":{"name":"from-json","image":"converge/trainer:dev","cpus":0.5,
        "args":["--model","mlp-digits"],"metric":"loss","direction":"DIRECTION_MINIMIZE",
        "labels":{"team":"ml"}}}"#;
    let a = addr.to_string();
    let submitted = tokio::task::spawn_blocking(move || {
        run_grpcurl(&[
            "-plaintext",
            "-d",
            body,
            &a,
            "converge.v1.ControlService/SubmitJob",
        ])
    })
    .await??;
    let submitted: serde_json::Value = serde_json::from_str(&submitted)?;
    let id = submitted["jobId"]
        .as_str()
        .expect("jobId in response")
        .to_string();

    let a = addr.to_string();
    let req = format!(r#"{{"job_id":"{id}"}}"#);
    let got = tokio::task::spawn_blocking(move || {
        run_grpcurl(&[
            "-plaintext",
            "-d",
            &req,
            &a,
            "converge.v1.ControlService/GetJob",
        ])
    })
    .await??;
    let got: serde_json::Value = serde_json::from_str(&got)?;
    assert_eq!(got["id"], id.as_str());
    assert_eq!(got["spec"]["name"], "from-json");
    assert_eq!(got["spec"]["cpus"], 0.5);
    assert_eq!(got["spec"]["labels"]["team"], "ml");
    assert_eq!(got["state"], "JOB_STATE_PENDING");

    // And the typed client agrees with what grpcurl saw.
    let mut client = manager.control().await?;
    let job = client
        .get_job(pb::GetJobRequest {
            job_id: id.clone(),
            include_progress: false,
        })
        .await?
        .into_inner();
    assert_eq!(job.spec.unwrap().args, vec!["--model", "mlp-digits"]);
    manager.stop().await;
    Ok(())
}
