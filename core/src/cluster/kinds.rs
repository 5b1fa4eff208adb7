//! The pending jobs counted by the kind their policy gives them
//! ([`ClusterPolicy::wait_kind`]), with the reason every job of a kind holds, when they all
//! hold one: what lets a pass over a backlog end once each kind has had its answer
//! (`Core::schedule`), rather than visit every waiting job to find it holds that answer
//! already, and skip the jobs of kinds that hold theirs to the next job of another.

use std::collections::{BTreeSet, HashMap};

use super::policy::WaitKind;

#[cfg(doc)]
use super::policy::ClusterPolicy;

/// The pending jobs by kind (module doc). The core tells it of every job that becomes
/// pending, leaves, or is given another reason while it waits.
#[derive(Debug, Default)]
pub(super) struct Kinds {
    of: HashMap<WaitKind, Kind, foldhash::fast::RandomState>,
    /// Pending jobs of no kind, by their place in the queue: each is asked at every pass.
    unkinded: BTreeSet<u64>,
    /// Jobs that became pending, ever: a pass sees whether one came while it ran.
    joins: u64,
}

#[derive(Debug)]
struct Kind {
    /// Its pending jobs, by their place in the queue.
    seqs: BTreeSet<u64>,
    /// A reason some of them may hold, and how many do: every one when `holding == jobs`.
    reason: String,
    holding: usize,
}

impl Kind {
    /// One more of its jobs holds `reason`.
    fn holds(&mut self, reason: &str) {
        // The count is exact for `reason` only. With one job, the count of any reason is
        // known, so `reason` may be re-pointed (as `Kinds::settled` does after a pass gave
        // every job one).
        if self.seqs.len() == 1 && self.reason != reason {
            reason.clone_into(&mut self.reason);
            self.holding = 0;
        }
        if self.reason == reason {
            self.holding += 1;
        }
    }

    /// One of its jobs no longer holds `reason`.
    fn dropped(&mut self, reason: &str) {
        if self.reason == reason {
            self.holding -= 1;
        }
    }
}

/// The most kinds [`Kinds::next_unheld`] searches among: beyond them, a search per skip would
/// cost more than the visits it saves, and it answers "the next job".
const SEARCHED_KINDS: usize = 64;

impl Kinds {
    /// Job `seq` of `kind` became pending, holding `reason`.
    pub fn joined(&mut self, kind: Option<WaitKind>, seq: u64, reason: &str) {
        self.joins += 1;
        let Some(kind) = kind else {
            self.unkinded.insert(seq);
            return;
        };
        let k = self.of.entry(kind).or_insert_with(|| Kind {
            seqs: BTreeSet::new(),
            reason: String::new(),
            holding: 0,
        });
        k.seqs.insert(seq);
        k.holds(reason);
    }

    /// Pending job `seq` of `kind`, holding `reason`, left the queue.
    pub fn left(&mut self, kind: Option<WaitKind>, seq: u64, reason: &str) {
        let Some(kind) = kind else {
            self.unkinded.remove(&seq);
            return;
        };
        // Counted when it joined, unless a policy's kind for a job changed while it waited
        // (which `wait_kind` promises not to do): then the kind it joined keeps its place and
        // a job too many, which can only cost passes their early end and their skips over that
        // kind (a skip to that place lands on the next pending job).
        debug_assert!(
            self.of.get(&kind).is_some_and(|k| k.seqs.contains(&seq)),
            "a pending job's kind is counted"
        );
        let Some(k) = self.of.get_mut(&kind) else {
            return;
        };
        if !k.seqs.remove(&seq) {
            return;
        }
        k.dropped(reason);
        if k.seqs.is_empty() {
            self.of.remove(&kind);
        }
    }

    /// A pending job of `kind` was given `to` in place of `from`.
    pub fn reasoned(&mut self, kind: Option<WaitKind>, from: &str, to: &str) {
        if let Some(k) = kind.and_then(|kind| self.of.get_mut(&kind)) {
            k.dropped(from);
            k.holds(to);
        }
    }

    /// Every pending job of `kind` was just given `reason` (a pass visited each).
    pub fn settled(&mut self, kind: WaitKind, reason: &str) {
        if let Some(k) = self.of.get_mut(&kind) {
            if k.reason != reason {
                reason.clone_into(&mut k.reason);
            }
            k.holding = k.seqs.len();
        }
    }

    /// Whether every pending job of `kind` holds `reason`.
    pub fn all_hold(&self, kind: WaitKind, reason: &str) -> bool {
        self.of
            .get(&kind)
            .is_some_and(|k| k.holding == k.seqs.len() && k.reason == reason)
    }

    /// The place of the first pending job in `from..=last` of no kind or of a kind for which
    /// `holds` is false; `None` when there is none. Every job before it is of a kind `holds`
    /// says has its answer: a pass may skip them. With more than [`SEARCHED_KINDS`] kinds,
    /// `from` itself.
    pub fn next_unheld(
        &self,
        from: u64,
        last: u64,
        holds: impl Fn(WaitKind) -> bool,
    ) -> Option<u64> {
        if from > last {
            return None;
        }
        if self.of.len() > SEARCHED_KINDS {
            return Some(from);
        }
        let first = |seqs: &BTreeSet<u64>| seqs.range(from..=last).next().copied();
        (self.of.iter())
            .filter(|(kind, _)| !holds(**kind))
            .filter_map(|(_, k)| first(&k.seqs))
            .chain(first(&self.unkinded))
            .min()
    }

    /// How many kinds have pending jobs.
    pub fn len(&self) -> usize {
        self.of.len()
    }

    /// Pending jobs of no kind.
    pub fn unkinded(&self) -> usize {
        self.unkinded.len()
    }

    /// Jobs that became pending, ever.
    pub fn joins(&self) -> u64 {
        self.joins
    }

    /// Whether the counts are those of `pending` (each pending job's place, kind and reason).
    #[cfg(test)]
    pub fn counts<'a>(
        &self,
        pending: impl Iterator<Item = (u64, Option<WaitKind>, &'a str)>,
    ) -> bool {
        let mut fresh = Kinds::default();
        let mut holding: HashMap<WaitKind, usize> = HashMap::new();
        for (seq, kind, reason) in pending {
            fresh.joined(kind, seq, reason);
            if let Some(kind) = kind
                && self.of.get(&kind).is_some_and(|k| k.reason == reason)
            {
                *holding.entry(kind).or_default() += 1;
            }
        }
        fresh.unkinded == self.unkinded
            && fresh.of.len() == self.of.len()
            && (self.of.iter()).all(|(kind, k)| {
                fresh.of.get(kind).is_some_and(|f| f.seqs == k.seqs)
                    && holding.get(kind).copied().unwrap_or(0) == k.holding
            })
    }
}
