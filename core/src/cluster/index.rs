//! The placement index: every worker's [`WorkerSnapshot`], kept in worker-id order and brought
//! up to date only where something changed.
//!
//! A placer reads one snapshot per worker. Building them afresh for every placement walked every
//! job on every worker and allocated each worker's id and job list again: at 10,000 workers
//! that was most of the simulator's time and grew with the cluster, not with the change. Here a
//! worker's snapshot is rebuilt only after the core changed what it shows: the worker's jobs
//! ([`super::Core::transition`]), the worker itself ([`super::Core::worker_mut`]), or its jobs'
//! views, which only the worker's own heartbeat writes (and that step goes through
//! `worker_mut`). Progress lines, the bulk of the traffic, touch nothing here. Tests check after
//! every step that each snapshot equals one built afresh ([`super::Core::index_is_fresh`]).
//!
//! Placers still compare every worker (a contiguous array of plain structs, no allocation per
//! worker); an ordered index per placer would have to reproduce each placer's tie rules and
//! could not serve FlowCon's Alg. 4, whose score depends on every reported job. The benchmark in
//! `docs/performance.md` shows the scan is not where the time goes at 10,000 workers.

use std::collections::{BTreeMap, BTreeSet};

use converge_policy::cluster::WorkerSnapshot;

use super::lifecycle::{Job, Worker};
use super::policy::snapshot;
use super::types::{JobId, WorkerId};

/// Snapshots of every worker, in id order (module doc).
#[derive(Debug, Default)]
pub struct PlacementIndex {
    ids: Vec<WorkerId>,
    snaps: Vec<WorkerSnapshot>,
    /// Workers written since their snapshot was taken.
    stale: BTreeSet<WorkerId>,
    /// A worker was added: the order itself must be rebuilt.
    reshape: bool,
}

impl PlacementIndex {
    /// Notes that worker `id` (or one of its jobs) changed.
    pub fn touch(&mut self, id: &str) {
        if !self.stale.contains(id) {
            self.stale.insert(id.to_string());
        }
    }

    /// Notes that the set of workers may have changed.
    pub fn reshape(&mut self) {
        self.reshape = true;
    }

    /// Brings every changed snapshot up to date.
    pub fn refresh(&mut self, workers: &BTreeMap<WorkerId, Worker>, jobs: &BTreeMap<JobId, Job>) {
        if self.reshape || self.ids.len() != workers.len() {
            self.ids = workers.keys().cloned().collect();
            self.snaps = workers.values().map(|w| snapshot(w, jobs)).collect();
            self.stale.clear();
            self.reshape = false;
            return;
        }
        for id in std::mem::take(&mut self.stale) {
            match (self.position(&id), workers.get(&id)) {
                (Some(i), Some(w)) => self.snaps[i] = snapshot(w, jobs),
                // A worker the index has not seen: its place in the order is new.
                _ => {
                    self.reshape = true;
                    return self.refresh(workers, jobs);
                }
            }
        }
    }

    /// Worker ids, in the order of [`PlacementIndex::snapshots`].
    pub fn ids(&self) -> &[WorkerId] {
        &self.ids
    }

    /// One snapshot per worker, in id order.
    pub fn snapshots(&self) -> &[WorkerSnapshot] {
        &self.snaps
    }

    /// Where worker `id` is in that order.
    pub fn position(&self, id: &str) -> Option<usize> {
        self.ids.binary_search_by(|w| w.as_str().cmp(id)).ok()
    }

    /// Whether every snapshot equals a fresh one (what tests check after every step).
    pub fn is_fresh(
        &self,
        workers: &BTreeMap<WorkerId, Worker>,
        jobs: &BTreeMap<JobId, Job>,
    ) -> bool {
        self.stale.is_empty()
            && !self.reshape
            && self.ids.iter().eq(workers.keys())
            && self
                .snaps
                .iter()
                .zip(workers.values())
                .all(|(s, w)| *s == snapshot(w, jobs))
    }
}
