//! The real workload as measured by `cargo xtask measure` (files under `sim/measured/`), and
//! what the simulator takes from it.
//!
//! The schema is here, in the crate that reads it, and `xtask` writes these same types: one
//! definition of each file. [`Measured`] loads a directory of them and answers the questions a
//! simulated job asks (how many core-seconds a step costs, how much co-location slows it, how
//! long a start, a save and a restore take, what its held-out loss does over its steps).

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// What every file starts with: where and how its numbers were made.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Header {
    /// The command line that wrote the file.
    pub command: String,
    /// UTC, RFC 3339.
    pub date: String,
    /// A `--quick` smoke run: a handful of points with short windows, not data.
    pub quick: bool,
    /// The machine.
    pub machine: Machine,
    /// The trainer image's id.
    pub image: String,
    /// The measurement settings.
    pub settings: Settings,
}

/// The machine a file was measured on.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Machine {
    /// Online CPUs.
    pub nproc: usize,
    /// `v1` or `v2`.
    pub cgroup: String,
    /// `/proc/cpuinfo`'s model name.
    pub cpu_model: String,
    /// Kernel release.
    pub kernel: String,
    /// Docker server version.
    pub docker: String,
    /// 1/5/15-minute load averages when the table started: other work on the machine shows
    /// here (this command's own containers are not running yet).
    pub loadavg_start: String,
    /// Load averages when the table was finished (includes this command's own load).
    pub loadavg_end: String,
}

/// The settings of a run.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Settings {
    /// Steady-state window per point, seconds.
    pub window_s: f64,
    /// Warm-up before the window, seconds after the first progress line.
    pub warmup_s: f64,
    /// `--report-every` of every measured job.
    pub report_every: u64,
    /// Save/restore/start cycles per model and size.
    pub reps: usize,
    /// Co-location budget and checkpoint/start `--cpus`, cores.
    pub budget: f64,
}

/// A steady-state rate of one job over a window.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Rate {
    /// Training seconds per step (Δ`elapsed_s` / Δ`step` between the window's first and last
    /// progress lines).
    pub s_per_step: f64,
    /// 1 / `s_per_step`.
    pub steps_per_s: f64,
    /// Steps in the window.
    pub steps: u64,
    /// Training seconds in the window.
    pub window_s: f64,
    /// Report intervals in the window.
    pub intervals: usize,
    /// CPU seconds per step (the container's cgroup usage over the window), when readable.
    pub cpu_s_per_step: Option<f64>,
    /// Cores the container used on average over the window, when readable.
    pub cores: Option<f64>,
}

/// `step_time.json`.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct StepTimeFile {
    /// Provenance.
    pub header: Header,
    /// One point per model × size × `--cpus` × `--threads`.
    pub points: Vec<StepPoint>,
}

/// One step-time point.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct StepPoint {
    /// `--model`.
    pub model: String,
    /// `--size`.
    pub size: u32,
    /// Docker `--cpus` (a CFS quota over the 100 ms period).
    pub cpus: f64,
    /// `--threads` (0: one per CPU the trainer sees at start, cgroup quota included).
    pub threads: u32,
    /// The measurement, or `None` with `error`.
    pub rate: Option<Rate>,
    /// Why the point has no measurement.
    pub error: Option<String>,
}

/// `colocation.json`.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct ColocationFile {
    /// Provenance.
    pub header: Header,
    /// The parent cgroup's quota, cores.
    pub budget: f64,
    /// One-core jobs kept busy on the machine's other CPUs while measuring (0: those CPUs
    /// idle; `cargo xtask measure --busy-host`: the testbed's other workers, busy).
    #[serde(default)]
    pub neighbors: usize,
    /// One point per model × threads × mode × jobs.
    pub points: Vec<ColocationPoint>,
}

/// One co-location point: `jobs` identical jobs started together under the budget.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct ColocationPoint {
    /// `--model`.
    pub model: String,
    /// `--size`.
    pub size: u32,
    /// `--threads` of every job.
    pub threads: u32,
    /// `free`: no per-container limit (CFS shares inside the parent's quota); `split`: each
    /// container has `--cpus budget/jobs` (hard quotas, as FlowCon's limits are).
    pub mode: String,
    /// Jobs sharing the budget.
    pub jobs: usize,
    /// Each container's `--cpus`, in `split` mode.
    pub per_job_cpus: Option<f64>,
    /// Each job's rate over the common window.
    pub rates: Vec<Rate>,
    /// Sum of the jobs' steps/s.
    pub aggregate_steps_per_s: Option<f64>,
    /// `aggregate_steps_per_s` over that of one job alone with the whole budget (free mode,
    /// same model, size and threads): 1.0 = no cost of sharing. With repetitions, the median of
    /// [`ColocationPoint::repeats`].
    pub relative: Option<f64>,
    /// Each repetition's `relative`, against the job alone measured in the same repetition
    /// (`cargo xtask measure --reps`), in the order measured: `null` where that repetition
    /// failed, so position k is repetition k in every table ([`Measured::at_repetition`]).
    /// Empty in files measured before repetitions were.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub repeats: Vec<Option<f64>>,
    /// Sum of the jobs' cores (should not exceed the budget).
    pub cores_total: Option<f64>,
    /// Why the point has no measurement.
    pub error: Option<String>,
}

/// `pairs.json`: two jobs of different models sharing one budget under free competition.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct PairsFile {
    /// Provenance.
    pub header: Header,
    /// The parent cgroup's quota, cores.
    pub budget: f64,
    /// As [`ColocationFile::neighbors`].
    #[serde(default)]
    pub neighbors: usize,
    /// Each model alone in the budget: the reference of the pairs' efficiencies.
    pub alone: Vec<PairJob>,
    /// One point per unordered pair of distinct (model, size).
    pub pairs: Vec<PairPoint>,
}

/// `host.json`: one-thread jobs of one model, each in a container of its own limited to one
/// core (as each of the testbed's workers holds its jobs), 1 to `nproc` of them at once. The
/// testbed's workers are containers on this one machine, so a busy worker may slow the others
/// down: on a machine whose CPUs are hyperthreads of one core (or share one core's budget in
/// the hypervisor), two busy one-core workers each get far less than a core's throughput.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct HostFile {
    /// Provenance.
    pub header: Header,
    /// One point per model × number of jobs at once.
    pub points: Vec<HostPoint>,
}

/// `jobs` copies of one model at once, each under `--cpus 1`.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct HostPoint {
    /// `--model`.
    pub model: String,
    /// `--size`.
    pub size: u32,
    /// How many ran at once.
    pub jobs: usize,
    /// Each one's rate over the common window.
    pub rates: Vec<Rate>,
    /// Their mean steps/s over the same model's alone (the point with `jobs` = 1): what each
    /// gets done while that many are busy; `None` when a rate is missing. With repetitions,
    /// the median of [`HostPoint::repeats`].
    pub relative: Option<f64>,
    /// Each repetition's `relative`, against the alone of the same repetition (`cargo xtask
    /// measure --reps`), `null` where that repetition failed (as
    /// [`ColocationPoint::repeats`]); empty in files measured before the host table was
    /// repeated.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub repeats: Vec<Option<f64>>,
    /// Why the point has no measurement.
    pub error: Option<String>,
}

/// One job of a pair, or one alone.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct PairJob {
    /// `--model`.
    pub model: String,
    /// `--size`.
    pub size: u32,
    /// Its rate over the window.
    pub rate: Option<Rate>,
    /// Steps per CPU-second over the same model's alone (1.0: sharing costs it nothing);
    /// `None` alone or where CPU use was not readable. With repetitions, the median of
    /// [`PairJob::repeats`].
    pub efficiency: Option<f64>,
    /// Each repetition's `efficiency`, against the job alone measured in the same repetition
    /// (`cargo xtask measure --reps`), `null` where that repetition failed (as
    /// [`ColocationPoint::repeats`]); empty alone and in files measured before pairs were
    /// repeated.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub repeats: Vec<Option<f64>>,
}

/// Two jobs of different models started together.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct PairPoint {
    /// The two jobs.
    pub jobs: Vec<PairJob>,
    /// Why the point has no measurement.
    pub error: Option<String>,
}

/// `checkpoint.json`.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct CheckpointFile {
    /// Provenance.
    pub header: Header,
    /// `--cpus` of the jobs (`--threads 1`).
    pub cpus: f64,
    /// Medians per model and size.
    pub summary: Vec<CheckpointSummary>,
    /// Every cycle.
    pub samples: Vec<CheckpointSample>,
}

/// One save/restore cycle: start fresh, train, `docker stop`, start again on the checkpoint.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct CheckpointSample {
    /// `--model`.
    pub model: String,
    /// `--size`.
    pub size: u32,
    /// Repetition, from 0.
    pub rep: usize,
    /// Step the checkpoint holds.
    pub saved_step: Option<u64>,
    /// `checkpoint_bytes` of the `saved` progress line.
    pub checkpoint_bytes: Option<u64>,
    /// Size of the checkpoint file on disk.
    pub file_bytes: Option<u64>,
    /// Wall seconds `docker stop` took (SIGTERM → step finished → saved → exit → container
    /// stopped): what a migration waits for before it can restore.
    pub stop_s: Option<f64>,
    /// `docker stop` issued → the daemon read the `saved` line.
    pub saved_line_s: Option<f64>,
    /// The trainer's exit status (0 = saved and exited as the contract says).
    pub exit_code: Option<i64>,
    /// `docker run` of the next incarnation → the daemon read its first progress line (the
    /// `restored` line, held-out loss included).
    pub restore_s: Option<f64>,
    /// Step of the restored line (must equal `saved_step`).
    pub restored_step: Option<u64>,
    /// Why the cycle is incomplete.
    pub error: Option<String>,
}

/// Medians of a model and size's cycles.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct CheckpointSummary {
    /// `--model`.
    pub model: String,
    /// `--size`.
    pub size: u32,
    /// Cycles with a measurement.
    pub n: usize,
    /// Median checkpoint size, bytes.
    pub checkpoint_bytes: Option<u64>,
    /// Median `stop_s`.
    pub stop_s: Option<f64>,
    /// Median `saved_line_s`.
    pub saved_line_s: Option<f64>,
    /// Median `restore_s`.
    pub restore_s: Option<f64>,
}

/// `start.json`.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct StartFile {
    /// Provenance.
    pub header: Header,
    /// `--cpus` of the jobs (`--threads 1`).
    pub cpus: f64,
    /// Medians per model and size.
    pub summary: Vec<StartSummary>,
    /// Every start.
    pub samples: Vec<StartSample>,
}

/// One fresh start (empty checkpoint directory).
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct StartSample {
    /// `--model`.
    pub model: String,
    /// `--size`.
    pub size: u32,
    /// Repetition, from 0.
    pub rep: usize,
    /// `docker run -d` issued → returned (container created and started).
    pub docker_run_s: Option<f64>,
    /// `docker run -d` issued → the daemon read the first progress line (step 0: data loaded,
    /// model built, initial held-out loss evaluated).
    pub start_s: Option<f64>,
    /// Why the start was not measured.
    pub error: Option<String>,
}

/// Medians of a model and size's starts.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct StartSummary {
    /// `--model`.
    pub model: String,
    /// `--size`.
    pub size: u32,
    /// Starts with a measurement.
    pub n: usize,
    /// Median `docker_run_s`.
    pub docker_run_s: Option<f64>,
    /// Median `start_s`.
    pub start_s: Option<f64>,
}

/// `curves.json`.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct CurvesFile {
    /// Provenance.
    pub header: Header,
    /// For each model, the size whose curve `curves.md` carries (its size in the testbed's
    /// experiments).
    pub curves_md_sizes: BTreeMap<String, u32>,
    /// One `calibrate` run per size.
    pub runs: Vec<CurveRun>,
}

/// One `converge-trainer calibrate` run (one thread per model, in a container with `--cpus 1`).
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct CurveRun {
    /// `--size`.
    pub size: u32,
    /// `--models`.
    pub models: Vec<String>,
    /// `--steps-scale`.
    pub steps_scale: f64,
    /// The command's stdout, verbatim (two markdown tables).
    pub markdown: String,
    /// Both tables, joined per model.
    pub rows: Vec<CurveRow>,
    /// Why the run has no rows.
    pub error: Option<String>,
}

/// One model's calibration row and curve.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct CurveRow {
    /// Model name.
    pub model: String,
    /// The first table's cells by column header (numbers where they parse, else strings).
    pub columns: BTreeMap<String, serde_json::Value>,
    /// `(fraction of the run, held-out loss)` from the second table, `n/a` cells skipped.
    pub points: Vec<(f64, f64)>,
}

// ---------------------------------------------------------------------------------------------
// What the simulator takes from the files.

/// The measured files of one directory, loaded (`step_time.json`, `colocation.json`,
/// `checkpoint.json`, `start.json`, `curves.json`, `pairs.json`, `host.json`,
/// `colocation_busy.json`, `pairs_busy.json`; each may be missing, and a question whose file
/// is missing gets an error naming it).
#[derive(Debug, Clone, Default)]
pub struct Measured {
    /// Where the files were read.
    pub dir: std::path::PathBuf,
    /// `step_time.json`.
    pub step_time: Option<StepTimeFile>,
    /// `colocation.json`.
    pub colocation: Option<ColocationFile>,
    /// `checkpoint.json`.
    pub checkpoint: Option<CheckpointFile>,
    /// `start.json`.
    pub start: Option<StartFile>,
    /// `curves.json`.
    pub curves: Option<CurvesFile>,
    /// `pairs.json`.
    pub pairs: Option<PairsFile>,
    /// `host.json`.
    pub host: Option<HostFile>,
    /// `colocation_busy.json`: the co-location table with the machine's other CPUs busy.
    pub colocation_busy: Option<ColocationFile>,
    /// `pairs_busy.json`: the pairs with the machine's other CPUs busy.
    pub pairs_busy: Option<PairsFile>,
    /// `host_pairs.json`: two models, each in a one-core container of its own, on the
    /// machine's CPUs at once (two of the testbed's workers, each busy with one job).
    pub host_pairs: Option<PairsFile>,
    /// Step-time factors by (model, size) from probes taken beside live runs
    /// ([`Measured::at_speed_of`]); empty when the table's step times stand as measured.
    pub speed: BTreeMap<(String, u32), f64>,
}

/// One model's step time alone at `--cpus 1 --threads 1`, taken beside a live run
/// (`cargo xtask experiment` probes every model of its trace before each run, the way the
/// step-time table measures a cell). This machine's speed drifts between sessions and within
/// one by more than the simulator's error goal (sim/README.md, "Speed drift"), so a step time
/// measured hours before the runs is not the one they had.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Probe {
    /// `--model`.
    pub model: String,
    /// `--size`.
    pub size: u32,
    /// Training seconds per step over the probe's window.
    pub s_per_step: f64,
}

/// What one job (model, size, threads) costs on the measured machine, in the simulator's
/// units.
#[derive(Debug, Clone, PartialEq)]
pub struct JobCost {
    /// Training seconds per step with a quota of one core (the simulator's reference
    /// core-seconds per step).
    pub s_per_step: f64,
    /// The most cores it can use: its step rate with the whole machine over its rate with one
    /// core (`--threads 1` measures ~1).
    pub max_cores: f64,
    /// What sharing a worker costs such jobs.
    pub sharing: Sharing,
    /// `docker run` → first progress line, seconds.
    pub start_s: f64,
    /// `docker stop` → exited with its checkpoint written, seconds.
    pub save_s: f64,
    /// What its `saved` line said the checkpoint took, bytes (the nearest measured model's).
    pub checkpoint_bytes: Option<u64>,
    /// `docker run` on a checkpoint → first (restored) progress line, seconds.
    pub restore_s: f64,
    /// Held-out loss by step: `(step, loss)` from the trainer's `calibrate` run.
    pub curve: Vec<(f64, f64)>,
    /// The relative scatter of that loss between reports (`calibrate`'s `loss noise`), when
    /// measured.
    pub noise: Option<f64>,
}

impl Measured {
    /// Loads every file present in `dir`; a file that is there but does not parse is an error.
    pub fn load(dir: &Path) -> Result<Self> {
        fn read<T: for<'de> Deserialize<'de>>(dir: &Path, name: &str) -> Result<Option<T>> {
            let path = dir.join(name);
            let text = match std::fs::read_to_string(&path) {
                Ok(t) => t,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(source) => return Err(Error::Read { path, source }),
            };
            serde_json::from_str(&text)
                .map(Some)
                .map_err(|source| Error::Parse { path, source })
        }
        Ok(Measured {
            dir: dir.to_path_buf(),
            step_time: read(dir, "step_time.json")?,
            colocation: read(dir, "colocation.json")?,
            checkpoint: read(dir, "checkpoint.json")?,
            start: read(dir, "start.json")?,
            curves: read(dir, "curves.json")?,
            pairs: read(dir, "pairs.json")?,
            host: read(dir, "host.json")?,
            colocation_busy: read(dir, "colocation_busy.json")?,
            pairs_busy: read(dir, "pairs_busy.json")?,
            host_pairs: read(dir, "host_pairs.json")?,
            speed: BTreeMap::new(),
        })
    }

    /// The same measurements at the speed the probes saw: each probed (model, size) has every
    /// step time scaled by the median of its probes over the table's one-core, one-thread step
    /// time. What was measured relative to that point (more cores, more threads, co-location)
    /// keeps its ratio; save, restore and start times are left as measured. A probe of a model
    /// the table lacks is an error naming it.
    pub fn at_speed_of(mut self, probes: &[Probe]) -> Result<Self> {
        let mut by_pair: BTreeMap<(String, u32), Vec<f64>> = BTreeMap::new();
        for p in probes {
            by_pair
                .entry((p.model.clone(), p.size))
                .or_default()
                .push(p.s_per_step);
        }
        self.speed.clear();
        for ((model, size), seen) in by_pair {
            let table = self
                .step_time
                .as_ref()
                .and_then(|f| {
                    f.points.iter().find(|p| {
                        p.model == model && p.size == size && p.threads == 1 && p.cpus == 1.0
                    })
                })
                .and_then(|p| p.rate.as_ref())
                .ok_or_else(|| self.missing("step time at --cpus 1 --threads 1", &model, size))?
                .s_per_step;
            let probed = median(seen).unwrap_or(table);
            self.speed.insert((model, size), probed / table);
        }
        Ok(self)
    }

    /// How many repetitions the sharing tables were measured in: the most any co-location
    /// point, pair or host point holds (1 where none was repeated).
    pub fn repetitions(&self) -> usize {
        // The walk over the tables is `factors_mut`'s, on a copy: one list of what is
        // repeated serves both (this is read once per report).
        let mut m = self.clone();
        m.factors_mut()
            .map(|(_, r)| r.len())
            .max()
            .unwrap_or(0)
            .max(1)
    }

    /// The same measurements with each sharing factor (co-location points and pairs, measured
    /// with the host idle and busy, and the busy workers of the host table) taken from
    /// repetition `k` alone, where it was repeated, instead of the median of the repetitions:
    /// how far the simulator's answer moves with the scatter of the tables it reads. Points
    /// without a `k`-th repetition, or whose `k`-th failed, keep their median.
    pub fn at_repetition(&self, k: usize) -> Self {
        let mut m = self.clone();
        for (factor, repeats) in m.factors_mut() {
            if let Some(&Some(r)) = repeats.get(k) {
                *factor = Some(r);
            }
        }
        m
    }

    /// Every repeated sharing factor (co-location points, pairs and host points, with the
    /// host idle and busy) beside its repetitions.
    fn factors_mut(&mut self) -> impl Iterator<Item = (&mut Option<f64>, &[Option<f64>])> {
        let coloc = [&mut self.colocation, &mut self.colocation_busy]
            .into_iter()
            .flatten()
            .flat_map(|f| &mut f.points)
            .map(|p| (&mut p.relative, p.repeats.as_slice()));
        let pairs = [&mut self.pairs, &mut self.pairs_busy, &mut self.host_pairs]
            .into_iter()
            .flatten()
            .flat_map(|f| &mut f.pairs)
            .flat_map(|p| &mut p.jobs)
            .map(|j| (&mut j.efficiency, j.repeats.as_slice()));
        let host = (self.host.iter_mut())
            .flat_map(|f| &mut f.points)
            .map(|p| (&mut p.relative, p.repeats.as_slice()));
        coloc.chain(pairs).chain(host)
    }

    /// The provenance of each sharing table present (co-location, pairs and host, with the
    /// host idle and busy): what the engine's factors come from.
    pub fn sharing_headers(&self) -> impl Iterator<Item = &Header> {
        [
            self.colocation.as_ref().map(|f| &f.header),
            self.colocation_busy.as_ref().map(|f| &f.header),
            self.pairs.as_ref().map(|f| &f.header),
            self.pairs_busy.as_ref().map(|f| &f.header),
            self.host.as_ref().map(|f| &f.header),
            self.host_pairs.as_ref().map(|f| &f.header),
        ]
        .into_iter()
        .flatten()
    }

    /// Whether any file is a `--quick` smoke run (its numbers are not data).
    pub fn quick(&self) -> bool {
        let others = [
            self.step_time.as_ref().map(|f| &f.header),
            self.checkpoint.as_ref().map(|f| &f.header),
            self.start.as_ref().map(|f| &f.header),
            self.curves.as_ref().map(|f| &f.header),
        ];
        others
            .into_iter()
            .flatten()
            .chain(self.sharing_headers())
            .any(|h| h.quick)
    }

    /// The directory as reports show it: its last two components (`sim/measured`), so a
    /// generated file does not carry the path of the machine it was made on.
    fn shown_dir(&self) -> String {
        let parts: Vec<String> = self
            .dir
            .components()
            .rev()
            .take(2)
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        parts.into_iter().rev().collect::<Vec<_>>().join("/")
    }

    fn missing(&self, what: &str, model: &str, size: u32) -> Error {
        Error::Invalid(format!(
            "{}: no measurement of {what} for {model} size {size}; run `cargo xtask measure` \
             with this model and size in a trace under experiments/",
            self.dir.display()
        ))
    }

    /// What a job of `model` at `size` with `threads` costs (see [`JobCost`]). Step time is
    /// required; co-location factors default to none (1.0) where not measured, and start,
    /// save and restore times to those of the model's other sizes, then to the median of all.
    pub fn cost(&self, model: &str, size: u32, threads: u32) -> Result<JobCost> {
        let steps = self
            .step_time
            .as_ref()
            .ok_or_else(|| self.missing("step time (step_time.json)", model, size))?;
        let rate_at = |cpus: f64| {
            steps
                .points
                .iter()
                .filter(|p| p.model == model && p.size == size && p.threads == threads)
                .filter(|p| (p.cpus - cpus).abs() < 1e-9)
                .find_map(|p| p.rate.as_ref())
        };
        let one = rate_at(1.0).ok_or_else(|| {
            self.missing(
                &format!("step time at --cpus 1 --threads {threads}"),
                model,
                size,
            )
        })?;
        let most = steps
            .points
            .iter()
            .filter(|p| p.model == model && p.size == size && p.threads == threads)
            .map(|p| p.cpus)
            .fold(1.0, f64::max);
        let max_cores = rate_at(most)
            .map_or(1.0, |r| one.s_per_step / r.s_per_step)
            .max(1.0);
        let pick = |per: Vec<(&str, u32, f64)>| -> Option<f64> {
            let exact = per
                .iter()
                .find(|p| p.0 == model && p.1 == size)
                .map(|p| p.2);
            let same_model: Vec<f64> = per.iter().filter(|p| p.0 == model).map(|p| p.2).collect();
            let all: Vec<f64> = per.iter().map(|p| p.2).collect();
            exact.or_else(|| median(same_model)).or_else(|| median(all))
        };
        let start_s = self
            .start
            .as_ref()
            .and_then(|f| {
                pick(
                    f.summary
                        .iter()
                        .filter_map(|s| Some((s.model.as_str(), s.size, s.start_s?)))
                        .collect(),
                )
            })
            .ok_or_else(|| self.missing("start time (start.json)", model, size))?;
        let (save_s, restore_s) = self
            .checkpoint
            .as_ref()
            .and_then(|f| {
                let save = pick(
                    f.summary
                        .iter()
                        .filter_map(|s| Some((s.model.as_str(), s.size, s.stop_s?)))
                        .collect(),
                )?;
                let restore = pick(
                    f.summary
                        .iter()
                        .filter_map(|s| Some((s.model.as_str(), s.size, s.restore_s?)))
                        .collect(),
                )?;
                Some((save, restore))
            })
            .ok_or_else(|| self.missing("save/restore time (checkpoint.json)", model, size))?;
        let checkpoint_bytes = self.checkpoint.as_ref().and_then(|f| {
            pick(
                f.summary
                    .iter()
                    .filter_map(|s| Some((s.model.as_str(), s.size, s.checkpoint_bytes? as f64)))
                    .collect(),
            )
            .map(|b| b.round() as u64)
        });
        let speed = self
            .speed
            .get(&(model.to_string(), size))
            .copied()
            .unwrap_or(1.0);
        Ok(JobCost {
            s_per_step: one.s_per_step * speed,
            max_cores,
            sharing: self.sharing(model, size, threads),
            start_s,
            save_s,
            checkpoint_bytes,
            restore_s,
            curve: self.curve(model, size)?,
            noise: self.noise(model, size),
        })
    }

    /// What sharing a worker costs `model` at `size` with `threads`: the co-location and
    /// pairs tables, the host's, and the first two again as measured with the host's other
    /// CPUs busy where they were (`--busy-host`; what that table lacks, the idle one gives).
    fn sharing(&self, model: &str, size: u32, threads: u32) -> Sharing {
        let idle = Sharing {
            free: factors(self.colocation.as_ref(), model, size, threads, "free"),
            split: factors(self.colocation.as_ref(), model, size, threads, "split"),
            beside: beside(self.pairs.as_ref(), model, size),
            host: self.host(model, size),
            host_beside: beside(self.host_pairs.as_ref(), model, size),
            busy_host: None,
        };
        let busy_host = (self.colocation_busy.is_some() || self.pairs_busy.is_some()).then(|| {
            // A table with no more than its one-job entry measured nothing of sharing.
            let or_idle = |v: Vec<f64>, idle: &[f64]| if v.len() < 2 { idle.to_vec() } else { v };
            let c = self.colocation_busy.as_ref();
            let mut beside = idle.beside.clone();
            beside.extend(self::beside(self.pairs_busy.as_ref(), model, size));
            Box::new(Sharing {
                free: or_idle(factors(c, model, size, threads, "free"), &idle.free),
                split: or_idle(factors(c, model, size, threads, "split"), &idle.split),
                beside,
                host: Vec::new(),
                host_beside: BTreeMap::new(),
                busy_host: None,
            })
        });
        Sharing { busy_host, ..idle }
    }

    /// What `model` at `size` gets done while 1, 2, ... one-core workers of the testbed's host
    /// are busy (`host.json`, index n − 1): its own model's points where measured (at the size
    /// it borrows, [`borrowed_size`]), else the median over the measured models; empty (no
    /// cost) without the file. Consecutive from one job only, as the co-location factors are.
    fn host(&self, model: &str, size: u32) -> Vec<f64> {
        let Some(f) = &self.host else {
            return Vec::new();
        };
        let most = f.points.iter().map(|p| p.jobs).max().unwrap_or(0);
        // Its model's point at the size it borrows ([`borrowed_size`]), else the median over
        // the models.
        let measured = borrowed_size(
            f.points.iter().filter(|p| p.model == model).map(|p| p.size),
            size,
        );
        let own = |n: usize| {
            (f.points.iter())
                .filter(|p| p.model == model && Some(p.size) == measured && p.jobs == n)
                .find_map(|p| p.relative)
        };
        let all = |n: usize| {
            median(
                f.points
                    .iter()
                    .filter(|p| p.jobs == n)
                    .filter_map(|p| p.relative),
            )
        };
        (1..=most)
            .map_while(|n| own(n).or_else(|| all(n)))
            .collect()
    }

    /// The `calibrate` row of `model` at `size`.
    fn curve_row(&self, model: &str, size: u32) -> Option<&CurveRow> {
        self.curves.as_ref().and_then(|f| {
            f.runs
                .iter()
                .filter(|r| r.size == size)
                .flat_map(|r| &r.rows)
                .find(|r| r.model == model)
        })
    }

    /// The relative scatter of `model`'s held-out loss between reports at `size`
    /// (`calibrate`'s `loss noise` column); `None` in files measured before it was.
    pub fn noise(&self, model: &str, size: u32) -> Option<f64> {
        self.curve_row(model, size)?
            .columns
            .get("loss noise")?
            .as_f64()
    }

    /// The held-out loss of `model` at `size` by step, from its `calibrate` run.
    pub fn curve(&self, model: &str, size: u32) -> Result<Vec<(f64, f64)>> {
        let row = self
            .curve_row(model, size)
            .ok_or_else(|| self.missing("a loss curve (curves.json)", model, size))?;
        let steps = row
            .columns
            .get("steps")
            .and_then(serde_json::Value::as_f64)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "{}: curves.json row {model} size {size} has no `steps` column",
                    self.dir.display()
                ))
            })?;
        Ok(row.points.iter().map(|&(f, v)| (f * steps, v)).collect())
    }
}

impl Measured {
    /// The cost of sharing a worker for jobs we cannot run (the papers' models), from what
    /// our trainer pays with `--threads 1`: per number of co-located jobs, the median over the
    /// measured models; `None` without such co-location points. Not `--threads 0`: a pool sized
    /// to the machine costs far more under free competition (sim/README.md), but the papers
    /// do not say how their frameworks' pools were sized, and charging the papers' baselines
    /// that cost would hand FlowCon's quotas a gain we cannot check.
    pub fn contention(&self) -> Option<crate::curve::Contention> {
        let c = self.colocation.as_ref()?;
        let table = |mode: &str| -> Vec<f64> {
            let most = c.points.iter().map(|p| p.jobs).max().unwrap_or(0);
            (1..=most)
                .map_while(|n| {
                    let at: Vec<f64> = c
                        .points
                        .iter()
                        .filter(|p| p.threads == 1 && p.jobs == n)
                        .filter(|p| p.mode == mode || n == 1)
                        .filter_map(|p| p.relative)
                        .collect();
                    median(at)
                })
                .collect()
        };
        let free = table("free");
        if free.is_empty() {
            return None;
        }
        Some(crate::curve::Contention {
            sharing: Sharing {
                free,
                split: table("split"),
                // The papers' workers are machines of their own.
                beside: BTreeMap::new(),
                host: Vec::new(),
                host_beside: BTreeMap::new(),
                busy_host: None,
            },
            source: format!(
                "co-location of `--threads 1` jobs, median over models, `{}/colocation.json`, {}",
                self.shown_dir(),
                c.header.date
            ),
        })
    }
}

/// The co-location factors of `model` at `size` with `threads` in `file`, under `mode`
/// (`free` or `split`), for 1, 2, ... jobs (index n − 1); empty where not measured.
/// Co-location was measured at each model's size in the traces' first use; another size of
/// the same model borrows those factors ([`borrowed_size`]).
fn factors(
    file: Option<&ColocationFile>,
    model: &str,
    size: u32,
    threads: u32,
    mode: &str,
) -> Vec<f64> {
    let Some(c) = file else {
        return Vec::new();
    };
    let Some(size) = borrowed_size(
        (c.points.iter())
            .filter(|p| p.model == model && p.threads == threads)
            .map(|p| p.size),
        size,
    ) else {
        return Vec::new();
    };
    let mut pts: Vec<(usize, f64)> = c
        .points
        .iter()
        .filter(|p| p.model == model && p.size == size && p.threads == threads)
        .filter(|p| p.mode == mode || p.jobs == 1)
        .filter_map(|p| Some((p.jobs, p.relative?)))
        .collect();
    pts.sort_by_key(|p| p.0);
    pts.dedup_by_key(|p| p.0);
    // Consecutive from one job only: a gap would misplace every later factor.
    pts.iter()
        .enumerate()
        .take_while(|(i, p)| p.0 == i + 1)
        .map(|(_, p)| p.1)
        .collect()
}

/// What `model` at `size` was measured to get done per CPU-second beside each other model
/// (`file`, a pairs table), by the other's [`model_key`]. A size the table did not measure
/// borrows its model's nearest measured size, as the co-location and host tables do: the
/// pairs are measured at one size per model, and the traces run others.
fn beside(file: Option<&PairsFile>, model: &str, size: u32) -> BTreeMap<String, f64> {
    let jobs = || {
        file.iter()
            .flat_map(|f| &f.pairs)
            .filter_map(|p| match p.jobs.as_slice() {
                [a, b] => Some([(a, b), (b, a)]),
                _ => None,
            })
            .flatten()
            .filter(move |(me, _)| me.model == model)
    };
    let Some(measured) = borrowed_size(jobs().map(|(me, _)| me.size), size) else {
        return BTreeMap::new();
    };
    jobs()
        .filter(|(me, _)| me.size == measured)
        .filter_map(|(me, other)| Some((model_key(&other.model, other.size), me.efficiency?)))
        .collect()
}

/// The factor `table` holds beside `other` ([`model_key`]): its own entry, else the entry of
/// the same model at its nearest measured size, as [`beside`] borrows (the tables measure one
/// size per model).
fn beside_in(table: &BTreeMap<String, f64>, other: &str) -> Option<f64> {
    if let Some(&v) = table.get(other) {
        return Some(v);
    }
    let (model, size) = other.rsplit_once('/')?;
    let size: u32 = size.parse().ok()?;
    let of_model = || {
        table.iter().filter_map(move |(k, &v)| {
            let (m, s) = k.rsplit_once('/')?;
            (m == model).then_some((s.parse::<u32>().ok()?, v))
        })
    };
    let measured = borrowed_size(of_model().map(|(s, _)| s), size)?;
    of_model().find(|&(s, _)| s == measured).map(|(_, v)| v)
}

/// The size whose measurements a job of `size` reads, of the sizes measured for its model: its
/// own, else the nearest (the smaller of two as near). Every sharing table is measured at one
/// size per model, in the traces' first use, and the traces run others; this is the one rule
/// the co-location, host and pairs tables borrow by.
fn borrowed_size(measured: impl IntoIterator<Item = u32>, size: u32) -> Option<u32> {
    measured.into_iter().min_by_key(|&s| (s.abs_diff(size), s))
}

/// The median of the finite values (the mean of the middle two for an even count); `None`
/// when there is none. Shared by `xtask`'s measurements and reports.
pub fn median(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// What sharing a worker costs a job: the aggregate throughput of n co-located jobs over one
/// alone, for n = 1, 2, ... (index n − 1). Empty tables: no cost (a work-conserving CPU).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sharing {
    /// Under free competition.
    pub free: Vec<f64>,
    /// Under hard per-container quotas that split the worker (FlowCon's limits).
    pub split: Vec<f64>,
    /// Under free competition with exactly one job of another model, by that model's
    /// [`model_key`] (`pairs.json`): the cost of sharing depends on the pair of working sets.
    #[serde(default)]
    pub beside: BTreeMap<String, f64>,
    /// What a job gets done while n one-core workers of the testbed's host are busy, itself
    /// included, over alone (`host.json`, index n − 1): the testbed's workers share one
    /// machine. Empty (no cost) for workers that are machines of their own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host: Vec<f64>,
    /// What a job gets done while one other one-core worker of its host is busy with exactly
    /// one job of another model, by that model's [`model_key`] (`host_pairs.json`), over
    /// alone: [`Sharing::host`] measures two busy workers running one model, and what a
    /// busy neighbour costs depends on what it runs ([`Sharing::on_host_beside`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub host_beside: BTreeMap<String, f64>,
    /// `free`, `split` and `beside` as measured with the host's other CPUs busy
    /// (`colocation_busy.json`, `pairs_busy.json`): what they stand for while another worker
    /// of the host is busy ([`Sharing::on`]). `None` where not measured, or for workers that
    /// are machines of their own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy_host: Option<Box<Sharing>>,
}

/// How a measured (model, size) is named in [`Sharing::beside`].
pub fn model_key(model: &str, size: u32) -> String {
    format!("{model}/{size}")
}

impl Sharing {
    /// The factor beside exactly one other job, of model `other` ([`model_key`]): the
    /// measured pair where there is one, else [`Sharing::factor`]. Pairs were measured under
    /// free competition; the two working sets interleave on the core under quotas as well, so
    /// the pair's factor stands for both.
    pub fn beside(&self, other: &str, limited: bool) -> f64 {
        beside_in(&self.beside, other).unwrap_or_else(|| self.factor(limited, 2))
    }

    /// The factor for a job while `busy` workers of its host (its own included) have jobs
    /// running: 1 alone or where nothing was measured, the last measured factor beyond the
    /// table.
    pub fn on_host(&self, busy: usize) -> f64 {
        nth_factor(&self.host, busy)
    }

    /// [`Sharing::on_host`] given what the other busy workers run: `neighbours` holds each
    /// of their jobs' [`model_key`] with its weight (its share of its worker's time). The
    /// host table measured busy workers of the job's own model; each neighbour of another
    /// model measured in [`Sharing::host_beside`] scales that by its pair's factor over the
    /// factor for one neighbour of the job's own model (so two busy workers, one job each,
    /// pay exactly the pair's factor), weighted by its share. A neighbour not measured counts
    /// as one of the job's own model.
    pub fn on_host_beside(&self, busy: usize, neighbours: &[(&str, f64)]) -> f64 {
        let same = self.on_host(busy);
        let own = nth_factor(&self.host, 2);
        let total: f64 = neighbours.iter().map(|(_, w)| w).sum();
        if busy < 2 || self.host_beside.is_empty() || total <= 0.0 || own <= 0.0 {
            return same;
        }
        let relative = neighbours
            .iter()
            .map(|(other, w)| w * beside_in(&self.host_beside, other).unwrap_or(own) / own)
            .sum::<f64>()
            / total;
        same * relative
    }

    /// The tables that hold while `busy` workers of the host (the job's own included) have
    /// jobs running: those measured with the other CPUs busy once another worker is, where
    /// measured. On the testbed a job beside a busy worker pays the host's factor
    /// ([`Sharing::on_host`]) times these: both were measured against the job alone under the
    /// same host, so the product is what was measured with both.
    pub fn on(&self, busy: usize) -> &Sharing {
        match &self.busy_host {
            Some(b) if busy >= 2 => b,
            _ => self,
        }
    }

    /// What a job's rate is multiplied by while `busy` workers of its host (its own included)
    /// have jobs, on a worker whose jobs' threads number `load` per core: the host's factor
    /// given what the other busy workers run (`neighbours`, [`Sharing::on_host_beside`]; empty:
    /// the host table's) times its worker's, read from the tables that hold at `busy`
    /// ([`Sharing::on`]); beside exactly one job of a measured model `beside` ([`model_key`]),
    /// that pair's. The one place the factors compose: the engine charges it, and the reports
    /// show it.
    pub fn charged(
        &self,
        busy: usize,
        limited: bool,
        load: f64,
        beside: Option<&str>,
        neighbours: &[(&str, f64)],
    ) -> f64 {
        let tables = self.on(busy);
        self.on_host_beside(busy, neighbours)
            * match beside {
                Some(other) => tables.beside(other, limited),
                None => tables.factor_at(limited, load),
            }
    }

    /// The factor for a job sharing its worker with `n − 1` others, held below the worker by
    /// its quota (`limited`) or not: 1 alone or where nothing was measured, the last measured
    /// factor beyond the table.
    pub fn factor(&self, limited: bool, n: usize) -> f64 {
        self.factor_at(limited, n as f64)
    }

    /// The factor for a job on a worker whose jobs' threads number `load` per core: the
    /// tables were measured with n one-thread jobs on one core, so n threads per core read
    /// as n jobs there, and a load between two whole numbers reads between their factors
    /// (linearly; 1 at a thread per core or fewer). At a whole number it is
    /// [`Sharing::factor`]'s, so a worker of one core and one-thread jobs (the testbed's)
    /// pays exactly what its job count does.
    pub fn factor_at(&self, limited: bool, load: f64) -> f64 {
        let table = if limited { &self.split } else { &self.free };
        if load <= 1.0 || table.is_empty() {
            return 1.0;
        }
        let whole = load.floor();
        let n = whole as usize;
        let below = nth_factor(table, n);
        if load == whole {
            return below;
        }
        below + (nth_factor(table, n + 1) - below) * (load - whole)
    }
}

/// A factor table's entry for `n` (index n − 1): 1 for one or where nothing was measured, the
/// last measured entry beyond the table.
fn nth_factor(table: &[f64], n: usize) -> f64 {
    if n <= 1 || table.is_empty() {
        return 1.0;
    }
    table[(n - 1).min(table.len() - 1)]
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            command: "test".into(),
            date: "2026-11-24T00:00:00Z".into(),
            quick: false,
            machine: Machine {
                nproc: 2,
                cgroup: "v2".into(),
                cpu_model: "test".into(),
                kernel: "test".into(),
                docker: "test".into(),
                loadavg_start: String::new(),
                loadavg_end: String::new(),
            },
            image: "sha256:test".into(),
            settings: Settings {
                window_s: 6.0,
                warmup_s: 2.0,
                report_every: 25,
                reps: 3,
                budget: 1.0,
            },
        }
    }

    fn rate(s_per_step: f64) -> Rate {
        Rate {
            s_per_step,
            steps_per_s: 1.0 / s_per_step,
            steps: 1000,
            window_s: 6.0,
            intervals: 40,
            cpu_s_per_step: None,
            cores: None,
        }
    }

    pub(crate) fn step(model: &str, size: u32, cpus: f64, threads: u32, s: f64) -> StepPoint {
        StepPoint {
            model: model.into(),
            size,
            cpus,
            threads,
            rate: Some(rate(s)),
            error: None,
        }
    }

    fn coloc(mode: &str, jobs: usize, relative: Option<f64>) -> ColocationPoint {
        ColocationPoint {
            model: "mlp".into(),
            size: 12,
            threads: 1,
            mode: mode.into(),
            jobs,
            per_job_cpus: None,
            rates: Vec::new(),
            aggregate_steps_per_s: None,
            relative,
            repeats: Vec::new(),
            cores_total: None,
            error: None,
        }
    }

    /// One job of a pair, measured once.
    pub(crate) fn pair_job(model: &str, size: u32, efficiency: Option<f64>) -> PairJob {
        PairJob {
            model: model.into(),
            size,
            rate: None,
            efficiency,
            repeats: Vec::new(),
        }
    }

    /// A pairs table of these pairs, measured with the machine's other CPUs idle.
    pub(crate) fn pairs_file(pairs: Vec<[PairJob; 2]>) -> PairsFile {
        PairsFile {
            header: header(),
            budget: 1.0,
            neighbors: 0,
            alone: Vec::new(),
            pairs: pairs
                .into_iter()
                .map(|jobs| PairPoint {
                    jobs: jobs.into(),
                    error: None,
                })
                .collect(),
        }
    }

    /// A machine where `mlp` size 12 costs 8 ms a step on one core and two co-located jobs
    /// lose 10% of their aggregate throughput.
    pub(crate) fn measured() -> Measured {
        Measured {
            dir: "test".into(),
            step_time: Some(StepTimeFile {
                header: header(),
                points: vec![
                    step("mlp", 12, 0.5, 1, 0.02),
                    step("mlp", 12, 1.0, 1, 0.008),
                    step("mlp", 12, 2.0, 1, 0.0078),
                    step("mlp", 12, 1.0, 0, 0.009),
                ],
            }),
            colocation: Some(ColocationFile {
                header: header(),
                budget: 1.0,
                neighbors: 0,
                points: vec![
                    coloc("free", 1, Some(1.0)),
                    coloc("free", 2, Some(0.9)),
                    coloc("free", 4, Some(0.7)),
                    coloc("split", 2, Some(0.95)),
                    coloc("split", 3, Some(0.93)),
                ],
            }),
            checkpoint: Some(CheckpointFile {
                header: header(),
                cpus: 1.0,
                summary: vec![CheckpointSummary {
                    model: "mlp".into(),
                    size: 8,
                    n: 3,
                    checkpoint_bytes: Some(1000),
                    stop_s: Some(0.3),
                    saved_line_s: Some(0.1),
                    restore_s: Some(0.6),
                }],
                samples: Vec::new(),
            }),
            start: Some(StartFile {
                header: header(),
                cpus: 1.0,
                summary: vec![StartSummary {
                    model: "cnn".into(),
                    size: 6,
                    n: 3,
                    docker_run_s: Some(0.2),
                    start_s: Some(0.5),
                }],
                samples: Vec::new(),
            }),
            curves: Some(CurvesFile {
                header: header(),
                curves_md_sizes: BTreeMap::new(),
                runs: vec![CurveRun {
                    size: 12,
                    models: vec!["mlp".into()],
                    steps_scale: 1.0,
                    markdown: String::new(),
                    rows: vec![CurveRow {
                        model: "mlp".into(),
                        columns: BTreeMap::from([("steps".into(), serde_json::json!(2000))]),
                        points: vec![(0.0, 2.3), (0.5, 0.4), (1.0, 0.3)],
                    }],
                    error: None,
                }],
            }),
            pairs: None,
            host: None,
            colocation_busy: None,
            pairs_busy: None,
            host_pairs: None,
            speed: BTreeMap::new(),
        }
    }

    #[test]
    fn probes_beside_live_runs_set_the_step_time_and_keep_the_measured_ratios() {
        let probe = |s| Probe {
            model: "mlp".into(),
            size: 12,
            s_per_step: s,
        };
        // The median of three probes (6 ms) over the table's 8 ms: every step time of the
        // model, any thread count, runs at 3/4 of the table's.
        let m = measured()
            .at_speed_of(&[probe(0.007), probe(0.006), probe(0.005)])
            .unwrap();
        let c = m.cost("mlp", 12, 1).unwrap();
        assert!((c.s_per_step - 0.006).abs() < 1e-12);
        assert!((c.max_cores - 0.008 / 0.0078).abs() < 1e-12);
        assert!((m.cost("mlp", 12, 0).unwrap().s_per_step - 0.009 * 0.75).abs() < 1e-12);
        assert_eq!(c.sharing, measured().cost("mlp", 12, 1).unwrap().sharing);
        // A probe of something the table never measured is refused, naming it.
        let e = measured()
            .at_speed_of(&[Probe {
                model: "gru".into(),
                size: 2,
                s_per_step: 0.01,
            }])
            .unwrap_err()
            .to_string();
        assert!(e.contains("gru size 2"), "{e}");
    }

    #[test]
    fn a_jobs_cost_comes_from_its_measurements() {
        let c = measured().cost("mlp", 12, 1).unwrap();
        // One core's step time is the reference cost; the whole machine barely helps a
        // one-thread job.
        assert_eq!(c.s_per_step, 0.008);
        assert!((c.max_cores - 0.008 / 0.0078).abs() < 1e-12);
        // Free factors stop at the first gap (3 jobs were not measured): 4 is not taken as 3.
        assert_eq!(c.sharing.free, vec![1.0, 0.9]);
        assert_eq!(c.sharing.split, vec![1.0, 0.95, 0.93]);
        // Save/restore of another size of the model, start of the only model measured.
        assert_eq!((c.save_s, c.restore_s, c.start_s), (0.3, 0.6, 0.5));
        // The curve by step: fraction × the calibrate run's steps.
        assert_eq!(c.curve, vec![(0.0, 2.3), (1000.0, 0.4), (2000.0, 0.3)]);
        // The thread count selects its own row.
        assert_eq!(measured().cost("mlp", 12, 0).unwrap().s_per_step, 0.009);
        // Another size of the model borrows its co-location factors.
        let mut m = measured();
        if let Some(f) = &mut m.step_time {
            f.points.push(step("mlp", 8, 1.0, 1, 0.004));
        }
        if let Some(f) = &mut m.curves {
            f.runs[0].rows[0].model = "other".into();
        }
        assert!(m.cost("mlp", 8, 1).is_err(), "no curve for size 8");
        if let Some(f) = &mut m.curves {
            f.runs[0].size = 8;
            f.runs[0].rows[0].model = "mlp".into();
        }
        assert_eq!(m.cost("mlp", 8, 1).unwrap().sharing.free, vec![1.0, 0.9]);
    }

    #[test]
    fn what_was_not_measured_is_an_error_naming_the_command() {
        let e = measured().cost("gru", 2, 1).unwrap_err().to_string();
        assert!(
            e.contains("gru size 2") && e.contains("cargo xtask measure"),
            "{e}"
        );
        let mut m = measured();
        m.start = None;
        let e = m.cost("mlp", 12, 1).unwrap_err().to_string();
        assert!(e.contains("start.json"), "{e}");
    }

    #[test]
    fn the_papers_models_pay_the_median_one_thread_factor_and_reports_name_no_machine_path() {
        let mut m = measured();
        m.dir = "/home/someone/converge/sim/measured".into();
        let c = m.contention().unwrap();
        assert_eq!(
            c.sharing.free,
            vec![1.0, 0.9],
            "stops at the first unmeasured count"
        );
        assert_eq!(c.sharing.split, vec![1.0, 0.95, 0.93]);
        assert!(
            c.source.contains("`sim/measured/colocation.json`"),
            "{}",
            c.source
        );
        assert!(!c.source.contains("/home/someone"), "{}", c.source);
    }

    #[test]
    fn a_job_beside_another_model_pays_that_pairs_factor() {
        let job = pair_job;
        let mut m = measured();
        let mut file = pairs_file(vec![
            [job("mlp", 12, Some(0.8)), job("gru", 2, Some(0.9))],
            [job("cnn", 6, Some(0.95)), job("mlp", 12, None)],
        ]);
        file.pairs[1].error = Some("exited".into());
        m.pairs = Some(file);
        // The mlp's own efficiency beside the gru; nothing beside the cnn (not measured).
        let c = m.cost("mlp", 12, 1).unwrap();
        assert_eq!(
            c.sharing.beside,
            BTreeMap::from([(model_key("gru", 2), 0.8)])
        );
        assert_eq!(c.sharing.beside("gru/2", false), 0.8);
        assert_eq!(c.sharing.beside("cnn/6", false), c.sharing.factor(false, 2));
    }

    #[test]
    fn a_busy_neighbour_costs_what_its_model_was_measured_to_cost() {
        let s = Sharing {
            host: vec![1.0, 0.8],
            host_beside: BTreeMap::from([(model_key("vae", 32), 0.96)]),
            ..Sharing::default()
        };
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        // Beside one job of a measured model, that pair's factor; of another, the host table's
        // (measured beside the job's own model).
        assert!(close(s.on_host_beside(2, &[("vae/32", 1.0)]), 0.96));
        assert!(close(s.on_host_beside(2, &[("gru/2", 1.0)]), 0.8));
        // A size not measured reads its model's.
        assert!(close(s.on_host_beside(2, &[("vae/24", 1.0)]), 0.96));
        // Weighted by each neighbour's share of its worker.
        assert!(close(
            s.on_host_beside(2, &[("vae/32", 0.5), ("gru/2", 0.5)]),
            0.8 * (0.5 * 0.96 / 0.8 + 0.5)
        ));
        // Alone on the host, or with nothing known of the neighbours: the host table.
        assert_eq!(s.on_host_beside(1, &[("vae/32", 1.0)]), 1.0);
        assert_eq!(s.on_host_beside(2, &[]), 0.8);
        assert_eq!(s.charged(2, false, 1.0, None, &[("vae/32", 1.0)]), 0.96);
    }

    #[test]
    fn a_size_the_pairs_did_not_measure_borrows_its_models_nearest() {
        let job = |model: &str, size, e| pair_job(model, size, Some(e));
        let file = pairs_file(vec![
            [job("mlp", 12, 0.9), job("vae", 32, 0.95)],
            [job("mlp", 4, 0.7), job("gru", 2, 0.97)],
        ]);
        // mlp 8 is as far from 4 as from 12: the smaller; mlp 10 reads 12's.
        assert_eq!(
            beside(Some(&file), "mlp", 8),
            BTreeMap::from([(model_key("gru", 2), 0.7)])
        );
        assert_eq!(
            beside(Some(&file), "mlp", 10),
            BTreeMap::from([(model_key("vae", 32), 0.9)])
        );
        assert!(beside(Some(&file), "cnn", 6).is_empty());
        let s = Sharing {
            free: vec![1.0, 0.8],
            beside: beside(Some(&file), "mlp", 12),
            ..Sharing::default()
        };
        // Beside a vae of another size, the vae's pair; beside a model not measured, the
        // co-location table's two jobs.
        assert_eq!(s.beside("vae/24", false), 0.9);
        assert_eq!(s.beside("cnn/6", false), 0.8);
    }

    /// One rule for every table: a job's own size where measured, else its model's nearest,
    /// the smaller of two as near.
    #[test]
    fn a_size_not_measured_borrows_its_models_nearest() {
        assert_eq!(borrowed_size([8, 12, 32], 12), Some(12));
        assert_eq!(borrowed_size([8, 12, 32], 20), Some(12));
        assert_eq!(borrowed_size([32, 8, 12], 10), Some(8));
        assert_eq!(borrowed_size([32, 8], 100), Some(32));
        assert_eq!(borrowed_size([], 12), None);
        // The co-location and host tables borrow by it, as the pairs do: a model measured at
        // two sizes lends a job of a third the nearest one's factors.
        let mut m = measured();
        let c = m.colocation.as_mut().unwrap();
        c.points = vec![
            coloc("free", 1, Some(1.0)),
            coloc("free", 2, Some(0.9)),
            ColocationPoint {
                size: 20,
                ..coloc("free", 1, Some(1.0))
            },
            ColocationPoint {
                size: 20,
                ..coloc("free", 2, Some(0.6))
            },
        ];
        m.step_time
            .as_mut()
            .unwrap()
            .points
            .push(step("mlp", 18, 1.0, 1, 0.008));
        let mut small = m.curves.as_ref().unwrap().runs[0].clone();
        small.size = 18;
        m.curves.as_mut().unwrap().runs.push(small);
        assert_eq!(m.cost("mlp", 18, 1).unwrap().sharing.factor(false, 2), 0.6);
        assert_eq!(m.cost("mlp", 12, 1).unwrap().sharing.factor(false, 2), 0.9);
        let host = |size, jobs, relative| HostPoint {
            model: "mlp".into(),
            size,
            jobs,
            rates: Vec::new(),
            relative: Some(relative),
            repeats: Vec::new(),
            error: None,
        };
        m.host = Some(HostFile {
            header: header(),
            points: vec![
                host(12, 1, 1.0),
                host(12, 2, 0.9),
                host(20, 1, 1.0),
                host(20, 2, 0.7),
            ],
        });
        assert_eq!(m.cost("mlp", 18, 1).unwrap().sharing.on_host(2), 0.7);
        assert_eq!(m.cost("mlp", 12, 1).unwrap().sharing.on_host(2), 0.9);
    }

    #[test]
    fn each_repetition_of_the_sharing_tables_is_read_alone() {
        let mut m = measured();
        let c = m.colocation.as_mut().unwrap();
        c.points = vec![
            coloc("free", 1, Some(1.0)),
            ColocationPoint {
                repeats: vec![Some(0.7), Some(0.9), Some(0.8)],
                ..coloc("free", 2, Some(0.8))
            },
        ];
        m.pairs = Some(pairs_file(vec![[
            PairJob {
                repeats: vec![Some(0.85), Some(0.95)],
                ..pair_job("mlp", 12, Some(0.85))
            },
            pair_job("gru", 2, Some(0.9)),
        ]]));
        let host = |jobs, relative, repeats| HostPoint {
            model: "mlp".into(),
            size: 12,
            jobs,
            rates: Vec::new(),
            relative: Some(relative),
            repeats,
            error: None,
        };
        m.host = Some(HostFile {
            header: header(),
            points: vec![
                host(1, 1.0, vec![Some(1.0); 4]),
                host(2, 0.9, vec![Some(0.95), Some(0.9), Some(0.85), Some(0.8)]),
            ],
        });
        // The most repetitions any factor holds.
        assert_eq!(m.repetitions(), 4);
        assert_eq!(Measured::default().repetitions(), 1);
        let factors = |m: &Measured| {
            let s = m.cost("mlp", 12, 1).unwrap().sharing;
            (s.factor(false, 2), s.beside("gru/2", false), s.on_host(2))
        };
        assert_eq!(factors(&m), (0.8, 0.85, 0.9), "the stored factors");
        assert_eq!(factors(&m.at_repetition(0)), (0.7, 0.85, 0.95));
        assert_eq!(factors(&m.at_repetition(1)), (0.9, 0.95, 0.9));
        // The pair was repeated twice and the co-location three times: past those, the
        // stored factor.
        assert_eq!(factors(&m.at_repetition(2)), (0.8, 0.85, 0.85));
        assert_eq!(factors(&m.at_repetition(3)), (0.8, 0.85, 0.8));

        // The tables measured with the host busy, and the pairs on two workers, alike.
        let repeated = |repeats: Vec<Option<f64>>| PairJob {
            repeats,
            ..pair_job("mlp", 12, Some(0.9))
        };
        m.colocation_busy = Some(ColocationFile {
            neighbors: 1,
            points: vec![
                coloc("free", 1, Some(1.0)),
                ColocationPoint {
                    repeats: vec![Some(0.6), Some(0.65)],
                    ..coloc("free", 2, Some(0.62))
                },
            ],
            ..m.colocation.clone().unwrap()
        });
        m.pairs_busy = Some(pairs_file(vec![[
            repeated(vec![Some(0.5), Some(0.55)]),
            pair_job("gru", 2, Some(0.9)),
        ]]));
        m.host_pairs = Some(pairs_file(vec![[
            repeated(vec![Some(0.7), Some(0.75)]),
            pair_job("gru", 2, Some(0.9)),
        ]]));
        let busy = |m: &Measured| {
            let s = m.cost("mlp", 12, 1).unwrap().sharing;
            (
                s.on(2).factor(false, 2),
                s.on(2).beside("gru/2", false),
                s.on_host_beside(2, &[("gru/2", 1.0)]),
            )
        };
        assert_eq!(busy(&m), (0.62, 0.9, 0.9));
        assert_eq!(busy(&m.at_repetition(0)), (0.6, 0.5, 0.7));
        assert_eq!(busy(&m.at_repetition(1)), (0.65, 0.55, 0.75));

        // A failed repetition is a hole, not a shift: the one after it keeps its place, and
        // where it failed the stored median holds.
        m.colocation.as_mut().unwrap().points[1].repeats = vec![Some(0.7), None, Some(0.75)];
        assert_eq!(factors(&m.at_repetition(1)).0, 0.8);
        assert_eq!(factors(&m.at_repetition(2)).0, 0.75);
    }

    #[test]
    fn beside_a_busy_worker_a_job_pays_the_busy_host_tables_where_measured() {
        let mut m = measured();
        let idle = m.colocation.clone().unwrap();
        // Measured with the other CPU busy: two free jobs cost nothing more; the split cells
        // were not measured, and stay the idle host's.
        m.colocation_busy = Some(ColocationFile {
            neighbors: 1,
            points: vec![coloc("free", 1, Some(1.0)), coloc("free", 2, Some(1.0))],
            ..idle
        });
        let c = m.cost("mlp", 12, 1).unwrap();
        let s = &c.sharing;
        assert_eq!(
            s.on(1).factor(false, 2),
            0.9,
            "its worker alone busy: idle host"
        );
        assert_eq!(
            s.on(2).factor(false, 2),
            1.0,
            "another worker busy: busy host"
        );
        assert_eq!(
            s.on(2).factor(true, 2),
            s.factor(true, 2),
            "split: not measured busy"
        );
        assert_eq!(
            m.cost("mlp", 12, 0).unwrap().sharing.on(2).factor(false, 2),
            m.cost("mlp", 12, 0).unwrap().sharing.factor(false, 2),
            "no busy cell for its threads: the idle host's"
        );
        assert_eq!(
            s.charged(1, false, 2.0, None, &[]),
            0.9,
            "what the engine charges"
        );
        assert_eq!(s.charged(2, false, 2.0, None, &[]), 1.0);
        m.colocation_busy = None;
        assert!(m.cost("mlp", 12, 1).unwrap().sharing.busy_host.is_none());
    }

    #[test]
    fn a_size_not_measured_on_the_host_borrows_its_models_then_the_median() {
        let mut m = measured();
        let point = |model: &str, jobs, relative| HostPoint {
            model: model.into(),
            size: 12,
            jobs,
            rates: Vec::new(),
            relative: Some(relative),
            repeats: Vec::new(),
            error: None,
        };
        m.host = Some(HostFile {
            header: header(),
            points: vec![
                point("mlp", 1, 1.0),
                point("mlp", 2, 0.6),
                point("cnn", 1, 1.0),
                point("cnn", 2, 1.0),
                point("gru", 1, 1.0),
                point("gru", 2, 0.9),
            ],
        });
        assert_eq!(m.host("mlp", 12), vec![1.0, 0.6]);
        assert_eq!(m.host("mlp", 8), vec![1.0, 0.6], "its model's, at size 12");
        assert_eq!(
            m.host("vae", 32),
            vec![1.0, 0.9],
            "the median over the models"
        );
    }

    #[test]
    fn factors_hold_beyond_the_table_and_are_one_alone() {
        let mut s = Sharing {
            free: vec![1.0, 0.9, 0.8],
            split: vec![1.0, 0.95],
            beside: BTreeMap::new(),
            host: vec![1.0, 0.6],
            host_beside: BTreeMap::new(),
            busy_host: None,
        };
        assert_eq!((s.on_host(1), s.on_host(2), s.on_host(3)), (1.0, 0.6, 0.6));
        assert_eq!(Sharing::default().on_host(2), 1.0);
        assert_eq!(s.factor(false, 1), 1.0);
        assert_eq!(s.factor(false, 2), 0.9);
        assert_eq!(s.factor(false, 7), 0.8);
        assert_eq!(s.factor(true, 2), 0.95);
        assert_eq!(Sharing::default().factor(true, 3), 1.0);
        // By threads per core: whole numbers read as job counts, between them linearly.
        assert_eq!(s.factor_at(false, 2.0), 0.9);
        assert_eq!(s.factor_at(false, 0.5), 1.0);
        assert!((s.factor_at(false, 1.5) - 0.95).abs() < 1e-12);
        assert!((s.factor_at(false, 2.25) - 0.875).abs() < 1e-12);
        assert_eq!(s.factor_at(false, 9.5), 0.8);
        // Beside a model measured as a pair, the pair's factor; beside another, the count's.
        s.beside.insert(model_key("gru", 2), 0.85);
        assert_eq!(s.beside("gru/2", false), 0.85);
        assert_eq!(s.beside("gru/2", true), 0.85);
        assert_eq!(s.beside("cnn/6", true), 0.95);
        assert_eq!(s.beside("cnn/6", false), 0.9);
    }

    #[test]
    fn a_directory_loads_what_is_there() {
        let dir = std::env::temp_dir().join(format!("converge-measured-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let m = measured();
        std::fs::write(
            dir.join("step_time.json"),
            serde_json::to_string(m.step_time.as_ref().unwrap()).unwrap(),
        )
        .unwrap();
        let loaded = Measured::load(&dir).unwrap();
        assert_eq!(loaded.step_time.unwrap().points.len(), 4);
        assert!(loaded.colocation.is_none());
        std::fs::write(dir.join("start.json"), "{not json").unwrap();
        let e = Measured::load(&dir).unwrap_err().to_string();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(e.contains("start.json"), "{e}");
    }
}
