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
/// one operator and one viewer token (`TOKEN ROLE NAME`, what `--tokens` reads) into `dir`,
/// one subdirectory per service, which compose mounts as the service's `/certs`:
///
/// ```text
/// dir/ca.pem  ca.key  tokens -> manager/tokens    for users' tools (and the CA's key)
/// dir/manager/ca.pem  manager.pem  manager.key  tokens
/// dir/worker-1/ca.pem  worker-1.pem  worker-1.key
/// ```
///
/// Why directories: a rotation (this again) must reach running services, and a bind mount
/// of a single file keeps the file it was started with, so a file replaced by a rename (a
/// reader then sees the old key or the new, never half of one) was never seen. A directory
/// mount looks names up at each open and sees the renamed files; one directory per service
/// keeps what each container sees to what it needs: an agent gets the CA's certificate and
/// its own worker's certificate and key, not the CA's key, another worker's key or the
/// tokens. Every file is written by a rename ([`converge_messenger::tls::write_public`]),
/// keys after their certificates.
pub fn write_credentials(dir: &Path, manager_names: &[String], workers: &[String]) -> Result<()> {
    use converge_messenger::tls::{Credentials, files, write_private, write_public};
    if let Some(w) = workers
        .iter()
        .find(|w| matches!(w.as_str(), MANAGER_DIR | "" | "." | "..") || w.contains('/'))
    {
        bail!("worker id `{w}` cannot name a credentials subdirectory of its own");
    }
    let made = Credentials::new(manager_names, workers)?;
    std::fs::create_dir_all(dir)?;
    write_public(&dir.join(files::CA), &made.ca)?;
    write_private(&dir.join(files::CA_KEY), &made.ca_key)?;
    let manager = dir.join(MANAGER_DIR);
    made.write_side(&manager, None)?;
    let token = || uuid::Uuid::new_v4().simple().to_string();
    write_private(
        &manager.join(TOKENS),
        &format!("{} operator operator\n{} viewer viewer\n", token(), token()),
    )?;
    // One tokens file, where users have always read it and where the manager does.
    let link = dir.join(TOKENS);
    if std::fs::read_link(&link).ok().as_deref() != Some(Path::new(TOKENS_LINK)) {
        let new = dir.join(format!("{TOKENS}.link"));
        let _ = std::fs::remove_file(&new);
        std::os::unix::fs::symlink(TOKENS_LINK, &new)?;
        std::fs::rename(&new, &link)?;
    }
    for w in workers {
        made.write_side(&dir.join(w), Some(w))?;
    }
    // Files of the layout before this one (all in `dir`): left there, they would be taken
    // for the current ones, and they no longer are.
    let (cert, key) = files::MANAGER;
    let mut old = vec![cert.to_string(), key.to_string()];
    for w in workers {
        let (cert, key) = files::worker(w);
        old.extend([cert, key]);
    }
    for name in old {
        if std::fs::remove_file(dir.join(&name)).is_ok() {
            eprintln!(
                "xtask: removed {name}, left in {} by an older `cargo xtask certs` (the services' files are in subdirectories now)",
                dir.display()
            );
        }
    }
    Ok(())
}

/// The manager's subdirectory of a credentials directory.
pub const MANAGER_DIR: &str = "manager";

/// Where a credentials directory's `tokens` points.
const TOKENS_LINK: &str = "manager/tokens";

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
        remove_worker_cgroups();
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

/// Removes the worker cgroups the testbed's agents made (`/converge/<worker>` in every cgroup
/// hierarchy), once their jobs are gone. An agent removes its own when it stops with none
/// left in it, but compose stops the agents while their jobs still run, and the cgroups
/// outlived every testbed (a new user's walk). `rmdir` removes only an empty cgroup: one
/// another testbed's jobs still use stays.
pub fn remove_worker_cgroups() {
    let root = std::path::Path::new("/sys/fs/cgroup");
    let hierarchies: Vec<std::path::PathBuf> = if root.join("cgroup.controllers").exists() {
        vec![root.to_path_buf()]
    } else {
        (std::fs::read_dir(root).into_iter().flatten().flatten())
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .collect()
    };
    for h in hierarchies {
        let top = h.join("converge");
        for w in WORKERS {
            let _ = std::fs::remove_dir(top.join(w));
        }
        let _ = std::fs::remove_dir(&top);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker id that would name no directory of its own (the manager's, this one, the
    /// parent) is refused before anything is written.
    #[test]
    fn a_worker_id_that_is_not_a_directory_of_its_own_is_refused() {
        let dir = std::env::temp_dir().join(format!("converge-creds-{}", uuid::Uuid::new_v4()));
        for bad in ["manager", "..", ".", "", "a/b"] {
            let e = write_credentials(&dir, &["manager".into()], &[bad.into()]).unwrap_err();
            assert!(
                e.to_string().contains("cannot name a credentials"),
                "{bad}: {e}"
            );
        }
        assert!(!dir.exists(), "something was written");
    }

    /// Each compose service mounts one credentials directory as `/certs` (a directory, so a
    /// rotation's renamed files are seen: [`write_credentials`]), and that directory holds
    /// exactly the files the service's settings name: an agent no CA key, no other worker's
    /// key, no tokens.
    #[test]
    fn each_service_mounts_a_directory_of_exactly_its_own_credentials() {
        let dir = std::env::temp_dir().join(format!("converge-creds-{}", uuid::Uuid::new_v4()));
        let workers: Vec<String> = WORKERS.iter().map(|w| w.to_string()).collect();
        write_credentials(&dir, &["manager".into()], &workers).unwrap();
        // Written twice (a rotation), as over an older layout, leaves the same files.
        write_credentials(&dir, &["manager".into()], &workers).unwrap();
        let compose =
            std::fs::read_to_string(crate::workspace_root().join("docker-compose.yml")).unwrap();
        let mut services: Vec<(String, Vec<String>, Vec<String>)> = Vec::new();
        let mut in_services = false;
        for line in compose.lines() {
            if line == "services:" {
                in_services = true;
            } else if !line.starts_with(' ') && !line.is_empty() && !line.starts_with('#') {
                in_services = false;
            }
            let name = line.strip_prefix("  ").and_then(|l| l.strip_suffix(':'));
            if in_services && let Some(n) = name.filter(|n| !n.starts_with(' ')) {
                services.push((n.to_string(), Vec::new(), Vec::new()));
                continue;
            }
            let Some((_, settings, mounts)) = services.last_mut().filter(|_| in_services) else {
                continue;
            };
            let line = line.trim();
            if let Some(m) = line.strip_prefix("- ${CONVERGE_CERTS:-./target/certs}/") {
                mounts.push(m.to_string());
            } else if line.starts_with("CONVERGE_TLS_") || line.starts_with("CONVERGE_TOKENS:") {
                let file = line.split_once(':').unwrap().1.trim();
                settings.push(file.strip_prefix("/certs/").unwrap().to_string());
            }
        }
        let with_tls: Vec<_> = services.iter().filter(|s| !s.1.is_empty()).collect();
        assert_eq!(with_tls.len(), 1 + WORKERS.len(), "{services:?}");
        for (service, settings, mounts) in with_tls {
            let [mount] = mounts.as_slice() else {
                panic!("{service} mounts {mounts:?}: one directory of credentials, as /certs")
            };
            let sub = mount.strip_suffix(":/certs:ro").unwrap_or_else(|| {
                panic!("{service} mounts `{mount}`: a file, where a rotation is not seen")
            });
            let mut have: Vec<String> = std::fs::read_dir(dir.join(sub))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            have.sort();
            let mut want = settings.clone();
            want.sort();
            want.dedup();
            assert_eq!(have, want, "{service} mounts {sub}/");
        }
        let token = operator_token(&dir).unwrap();
        let manager_tokens = std::fs::read_to_string(dir.join(MANAGER_DIR).join(TOKENS)).unwrap();
        assert!(
            manager_tokens.contains(&token),
            "one tokens file for users and the manager"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
