//! A fuzz run against a real manager over real tonic with TLS (issue 15): 10,000 random and
//! mutated agent messages (from an agent holding a valid certificate for its own worker) and
//! control requests. The manager never panics (a panic hook records any, on any thread) or
//! hangs; every control call gets an answer or a status it documents; every agent stream
//! carries only well-formed messages and ends, if the manager ends it, with a status it
//! documents; and the jobs on the other worker, which nothing sent was allowed to change, are
//! exactly as they were. The seed is printed; set `FUZZ_SEED` to replay a run.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use converge_integration_tests::{ScriptedAgent, TestManager, eventually, tempfile_dir};
use converge_messenger::pb::{
    self, AgentMessage, agent_message::Kind, agent_service_client::AgentServiceClient,
    control_service_client::ControlServiceClient,
};
use converge_messenger::tls::{self, TlsFiles};
use prost::Message;
use rand::{Rng, SeedableRng, seq::IndexedRandom};
use rand_chacha::ChaCha8Rng;
use tonic::Code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

const MESSAGES: usize = 8_000;
const REQUESTS: usize = 2_000;

fn tls_for(dir: &std::path::Path, worker: &str) -> ClientTlsConfig {
    let pem = |f: &str| std::fs::read_to_string(dir.join(f)).expect("certificate file");
    ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(pem("ca.pem")))
        .identity(Identity::from_pem(
            pem(&format!("{worker}.pem")),
            pem(&format!("{worker}.key")),
        ))
        .domain_name("localhost")
}

/// A job id: one of the bystanders' (foreign to w1), one the fuzzer submitted (some of them
/// placed on w1, so w1 may speak of them), one w1 made up, or garbage.
fn job_id(rng: &mut ChaCha8Rng, bystanders: &[String], own: &[String]) -> String {
    match rng.random_range(0..6) {
        0 | 1 => bystanders.choose(rng).cloned().unwrap_or_default(),
        5 => own.choose(rng).cloned().unwrap_or_default(),
        2 => uuid::Uuid::new_v4().to_string(),
        3 => String::new(),
        _ => "x".repeat(rng.random_range(1..2000)),
    }
}

fn number(rng: &mut ChaCha8Rng) -> f64 {
    *[
        f64::NAN,
        f64::INFINITY,
        -1.0,
        0.0,
        1e300,
        rng.random::<f64>(),
    ]
    .choose(rng)
    .expect("non-empty")
}

fn agent_message(rng: &mut ChaCha8Rng, bystanders: &[String], own: &[String]) -> AgentMessage {
    let epoch = *[0, 1, 2, u64::MAX].choose(rng).expect("non-empty");
    let kind = match rng.random_range(0..7) {
        0 => Kind::Heartbeat(pb::Heartbeat {
            seq: rng.random(),
            jobs: (0..rng.random_range(0..5))
                .map(|_| pb::JobStatus {
                    job_id: job_id(rng, bystanders, own),
                    epoch,
                    category: rng.random_range(-1..5),
                    growth_efficiency: Some(number(rng)),
                    cpu_limit: Some(number(rng)),
                    cpu_usage: number(rng),
                    ..Default::default()
                })
                .collect(),
            alpha: Some(number(rng)),
            ..Default::default()
        }),
        1 => Kind::Progress(pb::ProgressBatch {
            samples: (0..rng.random_range(0..8))
                .map(|_| pb::ProgressSample {
                    job_id: job_id(rng, bystanders, own),
                    epoch,
                    step: rng.random(),
                    total_steps: Some(rng.random()),
                    value: Some(number(rng)),
                    checkpoint: rng.random_range(-1..4),
                    ..Default::default()
                })
                .collect(),
            malformed: vec![pb::MalformedLines {
                job_id: job_id(rng, bystanders, own),
                epoch,
                count: rng.random(),
                last_error: "fuzz".into(),
            }],
        }),
        2 => Kind::Result(pb::CommandResult {
            command_id: format!("cmd-{}", rng.random::<u8>()),
            job_id: job_id(rng, bystanders, own),
            epoch,
            ok: rng.random(),
            error: "fuzz".into(),
            detail: Some(pb::command_result::Detail::Saved(pb::Saved {
                step: rng.random(),
                ..Default::default()
            })),
            ..Default::default()
        }),
        3 => Kind::Exited(pb::ContainerExited {
            job_id: job_id(rng, bystanders, own),
            epoch,
            exit_code: rng.random(),
            done: rng.random(),
            requested: rng.random(),
            last_step: Some(rng.random()),
            ..Default::default()
        }),
        4 => Kind::MigrationRequest(pb::MigrationRequest {
            job_id: job_id(rng, bystanders, own),
            epoch,
            reason: "fuzz".into(),
        }),
        5 => Kind::Usage(pb::UsageBatch {
            samples: vec![pb::UsageSample {
                job_id: job_id(rng, bystanders, own),
                epoch,
                cpu_cores: number(rng),
                ..Default::default()
            }],
        }),
        // A second Register on an open stream.
        _ => Kind::Register(pb::Register {
            worker_id: "w1".into(),
            cpu_capacity: number(rng),
            ..Default::default()
        }),
    };
    AgentMessage { kind: Some(kind) }
}

/// A message w1 may send (about one of its own jobs, at its epoch), then mutated: its encoding
/// with bits flipped, cut short or a tail repeated; when that no longer decodes, one field is
/// changed instead. Mutations of valid input get past the first checks that most random
/// messages fail. The flag says whether the bytes were mutated.
fn mutated(
    rng: &mut ChaCha8Rng,
    bystanders: &[String],
    own: &[String],
    step: &mut u64,
) -> (AgentMessage, bool) {
    let job_id = own.choose(rng).cloned().unwrap_or_default();
    *step += 10;
    let kind = match rng.random_range(0..4) {
        0 => Kind::Progress(pb::ProgressBatch {
            samples: vec![pb::ProgressSample {
                job_id,
                epoch: 1,
                step: *step,
                total_steps: Some(1_000_000),
                value: Some(1.0 / *step as f64),
                ..Default::default()
            }],
            malformed: vec![],
        }),
        1 => Kind::Heartbeat(pb::Heartbeat {
            seq: *step,
            jobs: vec![pb::JobStatus {
                job_id,
                epoch: 1,
                cpu_limit: Some(1.0),
                cpu_usage: 0.9,
                ..Default::default()
            }],
            ..Default::default()
        }),
        2 => Kind::Usage(pb::UsageBatch {
            samples: vec![pb::UsageSample {
                job_id,
                epoch: 1,
                cpu_cores: 0.9,
                ..Default::default()
            }],
        }),
        _ => Kind::MigrationRequest(pb::MigrationRequest {
            job_id,
            epoch: 1,
            reason: "converged".into(),
        }),
    };
    let valid = AgentMessage { kind: Some(kind) };
    let mut bytes = valid.encode_to_vec();
    match rng.random_range(0..3) {
        0 => {
            for _ in 0..rng.random_range(1..4) {
                let i = rng.random_range(0..bytes.len());
                bytes[i] ^= 1 << rng.random_range(0..8);
            }
        }
        1 => bytes.truncate(rng.random_range(0..bytes.len())),
        _ => {
            let tail = bytes[rng.random_range(0..bytes.len())..].to_vec();
            bytes.extend_from_slice(&tail);
        }
    }
    if let Ok(m) = AgentMessage::decode(bytes.as_slice()) {
        return (m, true);
    }
    let mut m = valid;
    match m.kind.as_mut() {
        Some(Kind::Progress(b)) => match rng.random_range(0..3) {
            0 => b.samples[0].job_id = bystanders.choose(rng).cloned().unwrap_or_default(),
            1 => b.samples[0].epoch = 2,
            _ => b.samples[0].step = u64::MAX,
        },
        Some(Kind::Heartbeat(h)) => h.jobs[0].cpu_usage = number(rng),
        Some(Kind::Usage(u)) => {
            u.samples[0].job_id = bystanders.choose(rng).cloned().unwrap_or_default()
        }
        Some(Kind::MigrationRequest(r)) => r.epoch = u64::MAX,
        _ => {}
    }
    (m, false)
}

/// What ends an agent stream from the manager's side: the codes `messenger::manager` and the
/// actor document (a refused Register, a replaced stream, a shutdown, a flood).
fn ends_as_documented(code: Code) -> bool {
    matches!(
        code,
        Code::Unauthenticated
            | Code::DeadlineExceeded
            | Code::Cancelled
            | Code::FailedPrecondition
            | Code::InvalidArgument
            | Code::PermissionDenied
            | Code::Unavailable
            | Code::Aborted
            | Code::ResourceExhausted
    )
}

/// w1's fuzzing stream: a sender whose messages go to the manager.
async fn open_w1(
    addr: std::net::SocketAddr,
    tls: ClientTlsConfig,
    problems: Arc<Mutex<Vec<String>>>,
) -> anyhow::Result<tokio::sync::mpsc::Sender<AgentMessage>> {
    let channel = Endpoint::from_shared(format!("https://{addr}"))?
        .tls_config(tls)?
        .connect()
        .await?;
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tx.send(AgentMessage {
        kind: Some(Kind::Register(pb::Register {
            worker_id: "w1".into(),
            cpu_capacity: 2.0,
            instance_id: "fuzz".into(),
            ..Default::default()
        })),
    })
    .await?;
    let mut replies = AgentServiceClient::new(channel)
        .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    // Drain what the manager sends (commands for jobs placed on w1) so its queue never fills,
    // and note anything it should not have sent.
    tokio::spawn(async move {
        loop {
            match replies.message().await {
                Ok(Some(m)) if m.kind.is_none() => {
                    problems
                        .lock()
                        .unwrap()
                        .push(format!("an empty message: {m:?}"));
                }
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(s) if ends_as_documented(s.code()) => break,
                Err(s) => {
                    problems.lock().unwrap().push(format!(
                        "the stream ended with {:?}: {}",
                        s.code(),
                        s.message()
                    ));
                    break;
                }
            }
        }
    });
    Ok(tx)
}

fn allowed(code: Code) -> bool {
    matches!(
        code,
        Code::InvalidArgument
            | Code::NotFound
            | Code::FailedPrecondition
            | Code::ResourceExhausted
            | Code::OutOfRange
    )
}

async fn control_request(
    rng: &mut ChaCha8Rng,
    c: &mut ControlServiceClient<Channel>,
    submitted: &mut Vec<String>,
) -> Result<(), tonic::Status> {
    match rng.random_range(0..6) {
        0 => {
            let mut spec = pb::JobSpec {
                image: ["converge/trainer:dev", "", " "]
                    .choose(rng)
                    .expect("non-empty")
                    .to_string(),
                cpus: number(rng),
                memory_bytes: rng.random(),
                name: "n".repeat(rng.random_range(0..300)),
                metric: ["loss", "", "bad metric!"]
                    .choose(rng)
                    .expect("non-empty")
                    .to_string(),
                direction: rng.random_range(-1..4),
                estimated_runtime_s: number(rng),
                user: ["", "1000", "root", "1:2:3"]
                    .choose(rng)
                    .expect("non-empty")
                    .to_string(),
                ..Default::default()
            };
            if rng.random_bool(0.2) {
                spec.value_curve = Some(pb::ValueCurve {
                    max_value: number(rng),
                    full_value_until_s: number(rng),
                    zero_value_at_s: number(rng),
                });
            }
            if rng.random_bool(0.2) {
                spec.env
                    .insert("K".into(), "v".repeat(rng.random_range(0..10_000)));
            }
            let spec = rng.random_bool(0.95).then_some(spec);
            let r = c.submit_job(pb::SubmitJobRequest { spec }).await?;
            submitted.push(r.into_inner().job_id);
        }
        1 => {
            let id = submitted
                .choose(rng)
                .cloned()
                .unwrap_or_else(|| "not-a-job".into());
            c.get_job(pb::GetJobRequest {
                job_id: id,
                include_progress: rng.random(),
            })
            .await?;
        }
        2 => {
            // Only jobs the fuzzer made, or nonsense: never the bystanders.
            let id = if rng.random_bool(0.5) {
                submitted.choose(rng).cloned().unwrap_or_default()
            } else {
                uuid::Uuid::new_v4().to_string()
            };
            c.cancel_job(pb::CancelJobRequest { job_id: id }).await?;
        }
        3 => {
            c.list_jobs(pb::ListJobsRequest {
                state: rng.random_range(-2..15),
                worker_id: ["", "w1", "w2", "nope"]
                    .choose(rng)
                    .expect("non-empty")
                    .to_string(),
                name: ["", "a", "nope"]
                    .choose(rng)
                    .expect("non-empty")
                    .to_string(),
                page_size: rng.random_range(0..4),
                page_token: ["", "1", "3", "x", "18446744073709551615"]
                    .choose(rng)
                    .expect("non-empty")
                    .to_string(),
                not_ended: rng.random_bool(0.5),
            })
            .await?;
        }
        4 => {
            let worker_id = ["w1", "", "w9"].choose(rng).expect("non-empty").to_string();
            match rng.random_range(0..3) {
                0 => {
                    c.drain_worker(pb::DrainWorkerRequest { worker_id }).await?;
                }
                1 => {
                    c.undrain_worker(pb::UndrainWorkerRequest { worker_id })
                        .await?;
                }
                _ => {
                    c.forget_worker(pb::ForgetWorkerRequest { worker_id })
                        .await?;
                }
            }
        }
        _ => {
            let _ = c
                .watch_events(pb::WatchEventsRequest {
                    job_id: job_id(rng, &[], &[]),
                    from_seq: rng.random(),
                })
                .await?;
        }
    }
    Ok(())
}

/// What must not change for a bystander.
fn fingerprint(j: &pb::Job) -> (i32, u64, String, u64, String) {
    (
        j.state,
        j.epoch,
        j.worker_id.clone(),
        j.step,
        j.reason.clone(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_random_inputs_break_nothing_and_touch_no_other_workers_job()
-> anyhow::Result<()> {
    let seed: u64 = std::env::var("FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("fuzz seed {seed} (FUZZ_SEED={seed} replays this run)");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    // Any panic on any thread of this process (the manager runs in it): tokio would catch one
    // in a task and the manager might go on without that task, so a hook is the only sure way
    // to see it.
    let panics = Arc::new(Mutex::new(Vec::<String>::new()));
    let default_hook = std::panic::take_hook();
    {
        let panics = panics.clone();
        std::panic::set_hook(Box::new(move |info| {
            panics.lock().unwrap().push(info.to_string());
            default_hook(info);
        }));
    }
    let problems = Arc::new(Mutex::new(Vec::<String>::new()));

    let certs = tempfile_dir("fuzz-certs")?;
    tls::generate(
        certs.path(),
        &["localhost".into()],
        &["w1".into(), "w2".into()],
    )?;
    let state = tempfile_dir("fuzz-state")?;
    let settings = |c: &mut converge_manager::Config| {
        c.tls = Some(TlsFiles::manager(certs.path()));
        c.heartbeat_interval = Duration::from_millis(200);
        c.state_dir = Some(state.path().to_path_buf());
    };
    let manager = TestManager::start(settings).await?;
    let https = format!("https://{}", manager.addr);
    let control_tls = tls::control_client(&certs.path().join("ca.pem"), "localhost")?;
    let mut control = ControlServiceClient::new(
        Endpoint::from_shared(https.clone())?
            .tls_config(control_tls)?
            .connect()
            .await?,
    );

    // The bystanders: three jobs placed on w2 (the only worker yet), which keeps heartbeating.
    let _w2 = ScriptedAgent::connect_as(&https, certs.path(), "w2", 4.0).await?;
    let mut bystanders = Vec::new();
    for _ in 0..3 {
        let id = control
            .submit_job(pb::SubmitJobRequest {
                spec: Some(converge_integration_tests::one_core_spec()),
            })
            .await?
            .into_inner()
            .job_id;
        bystanders.push(id);
    }
    let snapshot = |jobs: &[pb::Job]| -> Vec<_> {
        bystanders
            .iter()
            .map(|id| fingerprint(jobs.iter().find(|j| &j.id == id).expect("known")))
            .collect()
    };
    let before = snapshot(
        &control
            .list_jobs(pb::ListJobsRequest::default())
            .await?
            .into_inner()
            .jobs,
    );
    assert!(before.iter().all(|f| f.2 == "w2"), "{before:?}");

    // The fuzzing agent: w1, with w1's own valid certificate.
    let w1_tls = tls_for(certs.path(), "w1");
    let mut w1 = open_w1(manager.addr, w1_tls.clone(), problems.clone()).await?;
    // A few jobs of the fuzzer's own that land on w1, so that some of what w1 says is about
    // jobs it may speak of.
    let mut submitted = Vec::new();
    for _ in 0..2 {
        let id = control
            .submit_job(pb::SubmitJobRequest {
                spec: Some(converge_integration_tests::one_core_spec()),
            })
            .await?
            .into_inner();
        assert_eq!(id.job.as_ref().map(|j| j.worker_id.as_str()), Some("w1"));
        submitted.push(id.job_id);
    }
    let (mut sent, mut asked, mut reopened, mut bytes_mutated, mut step) = (0, 0, 0, 0, 0);
    while sent < MESSAGES || asked < REQUESTS {
        if asked < REQUESTS && (sent >= MESSAGES || rng.random_bool(0.2)) {
            asked += 1;
            let r = tokio::time::timeout(
                Duration::from_secs(10),
                control_request(&mut rng, &mut control, &mut submitted),
            )
            .await
            .map_err(|_| anyhow::anyhow!("a control request hung (seed {seed})"))?;
            if let Err(s) = r {
                anyhow::ensure!(
                    allowed(s.code()),
                    "undocumented status {:?}: {} (seed {seed})",
                    s.code(),
                    s.message()
                );
            }
        } else {
            sent += 1;
            let m = if rng.random_bool(0.5) {
                agent_message(&mut rng, &bystanders, &submitted)
            } else {
                let (m, bytes) = mutated(&mut rng, &bystanders, &submitted, &mut step);
                bytes_mutated += usize::from(bytes);
                m
            };
            if w1.send(m).await.is_err() {
                // The manager ended the stream: open another.
                reopened += 1;
                w1 = open_w1(manager.addr, w1_tls.clone(), problems.clone()).await?;
            }
        }
    }
    drop(w1);
    eprintln!(
        "sent {sent} agent messages ({bytes_mutated} of them valid ones with mutated bytes), \
         {asked} control requests; reopened w1's stream {reopened} times"
    );

    // Still serving, and the bystanders are exactly as they were.
    let jobs = eventually(Duration::from_secs(10), "the manager to answer", || {
        let mut c = control.clone();
        async move {
            Ok(c.list_jobs(pb::ListJobsRequest::default())
                .await
                .ok()
                .map(|r| r.into_inner().jobs))
        }
    })
    .await?;
    assert_eq!(snapshot(&jobs), before, "bystanders changed (seed {seed})");
    assert_eq!(
        *problems.lock().unwrap(),
        Vec::<String>::new(),
        "w1's streams (seed {seed})"
    );
    assert_eq!(
        *panics.lock().unwrap(),
        Vec::<String>::new(),
        "panics (seed {seed})"
    );

    // What the fuzz left in the store reads back: the manager starts again on it.
    let addr = manager.addr;
    manager.stop().await;
    let manager = TestManager::start_at(addr, settings).await?;
    let mut control = ControlServiceClient::new(
        Endpoint::from_shared(https)?
            .tls_config(tls::control_client(
                &certs.path().join("ca.pem"),
                "localhost",
            )?)?
            .connect()
            .await?,
    );
    let jobs = control
        .list_jobs(pb::ListJobsRequest::default())
        .await?
        .into_inner()
        .jobs;
    assert_eq!(
        snapshot(&jobs),
        before,
        "bystanders after a restart (seed {seed})"
    );
    manager.stop().await;
    assert_eq!(
        *panics.lock().unwrap(),
        Vec::<String>::new(),
        "panics (seed {seed})"
    );
    Ok(())
}
