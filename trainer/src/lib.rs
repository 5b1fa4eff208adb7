//! `converge-trainer`: the reference training workload for Converge.
//!
//! Converge decides from what training jobs report, so it needs jobs that behave like the ones
//! in its papers: CPU-bound, a loss that falls fast and then flattens, a fixed number of steps,
//! and a checkpoint they can be stopped into and resumed from. This crate is such a job, and the
//! reference implementation of the contracts in `shared/design.md` ("Contracts a workload
//! container keeps"): `CONVERGE_PROGRESS` lines on stdout, and on SIGTERM an atomic checkpoint
//! under `$CONVERGE_CHECKPOINT_DIR` followed by exit 0.
//!
//! # The models and what they stand in for
//! Real gradient descent with candle (CPU), on small real datasets embedded in the binary:
//!
//! | `--model` | stands in for (papers' workloads) | data |
//! |---|---|---|
//! | `mlp-digits` | MNIST multi-layer perceptron | sklearn 8x8 digits |
//! | `cnn-digits` | MNIST convolutional network | sklearn 8x8 digits |
//! | `logreg-wine` | logistic regression | UCI wine |
//! | `vae-digits` | variational autoencoder (Kingma & Welling) | sklearn 8x8 digits |
//! | `gru-co2` | GRU / LSTM / Bi-RNN sequence models | Mauna Loa weekly CO2 |
//!
//! Every model reports its loss on held-out rows (`"metric":"loss"`, to minimize); the
//! classifiers can report held-out accuracy instead (`--metric accuracy`, to maximize).
//!
//! # Where to start reading
//! - [`run::train`]: the life of one incarnation: restore or start, step, report, checkpoint,
//!   stop. `main.rs` only parses flags, wires SIGTERM/SIGINT to the stop signal and calls it.
//! - [`models`]: the [`Model`] trait and the [`ModelKind`] registry; one file per model.
//! - [`checkpoint`]: the file format and the checks that refuse a corrupt or foreign file.
//! - [`optim::Adam`]: the optimizer, written out so its moments can be checkpointed.
//! - [`rng`]: why randomness is a pure function of `(seed, step)`, which makes resume exact.
//! - [`config`]: flags, `CONVERGE_*` variables and their validation; [`calibrate`]: the table
//!   in `trainer/README.md`.
//!
//! Errors are one [`Error`] enum; [`Error::exit_code`] gives the process status (64 for bad
//! flags, 65 for a refused checkpoint).

pub mod calibrate;
pub mod checkpoint;
pub mod config;
pub mod data;
mod error;
pub mod models;
pub mod optim;
pub mod params;
pub mod rng;
pub mod run;

pub use config::{Cli, Command, Config, TrainArgs};
pub use error::{Error, Result};
pub use models::{Metric, Model, ModelKind};
pub use run::{Outcome, train};

/// Peak resident set size of this process in KiB (`VmHWM` from `/proc/self/status`), if the
/// platform has it.
pub fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// CPU seconds (user + system, all threads, finished ones included) this process has used.
pub fn cpu_seconds() -> Option<f64> {
    use nix::sys::resource::{UsageWho, getrusage};
    use nix::sys::time::TimeValLike;
    let u = getrusage(UsageWho::RUSAGE_SELF).ok()?;
    Some((u.user_time().num_microseconds() + u.system_time().num_microseconds()) as f64 / 1e6)
}
