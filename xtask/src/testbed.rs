//! The compose testbed: up, down, and removal of the job containers agents started (compose
//! does not know about those: agents create them on the host engine directly).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Result, bail};

use crate::run;

/// The compose project name, so the demo never touches a user's other projects.
pub const PROJECT: &str = "converge";

/// The workers the compose file defines.
pub const WORKERS: &[&str] = &["worker-1", "worker-2"];

/// A running testbed; tears itself down on drop, even after a failure or panic.
pub struct Testbed {
    root: PathBuf,
    checkpoints: PathBuf,
    compose: Vec<String>,
}

impl Testbed {
    /// Starts manager and agents with `policy`; checkpoints under `target/testbed`.
    pub fn up(root: &Path, policy: &str, port: u16) -> Result<Self> {
        Self::up_with(root, policy, port, &[], &[])
    }

    /// Like [`Testbed::up`], with only `services` (all when empty) and extra environment for
    /// the compose file's `${...}` settings.
    pub fn up_with(
        root: &Path,
        policy: &str,
        port: u16,
        services: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Self> {
        let checkpoints = root.join("target/testbed/checkpoints");
        std::fs::create_dir_all(&checkpoints)?;
        let tb = Self {
            root: root.to_path_buf(),
            checkpoints,
            compose: compose_command()?,
        };
        // Leftovers of an earlier run that was killed before it could clean up.
        tb.down_quietly();
        let mut cmd = tb.command();
        cmd.args(["up", "-d"])
            .args(services)
            .env("CONVERGE_POLICY", policy)
            .env("CONVERGE_PORT", port.to_string());
        for (k, v) in env {
            cmd.env(k, v);
        }
        run(&mut cmd)?;
        Ok(tb)
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.compose[0]);
        cmd.args(&self.compose[1..])
            .args(["-p", PROJECT, "-f"])
            .arg(self.root.join("docker-compose.yml"))
            .env("CONVERGE_CHECKPOINT_ROOT", &self.checkpoints)
            .current_dir(&self.root);
        cmd
    }

    /// Prints the last lines of every service's log (for a failed run).
    pub fn print_logs(&self) {
        let _ = self.command().args(["logs", "--tail", "40"]).status();
    }

    fn down_quietly(&self) {
        let _ = self
            .command()
            .args(["down", "-v", "--remove-orphans", "-t", "5"])
            .output();
        remove_job_containers();
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        eprintln!("xtask: tearing the testbed down");
        self.down_quietly();
    }
}

/// Removes every job container the testbed's agents started.
pub fn remove_job_containers() {
    for w in WORKERS {
        remove_containers(&format!("converge.worker={w}"));
    }
}

/// Removes every container carrying `label` (`key=value`).
pub(crate) fn remove_containers(label: &str) {
    let Ok(out) = Command::new("docker")
        .args(["ps", "-aq", "--filter"])
        .arg(format!("label={label}"))
        .output()
    else {
        return;
    };
    let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(String::from)
        .collect();
    if !ids.is_empty() {
        let _ = Command::new("docker")
            .args(["rm", "-f"])
            .args(&ids)
            .output();
    }
}

/// `docker compose` where the plugin exists, else `docker-compose` (1.29 on Debian).
fn compose_command() -> Result<Vec<String>> {
    let plugin = Command::new("docker")
        .args(["compose", "version"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if plugin {
        return Ok(vec!["docker".into(), "compose".into()]);
    }
    if Command::new("docker-compose")
        .arg("version")
        .output()
        .is_ok()
    {
        return Ok(vec!["docker-compose".into()]);
    }
    bail!("neither `docker compose` nor `docker-compose` is installed")
}
