//! `converge-sim`: run an experiment, sweep its parameters, or regenerate `sim/RESULTS.md`.
//!
//! ```text
//! converge-sim run sim/experiments/flowcon-3job.json
//! converge-sim sweep sim/experiments/flowcon-3job.json --alpha 0.01,0.05 --interval 20,30
//! converge-sim results            # every experiment -> sim/RESULTS.md + sim/results/*.svg
//! converge-sim scale              # 1,000 workers, 10,000 jobs: events/s per policy
//! ```

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use converge_sim::curve::{Catalog, Contention};
use converge_sim::experiment::Experiment;
use converge_sim::measured::Measured;
use converge_sim::value::{self, ValueExperiment};
use converge_sim::{compare, plot, report};

/// Seconds since the first call: the wall clock the value studies time their decisions with
/// (only the binary reads clocks; the simulation's own time is virtual).
fn wall_clock() -> f64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_secs_f64()
}

#[derive(Debug, Parser)]
#[command(
    name = "converge-sim",
    about = "Discrete-event simulator for Converge's policies"
)]
struct Cli {
    /// The trainer's calibration curve table (markdown, from `converge-trainer calibrate`):
    /// its curves replace the built-in ones of the same name, other models are added.
    #[arg(long, global = true, env = "CONVERGE_SIM_CURVES")]
    curves: Option<PathBuf>,
    // The help is built with `concat!` to show the default directory, which `Option` (needed
    // to tell a named directory from the default) would otherwise hide. clap prints it as
    // plain text, so no rustdoc links here.
    #[arg(long, global = true, value_name = "DIR", help = MEASURED_HELP)]
    measured: Option<PathBuf>,
    /// A work-conserving CPU with no cost of sharing (the model before measurements).
    #[arg(long, global = true)]
    no_contention: bool,
    #[command(subcommand)]
    command: Command,
}

/// Where the measurements are read when `--measured` is not given: the crate's own, from the
/// source tree the binary was built in.
const DEFAULT_MEASURED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/measured");

const MEASURED_HELP: &str = concat!(
    "Directory of measurements of the real workload (written by `cargo xtask measure`): the \
     papers' experiments pay the cost of sharing a worker measured there (its colocation.json). \
     A directory named here must exist and hold those measurements. Without the flag: ",
    env!("CARGO_MANIFEST_DIR"),
    "/measured, and if that has none, no cost of sharing (with a warning)"
);

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one experiment: policy vs baseline vs oracle, printed beside the paper's numbers.
    Run {
        /// The experiment file.
        file: PathBuf,
        /// Print the full results as JSON instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// Run the experiment's policy at every α × interval (defaults: the file's sweep points).
    Sweep {
        /// The experiment file.
        file: PathBuf,
        /// Comma-separated α values.
        #[arg(long, value_delimiter = ',')]
        alpha: Vec<f64>,
        /// Comma-separated intervals (FlowCon itval / SpeCon categorization interval), seconds.
        #[arg(long, value_delimiter = ',')]
        interval: Vec<f64>,
    },
    /// One large run per policy (default 1,000 workers, 10,000 jobs): events/s, core steps/s,
    /// and a digest of every job's result (equal digests = the same results, byte for byte).
    Scale {
        /// Workers (16 cores each), at least 1.
        #[arg(long, default_value_t = 1_000, value_parser = at_least_one)]
        workers: usize,
        /// Jobs, arriving uniformly over `--window` seconds, at least 1.
        #[arg(long, default_value_t = 10_000, value_parser = at_least_one)]
        jobs: usize,
        /// Arrival window, seconds (0: every job arrives at once).
        #[arg(long, default_value_t = 3_000.0, value_parser = seconds)]
        window: f64,
        /// Which policies to run (`ds`, `flowcon`, `specon` as the papers run them; `converge`,
        /// `las` as the manager runs them).
        #[arg(long, value_delimiter = ',', default_values = ["ds", "flowcon", "specon", "converge", "las"])]
        policies: Vec<String>,
    },
    /// Run one value-based allocation study (`sim/experiments/value/*.json`) and print its
    /// table.
    Value {
        /// The study file.
        file: PathBuf,
        /// Override the number of workloads per cell (fewer = quicker).
        #[arg(long)]
        seeds: Option<usize>,
        /// Print the grid as JSON instead of markdown.
        #[arg(long)]
        json: bool,
    },
    /// Converge's own policy against every baseline, the oracle and LAS, with exact and
    /// perturbed estimates, and the ETAs' accuracy: writes CONVERGE.md.
    Compare {
        /// Folders of experiment files (every `*.json` directly in each).
        #[arg(long, value_delimiter = ',', default_values = [
            concat!(env!("CARGO_MANIFEST_DIR"), "/experiments"),
            concat!(env!("CARGO_MANIFEST_DIR"), "/experiments/converge"),
        ])]
        experiments: Vec<PathBuf>,
        /// The markdown file to write.
        #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/CONVERGE.md"))]
        out: PathBuf,
        /// Also write every run of every experiment, job by job, as JSON to this file (to see
        /// which job a row's worst case is, where it ran and when it finished under each policy).
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Regenerate RESULTS.md and its plots from every experiment file.
    Results {
        /// Folder of experiment files.
        #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/experiments"))]
        experiments: PathBuf,
        /// The markdown file to write (plots go to `results/` beside it).
        #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/RESULTS.md"))]
        out: PathBuf,
    },
}

/// A count that must not be zero. Checked here rather than left to `Experiment::check`, so
/// that the error names the flag: a run with no workers or no jobs measures nothing.
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// A finite, non-negative number of seconds (the arrival window runs from 0 to it).
fn seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
        Ok(_) => Err("must be a finite number of seconds, 0 or more".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// mimalloc rather than glibc's malloc, in the simulator only. A core step allocates and frees
/// small buffers (an agent's message, a policy's claims, a job's progress points); at 10,000
/// workers glibc's `malloc`, `free` and `realloc` were about a sixth of `converge`'s samples,
/// and with mimalloc `converge` ran in 0.80 of the time (`docs/performance.md`, "The
/// simulator's allocator"). Where memory comes from does not change what is decided: every
/// digest is the same. The manager keeps glibc's: there the trade is memory, and mimalloc
/// lost it ("Tried and not taken", ibid.).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match execute(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("converge-sim: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn execute(cli: Cli) -> anyhow::Result<()> {
    let Cli {
        curves,
        measured,
        no_contention,
        command,
    } = cli;
    let catalogs = || -> anyhow::Result<Catalog> {
        let mut catalog = Catalog::builtin();
        if let Some(path) = &curves {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading curve table {}", path.display()))?;
            catalog.load_curve_table(&text, 300.0)?;
        }
        Ok(catalog)
    };
    // The value studies keep the value paper's own CPU model (shares of one unit, :59): no
    // cost of sharing. The FlowCon and SpeCon experiments pay the measured one.
    let plain = catalogs()?;
    let mut catalog = catalogs()?;
    if !no_contention && let Some(c) = contention(measured.as_deref())? {
        eprintln!("cost of sharing a worker: {}", c.source);
        catalog.set_contention(c);
    }
    let catalog = catalog;
    match command {
        Command::Run { file, json } => {
            let e = Experiment::load(&file)?;
            let c = report::compare(&e, &catalog, false)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&c)?);
            } else {
                println!("{}", report::section(&c, None, &[]));
                println!(
                    "events: policy {}, baseline {}, oracle {}",
                    c.policy.events, c.baseline.events, c.oracle.events
                );
            }
        }
        Command::Sweep {
            file,
            alpha,
            interval,
        } => {
            let e = Experiment::load(&file)?;
            let points: Vec<(f64, f64)> = if alpha.is_empty() && interval.is_empty() {
                e.sweep.iter().map(|p| (p.alpha, p.interval)).collect()
            } else {
                let (da, di) = default_parameters(&e);
                let alphas = if alpha.is_empty() { vec![da] } else { alpha };
                let intervals = if interval.is_empty() {
                    vec![di]
                } else {
                    interval
                };
                alphas
                    .iter()
                    .flat_map(|&a| intervals.iter().map(move |&i| (a, i)))
                    .collect()
            };
            anyhow::ensure!(
                !points.is_empty(),
                "{} has no sweep points; pass --alpha and/or --interval",
                file.display()
            );
            let rows = report::sweep(&e, &catalog, &points)?;
            println!("{}", report::sweep_table(&rows, e.focus_job.as_deref()));
        }
        Command::Value { file, seeds, json } => {
            let mut e = ValueExperiment::load(&file)?;
            if let Some(n) = seeds {
                e.seeds = n;
            }
            e.check()?;
            let started = std::time::Instant::now();
            let grid = e.run(&plain, Some(wall_clock))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&grid)?);
            } else {
                println!("{}", value::section(&e, &grid, &[], true)?);
            }
            eprintln!("{}: {:.1} s", e.name, started.elapsed().as_secs_f64());
        }
        Command::Results { experiments, out } => results(&catalog, &plain, &experiments, &out)?,
        Command::Compare {
            experiments,
            out,
            json,
        } => {
            let mut evals = Vec::new();
            for dir in &experiments {
                for e in report::load_all(dir)? {
                    eprintln!("comparing on {}", e.name);
                    evals.push(compare::evaluate(&e, &catalog)?);
                }
            }
            let doc = compare::markdown(&evals, "cargo run --release -p converge-sim -- compare");
            std::fs::write(&out, &doc).with_context(|| format!("writing {}", out.display()))?;
            println!("{doc}");
            eprintln!("wrote {}", out.display());
            if let Some(path) = json {
                std::fs::write(&path, serde_json::to_string_pretty(&evals)?)
                    .with_context(|| format!("writing {}", path.display()))?;
                eprintln!("wrote {}", path.display());
            }
        }
        Command::Scale {
            workers,
            jobs,
            window,
            policies,
        } => scale(&catalog, workers, jobs, window, &policies)?,
    }
    Ok(())
}

/// The cost of sharing a worker the FlowCon and SpeCon experiments pay: from the directory
/// `--measured` named, or else from [`DEFAULT_MEASURED`].
fn contention(named: Option<&Path>) -> anyhow::Result<Option<Contention>> {
    let Some(dir) = named else {
        // Without the flag, missing measurements stay a warning: the binary also runs where
        // the source tree it was built in is gone, and the papers' experiments are still
        // meaningful there on a CPU with no cost of sharing (as with `--no-contention`).
        let dir = Path::new(DEFAULT_MEASURED);
        let c = Measured::load(dir)?.contention();
        if c.is_none() {
            eprintln!(
                "{}: no co-location measurements; a work-conserving CPU with no cost of sharing",
                dir.display()
            );
        }
        return Ok(c);
    };
    // A directory the user named and we cannot use is an error, not the fallback above: a
    // typo would otherwise change every number and still exit 0.
    if !dir.is_dir() {
        let why = if dir.exists() {
            "not a directory (the flag takes the directory `cargo xtask measure` writes)"
        } else {
            "no such directory"
        };
        anyhow::bail!("--measured {}: {why}", dir.display());
    }
    let loaded = Measured::load(dir).with_context(|| format!("--measured {}", dir.display()))?;
    match loaded.contention() {
        Some(c) => Ok(Some(c)),
        None => anyhow::bail!(
            "--measured {}: no co-location measurements (colocation.json with `--threads 1` \
             points); pass --no-contention for a CPU with no cost of sharing",
            dir.display()
        ),
    }
}

fn scale(
    catalog: &Catalog,
    workers: usize,
    jobs: usize,
    window: f64,
    names: &[String],
) -> anyhow::Result<()> {
    use converge_sim::engine::Simulation;
    use converge_sim::experiment::{PolicyName, PolicySpec, WorkerGroup, Workload};
    let named = |policy: &str| -> anyhow::Result<PolicySpec> {
        Ok(PolicySpec::Named {
            policy: PolicyName::new(policy)?,
            flowcon_interval: 20.0,
            specon_interval: 30.0,
            rebalance_interval: 30.0,
        })
    };
    let mut policies = Vec::new();
    for name in names {
        policies.push(match name.as_str() {
            "ds" => PolicySpec::DockerSwarm,
            "flowcon" => PolicySpec::Flowcon {
                alpha: 0.05,
                itval: 20.0,
                beta: 2.0,
                adaptive: true,
                placement: true,
            },
            "specon" => PolicySpec::Specon {
                alpha: 0.01,
                interval: 30.0,
                rebalance: true,
            },
            "converge" | "las" => named(name)?,
            other => anyhow::bail!(
                "unknown --policies entry `{other}`; use ds, flowcon, specon, converge or las"
            ),
        });
    }
    for policy in policies {
        let e = Experiment {
            name: "scale".into(),
            title: format!("{workers} workers, {jobs} jobs"),
            seed: 1,
            workers: vec![WorkerGroup {
                count: workers,
                cpus: 16.0,
                calibration: 1.0,
            }],
            workload: Workload::Random {
                jobs,
                window: (0.0, window),
                models: catalog.names().iter().map(|s| s.to_string()).collect(),
                sizes: Default::default(),
            },
            policy,
            baseline: PolicySpec::DockerSwarm,
            system: Default::default(),
            paper: Default::default(),
            sweep: vec![],
            focus_job: None,
            note: String::new(),
        };
        e.check()?;
        let trace = e.jobs(catalog)?;
        // Wall-clock time is measured here, in the binary, never inside the simulation.
        let started = std::time::Instant::now();
        let run = Simulation::new(&e, catalog, &trace, policy, false)?.run()?;
        let secs = started.elapsed().as_secs_f64();
        println!(
            "{:<45} {:>10} events ({} stale), {:>10} core steps in {:>7.2} s = {:>9.0} events/s, {:>9.0} steps/s (simulated makespan {:.0} s, results {:016x})",
            policy.label(),
            run.events,
            run.stale,
            run.steps,
            secs,
            run.events as f64 / secs,
            run.steps as f64 / secs,
            run.makespan,
            digest(&run)?
        );
    }
    Ok(())
}

/// FNV-1a over every job's result, the migrations and the refusals as JSON: two runs with the
/// same digest produced the same results, byte for byte.
fn digest(run: &converge_sim::engine::Run) -> anyhow::Result<u64> {
    let bytes = serde_json::to_vec(&(&run.jobs, run.migrations, run.refusals, run.makespan))?;
    Ok(bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    }))
}

fn default_parameters(e: &Experiment) -> (f64, f64) {
    use converge_sim::experiment::PolicySpec;
    match e.policy {
        PolicySpec::Flowcon { alpha, itval, .. } => (alpha, itval),
        PolicySpec::Specon {
            alpha, interval, ..
        } => (alpha, interval),
        _ => (0.0, 0.0),
    }
}

fn results(catalog: &Catalog, plain: &Catalog, dir: &Path, out: &Path) -> anyhow::Result<()> {
    let base = out.parent().unwrap_or(Path::new("."));
    let plots_dir = base.join("results");
    std::fs::create_dir_all(&plots_dir)
        .with_context(|| format!("creating {}", plots_dir.display()))?;
    let mut doc = String::from(RESULTS_HEADER);
    let c = catalog.contention();
    doc.push_str(&if c.sharing.free.is_empty() {
        "**Cost of sharing a worker:** none (a work-conserving CPU; `--no-contention` or no \
         co-location measurements).\n\n"
            .to_string()
    } else {
        let f = |v: &[f64]| {
            v.iter()
                .map(|x| format!("{x:.3}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!(
            "**Cost of sharing a worker (measured):** the papers' jobs pay what our one-thread \
             trainer jobs pay ({}); aggregate throughput of 1, 2, ... co-located jobs on one \
             core over one alone, which a worker pays at as many threads per core (each job \
             running as many threads as the cores it can use; between whole numbers \
             linearly): free competition {}; under quotas that split the worker {}. A thread pool \
             sized to the machine pays far more under free competition (`sim/README.md`, \
             co-location table, `--threads 0`); that is not charged here, since the papers do \
             not say how their frameworks' pools were sized.\n\n",
            c.source,
            f(&c.sharing.free),
            f(&c.sharing.split)
        )
    });
    for e in report::load_all(dir)? {
        eprintln!("running {}", e.name);
        let c = report::compare(&e, catalog, true)?;
        let sweep = if e.sweep.is_empty() {
            None
        } else {
            let points: Vec<(f64, f64)> = e.sweep.iter().map(|p| (p.alpha, p.interval)).collect();
            Some(report::sweep(&e, catalog, &points)?)
        };
        let mut plots = Vec::new();
        let mut draw = |suffix: &str, f: &dyn Fn(&Path) -> converge_sim::Result<()>| {
            let name = format!("results/{}-{suffix}.svg", e.name);
            f(&base.join(&name))?;
            plots.push(name);
            anyhow::Ok(())
        };
        draw("jct", &|p| {
            plot::completion_times(
                &c.policy,
                &c.baseline,
                &format!("{}: completion time per job", e.name),
                p,
            )
        })?;
        let workers = e.worker_list().len();
        if workers == 1 {
            draw("cpu-policy", &|p| {
                plot::cpu_shares(
                    &c.policy,
                    &format!("{}: CPU share, {}", e.name, c.policy.policy),
                    p,
                )
            })?;
            draw("cpu-baseline", &|p| {
                plot::cpu_shares(
                    &c.baseline,
                    &format!("{}: CPU share, {}", e.name, c.baseline.policy),
                    p,
                )
            })?;
        } else {
            draw("cpu-policy", &|p| {
                plot::cpu_shares(
                    &c.policy,
                    &format!("{}: CPU share on worker-1, {}", e.name, c.policy.policy),
                    p,
                )
            })?;
            draw("workers-policy", &|p| {
                plot::jobs_per_worker(
                    &c.policy,
                    workers,
                    &format!("{}: jobs per worker, {}", e.name, c.policy.policy),
                    p,
                )
            })?;
            draw("workers-baseline", &|p| {
                plot::jobs_per_worker(
                    &c.baseline,
                    workers,
                    &format!("{}: jobs per worker, {}", e.name, c.baseline.policy),
                    p,
                )
            })?;
        }
        doc.push_str(&report::section(&c, sweep.as_deref(), &plots));
    }
    let studies = value::load_all(&dir.join("value"))?;
    if !studies.is_empty() {
        doc.push_str(VALUE_HEADER);
    }
    for e in studies {
        eprintln!("running {}", e.name);
        let grid = e.run(plain, Some(wall_clock))?;
        let plots = value::plots(&e, &grid, base)?;
        doc.push_str(&value::section(&e, &grid, &plots, true)?);
    }
    std::fs::write(out, doc).with_context(|| format!("writing {}", out.display()))?;
    eprintln!("wrote {}", out.display());
    Ok(())
}

const RESULTS_HEADER: &str = "# Simulator results\n\n\
Generated by `cargo run -p converge-sim -- results` (do not edit by hand). Every experiment \
in `sim/experiments/` runs the policy, the paper's baseline and the oracle SRPT on the same \
job trace and seed; our numbers stand beside the paper's. Every decision is taken by \
the same cores the manager and the agents run (`converge_core::cluster` and \
`converge_core::node`); the simulator plays the agents, the containers and the clock.\n\n\
**The simulator's runtime is a model.** Jobs are work done at the CPU share a CFS-like model \
gives them under Docker's hard quotas, less the measured cost of sharing a worker (below); \
their metrics follow parametric curves with seeded noise, set by eye from the papers' \
descriptions (we cannot run the papers' models; our own trainer's jobs are simulated from \
measurements and checked against the testbed in `experiments/*/results.md`). Absolute seconds are therefore not the papers' testbeds'; \
compare the *changes* (reductions), and read differences as differences between our model \
workload and theirs as much as between implementations. The same seed gives byte-identical \
output.\n\n\
The *oracle SRPT* row runs the same trace with every worker serving the job with the least \
remaining work first, each up to the cores it can use (full knowledge, on the baseline's \
placement). It is a reference for what reordering can do for the *average* completion time, \
not a bound on anything: not on the makespan (it starves long jobs, so its makespan can be \
longer than the policy's and the baseline's), and not on the average either (shortest \
remaining first is optimal for the mean on one processor running one job at a time; here jobs \
use several cores and pay the measured cost of sharing, so another order, or another \
placement, can finish sooner on average).\n\n\
Parameter sweeps: `converge-sim sweep FILE --alpha 0.01,0.05 --interval 20,30`. Benchmarks: \
see `sim/README.md`.\n\n";

const VALUE_HEADER: &str = "# Value-based allocation\n\n\
The value-based allocation paper's experiments (`shared/papers/value-based-allocation.txt` \
§VI), from the files in `sim/experiments/value/` (one study each; run one with \
`converge-sim value FILE`). Every cell runs the same seeded workloads; totals are means over \
them. A worker here is one unit of CPU of its speed, shared by CPU shares as the paper's \
model says (:59): a container alone gets all of it, two with equal shares half each. The \
value curves are ours (the paper gives none): full value until 1.5 × ET, zero at 3 × ET; the \
`value-curves` study shows how they move the comparison. The allocation times are wall-clock \
measurements of the policy's arrival decision in this run, on this machine: the only numbers \
in this file that change from one regeneration to the next.\n\n";

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("converge-sim").chain(args.iter().copied()))
    }

    #[test]
    fn a_measured_directory_that_is_not_there_is_an_error_naming_the_flag() {
        let missing = std::env::temp_dir().join(format!("no-such-measured-{}", std::process::id()));
        let e = contention(Some(&missing)).unwrap_err().to_string();
        assert!(e.contains("--measured"), "{e}");
        assert!(e.contains(&missing.display().to_string()), "{e}");
    }

    #[test]
    fn a_measured_path_that_is_a_file_is_an_error() {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("measured/colocation.json");
        let e = format!("{:#}", contention(Some(&file)).unwrap_err());
        assert!(
            e.contains("--measured") && e.contains("not a directory"),
            "{e}"
        );
    }

    #[test]
    fn a_named_measured_directory_without_co_location_is_an_error() {
        // The crate's own folder exists and holds no colocation.json.
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let e = format!("{:#}", contention(Some(&dir)).unwrap_err());
        assert!(
            e.contains("--measured") && e.contains("--no-contention"),
            "{e}"
        );
    }

    #[test]
    fn without_the_flag_the_crates_own_measurements_are_read() {
        let named = contention(Some(Path::new(DEFAULT_MEASURED))).unwrap();
        let default = contention(None).unwrap();
        assert_eq!(
            default.map(|c| c.source),
            named.map(|c| c.source),
            "the default must be the crate's measured/"
        );
        assert_eq!(parse(&["run", "f.json"]).unwrap().measured, None);
    }

    /// clap prints the arguments' doc comments: rustdoc's link syntax would show as is.
    #[test]
    fn no_help_shows_rustdoc_link_syntax() {
        let mut cli = Cli::command();
        // Building copies the global flags into every subcommand, as `--help` shows them.
        cli.build();
        let mut pages = vec![cli.render_long_help().to_string()];
        for sub in cli.get_subcommands_mut() {
            pages.push(sub.render_long_help().to_string());
        }
        assert!(pages.len() > 6);
        for page in pages {
            assert!(!page.contains("[`") && !page.contains("`]"), "{page}");
        }
    }

    #[test]
    fn scale_names_the_flag_that_is_zero() {
        for flag in ["--workers", "--jobs"] {
            let e = parse(&["scale", flag, "0"]).unwrap_err().to_string();
            assert!(e.contains(flag) && e.contains("at least 1"), "{e}");
        }
        for window in ["--window=-1", "--window=nan", "--window=inf"] {
            let e = parse(&["scale", window]).unwrap_err().to_string();
            assert!(e.contains("--window"), "{e}");
        }
        let Command::Scale {
            workers,
            jobs,
            window,
            ..
        } = parse(&["scale", "--workers", "1", "--jobs", "1", "--window", "0"])
            .unwrap()
            .command
        else {
            panic!("not scale");
        };
        assert_eq!((workers, jobs, window), (1, 1, 0.0));
    }
}
