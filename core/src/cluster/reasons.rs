//! Reasons a job's record says that more than one part of the core writes: one text each, so
//! that what sets a reason and what later recognizes it (a placement pass leaving a fresh
//! submission's reason alone, a registration settling a cancelled job's wait) agree.

/// What a running job says.
pub(super) fn running_on(worker: &str) -> String {
    format!("running on {worker}")
}

/// What a job says from its submission until a placement pass gives it a reason.
pub(super) const SUBMITTED: &str = "waiting for a worker";

/// What a job cancelled while `worker` is unreachable adds to its reason
/// ([`Core::cancel`](super::Core::cancel)); settled when the worker registers again.
pub(super) fn stop_waits(worker: &str) -> String {
    format!("; its container on {worker} stops when {worker} is back")
}
