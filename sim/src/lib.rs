//! # converge-sim: the papers' experiments, replayed on the decision cores
//!
//! A discrete-event simulator that is a third shell around the *same* decision cores the
//! manager and the agent run: one `converge_core::cluster::Core` for the cluster (placement,
//! SpeCon's Alg. 2-3, value-based allocation, every job's lifecycle) and one
//! `converge_core::node::NodeCore` per worker (FlowCon's rounds and the quotas they set,
//! SpeCon's Alg. 1 and its migration requests). The simulator plays the agents, the containers
//! and the clock, so policies can be compared on identical job traces in seconds instead of
//! hours ([`engine`] says how).
//!
//! **The runtime is a model on purpose.** Training is work done at the CPU a job gets; sharing
//! follows a CFS-like weighted water-fill under Docker's hard quotas ([`converge_policy::share`]), less the cost
//! of sharing a worker measured on the real one ([`measured`]); the metric a
//! job reports comes from a curve ([`curve`]) with seeded noise; the manager sees progress and
//! CPU use only as fresh as the last heartbeat; a migration pauses a job for save + restore
//! seconds. Absolute times therefore differ from the papers' testbeds; what carries over is how
//! policies compare.
//!
//! Two baselines are not cluster policies and stay outside the cores: the oracle (the CPU
//! model serves the shortest remaining work first, on the baseline's placement) and the GA's
//! offline plan ([`ga`]), which only a simulator that knows the whole workload can compute; its
//! plan is carried out through the core ([`policies::PlanPolicy`]).
//!
//! Virtual clock, seeded RNG (ChaCha8): the same experiment file gives byte-identical output.
//!
//! ## Where to start
//! - [`experiment::Experiment`]: an experiment file (`sim/experiments/*.json`).
//! - [`trace::TraceFile`]: a trace (`experiments/<trace>/trace.json`) that runs both live and
//!   here, with the runtime measured on the real workers ([`measured`]).
//! - [`engine::Simulation`] / [`engine::run_policy`]: one run of one policy;
//!   [`policies`]: which core policy and node configuration each experiment policy runs.
//! - [`report`]: policy vs baseline vs oracle, tables beside the paper's numbers, sweeps, and
//!   `RESULTS.md`; [`plot`] draws the SVG figures.
//! - [`compare`]: Converge's own policy against every baseline, the oracle and LAS, with exact
//!   and perturbed estimates, and the ETAs' accuracy (`CONVERGE.md`).
//! - [`value`]: the value-based allocation paper's studies (W1..W9 under Spread, the GA, DwoP and
//!   DwP; λ, stride, cluster size, value curves); [`ga`] is its offline GA baseline.
//! - The `converge-sim` binary: `run FILE`, `sweep FILE --alpha .. --interval ..`, `value FILE`,
//!   `results`, `compare`.

pub mod compare;
pub mod curve;
pub mod engine;
mod error;
pub mod experiment;
pub mod ga;
pub mod measured;
pub mod plot;
pub mod policies;
pub mod report;
pub mod trace;
pub mod value;

pub use error::{Error, Result};
