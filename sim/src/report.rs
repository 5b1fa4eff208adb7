//! Comparing runs: policy vs baseline vs oracle on the same trace, summaries beside the paper's
//! numbers, sweeps, and the `RESULTS.md` document.

use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::curve::Catalog;
use crate::engine::{Run, Simulation};
use crate::error::Result;
use crate::experiment::{Experiment, PaperNumbers, PolicySpec};

/// Three runs of one experiment on one trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    /// The experiment.
    pub experiment: Experiment,
    /// The policy under test.
    pub policy: Run,
    /// The paper's baseline.
    pub baseline: Run,
    /// Shortest-remaining-work-first with full knowledge, on the baseline's placement.
    pub oracle: Run,
}

/// Policy vs baseline in the papers' terms (reductions are fractions; positive = better).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Average completion time under the policy.
    pub avg_jct: f64,
    /// Average completion time under the baseline.
    pub baseline_avg_jct: f64,
    /// Makespan under the policy.
    pub makespan: f64,
    /// Makespan under the baseline.
    pub baseline_makespan: f64,
    /// Share of jobs that finished sooner.
    pub improved: f64,
    /// Average completion time reduction.
    pub avg_reduction: f64,
    /// Makespan reduction.
    pub makespan_reduction: f64,
    /// The best job and its reduction.
    pub best: (String, f64),
    /// The worst job and its change (positive = slower).
    pub worst: (String, f64),
    /// The focus job's reduction.
    pub focus: Option<f64>,
}

fn reduction(policy: f64, baseline: f64) -> f64 {
    if baseline > 0.0 {
        (baseline - policy) / baseline
    } else {
        0.0
    }
}

/// Summarizes `policy` against `baseline` (same trace, same job ids).
pub fn summarize(policy: &Run, baseline: &Run, focus: Option<&str>) -> Summary {
    let changes: Vec<(String, f64)> = policy
        .jobs
        .iter()
        .zip(&baseline.jobs)
        .map(|(p, b)| (p.id.clone(), reduction(p.jct, b.jct)))
        .collect();
    let improved =
        changes.iter().filter(|(_, r)| *r > 1e-9).count() as f64 / changes.len().max(1) as f64;
    let best = changes
        .iter()
        .cloned()
        .fold(None::<(String, f64)>, |acc, c| match acc {
            Some(a) if a.1 >= c.1 => Some(a),
            _ => Some(c),
        })
        .unwrap_or_default();
    let worst = changes
        .iter()
        .cloned()
        .fold(None::<(String, f64)>, |acc, c| match acc {
            Some(a) if a.1 <= c.1 => Some(a),
            _ => Some(c),
        })
        .map(|(id, r)| (id, -r))
        .unwrap_or_default();
    Summary {
        avg_jct: policy.avg_jct,
        baseline_avg_jct: baseline.avg_jct,
        makespan: policy.makespan,
        baseline_makespan: baseline.makespan,
        improved,
        avg_reduction: reduction(policy.avg_jct, baseline.avg_jct),
        makespan_reduction: reduction(policy.makespan, baseline.makespan),
        best,
        worst,
        focus: focus.and_then(|f| changes.iter().find(|(id, _)| id == f).map(|c| c.1)),
    }
}

/// Runs the policy, the baseline and the oracle on the experiment's trace.
pub fn compare(experiment: &Experiment, catalog: &Catalog, record: bool) -> Result<Comparison> {
    let jobs = experiment.jobs(catalog)?;
    let run = |p: PolicySpec| Simulation::new(experiment, catalog, &jobs, p, record)?.run();
    Ok(Comparison {
        experiment: experiment.clone(),
        policy: run(experiment.policy)?,
        baseline: run(experiment.baseline)?,
        oracle: run(PolicySpec::Oracle)?,
    })
}

/// One sweep point's outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepRow {
    /// α.
    pub alpha: f64,
    /// Interval.
    pub interval: f64,
    /// Ours.
    pub summary: Summary,
    /// The paper's, if the experiment file lists this point.
    pub paper: PaperNumbers,
}

/// Runs the policy at every (α, interval) pair against one baseline run.
pub fn sweep(
    experiment: &Experiment,
    catalog: &Catalog,
    points: &[(f64, f64)],
) -> Result<Vec<SweepRow>> {
    let jobs = experiment.jobs(catalog)?;
    let baseline =
        Simulation::new(experiment, catalog, &jobs, experiment.baseline, false)?.run()?;
    points
        .iter()
        .map(|&(alpha, interval)| {
            let policy = experiment.policy.with_parameters(alpha, interval);
            let run = Simulation::new(experiment, catalog, &jobs, policy, false)?.run()?;
            let paper = experiment
                .sweep
                .iter()
                .find(|p| p.alpha == alpha && p.interval == interval)
                .map(|p| p.paper.clone())
                .unwrap_or_default();
            Ok(SweepRow {
                alpha,
                interval,
                summary: summarize(&run, &baseline, experiment.focus_job.as_deref()),
                paper,
            })
        })
        .collect()
}

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

fn opt_pct(x: Option<f64>) -> String {
    x.map_or("–".into(), pct)
}

fn secs(x: f64) -> String {
    format!("{x:.1} s")
}

/// The summary table: ours beside the paper's.
pub fn summary_table(c: &Comparison) -> String {
    let e = &c.experiment;
    let s = summarize(&c.policy, &c.baseline, e.focus_job.as_deref());
    let p = &e.paper;
    let pair = |v: Option<(f64, f64)>| {
        v.map_or(("–".to_string(), "–".to_string()), |(a, b)| {
            (secs(a), secs(b))
        })
    };
    let (paper_jct, paper_base_jct) = pair(p.avg_jct);
    let (paper_ms, paper_base_ms) = pair(p.makespan);
    let paper_avg_red = p.avg_reduction.or(p.avg_jct.map(|(a, b)| reduction(a, b)));
    let paper_ms_red = p
        .makespan_reduction
        .or(p.makespan.map(|(a, b)| reduction(a, b)));
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| metric | ours: {} | ours: {} | ours: change | paper: policy | paper: baseline | paper: change |",
        c.policy.policy, c.baseline.policy
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|");
    let _ = writeln!(
        out,
        "| average completion time | {} | {} | {} | {} | {} | {} |",
        secs(s.avg_jct),
        secs(s.baseline_avg_jct),
        pct(s.avg_reduction),
        paper_jct,
        paper_base_jct,
        opt_pct(paper_avg_red)
    );
    let _ = writeln!(
        out,
        "| makespan | {} | {} | {} | {} | {} | {} |",
        secs(s.makespan),
        secs(s.baseline_makespan),
        pct(s.makespan_reduction),
        paper_ms,
        paper_base_ms,
        opt_pct(paper_ms_red)
    );
    let _ = writeln!(
        out,
        "| jobs improved | | | {} | | | {} |",
        pct(s.improved),
        opt_pct(p.improved)
    );
    let _ = writeln!(
        out,
        "| best job (reduction) | | | {} {} | | | {} |",
        s.best.0,
        pct(s.best.1),
        opt_pct(p.best)
    );
    let _ = writeln!(
        out,
        "| worst job (increase) | | | {} {} | | | {} |",
        s.worst.0,
        pct(s.worst.1),
        opt_pct(p.worst)
    );
    if let Some(f) = &e.focus_job {
        let _ = writeln!(
            out,
            "| {f} reduction | | | {} | | | {} |",
            opt_pct(s.focus),
            opt_pct(p.focus)
        );
    }
    let _ = writeln!(
        out,
        "| oracle SRPT (a reference, not a bound) | {} avg, {} makespan | | {} / {} vs baseline | | | |",
        secs(c.oracle.avg_jct),
        secs(c.oracle.makespan),
        pct(reduction(c.oracle.avg_jct, s.baseline_avg_jct)),
        pct(reduction(c.oracle.makespan, s.baseline_makespan)),
    );
    out
}

/// Per-job completion times under the three runs.
pub fn job_table(c: &Comparison) -> String {
    let mut out = String::from(
        "| job | model | arrival | policy | baseline | oracle | change | migrations |\n|---|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for ((p, b), o) in c
        .policy
        .jobs
        .iter()
        .zip(&c.baseline.jobs)
        .zip(&c.oracle.jobs)
    {
        let _ = writeln!(
            out,
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {} |",
            p.id,
            p.model,
            p.arrival,
            p.jct,
            b.jct,
            o.jct,
            pct(reduction(p.jct, b.jct)),
            p.migrations
        );
    }
    out
}

/// The sweep table: ours beside the paper's per point.
pub fn sweep_table(rows: &[SweepRow], focus: Option<&str>) -> String {
    let mut out = String::new();
    let focus_head = focus.map_or(String::new(), |f| format!(" {f} ours | {f} paper |"));
    let focus_rule = if focus.is_some() { "---:|---:|" } else { "" };
    let _ = writeln!(
        out,
        "| α, interval | improved ours | improved paper | avg ours | avg paper | best ours | best paper | makespan ours | makespan paper |{focus_head}"
    );
    let _ = writeln!(
        out,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|{focus_rule}"
    );
    for r in rows {
        let s = &r.summary;
        let p = &r.paper;
        let focus_cells = if focus.is_some() {
            format!(" {} | {} |", opt_pct(s.focus), opt_pct(p.focus))
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "| {}, {}s | {} | {} | {} | {} | {} | {} | {} | {} |{focus_cells}",
            r.alpha,
            r.interval,
            pct(s.improved),
            opt_pct(p.improved),
            pct(s.avg_reduction),
            opt_pct(p.avg_reduction),
            pct(s.best.1),
            opt_pct(p.best),
            pct(s.makespan_reduction),
            opt_pct(p.makespan_reduction),
        );
    }
    out
}

/// The markdown section for one experiment (`plots` are paths relative to RESULTS.md).
pub fn section(c: &Comparison, sweep: Option<&[SweepRow]>, plots: &[String]) -> String {
    let e = &c.experiment;
    let mut out = String::new();
    let workers: Vec<String> = e
        .workers
        .iter()
        .map(|g| format!("{} × {} cores (speed {})", g.count, g.cpus, g.calibration))
        .collect();
    let _ = writeln!(out, "## {} — {}\n", e.name, e.title);
    let _ = writeln!(
        out,
        "Cluster: {}. Jobs: {}. Seed {}. Paper: {}.\n",
        workers.join(", "),
        c.policy.jobs.len(),
        e.seed,
        if e.paper.source.is_empty() {
            "–"
        } else {
            &e.paper.source
        }
    );
    out.push_str(&summary_table(c));
    out.push('\n');
    if !e.note.is_empty() {
        let _ = writeln!(out, "**Why ours differs:** {}\n", e.note);
    }
    if let Some(rows) = sweep {
        let _ = writeln!(out, "Sweep (the paper's table):\n");
        out.push_str(&sweep_table(rows, e.focus_job.as_deref()));
        out.push('\n');
    }
    for p in plots {
        let _ = writeln!(out, "![{p}]({p})\n");
    }
    let _ = writeln!(
        out,
        "<details><summary>Per-job completion times (s)</summary>\n\n{}\n</details>\n",
        job_table(c)
    );
    out
}

/// Reads every `*.json` under `dir`, sorted by file name.
pub fn load_all(dir: &Path) -> Result<Vec<Experiment>> {
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .map_err(|source| crate::Error::Read {
            path: dir.into(),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    paths.iter().map(|p| Experiment::load(p)).collect()
}
