//! `converge-manager`: parses the configuration and serves until SIGINT/SIGTERM.

use clap::Parser;
use converge_manager::config::Cli;
use tokio_util::sync::CancellationToken;

/// Exit code for an invalid configuration (EX_USAGE).
const EX_USAGE: i32 = 64;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let config = match Cli::parse().validate() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("converge-manager: {e}");
            std::process::exit(EX_USAGE);
        }
    };
    let listener = tokio::net::TcpListener::bind(config.listen).await?;
    let shutdown = CancellationToken::new();
    tokio::spawn(shutdown_on_signal(shutdown.clone()));
    converge_manager::serve(config, listener, shutdown).await?;
    Ok(())
}

/// Cancels `token` on SIGINT or SIGTERM (as PID 1 in a container, nothing else would).
async fn shutdown_on_signal(token: CancellationToken) {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    token.cancel();
}
