//! The agent's use of the Docker Engine API (bollard): connecting with version negotiation,
//! the labels and names of Converge containers, and turning a `Start` command into a
//! container definition.

use std::collections::HashMap;

use bollard::Docker;
use bollard::models::{ContainerCreateBody, HostConfig};
use converge_messenger::pb;

use crate::cgroup;
use crate::error::{Error, Result};

/// Label naming the job a container runs.
pub const LABEL_JOB: &str = "converge.job";
/// Label holding the incarnation's epoch.
pub const LABEL_EPOCH: &str = "converge.epoch";
/// Label naming the worker (agent) that owns the container.
pub const LABEL_WORKER: &str = "converge.worker";
/// Label holding the metric the job reports, so a re-adopting agent parses it the same way.
pub const LABEL_METRIC: &str = "converge.metric";
/// Label holding the job's checkpoint directory (relative to the checkpoint root).
pub const LABEL_CHECKPOINT_DIR: &str = "converge.checkpoint_dir";

/// Where the checkpoint directory is mounted in a container unless the job's env says otherwise.
pub const CONTAINER_CHECKPOINT_PATH: &str = "/checkpoint";

/// Connects to Docker and negotiates the API version down to what the engine speaks (the
/// engine here is 20.10, API 1.41; bollard 0.21 defaults to a newer version).
pub async fn connect(host: Option<&str>) -> Result<Docker> {
    let endpoint = host.unwrap_or("the default socket (DOCKER_HOST or /var/run/docker.sock)");
    let wrap = |source| Error::DockerConnect {
        endpoint: endpoint.to_string(),
        source,
    };
    let docker = match host {
        Some(h) => Docker::connect_with_host(h).map_err(wrap)?,
        None => Docker::connect_with_defaults().map_err(wrap)?,
    };
    let docker = docker.negotiate_version().await.map_err(wrap)?;
    // negotiate_version only reads /version; ping proves the engine answers API calls too.
    docker.ping().await.map_err(wrap)?;
    Ok(docker)
}

/// The container name of a job's incarnation on a worker: readable in `docker ps`, unique per
/// (worker, job, epoch) so two workers sharing an engine never collide.
pub fn container_name(worker: &str, job: &str, epoch: u64) -> String {
    let clean: String = job
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .take(100)
        .collect();
    format!("converge-{worker}-{clean}-e{epoch}")
}

/// Everything the agent decided about a container before creating it.
#[derive(Clone, Debug)]
pub struct ContainerPlan {
    /// Container name.
    pub name: String,
    /// Create body.
    pub body: ContainerCreateBody,
    /// CPU limit applied (cores, after clamping).
    pub cpus: f64,
    /// Host checkpoint directory (created before the container starts).
    pub host_checkpoint_dir: std::path::PathBuf,
    /// Checkpoint dir relative to the root, as labelled.
    pub checkpoint_dir: String,
}

/// Inputs of [`plan_container`] that come from the agent rather than the command.
pub struct PlanContext<'a> {
    /// Worker id.
    pub worker: &'a str,
    /// Worker CPU capacity (cores).
    pub capacity: f64,
    /// Docker cgroup parent.
    pub cgroup_parent: &'a str,
    /// Host checkpoint root.
    pub checkpoint_root: &'a std::path::Path,
    /// Most processes (and threads) a job container may have.
    pub pids_limit: i64,
}

/// The tmpfs's options: private, no executables or set-uid, bounded.
const JOB_TMPFS_OPTIONS: &str = "rw,noexec,nosuid,nodev,size=256m";

pub use converge_contract::{JOB_TMPFS, parse_user};

/// What every container the agent runs gets, a job's or the calibration benchmark's: its
/// worker's cgroup parent (the worker's capacity) and no privileges. A training job needs none,
/// and a job that escapes its process should find nothing to use (issue 15): no capabilities,
/// no new privileges, a read-only root with a bounded private tmpfs, a bounded process count.
///
/// And an init process (Docker's `docker-init`) as PID 1, passing signals on to the job: the
/// kernel drops a signal that has no handler sent to a PID 1, so a job process that is PID 1
/// and has no SIGTERM handler (yet: one stopped while it starts, or an image that never
/// installs one) ignores a stop, and only the SIGKILL at the stop's deadline ends it, its CPU
/// held until then. Under an init SIGTERM ends such a process at once.
pub fn unprivileged(cgroup_parent: &str, pids_limit: i64) -> HostConfig {
    HostConfig {
        init: Some(true),
        cgroup_parent: Some(cgroup_parent.to_string()),
        cap_drop: Some(vec!["ALL".into()]),
        security_opt: Some(vec!["no-new-privileges:true".into()]),
        readonly_rootfs: Some(true),
        tmpfs: Some(HashMap::from([(
            JOB_TMPFS.to_string(),
            JOB_TMPFS_OPTIONS.to_string(),
        )])),
        pids_limit: Some(pids_limit),
        ..Default::default()
    }
}

/// What to do about a container start that failed with `why` (Docker's words), when those
/// words name no fix: empty otherwise. Job containers run under Docker's init
/// ([`unprivileged`]), and a daemon installed without one fails every start.
pub fn start_fix(why: &str) -> &'static str {
    if why.contains("docker-init") {
        " (job containers run under Docker's init: install docker-init beside dockerd, e.g. \
         Debian's tini package, or point the daemon's init-path at one)"
    } else {
        ""
    }
}

/// Turns a `Start` command into a container definition, or says what is wrong with it.
pub fn plan_container(
    ctx: &PlanContext<'_>,
    job: &str,
    epoch: u64,
    start: &pb::Start,
) -> std::result::Result<ContainerPlan, String> {
    let spec = start.spec.as_ref().ok_or("Start has no job spec")?;
    if spec.image.is_empty() {
        return Err("Start.spec.image is empty".into());
    }
    let checkpoint_dir = if start.checkpoint_dir.is_empty() {
        job.to_string()
    } else {
        start.checkpoint_dir.trim_matches('/').to_string()
    };
    if checkpoint_dir.is_empty()
        || checkpoint_dir
            .split('/')
            .any(|s| s.is_empty() || s == "." || s == "..")
    {
        return Err(format!(
            "Start.checkpoint_dir `{}` must be a relative path without `.` or `..` parts",
            start.checkpoint_dir
        ));
    }
    let host_checkpoint_dir = ctx.checkpoint_root.join(&checkpoint_dir);
    let container_path = spec
        .env
        .get(converge_contract::CHECKPOINT_DIR_ENV)
        .cloned()
        .filter(|p| p.starts_with('/'))
        .unwrap_or_else(|| CONTAINER_CHECKPOINT_PATH.to_string());

    let mut env: Vec<String> = spec
        .env
        .iter()
        .filter(|(k, _)| k.as_str() != converge_contract::CHECKPOINT_DIR_ENV)
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    env.sort();
    env.push(format!(
        "{}={container_path}",
        converge_contract::CHECKPOINT_DIR_ENV
    ));

    let mut labels: HashMap<String, String> = spec.labels.clone();
    labels.insert(LABEL_JOB.into(), job.into());
    labels.insert(LABEL_EPOCH.into(), epoch.to_string());
    labels.insert(LABEL_WORKER.into(), ctx.worker.into());
    labels.insert(LABEL_CHECKPOINT_DIR.into(), checkpoint_dir.clone());
    if !spec.metric.is_empty() {
        labels.insert(LABEL_METRIC.into(), spec.metric.clone());
    }

    // Start.cpus is the limit to start with; 0 = none, which under the worker's parent means
    // "the whole worker".
    let cpus = cgroup::clamp_cpus(start.cpus, ctx.capacity);
    let host_config = HostConfig {
        nano_cpus: Some(cgroup::nano_cpus(cpus)),
        cpu_shares: (start.cpu_shares > 0).then_some(i64::from(start.cpu_shares.max(2))),
        // The manager refuses more than i64::MAX; saturate rather than wrap to a negative.
        memory: (spec.memory_bytes > 0)
            .then(|| i64::try_from(spec.memory_bytes).unwrap_or(i64::MAX)),
        binds: Some(vec![format!(
            "{}:{container_path}",
            host_checkpoint_dir.display()
        )]),
        ..unprivileged(ctx.cgroup_parent, ctx.pids_limit)
    };
    parse_user(&spec.user).map_err(|e| format!("Start.spec.user {e}"))?;
    let body = ContainerCreateBody {
        image: Some(spec.image.clone()),
        user: (!spec.user.is_empty()).then(|| spec.user.clone()),
        cmd: (!spec.args.is_empty()).then(|| spec.args.clone()),
        env: Some(env),
        labels: Some(labels),
        host_config: Some(host_config),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        ..Default::default()
    };
    Ok(ContainerPlan {
        name: container_name(ctx.worker, job, epoch),
        body,
        cpus,
        host_checkpoint_dir,
        checkpoint_dir,
    })
}

/// A Docker error as a sentence a person can act on.
pub fn describe(e: &bollard::errors::Error) -> String {
    match e {
        bollard::errors::Error::DockerResponseServerError {
            status_code,
            message,
        } => format!("Docker answered {status_code}: {message}"),
        other => format!("Docker request failed: {other}"),
    }
}

/// True when Docker answered 404 (no such container or image).
pub fn is_not_found(e: &bollard::errors::Error) -> bool {
    matches!(
        e,
        bollard::errors::Error::DockerResponseServerError {
            status_code: 404,
            ..
        }
    )
}

/// True when Docker answered 409 (name in use, or a state conflict).
pub fn is_conflict(e: &bollard::errors::Error) -> bool {
    matches!(
        e,
        bollard::errors::Error::DockerResponseServerError {
            status_code: 409,
            ..
        }
    )
}

/// True when Docker answered 304 (already started / already stopped).
pub fn is_not_modified(e: &bollard::errors::Error) -> bool {
    matches!(
        e,
        bollard::errors::Error::DockerResponseServerError {
            status_code: 304,
            ..
        }
    )
}

/// Parses Docker's log timestamps (RFC 3339 with up to nanoseconds, UTC `Z`) into Unix ns.
pub fn parse_timestamp_ns(ts: &str) -> Option<i128> {
    // 2026-11-22T14:47:24.123456789Z
    let (date, rest) = ts.split_once('T')?;
    let mut d = date.split('-');
    let y: i64 = d.next()?.parse().ok()?;
    let m: i64 = d.next()?.parse().ok()?;
    let day: i64 = d.next()?.parse().ok()?;
    let rest = rest.strip_suffix('Z')?;
    let (hms, frac) = rest.split_once('.').unwrap_or((rest, ""));
    let mut t = hms.split(':');
    let h: i64 = t.next()?.parse().ok()?;
    let mi: i64 = t.next()?.parse().ok()?;
    let s: i64 = t.next()?.parse().ok()?;
    let mut nanos: i64 = 0;
    if !frac.is_empty() {
        if frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        nanos = frac.parse::<i64>().ok()? * 10i64.pow(9 - frac.len() as u32);
    }
    let days = days_from_civil(y, m, day);
    let secs = days * 86_400 + h * 3600 + mi * 60 + s;
    Some(secs as i128 * 1_000_000_000 + nanos as i128)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> PlanContext<'static> {
        PlanContext {
            worker: "w1",
            capacity: 2.0,
            cgroup_parent: "/converge/w1",
            checkpoint_root: std::path::Path::new("/ckpt"),
            pids_limit: 512,
        }
    }

    fn start(cpus: f64) -> pb::Start {
        pb::Start {
            spec: Some(pb::JobSpec {
                image: "converge/trainer:dev".into(),
                args: vec!["--steps".into(), "10".into()],
                metric: "loss".into(),
                env: [("A".to_string(), "1".to_string())].into(),
                labels: [("team".to_string(), "x".to_string())].into(),
                ..Default::default()
            }),
            checkpoint_dir: "jobs/j1".into(),
            cpus,
            cpu_shares: 0,
        }
    }

    /// Every job container runs under Docker's init, and a daemon without one is told how
    /// to get it (Docker's own words name only a missing executable).
    #[test]
    fn job_containers_run_under_an_init_and_a_missing_one_names_the_fix() {
        assert_eq!(unprivileged("/w1", 64).init, Some(true));
        let why = r#"failed to create task for container: exec: "docker-init": executable file not found in $PATH"#;
        assert!(start_fix(why).contains("install docker-init"));
        assert_eq!(start_fix("no space left on device"), "");
    }

    #[test]
    fn a_start_becomes_a_labelled_container_under_the_worker_parent() {
        let p = plan_container(&ctx(), "j1", 3, &start(0.5)).unwrap();
        assert_eq!(p.name, "converge-w1-j1-e3");
        let labels = p.body.labels.as_ref().unwrap();
        assert_eq!(labels[LABEL_JOB], "j1");
        assert_eq!(labels[LABEL_EPOCH], "3");
        assert_eq!(labels[LABEL_WORKER], "w1");
        assert_eq!(labels["team"], "x");
        let hc = p.body.host_config.as_ref().unwrap();
        assert_eq!(hc.cgroup_parent.as_deref(), Some("/converge/w1"));
        assert_eq!(hc.nano_cpus, Some(500_000_000));
        assert_eq!(
            hc.binds.as_ref().unwrap(),
            &vec!["/ckpt/jobs/j1:/checkpoint".to_string()]
        );
        assert_eq!(hc.cap_drop.as_deref(), Some(&["ALL".to_string()][..]));
        assert_eq!(
            hc.security_opt.as_deref(),
            Some(&["no-new-privileges:true".to_string()][..])
        );
        assert_eq!((hc.readonly_rootfs, hc.pids_limit), (Some(true), Some(512)));
        assert!(hc.tmpfs.as_ref().unwrap().contains_key("/tmp"));
        assert_eq!(p.body.user, None);
        let env = p.body.env.as_ref().unwrap();
        assert!(env.contains(&"A=1".to_string()));
        assert!(env.contains(&"CONVERGE_CHECKPOINT_DIR=/checkpoint".to_string()));
    }

    #[test]
    fn a_start_limit_above_capacity_is_clamped() {
        let p = plan_container(&ctx(), "j1", 1, &start(8.0)).unwrap();
        assert_eq!(p.cpus, 2.0);
        let p = plan_container(&ctx(), "j1", 1, &start(0.0)).unwrap();
        assert_eq!(p.cpus, 2.0);
    }

    #[test]
    fn a_user_is_numeric_uid_or_uid_gid() {
        assert_eq!(parse_user(""), Ok(None));
        assert_eq!(parse_user("1000"), Ok(Some((1000, None))));
        assert_eq!(parse_user("1000:50"), Ok(Some((1000, Some(50)))));
        for bad in ["root", "1000:", ":1", "-1", "1:2:3"] {
            assert!(parse_user(bad).is_err(), "{bad}");
        }
        let mut s = start(1.0);
        s.spec.as_mut().unwrap().user = "1000:1000".into();
        let p = plan_container(&ctx(), "j1", 1, &s).unwrap();
        assert_eq!(p.body.user.as_deref(), Some("1000:1000"));
    }

    #[test]
    fn bad_starts_are_refused_with_a_reason() {
        let mut s = start(1.0);
        s.checkpoint_dir = "../etc".into();
        assert!(
            plan_container(&ctx(), "j1", 1, &s)
                .unwrap_err()
                .contains("checkpoint_dir")
        );
        let mut s = start(1.0);
        s.spec.as_mut().unwrap().image.clear();
        assert!(
            plan_container(&ctx(), "j1", 1, &s)
                .unwrap_err()
                .contains("image")
        );
        assert_eq!(container_name("w", "a/b c", 2), "converge-w-a_b_c-e2");
    }

    #[test]
    fn docker_timestamps_parse() {
        assert_eq!(
            parse_timestamp_ns("1970-01-01T00:00:01Z"),
            Some(1_000_000_000)
        );
        assert_eq!(
            parse_timestamp_ns("1970-01-01T00:00:00.5Z"),
            Some(500_000_000)
        );
        assert_eq!(
            parse_timestamp_ns("2000-03-01T00:00:00.000000001Z"),
            Some(951_868_800_000_000_001)
        );
        assert_eq!(parse_timestamp_ns("garbage"), None);
    }
}
