//! `cargo xtask experiment TRACE`: one trace, run live on the testbed and in the simulator,
//! compared job by job.
//!
//! The trace (`experiments/TRACE/trace.json`, [`converge_sim::trace::TraceFile`]) names the
//! jobs, their arrival times, the workers, the policies (baseline first) and the intervals.
//! For every policy the driver runs it `--runs` times on a fresh compose testbed, recording
//! every second each job's state, worker and CPU use through the control API, and keeps each
//! run as `experiments/TRACE/runs/POLICY-K.json`; then the simulator runs the same trace once
//! per policy with the runtime measured by `cargo xtask measure` (`sim/measured/`). It writes
//! `experiments/TRACE/results.md` (generated tables only: the reading text lives in the
//! directory's `README.md`, which this command never touches) and SVG plots: completion time
//! per job, live (median and range over the runs) beside simulated, for every policy; CPU use
//! per job and running jobs per worker of each policy's first live run.
//!
//! `--sim-only` skips the live runs and rebuilds the report from the recorded ones, so the
//! simulator's side can be iterated on in seconds.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use converge_messenger::pb;
use converge_sim::measured::{Measured, Probe, median};
use converge_sim::trace::TraceFile;
use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use serde::{Deserialize, Serialize};

use crate::cluster::{connect, wait_for_workers};
use crate::testbed::{Testbed, WORKERS};

/// The command's arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The trace: `experiments/TRACE/trace.json`.
    pub trace: String,
    /// Live runs per policy.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Keep the live runs already recorded under `experiments/TRACE/runs/` and run only the
    /// missing ones (after an interrupted run).
    #[arg(long)]
    pub resume: bool,
    /// No live run: simulate, and report against the live runs already recorded.
    #[arg(long)]
    pub sim_only: bool,
    /// Host port of the testbed manager's control API.
    #[arg(long, default_value_t = 7070)]
    pub port: u16,
}

/// Every trace under `experiments/`, by name.
pub fn traces(root: &Path) -> Result<Vec<TraceFile>> {
    let mut out = Vec::new();
    let dir = root.join("experiments");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(out);
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path().join("trace.json")))
        .filter(|p| p.is_file())
        .collect();
    paths.sort();
    for p in paths {
        out.push(TraceFile::load(&p)?);
    }
    Ok(out)
}

/// One live run, as recorded.
#[derive(Serialize, Deserialize, Default, Debug, Clone)]
pub struct LiveRun {
    /// The manager's policy.
    pub policy: String,
    /// Which run of this policy, from 1.
    pub run: usize,
    /// Per job name: times since the run's start, final state, last worker.
    pub jobs: BTreeMap<String, LiveJob>,
    /// (t, job name, CPU cores) every second.
    pub cpu: Vec<(f64, String, f64)>,
    /// (t, worker, running jobs) every second.
    pub per_worker: Vec<(f64, String, usize)>,
    /// Migrations, from the manager's event log.
    pub migrations: Vec<Migration>,
    /// (t, job name, step, the manager's predicted seconds to finish) every second while the
    /// job runs: its progress and its ETA against the finish it had.
    #[serde(default)]
    pub progress: Vec<(f64, String, u64, Option<f64>)>,
    /// The speed probe taken just before the run (each model alone, one core): what the
    /// simulator's step times are scaled to ([`Measured::at_speed_of`]).
    #[serde(default)]
    pub probe: Vec<Probe>,
}

/// One job of a live run.
#[derive(Serialize, Deserialize, Default, Debug, Clone)]
pub struct LiveJob {
    /// Submitted, seconds since the run's start (the manager's clock).
    pub submitted_s: f64,
    /// Finished, seconds since the run's start.
    pub finished_s: f64,
    /// Final state.
    pub state: String,
    /// Last worker.
    pub worker: String,
}

impl LiveJob {
    /// Completion time: submission to end, seconds.
    pub fn jct(&self) -> f64 {
        self.finished_s - self.submitted_s
    }

    /// Whether it completed (not failed or cancelled).
    pub fn completed(&self) -> bool {
        self.state == pb::JobState::label_of(pb::JobState::Completed as i32)
    }
}

/// A migration of a live run.
#[derive(Serialize, Deserialize, Default, Debug, Clone)]
pub struct Migration {
    /// When it finished, seconds since the run's start.
    pub t_s: f64,
    /// The job's name.
    pub job: String,
    /// From worker.
    pub from: String,
    /// To worker.
    pub to: String,
    /// Downtime, ms.
    pub downtime_ms: Option<u64>,
}

/// Runs the trace live (unless `--sim-only`) and in the simulator, and writes the report.
pub fn run(root: &Path, args: &Args) -> Result<()> {
    let dir = root.join("experiments").join(&args.trace);
    let trace = TraceFile::load(&dir.join("trace.json")).with_context(|| {
        let known: Vec<String> = traces(root)
            .map(|t| t.into_iter().map(|t| t.name).collect())
            .unwrap_or_default();
        format!(
            "trace `{}` (known: {})",
            args.trace,
            if known.is_empty() {
                "none".into()
            } else {
                known.join(", ")
            }
        )
    })?;
    if trace.workers > WORKERS.len() {
        bail!(
            "{}: the compose testbed has {} workers, the trace asks for {}",
            args.trace,
            WORKERS.len(),
            trace.workers
        );
    }
    let runs_dir = dir.join("runs");
    std::fs::create_dir_all(&runs_dir)?;
    if !args.sim_only {
        run_live(root, &trace, &runs_dir, args)?;
    }
    let live = load_runs(&runs_dir, &trace)?;
    let probes: Vec<Probe> = live
        .values()
        .flatten()
        .flat_map(|r| r.probe.iter().cloned())
        .collect();
    let measured = Measured::load(&root.join("sim/measured"))?.at_speed_of(&probes)?;
    let sims = simulate(&trace, &measured)?;
    let mut report = Report::new(&trace, &live, &sims, &measured);
    // The same trace under other seeds of the simulator's noise (the reported loss scatters
    // as measured): how much of one simulated run's agreement with the testbed is its draw.
    let others = (1..=OTHER_SEEDS)
        .map(|k| {
            let mut t = trace.clone();
            t.seed = trace.seed.wrapping_add(k);
            Ok(Report::new(&t, &live, &simulate(&t, &measured)?, &measured))
        })
        .collect::<Result<Vec<_>>>()?;
    report.seeds = report.spread(&others);
    report.table_repetitions = repetition_spread(&report, &trace, &live, &measured)?;
    let text = report.markdown();
    println!("{text}");
    std::fs::write(dir.join("results.md"), &text)?;
    std::fs::write(
        dir.join("results.json"),
        serde_json::to_string_pretty(&report.json())? + "\n",
    )?;
    for policy in &trace.policies {
        plot_completion(
            &dir.join(format!("completion-{policy}.svg")),
            &trace,
            policy,
            &report,
        )?;
        if let Some(first) = live.get(policy).and_then(|r| r.first()) {
            plot_cpu(&dir.join(format!("cpu-{policy}.svg")), &trace, first)?;
            plot_workers(&dir.join(format!("workers-{policy}.svg")), &trace, first)?;
            plot_eta(&dir.join(format!("eta-{policy}.svg")), &trace, first)?;
        }
    }
    println!("wrote {}", dir.display());
    Ok(())
}

/// Seeds of the simulator's noise the trace is also simulated with, besides its own.
const OTHER_SEEDS: u64 = 10;

/// The same trace simulated once per repetition of the sharing tables, each with every
/// factor taken from that repetition in place of the median ([`Measured::at_repetition`]):
/// how far the simulator's answer moves with the scatter of the factors it reads, to set
/// beside how far it is from the testbed. Empty where the tables were measured once.
fn repetition_spread(
    report: &Report,
    trace: &TraceFile,
    live: &BTreeMap<String, Vec<LiveRun>>,
    measured: &Measured,
) -> Result<Vec<Spread>> {
    let n = measured.repetitions();
    if n < 2 {
        return Ok(Vec::new());
    }
    let others = (0..n)
        .map(|k| {
            let m = measured.at_repetition(k);
            Ok(Report::new(trace, live, &simulate(trace, &m)?, &m))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(report.spread(&others))
}

/// Every policy of the trace, simulated once with the trace's seed.
fn simulate(trace: &TraceFile, measured: &Measured) -> Result<BTreeMap<String, SimRun>> {
    let mut sims = BTreeMap::new();
    for policy in &trace.policies {
        let run = trace
            .simulate(policy, measured, false)
            .with_context(|| format!("simulating {} under {policy}", trace.name))?;
        // A trace's catalog names each job's model after the job.
        sims.insert(
            policy.clone(),
            SimRun {
                jct: run.jobs.iter().map(|j| (j.model.clone(), j.jct)).collect(),
                worker: run
                    .jobs
                    .iter()
                    .map(|j| (j.model.clone(), format!("worker-{}", j.worker + 1)))
                    .collect(),
                migrations: run.migrations,
                eta: run
                    .jobs
                    .iter()
                    .map(|j| (j.model.clone(), j.eta_error))
                    .collect(),
            },
        );
    }
    Ok(sims)
}

fn run_path(runs_dir: &Path, policy: &str, k: usize) -> PathBuf {
    runs_dir.join(format!("{policy}-{k}.json"))
}

fn run_live(root: &Path, trace: &TraceFile, runs_dir: &Path, args: &Args) -> Result<()> {
    crate::images::build(root, &[])?;
    if !args.resume {
        for e in std::fs::read_dir(runs_dir)? {
            let p = e?.path();
            if p.extension().is_some_and(|x| x == "json") {
                std::fs::remove_file(p)?;
            }
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let mut services = vec!["manager"];
    services.extend(["agent-1", "agent-2"].iter().take(trace.workers).copied());
    let env = trace.testbed_env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let table = Measured::load(&root.join("sim/measured"))?
        .step_time
        .map(|f| f.header.settings)
        .context("sim/measured/step_time.json is missing: run `cargo xtask measure` first")?;
    let mut pairs: Vec<(String, u32)> = trace
        .jobs
        .iter()
        .map(|j| (j.model.clone(), j.size))
        .collect();
    pairs.sort();
    pairs.dedup();
    for k in 1..=args.runs {
        // Policies interleaved run by run, so a slow drift of the machine falls on all alike.
        for policy in &trace.policies {
            let path = run_path(runs_dir, policy, k);
            if path.exists() {
                println!("{policy} run {k}: kept {}", path.display());
                continue;
            }
            println!("{}: {policy}, run {k} of {}", trace.name, args.runs);
            // On a quiet machine, before the testbed starts.
            let probe = crate::measure::probe(&pairs, &table)?;
            let testbed = Testbed::up_with(root, policy, args.port, &services, &env)?;
            let result = rt.block_on(drive(trace, policy, k, args.port, |_, _| {}));
            if result.is_err() {
                testbed.print_logs();
            }
            drop(testbed);
            let mut run = result?;
            run.probe = probe;
            std::fs::write(&path, serde_json::to_string_pretty(&run)? + "\n")?;
        }
    }
    Ok(())
}

fn load_runs(runs_dir: &Path, trace: &TraceFile) -> Result<BTreeMap<String, Vec<LiveRun>>> {
    let mut out: BTreeMap<String, Vec<LiveRun>> = BTreeMap::new();
    for policy in &trace.policies {
        let mut k = 1;
        loop {
            let path = run_path(runs_dir, policy, k);
            let Ok(text) = std::fs::read_to_string(&path) else {
                break;
            };
            let run: LiveRun = serde_json::from_str(&text)
                .with_context(|| format!("reading {}", path.display()))?;
            out.entry(policy.clone()).or_default().push(run);
            k += 1;
        }
    }
    Ok(out)
}

/// Runs `trace` on the testbed at `port` (its manager running `policy`) and records it as
/// run `k`. Every second `view` gets the trace's jobs (in the trace's order, by name) and the
/// seconds since the start: the demo's live view.
pub async fn drive(
    trace: &TraceFile,
    policy: &str,
    k: usize,
    port: u16,
    mut view: impl FnMut(&[pb::Job], f64),
) -> Result<LiveRun> {
    let mut client = connect(port).await?;
    wait_for_workers(&mut client, trace.workers).await?;
    let mut run = LiveRun {
        policy: policy.to_string(),
        run: k,
        ..Default::default()
    };
    let t0 = Instant::now();
    let mut ids: BTreeMap<String, String> = BTreeMap::new();
    let mut pending: Vec<_> = trace.jobs.iter().collect();
    let deadline = Duration::from_secs(60 * 60);
    loop {
        let now = t0.elapsed().as_secs_f64();
        while let Some(job) = pending.first().filter(|j| j.at_s <= now) {
            let spec = pb::JobSpec {
                name: job.name.clone(),
                image: "converge/trainer:dev".into(),
                args: job.trainer_args(),
                cpus: job.cpus,
                ..Default::default()
            };
            let id = client
                .submit_job(pb::SubmitJobRequest { spec: Some(spec) })
                .await
                .map_err(|e| anyhow::anyhow!("submitting {}: {}", job.name, e.message()))?
                .into_inner()
                .job_id;
            ids.insert(id, job.name.clone());
            pending.remove(0);
        }
        let jobs = client
            .list_jobs(pb::ListJobsRequest::default())
            .await?
            .into_inner()
            .jobs;
        let mut mine: Vec<&pb::Job> = jobs.iter().filter(|j| ids.contains_key(&j.id)).collect();
        mine.sort_by_key(|j| &ids[&j.id]);
        view(&mine.into_iter().cloned().collect::<Vec<_>>(), now);
        let mut per_worker: BTreeMap<String, usize> = BTreeMap::new();
        for j in &jobs {
            let Some(name) = ids.get(&j.id) else { continue };
            if j.state == pb::JobState::Running as i32 {
                run.cpu.push((now, name.clone(), j.cpu_usage));
                let eta = j.eta.as_ref().map(|e| e.remaining_s).filter(|r| *r > 0.0);
                run.progress.push((now, name.clone(), j.step, eta));
                *per_worker.entry(j.worker_id.clone()).or_default() += 1;
            }
        }
        for w in client
            .list_workers(pb::ListWorkersRequest {})
            .await?
            .into_inner()
            .workers
        {
            let n = per_worker.get(&w.id).copied().unwrap_or(0);
            run.per_worker.push((now, w.id, n));
        }
        let done = pending.is_empty()
            && jobs
                .iter()
                .filter(|j| ids.contains_key(&j.id))
                .all(|j| pb::JobState::ended(j.state));
        if done {
            // The run's origin on the manager's clock: the first submission was due at the
            // first job's `at_s`.
            let first = jobs
                .iter()
                .filter(|j| ids.contains_key(&j.id))
                .map(|j| j.submitted_unix_ms)
                .min()
                .unwrap_or(0);
            let origin = first as f64 / 1000.0 - trace.jobs[0].at_s;
            for j in jobs.iter().filter(|j| ids.contains_key(&j.id)) {
                run.jobs.insert(
                    ids[&j.id].clone(),
                    LiveJob {
                        submitted_s: j.submitted_unix_ms as f64 / 1000.0 - origin,
                        finished_s: j.finished_unix_ms as f64 / 1000.0 - origin,
                        state: pb::JobState::label_of(j.state),
                        worker: j.worker_id.clone(),
                    },
                );
            }
            let mut events = client
                .watch_events(pb::WatchEventsRequest {
                    job_id: String::new(),
                    from_seq: 1,
                })
                .await?
                .into_inner();
            while let Ok(Ok(Some(e))) =
                tokio::time::timeout(Duration::from_millis(500), events.message()).await
            {
                if e.kind == pb::EventKind::Migration as i32
                    && let Some(d) = e.attributes.get("downtime_ms")
                {
                    run.migrations.push(Migration {
                        t_s: e.unix_ms as f64 / 1000.0 - origin,
                        job: ids.get(&e.job_id).cloned().unwrap_or(e.job_id.clone()),
                        from: e.attributes.get("from").cloned().unwrap_or_default(),
                        to: e.attributes.get("to").cloned().unwrap_or_default(),
                        downtime_ms: d.parse().ok(),
                    });
                }
            }
            return Ok(run);
        }
        if t0.elapsed() > deadline {
            bail!("{policy}: jobs did not finish within {deadline:?}");
        }
        // Ctrl-C (watched since the speed probe) ends the run through the testbed's guard.
        crate::measure::check_interrupt()?;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// The comparison.

/// What the simulator predicted for one policy.
struct SimRun {
    /// Completion time by job name.
    jct: BTreeMap<String, f64>,
    /// The worker each job finished on, by job name.
    worker: BTreeMap<String, String>,
    migrations: u64,
    /// The cluster core's ETA errors at 25/50/75% of its steps, by job name.
    eta: BTreeMap<String, [Option<f64>; 3]>,
}

/// How far the manager's predicted finish was off, as a fraction of the job's run, when the
/// job passed 25%, 50% and 75% of its steps: from the run's per-second records of step and
/// ETA (the core's own measure, `Job::eta_errors`, is the same quantity from its side). The
/// run starts at the job's first record as running.
fn live_eta_errors(r: &LiveRun, job: &str, steps: u64) -> [Option<f64>; 3] {
    let Some(done) = r.jobs.get(job).filter(|j| j.completed()) else {
        return [None; 3];
    };
    let rows: Vec<&(f64, String, u64, Option<f64>)> =
        r.progress.iter().filter(|p| p.1 == job).collect();
    let Some(start) = rows.first().map(|p| p.0) else {
        return [None; 3];
    };
    let run = (done.finished_s - start).max(1e-9);
    [0.25, 0.5, 0.75].map(|q| {
        rows.iter()
            .find(|p| p.2 as f64 >= q * steps as f64)
            .and_then(|p| p.3.map(|eta| ((p.0 + eta) - done.finished_s).abs() / run))
    })
}

/// ETA errors of one model under one policy: medians over its jobs (and live runs).
#[derive(Serialize)]
struct EtaRow {
    model: String,
    live_jobs: usize,
    live: [Option<f64>; 3],
    sim: [Option<f64>; 3],
}

/// One job under one policy: live runs against the simulator.
#[derive(Serialize)]
struct JobRow {
    job: String,
    at_s: f64,
    /// Completion time of each live run (None: the job did not complete in that run).
    live: Vec<Option<f64>>,
    live_median: Option<f64>,
    /// (max − min) / median over the live runs.
    live_spread: Option<f64>,
    sim: Option<f64>,
    /// (sim − live median) / live median.
    error: Option<f64>,
    /// The worker it finished on in each live run, and in the simulator.
    live_workers: Vec<String>,
    sim_worker: String,
}

/// One policy's summary.
#[derive(Serialize)]
struct PolicyRow {
    policy: String,
    runs: usize,
    /// Mean over the runs of each run's average completion time.
    live_avg_jct: Option<f64>,
    /// Each live run's average completion time, if every job of the trace completed in it.
    #[serde(skip)]
    run_avgs: Vec<Option<f64>>,
    /// (max − min) / mean of the runs' average completion times.
    live_avg_spread: Option<f64>,
    sim_avg_jct: Option<f64>,
    live_makespan: Option<f64>,
    sim_makespan: Option<f64>,
    /// Median over jobs of |error|.
    median_abs_error: Option<f64>,
    live_migrations: Option<f64>,
    sim_migrations: u64,
    jobs: Vec<JobRow>,
    eta: Vec<EtaRow>,
}

struct Report {
    trace: TraceFile,
    rows: Vec<PolicyRow>,
    provenance: String,
    /// Per policy, what [`OTHER_SEEDS`] other seeds of the simulator's noise give.
    seeds: Vec<Spread>,
    /// Per policy, what each repetition of the sharing tables gives in place of their medians
    /// ([`Measured::at_repetition`]); empty where the tables were measured once.
    table_repetitions: Vec<Spread>,
    /// What sharing a worker cost each model live, against the tables.
    sharing: Vec<SharingRow>,
    /// Each live run as the prediction of its policy's other runs, beside the simulator.
    held_out: Vec<HeldOutRow>,
}

/// One live run taken as the prediction of its policy's other live runs, and the simulator
/// held to the same reference: the goals asked of the testbed itself. A goal that a live run
/// misses against its own repetitions is one the testbed does not reproduce to.
#[derive(Serialize)]
struct HeldOutRow {
    policy: String,
    /// The run taken out (1-based).
    run: usize,
    /// Median over jobs of |this run's completion − the other runs' median| / that median.
    live_error: Option<f64>,
    /// The simulator's median absolute error per job against the same medians.
    sim_error: Option<f64>,
    /// Points between this run's policy/baseline ratio of average completion (against the
    /// baseline's run of the same round: rounds interleave the policies) and the ratio of the
    /// other rounds' averages. `None` for the baseline.
    live_ratio_difference: Option<f64>,
    /// Points between the simulator's ratio and the other rounds' ratio.
    sim_ratio_difference: Option<f64>,
}

/// [`HeldOutRow`]s of every policy with at least two live runs, run by run.
fn held_out(rows: &[PolicyRow]) -> Vec<HeldOutRow> {
    let avg = |row: &PolicyRow, k: usize| row.run_avgs.get(k).copied().flatten();
    let others_avg = |row: &PolicyRow, k: usize| -> Option<f64> {
        let v: Option<Vec<f64>> = (0..row.runs)
            .filter(|&i| i != k)
            .map(|i| avg(row, i))
            .collect();
        v.and_then(|v| mean(&v))
    };
    let ratio = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b);
    let points = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| 100.0 * (a - b).abs());
    let base = &rows[0];
    let mut out = Vec::new();
    for (p, row) in rows.iter().enumerate().filter(|(_, r)| r.runs > 1) {
        for k in 0..row.runs {
            let (mut live, mut sim) = (Vec::new(), Vec::new());
            for j in &row.jobs {
                let others = j.live.iter().enumerate().filter(|&(i, _)| i != k);
                let Some(m) = median(others.filter_map(|(_, v)| *v)) else {
                    continue;
                };
                live.extend(j.live[k].map(|x| ((x - m) / m).abs()));
                sim.extend(j.sim.map(|s| ((s - m) / m).abs()));
            }
            let (live_ratio_difference, sim_ratio_difference) = if p == 0 {
                (None, None)
            } else {
                let others = ratio(others_avg(row, k), others_avg(base, k));
                (
                    points(ratio(avg(row, k), avg(base, k)), others),
                    points(ratio(row.sim_avg_jct, base.sim_avg_jct), others),
                )
            };
            out.push(HeldOutRow {
                policy: row.policy.clone(),
                run: k + 1,
                live_error: median(live),
                sim_error: median(sim),
                live_ratio_difference,
                sim_ratio_difference,
            });
        }
    }
    out
}

/// One policy's goals over variants of one simulated run (other seeds of the simulator's
/// noise, or each repetition of the sharing tables), one value per variant.
#[derive(Serialize)]
struct Spread {
    policy: String,
    /// Median absolute error per job.
    errors: Vec<f64>,
    /// Points between the live and the simulated policy/baseline ratios (the baseline's row:
    /// none).
    ratio_differences: Vec<f64>,
}

/// `v` with `d` decimals, `–` where there is none (the reports' tables).
fn fixed(v: Option<f64>, d: usize) -> String {
    v.map_or("–".to_string(), |v| format!("{v:.d$}"))
}

/// `v` as a percentage with one decimal, `–` where there is none.
fn abs_pct(v: Option<f64>) -> String {
    v.map_or("–".to_string(), |v| format!("{:.1}%", 100.0 * v))
}

/// A table of [`Spread`]s, one row per policy: the median and range over the variants
/// (`what`: "seeds", "repetitions") of each goal, and how many variants meet it.
fn spread_table(s: &mut String, spreads: &[Spread], what: &str) {
    let _ = writeln!(
        s,
        "| policy | median abs. error per job: median | range | {what} ≤ 10% | ratio difference (points): median | range | {what} ≤ 5 |\n|---|---:|---:|---:|---:|---:|---:|"
    );
    let range = |v: &[f64], scale: f64, d: usize| {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min) * scale;
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max) * scale;
        if v.is_empty() {
            "–".to_string()
        } else {
            format!("{lo:.d$}–{hi:.d$}")
        }
    };
    let within = |v: &[f64], goal: f64| {
        if v.is_empty() {
            "–".to_string()
        } else {
            format!(
                "{} of {}",
                v.iter().filter(|&&x| x <= goal).count(),
                v.len()
            )
        }
    };
    for sp in spreads {
        let _ = writeln!(
            s,
            "| {} | {} | {}% | {} | {} | {} | {} |",
            sp.policy,
            abs_pct(median(sp.errors.clone())),
            range(&sp.errors, 100.0, 1),
            within(&sp.errors, 0.10),
            fixed(median(sp.ratio_differences.clone()), 1),
            range(&sp.ratio_differences, 1.0, 1),
            within(&sp.ratio_differences, 5.0),
        );
    }
}

/// Per model (and size), the median ETA errors of its jobs live (over every run) and
/// simulated.
fn eta_rows(trace: &TraceFile, runs: &[LiveRun], sim: &SimRun) -> Vec<EtaRow> {
    // Per model: live errors and simulated errors at each quarter, live jobs with a half-way one.
    type Errors = ([Vec<f64>; 3], [Vec<f64>; 3], usize);
    let mut by_model: BTreeMap<String, Errors> = BTreeMap::new();
    for j in &trace.jobs {
        let e = by_model
            .entry(format!("{} {}", j.model, j.size))
            .or_default();
        for r in runs {
            let live = live_eta_errors(r, &j.name, j.steps);
            e.2 += usize::from(live[1].is_some());
            for (q, x) in live.iter().enumerate() {
                e.0[q].extend(x);
            }
        }
        for (q, x) in sim.eta.get(&j.name).into_iter().flatten().enumerate() {
            e.1[q].extend(x);
        }
    }
    by_model
        .into_iter()
        .map(|(model, (live, simulated, n))| EtaRow {
            model,
            live_jobs: n,
            live: live.map(median),
            sim: simulated.map(median),
        })
        .collect()
}

/// (max − min) / `center` of repeated runs' values; `None` for fewer than two runs.
fn spread_around(values: &[f64], center: f64) -> Option<f64> {
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (values.len() > 1).then(|| (hi - lo) / center)
}

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// What sharing a worker cost one model on the testbed, against what the simulator charges.
#[derive(Serialize)]
struct SharingRow {
    /// Model and size.
    model: String,
    /// Jobs running on its worker.
    jobs: usize,
    /// CPU-seconds of the job measured at that count.
    cpu_s: f64,
    /// Its steps per CPU-second over its speed probe alone (1 = as fast as alone).
    live: f64,
    /// The co-location table's factor for that many copies, under free competition: what the
    /// simulator charges it with no pair measured.
    table: Option<f64>,
    /// What the simulator charges it for that many copies while another worker of the host
    /// is busy: the host's factor for two busy workers (beside the other models of
    /// `host_pairs.json` in equal shares where measured, else beside its own model) times the
    /// co-location table measured with the host busy (or the idle one where that was not
    /// measured); `None` on a trace of one worker.
    busy: Option<f64>,
}

/// Each model's steps per CPU-second in the live runs while its worker ran k jobs, over its
/// speed probe. From every run of every policy that leaves the CPU to free competition
/// (FlowCon's quotas change what a CPU-second is worth), between consecutive progress samples
/// of a job that never moved, during which every per-second CPU sample saw the same number of
/// busy jobs (above 0.02 cores) on its worker.
fn live_sharing(
    trace: &TraceFile,
    live: &BTreeMap<String, Vec<LiveRun>>,
    measured: &Measured,
) -> Vec<SharingRow> {
    // (model, size) -> jobs -> (CPU-seconds, CPU-seconds × efficiency)
    let mut acc: BTreeMap<(String, u32), BTreeMap<usize, (f64, f64)>> = BTreeMap::new();
    let by_name: BTreeMap<&str, (&str, u32)> = trace
        .jobs
        .iter()
        .map(|j| (j.name.as_str(), (j.model.as_str(), j.size)))
        .collect();
    for (policy, runs) in live {
        if policy.starts_with("flowcon") {
            continue;
        }
        for r in runs {
            let probe: BTreeMap<(&str, u32), f64> = r
                .probe
                .iter()
                .map(|p| ((p.model.as_str(), p.size), p.s_per_step))
                .collect();
            let moved: Vec<&str> = r.migrations.iter().map(|m| m.job.as_str()).collect();
            // Per sample time: each job's cores.
            let mut samples: BTreeMap<i64, BTreeMap<&str, f64>> = BTreeMap::new();
            for (t, job, cores) in &r.cpu {
                samples
                    .entry((t * 10.0).round() as i64)
                    .or_default()
                    .insert(job.as_str(), *cores);
            }
            let worker = |job: &str| r.jobs.get(job).map(|j| j.worker.as_str());
            for (name, &(model, size)) in &by_name {
                let (Some(&s_per_step), Some(w)) = (probe.get(&(model, size)), worker(name)) else {
                    continue;
                };
                if moved.contains(name) {
                    continue;
                }
                let points: Vec<(f64, u64)> = r
                    .progress
                    .iter()
                    .filter(|p| p.1 == *name)
                    .map(|p| (p.0, p.2))
                    .collect();
                for pair in points.windows(2) {
                    let ((t0, s0), (t1, s1)) = (pair[0], pair[1]);
                    if s1 <= s0 {
                        continue;
                    }
                    let inside: Vec<&BTreeMap<&str, f64>> = samples
                        .range((t0 * 10.0).round() as i64 + 1..=(t1 * 10.0).round() as i64)
                        .map(|(_, v)| v)
                        .collect();
                    if inside.is_empty() {
                        continue;
                    }
                    let busy: Vec<usize> = inside
                        .iter()
                        .map(|v| {
                            v.iter()
                                .filter(|(j, c)| **c > 0.02 && worker(j) == Some(w))
                                .count()
                        })
                        .collect();
                    let k = busy[0];
                    if k == 0 || busy.iter().any(|&b| b != k) {
                        continue;
                    }
                    let mean_cores = inside
                        .iter()
                        .map(|v| v.get(name).copied().unwrap_or(0.0))
                        .sum::<f64>()
                        / inside.len() as f64;
                    let cpu = mean_cores * (t1 - t0);
                    if cpu < 0.05 {
                        continue;
                    }
                    let eff = (s1 - s0) as f64 * s_per_step / cpu;
                    let e = acc
                        .entry((model.to_string(), size))
                        .or_default()
                        .entry(k)
                        .or_default();
                    e.0 += cpu;
                    e.1 += cpu * eff;
                }
            }
        }
    }
    let several = trace.workers > 1;
    acc.into_iter()
        .flat_map(|((model, size), by_k)| {
            let sharing = measured
                .cost(&model, size, 1)
                .map(|c| c.sharing)
                .unwrap_or_default();
            // Beside a busy worker running the other measured models in equal shares: the
            // live rows mix whatever the other worker ran.
            let neighbours: Vec<(String, f64)> = sharing
                .host_beside
                .keys()
                .map(|k| (k.clone(), 1.0))
                .collect();
            by_k.into_iter()
                .map(move |(jobs, (cpu_s, weighted))| SharingRow {
                    model: format!("{model} {size}"),
                    jobs,
                    cpu_s,
                    live: weighted / cpu_s,
                    table: sharing.free.get(jobs - 1).copied(),
                    busy: several.then(|| {
                        let neighbours: Vec<(&str, f64)> =
                            neighbours.iter().map(|(k, w)| (k.as_str(), *w)).collect();
                        sharing.charged(2, false, jobs as f64, None, &neighbours)
                    }),
                })
        })
        .collect()
}

impl Report {
    fn new(
        trace: &TraceFile,
        live: &BTreeMap<String, Vec<LiveRun>>,
        sims: &BTreeMap<String, SimRun>,
        measured: &Measured,
    ) -> Self {
        let empty = Vec::new();
        let rows: Vec<PolicyRow> = trace
            .policies
            .iter()
            .map(|policy| {
                let runs = live.get(policy).unwrap_or(&empty);
                let sim = &sims[policy];
                let jobs: Vec<JobRow> = trace
                    .jobs
                    .iter()
                    .map(|j| {
                        let lv: Vec<Option<f64>> = runs
                            .iter()
                            .map(|r| {
                                r.jobs
                                    .get(&j.name)
                                    .filter(|x| x.completed())
                                    .map(LiveJob::jct)
                            })
                            .collect();
                        let done: Vec<f64> = lv.iter().flatten().copied().collect();
                        let med = median(done.clone());
                        let spread = med.and_then(|m| spread_around(&done, m));
                        let s = sim.jct.get(&j.name).copied();
                        JobRow {
                            job: j.name.clone(),
                            at_s: j.at_s,
                            live: lv,
                            live_median: med,
                            live_spread: spread,
                            sim: s,
                            error: med.zip(s).map(|(m, s)| (s - m) / m),
                            live_workers: runs
                                .iter()
                                .map(|r| {
                                    r.jobs.get(&j.name).map_or("–".into(), |x| {
                                        x.worker.trim_start_matches("worker-").to_string()
                                    })
                                })
                                .collect(),
                            sim_worker: sim.worker.get(&j.name).map_or("–".into(), |w| {
                                w.trim_start_matches("worker-").to_string()
                            }),
                        }
                    })
                    .collect();
                // Per-run averages over the jobs that completed in every run.
                let complete = |r: &LiveRun| {
                    trace
                        .jobs
                        .iter()
                        .all(|j| r.jobs.get(&j.name).is_some_and(LiveJob::completed))
                };
                let full: Vec<&LiveRun> = runs.iter().filter(|r| complete(r)).collect();
                let run_avgs: Vec<Option<f64>> = runs
                    .iter()
                    .map(|r| {
                        complete(r).then(|| {
                            r.jobs.values().map(LiveJob::jct).sum::<f64>() / r.jobs.len() as f64
                        })
                    })
                    .collect();
                let avgs: Vec<f64> = run_avgs.iter().flatten().copied().collect();
                let spans: Vec<f64> = full
                    .iter()
                    .map(|r| r.jobs.values().map(|j| j.finished_s).fold(0.0, f64::max))
                    .collect();
                let live_avg = mean(&avgs);
                let sim_values: Vec<f64> = sim.jct.values().copied().collect();
                let sim_span = trace
                    .jobs
                    .iter()
                    .filter_map(|j| sim.jct.get(&j.name).map(|c| c + j.at_s))
                    .fold(0.0, f64::max);
                PolicyRow {
                    policy: policy.clone(),
                    runs: runs.len(),
                    live_avg_jct: live_avg,
                    run_avgs,
                    live_avg_spread: live_avg.and_then(|m| spread_around(&avgs, m)),
                    sim_avg_jct: mean(&sim_values),
                    live_makespan: mean(&spans),
                    sim_makespan: (sim_span > 0.0).then_some(sim_span),
                    median_abs_error: median(jobs.iter().filter_map(|r| r.error.map(f64::abs))),
                    live_migrations: mean(
                        &runs
                            .iter()
                            .map(|r| r.migrations.len() as f64)
                            .collect::<Vec<_>>(),
                    ),
                    sim_migrations: sim.migrations,
                    jobs,
                    eta: eta_rows(trace, runs, sim),
                }
            })
            .collect();
        Report {
            trace: trace.clone(),
            held_out: held_out(&rows),
            rows,
            provenance: provenance(measured),
            seeds: Vec::new(),
            table_repetitions: Vec::new(),
            sharing: live_sharing(trace, live, measured),
        }
    }

    /// Points between the live and the simulated ratio of `row`'s policy to the baseline.
    fn ratio_difference(&self, row: &PolicyRow) -> Option<f64> {
        let (l, s) = self.ratios(row);
        l.zip(s).map(|(l, s)| 100.0 * (s - l).abs())
    }

    /// Each policy's goals in `others`, variants of the same trace's simulated run.
    fn spread(&self, others: &[Report]) -> Vec<Spread> {
        self.rows
            .iter()
            .enumerate()
            .map(|(i, row)| Spread {
                policy: row.policy.clone(),
                errors: others
                    .iter()
                    .filter_map(|o| o.rows[i].median_abs_error)
                    .collect(),
                ratio_differences: others
                    .iter()
                    .filter(|_| i > 0)
                    .filter_map(|o| o.ratio_difference(&o.rows[i]))
                    .collect(),
            })
            .collect()
    }

    /// (live, sim) ratio of a policy's average completion time to the baseline's.
    fn ratios(&self, row: &PolicyRow) -> (Option<f64>, Option<f64>) {
        let base = &self.rows[0];
        (
            row.live_avg_jct.zip(base.live_avg_jct).map(|(p, b)| p / b),
            row.sim_avg_jct.zip(base.sim_avg_jct).map(|(p, b)| p / b),
        )
    }

    fn json(&self) -> serde_json::Value {
        let ratios: Vec<serde_json::Value> = self
            .rows
            .iter()
            .map(|r| {
                let (l, s) = self.ratios(r);
                serde_json::json!({"policy": r.policy, "live_ratio": l, "sim_ratio": s})
            })
            .collect();
        serde_json::json!({
            "trace": self.trace.name,
            "baseline": self.trace.policies[0],
            "measured": self.provenance,
            "policies": self.rows,
            "ratios_to_baseline": ratios,
            "other_seeds": self.seeds,
            "table_repetitions": self.table_repetitions,
            "sharing_live": self.sharing,
            "live_held_out": self.held_out,
        })
    }

    fn markdown(&self) -> String {
        let t = &self.trace;
        let pct = |v: Option<f64>| v.map_or("–".to_string(), |v| format!("{:+.1}%", 100.0 * v));
        let mut s = String::new();
        let _ = writeln!(s, "# {}: live against simulated\n", t.name);
        let _ = writeln!(s, "{}\n", t.title);
        let _ = writeln!(
            s,
            "Generated by `cargo xtask experiment {}` (live runs: `runs/*.json`; simulator runtime: {}). The reading is in `README.md`.\n",
            t.name, self.provenance
        );
        let _ = writeln!(s, "## Summary\n");
        let _ = writeln!(
            s,
            "| policy | live runs | avg completion live (s) | spread of live runs | avg completion sim (s) | median abs. error per job (goal ≤ 10%) | makespan live / sim (s) | migrations live (mean) / sim |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|");
        for r in &self.rows {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} / {} | {} / {} |",
                r.policy,
                r.runs,
                fixed(r.live_avg_jct, 1),
                abs_pct(r.live_avg_spread),
                fixed(r.sim_avg_jct, 1),
                abs_pct(r.median_abs_error),
                fixed(r.live_makespan, 1),
                fixed(r.sim_makespan, 1),
                fixed(r.live_migrations, 1),
                r.sim_migrations
            );
        }
        if self.rows.len() > 1 {
            let _ = writeln!(
                s,
                "\n| policy / `{}` | avg completion ratio live | sim | difference (points; goal ≤ 5) | makespan ratio live | sim |",
                t.policies[0]
            );
            let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|");
            let base = &self.rows[0];
            for r in &self.rows[1..] {
                let (l, sm) = self.ratios(r);
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {} |",
                    r.policy,
                    fixed(l, 3),
                    fixed(sm, 3),
                    fixed(self.ratio_difference(r), 1),
                    fixed(
                        r.live_makespan.zip(base.live_makespan).map(|(p, b)| p / b),
                        3
                    ),
                    fixed(r.sim_makespan.zip(base.sim_makespan).map(|(p, b)| p / b), 3),
                );
            }
        }
        if !self.seeds.is_empty() {
            let _ = writeln!(
                s,
                "\nThe simulator reports each job's loss with the scatter its model was measured to have, so one simulated run is one draw of that noise. The same trace with {OTHER_SEEDS} other seeds: per policy, the median and range over the seeds, and how many meet the goal.\n"
            );
            spread_table(&mut s, &self.seeds, "seeds");
        }
        if !self.table_repetitions.is_empty() {
            let _ = writeln!(
                s,
                "\nThe sharing factors the simulator charges (co-location, pairs and host, as measured in `sim/measured/`) are each the median of their repetitions, passes minutes apart, and the repetitions scatter (`sim/README.md` gives each table's count and ranges). The same trace with every factor taken from one repetition in place of the median, once per repetition up to the most any table holds (a factor measured fewer times keeps its median): per policy, the median and range over these runs, and how many meet the goal. Where this range is as wide as the distance to the live runs, the tables do not pin the answer down more finely than the goal.\n"
            );
            spread_table(&mut s, &self.table_repetitions, "repetitions");
        }
        if !self.held_out.is_empty() {
            let _ = writeln!(
                s,
                "\n## The live runs against each other\n\nThe goals asked of the testbed itself: each live run taken as the prediction of its policy's other live runs (each job against the median of its completion times in the other runs; the run's policy/baseline ratio of average completion, against the baseline's run of the same round, against the ratio of the other rounds' averages), beside the simulator held to the same references. A goal that a live run misses here is one the testbed does not reproduce itself to with this many runs.\n\n| policy | run left out | median abs. error per job: that run | sim | ratio difference (points): that run | sim |\n|---|---:|---:|---:|---:|---:|"
            );
            for h in &self.held_out {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {} |",
                    h.policy,
                    h.run,
                    abs_pct(h.live_error),
                    abs_pct(h.sim_error),
                    fixed(h.live_ratio_difference, 1),
                    fixed(h.sim_ratio_difference, 1),
                );
            }
        }
        for r in &self.rows {
            let _ = writeln!(s, "\n## `{}`: completion time per job (s)\n", r.policy);
            let runs: Vec<String> = (1..=r.runs).map(|k| format!("live {k}")).collect();
            let _ = writeln!(
                s,
                "| job | arrives (s) | {} | live median | live spread | sim | sim error | finished on worker: live runs / sim |",
                runs.join(" | ")
            );
            let _ = writeln!(
                s,
                "|---|---:|{}---:|---:|---:|---:|---|",
                "---:|".repeat(r.runs)
            );
            for j in &r.jobs {
                let lv: Vec<String> = j.live.iter().map(|v| fixed(*v, 1)).collect();
                let _ = writeln!(
                    s,
                    "| {} | {:.0} | {} | {} | {} | {} | {} | {} / {} |",
                    j.job,
                    j.at_s,
                    lv.join(" | "),
                    fixed(j.live_median, 1),
                    abs_pct(j.live_spread),
                    fixed(j.sim, 1),
                    pct(j.error),
                    j.live_workers.join(" "),
                    j.sim_worker
                );
            }
        }
        if !self.sharing.is_empty() {
            let several = self.sharing.iter().any(|r| r.busy.is_some());
            let _ = writeln!(
                s,
                "\n## Sharing a worker, live against the tables\n\nEach model's steps per CPU-second on the testbed while its worker ran k jobs, over its speed probe alone (1.00: as fast as alone), from every live run under free competition (intervals between two progress samples of a job that never moved, during which its worker's count of busy jobs did not change); beside it, the same over the model's own one-job row (what sharing cost it there), and what the simulator charges k jobs of that model under free competition (the co-location table's factor for k copies; beside exactly one job of a measured pair, the pair's instead){}.\n\n| model | jobs on its worker | CPU-seconds measured | live, over the probe | live, over live with 1 job | table, k copies |{}\n|---|---:|---:|---:|---:|---:|{}",
                if several {
                    "; on a trace of several workers, also what it charges them while another worker of the host is busy (the host's factor for two busy workers, beside the other models measured in `host_pairs.json` in equal shares where they were, else beside its own model, times the co-location table measured with the host busy, where it was)"
                } else {
                    ""
                },
                if several {
                    " table, another worker busy |"
                } else {
                    ""
                },
                if several { "---:|" } else { "" },
            );
            for row in &self.sharing {
                let busy = if several {
                    format!(" {} |", fixed(row.busy, 2))
                } else {
                    String::new()
                };
                let alone = self
                    .sharing
                    .iter()
                    .find(|o| o.model == row.model && o.jobs == 1)
                    .map(|o| o.live);
                let _ = writeln!(
                    s,
                    "| {} | {} | {:.0} | {:.2} | {} | {} |{busy}",
                    row.model,
                    row.jobs,
                    row.cpu_s,
                    row.live,
                    fixed(alone.map(|a| row.live / a), 2),
                    fixed(row.table, 2),
                );
            }
        }
        let _ = writeln!(
            s,
            "\n## ETA accuracy\n\nHow far the manager's predicted finish (`GetJob`'s ETA) was from the real one, as a fraction of the job's run, when the job passed 25%, 50% and 75% of its steps: median over the jobs of each model, live (every run) and simulated. Goal: ≤ 15% at half-way.\n\n| policy | model | live jobs | live 25% | 50% | 75% | sim 25% | 50% | 75% |\n|---|---|---:|---:|---:|---:|---:|---:|---:|"
        );
        for row in &self.rows {
            for e in &row.eta {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    row.policy,
                    e.model,
                    e.live_jobs,
                    abs_pct(e.live[0]),
                    abs_pct(e.live[1]),
                    abs_pct(e.live[2]),
                    abs_pct(e.sim[0]),
                    abs_pct(e.sim[1]),
                    abs_pct(e.sim[2]),
                );
            }
        }
        let _ = writeln!(
            s,
            "\nPlots: `completion-POLICY.svg` (live median with the range of the runs, and the simulator's, per job), `cpu-POLICY.svg` and `workers-POLICY.svg` (the first live run: CPU cores per job, running jobs per worker with migrations marked), `eta-POLICY.svg` (the first live run: each job's predicted finish over time against its real finish)."
        );
        s
    }
}

fn provenance(m: &Measured) -> String {
    let date = m
        .step_time
        .as_ref()
        .map_or("not measured".to_string(), |f| {
            format!("`sim/measured/`, step times measured {}", f.header.date)
        });
    // The sharing tables are measured apart from the step times, and were again later.
    let sharing: Vec<&str> = m.sharing_headers().map(|h| h.date.as_str()).collect();
    let date = match (sharing.iter().min(), sharing.iter().max()) {
        (Some(first), Some(last)) if first == last => format!("{date}, sharing tables {first}"),
        (Some(first), Some(last)) => format!("{date}, sharing tables {first} to {last}"),
        _ => date,
    };
    let date = if m.quick() {
        format!("{date} — a `--quick` smoke run, not data")
    } else {
        date
    };
    if m.speed.is_empty() {
        return format!("{date}; no speed probe beside these runs: step times as measured");
    }
    let factors: Vec<String> = m
        .speed
        .iter()
        .map(|((model, size), f)| format!("{model} {size} ×{f:.2}"))
        .collect();
    format!(
        "{date}; step times scaled to the median of the speed probes taken before each live \
         run (probe / table: {})",
        factors.join(", ")
    )
}

// ---------------------------------------------------------------------------------------------
// Plots.

/// Every plot's canvas: white, 900 × 420, at `path`.
pub(crate) fn canvas(path: &Path) -> Result<DrawingArea<SVGBackend<'_>, Shift>> {
    let root = SVGBackend::new(path, (900, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    Ok(root)
}

/// A chart on `root` with every plot's caption style, margins and axis areas.
pub(crate) fn chart<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, Shift>,
    caption: String,
    x: std::ops::Range<f64>,
    y: std::ops::Range<f64>,
    y_label_area: u32,
) -> Result<ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>> {
    Ok(ChartBuilder::on(root)
        .caption(caption, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(y_label_area)
        .build_cartesian_2d(x, y)?)
}

/// Draws the chart's legend and writes the file.
pub(crate) fn finish<'a, 'b: 'a>(
    chart: &mut ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    root: &DrawingArea<SVGBackend<'b>, Shift>,
    what: &str,
) -> Result<()> {
    chart
        .configure_series_labels()
        .background_style(WHITE)
        .border_style(BLACK)
        .draw()?;
    root.present()
        .with_context(|| format!("writing the {what} plot"))?;
    Ok(())
}

fn plot_completion(path: &Path, trace: &TraceFile, policy: &str, report: &Report) -> Result<()> {
    let Some(row) = report.rows.iter().find(|r| r.policy == policy) else {
        return Ok(());
    };
    let names: Vec<String> = row.jobs.iter().map(|j| j.job.clone()).collect();
    let live = Bars {
        label: "live (median of runs)".into(),
        values: row.jobs.iter().map(|j| j.live_median).collect(),
        ranges: row
            .jobs
            .iter()
            .map(|j| {
                let done: Vec<f64> = j.live.iter().flatten().copied().collect();
                let lo = done.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = done.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                (lo.is_finite() && hi.is_finite()).then_some((lo, hi))
            })
            .collect(),
        color: BLUE,
    };
    let sim = Bars {
        label: "simulated".into(),
        values: row.jobs.iter().map(|j| j.sim).collect(),
        ranges: Vec::new(),
        color: RED,
    };
    plot_bars(
        path,
        format!("{}: completion time per job under {policy}", trace.name),
        &names,
        &[live, sim],
    )
}

/// One series of a grouped bar plot: a value per job, optionally a range drawn over it.
pub(crate) struct Bars {
    pub label: String,
    pub values: Vec<Option<f64>>,
    /// (low, high) per job; empty for none.
    pub ranges: Vec<Option<(f64, f64)>>,
    pub color: RGBColor,
}

/// Completion time per job, one bar per series side by side in each job's slot.
pub(crate) fn plot_bars(
    path: &Path,
    caption: String,
    names: &[String],
    series: &[Bars],
) -> Result<()> {
    let n = names.len();
    let top = series
        .iter()
        .flat_map(|s| {
            s.values
                .iter()
                .flatten()
                .copied()
                .chain(s.ranges.iter().flatten().map(|r| r.1))
        })
        .fold(1.0, f64::max)
        * 1.1;
    let root = canvas(path)?;
    let mut chart = chart(&root, caption, 0.0..n as f64, 0.0..top, 45)?;
    chart
        .configure_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| names.get(x.floor() as usize).cloned().unwrap_or_default())
        .y_desc("completion time (s)")
        .draw()?;
    // Each job's slot: 0.1 margin, then the series' bars across 0.8.
    let width = 0.8 / series.len().max(1) as f64;
    for (k, s) in series.iter().enumerate() {
        let left = |i: usize| i as f64 + 0.1 + k as f64 * width;
        let color = s.color.mix(0.7);
        let bars: Vec<Rectangle<(f64, f64)>> = s
            .values
            .iter()
            .enumerate()
            .filter_map(|(i, v)| {
                Some(Rectangle::new(
                    [(left(i), 0.0), (left(i) + width * 0.95, (*v)?)],
                    color.filled(),
                ))
            })
            .collect();
        chart
            .draw_series(bars)?
            .label(s.label.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
        chart.draw_series(s.ranges.iter().enumerate().filter_map(|(i, r)| {
            let (lo, hi) = (*r)?;
            let x = left(i) + width * 0.475;
            Some(PathElement::new(
                vec![(x, lo), (x, hi)],
                BLACK.stroke_width(2),
            ))
        }))?;
    }
    finish(&mut chart, &root, "completion")
}

/// Each job's predicted finish (time + ETA) over time, and its real finish as a dashed level.
pub(crate) fn plot_eta(path: &Path, trace: &TraceFile, r: &LiveRun) -> Result<()> {
    let end = r
        .jobs
        .values()
        .map(|j| j.finished_s)
        .chain(r.progress.iter().filter_map(|p| Some(p.0 + p.3?)))
        .fold(1.0, f64::max)
        * 1.05;
    let root = canvas(path)?;
    let mut chart = chart(
        &root,
        format!(
            "{}: predicted finish against real finish ({}, live run {})",
            trace.name, r.policy, r.run
        ),
        0.0..end,
        0.0..end,
        55,
    )?;
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .y_desc("finish (s)")
        .draw()?;
    for (i, job) in trace.jobs.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let pts: Vec<(f64, f64)> = r
            .progress
            .iter()
            .filter(|p| p.1 == job.name)
            .filter_map(|p| Some((p.0, p.0 + p.3?)))
            .collect();
        if let (Some(first), Some(done)) = (pts.first(), r.jobs.get(&job.name)) {
            chart.draw_series(DashedLineSeries::new(
                [
                    (first.0, done.finished_s),
                    (done.finished_s, done.finished_s),
                ],
                4,
                3,
                color.stroke_width(1),
            ))?;
        }
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(2)))?
            .label(job.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], color));
    }
    finish(&mut chart, &root, "ETA")
}

pub(crate) fn plot_cpu(path: &Path, trace: &TraceFile, r: &LiveRun) -> Result<()> {
    let end = r.cpu.iter().map(|c| c.0).fold(1.0, f64::max);
    let root = canvas(path)?;
    let mut chart = chart(
        &root,
        format!(
            "{}: CPU use per job ({}, live run {})",
            trace.name, r.policy, r.run
        ),
        0.0..end,
        0.0..1.2,
        45,
    )?;
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .y_desc("CPU (cores)")
        .draw()?;
    for (i, job) in trace.jobs.iter().enumerate() {
        let pts: Vec<(f64, f64)> = r
            .cpu
            .iter()
            .filter(|c| c.1 == job.name)
            .map(|c| (c.0, c.2))
            .collect();
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(2)))?
            .label(job.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], color));
    }
    finish(&mut chart, &root, "CPU")
}

pub(crate) fn plot_workers(path: &Path, trace: &TraceFile, r: &LiveRun) -> Result<()> {
    let end = r.per_worker.iter().map(|c| c.0).fold(1.0, f64::max);
    let top = r.per_worker.iter().map(|c| c.2).max().unwrap_or(1) as f64 + 1.0;
    let root = canvas(path)?;
    let mut chart = chart(
        &root,
        format!(
            "{}: running jobs per worker ({}, live run {})",
            trace.name, r.policy, r.run
        ),
        0.0..end,
        0.0..top,
        45,
    )?;
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .y_desc("jobs")
        .draw()?;
    let workers: std::collections::BTreeSet<&String> = r.per_worker.iter().map(|w| &w.1).collect();
    for (i, w) in workers.iter().enumerate() {
        let pts: Vec<(f64, f64)> = r
            .per_worker
            .iter()
            .filter(|p| &&p.1 == w)
            .map(|p| (p.0, p.2 as f64))
            .collect();
        let color = Palette99::pick(i).to_rgba();
        let label = (*w).clone();
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(2)))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], color));
    }
    // Migrations as markers at the time they finished, labelled with the job.
    chart.draw_series(r.migrations.iter().map(|m| {
        EmptyElement::at((m.t_s, top - 0.5))
            + TriangleMarker::new((0, 0), 6, RED.filled())
            + Text::new(format!("{}->{}", m.job, m.to), (5, 5), ("sans-serif", 11))
    }))?;
    finish(&mut chart, &root, "workers")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("xtask sits in the workspace")
            .to_path_buf()
    }

    #[test]
    fn every_trace_simulates_on_the_committed_measurements() {
        let root = root();
        let traces = traces(&root).unwrap();
        assert!(
            traces.len() >= 3,
            "experiments/ has {} traces",
            traces.len()
        );
        let measured = Measured::load(&root.join("sim/measured")).unwrap();
        for t in &traces {
            for p in &t.policies {
                let run = t.simulate(p, &measured, false).unwrap();
                assert_eq!(run.jobs.len(), t.jobs.len(), "{} {p}", t.name);
                assert!(
                    run.jobs.iter().all(|j| j.outcome.is_completed()),
                    "{} {p}",
                    t.name
                );
                assert_eq!(run.refusals, 0, "{} {p}", t.name);
            }
        }
    }

    /// A trace of one job, `a`, under `spread` (the baseline) and `converge`.
    fn one_job_trace() -> TraceFile {
        serde_json::from_value(serde_json::json!({
            "name": "t", "title": "test", "workers": 1, "policies": ["spread", "converge"],
            "jobs": [{"name": "a", "at_s": 0, "model": "mlp-digits", "size": 12, "steps": 100}]
        }))
        .unwrap()
    }

    /// What the simulator says of job `a`: it completes in `jct` seconds on `worker`.
    fn sim_run(jct: f64, worker: &str) -> SimRun {
        SimRun {
            jct: BTreeMap::from([("a".to_string(), jct)]),
            worker: BTreeMap::from([("a".to_string(), worker.to_string())]),
            migrations: 0,
            eta: BTreeMap::new(),
        }
    }

    fn live(policy: &str, run: usize, jct: f64) -> LiveRun {
        LiveRun {
            policy: policy.into(),
            run,
            jobs: BTreeMap::from([(
                "a".to_string(),
                LiveJob {
                    submitted_s: 0.0,
                    finished_s: jct,
                    state: pb::JobState::label_of(pb::JobState::Completed as i32),
                    worker: "worker-1".into(),
                },
            )]),
            ..LiveRun::default()
        }
    }

    #[test]
    fn the_report_sets_each_job_against_the_median_of_its_live_runs() {
        let trace = one_job_trace();
        let runs = BTreeMap::from([
            (
                "spread".to_string(),
                vec![
                    live("spread", 1, 10.0),
                    live("spread", 2, 12.0),
                    live("spread", 3, 11.0),
                ],
            ),
            ("converge".to_string(), vec![live("converge", 1, 5.5)]),
        ]);
        // The first spread run's records of step and ETA: it runs from 0 to 10 s; at a
        // quarter of its 100 steps it predicts 10.5 s, at half 10 s, at three quarters 10.5 s.
        let mut runs = runs;
        runs.get_mut("spread").unwrap()[0].progress = vec![
            (0.0, "a".into(), 0, None),
            (2.5, "a".into(), 25, Some(8.0)),
            (5.0, "a".into(), 50, Some(5.0)),
            (7.5, "a".into(), 75, Some(3.0)),
        ];
        let mut spread = sim_run(12.1, "worker-1");
        spread.eta = BTreeMap::from([("a".to_string(), [Some(0.1), Some(0.02), None])]);
        let sims = BTreeMap::from([
            ("spread".to_string(), spread),
            ("converge".to_string(), sim_run(5.0, "worker-2")),
        ]);
        let r = Report::new(&trace, &runs, &sims, &Measured::default());
        let spread = &r.rows[0];
        assert_eq!(spread.jobs[0].live_median, Some(11.0));
        assert!((spread.jobs[0].live_spread.unwrap() - 2.0 / 11.0).abs() < 1e-12);
        assert!((spread.jobs[0].error.unwrap() - 0.1).abs() < 1e-12);
        let (l, s) = r.ratios(&r.rows[1]);
        assert!((l.unwrap() - 0.5).abs() < 1e-12 && (s.unwrap() - 5.0 / 12.1).abs() < 1e-12);
        let md = r.markdown();
        assert!(
            md.contains(
                "| a | 0 | 10.0 | 12.0 | 11.0 | 11.0 | 18.2% | 12.1 | +10.0% | 1 1 1 / 1 |"
            ),
            "{md}"
        );
        assert!(md.contains("not measured"), "{md}");
        assert!(
            md.contains("| spread | mlp-digits 12 | 1 | 5.0% | 0.0% | 5.0% | 10.0% | 2.0% | – |"),
            "{md}"
        );
    }

    #[test]
    fn each_repetition_of_the_sharing_tables_is_simulated_and_its_spread_shown() {
        // Two jobs sharing one worker, so the pair's factors matter; live, each takes 60 s.
        let trace: TraceFile = serde_json::from_value(serde_json::json!({
            "name": "t", "title": "test", "workers": 1, "policies": ["spread", "converge"],
            "jobs": [
                {"name": "a", "at_s": 0, "model": "mlp-digits", "size": 12, "steps": 3000},
                {"name": "b", "at_s": 0, "model": "cnn-digits", "size": 6, "steps": 1500}
            ]
        }))
        .unwrap();
        let run = |policy: &str| {
            let mut r = live(policy, 1, 60.0);
            let b = r.jobs["a"].clone();
            r.jobs.insert("b".into(), b);
            (policy.to_string(), vec![r])
        };
        let runs = BTreeMap::from([run("spread"), run("converge")]);
        let measured = Measured::load(&root().join("sim/measured")).unwrap();
        let n = measured.repetitions();
        assert!(n > 1, "the committed tables hold repetitions");
        let mut r = Report::new(
            &trace,
            &runs,
            &simulate(&trace, &measured).unwrap(),
            &measured,
        );
        r.table_repetitions = repetition_spread(&r, &trace, &runs, &measured).unwrap();
        assert_eq!(r.table_repetitions.len(), 2, "one row per policy");
        let spread = &r.table_repetitions[0];
        assert_eq!(spread.errors.len(), n, "one simulated run per repetition");
        assert!(
            spread
                .errors
                .iter()
                .any(|e| (e - spread.errors[0]).abs() > 1e-9),
            "the repetitions' factors move the simulated jobs: {:?}",
            spread.errors
        );
        assert_eq!(r.table_repetitions[1].ratio_differences.len(), n);
        let md = r.markdown();
        assert!(
            md.contains(
                "| policy | median abs. error per job: median | range | repetitions ≤ 10% |"
            ),
            "{md}"
        );
        assert!(md.contains(&format!(" of {n} |")), "{md}");
    }

    #[test]
    fn each_live_run_is_held_out_against_the_others_as_the_simulator_is() {
        let trace = one_job_trace();
        let runs = |p: &str, jcts: [f64; 3]| {
            (
                p.to_string(),
                (0..3).map(|k| live(p, k + 1, jcts[k])).collect::<Vec<_>>(),
            )
        };
        let runs = BTreeMap::from([
            runs("spread", [10.0, 12.0, 11.0]),
            runs("converge", [5.0, 7.2, 5.5]),
        ]);
        let sims = BTreeMap::from([
            ("spread".to_string(), sim_run(12.1, "worker-1")),
            ("converge".to_string(), sim_run(5.0, "worker-1")),
        ]);
        let r = Report::new(&trace, &runs, &sims, &Measured::default());
        assert_eq!(
            r.held_out.len(),
            6,
            "every run of both policies, one at a time"
        );
        let close = |a: Option<f64>, b: f64| (a.unwrap() - b).abs() < 1e-9;
        // Spread's first run against the median of the other two (11.5), and the simulator
        // against the same median.
        let h = &r.held_out[0];
        assert_eq!((h.policy.as_str(), h.run), ("spread", 1));
        assert!(close(h.live_error, 1.5 / 11.5) && close(h.sim_error, 0.6 / 11.5));
        assert!(
            h.live_ratio_difference.is_none(),
            "the baseline has no ratio"
        );
        // Converge's second run: 7.2 against spread's 12 of the same round is 0.6; the other
        // rounds' averages, 5.25 against 10.5, are 0.5; the simulator's 5 / 12.1.
        let h = &r.held_out[4];
        assert_eq!((h.policy.as_str(), h.run), ("converge", 2));
        assert!(close(h.live_error, 1.95 / 5.25));
        assert!(close(h.live_ratio_difference, 10.0));
        assert!(close(h.sim_ratio_difference, 100.0 * (0.5 - 5.0 / 12.1)));
        let md = r.markdown();
        assert!(
            md.contains("| converge | 2 | 37.1% | 4.8% | 10.0 | 8.7 |"),
            "{md}"
        );
    }
}
