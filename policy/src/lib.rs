//! # converge-policy: the algorithms, as pure deterministic code
//!
//! Every scheduling decision Converge makes is computed here, from plain data, with no I/O, no
//! clocks (time is an argument) and no global randomness (a seeded generator is passed in). The
//! manager, the agent and the simulator are three drivers around the same code, so what the
//! simulator measures is what the live system does.
//!
//! ## Where to start
//! - [`cluster`]: the plain data drivers fill in ([`JobRequest`], [`WorkerSnapshot`],
//!   [`JobSnapshot`], [`Category`]) and the [`Placer`] trait with its [`Placement`] answer.
//! - [`baseline`]: the papers' baselines: Docker Swarm [`Spread`], Kubernetes
//!   [`LeastAllocated`], and [`FreeCompetition`] (no limits).
//!
//! Each algorithm cites the paper and the line numbers of the text copies in `shared/papers/`.

pub mod baseline;
pub mod cluster;
mod error;

pub use baseline::{FreeCompetition, LeastAllocated, Spread};
pub use cluster::{Category, JobRequest, JobSnapshot, Placement, Placer, WorkerSnapshot};
pub use error::{Error, Result};
