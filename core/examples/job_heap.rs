//! Heap bytes the cluster core holds per live job: a command that prints numbers, for issue
//! 17's memory budget (`docs/performance.md`, "Memory per live job").
//!
//! The load harness (`integration-tests/examples/load -- memory`) measures the manager's RSS
//! with real agents over gRPC; that number also holds the allocator's slack, the manager's own
//! maps and whatever a busy machine made it buffer, and takes minutes. This drives the core
//! alone with the same shape of input (100 workers, one-core jobs placed at once, each sending
//! 40 progress lines, heartbeats every second), counts every byte the allocator hands out, and
//! prints the bytes per job the core still holds. Same input, same count: it is exact, and a
//! change to the core's records shows here in seconds.
//!
//! ```text
//! cargo run --release -p converge-core --example job_heap [-- JOBS...]
//! ```

use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

use converge_core::cluster::policy::{self, PolicyConfig};
use converge_core::cluster::types::{
    AgentMessage, CommandResult, Heartbeat, JobSpec, JobStatus, ProgressBatch, ProgressSample,
    Register, ResultDetail,
};
use converge_core::cluster::{Config, Core, Effect, Input};

/// Counts the bytes handed out and given back (the workspace forbids `unsafe`; the crate's
/// wrapper of the system allocator holds it).
#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

const WORKERS: u64 = 100;
const POINTS: u64 = 40;

fn main() {
    let levels: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("each argument is a job count"))
        .collect();
    let levels = if levels.is_empty() {
        vec![1_000, 10_000, 100_000]
    } else {
        levels
    };
    println!("| live jobs | core heap per live job |");
    println!("|---:|---:|");
    for n in levels {
        let per_job = run(n);
        println!("| {n} | {per_job:.0} B |");
    }
}

/// Builds a core holding `n` running jobs that each reported [`POINTS`] progress lines, and
/// returns the heap bytes it holds per job beyond what it held with its workers and no jobs.
fn run(n: usize) -> f64 {
    let p = policy::by_name("spread", &PolicyConfig::default()).expect("spread exists");
    let mut core = Core::new(
        Config {
            heartbeat_interval: 1.0,
            lost_after_missed: 3,
            recover_lost_after: 10.0,
            save_deadline: 5.0,
            progress_history: converge_core::cluster::PROGRESS_HISTORY,
            keep_finished: converge_core::cluster::KEEP_FINISHED,
            id_prefix: String::new(),
            // As a manager with a store: what a step changed is taken after it.
            record_changes: true,
        },
        p,
    );
    let mut now = 0.0;
    let cpus = (n as u64).div_ceil(WORKERS) as f64;
    for w in 0..WORKERS {
        core.step(
            now,
            Input::Connected {
                conn: w,
                register: Register {
                    worker: format!("worker-{w:03}").into(),
                    cpu_capacity: cpus,
                    instance_id: format!("worker-{w:03}-agent"),
                    ..Register::default()
                },
            },
        );
    }
    let region = Region::new(GLOBAL);
    // Ids as the manager makes them (hyphenated UUIDs), containers as Docker names them.
    let id = |k: usize| {
        format!(
            "0193a5c4-7e2b-7{:03x}-8{:03x}-{:012x}",
            k % 4096,
            k % 4093,
            k
        )
    };
    let mut placed: Vec<(u64, String)> = Vec::with_capacity(n);
    for k in 0..n {
        let out = core.step(
            now,
            Input::Submit {
                id: id(k).into(),
                spec: JobSpec {
                    cpus: 1.0,
                    ..JobSpec::default()
                },
            },
        );
        for e in out {
            if let Effect::Send { conn, command, .. } = e
                && command.action.name() == "start"
            {
                let container_id = format!("{:064x}", k as u128 * 0x9e37_79b9_7f4a_7c15);
                core.step(
                    now,
                    Input::Agent {
                        conn,
                        message: AgentMessage::Result(CommandResult {
                            command: command.id.clone(),
                            job: command.job.clone(),
                            epoch: command.epoch,
                            ok: true,
                            error: String::new(),
                            detail: ResultDetail::Started { container_id },
                        }),
                    },
                );
                placed.push((conn, command.job.to_string()));
            }
        }
    }
    assert_eq!(placed.len(), n, "every job is placed at once");
    core.take_changes();
    // Each job reports POINTS lines a second apart, as the harness's agents do; every worker
    // heartbeats once a second with what each of its jobs used.
    let start_ms: i64 = 1_764_000_000_000;
    for t in 1..=POINTS {
        now += 1.0;
        for w in 0..WORKERS {
            let jobs = placed
                .iter()
                .filter(|(c, _)| *c == w)
                .map(|(_, job)| JobStatus {
                    job: job.clone().into(),
                    epoch: 1,
                    category: None,
                    growth_efficiency: None,
                    cpu_limit: None,
                    cpu_usage: 0.97 + (t % 7) as f64 * 0.01,
                })
                .collect();
            core.step(
                now,
                Input::Agent {
                    conn: w,
                    message: AgentMessage::Heartbeat(Heartbeat {
                        jobs,
                        ..Heartbeat::default()
                    }),
                },
            );
        }
        for (k, (conn, job)) in placed.iter().enumerate() {
            let samples = vec![ProgressSample {
                job: job.clone().into(),
                epoch: 1,
                unix_ms: start_ms + (t as i64) * 1000 + (k % 997) as i64,
                step: t,
                total_steps: Some(10_000),
                // A loss computed in f32, as our trainer's is (trainer/src/run.rs).
                value: Some(f64::from(1.0f32 / t as f32)),
                checkpointed: false,
            }];
            core.step(
                now,
                Input::Agent {
                    conn: *conn,
                    message: AgentMessage::Progress(ProgressBatch {
                        samples,
                        malformed: vec![],
                    }),
                },
            );
        }
        // What the shell does after each write.
        core.take_changes();
    }
    drop(placed);
    let stats = region.change();
    // A realloc counts its growth as allocated and its shrinking as deallocated.
    let held = stats
        .bytes_allocated
        .saturating_sub(stats.bytes_deallocated);
    std::hint::black_box(&core);
    held as f64 / n as f64
}
