//! The `converge-trainer` binary: flags in, [`converge_trainer::train`] or
//! [`converge_trainer::calibrate`], exit status out. SIGTERM and SIGINT are wired to the
//! training loop's stop signal here: as a container's PID 1 (an image run without an init) it
//! would get no default signal handling, and under an init the default would end it unsaved.

use std::os::unix::process::CommandExt;
use std::process::{Command as Process, ExitCode};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use clap::Parser;
use converge_trainer::{Cli, Command, Config, ModelKind, calibrate};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, pthread_sigmask};
use signal_hook::consts::{SIGINT, SIGTERM};

/// Writes one line to stderr in a single `write`, so log collectors that interleave a
/// container's stdout and stderr by chunk never split it (`eprintln!` writes piecewise).
macro_rules! log {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let line = format!("{}\n", format_args!($($arg)*));
        let _ = std::io::stderr().write_all(line.as_bytes());
    }};
}

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
                log!("converge-trainer: calibrate: {e:#}");
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
    // A stop that comes before its handler is in place waits for it (below).
    hold_stop_signals(SigmaskHow::SIG_BLOCK);
    if args.slow_start_ms > 0 {
        log!(
            "converge-trainer: fault injection: starting slowly ({} ms)",
            args.slow_start_ms
        );
        std::thread::sleep(std::time::Duration::from_millis(args.slow_start_ms));
    }
    let cfg = match Config::from_args(args) {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    pin_runtime_env(cfg.threads);
    let stop = Arc::new(AtomicBool::new(false));
    let stopping_signals: &[i32] = if args.unhandled_sigterm {
        log!("converge-trainer: fault injection: SIGTERM left unhandled");
        &[SIGINT]
    } else if args.ignore_sigterm {
        // A handler that only sets an unused flag: the signal is caught (as PID 1 or not) and
        // changes nothing.
        let ignored = Arc::new(AtomicBool::new(false));
        if let Err(e) = signal_hook::flag::register(SIGTERM, ignored) {
            log!("converge-trainer: cannot handle signal {SIGTERM}: {e}");
            return ExitCode::from(71);
        }
        log!("converge-trainer: fault injection: ignoring SIGTERM");
        &[SIGINT]
    } else {
        &[SIGTERM, SIGINT]
    };
    for &sig in stopping_signals {
        // A second signal while the first is being handled (e.g. a slow save) ends the process
        // at once: the checkpoint on disk is still the previous, complete one.
        let registered = signal_hook::flag::register_conditional_shutdown(sig, 130, stop.clone())
            .and_then(|_| signal_hook::flag::register(sig, stop.clone()));
        if let Err(e) = registered {
            log!("converge-trainer: cannot handle signal {sig}: {e}");
            return ExitCode::from(71);
        }
    }
    // A stop that came meanwhile is handled now.
    hold_stop_signals(SigmaskHow::SIG_UNBLOCK);
    let mut stdout = std::io::stdout();
    let result = converge_trainer::train(&cfg, &|_| stop.load(Ordering::SeqCst), &mut stdout);
    match result {
        Ok(outcome) => {
            log!(
                "converge-trainer: {} at step {}; wall {:.4}s cpu {:.4}s peak RSS {} KiB",
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
                log!("converge-trainer: stopped with no checkpoint directory; state discarded");
                return ExitCode::from(STOPPED_UNSAVED);
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}

/// glibc malloc settings for training: tensors of a few MB are allocated and freed on every
/// step, and glibc's defaults hand such memory back to the kernel (a fresh `mmap` per tensor
/// above the 128 KiB threshold, heap trimming above 128 KiB free), so each step pays for page
/// faults and zeroing again. Measured with `mlp-digits --size 12` under one core: about 6 ms a
/// step with the defaults, 3.5 ms with these; until the first checkpoint freed a large buffer
/// (which raises glibc's dynamic mmap threshold) a run went at the first speed and afterwards
/// at the second, so the same job's step cost depended on whether it had checkpointed yet.
/// 32 MiB is the largest mmap threshold glibc accepts on 64-bit; freed heap above 128 MiB is
/// still returned.
const MALLOC_TUNABLES: &str =
    "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=134217728";

/// Makes `--threads` bind all of candle's CPU parallelism, and sets [`MALLOC_TUNABLES`] unless
/// the caller set `GLIBC_TUNABLES`, then returns.
///
/// Why a re-exec: besides the rayon pool [`converge_trainer::train`] runs in (which bounds gemm
/// and convolutions), candle 0.11 keeps a process-wide pool of spinning threads for element-wise
/// ops, sized once from `CANDLE_NUM_THREADS` (else the physical core count), and picks gemm's
/// fan-out from `RAYON_NUM_THREADS`; glibc reads its tunables once, at start. Environment
/// variables can only be changed in-process with `unsafe` (forbidden here), so when they do not
/// match the binary `exec`s itself with them set: same PID, same arguments, same signal mask,
/// no signal handlers yet. If the exec fails the run goes on with the defaults, and
/// says so.
fn pin_runtime_env(threads: usize) {
    let want = threads.to_string();
    let set = |k: &str| std::env::var(k).is_ok_and(|v| v == want);
    let tunables = std::env::var_os("GLIBC_TUNABLES").is_some();
    if set("CANDLE_NUM_THREADS") && set("RAYON_NUM_THREADS") && tunables {
        return;
    }
    let mut cmd = match std::env::current_exe() {
        Ok(exe) => Process::new(exe),
        Err(e) => {
            log!(
                "converge-trainer: could not find its own executable ({e}); running with default threads and malloc settings"
            );
            return;
        }
    };
    cmd.args(std::env::args_os().skip(1))
        .env("CANDLE_NUM_THREADS", &want)
        .env("RAYON_NUM_THREADS", &want);
    if !tunables {
        cmd.env("GLIBC_TUNABLES", MALLOC_TUNABLES);
    }
    let err = cmd.exec();
    log!(
        "converge-trainer: could not re-exec with CANDLE_NUM_THREADS={want} and malloc \
         tunables ({err}); element-wise ops may use more than --threads cores"
    );
}

/// Blocks or unblocks SIGTERM and SIGINT for this thread (and the threads it starts later).
///
/// A run blocks them first thing and unblocks them once their handlers are in place: a stop
/// sent between (an orchestrator's stop right after the start) stays pending, across the
/// re-exec of [`pin_runtime_env`] (which keeps the mask and pending signals but resets
/// handlers), and is handled as any stop, with a checkpoint. Unblocked with no handler it
/// would end the process unsaved (under an init), or be lost (the kernel drops a signal that
/// has no handler sent to a container's PID 1, and only the stop deadline's SIGKILL would end
/// the process). A blocked signal is neither.
fn hold_stop_signals(how: SigmaskHow) {
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
    if let Err(e) = pthread_sigmask(how, Some(&set), None) {
        log!("converge-trainer: cannot {how:?} the stop signals: {e}");
    }
}

fn fail(e: &converge_trainer::Error) -> ExitCode {
    log!("converge-trainer: error: {e}");
    ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(70))
}
