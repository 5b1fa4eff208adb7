//! FlowCon on a live worker (issue 5): the agent's executor runs TCC'22 Alg. 1-3 from real
//! progress lines and real cgroup CPU time, and applies the limits with Docker updates; the
//! manager shows each job's category, growth efficiency and limit. Real Docker, real trainer
//! containers, real gRPC, real grpcurl.

use std::time::Duration;

use converge_agent::policy::{Category, RoundReport, RoundTrigger};
use converge_integration_tests::{
    TRAINER_IMAGE, TestAgent, TestManager, cgroup_cpu, eventually, inspect_nano_cpus, job,
    require_docker, run_grpcurl, running_container_of, tempfile_dir, trainer_spec, unique,
    wait_for_workers,
};
use converge_messenger::pb::{self, control_service_client::ControlServiceClient};
use tokio::sync::mpsc;
use tonic::transport::Channel;

/// A long `mlp-digits --size 8` job (about 3 ms of CPU per step): its held-out loss makes 90% of
/// its gain in the first ~30 steps and is flat after ~750 (trainer/README.md, "--size 8"), so
/// within a few seconds of starting it gains far less than 2% of its initial loss per second.
fn long_mlp() -> pb::JobSpec {
    let mut spec = trainer_spec("mlp-digits", 200_000, 20);
    spec.args.extend(["--size".into(), "8".into()]);
    // Two of them fit the 1-core worker's reservations; FlowCon decides the real shares.
    spec.cpus = 0.5;
    spec
}

async fn submit(
    c: &mut ControlServiceClient<Channel>,
    spec: pb::JobSpec,
) -> anyhow::Result<String> {
    Ok(c.submit_job(pb::SubmitJobRequest { spec: Some(spec) })
        .await?
        .into_inner()
        .job_id)
}

/// CPU cores a container used over `window`, from its cgroup's CPU time.
async fn cores_used(
    config: &converge_agent::config::Config,
    id: &str,
    window: Duration,
) -> anyhow::Result<f64> {
    let (_, a) = cgroup_cpu(config, id)?;
    let t = std::time::Instant::now();
    tokio::time::sleep(window).await;
    let (_, b) = cgroup_cpu(config, id)?;
    Ok((b - a) as f64 / t.elapsed().as_nanos() as f64)
}

/// Issue 5, must-show: a job that is completing shares a 1-core worker with a newcomer. The
/// round the newcomer's start event triggers gives it a higher limit than the completing job's
/// (read back from both containers' cgroups), and the completing job's measured CPU use falls
/// to its limit (cgroup CPU-time deltas), while the newcomer takes the rest of the core.
///
/// Parameters, chosen so the scenario does not depend on timing luck:
/// - `--flowcon-interval 2s`: rounds come quickly, so the long job's lists advance in seconds.
/// - `--flowcon-alpha 0.02` (fixed, Alg. 3 off): 2% of the initial loss per second per core.
///   The job's first measured interval (2-4 s after its start) already gains under 1%/s, so it
///   goes New → Watching → Completing in two measured rounds; while alone and completing it
///   runs free (Alg. 1 lines 14-17).
/// - β = 2 (default): with two containers the completing job's lower bound is 1/(2·2) = 0.25 of
///   the worker, and its growth share is far below that, so its limit is exactly the bound;
///   the newcomer has no growth efficiency yet, so it gets the whole worker (limit 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completing_job_is_held_to_its_lower_bound_when_a_new_job_arrives() -> anyhow::Result<()>
{
    require_docker(&[TRAINER_IMAGE]);
    let checkpoints = tempfile_dir("flowcon")?;
    let manager = TestManager::start(|c| {
        c.policy = "flowcon".into();
        c.heartbeat_interval = Duration::from_millis(250);
    })
    .await?;
    let (reports_tx, mut reports) = mpsc::channel::<RoundReport>(1024);
    let mut config = converge_agent::config::Config::new(manager.endpoint(), unique("it-fc"), 1.0);
    config.checkpoint_root = checkpoints.path().to_path_buf();
    config.heartbeat_interval = Duration::from_millis(250);
    config.usage_interval = Duration::from_millis(500);
    config.flowcon_interval = Duration::from_secs(2);
    config.flowcon_alpha = Some(0.02);
    config.round_reports = Some(reports_tx);
    let agent = TestAgent::start_with(config.clone());
    let mut client = manager.control().await?;
    wait_for_workers(&client, 1).await?;

    let a = submit(&mut client, long_mlp()).await?;
    // The manager learns the category from the agent's heartbeats.
    eventually(
        Duration::from_secs(40),
        "the first job to be completing",
        || {
            let mut c = client.clone();
            let a = a.clone();
            async move {
                let j = job(&mut c, &a, false).await?;
                Ok((j.category == pb::Category::Completing as i32).then_some(()))
            }
        },
    )
    .await?;
    let a_container = running_container_of(&a)?;
    let (a_full, a_nano) = inspect_nano_cpus(&a_container)?;
    assert_eq!(
        a_nano, 1_000_000_000,
        "alone and completing: free (limit 1)"
    );
    let alone = cores_used(&config, &a_full, Duration::from_millis(1000)).await?;

    // Forget the rounds so far: the next Started round of the newcomer is the one we check.
    while reports.try_recv().is_ok() {}
    let b = submit(&mut client, long_mlp()).await?;
    let round = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let r = reports.recv().await.expect("agent reports rounds");
            if r.trigger == (RoundTrigger::Started { job_id: b.clone() }) {
                return r;
            }
        }
    })
    .await
    .map_err(|_| anyhow::anyhow!("no FlowCon round for the newcomer's start event"))?;

    // That very round: the newcomer above the completing job, both from its decisions and
    // from what the containers' cgroups now enforce.
    let limit = |id: &str| {
        round
            .decisions
            .limits
            .iter()
            .find(|l| l.job_id == id)
            .unwrap_or_else(|| panic!("{id} in the round: {round:#?}"))
            .clone()
    };
    let (la, lb) = (limit(&a), limit(&b));
    assert_eq!(la.category, Category::Completing, "{round:#?}");
    assert_eq!(lb.category, Category::New, "{round:#?}");
    assert!(
        lb.limit > la.limit,
        "newcomer {} <= completing {}",
        lb.limit,
        la.limit
    );
    assert!(
        (la.limit - 0.25).abs() < 1e-9,
        "completing job at 1/(β·n): {round:#?}"
    );
    let applied_a = round
        .applied
        .iter()
        .find(|l| l.job_id == a)
        .unwrap_or_else(|| panic!("{a} applied in the round: {round:#?}"));
    assert_eq!(
        (applied_a.cpus, applied_a.error.as_deref()),
        (0.25, None),
        "the round's Docker update of the completing job: {round:#?}"
    );
    let b_container = running_container_of(&b)?;
    let b_full = inspect_nano_cpus(&b_container)?.0;
    // What Docker and the cgroups enforce, against the latest round the agent reported: a
    // periodic round may run while the test reads (each `docker inspect` takes a while on a
    // busy host), so the reading is taken again until no round reported meanwhile.
    let mut latest = round.clone();
    let enforced = loop {
        while let Ok(r) = reports.try_recv() {
            latest = r;
        }
        let seen = (
            inspect_nano_cpus(&a_full)?.1,
            inspect_nano_cpus(&b_full)?.1,
            cgroup_cpu(&config, &a_full)?.0.expect("a CFS quota"),
            cgroup_cpu(&config, &b_full)?.0.expect("a CFS quota"),
        );
        match reports.try_recv() {
            Ok(r) => latest = r,
            Err(_) => break seen,
        }
    };
    let (a_nano, b_nano, a_quota, b_quota) = enforced;
    let in_force = |id: &str| {
        latest
            .applied
            .iter()
            .find(|l| l.job_id == id)
            .map(|l| l.cpus)
            .unwrap_or_else(|| panic!("{id} in the latest round: {latest:#?}"))
    };
    assert_eq!(
        in_force(&a),
        0.25,
        "the completing job stays at its lower bound: {latest:#?}"
    );
    assert_eq!(
        a_nano, 250_000_000,
        "docker inspect: completing job at 0.25 CPUs"
    );
    assert_eq!(
        b_nano,
        (in_force(&b) * 1e9).round() as i64,
        "docker inspect: newcomer at the latest round's limit: {latest:#?}"
    );
    assert!(
        b_quota > a_quota,
        "cgroup quotas: newcomer {b_quota} <= completing {a_quota}"
    );
    assert!((a_quota - 0.25).abs() < 1e-6, "cgroup quota {a_quota}");

    // Measured use over the next two seconds (the next round keeps both limits: the newcomer
    // has no growth efficiency before its second measured round).
    let (a_used, b_used) = tokio::join!(
        cores_used(&config, &a_full, Duration::from_secs(2)),
        cores_used(&config, &b_full, Duration::from_secs(2)),
    );
    let (a_used, b_used) = (a_used?, b_used?);
    println!(
        "completing job: {alone:.3} cores alone, {a_used:.3} under its 0.25 limit; newcomer {b_used:.3} cores"
    );
    println!(
        "container start -> limits applied: {:?} from Docker's event time, {:?} inside the agent",
        round.event_to_applied, round.received_to_applied
    );
    assert!(
        a_used <= 0.25 * 1.1 + 0.02,
        "completing job above its limit: {a_used}"
    );
    // The newcomer takes what the completing job may no longer use. (On a host so busy that
    // the worker got under half a core, both containers' fair shares sit below the 0.25 cap
    // and no order between them follows from the limits.)
    assert!(
        b_used > a_used || a_used + b_used < 0.5,
        "newcomer {b_used} <= completing {a_used} on a worker that got {} cores",
        a_used + b_used
    );
    assert!(round.event_to_applied.is_some() && round.received_to_applied.is_some());

    drop(agent);
    manager.stop().await;
    Ok(())
}

/// Issue 5, must-show: grpcurl shows a running job's category, growth efficiency and limit
/// (GetJob and ListJobs), and the worker's FlowCon threshold and interval (ListWorkers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcurl_shows_category_growth_and_limit_of_a_running_job() -> anyhow::Result<()> {
    require_docker(&[TRAINER_IMAGE]);
    let checkpoints = tempfile_dir("flowcon-grpcurl")?;
    let manager = TestManager::start(|c| {
        c.policy = "flowcon".into();
        c.heartbeat_interval = Duration::from_millis(250);
    })
    .await?;
    let mut config = converge_agent::config::Config::new(manager.endpoint(), unique("it-fg"), 1.0);
    config.checkpoint_root = checkpoints.path().to_path_buf();
    config.heartbeat_interval = Duration::from_millis(250);
    // Adaptive threshold (the default); short rounds so G is measured within seconds.
    config.flowcon_interval = Duration::from_secs(1);
    let agent = TestAgent::start_with(config);
    let mut client = manager.control().await?;
    wait_for_workers(&client, 1).await?;
    let id = submit(&mut client, long_mlp()).await?;
    eventually(
        Duration::from_secs(40),
        "a measured growth efficiency",
        || {
            let mut c = client.clone();
            let id = id.clone();
            async move {
                let j = job(&mut c, &id, false).await?;
                Ok(
                    (j.state == pb::JobState::Running as i32 && j.growth_efficiency.is_some())
                        .then_some(()),
                )
            }
        },
    )
    .await?;

    let addr = manager.addr.to_string();
    let body = format!(r#"{{"jobId":"{id}"}}"#);
    let (a, b) = (addr.clone(), body.clone());
    let get = tokio::task::spawn_blocking(move || {
        run_grpcurl(&[
            "-plaintext",
            "-d",
            &b,
            &a,
            "converge.v1.ControlService/GetJob",
        ])
    })
    .await??;
    let a = addr.clone();
    let list = tokio::task::spawn_blocking(move || {
        run_grpcurl(&[
            "-plaintext",
            "-d",
            "{}",
            &a,
            "converge.v1.ControlService/ListJobs",
        ])
    })
    .await??;
    let a = addr.clone();
    let workers = tokio::task::spawn_blocking(move || {
        run_grpcurl(&[
            "-plaintext",
            "-d",
            "{}",
            &a,
            "converge.v1.ControlService/ListWorkers",
        ])
    })
    .await??;
    println!("GetJob:\n{get}");

    let check = |j: &serde_json::Value, what: &str| {
        let category = j["category"].as_str().unwrap_or_default();
        assert!(
            category.starts_with("CATEGORY_") && category != "CATEGORY_UNSPECIFIED",
            "{what}: category missing: {j:#}"
        );
        assert!(
            j["growthEfficiency"].is_number(),
            "{what}: growthEfficiency missing: {j:#}"
        );
        let limit = j["cpuLimit"].as_f64().unwrap_or(-1.0);
        assert!(
            limit > 0.0 && limit <= 1.0,
            "{what}: cpuLimit missing or out of (0, 1]: {j:#}"
        );
    };
    let get: serde_json::Value = serde_json::from_str(&get)?;
    check(&get, "GetJob");
    let list: serde_json::Value = serde_json::from_str(&list)?;
    let listed = list["jobs"]
        .as_array()
        .and_then(|js| js.iter().find(|j| j["id"] == id.as_str()))
        .unwrap_or_else(|| panic!("job {id} in ListJobs: {list:#}"));
    check(listed, "ListJobs");
    let workers: serde_json::Value = serde_json::from_str(&workers)?;
    let w = &workers["workers"][0];
    assert!(w["alpha"].is_number(), "worker alpha missing: {w:#}");
    assert!(
        w["intervalS"].is_number(),
        "worker intervalS missing: {w:#}"
    );

    drop(agent);
    manager.stop().await;
    Ok(())
}

/// The time from a container start or die event to FlowCon's new limits being applied, over
/// a few arrivals and departures on a 1-core worker (issue 5's "event → limits" budget: under
/// 1 s). A measurement, not a test: `cargo test -p converge-integration-tests --test
/// flowcon_docker -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, not a test: run with --ignored --nocapture"]
async fn event_to_applied_limits_latency() -> anyhow::Result<()> {
    require_docker(&[TRAINER_IMAGE]);
    let checkpoints = tempfile_dir("flowcon-latency")?;
    let manager = TestManager::start(|c| {
        c.policy = "flowcon".into();
        c.heartbeat_interval = Duration::from_millis(250);
    })
    .await?;
    let (reports_tx, mut reports) = mpsc::channel::<RoundReport>(4096);
    let mut config = converge_agent::config::Config::new(manager.endpoint(), unique("it-fl"), 1.0);
    config.checkpoint_root = checkpoints.path().to_path_buf();
    config.heartbeat_interval = Duration::from_millis(250);
    config.flowcon_interval = Duration::from_secs(2);
    config.round_reports = Some(reports_tx);
    let agent = TestAgent::start_with(config);
    let mut client = manager.control().await?;
    wait_for_workers(&client, 1).await?;
    let mut ids = Vec::new();
    for i in 0..6u64 {
        let mut spec = trainer_spec("mlp-digits", 400 + 200 * i, 20);
        spec.args.extend(["--size".into(), "8".into()]);
        spec.cpus = 0.1;
        ids.push(submit(&mut client, spec).await?);
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    eventually(Duration::from_secs(120), "every job to finish", || {
        let mut c = client.clone();
        let ids = ids.clone();
        async move {
            for id in &ids {
                let j = job(&mut c, id, false).await?;
                if j.state != pb::JobState::Completed as i32 {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        }
    })
    .await?;
    let mut rows = Vec::new();
    while let Ok(r) = reports.try_recv() {
        if let (Some(e), Some(a)) = (r.event_to_applied, r.received_to_applied) {
            let kind = match r.trigger {
                RoundTrigger::Started { .. } => "start",
                RoundTrigger::Died { .. } => "die",
                _ => continue,
            };
            let changed = r.applied.iter().filter(|a| a.changed).count();
            rows.push((kind, r.applied.len(), changed, e, a));
        }
    }
    println!("event | containers | limits changed | event time -> applied | received -> applied");
    for (kind, n, changed, e, a) in &rows {
        println!("{kind} | {n} | {changed} | {e:?} | {a:?}");
    }
    let mut all: Vec<Duration> = rows.iter().map(|r| r.3).collect();
    all.sort();
    if let (Some(p50), Some(max)) = (all.get(all.len() / 2), all.last()) {
        println!("{} events: median {p50:?}, max {max:?}", all.len());
    }
    drop(agent);
    manager.stop().await;
    Ok(())
}

/// Issue 5: when the manager's policy says "free" (here: the worker re-registers with a manager
/// running `spread`), the agent removes the limits FlowCon set and its containers compete
/// freely within the worker's capacity again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_flowcon_set_are_released_when_the_policy_turns_free() -> anyhow::Result<()> {
    require_docker(&[TRAINER_IMAGE]);
    let checkpoints = tempfile_dir("flowcon-free")?;
    let manager = TestManager::start(|c| {
        c.policy = "flowcon".into();
        c.heartbeat_interval = Duration::from_millis(250);
    })
    .await?;
    let addr = manager.addr;
    let mut config = converge_agent::config::Config::new(manager.endpoint(), unique("it-ff"), 1.0);
    config.checkpoint_root = checkpoints.path().to_path_buf();
    config.heartbeat_interval = Duration::from_millis(250);
    config.flowcon_interval = Duration::from_secs(1);
    // Two jobs both learning: their limits become their shares of growth efficiency.
    config.flowcon_alpha = Some(0.0);
    config.fence_after = Duration::ZERO;
    let agent = TestAgent::start_with(config);
    let mut client = manager.control().await?;
    wait_for_workers(&client, 1).await?;
    let ids = [
        submit(&mut client, long_mlp()).await?,
        submit(&mut client, long_mlp()).await?,
    ];
    // Some container is held below the whole worker by FlowCon.
    eventually(
        Duration::from_secs(40),
        "a FlowCon limit below 1 CPU",
        || {
            let ids = ids.clone();
            async move {
                for id in &ids {
                    if let Ok(c) = running_container_of(id)
                        && inspect_nano_cpus(&c)?.1 < 1_000_000_000
                    {
                        return Ok(Some(()));
                    }
                }
                Ok(None)
            }
        },
    )
    .await?;
    drop(client);
    tokio::time::timeout(Duration::from_secs(15), manager.stop())
        .await
        .map_err(|_| anyhow::anyhow!("the manager did not stop"))?;
    let manager = TestManager::start_at(addr, |c| {
        c.policy = "spread".into();
        c.heartbeat_interval = Duration::from_millis(250);
    })
    .await?;
    eventually(Duration::from_secs(30), "every limit released", || {
        let ids = ids.clone();
        async move {
            for id in &ids {
                let c = running_container_of(id)?;
                if inspect_nano_cpus(&c)?.1 != 1_000_000_000 {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        }
    })
    .await?;
    drop(agent);
    manager.stop().await;
    Ok(())
}
