//! # converge-sim: the papers' experiments, replayed on the policy code
//!
//! A discrete-event simulator that drives the *same* `converge-policy` code the manager and
//! the agent run (FlowCon's executor and placement, SpeCon's migration and rebalancing, the
//! baselines) over a modelled cluster, so that policies can be compared on identical job traces
//! in seconds instead of hours.
//!
//! **The runtime is a model on purpose.** Training is work done at the CPU share a job gets;
//! sharing follows a CFS-like water-filling with soft limits ([`cpu`]); the metric a job reports
//! comes from a curve ([`curve`]) with seeded noise; the manager sees worker state only as fresh
//! as the last heartbeat; a migration pauses a job for save + restore seconds. Absolute times
//! therefore differ from the papers' testbeds; what carries over is how policies compare.
//!
//! Virtual clock, seeded RNG (ChaCha8): the same experiment file gives byte-identical output.
//!
//! ## Where to start
//! - [`experiment::Experiment`]: an experiment file (`sim/experiments/*.json`).
//! - [`engine::Simulation`] / [`engine::run_policy`]: one run of one policy.
//! - [`report`]: policy vs baseline vs oracle, tables beside the paper's numbers, sweeps, and
//!   `RESULTS.md`; [`plot`] draws the SVG figures.
//! - [`value`]: the value-based allocation paper's studies (W1..W9 under Spread, the GA, DwoP and
//!   DwP; λ, stride, cluster size, value curves); [`ga`] is its offline GA baseline.
//! - The `converge-sim` binary: `run FILE`, `sweep FILE --alpha .. --interval ..`, `value FILE`,
//!   `results`.

pub mod cpu;
pub mod curve;
pub mod engine;
mod error;
pub mod experiment;
pub mod ga;
pub mod plot;
pub mod report;
pub mod value;

pub use error::{Error, Result};
