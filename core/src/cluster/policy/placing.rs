//! Policies that only place: a `converge_policy` [`Placer`] (spread, least-allocated,
//! round-robin, FlowCon's Alg. 4), with the worker-side mode that goes with it.

use std::collections::BTreeMap;

use converge_policy::cluster::{Placement, Placer};

use super::{Admission, ClusterPolicy, ClusterView, request, scores_text};
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
        match self.placer.place(&request(&job.spec), snaps) {
            Placement::Worker { index, scores } => {
                let worker = ids[index].clone();
                Admission::Place {
                    reason: format!("placed on {worker} by {}", self.placer.name()),
                    worker,
                    cpu_shares: 0,
                    victims: Vec::new(),
                    attributes: BTreeMap::from([(
                        "scores".to_string(),
                        scores_text(ids, &scores, index),
                    )]),
                }
            }
            Placement::Unschedulable { reason } => Admission::Wait { reason },
        }
    }

    /// The placer's choice for a job that must leave its worker.
    pub fn target(&mut self, job: &Job, view: ClusterView<'_>) -> Option<WorkerId> {
        let (ids, snaps) = view.snapshots();
        self.placer
            .place(&request(&job.spec), snaps)
            .index()
            .map(|i| ids[i].clone())
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
