//! The binary as a user meets it: flags and their exit codes, and SIGTERM handling.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use converge_contract::{CheckpointEvent, parse_line};

const BIN: &str = env!("CARGO_BIN_EXE_converge-trainer");

fn trainer() -> Command {
    let mut c = Command::new(BIN);
    // The test's own environment must not configure the trainer behind its back.
    for (k, _) in std::env::vars() {
        if k.starts_with("CONVERGE_") {
            c.env_remove(k);
        }
    }
    c
}

/// Sends `child` SIGTERM, as `docker stop` would.
fn sigterm(child: &std::process::Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn invalid_configuration_exits_64_naming_the_flag() {
    for (args, flag) in [
        (vec!["--model", "resnet-9000"], "--model"),
        (vec!["--steps", "0"], "--steps"),
        (vec!["--batch", "0"], "--batch"),
        (vec!["--lr", "-1"], "--lr"),
        (vec!["--size", "0"], "--size"),
        (
            vec!["--model", "vae-digits", "--metric", "accuracy"],
            "--metric",
        ),
        (vec!["--metric", "bleu"], "--metric"),
        (vec!["--no-such-flag"], "--no-such-flag"),
    ] {
        let out = trainer().args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
    }
    // Environment fallbacks are validated the same way.
    let out = trainer().env("CONVERGE_STEPS", "0").output().unwrap();
    assert_eq!(out.status.code(), Some(64));
}

#[test]
fn list_models_names_all_five() {
    let out = trainer().arg("--list-models").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for m in [
        "mlp-digits",
        "cnn-digits",
        "logreg-wine",
        "vae-digits",
        "gru-co2",
    ] {
        assert!(text.contains(m), "{text}");
    }
}

#[test]
fn sigterm_finishes_the_step_saves_and_exits_0_then_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let spawn = || {
        trainer()
            .args([
                "--model",
                "mlp-digits",
                "--steps",
                "1000000",
                "--threads",
                "1",
            ])
            .args(["--report-every", "5"])
            .env("CONVERGE_CHECKPOINT_DIR", dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut child = spawn();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // Wait for training to be under way, then ask it to stop as `docker stop` would.
    for l in lines.by_ref() {
        let p = parse_line(&l.unwrap(), None).unwrap().unwrap();
        if p.step >= 20 {
            break;
        }
    }
    sigterm(&child);
    let rest: Vec<String> = lines.map(Result::unwrap).collect();
    let code = child.wait().unwrap();
    assert_eq!(code.code(), Some(0), "exit status after SIGTERM");
    let saved = parse_line(rest.last().expect("a line after SIGTERM"), None)
        .unwrap()
        .unwrap();
    assert_eq!(saved.checkpoint, Some(CheckpointEvent::Saved));
    assert!(saved.checkpoint_bytes.unwrap() > 0);

    // The next incarnation resumes at the saved step.
    let mut child = spawn();
    let first = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .next()
        .unwrap()
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let p = parse_line(&first, None).unwrap().unwrap();
    assert_eq!(p.checkpoint, Some(CheckpointEvent::Restored));
    assert_eq!(p.step, saved.step);
}

/// A stop that comes while the trainer starts, before its handlers are in place (an
/// orchestrator's stop right after its start), is handled as any stop: it saves at once and
/// exits 0. Made certain here by starting the trainer with SIGTERM already pending and
/// blocked, as it is in a trainer that blocked it itself before the signal came; the trainer
/// must unblock it once it can handle it. Without that the signal is never seen (or, in a
/// container's PID 1 with no handler, dropped) and the run trains on to its end.
#[test]
#[allow(unsafe_code)]
fn a_sigterm_sent_before_the_handlers_are_in_place_is_handled() {
    use std::os::unix::process::CommandExt;

    use nix::sys::signal::{SigSet, SigmaskHow, Signal, raise, sigprocmask};

    let dir = tempfile::tempdir().unwrap();
    let mut cmd = trainer();
    cmd.args(["--model", "mlp-digits", "--steps", "300", "--threads", "1"])
        .env("CONVERGE_CHECKPOINT_DIR", dir.path());
    // SAFETY: between fork and exec only async-signal-safe calls (sigprocmask, raise), no
    // allocation.
    unsafe {
        cmd.pre_exec(|| {
            let mut term = SigSet::empty();
            term.add(Signal::SIGTERM);
            sigprocmask(SigmaskHow::SIG_BLOCK, Some(&term), None)?;
            raise(Signal::SIGTERM)?;
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = parse_line(stdout.lines().last().expect("a line"), None)
        .unwrap()
        .unwrap();
    assert_eq!(last.checkpoint, Some(CheckpointEvent::Saved), "{stdout}");
    assert!(last.step < 300, "it trained to the end: {stdout}");
    assert!(stderr.contains("stopped at step"), "{stderr}");
}

/// The same stop, sent while the trainer itself starts (here slowly, by fault injection),
/// before its handlers are in place: held until they are, then handled with a checkpoint.
/// Without the hold it would end the process at once, unsaved (killed by the signal).
#[test]
fn a_sigterm_sent_while_the_trainer_starts_is_held_until_it_can_save() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = trainer()
        .args(["--model", "mlp-digits", "--steps", "300", "--threads", "1"])
        .env("CONVERGE_CHECKPOINT_DIR", dir.path())
        .env("CONVERGE_FAULT_SLOW_START_MS", "1000")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
    // Its start under way (the first process's, before its re-exec): stop it now.
    for l in stderr.by_ref() {
        if l.unwrap().contains("starting slowly") {
            break;
        }
    }
    sigterm(&child);
    let rest: Vec<String> = stderr.map(Result::unwrap).collect();
    let stdout: Vec<String> = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map(Result::unwrap)
        .collect();
    let code = child.wait().unwrap();
    assert_eq!(code.code(), Some(0), "{code:?}: {rest:?}");
    let last = parse_line(stdout.last().expect("a line"), None)
        .unwrap()
        .unwrap();
    assert_eq!(last.checkpoint, Some(CheckpointEvent::Saved), "{stdout:?}");
    assert!(last.step < 300, "it trained to the end: {stdout:?}");
}

#[test]
fn ignore_sigterm_keeps_training_through_sigterm_and_still_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = trainer()
        .args([
            "--model",
            "mlp-digits",
            "--steps",
            "1000000",
            "--threads",
            "1",
        ])
        .args([
            "--report-every",
            "5",
            "--checkpoint-every",
            "50",
            "--ignore-sigterm",
        ])
        .env("CONVERGE_CHECKPOINT_DIR", dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut step_at_term = 0;
    for l in lines.by_ref() {
        let p = parse_line(&l.unwrap(), None).unwrap().unwrap();
        if p.step >= 20 {
            step_at_term = p.step;
            break;
        }
    }
    sigterm(&child);
    // It keeps going well past the step it was at, saving periodically, and never exits.
    let mut periodic_saves = 0;
    for l in lines.by_ref() {
        let p = parse_line(&l.unwrap(), None).unwrap().unwrap();
        if p.checkpoint == Some(CheckpointEvent::Saved) {
            periodic_saves += 1;
        }
        if p.step >= step_at_term + 200 {
            break;
        }
    }
    assert!(child.try_wait().unwrap().is_none(), "it exited on SIGTERM");
    assert!(
        periodic_saves >= 2,
        "periodic checkpoints continue: {periodic_saves}"
    );
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn sigterm_without_a_checkpoint_directory_exits_143() {
    let mut child = trainer()
        .args([
            "--model",
            "logreg-wine",
            "--steps",
            "100000000",
            "--threads",
            "1",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    lines.next().unwrap().unwrap();
    sigterm(&child);
    for _ in lines {}
    assert_eq!(child.wait().unwrap().code(), Some(143));
}

#[test]
fn threads_1_leaves_one_compute_thread() {
    // candle would otherwise start its own element-wise pool sized by the core count; the
    // binary re-execs itself to size it from --threads. Look at the live process's threads.
    let mut child = trainer()
        .args([
            "--model",
            "mlp-digits",
            "--steps",
            "100000000",
            "--threads",
            "1",
        ])
        .args(["--size", "4", "--batch", "256", "--report-every", "5"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    for l in lines.by_ref() {
        if parse_line(&l.unwrap(), None).unwrap().unwrap().step >= 10 {
            break;
        }
    }
    let tasks = std::fs::read_dir(format!("/proc/{}/task", child.id()))
        .unwrap()
        .map(|t| std::fs::read_to_string(t.unwrap().path().join("comm")).unwrap())
        .map(|c| c.trim().to_string())
        .collect::<Vec<_>>();
    let environ = std::fs::read(format!("/proc/{}/environ", child.id())).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    // The same re-exec keeps glibc from handing each step's tensors back to the kernel (a
    // step of this model cost ~40% more with glibc's defaults).
    let tunables = environ
        .split(|b| *b == 0)
        .map(String::from_utf8_lossy)
        .find_map(|kv| kv.strip_prefix("GLIBC_TUNABLES=").map(str::to_string));
    // (glibc rewrites the variable after reading it and may drop entries it has applied, so
    // only the first is checked.)
    assert!(
        tunables
            .as_deref()
            .is_some_and(|t| t.starts_with("glibc.malloc.mmap_threshold=33554432")),
        "GLIBC_TUNABLES of the running trainer: {tunables:?}"
    );
    // The main thread only waits on the pool; `trainer-0` does all the numeric work.
    let mut compute: Vec<&String> = tasks.iter().filter(|t| *t != "converge-traine").collect();
    compute.sort();
    assert_eq!(compute, vec!["trainer-0"], "threads: {tasks:?}");
}

#[test]
fn a_refused_checkpoint_exits_65_and_is_left_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("converge-trainer.ckpt");
    std::fs::write(&path, b"CVGTRAIN but then garbage").unwrap();
    let out = trainer()
        .args(["--model", "logreg-wine", "--steps", "10", "--threads", "1"])
        .env("CONVERGE_CHECKPOINT_DIR", dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(65), "{stderr}");
    assert!(stderr.contains("is corrupt"), "{stderr}");
    assert!(
        out.stdout.is_empty(),
        "no progress over a refused checkpoint"
    );
    assert_eq!(std::fs::read(&path).unwrap(), b"CVGTRAIN but then garbage");
}

#[test]
fn the_result_does_not_depend_on_threads() {
    // A migrated job may land on a worker with another core count (`--threads 0` resolves to
    // it). gemm splits work across threads by output blocks, never along the reduction, and
    // element-wise ops are independent per element, so the numbers are the same bit for bit.
    let final_line = |threads: &str| {
        let out = trainer()
            .args(["--model", "mlp-digits", "--size", "4", "--batch", "256"])
            .args([
                "--steps",
                "30",
                "--report-every",
                "1000",
                "--threads",
                threads,
            ])
            .output()
            .unwrap();
        assert!(out.status.success());
        let text = String::from_utf8(out.stdout).unwrap();
        let last = parse_line(text.lines().last().unwrap(), None)
            .unwrap()
            .unwrap();
        assert!(last.done);
        last.value.unwrap()
    };
    assert_eq!(final_line("1").to_bits(), final_line("2").to_bits());
}
