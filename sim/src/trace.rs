//! Trace files (`experiments/<trace>/trace.json`): one workload that runs both on the real
//! testbed (`cargo xtask experiment <trace>`) and in the simulator, so the two can be compared
//! job by job.
//!
//! A trace names what the live driver submits — each job's trainer model, size, step budget,
//! thread count, reservation and arrival time — the workers, the policies compared (the
//! manager's `--policy` names, baseline first) and the intervals the manager and the agents run
//! with. The simulator turns it into its own terms with nothing set by eye: each job's work is
//! its steps times the measured seconds per step, its curve is the trainer's measured held-out
//! loss by step, its start, save and restore times and the cost of sharing a worker are the
//! measured ones ([`crate::measured`]).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::curve::{Catalog, Model, TableCurve};
use crate::engine::{Run, Simulation};
use crate::error::{Error, Result};
use crate::experiment::{
    Experiment, JobSpec, PaperNumbers, PolicyName, PolicySpec, Runtime, SystemModel, WorkerGroup,
    Workload,
};
use crate::measured::Measured;

/// One trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceFile {
    /// Short id (its directory's name).
    pub name: String,
    /// One line: what it exercises.
    pub title: String,
    /// Workers, one CPU each (the compose testbed's `agent-1`, `agent-2`, ...).
    pub workers: usize,
    /// Policies compared, by the manager's name; the first is the baseline.
    pub policies: Vec<String>,
    /// The manager's and the agents' intervals.
    #[serde(default)]
    pub settings: Settings,
    /// Seed of the simulator's metric noise.
    #[serde(default)]
    pub seed: u64,
    /// The jobs, in arrival order.
    pub jobs: Vec<TraceJob>,
}

/// The intervals a trace runs with, live and simulated.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// The agents' FlowCon interval (`CONVERGE_FLOWCON_INTERVAL`), seconds.
    pub flowcon_interval_s: f64,
    /// The agents' SpeCon categorization interval (`CONVERGE_SPECON_INTERVAL`), seconds.
    pub specon_interval_s: f64,
    /// The manager's rebalance interval (`CONVERGE_REBALANCE_INTERVAL`), seconds.
    pub rebalance_interval_s: f64,
}

/// The heartbeat interval of the testbed's agents and manager (their default), seconds.
pub const HEARTBEAT_S: f64 = 1.0;

impl Default for Settings {
    /// The agent's and the manager's defaults.
    fn default() -> Self {
        Settings {
            flowcon_interval_s: 20.0,
            specon_interval_s: 30.0,
            rebalance_interval_s: 30.0,
        }
    }
}

/// One job of a trace: a trainer run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceJob {
    /// Its name in tables and plots (and `JobSpec.name`).
    pub name: String,
    /// Seconds after the run's start.
    pub at_s: f64,
    /// `--model`.
    pub model: String,
    /// `--size`.
    pub size: u32,
    /// `--steps`.
    pub steps: u64,
    /// `--threads` (1: one core at most).
    #[serde(default = "one_thread")]
    pub threads: u32,
    /// CPU cores it reserves.
    #[serde(default = "reserve")]
    pub cpus: f64,
    /// `--report-every`.
    #[serde(default = "report_every")]
    pub report_every: u64,
    /// `--checkpoint-every`.
    #[serde(default = "checkpoint_every")]
    pub checkpoint_every: u64,
}

fn one_thread() -> u32 {
    1
}
fn reserve() -> f64 {
    0.3
}
fn report_every() -> u64 {
    25
}
fn checkpoint_every() -> u64 {
    250
}

impl TraceJob {
    /// The trainer's arguments, as the live driver submits them.
    pub fn trainer_args(&self) -> Vec<String> {
        vec![
            "--model".into(),
            self.model.clone(),
            "--size".into(),
            self.size.to_string(),
            "--steps".into(),
            self.steps.to_string(),
            "--threads".into(),
            self.threads.to_string(),
            "--report-every".into(),
            self.report_every.to_string(),
            "--checkpoint-every".into(),
            self.checkpoint_every.to_string(),
        ]
    }
}

impl TraceFile {
    /// Reads and checks a trace file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.into(),
            source,
        })?;
        let t: TraceFile = serde_json::from_str(&text).map_err(|source| Error::Parse {
            path: path.into(),
            source,
        })?;
        t.check()
            .map_err(|e| Error::Invalid(format!("{}: {e}", path.display())))?;
        Ok(t)
    }

    /// Structural checks; the error names the field to fix.
    pub fn check(&self) -> Result<()> {
        let bad = |why: String| Err(Error::Invalid(why));
        if self.workers == 0 {
            return bad("`workers` must be at least 1".into());
        }
        if self.policies.is_empty() {
            return bad("`policies` must name at least one policy (baseline first)".into());
        }
        for p in &self.policies {
            PolicyName::new(p)?;
        }
        if self.jobs.is_empty() {
            return bad("`jobs` is empty".into());
        }
        let s = &self.settings;
        for (what, v) in [
            ("settings.flowcon_interval_s", s.flowcon_interval_s),
            ("settings.specon_interval_s", s.specon_interval_s),
            ("settings.rebalance_interval_s", s.rebalance_interval_s),
        ] {
            if !(v >= 1.0 && v.is_finite()) {
                return bad(format!("`{what}` must be at least 1 second, got {v}"));
            }
        }
        let mut names = std::collections::BTreeSet::new();
        for (i, j) in self.jobs.iter().enumerate() {
            if !names.insert(&j.name) {
                return bad(format!("jobs[{i}]: the name `{}` is used twice", j.name));
            }
            if j.steps == 0 || j.threads > 64 || j.at_s.is_nan() || j.at_s < 0.0 {
                return bad(format!(
                    "jobs[{i}] ({}): steps must be positive, threads at most 64, at_s not negative",
                    j.name
                ));
            }
            if !(j.cpus > 0.0 && j.cpus <= 1.0) {
                return bad(format!(
                    "jobs[{i}] ({}): cpus must be in (0, 1] (each worker has one core), got {}",
                    j.name, j.cpus
                ));
            }
            if i > 0 && j.at_s < self.jobs[i - 1].at_s {
                return bad(format!(
                    "jobs[{i}] ({}): jobs must be listed in arrival order",
                    j.name
                ));
            }
        }
        Ok(())
    }

    /// The environment the testbed's manager and agents get for this trace.
    pub fn testbed_env(&self) -> Vec<(&'static str, String)> {
        let s = &self.settings;
        let secs = |v: f64| format!("{}ms", (v * 1000.0).round() as u64);
        vec![
            ("CONVERGE_FLOWCON_INTERVAL", secs(s.flowcon_interval_s)),
            ("CONVERGE_SPECON_INTERVAL", secs(s.specon_interval_s)),
            ("CONVERGE_REBALANCE_INTERVAL", secs(s.rebalance_interval_s)),
        ]
    }

    /// The policy `name` as the simulator runs it: the manager's policy with this trace's
    /// intervals.
    pub fn policy(&self, name: &str) -> Result<PolicySpec> {
        let s = &self.settings;
        Ok(PolicySpec::Named {
            policy: PolicyName::new(name)?,
            flowcon_interval: s.flowcon_interval_s,
            specon_interval: s.specon_interval_s,
            rebalance_interval: s.rebalance_interval_s,
        })
    }

    /// The trace in the simulator's terms: an experiment (workers, heartbeat), a catalog with
    /// one model per job (its measured curve over its own steps), and the jobs with their
    /// measured runtimes.
    pub fn to_simulation(
        &self,
        measured: &Measured,
    ) -> Result<(Experiment, Catalog, Vec<JobSpec>)> {
        let mut catalog = Catalog::empty();
        let mut jobs = Vec::with_capacity(self.jobs.len());
        for (i, j) in self.jobs.iter().enumerate() {
            let cost = measured.cost(&j.model, j.size, j.threads)?;
            let steps = j.steps as f64;
            let points: Vec<(f64, f64)> = cost
                .curve
                .iter()
                .map(|&(step, loss)| (step / steps, loss))
                .collect();
            let work = steps * cost.s_per_step;
            catalog.insert(Model {
                name: j.name.clone(),
                work,
                max_cores: cost.max_cores,
                curve: Box::new(TableCurve::measured(points)),
            });
            jobs.push(JobSpec {
                id: format!("job-{}", i + 1),
                model: catalog.index(&j.name)?,
                model_name: j.name.clone(),
                arrival: j.at_s,
                work,
                max_cores: cost.max_cores,
                value: None,
                runtime: Some(Runtime {
                    model: crate::measured::model_key(&j.model, j.size),
                    steps: j.steps,
                    request_cpus: j.cpus,
                    sharing: cost.sharing,
                    start_s: cost.start_s,
                    save_s: cost.save_s,
                    checkpoint_bytes: cost.checkpoint_bytes,
                    restore_s: cost.restore_s,
                    noise: cost.noise,
                }),
            });
        }
        let first = self.policy(&self.policies[0])?;
        let experiment = Experiment {
            name: self.name.clone(),
            title: self.title.clone(),
            seed: self.seed,
            workers: vec![WorkerGroup {
                count: self.workers,
                cpus: 1.0,
                calibration: 1.0,
            }],
            workload: Workload::Fixed(Vec::new()),
            policy: first,
            baseline: first,
            system: SystemModel {
                heartbeat: HEARTBEAT_S,
                ..SystemModel::default()
            },
            paper: PaperNumbers::default(),
            sweep: Vec::new(),
            focus_job: None,
            note: String::new(),
        };
        Ok((experiment, catalog, jobs))
    }

    /// Runs policy `name` over the trace in the simulator. `record` keeps plot series.
    pub fn simulate(&self, name: &str, measured: &Measured, record: bool) -> Result<Run> {
        let (experiment, catalog, jobs) = self.to_simulation(measured)?;
        let policy = self.policy(name)?;
        Simulation::new(&experiment, &catalog, &jobs, policy, record)?.run()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measured::tests::{measured, pair_job, pairs_file, step};

    fn trace(policies: &[&str], jobs: &[(&str, f64, u64)]) -> TraceFile {
        TraceFile {
            name: "t".into(),
            title: "test".into(),
            workers: 1,
            policies: policies.iter().map(|p| p.to_string()).collect(),
            settings: Settings::default(),
            seed: 1,
            jobs: jobs
                .iter()
                .map(|&(name, at_s, steps)| TraceJob {
                    name: name.into(),
                    at_s,
                    model: "mlp".into(),
                    size: 12,
                    steps,
                    threads: 1,
                    cpus: 0.3,
                    report_every: 25,
                    checkpoint_every: 250,
                })
                .collect(),
        }
    }

    #[test]
    fn bad_traces_are_refused_naming_the_field() {
        let ok = trace(&["spread", "converge"], &[("a", 0.0, 100), ("b", 5.0, 100)]);
        ok.check().unwrap();
        let e = trace(&["fifo"], &[("a", 0.0, 100)]).check().unwrap_err();
        assert!(
            e.to_string().contains("fifo") && e.to_string().contains("las"),
            "{e}"
        );
        let e = trace(&["spread"], &[("a", 0.0, 100), ("a", 1.0, 100)])
            .check()
            .unwrap_err();
        assert!(e.to_string().contains("used twice"), "{e}");
        let e = trace(&["spread"], &[("a", 5.0, 100), ("b", 1.0, 100)])
            .check()
            .unwrap_err();
        assert!(e.to_string().contains("arrival order"), "{e}");
        let mut t = ok.clone();
        t.jobs[1].cpus = 2.0;
        assert!(t.check().unwrap_err().to_string().contains("jobs[1]"));
    }

    #[test]
    fn a_trace_job_costs_its_steps_at_the_measured_rate_and_follows_its_curve_by_step() {
        let t = trace(&["spread"], &[("a", 0.0, 1000)]);
        let (_, catalog, jobs) = t.to_simulation(&measured()).unwrap();
        assert!((jobs[0].work - 8.0).abs() < 1e-12, "1000 steps × 8 ms");
        let r = jobs[0].runtime.as_ref().unwrap();
        assert_eq!((r.steps, r.request_cpus, r.start_s), (1000, 0.3, 0.5));
        // The calibrate run measured 0.4 at step 1000 of its 2000: that is where this
        // 1000-step job ends, whatever fraction it is of the calibrate run.
        let curve = &catalog.get(jobs[0].model).curve;
        assert!((curve.value(1.0) - 0.4).abs() < 1e-12);
        assert!((curve.value(0.5) - (2.3 + 0.4) / 2.0).abs() < 1e-12);
    }

    /// Each trace job reports its loss with its model's measured scatter: two jobs of one model
    /// started together under FlowCon, whose limits follow the growth of their reported loss,
    /// get the same limits throughout when the model's loss was measured not to scatter, and
    /// different ones when it scatters as a small CNN's does.
    #[test]
    fn a_trace_jobs_loss_scatters_as_its_models_was_measured_to() {
        let with_noise = |noise: f64| {
            let mut m = measured();
            for r in m.curves.iter_mut().flat_map(|f| &mut f.runs) {
                for row in &mut r.rows {
                    row.columns
                        .insert("loss noise".into(), serde_json::json!(noise));
                }
            }
            m
        };
        let mut t = trace(&["flowcon"], &[("a", 0.0, 20_000), ("b", 0.0, 20_000)]);
        t.settings.flowcon_interval_s = 5.0;
        let (_, _, jobs) = t.to_simulation(&with_noise(0.1)).unwrap();
        assert_eq!(jobs[0].runtime.as_ref().unwrap().noise, Some(0.1));
        let splits = |noise: f64| -> Vec<(f64, f64)> {
            let run = t.simulate("flowcon", &with_noise(noise), true).unwrap();
            let cpu = run.trace.unwrap().cpu;
            cpu.iter()
                .filter(|(_, jobs)| jobs.len() == 2)
                .map(|(_, jobs)| (jobs[0].1, jobs[1].1))
                .collect()
        };
        let calm = splits(0.0);
        assert!(!calm.is_empty(), "{calm:?}");
        assert!(
            calm.iter().all(|(a, b)| (a - b).abs() < 1e-9),
            "same model, same progress, no scatter: the same limits ({calm:?})"
        );
        let noisy = splits(0.1);
        assert!(
            noisy.iter().any(|(a, b)| (a - b).abs() > 0.05),
            "a scattering loss ranks them apart in some round ({noisy:?})"
        );
    }

    #[test]
    fn a_job_alone_finishes_after_its_start_and_its_work() {
        let t = trace(&["spread"], &[("a", 3.0, 1000)]);
        let run = t.simulate("spread", &measured(), false).unwrap();
        let jct = run.jobs[0].jct;
        // Start (0.5 s) + 1000 steps × 8 ms on the whole core.
        assert!((jct - 8.5).abs() < 1e-6, "{jct}");
    }

    #[test]
    fn sharing_a_worker_costs_what_co_location_measured() {
        let t = trace(&["spread"], &[("a", 0.0, 1000), ("b", 0.0, 1000)]);
        let run = t.simulate("spread", &measured(), false).unwrap();
        // Half a core each, at 90% of the throughput two jobs alone would have.
        let want = 0.5 + 8.0 / (0.5 * 0.9);
        for j in &run.jobs {
            assert!((j.jct - want).abs() < 1e-6, "{} vs {want}", j.jct);
        }
        // A measured pair replaces the count's factor for a job beside exactly that model.
        let mut paired = measured();
        let half = || pair_job("mlp", 12, Some(0.5));
        paired.pairs = Some(pairs_file(vec![[half(), half()]]));
        let run = t.simulate("spread", &paired, false).unwrap();
        let want = 0.5 + 8.0 / (0.5 * 0.5);
        for j in &run.jobs {
            assert!((j.jct - want).abs() < 1e-6, "{} vs {want}", j.jct);
        }
        let mut free = measured();
        if let Some(c) = &mut free.colocation {
            c.points.clear();
        }
        let run = t.simulate("spread", &free, false).unwrap();
        assert!(
            (run.jobs[0].jct - (0.5 + 16.0)).abs() < 1e-6,
            "{}",
            run.jobs[0].jct
        );
    }
    #[test]
    fn busy_workers_on_one_host_slow_each_other_down_as_host_measured() {
        let mut t = trace(&["spread"], &[("a", 0.0, 1000), ("b", 0.0, 500)]);
        t.workers = 2;
        let jct = |m: &Measured| -> Vec<f64> {
            let run = t.simulate("spread", m, false).unwrap();
            let mut out: Vec<(String, f64)> =
                run.jobs.iter().map(|j| (j.id.clone(), j.jct)).collect();
            out.sort_by(|x, y| x.0.cmp(&y.0));
            out.into_iter().map(|x| x.1).collect()
        };
        // Workers of their own: each job alone on its worker (spread), start 0.5 s + work.
        let apart = jct(&measured());
        assert!(
            (apart[0] - 8.5).abs() < 1e-6 && (apart[1] - 4.5).abs() < 1e-6,
            "{apart:?}"
        );
        // On one host where two busy one-core workers each get half a core's throughput: b's
        // 4 s of work take 8, then a, alone on the host, does its last 4 s at full speed.
        let mut shared = measured();
        let point = |jobs: usize, relative: f64| crate::measured::HostPoint {
            model: "mlp".into(),
            size: 12,
            jobs,
            rates: Vec::new(),
            relative: Some(relative),
            repeats: Vec::new(),
            error: None,
        };
        shared.host = Some(crate::measured::HostFile {
            header: shared.step_time.as_ref().unwrap().header.clone(),
            points: vec![point(1, 1.0), point(2, 0.5)],
        });
        let together = jct(&shared);
        assert!(
            (together[0] - 12.5).abs() < 1e-6 && (together[1] - 8.5).abs() < 1e-6,
            "{together:?}"
        );
        // With what a busy neighbour of b's model costs measured apart (`host_pairs.json`):
        // three quarters of a core's throughput, not the host table's half. b's 4 s of work
        // take 16/3 s, in which a does 4 of its 8; a does the rest alone.
        let mut by_neighbour = shared.clone();
        let job = || pair_job("mlp", 12, Some(0.75));
        by_neighbour.host_pairs = Some(pairs_file(vec![[job(), job()]]));
        let neighbour = jct(&by_neighbour);
        let b = 0.5 + 4.0 / 0.75;
        assert!(
            (neighbour[1] - b).abs() < 1e-6 && (neighbour[0] - (b + 4.0)).abs() < 1e-6,
            "{neighbour:?}"
        );
    }

    /// Two models on one host: each job is charged what a busy neighbour *of the other's
    /// model* costs it, not what one of its own model would. Same-model pairs are measured
    /// too, at other factors, so an engine that charged a job by its own model (or by the
    /// wrong side of the pair) finishes both jobs at other times.
    #[test]
    fn a_busy_neighbour_costs_what_its_model_was_measured_to_cost() {
        let mut t = trace(&["spread"], &[("a", 0.0, 1000), ("b", 0.0, 500)]);
        t.workers = 2;
        // b is the small MLP: 4 ms a step, 2 s of work; a keeps 8 ms a step, 8 s.
        t.jobs[1].size = 6;
        let mut m = measured();
        let steps = m.step_time.as_mut().unwrap();
        steps.points.push(step("mlp", 6, 1.0, 1, 0.004));
        let curves = m.curves.as_mut().unwrap();
        let mut small = curves.runs[0].clone();
        small.size = 6;
        curves.runs.push(small);
        // Alone on the host a job runs at full speed (the host table: one busy worker, 1.0).
        m.host = Some(crate::measured::HostFile {
            header: steps.header.clone(),
            points: vec![crate::measured::HostPoint {
                model: "mlp".into(),
                size: 12,
                jobs: 1,
                rates: Vec::new(),
                relative: Some(1.0),
                repeats: Vec::new(),
                error: None,
            }],
        });
        let job = |size, efficiency| pair_job("mlp", size, Some(efficiency));
        m.host_pairs = Some(pairs_file(vec![
            // a beside a busy b: 0.75; b beside a busy a: 0.6.
            [job(12, 0.75), job(6, 0.6)],
            // Beside their own model: 0.9 and 0.4.
            [job(12, 0.9), job(12, 0.9)],
            [job(6, 0.4), job(6, 0.4)],
        ]));
        let run = t.simulate("spread", &m, false).unwrap();
        let jct = |id: &str| run.jobs.iter().find(|j| j.id == id).unwrap().jct;
        // b: its 2 s at 0.6 after the 0.5 s start. a: 0.75 meanwhile (2.5 s of its 8), then
        // the 5.5 s left alone at full speed.
        let b = 0.5 + 2.0 / 0.6;
        let a = b + (8.0 - (b - 0.5) * 0.75);
        assert!(
            (jct("job-2") - b).abs() < 1e-6 && (jct("job-1") - a).abs() < 1e-6,
            "a {} (want {a}), b {} (want {b}); charged by its own model they would be 9 and 5.5",
            jct("job-1"),
            jct("job-2"),
        );
    }

    #[test]
    fn beside_a_busy_worker_jobs_pay_the_co_location_measured_with_the_host_busy() {
        // a and c share w0 while b keeps w1 busy all along.
        let mut t = trace(
            &["spread"],
            &[("a", 0.0, 1000), ("b", 0.0, 5000), ("c", 0.0, 1000)],
        );
        t.workers = 2;
        // By the trace's order (a, b, c).
        let jct = |m: &Measured, id: &str| -> f64 {
            let run = t.simulate("spread", m, false).unwrap();
            let mut out: Vec<(String, f64)> =
                run.jobs.iter().map(|j| (j.id.clone(), j.jct)).collect();
            out.sort_by(|x, y| x.0.cmp(&y.0));
            out[usize::from(id == "c") * 2].1
        };
        let idle = measured();
        let mut free_of_cost = measured();
        free_of_cost.colocation = None;
        let mut busy = measured();
        busy.colocation_busy = Some(crate::measured::ColocationFile {
            neighbors: 1,
            points: busy
                .colocation
                .as_ref()
                .unwrap()
                .points
                .iter()
                .cloned()
                .map(|mut p| {
                    p.relative = Some(1.0);
                    p
                })
                .collect(),
            ..busy.colocation.clone().unwrap()
        });
        for id in ["a", "c"] {
            assert!(
                jct(&idle, id) > jct(&free_of_cost, id) + 1.0,
                "the idle-host table charges sharing"
            );
            assert!(
                (jct(&busy, id) - jct(&free_of_cost, id)).abs() < 1e-6,
                "with w1 busy, the busy-host table (no cost) holds: {} vs {}",
                jct(&busy, id),
                jct(&free_of_cost, id)
            );
        }
    }
}
