//! The `converge-trainer` binary: flags in, [`converge_trainer::train`] or
//! [`converge_trainer::calibrate`], exit status out. As PID 1 in a container it gets no default
//! signal handling, so SIGTERM and SIGINT are wired to the training loop's stop signal here.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use clap::Parser;
use converge_trainer::{Cli, Command, Config, ModelKind, calibrate};
use signal_hook::consts::{SIGINT, SIGTERM};

/// Exit status after a stop signal when there was no checkpoint directory to save into:
/// 128 + SIGTERM, what a shell reports for a terminated process, so nobody mistakes it for a
/// saved stop.
const STOPPED_UNSAVED: u8 = 143;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() => {
            let _ = e.print();
            return ExitCode::from(64);
        }
        Err(e) => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
    };
    match cli.command {
        Some(Command::Calibrate(args)) => match calibrate::run(&args) {
            Ok(table) => {
                print!("{table}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("converge-trainer: calibrate: {e:#}");
                ExitCode::from(70)
            }
        },
        None if cli.train.list_models => {
            for m in ModelKind::ALL {
                let d = m.defaults();
                println!(
                    "{:<12} steps {:<5} batch {:<3} lr {:<6} {}",
                    m.name(),
                    d.steps,
                    d.batch,
                    d.lr,
                    m.describe()
                );
            }
            ExitCode::SUCCESS
        }
        None => train(&cli.train),
    }
}

fn train(args: &converge_trainer::TrainArgs) -> ExitCode {
    let wall = Instant::now();
    let cfg = match Config::from_args(args) {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [SIGTERM, SIGINT] {
        // A second signal while the first is being handled (e.g. a slow save) ends the process
        // at once: the checkpoint on disk is still the previous, complete one.
        let registered = signal_hook::flag::register_conditional_shutdown(sig, 130, stop.clone())
            .and_then(|_| signal_hook::flag::register(sig, stop.clone()));
        if let Err(e) = registered {
            eprintln!("converge-trainer: cannot handle signal {sig}: {e}");
            return ExitCode::from(71);
        }
    }
    let mut stdout = std::io::stdout();
    let result = converge_trainer::train(&cfg, &|_| stop.load(Ordering::SeqCst), &mut stdout);
    match result {
        Ok(outcome) => {
            eprintln!(
                "converge-trainer: {} at step {}; wall {:.2}s cpu {:.2}s peak RSS {} KiB",
                if outcome.finished {
                    "finished"
                } else {
                    "stopped"
                },
                outcome.step,
                wall.elapsed().as_secs_f64(),
                converge_trainer::cpu_seconds().unwrap_or(f64::NAN),
                converge_trainer::peak_rss_kib().unwrap_or(0),
            );
            if !outcome.finished && outcome.saved_bytes.is_none() {
                eprintln!(
                    "converge-trainer: stopped with no checkpoint directory; state discarded"
                );
                return ExitCode::from(STOPPED_UNSAVED);
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}

fn fail(e: &converge_trainer::Error) -> ExitCode {
    eprintln!("converge-trainer: error: {e}");
    ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(70))
}
