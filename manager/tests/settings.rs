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

/// A variable set to nothing is unset, as a shell or a compose file means it: clap read each
/// as its flag given no value, and refused it, naming a flag the user had not typed. Here the
/// manager gets past all of them to the one setting that is wrong; and a settings file's key
/// whose variable is empty is the file's again.
#[test]
fn an_empty_variable_is_unset() {
    let dir = std::env::temp_dir().join(format!("converge-settings-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("manager.toml");
    std::fs::write(&file, "heartbeat-interval = \"soon\"\n").expect("settings file");
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let out = Command::new(env!("CARGO_BIN_EXE_converge-manager"))
            .args(["--listen", "127.0.0.1:0", "--state-dir", "none"])
            .args(args)
            .env_remove("CONVERGE_CONFIG")
            .envs(env.iter().copied())
            .output()
            .expect("converge-manager runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let empty = [
        ("CONVERGE_TLS_CA", ""),
        ("CONVERGE_LOST_AFTER", ""),
        ("CONVERGE_METRICS_LISTEN", ""),
        ("CONVERGE_POLICY", ""),
        ("CONVERGE_CONFIG", ""),
    ];
    let (code, err) = run(&["--tokens", "/nonexistent/tokens"], &empty);
    assert_eq!(code, Some(64), "{err}");
    assert!(
        err.contains("--tokens: cannot read /nonexistent/tokens"),
        "{err}"
    );
    let path = file.display().to_string();
    let (code, err) = run(&["--config", &path], &[("CONVERGE_HEARTBEAT_INTERVAL", "")]);
    assert_eq!(code, Some(64), "{err}");
    assert!(
        err.contains(&format!(
            "`heartbeat-interval` is set in the settings file {path}"
        )),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
