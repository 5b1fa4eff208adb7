//! Policies that only place: a `converge_policy` [`Placer`] (spread, least-allocated,
//! round-robin, FlowCon's Alg. 4), with the worker-side mode that goes with it.

use std::collections::BTreeMap;

use converge_policy::cluster::{JobRequest, Placement, Placer};

use super::{
    Admission, ClusterPolicy, ClusterView, SCORES_SHOWN, request, scores_text, shown_text,
};
use crate::cluster::lifecycle::Job;
use crate::cluster::types::{Time, WorkerId, WorkerMode};

/// A placer and the worker mode it runs with.
pub struct Placing {
    placer: Box<dyn Placer + Send>,
    mode: WorkerMode,
}

impl Placing {
    /// `placer`, with agents running `mode`.
    pub fn new(placer: Box<dyn Placer + Send>, mode: WorkerMode) -> Self {
        Placing { placer, mode }
    }

    /// The placer's answer for `job` as an admission (shared by every policy that places).
    pub fn admit(&mut self, job: &Job, view: ClusterView<'_>) -> Admission {
        let (ids, snaps) = view.snapshots();
        let need = request(&job.spec);
        let (index, scores) = match self.ranked(&need, view) {
            Some(shown) => (
                shown[0],
                shown_text(ids, shown, |i| snaps[i].running as f64),
            ),
            None => match self.placer.place(&need, snaps) {
                Placement::Worker { index, scores } => (index, scores_text(ids, &scores, index)),
                Placement::Unschedulable { reason } => return Admission::Wait { reason },
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
        let index = match self.ranked(&need, view) {
            Some(shown) => Some(shown[0]),
            None => self.placer.place(&need, snaps).index(),
        };
        index.map(|i| ids[i].clone())
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
}

impl ClusterPolicy for Placing {
    fn name(&self) -> &'static str {
        self.placer.name()
    }

    fn worker_mode(&self) -> WorkerMode {
        self.mode
    }

    fn place(&mut self, _now: Time, job: &Job, view: ClusterView<'_>) -> Admission {
        self.admit(job, view)
    }

    fn place_move(&mut self, _now: Time, job: &Job, view: ClusterView<'_>) -> Option<WorkerId> {
        self.target(job, view)
    }
}
