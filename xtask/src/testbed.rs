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

/// Where [`Testbed::up_with`] writes the testbed's CA, certificates and tokens (new ones at every
/// start: a rotation each time).
pub fn credentials_dir(root: &Path) -> PathBuf {
    root.join("target/testbed/certs")
}

/// Names the manager's certificate carries: its compose service, and the host's loopback.
pub const MANAGER_NAMES: &[&str] = &["manager", "localhost", "127.0.0.1"];

/// Writes a cluster CA, the manager's and each worker's certificates, and a tokens file with
/// one operator and one viewer token (`TOKEN ROLE NAME`, what `--tokens` reads) into `dir`.
pub fn write_credentials(dir: &Path, manager_names: &[String], workers: &[String]) -> Result<()> {
    converge_messenger::tls::generate(dir, manager_names, workers)?;
    let token = || uuid::Uuid::new_v4().simple().to_string();
    converge_messenger::tls::write_private(
        &dir.join(TOKENS),
        &format!("{} operator xtask\n{} viewer viewer\n", token(), token()),
    )?;
    Ok(())
}

/// The tokens file's name in a credentials directory.
pub const TOKENS: &str = "tokens";

/// The operator token in a credentials directory's tokens file.
pub fn operator_token(dir: &Path) -> Result<String> {
    let text = std::fs::read_to_string(dir.join(TOKENS))?;
    text.lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(1) == Some(&"operator")).then(|| f[0].to_string())
        })
        .ok_or_else(|| anyhow::anyhow!("no operator token in {}", dir.join(TOKENS).display()))
}

/// A running testbed; tears itself down on drop, even after a failure or panic.
pub struct Testbed {
    root: PathBuf,
    checkpoints: PathBuf,
    compose: Vec<String>,
}

impl Testbed {
    /// Starts manager and agents with `policy` (checkpoints under `target/testbed`), only
    /// `services` (all when empty), with extra environment for the compose file's `${...}`
    /// settings.
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
        // TLS and tokens by default: fresh credentials for every start.
        let workers: Vec<String> = WORKERS.iter().map(|w| w.to_string()).collect();
        let names: Vec<String> = MANAGER_NAMES.iter().map(|s| s.to_string()).collect();
        write_credentials(&credentials_dir(root), &names, &workers)?;
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
            .env("CONVERGE_CERTS", credentials_dir(&self.root))
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
