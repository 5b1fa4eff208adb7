//! The value-based allocation paper's experiments (value-based-allocation.txt §VI, :131-163):
//! workload sets W1..W9 of random containers with value curves, run under Spread, the GA
//! baseline, DwoP and DwP, and studies of λ, the CPU-share stride, the cluster size and the
//! value curves.
//!
//! Files live in `sim/experiments/value/*.json` ([`ValueExperiment`]). Each file is one study
//! ([`Study`]); its result is a [`Grid`]: rows are workload sets (or cluster sizes), columns are
//! the file's series (with the studied parameter substituted), cells hold the total value of
//! each of the `seeds` random workloads. [`Claim`]s put our ratios beside the paper's.
//!
//! ## The workload (:135)
//! Container j arrives at `AT_1 = 0`, `AT_{j+1} = AT_j + U(0, T_max)`; its execution time on the
//! reference worker is `ET_j = U(100, 800)` s; its value curve is worth `max_value` (100) until
//! `full_value_factor · ET_j` after release and falls linearly to 0 at `zero_value_factor · ET_j`.
//! The paper does not give its curves; the factors are ours (the `value-curves` study shows how
//! they move the comparison). A worker is one unit of CPU of its speed (a container alone gets
//! all of it; the paper's model, :59), so jobs have one core of demand and workers one core.
//! Set `s` (1-based), workload `k` (0-based) is generated from seed `seed + 1000·s + k`: every
//! study sees the same workloads.

use std::fmt::Write as _;
use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use converge_policy::value::ValueCurve;

use crate::curve::Catalog;
use crate::engine::Simulation;
use crate::error::{Error, Result};
use crate::experiment::{Experiment, JobSpec, PolicySpec, SystemModel, WorkerGroup, Workload};

/// One value-based study (a file in `sim/experiments/value/`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ValueExperiment {
    /// Short id (used for plot file names).
    pub name: String,
    /// One-line description.
    pub title: String,
    /// Base seed of the workloads.
    pub seed: u64,
    /// Random workloads per set (the paper: 10).
    pub seeds: usize,
    /// The cluster (cores are ignored: a worker is one unit of CPU of its speed). The
    /// scalability study repeats this pattern.
    pub workers: Vec<WorkerGroup>,
    /// The workload sets.
    pub workload: ValueWorkload,
    /// The policies compared.
    pub series: Vec<Series>,
    /// What varies.
    pub study: Study,
    /// The paper's statements, to print beside ours.
    #[serde(default)]
    pub claims: Vec<Claim>,
    /// Where in the paper.
    #[serde(default)]
    pub paper: String,
    /// Why ours differs, where it does (written after looking).
    #[serde(default)]
    pub note: String,
}

/// The workload sets W1..W9 (:135).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ValueWorkload {
    /// Containers per workload (the paper: 150).
    pub containers: usize,
    /// Execution time on the reference worker, uniform in this range, seconds (100-800).
    pub exec_time: (f64, f64),
    /// Every container's maximum value (100).
    pub max_value: f64,
    /// Full value until this × ET_j after release.
    pub full_value_factor: f64,
    /// Zero value from this × ET_j after release.
    pub zero_value_factor: f64,
    /// T_max of each set, seconds (W1 = 10, W2 = 45, …, W9 = 290).
    pub t_max: Vec<f64>,
}

/// A policy under a label.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Series {
    /// Column label, e.g. "SP", "DwP".
    pub label: String,
    /// The policy.
    pub policy: PolicySpec,
}

/// What a study varies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Study {
    /// Every series on every workload set (Fig. 3).
    Workloads,
    /// Every series (DwP) with λ replaced by each value, on every set (:159).
    Lambda {
        /// The λ values.
        lambdas: Vec<f64>,
    },
    /// Every series with the CPU-share stride replaced by each value, on every set (:161).
    Stride {
        /// The strides.
        strides: Vec<u32>,
    },
    /// Every series on clusters of each size (the worker pattern repeated), on one set (:163,
    /// Fig. 4).
    Scalability {
        /// Cluster sizes.
        workers: Vec<usize>,
        /// The workload set (1-based: 1 = W1).
        set: usize,
    },
    /// Every series with each (full, zero) value-curve factor pair, on the given sets.
    Curves {
        /// `(full_value_factor, zero_value_factor)` pairs.
        factors: Vec<(f64, f64)>,
        /// Workload sets (1-based).
        sets: Vec<usize>,
    },
}

/// What a claim compares.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Metric {
    /// Total value (summed over the claim's rows, mean over workloads).
    #[default]
    Value,
    /// Wall-clock allocation time per arrival decision.
    Time,
}

/// A statement of the paper, as a ratio of two columns (or one column's absolute number).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Claim {
    /// What the paper says, in words.
    pub text: String,
    /// The column on top.
    pub numerator: String,
    /// The column below (absent: the numerator's own number).
    #[serde(default)]
    pub denominator: Option<String>,
    /// Rows summed (labels such as "W2" or "20"); empty = every row.
    #[serde(default)]
    pub rows: Vec<String>,
    /// Value or time.
    #[serde(default)]
    pub metric: Metric,
    /// The paper's number as it states it ("3.85", "< 1.01", "> 1").
    pub paper: String,
}

/// One cell: one column on one row, over the workloads.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    /// Total value of each workload.
    pub values: Vec<f64>,
    /// Mean rejected, dropped, stopped containers, preemptions and resumptions per workload.
    pub rejected: f64,
    /// See `rejected`.
    pub dropped: f64,
    /// See `rejected`.
    pub preemptions: f64,
    /// See `rejected`.
    pub resumes: f64,
    /// Arrival decisions over all workloads.
    pub decisions: u64,
    /// Wall-clock seconds in those decisions (when timed).
    pub decision_seconds: Option<f64>,
}

impl Cell {
    /// Mean total value.
    pub fn mean(&self) -> f64 {
        self.values.iter().sum::<f64>() / self.values.len().max(1) as f64
    }

    /// Sample standard deviation of the total value.
    pub fn sd(&self) -> f64 {
        let n = self.values.len();
        if n < 2 {
            return 0.0;
        }
        let m = self.mean();
        (self.values.iter().map(|v| (v - m).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
    }

    /// Mean wall-clock seconds per arrival decision.
    pub fn seconds_per_decision(&self) -> Option<f64> {
        self.decision_seconds
            .filter(|_| self.decisions > 0)
            .map(|s| s / self.decisions as f64)
    }
}

/// A study's outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Grid {
    /// What the rows are ("workload set", "workers").
    pub row_label: String,
    /// Row labels.
    pub rows: Vec<String>,
    /// Column labels.
    pub columns: Vec<String>,
    /// `cells[row][column]`.
    pub cells: Vec<Vec<Cell>>,
}

impl Grid {
    fn column(&self, label: &str) -> Result<usize> {
        self.columns.iter().position(|c| c == label).ok_or_else(|| {
            Error::Invalid(format!("no column {label:?}; columns: {:?}", self.columns))
        })
    }

    fn row_indices(&self, rows: &[String]) -> Result<Vec<usize>> {
        if rows.is_empty() {
            return Ok((0..self.rows.len()).collect());
        }
        rows.iter()
            .map(|r| {
                self.rows
                    .iter()
                    .position(|x| x == r)
                    .ok_or_else(|| Error::Invalid(format!("no row {r:?}; rows: {:?}", self.rows)))
            })
            .collect()
    }

    /// Our number for `claim`: a ratio of sums over its rows (value), of mean seconds per
    /// decision (time), or the numerator's own number without a denominator.
    pub fn claim(&self, claim: &Claim) -> Result<f64> {
        let rows = self.row_indices(&claim.rows)?;
        let measure = |col: usize| -> f64 {
            match claim.metric {
                Metric::Value => rows.iter().map(|&r| self.cells[r][col].mean()).sum(),
                Metric::Time => {
                    let (s, d) = rows.iter().fold((0.0, 0u64), |(s, d), &r| {
                        let c = &self.cells[r][col];
                        (s + c.decision_seconds.unwrap_or(f64::NAN), d + c.decisions)
                    });
                    s / d.max(1) as f64
                }
            }
        };
        let num = measure(self.column(&claim.numerator)?);
        Ok(match &claim.denominator {
            Some(d) => num / measure(self.column(d)?),
            None => num,
        })
    }
}

impl ValueExperiment {
    /// Reads and checks a file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.into(),
            source,
        })?;
        let e: ValueExperiment = serde_json::from_str(&text).map_err(|source| Error::Parse {
            path: path.into(),
            source,
        })?;
        e.check()?;
        Ok(e)
    }

    /// Structural checks.
    pub fn check(&self) -> Result<()> {
        let bad = |m: &str| Err(Error::Invalid(format!("{}: {m}", self.name)));
        let w = &self.workload;
        if self.workers.iter().map(|g| g.count).sum::<usize>() == 0 {
            return bad("no workers");
        }
        if self.workers.iter().any(|g| g.calibration <= 0.0) {
            return bad("worker speeds must be positive");
        }
        if self.seeds == 0 || self.series.is_empty() || w.t_max.is_empty() {
            return bad("needs seeds >= 1, at least one series and one T_max");
        }
        if !(w.exec_time.0 > 0.0 && w.exec_time.1 >= w.exec_time.0) {
            return bad("exec_time needs 0 < low <= high");
        }
        ValueCurve::new(w.max_value, w.full_value_factor, w.zero_value_factor)?;
        let sets = match &self.study {
            Study::Scalability { set, .. } => vec![*set],
            Study::Curves { sets, .. } => sets.clone(),
            _ => vec![],
        };
        if sets.iter().any(|&s| s == 0 || s > w.t_max.len()) {
            return bad("workload sets are 1-based indices into t_max");
        }
        Ok(())
    }

    /// The worker (cpus, speed) pattern expanded.
    fn pattern(&self) -> Vec<f64> {
        self.workers
            .iter()
            .flat_map(|g| std::iter::repeat_n(g.calibration, g.count))
            .collect()
    }

    /// Workload `k` of set `set` (1-based) with curve factors `(full, zero)`.
    pub fn workload(&self, set: usize, k: usize, factors: (f64, f64)) -> Vec<JobSpec> {
        let w = &self.workload;
        let t_max = w.t_max[set - 1];
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed + 1000 * set as u64 + k as u64);
        let mut at = 0.0;
        (0..w.containers)
            .map(|j| {
                if j > 0 {
                    at += rng.random::<f64>() * t_max;
                }
                let et = w.exec_time.0 + rng.random::<f64>() * (w.exec_time.1 - w.exec_time.0);
                JobSpec {
                    id: format!("job-{}", j + 1),
                    model: 0,
                    model_name: "container".into(),
                    arrival: at,
                    work: et,
                    max_cores: 1.0,
                    value: Some(ValueCurve {
                        max_value: w.max_value,
                        full_value_until_s: factors.0 * et,
                        zero_value_at_s: factors.1 * et,
                    }),
                    runtime: None,
                }
            })
            .collect()
    }

    /// One run's experiment shell: `speeds` workers of one core.
    fn shell(&self, speeds: &[f64], policy: PolicySpec, seed: u64) -> Experiment {
        Experiment {
            name: self.name.clone(),
            title: self.title.clone(),
            seed,
            workers: speeds
                .iter()
                .map(|&calibration| WorkerGroup {
                    count: 1,
                    cpus: 1.0,
                    calibration,
                })
                .collect(),
            workload: Workload::Fixed(vec![]),
            policy,
            baseline: PolicySpec::DockerSwarm,
            system: SystemModel::default(),
            paper: Default::default(),
            sweep: vec![],
            focus_job: None,
            note: String::new(),
        }
    }

    /// Runs the study. `timer` (seconds from a fixed origin) times the arrival decisions.
    pub fn run(&self, catalog: &Catalog, timer: Option<fn() -> f64>) -> Result<Grid> {
        let w = &self.workload;
        let default_factors = (w.full_value_factor, w.zero_value_factor);
        let sets: Vec<usize> = (1..=w.t_max.len()).collect();
        let set_label = |s: usize| format!("W{s}");
        // (row label, set, factors, speeds) per row; (label, policy) per column.
        type Row = (String, usize, (f64, f64), Vec<f64>);
        let pattern = self.pattern();
        let plain_rows = || -> Vec<Row> {
            sets.iter()
                .map(|&s| (set_label(s), s, default_factors, pattern.clone()))
                .collect()
        };
        let plain_columns = || -> Vec<(String, PolicySpec)> {
            self.series
                .iter()
                .map(|s| (s.label.clone(), s.policy))
                .collect()
        };
        let (row_label, rows, columns): (&str, Vec<Row>, Vec<(String, PolicySpec)>) =
            match &self.study {
                Study::Workloads => ("workload set", plain_rows(), plain_columns()),
                Study::Lambda { lambdas } => {
                    let mut cols = Vec::new();
                    for s in &self.series {
                        for &l in lambdas {
                            let policy = match s.policy {
                                PolicySpec::Value {
                                    stride,
                                    preemption: Some(p),
                                } => PolicySpec::Value {
                                    stride,
                                    preemption: Some(converge_policy::value::PreemptionConfig {
                                        lambda: l,
                                        ..p
                                    }),
                                },
                                other => other,
                            };
                            cols.push((format!("{} λ={l}", s.label), policy));
                        }
                    }
                    ("workload set", plain_rows(), cols)
                }
                Study::Stride { strides } => {
                    let mut cols = Vec::new();
                    for s in &self.series {
                        for &st in strides {
                            let policy = match s.policy {
                                PolicySpec::Value { preemption, .. } => PolicySpec::Value {
                                    stride: st,
                                    preemption,
                                },
                                other => other,
                            };
                            cols.push((format!("{} stride {st}", s.label), policy));
                        }
                    }
                    ("workload set", plain_rows(), cols)
                }
                Study::Scalability { workers, set } => (
                    "workers",
                    workers
                        .iter()
                        .map(|&n| {
                            let speeds = (0..n).map(|i| pattern[i % pattern.len()]).collect();
                            (n.to_string(), *set, default_factors, speeds)
                        })
                        .collect(),
                    plain_columns(),
                ),
                Study::Curves { factors, sets } => {
                    let mut rows = Vec::new();
                    for &s in sets {
                        for &f in factors {
                            let label = format!("W{s}, full {}×ET, zero {}×ET", f.0, f.1);
                            rows.push((label, s, f, pattern.clone()));
                        }
                    }
                    ("set, curve", rows, plain_columns())
                }
            };
        let mut cells = Vec::with_capacity(rows.len());
        for (_, set, factors, speeds) in &rows {
            let workloads: Vec<Vec<JobSpec>> = (0..self.seeds)
                .map(|k| self.workload(*set, k, *factors))
                .collect();
            let mut line = Vec::with_capacity(columns.len());
            for (_, policy) in &columns {
                let mut cell = Cell::default();
                let n = self.seeds as f64;
                for (k, jobs) in workloads.iter().enumerate() {
                    let seed = self.seed + 1000 * *set as u64 + k as u64;
                    let e = self.shell(speeds, *policy, seed);
                    let mut sim = Simulation::new(&e, catalog, jobs, *policy, false)?;
                    if let Some(t) = timer {
                        sim = sim.with_timer(Box::new(t));
                    }
                    let run = sim.run()?;
                    let v = run.value.unwrap_or_default();
                    cell.values.push(v.total);
                    cell.rejected += v.rejected as f64 / n;
                    cell.dropped += v.dropped as f64 / n;
                    cell.preemptions += v.preemptions as f64 / n;
                    cell.resumes += v.resumes as f64 / n;
                    cell.decisions += v.decisions;
                    if let Some(s) = v.decision_seconds {
                        *cell.decision_seconds.get_or_insert(0.0) += s;
                    }
                }
                line.push(cell);
            }
            cells.push(line);
        }
        Ok(Grid {
            row_label: row_label.into(),
            rows: rows.into_iter().map(|r| r.0).collect(),
            columns: columns.into_iter().map(|c| c.0).collect(),
            cells,
        })
    }

    /// The upper bound on a workload's value: every container at its maximum.
    pub fn max_total(&self) -> f64 {
        self.workload.containers as f64 * self.workload.max_value
    }
}

/// Reads every `*.json` under `dir`, sorted by file name (none if `dir` does not exist).
pub fn load_all(dir: &Path) -> Result<Vec<ValueExperiment>> {
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .map_err(|source| Error::Read {
            path: dir.into(),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    paths.iter().map(|p| ValueExperiment::load(p)).collect()
}

fn ms(s: Option<f64>) -> String {
    match s {
        None => "–".into(),
        Some(s) if s < 1e-3 => format!("{:.1} µs", s * 1e6),
        Some(s) => format!("{:.2} ms", s * 1e3),
    }
}

/// Draws the study's figures under `base` (RESULTS.md's folder); returns their paths relative
/// to it.
pub fn plots(e: &ValueExperiment, g: &Grid, base: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let means: Vec<Vec<f64>> = g
        .cells
        .iter()
        .map(|r| r.iter().map(Cell::mean).collect())
        .collect();
    let mut draw = |suffix: &str, f: &dyn Fn(&Path) -> Result<()>| -> Result<()> {
        let name = format!("results/{}-{suffix}.svg", e.name);
        f(&base.join(&name))?;
        out.push(name);
        Ok(())
    };
    match &e.study {
        Study::Lambda { lambdas } => {
            // x = λ, one line per workload set.
            let per_lambda: Vec<Vec<f64>> = (0..lambdas.len())
                .map(|l| means.iter().map(|row| row[l]).collect())
                .collect();
            draw("value", &|p| {
                crate::plot::lines(
                    p,
                    &format!("{}: DwP total value by λ, per workload set", e.name),
                    "λ",
                    "total value",
                    lambdas,
                    &g.rows,
                    &per_lambda,
                )
            })?;
        }
        Study::Scalability { workers, .. } => {
            let xs: Vec<f64> = workers.iter().map(|&n| n as f64).collect();
            draw("value", &|p| {
                crate::plot::lines(
                    p,
                    &format!("{}: total value by cluster size (Fig. 4)", e.name),
                    "workers",
                    "total value",
                    &xs,
                    &g.columns,
                    &means,
                )
            })?;
            let times: Vec<Vec<f64>> = g
                .cells
                .iter()
                .map(|r| {
                    r.iter()
                        .map(|c| c.seconds_per_decision().map_or(f64::NAN, |s| s * 1e3))
                        .collect()
                })
                .collect();
            if times.iter().flatten().any(|t| t.is_finite()) {
                draw("time", &|p| {
                    crate::plot::lines(
                        p,
                        &format!("{}: allocation time per container", e.name),
                        "workers",
                        "ms per decision",
                        &xs,
                        &g.columns,
                        &times,
                    )
                })?;
            }
        }
        _ => draw("value", &|p| {
            crate::plot::grouped_bars(
                p,
                &format!("{}: mean total value", e.name),
                "total value",
                &g.rows,
                &g.columns,
                &means,
            )
        })?,
    }
    Ok(out)
}

/// The markdown section for one study (`plots` relative to RESULTS.md; `timed` says whether the
/// run measured allocation times).
pub fn section(e: &ValueExperiment, g: &Grid, plots: &[String], timed: bool) -> Result<String> {
    let mut out = String::new();
    let w = &e.workload;
    let _ = writeln!(out, "## {} — {}\n", e.name, e.title);
    let speeds: Vec<String> = e
        .workers
        .iter()
        .map(|g| format!("{} × speed {}", g.count, g.calibration))
        .collect();
    let _ = writeln!(
        out,
        "Cluster: {}. {} containers per workload, ET uniform {}-{} s, max value {}, curves: full \
         value until {}×ET, zero at {}×ET. {} workloads per cell (seeds {}+1000·set+k). Paper: {}.\n",
        speeds.join(", "),
        w.containers,
        w.exec_time.0,
        w.exec_time.1,
        w.max_value,
        w.full_value_factor,
        w.zero_value_factor,
        e.seeds,
        e.seed,
        if e.paper.is_empty() { "–" } else { &e.paper }
    );
    let policies: Vec<String> = e
        .series
        .iter()
        .map(|s| format!("{} = {}", s.label, s.policy.label()))
        .collect();
    let _ = writeln!(out, "Series: {}.\n", policies.join("; "));
    let _ = writeln!(
        out,
        "Total value, mean ± sd over the workloads (max possible {:.0}):\n",
        e.max_total()
    );
    let _ = writeln!(out, "| {} | {} |", g.row_label, g.columns.join(" | "));
    let _ = writeln!(out, "|---|{}", "---:|".repeat(g.columns.len()));
    for (r, row) in g.rows.iter().enumerate() {
        let cells: Vec<String> = g.cells[r]
            .iter()
            .map(|c| format!("{:.0} ± {:.0}", c.mean(), c.sd()))
            .collect();
        let _ = writeln!(out, "| {row} | {} |", cells.join(" | "));
    }
    out.push('\n');
    if timed && matches!(e.study, Study::Stride { .. } | Study::Scalability { .. }) {
        let _ = writeln!(
            out,
            "Allocation time per arrival decision (wall clock, this machine, this run; the only \
             numbers here that change from run to run):\n"
        );
        let _ = writeln!(out, "| {} | {} |", g.row_label, g.columns.join(" | "));
        let _ = writeln!(out, "|---|{}", "---:|".repeat(g.columns.len()));
        for (r, row) in g.rows.iter().enumerate() {
            let cells: Vec<String> = g.cells[r]
                .iter()
                .map(|c| ms(c.seconds_per_decision()))
                .collect();
            let _ = writeln!(out, "| {row} | {} |", cells.join(" | "));
        }
        out.push('\n');
    }
    if !e.claims.is_empty() {
        let _ = writeln!(out, "| the paper says | ours | paper |\n|---|---:|---:|");
        for c in &e.claims {
            if c.metric == Metric::Time && !timed {
                continue;
            }
            let ours = g.claim(c)?;
            let fmt = |x: f64| match (c.metric, &c.denominator) {
                // A ratio over a column that earned nothing has no number: `inf` or `NaN`
                // would read as a result.
                (Metric::Value, Some(d)) if !x.is_finite() => format!("n/a ({d} earned 0)"),
                _ if !x.is_finite() => "n/a".to_string(),
                (Metric::Time, None) => ms(Some(x)),
                _ => format!("{x:.2}"),
            };
            let _ = writeln!(out, "| {} | {} | {} |", c.text, fmt(ours), c.paper);
        }
        out.push('\n');
    }
    if !e.note.is_empty() {
        let _ = writeln!(out, "**Reading it:** {}\n", e.note);
    }
    for p in plots {
        let _ = writeln!(out, "![{p}]({p})\n");
    }
    let _ = writeln!(
        out,
        "<details><summary>Mean rejected / dropped / preempted / resumed containers per workload</summary>\n"
    );
    let _ = writeln!(out, "| {} | {} |", g.row_label, g.columns.join(" | "));
    let _ = writeln!(out, "|---|{}", "---:|".repeat(g.columns.len()));
    for (r, row) in g.rows.iter().enumerate() {
        let cells: Vec<String> = g.cells[r]
            .iter()
            .map(|c| {
                format!(
                    "{:.1} / {:.1} / {:.1} / {:.1}",
                    c.rejected, c.dropped, c.preemptions, c.resumes
                )
            })
            .collect();
        let _ = writeln!(out, "| {row} | {} |", cells.join(" | "));
    }
    out.push_str("\n</details>\n\n");
    Ok(out)
}
