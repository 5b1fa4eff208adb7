//! What the demo and the experiments ask of a running cluster, through the control API.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use converge_messenger::pb::{self, control_service_client::ControlServiceClient};
use tonic::transport::Channel;

/// A control client, retrying for 30 s while the manager's container starts.
pub async fn connect(endpoint: &str) -> Result<ControlServiceClient<Channel>> {
    let start = Instant::now();
    loop {
        match tonic::transport::Endpoint::from_shared(endpoint.to_string())?
            .connect()
            .await
        {
            Ok(ch) => return Ok(ControlServiceClient::new(ch)),
            Err(e) if start.elapsed() > Duration::from_secs(30) => {
                return Err(e).context(format!("manager at {endpoint} did not come up"));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    }
}

/// Waits up to 60 s for `n` workers to be ready.
pub async fn wait_for_workers(client: &mut ControlServiceClient<Channel>, n: usize) -> Result<()> {
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

/// Whether a job state is final.
pub fn terminal(state: i32) -> bool {
    [
        pb::JobState::Completed,
        pb::JobState::Failed,
        pb::JobState::Cancelled,
        pb::JobState::Rejected,
    ]
    .iter()
    .any(|s| *s as i32 == state)
}
