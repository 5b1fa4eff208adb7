//! `converge-agent`: the thin binary around [`converge_agent::run`].

use std::process::ExitCode;

use clap::Parser;
use converge_messenger::telemetry::{SpanExport, Telemetry};
use tokio_util::sync::CancellationToken;

/// Exit code for invalid settings (EX_USAGE).
const EXIT_CONFIG: u8 = 64;

#[tokio::main]
async fn main() -> ExitCode {
    let args = match converge_messenger::config_file::with_file(std::env::args_os().collect()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("converge-agent: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let cli = match converge_agent::Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version are not errors; anything else is a usage error (exit 64).
            let code = if e.use_stderr() { EXIT_CONFIG } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    // Logs go to stderr (coloured only on a terminal); traces wherever the standard OTEL_*
    // variables say, nowhere when they are unset.
    let telemetry = match Telemetry::new(cli.log_format)
        .export(SpanExport::from_env("converge-agent"))
        .init()
    {
        Ok(t) => t,
        Err(e) => {
            eprintln!("converge-agent: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let config = match cli.into_config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("converge-agent: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let shutdown = CancellationToken::new();
    tokio::spawn(signals(shutdown.clone()));
    let result = converge_agent::run(config, shutdown).await;
    // Send the spans still buffered before the process goes.
    telemetry.shutdown().await;
    match result {
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
