//! Control-plane load harness (issue 17): a real manager (the release binary, store on) and
//! synthetic agents as real tonic clients over loopback, against a bare tonic `AgentService`
//! with a no-op handler in the same run, so that every figure is also a ratio to what this
//! machine's gRPC stack can carry at all.
//!
//!     cargo build --release -p converge-manager
//!     cargo run --release -p converge-integration-tests --example load -- table
//!     cargo run --release -p converge-integration-tests --example load -- memory
//!     cargo run --release -p converge-integration-tests --example load -- soak --svg docs/soak.svg
//!
//! - `throughput` / `table`: agents × containers × rate → messages/s the server handled (the
//!   manager's own counter, taken after its decision core consumed each message; the bare
//!   handler's count), the latency from a progress message to the manager's state (a probe
//!   sends its job's next step and polls `GetJob` until it shows; against the bare server the
//!   echo's round trip), and the server process's CPU and RSS from `/proc`.
//! - `memory`: RSS of the manager with 1k, 10k and 100k live jobs, each with a full progress
//!   history, over the RSS with none: bytes per live job.
//!   With `CONVERGE_LOAD_WRAP="heaptrack -o /tmp/manager"` the manager runs under a heap
//!   profiler (its RSS then includes the profiler's own): where the bytes per job go, read
//!   with `heap`.
//! - `soak`: agents for minutes with jobs starting and finishing and agents reconnecting at
//!   random; RSS, tokio tasks, threads and open files every 10 s, drawn as an SVG; at the end,
//!   every job's final state is checked.
//! - `backup`: what a `Backup` costs at each number of stored jobs; `backlog`: SubmitJob/s at
//!   each number of jobs waiting for room; `workoff`: jobs completed/s by a full cluster
//!   working off a backlog.
//!
//! `throughput`, `backlog` and `workoff` take `--against PATH`: another build's `converge-manager`,
//! measured after this one in the same run, so that a change is a ratio within one run.

mod fleet;
mod target;

use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use clap::{Parser, Subcommand};
use converge_messenger::pb;
use converge_messenger::pb::control_service_client::ControlServiceClient;
use fleet::{Fleet, FleetConfig, Probe};
use target::{Kind, Target};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

#[derive(Parser)]
struct Args {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// One load shape against the bare stream, then against the manager.
    Throughput {
        #[arg(long, default_value_t = 100)]
        agents: usize,
        #[arg(long, default_value_t = 10)]
        containers: usize,
        /// Progress messages per second per container; 0 = as fast as the streams take them.
        #[arg(long, default_value_t = 0.0)]
        rate: f64,
        /// Seconds measured (after 3 s of warm-up).
        #[arg(long, default_value_t = 15)]
        seconds: u64,
        /// Extra arguments for the manager (e.g. `--manager-arg=--state-dir=none`).
        #[arg(long = "manager-arg", allow_hyphen_values = true)]
        manager_args: Vec<String>,
        /// A `converge-manager` binary of another build, measured after this one in the same
        /// run (a second row, its ratio also to the same bare stream).
        #[arg(long)]
        against: Option<std::path::PathBuf>,
    },
    /// The shapes of `docs/performance.md`, as a markdown table.
    Table {
        #[arg(long, default_value_t = 15)]
        seconds: u64,
    },
    /// Manager RSS per live job at each number of live jobs.
    Memory {
        #[arg(long, value_delimiter = ',', default_values_t = [1_000usize, 10_000, 100_000])]
        levels: Vec<usize>,
        /// Progress messages each job sends (enough to fill the kept history).
        #[arg(long, default_value_t = 40)]
        points: u64,
        /// Extra arguments for the manager (e.g. `--manager-arg=--progress-history=1`).
        #[arg(long = "manager-arg", allow_hyphen_values = true)]
        manager_args: Vec<String>,
    },
    /// Where a heap profile's peak went, by the innermost Converge function on each stack:
    /// reads heaptrack's collapsed stacks (`heaptrack_print -f FILE.zst
    /// --flamegraph-cost-type peak -F STACKS`).
    Heap {
        stacks: std::path::PathBuf,
        /// Rows shown.
        #[arg(long, default_value_t = 12)]
        top: usize,
    },
    /// Agents for minutes with jobs coming and going and agents reconnecting.
    Soak {
        #[arg(long, default_value_t = 1_000)]
        agents: usize,
        #[arg(long, default_value_t = 10)]
        minutes: u64,
        /// Seconds between samples.
        #[arg(long, default_value_t = 10)]
        every: u64,
        /// Agent reconnects per minute, at random agents.
        #[arg(long, default_value_t = 60)]
        reconnects: u64,
        /// Where to draw the memory curve.
        #[arg(long)]
        svg: Option<std::path::PathBuf>,
    },
    /// What `Backup` costs at each number of stored jobs: the copy's size and time, and the
    /// longest a GetJob waited while it ran (whatever of the copy the manager's actor does, it
    /// answers nothing meanwhile), against the median GetJob at rest. The jobs wait with no
    /// worker. With `--against`, the same against another manager build in the same run.
    Backup {
        #[arg(long, value_delimiter = ',', default_values_t = [1_000usize, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 100_000])]
        levels: Vec<usize>,
        #[arg(long)]
        against: Option<std::path::PathBuf>,
        /// Backups asked for at once at each level (the table shows the longest stream and the
        /// largest copy).
        #[arg(long, default_value_t = 1)]
        at_once: usize,
    },
    /// What a backlog of waiting jobs costs a submission: SubmitJob/s at each number of jobs
    /// waiting, with no worker, and with a full cluster (agents of one core each running one
    /// job, heartbeating and reporting progress once a second), the waiting jobs asking for a
    /// core each. With `--against`, the same against another manager build in the same run.
    Backlog {
        #[arg(long, value_delimiter = ',', default_values_t = [1_000usize, 2_000, 4_000, 8_000, 16_000])]
        levels: Vec<usize>,
        /// Agents of the full cluster.
        #[arg(long, default_value_t = 100)]
        agents: usize,
        /// A `converge-manager` binary of another build (e.g. an earlier commit's, built into
        /// its own target directory), measured after this one.
        #[arg(long)]
        against: Option<std::path::PathBuf>,
        /// Extra arguments for the managers (e.g. `--manager-arg=--policy=converge`).
        #[arg(long = "manager-arg", allow_hyphen_values = true)]
        manager_args: Vec<String>,
    },
    /// What a backlog of waiting jobs costs a full cluster working it off: jobs completed per
    /// second, once the agents (one core each, each job done in a tenth of a second) are busy,
    /// while the backlog is still at least half what it was, for two minutes at most. Every job
    /// that ends frees a core, which makes the manager ask again about the jobs waiting for
    /// one. With `--against`, the same against another manager build in the same run.
    Workoff {
        #[arg(long, value_delimiter = ',', default_values_t = [1_000usize, 4_000, 16_000])]
        levels: Vec<usize>,
        #[arg(long, default_value_t = 100)]
        agents: usize,
        /// Jobs of 2 cores submitted after the backlog: another kind, last in the queue, that
        /// no agent has room for.
        #[arg(long, default_value_t = 0)]
        big: usize,
        #[arg(long)]
        against: Option<std::path::PathBuf>,
        #[arg(long = "manager-arg", allow_hyphen_values = true)]
        manager_args: Vec<String>,
    },
    /// (Internal) the bare server.
    #[command(hide = true)]
    BareServer {
        #[arg(long)]
        listen: std::net::SocketAddr,
    },
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Cmd::BareServer { listen } = args.command {
        // The server under test gets the runtime the manager gets: tokio's default, all cores.
        return tokio::runtime::Runtime::new()?.block_on(target::bare::serve(listen));
    }
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        match args.command {
            Cmd::Throughput {
                agents,
                containers,
                rate,
                seconds,
                manager_args,
                against,
            } => {
                let shape = Shape {
                    agents,
                    containers,
                    rate,
                };
                let (bare, manager) = compare(&shape, seconds, &manager_args).await?;
                let other = match &against {
                    Some(bin) => {
                        let m = measure(Kind::Manager, Some(bin), &shape, seconds, &manager_args);
                        Some(m.await?)
                    }
                    None => None,
                };
                print_header();
                print_row(&shape, "", &bare, &manager);
                if let Some(other) = other {
                    print_row(&shape, " (against)", &bare, &other);
                }
            }
            Cmd::Table { seconds } => {
                print_header();
                for shape in SHAPES {
                    let (bare, manager) = compare(&shape, seconds, &[]).await?;
                    print_row(&shape, "", &bare, &manager);
                }
            }
            Cmd::Memory {
                levels,
                points,
                manager_args,
            } => memory(&levels, points, &manager_args).await?,
            Cmd::Heap { stacks, top } => heap(&stacks, top)?,
            Cmd::Backup {
                levels,
                against,
                at_once,
            } => backup(&levels, against.as_deref(), at_once).await?,
            Cmd::Backlog {
                levels,
                agents,
                against,
                manager_args,
            } => backlog(&levels, agents, against.as_deref(), &manager_args).await?,
            Cmd::Workoff {
                levels,
                agents,
                big,
                against,
                manager_args,
            } => workoff(&levels, agents, big, against.as_deref(), &manager_args).await?,
            Cmd::Soak {
                agents,
                minutes,
                every,
                reconnects,
                svg,
            } => soak(agents, minutes, every, reconnects, svg.as_deref()).await?,
            Cmd::BareServer { .. } => unreachable!(),
        }
        anyhow::Ok(())
    })
}

/// A load shape.
#[derive(Debug, Clone, Copy)]
struct Shape {
    agents: usize,
    containers: usize,
    rate: f64,
}

/// Saturating shapes (rate 0) find the ceiling; paced ones show latency under a load a cluster
/// of that size would put on the manager (a progress line per container per second).
const SHAPES: [Shape; 4] = [
    Shape {
        agents: 10,
        containers: 10,
        rate: 0.0,
    },
    Shape {
        agents: 100,
        containers: 10,
        rate: 0.0,
    },
    Shape {
        agents: 1_000,
        containers: 4,
        rate: 0.0,
    },
    Shape {
        agents: 1_000,
        containers: 10,
        rate: 1.0,
    },
];

/// One server's figures.
struct Measured {
    handled_per_s: f64,
    p50: Duration,
    p99: Duration,
    cpu_cores: f64,
    rss_bytes: u64,
}

async fn compare(
    shape: &Shape,
    seconds: u64,
    manager_args: &[String],
) -> anyhow::Result<(Measured, Measured)> {
    // Bare first, then the manager: each alone on the machine.
    let bare = measure(Kind::Bare, None, shape, seconds, &[]).await?;
    let manager = measure(Kind::Manager, None, shape, seconds, manager_args).await?;
    Ok((bare, manager))
}

fn print_header() {
    println!(
        "| agents × containers × rate | manager msgs/s | bare msgs/s | ratio | manager p50 / p99 | bare p50 / p99 | manager CPU | bare CPU | manager RSS | bare RSS |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
}

/// One row: `label` follows the shape (which build, when two are compared).
fn print_row(shape: &Shape, label: &str, bare: &Measured, manager: &Measured) {
    let rate = if shape.rate > 0.0 {
        format!("{}/s", shape.rate)
    } else {
        "max".into()
    };
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "| {} × {} × {rate}{label} | {:.0} | {:.0} | {:.2} | {:.1} / {:.1} ms | {:.1} / {:.1} ms | {:.2} cores | {:.2} cores | {:.0} MiB | {:.0} MiB |",
        shape.agents,
        shape.containers,
        manager.handled_per_s,
        bare.handled_per_s,
        manager.handled_per_s / bare.handled_per_s.max(1.0),
        ms(manager.p50),
        ms(manager.p99),
        ms(bare.p50),
        ms(bare.p99),
        manager.cpu_cores,
        bare.cpu_cores,
        manager.rss_bytes as f64 / (1 << 20) as f64,
        bare.rss_bytes as f64 / (1 << 20) as f64,
    );
}

async fn control(target: &Target) -> anyhow::Result<ControlServiceClient<Channel>> {
    let channel = tonic::transport::Endpoint::from_shared(target.endpoint())?
        .connect()
        .await
        .context("connecting to the manager's control API")?;
    Ok(ControlServiceClient::new(channel).max_decoding_message_size(1 << 30))
}

/// Submits `n` one-core jobs from 32 concurrent callers.
async fn submit(client: &ControlServiceClient<Channel>, n: usize) -> anyhow::Result<Vec<String>> {
    submit_of(client, n, converge_integration_tests::one_core_spec()).await
}

/// Submits `n` jobs of `spec` from 32 callers at once; their ids.
async fn submit_of(
    client: &ControlServiceClient<Channel>,
    n: usize,
    spec: pb::JobSpec,
) -> anyhow::Result<Vec<String>> {
    const CALLERS: usize = 32;
    let mut tasks = Vec::new();
    for k in 0..CALLERS {
        let mut c = client.clone();
        let count = n / CALLERS + usize::from(k < n % CALLERS);
        let spec = spec.clone();
        tasks.push(tokio::spawn(async move {
            let mut ids = Vec::with_capacity(count);
            for _ in 0..count {
                let r = c
                    .submit_job(pb::SubmitJobRequest {
                        spec: Some(spec.clone()),
                    })
                    .await?
                    .into_inner();
                ids.push(r.job_id);
            }
            anyhow::Ok(ids)
        }));
    }
    let mut ids = Vec::with_capacity(n);
    for t in tasks {
        ids.extend(t.await??);
    }
    Ok(ids)
}

/// A row of a table [`print_head`] began: the `first` cells, this build's rate, and the other
/// build's with the ratio to it when there is one.
fn print_rates(first: &str, this: f64, other: Option<f64>) {
    match other {
        Some(other) => println!(
            "| {first} | {this:.0} | {other:.0} | {:.1}x |",
            this / other
        ),
        None => println!("| {first} | {this:.0} |"),
    }
}

/// Waits until the manager's gauge of jobs in `state` reaches `n` (`completed` counts every
/// job that ever completed).
async fn jobs_in(target: &Target, state: &str, n: u64, within: Duration) -> anyhow::Result<()> {
    if let Err(r) = jobs_in_by(target, state, n, within).await? {
        bail!("{r} of {n} jobs {state} after {within:?}");
    }
    Ok(())
}

/// Waits until `n` jobs are in `state`, or `within` has passed: `Err` with how many were.
async fn jobs_in_by(
    target: &Target,
    state: &str,
    n: u64,
    within: Duration,
) -> anyhow::Result<Result<(), u64>> {
    let began = Instant::now();
    loop {
        let r = target.jobs_in(state).await?;
        if r >= n {
            return Ok(Ok(()));
        }
        if began.elapsed() > within {
            return Ok(Err(r));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn measure(
    kind: Kind,
    manager: Option<&std::path::Path>,
    shape: &Shape,
    seconds: u64,
    extra: &[String],
) -> anyhow::Result<Measured> {
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let target = Target::start_at(kind, manager, &extra).await?;
    let shutdown = CancellationToken::new();
    let mut probe = Probe::connect(&target.endpoint(), &shutdown).await?;
    let client = match kind {
        Kind::Manager => {
            let c = control(&target).await?;
            // The probe's worker is the only one yet: its job lands there, and it is full.
            submit(&c, 1).await?;
            probe.take_start().await?;
            Some(c)
        }
        Kind::Bare => None,
    };
    let fleet = Fleet::start(
        &target.endpoint(),
        &FleetConfig {
            agents: shape.agents,
            cpus: shape.containers as f64,
            rate: shape.rate,
            fake_containers: if kind == Kind::Bare {
                shape.containers
            } else {
                0
            },
            quiet_after: None,
            finish_after: None,
            prefix: "load-".into(),
        },
    )
    .await?;
    if let Some(c) = &client {
        let n = shape.agents * shape.containers;
        submit(c, n).await?;
        jobs_in(&target, "running", n as u64 + 1, Duration::from_secs(300)).await?;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (h0, p0) = (target.handled().await?, target.sample()?);
    let mut lat = probe
        .measure(
            client,
            Duration::from_millis(20),
            Duration::from_secs(seconds),
        )
        .await?;
    let (h1, p1) = (target.handled().await?, target.sample()?);
    fleet.stop().await;
    shutdown.cancel();
    let dt = (p1.at - p0.at).as_secs_f64();
    lat.sort();
    ensure!(!lat.is_empty(), "no latency samples");
    let q = |f: f64| lat[((lat.len() - 1) as f64 * f).round() as usize];
    Ok(Measured {
        handled_per_s: (h1 - h0) as f64 / dt,
        p50: q(0.5),
        p99: q(0.99),
        cpu_cores: (p1.cpu_s - p0.cpu_s) / dt,
        rss_bytes: p1.rss_bytes,
    })
}

async fn memory(levels: &[usize], points: u64, extra: &[String]) -> anyhow::Result<()> {
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let target = Target::start(Kind::Manager, &extra).await?;
    let client = control(&target).await?;
    let most = levels.iter().copied().max().unwrap_or(0);
    let agents = 100;
    let fleet = Fleet::start(
        &target.endpoint(),
        &FleetConfig {
            agents,
            cpus: most.div_ceil(agents) as f64,
            rate: 0.0,
            fake_containers: 0,
            quiet_after: Some(points),
            finish_after: None,
            prefix: "mem-".into(),
        },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let empty = target.sample()?.rss_bytes;
    println!(
        "manager RSS with {agents} agents and no jobs: {:.1} MiB; each job sends {points} progress messages",
        empty as f64 / (1 << 20) as f64
    );
    println!("| live jobs | manager RSS | over no jobs | per live job |");
    println!("|---:|---:|---:|---:|");
    let mut live = 0;
    for &level in levels {
        submit(&client, level - live).await?;
        live = level;
        jobs_in(&target, "running", live as u64, Duration::from_secs(900)).await?;
        // Settled: the manager took every job's points (heartbeats go on; they add nothing).
        while target.progress_handled().await? < live as u64 * points {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let rss = target.sample()?.rss_bytes;
        let over = rss.saturating_sub(empty);
        println!(
            "| {live} | {:.1} MiB | {:.1} MiB | {:.0} B |",
            rss as f64 / (1 << 20) as f64,
            over as f64 / (1 << 20) as f64,
            over as f64 / live as f64
        );
    }
    fleet.stop().await;
    Ok(())
}

async fn backup(
    levels: &[usize],
    against: Option<&std::path::Path>,
    at_once: usize,
) -> anyhow::Result<()> {
    let at_once = at_once.max(1);
    println!(
        "jobs are submitted from 32 callers with no worker (Pending): each one stored, none running; {at_once} Backup(s) at once"
    );
    println!(
        "| build | stored jobs | SubmitJob/s to get there | copy | Backup (whole stream) | GetJob at rest (median) | longest GetJob during the Backup | ratio |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for bin in std::iter::once(None).chain(against.map(Some)) {
        let build = if bin.is_some() { "against" } else { "this" };
        backup_levels(levels, bin, build, at_once).await?;
    }
    Ok(())
}

/// The rows of [`backup`] for one manager build.
async fn backup_levels(
    levels: &[usize],
    bin: Option<&std::path::Path>,
    build: &str,
    at_once: usize,
) -> anyhow::Result<()> {
    let target = Target::start_at(Kind::Manager, bin, &[]).await?;
    let client = control(&target).await?;
    // One GetJob's round trip, the median of `n`, of job `id`.
    let get = |id: String, n: usize| {
        let mut c = client.clone();
        async move {
            let mut took = Vec::with_capacity(n);
            for _ in 0..n {
                let t = Instant::now();
                c.get_job(pb::GetJobRequest {
                    job_id: id.clone(),
                    ..Default::default()
                })
                .await?;
                took.push(t.elapsed());
            }
            took.sort();
            anyhow::Ok(took[n / 2])
        }
    };
    let mut stored = 0;
    let mut last = String::new();
    for &level in levels {
        let t = Instant::now();
        let ids = submit(&client, level - stored).await?;
        let submit_rate = (level - stored) as f64 / t.elapsed().as_secs_f64();
        stored = level;
        last = ids.last().cloned().unwrap_or(last);
        let rest = get(last.clone(), 21).await?;
        let began = Instant::now();
        let copies: Vec<_> = (0..at_once)
            .map(|_| {
                let mut c = client.clone();
                tokio::spawn(async move {
                    let mut chunks = c.backup(pb::BackupRequest {}).await?.into_inner();
                    let mut bytes = 0;
                    while let Some(chunk) = chunks.message().await? {
                        bytes += chunk.data.len();
                    }
                    anyhow::Ok((bytes, began.elapsed()))
                })
            })
            .collect();
        // GetJobs one after another until the Backups are done: the longest waited for a copy.
        let mut during = Duration::ZERO;
        while copies.iter().any(|c| !c.is_finished()) {
            during = during.max(get(last.clone(), 1).await?);
        }
        let (mut bytes, mut took) = (0, Duration::ZERO);
        for copy in copies {
            let (b, t) = copy.await??;
            (bytes, took) = (bytes.max(b), took.max(t));
        }
        println!(
            "| {build} | {stored} | {submit_rate:.0} | {:.1} MiB | {:.0} ms | {:.2} ms | {:.1} ms | {:.0}x |",
            bytes as f64 / (1 << 20) as f64,
            took.as_secs_f64() * 1e3,
            rest.as_secs_f64() * 1e3,
            during.as_secs_f64() * 1e3,
            during.as_secs_f64() / rest.as_secs_f64()
        );
    }
    Ok(())
}

/// SubmitJob/s at each backlog level, for each cluster shape (no worker; `agents` full
/// agents), for this build and, if given, `against`: rows of the table `docs/performance.md`
/// shows ("A backlog of waiting jobs").
async fn backlog(
    levels: &[usize],
    agents: usize,
    against: Option<&std::path::Path>,
    manager_args: &[String],
) -> anyhow::Result<()> {
    let extra: Vec<&str> = manager_args.iter().map(String::as_str).collect();
    // Rates per (shape, build), each a list over the levels.
    let mut rates: Vec<Vec<Vec<f64>>> = Vec::new();
    for shape_agents in [0, agents] {
        let mut per_build = Vec::new();
        for bin in std::iter::once(None).chain(against.map(Some)) {
            let target = Target::start_at(Kind::Manager, bin, &extra).await?;
            let client = control(&target).await?;
            let fleet = if shape_agents > 0 {
                let fleet = Fleet::start(
                    &target.endpoint(),
                    &FleetConfig {
                        agents: shape_agents,
                        cpus: 1.0,
                        rate: 1.0,
                        fake_containers: 0,
                        quiet_after: None,
                        finish_after: None,
                        prefix: "full-".into(),
                    },
                )
                .await?;
                // One job per agent fills the cluster; the backlog comes after.
                submit(&client, shape_agents).await?;
                jobs_in(
                    &target,
                    "running",
                    shape_agents as u64,
                    Duration::from_secs(120),
                )
                .await?;
                Some(fleet)
            } else {
                None
            };
            let mut waiting = 0;
            let mut row = Vec::new();
            for &level in levels {
                let t = Instant::now();
                submit(&client, level - waiting).await?;
                row.push((level - waiting) as f64 / t.elapsed().as_secs_f64());
                waiting = level;
            }
            if let Some(fleet) = fleet {
                fleet.stop().await;
            }
            per_build.push(row);
        }
        rates.push(per_build);
    }
    print_head(
        "SubmitJob/s from 32 callers, at each number of jobs already waiting for a core",
        &[
            ("cluster", "---"),
            ("jobs waiting", "---:"),
            ("SubmitJob/s to get there", "---:"),
        ],
        against.is_some(),
    );
    for (shape, per_build) in [0, agents].iter().zip(&rates) {
        let cluster = if *shape == 0 {
            "no worker".to_string()
        } else {
            format!("{shape} agents of 1 core, full")
        };
        for (k, level) in levels.iter().enumerate() {
            let other = per_build.get(1).map(|o| o[k]);
            print_rates(&format!("{cluster} | {level}"), per_build[0][k], other);
        }
    }
    Ok(())
}

/// Jobs completed per second by `agents` full agents working off each backlog level, for this
/// build and, if given, `against` ("A backlog of waiting jobs").
async fn workoff(
    levels: &[usize],
    agents: usize,
    big: usize,
    against: Option<&std::path::Path>,
    manager_args: &[String],
) -> anyhow::Result<()> {
    let extra: Vec<&str> = manager_args.iter().map(String::as_str).collect();
    // Rates per level, one per build.
    let mut rates: Vec<Vec<f64>> = Vec::new();
    for &level in levels {
        let mut row = Vec::new();
        for bin in std::iter::once(None).chain(against.map(Some)) {
            let target = Target::start_at(Kind::Manager, bin, &extra).await?;
            let client = control(&target).await?;
            submit(&client, level).await?;
            let two_cores = pb::JobSpec {
                cpus: 2.0,
                ..converge_integration_tests::one_core_spec()
            };
            submit_of(&client, big, two_cores).await?;
            let fleet = Fleet::start(
                &target.endpoint(),
                &FleetConfig {
                    agents,
                    cpus: 1.0,
                    // A step each tenth of a second, and done after one.
                    rate: 10.0,
                    fake_containers: 0,
                    quiet_after: None,
                    finish_after: Some((1, 1)),
                    prefix: "work-".into(),
                },
            )
            .await?;
            // From when every agent has finished a job to when half the backlog is done, or
            // for two minutes (a slow build would take most of an hour).
            jobs_in(
                &target,
                "completed",
                agents as u64,
                Duration::from_secs(600),
            )
            .await?;
            let (from, t) = (target.jobs_in("completed").await?, Instant::now());
            let window = Duration::from_secs(120);
            // Past the window, what was done by then is the rate's.
            let _unfinished = jobs_in_by(&target, "completed", level as u64 / 2, window).await?;
            let to = target.jobs_in("completed").await?;
            row.push((to - from) as f64 / t.elapsed().as_secs_f64());
            fleet.stop().await;
        }
        rates.push(row);
    }
    print_head(
        &format!(
            "Jobs completed/s by {agents} agents of 1 core (each job done in 0.1 s) working off a backlog, until half of it is done or for 120 s{}",
            if big > 0 {
                format!("; {big} job(s) of 2 cores after the backlog")
            } else {
                String::new()
            }
        ),
        &[
            ("jobs waiting at the start", "---:"),
            ("completed/s", "---:"),
        ],
        against.is_some(),
    );
    for (level, row) in levels.iter().zip(&rates) {
        print_rates(&level.to_string(), row[0], row.get(1).copied());
    }
    Ok(())
}

/// The title and head of a Markdown table of `columns` (name, alignment), with a column for
/// the other build and the ratio to it when there is one (`--against`).
fn print_head(title: &str, columns: &[(&str, &str)], against: bool) {
    let against_columns: &[(&str, &str)] = if against {
        println!("{title}; `against`: the other build, in the same run");
        &[("against", "---:"), ("ratio", "---:")]
    } else {
        println!("{title}");
        &[]
    };
    let all = || columns.iter().chain(against_columns);
    println!(
        "|{}",
        all()
            .map(|(name, _)| format!(" {name} |"))
            .collect::<String>()
    );
    println!(
        "|{}",
        all()
            .map(|(_, align)| format!("{align}|"))
            .collect::<String>()
    );
}

/// Peak heap bytes by the innermost frame of our own crates (and what it called), from
/// heaptrack's collapsed stacks: one line per stack, frames root first, `;`-separated, then
/// the bytes.
fn heap(stacks: &std::path::Path, top: usize) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(stacks)
        .with_context(|| format!("reading heaptrack's stacks from {}", stacks.display()))?;
    // Rust's symbol hashes (`::h0123456789abcdef`) would split one function into many rows.
    // heaptrack prints legacy-mangled escapes (`_$LT$impl$u20$Foo$GT$`): made readable.
    let name = |f: &str| {
        // With debug info heaptrack appends the file: `foo::h0123.. (src/x.rs)`.
        let f = match f.rfind(" (") {
            Some(i) if f.ends_with(')') => &f[..i],
            _ => f,
        };
        let f = match f.rfind("::h") {
            Some(i) if f.len() - i == 19 => &f[..i],
            _ => f,
        };
        [
            ("$LT$", "<"),
            ("$GT$", ">"),
            ("$u20$", " "),
            ("$C$", ","),
            ("$u7b$", "{"),
            ("$u7d$", "}"),
            ("$RF$", "&"),
            ("..", "::"),
        ]
        .iter()
        .fold(f.trim_start_matches('_').to_string(), |s, (from, to)| {
            s.replace(from, to)
        })
    };
    let mut by: std::collections::HashMap<String, u64> = Default::default();
    for line in text.lines() {
        let Some((stack, bytes)) = line.rsplit_once(' ') else {
            continue;
        };
        let bytes: u64 = bytes.parse().context("a stack's bytes")?;
        let frames: Vec<&str> = stack.split(';').collect();
        let key = match frames.iter().rposition(|f| f.contains("converge")) {
            Some(i) => {
                let callee = frames
                    .get(i + 1)
                    .map(|f| name(f))
                    .filter(|c| !c.is_empty())
                    .unwrap_or_else(|| "(allocates itself)".into());
                format!("{} -> {callee}", name(frames[i]))
            }
            None => "(outside our crates: connections, HTTP/2, decode buffers)".into(),
        };
        *by.entry(key).or_default() += bytes;
    }
    let total: u64 = by.values().sum();
    let mut rows: Vec<_> = by.into_iter().collect();
    rows.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    println!("peak heap: {:.2} MiB", total as f64 / (1 << 20) as f64);
    println!("| MiB at peak | where (innermost Converge frame -> what it called) |");
    println!("|---:|---|");
    for (key, bytes) in rows.into_iter().take(top) {
        let key: String = key.chars().take(160).collect();
        println!("| {:.2} | `{key}` |", bytes as f64 / (1 << 20) as f64);
    }
    Ok(())
}

/// One soak sample.
struct Sample {
    t: f64,
    rss: u64,
    /// `VmData` ([`target::ProcSample::data_bytes`]).
    held: u64,
    tasks: u64,
    threads: u64,
    fds: u64,
    live: u64,
    finished: u64,
}

async fn soak(
    agents: usize,
    minutes: u64,
    every: u64,
    reconnects: u64,
    svg: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    use std::sync::atomic::Ordering;
    let target = Target::start(Kind::Manager, &[]).await?;
    let client = control(&target).await?;
    let cpus = 4.0;
    let fleet = Fleet::start(
        &target.endpoint(),
        &FleetConfig {
            agents,
            cpus,
            rate: 1.0,
            fake_containers: 0,
            quiet_after: None,
            // 20 s to 2 min at a step a second.
            finish_after: Some((20, 120)),
            prefix: "soak-".into(),
        },
    )
    .await?;
    let want_live = (agents as f64 * cpus * 0.8) as u64;
    println!(
        "soak: {agents} agents × {cpus} cores for {minutes} min, ~{want_live} live jobs of 20-120 steps at 1 step/s, {reconnects} reconnects/min"
    );
    let began = Instant::now();
    let length = Duration::from_secs(minutes * 60);
    let mut submitted: Vec<String> = Vec::new();
    let mut samples: Vec<Sample> = Vec::new();
    let mut next_sample = Duration::ZERO;
    let mut rng_state = 0x9e37_79b9_7f4a_7c15u64;
    let mut rand = move || {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        rng_state
    };
    let mut owed = 0.0;
    while began.elapsed() < length {
        let live = target.jobs_in("running").await?
            + target.jobs_in("starting").await?
            + target.jobs_in("pending").await?;
        if live < want_live {
            // At most 500 a second: a feed, not a burst.
            let n = (want_live - live).min(500) as usize;
            submitted.extend(submit(&client, n).await?);
        }
        owed += reconnects as f64 / 60.0;
        while owed >= 1.0 {
            fleet.reconnect(rand() as usize);
            owed -= 1.0;
        }
        if began.elapsed() >= next_sample {
            let p = target.sample()?;
            let s = Sample {
                t: began.elapsed().as_secs_f64(),
                rss: p.rss_bytes,
                held: p.data_bytes,
                tasks: target.tasks().await?,
                threads: p.threads,
                fds: p.fds,
                live,
                finished: fleet.counts.finished.load(Ordering::Relaxed),
            };
            println!(
                "t={:>5.0}s rss={:>7.1} MiB held={:>7.1} MiB tasks={:>6} threads={:>3} fds={:>5} live={:>5} finished={:>7} reconnects={}",
                s.t,
                s.rss as f64 / (1 << 20) as f64,
                s.held as f64 / (1 << 20) as f64,
                s.tasks,
                s.threads,
                s.fds,
                s.live,
                s.finished,
                fleet.counts.reconnects.load(Ordering::Relaxed)
            );
            samples.push(s);
            next_sample += Duration::from_secs(every);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // Let every job finish, then check each one's final state.
    let drain = Instant::now();
    loop {
        let live = target.jobs_in("running").await?
            + target.jobs_in("starting").await?
            + target.jobs_in("pending").await?;
        if live == 0 {
            break;
        }
        if drain.elapsed() > Duration::from_secs(600) {
            bail!("{live} jobs still live 10 min after the soak stopped submitting");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let jobs = client
        .clone()
        .list_jobs(pb::ListJobsRequest::default())
        .await?
        .into_inner()
        .jobs;
    let exits = fleet.exits.lock().expect("exits").clone();
    let mut wrong = Vec::new();
    let by_id: std::collections::BTreeMap<&str, &pb::Job> =
        jobs.iter().map(|j| (j.id.as_str(), j)).collect();
    for id in &submitted {
        match by_id.get(id.as_str()) {
            None => wrong.push(format!("{id}: missing")),
            Some(j) if j.state != pb::JobState::Completed as i32 => {
                wrong.push(format!("{id}: {:?} ({})", j.state(), j.reason))
            }
            Some(_) if exits.get(id) != Some(&0) => wrong.push(format!(
                "{id}: completed but its agent never ran it to the end"
            )),
            Some(_) => {}
        }
    }
    fleet.stop().await;
    let verdict = verdict(&samples);
    println!(
        "{} jobs submitted, {} listed, {} not as they should be; {}",
        submitted.len(),
        jobs.len(),
        wrong.len(),
        verdict
    );
    for w in wrong.iter().take(20) {
        println!("  {w}");
    }
    if let Some(path) = svg {
        std::fs::write(path, draw(&samples, &verdict))
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    ensure!(wrong.is_empty(), "{} jobs ended wrong", wrong.len());
    Ok(())
}

/// Flat after warm-up: the last third's mean memory held (`VmData`) and tasks within 10% of
/// the middle third's. RSS is reported beside it: it counts the pages of held memory written
/// so far, so it may climb towards a flat `VmData` for a long while (the allocator's chunks of
/// a finished job are reused by later ones, which write parts the first left untouched)
/// without the manager taking more memory; RSS above `VmData` growth would be file pages.
fn verdict(samples: &[Sample]) -> String {
    let n = samples.len();
    if n < 6 {
        return "too few samples for a verdict".into();
    }
    let mean =
        |s: &[Sample], f: &dyn Fn(&Sample) -> f64| s.iter().map(f).sum::<f64>() / s.len() as f64;
    let (mid, last) = (&samples[n / 3..2 * n / 3], &samples[2 * n / 3..]);
    let growth = |f: &dyn Fn(&Sample) -> f64| mean(last, f) / mean(mid, f).max(1.0) - 1.0;
    let rss = growth(&|s| s.rss as f64);
    let held = growth(&|s| s.held as f64);
    let tasks = growth(&|s| s.tasks as f64);
    let flat = held.abs() <= 0.10 && tasks.abs() <= 0.10;
    format!(
        "{}: last third over middle third: memory held {:+.1}%, tasks {:+.1}% (RSS {:+.1}%)",
        if flat { "flat" } else { "NOT flat" },
        held * 100.0,
        tasks * 100.0,
        rss * 100.0,
    )
}

/// RSS (MiB) and tokio tasks over time, one SVG.
fn draw(samples: &[Sample], verdict: &str) -> String {
    let (w, h, pad) = (720.0, 360.0, 50.0);
    let t_max = samples.last().map_or(1.0, |s| s.t).max(1.0);
    let rss_max = samples.iter().map(|s| s.rss.max(s.held)).max().unwrap_or(1) as f64
        / (1 << 20) as f64
        * 1.1;
    let tasks_max = samples.iter().map(|s| s.tasks).max().unwrap_or(1) as f64 * 1.1;
    let x = |t: f64| pad + t / t_max * (w - 2.0 * pad);
    let y = |v: f64, max: f64| h - pad - v / max.max(1e-9) * (h - 2.0 * pad);
    let line = |f: &dyn Fn(&Sample) -> f64, max: f64| {
        samples
            .iter()
            .map(|s| format!("{:.1},{:.1}", x(s.t), y(f(s), max)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let rss = line(&|s| s.rss as f64 / (1 << 20) as f64, rss_max);
    let held = line(&|s| s.held as f64 / (1 << 20) as f64, rss_max);
    let tasks = line(&|s| s.tasks as f64, tasks_max);
    format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{pad}" y="20">Manager under a soak: RSS (blue) and memory held, VmData (green), MiB, left; tokio tasks (orange, right)</text>
<text x="{pad}" y="36" fill="#555">{verdict}</text>
<line x1="{pad}" y1="{b}" x2="{r}" y2="{b}" stroke="black"/>
<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{b}" stroke="black"/>
<line x1="{r}" y1="{pad}" x2="{r}" y2="{b}" stroke="black"/>
<text x="{pad}" y="{lb}">0 s</text><text x="{r}" y="{lb}" text-anchor="end">{t_max:.0} s</text>
<text x="{lx}" y="{pad}" text-anchor="end" fill="#1f77b4">{rss_max:.0}</text>
<text x="{rx}" y="{pad}" fill="#ff7f0e">{tasks_max:.0}</text>
<text x="{lx}" y="{b}" text-anchor="end">0</text>
<polyline fill="none" stroke="#1f77b4" stroke-width="2" points="{rss}"/>
<polyline fill="none" stroke="#2ca02c" stroke-width="2" points="{held}"/>
<polyline fill="none" stroke="#ff7f0e" stroke-width="2" points="{tasks}"/>
</svg>
"##,
        b = h - pad,
        r = w - pad,
        lb = h - pad + 16.0,
        lx = pad - 4.0,
        rx = w - pad + 4.0,
    )
}
