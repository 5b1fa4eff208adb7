//! What the demo and the experiments ask of a running cluster, through the control API.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use converge_cli::client::{Bearer, Client};
use converge_messenger::pb::{self, control_service_client::ControlServiceClient};

/// A control client of the testbed manager on 127.0.0.1:`port`, with the credentials
/// [`crate::testbed::Testbed::up_with`] wrote, retrying for 30 s while its container starts.
pub async fn connect(port: u16) -> Result<Client> {
    let dir = crate::testbed::credentials_dir(&crate::workspace_root());
    let token = crate::testbed::operator_token(&dir)?;
    let bearer = Bearer(Some(format!("Bearer {token}").parse()?));
    let tls = converge_messenger::tls::control_client(
        &dir.join(converge_messenger::tls::files::CA),
        "localhost",
    )?;
    let endpoint = format!("https://127.0.0.1:{port}");
    let start = Instant::now();
    loop {
        match tonic::transport::Endpoint::from_shared(endpoint.clone())?
            .tls_config(tls.clone())?
            .connect()
            .await
        {
            Ok(ch) => return Ok(ControlServiceClient::with_interceptor(ch, bearer)),
            Err(e) if start.elapsed() > Duration::from_secs(30) => {
                return Err(e).context(format!("manager at {endpoint} did not come up"));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    }
}

/// Waits up to 60 s for `n` workers to be ready.
pub async fn wait_for_workers(client: &mut Client, n: usize) -> Result<()> {
    let start = Instant::now();
    loop {
        let ready = client
            .list_workers(pb::ListWorkersRequest {})
            .await?
            .into_inner()
            .workers
            .iter()
            .filter(|w| w.state == pb::WorkerState::Ready as i32)
            .count();
        if ready >= n {
            println!("{ready} workers ready");
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(60) {
            bail!("only {ready} of {n} workers registered within 60s");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
