//! Command line and environment (`CONVERGE_*`), parsed into a validated [`Config`].
//!
//! Every flag has an environment fallback so an orchestrator can configure a container without
//! rewriting its command. Flags a user leaves out take the chosen model's defaults
//! ([`crate::ModelKind::defaults`]), so `--model vae-digits` alone is a sensible job.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use converge_contract::CHECKPOINT_DIR_ENV;

use crate::error::{Error, Result};
use crate::models::{Metric, ModelKind};

/// `converge-trainer`: trains one model and reports progress on stdout.
#[derive(Debug, Parser)]
#[command(name = "converge-trainer", version, about, long_about = None)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Cli {
    /// A task other than training.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Training options (when no subcommand is given).
    #[command(flatten)]
    pub train: TrainArgs,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Train every model at 1 thread and print the calibration table (markdown).
    Calibrate(CalibrateArgs),
}

/// Options of `calibrate`.
#[derive(Debug, Args)]
pub struct CalibrateArgs {
    /// Only these models (comma-separated); all by default.
    #[arg(long, value_delimiter = ',')]
    pub models: Vec<String>,
    /// Size knob passed to every model.
    #[arg(long, default_value_t = 1)]
    pub size: usize,
    /// Multiplies each model's default step count (e.g. 0.1 for a quick look).
    #[arg(long, default_value_t = 1.0)]
    pub steps_scale: f64,
}

/// Training flags, each with a `CONVERGE_*` environment fallback.
#[derive(Debug, Args, Clone, Default)]
pub struct TrainArgs {
    /// Model to train (see --list-models).
    #[arg(long, env = "CONVERGE_MODEL", default_value = "mlp-digits")]
    pub model: String,
    /// What to report: `loss` (held-out loss, minimize; every model) or `accuracy` (held-out
    /// accuracy, maximize; classifiers only).
    #[arg(long, env = "CONVERGE_METRIC", default_value = "loss")]
    pub metric: String,
    /// Total training steps (one optimizer update each). Default: the model's.
    #[arg(long, env = "CONVERGE_STEPS")]
    pub steps: Option<u64>,
    /// Mini-batch size. Default: the model's.
    #[arg(long, env = "CONVERGE_BATCH")]
    pub batch: Option<usize>,
    /// Adam learning rate. Default: the model's.
    #[arg(long, env = "CONVERGE_LR", allow_negative_numbers = true)]
    pub lr: Option<f64>,
    /// Worker threads for the numeric kernels; 0 means one per available CPU.
    #[arg(long, env = "CONVERGE_THREADS", default_value_t = 0)]
    pub threads: usize,
    /// Seed for initial weights, data order and sampling noise.
    #[arg(long, env = "CONVERGE_SEED", default_value_t = 0)]
    pub seed: u64,
    /// Print a progress line (held-out metric) every this many steps.
    #[arg(long, env = "CONVERGE_REPORT_EVERY", default_value_t = 10)]
    pub report_every: u64,
    /// Also save a checkpoint every this many steps (0: only on SIGTERM/SIGINT and at the end).
    #[arg(long, env = "CONVERGE_CHECKPOINT_EVERY", default_value_t = 0)]
    pub checkpoint_every: u64,
    /// Model size: multiplies hidden widths (cost per step grows roughly with its square).
    #[arg(long, env = "CONVERGE_SIZE", default_value_t = 1)]
    pub size: usize,
    /// Directory to checkpoint into and resume from; without it nothing is saved.
    #[arg(long, env = CHECKPOINT_DIR_ENV)]
    pub checkpoint_dir: Option<PathBuf>,
    /// Print the models this trainer knows and exit.
    #[arg(long)]
    pub list_models: bool,
    /// Fault injection: ignore SIGTERM and keep training, as a misbehaving image would, so an
    /// orchestrator's "kill after the save deadline, resume from the last periodic checkpoint"
    /// path can be tested with a real workload. SIGINT still stops it.
    #[arg(long, env = "CONVERGE_FAULT_IGNORE_SIGTERM")]
    pub ignore_sigterm: bool,
    /// Fault injection: leave SIGTERM's default action, as an image written without signals in
    /// mind. Under an init process SIGTERM ends it at once, unsaved; as a container's PID 1 the
    /// kernel drops the signal and only the stop deadline's SIGKILL ends it.
    #[arg(
        long,
        env = "CONVERGE_FAULT_UNHANDLED_SIGTERM",
        conflicts_with = "ignore_sigterm"
    )]
    pub unhandled_sigterm: bool,
    /// Fault injection: wait this many milliseconds at the start of a run, before the stop
    /// signals' handlers are in place, as a slow start would (a stop sent then must still be
    /// handled, with a checkpoint). Said on stderr as it begins.
    #[arg(
        long,
        env = "CONVERGE_FAULT_SLOW_START_MS",
        default_value_t = 0,
        hide = true
    )]
    pub slow_start_ms: u64,
}

/// Largest accepted `--size`: width 64x the default is already minutes per step on one core.
pub const MAX_SIZE: usize = 64;

/// A validated training configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// What to train.
    pub model: ModelKind,
    /// What to report.
    pub metric: Metric,
    /// Total steps.
    pub steps: u64,
    /// Mini-batch size.
    pub batch: usize,
    /// Learning rate.
    pub lr: f64,
    /// Worker threads (at least 1).
    pub threads: usize,
    /// Seed.
    pub seed: u64,
    /// Steps between progress lines.
    pub report_every: u64,
    /// Steps between periodic checkpoints (0: none).
    pub checkpoint_every: u64,
    /// Width multiplier.
    pub size: usize,
    /// Where checkpoints live.
    pub checkpoint_dir: Option<PathBuf>,
}

impl Config {
    /// The model's defaults, one thread, no checkpoint directory.
    pub fn new(model: ModelKind) -> Self {
        let d = model.defaults();
        Config {
            model,
            metric: Metric::Loss,
            steps: d.steps,
            batch: d.batch,
            lr: d.lr,
            threads: 1,
            seed: 0,
            report_every: 10,
            checkpoint_every: 0,
            size: 1,
            checkpoint_dir: None,
        }
    }

    /// Validates flags; the error names the flag at fault.
    pub fn from_args(a: &TrainArgs) -> Result<Self> {
        let model = ModelKind::from_name(&a.model).ok_or_else(|| Error::InvalidConfig {
            flag: "--model",
            why: format!(
                "unknown model `{}`; known: {}",
                a.model,
                ModelKind::ALL.map(|m| m.name()).join(", ")
            ),
        })?;
        let mut c = Config::new(model);
        c.metric = Metric::from_name(&a.metric).ok_or_else(|| Error::InvalidConfig {
            flag: "--metric",
            why: format!("unknown metric `{}`; known: loss, accuracy", a.metric),
        })?;
        if let Some(s) = a.steps {
            c.steps = s;
        }
        if let Some(b) = a.batch {
            c.batch = b;
        }
        if let Some(lr) = a.lr {
            c.lr = lr;
        }
        c.threads = if a.threads == 0 {
            std::thread::available_parallelism().map_or(1, usize::from)
        } else {
            a.threads
        };
        c.seed = a.seed;
        c.report_every = a.report_every;
        c.checkpoint_every = a.checkpoint_every;
        c.size = a.size;
        c.checkpoint_dir = a.checkpoint_dir.clone();
        c.validate()?;
        Ok(c)
    }

    /// Checks ranges; the error names the flag at fault.
    pub fn validate(&self) -> Result<()> {
        let bad = |flag, why: String| Err(Error::InvalidConfig { flag, why });
        if self.metric == Metric::Accuracy && !self.model.is_classifier() {
            return bad(
                "--metric",
                format!(
                    "{} is not a classifier; it reports loss only",
                    self.model.name()
                ),
            );
        }
        if self.steps == 0 {
            return bad("--steps", "must be at least 1".into());
        }
        let train_rows = self.model.train_rows();
        if self.batch == 0 || self.batch > train_rows {
            return bad(
                "--batch",
                format!(
                    "must be between 1 and {train_rows} (the training rows of {})",
                    self.model.name()
                ),
            );
        }
        if !(self.lr.is_finite() && self.lr > 0.0 && self.lr <= 10.0) {
            return bad("--lr", format!("must be in (0, 10], got {}", self.lr));
        }
        if self.threads == 0 || self.threads > 1024 {
            return bad(
                "--threads",
                format!("must be 0 (auto) or 1..=1024, got {}", self.threads),
            );
        }
        if self.report_every == 0 {
            return bad("--report-every", "must be at least 1".into());
        }
        if self.size == 0 || self.size > MAX_SIZE {
            return bad(
                "--size",
                format!("must be between 1 and {MAX_SIZE}, got {}", self.size),
            );
        }
        Ok(())
    }
}
