//! `cargo xtask experiment NAME`: a paper's experiment on the real testbed.
//!
//! The same submission schedule runs twice on fresh compose testbeds — once under the paper's
//! baseline, once under the Converge policy — and the driver records, every second, each job's
//! state, worker and CPU use (from the agents' reports, through the control API). It then
//! prints per-job completion times, average JCT, makespan and the ratios, and writes
//! `experiments/NAME/results.md` with SVG plots: CPU use per job over time for both runs
//! (FlowCon's Figs. 7 and 8), jobs per worker over time with migrations marked (SpeCon's Figs. 8
//! and 9), and completion time per job.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use converge_messenger::pb;
use plotters::prelude::*;

use crate::cluster::{connect, terminal, wait_for_workers};
use crate::testbed::Testbed;

/// One submission of a schedule.
#[derive(Clone, Debug)]
pub struct Submission {
    /// Seconds after the run starts.
    pub at_s: f64,
    /// Label in tables and plots.
    pub name: &'static str,
    /// Trainer arguments.
    pub args: Vec<String>,
}

/// A scenario: the schedule, which services run, and the two policies compared.
pub struct Scenario {
    /// Directory name under `experiments/`.
    pub name: &'static str,
    /// What it reproduces, for the results file.
    pub title: &'static str,
    /// Compose services to start.
    pub services: &'static [&'static str],
    /// Extra compose environment (agent settings), for both runs.
    pub env: Vec<(&'static str, String)>,
    /// The baseline policy.
    pub baseline: &'static str,
    /// The policy under test.
    pub policy: &'static str,
    /// The submissions.
    pub schedule: Vec<Submission>,
    /// CPU cores each job requests (reservation).
    pub cpus: f64,
}

fn trainer(model: &str, size: u32, steps: u32) -> Vec<String> {
    [
        "--model",
        model,
        "--size",
        &size.to_string(),
        "--steps",
        &steps.to_string(),
        "--threads",
        "1",
        "--report-every",
        "25",
        "--checkpoint-every",
        "250",
    ]
    .map(String::from)
    .to_vec()
}

/// The scenarios this command knows.
pub fn scenarios() -> Vec<Scenario> {
    // Time is scaled by k = 4 against the papers so a run takes minutes on a 2-core machine.
    // Step counts come from step times measured on the trainer image at 1 CPU (vae-digits
    // size 32: 2.5 ms, mlp-digits size 12: 7.5 ms, cnn-digits size 6: 8.5 ms, gru-co2 size 2:
    // 6.7 ms): alone on a worker the VAE runs ~50 s (flat after its first tenth, like the
    // paper's) and each MNIST job ~20 s.
    vec![
        Scenario {
            name: "flowcon-3job",
            title: "FlowCon ICPP'19 §5.3 fixed schedule (VAE at 0 s, MNIST-PyTorch at 40 s, MNIST-TF at 80 s), time scaled by 1/4, one worker of 1 CPU",
            services: &["manager", "agent-1"],
            env: vec![("CONVERGE_FLOWCON_INTERVAL", "5s".into())],
            baseline: "spread",
            policy: "flowcon",
            schedule: vec![
                Submission {
                    at_s: 0.0,
                    name: "VAE",
                    args: trainer("vae-digits", 32, 20000),
                },
                Submission {
                    at_s: 10.0,
                    name: "MNIST-MLP",
                    args: trainer("mlp-digits", 12, 2700),
                },
                Submission {
                    at_s: 20.0,
                    name: "MNIST-CNN",
                    args: trainer("cnn-digits", 6, 2400),
                },
            ],
            cpus: 0.3,
        },
        Scenario {
            name: "specon-2worker",
            title: "SpeCon §VI-C job mix converging at different times on two 1-CPU workers, even initial placement, time scaled by 1/4",
            services: &["manager", "agent-1", "agent-2"],
            env: vec![
                ("CONVERGE_SPECON_INTERVAL", "8s".into()),
                ("CONVERGE_REBALANCE_INTERVAL", "8s".into()),
            ],
            baseline: "round-robin",
            policy: "specon",
            schedule: vec![
                Submission {
                    at_s: 0.0,
                    name: "J1-VAE",
                    args: trainer("vae-digits", 32, 24000),
                },
                Submission {
                    at_s: 5.0,
                    name: "J2-GRU",
                    args: trainer("gru-co2", 2, 3000),
                },
                Submission {
                    at_s: 10.0,
                    name: "J3-MLP",
                    args: trainer("mlp-digits", 12, 2700),
                },
                Submission {
                    at_s: 15.0,
                    name: "J4-CNN",
                    args: trainer("cnn-digits", 6, 2400),
                },
                Submission {
                    at_s: 20.0,
                    name: "J5-VAE",
                    args: trainer("vae-digits", 24, 24000),
                },
                Submission {
                    at_s: 25.0,
                    name: "J6-MLP",
                    args: trainer("mlp-digits", 8, 6000),
                },
            ],
            cpus: 0.3,
        },
    ]
}

/// What one run recorded.
#[derive(Default)]
struct Run {
    policy: String,
    /// Per job name: (submitted, finished) seconds since the run's start, final state, worker.
    jobs: BTreeMap<String, (f64, f64, String, String)>,
    /// (t, job name, cpu cores).
    cpu: Vec<(f64, String, f64)>,
    /// (t, worker, running jobs).
    per_worker: Vec<(f64, String, usize)>,
    /// (t, job name, from, to, downtime ms).
    migrations: Vec<(f64, String, String, String, Option<u64>)>,
}

/// Runs the named scenario under both policies and writes `experiments/NAME/`.
pub fn run(root: &Path, name: &str, port: u16) -> Result<()> {
    let all = scenarios();
    let Some(sc) = all.iter().find(|s| s.name == name) else {
        bail!(
            "unknown experiment `{name}`; known: {}",
            all.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
        );
    };
    crate::images::build(root, &[])?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let mut runs = Vec::new();
    for policy in [sc.baseline, sc.policy] {
        let env: Vec<(&str, &str)> = sc.env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let testbed = Testbed::up_with(root, policy, port, sc.services, &env)?;
        let result = rt.block_on(drive(sc, policy, port));
        if result.is_err() {
            testbed.print_logs();
        }
        drop(testbed);
        runs.push(result?);
    }
    let out = root.join("experiments").join(sc.name);
    std::fs::create_dir_all(&out)?;
    let report = report(sc, &runs[0], &runs[1]);
    println!("{report}");
    std::fs::write(out.join("results.md"), &report)?;
    for r in &runs {
        plot_cpu(&out.join(format!("cpu-{}.svg", r.policy)), sc, r)?;
        plot_workers(&out.join(format!("workers-{}.svg", r.policy)), sc, r)?;
    }
    plot_completion(&out.join("completion.svg"), sc, &runs[0], &runs[1])?;
    println!("wrote {}", out.display());
    Ok(())
}

async fn drive(sc: &Scenario, policy: &str, port: u16) -> Result<Run> {
    let endpoint = format!("http://127.0.0.1:{port}");
    let mut client = connect(&endpoint).await?;
    let workers = sc
        .services
        .iter()
        .filter(|s| s.starts_with("agent"))
        .count();
    wait_for_workers(&mut client, workers).await?;
    let mut run = Run {
        policy: policy.to_string(),
        ..Default::default()
    };
    let t0 = Instant::now();
    let mut ids: BTreeMap<String, &'static str> = BTreeMap::new();
    let mut pending: Vec<&Submission> = sc.schedule.iter().collect();
    let deadline = Duration::from_secs(60 * 60);
    loop {
        let now = t0.elapsed().as_secs_f64();
        while let Some(s) = pending.first().filter(|s| s.at_s <= now) {
            let spec = pb::JobSpec {
                name: s.name.to_string(),
                image: "converge/trainer:dev".into(),
                args: s.args.clone(),
                cpus: sc.cpus,
                ..Default::default()
            };
            let id = client
                .submit_job(pb::SubmitJobRequest { spec: Some(spec) })
                .await
                .map_err(|e| anyhow::anyhow!("submitting {}: {}", s.name, e.message()))?
                .into_inner()
                .job_id;
            ids.insert(id, s.name);
            pending.remove(0);
        }
        let jobs = client
            .list_jobs(pb::ListJobsRequest::default())
            .await?
            .into_inner()
            .jobs;
        let mut per_worker: BTreeMap<String, usize> = BTreeMap::new();
        for j in &jobs {
            let Some(name) = ids.get(&j.id) else { continue };
            let running = j.state == pb::JobState::Running as i32;
            if running {
                run.cpu.push((now, name.to_string(), j.cpu_usage));
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
                .all(|j| terminal(j.state));
        if done {
            let first = jobs.iter().map(|j| j.submitted_unix_ms).min().unwrap_or(0);
            let origin = first as f64 / 1000.0 - sc.schedule[0].at_s;
            for j in jobs.iter().filter(|j| ids.contains_key(&j.id)) {
                run.jobs.insert(
                    ids[&j.id].to_string(),
                    (
                        j.submitted_unix_ms as f64 / 1000.0 - origin,
                        j.finished_unix_ms as f64 / 1000.0 - origin,
                        pb::JobState::label_of(j.state),
                        j.worker_id.clone(),
                    ),
                );
            }
            // Migrations, from the event log.
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
                    run.migrations.push((
                        e.unix_ms as f64 / 1000.0 - origin,
                        ids.get(&e.job_id)
                            .map_or(e.job_id.clone(), |n| n.to_string()),
                        e.attributes.get("from").cloned().unwrap_or_default(),
                        e.attributes.get("to").cloned().unwrap_or_default(),
                        d.parse().ok(),
                    ));
                }
            }
            return Ok(run);
        }
        if t0.elapsed() > deadline {
            bail!("{policy}: jobs did not finish within {deadline:?}");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn report(sc: &Scenario, base: &Run, pol: &Run) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# {}\n\n{}\n", sc.name, sc.title);
    let _ = writeln!(
        s,
        "Command: `cargo xtask experiment {}`. Baseline `{}`, policy `{}`; the same schedule on a fresh testbed each.\n",
        sc.name, sc.baseline, sc.policy
    );
    let _ = writeln!(
        s,
        "| job | submitted (s) | {b} completion (s) | {p} completion (s) | change |",
        b = sc.baseline,
        p = sc.policy
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|");
    let mut improved = 0;
    for sub in &sc.schedule {
        let (Some(b), Some(p)) = (base.jobs.get(sub.name), pol.jobs.get(sub.name)) else {
            continue;
        };
        let (cb, cp) = (b.1 - b.0, p.1 - p.0);
        if cp < cb {
            improved += 1;
        }
        let _ = writeln!(
            s,
            "| {} | {:.0} | {:.1} ({}) | {:.1} ({}) | {:+.1}% |",
            sub.name,
            sub.at_s,
            cb,
            b.2,
            cp,
            p.2,
            100.0 * (cp - cb) / cb
        );
    }
    let avg =
        |r: &Run| r.jobs.values().map(|j| j.1 - j.0).sum::<f64>() / r.jobs.len().max(1) as f64;
    let makespan = |r: &Run| r.jobs.values().map(|j| j.1).fold(0.0, f64::max);
    let (ab, ap, mb, mp) = (avg(base), avg(pol), makespan(base), makespan(pol));
    let _ = writeln!(s);
    let _ = writeln!(s, "| | {} | {} | ratio |", sc.baseline, sc.policy);
    let _ = writeln!(s, "|---|---:|---:|---:|");
    let _ = writeln!(
        s,
        "| average completion time (s) | {ab:.1} | {ap:.1} | {:.3} |",
        ap / ab
    );
    let _ = writeln!(s, "| makespan (s) | {mb:.1} | {mp:.1} | {:.3} |", mp / mb);
    let _ = writeln!(
        s,
        "| jobs improved | | {improved} of {} | |",
        sc.schedule.len()
    );
    if !pol.migrations.is_empty() {
        let _ = writeln!(s, "\nMigrations under `{}`:\n", sc.policy);
        let _ = writeln!(
            s,
            "| t (s) | job | from | to | downtime (ms) |\n|---:|---|---|---|---:|"
        );
        for (t, j, f, to, d) in &pol.migrations {
            let _ = writeln!(
                s,
                "| {t:.0} | {j} | {f} | {to} | {} |",
                d.map_or("-".into(), |d| d.to_string())
            );
        }
    }
    let _ = writeln!(
        s,
        "\nPlots: `cpu-{b}.svg` / `cpu-{p}.svg` (CPU cores per job over time), `workers-{b}.svg` / `workers-{p}.svg` (running jobs per worker, migrations marked), `completion.svg`.",
        b = sc.baseline,
        p = sc.policy
    );
    s
}

fn plot_cpu(path: &Path, sc: &Scenario, r: &Run) -> Result<()> {
    let end = r.cpu.iter().map(|c| c.0).fold(1.0, f64::max);
    let root = SVGBackend::new(path, (900, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{}: CPU use per job ({})", sc.name, r.policy),
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(45)
        .build_cartesian_2d(0.0..end, 0.0..1.2)?;
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .y_desc("CPU (cores)")
        .draw()?;
    for (i, sub) in sc.schedule.iter().enumerate() {
        let pts: Vec<(f64, f64)> = r
            .cpu
            .iter()
            .filter(|c| c.1 == sub.name)
            .map(|c| (c.0, c.2))
            .collect();
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(2)))?
            .label(sub.name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE)
        .border_style(BLACK)
        .draw()?;
    root.present().context("writing the CPU plot")?;
    Ok(())
}

fn plot_workers(path: &Path, sc: &Scenario, r: &Run) -> Result<()> {
    let end = r.per_worker.iter().map(|c| c.0).fold(1.0, f64::max);
    let top = r.per_worker.iter().map(|c| c.2).max().unwrap_or(1) as f64 + 1.0;
    let root = SVGBackend::new(path, (900, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{}: running jobs per worker ({})", sc.name, r.policy),
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(45)
        .build_cartesian_2d(0.0..end, 0.0..top)?;
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
    chart.draw_series(r.migrations.iter().map(|(t, job, _, to, _)| {
        EmptyElement::at((*t, top - 0.5))
            + TriangleMarker::new((0, 0), 6, RED.filled())
            + Text::new(format!("{job}->{to}"), (5, 5), ("sans-serif", 11))
    }))?;
    chart
        .configure_series_labels()
        .background_style(WHITE)
        .border_style(BLACK)
        .draw()?;
    root.present().context("writing the workers plot")?;
    Ok(())
}

fn plot_completion(path: &Path, sc: &Scenario, base: &Run, pol: &Run) -> Result<()> {
    let n = sc.schedule.len();
    let top = [base, pol]
        .iter()
        .flat_map(|r| r.jobs.values().map(|j| j.1 - j.0))
        .fold(1.0, f64::max)
        * 1.1;
    let root = SVGBackend::new(path, (900, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{}: completion time per job", sc.name),
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(45)
        .build_cartesian_2d(0.0..n as f64, 0.0..top)?;
    chart
        .configure_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| {
            sc.schedule
                .get(x.floor() as usize)
                .map_or(String::new(), |s| s.name.to_string())
        })
        .y_desc("completion time (s)")
        .draw()?;
    for (k, (r, color)) in [(base, BLUE), (pol, RED)].into_iter().enumerate() {
        let bars: Vec<Rectangle<(f64, f64)>> = sc
            .schedule
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let j = r.jobs.get(s.name)?;
                let x = i as f64 + 0.1 + 0.4 * k as f64;
                Some(Rectangle::new(
                    [(x, 0.0), (x + 0.38, j.1 - j.0)],
                    color.filled(),
                ))
            })
            .collect();
        chart
            .draw_series(bars)?
            .label(r.policy.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE)
        .border_style(BLACK)
        .draw()?;
    root.present().context("writing the completion plot")?;
    Ok(())
}
