//! The value-based allocation studies on small workloads: the engine agrees with the policy's
//! offline model, value policies act as their names say, and runs are deterministic.

use std::path::Path;

use converge_policy::value::{OfflineJob, offline_value};
use converge_sim::curve::Catalog;
use converge_sim::engine::{Outcome, Simulation};
use converge_sim::experiment::{Experiment, PolicySpec, SystemModel, WorkerGroup, Workload};
use converge_sim::ga;
use converge_sim::value::{self, ValueExperiment};

fn study() -> ValueExperiment {
    let mut e = ValueExperiment::load(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/value/v1-workloads.json"),
    )
    .unwrap();
    e.workload.containers = 25;
    e.seeds = 1;
    e
}

fn shell(policy: PolicySpec) -> Experiment {
    Experiment {
        name: "t".into(),
        title: "t".into(),
        seed: 5,
        workers: vec![
            WorkerGroup {
                count: 2,
                cpus: 1.0,
                calibration: 1.0,
            },
            WorkerGroup {
                count: 1,
                cpus: 1.0,
                calibration: 1.5,
            },
        ],
        workload: Workload::Fixed(vec![]),
        policy,
        baseline: PolicySpec::DockerSwarm,
        system: SystemModel::default(),
        paper: Default::default(),
        sweep: vec![],
        focus_job: None,
        note: String::new(),
    }
}

#[test]
fn every_value_study_file_loads() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/value");
    assert!(!value::load_all(&dir).unwrap().is_empty());
}

#[test]
fn the_engine_runs_a_static_plan_to_the_value_the_offline_model_computes() {
    let catalog = Catalog::builtin();
    let jobs = study().workload(2, 0, (1.5, 3.0));
    let offline: Vec<OfflineJob> = jobs
        .iter()
        .map(|j| OfflineJob {
            release: j.arrival,
            work: j.work,
            curve: j.value.unwrap(),
        })
        .collect();
    let policy = PolicySpec::ValueGa {
        population: 8,
        generations: 5,
    };
    let e = shell(policy);
    let run = Simulation::new(&e, &catalog, &jobs, policy, false)
        .unwrap()
        .run()
        .unwrap();
    // The same plan, re-derived with the engine's seed, evaluated by the policy's model.
    use rand::SeedableRng;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(e.seed ^ 0x6a_0ff1_13e0);
    let (plan, fitness) = ga::plan(
        &[1.0, 1.0, 1.5],
        &offline,
        ga::GaConfig {
            population: 8,
            generations: 5,
        },
        &mut rng,
    );
    let total = run.value.unwrap().total;
    assert!(
        (total - fitness).abs() < 1e-6,
        "engine {total} vs model {fitness}"
    );
    assert!((offline_value(&[1.0, 1.0, 1.5], &offline, &plan) - fitness).abs() < 1e-9);
}

#[test]
fn value_policies_do_what_their_names_say() {
    let catalog = Catalog::builtin();
    let jobs = study().workload(1, 0, (1.5, 3.0));
    let run = |p: PolicySpec| {
        let run = Simulation::new(&shell(p), &catalog, &jobs, p, false)
            .unwrap()
            .run()
            .unwrap();
        // Pauses, resumptions, stops and drops all went through the cores without a refusal.
        assert_eq!(run.refusals, 0, "{}", run.policy);
        run
    };
    let sp = run(PolicySpec::DockerSwarm);
    let dwop = run(PolicySpec::Value {
        stride: 18,
        preemption: None,
    });
    let dwp = run(PolicySpec::Value {
        stride: 18,
        preemption: Some(Default::default()),
    });
    let (s, o, p) = (sp.value.unwrap(), dwop.value.unwrap(), dwp.value.unwrap());
    // Spread runs everything; DwoP never preempts; every total is within the maximum.
    assert_eq!((s.rejected, s.dropped, s.preemptions), (0, 0, 0));
    assert_eq!(o.preemptions, 0);
    for v in [&s, &o, &p] {
        assert!(v.total >= 0.0 && v.total <= 25.0 * 100.0);
        assert_eq!(v.completed + v.rejected + v.dropped + v.stopped, 25);
    }
    // On this heavy set the value-aware policies beat Spread.
    assert!(
        o.total > s.total && p.total > s.total,
        "{} {} {}",
        s.total,
        o.total,
        p.total
    );
    // A rejected job never ran.
    for j in &dwop.jobs {
        if let Outcome::Rejected(r) = &j.outcome {
            assert!(
                r.starts_with("expected value 0 on every worker")
                    || r.starts_with("running it would lower the total expected value"),
                "{r}"
            );
            assert!(j.finish.is_nan());
            assert_eq!(j.value, Some(0.0));
        }
    }
}

#[test]
fn a_study_is_deterministic() {
    let catalog = Catalog::builtin();
    let mut e = study();
    e.workload.containers = 12;
    e.workload.t_max = vec![10.0, 290.0];
    let a = serde_json::to_string(&e.run(&catalog, None).unwrap()).unwrap();
    let b = serde_json::to_string(&e.run(&catalog, None).unwrap()).unwrap();
    assert_eq!(a, b);
}

/// A ratio over a column that earned nothing is said to be so, not printed as `inf`: Spread
/// earns 0 on W1 in the paper's model, and `DwP / SP on W1` was shown as `inf`.
#[test]
fn a_claim_over_a_column_that_earned_nothing_is_not_a_number() {
    let e = study();
    let rows: Vec<String> = (1..=9).map(|i| format!("W{i}")).collect();
    let columns: Vec<String> = e.series.iter().map(|s| s.label.clone()).collect();
    let cells = rows
        .iter()
        .map(|r| {
            columns
                .iter()
                .map(|c| value::Cell {
                    values: vec![if r == "W1" && c == "SP" { 0.0 } else { 10.0 }],
                    ..Default::default()
                })
                .collect()
        })
        .collect();
    let grid = value::Grid {
        row_label: "workload set".into(),
        rows,
        columns,
        cells,
    };
    let md = value::section(&e, &grid, &[], false).unwrap();
    assert!(
        md.contains("| DwP / SP on W1 (3.85×) | n/a (SP earned 0) | 3.85 |"),
        "{md}"
    );
    // The other claims keep their numbers.
    assert!(
        md.contains("| DwP / SP on W9 (about 17% better) | 1.00 | 1.17 |"),
        "{md}"
    );
    assert!(!md.contains("| inf |") && !md.contains("NaN"), "{md}");
}
