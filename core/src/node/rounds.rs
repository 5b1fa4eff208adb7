//! The worker's policy rounds: FlowCon's elastic limits (TCC'22 Alg. 1-3) and SpeCon's Alg. 1,
//! fed from the measurements the core holds.
//!
//! The algorithms are `converge_policy`'s, unchanged; this module turns measurements into
//! their inputs and their outputs into quotas and migration requests.
//!
//! - CPU use is fed as a fraction of the worker's capacity (Δ CPU-seconds / Δ time / cores),
//!   the papers' unit, so FlowCon's α values carry over unscaled
//!   (`converge_policy::growth::Resource::Cpu`).
//! - Progress is normalized by the incarnation's initial value (a restored job's first value
//!   is its restored loss, so its relative gains read larger than from scratch).
//! - SpeCon Alg. 1 marks nothing migrated on the worker (that is Alg. 2's decision, on the
//!   manager); a converged job keeps being named each interval, so requests are deduplicated
//!   per (job, epoch): a job that moved and came back as a new incarnation may ask again.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use converge_policy::cluster::Category;
use converge_policy::flowcon::{FlowCon, FlowConConfig, FlowConDecisions, Observation};
use converge_policy::growth::{Direction, Sample, Usage};
use converge_policy::limits::cpu_quotas;
use converge_policy::specon::{JobObservation, SpeCon, SpeConConfig};

use super::types::{MigrationRequest, Target, Time};

/// One container on the worker as a round sees it (one per job, the newest epoch).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Running {
    pub job_id: String,
    pub epoch: u64,
    pub container_id: String,
    /// The latest progress sample.
    pub sample: Option<Sample>,
    /// What progress is normalized by.
    pub initial_value: Option<f64>,
    pub direction: Direction,
    /// The latest cumulative CPU reading: (when, CPU-seconds).
    pub cpu: Option<(Time, f64)>,
    /// The limit in force, cores (None: unknown).
    pub cpu_limit: Option<f64>,
}

/// What a FlowCon round decided, before the core records it.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    pub decisions: FlowConDecisions,
    pub targets: Vec<Target>,
    pub usage: BTreeMap<String, f64>,
}

/// One worker's FlowCon, fed from measurements.
#[derive(Debug, Clone)]
pub(crate) struct FlowConRounds {
    flowcon: FlowCon,
    capacity: f64,
    /// Each container's CPU reading at the previous round: (CPU-seconds, when).
    cpu: HashMap<String, (f64, Time)>,
    /// When the next round is due absent an event (`next_round_at`).
    pub next_round: Time,
    /// Containers whose limit FlowCon set (released when the worker policy turns "free").
    pub limited: HashSet<String>,
}

impl FlowConRounds {
    /// Rounds for a worker of `capacity` cores; the first is due at `now`.
    pub fn new(
        config: FlowConConfig,
        capacity: f64,
        now: Time,
    ) -> Result<Self, converge_policy::Error> {
        Ok(Self {
            flowcon: FlowCon::new(config)?,
            capacity,
            cpu: HashMap::new(),
            next_round: now,
            limited: HashSet::new(),
        })
    }

    /// The policy's state (snapshots, α, itval).
    pub fn flowcon(&self) -> &FlowCon {
        &self.flowcon
    }

    /// One round at `now` over the containers on the worker.
    pub fn round(&mut self, now: Time, running: &[Running]) -> Plan {
        let present: HashSet<&str> = running.iter().map(|r| r.container_id.as_str()).collect();
        self.cpu.retain(|id, _| present.contains(id.as_str()));
        self.limited.retain(|id| present.contains(id.as_str()));
        let mut usage = BTreeMap::new();
        let mut observations = Vec::with_capacity(running.len());
        for r in running {
            // Eq. 2's R: average CPU since the previous round, as a fraction of the worker.
            let used = match (r.cpu, self.cpu.get(&r.container_id)) {
                (Some((at, s)), Some(&(prev_s, prev_at))) if s >= prev_s && at > prev_at => {
                    (s - prev_s) / (at - prev_at) / self.capacity
                }
                _ => 0.0,
            };
            if let Some((at, s)) = r.cpu {
                self.cpu.insert(r.container_id.clone(), (s, at));
            }
            usage.insert(r.job_id.clone(), used);
            observations.push(Observation {
                job_id: r.job_id.clone(),
                sample: r.sample,
                initial_value: r.initial_value,
                direction: r.direction,
                usage: Usage::cpu(used),
            });
        }
        // FlowCon TCC'22 Alg. 2 (listeners), Alg. 3 (adaptive α, when on) and Alg. 1 (lists and
        // limits), flowcon-tcc2022-extended.txt:116-146, 213-232, 250-270.
        let decisions = self.flowcon.on_round(now, &observations);
        let floor = self.flowcon.lower_bound(decisions.limits.len());
        // The one conversion of limits to quotas; the simulator caps its jobs with it too.
        let quotas = cpu_quotas(&decisions.limits, floor, self.capacity);
        let by_job: HashMap<&str, &Running> =
            running.iter().map(|r| (r.job_id.as_str(), r)).collect();
        let targets = decisions
            .limits
            .iter()
            .zip(quotas)
            .filter_map(|(d, cpus)| {
                let r = by_job.get(d.job_id.as_str())?;
                // Docker's quota has a 10 µs-per-100 ms grain; skip updates that change nothing.
                let changed = r.cpu_limit.is_none_or(|c| (c - cpus).abs() > 1e-4);
                Some(Target {
                    job_id: d.job_id.clone(),
                    container_id: r.container_id.clone(),
                    cpus,
                    changed,
                })
            })
            .collect();
        // Alg. 1 line 17 / Alg. 2 lines 8, 16: the interval in force (doubled while all
        // complete, reset by an event).
        self.next_round = decisions.next_round_at.max(now);
        Plan {
            decisions,
            targets,
            usage,
        }
    }
}

/// SpeCon's Alg. 1 on one worker.
#[derive(Debug, Clone)]
pub(crate) struct SpeConRounds {
    specon: SpeCon,
    interval: Time,
    /// When the next categorization is due.
    pub next_round: Time,
    requested: HashSet<(String, u64)>,
}

impl SpeConRounds {
    /// Rounds whose first categorization (which only records each job's first sample) is due
    /// at `now`.
    pub fn new(config: SpeConConfig, now: Time) -> Result<Self, converge_policy::Error> {
        Ok(Self {
            interval: config.interval,
            specon: SpeCon::new(config)?,
            next_round: now,
            requested: HashSet::new(),
        })
    }

    /// Each job's category, by job id.
    pub fn categories(&self) -> impl Iterator<Item = (&String, Category)> {
        self.specon.jobs().iter().map(|(id, j)| (id, j.category))
    }

    /// One categorization at `now`; returns the migration requests not sent before.
    pub fn round(&mut self, now: Time, running: &[Running]) -> Vec<MigrationRequest> {
        let observations: Vec<JobObservation> = running
            .iter()
            .map(|r| JobObservation {
                job_id: r.job_id.clone(),
                // Every job here is on this worker: one worker, index 0.
                worker: 0,
                sample: r.sample,
                initial_value: r.initial_value,
                direction: r.direction,
            })
            .collect();
        // SpeCon Alg. 1 lines 3-16 (specon-speculative-migration.txt:161-195): gains over the
        // interval move jobs between PC/WC/CC; converged jobs sharing the worker are named.
        let names = self.specon.categorize(now, &observations);
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
            requests.push(MigrationRequest {
                job_id: job,
                epoch: r.epoch,
                // SpeCon Alg. 1 line 16: "Request-Reallocation".
                reason: format!(
                    "converged (SpeCon Alg. 1): gained {:.3}% of its initial metric in the last \
                     {:.0?}, below α = {:.3}% and below the interval before; shares the worker \
                     with {others} other job(s)",
                    gain * 100.0,
                    Duration::from_secs_f64(self.interval.max(0.0)),
                    alpha * 100.0
                ),
            });
        }
        requests
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use converge_policy::limits::MIN_CPUS;
    use proptest::prelude::*;

    fn running(job: &str, t: Time, value: f64, cpu_s: f64) -> Running {
        Running {
            job_id: job.into(),
            epoch: 1,
            container_id: format!("c-{job}"),
            sample: Some(Sample { time: t, value }),
            initial_value: Some(2.0),
            direction: Direction::Minimize,
            cpu: Some((t, cpu_s)),
            cpu_limit: None,
        }
    }

    proptest! {
        /// Whole rounds: whatever the jobs report, every container's limit stays within the
        /// worker and above FlowCon's lower bound for the containers present.
        #[test]
        fn every_round_keeps_limits_within_bounds(
            rounds in prop::collection::vec(
                prop::collection::vec((0u8..6, 0.0..3.0f64, 0.0..2.0f64), 0..6),
                1..12,
            ),
            capacity in 0.05..8.0f64,
            alpha in 0.0..0.5f64,
        ) {
            let config = FlowConConfig { alpha, itval: 2.0, beta: 2.0, adaptive: alpha < 0.1, ..Default::default() };
            let mut d = FlowConRounds::new(config, capacity, 0.0).unwrap();
            let mut cpu: HashMap<String, f64> = HashMap::new();
            for (i, jobs) in rounds.iter().enumerate() {
                let now = 2.0 * (i as f64 + 1.0);
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
        let config = FlowConConfig {
            alpha: 0.02,
            itval: 2.0,
            beta: 2.0,
            adaptive: false,
            ..Default::default()
        };
        let mut d = FlowConRounds::new(config, 1.0, 0.0).unwrap();
        // Rounds at 2, 4, 6 s: loss 1.0 -> 0.99 -> 0.985 with a full core: G < α twice.
        let mut plan = d.round(2.0, &[running("a", 2.0, 1.0, 0.0)]);
        for (s, loss) in [(4.0, 0.99), (6.0, 0.985)] {
            plan = d.round(s, &[running("a", s, loss, s - 2.0)]);
        }
        assert!(plan.decisions.all_completing, "{plan:?}");
        assert_eq!(plan.targets[0].cpus, 1.0, "alone and completing: free");
        // Alg. 1 lines 14-17: itval doubled while all complete.
        assert_eq!(d.next_round, 10.0);
        let b = Running {
            sample: None,
            initial_value: None,
            cpu: Some((7.0, 0.0)),
            ..running("b", 7.0, 0.0, 0.0)
        };
        let mut a = running("a", 6.0, 0.985, 5.0);
        a.cpu = Some((7.0, 5.0));
        let plan = d.round(7.0, &[a, b]);
        assert!(plan.decisions.event);
        let cpus: BTreeMap<&str, f64> = plan
            .targets
            .iter()
            .map(|t| (t.job_id.as_str(), t.cpus))
            .collect();
        assert_eq!(cpus["a"], 0.25, "completing: 1/(β·n) of the worker");
        assert_eq!(cpus["b"], 1.0, "newcomer: the whole worker");
        // Alg. 2 line 8: the event resets itval.
        assert_eq!(d.next_round, 9.0);
    }

    #[test]
    fn cpu_use_is_a_fraction_of_the_worker_over_the_round() {
        let mut d = FlowConRounds::new(FlowConConfig::default(), 2.0, 0.0).unwrap();
        let plan = d.round(1.0, &[running("a", 1.0, 2.0, 1.0)]);
        assert_eq!(plan.usage["a"], 0.0, "no baseline yet");
        // 3 s of CPU in 2 s on a 2-core worker: 1.5 cores = 0.75 of the worker.
        let plan = d.round(3.0, &[running("a", 3.0, 1.0, 4.0)]);
        assert!((plan.usage["a"] - 0.75).abs() < 1e-12, "{:?}", plan.usage);
    }

    #[test]
    fn specon_requests_a_converged_shared_job_once_per_epoch() {
        let config = SpeConConfig {
            alpha: 0.01,
            interval: 1.0,
            ..Default::default()
        };
        let mut d = SpeConRounds::new(config, 0.0).unwrap();
        // "a" barely moves (gains shrinking below 1%), "b" learns fast.
        let a = [2.0, 1.99, 1.985, 1.983, 1.982];
        let b = [2.0, 1.5, 1.0, 0.6, 0.3];
        let mut sent = Vec::new();
        for s in 0..5 {
            let t = s as f64;
            let rs = [running("a", t, a[s], 0.0), running("b", t, b[s], 0.0)];
            sent.extend(d.round(t, &rs));
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
        let mut a2 = running("a", 5.0, 1.9815, 0.0);
        a2.epoch = 2;
        let again = d.round(5.0, &[a2, running("b", 5.0, 0.1, 0.0)]);
        assert_eq!(again.len(), 1, "{again:?}");
        assert_eq!(again[0].epoch, 2);
    }
}
