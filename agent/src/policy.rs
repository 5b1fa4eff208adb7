//! The worker side of the policies the manager runs: FlowCon's executor (issue 5) and SpeCon's
//! container monitor (issue 6), fed with real measurements by the executor actor.
//!
//! The algorithms are `converge_policy`'s, unchanged; this module only turns the agent's
//! measurements into their inputs and their outputs into Docker CPU limits and migration
//! requests. The executor owns the drivers (they are fields of its actor state), applies what
//! they decide and publishes a read-only copy for heartbeats in [`crate::view::PolicyView`].
//!
//! - [`Mode`]: what the manager's last `Registered` asked for (`worker_policy`, `migration`).
//! - [`FlowConDriver`]: one worker's [`FlowCon`] (TCC'22 Alg. 1-3). Each round reads every
//!   running container's latest progress sample and its CPU use since the previous round, runs
//!   [`FlowCon::on_round`], and maps each limit (a fraction of the worker) to Docker CPUs with
//!   [`limit_to_cpus`]. The executor runs a round at `next_round` (FlowCon's `itval`, doubled
//!   while every job is completing) and at once on a container start or die (Alg. 2).
//! - [`SpeConDriver`]: SpeCon's Alg. 1 ([`SpeCon::categorize`]) every categorization interval;
//!   one `MigrationRequest` per (job, epoch) it names.
//! - [`RoundReport`]: what one FlowCon round did, with the time from the container event that
//!   triggered it to its limits being applied.
//!
//! ## Units and decisions
//! - CPU use is fed as a fraction of the worker's capacity (Δ cgroup CPU time / Δ wall time /
//!   cores), the papers' unit, so FlowCon's α values carry over unscaled
//!   (`converge_policy::growth::Resource::Cpu`).
//! - A progress sample's time is when the agent read its line; its value is the job's metric.
//!   Progress is normalized by the first value this incarnation reported (a restored job's
//!   first value is its restored loss, so its relative gains read larger than from scratch).
//! - Containers that are running or paused and whose exit is not being reported count as "on
//!   the worker" (Alg. 2's `T(i)`); a paused one uses no CPU, so its G is undefined and it keeps
//!   its list (design.md).
//! - Limits are Docker `NanoCpus` (a CFS quota per container under the worker's parent quota).
//!   What one container leaves unused goes to the others, the papers' "soft" limit.
//! - When FlowCon and SpeCon both run (`--policy converge`), the heartbeat reports FlowCon's
//!   lists: they drive the limits the manager's Alg. 4 placement reasons about. SpeCon's
//!   categories then only decide which migrations are requested. With SpeCon alone the
//!   heartbeat reports SpeCon's categories (Progressing/Watching/Converged as
//!   NEW/WATCHING/COMPLETING), which the manager's Alg. 2 scores and Alg. 3 use.
//! - SpeCon Alg. 1 marks nothing migrated on the worker (that is Alg. 2's decision, on the
//!   manager); a converged job keeps being named each interval, so requests are deduplicated
//!   per (job, epoch): a job that moved and came back as a new incarnation may ask again.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, SystemTime};

use converge_messenger::pb;
pub use converge_policy::cluster::Category;
use converge_policy::flowcon::{FlowCon, FlowConConfig, FlowConDecisions, Observation};
use converge_policy::growth::{Direction, Sample, Usage};
use converge_policy::specon::{JobObservation, SpeCon, SpeConConfig};
use tokio::time::Instant;

use crate::cgroup::MIN_CPUS;

/// What the worker runs, from the manager's last `Registered`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mode {
    /// `worker_mode == FLOWCON`: FlowCon's elastic limits. Otherwise containers compete
    /// freely within the worker's capacity.
    pub flowcon: bool,
    /// `migration`: SpeCon's Alg. 1 runs and converged jobs ask to be migrated.
    pub migration: bool,
}

impl Mode {
    /// The mode a registration asks for (`None`: not registered yet, nothing runs).
    pub fn from_registered(r: Option<&pb::Registered>) -> Self {
        r.map_or_else(Mode::default, |r| Mode {
            flowcon: r.worker_mode() == pb::WorkerMode::Flowcon,
            migration: r.migration,
        })
    }
}

/// FlowCon's limit (a fraction of the worker) as Docker CPUs (cores).
///
/// `limit × capacity`, and whatever the policy says: never above the capacity (a limit above
/// the whole worker means nothing, and under cgroup v1 a child quota above its parent's is
/// refused), never below FlowCon's lower bound `floor × capacity` (ICPP'19 Alg. 1 line 22),
/// and never below Docker's smallest quota. A limit that is not a number means "no limit".
pub fn limit_to_cpus(limit: f64, floor: f64, capacity: f64) -> f64 {
    let floor = if floor.is_finite() {
        floor.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let fraction = if limit.is_nan() { 1.0 } else { limit }.clamp(floor, 1.0);
    let capacity = capacity.max(MIN_CPUS);
    (fraction * capacity).clamp(MIN_CPUS, capacity)
}

/// Scales `cpus` up, keeping their ratios, when together they leave part of the worker idle.
///
/// Why: the papers treat `docker update` limits as soft ("the unused option will be utilized by
/// others", flowcon-icpp2019.txt:423-426), but Docker's `--cpus` is a hard CFS quota. With
/// every job held at FlowCon's lower bound `1/(β·n)` (three jobs, β = 2: 1/6 each), half the
/// worker would sit idle — measured on the testbed before this existed. Scaling the limits up
/// until they cover the capacity keeps FlowCon's priorities (the ratios) and keeps the worker
/// busy, as soft limits would. Scaling only ever raises a limit, so none falls below the lower
/// bound, and none exceeds the capacity.
pub fn work_conserving(cpus: &mut [f64], capacity: f64) {
    let total: f64 = cpus.iter().sum();
    if cpus.is_empty() || total.is_nan() || total <= 0.0 || total >= capacity {
        return;
    }
    let factor = capacity / total;
    for c in cpus.iter_mut() {
        *c = (*c * factor).min(capacity);
    }
}

/// A policy category on the wire.
pub fn category_to_pb(c: Category) -> pb::Category {
    match c {
        Category::New => pb::Category::New,
        Category::Watching => pb::Category::Watching,
        Category::Completing => pb::Category::Completing,
    }
}

/// One container on the worker as a round sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Running {
    /// The job.
    pub job_id: String,
    /// The incarnation.
    pub epoch: u64,
    /// Docker's id.
    pub container_id: String,
    /// The latest progress sample: when the agent read it, and the metric's value.
    pub sample: Option<(Instant, f64)>,
    /// The first value this incarnation reported.
    pub first_value: Option<f64>,
    /// The metric's direction.
    pub direction: Direction,
    /// Cumulative CPU time, ns (None when it could not be read).
    pub cpu_ns: Option<u64>,
    /// The CPU limit applied now, in cores.
    pub cpu_limit: Option<f64>,
}

/// A limit a round wants on a container.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    /// The job.
    pub job_id: String,
    /// Its container.
    pub container_id: String,
    /// Docker CPUs.
    pub cpus: f64,
}

/// A FlowCon round's decisions and the limits to apply.
#[derive(Clone, Debug)]
pub struct Plan {
    /// What [`FlowCon::on_round`] decided.
    pub decisions: FlowConDecisions,
    /// Each decision as Docker CPUs on its container.
    pub targets: Vec<Target>,
    /// The CPU use each job was measured at, as a fraction of the worker (by job id).
    pub usage: BTreeMap<String, f64>,
}

/// One worker's FlowCon, fed from measurements.
#[derive(Debug)]
pub struct FlowConDriver {
    flowcon: FlowCon,
    capacity: f64,
    /// Time zero of the policy's clock.
    origin: Instant,
    /// Each container's cumulative CPU time at the previous round.
    cpu: HashMap<String, (u64, Instant)>,
    /// When the next round is due absent an event (`next_round_at`).
    pub next_round: Instant,
    /// Containers whose limit FlowCon changed (released when the worker policy turns "free").
    pub limited: HashSet<String>,
}

impl FlowConDriver {
    /// A driver for a worker of `capacity` cores; the first round is due at `now`.
    pub fn new(
        config: FlowConConfig,
        capacity: f64,
        now: Instant,
    ) -> Result<Self, converge_policy::Error> {
        Ok(Self {
            flowcon: FlowCon::new(config)?,
            capacity,
            origin: now,
            cpu: HashMap::new(),
            next_round: now,
            limited: HashSet::new(),
        })
    }

    /// The policy's state (for snapshots, α and itval).
    pub fn flowcon(&self) -> &FlowCon {
        &self.flowcon
    }

    fn secs(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.origin).as_secs_f64()
    }

    /// One round at `now` over the containers on the worker (one per job).
    pub fn round(&mut self, now: Instant, running: &[Running]) -> Plan {
        let present: HashSet<&str> = running.iter().map(|r| r.container_id.as_str()).collect();
        self.cpu.retain(|id, _| present.contains(id.as_str()));
        self.limited.retain(|id| present.contains(id.as_str()));
        let mut usage = BTreeMap::new();
        let mut observations = Vec::with_capacity(running.len());
        for r in running {
            // Eq. 2's R: average CPU since the previous round, as a fraction of the worker.
            let used = match (r.cpu_ns, self.cpu.get(&r.container_id)) {
                (Some(ns), Some(&(prev_ns, prev_t))) if ns >= prev_ns && now > prev_t => {
                    (ns - prev_ns) as f64
                        / now.duration_since(prev_t).as_nanos() as f64
                        / self.capacity
                }
                _ => 0.0,
            };
            if let Some(ns) = r.cpu_ns {
                self.cpu.insert(r.container_id.clone(), (ns, now));
            }
            usage.insert(r.job_id.clone(), used);
            observations.push(Observation {
                job_id: r.job_id.clone(),
                sample: r.sample.map(|(at, value)| Sample {
                    time: self.secs(at),
                    value,
                }),
                initial_value: r.first_value,
                direction: r.direction,
                usage: Usage::cpu(used),
            });
        }
        let t = self.secs(now);
        // FlowCon TCC'22 Alg. 2 (listeners), Alg. 3 (adaptive α, when on) and Alg. 1 (lists and
        // limits), flowcon-tcc2022-extended.txt:116-146, 213-232, 250-270.
        let decisions = self.flowcon.on_round(t, &observations);
        let floor = self.flowcon.lower_bound(decisions.limits.len());
        let containers: HashMap<&str, &str> = running
            .iter()
            .map(|r| (r.job_id.as_str(), r.container_id.as_str()))
            .collect();
        let mut targets: Vec<Target> = decisions
            .limits
            .iter()
            .filter_map(|d| {
                Some(Target {
                    job_id: d.job_id.clone(),
                    container_id: containers.get(d.job_id.as_str())?.to_string(),
                    cpus: limit_to_cpus(d.limit, floor, self.capacity),
                })
            })
            .collect();
        let mut cpus: Vec<f64> = targets.iter().map(|t| t.cpus).collect();
        work_conserving(&mut cpus, self.capacity);
        for (t, c) in targets.iter_mut().zip(cpus) {
            t.cpus = c;
        }
        // Alg. 1 line 17 / Alg. 2 lines 8, 16: the interval in force (doubled while all
        // complete, reset by an event).
        self.next_round = now + Duration::from_secs_f64((decisions.next_round_at - t).max(0.0));
        Plan {
            decisions,
            targets,
            usage,
        }
    }
}

/// SpeCon's Alg. 1 on one worker.
#[derive(Debug)]
pub struct SpeConDriver {
    specon: SpeCon,
    origin: Instant,
    interval: Duration,
    /// When the next categorization is due.
    pub next_round: Instant,
    requested: HashSet<(String, u64)>,
}

impl SpeConDriver {
    /// A driver whose first categorization (which only records each job's first sample) is
    /// due at `now`.
    pub fn new(config: SpeConConfig, now: Instant) -> Result<Self, converge_policy::Error> {
        Ok(Self {
            interval: Duration::from_secs_f64(config.interval),
            specon: SpeCon::new(config)?,
            origin: now,
            next_round: now,
            requested: HashSet::new(),
        })
    }

    /// Each job's category, by job id.
    pub fn categories(&self) -> impl Iterator<Item = (&String, Category)> {
        self.specon.jobs().iter().map(|(id, j)| (id, j.category))
    }

    /// One categorization at `now`; returns the migration requests not sent before.
    pub fn round(&mut self, now: Instant, running: &[Running]) -> Vec<pb::MigrationRequest> {
        let at = |t: Instant| t.saturating_duration_since(self.origin).as_secs_f64();
        let observations: Vec<JobObservation> = running
            .iter()
            .map(|r| JobObservation {
                job_id: r.job_id.clone(),
                // Every job here is on this worker: one worker, index 0.
                worker: 0,
                sample: r.sample.map(|(t, value)| Sample { time: at(t), value }),
                initial_value: r.first_value,
                direction: r.direction,
            })
            .collect();
        // SpeCon Alg. 1 lines 3-16 (specon-speculative-migration.txt:161-195): gains over the
        // interval move jobs between PC/WC/CC; converged jobs sharing the worker are named.
        let names = self.specon.categorize(at(now), &observations);
        self.next_round = now + self.interval;
        self.requested.retain(|(job, epoch)| {
            running
                .iter()
                .any(|r| &r.job_id == job && r.epoch == *epoch)
        });
        let alpha = self.specon.config().alpha;
        let others = running.len().saturating_sub(1);
        let mut requests = Vec::new();
        for job in names {
            let Some(r) = running.iter().find(|r| r.job_id == job) else {
                continue;
            };
            if !self.requested.insert((job.clone(), r.epoch)) {
                continue;
            }
            let gain = self
                .specon
                .jobs()
                .get(&job)
                .and_then(|j| j.last_gain)
                .unwrap_or(0.0);
            requests.push(pb::MigrationRequest {
                job_id: job,
                epoch: r.epoch,
                // SpeCon Alg. 1 line 16: "Request-Reallocation".
                reason: format!(
                    "converged (SpeCon Alg. 1): gained {:.3}% of its initial metric in the last \
                     {:.0?}, below α = {:.3}% and below the interval before; shares the worker \
                     with {others} other job(s)",
                    gain * 100.0,
                    self.interval,
                    alpha * 100.0
                ),
            });
        }
        requests
    }
}

/// What started a FlowCon round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RoundTrigger {
    /// FlowCon's interval elapsed.
    Interval,
    /// A job's container started (Alg. 2 lines 5-9).
    Started {
        /// The job.
        job_id: String,
    },
    /// A job's container died (Alg. 2 lines 10-17).
    Died {
        /// The job.
        job_id: String,
    },
    /// The manager's registration turned FlowCon on.
    PolicyChanged,
}

/// One limit a round applied (or found already in place).
#[derive(Clone, Debug, PartialEq)]
pub struct AppliedLimit {
    /// The job.
    pub job_id: String,
    /// Its container.
    pub container_id: String,
    /// Docker CPUs now in force.
    pub cpus: f64,
    /// Whether this round changed it (a Docker update was sent).
    pub changed: bool,
    /// Why the update failed, if it did (the previous limit then stays).
    pub error: Option<String>,
}

/// What one FlowCon round did (sent to `Config::round_reports`).
#[derive(Clone, Debug)]
pub struct RoundReport {
    /// What started it.
    pub trigger: RoundTrigger,
    /// The policy's decisions.
    pub decisions: FlowConDecisions,
    /// Every container's limit after the round.
    pub applied: Vec<AppliedLimit>,
    /// CPU use each job was measured at over the last interval (fraction of the worker).
    pub usage: BTreeMap<String, f64>,
    /// From the Docker event's own timestamp to the last limit applied (event delivery by the
    /// engine included); only for rounds a container event started.
    pub event_to_applied: Option<Duration>,
    /// From the executor receiving the event to the last limit applied (the agent's share).
    pub received_to_applied: Option<Duration>,
}

/// A Docker event's `timeNano` as a time.
pub fn event_time(time_nano: Option<i64>) -> Option<SystemTime> {
    let ns = u64::try_from(time_nano?).ok()?;
    SystemTime::UNIX_EPOCH.checked_add(Duration::from_nanos(ns))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn running(job: &str, t: Instant, value: f64, cpu_ns: u64) -> Running {
        Running {
            job_id: job.into(),
            epoch: 1,
            container_id: format!("c-{job}"),
            sample: Some((t, value)),
            first_value: Some(2.0),
            direction: Direction::Minimize,
            cpu_ns: Some(cpu_ns),
            cpu_limit: None,
        }
    }

    #[test]
    fn limits_map_to_cores_within_capacity_and_floor() {
        // Half of a 2-core worker.
        assert_eq!(limit_to_cpus(0.5, 0.25, 2.0), 1.0);
        // Above the worker: the whole worker, never more.
        assert_eq!(limit_to_cpus(1.7, 0.25, 2.0), 2.0);
        // Below FlowCon's lower bound: the bound.
        assert_eq!(limit_to_cpus(0.01, 0.25, 2.0), 0.5);
        // Not a number: no limit (the whole worker).
        assert_eq!(limit_to_cpus(f64::NAN, 0.25, 2.0), 2.0);
        // Docker's smallest quota wins over a tinier bound on a tiny worker.
        assert_eq!(limit_to_cpus(0.0, 0.0, 0.02), MIN_CPUS);
    }

    #[test]
    fn limits_that_leave_the_worker_idle_are_scaled_up_keeping_their_ratios() {
        // Three jobs at FlowCon's floor 1/6 on a 1-core worker would use half of it.
        let mut cpus = vec![1.0 / 6.0; 3];
        work_conserving(&mut cpus, 1.0);
        for c in &cpus {
            assert!((c - 1.0 / 3.0).abs() < 1e-12, "{cpus:?}");
        }
        // A newcomer at 0.5 beside a completing job at 0.125: 4:1 kept, the worker covered.
        let mut cpus = vec![0.5, 0.125];
        work_conserving(&mut cpus, 1.0);
        assert!(
            (cpus[0] - 0.8).abs() < 1e-12 && (cpus[1] - 0.2).abs() < 1e-12,
            "{cpus:?}"
        );
        // Limits that already cover the worker are left alone (the paper's 1 + 0.25).
        let mut cpus = vec![1.0, 0.25];
        work_conserving(&mut cpus, 1.0);
        assert_eq!(cpus, vec![1.0, 0.25]);
        // A lone job gets the whole worker, never more.
        let mut cpus = vec![0.3];
        work_conserving(&mut cpus, 2.0);
        assert_eq!(cpus, vec![2.0]);
    }

    proptest! {
        #[test]
        fn mapped_limits_never_exceed_capacity_nor_fall_below_the_bound(
            limit in prop_oneof![any::<f64>(), -1.0..2.0f64],
            beta in 1.0..8.0f64,
            n in 1usize..40,
            capacity in 0.01..64.0f64,
        ) {
            let floor = 1.0 / (beta * n as f64);
            let cpus = limit_to_cpus(limit, floor, capacity);
            prop_assert!(cpus <= capacity + 1e-12, "{cpus} > {capacity}");
            prop_assert!(cpus >= (floor * capacity).min(capacity) - 1e-12, "{cpus} < floor");
            prop_assert!(cpus >= MIN_CPUS - 1e-12);
        }

        /// Whole rounds: whatever the jobs report, every container's limit stays within the
        /// worker and above FlowCon's lower bound for the containers present.
        #[test]
        fn every_round_keeps_limits_within_bounds(
            rounds in prop::collection::vec(
                prop::collection::vec((0u8..6, 0.0..3.0f64, 0u64..2_000_000_000), 0..6),
                1..12,
            ),
            capacity in 0.05..8.0f64,
            alpha in 0.0..0.5f64,
        ) {
            let t0 = Instant::now();
            let config = FlowConConfig { alpha, itval: 2.0, beta: 2.0, adaptive: alpha < 0.1, ..Default::default() };
            let mut d = FlowConDriver::new(config, capacity, t0).unwrap();
            let mut cpu: HashMap<String, u64> = HashMap::new();
            for (i, jobs) in rounds.iter().enumerate() {
                let now = t0 + Duration::from_secs(2 * (i as u64 + 1));
                let mut seen = HashSet::new();
                let rs: Vec<Running> = jobs
                    .iter()
                    .filter(|(j, _, _)| seen.insert(*j))
                    .map(|(j, v, c)| {
                        let id = format!("j{j}");
                        let total = cpu.entry(id.clone()).or_default();
                        *total += c;
                        running(&id, now, *v, *total)
                    })
                    .collect();
                let plan = d.round(now, &rs);
                prop_assert_eq!(plan.targets.len(), rs.len());
                let floor = 1.0 / (2.0 * rs.len().max(1) as f64);
                for t in &plan.targets {
                    prop_assert!(t.cpus <= capacity + 1e-12);
                    prop_assert!(t.cpus >= (floor * capacity).max(MIN_CPUS).min(capacity) - 1e-9);
                }
                prop_assert!(d.next_round > now);
            }
        }
    }

    #[test]
    fn a_newcomer_holds_a_completing_job_to_its_lower_bound() {
        // One core; a job that has stopped learning, then a new one arrives.
        let t0 = Instant::now();
        let config = FlowConConfig {
            alpha: 0.02,
            itval: 2.0,
            beta: 2.0,
            adaptive: false,
            ..Default::default()
        };
        let mut d = FlowConDriver::new(config, 1.0, t0).unwrap();
        let at = |s: u64| t0 + Duration::from_secs(s);
        // Rounds at 2, 4, 6 s: loss 1.0 -> 0.99 -> 0.985 with a full core: G < α twice.
        let mut plan = d.round(at(2), &[running("a", at(2), 1.0, 0)]);
        for (s, loss) in [(4, 0.99), (6, 0.985)] {
            plan = d.round(at(s), &[running("a", at(s), loss, (s - 2) * 1_000_000_000)]);
        }
        assert!(plan.decisions.all_completing, "{plan:?}");
        assert_eq!(plan.targets[0].cpus, 1.0, "alone and completing: free");
        // Alg. 1 lines 14-17: itval doubled while all complete.
        assert_eq!(d.next_round, at(6) + Duration::from_secs(4));
        let b = Running {
            sample: None,
            first_value: None,
            cpu_ns: Some(0),
            ..running("b", at(7), 0.0, 0)
        };
        let plan = d.round(at(7), &[running("a", at(6), 0.985, 5_000_000_000), b]);
        assert!(plan.decisions.event);
        let cpus: BTreeMap<&str, f64> = plan
            .targets
            .iter()
            .map(|t| (t.job_id.as_str(), t.cpus))
            .collect();
        assert_eq!(cpus["a"], 0.25, "completing: 1/(β·n) of the worker");
        assert_eq!(cpus["b"], 1.0, "newcomer: the whole worker");
        // Alg. 2 line 8: the event resets itval.
        assert_eq!(d.next_round, at(7) + Duration::from_secs(2));
    }

    #[test]
    fn cpu_use_is_a_fraction_of_the_worker_over_the_round() {
        let t0 = Instant::now();
        let mut d = FlowConDriver::new(FlowConConfig::default(), 2.0, t0).unwrap();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let plan = d.round(at(1), &[running("a", at(1), 2.0, 1_000_000_000)]);
        assert_eq!(plan.usage["a"], 0.0, "no baseline yet");
        // 3 s of CPU in 2 s on a 2-core worker: 1.5 cores = 0.75 of the worker.
        let plan = d.round(at(3), &[running("a", at(3), 1.0, 4_000_000_000)]);
        assert!((plan.usage["a"] - 0.75).abs() < 1e-12, "{:?}", plan.usage);
    }

    #[test]
    fn specon_requests_a_converged_shared_job_once_per_epoch() {
        let t0 = Instant::now();
        let config = SpeConConfig {
            alpha: 0.01,
            interval: 1.0,
            ..Default::default()
        };
        let mut d = SpeConDriver::new(config, t0).unwrap();
        let at = |s: u64| t0 + Duration::from_secs(s);
        // "a" barely moves (gains shrinking below 1%), "b" learns fast.
        let a = [2.0, 1.99, 1.985, 1.983, 1.982];
        let b = [2.0, 1.5, 1.0, 0.6, 0.3];
        let mut sent = Vec::new();
        for s in 0..5 {
            let rs = [
                running("a", at(s), a[s as usize], 0),
                running("b", at(s), b[s as usize], 0),
            ];
            sent.extend(d.round(at(s), &rs));
        }
        assert_eq!(sent.len(), 1, "{sent:?}");
        assert_eq!(sent[0].job_id, "a");
        assert_eq!(sent[0].epoch, 1);
        assert!(
            sent[0].reason.contains("SpeCon Alg. 1"),
            "{}",
            sent[0].reason
        );
        let cats: BTreeMap<&String, Category> = d.categories().collect();
        assert_eq!(cats[&"a".to_string()], Category::CONVERGED);
        assert_eq!(cats[&"b".to_string()], Category::PROGRESSING);
        // A new incarnation of the same job may ask again.
        let mut a2 = running("a", at(5), 1.9815, 0);
        a2.epoch = 2;
        let again = d.round(at(5), &[a2, running("b", at(5), 0.1, 0)]);
        assert_eq!(again.len(), 1, "{again:?}");
        assert_eq!(again[0].epoch, 2);
    }

    #[test]
    fn mode_follows_the_registration() {
        let mut r = pb::Registered {
            worker_mode: pb::WorkerMode::Flowcon as i32,
            ..Default::default()
        };
        assert_eq!(
            Mode::from_registered(Some(&r)),
            Mode {
                flowcon: true,
                migration: false
            }
        );
        r.set_worker_mode(pb::WorkerMode::Free);
        r.migration = true;
        assert_eq!(
            Mode::from_registered(Some(&r)),
            Mode {
                flowcon: false,
                migration: true
            }
        );
        assert_eq!(Mode::from_registered(None), Mode::default());
    }
}
