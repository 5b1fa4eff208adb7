//! The manager binary refuses bad settings as a usage error (exit 64), each said once with the
//! program's name, whether clap or the manager itself finds it wrong.

use std::process::Command;

/// Runs converge-manager with `args` on a free loopback port, without a store: (exit code,
/// stderr).
fn manager(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_converge-manager"))
        .args(["--listen", "127.0.0.1:0", "--state-dir", "none"])
        .args(args)
        .env_remove("CONVERGE_CONFIG")
        .output()
        .expect("converge-manager runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_tokens_file_that_cannot_be_read_is_a_usage_error_said_once() {
    let (code, err) = manager(&["--tokens", "/nonexistent/tokens"]);
    assert_eq!(code, Some(64), "{err}");
    assert!(
        err.contains("converge-manager: --tokens: cannot read /nonexistent/tokens"),
        "{err}"
    );
    assert!(!err.contains("Caused by"), "causes said twice: {err}");
}

#[test]
fn a_flag_that_does_not_parse_is_a_usage_error() {
    let (code, err) = manager(&["--heartbeat-interval", "soon"]);
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("--heartbeat-interval"), "{err}");
}
