//! The worker side of the policies the manager runs: FlowCon's executor (issue 5) and SpeCon's
//! container monitor (issue 6).
//!
//! The decisions live in the worker's pure core, `converge_core::node` (the simulator drives
//! the same one): when a round is due (FlowCon's `itval`, doubled while every job is
//! completing, and at once on a container start or die, Alg. 2), `FlowCon::on_round`, the
//! limits as Docker quotas (`converge_policy::limits::cpu_quotas`: the lower bound, the
//! capacity, work-conserving scaling), SpeCon's Alg. 1 and its migration requests (one per
//! job and epoch). The executor feeds it real measurements (cgroup CPU time, progress lines)
//! and carries out what it decides; this module holds what the agent adds around it:
//!
//! - [`mode`]: what the manager's last `Registered` asked for (`worker_mode`, `migration`).
//! - [`RoundReport`]: what one FlowCon round did, with the time from the container event that
//!   triggered it to its limits being applied (sent to `Config::round_reports`).
//! - [`category_to_pb`], [`event_time`]: wire and Docker conversions.
//!
//! ## Units and decisions
//! - CPU use is fed as a fraction of the worker's capacity (Δ cgroup CPU time / Δ wall time /
//!   cores), the papers' unit, so FlowCon's α values carry over unscaled.
//! - A progress sample's time is when the agent read its line; its value is the job's metric.
//!   Progress is normalized by the first value this incarnation reported.
//! - Containers that are running or paused and whose exit is not being reported count as "on
//!   the worker" (Alg. 2's `T(i)`); a paused one uses no CPU, so its G is undefined and it keeps
//!   its list (design.md).
//! - Limits are Docker `NanoCpus` (a CFS quota per container under the worker's parent quota).
//!   What one container leaves unused goes to the others, the papers' "soft" limit.
//! - When FlowCon and SpeCon both run (`--policy converge`), the heartbeat reports FlowCon's
//!   lists: they drive the limits the manager's Alg. 4 placement reasons about. SpeCon's
//!   categories then only decide which migrations are requested. With SpeCon alone the
//!   heartbeat reports SpeCon's categories (Progressing/Watching/Converged as
//!   NEW/WATCHING/COMPLETING), which the manager's Alg. 2 scores and Alg. 3 use.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

pub use converge_core::node::{Mode, RoundTrigger};
use converge_messenger::pb;
pub use converge_policy::cluster::Category;
use converge_policy::flowcon::FlowConDecisions;

/// The worker policy a registration asks for (`None`: not registered yet, nothing runs):
/// FlowCon's elastic limits for `worker_mode == FLOWCON`, SpeCon's Alg. 1 with `migration`.
pub fn mode(r: Option<&pb::Registered>) -> Mode {
    r.map_or_else(Mode::default, |r| Mode {
        flowcon: r.worker_mode() == pb::WorkerMode::Flowcon,
        migration: r.migration,
    })
}

/// A policy category on the wire.
pub fn category_to_pb(c: Category) -> pb::Category {
    match c {
        Category::New => pb::Category::New,
        Category::Watching => pb::Category::Watching,
        Category::Completing => pb::Category::Completing,
    }
}

/// One limit a round applied (or found already in place).
#[derive(Clone, Debug, PartialEq)]
pub struct AppliedLimit {
    /// The job.
    pub job_id: String,
    /// Its container.
    pub container_id: String,
    /// Docker CPUs now in force.
    pub cpus: f64,
    /// Whether this round changed it (a Docker update was sent).
    pub changed: bool,
    /// Why the update failed, if it did (the previous limit then stays).
    pub error: Option<String>,
}

/// What one FlowCon round did (sent to `Config::round_reports`).
#[derive(Clone, Debug)]
pub struct RoundReport {
    /// What started it.
    pub trigger: RoundTrigger,
    /// The policy's decisions.
    pub decisions: FlowConDecisions,
    /// Every container's limit after the round.
    pub applied: Vec<AppliedLimit>,
    /// CPU use each job was measured at over the last interval (fraction of the worker).
    pub usage: BTreeMap<String, f64>,
    /// From the Docker event's own timestamp to the last limit applied (event delivery by the
    /// engine included); only for rounds a container event started.
    pub event_to_applied: Option<Duration>,
    /// From the executor receiving the event to the last limit applied (the agent's share).
    pub received_to_applied: Option<Duration>,
}

/// A Docker event's `timeNano` as a time.
pub fn event_time(time_nano: Option<i64>) -> Option<SystemTime> {
    let ns = u64::try_from(time_nano?).ok()?;
    SystemTime::UNIX_EPOCH.checked_add(Duration::from_nanos(ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_follows_the_registration() {
        let mut r = pb::Registered {
            worker_mode: pb::WorkerMode::Flowcon as i32,
            ..Default::default()
        };
        assert_eq!(
            mode(Some(&r)),
            Mode {
                flowcon: true,
                migration: false
            }
        );
        r.set_worker_mode(pb::WorkerMode::Free);
        r.migration = true;
        assert_eq!(
            mode(Some(&r)),
            Mode {
                flowcon: false,
                migration: true
            }
        );
        assert_eq!(mode(None), Mode::default());
    }

    #[test]
    fn docker_event_times_are_unix_nanoseconds() {
        assert_eq!(
            event_time(Some(1_500_000_000)),
            Some(SystemTime::UNIX_EPOCH + Duration::from_millis(1500))
        );
        assert_eq!(event_time(Some(-1)), None);
        assert_eq!(event_time(None), None);
    }
}
