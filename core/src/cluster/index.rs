//! The placement index: every worker's [`WorkerSnapshot`], kept in worker-id order and brought
//! up to date only where something changed.
//!
//! A placer reads one snapshot per worker. Building them afresh for every placement walked every
//! job on every worker and allocated each worker's id and job list again: at 10,000 workers
//! that was most of the simulator's time and grew with the cluster, not with the change. Here a
//! worker's snapshot is rebuilt only after the core changed what it shows: the worker's jobs
//! ([`super::Core::transition`]), the worker itself (`Core::worker_mut`), or its jobs'
//! views, which only the worker's own heartbeat writes (and that step goes through
//! `worker_mut`). Progress lines, the bulk of the traffic, touch nothing here. Tests check after
//! every step that each snapshot equals one built afresh (`Core::derived_state_is_fresh`, in
//! tests).
//!
//! It also keeps the set of draining workers, for the same reason: the core looks for drains
//! to continue after every change, and finding them by walking every worker was a fifth of
//! the simulator's profile at 10,000 workers.
//!
//! It also keeps the schedulable workers ordered by their running jobs, then their place in
//! the id order: the order in which Spread (and the policies that place with it: Docker
//! Swarm's, `las`, the value policies' fallback) prefers workers, whatever the job
//! ([`converge_policy::cluster::Placer::ranks_by_running`]). Such a placement reads the first
//! workers of the order that fit instead of comparing every worker (Spread's scan and the
//! event's nearest scores were a sixth of the simulator's time at 10,000 workers). The other
//! placers still compare every worker (a contiguous array of plain structs, no allocation per
//! worker) unless they keep an index of their own
//! ([`converge_policy::cluster::PlacerIndex`]: FlowCon's Alg. 4, ordered by its score), which
//! this index tells of every snapshot it rebuilds; least-allocated's scores depend on the job.
//! For `converge`, which asks for it, it keeps the workers ordered by crowding (jobs per
//! reference core): its placement scores only the least crowded, the first in that order.

use std::collections::{BTreeSet, HashMap};
use std::ops::Bound::{Excluded, Unbounded};

use converge_policy::cluster::{PlacerIndex, WorkerSnapshot};

use super::lifecycle::{Jobs, Worker, WorkerPhase, Workers};
use super::policy::snapshot;
use super::types::WorkerId;

/// Snapshots of every worker, in id order (module doc).
#[derive(Debug, Default)]
pub struct PlacementIndex {
    ids: Vec<WorkerId>,
    snaps: Vec<WorkerSnapshot>,
    /// Each worker's place in `ids`: found by hashing its id once, where a binary search
    /// compared it with fourteen others at 10,000 workers, each behind a pointer (a heartbeat
    /// looks its worker's place up to refresh its snapshot). Foldhash, as in
    /// [`IdMap`](crate::cluster::idmap::IdMap), for the same reasons.
    places: HashMap<WorkerId, usize, foldhash::fast::RandomState>,
    /// Workers written since their snapshot was taken.
    stale: BTreeSet<WorkerId>,
    /// How many times a worker was touched, ever: while it stays the same, no snapshot
    /// changed (what lets the core leave jobs waiting for room alone; `Core::schedule`).
    touches: u64,
    /// Workers that are draining, whatever their connection: the core looks for drains to
    /// continue after every placement and departure, and walking every worker for them was
    /// a fifth of the simulator's profile at 10,000 workers (`docs/performance.md`).
    draining: BTreeSet<WorkerId>,
    /// `(running jobs, place in the id order)` of every schedulable worker (module doc).
    by_running: BTreeSet<(usize, usize)>,
    /// The policy's placer's own index, told of every snapshot that changes (module doc).
    placer: Option<Box<dyn PlacerIndex>>,
    /// The schedulable workers with cores, by crowding (jobs per reference core, counting a
    /// newcomer): the order `converge` places in (`priority::per_core_of`), kept only for a
    /// policy that asks ([`super::policy::ClusterPolicy::orders_by_crowd`]); keyed by `CrowdKey`.
    by_crowd: Option<BTreeSet<CrowdKey>>,
}

impl PlacementIndex {
    /// An empty index that keeps `placer`'s index too, if the policy's placer has one, and
    /// the order by crowding if `by_crowd`.
    pub fn new(placer: Option<Box<dyn PlacerIndex>>, by_crowd: bool) -> Self {
        PlacementIndex {
            placer,
            by_crowd: by_crowd.then(BTreeSet::new),
            ..Default::default()
        }
    }

    /// Notes that worker `id` (or one of its jobs) changed.
    pub fn touch(&mut self, id: &WorkerId) {
        self.touches += 1;
        if !self.stale.contains(id) {
            self.stale.insert(id.clone());
        }
    }

    /// A count that changes whenever a snapshot may have ([`PlacementIndex::touch`]).
    pub fn touches(&self) -> u64 {
        self.touches
    }

    /// Brings every changed snapshot up to date. A worker the index has not seen goes in at its
    /// place in the order: rebuilding every snapshot for each registration made registering W
    /// workers cost W² snapshots. When the count differs from the core's (a worker forgotten,
    /// or one never touched, which does not happen today), the whole order is rebuilt, and the
    /// placer's index cut to the workers that remain.
    pub fn refresh(&mut self, workers: &Workers, jobs: &Jobs) {
        // A worker inserted before others moves their places: the order is then rebuilt.
        let mut shifted = false;
        // Workers the index knows first, at the places it knows them by, then the new ones:
        // an insertion moves the places after it, and a known worker written after it in the
        // same refresh would be written at its old place, over its neighbour's snapshot. (New
        // workers are rare: the list stays unallocated at almost every refresh, which runs at
        // every step.)
        let mut new = Vec::new();
        for id in std::mem::take(&mut self.stale) {
            match self.places.get(&id) {
                Some(&i) => self.rewrite(i, &id, workers, jobs),
                None => new.push(id),
            }
        }
        for id in new {
            let Some(w) = workers.get(&id) else {
                continue;
            };
            self.note_draining(w);
            let i = self.ids.partition_point(|x| *x < id);
            self.ids.insert(i, w.id.clone());
            self.snaps.insert(i, snapshot(w, jobs));
            self.places.insert(w.id.clone(), i);
            shifted |= i + 1 < self.ids.len();
            self.rank(i);
        }
        if self.ids.len() != workers.len() {
            // Workers left (forgotten), or some were never touched: every place is set again.
            if let Some(p) = &mut self.placer {
                p.truncate(workers.len());
            }
            self.ids = workers.keys().cloned().collect();
            self.snaps = workers.values().map(|w| snapshot(w, jobs)).collect();
            self.draining.clear();
            workers.values().for_each(|w| self.note_draining(w));
            shifted = true;
        }
        if shifted {
            self.places = (self.ids.iter().cloned()).zip(0..).collect();
            self.by_running.clear();
            if let Some(order) = &mut self.by_crowd {
                order.clear();
            }
            (0..self.snaps.len()).for_each(|i| self.rank(i));
        }
    }

    /// Rebuilds the snapshot of worker `id`, known at place `i`, and its places in the orders.
    fn rewrite(&mut self, i: usize, id: &WorkerId, workers: &Workers, jobs: &Jobs) {
        let Some(w) = workers.get(id) else {
            return;
        };
        self.note_draining(w);
        let old = std::mem::replace(&mut self.snaps[i], snapshot(w, jobs));
        if old.schedulable {
            self.by_running.remove(&(old.running, i));
        }
        if let (Some(order), Some(key)) = (&mut self.by_crowd, crowd_key(&old, i)) {
            order.remove(&key);
        }
        self.rank(i);
    }

    /// Puts the worker at place `i` in the order by running jobs, if it is schedulable, and
    /// tells the placer's index of its snapshot.
    fn rank(&mut self, i: usize) {
        let s = &self.snaps[i];
        if s.schedulable {
            self.by_running.insert((s.running, i));
        }
        if let (Some(order), Some(key)) = (&mut self.by_crowd, crowd_key(s, i)) {
            order.insert(key);
        }
        if let Some(p) = &mut self.placer {
            p.set(i, s);
        }
    }

    /// Shows schedulable worker `id` as not schedulable, in its snapshot and every order,
    /// until [`PlacementIndex::unhide`]: what a placement asked to look past one worker reads
    /// (`Core::place_elsewhere`). Every placer reads schedulability from the snapshots or
    /// from these orders, so hiding it here keeps it out of every placer's answer, fast paths
    /// included, instead of each policy filtering it out its own way. Neither touches it:
    /// nothing changed that a waiting job's answer depends on, and a touch made every waiting
    /// job be asked again.
    pub(crate) fn hide(&mut self, id: &str) {
        let Some(&i) = self.places.get(id) else {
            return;
        };
        let s = &self.snaps[i];
        if !s.schedulable {
            return;
        }
        self.by_running.remove(&(s.running, i));
        if let (Some(order), Some(key)) = (&mut self.by_crowd, crowd_key(s, i)) {
            order.remove(&key);
        }
        self.snaps[i].schedulable = false;
        if let Some(p) = &mut self.placer {
            p.set(i, &self.snaps[i]);
        }
    }

    /// Shows worker `id`, hidden by [`PlacementIndex::hide`], as it is again.
    pub(crate) fn unhide(&mut self, id: &str) {
        let Some(&i) = self.places.get(id) else {
            return;
        };
        if !self.snaps[i].schedulable {
            self.snaps[i].schedulable = true;
            self.rank(i);
        }
    }

    /// Places of the schedulable workers with cores, least crowded first, each with its
    /// crowding; `None` unless the policy asked for the order. At each crowding come the
    /// workers with jobs, in id order, then the empty ones, in groups of workers alike in
    /// everything a placement reads of an empty worker (capacities, reservations and
    /// speed), each group in id order and only its first `per_group` workers.
    ///
    /// Alike empty workers score alike. A placement that chooses the least score (ties to
    /// the first in id order) and lists the `per_group - 1` scores nearest its choice (ties
    /// to the first in id order) never chooses or lists one beyond a group's first
    /// `per_group`. The caller's part: ask for at least as many as it lists plus its choice,
    /// and break ties by place itself, since within a crowding the order is not by place.
    /// Those it would pass over are skipped, not visited: at 10,000 workers a band of
    /// `converge`'s least crowded was thousands of empty workers, all alike, visited at
    /// every placement (docs/performance.md, "Empty workers scored from their snapshots,
    /// lone jobs' weights").
    pub fn by_crowd(&self, per_group: usize) -> Option<ByCrowd<'_>> {
        assert!(per_group > 0, "a group of alike workers shows at least one");
        let order = self.by_crowd.as_ref()?;
        Some(ByCrowd {
            order,
            rest: order.range(..),
            per_group,
            group: None,
        })
    }

    /// The policy's placer's own index, up to date with [`PlacementIndex::snapshots`].
    pub fn placer(&self) -> Option<&dyn PlacerIndex> {
        self.placer.as_deref()
    }

    /// Places (in [`PlacementIndex::snapshots`]) of the schedulable workers, fewest running
    /// jobs first, ties in id order (module doc).
    pub fn by_running(&self) -> impl Iterator<Item = usize> + '_ {
        self.by_running.iter().map(|&(_, i)| i)
    }

    fn note_draining(&mut self, w: &Worker) {
        if w.state == WorkerPhase::Draining {
            if !self.draining.contains(&w.id) {
                self.draining.insert(w.id.clone());
            }
        } else {
            self.draining.remove(&w.id);
        }
    }

    /// The workers in state Draining, in id order (as of the last refresh).
    pub fn draining(&self) -> impl Iterator<Item = &WorkerId> {
        self.draining.iter()
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
        self.places.get(id).copied()
    }

    /// Whether every snapshot equals a fresh one (what tests check after every step).
    #[cfg(test)]
    pub(crate) fn is_fresh(&self, workers: &Workers, jobs: &Jobs) -> bool {
        self.stale.is_empty()
            && self.ids.iter().eq(workers.keys())
            && self.places.len() == self.ids.len()
            && (self.ids.iter().enumerate()).all(|(i, id)| self.places.get(id) == Some(&i))
            && self.draining.iter().eq(workers
                .values()
                .filter(|w| w.state == WorkerPhase::Draining)
                .map(|w| &w.id))
            && self
                .snaps
                .iter()
                .zip(workers.values())
                .all(|(s, w)| *s == snapshot(w, jobs))
            && (self.placer.as_ref()).is_none_or(|p| p.agrees_with(&self.snaps))
            && self.by_crowd.as_ref().is_none_or(|order| {
                let mut fresh: Vec<CrowdKey> = (0..self.snaps.len())
                    .filter_map(|i| crowd_key(&self.snaps[i], i))
                    .collect();
                fresh.sort_unstable();
                order.iter().eq(fresh.iter())
            })
            && self.by_running.iter().copied().eq({
                let mut order: Vec<(usize, usize)> = (self.snaps.iter().enumerate())
                    .filter(|(_, s)| s.schedulable)
                    .map(|(i, s)| (s.running, i))
                    .collect();
                order.sort_unstable();
                order
            })
    }
}

/// Where the worker at place `i` goes in the order by crowding, if it is in it.
fn crowd_key(s: &WorkerSnapshot, i: usize) -> Option<CrowdKey> {
    (s.schedulable && s.cpu_capacity > 0.0).then(|| CrowdKey {
        crowd: super::policy::priority::per_core_of(s, 1),
        alike: (s.running == 0).then(|| Alike::of(s)),
        place: i,
    })
}

/// A worker's key in the order by crowding: its crowding, then (for an empty worker) its
/// group of alike workers, then its place. Workers with jobs (no group) come before the
/// empty ones of the same crowding.
#[derive(Debug, Clone, Copy, PartialEq)]
struct CrowdKey {
    crowd: f64,
    alike: Option<Alike>,
    place: usize,
}

impl Eq for CrowdKey {}

impl PartialOrd for CrowdKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for CrowdKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.crowd.total_cmp(&other.crowd))
            .then(self.alike.cmp(&other.alike))
            .then(self.place.cmp(&other.place))
    }
}

/// What a placement reads of an empty worker's snapshot, to the bit: whether a job fits
/// (capacities and what is reserved, nothing on an empty worker) and what it adds there
/// (its own work at the worker's speed: capacity and calibration). Empty workers alike in
/// these are alike to `converge`'s placement (`PriorityPolicy::place_in_band`), which must
/// read nothing else of an empty worker's snapshot; its tests compare its every answer with
/// a scan of every worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Alike {
    cpu_capacity: u64,
    cpu_requested: u64,
    memory_capacity: u64,
    memory_requested: u64,
    calibration: u64,
}

impl Alike {
    fn of(s: &WorkerSnapshot) -> Self {
        Alike {
            cpu_capacity: s.cpu_capacity.to_bits(),
            cpu_requested: s.cpu_requested.to_bits(),
            memory_capacity: s.memory_capacity,
            memory_requested: s.memory_requested,
            calibration: s.calibration.to_bits(),
        }
    }
}

/// The order by crowding, as [`PlacementIndex::by_crowd`] gives it: `(place, crowding)`.
pub struct ByCrowd<'a> {
    order: &'a BTreeSet<CrowdKey>,
    /// What is left of the order.
    rest: std::collections::btree_set::Range<'a, CrowdKey>,
    per_group: usize,
    /// The group of alike empty workers last given, and how many of it were given. (What
    /// makes them alike fixes their crowding too: it is a newcomer over their speed.)
    group: Option<(Alike, usize)>,
}

impl Iterator for ByCrowd<'_> {
    type Item = (usize, f64);

    fn next(&mut self) -> Option<(usize, f64)> {
        let k = *self.rest.next()?;
        if let Some(alike) = k.alike {
            let given = match self.group {
                Some((a, n)) if a == alike => n + 1,
                _ => 1,
            };
            self.group = Some((alike, given));
            if given == self.per_group {
                // Past the group's last worker: no place is beyond `usize::MAX`.
                let last = CrowdKey {
                    place: usize::MAX,
                    ..k
                };
                self.rest = self.order.range((Excluded(last), Unbounded));
            }
        }
        Some((k.place, k.crowd))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use converge_policy::flowcon::FlowConPlacer;

    fn worker(id: &str, cpus: f64) -> Worker {
        Worker {
            id: id.into(),
            state: WorkerPhase::Ready,
            cpu_capacity: cpus,
            memory_bytes: 8 << 30,
            calibration: 1.0,
            labels: Default::default(),
            conn: Some(1),
            instance_id: format!("{id}-a"),
            last_seen: 0.0,
            last_heard: 0.0,
            alpha: None,
            interval_s: None,
            jobs: Default::default(),
            inbound: Default::default(),
            shared_since: 0.0,
            stops_owed: Vec::new(),
        }
    }

    /// One refresh that adds a worker before a known one and writes that known one: each
    /// snapshot, each order and the placer's index must be those of its own worker. (The core
    /// refreshes after each registration today, so this mix comes only from a batch; written
    /// in turn, the known worker's snapshot landed at its old place, over its neighbour's.)
    #[test]
    fn a_refresh_that_adds_a_worker_before_a_changed_one_keeps_every_place_its_own() {
        let placer = converge_policy::cluster::Placer::index(&FlowConPlacer);
        let mut index = PlacementIndex::new(placer, true);
        let (mut workers, jobs) = (Workers::new(), Jobs::new());
        for (id, cpus) in [("w1", 1.0), ("w3", 3.0)] {
            workers.insert(worker(id, cpus));
            index.touch(&id.into());
        }
        index.refresh(&workers, &jobs);
        assert!(index.is_fresh(&workers, &jobs));
        workers.insert(worker("w2", 2.0));
        workers.get_mut("w3").unwrap().cpu_capacity = 4.0;
        index.touch(&"w2".into());
        index.touch(&"w3".into());
        index.refresh(&workers, &jobs);
        let capacities: Vec<f64> = index.snapshots().iter().map(|s| s.cpu_capacity).collect();
        assert_eq!(capacities, [1.0, 2.0, 4.0]);
        assert!(index.is_fresh(&workers, &jobs));
    }
}
