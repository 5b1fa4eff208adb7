//! The agent's error type.

use std::path::PathBuf;

/// What can stop the agent from starting or running.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting is invalid; the binary exits with code 64.
    #[error("invalid setting --{setting}: {why}")]
    Config {
        /// The setting's flag name (without `--`).
        setting: &'static str,
        /// What is wrong and what is accepted.
        why: String,
    },
    /// The Docker engine could not be reached or refused the API version.
    #[error("cannot use the Docker engine at {endpoint}: {source}")]
    DockerConnect {
        /// Where the agent looked.
        endpoint: String,
        /// What went wrong.
        #[source]
        source: bollard::errors::Error,
    },
    /// A Docker request failed.
    #[error("Docker request failed: {0}")]
    Docker(#[from] bollard::errors::Error),
    /// The worker's cgroup could not be set up or read.
    #[error("cgroup {}: {source}", path.display())]
    Cgroup {
        /// The file or directory involved.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Another agent process on this host runs the same worker (it holds its cgroup).
    #[error(
        "another agent process on this host runs this worker: it holds the worker's cgroup {}; \
         stop it, or give this agent another --worker-id (or --cgroup-parent)",
        path.display()
    )]
    WorkerTaken {
        /// The worker's CPU cgroup.
        path: PathBuf,
    },
    /// The cgroup filesystem is not what the agent supports.
    #[error("unsupported cgroup setup at {}: {why}", path.display())]
    CgroupUnsupported {
        /// The cgroup root.
        path: PathBuf,
        /// What was found.
        why: String,
    },
    /// A host directory could not be created or read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The worker's calibration could not be measured (`--calibration measure`).
    #[error("cannot measure the worker's calibration: {0}")]
    Calibration(#[from] crate::calibration::CalibrationError),
    /// The metrics endpoint could not listen on its address.
    #[error("cannot serve metrics on {addr}: {source}")]
    MetricsListen {
        /// The `--metrics-listen` address.
        addr: std::net::SocketAddr,
        /// Why binding failed.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// True for configuration errors (exit code 64).
    pub fn is_config(&self) -> bool {
        matches!(self, Error::Config { .. } | Error::WorkerTaken { .. })
    }
}

/// The agent's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
