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
    // The cause is left to `source()`, not repeated here: callers that print the chain
    // (`{:#}` in the binary) would otherwise say it twice.
    #[error("experiment file {path} is invalid")]
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The binary prints an error with its causes (`{:#}`): the parser's message must come
    /// once, from the cause, not again in our own.
    #[test]
    fn a_parse_error_states_its_cause_once() {
        let source = serde_json::from_str::<serde_json::Value>("").unwrap_err();
        let cause = source.to_string();
        let e = Error::Parse {
            path: "x.json".into(),
            source,
        };
        let shown = format!("{:#}", anyhow::Error::from(e));
        assert_eq!(shown.matches(&cause).count(), 1, "{shown}");
        assert!(
            shown.starts_with("experiment file x.json is invalid: "),
            "{shown}"
        );
    }
}
