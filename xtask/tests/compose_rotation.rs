//! The README's rotation on the compose testbed: `cargo xtask certs` again while the manager
//! runs, and the manager serves the new certificate, with no restart. Needs Docker,
//! `docker compose` or `docker-compose`, and the manager image (`cargo xtask images`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A compose project of its own, taken down (volumes too) however the test ends.
struct Project {
    compose: Vec<String>,
    name: String,
    env: Vec<(&'static str, String)>,
}

impl Project {
    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.compose[0]);
        cmd.args(&self.compose[1..])
            .args(["-p", &self.name, "-f"])
            .arg(root().join("docker-compose.yml"))
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd
    }
}

impl Drop for Project {
    fn drop(&mut self) {
        let _ = self.command().args(["down", "-v", "-t", "2"]).output();
    }
}

fn compose() -> Vec<String> {
    let docker = Command::new("docker").arg("info").output();
    assert!(
        docker.is_ok_and(|o| o.status.success()),
        "this test needs a running Docker engine (`docker info` failed)"
    );
    if Command::new("docker")
        .args(["compose", "version"])
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return vec!["docker".into(), "compose".into()];
    }
    assert!(
        Command::new("docker-compose")
            .arg("version")
            .output()
            .is_ok_and(|o| o.status.success()),
        "this test needs `docker compose` or `docker-compose`"
    );
    vec!["docker-compose".into()]
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Connects over TLS trusting `ca`, until it works or `within` passes; the last error.
async fn connect_within(port: u16, ca: &Path, within: Duration) -> Result<(), String> {
    let start = Instant::now();
    loop {
        let tls = converge_messenger::tls::control_client(ca, "localhost").unwrap();
        let got = tonic::transport::Endpoint::from_shared(format!("https://127.0.0.1:{port}"))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect()
            .await;
        match got {
            Ok(_) => return Ok(()),
            Err(e) if start.elapsed() > within => {
                let mut words = e.to_string();
                let mut cause = std::error::Error::source(&e);
                while let Some(c) = cause {
                    words = format!("{words}: {c}");
                    cause = c.source();
                }
                return Err(words);
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

#[tokio::test]
async fn a_rotation_reaches_the_running_compose_manager() {
    let compose = compose();
    let certs =
        std::env::temp_dir().join(format!("converge-compose-certs-{}", uuid::Uuid::new_v4()));
    let xtask = env!("CARGO_BIN_EXE_xtask");
    run(Command::new(xtask).args(["certs", "--dir"]).arg(&certs));
    let port = free_port();
    let project = Project {
        compose,
        name: format!(
            "converge-rotation-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        ),
        env: vec![
            ("CONVERGE_CERTS", certs.display().to_string()),
            ("CONVERGE_PORT", port.to_string()),
            ("CONVERGE_METRICS_PORT", free_port().to_string()),
        ],
    };
    run(project.command().args(["up", "-d", "manager"]));
    let ca = certs.join("ca.pem");
    if let Err(e) = connect_within(port, &ca, Duration::from_secs(60)).await {
        let logs = project.command().args(["logs", "manager"]).output();
        panic!(
            "the manager never served its first certificate: {e}\n{}",
            logs.map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default()
        );
    }

    // The README's rotation: every file written again, under a new CA (of the same name).
    run(Command::new(xtask).args(["certs", "--dir"]).arg(&certs));
    // The manager reads its files at the next connection: the first one may already work.
    if let Err(e) = connect_within(port, &ca, Duration::from_secs(30)).await {
        let logs = project.command().args(["logs", "manager"]).output();
        panic!(
            "after the rotation the manager still serves the old certificate (its container \
             does not see the new files): {e}\n{}",
            logs.map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default()
        );
    }
    drop(project);
    let _ = std::fs::remove_dir_all(certs);
}
