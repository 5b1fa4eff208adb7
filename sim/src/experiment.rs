//! Experiment files (`sim/experiments/*.json`): cluster, workload, the policy and its baseline,
//! and the paper's reported numbers to print beside ours.

use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use converge_core::cluster::policy::POLICIES;
use converge_policy::value::{PreemptAction, PreemptionConfig, ValueCurve, VictimCriterion};

use crate::curve::Catalog;
use crate::error::{Error, Result};

/// One experiment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Experiment {
    /// Short id (file stem; used for plot file names).
    pub name: String,
    /// One-line description.
    pub title: String,
    /// Seed of every random choice (arrivals, models, noise).
    pub seed: u64,
    /// The cluster.
    pub workers: Vec<WorkerGroup>,
    /// The jobs.
    pub workload: Workload,
    /// The policy under test.
    pub policy: PolicySpec,
    /// The paper's baseline.
    pub baseline: PolicySpec,
    /// Model parameters of the simulated system.
    #[serde(default)]
    pub system: SystemModel,
    /// What the paper reports for this experiment.
    #[serde(default)]
    pub paper: PaperNumbers,
    /// Parameter points to sweep (α × interval), with the paper's numbers per point.
    #[serde(default)]
    pub sweep: Vec<SweepPoint>,
    /// A job whose reduction the paper reports separately (e.g. `job-3`, MNIST TensorFlow).
    #[serde(default)]
    pub focus_job: Option<String>,
    /// Why our numbers differ from the paper's, where they do (written after looking).
    #[serde(default)]
    pub note: String,
}

/// `count` identical workers.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerGroup {
    /// How many.
    pub count: usize,
    /// Cores each.
    pub cpus: f64,
    /// Speed relative to the reference worker.
    #[serde(default = "one")]
    pub calibration: f64,
}

fn one() -> f64 {
    1.0
}

/// The jobs of an experiment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub enum Workload {
    /// Jobs at fixed times.
    Fixed(Vec<FixedJob>),
    /// `jobs` jobs with uniformly random arrival times in `window` and models drawn from
    /// `models`.
    Random {
        /// How many jobs.
        jobs: usize,
        /// Arrival window, seconds.
        window: (f64, f64),
        /// Models to draw from.
        models: Vec<String>,
        /// How each job's work varies around its model's (default: uniform within the
        /// system's `work_spread`).
        #[serde(default)]
        sizes: Sizes,
    },
    /// `jobs` jobs of `model`, one every `every` seconds from 0.
    Periodic {
        /// How many jobs.
        jobs: usize,
        /// The model.
        model: String,
        /// Interval, seconds.
        every: f64,
    },
}

/// How a random workload's job sizes vary: each job's work is its model's times a factor.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub enum Sizes {
    /// Uniform in `[1 - work_spread, 1 + work_spread]` ([`SystemModel::work_spread`]).
    #[default]
    Uniform,
    /// Pareto: `min · U^(-1/shape)`, at most `cap`. Heavy-tailed, as the job durations of
    /// shared GPU clusters are (Tiresias, Gu et al., NSDI'19, §2.2: most jobs are short, a few
    /// take most of the time); shape 1.1–1.5 gives a few jobs tens of times the median's work.
    Pareto {
        /// Tail index α (smaller: heavier).
        shape: f64,
        /// The smallest factor.
        min: f64,
        /// The largest factor (a cap keeps one draw from dwarfing the whole trace).
        cap: f64,
    },
}

/// A job at a fixed time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FixedJob {
    /// The model.
    pub model: String,
    /// Arrival, seconds.
    pub at: f64,
}

/// A scheduling scheme: placement plus on-worker sharing plus (maybe) migration.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum PolicySpec {
    /// FlowCon: Alg. 4 placement, Alg. 1-3 limits on every worker.
    Flowcon {
        /// Threshold α.
        alpha: f64,
        /// Interval itval, seconds.
        itval: f64,
        /// β of the lower bound.
        #[serde(default = "two")]
        beta: f64,
        /// Alg. 3 on.
        #[serde(default)]
        adaptive: bool,
        /// Use Alg. 4 for placement (else Docker Swarm spread, as in the single-worker runs).
        #[serde(default = "yes")]
        placement: bool,
    },
    /// FlowCon's DS/NA baseline: Docker Swarm spread placement, free competition.
    DockerSwarm,
    /// SpeCon: fixed round-robin initial placement, Alg. 1-3 migrations, free competition.
    Specon {
        /// Threshold α.
        alpha: f64,
        /// Categorization interval, seconds.
        interval: f64,
        /// Alg. 3 on.
        #[serde(default = "yes")]
        rebalance: bool,
    },
    /// SpeCon's DS baseline: fixed round-robin initial placement, no migration.
    Kubernetes,
    /// Shortest-remaining-work-first on every worker with full knowledge (an upper bound on
    /// what sharing can do), on the baseline's placement.
    Oracle,
    /// Value-based allocation (value-based-allocation.txt:104-114): DwoP, or DwP when
    /// `preemption` is given. Every job needs a value curve.
    Value {
        /// CPU-share stride (1 = every share 1..=1024).
        #[serde(default = "one_u32")]
        stride: u32,
        /// DwP's λ, victim criterion and action; absent for DwoP.
        #[serde(default)]
        preemption: Option<PreemptionConfig>,
    },
    /// The value-based allocation paper's GA offline baseline (:100-102): the whole workload
    /// known in advance, each job given a node (or rejected) and a CPU share.
    ValueGa {
        /// Chromosomes per generation.
        population: usize,
        /// Generations.
        generations: usize,
    },
    /// A cluster policy by the manager's `--policy` name, with the intervals the manager and
    /// the agents run it with: exactly what a trace runs live ([`crate::trace`]).
    Named {
        /// The manager's policy.
        policy: PolicyName,
        /// The agents' FlowCon interval (itval), seconds; α adapts (Alg. 3), as the agent's
        /// default is.
        flowcon_interval: f64,
        /// The agents' SpeCon categorization interval, seconds.
        specon_interval: f64,
        /// The manager's rebalance interval, seconds.
        rebalance_interval: f64,
    },
}

/// One of the manager's policy names (`converge_core::cluster::policy::POLICIES`, the list
/// `--policy` accepts): an experiment or a trace can name any policy the manager runs, and a
/// policy added to the manager needs nothing here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyName(&'static str);

impl PolicyName {
    /// The manager's policy called `name`; the error lists the names it knows.
    pub fn new(name: &str) -> Result<Self> {
        POLICIES
            .iter()
            .find(|p| **p == name)
            .map(|p| PolicyName(p))
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "unknown policy `{name}`; the manager's policies: {}",
                    POLICIES.join(", ")
                ))
            })
    }

    /// The manager's name for it.
    pub fn as_str(self) -> &'static str {
        self.0
    }
}

impl Serialize for PolicyName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.0)
    }
}

impl<'de> Deserialize<'de> for PolicyName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        PolicyName::new(&name).map_err(serde::de::Error::custom)
    }
}

fn one_u32() -> u32 {
    1
}

fn two() -> f64 {
    2.0
}

fn yes() -> bool {
    true
}

impl PolicySpec {
    /// A short label for tables.
    pub fn label(&self) -> String {
        match self {
            PolicySpec::Flowcon {
                alpha,
                itval,
                adaptive,
                ..
            } => format!(
                "FlowCon (α={alpha}, itval={itval}s{})",
                if *adaptive { ", adaptive" } else { "" }
            ),
            PolicySpec::DockerSwarm => "Docker Swarm (DS/NA)".into(),
            PolicySpec::Specon {
                alpha, interval, ..
            } => format!("SpeCon (α={alpha}, interval={interval}s)"),
            PolicySpec::Kubernetes => "Kubernetes default (DS)".into(),
            PolicySpec::Oracle => "oracle SRPT".into(),
            PolicySpec::Value {
                stride,
                preemption: None,
            } => format!("DwoP (stride {stride})"),
            PolicySpec::Value {
                stride,
                preemption: Some(p),
            } => format!(
                "DwP (λ={}, {}, {}, stride {stride})",
                p.lambda,
                match p.criterion {
                    VictimCriterion::LowestExpectedValue => "LEV",
                    VictimCriterion::LowestValueDensity => "LVD",
                    VictimCriterion::MinimalRemainingValue => "MRV",
                },
                match p.action {
                    PreemptAction::Pause => "pause",
                    PreemptAction::Stop => "stop",
                }
            ),
            PolicySpec::ValueGa {
                population,
                generations,
            } => format!("GA ({population} × {generations} generations)"),
            PolicySpec::Named { policy, .. } => policy.as_str().to_string(),
        }
    }

    /// The same policy with α and interval replaced (for sweeps). Baselines are unchanged.
    pub fn with_parameters(self, new_alpha: f64, new_interval: f64) -> Self {
        match self {
            PolicySpec::Flowcon {
                beta,
                adaptive,
                placement,
                ..
            } => PolicySpec::Flowcon {
                alpha: new_alpha,
                itval: new_interval,
                beta,
                adaptive,
                placement,
            },
            PolicySpec::Specon { rebalance, .. } => PolicySpec::Specon {
                alpha: new_alpha,
                interval: new_interval,
                rebalance,
            },
            other => other,
        }
    }
}

/// The simulated system's own parameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SystemModel {
    /// Seconds between worker heartbeats (the manager's view is this stale).
    pub heartbeat: f64,
    /// Seconds to save a checkpoint when migrating.
    pub save: f64,
    /// Bytes a job without a measured runtime reports saving. Only whether it is 0 decides
    /// anything: the core counts a save of 0 bytes as no checkpoint
    /// (`converge_core::cluster::moves::wrote_checkpoint`).
    #[serde(default = "default_checkpoint_bytes")]
    pub checkpoint_bytes: u64,
    /// Seconds to restore it on the target.
    pub restore: f64,
    /// Relative standard deviation of the noise on reported metric values.
    pub noise: f64,
    /// Per-job spread of work: each job's work is the model's times a uniform factor in
    /// `[1 - spread, 1 + spread]` (random workloads only).
    pub work_spread: f64,
    /// Error of the remaining-work estimates: each job reports its steps to go scaled by its
    /// own factor, drawn once uniformly in `[1 - e, 1 + e]` (its real work is unchanged), so a
    /// policy that schedules by estimates is judged on wrong ones. 0: exact.
    #[serde(default)]
    pub estimate_noise: f64,
}

/// A synthetic job's checkpoint: 1 MiB, between the measured models' (`sim/measured/`).
fn default_checkpoint_bytes() -> u64 {
    1 << 20
}

impl Default for SystemModel {
    fn default() -> Self {
        SystemModel {
            heartbeat: 5.0,
            save: 2.0,
            checkpoint_bytes: default_checkpoint_bytes(),
            restore: 2.0,
            noise: 0.003,
            work_spread: 0.2,
            estimate_noise: 0.0,
        }
    }
}

/// The paper's reported numbers (all optional; percentages as fractions).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PaperNumbers {
    /// Where in the paper (section, figure, text lines).
    #[serde(default)]
    pub source: String,
    /// Average completion time, (policy, baseline), seconds.
    pub avg_jct: Option<(f64, f64)>,
    /// Makespan, (policy, baseline), seconds.
    pub makespan: Option<(f64, f64)>,
    /// Share of jobs that finished sooner under the policy.
    pub improved: Option<f64>,
    /// Average completion-time reduction.
    pub avg_reduction: Option<f64>,
    /// Makespan reduction.
    pub makespan_reduction: Option<f64>,
    /// The best job's reduction.
    pub best: Option<f64>,
    /// The worst job's change (positive = slower).
    pub worst: Option<f64>,
    /// A named job's reduction (e.g. MNIST TensorFlow in FlowCon's Table 2).
    pub focus: Option<f64>,
}

/// One point of a parameter sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepPoint {
    /// α.
    pub alpha: f64,
    /// itval (FlowCon) or categorization interval (SpeCon), seconds.
    pub interval: f64,
    /// The paper's numbers at this point.
    #[serde(default)]
    pub paper: PaperNumbers,
}

/// A job of a generated trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    /// `job-N`, numbered by arrival.
    pub id: String,
    /// Catalog index of its model.
    pub model: usize,
    /// Model name.
    pub model_name: String,
    /// Arrival, seconds.
    pub arrival: f64,
    /// Work, reference core-seconds.
    pub work: f64,
    /// Most cores it can use.
    pub max_cores: f64,
    /// Its value curve (value-based allocation workloads only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<ValueCurve>,
    /// What was measured of this job on the real workers (trace runs, [`crate::trace`]);
    /// `None`: the experiment's [`SystemModel`] and one step per core-second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<Runtime>,
}

/// A job's measured runtime ([`crate::measured::JobCost`]) and what it asks of the manager,
/// as a trace run submits it live.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Runtime {
    /// Its measured model ([`crate::measured::model_key`]): what a job beside it looks up in
    /// its [`crate::measured::Sharing::beside`].
    #[serde(default)]
    pub model: String,
    /// Its step budget (`--steps`): what it reports as total steps.
    pub steps: u64,
    /// CPU cores it reserves (`JobSpec.cpus`).
    pub request_cpus: f64,
    /// What sharing a worker costs it.
    pub sharing: crate::measured::Sharing,
    /// Seconds from its container's start to its first progress line.
    pub start_s: f64,
    /// Seconds to save its checkpoint and exit.
    pub save_s: f64,
    /// Bytes its checkpoint takes (the `saved` line's, measured); the system's when unknown.
    #[serde(default)]
    pub checkpoint_bytes: Option<u64>,
    /// Seconds from a restore's start to its first progress line.
    pub restore_s: f64,
    /// Relative scatter of its held-out loss between reports, measured (the `loss noise`
    /// column of `converge-trainer calibrate`); the system's [`SystemModel::noise`] when
    /// unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub noise: Option<f64>,
}

impl Experiment {
    /// Reads and checks an experiment file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.into(),
            source,
        })?;
        let e: Experiment = serde_json::from_str(&text).map_err(|source| Error::Parse {
            path: path.into(),
            source,
        })?;
        e.check()?;
        Ok(e)
    }

    /// Structural checks.
    pub fn check(&self) -> Result<()> {
        if self.workers.iter().map(|g| g.count).sum::<usize>() == 0 {
            return Err(Error::Invalid(format!("{}: no workers", self.name)));
        }
        if self
            .workers
            .iter()
            .any(|g| g.cpus <= 0.0 || g.calibration <= 0.0)
        {
            return Err(Error::Invalid(format!(
                "{}: worker cpus and calibration must be positive",
                self.name
            )));
        }
        if let Workload::Random { window, models, .. } = &self.workload
            && (window.1 < window.0 || models.is_empty())
        {
            return Err(Error::Invalid(format!(
                "{}: random workload needs a window with start <= end and at least one model",
                self.name
            )));
        }
        Ok(())
    }

    /// Worker (cpus, calibration) list, expanded from the groups.
    pub fn worker_list(&self) -> Vec<(f64, f64)> {
        self.workers
            .iter()
            .flat_map(|g| std::iter::repeat_n((g.cpus, g.calibration), g.count))
            .collect()
    }

    /// The job trace, generated from the seed (the same for every policy run).
    pub fn jobs(&self, catalog: &Catalog) -> Result<Vec<JobSpec>> {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        let spread = self.system.work_spread.clamp(0.0, 0.9);
        let mut raw: Vec<(usize, f64, f64)> = match &self.workload {
            Workload::Fixed(list) => list
                .iter()
                .map(|j| Ok((catalog.index(&j.model)?, j.at, 1.0)))
                .collect::<Result<_>>()?,
            Workload::Periodic { jobs, model, every } => {
                let m = catalog.index(model)?;
                (0..*jobs).map(|i| (m, i as f64 * every, 1.0)).collect()
            }
            Workload::Random {
                jobs,
                window,
                models,
                sizes,
            } => {
                let idx: Vec<usize> = models
                    .iter()
                    .map(|m| catalog.index(m))
                    .collect::<Result<_>>()?;
                (0..*jobs)
                    .map(|_| {
                        let at = window.0 + rng.random::<f64>() * (window.1 - window.0);
                        let m = idx[rng.random_range(0..idx.len())];
                        let mut f = 1.0 - spread + 2.0 * spread * rng.random::<f64>();
                        if let Sizes::Pareto { shape, min, cap } = *sizes {
                            let u = rng.random::<f64>().max(1e-12);
                            f = (min * u.powf(-1.0 / shape.max(0.1))).min(cap);
                        }
                        (m, (at * 10.0).round() / 10.0, f)
                    })
                    .collect()
            }
        };
        raw.sort_by(|a, b| a.1.total_cmp(&b.1));
        Ok(raw
            .into_iter()
            .enumerate()
            .map(|(i, (m, at, f))| {
                let model = catalog.get(m);
                JobSpec {
                    id: format!("job-{}", i + 1),
                    model: m,
                    model_name: model.name.clone(),
                    arrival: at,
                    work: model.work * f,
                    max_cores: model.max_cores,
                    value: None,
                    runtime: None,
                }
            })
            .collect())
    }
}
