//! Speed of the policy decisions at scale and of the simulator itself.
//!
//! ```text
//! CARGO_TARGET_DIR=/work/targets/policy cargo bench -p converge-sim --bench sim
//! ```
//! Prints per-decision latency (placement over 10,000 workers with each placer, a FlowCon round
//! over 100 containers, SpeCon's Alg. 2 host selection and Alg. 3 plan over 10,000 workers, one
//! value-based DwoP and DwP arrival decision over 50 workers at CPU-share stride 1 and 18) and
//! the simulator's events per second on a 100-worker, 1,000-job run. (The simulator drives the
//! cluster core, whose String ids and per-step scans make a 10,000-worker run take minutes to
//! hours until the core is optimised; `converge-sim scale --workers N --jobs M` measures any
//! size.)

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use std::hint::black_box;

use converge_policy::flowcon::{FlowCon, FlowConConfig, FlowConPlacer, Observation};
use converge_policy::growth::{Direction, Sample, Usage};
use converge_policy::specon::{RebalanceCandidate, rebalance_plan, select_host, worker_score};
use converge_policy::value::{
    Container, NodeState, PreemptionConfig, ValueAllocator, ValueConfig, ValueCurve, ValueJob,
    beta, is_overloaded,
};
use converge_policy::{
    Category, JobRequest, JobSnapshot, LeastAllocated, Placer, Spread, WorkerSnapshot,
};
use converge_sim::curve::Catalog;
use converge_sim::engine::Simulation;
use converge_sim::experiment::{Experiment, PolicySpec, WorkerGroup, Workload};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

const WORKERS: usize = 10_000;

fn cluster() -> Vec<WorkerSnapshot> {
    (0..WORKERS)
        .map(|i| WorkerSnapshot {
            id: format!("worker-{i}").into(),
            cpu_capacity: 16.0,
            cpu_requested: (i % 13) as f64,
            memory_capacity: 64 << 30,
            memory_requested: ((i % 7) as u64) << 30,
            cpu_requested_nonzero: (i % 13) as f64,
            memory_requested_nonzero: ((i % 7) as u64) << 30,
            running: i % 9,
            calibration: 1.0,
            schedulable: i % 101 != 0,
            jobs: (0..(i % 5))
                .map(|k| JobSnapshot {
                    job_id: format!("j{i}-{k}").into(),
                    category: [Category::New, Category::Watching, Category::Completing]
                        [(i + k) % 3],
                    growth_efficiency: Some(((i * 7 + k) % 100) as f64 / 1000.0),
                    cpu_limit: None,
                })
                .collect(),
        })
        .collect()
}

fn placement(c: &mut Criterion) {
    let workers = cluster();
    let job = JobRequest {
        cpus: 2.0,
        memory_bytes: 1 << 30,
    };
    let mut g = c.benchmark_group("placement over 10k workers");
    g.bench_function("docker swarm spread", |b| {
        b.iter(|| black_box(Spread.place(black_box(&job), black_box(&workers))))
    });
    g.bench_function("kubernetes least-allocated", |b| {
        b.iter(|| black_box(LeastAllocated.place(black_box(&job), black_box(&workers))))
    });
    g.bench_function("flowcon alg 4", |b| {
        b.iter(|| black_box(FlowConPlacer.place(black_box(&job), black_box(&workers))))
    });
    g.finish();
}

fn flowcon_round(c: &mut Criterion) {
    let mut f = FlowCon::new(FlowConConfig {
        adaptive: true,
        ..FlowConConfig::default()
    })
    .unwrap();
    let mut t = 0.0;
    let obs = |t: f64| -> Vec<Observation> {
        (0..100)
            .map(|i| Observation {
                job_id: format!("job-{i:03}"),
                sample: Some(Sample {
                    time: t,
                    value: 2.0 * (-(t / (50.0 + i as f64))).exp(),
                }),
                initial_value: Some(2.0),
                direction: Direction::Minimize,
                usage: Usage::cpu(0.01),
            })
            .collect()
    };
    let mut inputs = obs(0.0);
    f.on_round(0.0, &inputs);
    c.bench_function("flowcon round over 100 containers", |b| {
        b.iter(|| {
            t += 20.0;
            for o in &mut inputs {
                if let Some(s) = &mut o.sample {
                    s.time = t;
                    s.value *= 0.99;
                }
            }
            black_box(f.on_round(t, black_box(&inputs)))
        })
    });
}

fn specon_decisions(c: &mut Criterion) {
    let w = Default::default();
    let scores: Vec<Option<f64>> = (0..WORKERS)
        .map(|i| Some(worker_score(i % 4, i % 3, i % 5, &w)))
        .collect();
    let use_: Vec<f64> = (0..WORKERS).map(|i| (i % 17) as f64 / 17.0).collect();
    c.bench_function("specon alg 2 host selection over 10k workers", |b| {
        b.iter(|| black_box(select_host(black_box(5), &scores, &use_)))
    });
    let counts: Vec<usize> = (0..WORKERS)
        .map(|i| if i % 50 == 0 { 0 } else { 3 + i % 6 })
        .collect();
    let schedulable = vec![true; WORKERS];
    let candidates: Vec<RebalanceCandidate> = (0..5_000)
        .map(|i| RebalanceCandidate {
            job_id: format!("job-{i}"),
            worker: (i * 7) % WORKERS,
            converged_for: (i % 300) as f64,
        })
        .collect();
    c.bench_function("specon alg 3 rebalancing over 10k workers", |b| {
        b.iter(|| {
            black_box(rebalance_plan(
                &counts,
                &schedulable,
                black_box(&candidates),
            ))
        })
    });
}

/// 50 workers (every third 50% faster), each running 4 containers of the paper's kind (ET
/// 100-800 s, curves full until 1.5 × ET, zero at 3 × ET), part-way through and late enough
/// that about half the workers are overloaded at λ = 0.5.
fn value_cluster() -> Vec<NodeState> {
    (0..50)
        .map(|i| NodeState {
            id: format!("worker-{}", i + 1),
            speed: if i % 3 == 2 { 1.5 } else { 1.0 },
            schedulable: true,
            containers: (0..4)
                .map(|k| {
                    let et = 100.0 + ((i * 37 + k * 101) % 700) as f64;
                    let released = -(((i * 13 + k * 29) % 40) as f64) * et / 20.0;
                    Container {
                        job: ValueJob {
                            id: format!("job-{i}-{k}"),
                            released_at: released,
                            estimated_s: et,
                            curve: ValueCurve::new(100.0, 1.5 * et, 3.0 * et).unwrap(),
                        },
                        shares: 1 + ((i * 97 + k * 389) % 1024) as u32,
                        remaining_s: et * (0.2 + 0.2 * k as f64),
                        paused: false,
                        pinned: false,
                    }
                })
                .collect(),
        })
        .collect()
}

fn value_decisions(c: &mut Criterion) {
    let nodes = value_cluster();
    let job = ValueJob {
        id: "new".into(),
        released_at: 0.0,
        estimated_s: 300.0,
        curve: ValueCurve::new(100.0, 450.0, 900.0).unwrap(),
    };
    let overloaded = nodes
        .iter()
        .filter(|n| is_overloaded(beta(0.0, n), 0.5))
        .count();
    println!("value decisions: {overloaded} of 50 workers overloaded at λ = 0.5");
    let mut g = c.benchmark_group("value decision over 50 workers");
    for stride in [1, 18] {
        let dwop = ValueAllocator::new(ValueConfig::dwop(stride)).unwrap();
        let dwp =
            ValueAllocator::new(ValueConfig::dwp(stride, PreemptionConfig::default())).unwrap();
        g.bench_function(format!("dwop stride {stride}"), |b| {
            b.iter(|| black_box(dwop.on_arrival(0.0, black_box(&job), black_box(&nodes))))
        });
        g.bench_function(format!("dwp stride {stride}"), |b| {
            b.iter(|| black_box(dwp.on_arrival(0.0, black_box(&job), black_box(&nodes))))
        });
    }
    g.finish();
}

/// Workers and jobs of the simulator benchmark.
const SIM_WORKERS: usize = 100;
const SIM_JOBS: usize = 1_000;

fn scale_experiment(policy: PolicySpec) -> Experiment {
    Experiment {
        name: "scale".into(),
        title: "100 workers, 1,000 jobs".into(),
        seed: 1,
        workers: vec![WorkerGroup {
            count: SIM_WORKERS,
            cpus: 16.0,
            calibration: 1.0,
        }],
        workload: Workload::Random {
            jobs: SIM_JOBS,
            window: (0.0, 3_000.0),
            models: Catalog::builtin()
                .names()
                .iter()
                .map(|s| s.to_string())
                .collect(),
            sizes: Default::default(),
        },
        policy,
        baseline: PolicySpec::DockerSwarm,
        system: Default::default(),
        paper: Default::default(),
        sweep: vec![],
        focus_job: None,
        note: String::new(),
    }
}

fn simulator(c: &mut Criterion) {
    let catalog = Catalog::builtin();
    let mut g = c.benchmark_group("simulator, 100 workers, 1,000 jobs");
    g.sample_size(10);
    for policy in [
        PolicySpec::DockerSwarm,
        PolicySpec::Flowcon {
            alpha: 0.05,
            itval: 20.0,
            beta: 2.0,
            adaptive: true,
            placement: true,
        },
        PolicySpec::Specon {
            alpha: 0.01,
            interval: 30.0,
            rebalance: true,
        },
    ] {
        let e = scale_experiment(policy);
        let jobs = e.jobs(&catalog).unwrap();
        let events = Simulation::new(&e, &catalog, &jobs, policy, false)
            .unwrap()
            .run()
            .unwrap()
            .events;
        println!("{}: {events} events per run", policy.label());
        g.throughput(Throughput::Elements(events));
        g.bench_function(policy.label(), |b| {
            b.iter(|| {
                Simulation::new(&e, &catalog, &jobs, policy, false)
                    .unwrap()
                    .run()
                    .unwrap()
                    .events
            })
        });
    }
    g.finish();
}

criterion_group!(
    benches,
    placement,
    flowcon_round,
    specon_decisions,
    value_decisions,
    simulator
);
criterion_main!(benches);
