//! `cargo xtask demo`: what Converge does, shown live on this machine against the strongest
//! other policy.
//!
//! 1. Builds the images.
//! 2. Reads the demo's job mix, `experiments/demo/trace.json` (trainer jobs of four models and
//!    very different lengths arriving in a burst on two 1-CPU workers, sized from the measured
//!    step times in `sim/measured/`), resizes it to this machine's speed (a ten-second probe of
//!    one model), and asks the simulator, which drives the manager's own decision core, how
//!    every policy would do on it. The one with the lowest average
//!    completion time is the opponent (`--against` names one instead).
//! 3. Runs the mix live under the opponent, then under `converge`, each on a fresh compose
//!    testbed, drawing every job's progress bar, state, worker, CPU and ETA as it goes (the
//!    same view as `convergectl top`).
//! 4. Prints each job's completion time under both, the average and the makespan, live and as
//!    the simulator predicted; writes `target/demo/report.html` with the plots and prints its
//!    path and how long the whole demo took.
//!
//! The testbeds are torn down on the way out, also when something fails.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use converge_cli::view::{Board, duration};
use converge_sim::measured::Measured;
use converge_sim::trace::TraceFile;
use plotters::style::{BLUE, RED};

use crate::experiment::{self, Bars, LiveRun};
use crate::testbed::Testbed;

/// The policies the opponent is chosen from: the three baselines, FlowCon and SpeCon as the
/// papers define them, and least attained service (Tiresias), the strongest policy that, like
/// Converge, needs nothing from the training framework but its reports.
const OPPONENTS: &[&str] = &[
    "spread",
    "least-allocated",
    "round-robin",
    "flowcon",
    "specon",
    "las",
];

/// Converge's policy.
const CONVERGE: &str = "converge";

/// The command's arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Run the mix against this policy instead of the one the simulator finds strongest.
    #[arg(long)]
    pub against: Option<String>,
    /// Host port for the manager (127.0.0.1 only).
    #[arg(long, default_value_t = 7070)]
    pub port: u16,
    /// Print the simulator's forecast for the mix and stop: no images, no testbed.
    #[arg(long)]
    pub forecast: bool,
}

/// One policy's outcome on the mix: per job, and the two summary figures.
struct Outcome {
    /// Completion time per job name (absent: it did not complete).
    jct: BTreeMap<String, Option<f64>>,
    avg: Option<f64>,
    makespan: Option<f64>,
}

impl Outcome {
    fn live(trace: &TraceFile, run: &LiveRun) -> Outcome {
        let jct: BTreeMap<String, Option<f64>> = trace
            .jobs
            .iter()
            .map(|j| {
                let done = run.jobs.get(&j.name).filter(|l| l.completed());
                (j.name.clone(), done.map(|l| l.jct()))
            })
            .collect();
        let all: Option<Vec<f64>> = jct.values().copied().collect();
        let start = trace.jobs[0].at_s;
        Outcome {
            avg: all.as_ref().map(|v| v.iter().sum::<f64>() / v.len() as f64),
            makespan: all.map(|_| {
                run.jobs
                    .values()
                    .map(|l| l.finished_s - start)
                    .fold(0.0, f64::max)
            }),
            jct,
        }
    }

    fn simulated(run: &converge_sim::engine::Run) -> Outcome {
        Outcome {
            // A trace's catalog names each job's model after the job.
            jct: run
                .jobs
                .iter()
                .map(|j| (j.model.clone(), Some(j.jct)))
                .collect(),
            avg: Some(run.avg_jct),
            makespan: Some(run.makespan),
        }
    }
}

/// Runs the demo.
pub fn run(root: &Path, args: &Args) -> Result<()> {
    let started = Instant::now();
    if !args.forecast {
        crate::images::build(root, &[])?;
    }
    let built = started.elapsed();
    let designed = TraceFile::load(&root.join("experiments/demo/trace.json"))?;
    let measured = Measured::load(&root.join("sim/measured"))?;
    let (trace, measured) = if args.forecast {
        (designed, measured)
    } else {
        at_this_machines_speed(designed, measured)?
    };
    println!();
    println!("{}", trace.title);
    println!();
    println!("The simulator's forecast (the manager's decision core, the measured runtime):");
    let mut forecast = BTreeMap::new();
    for policy in OPPONENTS.iter().chain([&CONVERGE]) {
        let run = trace
            .simulate(policy, &measured, false)
            .with_context(|| format!("simulating the demo under {policy}"))?;
        println!(
            "  {policy:<16} average completion {:>6.1}s   makespan {:>6.1}s",
            run.avg_jct, run.makespan
        );
        forecast.insert(policy.to_string(), Outcome::simulated(&run));
    }
    let opponent = match &args.against {
        Some(p) if p == CONVERGE => bail!("--against names the policy to beat, not converge"),
        Some(p) => {
            converge_sim::experiment::PolicyName::new(p)?;
            if !forecast.contains_key(p) {
                let run = trace.simulate(p, &measured, false)?;
                forecast.insert(p.clone(), Outcome::simulated(&run));
            }
            p.clone()
        }
        None => OPPONENTS
            .iter()
            .min_by(|a, b| {
                let avg = |p: &str| forecast[p].avg.unwrap_or(f64::INFINITY);
                avg(a).total_cmp(&avg(b))
            })
            .expect("opponents are listed")
            .to_string(),
    };
    if args.forecast {
        // Nothing runs, so nothing probes this machine: the jobs are the designed sizes.
        println!(
            "The strongest of them on this mix is `{opponent}` (the simulator's forecast of the \
             designed sizes; a live demo resizes the jobs to this machine first)."
        );
        return Ok(());
    }
    println!(
        "The strongest of them on this mix is `{opponent}`: it runs first, then `{CONVERGE}`."
    );

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let mut services = vec!["manager"];
    services.extend(["agent-1", "agent-2"].iter().take(trace.workers).copied());
    let env = trace.testbed_env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut runs = Vec::new();
    for policy in [opponent.as_str(), CONVERGE] {
        println!();
        let testbed = Testbed::up_with(root, policy, args.port, &services, &env)?;
        // Drawn from the first record on, below what the start of the run prints.
        let mut board: Option<Board> = None;
        let result = rt.block_on(experiment::drive(
            &trace,
            policy,
            1,
            args.port,
            |jobs, t| {
                let now = converge_messenger::unix_ms(std::time::SystemTime::now());
                board
                    .get_or_insert_with(|| Board::new(&format!("{policy:>16}")))
                    .update(jobs, now, &format!("t = {t:>3.0}s"), "");
            },
        ));
        if let Some(b) = &mut board {
            b.finish();
        }
        if result.is_err() {
            testbed.print_logs();
        }
        drop(testbed);
        runs.push(result?);
    }

    let live: Vec<Outcome> = runs.iter().map(|r| Outcome::live(&trace, r)).collect();
    let table = comparison(&trace, &opponent, &live, &forecast);
    println!();
    println!("{}", table.markdown());
    let dir = root.join("target/demo");
    let report = write_report(&dir, &trace, &opponent, &runs, &live, &table)?;
    println!(
        "Report: {}\nThe demo took {} ({} of it building the images).",
        report.display(),
        duration(started.elapsed().as_secs_f64()),
        duration(built.as_secs_f64())
    );
    for (r, o) in runs.iter().zip(&live) {
        if let Some((name, _)) = o.jct.iter().find(|(_, t)| t.is_none()) {
            bail!(
                "under {}, job {name} ended {}",
                r.policy,
                r.jobs
                    .get(name)
                    .map(|j| j.state.as_str())
                    .unwrap_or("unseen")
            );
        }
    }
    Ok(())
}

/// The mix resized so each job takes on this machine the seconds it was designed to take on
/// the measured one, and the measurements scaled to match: this machine's speed differs from
/// the one `sim/measured/` was taken on, and drifts between sessions (a factor of two has been
/// seen), which would stretch the demo past its time or shrink its jobs below what the
/// policies need. One model is probed alone (about ten seconds); all models have been seen to
/// drift alike (`experiments/mixed-arrivals/results.md`'s probe factors).
fn at_this_machines_speed(
    mut trace: TraceFile,
    measured: Measured,
) -> Result<(TraceFile, Measured)> {
    let settings = measured
        .step_time
        .as_ref()
        .map(|f| f.header.settings.clone())
        .context("sim/measured/step_time.json is missing: run `cargo xtask measure` first")?;
    let longest = trace
        .jobs
        .iter()
        .max_by_key(|j| j.steps)
        .expect("a trace has jobs");
    let pair = (longest.model.clone(), longest.size);
    println!(
        "Probing this machine's speed ({} --size {} alone):",
        pair.0, pair.1
    );
    let probe = crate::measure::probe(std::slice::from_ref(&pair), &settings)?;
    let at = |m: &Measured, model: &str, size: u32| -> Result<f64> {
        Ok(m.cost(model, size, 1)?.s_per_step)
    };
    let factor = probe[0].s_per_step / at(&measured, &pair.0, pair.1)?;
    println!(
        "  {:.2}x the measured machine's step time: each job's steps are scaled by {:.2}",
        factor,
        1.0 / factor
    );
    for j in &mut trace.jobs {
        // Whole reports, at least a few of them.
        let steps = (j.steps as f64 / factor / j.report_every as f64).round() as u64;
        j.steps = steps.max(4) * j.report_every;
    }
    let mut probes = Vec::new();
    for j in &trace.jobs {
        probes.push(converge_sim::measured::Probe {
            model: j.model.clone(),
            size: j.size,
            s_per_step: at(&measured, &j.model, j.size)? * factor,
        });
    }
    let measured = measured.at_speed_of(&probes)?;
    Ok((trace, measured))
}

/// The comparison the demo ends with, as data: printed as markdown, written as HTML.
struct Table {
    caption: String,
    header: Vec<String>,
    rows: Vec<Vec<String>>,
    /// How many of the last rows are summaries (drawn bold).
    summaries: usize,
}

impl Table {
    fn markdown(&self) -> String {
        let line = |cells: &[String]| format!("| {} |", cells.join(" | "));
        let mut t = format!("{}\n\n{}\n|---|---|", self.caption, line(&self.header));
        t.push_str(&"---:|".repeat(self.header.len().saturating_sub(2)));
        let first_summary = self.rows.len() - self.summaries;
        for (i, row) in self.rows.iter().enumerate() {
            let row: Vec<String> = if i >= first_summary {
                row.iter()
                    .map(|c| {
                        if c.is_empty() {
                            c.clone()
                        } else {
                            format!("**{c}**")
                        }
                    })
                    .collect()
            } else {
                row.clone()
            };
            t.push('\n');
            t.push_str(&line(&row));
        }
        t.push('\n');
        t
    }

    fn html(&self) -> String {
        let cells = |tag: &str, row: &[String], bold: bool| {
            row.iter()
                .map(|c| match bold && !c.is_empty() {
                    true => format!("<{tag}><b>{}</b></{tag}>", escape(c)),
                    false => format!("<{tag}>{}</{tag}>", escape(c)),
                })
                .collect::<String>()
        };
        let first_summary = self.rows.len() - self.summaries;
        let mut t = format!(
            "<p>{}</p><table><tr>{}</tr>",
            escape(&self.caption),
            cells("th", &self.header, false)
        );
        for (i, row) in self.rows.iter().enumerate() {
            let _ = write!(t, "<tr>{}</tr>", cells("td", row, i >= first_summary));
        }
        t.push_str("</table>");
        t
    }
}

/// The table the demo ends with: completion time per job under both policies, live and as
/// forecast, and the average and makespan with converge's change against the opponent.
fn comparison(
    trace: &TraceFile,
    opponent: &str,
    live: &[Outcome],
    forecast: &BTreeMap<String, Outcome>,
) -> Table {
    let (a, c) = (&live[0], &live[1]);
    let (fa, fc) = (&forecast[opponent], &forecast[CONVERGE]);
    let secs = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
    let change = |base: Option<f64>, new: Option<f64>| match (base, new) {
        (Some(b), Some(n)) if b > 0.0 => format!("{:+.0}%", (n - b) / b * 100.0),
        _ => "-".into(),
    };
    let mut rows: Vec<Vec<String>> = trace
        .jobs
        .iter()
        .map(|j| {
            let (x, y) = (a.jct[&j.name], c.jct[&j.name]);
            vec![
                j.name.clone(),
                format!("{} {}", j.model, j.size),
                format!("{:.0}", j.at_s),
                secs(x),
                secs(y),
                change(x, y),
                secs(fa.jct.get(&j.name).copied().flatten()),
                secs(fc.jct.get(&j.name).copied().flatten()),
            ]
        })
        .collect();
    for (what, x, y, fx, fy) in [
        ("average", a.avg, c.avg, fa.avg, fc.avg),
        ("makespan", a.makespan, c.makespan, fa.makespan, fc.makespan),
    ] {
        rows.push(vec![
            what.into(),
            String::new(),
            String::new(),
            secs(x),
            secs(y),
            change(x, y),
            secs(fx),
            secs(fy),
        ]);
    }
    Table {
        caption: "Completion time (s), submission to end: live on the testbed, and as the simulator forecast".into(),
        header: [
            "job",
            "model",
            "arrives (s)",
            opponent,
            CONVERGE,
            "change",
            &format!("forecast {opponent}"),
            &format!("forecast {CONVERGE}"),
        ]
        .map(String::from)
        .to_vec(),
        rows,
        summaries: 2,
    }
}

/// Writes `report.html` and its plots into `dir`; returns the report's path.
fn write_report(
    dir: &Path,
    trace: &TraceFile,
    opponent: &str,
    runs: &[LiveRun],
    live: &[Outcome],
    table: &Table,
) -> Result<std::path::PathBuf> {
    // Only this run's files: an earlier opponent's plots would sit beside them.
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    std::fs::create_dir_all(dir)?;
    let names: Vec<String> = trace.jobs.iter().map(|j| j.name.clone()).collect();
    let series = |label: &str, o: &Outcome, color| Bars {
        label: label.to_string(),
        values: names.iter().map(|n| o.jct[n]).collect(),
        ranges: Vec::new(),
        color,
    };
    experiment::plot_bars(
        &dir.join("completion.svg"),
        format!("completion time per job: {opponent} against converge (live)"),
        &names,
        &[
            series(opponent, &live[0], BLUE),
            series(CONVERGE, &live[1], RED),
        ],
    )?;
    let mut plots = vec!["completion.svg".to_string()];
    for r in runs {
        for (what, plot) in [
            (
                "workers",
                experiment::plot_workers as fn(&Path, &TraceFile, &LiveRun) -> Result<()>,
            ),
            ("cpu", experiment::plot_cpu),
            ("eta", experiment::plot_eta),
        ] {
            let file = format!("{what}-{}.svg", r.policy);
            plot(&dir.join(&file), trace, r)?;
            plots.push(file);
        }
    }
    std::fs::write(
        dir.join("runs.json"),
        serde_json::to_string_pretty(runs)? + "\n",
    )?;
    let mut html = String::new();
    let _ = write!(
        html,
        "<!doctype html><meta charset=utf-8><title>Converge demo</title>\
         <style>body{{font-family:sans-serif;max-width:960px;margin:auto}}\
         table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:2px 8px;text-align:right}}</style>\
         <h1>Converge demo: {opponent} against converge</h1><p>{}</p>{}",
        escape(&trace.title),
        table.html()
    );
    for p in &plots {
        let _ = write!(html, "<p><img src=\"{p}\" alt=\"{p}\"></p>");
    }
    let _ = write!(
        html,
        "<p>Every job's record (state, CPU, progress and ETA each second): <code>runs.json</code>.</p>"
    );
    let path = dir.join("report.html");
    std::fs::write(&path, html)?;
    Ok(path)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_comparison_prints_as_markdown_and_writes_as_html_with_bold_summaries() {
        let t = Table {
            caption: "Completion time (s)".into(),
            header: vec!["job".into(), "model".into(), "a".into()],
            rows: vec![
                vec!["x<y".into(), "m".into(), "1.0".into()],
                vec!["average".into(), String::new(), "-20%".into()],
            ],
            summaries: 1,
        };
        assert_eq!(
            t.markdown(),
            "Completion time (s)\n\n| job | model | a |\n|---|---|---:|\n| x<y | m | 1.0 |\n| **average** |  | **-20%** |\n"
        );
        assert_eq!(
            t.html(),
            "<p>Completion time (s)</p><table><tr><th>job</th><th>model</th><th>a</th></tr>\
             <tr><td>x&lt;y</td><td>m</td><td>1.0</td></tr><tr><td><b>average</b></td><td></td><td><b>-20%</b></td></tr></table>"
        );
    }
}
