use std::time::Duration;

use converge_messenger::pb::{self, EventKind, JobState, WorkerState};
use converge_policy::value::{
    PreemptAction, PreemptionConfig, ValueAction, ValueAllocator, ValueConfig, ValueDecision,
    VictimCriterion,
};
use tokio::time::Instant;

use super::*;
use crate::actor::{Actor, ActorConfig};
use crate::metrics::ManagerMetrics;
use crate::state::Worker;

fn allocator(lambda: f64) -> ValueAllocator {
    ValueAllocator::new(ValueConfig::dwp(
        1,
        PreemptionConfig {
            lambda,
            criterion: VictimCriterion::MinimalRemainingValue,
            action: PreemptAction::Pause,
        },
    ))
    .unwrap()
}

fn actor(lambda: f64) -> Actor {
    let config = ActorConfig {
        manager_id: "m".into(),
        heartbeat_interval: Duration::from_secs(1),
        lost_after_missed: 3,
        progress_history: 16,
        worker_policy: converge_messenger::pb::WorkerMode::Free,
        migration: false,
        save_deadline: Duration::from_secs(10),
        rebalance_interval: Duration::from_secs(30),
        recover_lost_after: Duration::from_secs(60),
        value: Some(allocator(lambda)),
    };
    let mut a = Actor::new(
        config,
        Box::new(ValuePlacer::new("value")),
        ManagerMetrics::new(),
    );
    a.cluster.workers.insert("w1".into(), worker("w1", 1.5));
    a
}

fn worker(id: &str, calibration: f64) -> Worker {
    Worker {
        id: id.into(),
        state: WorkerState::Ready,
        cpu_capacity: 1.0,
        memory_bytes: 0,
        calibration,
        labels: Default::default(),
        link: None,
        instance_id: String::new(),
        last_seen: Instant::now(),
        last_seen_unix_ms: 0,
        alpha: None,
        interval_s: None,
    }
}

/// A value job submitted at `submitted_s` (Unix seconds) with `et` reference seconds and a
/// curve worth `max` until `full` s after release, zero from `zero` s.
fn job(id: &str, seq: u64, state: JobState, et: f64, (max, full, zero): (f64, f64, f64)) -> Job {
    Job {
        id: id.into(),
        seq,
        spec: pb::JobSpec {
            image: "converge/trainer:dev".into(),
            cpus: 1.0,
            value_curve: Some(pb::ValueCurve {
                max_value: max,
                full_value_until_s: full,
                zero_value_at_s: zero,
            }),
            estimated_runtime_s: et,
            ..Default::default()
        },
        state,
        reason: String::new(),
        worker_id: (state != JobState::Pending).then(|| "w1".to_string()),
        epoch: u64::from(state != JobState::Pending),
        container_id: String::new(),
        start_command_id: String::new(),
        submitted_unix_ms: 1_000_000,
        started_unix_ms: 0,
        finished_unix_ms: 0,
        step: 0,
        total_steps: 0,
        metric_value: None,
        samples: 0,
        malformed: 0,
        progress: Default::default(),
        category: pb::Category::Unspecified,
        growth_efficiency: None,
        cpu_limit: None,
        migrations: 0,
        exit_code: None,
        policy: "value".into(),
        cpu_usage: 0.0,
        converged_since: None,
        migration_decided: false,
        rebalanced: false,
        migration: None,
        last_migration_downtime_ms: None,
        lost_since: None,
        trace: Default::default(),
    }
}

fn insert(a: &mut Actor, j: Job) {
    a.cluster.jobs.insert(j.id.clone(), j);
}

#[test]
fn node_states_carry_speed_shares_remaining_work_and_pause() {
    let mut a = actor(0.5);
    a.cluster.workers.insert("w0".into(), worker("w0", 1.0));
    let mut run = job("run", 2, JobState::Running, 100.0, (10.0, 5.0, 50.0));
    run.step = 250;
    run.total_steps = 1000;
    insert(&mut a, run);
    insert(
        &mut a,
        job("paused", 1, JobState::Paused, 40.0, (50.0, 0.0, 90.0)),
    );
    // Without a value curve: spread's business, invisible to the allocator.
    let mut plain = job("plain", 3, JobState::Running, 0.0, (1.0, 0.0, 1.0));
    plain.spec.value_curve = None;
    insert(&mut a, plain);
    insert(
        &mut a,
        job("done", 0, JobState::Completed, 10.0, (1.0, 0.0, 9.0)),
    );
    let shares = HashMap::from([("run".to_string(), 700)]);
    let (ids, nodes) = node_states(&a.cluster, &shares);
    assert_eq!(ids, ["w0", "w1"]);
    assert!(nodes[0].containers.is_empty());
    let w1 = &nodes[1];
    assert_eq!(w1.speed, 1.5);
    assert!(!w1.schedulable, "no agent stream: not schedulable");
    let got: Vec<(&str, u32, f64, bool)> = w1
        .containers
        .iter()
        .map(|c| (c.job.id.as_str(), c.shares, c.remaining_s, c.paused))
        .collect();
    // In submission order; remaining = ET × (1 − step/total); ET while the total is unknown;
    // Docker's default share for a job whose share was never chosen.
    assert_eq!(
        got,
        [("paused", 1024, 40.0, true), ("run", 700, 75.0, false)]
    );
    let c = &w1.containers[1];
    assert_eq!(c.job.released_at, 1000.0);
    assert_eq!(c.job.curve.zero_value_at_s, 50.0);
}

/// The integration test's scenario (value_docker.rs) on the allocator, with the numbers it
/// uses: a low-value job L (ET 20 s, worth 10 falling to 0 at 50 s) has run 3 s of its 20 when a
/// high-value job H (ET 60 s, worth 100 falling to 0 at 300 s) arrives on the one 1-CPU worker.
/// With λ = 0.9 the worker is overloaded (β = 0.6: L, done at 20 s, expects 6 of 10); sharing delays
/// L by about H's 60 s, past its zero-value time, while pausing L gives H the whole CPU, so
/// DwP pauses L; once H is gone L, paused 5 s, can still finish by 25 s and is resumed.
#[test]
fn the_docker_scenario_pauses_the_low_value_job_and_resumes_it_after() {
    let alloc = allocator(0.9);
    let t0 = 1000.0;
    let mut l = job("L", 0, JobState::Running, 20.0, (10.0, 0.0, 50.0));
    l.step = 150;
    l.total_steps = 1000;
    let mut a = actor(0.9);
    insert(&mut a, l);
    let (_, mut nodes) = node_states(&a.cluster, &HashMap::from([("L".to_string(), 1)]));
    nodes[0].schedulable = true;
    nodes[0].speed = 1.0;
    let h = ValueJob {
        id: "H".into(),
        released_at: t0 + 3.0,
        estimated_s: 60.0,
        curve: ValueCurve {
            max_value: 100.0,
            full_value_until_s: 0.0,
            zero_value_at_s: 300.0,
        },
    };
    let beta = converge_policy::value::beta(t0 + 3.0, &nodes[0]);
    assert!((beta - 0.6).abs() < 1e-9, "β {beta}");
    match alloc.on_arrival(t0 + 3.0, &h, &nodes) {
        ValueDecision::Place {
            node: 0, victims, ..
        } => {
            assert_eq!(victims.len(), 1, "{victims:?}");
            assert_eq!(victims[0].job, "L");
            assert_eq!(victims[0].action, PreemptAction::Pause);
            assert!(
                victims[0].reason.starts_with("preempted for job H"),
                "{}",
                victims[0].reason
            );
        }
        other => panic!("expected a placement pausing L, got {other:?}"),
    }
    // H done 5 s later (it ran faster than its estimate): L is resumed.
    nodes[0].containers[0].paused = true;
    let actions = alloc.on_departure(t0 + 8.0, 0, &nodes);
    assert!(
        matches!(&actions[..], [ValueAction::Resume { job, .. }] if job == "L"),
        "{actions:?}"
    );
}

#[test]
fn a_placement_pauses_its_victim_and_starts_the_job_with_its_share() {
    let mut a = actor(0.5);
    insert(
        &mut a,
        job("L", 0, JobState::Running, 20.0, (10.0, 0.0, 50.0)),
    );
    insert(
        &mut a,
        job("H", 1, JobState::Pending, 5.0, (100.0, 0.0, 30.0)),
    );
    let ids = vec!["w1".to_string()];
    a.apply_arrival(
        "H",
        &ids,
        ValueDecision::Place {
            node: 0,
            cpu_shares: 512,
            expected_value: 80.0,
            victims: vec![Preemption {
                job: "L".into(),
                node: 0,
                action: PreemptAction::Pause,
                reason: "preempted for job H: minimal remaining value on w1".into(),
            }],
            reason: "placed on w1 with 512 CPU shares: expected value 80.0 of 100".into(),
        },
    );
    let l = &a.cluster.jobs["L"];
    assert_eq!(l.state, JobState::Paused);
    assert_eq!(
        l.reason,
        "preempted for job H: minimal remaining value on w1"
    );
    let h = &a.cluster.jobs["H"];
    assert_eq!(h.state, JobState::Starting);
    assert_eq!((h.worker_id.as_deref(), h.epoch), (Some("w1"), 1));
    assert_eq!(a.value.as_ref().unwrap().shares["H"], 512);
    let (history, _) = a.events.watch("H", 1);
    let placed = history
        .iter()
        .find(|e| e.kind == EventKind::JobPlaced as i32)
        .expect("a placement event");
    assert_eq!(placed.attributes["cpu_shares"], "512");
    assert!(
        placed.reason.starts_with("placed on w1 with 512"),
        "{}",
        placed.reason
    );
}

#[test]
fn a_rejection_ends_the_job_with_the_reason_and_starts_nothing() {
    let mut a = actor(0.5);
    insert(
        &mut a,
        job("Z", 0, JobState::Pending, 60.0, (100.0, 0.0, 5.0)),
    );
    a.apply_arrival(
        "Z",
        &["w1".to_string()],
        ValueDecision::Reject {
            reason: "rejected: expected value 0 at any worker".into(),
        },
    );
    let z = &a.cluster.jobs["Z"];
    assert_eq!(z.state, JobState::Rejected);
    assert_eq!(z.reason, "rejected: expected value 0 at any worker");
    assert_eq!((z.epoch, z.worker_id.as_deref()), (0, None));
    assert!(z.finished_unix_ms > 0);
}

#[test]
fn resumptions_and_drops_are_carried_out_and_a_departure_is_noted() {
    let mut a = actor(0.5);
    insert(
        &mut a,
        job("P", 0, JobState::Paused, 20.0, (10.0, 0.0, 50.0)),
    );
    insert(
        &mut a,
        job("D", 1, JobState::Running, 20.0, (10.0, 0.0, 50.0)),
    );
    a.apply_actions(
        &["w1".to_string()],
        vec![
            ValueAction::Resume {
                job: "P".into(),
                node: 0,
                cpu_shares: 300,
                expected_value: 7.0,
                reason: "resumed: w1 has room again".into(),
            },
            ValueAction::Drop {
                job: "D".into(),
                node: 0,
                reason: "dropped: value reached zero".into(),
            },
        ],
    );
    assert_eq!(a.cluster.jobs["P"].state, JobState::Running);
    assert_eq!(a.cluster.jobs["P"].reason, "resumed: w1 has room again");
    let v = a.value.as_ref().unwrap();
    assert_eq!(v.shares["P"], 300);
    let d = &a.cluster.jobs["D"];
    assert_eq!(d.state, JobState::Rejected);
    assert_eq!(d.reason, "dropped: value reached zero");
    assert_eq!(v.departed, ["w1"], "the drop freed w1");
}

#[test]
fn a_start_sent_again_carries_the_jobs_share() {
    let mut a = actor(0.5);
    insert(
        &mut a,
        job("S", 0, JobState::Starting, 20.0, (10.0, 0.0, 50.0)),
    );
    a.value.as_mut().unwrap().shares.insert("S".into(), 77);
    // As reconcile and a restore build it: from the job alone, share 0.
    let mut cmd = super::start_command(&a.cluster.jobs["S"]);
    a.value_fill_shares(&mut cmd);
    match cmd.action {
        Some(Action::Start(s)) => assert_eq!(s.cpu_shares, 77),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_value_curve_without_an_estimated_runtime_is_refused_by_name() {
    let a = actor(0.5);
    let mut spec = job("x", 0, JobState::Pending, 0.0, (1.0, 0.0, 1.0)).spec;
    match a.value_check_spec(&spec) {
        Err(Error::InvalidArgument { field, .. }) => {
            assert_eq!(field, "spec.estimated_runtime_s")
        }
        other => panic!("{other:?}"),
    }
    spec.value_curve = None;
    assert!(a.value_check_spec(&spec).is_ok(), "no curve: spread's job");
}
