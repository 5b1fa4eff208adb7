//! SpeCon on the cluster (specon-speculative-migration.txt): Alg. 1 runs on every worker (the
//! agent categorizes its jobs and asks for a move when a converged job shares its worker,
//! :161-195); this policy holds the cluster-wide state of Alg. 2 and 3 in one
//! [`converge_policy::specon::SpeCon`]:
//! - on every heartbeat, the categories the worker reports are observed (`t_c` of Alg. 3 is the
//!   first report of Converged);
//! - on a migration request, Alg. 2 (:227-256) picks the host: a move, or a keep (a job is
//!   decided at most once);
//! - on its timer, Alg. 3 (:290-332) rebalances.
//!
//! The simulator drives the same policy with the same calls, in the same order, through the
//! core. Placement is a plain placer (round-robin for `specon`, FlowCon's Alg. 4 for `converge`).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use converge_policy::cluster::Placer;
use converge_policy::specon::{SpeCon, SpeConConfig, WorkerLoad};

use super::placing::Placing;
use super::{Admission, ClusterPolicy, ClusterView, Decision, Report, WaitKind, request};
use crate::cluster::lifecycle::{Job, JobPhase};
use crate::cluster::types::{JobId, MoveReason, Time, WorkerId, WorkerMode};

/// SpeCon's Alg. 2 and 3 around a placer.
pub struct SpeConPolicy {
    name: &'static str,
    placing: Placing,
    specon: SpeCon,
    interval: Time,
    next_rebalance: Option<Time>,
    /// Jobs observed running, by the worker that reported them (`heartbeat`). Lists, kept
    /// and refilled in place (a set per worker made and dropped at every sync was a tenth of
    /// SpeCon's time at 3,000 workers).
    seen: Seen,
    /// Jobs that left a worker since the last heartbeat (`heartbeat`).
    departed: BTreeSet<JobId>,
    /// Jobs whose phase changed, or whose state Alg. 2 or 3 changed, since the last `sync`,
    /// each with the workers it was on before (whose lists in `seen` may still name it): all
    /// a `sync` needs to look at (`sync`).
    touched: BTreeMap<JobId, Vec<WorkerId>>,
    /// How many workers the view held at the last `sync`. A worker that registers shifts the
    /// indices SpeCon knows workers by, and the next `sync` walks them all, as it does while
    /// this is 0 (no sync yet, or `touched` overflowed).
    synced_workers: usize,
    /// `R(w, t)` of every worker, kept between requests ([`Loads`]).
    loads: Loads,
}

/// `R(w, t)` of every worker as Alg. 2 and 3 read it, by place in the view, kept between
/// requests ([`Loads::refresh`]).
#[derive(Default)]
struct Loads {
    /// Each worker's cores in use (the sum in `R(w, t)`), as of the last refresh.
    used: Vec<f64>,
    /// Workers whose sum in `used` may be out of date: a heartbeat wrote their jobs' use, or
    /// a job left them.
    stale: Vec<WorkerId>,
    /// Jobs whose phase changed since the last refresh: the workers they are on now are out
    /// of date in `used` too.
    moved: Vec<JobId>,
    /// What Alg. 2 and 3 read, as of the last refresh.
    loads: Vec<WorkerLoad>,
}

/// The most jobs `SpeConPolicy::touched` holds before the next sync is made a full one.
const TOUCHED_AT_MOST: usize = 1 << 16;

/// Running jobs by the worker they were observed on (`SpeConPolicy::seen`). Found by hash
/// (foldhash, as the core's records): every heartbeat takes its worker's list out and puts
/// it back, and nothing walks the map, so its order reaches no decision.
type Seen = HashMap<WorkerId, Vec<JobId>, foldhash::fast::RandomState>;

impl SpeConPolicy {
    /// `name` placing with `placer`, agents running `mode`, Alg. 3 every `interval` seconds.
    pub fn new(
        name: &'static str,
        placer: Box<dyn Placer + Send>,
        mode: WorkerMode,
        interval: Time,
    ) -> Self {
        SpeConPolicy {
            name,
            placing: Placing::new(placer, mode),
            // Alg. 1's α and interval are the agents'; here only the state of Alg. 2-3 is used.
            specon: SpeCon::new(SpeConConfig::default()).expect("default SpeCon config is valid"),
            interval,
            next_rebalance: None,
            seen: Seen::default(),
            departed: BTreeSet::new(),
            touched: BTreeMap::new(),
            synced_workers: 0,
            loads: Loads::default(),
        }
    }

    /// Brings SpeCon's per-job state in line with the running jobs, as [`sync_all`] does,
    /// looking only at the jobs `touched` since the last sync. The rest are as `sync_all`
    /// would leave them: a job whose phase did not change still runs where it ran (or still
    /// does not run), and its category changes only at its worker's heartbeat, which
    /// observes it then. `sync_all` over every worker at every migration request was half of
    /// SpeCon's time at 10,000 workers (`docs/performance.md`). Debug and test builds check
    /// every sync against `sync_all`.
    fn sync(&mut self, now: Time, view: ClusterView<'_>) {
        #[cfg(any(test, debug_assertions))]
        let expected = {
            let (mut specon, mut seen) = (self.specon.clone(), self.seen.clone());
            sync_all(&mut specon, &mut seen, now, view);
            (specon, seen)
        };
        if view.workers.len() != self.synced_workers {
            sync_all(&mut self.specon, &mut self.seen, now, view);
            self.synced_workers = view.workers.len();
            self.touched.clear();
        }
        for (id, left) in std::mem::take(&mut self.touched) {
            for w in &left {
                if let Some(list) = self.seen.get_mut(w) {
                    list.retain(|j| *j != id);
                }
            }
            match view.jobs.get(&id).map(|j| (j, &j.phase)) {
                Some((j, JobPhase::Running { worker })) => {
                    // Its worker's heartbeat since may have listed it already.
                    let here = self.seen.entry(worker.clone()).or_default();
                    here.retain(|k| *k != id);
                    let index = view.index_of(worker).expect("every worker is indexed");
                    observe(&mut self.specon, here, now, index, j);
                }
                // Being moved: kept.
                _ if Self::kept(view, &id) => {}
                _ => self.specon.forget(&id),
            }
        }
        // Checked in debug builds and in every test build (release ones too): a sync that
        // missed a change would go on unnoticed, deciding on a stale view.
        #[cfg(any(test, debug_assertions))]
        assert!(
            self.specon == expected.0 && same_seen(&self.seen, &expected.1),
            "SpeCon's incremental sync differs from a full one"
        );
    }

    /// Alg. 2 or 3 changed `job`'s state (its worker, its marks): the next `sync` looks at it
    /// again, as a full one would.
    fn decided(&mut self, job: JobId) {
        self.touched.entry(job).or_default();
    }

    /// What [`sync_all`] would change at a heartbeat from `worker`, without looking at every
    /// job: only the reporting worker's jobs have new reports, and a job can have stopped
    /// running only if it left a worker since the last heartbeat or was running on this one.
    /// Alg. 2 and 3 run a `sync` first, so what they read is the same; this keeps the marks
    /// SpeCon forgets (a job that stopped running starts afresh) and the times it records
    /// (`t_c`, the first Converged report) as `sync` at every heartbeat did, at a cost that
    /// grows with one worker's jobs rather than the cluster's. (One case is recorded later
    /// than `sync` at every heartbeat recorded it: a job that stayed Converged through its
    /// worker's loss and return gets its new `t_c` at that worker's next heartbeat rather
    /// than at the next heartbeat of any worker.)
    fn heartbeat(&mut self, now: Time, worker: &WorkerId, view: ClusterView<'_>) {
        // It wrote its jobs' use of the CPU.
        self.loads.changed(Some(worker.clone()), None);
        let departed = std::mem::take(&mut self.departed);
        let mut here = self.seen.remove(worker).unwrap_or_default();
        // Forgetting is by id and idempotent: a job both departed and seen here is checked
        // twice, to the same end.
        for id in departed.iter().chain(&here) {
            if !Self::kept(view, id) {
                self.specon.forget(id);
            }
        }
        let (Some(index), Some(w)) = (view.index_of(worker), view.workers.get(worker)) else {
            return;
        };
        here.clear();
        for j in w.jobs.iter().filter_map(|id| view.jobs.get(id)) {
            if matches!(j.phase, JobPhase::Running { .. }) {
                observe(&mut self.specon, &mut here, now, index, j);
            }
        }
        self.seen.insert(worker.clone(), here);
    }

    /// Whether SpeCon keeps the state of job `id`: while it runs, and while it is moved (the
    /// `migrated` mark holds until it runs again). Any other job is forgotten, to start afresh
    /// should it run again.
    fn kept(view: ClusterView<'_>, id: &str) -> bool {
        view.jobs
            .get(id)
            .is_some_and(|j| matches!(j.phase, JobPhase::Running { .. } | JobPhase::Migrating(_)))
    }

    /// Whether worker index `to` has room for `job` by reservation: Alg. 2 and 3 count jobs,
    /// not cores, and reservations still hold.
    fn fits(view: ClusterView<'_>, to: usize, job: &str) -> bool {
        let Some(j) = view.jobs.get(job) else {
            return false;
        };
        view.snapshots()
            .1
            .get(to)
            .is_some_and(|w| w.fits(&request(&j.spec)))
    }
}

impl Loads {
    /// Notes that `worker`'s cores in use, and those of the worker `job` is on now, may have
    /// changed since the last refresh. Where no migration request or tick comes to read them
    /// (one worker), the notes would pile up: past a bound, the next refresh sums every
    /// worker's instead.
    fn changed(&mut self, worker: Option<WorkerId>, job: Option<JobId>) {
        if self.stale.len() + self.moved.len() >= TOUCHED_AT_MOST {
            self.used.clear();
            self.stale.clear();
            self.moved.clear();
        }
        self.stale.extend(worker);
        self.moved.extend(job);
    }

    /// `R(w, t)` of every worker: cores in use over capacity, from heartbeats, and whether it
    /// may receive. The cores in use are summed again only on the workers whose jobs' use a
    /// heartbeat wrote, or whose jobs came or went, since the last time: summing every
    /// worker's at every migration request looked every running job up (a fifth of SpeCon's
    /// samples at 10,000 workers). Each sum is worked out as it always was, in the same order,
    /// so it is the same to the bit. The loads are then written in place from the sums and
    /// the placement snapshots (one pass over two arrays, where walking the workers' records
    /// was a cache miss each). Debug and test builds check every load against one worked out
    /// afresh from the workers.
    fn refresh(&mut self, view: ClusterView<'_>) -> &[WorkerLoad] {
        if self.used.len() != view.workers.len() {
            self.used = view.workers.values().map(|w| used(view, w)).collect();
        } else {
            for job in self.moved.drain(..) {
                if let Some(w) = view.jobs.get(&job).and_then(|j| j.worker()) {
                    self.stale.push(w.clone());
                }
            }
            for id in self.stale.drain(..) {
                if let (Some(i), Some(w)) = (view.index_of(&id), view.workers.get(&id)) {
                    self.used[i] = used(view, w);
                }
            }
        }
        self.stale.clear();
        self.moved.clear();
        // The snapshots are those of the workers in the same order, brought up to date
        // before the policy is called (`policy_view!`).
        let snaps = view.snapshots().1;
        self.loads.clear();
        self.loads.extend(
            (snaps.iter().zip(&self.used))
                .map(|(w, &used)| load(used, w.cpu_capacity, w.schedulable)),
        );
        #[cfg(any(test, debug_assertions))]
        {
            let afresh: Vec<WorkerLoad> = (view.workers.values())
                .map(|w| load(used(view, w), w.cpu_capacity, w.schedulable()))
                .collect();
            let bits = |l: &[WorkerLoad]| -> Vec<(u64, bool)> {
                l.iter()
                    .map(|l| (l.resource_use.to_bits(), l.schedulable))
                    .collect()
            };
            assert_eq!(
                bits(&self.loads),
                bits(&afresh),
                "the workers' loads, kept between requests, differ from their sums"
            );
        }
        &self.loads
    }
}

impl ClusterPolicy for SpeConPolicy {
    fn name(&self) -> &'static str {
        self.name
    }

    fn worker_mode(&self) -> WorkerMode {
        self.placing.worker_mode()
    }

    fn agent_migration(&self) -> bool {
        true
    }

    fn on_worker_forgotten(&mut self, place: usize, id: &WorkerId) {
        // SpeCon's places move down first, for the jobs a sync keeps as they are (those being
        // moved); then the next sync and the next loads' refresh are full ones. The count of
        // workers cannot say so: a worker registered before the next sync brings it back.
        self.specon.remove_worker(place);
        self.seen.remove(id);
        self.synced_workers = usize::MAX;
        self.loads.used.clear();
    }

    fn placer_index(&self) -> Option<Box<dyn converge_policy::cluster::PlacerIndex>> {
        self.placing.placer_index()
    }

    fn place(&mut self, _now: Time, job: &Job, view: ClusterView<'_>) -> Admission {
        self.placing.admit(job, view)
    }

    fn wait_kind(&self, job: &Job) -> Option<WaitKind> {
        Placing::wait_kind(job)
    }

    fn place_move(&mut self, _now: Time, job: &Job, view: ClusterView<'_>) -> Option<WorkerId> {
        self.placing.target(job, view)
    }

    fn on_report(&mut self, now: Time, report: Report<'_>, view: ClusterView<'_>) -> Vec<Decision> {
        match report {
            Report::Heartbeat { worker } => {
                self.heartbeat(now, worker, view);
                Vec::new()
            }
            Report::MigrationRequest {
                worker,
                job,
                reason,
            } => {
                self.sync(now, view);
                let loads = self.loads.refresh(view);
                let ids = view.snapshots().0;
                let decided = self
                    .specon
                    .jobs()
                    .get(job.as_str())
                    .is_none_or(|j| j.migrated);
                if decided {
                    // Alg. 2 lines 9/15/20: decided at most once.
                    return Vec::new();
                }
                let chosen = self.specon.schedule(job, loads);
                if chosen.is_some() {
                    // Alg. 2 set its worker to the target, moved or not.
                    self.decided(job.clone());
                }
                match chosen {
                    Some(m) if Self::fits(view, m.to, job) => {
                        let mut attributes = score_attributes(ids, &m.scores, m.to);
                        attributes.insert("request".into(), reason.to_string());
                        vec![Decision::Move {
                            job: job.clone(),
                            to: ids[m.to].clone(),
                            reason: MoveReason::Speculative,
                            attributes,
                        }]
                    }
                    Some(m) => vec![Decision::Keep {
                        job: job.clone(),
                        reason: format!(
                            "kept on {worker}: {} has the lowest score but no room for it",
                            ids[m.to]
                        ),
                        attributes: BTreeMap::from([("request".into(), reason.to_string())]),
                    }],
                    None => vec![Decision::Keep {
                        job: job.clone(),
                        reason: format!(
                            "kept on {worker}: it has the minimum score (SpeCon Alg. 2 lines 8-10)"
                        ),
                        attributes: BTreeMap::from([("request".into(), reason.to_string())]),
                    }],
                }
            }
        }
    }

    fn on_tick(&mut self, now: Time, view: ClusterView<'_>) -> Vec<Decision> {
        let due = *self.next_rebalance.get_or_insert(now + self.interval);
        if now < due {
            return Vec::new();
        }
        self.next_rebalance = Some(now + self.interval);
        if view.workers.len() < 2 {
            return Vec::new();
        }
        self.sync(now, view);
        let loads = self.loads.refresh(view);
        let ids = view.snapshots().0;
        let (moves, bf) = self.specon.rebalance(now, loads, &[]);
        for m in &moves {
            // Alg. 3 set its worker to the target, moved or not.
            self.decided(m.job_id.as_str().into());
        }
        moves
            .into_iter()
            .filter(|m| Self::fits(view, m.to, &m.job_id))
            .map(|m| Decision::Move {
                to: ids[m.to].clone(),
                job: m.job_id.into(),
                reason: MoveReason::Rebalance,
                attributes: BTreeMap::from([("balance_factor".into(), bf.to_string())]),
            })
            .collect()
    }

    fn next_due(&self) -> Option<Time> {
        self.next_rebalance
    }

    fn on_transition(&mut self, job: &JobId, was_on: Option<&WorkerId>) {
        // Syncs come with migration requests and rebalancing ticks: where neither comes (one
        // worker, whose agent asks for no move), `touched` would keep every job that ever
        // changed. Past a bound, the next sync walks everything instead.
        if self.touched.len() >= TOUCHED_AT_MOST {
            self.touched.clear();
            self.synced_workers = 0;
        }
        let left = self.touched.entry(job.clone()).or_default();
        if let Some(w) = was_on
            && !left.contains(w)
        {
            left.push(w.clone());
        }
        // Its worker before and its worker now (found at the next refresh) sum their cores
        // anew.
        self.loads.changed(was_on.cloned(), Some(job.clone()));
    }

    fn on_departure(
        &mut self,
        _now: Time,
        _worker: &WorkerId,
        job: &JobId,
        _view: ClusterView<'_>,
    ) -> Vec<Decision> {
        self.departed.insert(job.clone());
        Vec::new()
    }
}

/// Brings `specon` and `seen` in line with the running jobs: their workers (by index in the
/// view's order) and their reported categories; jobs neither running nor being moved leave.
/// It walks the workers' jobs, not every job the core holds (the simulator keeps every
/// finished job). What [`SpeConPolicy::sync`] keeps up to date by the jobs touched, and its
/// check in debug builds.
fn sync_all(specon: &mut SpeCon, seen: &mut Seen, now: Time, view: ClusterView<'_>) {
    specon.retain(|id| SpeConPolicy::kept(view, id));
    // The view's order of workers is the index SpeCon knows them by. A worker's list is
    // emptied, not removed, when none of its jobs runs (a forgotten worker's list goes with
    // it: `on_worker_forgotten`).
    for (index, w) in view.workers.values().enumerate() {
        let mut runs_here = w
            .jobs
            .iter()
            .filter_map(|id| view.jobs.get(id))
            .filter(|j| matches!(j.phase, JobPhase::Running { .. }))
            .peekable();
        let here = match seen.get_mut(&w.id) {
            Some(here) => here,
            None if runs_here.peek().is_none() => continue,
            None => seen.entry(w.id.clone()).or_default(),
        };
        here.clear();
        for j in runs_here {
            observe(specon, here, now, index, j);
        }
    }
}

/// A worker's load for Alg. 2 and 3: `R(w, t)`, its `used` cores over its `capacity`.
fn load(used: f64, capacity: f64, schedulable: bool) -> WorkerLoad {
    WorkerLoad {
        resource_use: if capacity > 0.0 { used / capacity } else { 0.0 },
        schedulable,
    }
}

/// The cores in use on worker `w`, from its jobs' last heartbeat (the sum in `R(w, t)`).
fn used(view: ClusterView<'_>, w: &crate::cluster::lifecycle::Worker) -> f64 {
    (w.jobs.iter())
        .filter_map(|id| view.jobs.get(id))
        .map(|j| j.view.cpu_usage)
        .sum()
}

/// SpeCon observes running job `j` on worker `index` (its category as last reported), and
/// `here`, that worker's list in `seen`, names it.
fn observe(specon: &mut SpeCon, here: &mut Vec<JobId>, now: Time, index: usize, j: &Job) {
    specon.observe(now, &j.id, index, j.view.category);
    here.push(j.id.clone());
}

/// Whether two `seen` name the same jobs on each worker, in any order (an empty list is no
/// list).
#[cfg(any(test, debug_assertions))]
fn same_seen(a: &Seen, b: &Seen) -> bool {
    let sets = |s: &Seen| -> BTreeMap<WorkerId, BTreeSet<JobId>> {
        s.iter()
            .filter(|(_, l)| !l.is_empty())
            .map(|(w, l)| (w.clone(), l.iter().cloned().collect()))
            .collect()
    };
    sets(a) == sets(b)
}

/// `score.w1 = 3` for each worker Alg. 2 scored (`ineligible` for the others), up to
/// [`SCORES_SHOWN`](super::SCORES_SHOWN): over more workers, the chosen one (`to`) and the
/// eligible workers scored nearest it, and `scores_not_shown`, how many were left out. Every
/// worker's score in every migration event wrote 10,000 attributes into each at 10,000
/// workers, for the event log, the store and the trace (docs/performance.md).
fn score_attributes(ids: &[WorkerId], scores: &[f64], to: usize) -> BTreeMap<String, String> {
    let shown = super::shown_places(scores, to);
    let mut attributes: BTreeMap<String, String> = (shown.iter())
        .map(|&i| {
            (
                format!("score.{}", ids[i]),
                if scores[i].is_finite() {
                    scores[i].to_string()
                } else {
                    "ineligible".into()
                },
            )
        })
        .collect();
    if shown.len() < ids.len() {
        attributes.insert(
            "scores_not_shown".into(),
            (ids.len() - shown.len()).to_string(),
        );
    }
    attributes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::policy::SCORES_SHOWN;

    fn ids(n: usize) -> Vec<WorkerId> {
        (0..n).map(|i| format!("w{i:02}").into()).collect()
    }

    #[test]
    fn a_migration_lists_every_score_of_a_small_cluster() {
        let ids = ids(3);
        let a = score_attributes(&ids, &[2.0, f64::INFINITY, 1.0], 2);
        assert_eq!(a["score.w00"], "2");
        assert_eq!(a["score.w01"], "ineligible");
        assert_eq!(a["score.w02"], "1");
        assert!(!a.contains_key("scores_not_shown"), "{a:?}");
    }

    /// Over more workers than an event lists, the target and the eligible workers scored
    /// nearest it, and how many were left out: not one attribute per worker of the cluster.
    #[test]
    fn a_migration_on_a_big_cluster_lists_the_target_and_its_nearest_rivals() {
        let n = 1000;
        let ids = ids(n);
        // Scores 0..n, every tenth worker ineligible; the target is w500 (score 500).
        let scores: Vec<f64> = (0..n)
            .map(|i| if i % 10 == 3 { f64::INFINITY } else { i as f64 })
            .collect();
        let a = score_attributes(&ids, &scores, 500);
        let shown: Vec<&String> = a.keys().filter(|k| k.starts_with("score.")).collect();
        assert_eq!(shown.len(), SCORES_SHOWN, "{a:?}");
        assert_eq!(a["score.w500"], "500");
        assert_eq!(a["scores_not_shown"], (n - SCORES_SHOWN).to_string());
        // The 15 nearest eligible: 491..=508 but 493 and 503 (ineligible); at distance 9
        // only one more was wanted, and worker order keeps w491 over w509.
        for i in (491..=508).filter(|i| i % 10 != 3) {
            assert!(
                a.contains_key(&format!("score.w{i:02}")),
                "w{i} missing: {a:?}"
            );
        }
        assert!(!a.contains_key("score.w509"), "{a:?}");
    }
}
