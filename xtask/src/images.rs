//! Static binaries and `FROM scratch` images, with no registry.
//!
//! Why this shape: no image can be pulled here, so images contain nothing but one static
//! binary. glibc with `+crt-static` on the host triple needs nothing a fresh machine lacks
//! (`shared/notes/toolchain.md`). Passing `--target` explicitly makes cargo apply RUSTFLAGS to
//! the binaries only (not build scripts) and keeps them in `target/<triple>/image`, so the
//! debug build used by tests stays cached next to it in the same target dir.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::{cargo, output, run};

/// The cargo profile images are built with (the root `Cargo.toml` says what it optimises
/// and why).
const PROFILE: &str = "image";

/// One image: the package and binary it wraps.
struct Image {
    name: &'static str,
    package: &'static str,
    bin: &'static str,
}

const IMAGES: &[Image] = &[
    Image {
        name: "trainer",
        package: "converge-trainer",
        bin: "converge-trainer",
    },
    Image {
        name: "manager",
        package: "converge-manager",
        bin: "converge-manager",
    },
    Image {
        name: "agent",
        package: "converge-agent",
        bin: "converge-agent",
    },
];

/// Builds the named images (all when `names` is empty) as `converge/<name>:dev`.
pub fn build(root: &Path, names: &[String]) -> Result<()> {
    let chosen: Vec<&Image> = if names.is_empty() {
        IMAGES.iter().filter(|i| has_bin(root, i)).collect()
    } else {
        names
            .iter()
            .map(|n| {
                IMAGES.iter().find(|i| i.name == n).with_context(|| {
                    format!(
                        "unknown image `{n}`; known: {}",
                        IMAGES.iter().map(|i| i.name).collect::<Vec<_>>().join(", ")
                    )
                })
            })
            .collect::<Result<_>>()?
    };
    if chosen.is_empty() {
        return Ok(());
    }
    let triple = host_triple()?;
    let mut cmd = Command::new(cargo());
    cmd.current_dir(root)
        .args(["build", "--profile", PROFILE, "--target", &triple]);
    for i in &chosen {
        cmd.args(["-p", i.package, "--bin", i.bin]);
    }
    cmd.env(
        "RUSTFLAGS",
        "-C target-feature=+crt-static --cfg getrandom_backend=\"linux_getrandom\"",
    );
    run(&mut cmd)?;

    let target_dir = std::env::var("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| root.join("target"));
    for i in chosen {
        let bin = target_dir.join(&triple).join(PROFILE).join(i.bin);
        let ctx = target_dir.join("images").join(i.name);
        std::fs::create_dir_all(&ctx)?;
        std::fs::copy(&bin, ctx.join(i.bin))
            .with_context(|| format!("copying {}", bin.display()))?;
        std::fs::write(
            ctx.join("Dockerfile"),
            format!(
                "FROM scratch\nCOPY {bin} /{bin}\nENTRYPOINT [\"/{bin}\"]\n",
                bin = i.bin
            ),
        )?;
        let tag = format!("converge/{}:dev", i.name);
        run(Command::new("docker")
            .args(["build", "-q", "-t", &tag])
            .arg(&ctx))
        .with_context(|| format!("building image {tag}: is Docker running?"))?;
    }
    Ok(())
}

/// An image is built by default once its crate has the binary (crates fill in over time).
fn has_bin(root: &Path, i: &Image) -> bool {
    let dir = i.package.trim_start_matches("converge-");
    root.join(dir).join("src/main.rs").exists()
        || root
            .join(dir)
            .join("src/bin")
            .join(format!("{}.rs", i.bin))
            .exists()
}

fn host_triple() -> Result<String> {
    let v = output(Command::new("rustc").arg("-vV"))?;
    match v.lines().find_map(|l| l.strip_prefix("host: ")) {
        Some(t) => Ok(t.trim().to_string()),
        None => bail!("`rustc -vV` printed no host triple"),
    }
}
