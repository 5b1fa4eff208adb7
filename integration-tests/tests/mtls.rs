//! Mutual TLS on the agent stream over real sockets (issue 15): an agent with no certificate,
//! one with a certificate from another CA, and worker w1's certificate registering as w2 are
//! all refused, and the manager's state is unchanged; w1's certificate registers as w1. The
//! certificates are made as `cargo xtask certs` makes them.

use std::time::Duration;

use converge_integration_tests::{ScriptedAgent, TestManager, tempfile_dir};
use converge_messenger::pb::{
    self, AgentMessage, agent_message::Kind, agent_service_client::AgentServiceClient,
    control_service_client::ControlServiceClient, manager_message,
};
use converge_messenger::tls::{self, TlsFiles};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

fn register(worker: &str) -> AgentMessage {
    AgentMessage {
        kind: Some(Kind::Register(pb::Register {
            worker_id: worker.into(),
            cpu_capacity: 1.0,
            instance_id: "i".into(),
            ..Default::default()
        })),
    }
}

/// Opens an agent stream over `tls` and sends `Register` for `worker`: the manager's answer
/// (its `Registered`), or the error.
async fn try_register(
    addr: std::net::SocketAddr,
    tls: ClientTlsConfig,
    worker: &str,
) -> Result<pb::Registered, String> {
    let channel = Endpoint::from_shared(format!("https://{addr}"))
        .map_err(|e| e.to_string())?
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(register(worker)).await.expect("open");
    let mut replies = AgentServiceClient::new(channel)
        .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?
        .into_inner();
    let first = replies
        .message()
        .await
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?;
    drop(tx);
    match first.and_then(|m| m.kind) {
        Some(manager_message::Kind::Registered(r)) => Ok(r),
        other => Err(format!("unexpected first message {other:?}")),
    }
}

fn pem(path: std::path::PathBuf) -> String {
    std::fs::read_to_string(path).expect("certificate file")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_an_agent_with_its_own_workers_certificate_may_register() -> anyhow::Result<()> {
    let ours = tempfile_dir("certs")?;
    let theirs = tempfile_dir("other-ca")?;
    let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    tls::generate(ours.path(), &names, &["w1".into()])?;
    tls::generate(theirs.path(), &names, &["w1".into()])?;
    let files = TlsFiles {
        ca: ours.path().join("ca.pem"),
        cert: ours.path().join("manager.pem"),
        key: ours.path().join("manager.key"),
    };
    let manager = TestManager::start(|c| c.tls = Some(files)).await?;
    let ca = Certificate::from_pem(pem(ours.path().join("ca.pem")));
    let base = || {
        ClientTlsConfig::new()
            .ca_certificate(ca.clone())
            .domain_name("localhost")
    };
    let identity = |dir: &std::path::Path| {
        Identity::from_pem(pem(dir.join("w1.pem")), pem(dir.join("w1.key")))
    };

    // No certificate: refused before any message is read.
    let e = try_register(manager.addr, base(), "w1").await.unwrap_err();
    assert!(e.starts_with("Unauthenticated"), "{e}");
    // A certificate from another CA: the handshake fails.
    let e = try_register(manager.addr, base().identity(identity(theirs.path())), "w1")
        .await
        .unwrap_err();
    // Refused by the handshake itself, not let in and turned away later.
    assert!(
        !e.starts_with("Unauthenticated") && !e.starts_with("PermissionDenied"),
        "{e}"
    );
    // w1's certificate registering as w2.
    let e = try_register(manager.addr, base().identity(identity(ours.path())), "w2")
        .await
        .unwrap_err();
    assert_eq!(
        e,
        "PermissionDenied: this certificate is for worker w1; it may not register as w2"
    );

    // Nothing of the refused attempts reached the manager's state.
    let channel = Endpoint::from_shared(format!("https://{}", manager.addr))?
        .tls_config(base())?
        .connect()
        .await?;
    let mut control = ControlServiceClient::new(channel);
    let workers = control
        .list_workers(pb::ListWorkersRequest {})
        .await?
        .into_inner()
        .workers;
    assert!(workers.is_empty(), "{workers:?}");

    // w1's own certificate, as w1: registered.
    let r = try_register(manager.addr, base().identity(identity(ours.path())), "w1")
        .await
        .map_err(anyhow::Error::msg)?;
    assert!(!r.policy.is_empty());
    let workers = control
        .list_workers(pb::ListWorkersRequest {})
        .await?
        .into_inner()
        .workers;
    assert_eq!(
        workers.iter().map(|w| w.id.as_str()).collect::<Vec<_>>(),
        ["w1"]
    );

    // Users' tools come with the CA only (the README's grpcurl line).
    let ca = ours.path().join("ca.pem");
    let out = converge_integration_tests::run_grpcurl(&[
        "-cacert",
        ca.to_str().expect("utf-8 path"),
        &manager.addr.to_string(),
        "converge.v1.ControlService/ListWorkers",
    ])?;
    assert!(out.contains("\"w1\""), "{out}");
    manager.stop().await;
    Ok(())
}

/// A new CA and certificates written over the old files (what `cargo xtask certs` does) are
/// taken by the running manager and the running agent, with no restart of either and none of
/// the job: the agent reconnects with the new files and registers again, reporting its
/// container, and the job stays at its first incarnation. The old certificate is refused from
/// then on. Without the reload on either side the agent could not register again (each side
/// would trust only the other's new CA, or only the old one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_certificates_are_taken_without_a_restart_and_the_job_runs_on() -> anyhow::Result<()>
{
    let certs = tempfile_dir("rotate")?;
    let old = tempfile_dir("rotate-old")?;
    let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    let workers = ["w1".to_string(), "w2".to_string()];
    tls::generate(certs.path(), &names, &workers)?;
    for f in ["w1.pem", "w1.key"] {
        std::fs::copy(certs.path().join(f), old.path().join(f))?;
    }
    let manager = TestManager::start(|c| c.tls = Some(TlsFiles::manager(certs.path()))).await?;
    let https = format!("https://{}", manager.addr);
    let control = |ca: std::path::PathBuf| {
        let https = https.clone();
        async move {
            let channel = Endpoint::from_shared(https)?
                .tls_config(tls::control_client(&ca, "localhost")?)?
                .connect()
                .await?;
            anyhow::Ok(ControlServiceClient::new(channel))
        }
    };

    let mut agent = ScriptedAgent::connect_as(&https, certs.path(), "w1", 2.0).await?;

    // A job starts on w1; from then on w1 reports its container when it registers.
    let mut client = control(certs.path().join("ca.pem")).await?;
    let id = client
        .submit_job(pb::SubmitJobRequest {
            spec: Some(converge_integration_tests::one_core_spec()),
        })
        .await?
        .into_inner()
        .job_id;
    agent.report(vec![pb::ContainerReport {
        job_id: id.clone(),
        epoch: 1,
        container_id: "ctr-1".into(),
        state: pb::ContainerState::Running as i32,
        ..Default::default()
    }]);
    agent.answer_start(&id, "ctr-1").await?;
    converge_integration_tests::eventually(Duration::from_secs(10), "the job to run", || {
        let (mut c, id) = (client.clone(), id.clone());
        async move {
            let j = converge_integration_tests::job(&mut c, &id, false).await?;
            Ok((j.state == pb::JobState::Running as i32).then_some(()))
        }
    })
    .await?;

    // The rotation: every file replaced, under a new CA.
    tls::generate(certs.path(), &names, &workers)?;
    let again = tokio::time::timeout(
        Duration::from_secs(20),
        agent
            .status
            .wait_for(|s| s.connected && s.registrations >= 2),
    )
    .await
    .map(|r| r.is_ok());
    assert!(
        matches!(again, Ok(true)),
        "the agent did not register again with the new files: {:?}",
        agent.status.borrow().last_error
    );

    // A client trusting only the new CA reaches the manager: it serves the new certificate.
    let mut client = control(certs.path().join("ca.pem")).await?;
    let job = converge_integration_tests::job(&mut client, &id, false).await?;
    assert_eq!(job.state, pb::JobState::Running as i32, "{job:?}");
    assert_eq!(job.epoch, 1, "no second incarnation: {job:?}");
    while let Ok(c) = agent.commands.try_recv() {
        assert!(
            !matches!(c.action, Some(pb::command::Action::Start(_))),
            "the job was started again: {c:?}"
        );
    }
    // The old worker certificate is refused now, by a client that trusts the new CA, while the
    // same client with a new certificate (w2's) registers: only the identity differs.
    let trusting_new = || {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(pem(certs.path().join("ca.pem"))))
            .domain_name("localhost")
    };
    let identity = |dir: &std::path::Path, w: &str| {
        Identity::from_pem(
            pem(dir.join(format!("{w}.pem"))),
            pem(dir.join(format!("{w}.key"))),
        )
    };
    let e = try_register(
        manager.addr,
        trusting_new().identity(identity(old.path(), "w1")),
        "w1",
    )
    .await
    .unwrap_err();
    assert!(
        !e.starts_with("Unauthenticated") && !e.starts_with("PermissionDenied"),
        "refused by the handshake: {e}"
    );
    try_register(
        manager.addr,
        trusting_new().identity(identity(certs.path(), "w2")),
        "w2",
    )
    .await
    .map_err(anyhow::Error::msg)?;
    drop(agent);
    manager.stop().await;
    Ok(())
}
