//! The actor's promise to its store (module doc): nothing a step decided leaves the process
//! before the batch that holds it is written. An answer to a submission, the Start it sends
//! and the ack of a heartbeat that came after an exit each wait for the commit of what they
//! tell: a crash between the two would otherwise undo what a client or an agent was told.
//!
//! The store here is the real one, watched: as each commit begins it reads everything the
//! actor has sent so far (the answers' channels and the agent's stream), and checks each
//! against what earlier commits wrote. The actor commits and sends on one thread, so what is
//! in those channels when a commit begins was sent before it: the check is exact, not a race.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use converge_core::cluster::types::JobState as CoreState;
use converge_messenger::manager::{AgentLink, StreamEvent};
use converge_messenger::pb::{self, agent_message::Kind as AgentKind};
use converge_store::Sqlite;
use converge_store::{Batch, PendingBackup, Recovered, Store, StoredEvent, StoredJob};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::{Actor, ActorConfig, ManagerKind, Request};
use crate::metrics::ManagerMetrics;

/// What the actor sent, as the test waits for it.
#[derive(Debug, PartialEq)]
enum Sent {
    /// A submission was answered with this job.
    Answer(String),
    /// A submission was refused, for this (the test then fails, saying so).
    Refused(String),
    /// A Start for this job and epoch (with its command id, to answer it).
    Start(String, u64, String),
    /// A heartbeat was acknowledged.
    Ack(u64),
}

/// What the watched store reads and what it has seen written.
struct Watch {
    answers: Vec<oneshot::Receiver<crate::Result<super::Submitted>>>,
    stream: Option<mpsc::Receiver<Result<pb::ManagerMessage, tonic::Status>>>,
    /// Each job's state and epoch as last written.
    written: HashMap<String, (CoreState, u64)>,
    /// The job whose exit the agent sent before heartbeat `seq` (its ack promises the exit
    /// is kept).
    exited_before: HashMap<u64, String>,
    /// What left the process before the write it tells of.
    early: Vec<String>,
    sent: mpsc::UnboundedSender<Sent>,
}

impl Watch {
    /// Reads what the actor sent since the last commit began, and checks each against the
    /// records written so far.
    fn read_sent(&mut self) {
        let mut sent = Vec::new();
        self.answers.retain_mut(|rx| match rx.try_recv() {
            Ok(Ok((job, _))) => {
                sent.push(Sent::Answer(job.id));
                false
            }
            Ok(Err(e)) => {
                sent.push(Sent::Refused(e.to_string()));
                false
            }
            Err(oneshot::error::TryRecvError::Empty) => true,
            Err(oneshot::error::TryRecvError::Closed) => false,
        });
        while let Some(Ok(Ok(m))) = self.stream.as_mut().map(|rx| rx.try_recv()) {
            match m.kind {
                Some(ManagerKind::Command(c))
                    if matches!(c.action, Some(pb::command::Action::Start(_))) =>
                {
                    sent.push(Sent::Start(c.job_id, c.epoch, c.command_id))
                }
                Some(ManagerKind::Ack(a)) => sent.push(Sent::Ack(a.heartbeat_seq)),
                _ => {}
            }
        }
        for s in sent {
            let kept = match &s {
                Sent::Answer(job) => self.written.contains_key(job),
                Sent::Refused(_) => true,
                Sent::Start(job, epoch, _) => {
                    self.written.get(job) == Some(&(CoreState::Starting, *epoch))
                }
                Sent::Ack(seq) => self.exited_before.get(seq).is_none_or(|job| {
                    self.written
                        .get(job)
                        .is_some_and(|(state, _)| *state == CoreState::Completed)
                }),
            };
            if !kept {
                self.early.push(format!("{s:?}"));
            }
            let _ = self.sent.send(s);
        }
    }
}

/// The real store, with every commit watched.
struct Watched {
    store: Sqlite,
    watch: Arc<Mutex<Watch>>,
}

impl Store for Watched {
    fn load(&mut self, events: usize, finished: usize) -> converge_store::Result<Recovered> {
        self.store.load(events, finished)
    }

    fn commit(&mut self, batch: &Batch<'_>) -> converge_store::Result<()> {
        let mut watch = self.watch.lock().unwrap();
        watch.read_sent();
        self.store.commit(batch)?;
        for job in &batch.jobs {
            (watch.written).insert(job.id.to_string(), (job.state(), job.epoch));
        }
        Ok(())
    }

    fn location(&self) -> String {
        self.store.location()
    }

    fn jobs(
        &mut self,
        query: converge_store::JobQuery<'_>,
    ) -> converge_store::Result<Vec<StoredJob>> {
        self.store.jobs(query)
    }

    fn events(
        &mut self,
        from: u64,
        before: u64,
        job: Option<&str>,
        limit: usize,
    ) -> converge_store::Result<Vec<StoredEvent>> {
        self.store.events(from, before, job, limit)
    }

    fn prune_finished(&mut self, before: f64, limit: usize) -> converge_store::Result<Vec<String>> {
        self.store.prune_finished(before, limit)
    }

    fn backup(&mut self) -> converge_store::Result<PendingBackup> {
        self.store.backup()
    }
}

/// Waits until what the actor sent, gathered in `seen`, holds what `done` looks for. A
/// commit comes at least once a second while the actor ticks, so what it sends is seen within
/// about a second.
async fn until(
    rx: &mut mpsc::UnboundedReceiver<Sent>,
    seen: &mut Vec<Sent>,
    done: impl Fn(&[Sent]) -> bool,
) {
    let wait = async {
        while !done(seen) {
            match rx.recv().await.expect("the actor stopped") {
                Sent::Refused(why) => panic!("the submission was refused: {why}"),
                sent => seen.push(sent),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), wait)
        .await
        .unwrap_or_else(|_| panic!("the actor did not send it within 30 s; it sent {seen:?}"))
}

#[tokio::test]
async fn answers_commands_and_acks_leave_only_after_the_commit_of_what_they_tell() {
    let dir = tempfile::tempdir().unwrap();
    let (sent_tx, mut sent_rx) = mpsc::unbounded_channel();
    let watch = Arc::new(Mutex::new(Watch {
        answers: Vec::new(),
        stream: None,
        written: HashMap::new(),
        exited_before: HashMap::new(),
        early: Vec::new(),
        sent: sent_tx,
    }));
    let store = Watched {
        store: Sqlite::open(dir.path()).unwrap(),
        watch: watch.clone(),
    };
    let config = converge_core::cluster::Config::default();
    let policy = converge_core::cluster::policy::by_name("spread", &Default::default()).unwrap();
    let actor = Actor::new(
        ActorConfig {
            manager_id: "manager-test".into(),
            core: config.clone(),
            events_in_memory: 100,
            finished_retention: None,
        },
        converge_core::cluster::Core::new(config, policy),
        ManagerMetrics::new(),
        Some(Box::new(store)),
        None,
    );
    let (requests, requests_rx) = mpsc::channel(16);
    let (streams, streams_rx) = mpsc::channel(16);
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(actor.run(requests_rx, streams_rx, shutdown.clone()));

    // An agent with room for the job.
    let (link, stream) = AgentLink::channel(1, 64);
    watch.lock().unwrap().stream = Some(stream);
    let register = pb::Register {
        worker_id: "w1".into(),
        cpu_capacity: 2.0,
        ..Default::default()
    };
    let connected = StreamEvent::Connected {
        conn: 1,
        register,
        link,
    };
    streams.send(connected).await.unwrap();

    // A submission: answered, and started on w1.
    let (reply, answer) = oneshot::channel();
    watch.lock().unwrap().answers.push(answer);
    let spec = pb::JobSpec {
        image: "converge-trainer:test".into(),
        cpus: 1.0,
        ..Default::default()
    };
    let submit = Request::Submit {
        spec: Some(Box::new(spec)),
        reply,
    };
    requests.send(submit).await.unwrap();
    let mut seen = Vec::new();
    let answered = |seen: &[Sent]| -> Option<String> {
        seen.iter().find_map(|s| match s {
            Sent::Answer(job) => Some(job.clone()),
            _ => None,
        })
    };
    let started = |seen: &[Sent]| -> Option<(u64, String)> {
        let job = answered(seen)?;
        seen.iter().find_map(|s| match s {
            Sent::Start(j, epoch, command) if *j == job => Some((*epoch, command.clone())),
            _ => None,
        })
    };
    until(&mut sent_rx, &mut seen, |seen| started(seen).is_some()).await;
    let (job, (epoch, command)) = (answered(&seen).unwrap(), started(&seen).unwrap());

    // The agent starts it, sees it exit, and heartbeats: the ack promises the exit is kept.
    watch.lock().unwrap().exited_before.insert(7, job.clone());
    let started = pb::CommandResult {
        command_id: command,
        job_id: job.clone(),
        epoch,
        ok: true,
        detail: Some(pb::command_result::Detail::Started(pb::Started {
            container_id: "c1".into(),
            from_checkpoint: false,
        })),
        ..Default::default()
    };
    let exited = pb::ContainerExited {
        job_id: job.clone(),
        epoch,
        container_id: "c1".into(),
        exit_code: 0,
        done: true,
        ..Default::default()
    };
    let heartbeat = pb::Heartbeat {
        seq: 7,
        ..Default::default()
    };
    for kind in [
        AgentKind::Result(started),
        AgentKind::Exited(exited),
        AgentKind::Heartbeat(heartbeat),
    ] {
        streams
            .send(StreamEvent::Message { conn: 1, kind })
            .await
            .unwrap();
    }
    until(&mut sent_rx, &mut seen, |seen| seen.contains(&Sent::Ack(7))).await;

    shutdown.cancel();
    running.await.unwrap().unwrap();
    let early = std::mem::take(&mut watch.lock().unwrap().early);
    assert!(
        early.is_empty(),
        "sent before the commit of what it tells (a crash then would undo it): {early:?}"
    );
}
