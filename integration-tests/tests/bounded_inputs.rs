//! Inputs are bounded and refused naming what to fix, over real gRPC (issue 15): a 10 MB
//! environment value is refused by validation as `spec.env` (not by the decoder's size limit),
//! and nothing is created.

use converge_integration_tests::TestManager;
use converge_messenger::pb;
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ten_megabyte_env_value_is_refused_naming_spec_env() -> anyhow::Result<()> {
    let manager = TestManager::start(|_| {}).await?;
    let mut client = manager.control().await?.max_encoding_message_size(64 << 20);
    let mut spec = pb::JobSpec {
        image: "converge/trainer:dev".into(),
        cpus: 1.0,
        ..Default::default()
    };
    spec.env.insert("DATA".into(), "x".repeat(10 << 20));
    let err = client
        .submit_job(pb::SubmitJobRequest { spec: Some(spec) })
        .await
        .expect_err("refused");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().starts_with("spec.env: entry `DATA`"),
        "{}",
        err.message()
    );
    let jobs = client
        .list_jobs(pb::ListJobsRequest::default())
        .await?
        .into_inner()
        .jobs;
    assert!(jobs.is_empty(), "nothing created: {jobs:?}");
    manager.stop().await;
    Ok(())
}
