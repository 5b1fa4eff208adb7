//! Policies that only place: a `converge_policy` [`Placer`] (spread, least-allocated,
//! round-robin, FlowCon's Alg. 4), with the worker-side mode that goes with it.

use std::collections::BTreeMap;

use converge_policy::cluster::{JobRequest, Placement, Placer, PlacerIndex};

#[cfg(any(test, debug_assertions))]
use super::shown_places;
use super::{
    Admission, ClusterPolicy, ClusterView, SCORES_SHOWN, WaitKind, placement_text, request,
    shown_text,
};
use crate::cluster::lifecycle::Job;
use crate::cluster::types::{Time, WorkerId, WorkerMode};

/// A placer and the worker mode it runs with.
pub struct Placing {
    placer: Box<dyn Placer + Send>,
    mode: WorkerMode,
    /// Whether the placer has an index of its own: only then is the core's placer index
    /// (built from this policy's placer, [`ClusterPolicy::placer_index`]) this placer's.
    indexed: bool,
}

impl Placing {
    /// `placer`, with agents running `mode`.
    pub fn new(placer: Box<dyn Placer + Send>, mode: WorkerMode) -> Self {
        let indexed = placer.index().is_some();
        Placing {
            placer,
            mode,
            indexed,
        }
    }

    /// Which jobs get the same wait for room from [`Placing::admit`]: its only one is the
    /// placer's `Unschedulable`, whose reason reads the request and the snapshots
    /// ([`converge_policy::cluster::unschedulable_reason`]).
    pub fn wait_kind(job: &Job) -> Option<WaitKind> {
        WaitKind::request(&job.spec)
    }

    /// The placer's answer for `job` as an admission (shared by every policy that places).
    pub fn admit(&mut self, job: &Job, view: ClusterView<'_>) -> Admission {
        let (ids, snaps) = view.snapshots();
        let need = request(&job.spec);
        let (index, scores) = match self.quick(&need, view) {
            Some((shown, placer)) => {
                let score = |i: usize| placer.map_or(snaps[i].running as f64, |p| p.score(i));
                (shown[0], shown_text(ids, shown, score))
            }
            None => match self.placer.place(&need, snaps) {
                Placement::Worker { index, scores } => (index, placement_text(ids, &scores, index)),
                // Every placer says so only when no schedulable worker fits the request.
                Placement::Unschedulable { reason } => {
                    return Admission::Wait {
                        reason,
                        for_room: true,
                    };
                }
            },
        };
        let worker = ids[index].clone();
        Admission::Place {
            reason: format!("placed on {worker} by {}", self.placer.name()),
            worker,
            cpu_shares: 0,
            victims: Vec::new(),
            attributes: BTreeMap::from([("scores".to_string(), scores)]),
        }
    }

    /// The placer's choice for a job that must leave its worker.
    pub fn target(&mut self, job: &Job, view: ClusterView<'_>) -> Option<WorkerId> {
        let (ids, snaps) = view.snapshots();
        let need = request(&job.spec);
        let index = match self.quick(&need, view) {
            Some((shown, _)) => Some(shown[0]),
            None => self.placer.place(&need, snaps).index(),
        };
        index.map(|i| ids[i].clone())
    }

    /// Over more workers than an event lists, the placer's choice then its nearest rivals
    /// read off an order the core keeps ([`Placing::ranked`], [`Placing::indexed`]), with
    /// the placer's index when the order was its own (else the scores are running jobs);
    /// `None` when neither applies or nothing fits (the placer then compares every worker,
    /// and says why nothing fits).
    pub(crate) fn quick<'v>(
        &mut self,
        need: &JobRequest,
        view: ClusterView<'v>,
    ) -> Option<(Vec<usize>, Option<&'v dyn PlacerIndex>)> {
        match self.ranked(need, view) {
            Some(shown) => Some((shown, None)),
            None => (self.indexed(need, view)).map(|(shown, placer)| (shown, Some(placer))),
        }
    }

    /// For a placer that [ranks by running jobs](Placer::ranks_by_running), over more workers
    /// than an event lists: its choice then its nearest rivals, read off the index's order
    /// (the first workers there that fit) instead of a comparison of every worker. The same
    /// answer and the same event text as [`Placer::place`] and [`scores_text`]: the choice
    /// has the fewest running jobs of the workers it fits, so its rivals' distances are their
    /// running jobs less its own, and the nearest are the next in the order, ties in id
    /// order as in `scores_text`. `None` when this does not apply or nothing fits (the placer
    /// then says why).
    pub(crate) fn ranked(&self, need: &JobRequest, view: ClusterView<'_>) -> Option<Vec<usize>> {
        let (ids, snaps) = view.snapshots();
        if !self.placer.ranks_by_running() || ids.len() <= SCORES_SHOWN {
            return None;
        }
        let shown: Vec<usize> = (view.index.by_running())
            .filter(|&i| snaps[i].fits(need))
            .take(SCORES_SHOWN)
            .collect();
        (!shown.is_empty()).then_some(shown)
    }

    /// For a placer with [an index of its own](converge_policy::cluster::PlacerIndex), over
    /// more workers than an event lists: its choice then its nearest rivals, from that index.
    /// Test and debug builds check the answer against [`Placer::place`] and [`shown_places`]
    /// over the same snapshots, every time.
    fn indexed<'v>(
        &mut self,
        need: &JobRequest,
        view: ClusterView<'v>,
    ) -> Option<(Vec<usize>, &'v dyn PlacerIndex)> {
        let (ids, snaps) = view.snapshots();
        let placer = (view.index.placer()).filter(|_| self.indexed && ids.len() > SCORES_SHOWN)?;
        let shown = placer.place(need, snaps, SCORES_SHOWN - 1)?;
        #[cfg(any(test, debug_assertions))]
        {
            // The placers with an index keep no state in `place`: the check changes nothing.
            match self.placer.place(need, snaps) {
                Placement::Worker { index, scores } => {
                    let (mut want, mut got) =
                        (shown_places(&scores.to_vec(), index), shown.clone());
                    want.sort_unstable();
                    got.sort_unstable();
                    assert_eq!(
                        (shown[0], got),
                        (index, want),
                        "the placer's index and its scan"
                    );
                }
                p => panic!("the placer's index chose where its scan says {p:?}"),
            }
        }
        Some((shown, placer))
    }
}

impl ClusterPolicy for Placing {
    fn name(&self) -> &'static str {
        self.placer.name()
    }

    fn placer_index(&self) -> Option<Box<dyn PlacerIndex>> {
        self.placer.index()
    }

    fn worker_mode(&self) -> WorkerMode {
        self.mode
    }

    fn place(&mut self, _now: Time, job: &Job, view: ClusterView<'_>) -> Admission {
        self.admit(job, view)
    }

    fn wait_kind(&self, job: &Job) -> Option<WaitKind> {
        Placing::wait_kind(job)
    }

    fn place_move(&mut self, _now: Time, job: &Job, view: ClusterView<'_>) -> Option<WorkerId> {
        self.target(job, view)
    }
}
