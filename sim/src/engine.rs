//! The discrete-event engine: a virtual clock, an event heap, workers that share CPU like CFS,
//! jobs whose training is work done, and the policy code driving it all.
//!
//! Between events every job's CPU share is constant, so its work grows linearly; each worker is
//! advanced lazily (only when an event touches it), so an event costs work proportional to the
//! jobs on one worker, not the cluster. Completion events carry the worker's version and are
//! dropped when a later reallocation superseded them.
//!
//! What is modelled, on purpose and no more: CPU sharing ([`crate::cpu`]), per-job parallelism,
//! worker speed (calibration), metric noise (seeded), the manager's stale view between
//! heartbeats, and the migration pause (save + restore seconds during which the job makes no
//! progress). Runtimes are a model of the papers' testbeds, not a measurement of ours.
//!
//! Value-based allocation (value-based-allocation.txt) adds CPU shares (weights in the CPU
//! model), pausing (a paused container stays on its worker and uses no CPU), stopping,
//! rejection and dropping: [`PolicySpec::Value`] calls [`ValueAllocator`] at each arrival
//! (after a tick that drops worthless jobs), after each completion (resumptions) and at each
//! heartbeat (drops); [`PolicySpec::ValueGa`] runs the GA's static plan ([`crate::ga`]). A job's
//! value is its curve at its completion, 0 if it did not complete.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};

use converge_policy::flowcon::{FlowCon, FlowConConfig, FlowConPlacer, Observation};
use converge_policy::growth::{Sample, Usage};
use converge_policy::specon::{JobObservation, SpeCon, SpeConConfig, WorkerLoad};
use converge_policy::value::{
    Container, NodeState, OfflineJob, PreemptAction, ValueAction, ValueAllocator, ValueConfig,
    ValueDecision, ValueJob,
};
use converge_policy::{JobRequest, Placement, Placer, RoundRobin, Spread, WorkerSnapshot};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::cpu::{fair_share, srpt_share, weighted_fair_share};
use crate::curve::Catalog;
use crate::error::{Error, Result};
use crate::experiment::{Experiment, JobSpec, PolicySpec, SystemModel};

/// Hard stop against runaway runs (a bug, not a workload).
const MAX_EVENTS: u64 = 500_000_000;

/// Docker's default `--cpu-shares`: every container has it unless a value policy sets another.
const DEFAULT_SHARES: u32 = 1024;

/// How a job ended.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// It ran to completion.
    #[default]
    Completed,
    /// A value policy did not run it (the reason).
    Rejected(String),
    /// A value policy dropped it because its value reached zero (the reason).
    Dropped(String),
    /// A value policy stopped it to make room for another (the reason).
    Stopped(String),
}

impl Outcome {
    /// Whether the job completed.
    pub fn is_completed(&self) -> bool {
        *self == Outcome::Completed
    }
}

/// Value-based allocation counts of a run (value-curve workloads only).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ValueSummary {
    /// `Σ V_j` (value-based-allocation.txt:88): every job's curve at its completion, 0 if it did
    /// not complete.
    pub total: f64,
    /// Jobs that completed.
    pub completed: usize,
    /// Jobs rejected at arrival.
    pub rejected: usize,
    /// Jobs dropped when their value reached zero.
    pub dropped: usize,
    /// Jobs stopped as victims.
    pub stopped: usize,
    /// Preemptions (pauses and stops).
    pub preemptions: u64,
    /// Resumptions of paused jobs.
    pub resumes: u64,
    /// Arrival decisions taken by the allocator.
    pub decisions: u64,
    /// Wall-clock seconds spent in those decisions, when the driver passed a timer.
    pub decision_seconds: Option<f64>,
}

/// One job's outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobResult {
    /// Job id.
    pub id: String,
    /// Model name.
    pub model: String,
    /// Arrival time.
    pub arrival: f64,
    /// Finish time.
    pub finish: f64,
    /// Completion time (finish − arrival).
    pub jct: f64,
    /// Worker it finished on.
    pub worker: usize,
    /// Times it was migrated.
    pub migrations: u32,
    /// How it ended.
    #[serde(default, skip_serializing_if = "Outcome::is_completed")]
    pub outcome: Outcome,
    /// Its value, for jobs with a value curve.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<f64>,
}

/// Time series for plots (recorded only when asked).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Trace {
    /// CPU share (fraction of the worker) per job on worker 0 after each reallocation.
    pub cpu: Vec<(f64, Vec<(usize, f64)>)>,
    /// Jobs on each worker after each change: (time, worker, count).
    pub per_worker: Vec<(f64, usize, usize)>,
}

/// A run's outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Run {
    /// The policy's label.
    pub policy: String,
    /// Per-job results, in arrival order.
    pub jobs: Vec<JobResult>,
    /// Last finish − first arrival.
    pub makespan: f64,
    /// Mean completion time.
    pub avg_jct: f64,
    /// Events processed.
    pub events: u64,
    /// Migrations performed.
    pub migrations: u64,
    /// Plots' data, if recorded.
    pub trace: Option<Trace>,
    /// Value-based allocation counts, for value-curve workloads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<ValueSummary>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Event {
    Arrival(usize),
    Completion { worker: usize, version: u64 },
    FlowConRound { worker: usize, version: u64 },
    SpeConRound,
    Heartbeat,
    MigrationDone(usize),
}

#[derive(Debug, Clone, Copy)]
struct Scheduled {
    time: f64,
    seq: u64,
    event: Event,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    // Reversed: the heap pops the earliest time, then the earliest scheduled.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .time
            .total_cmp(&self.time)
            .then(other.seq.cmp(&self.seq))
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    Pending,
    Running(usize),
    Migrating(usize),
    /// On a worker, using no CPU (value-based preemption).
    Paused(usize),
    Done,
    /// Rejected, dropped or stopped (see `SimJob::outcome`).
    Ended,
}

#[derive(Debug)]
struct SimJob {
    spec: JobSpec,
    done: f64,
    cpu_seconds: f64,
    state: State,
    limit: f64,
    alloc: f64,
    finish: f64,
    worker: usize,
    migrations: u32,
    round_cpu: f64,
    round_time: f64,
    initial: f64,
    shares: u32,
    outcome: Outcome,
}

#[derive(Debug)]
struct SimWorker {
    cpus: f64,
    calibration: f64,
    jobs: Vec<usize>,
    last_update: f64,
    version: u64,
    round_version: u64,
    flowcon: Option<FlowCon>,
    /// Paused containers (value-based preemption): here, but not sharing the CPU.
    paused: Vec<usize>,
}

/// How each worker shares CPU.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Sharing {
    Fair,
    Srpt,
}

/// One simulation run of one policy over one job trace.
pub struct Simulation<'a> {
    catalog: &'a Catalog,
    system: SystemModel,
    label: String,
    now: f64,
    heap: BinaryHeap<Scheduled>,
    seq: u64,
    jobs: Vec<SimJob>,
    workers: Vec<SimWorker>,
    snapshots: Vec<WorkerSnapshot>,
    placer: Box<dyn Placer>,
    specon: Option<SpeCon>,
    flowcon_config: Option<FlowConConfig>,
    sharing: Sharing,
    rng: ChaCha8Rng,
    waiting: VecDeque<usize>,
    unfinished: usize,
    events: u64,
    migrations: u64,
    trace: Option<Trace>,
    index_of: std::collections::HashMap<String, usize>,
    value: Option<ValueAllocator>,
    plan: Option<crate::ga::Plan>,
    value_stats: ValueSummary,
    timer: Option<Box<dyn Fn() -> f64>>,
}

impl std::fmt::Debug for Simulation<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Simulation")
            .field("policy", &self.label)
            .field("now", &self.now)
            .field("jobs", &self.jobs.len())
            .field("workers", &self.workers.len())
            .finish()
    }
}

impl<'a> Simulation<'a> {
    /// Sets up `policy` over the experiment's cluster and the given job trace. `record` keeps
    /// time series for plots. The oracle takes the experiment baseline's placement.
    pub fn new(
        experiment: &Experiment,
        catalog: &'a Catalog,
        jobs: &[JobSpec],
        policy: PolicySpec,
        record: bool,
    ) -> Result<Self> {
        let workers_spec = experiment.worker_list();
        let placement_of = |p: PolicySpec| -> Box<dyn Placer> {
            match p {
                PolicySpec::Flowcon {
                    placement: true, ..
                } => Box::new(FlowConPlacer),
                PolicySpec::Flowcon { .. } | PolicySpec::DockerSwarm => Box::new(Spread),
                PolicySpec::Specon { .. } | PolicySpec::Kubernetes => {
                    Box::new(RoundRobin::default())
                }
                PolicySpec::Oracle => Box::new(Spread),
                // Value policies place through the allocator or the plan, never the placer.
                PolicySpec::Value { .. } | PolicySpec::ValueGa { .. } => Box::new(Spread),
            }
        };
        let placer = match policy {
            PolicySpec::Oracle => placement_of(experiment.baseline),
            p => placement_of(p),
        };
        let flowcon_config = match policy {
            PolicySpec::Flowcon {
                alpha,
                itval,
                beta,
                adaptive,
                ..
            } => {
                let c = FlowConConfig {
                    alpha,
                    itval,
                    beta,
                    adaptive,
                    ..FlowConConfig::default()
                };
                c.validate()?;
                Some(c)
            }
            _ => None,
        };
        let specon = match policy {
            PolicySpec::Specon {
                alpha,
                interval,
                rebalance,
            } => Some(SpeCon::new(SpeConConfig {
                alpha,
                interval,
                rebalance,
                ..SpeConConfig::default()
            })?),
            _ => None,
        };
        let workers: Vec<SimWorker> = workers_spec
            .iter()
            .map(|&(cpus, calibration)| {
                Ok(SimWorker {
                    cpus,
                    calibration,
                    jobs: Vec::new(),
                    last_update: 0.0,
                    version: 0,
                    round_version: 0,
                    flowcon: flowcon_config.map(FlowCon::new).transpose()?,
                    paused: Vec::new(),
                })
            })
            .collect::<Result<_>>()?;
        let snapshots = workers_spec
            .iter()
            .enumerate()
            .map(|(i, &(cpus, calibration))| WorkerSnapshot {
                id: format!("worker-{}", i + 1),
                cpu_capacity: cpus,
                cpu_requested: 0.0,
                memory_capacity: u64::MAX,
                memory_requested: 0,
                running: 0,
                calibration,
                schedulable: true,
                jobs: Vec::new(),
            })
            .collect();
        let sim_jobs = jobs
            .iter()
            .map(|spec| SimJob {
                initial: catalog.get(spec.model).curve.value(0.0),
                spec: spec.clone(),
                done: 0.0,
                cpu_seconds: 0.0,
                state: State::Pending,
                limit: 1.0,
                alloc: 0.0,
                finish: f64::NAN,
                worker: usize::MAX,
                migrations: 0,
                round_cpu: 0.0,
                round_time: 0.0,
                shares: DEFAULT_SHARES,
                outcome: Outcome::Completed,
            })
            .collect();
        let value_policy = matches!(
            policy,
            PolicySpec::Value { .. } | PolicySpec::ValueGa { .. }
        );
        if value_policy && jobs.iter().any(|j| j.value.is_none()) {
            return Err(Error::Invalid(format!(
                "{}: {} needs a value curve on every job",
                experiment.name,
                policy.label()
            )));
        }
        let value = match policy {
            PolicySpec::Value { stride, preemption } => {
                Some(ValueAllocator::new(ValueConfig { stride, preemption })?)
            }
            _ => None,
        };
        let plan = match policy {
            PolicySpec::ValueGa {
                population,
                generations,
            } => {
                let speeds: Vec<f64> = workers_spec.iter().map(|w| w.1).collect();
                let offline: Vec<OfflineJob> = jobs
                    .iter()
                    .map(|j| OfflineJob {
                        release: j.arrival,
                        work: j.work,
                        curve: j.value.expect("checked above"),
                    })
                    .collect();
                // The GA's own stream, from the experiment's seed.
                let mut rng = ChaCha8Rng::seed_from_u64(experiment.seed ^ 0x6a_0ff1_13e0);
                let config = crate::ga::GaConfig {
                    population,
                    generations,
                };
                Some(crate::ga::plan(&speeds, &offline, config, &mut rng).0)
            }
            _ => None,
        };
        let mut sim = Simulation {
            catalog,
            system: experiment.system,
            label: policy.label(),
            now: 0.0,
            heap: BinaryHeap::new(),
            seq: 0,
            jobs: sim_jobs,
            workers,
            snapshots,
            placer,
            specon,
            flowcon_config,
            sharing: if policy == PolicySpec::Oracle {
                Sharing::Srpt
            } else {
                Sharing::Fair
            },
            // One noise stream per run, from the experiment's seed.
            rng: ChaCha8Rng::seed_from_u64(experiment.seed ^ 0x5eed_0fc0_ffee),
            waiting: VecDeque::new(),
            unfinished: jobs.len(),
            events: 0,
            migrations: 0,
            trace: record.then(Trace::default),
            index_of: jobs
                .iter()
                .enumerate()
                .map(|(i, j)| (j.id.clone(), i))
                .collect(),
            value,
            plan,
            value_stats: ValueSummary::default(),
            timer: None,
        };
        for (i, j) in jobs.iter().enumerate() {
            sim.schedule(j.arrival, Event::Arrival(i));
        }
        sim.schedule(0.0, Event::Heartbeat);
        if let Some(s) = &sim.specon {
            let interval = s.config().interval;
            sim.schedule(interval, Event::SpeConRound);
        }
        Ok(sim)
    }

    /// Measures the wall-clock time of each value-based arrival decision with `timer` (seconds
    /// from any fixed origin). The simulation itself never reads a clock: the binary passes one.
    pub fn with_timer(mut self, timer: Box<dyn Fn() -> f64>) -> Self {
        self.timer = Some(timer);
        self
    }

    fn schedule(&mut self, time: f64, event: Event) {
        self.seq += 1;
        self.heap.push(Scheduled {
            time,
            seq: self.seq,
            event,
        });
    }

    /// Runs to the last completion and returns the results.
    pub fn run(mut self) -> Result<Run> {
        while let Some(Scheduled { time, event, .. }) = self.heap.pop() {
            if self.unfinished == 0 {
                break;
            }
            self.now = time;
            self.events += 1;
            if self.events > MAX_EVENTS {
                return Err(Error::Invalid(format!(
                    "{}: more than {MAX_EVENTS} events; the run does not converge",
                    self.label
                )));
            }
            match event {
                Event::Arrival(j) if self.value.is_some() => self.value_arrival(j),
                Event::Arrival(j) if self.plan.is_some() => self.plan_arrival(j),
                Event::Arrival(j) => {
                    self.waiting.push_back(j);
                    self.place_waiting();
                }
                Event::Completion { worker, version } => {
                    if self.workers[worker].version == version {
                        self.complete(worker);
                    }
                }
                Event::FlowConRound { worker, version } => {
                    if self.workers[worker].round_version == version {
                        self.flowcon_round(worker);
                    }
                }
                Event::SpeConRound => self.specon_round(),
                Event::Heartbeat => self.heartbeat(),
                Event::MigrationDone(j) => self.migration_done(j),
            }
        }
        Ok(self.results())
    }

    fn results(self) -> Run {
        let jobs: Vec<JobResult> = self
            .jobs
            .iter()
            .map(|j| JobResult {
                id: j.spec.id.clone(),
                model: j.spec.model_name.clone(),
                arrival: j.spec.arrival,
                finish: j.finish,
                jct: j.finish - j.spec.arrival,
                worker: j.worker,
                migrations: j.migrations,
                outcome: j.outcome.clone(),
                value: j.spec.value.map(|c| {
                    if j.state == State::Done {
                        c.value_at(j.finish - j.spec.arrival)
                    } else {
                        0.0
                    }
                }),
            })
            .collect();
        let first = jobs.iter().map(|j| j.arrival).fold(f64::INFINITY, f64::min);
        let last = jobs.iter().map(|j| j.finish).fold(0.0, f64::max);
        // Completed jobs only (with value policies some never complete).
        let done: Vec<f64> = jobs
            .iter()
            .map(|j| j.jct)
            .filter(|t| t.is_finite())
            .collect();
        let avg = done.iter().sum::<f64>() / done.len().max(1) as f64;
        let value = jobs.iter().any(|j| j.value.is_some()).then(|| {
            let count = |f: fn(&Outcome) -> bool| jobs.iter().filter(|j| f(&j.outcome)).count();
            ValueSummary {
                total: jobs.iter().filter_map(|j| j.value).sum(),
                completed: count(|o| matches!(o, Outcome::Completed)),
                rejected: count(|o| matches!(o, Outcome::Rejected(_))),
                dropped: count(|o| matches!(o, Outcome::Dropped(_))),
                stopped: count(|o| matches!(o, Outcome::Stopped(_))),
                ..self.value_stats.clone()
            }
        });
        Run {
            value,
            policy: self.label,
            makespan: if jobs.is_empty() { 0.0 } else { last - first },
            avg_jct: avg,
            jobs,
            events: self.events,
            migrations: self.migrations,
            trace: self.trace,
        }
    }

    /// Brings worker `w`'s jobs' work up to `now`.
    fn advance(&mut self, w: usize) {
        let worker = &mut self.workers[w];
        let dt = self.now - worker.last_update;
        if dt > 0.0 {
            for &j in &worker.jobs {
                let job = &mut self.jobs[j];
                job.done += job.alloc * worker.calibration * dt;
                job.cpu_seconds += job.alloc * dt;
            }
        }
        worker.last_update = self.now;
    }

    /// Recomputes worker `w`'s CPU shares and its next completion.
    fn reallocate(&mut self, w: usize) {
        let worker = &self.workers[w];
        let demand: Vec<f64> = worker
            .jobs
            .iter()
            .map(|&j| self.jobs[j].spec.max_cores)
            .collect();
        let alloc = match self.sharing {
            Sharing::Fair => {
                let limits: Vec<f64> = worker.jobs.iter().map(|&j| self.jobs[j].limit).collect();
                if worker
                    .jobs
                    .iter()
                    .all(|&j| self.jobs[j].shares == DEFAULT_SHARES)
                {
                    fair_share(worker.cpus, &demand, &limits)
                } else {
                    let weights: Vec<f64> = worker
                        .jobs
                        .iter()
                        .map(|&j| f64::from(self.jobs[j].shares))
                        .collect();
                    weighted_fair_share(worker.cpus, &demand, &limits, &weights)
                }
            }
            Sharing::Srpt => {
                let remaining: Vec<f64> = worker
                    .jobs
                    .iter()
                    .map(|&j| self.jobs[j].spec.work - self.jobs[j].done)
                    .collect();
                srpt_share(worker.cpus, &demand, &remaining)
            }
        };
        let mut next = f64::INFINITY;
        for (&j, a) in worker.jobs.iter().zip(alloc) {
            let job = &mut self.jobs[j];
            job.alloc = a;
            let rate = a * worker.calibration;
            if rate > 0.0 {
                next = next.min((job.spec.work - job.done).max(0.0) / rate);
            }
        }
        if let Some(t) = &mut self.trace {
            if w == 0 {
                t.cpu.push((
                    self.now,
                    worker
                        .jobs
                        .iter()
                        .map(|&j| (j, self.jobs[j].alloc / worker.cpus))
                        .collect(),
                ));
            }
            t.per_worker.push((self.now, w, worker.jobs.len()));
        }
        let worker = &mut self.workers[w];
        worker.version += 1;
        let version = worker.version;
        if next.is_finite() {
            self.schedule(self.now + next, Event::Completion { worker: w, version });
        }
    }

    /// A container appeared on or left worker `w`: FlowCon's Alg. 2 runs a round now; other
    /// policies just reshare.
    fn containers_changed(&mut self, w: usize) {
        if self.workers[w].flowcon.is_some() {
            self.flowcon_round(w);
        } else {
            self.reallocate(w);
        }
    }

    fn place_waiting(&mut self) {
        let request = JobRequest {
            cpus: 0.0,
            memory_bytes: 0,
        };
        while let Some(&j) = self.waiting.front() {
            match self.placer.place(&request, &self.snapshots) {
                Placement::Worker { index, .. } => {
                    self.waiting.pop_front();
                    self.snapshots[index].running += 1;
                    self.start(j, index);
                }
                Placement::Unschedulable { .. } => break,
            }
        }
    }

    fn start(&mut self, j: usize, w: usize) {
        self.advance(w);
        self.workers[w].jobs.push(j);
        let now = self.now;
        let job = &mut self.jobs[j];
        job.state = State::Running(w);
        job.worker = w;
        job.limit = 1.0;
        job.round_cpu = job.cpu_seconds;
        job.round_time = now;
        self.containers_changed(w);
    }

    fn complete(&mut self, w: usize) {
        self.advance(w);
        let now = self.now;
        let before = self.workers[w].jobs.len();
        let jobs = &mut self.jobs;
        self.workers[w].jobs.retain(|&j| {
            let job = &mut jobs[j];
            let finished = job.done >= job.spec.work * (1.0 - 1e-9) - 1e-9;
            if finished {
                job.state = State::Done;
                job.finish = now;
            }
            !finished
        });
        let gone = before - self.workers[w].jobs.len();
        self.unfinished -= gone;
        if gone > 0 {
            self.containers_changed(w);
            self.place_waiting();
            if self.value.is_some() {
                self.value_departure(w);
            }
        } else {
            self.reallocate(w);
        }
    }

    /// The metric job `j` reports now: its curve at its progress, with seeded noise.
    fn sample(&mut self, j: usize) -> Sample {
        let job = &self.jobs[j];
        let clean = self
            .catalog
            .get(job.spec.model)
            .curve
            .value(job.done / job.spec.work);
        // Box-Muller from two uniforms of the run's generator.
        let u1: f64 = self.rng.random::<f64>().max(1e-12);
        let u2: f64 = self.rng.random::<f64>();
        let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        Sample {
            time: self.now,
            value: clean * (1.0 + self.system.noise * z),
        }
    }

    fn flowcon_round(&mut self, w: usize) {
        self.advance(w);
        let now = self.now;
        let ids: Vec<usize> = self.workers[w].jobs.clone();
        let cpus = self.workers[w].cpus;
        let mut obs = Vec::with_capacity(ids.len());
        for &j in &ids {
            let sample = self.sample(j);
            let job = &mut self.jobs[j];
            let dt = now - job.round_time;
            let used = if dt > 0.0 {
                (job.cpu_seconds - job.round_cpu) / dt / cpus
            } else {
                0.0
            };
            job.round_cpu = job.cpu_seconds;
            job.round_time = now;
            obs.push(Observation {
                job_id: job.spec.id.clone(),
                sample: Some(sample),
                initial_value: Some(job.initial),
                direction: self.catalog.get(job.spec.model).curve.direction(),
                usage: Usage::cpu(used),
            });
        }
        let fc = self.workers[w].flowcon.as_mut().expect("flowcon worker");
        let decisions = fc.on_round(now, &obs);
        for (d, &j) in decisions
            .limits
            .iter()
            .zip(sorted_by_id(&ids, &self.jobs).iter())
        {
            debug_assert_eq!(d.job_id, self.jobs[j].spec.id);
            self.jobs[j].limit = d.limit;
        }
        let worker = &mut self.workers[w];
        worker.round_version += 1;
        let version = worker.round_version;
        if !ids.is_empty() {
            self.schedule(
                decisions.next_round_at,
                Event::FlowConRound { worker: w, version },
            );
        }
        self.reallocate(w);
    }

    fn heartbeat(&mut self) {
        if self.value.is_some() {
            self.value_tick();
        }
        // One pass over the jobs, not one per worker: this runs every few seconds at 100k jobs.
        let mut incoming = vec![0usize; self.workers.len()];
        for j in &self.jobs {
            if let State::Migrating(w) = j.state {
                incoming[w] += 1;
            }
        }
        for (w, worker) in self.workers.iter().enumerate() {
            let snap = &mut self.snapshots[w];
            snap.running = worker.jobs.len() + incoming[w];
            snap.jobs = worker
                .flowcon
                .as_ref()
                .map(|f| f.snapshots())
                .unwrap_or_default();
        }
        if self.unfinished > 0 {
            self.schedule(self.now + self.system.heartbeat, Event::Heartbeat);
        }
    }

    fn specon_round(&mut self) {
        let Some(mut specon) = self.specon.take() else {
            return;
        };
        for w in 0..self.workers.len() {
            self.advance(w);
        }
        let mut obs = Vec::new();
        for j in 0..self.jobs.len() {
            let (worker, sample) = match self.jobs[j].state {
                State::Running(w) => (w, Some(self.sample(j))),
                State::Migrating(w) => (w, None),
                _ => continue,
            };
            let job = &self.jobs[j];
            obs.push(JobObservation {
                job_id: job.spec.id.clone(),
                worker,
                sample,
                initial_value: Some(job.initial),
                direction: self.catalog.get(job.spec.model).curve.direction(),
            });
        }
        let loads: Vec<WorkerLoad> = self
            .workers
            .iter()
            .enumerate()
            .map(|(i, w)| WorkerLoad {
                id: format!("worker-{}", i + 1),
                resource_use: w.jobs.iter().map(|&j| self.jobs[j].alloc).sum::<f64>() / w.cpus,
                schedulable: true,
            })
            .collect();
        let decisions = specon.on_round(self.now, &obs, &loads);
        let interval = specon.config().interval;
        self.specon = Some(specon);
        for m in decisions.migrations {
            let Some(&j) = self.index_of.get(&m.job_id) else {
                continue;
            };
            if self.jobs[j].state != State::Running(m.from) {
                continue;
            }
            self.workers[m.from].jobs.retain(|&x| x != j);
            self.jobs[j].state = State::Migrating(m.to);
            self.jobs[j].migrations += 1;
            self.migrations += 1;
            self.snapshots[m.from].running = self.snapshots[m.from].running.saturating_sub(1);
            self.snapshots[m.to].running += 1;
            self.containers_changed(m.from);
            let pause = self.system.save + self.system.restore;
            self.schedule(self.now + pause, Event::MigrationDone(j));
        }
        if self.unfinished > 0 {
            self.schedule(self.now + interval, Event::SpeConRound);
        }
    }

    fn migration_done(&mut self, j: usize) {
        if let State::Migrating(to) = self.jobs[j].state {
            self.start(j, to);
        }
    }

    /// Brings every worker up to now.
    fn advance_all(&mut self) {
        for w in 0..self.workers.len() {
            self.advance(w);
        }
    }

    /// The cluster as [`ValueAllocator`] sees it (workers advanced to now by the caller).
    fn node_states(&self) -> Vec<NodeState> {
        let container = |j: usize, paused: bool| {
            let job = &self.jobs[j];
            Container {
                job: value_job(&job.spec),
                shares: job.shares,
                remaining_s: (job.spec.work - job.done).max(0.0),
                paused,
            }
        };
        self.workers
            .iter()
            .enumerate()
            .map(|(i, w)| NodeState {
                id: self.snapshots[i].id.clone(),
                speed: w.calibration,
                schedulable: true,
                containers: w
                    .jobs
                    .iter()
                    .map(|&j| container(j, false))
                    .chain(w.paused.iter().map(|&j| container(j, true)))
                    .collect(),
            })
            .collect()
    }

    /// Job `j` will not complete: rejected, dropped or stopped.
    fn end(&mut self, j: usize, outcome: Outcome) {
        self.jobs[j].state = State::Ended;
        self.jobs[j].outcome = outcome;
        self.unfinished -= 1;
    }

    /// Takes job `j` off worker `w` (running or paused).
    fn take_off(&mut self, j: usize, w: usize) {
        let worker = &mut self.workers[w];
        worker.jobs.retain(|&x| x != j);
        worker.paused.retain(|&x| x != j);
    }

    /// Applies drops and resumptions, then reshares the workers they touched.
    fn apply_value_actions(&mut self, actions: Vec<ValueAction>) {
        let mut touched = std::collections::BTreeSet::new();
        for a in actions {
            match a {
                ValueAction::Drop { job, node, reason } => {
                    let j = self.index_of[&job];
                    self.take_off(j, node);
                    self.end(j, Outcome::Dropped(reason));
                    touched.insert(node);
                }
                ValueAction::Resume {
                    job,
                    node,
                    cpu_shares,
                    ..
                } => {
                    let j = self.index_of[&job];
                    self.take_off(j, node);
                    self.workers[node].jobs.push(j);
                    self.jobs[j].shares = cpu_shares;
                    self.jobs[j].state = State::Running(node);
                    self.value_stats.resumes += 1;
                    touched.insert(node);
                }
            }
        }
        for w in touched {
            self.containers_changed(w);
        }
    }

    /// Drops worthless jobs everywhere (value-based-allocation.txt:65).
    fn value_tick(&mut self) {
        let Some(alloc) = self.value.clone() else {
            return;
        };
        self.advance_all();
        let actions = alloc.on_tick(self.now, &self.node_states());
        self.apply_value_actions(actions);
    }

    /// A container finished on worker `w`: drops there, then resumptions.
    fn value_departure(&mut self, w: usize) {
        let Some(alloc) = self.value.clone() else {
            return;
        };
        self.advance_all();
        let actions = alloc.on_departure(self.now, w, &self.node_states());
        self.apply_value_actions(actions);
    }

    /// Job `j` arrives under DwoP/DwP.
    fn value_arrival(&mut self, j: usize) {
        let Some(alloc) = self.value.clone() else {
            return;
        };
        self.value_tick();
        let nodes = self.node_states();
        let job = value_job(&self.jobs[j].spec);
        let started = self.timer.as_ref().map(|t| t());
        let decision = alloc.on_arrival(self.now, &job, &nodes);
        if let (Some(t), Some(t0)) = (self.timer.as_ref(), started) {
            *self.value_stats.decision_seconds.get_or_insert(0.0) += t() - t0;
        }
        self.value_stats.decisions += 1;
        match decision {
            ValueDecision::Place {
                node,
                cpu_shares,
                victims,
                ..
            } => {
                for v in victims {
                    let vj = self.index_of[&v.job];
                    self.take_off(vj, v.node);
                    self.value_stats.preemptions += 1;
                    match v.action {
                        PreemptAction::Pause => {
                            self.workers[v.node].paused.push(vj);
                            self.jobs[vj].state = State::Paused(v.node);
                        }
                        PreemptAction::Stop => self.end(vj, Outcome::Stopped(v.reason)),
                    }
                    if v.node != node {
                        self.containers_changed(v.node);
                    }
                }
                self.jobs[j].shares = cpu_shares;
                self.snapshots[node].running += 1;
                self.start(j, node);
            }
            ValueDecision::Reject { reason } => self.end(j, Outcome::Rejected(reason)),
        }
    }

    /// Job `j` arrives under the GA's static plan.
    fn plan_arrival(&mut self, j: usize) {
        match self.plan.as_ref().and_then(|p| p.get(j).copied().flatten()) {
            Some((node, shares)) => {
                self.jobs[j].shares = shares;
                self.snapshots[node].running += 1;
                self.start(j, node);
            }
            None => self.end(j, Outcome::Rejected("rejected by the offline plan".into())),
        }
    }

    /// The FlowCon configuration in force (None for other policies).
    pub fn flowcon_config(&self) -> Option<FlowConConfig> {
        self.flowcon_config
    }
}

/// A job spec as the value allocator sees it (the spec has a curve: checked in `new`).
fn value_job(spec: &JobSpec) -> ValueJob {
    ValueJob {
        id: spec.id.clone(),
        released_at: spec.arrival,
        estimated_s: spec.work,
        curve: spec
            .value
            .expect("value policies check every job has a curve"),
    }
}

/// Job indices ordered by job id (the order FlowCon reports decisions in).
fn sorted_by_id(ids: &[usize], jobs: &[SimJob]) -> Vec<usize> {
    let mut v = ids.to_vec();
    v.sort_by(|&a, &b| jobs[a].spec.id.cmp(&jobs[b].spec.id));
    v
}

/// Runs `policy` on the experiment's trace.
pub fn run_policy(
    experiment: &Experiment,
    catalog: &Catalog,
    policy: PolicySpec,
    record: bool,
) -> Result<Run> {
    let jobs = experiment.jobs(catalog)?;
    Simulation::new(experiment, catalog, &jobs, policy, record)?.run()
}
