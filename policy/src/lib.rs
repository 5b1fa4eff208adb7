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
//!   [`LeastAllocated`], SpeCon's fixed [`RoundRobin`] initial placement, and
//!   [`FreeCompetition`] (no limits).
//! - [`Id`]: job and worker ids, shared rather than copied.
//! - [`growth`]: progress (Eq. 1) and growth efficiency (Eq. 2), normalized by the job's own
//!   initial metric, direction respected.
//! - [`estimate`]: remaining-time estimates (steps over measured throughput, Optimus' curve
//!   fit for jobs that stop at convergence, attained service), each with a basis and a
//!   confidence.
//! - [`flowcon`]: [`flowcon::FlowCon`], one worker's executor (Alg. 1, 2, 3) with the step
//!   [`flowcon::FlowCon::on_round`], and [`flowcon::FlowConPlacer`] (Alg. 4) with its index
//!   of the workers ([`flowcon::FlowConIndex`], what a placement reads at scale).
//! - [`limits`]: FlowCon's limits as Docker CPU quotas ([`limits::cpu_quotas`]: lower bound,
//!   capacity, work-conserving scaling), the one conversion the agent applies and the
//!   simulator's CPU model caps jobs with.
//! - [`share`]: how a worker's CPU is split among its containers (CFS weights under hard
//!   quotas, water-filled): the simulator's CPU model and the cluster core's ETA forecast.
//! - [`specon`]: [`specon::SpeCon`], the manager's cluster-wide state machine (Alg. 1, 2, 3)
//!   with the step [`specon::SpeCon::on_round`]; [`specon::select_host`] and
//!   [`specon::rebalance_plan`] are the pure kernels.
//! - [`value`]: value-based allocation: [`value::ValueCurve`], expected execution time under CPU
//!   shares ([`value::completion_offsets`]), β (Eq. 1) and the overload test (Eq. 2), and
//!   [`value::ValueAllocator`] (DwoP and DwP) with the steps [`value::ValueAllocator::on_arrival`],
//!   [`value::ValueAllocator::on_departure`] and [`value::ValueAllocator::on_tick`].
//!
//! Every step takes the time as an argument and returns its decisions as data; none of the
//! algorithms draws random numbers (ties are broken by index or id), so the same inputs give the
//! same decisions. Wherever a paper's pseudo-code is garbled or contradicts its text, the
//! module doc of the algorithm lists what we decided and why.
//!
//! Each algorithm cites the paper and the line numbers of the text copies in `shared/papers/`.

pub mod baseline;
pub mod cluster;
mod error;
pub mod estimate;
pub mod flowcon;
pub mod growth;
pub mod id;
pub mod limits;
pub mod ranked;
pub mod share;
pub mod specon;
pub mod value;

pub use baseline::{FreeCompetition, LeastAllocated, RoundRobin, Spread};
pub use cluster::{Category, JobRequest, JobSnapshot, Placement, Placer, Scores, WorkerSnapshot};
pub use error::{Error, Result};
pub use id::Id;
pub use ranked::Ranked;
