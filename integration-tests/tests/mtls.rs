//! Mutual TLS on the agent stream over real sockets (issue 15): an agent with no certificate,
//! one with a certificate from another CA, and worker w1's certificate registering as w2 are
//! all refused, and the manager's state is unchanged; w1's certificate registers as w1. The
//! certificates are made as `cargo xtask certs` makes them.

use std::time::Duration;

use converge_integration_tests::{TestManager, tempfile_dir};
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
