//! The manager's errors, and their one conversion into `tonic::Status`.

use tonic::{Code, Status};

/// Everything a manager request can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is wrong; `field` names what to fix.
    #[error("{field}: {message}")]
    InvalidArgument {
        /// Path of the offending field, e.g. `spec.cpus`.
        field: String,
        /// What is wrong and what would be right.
        message: String,
    },
    /// No job with this id (never submitted here, or finished longer ago than the store keeps).
    #[error(
        "no job with id `{0}` (finished jobs are forgotten after the manager's --finished-retention)"
    )]
    JobNotFound(String),
    /// No worker with this id (never registered here, or forgotten).
    #[error("no worker `{0}` is registered (`convergectl workers` lists them)")]
    WorkerNotFound(String),
    /// The request does not fit the job's current state.
    #[error("{0}")]
    FailedPrecondition(String),
    /// The manager actor has stopped (shutting down).
    #[error("the manager is shutting down")]
    Unavailable,
    /// The listener could not be bound or served.
    #[error("gRPC server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
    /// Reflection could not be built from the descriptor sets.
    #[error("cannot build gRPC reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// An I/O error (binding the listener).
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The state store cannot be opened, read or written.
    #[error(transparent)]
    Store(#[from] converge_store::Error),
    /// The request was decided but could not be stored: nothing of it happened, and the
    /// manager stops.
    #[error("the manager's state store failed ({0}); nothing was done, and the manager stops")]
    StoreFailed(String),
    /// The stored state does not make a consistent cluster.
    #[error(
        "the state store {path} holds an inconsistent cluster: {why}; restore it from a backup, or move it away to start with an empty cluster"
    )]
    Recovery {
        /// The store.
        path: String,
        /// What is inconsistent.
        why: String,
    },
}

/// Results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An [`Error::InvalidArgument`] for `field`.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::InvalidArgument {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl From<Error> for Status {
    fn from(e: Error) -> Self {
        let code = match &e {
            Error::InvalidArgument { .. } => Code::InvalidArgument,
            Error::JobNotFound(_) | Error::WorkerNotFound(_) => Code::NotFound,
            Error::FailedPrecondition(_) => Code::FailedPrecondition,
            Error::Unavailable => Code::Unavailable,
            Error::Serve(_) | Error::Reflection(_) | Error::Io(_) => Code::Internal,
            // Nothing that was asked for was done: the caller may try again later.
            Error::Store(_) | Error::StoreFailed(_) | Error::Recovery { .. } => Code::Unavailable,
        };
        Status::new(code, e.to_string())
    }
}
