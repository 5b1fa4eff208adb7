//! The trainer's one error type. Each variant names what a user must fix; [`Error::exit_code`]
//! maps it to a `sysexits`-style process status so scripts can tell bad flags from bad files.

use std::path::PathBuf;

/// Result with the trainer's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can stop a training run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A flag (or its `CONVERGE_*` variable) has a value the trainer cannot run with.
    #[error("invalid configuration: {flag}: {why}")]
    InvalidConfig {
        /// The flag, spelled as on the command line (`--steps`).
        flag: &'static str,
        /// What is wrong and what would be accepted.
        why: String,
    },
    /// The checkpoint file is damaged: bad magic, bad checksum, truncated, unreadable tensors.
    #[error(
        "checkpoint {path} is corrupt: {why}; refusing to start over it (move it away to start fresh)"
    )]
    CorruptCheckpoint {
        /// The file.
        path: PathBuf,
        /// What check failed.
        why: String,
    },
    /// The checkpoint was written by a newer or older, incompatible trainer.
    #[error("checkpoint {path} has format version {found}, this trainer reads version {expected}")]
    UnsupportedCheckpointVersion {
        /// The file.
        path: PathBuf,
        /// Version in the file.
        found: u32,
        /// Version this build reads.
        expected: u32,
    },
    /// The checkpoint belongs to another model.
    #[error("checkpoint {path} is from model `{found}`, but this run trains `{expected}`")]
    WrongModel {
        /// The file.
        path: PathBuf,
        /// Model named in the file.
        found: String,
        /// Model of this run.
        expected: String,
    },
    /// The checkpoint was written with a different setting that changes the training math.
    #[error(
        "checkpoint {path} was written with {flag} {found}, but this run has {flag} {expected}; \
         resuming would not continue the same training"
    )]
    ConfigMismatch {
        /// The file.
        path: PathBuf,
        /// The flag whose value differs.
        flag: &'static str,
        /// Value in the checkpoint.
        found: String,
        /// Value of this run.
        expected: String,
    },
    /// The loss became NaN or infinite (usually a learning rate that is too high).
    #[error("training diverged at step {step}: loss is {value}; try a smaller --lr")]
    Diverged {
        /// Step whose loss was not finite.
        step: u64,
        /// The loss.
        value: f64,
    },
    /// Reading or writing a file failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done (`writing checkpoint`).
        what: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A tensor operation failed (a bug, or a shape the model did not expect).
    #[error("tensor operation failed: {0}")]
    Tensor(#[from] candle_core::Error),
    /// An embedded dataset could not be parsed (a bug: the data ships with the binary).
    #[error("embedded dataset {name} is malformed: {why}")]
    Dataset {
        /// The dataset.
        name: &'static str,
        /// What is wrong.
        why: String,
    },
    /// Writing progress lines failed (stdout closed).
    #[error("writing progress: {0}")]
    Output(#[source] std::io::Error),
    /// A calibration run of one model failed.
    #[error("calibrating {model}: {why}")]
    Calibration {
        /// The model.
        model: &'static str,
        /// What went wrong.
        why: String,
    },
    /// The worker thread pool could not be built.
    #[error("starting {threads} worker threads: {why}")]
    ThreadPool {
        /// Requested threads.
        threads: usize,
        /// Why not.
        why: String,
    },
}

impl Error {
    /// The process exit status for this error: 64 (`EX_USAGE`) for bad flags, 65
    /// (`EX_DATAERR`) for a checkpoint the trainer refuses, 74 (`EX_IOERR`) for I/O, 70
    /// (`EX_SOFTWARE`) for the rest.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::InvalidConfig { .. } => 64,
            Error::CorruptCheckpoint { .. }
            | Error::UnsupportedCheckpointVersion { .. }
            | Error::WrongModel { .. }
            | Error::ConfigMismatch { .. } => 65,
            Error::Io { .. } | Error::Output(_) => 74,
            Error::Diverged { .. }
            | Error::Tensor(_)
            | Error::Dataset { .. }
            | Error::ThreadPool { .. }
            | Error::Calibration { .. } => 70,
        }
    }
}
