//! The simulator's error type.

use std::path::PathBuf;

/// What can go wrong loading and running experiments.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An experiment file could not be read.
    #[error("cannot read experiment file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// An experiment file is not valid JSON for an experiment.
    #[error("experiment file {path} is invalid: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// The experiment names a model the catalog does not have.
    #[error("unknown model {name:?}; known models: {known}")]
    UnknownModel {
        /// The name given.
        name: String,
        /// The catalog's names.
        known: String,
    },
    /// The experiment is inconsistent (no workers, empty window, bad policy parameters).
    #[error("invalid experiment: {0}")]
    Invalid(String),
    /// A policy rejected its parameters.
    #[error(transparent)]
    Policy(#[from] converge_policy::Error),
    /// Writing results failed.
    #[error("cannot write {path}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Drawing a plot failed.
    #[error("cannot draw plot {path}: {message}")]
    Plot {
        /// The file.
        path: PathBuf,
        /// What the plotting library said.
        message: String,
    },
}

/// Result with the simulator's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
