//! `converge-manager`: parses the configuration and serves until SIGINT/SIGTERM.

use converge_manager::config::Cli;
use converge_messenger::telemetry::{SpanExport, Telemetry};
use tokio_util::sync::CancellationToken;

/// Exit code for an invalid configuration (EX_USAGE).
const EX_USAGE: i32 = 64;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let settings = match converge_messenger::config_file::read(std::env::args_os().collect()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("converge-manager: {e}");
            std::process::exit(EX_USAGE);
        }
    };
    // A usage error (EX_USAGE), and the settings file when the setting came from it.
    let refuse = |e: &str| -> ! {
        if let Some(blame) = settings.blame(e) {
            eprintln!("converge-manager: {blame}");
        }
        std::process::exit(EX_USAGE)
    };
    let cli = match converge_messenger::config_file::parse::<Cli>(&settings.args) {
        Ok(cli) => cli,
        // Help and version are not errors.
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            let _ = e.print();
            refuse(&e.to_string())
        }
    };
    // Traces go wherever the standard OTEL_* variables say; nowhere when they are unset.
    let telemetry = Telemetry::new(cli.log_format)
        .export(SpanExport::from_env("converge-manager"))
        .init()?;
    let config = match cli.validate() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("converge-manager: {e}");
            refuse(&e.to_string())
        }
    };
    let listener = match tokio::net::TcpListener::bind(config.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!(
                "converge-manager: cannot listen on {} (--listen): {e}",
                config.listen
            );
            std::process::exit(EX_USAGE);
        }
    };
    let shutdown = CancellationToken::new();
    tokio::spawn(shutdown_on_signal(shutdown.clone()));
    let result = converge_manager::serve(config, listener, shutdown).await;
    // Send the spans still buffered before the process goes.
    telemetry.shutdown().await;
    if let Err(e) = result {
        // Said as every other refusal is, once: the errors' texts already hold their causes
        // (anyhow's report repeated them as "Caused by").
        eprintln!("converge-manager: {e}");
        // A setting found wrong only once it was used (a --tokens file that cannot be read):
        // a usage error like the others.
        let usage = matches!(e, converge_manager::Error::InvalidArgument { .. });
        std::process::exit(if usage { EX_USAGE } else { 1 });
    }
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
