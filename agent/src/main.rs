//! `converge-agent`: the thin binary around [`converge_agent::run`].

use std::process::ExitCode;

use clap::Parser;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// Exit code for invalid settings (EX_USAGE).
const EXIT_CONFIG: u8 = 64;

#[tokio::main]
async fn main() -> ExitCode {
    // Logs go to stderr, coloured only on a terminal (not in `docker logs` or a CI log).
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    let config = match converge_agent::Cli::try_parse() {
        Ok(cli) => cli.into_config(),
        Err(e) => {
            // Help and version are not errors; anything else is a usage error (exit 64).
            let code = if e.use_stderr() { EXIT_CONFIG } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let config = match config {
        Ok(c) => c,
        Err(e) => {
            eprintln!("converge-agent: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let shutdown = CancellationToken::new();
    tokio::spawn(signals(shutdown.clone()));
    match converge_agent::run(config, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("converge-agent: {e}");
            ExitCode::from(if e.is_config() { EXIT_CONFIG } else { 1 })
        }
    }
}

/// Ctrl-C or SIGTERM cancels the agent (its containers keep running for the next agent).
async fn signals(shutdown: CancellationToken) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = match signal(SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
                shutdown.cancel();
                return;
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
    shutdown.cancel();
}
