//! Bearer tokens and roles on the control API over real gRPC (issue 15): no token is
//! Unauthenticated, a viewer may read but not submit (PermissionDenied naming the role), an
//! operator may submit; health stays reachable without a token (checked with real grpcurl).

use converge_integration_tests::{TestManager, run_grpcurl, tempfile_dir};
use converge_messenger::pb::{self, control_service_client::ControlServiceClient};
use tonic::{Code, metadata::MetadataValue, service::Interceptor};

const VIEWER: &str = "viewer-token-0123456789";
const OPERATOR: &str = "operator-token-0123456789";

fn bearer(token: &'static str) -> impl Interceptor {
    move |mut req: tonic::Request<()>| {
        let v = MetadataValue::try_from(format!("Bearer {token}")).expect("ascii");
        req.metadata_mut().insert("authorization", v);
        Ok(req)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_decide_who_may_read_and_who_may_change() -> anyhow::Result<()> {
    let dir = tempfile_dir("tokens")?;
    let file = dir.path().join("tokens");
    std::fs::write(
        &file,
        format!("{VIEWER} viewer dashboard\n{OPERATOR} operator alice\n"),
    )?;
    let manager = TestManager::start(|c| c.tokens = Some(file.clone())).await?;
    let channel = tonic::transport::Endpoint::from_shared(manager.endpoint())?
        .connect()
        .await?;

    let mut anonymous = ControlServiceClient::new(channel.clone());
    let e = anonymous
        .list_jobs(pb::ListJobsRequest::default())
        .await
        .expect_err("no token");
    assert_eq!(e.code(), Code::Unauthenticated);
    assert!(e.message().contains("authorization"), "{}", e.message());

    let mut viewer = ControlServiceClient::with_interceptor(channel.clone(), bearer(VIEWER));
    viewer.list_jobs(pb::ListJobsRequest::default()).await?;
    let e = viewer
        .submit_job(pb::SubmitJobRequest {
            spec: Some(converge_integration_tests::one_core_spec()),
        })
        .await
        .expect_err("a viewer may not submit");
    assert_eq!(e.code(), Code::PermissionDenied);
    assert_eq!(
        e.message(),
        "SubmitJob needs the operator role; dashboard is a viewer"
    );

    let mut operator = ControlServiceClient::with_interceptor(channel, bearer(OPERATOR));
    let id = operator
        .submit_job(pb::SubmitJobRequest {
            spec: Some(converge_integration_tests::one_core_spec()),
        })
        .await?
        .into_inner()
        .job_id;
    let jobs = viewer
        .list_jobs(pb::ListJobsRequest::default())
        .await?
        .into_inner()
        .jobs;
    assert_eq!(jobs.iter().map(|j| &j.id).collect::<Vec<_>>(), vec![&id]);

    // Tooling needs no token: health (and reflection, which grpcurl uses to find it).
    let addr = manager.addr.to_string();
    let health = run_grpcurl(&["-plaintext", &addr, "grpc.health.v1.Health/Check"])?;
    assert!(health.contains("SERVING"), "{health}");
    let listed = run_grpcurl(&[
        "-plaintext",
        "-H",
        &format!("authorization: Bearer {VIEWER}"),
        &addr,
        "converge.v1.ControlService/ListJobs",
    ])?;
    assert!(listed.contains(&id), "{listed}");
    manager.stop().await;
    Ok(())
}
