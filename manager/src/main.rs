//! `converge-manager`: parses the configuration and serves until SIGINT/SIGTERM.

use clap::Parser;
use converge_manager::config::Cli;
use converge_messenger::telemetry::{SpanExport, Telemetry};
use tokio_util::sync::CancellationToken;

/// Exit code for an invalid configuration (EX_USAGE).
const EX_USAGE: i32 = 64;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = match converge_messenger::config_file::with_file(std::env::args_os().collect()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("converge-manager: {e}");
            std::process::exit(EX_USAGE);
        }
    };
    let cli = Cli::parse_from(args);
    // Traces go wherever the standard OTEL_* variables say; nowhere when they are unset.
    let telemetry = Telemetry::new(cli.log_format)
        .export(SpanExport::from_env("converge-manager"))
        .init()?;
    let config = match cli.validate() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("converge-manager: {e}");
            std::process::exit(EX_USAGE);
        }
    };
    let listener = tokio::net::TcpListener::bind(config.listen).await?;
    let shutdown = CancellationToken::new();
    tokio::spawn(shutdown_on_signal(shutdown.clone()));
    let result = converge_manager::serve(config, listener, shutdown).await;
    // Send the spans still buffered before the process goes.
    telemetry.shutdown().await;
    result?;
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
