//! End-to-end checks of the simulator: determinism, the CPU model's arithmetic, and that each
//! policy actually acts. Small traces only: every test runs in milliseconds.

use std::path::Path;

use converge_sim::curve::Catalog;
use converge_sim::engine::run_policy;
use converge_sim::experiment::{Experiment, FixedJob, PolicySpec, WorkerGroup, Workload};
use converge_sim::report;

fn experiment(workers: usize, cpus: f64, workload: Workload) -> Experiment {
    Experiment {
        name: "test".into(),
        title: "test".into(),
        seed: 7,
        workers: vec![WorkerGroup {
            count: workers,
            cpus,
            calibration: 1.0,
        }],
        workload,
        policy: PolicySpec::Flowcon {
            alpha: 0.05,
            itval: 20.0,
            beta: 2.0,
            adaptive: false,
            placement: true,
        },
        baseline: PolicySpec::DockerSwarm,
        system: Default::default(),
        paper: Default::default(),
        sweep: vec![],
        focus_job: None,
        note: String::new(),
    }
}

#[test]
fn a_lone_job_runs_at_its_parallelism() {
    let catalog = Catalog::builtin();
    let e = experiment(
        1,
        4.0,
        Workload::Fixed(vec![FixedJob {
            model: "vae".into(),
            at: 10.0,
        }]),
    );
    let run = run_policy(&e, &catalog, PolicySpec::DockerSwarm, false).unwrap();
    let vae = catalog.get(catalog.index("vae").unwrap());
    let expected = vae.work / vae.max_cores;
    assert!(
        (run.jobs[0].jct - expected).abs() < 1e-6,
        "{}",
        run.jobs[0].jct
    );
    assert!((run.makespan - expected).abs() < 1e-6);
}

#[test]
fn faster_worker_finishes_sooner() {
    let catalog = Catalog::builtin();
    let mut e = experiment(
        1,
        4.0,
        Workload::Fixed(vec![FixedJob {
            model: "gru".into(),
            at: 0.0,
        }]),
    );
    let slow = run_policy(&e, &catalog, PolicySpec::DockerSwarm, false).unwrap();
    e.workers[0].calibration = 2.0;
    let fast = run_policy(&e, &catalog, PolicySpec::DockerSwarm, false).unwrap();
    assert!((slow.jobs[0].jct / fast.jobs[0].jct - 2.0).abs() < 1e-9);
}

#[test]
fn same_seed_gives_byte_identical_results() {
    let catalog = Catalog::builtin();
    let mut e = experiment(
        2,
        4.0,
        Workload::Random {
            jobs: 8,
            window: (0.0, 100.0),
            models: vec!["vae".into(), "mnist-pytorch".into(), "gru".into()],
            sizes: Default::default(),
        },
    );
    e.policy = PolicySpec::Flowcon {
        alpha: 0.05,
        itval: 20.0,
        beta: 2.0,
        adaptive: true,
        placement: true,
    };
    let a = serde_json::to_string(&report::compare(&e, &catalog, true).unwrap()).unwrap();
    let b = serde_json::to_string(&report::compare(&e, &catalog, true).unwrap()).unwrap();
    assert_eq!(a, b);
    e.seed += 1;
    let c = serde_json::to_string(&report::compare(&e, &catalog, true).unwrap()).unwrap();
    assert_ne!(a, c, "a different seed draws a different trace");
}

#[test]
fn flowcon_prioritizes_the_newcomer_in_the_fixed_schedule() {
    let catalog = Catalog::builtin();
    let e = Experiment::load(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/flowcon-3job.json"),
    )
    .unwrap();
    let c = report::compare(&e, &catalog, true).unwrap();
    // MNIST (TensorFlow), job-3, finishes sooner under FlowCon than under free competition.
    assert!(c.policy.jobs[2].jct < c.baseline.jobs[2].jct);
    // And the completing VAE was held to its lower bound at some point: 0.25 of the worker.
    let trace = c.policy.trace.unwrap();
    assert!(
        trace.cpu.iter().any(|(_, shares)| shares
            .iter()
            .any(|&(j, s)| j == 0 && (s - 0.25).abs() < 1e-9)),
        "VAE never held to 0.25"
    );
}

#[test]
fn specon_migrates_converged_jobs() {
    let catalog = Catalog::builtin();
    let mut e = experiment(
        2,
        4.0,
        Workload::Fixed(
            ["vae", "vae", "vae", "gru"]
                .iter()
                .enumerate()
                .map(|(i, m)| FixedJob {
                    model: m.to_string(),
                    at: i as f64 * 2.0,
                })
                .collect(),
        ),
    );
    e.policy = PolicySpec::Specon {
        alpha: 0.01,
        interval: 30.0,
        rebalance: true,
    };
    e.baseline = PolicySpec::Kubernetes;
    let run = run_policy(&e, &catalog, e.policy, false).unwrap();
    assert!(run.migrations > 0);
    assert!(
        run.jobs.iter().all(|j| j.migrations <= 2),
        "at most once by Alg. 2 and once by Alg. 3"
    );
    let base = run_policy(&e, &catalog, e.baseline, false).unwrap();
    assert_eq!(base.migrations, 0);
    // A migration and Alg. 1's rounds set node wakes and completions again: some timers are
    // popped stale, and they are among the events counted.
    assert!(
        0 < run.stale && run.stale < run.events,
        "{} stale of {} events",
        run.stale,
        run.events
    );
}

#[test]
fn every_experiment_file_loads() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments");
    let all = report::load_all(&dir).unwrap();
    assert!(all.len() >= 12);
    let catalog = Catalog::builtin();
    for e in &all {
        assert_eq!(e.name.as_str(), e.name.trim());
        e.jobs(&catalog).unwrap();
    }
}

#[test]
fn every_policy_runs_through_the_core_without_refusals() {
    // The shell plays the agents' part: a core that refused any of its messages (a result
    // for a job the worker never ran, a forbidden transition) would mean the shell is wrong.
    let catalog = Catalog::builtin();
    let e = experiment(
        3,
        4.0,
        Workload::Random {
            jobs: 12,
            window: (0.0, 200.0),
            models: vec!["vae".into(), "mnist-pytorch".into(), "gru".into()],
            sizes: Default::default(),
        },
    );
    for policy in [
        PolicySpec::DockerSwarm,
        PolicySpec::Kubernetes,
        PolicySpec::Oracle,
        e.policy,
        PolicySpec::Specon {
            alpha: 0.01,
            interval: 30.0,
            rebalance: true,
        },
    ] {
        let run = run_policy(&e, &catalog, policy, false).unwrap();
        assert_eq!(run.refusals, 0, "{}", run.policy);
        assert!(
            run.steps > run.events,
            "{}: the cores consumed the inputs",
            run.policy
        );
        assert!(
            run.jobs
                .iter()
                .all(|j| j.outcome.is_completed() && j.jct > 0.0),
            "{}: every job completes",
            run.policy
        );
    }
}

#[test]
fn jobs_the_core_archived_are_reported_like_the_others() {
    // The core keeps as many finished jobs as the manager does; the report reads the rest
    // from what the shell kept when the core let them go.
    let catalog = Catalog::builtin();
    let jobs = converge_core::cluster::KEEP_FINISHED + 200;
    let e = experiment(
        40,
        16.0,
        Workload::Random {
            jobs,
            window: (0.0, 2000.0),
            models: vec!["vae".into(), "mnist-pytorch".into(), "gru".into()],
            sizes: Default::default(),
        },
    );
    let run = run_policy(&e, &catalog, PolicySpec::DockerSwarm, false).unwrap();
    assert_eq!(run.jobs.len(), jobs);
    assert_eq!(
        run.archived,
        jobs - converge_core::cluster::KEEP_FINISHED,
        "the core kept only the manager's number of finished jobs"
    );
    let unfinished: Vec<_> = (run.jobs.iter())
        .filter(|j| !(j.outcome.is_completed() && j.jct > 0.0))
        .map(|j| format!("{}: {:?}", j.id, j.outcome))
        .collect();
    assert!(
        unfinished.is_empty(),
        "{} not completed: {:?}",
        unfinished.len(),
        &unfinished[..unfinished.len().min(3)]
    );
}
