//! Fencing by epoch and idempotency by command id, as plain data.

use std::collections::{HashMap, HashSet, VecDeque};

use super::types::{Command, CommandResult, RESULT_CACHE};

/// What the ledger says about a command before it runs.
#[derive(Debug, Clone, PartialEq)]
pub enum Admission {
    /// New and current: execute it.
    Execute,
    /// Seen before and answered: send this again (marked `replayed`).
    Replay(CommandResult),
    /// Seen before and still running: its result will be sent when it finishes.
    InFlight,
    /// Older than the newest epoch of its job: refused with this result (already recorded).
    Stale(CommandResult),
}

/// What the ledger knows of one job's epochs on this worker.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Fence {
    /// The newest epoch seen: older commands are stale.
    newest: u64,
    /// The newest epoch whose container exited here. A `Start` of it is a repeat whose first
    /// result the cache has forgotten: the manager numbers every incarnation anew (its core's
    /// `transition`), so carrying it out would run a finished incarnation a second time.
    ended: Option<u64>,
    /// When it was last seen: a number from `seen`.
    seen: u64,
}

/// The newest epoch seen per job, the results of the last `capacity` commands, and the
/// commands still running.
///
/// Epochs are kept for the `capacity` jobs seen most recently: an agent that ran a million jobs
/// does not hold a million entries. A job forgotten that way finished long ago here; a command
/// for it can only come from a stream that ended long ago (the manager sends on the live stream
/// only, in order), so forgetting its fence risks nothing a user would meet.
#[derive(Debug, Clone)]
pub struct CommandLedger {
    /// Job -> its fence.
    epochs: HashMap<String, Fence>,
    /// Jobs in the order they were seen, with the number they were seen at (older entries of
    /// a job seen again are skipped when evicting).
    seen: VecDeque<(String, u64)>,
    next_seen: u64,
    results: HashMap<String, CommandResult>,
    order: VecDeque<String>,
    in_flight: HashSet<String>,
    capacity: usize,
}

impl Default for CommandLedger {
    fn default() -> Self {
        Self::with_capacity(RESULT_CACHE)
    }
}

impl CommandLedger {
    /// A ledger remembering the last `capacity` results (at least one).
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            epochs: HashMap::new(),
            seen: VecDeque::new(),
            next_seen: 0,
            results: HashMap::new(),
            order: VecDeque::new(),
            in_flight: HashSet::new(),
            capacity: capacity.max(1),
        }
    }

    /// Records an epoch seen outside a command (an adopted container's label).
    pub fn observe_epoch(&mut self, job: &str, epoch: u64) {
        let n = self.next_seen;
        self.next_seen += 1;
        let e = self.epochs.entry(job.to_string()).or_insert(Fence {
            newest: epoch,
            ended: None,
            seen: n,
        });
        e.newest = e.newest.max(epoch);
        e.seen = n;
        self.seen.push_back((job.to_string(), n));
        while self.epochs.len() > self.capacity {
            let Some((old, at)) = self.seen.pop_front() else {
                break;
            };
            if self.epochs.get(&old).is_some_and(|e| e.seen == at) {
                self.epochs.remove(&old);
            }
        }
        // Jobs seen again leave older entries behind: drop them once they outnumber the live.
        if self.seen.len() > 4 * self.capacity {
            let epochs = &self.epochs;
            self.seen
                .retain(|(job, at)| epochs.get(job).is_some_and(|e| e.seen == *at));
        }
    }

    /// Records that a container of `epoch` exited here (it is also seen).
    pub fn observe_exit(&mut self, job: &str, epoch: u64) {
        self.observe_epoch(job, epoch);
        if let Some(e) = self.epochs.get_mut(job) {
            e.ended = e.ended.max(Some(epoch));
        }
    }

    /// The newest epoch seen for a job.
    pub fn epoch(&self, job: &str) -> Option<u64> {
        self.epochs.get(job).map(|e| e.newest)
    }

    /// The newest epoch of a job whose container exited here.
    pub fn ended(&self, job: &str) -> Option<u64> {
        self.epochs.get(job).and_then(|e| e.ended)
    }

    /// Jobs whose epoch is remembered.
    pub fn fenced(&self) -> usize {
        self.epochs.len()
    }

    /// Results remembered.
    pub fn cached(&self) -> usize {
        self.results.len()
    }

    /// Decides what to do with a command; an admitted command is marked in flight.
    pub fn admit(&mut self, cmd: &Command) -> Admission {
        if let Some(r) = self.results.get(&cmd.id) {
            let mut r = r.clone();
            r.replayed = true;
            return Admission::Replay(r);
        }
        if self.in_flight.contains(&cmd.id) {
            return Admission::InFlight;
        }
        if let Some(&Fence { newest, .. }) = self.epochs.get(&cmd.job_id)
            && cmd.epoch < newest
        {
            let r = CommandResult::of(cmd, Err(format!("stale epoch {} < {newest}", cmd.epoch)));
            self.record(r.clone());
            return Admission::Stale(r);
        }
        self.in_flight.insert(cmd.id.clone());
        Admission::Execute
    }

    /// Remembers a command's result (evicting the oldest beyond the capacity).
    ///
    /// A successful command's epoch becomes its job's newest. A failed one raises no fence:
    /// a Start of epoch 2 refused because epoch 1 still runs here must not make the Stop of
    /// epoch 1 that would clear the way "stale".
    pub fn record(&mut self, result: CommandResult) {
        self.in_flight.remove(&result.command_id);
        if result.ok {
            self.observe_epoch(&result.job_id, result.epoch);
        }
        if self.results.contains_key(&result.command_id) {
            return;
        }
        self.order.push_back(result.command_id.clone());
        self.results.insert(result.command_id.clone(), result);
        while self.order.len() > self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.results.remove(&old);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::types::Action;

    fn cmd(id: &str, job: &str, epoch: u64) -> Command {
        Command {
            id: id.into(),
            job_id: job.into(),
            epoch,
            action: Action::Pause,
        }
    }

    fn ok(c: &Command) -> CommandResult {
        CommandResult::of(c, Ok(None))
    }

    #[test]
    fn a_command_older_than_the_newest_epoch_is_refused() {
        let mut l = CommandLedger::default();
        assert_eq!(l.admit(&cmd("a", "j", 2)), Admission::Execute);
        l.record(ok(&cmd("a", "j", 2)));
        match l.admit(&cmd("b", "j", 1)) {
            Admission::Stale(r) => {
                assert!(!r.ok);
                assert_eq!(r.error, "stale epoch 1 < 2");
                assert_eq!(r.epoch, 1);
            }
            other => panic!("expected stale, got {other:?}"),
        }
        // The same epoch and newer ones are accepted; other jobs are independent.
        assert_eq!(l.admit(&cmd("c", "j", 2)), Admission::Execute);
        assert_eq!(l.admit(&cmd("d", "j", 3)), Admission::Execute);
        l.record(ok(&cmd("d", "j", 3)));
        assert_eq!(l.epoch("j"), Some(3));
        assert_eq!(l.admit(&cmd("e", "k", 1)), Admission::Execute);
    }

    #[test]
    fn a_failed_command_raises_no_fence() {
        let mut l = CommandLedger::default();
        l.observe_epoch("j", 1);
        // Start of epoch 2 fails (epoch 1 still runs here) ...
        assert_eq!(l.admit(&cmd("start2", "j", 2)), Admission::Execute);
        l.record(CommandResult::of(
            &cmd("start2", "j", 2),
            Err("already runs epoch 1".into()),
        ));
        // ... so the Stop of epoch 1 that clears the way is not stale.
        assert_eq!(l.admit(&cmd("stop1", "j", 1)), Admission::Execute);
        assert_eq!(l.epoch("j"), Some(1));
    }

    #[test]
    fn an_exit_is_remembered_with_the_newest_epoch() {
        let mut l = CommandLedger::with_capacity(2);
        l.observe_exit("j", 2);
        l.observe_exit("j", 1);
        assert_eq!((l.epoch("j"), l.ended("j")), (Some(2), Some(2)));
        l.observe_epoch("j", 3);
        assert_eq!((l.epoch("j"), l.ended("j")), (Some(3), Some(2)));
        assert_eq!(l.ended("k"), None);
        // Forgotten with the job's fence, after `capacity` other jobs.
        l.observe_epoch("a", 1);
        l.observe_epoch("b", 1);
        assert_eq!(l.ended("j"), None);
    }

    #[test]
    fn adopted_epochs_fence_commands() {
        let mut l = CommandLedger::default();
        l.observe_epoch("j", 5);
        l.observe_epoch("j", 4);
        assert!(matches!(l.admit(&cmd("a", "j", 4)), Admission::Stale(_)));
        assert_eq!(l.admit(&cmd("b", "j", 5)), Admission::Execute);
    }

    #[test]
    fn a_repeated_command_id_replays_the_earlier_result() {
        let mut l = CommandLedger::default();
        assert_eq!(l.admit(&cmd("a", "j", 1)), Admission::Execute);
        // While it runs, a repeat is neither executed nor answered twice.
        assert_eq!(l.admit(&cmd("a", "j", 1)), Admission::InFlight);
        l.record(CommandResult::of(&cmd("a", "j", 1), Err("boom".into())));
        match l.admit(&cmd("a", "j", 1)) {
            Admission::Replay(r) => {
                assert!(r.replayed);
                assert!(!r.ok);
                assert_eq!(r.error, "boom");
            }
            other => panic!("expected replay, got {other:?}"),
        }
        // A stale refusal is remembered too.
        l.observe_epoch("j", 9);
        assert!(matches!(l.admit(&cmd("s", "j", 1)), Admission::Stale(_)));
        assert!(matches!(l.admit(&cmd("s", "j", 1)), Admission::Replay(r) if r.replayed && !r.ok));
    }

    #[test]
    fn the_result_cache_is_bounded() {
        let mut l = CommandLedger::with_capacity(3);
        for i in 0..5 {
            let c = cmd(&format!("c{i}"), "j", 1);
            assert_eq!(l.admit(&c), Admission::Execute);
            l.record(ok(&c));
        }
        assert_eq!(l.cached(), 3);
        // The oldest were forgotten: executing again is the only option left.
        assert_eq!(l.admit(&cmd("c0", "j", 1)), Admission::Execute);
        assert!(matches!(l.admit(&cmd("c4", "j", 1)), Admission::Replay(_)));
    }

    #[test]
    fn epochs_are_kept_for_the_jobs_seen_most_recently() {
        let mut l = CommandLedger::with_capacity(3);
        for (job, epoch) in [("a", 2), ("b", 1), ("c", 1)] {
            l.observe_epoch(job, epoch);
        }
        // `a` is seen again: `b` is now the one seen longest ago.
        l.observe_epoch("a", 1);
        l.observe_epoch("d", 1);
        assert_eq!(l.fenced(), 3);
        assert_eq!(
            l.epoch("a"),
            Some(2),
            "the newest epoch stays, whatever came after"
        );
        assert_eq!(l.epoch("b"), None);
        assert_eq!(l.epoch("c"), Some(1));
        // A fence still holds for what is remembered.
        assert!(matches!(l.admit(&cmd("x", "a", 1)), Admission::Stale(_)));
        // Many sightings of few jobs do not pile up.
        for k in 0..1000 {
            l.observe_epoch("c", k);
        }
        assert!(l.seen.len() <= 4 * 3 + 1, "{}", l.seen.len());
    }
}
