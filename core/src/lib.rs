//! # converge-core: the decision cores
//!
//! Every decision the manager and the agents make about jobs lives here, as two pure state
//! machines over plain data: no tokio, no gRPC, no Docker, no clock (time is an argument), no
//! randomness (ids come in with the inputs). The manager's actor, the agent's executor and the
//! simulator are shells around them: they turn the outside world into inputs, call `step`, and
//! carry out the effects. So what the simulator measures is what the cluster does.
//!
//! ## Where to start
//! - [`cluster`]: the manager's core. [`cluster::Core::step`] takes one [`cluster::Input`]
//!   (a control request, an agent message, a disconnect, a tick) and returns the
//!   [`cluster::Effect`]s (commands to workers, events to record, the reply).
//! - [`cluster::lifecycle`]: a job's and a worker's lifecycle as enums that carry their data,
//!   with every transition in one function each.
//! - [`cluster::policy`]: the one interface every cluster policy implements (spread,
//!   least-allocated, round-robin, flowcon, specon, value, ...).
//! - [`node`]: one worker's core, the agent's executor without its I/O.
//!   [`node::NodeCore::step`] takes one [`node::NodeInput`] (a command, a container event or
//!   measurement, the session, a tick) and returns the [`node::NodeEffect`]s (Docker actions,
//!   results and requests for the manager, FlowCon's quotas, the next tick).

pub mod cluster;
pub mod node;
