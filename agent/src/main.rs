//! `converge-agent`: the thin binary around [`converge_agent::run`].

use std::process::ExitCode;

use converge_messenger::telemetry::{SpanExport, Telemetry};
use tokio_util::sync::CancellationToken;

/// Exit code for invalid settings (EX_USAGE).
const EXIT_CONFIG: u8 = 64;

#[tokio::main]
async fn main() -> ExitCode {
    let settings = match converge_messenger::config_file::read(std::env::args_os().collect()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("converge-agent: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    // A usage error (exit 64), and the settings file when the setting came from it.
    let refuse = |e: &str| {
        if let Some(blame) = settings.blame(e) {
            eprintln!("converge-agent: {blame}");
        }
        ExitCode::from(EXIT_CONFIG)
    };
    let cli = match converge_messenger::config_file::parse::<converge_agent::Cli>(&settings.args) {
        Ok(cli) => cli,
        // Help and version are not errors.
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            let _ = e.print();
            return refuse(&e.to_string());
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
            return refuse(&e.to_string());
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
