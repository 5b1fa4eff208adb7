//! The discrete-event engine: the third shell around Converge's decision cores.
//!
//! The manager's decisions are one [`converge_core::cluster::Core`], the very one the manager's
//! actor runs; every worker's decisions are one [`converge_core::node::NodeCore`], the very one
//! the agent's executor runs. What this file adds is what the other shells get from the world:
//! a virtual clock, an event heap, and modelled containers (training is work done at the CPU a
//! CFS-like model gives each job, [`converge_policy::share`]; the metric a job prints follows its curve with
//! seeded noise, [`crate::curve`]).
//!
//! How the shell plays the world's part:
//! - every worker registers with the cluster core at time 0 (`Connected`, stream `w + 1`), and
//!   its node core learns the worker mode from the answer (`Session`);
//! - a job's arrival is a `Submit`; the cluster core's `Send` effects go to the worker's node
//!   core as commands, and the node core's Docker actions are carried out on the model: a
//!   `Create` starts a container (a restore makes progress only after the model's restore
//!   time), a `Save` stops its progress at once and exits after the save time, `Stop`, `Pause`,
//!   `Resume` act at once, `UpdateCpus` sets the container's hard quota (and CPU weight); the
//!   node core's answers and exit reports go back to the cluster core as the agent sends them;
//! - every heartbeat interval each worker sends a progress batch (step, total steps, the noisy
//!   metric) and a heartbeat (each job's category and growth efficiency from its node core's
//!   last published state, its quota as a fraction of the worker, its CPU use since the last
//!   heartbeat), then the cluster core gets a `Tick` (and another whenever
//!   [`Core::next_due`] asks for one in between);
//! - each node core is ticked when its last `Wake` asks, after fresh CPU readings and
//!   progress of every container (as the node module doc prescribes); its migration requests
//!   go to the cluster core;
//! - a job that finishes its work prints its last progress line and exits 0 (`Died`, then the
//!   node core's exit report).
//!
//! Messages are delivered in order, with no latency: everything one event causes happens at
//! its virtual time, in a FIFO of inputs to the cores. Between events every job's CPU is
//! constant, so its work grows linearly; each worker is advanced lazily (only when an event
//! touches it), and completion events carry the worker's version and are dropped when a later
//! reallocation superseded them.

use std::cmp::Ordering;
use std::collections::{BTreeSet, BinaryHeap, HashMap, VecDeque};

use converge_core::cluster::lifecycle::{Job, JobPhase};
use converge_core::cluster::types::{self as wire, EventKind, JobState, WorkerMode};
use converge_core::cluster::{Config, Core, Effect, Input};
use converge_core::node::{
    self as nd, Answer, Detail, DockerAction, Mode, NodeCore, NodeEffect, NodeInput, PolicyStatus,
};
use converge_policy::flowcon::FlowConConfig;
use converge_policy::growth::Direction;
use converge_policy::limits::clamp_cpus;
use converge_policy::value::OfflineJob;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::curve::Catalog;
use crate::error::{Error, Result};
use crate::experiment::{Experiment, JobSpec, PolicySpec, SystemModel};
use crate::policies;
use converge_policy::share::{quota_share, srpt_share};

/// The policy state of incarnation `epoch` of job `id` in `jobs`, which the node core
/// publishes sorted by job id ([`NodeCore::policy_status`]): found by a binary search, where a
/// walk compared the id with each of the worker's jobs, for each of them at every heartbeat
/// (on workers where SpeCon gathers converged jobs, the most of any string comparison in its
/// runs at 3,000 workers; docs/performance.md).
fn policy_of<'a>(jobs: &'a [nd::JobPolicy], id: &str, epoch: u64) -> Option<&'a nd::JobPolicy> {
    debug_assert!(jobs.is_sorted_by(|a, b| a.job_id <= b.job_id));
    let first = jobs.partition_point(|p| p.job_id.as_str() < id);
    jobs[first..]
        .iter()
        .take_while(|p| p.job_id == id)
        .find(|p| p.epoch == epoch)
}

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
    /// A value policy did not run it (the reason): refused at admission, or dropped before
    /// it started.
    Rejected(String),
    /// A value policy dropped it because its value reached zero (the reason).
    Dropped(String),
    /// A value policy stopped it to make room for another (the reason).
    Stopped(String),
    /// The core gave it up (the reason); never expected in a simulation.
    Failed(String),
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
    /// Arrival decisions taken by the core.
    pub decisions: u64,
    /// Wall-clock seconds spent in the core's steps on those arrivals, when the driver passed
    /// a timer.
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
    /// Times it was migrated (moves the core saw complete).
    pub migrations: u32,
    /// How it ended.
    #[serde(default, skip_serializing_if = "Outcome::is_completed")]
    pub outcome: Outcome,
    /// Its value, for jobs with a value curve.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<f64>,
    /// How far the cluster core's predicted finish was off at 25%, 50% and 75% of its steps,
    /// as a fraction of its run ([`converge_core::cluster::lifecycle::Job::eta_errors`]).
    #[serde(default)]
    pub eta_error: [Option<f64>; 3],
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
    /// Events processed (the heap's: arrivals, heartbeats, timers, model completions).
    pub events: u64,
    /// Of the `events`, the timers found superseded when popped (a node's wake, a worker's
    /// next completion or the core's tick, set again since): each is popped and counted, and
    /// acts on nothing. What an events/s figure should be read beside. Not part of the
    /// results files.
    #[serde(skip)]
    pub stale: u64,
    /// Inputs the cores consumed (cluster and node steps).
    pub steps: u64,
    /// Migrations performed.
    pub migrations: u64,
    /// Inputs the cluster core refused (an agent speaking of what it does not run, a forbidden
    /// transition): 0 unless the shell or a core is wrong.
    pub refusals: u64,
    /// Finished jobs the cluster core let go of during the run, as the manager's does beyond
    /// its newest [`converge_core::cluster::KEEP_FINISHED`] (their ends are reported all the
    /// same). Not part of the results files.
    #[serde(skip)]
    pub archived: usize,
    /// Plots' data, if recorded.
    pub trace: Option<Trace>,
    /// Value-based allocation counts, for value-curve workloads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<ValueSummary>,
}

#[derive(Debug, Clone, PartialEq)]
enum Event {
    Arrival(usize),
    Heartbeat,
    /// The cluster core's own timer ([`Core::next_due`]).
    CoreTick,
    /// A node core's `Wake`.
    NodeTick {
        worker: usize,
        version: u64,
    },
    /// The model: the next job on a worker finishes its work.
    Completion {
        worker: usize,
        version: u64,
    },
    /// The model: a new container has loaded its data or checkpoint and trains.
    Restored {
        job: usize,
        epoch: u64,
    },
    /// The model: a container finished writing its checkpoint and exited.
    SaveDone {
        job: usize,
        epoch: u64,
        command: Option<String>,
    },
}

#[derive(Debug, Clone)]
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

/// Where a job's current container is, as the model sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Stage {
    /// No container (not placed yet, or between a save and its restore).
    Idle,
    /// Created, loading its data (a measured job) or its checkpoint: no progress yet.
    Restoring,
    /// Training.
    Running,
    /// Frozen (value-based preemption): on its worker, no CPU.
    Paused,
    /// Writing its checkpoint: no progress, exits after the save time.
    Saving,
    /// Finished its work.
    Done,
    /// Stopped for good.
    Stopped,
}

impl Stage {
    /// A container exists on a worker.
    fn live(self) -> bool {
        matches!(
            self,
            Stage::Restoring | Stage::Running | Stage::Paused | Stage::Saving
        )
    }
}

#[derive(Debug)]
struct SimJob {
    spec: JobSpec,
    /// `spec.id` as the core holds it: every report names the job by a clone of this, not by
    /// a fresh copy of the text (an allocation per job per heartbeat and progress line).
    id: converge_core::cluster::types::Id,
    /// Reference core-seconds of work done.
    done: f64,
    /// CPU-seconds the current container used.
    cpu_seconds: f64,
    stage: Stage,
    /// Cores it gets now.
    alloc: f64,
    /// Reference core-seconds of work it does per second now: its cores, times its worker's
    /// speed, times the measured cost of sharing the worker ([`crate::measured::Sharing::factor`]).
    rate: f64,
    /// Its container's hard CPU quota, cores.
    quota: f64,
    /// Its container's CPU weight.
    shares: u32,
    /// Finish time (NaN until done).
    finish: f64,
    /// Its current (or last) worker.
    worker: usize,
    /// Its current container's epoch.
    epoch: u64,
    /// The step a checkpoint holds (a restore resumes there).
    checkpoint: Option<u64>,
    /// Its step budget.
    total_steps: u64,
    /// What its reports scale its steps to go by ([`SystemModel::estimate_noise`]).
    misreport: f64,
    /// (time, CPU-seconds) at its last heartbeat, for the CPU use heartbeats report.
    heartbeat_cpu: (f64, f64),
    direction: Direction,
}

impl SimJob {
    fn container_id(&self) -> String {
        format!("{}-{}", self.spec.id, self.epoch)
    }

    fn step(&self) -> u64 {
        let fraction = (self.done / self.spec.work.max(1e-12)).clamp(0.0, 1.0);
        ((fraction * self.total_steps as f64).floor() as u64).min(self.total_steps)
    }

    /// The step budget its reports say: the steps to go scaled by its misreport factor.
    fn reported_total(&self) -> u64 {
        let step = self.step();
        step + ((self.total_steps - step) as f64 * self.misreport).round() as u64
    }

    fn finished(&self) -> bool {
        self.done >= self.spec.work * (1.0 - 1e-9) - 1e-9
    }
}

struct SimWorker {
    id: String,
    cpus: f64,
    calibration: f64,
    node: NodeCore,
    /// Jobs whose container lives here, by job index, in order and each once. A list, not a
    /// B-tree set: every heartbeat walks every worker's, and walking sets (and copying them
    /// out to walk) was 6% of the simulator's samples at 10,000 workers
    /// (`docs/performance.md`).
    containers: Vec<usize>,
    /// Jobs sharing the CPU (running containers).
    jobs: Vec<usize>,
    last_update: f64,
    version: u64,
    /// The node core's wake-up time and its event's version.
    wake: Option<f64>,
    wake_version: u64,
    /// What the node core last published for heartbeats.
    status: PolicyStatus,
}

/// How each worker shares CPU.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Sharing {
    Cfs,
    Srpt,
}

/// An input on its way to a core.
enum Msg {
    Core(Input),
    Node(usize, NodeInput),
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
    core: Core,
    /// Finished jobs the core archived, for the report: the core keeps as many finished jobs
    /// in memory as the manager does ([`converge_core::cluster::KEEP_FINISHED`]), so that the
    /// decisions run over the maps they run over in a cluster, not over every job ever run.
    archived: HashMap<converge_core::cluster::types::Id, Box<Job>>,
    sharing: Sharing,
    rng: ChaCha8Rng,
    queue: VecDeque<Msg>,
    /// Workers whose CPU split changed in the current event.
    dirty: BTreeSet<usize>,
    unfinished: usize,
    events: u64,
    /// Timers popped after they were set again (`Run::stale`).
    stale: u64,
    steps: u64,
    refusals: u64,
    trace: Option<Trace>,
    index_of: HashMap<String, usize>,
    /// The CPU weight of each Start command on its way to a node core.
    start_shares: HashMap<String, u32>,
    core_tick_at: Option<f64>,
    value_policy: bool,
    value_stats: ValueSummary,
    timer: Option<Box<dyn Fn() -> f64>>,
    failure: Option<String>,
    flowcon_config: Option<FlowConConfig>,
    /// Whether the workers share one host whose busy CPUs slow each other down (some job
    /// carries [`crate::measured::Sharing::host`] factors or tables measured with the host
    /// busy: the testbed's workers are containers on one machine).
    one_host: bool,
    /// Workers with a job on the CPU, as the rates in force were computed with.
    busy_workers: usize,
    /// Whether a job's host factor depends on what the other busy workers run
    /// ([`crate::measured::Sharing::host_beside`] measured): then a change on one worker
    /// changes the speed of every busy worker's jobs.
    host_neighbours: bool,
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
    /// time series for plots. The oracle takes the experiment baseline's policy.
    pub fn new(
        experiment: &Experiment,
        catalog: &'a Catalog,
        jobs: &[JobSpec],
        policy: PolicySpec,
        record: bool,
    ) -> Result<Self> {
        let workers_spec = experiment.worker_list();
        // Zero-padded, so the core's id order is the numeric order.
        let width = workers_spec.len().to_string().len();
        let worker_ids: Vec<String> = (0..workers_spec.len())
            .map(|i| format!("worker-{:0width$}", i + 1))
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
                let (plan, _) = crate::ga::plan(&speeds, &offline, config, &mut rng);
                Some(
                    jobs.iter()
                        .zip(plan)
                        .map(|(j, p)| {
                            (
                                j.id.as_str().into(),
                                p.map(|(w, s)| (worker_ids[w].as_str().into(), s)),
                            )
                        })
                        .collect(),
                )
            }
            _ => None,
        };
        let cluster_policy = policies::cluster_policy(policy, experiment.baseline, plan)?;
        let config = Config {
            heartbeat_interval: experiment.system.heartbeat,
            progress_history: converge_core::cluster::PROGRESS_HISTORY,
            // As the manager keeps them: the report reads archived jobs from `archived`.
            keep_finished: converge_core::cluster::KEEP_FINISHED,
            id_prefix: "sim".into(),
            // The simulator keeps no store, so no one would read what a step changed.
            record_changes: false,
            ..Config::default()
        };
        let workers = workers_spec
            .iter()
            .zip(&worker_ids)
            .map(|(&(cpus, calibration), id)| {
                let node = NodeCore::new(policies::node_config(policy, id, cpus)?, 0.0)?;
                Ok(SimWorker {
                    id: id.clone(),
                    cpus,
                    calibration,
                    node,
                    containers: Vec::new(),
                    jobs: Vec::new(),
                    last_update: 0.0,
                    version: 0,
                    wake: None,
                    wake_version: 0,
                    status: PolicyStatus::default(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        // Its own generator, so that noise on the estimates leaves every other draw of the run
        // (metric noise) as it was.
        let noise = experiment.system.estimate_noise.clamp(0.0, 0.95);
        let mut misreports = ChaCha8Rng::seed_from_u64(experiment.seed ^ 0xe571_3a7e);
        let mut sim_jobs: Vec<SimJob> = jobs
            .iter()
            .map(|spec| SimJob {
                spec: spec.clone(),
                id: spec.id.as_str().into(),
                done: 0.0,
                cpu_seconds: 0.0,
                stage: Stage::Idle,
                alloc: 0.0,
                rate: 0.0,
                quota: 0.0,
                shares: DEFAULT_SHARES,
                finish: f64::NAN,
                worker: usize::MAX,
                epoch: 0,
                checkpoint: None,
                // A trace job reports its real step budget; otherwise one step per reference
                // core-second, at least 100 (the value policy reads remaining work from
                // step / total steps).
                total_steps: spec
                    .runtime
                    .as_ref()
                    .map_or((spec.work.round() as u64).max(100), |r| r.steps),
                misreport: 1.0,
                heartbeat_cpu: (0.0, 0.0),
                direction: catalog.get(spec.model).curve.direction(),
            })
            .collect();
        if noise > 0.0 {
            for j in &mut sim_jobs {
                j.misreport = 1.0 - noise + 2.0 * noise * misreports.random::<f64>();
            }
        }
        let mut sim = Simulation {
            catalog,
            system: experiment.system,
            label: policy.label(),
            now: 0.0,
            heap: BinaryHeap::new(),
            seq: 0,
            jobs: sim_jobs,
            workers,
            core: Core::new(config, cluster_policy),
            archived: HashMap::new(),
            sharing: if policy == PolicySpec::Oracle {
                Sharing::Srpt
            } else {
                Sharing::Cfs
            },
            // One noise stream per run, from the experiment's seed.
            rng: ChaCha8Rng::seed_from_u64(experiment.seed ^ 0x5eed_0fc0_ffee),
            queue: VecDeque::new(),
            dirty: BTreeSet::new(),
            unfinished: jobs.len(),
            events: 0,
            stale: 0,
            steps: 0,
            refusals: 0,
            trace: record.then(Trace::default),
            index_of: jobs
                .iter()
                .enumerate()
                .map(|(i, j)| (j.id.clone(), i))
                .collect(),
            start_shares: HashMap::new(),
            core_tick_at: None,
            value_policy,
            value_stats: ValueSummary::default(),
            timer: None,
            failure: None,
            flowcon_config: policies::flowcon_config(policy),
            one_host: jobs.iter().any(|j| {
                j.runtime.as_ref().is_some_and(|r| {
                    !r.sharing.host.is_empty()
                        || !r.sharing.host_beside.is_empty()
                        || r.sharing.busy_host.is_some()
                })
            }),
            busy_workers: 0,
            host_neighbours: jobs.iter().any(|j| {
                j.runtime
                    .as_ref()
                    .is_some_and(|r| !r.sharing.host_beside.is_empty())
            }),
        };
        // Every agent registers at time 0; its node core hears the answer.
        for w in 0..sim.workers.len() {
            let worker = &sim.workers[w];
            sim.queue.push_back(Msg::Core(Input::Connected {
                conn: w as u64 + 1,
                register: wire::Register {
                    worker: worker.id.clone().into(),
                    cpu_capacity: worker.cpus,
                    calibration: worker.calibration,
                    instance_id: format!("{}-agent", worker.id),
                    ..wire::Register::default()
                },
            }));
        }
        sim.pump();
        for (i, j) in jobs.iter().enumerate() {
            sim.schedule(j.arrival, Event::Arrival(i));
        }
        sim.schedule(0.0, Event::Heartbeat);
        Ok(sim)
    }

    /// Measures the wall-clock time of the core's step on each arrival under value policies
    /// with `timer` (seconds from any fixed origin). The simulation itself never reads a
    /// clock: the binary passes one.
    pub fn with_timer(mut self, timer: Box<dyn Fn() -> f64>) -> Self {
        self.timer = Some(timer);
        self
    }

    /// The FlowCon configuration in force (None for other policies).
    pub fn flowcon_config(&self) -> Option<FlowConConfig> {
        self.flowcon_config
    }

    fn schedule(&mut self, time: f64, event: Event) {
        self.seq += 1;
        self.heap.push(Scheduled {
            time,
            seq: self.seq,
            event,
        });
    }

    /// Runs to the last job's end and returns the results.
    pub fn run(mut self) -> Result<Run> {
        while self.unfinished > 0 {
            let Some(Scheduled { time, event, .. }) = self.heap.pop() else {
                break;
            };
            self.now = time;
            self.events += 1;
            if self.events > MAX_EVENTS {
                return Err(Error::Invalid(format!(
                    "{}: more than {MAX_EVENTS} events; the run does not converge",
                    self.label
                )));
            }
            match event {
                Event::Arrival(j) => self.arrival(j),
                Event::Heartbeat => self.heartbeat(),
                Event::CoreTick => {
                    if self.core_tick_at == Some(time) {
                        self.core_tick_at = None;
                        self.queue.push_back(Msg::Core(Input::Tick));
                    } else {
                        self.stale += 1;
                    }
                }
                Event::NodeTick { worker, version } => {
                    if self.workers[worker].wake_version == version {
                        self.workers[worker].wake = None;
                        self.feed(worker);
                        self.queue.push_back(Msg::Node(worker, NodeInput::Tick));
                    } else {
                        self.stale += 1;
                    }
                }
                Event::Completion { worker, version } => {
                    if self.workers[worker].version == version {
                        self.complete(worker);
                    } else {
                        self.stale += 1;
                    }
                }
                Event::Restored { job, epoch } => self.restored(job, epoch),
                Event::SaveDone {
                    job,
                    epoch,
                    command,
                } => self.save_done(job, epoch, command),
            }
            self.pump();
            if let Some(f) = self.failure.take() {
                return Err(Error::Invalid(format!("{}: {f}", self.label)));
            }
        }
        if self.unfinished > 0 {
            return Err(Error::Invalid(format!(
                "{}: {} jobs never ended",
                self.label, self.unfinished
            )));
        }
        Ok(self.results())
    }

    // ---- the cores' inputs and effects ----

    /// Delivers every queued input, in order, with what each causes; then reshares the
    /// workers that changed and sets the cluster core's timer.
    fn pump(&mut self) {
        while let Some(m) = self.queue.pop_front() {
            self.steps += 1;
            match m {
                Msg::Core(input) => {
                    let out = self.core_step(input);
                    for e in out {
                        self.core_effect(e);
                    }
                }
                Msg::Node(w, input) => {
                    let out = self.workers[w].node.step(self.now, input);
                    for e in out {
                        self.node_effect(w, e);
                    }
                }
            }
        }
        let mut dirty = std::mem::take(&mut self.dirty);
        if self.one_host {
            let busy = self.workers.iter().filter(|w| !w.jobs.is_empty()).count();
            // A worker went busy or idle, or (where what a busy neighbour costs depends on
            // its model) a worker's jobs changed: every busy worker's jobs change speed.
            if busy != self.busy_workers || (self.host_neighbours && !dirty.is_empty()) {
                self.busy_workers = busy;
                dirty.extend((0..self.workers.len()).filter(|&w| !self.workers[w].jobs.is_empty()));
            }
        }
        for w in dirty {
            self.reallocate(w);
        }
        if let Some(due) = self.core.next_due()
            && due.is_finite()
            && due > self.now
            && self.core_tick_at.is_none_or(|t| due < t)
        {
            self.core_tick_at = Some(due);
            self.schedule(due, Event::CoreTick);
        }
    }

    fn core_effect(&mut self, e: Effect) {
        match e {
            Effect::Send { conn, command, .. } => {
                let w = conn as usize - 1;
                let Some(&j) = self.index_of.get(command.job.as_str()) else {
                    return;
                };
                let action = match command.action {
                    wire::Action::Start { cpu_shares } => {
                        self.start_shares.insert(command.id.to_string(), cpu_shares);
                        nd::Action::Start {
                            direction: Some(self.jobs[j].direction),
                            // The simulated jobs ask for no cores: no limit.
                            cpus: 0.0,
                        }
                    }
                    wire::Action::SetLimits { cpus, cpu_shares } => {
                        nd::Action::SetLimits { cpus, cpu_shares }
                    }
                    wire::Action::Save { deadline_ms } => nd::Action::Save {
                        deadline: Some(f64::from(deadline_ms) / 1000.0),
                    },
                    wire::Action::Pause => {
                        self.value_stats.preemptions += 1;
                        nd::Action::Pause
                    }
                    wire::Action::Resume => {
                        self.value_stats.resumes += 1;
                        nd::Action::Resume
                    }
                    wire::Action::Stop { reason, discard } => nd::Action::Stop {
                        remove: true,
                        reason,
                        discard,
                    },
                };
                self.queue.push_back(Msg::Node(
                    w,
                    NodeInput::Command(nd::Command {
                        id: command.id.to_string(),
                        job_id: command.job.to_string(),
                        epoch: command.epoch,
                        action,
                    }),
                ));
            }
            Effect::Registered { conn, registered } => {
                let mode = Mode {
                    flowcon: registered.mode == WorkerMode::FlowCon,
                    migration: registered.migration,
                };
                self.queue.push_back(Msg::Node(
                    conn as usize - 1,
                    NodeInput::Session {
                        connected: true,
                        mode: Some(mode),
                    },
                ));
            }
            Effect::Event(e) => {
                if e.kind == EventKind::JobState
                    && e.to.is_some_and(JobState::is_terminal)
                    && e.from.is_some_and(|f| !f.is_terminal())
                {
                    self.unfinished -= 1;
                }
            }
            Effect::Reply(Err(e)) => self.failure = Some(e.to_string()),
            Effect::Reply(Ok(_)) => {}
            Effect::Refused { .. } => self.refusals += 1,
            // Each simulated worker has one agent, with one instance id.
            Effect::Rejected { worker, .. } => {
                unreachable!("a second agent process registered as {worker}")
            }
            // The simulator forgets no worker.
            Effect::Close { worker, .. } => unreachable!("worker {worker} forgotten"),
        }
    }

    fn node_effect(&mut self, w: usize, e: NodeEffect) {
        let conn = w as u64 + 1;
        match e {
            NodeEffect::Docker(a) => self.docker(w, a),
            NodeEffect::Answer(Answer::Result(r) | Answer::Replay(r) | Answer::Stale(r)) => {
                let detail = match r.detail {
                    Some(Detail::Started { container_id, .. }) => {
                        wire::ResultDetail::Started { container_id }
                    }
                    Some(Detail::Saved {
                        step,
                        checkpoint_bytes,
                        save_ms,
                        killed,
                        ..
                    }) => wire::ResultDetail::Saved {
                        step,
                        checkpoint_bytes,
                        save_ms,
                        killed,
                    },
                    _ => wire::ResultDetail::None,
                };
                self.queue.push_back(Msg::Core(Input::Agent {
                    conn,
                    message: wire::AgentMessage::Result(wire::CommandResult {
                        command: r.command_id.into(),
                        job: r.job_id.into(),
                        epoch: r.epoch,
                        ok: r.ok,
                        error: r.error,
                        detail,
                    }),
                }));
            }
            NodeEffect::Answer(Answer::InFlight { .. }) => {}
            NodeEffect::ReportExit(x) => {
                let done = self.index_of.get(&x.job_id).is_some_and(|&j| {
                    self.jobs[j].stage == Stage::Done && self.jobs[j].epoch == x.epoch
                });
                let last_step = self.index_of.get(&x.job_id).map(|&j| self.jobs[j].step());
                self.queue.push_back(Msg::Core(Input::Agent {
                    conn,
                    message: wire::AgentMessage::Exited(wire::ContainerExited {
                        job: x.job_id.into(),
                        epoch: x.epoch,
                        exit_code: x.exit_code.unwrap_or(0),
                        oom_killed: false,
                        done,
                        last_step,
                        requested: x.requested,
                        // Modelled containers print nothing.
                        stderr_tail: String::new(),
                    }),
                }));
                self.queue.push_back(Msg::Node(
                    w,
                    NodeInput::Gone {
                        container_id: x.container_id,
                    },
                ));
            }
            NodeEffect::RequestMigration(m) => {
                self.queue.push_back(Msg::Core(Input::Agent {
                    conn,
                    message: wire::AgentMessage::MigrationRequest {
                        job: m.job_id.into(),
                        epoch: m.epoch,
                        reason: m.reason,
                    },
                }));
            }
            NodeEffect::Publish(status) => self.workers[w].status = status,
            NodeEffect::Wake { at } => {
                let worker = &mut self.workers[w];
                if worker.wake != at {
                    worker.wake = at;
                    worker.wake_version += 1;
                    if let Some(t) = at {
                        let (t, version) = (t.max(self.now), worker.wake_version);
                        self.schedule(t, Event::NodeTick { worker: w, version });
                    }
                }
            }
            // Quotas come with their `UpdateCpus`; the rest is for logs and metrics.
            NodeEffect::Round(_)
            | NodeEffect::SpeConRound { .. }
            | NodeEffect::Fencing { .. }
            | NodeEffect::ModeChanged(_) => {}
        }
    }

    /// Carries out a node core's Docker action on the model.
    fn docker(&mut self, w: usize, a: DockerAction) {
        let done = |command: String, outcome: std::result::Result<Option<Detail>, String>| {
            Msg::Node(
                w,
                NodeInput::Done {
                    command_id: command,
                    outcome,
                },
            )
        };
        let job_of = |sim: &Self, container: &str| {
            sim.workers[w]
                .containers
                .iter()
                .copied()
                .find(|&j| sim.jobs[j].container_id() == container)
        };
        match a {
            DockerAction::Create {
                command,
                job_id,
                epoch,
            } => {
                let Some(&j) = self.index_of.get(&job_id) else {
                    return;
                };
                self.advance(w);
                let shares = self.start_shares.remove(&command).unwrap_or(0);
                let cpus = self.workers[w].cpus;
                let job = &mut self.jobs[j];
                job.shares = if shares == 0 { DEFAULT_SHARES } else { shares };
                job.quota = clamp_cpus(0.0, cpus);
                job.worker = w;
                job.epoch = epoch;
                job.cpu_seconds = 0.0;
                job.heartbeat_cpu = (self.now, 0.0);
                let from_checkpoint = job.checkpoint.is_some();
                let container_id = job.container_id();
                let on = &mut self.workers[w].containers;
                if let Err(k) = on.binary_search(&j) {
                    on.insert(k, j);
                }
                self.queue.push_back(done(
                    command,
                    Ok(Some(Detail::Started {
                        container_id: container_id.clone(),
                        from_checkpoint,
                    })),
                ));
                // A measured job loads its data (or its checkpoint) before its first step; the
                // experiments' model only pays for restores.
                let load = match (&self.jobs[j].spec.runtime, from_checkpoint) {
                    (Some(r), false) => r.start_s,
                    (Some(r), true) => r.restore_s,
                    (None, false) => 0.0,
                    (None, true) => self.system.restore,
                };
                if load > 0.0 {
                    self.jobs[j].stage = Stage::Restoring;
                    self.schedule(self.now + load, Event::Restored { job: j, epoch });
                } else {
                    self.begin_training(j);
                }
                // Fresh readings before `Started` (whose FlowCon round reads them).
                self.feed(w);
                self.queue
                    .push_back(Msg::Node(w, NodeInput::Started { container_id }));
            }
            DockerAction::UpdateCpus {
                command,
                container_id,
                cpus,
                cpu_shares,
            } => {
                if let Some(j) = job_of(self, &container_id) {
                    self.advance(w);
                    self.jobs[j].quota = cpus;
                    if let Some(s) = cpu_shares {
                        self.jobs[j].shares = s;
                    }
                    self.dirty.insert(w);
                }
                if let Some(command) = command {
                    let limits = Detail::Limits {
                        cpus,
                        cpu_shares: cpu_shares.unwrap_or(0),
                    };
                    self.queue.push_back(done(command, Ok(Some(limits))));
                }
            }
            DockerAction::Pause {
                command,
                container_id,
            } => {
                if let Some(j) = job_of(self, &container_id) {
                    self.halt(j, Stage::Paused);
                }
                self.queue.push_back(done(command, Ok(None)));
            }
            DockerAction::Resume {
                command,
                container_id,
            } => {
                if let Some(j) = job_of(self, &container_id)
                    && self.jobs[j].stage == Stage::Paused
                {
                    self.advance(w);
                    self.jobs[j].stage = Stage::Running;
                    self.workers[w].jobs.push(j);
                    self.dirty.insert(w);
                }
                self.queue.push_back(done(command, Ok(None)));
            }
            DockerAction::Stop {
                command,
                container_id,
                ..
            } => {
                if let Some(j) = job_of(self, &container_id) {
                    self.halt(j, Stage::Stopped);
                    self.exit(j, 143);
                }
                self.queue.push_back(done(command, Ok(None)));
            }
            DockerAction::Save {
                command,
                container_id,
                ..
            } => {
                let Some(j) = job_of(self, &container_id) else {
                    if let Some(command) = command {
                        self.queue
                            .push_back(done(command, Err("no such container".into())));
                    }
                    return;
                };
                self.advance(w);
                if self.jobs[j].stage == Stage::Running && self.jobs[j].finished() {
                    // Its last step coincides with the save: it exits done.
                    self.complete(w);
                }
                let epoch = self.jobs[j].epoch;
                if self.jobs[j].stage == Stage::Done {
                    if let Some(command) = command {
                        self.queue
                            .push_back(done(command, Err("the container had exited".into())));
                    }
                    return;
                }
                self.halt(j, Stage::Saving);
                let save = self.save_s(j);
                self.schedule(
                    self.now + save,
                    Event::SaveDone {
                        job: j,
                        epoch,
                        command,
                    },
                );
            }
            // Never asked: the simulated agent adopts no containers.
            DockerAction::Remove { .. } => {}
        }
    }

    /// Seconds job `j` takes to save its checkpoint and exit.
    fn save_s(&self, j: usize) -> f64 {
        self.jobs[j]
            .spec
            .runtime
            .as_ref()
            .map_or(self.system.save, |r| r.save_s)
    }

    /// Bytes job `j`'s checkpoint takes.
    fn checkpoint_bytes(&self, j: usize) -> u64 {
        self.jobs[j]
            .spec
            .runtime
            .as_ref()
            .and_then(|r| r.checkpoint_bytes)
            .unwrap_or(self.system.checkpoint_bytes)
    }

    /// Job `j`'s container leaves the CPU (paused, saving, stopped).
    fn halt(&mut self, j: usize, stage: Stage) {
        let w = self.jobs[j].worker;
        self.advance(w);
        self.jobs[j].stage = stage;
        self.jobs[j].alloc = 0.0;
        self.jobs[j].rate = 0.0;
        self.workers[w].jobs.retain(|&x| x != j);
        self.dirty.insert(w);
    }

    /// Job `j`'s container exits with `code`: the node core hears `Died` after fresh readings
    /// of the others.
    fn exit(&mut self, j: usize, code: i32) {
        let w = self.jobs[j].worker;
        let container_id = self.jobs[j].container_id();
        let on = &mut self.workers[w].containers;
        if let Ok(k) = on.binary_search(&j) {
            on.remove(k);
        }
        self.feed(w);
        self.queue.push_back(Msg::Node(
            w,
            NodeInput::Died {
                container_id,
                exit_code: Some(code),
            },
        ));
    }

    /// Job `j`'s container starts training: it shares the CPU and prints its first progress
    /// line (its restored step, for a restore).
    fn begin_training(&mut self, j: usize) {
        let w = self.jobs[j].worker;
        self.advance(w);
        self.jobs[j].stage = Stage::Running;
        self.workers[w].jobs.push(j);
        self.dirty.insert(w);
        let restored = self.jobs[j].checkpoint.is_some();
        let sample = self.progress_sample(j, restored);
        self.queue.push_back(Msg::Core(Input::Agent {
            conn: w as u64 + 1,
            message: wire::AgentMessage::Progress(wire::ProgressBatch {
                samples: vec![sample],
                malformed: vec![],
            }),
        }));
    }

    // ---- the model's events ----

    fn arrival(&mut self, j: usize) {
        let spec = &self.jobs[j].spec;
        let input = Input::Submit {
            id: self.jobs[j].id.clone(),
            spec: wire::JobSpec {
                name: spec.id.clone(),
                // The experiments' jobs reserve nothing (placement never waits for room); a
                // trace's jobs reserve what they reserve live, and give no runtime estimate,
                // as the live driver submits them.
                cpus: spec.runtime.as_ref().map_or(0.0, |r| r.request_cpus),
                memory_bytes: 0,
                value_curve: spec.value,
                estimated_runtime_s: if spec.runtime.is_some() {
                    0.0
                } else {
                    spec.work
                },
                maximize: self.jobs[j].direction == Direction::Maximize,
                stop: None,
            },
        };
        if !self.value_policy {
            self.queue.push_back(Msg::Core(input));
            return;
        }
        // Value policies decide at arrival: time that step (the placement, victims included).
        let started = self.timer.as_ref().map(|t| t());
        self.steps += 1;
        let out = self.core_step(input);
        if let (Some(t), Some(t0)) = (self.timer.as_ref(), started) {
            *self.value_stats.decision_seconds.get_or_insert(0.0) += t() - t0;
        }
        self.value_stats.decisions += 1;
        for e in out {
            self.core_effect(e);
        }
    }

    /// One step of the cluster core, as the manager's actor takes it: the step, then finished
    /// jobs beyond what the core keeps archived, here to `archived` (the core notes no changed
    /// records: there is no store, `Config::record_changes`).
    fn core_step(&mut self, input: Input) -> Vec<Effect> {
        let out = self.core.step(self.now, input);
        for j in self.core.archive_records() {
            self.archived.insert(j.id.clone(), j);
        }
        out
    }

    fn heartbeat(&mut self) {
        let interval = self.system.heartbeat;
        for w in 0..self.workers.len() {
            self.advance(w);
            let conn = w as u64 + 1;
            // Sized up front: grown a push at a time, each reallocated as it grew, for every
            // worker at every heartbeat.
            let n = self.workers[w].containers.len();
            let (mut samples, mut statuses) = (Vec::with_capacity(n), Vec::with_capacity(n));
            // By place: what a report writes leaves the list as it is.
            for k in 0..n {
                let j = self.workers[w].containers[k];
                if self.jobs[j].stage == Stage::Running {
                    samples.push(self.progress_sample(j, false));
                }
                let job = &mut self.jobs[j];
                let (t0, c0) = job.heartbeat_cpu;
                let usage = if self.now > t0 {
                    (job.cpu_seconds - c0) / (self.now - t0)
                } else {
                    0.0
                };
                job.heartbeat_cpu = (self.now, job.cpu_seconds);
                let worker = &self.workers[w];
                let policy = policy_of(&worker.status.jobs, &job.spec.id, job.epoch);
                statuses.push(wire::JobStatus {
                    job: job.id.clone(),
                    epoch: job.epoch,
                    category: policy.map(|p| p.category),
                    growth_efficiency: policy.and_then(|p| p.growth_efficiency),
                    // As the agent reports it: the quota as a fraction of the worker.
                    cpu_limit: Some((job.quota / worker.cpus).min(1.0)),
                    cpu_usage: usage,
                });
            }
            if !samples.is_empty() {
                self.queue.push_back(Msg::Core(Input::Agent {
                    conn,
                    message: wire::AgentMessage::Progress(wire::ProgressBatch {
                        samples,
                        malformed: vec![],
                    }),
                }));
            }
            let status = &self.workers[w].status;
            self.queue.push_back(Msg::Core(Input::Agent {
                conn,
                message: wire::AgentMessage::Heartbeat(wire::Heartbeat {
                    jobs: statuses,
                    alpha: status.flowcon.map(|f| f.0),
                    interval_s: status.flowcon.map(|f| f.1),
                }),
            }));
        }
        self.queue.push_back(Msg::Core(Input::Tick));
        if self.unfinished > 0 {
            self.schedule(self.now + interval, Event::Heartbeat);
        }
    }

    /// The next job(s) on worker `w` finished their work: each prints its last line and
    /// exits 0.
    fn complete(&mut self, w: usize) {
        self.advance(w);
        let finished: Vec<usize> = self.workers[w]
            .jobs
            .iter()
            .copied()
            .filter(|&j| self.jobs[j].finished())
            .collect();
        if finished.is_empty() {
            // Rounding: reshare and schedule again.
            self.dirty.insert(w);
            return;
        }
        for &j in &finished {
            self.jobs[j].done = self.jobs[j].spec.work;
            self.halt(j, Stage::Done);
            self.jobs[j].finish = self.now;
            let sample = self.progress_sample(j, false);
            self.queue.push_back(Msg::Core(Input::Agent {
                conn: w as u64 + 1,
                message: wire::AgentMessage::Progress(wire::ProgressBatch {
                    samples: vec![sample],
                    malformed: vec![],
                }),
            }));
        }
        for j in finished {
            self.exit(j, 0);
        }
    }

    fn restored(&mut self, j: usize, epoch: u64) {
        if self.jobs[j].epoch == epoch && self.jobs[j].stage == Stage::Restoring {
            self.begin_training(j);
            self.progress_to_node(j);
        }
    }

    fn save_done(&mut self, j: usize, epoch: u64, command: Option<String>) {
        if self.jobs[j].epoch != epoch || self.jobs[j].stage != Stage::Saving {
            return;
        }
        let w = self.jobs[j].worker;
        let step = self.jobs[j].step();
        self.jobs[j].checkpoint = Some(step);
        self.jobs[j].stage = Stage::Idle;
        self.exit(j, 0);
        if let Some(command) = command {
            let ms = (self.save_s(j) * 1000.0).round() as u64;
            self.queue.push_back(Msg::Node(
                w,
                NodeInput::Done {
                    command_id: command,
                    outcome: Ok(Some(Detail::Saved {
                        checkpoint_dir: format!("{}/{epoch}", self.jobs[j].spec.id),
                        checkpoint_bytes: self.checkpoint_bytes(j),
                        step,
                        killed: false,
                        save_ms: ms,
                    })),
                },
            ));
        }
    }

    // ---- what the modelled containers report ----

    /// The metric job `j` prints now: its curve at its progress, with seeded noise of its
    /// model's measured scatter (trace jobs), else the system's.
    fn metric(&mut self, j: usize) -> f64 {
        let job = &self.jobs[j];
        let clean = self
            .catalog
            .get(job.spec.model)
            .curve
            .value(job.done / job.spec.work);
        let noise = job
            .spec
            .runtime
            .as_ref()
            .and_then(|r| r.noise)
            .unwrap_or(self.system.noise);
        // Box-Muller from two uniforms of the run's generator.
        let u1: f64 = self.rng.random::<f64>().max(1e-12);
        let u2: f64 = self.rng.random::<f64>();
        let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        clean * (1.0 + noise * z)
    }

    /// A progress line of job `j` for the cluster core.
    fn progress_sample(&mut self, j: usize, checkpointed: bool) -> wire::ProgressSample {
        let value = self.metric(j);
        let job = &self.jobs[j];
        wire::ProgressSample {
            job: job.id.clone(),
            epoch: job.epoch,
            unix_ms: (self.now * 1000.0).round() as i64,
            step: job.step(),
            total_steps: Some(job.reported_total()),
            value: Some(value),
            checkpointed,
        }
    }

    /// Job `j`'s latest progress line, for its node core.
    fn progress_to_node(&mut self, j: usize) {
        let value = self.metric(j);
        let job = &self.jobs[j];
        self.queue.push_back(Msg::Node(
            job.worker,
            NodeInput::Progress {
                container_id: job.container_id(),
                sample: nd::ProgressSample {
                    time: self.now,
                    step: job.step(),
                    value,
                },
                initial_value: None,
                direction: None,
            },
        ));
    }

    /// Fresh CPU readings of every container on `w`, and progress of those that train: what
    /// the node core reads before a round.
    fn feed(&mut self, w: usize) {
        self.advance(w);
        for k in 0..self.workers[w].containers.len() {
            let j = self.workers[w].containers[k];
            let job = &self.jobs[j];
            if !job.stage.live() {
                continue;
            }
            self.queue.push_back(Msg::Node(
                w,
                NodeInput::Usage {
                    container_id: job.container_id(),
                    cpu_seconds: job.cpu_seconds,
                },
            ));
            if job.stage == Stage::Running {
                self.progress_to_node(j);
            }
        }
    }

    // ---- the CPU model ----

    /// Brings worker `w`'s jobs' work up to now.
    fn advance(&mut self, w: usize) {
        let worker = &mut self.workers[w];
        let dt = self.now - worker.last_update;
        if dt > 0.0 {
            for &j in &worker.jobs {
                let job = &mut self.jobs[j];
                job.done += job.rate * dt;
                job.cpu_seconds += job.alloc * dt;
            }
        }
        worker.last_update = self.now;
    }

    /// Recomputes worker `w`'s CPU split and its next completion.
    fn reallocate(&mut self, w: usize) {
        self.advance(w);
        let worker = &self.workers[w];
        let jobs = &self.jobs;
        let demand: Vec<f64> = worker
            .jobs
            .iter()
            .map(|&j| jobs[j].spec.max_cores)
            .collect();
        let alloc = match self.sharing {
            Sharing::Cfs => {
                let quota: Vec<f64> = worker.jobs.iter().map(|&j| jobs[j].quota).collect();
                let weight: Vec<f64> = worker
                    .jobs
                    .iter()
                    .map(|&j| f64::from(jobs[j].shares))
                    .collect();
                quota_share(worker.cpus, &demand, &quota, &weight)
            }
            Sharing::Srpt => {
                let remaining: Vec<f64> = worker
                    .jobs
                    .iter()
                    .map(|&j| jobs[j].spec.work - jobs[j].done)
                    .collect();
                srpt_share(worker.cpus, &demand, &remaining)
            }
        };
        let mut next = f64::INFINITY;
        let (cpus, sharing) = (worker.cpus, worker.jobs.len());
        // Threads per core: a job runs as many threads as the cores it can use, rounded up
        // (the papers' models 1 to 4; our trace jobs one). The co-location tables were measured
        // on one core, so a big worker's jobs pay for how crowded its cores are, not for how
        // many jobs it holds.
        let load = worker
            .jobs
            .iter()
            .map(|&j| jobs[j].spec.max_cores.min(cpus).ceil().max(1.0))
            .sum::<f64>()
            / cpus.max(1e-9);
        // What the host's other busy workers run: what a busy neighbour costs depends on its
        // model (`host_pairs.json`). Each job counts one over its worker's number of jobs, the
        // share free competition gives one-thread jobs; under FlowCon's limits or converge's
        // split the shares are uneven, and that is not modelled: the shares are the other
        // workers' to compute, in an order this worker's does not wait for.
        let neighbours: Vec<(&str, f64)> = if self.host_neighbours {
            self.workers
                .iter()
                .enumerate()
                .filter(|&(v, other)| v != w && !other.jobs.is_empty())
                .flat_map(|(_, other)| {
                    let n = other.jobs.len() as f64;
                    other.jobs.iter().filter_map(move |&o| {
                        Some((jobs[o].spec.runtime.as_ref()?.model.as_str(), 1.0 / n))
                    })
                })
                .collect()
        } else {
            Vec::new()
        };
        // Each job's factor, read before any job changes: the measured cost of sharing, under
        // free competition or under a hard quota that holds it below the worker (FlowCon's
        // limits), and beside exactly one other job the cost of that pair of models if measured.
        let factors: Vec<f64> = worker
            .jobs
            .iter()
            .map(|&j| {
                let job = &jobs[j];
                let costs = match &job.spec.runtime {
                    Some(r) => &r.sharing,
                    None => &self.catalog.contention().sharing,
                };
                let limited = job.quota < cpus - 1e-9;
                let other = (sharing == 2)
                    .then(|| worker.jobs.iter().find(|&&o| o != j))
                    .flatten()
                    .and_then(|&o| jobs[o].spec.runtime.as_ref());
                costs.charged(
                    self.busy_workers,
                    limited,
                    load,
                    other.map(|r| r.model.as_str()),
                    &neighbours,
                )
            })
            .collect();
        for ((&j, a), shared) in worker.jobs.iter().zip(alloc).zip(factors) {
            let job = &mut self.jobs[j];
            job.alloc = a;
            let rate = a * worker.calibration * shared;
            job.rate = rate;
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

    // ---- results ----

    fn results(self) -> Run {
        let jobs: Vec<JobResult> = self
            .jobs
            .iter()
            .map(|j| {
                let core = self
                    .core
                    .job(&j.spec.id)
                    .or_else(|| self.archived.get(j.spec.id.as_str()).map(|j| &**j));
                let outcome = match core.map(|c| (&c.phase, c)) {
                    Some((JobPhase::Completed, _)) => Outcome::Completed,
                    // Not run: refused at admission, or dropped while it waited.
                    Some((JobPhase::Rejected | JobPhase::Dropped, c)) if c.epoch == 0 => {
                        Outcome::Rejected(c.reason.clone())
                    }
                    // Given up once it ran: stopped for another (a preemption's reason), or
                    // its value gone (a drop, or turned away when placed again).
                    Some((JobPhase::Dropped, c)) if c.reason.starts_with("preempted") => {
                        Outcome::Stopped(c.reason.clone())
                    }
                    Some((JobPhase::Dropped, c)) => Outcome::Dropped(c.reason.clone()),
                    Some((_, c)) => Outcome::Failed(c.reason.clone()),
                    None => Outcome::Failed("never submitted".into()),
                };
                let finish = if outcome.is_completed() {
                    j.finish
                } else {
                    f64::NAN
                };
                JobResult {
                    id: j.spec.id.clone(),
                    model: j.spec.model_name.clone(),
                    arrival: j.spec.arrival,
                    finish,
                    jct: finish - j.spec.arrival,
                    worker: j.worker,
                    migrations: core.map_or(0, |c| c.migrations),
                    eta_error: core.map_or([None; 3], |c| c.eta_errors()),
                    value: j.spec.value.map(|c| {
                        if outcome.is_completed() {
                            c.value_at(finish - j.spec.arrival)
                        } else {
                            0.0
                        }
                    }),
                    outcome,
                }
            })
            .collect();
        let first = jobs.iter().map(|j| j.arrival).fold(f64::INFINITY, f64::min);
        let last = jobs
            .iter()
            .map(|j| j.finish)
            .filter(|f| f.is_finite())
            .fold(0.0, f64::max);
        // Completed jobs only (with value policies some never complete).
        let done: Vec<f64> = jobs
            .iter()
            .map(|j| j.jct)
            .filter(|t| t.is_finite())
            .collect();
        let avg = done.iter().sum::<f64>() / done.len().max(1) as f64;
        let value = jobs.iter().any(|j| j.value.is_some()).then(|| {
            let count = |f: fn(&Outcome) -> bool| jobs.iter().filter(|j| f(&j.outcome)).count();
            let stopped = count(|o| matches!(o, Outcome::Stopped(_)));
            ValueSummary {
                total: jobs.iter().filter_map(|j| j.value).sum(),
                completed: count(|o| matches!(o, Outcome::Completed)),
                rejected: count(|o| matches!(o, Outcome::Rejected(_))),
                dropped: count(|o| matches!(o, Outcome::Dropped(_))),
                stopped,
                // Pauses were counted as sent; stops are the victims that ended stopped.
                preemptions: self.value_stats.preemptions + stopped as u64,
                ..self.value_stats.clone()
            }
        });
        Run {
            value,
            policy: self.label,
            makespan: if jobs.is_empty() { 0.0 } else { last - first },
            avg_jct: avg,
            migrations: jobs.iter().map(|j| u64::from(j.migrations)).sum(),
            jobs,
            events: self.events,
            stale: self.stale,
            steps: self.steps,
            refusals: self.refusals,
            archived: self.archived.len(),
            trace: self.trace,
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use converge_policy::cluster::Category;

    /// `policy_of` finds what a walk of the whole list finds, for ids before, between and
    /// after the listed ones, and for a job listed at two epochs (an old incarnation's entry
    /// beside the new one's).
    #[test]
    fn policy_of_finds_what_a_walk_finds() {
        let entry = |id: &str, epoch, category| nd::JobPolicy {
            job_id: id.into(),
            epoch,
            category,
            growth_efficiency: None,
        };
        let jobs = vec![
            entry("b", 1, Category::PROGRESSING),
            entry("d", 1, Category::CONVERGED),
            entry("d", 2, Category::PROGRESSING),
            entry("f", 3, Category::CONVERGED),
        ];
        let mut found = 0;
        for id in ["a", "b", "c", "d", "e", "f", "g"] {
            for epoch in 0..4 {
                let walked = (jobs.iter()).find(|p| p.job_id == id && p.epoch == epoch);
                assert_eq!(policy_of(&jobs, id, epoch), walked, "{id} at epoch {epoch}");
                found += usize::from(walked.is_some());
            }
        }
        assert_eq!(found, jobs.len(), "every entry is found once");
    }
}
