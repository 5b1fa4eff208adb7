//! What one pass of `Core::schedule` over the pending jobs knows as it goes: the answers it
//! may give a job without asking the policy, which jobs it may skip, whether it may end before
//! the end of the queue, and what it learnt for the next pass.

use std::collections::HashMap;

use super::kinds::Kinds;
use super::policy::WaitKind;

type Hasher = foldhash::fast::RandomState;

/// How many jobs of one kind in a row a pass visits before it looks for the next job that may
/// not hold its answer ([`Pass::in_a_run`]): a search reads every kind, so a queue whose kinds
/// are mixed closely would pay one at every job.
pub(super) const RUN: usize = 32;

/// One pass over the pending jobs (module doc).
pub(super) struct Pass {
    /// Every pending job is visited (unless the pass ends early); otherwise only those that
    /// came after the last pass that gave waits for room only.
    whole: bool,
    /// Tests' `every_pass_full`: the policy is asked about every job, and the pass never ends
    /// early.
    full: bool,
    /// [`Kinds::joins`] when the pass began: a job that came since is not in this pass.
    joins: u64,
    /// Every answer so far was a wait for room: then the pass changed nothing.
    for_room_only: bool,
    /// The waits for room given in this pass, by kind, at touch count `answers_at`: a job of
    /// the kind gets the same answer without asking while the count stays.
    answers: HashMap<WaitKind, String, Hasher>,
    answers_at: u64,
    /// How many kinds in `answers` have every pending job holding their answer.
    kinds_done: usize,
    /// Each kind's wait, while every job of it visited in this pass got the same one (`None`
    /// once two got different ones): a pass over every pending job then knows that each
    /// holds it ([`Kinds::settled`]). Kept in whole passes only.
    given: HashMap<WaitKind, Option<String>, Hasher>,
    /// The pass ended before the end of the queue ([`Pass::waits_for_room`]). One that skips
    /// to the end ([`Pass::in_a_run`]) has not: every job it skipped holds the answer it
    /// would have been given, so what it records ([`Pass::end`]) holds for them too.
    ended_early: bool,
    /// The kind of the jobs visited last, how many in a row were given their answers by
    /// [`Pass::known`] ([`Pass::in_a_run`]), and how many make a run ([`RUN`]).
    run_kind: Option<WaitKind>,
    run: usize,
    run_of: usize,
}

impl Pass {
    /// A pass begun at touch count `touches`, with `kinds` as they are then.
    pub fn new(whole: bool, full: bool, run_of: usize, kinds: &Kinds, touches: u64) -> Self {
        Self {
            whole,
            full,
            joins: kinds.joins(),
            for_room_only: true,
            answers: HashMap::default(),
            answers_at: touches,
            kinds_done: 0,
            given: HashMap::default(),
            ended_early: false,
            run_kind: None,
            run: 0,
            run_of,
        }
    }

    /// The wait a job of `kind` gets without asking, at touch count `touches`, noted as given
    /// ([`Pass::waits`]); the answers of an older count are forgotten (a worker's snapshot
    /// changed since).
    pub fn known(&mut self, kind: Option<WaitKind>, touches: u64) -> Option<&str> {
        if self.answers_at != touches || self.full {
            self.answers.clear();
            self.kinds_done = 0;
            self.answers_at = touches;
        }
        let Some((kind, reason)) = kind.and_then(|k| self.answers.get_key_value(&k)) else {
            // The policy is asked: a run of jobs given known answers ends.
            self.run_kind = None;
            return None;
        };
        if self.whole {
            note(&mut self.given, *kind, reason);
        }
        Some(reason)
    }

    /// The policy told a job of `kind` to wait, for `reason`.
    pub fn waits(&mut self, kind: Option<WaitKind>, reason: &str) {
        if let Some(kind) = kind.filter(|_| self.whole) {
            note(&mut self.given, kind, reason);
        }
    }

    /// The policy told a job of `kind` to wait for room, for `reason` (after [`Pass::waits`]);
    /// whether the pass may end here: every job left is of a kind answered in this pass and
    /// holds that answer already.
    pub fn waits_for_room(&mut self, kind: WaitKind, reason: String, kinds: &Kinds) -> bool {
        self.kinds_done += usize::from(kinds.all_hold(kind, &reason));
        self.answers.insert(kind, reason);
        self.ended_early = self.kinds_done == kinds.len()
            && kinds.unkinded() == 0
            && kinds.joins() == self.joins
            && !self.full;
        self.ended_early
    }

    /// Whether every pending job of `kind` holds the answer it has in this pass, at the
    /// touch count of the last [`Pass::known`]: then visiting any of them changes nothing.
    pub fn holds(&self, kind: WaitKind, kinds: &Kinds) -> bool {
        !self.full && (self.answers.get(&kind)).is_some_and(|a| kinds.all_hold(kind, a))
    }

    /// After a job of `kind` was given its answer by [`Pass::known`]: whether the pass should
    /// look for the next job that may not hold its answer ([`Kinds::next_unheld`]) and skip
    /// to it, having visited a run of jobs of `kind` in a row, which holds its answer. Counted
    /// by kind alone until the run is long enough: the visits in between cost no lookup.
    pub fn in_a_run(&mut self, kind: Option<WaitKind>, kinds: &Kinds) -> bool {
        if kind.is_none() || kind != self.run_kind {
            self.run_kind = kind;
            self.run = 0;
        }
        self.run += 1;
        if self.run < self.run_of {
            return false;
        }
        self.run = 0;
        kind.is_some_and(|k| self.holds(k, kinds))
    }

    /// The policy answered something other than a wait for room.
    pub fn acted(&mut self) {
        self.for_room_only = false;
    }

    /// Whether every answer of the pass was a wait for room.
    pub fn for_room_only(&self) -> bool {
        self.for_room_only
    }

    /// Ends the pass. One that visited every pending job, and in which none came, gave each
    /// kind it gave one answer that answer: recorded in `kinds`, so that the next pass can
    /// end once each kind has its answer again.
    pub fn end(self, kinds: &mut Kinds) {
        if !self.whole || self.ended_early || kinds.joins() != self.joins {
            return;
        }
        for (kind, reason) in self.given {
            if let Some(reason) = reason {
                kinds.settled(kind, &reason);
            }
        }
    }
}

/// Notes in `given` ([`Pass`]'s) that a job of `kind` was told to wait for `reason`.
fn note(given: &mut HashMap<WaitKind, Option<String>, Hasher>, kind: WaitKind, reason: &str) {
    match given.get_mut(&kind) {
        Some(seen) => {
            if seen.as_deref() != Some(reason) {
                *seen = None;
            }
        }
        None => {
            given.insert(kind, Some(reason.to_owned()));
        }
    }
}
