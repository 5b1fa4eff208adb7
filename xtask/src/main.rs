//! `cargo xtask`: the project's tasks, in Rust so they run wherever cargo does.
//!
//! - `images`: static release binaries and `FROM scratch` images (no registry needed).
//! - `demo`: the main job on the compose testbed (see [`demo`]).
//! - `test`: what CI runs (`.ci/run`): installs the test tools, builds images, runs every test.
//! - `measure`: the real workload on Docker, as data for the simulator (see [`measure`]).
//! - `experiment`: a trace run live on the testbed and in the simulator, compared job by job
//!   (see [`experiment`]).
//!
//! Start at [`Cmd`]; each variant's handler is a function below it.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

mod cluster;
mod demo;
mod experiment;
mod images;
mod measure;
mod testbed;
mod tools;

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Converge project tasks")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Build static binaries and `FROM scratch` images (`converge/<name>:dev`).
    Images {
        /// Which images (default: all of them).
        names: Vec<String>,
    },
    /// What Converge does: the demo's job mix live under the strongest other policy (the
    /// simulator picks it) and under converge, each on a fresh compose testbed, with a live
    /// view; a comparison table, and `target/demo/report.html` with the plots.
    Demo(demo::Args),
    /// A trace (`experiments/TRACE/trace.json`) run live on the testbed (3 runs per policy by
    /// default) and in the simulator; writes `experiments/TRACE/results.md`, `results.json`,
    /// the runs and the plots.
    Experiment(experiment::Args),
    /// Measure the trainer image on Docker (step time by CPU quota and threads, co-location,
    /// save/restore/start times, curves); writes `sim/measured/*.json` and the measured tables
    /// in `sim/README.md`.
    Measure(measure::Args),
    /// A cluster CA, a manager certificate and one client certificate per worker (mTLS
    /// between agents and manager), and a tokens file with an operator and a viewer token;
    /// writing over existing files rotates them, and running services take them. Each
    /// service's files go in a subdirectory of its own (`manager/`, `worker-1/`...), which
    /// compose mounts; `ca.pem` and `tokens` for users' tools stay at the top.
    Certs {
        /// Where the files go.
        #[arg(long, default_value = "target/certs")]
        dir: std::path::PathBuf,
        /// Worker ids, one certificate each (its name is the worker id).
        #[arg(long, value_delimiter = ',', default_value = "worker-1,worker-2")]
        workers: Vec<String>,
        /// Names (or IP addresses) the manager is reached by.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "manager,localhost,127.0.0.1"
        )]
        manager_names: Vec<String>,
    },
    /// Install the test tools, build the images, run every test (what CI runs).
    Test {
        /// Extra arguments passed to `cargo test`, after `--workspace`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let root = workspace_root();
    match cli.cmd {
        Cmd::Images { names } => images::build(&root, &names),
        Cmd::Demo(args) => demo::run(&root, &args),
        Cmd::Experiment(args) => experiment::run(&root, &args),
        Cmd::Measure(args) => measure::run(&root, &args),
        Cmd::Certs {
            dir,
            workers,
            manager_names,
        } => {
            let dir = root.join(dir);
            testbed::write_credentials(&dir, &manager_names, &workers)?;
            println!(
                "xtask: CA, manager ({}) and worker ({}) certificates, and a tokens file, in {} \
                 (ca.pem and tokens at the top, each service's files in {}/ and a directory per worker)",
                manager_names.join(", "),
                workers.join(", "),
                dir.display(),
                testbed::MANAGER_DIR,
            );
            Ok(())
        }
        Cmd::Test { args } => test(&root, &args),
    }
}

/// CI's command: everything a clean machine with Docker needs, then all tests.
fn test(root: &Path, args: &[String]) -> Result<()> {
    let path = tools::ensure_test_tools(root)?;
    // The decision cores read no clock (their clippy.toml bans it): checked before anything
    // else, since a core that reads the wall clock is one the simulator cannot drive.
    run(Command::new(cargo()).current_dir(root).args([
        "clippy",
        "--quiet",
        "-p",
        "converge-core",
        "-p",
        "converge-policy",
        "--",
        "-D",
        "clippy::disallowed_methods",
        "-D",
        "clippy::disallowed_types",
    ]))?;
    images::build(root, &[])?;
    let mut cmd = Command::new(cargo());
    cmd.current_dir(root)
        .env("PATH", path)
        .args(["test", "--workspace"])
        .args(args);
    run(&mut cmd)
}

pub(crate) fn workspace_root() -> PathBuf {
    // xtask lives one level below the workspace root.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask has a parent directory")
        .to_path_buf()
}

pub(crate) fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// Runs a command, echoing it, and fails with its exit status.
pub(crate) fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: running {cmd:?}");
    let status = cmd
        .status()
        .with_context(|| format!("could not start {:?}", cmd.get_program()))?;
    if !status.success() {
        bail!("{:?} failed with {status}", cmd.get_program());
    }
    Ok(())
}

/// Runs a command and returns its stdout.
pub(crate) fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("could not start {:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!(
            "{:?} failed with {}: {}",
            cmd.get_program(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
