//! The image as the agent will run it: `docker run` trains and prints progress, `docker stop`
//! leaves a checkpoint in the mounted directory and the container exits 0 within 10 s, and a
//! second container on the same volume resumes at the saved step.
//!
//! Needs Docker and the image `converge/trainer:dev` (`cargo xtask images trainer`; CI's
//! `cargo xtask test` builds it first). Without them this test fails and says so: a silent skip
//! would let a broken image pass.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use converge_contract::{CheckpointEvent, ProgressLine, parse_line};

const IMAGE: &str = "converge/trainer:dev";

fn docker(args: &[&str]) -> Output {
    Command::new("docker")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the docker CLI ({e}): install and start Docker"))
}

fn require_docker_and_image() {
    let v = docker(&["version", "--format", "{{.Server.Version}}"]);
    assert!(
        v.status.success(),
        "Docker is not reachable ({}): start the Docker engine",
        String::from_utf8_lossy(&v.stderr).trim()
    );
    let i = docker(&["image", "inspect", "--format", "{{.Id}}", IMAGE]);
    assert!(
        i.status.success(),
        "image {IMAGE} is missing: run `cargo xtask images trainer` first"
    );
}

/// A container removed (with `docker rm -f`) when the test ends, pass or fail.
struct Container(String);

impl Container {
    fn new(tag: &str) -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        Container(format!(
            "converge-trainer-test-{tag}-{}-{nanos}",
            std::process::id()
        ))
    }

    /// Progress lines so far (stdout and stderr; only progress lines are kept).
    fn progress(&self) -> Vec<ProgressLine> {
        let out = docker(&["logs", &self.0]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| parse_line(l, Some("loss")).expect("progress line parses"))
            .collect()
    }

    /// Follows the container's output (`docker logs -f`) until a progress line satisfies
    /// `until`, and returns the lines up to it; the stream ending first (the container
    /// exited) fails the test with what it printed.
    fn follow_until(&self, until: impl Fn(&ProgressLine) -> bool) -> Vec<ProgressLine> {
        let mut child = Command::new("docker")
            .args(["logs", "-f", &self.0])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("docker logs -f");
        let mut lines = Vec::new();
        for l in BufReader::new(child.stdout.take().unwrap()).lines() {
            let Some(p) = parse_line(&l.unwrap(), Some("loss")).expect("progress line parses")
            else {
                continue;
            };
            let done = until(&p);
            lines.push(p);
            if done {
                let _ = child.kill();
                let _ = child.wait();
                return lines;
            }
        }
        let _ = child.wait();
        panic!("{} stopped before the awaited line: {lines:?}", self.0);
    }

    fn exit_code(&self) -> i64 {
        let out = docker(&["inspect", "--format", "{{.State.ExitCode}}", &self.0]);
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = docker(&["rm", "-f", &self.0]);
    }
}

fn run_args<'a>(name: &'a str, volume: &'a str, steps: &'a str) -> Vec<&'a str> {
    vec![
        "run",
        "--name",
        name,
        "-v",
        volume,
        "-e",
        "CONVERGE_CHECKPOINT_DIR=/checkpoints",
        IMAGE,
        "--model",
        "mlp-digits",
        "--threads",
        "1",
        "--report-every",
        "20",
        "--steps",
        steps,
    ]
}

#[test]
fn docker_stop_saves_a_checkpoint_and_a_new_container_resumes_from_it() {
    require_docker_and_image();
    let dir = tempfile::tempdir().unwrap();
    let volume = format!("{}:/checkpoints", dir.path().display());

    // 1. Train (far more steps than will run) until progress is under way.
    let first = Container::new("first");
    let mut args = run_args(&first.0, &volume, "100000000");
    args.insert(1, "-d");
    let out = docker(&args);
    assert!(
        out.status.success(),
        "docker run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = first.follow_until(|l| l.step >= 200 && l.value.is_some());
    assert_eq!(lines[0].step, 0, "a fresh volume starts at step 0");

    // 2. `docker stop` sends SIGTERM and would SIGKILL after 10 s (exit 137); exit 0 means
    // the trainer saved and left on its own. (How fast is a measurement, not a test.)
    let out = docker(&["stop", "-t", "10", &first.0]);
    assert!(out.status.success());
    assert_eq!(first.exit_code(), 0, "exit code after docker stop");
    let lines = first.progress();
    let saved = lines.last().unwrap();
    assert_eq!(saved.checkpoint, Some(CheckpointEvent::Saved), "{saved:?}");
    let ckpt = dir.path().join("converge-trainer.ckpt");
    let size = std::fs::metadata(&ckpt)
        .unwrap_or_else(|e| panic!("{}: {e}", ckpt.display()))
        .len();
    assert_eq!(Some(size), saved.checkpoint_bytes);
    assert!(!Path::new(&format!("{}.tmp", ckpt.display())).exists());

    // 3. A new container on the same volume resumes there and finishes 40 steps later.
    let second = Container::new("second");
    let target = (saved.step + 40).to_string();
    let out = docker(&run_args(&second.0, &volume, &target));
    assert!(
        out.status.success(),
        "second run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = second.progress();
    let restored = &lines[0];
    assert_eq!(restored.checkpoint, Some(CheckpointEvent::Restored));
    assert_eq!(restored.step, saved.step, "resumes at the saved step");
    assert!(restored.elapsed_s >= saved.elapsed_s);
    let done = lines.last().unwrap();
    assert!(done.done);
    assert_eq!(done.step, saved.step + 40);
    assert_eq!(second.exit_code(), 0);
}
