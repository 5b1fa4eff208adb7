//! Unit tests of the cluster core with virtual time, and a property test over random
//! interleavings against modelled agents.

use std::collections::BTreeMap;

use super::policy::{self, PolicyConfig, WaitKind};
use super::*;

/// A core and the effects it produced, with helpers that play the agents' part.
struct Fixture {
    core: Core,
    now: Time,
    effects: Vec<Effect>,
    /// Every change stored after every step, and checked against the core: a change the core
    /// did not report to the store fails the test that makes it.
    store: Shadow,
}

/// `record` as a store that keeps it as JSON reads it back (the SQLite store does).
fn stored<T: serde::Serialize + serde::de::DeserializeOwned>(record: &T) -> T {
    serde_json::from_str(&serde_json::to_string(record).unwrap()).unwrap()
}

/// A store as the manager's shell keeps one (`saved`): what steps changed, written when a
/// step's effects leave the manager.
#[derive(Default)]
struct Shadow {
    jobs: BTreeMap<JobId, Job>,
    workers: BTreeMap<WorkerId, Worker>,
    counters: saved::Counters,
    unsaved: saved::Changes,
    /// Jobs the core archived: their records stay here, as in the manager's store.
    archived: std::collections::BTreeSet<JobId>,
}

impl Shadow {
    /// What the shell does after a step.
    fn after_step(&mut self, core: &mut Core, out: &[Effect]) {
        self.unsaved.merge(core.take_changes());
        if out.iter().any(Effect::is_observable) {
            self.commit(core);
            self.archive(core);
        }
    }

    /// What the shell does after a write: the core may now drop finished jobs.
    fn archive(&mut self, core: &mut Core) {
        for id in core.archive() {
            assert!(
                !self.unsaved.jobs.contains(&id),
                "job {id} archived with a change not yet stored"
            );
            assert!(
                self.jobs.get(&id).is_some_and(Job::is_terminal),
                "job {id} archived before its final record was stored"
            );
            self.archived.insert(id);
        }
    }

    fn commit(&mut self, core: &Core) {
        let changes = std::mem::take(&mut self.unsaved);
        // A shell may write soft changes later; this one writes them at once, so that every
        // record is checked.
        for id in changes.jobs.into_iter().chain(changes.soft) {
            if let Some(j) = core.job(&id) {
                self.jobs.insert(id, j.clone());
            }
        }
        // Deletions first, as the SQLite store does: a worker forgotten and registered again
        // since is written afresh.
        for id in changes.forgotten {
            self.workers.remove(&id);
        }
        for id in changes.workers {
            if let Some(w) = core.worker(&id) {
                self.workers.insert(id, w.clone());
            }
        }
        self.counters = core.counters();
    }

    /// What a restart reads, as the SQLite store reads it: every live job, the newest
    /// [`KEEP_FINISHED`] finished ones, and the longest downtime of the finished ones left out;
    /// each record as it reads back from its JSON, as the store keeps it (what a record does
    /// not store, a restart does not have).
    fn saved(&self) -> saved::Saved {
        let mut finished: Vec<&Job> = self.jobs.values().filter(|j| j.is_terminal()).collect();
        finished.sort_by(|a, b| {
            let at = |j: &Job| j.finished_at.get().unwrap_or(f64::NEG_INFINITY);
            at(b).total_cmp(&at(a)).then(b.seq.cmp(&a.seq))
        });
        let left_out = finished.split_off(finished.len().min(KEEP_FINISHED));
        saved::Saved {
            jobs: self
                .jobs
                .values()
                .filter(|j| !j.is_terminal() || finished.iter().any(|f| f.id == j.id))
                .map(stored)
                .collect(),
            workers: self.workers.values().map(stored).collect(),
            counters: self.counters.clone(),
            archived_downtime: left_out
                .iter()
                .filter_map(|j| j.last_migration_downtime.get())
                .reduce(f64::max),
        }
    }

    /// Every stored record is the core's own: nothing changed unreported.
    fn assert_complete(&self, core: &Core) {
        // What a store keeps of a worker: not its stream, nor its job indexes (rebuilt) and
        // when that last changed, nor the stops it is owed.
        let unlinked = |w: &Worker| {
            let mut w = w.clone();
            w.conn = None;
            w.jobs.clear();
            w.inbound.clear();
            w.shared_since = 0.0;
            w.last_heard = 0.0;
            w.stops_owed.clear();
            format!("{w:?}")
        };
        assert_eq!(
            self.jobs.len(),
            core.jobs().len() + self.archived.len(),
            "jobs stored: those in memory and those archived"
        );
        // What a store keeps of a job: not its fields that are not stored (what a
        // neighbour's leaving read off its use, the Pause or Resume it waits to hear of, the
        // time of its report before the last). Cleared here rather than read back from JSON
        // at every step, which made these tests six times slower.
        let kept = |j: &Job| {
            let mut j = j.clone();
            j.cap_read = OptF64::NONE;
            j.freezing = None;
            j.view_from = OptF64::NONE;
            format!("{j:?}")
        };
        for (id, j) in core.jobs().iter() {
            assert_eq!(
                self.jobs.get(id).map(kept),
                Some(kept(j)),
                "job {id} changed without telling the store"
            );
        }
        for (id, w) in core.workers().iter() {
            assert_eq!(
                self.workers.get(id).map(unlinked),
                Some(unlinked(w)),
                "worker {id} changed without telling the store"
            );
        }
        assert_eq!(self.counters, core.counters());
    }
}

/// Small, so that archiving runs in every test and every interleaving.
const KEEP_FINISHED: usize = 2;

fn config() -> Config {
    Config {
        heartbeat_interval: 1.0,
        lost_after_missed: 3,
        recover_lost_after: 10.0,
        save_deadline: 5.0,
        progress_history: 8,
        keep_finished: KEEP_FINISHED,
        id_prefix: "t".into(),
        record_changes: true,
    }
}

/// A small deterministic random sequence (Knuth's MMIX generator, high bits).
fn lcg(mut state: u64) -> impl FnMut() -> u64 {
    move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        state >> 33
    }
}

/// Worker `w` registers on stream `conn` with `cpus` cores at `speed` (its calibration).
fn connected(conn: ConnId, w: &str, cpus: f64, speed: f64) -> Input {
    Input::Connected {
        conn,
        register: Register {
            worker: w.into(),
            cpu_capacity: cpus,
            calibration: speed,
            instance_id: format!("{w}-a"),
            ..Register::default()
        },
    }
}

fn spec(cpus: f64) -> JobSpec {
    JobSpec {
        cpus,
        ..JobSpec::default()
    }
}

impl Fixture {
    fn new(policy: &str) -> Self {
        Self::with(policy::by_name(policy, &PolicyConfig::default()).unwrap())
    }

    /// A fixture around a core that runs `policy`.
    fn with(policy: Box<dyn ClusterPolicy>) -> Self {
        Fixture {
            core: Core::new(config(), policy),
            now: 0.0,
            effects: Vec::new(),
            store: Shadow::default(),
        }
    }

    fn step(&mut self, input: Input) -> Vec<Effect> {
        let out = self.core.step(self.now, input);
        self.effects.extend(out.iter().cloned());
        self.store.after_step(&mut self.core, &out);
        self.store.commit(&self.core);
        self.store.archive(&mut self.core);
        self.store.assert_complete(&self.core);
        assert!(
            self.core.derived_state_is_fresh(),
            "a placement snapshot, a worker's job set, the Lost count or the valued count is out of date"
        );
        out
    }

    /// The manager restarts: a new core from what the store holds, `grace` seconds for the
    /// agents to come back; every stream is gone.
    fn restart(&mut self, policy: &str, grace: Time) {
        let p = policy::by_name(policy, &PolicyConfig::default()).unwrap();
        self.core = Core::from_saved(config(), p, self.store.saved(), self.now, grace).unwrap();
    }

    fn advance(&mut self, dt: Time) -> Vec<Effect> {
        self.now += dt;
        self.step(Input::Tick)
    }

    /// Worker `w` (conn = its number) registers with `cpus` cores.
    fn register(&mut self, conn: ConnId, w: &str, cpus: f64) -> Vec<Effect> {
        self.register_at(conn, w, cpus, Register::default().calibration)
    }

    /// Worker `w` registers with `cpus` cores at `speed` (its calibration).
    fn register_at(&mut self, conn: ConnId, w: &str, cpus: f64, speed: f64) -> Vec<Effect> {
        self.step(connected(conn, w, cpus, speed))
    }

    /// Worker `w` registers again on stream `conn`, reporting running containers as
    /// `(job, epoch, last step)`.
    fn reregister(
        &mut self,
        conn: ConnId,
        w: &str,
        cpus: f64,
        running: &[(&str, u64, u64)],
    ) -> Vec<Effect> {
        let containers = (running.iter())
            .map(|(job, epoch, step)| ContainerReport {
                job: (*job).into(),
                epoch: *epoch,
                container_id: format!("{job}-{epoch}"),
                running: true,
                paused: false,
                last_step: Some(*step),
                exit: None,
            })
            .collect();
        self.reregister_listing(conn, w, cpus, containers)
    }

    /// Worker `w` registers again on stream `conn`, listing `containers`.
    fn reregister_listing(
        &mut self,
        conn: ConnId,
        w: &str,
        cpus: f64,
        containers: Vec<ContainerReport>,
    ) -> Vec<Effect> {
        self.step(Input::Connected {
            conn,
            register: Register {
                worker: w.into(),
                cpu_capacity: cpus,
                containers,
                ..Register::default()
            },
        })
    }

    fn submit(&mut self, id: &str, cpus: f64) -> Vec<Effect> {
        self.step(Input::Submit {
            id: id.into(),
            spec: spec(cpus),
        })
    }

    /// Submits `spec` as `id`, which must be placed at once, and acknowledges its Start:
    /// the connection of the worker it went to.
    fn start(&mut self, id: &str, spec: JobSpec) -> ConnId {
        let out = self.step(Input::Submit {
            id: id.into(),
            spec,
        });
        let (conn, start) = Fixture::sent(&out, id, "start").expect("placed");
        self.ok(conn, &start, Fixture::started(conn));
        conn
    }

    /// Submits `id`, expects it turned away (no Start, Rejected) and returns why.
    fn rejected(&mut self, id: &str, spec: JobSpec) -> String {
        let out = self.step(Input::Submit {
            id: id.into(),
            spec,
        });
        assert!(Fixture::sent(&out, id, "start").is_none(), "{out:?}");
        assert_eq!(self.state(id), JobState::Rejected);
        self.core.job(id).unwrap().reason.clone()
    }

    fn msg(&mut self, conn: ConnId, message: AgentMessage) -> Vec<Effect> {
        self.step(Input::Agent { conn, message })
    }

    /// A job's state as the manager answers for it: from the core, or from the store once
    /// archived.
    fn state(&self, id: &str) -> JobState {
        self.core
            .job(id)
            .or_else(|| {
                self.store
                    .jobs
                    .get(id)
                    .filter(|_| self.store.archived.contains(id))
            })
            .unwrap()
            .state()
    }

    fn epoch(&self, id: &str) -> u64 {
        self.core.job(id).unwrap().epoch
    }

    /// The first event of `kind` in `out`.
    fn event(out: &[Effect], kind: EventKind) -> Option<&Event> {
        out.iter().find_map(|e| match e {
            Effect::Event(e) if e.kind == kind => Some(e),
            _ => None,
        })
    }

    /// Workers `w00`, `w01`, ... (`n` of them) registered out of id order (the index's order
    /// is rebuilt when one goes in before others), of 1, 2 and 4 cores in turn, and of the
    /// `speeds` in turn.
    fn register_shuffled(&mut self, n: usize, speeds: &[f64]) {
        // 7 is coprime with n: every worker registers once.
        assert_ne!(n % 7, 0);
        for k in 0..n {
            let w = (k * 7) % n;
            let id = format!("w{w:02}");
            self.register_at(
                w as u64 + 1,
                &id,
                [1.0, 2.0, 4.0][w % 3],
                speeds[w % speeds.len()],
            );
        }
    }

    /// Submits `id` asking for `cpus` and checks where it was placed and the scores its event
    /// lists against `expected` (`None`: not placed).
    fn submit_placed(
        &mut self,
        id: &str,
        cpus: f64,
        expected: Option<(WorkerId, String)>,
    ) -> Vec<Effect> {
        let out = self.submit(id, cpus);
        let got = Fixture::event(&out, EventKind::JobPlaced).map(|e| {
            (
                e.worker.clone().expect("a placement names its worker"),
                e.attributes["scores"].clone(),
            )
        });
        assert_eq!(got, expected, "job {id} ({cpus} cpus)");
        out
    }

    /// Where `placer`'s scan of every worker puts a job asking `need`, and the scores the
    /// event would list.
    fn scanned(
        &self,
        placer: &mut dyn converge_policy::cluster::Placer,
        need: &converge_policy::cluster::JobRequest,
    ) -> Option<(WorkerId, String)> {
        let (ids, snaps) = self.core.view().snapshots();
        match placer.place(need, snaps) {
            converge_policy::cluster::Placement::Worker { index, scores } => Some((
                ids[index].clone(),
                policy::placement_text(ids, &scores, index),
            )),
            converge_policy::cluster::Placement::Unschedulable { .. } => None,
        }
    }

    /// The last command of `action` for `job` in `out`.
    fn sent(out: &[Effect], job: &str, action: &str) -> Option<(ConnId, Command)> {
        out.iter().rev().find_map(|e| match e {
            Effect::Send { conn, command, .. }
                if command.job == job && command.action.name() == action =>
            {
                Some((*conn, command.clone()))
            }
            _ => None,
        })
    }

    fn ok(&mut self, conn: ConnId, c: &Command, detail: ResultDetail) -> Vec<Effect> {
        self.msg(
            conn,
            AgentMessage::Result(CommandResult {
                command: c.id.clone(),
                job: c.job.clone(),
                epoch: c.epoch,
                ok: true,
                error: String::new(),
                detail,
            }),
        )
    }

    fn fail(&mut self, conn: ConnId, c: &Command, error: &str) -> Vec<Effect> {
        self.msg(
            conn,
            AgentMessage::Result(CommandResult {
                command: c.id.clone(),
                job: c.job.clone(),
                epoch: c.epoch,
                ok: false,
                error: error.into(),
                detail: ResultDetail::None,
            }),
        )
    }

    /// Submits each of `ids` (asking for `cpus` cores) and answers its Start: each runs where
    /// the policy put it.
    fn run_all(&mut self, ids: &[&str], cpus: f64) {
        for id in ids {
            let out = self.submit(id, cpus);
            let (conn, start) = Self::sent(&out, id, "start").expect("started");
            self.ok(conn, &start, Self::started(conn));
        }
    }

    fn started(conn: ConnId) -> ResultDetail {
        ResultDetail::Started {
            container_id: format!("c{conn}"),
        }
    }

    fn saved() -> ResultDetail {
        ResultDetail::Saved {
            step: 10,
            checkpoint_bytes: 100,
            save_ms: 5,
            killed: false,
        }
    }

    fn heartbeat(&mut self, conn: ConnId) -> Vec<Effect> {
        self.msg(conn, AgentMessage::Heartbeat(Heartbeat::default()))
    }

    /// A heartbeat reporting that `job` (at `epoch`) used `cpu_usage` cores.
    fn heartbeat_of(&mut self, conn: ConnId, job: &str, epoch: u64, cpu_usage: f64) -> Vec<Effect> {
        self.msg(
            conn,
            AgentMessage::Heartbeat(Heartbeat {
                jobs: vec![JobStatus {
                    job: job.into(),
                    epoch,
                    category: None,
                    growth_efficiency: None,
                    cpu_limit: None,
                    cpu_usage,
                }],
                ..Heartbeat::default()
            }),
        )
    }

    /// A heartbeat reporting that each job (at epoch 1) used its cores.
    fn heartbeat_uses(&mut self, conn: ConnId, uses: &[(&str, f64)]) -> Vec<Effect> {
        let jobs = (uses.iter())
            .map(|(j, u)| JobStatus {
                job: (*j).into(),
                epoch: 1,
                category: None,
                growth_efficiency: None,
                cpu_limit: None,
                cpu_usage: *u,
            })
            .collect();
        self.msg(
            conn,
            AgentMessage::Heartbeat(Heartbeat {
                jobs,
                ..Heartbeat::default()
            }),
        )
    }

    fn progress(&mut self, conn: ConnId, job: &str, epoch: u64, step: u64) -> Vec<Effect> {
        self.progress_of(conn, job, epoch, step, 100)
    }

    /// A heartbeat reporting `jobs` (each at epoch 1, using a core) in `category`.
    fn heartbeat_in(
        &mut self,
        conn: ConnId,
        jobs: &[&str],
        category: converge_policy::Category,
    ) -> Vec<Effect> {
        let status = |j: &&str| JobStatus {
            job: (*j).into(),
            epoch: 1,
            category: Some(category),
            growth_efficiency: None,
            cpu_limit: None,
            cpu_usage: 1.0,
        };
        let heartbeat = Heartbeat {
            jobs: jobs.iter().map(status).collect(),
            ..Heartbeat::default()
        };
        self.msg(conn, AgentMessage::Heartbeat(heartbeat))
    }

    fn progress_of(
        &mut self,
        conn: ConnId,
        job: &str,
        epoch: u64,
        step: u64,
        total: u64,
    ) -> Vec<Effect> {
        let unix_ms = (self.now * 1000.0) as i64;
        self.sample(
            conn,
            ProgressSample {
                job: job.into(),
                epoch,
                unix_ms,
                step,
                total_steps: Some(total),
                value: Some(1.0),
                checkpointed: false,
            },
        )
    }

    /// Job `job`'s incarnation `epoch` on `conn` reports a checkpoint at `step`.
    fn checkpointed(&mut self, conn: ConnId, job: &str, epoch: u64, step: u64) -> Vec<Effect> {
        let sample = ProgressSample {
            job: job.into(),
            epoch,
            step,
            checkpointed: true,
            ..ProgressSample::default()
        };
        self.sample(conn, sample)
    }

    /// One progress line from `conn`.
    fn sample(&mut self, conn: ConnId, sample: ProgressSample) -> Vec<Effect> {
        let batch = ProgressBatch {
            samples: vec![sample],
            malformed: vec![],
        };
        self.msg(conn, AgentMessage::Progress(batch))
    }

    fn exited(
        &mut self,
        conn: ConnId,
        job: &str,
        epoch: u64,
        code: i32,
        requested: bool,
    ) -> Vec<Effect> {
        self.msg(
            conn,
            AgentMessage::Exited(ContainerExited {
                job: job.into(),
                epoch,
                exit_code: code,
                done: code == 0 && !requested,
                requested,
                ..ContainerExited::default()
            }),
        )
    }

    /// `job`'s incarnation 1 on `conn` exits 0, unasked, without its `done` line (by the
    /// progress contract, a checkpoint on SIGTERM).
    fn exited_0_without_done(&mut self, conn: ConnId, job: &str) -> Vec<Effect> {
        self.msg(
            conn,
            AgentMessage::Exited(ContainerExited {
                job: job.into(),
                epoch: 1,
                exit_code: 0,
                ..ContainerExited::default()
            }),
        )
    }

    /// w1's agent (conn 1) dies and a new one (conn 5, another instance) registers; the
    /// container of `job`'s incarnation 1 exited meanwhile, at `step`, `done` or not. The new
    /// agent lists it exited and reports the exit, which it did not ask for (as
    /// `NodeCore::adopted` does for `Found::Exited`).
    fn agent_restarted_after_its_exit(&mut self, job: &str, step: u64, done: bool) {
        self.step(Input::Disconnected {
            conn: 1,
            reason: "agent crashed".into(),
        });
        self.step(Input::Connected {
            conn: 5,
            register: Register {
                worker: "w1".into(),
                cpu_capacity: 2.0,
                instance_id: "w1-b".into(),
                containers: vec![ContainerReport {
                    job: job.into(),
                    epoch: 1,
                    container_id: format!("{job}-1"),
                    running: false,
                    paused: false,
                    last_step: Some(step),
                    exit: None,
                }],
                ..Register::default()
            },
        });
        self.msg(
            5,
            AgentMessage::Exited(ContainerExited {
                job: job.into(),
                epoch: 1,
                exit_code: 0,
                done,
                requested: false,
                last_step: Some(step),
                ..ContainerExited::default()
            }),
        );
    }

    /// `secs` seconds in which only the agent on stream `conn` heartbeats, once a second:
    /// the others go silent (and are lost after the timeout).
    fn only_beating(&mut self, conn: ConnId, secs: usize) {
        for _ in 0..secs {
            self.heartbeat(conn);
            self.advance(1.0);
        }
    }

    /// Two 2-core workers and job `a` (1 core) running on w1 (spread picks the first).
    fn running() -> Self {
        let mut f = Fixture::new("spread");
        f.register(1, "w1", 2.0);
        f.register(2, "w2", 2.0);
        let out = f.submit("a", 1.0);
        let (conn, start) = Self::sent(&out, "a", "start").expect("started");
        assert_eq!(conn, 1);
        f.ok(1, &start, Self::started(1));
        assert_eq!(f.state("a"), JobState::Running);
        f
    }

    /// Under `policy`, jobs `ids` of half a core each started on w1, a 1-core worker.
    fn started_on_w1(policy: &str, ids: &[&str]) -> Self {
        let mut f = Fixture::new(policy);
        f.register(1, "w1", 1.0);
        for id in ids {
            let out = f.submit(id, 0.5);
            let (_, start) = Fixture::sent(&out, id, "start").unwrap();
            f.ok(1, &start, Fixture::started(1));
        }
        f
    }

    /// On [`Fixture::running`]: w1's agent dies, and after the grace `a` restarts on w2
    /// (epoch 2, started there). The stream of its Start.
    fn lose_w1(&mut self) -> ConnId {
        let (conn, start) = self.lose(1, 2, "a").expect("a restarted on w2");
        self.ok(conn, &start, Fixture::started(2));
        conn
    }

    /// The agent of stream `lost` dies; `alive`'s heartbeats go on past the grace: where
    /// `job` was restarted, with its Start, if it was.
    fn lose(&mut self, lost: ConnId, alive: ConnId, job: &str) -> Option<(ConnId, Command)> {
        self.step(Input::Disconnected {
            conn: lost,
            reason: "agent killed".into(),
        });
        let mut restarted = None;
        for _ in 0..14 {
            self.heartbeat(alive);
            let out = self.advance(1.0);
            restarted = restarted.or(Fixture::sent(&out, job, "start"));
        }
        restarted
    }

    /// [`Fixture::running`], then w1 drained: `a` is saving on w1 for w2.
    fn saving() -> (Self, Command) {
        let mut f = Self::running();
        let out = f.step(Input::Drain {
            worker: "w1".into(),
        });
        let (_, save) = Self::sent(&out, "a", "save").expect("drain saves");
        assert_eq!(f.state("a"), JobState::Migrating);
        (f, save)
    }

    /// [`Fixture::saving`], then saved: `a` restoring on w2 at epoch 2.
    fn restoring() -> (Self, Command) {
        let (mut f, save) = Self::saving();
        let out = f.ok(1, &save, Self::saved());
        let (conn, start) = Self::sent(&out, "a", "start").expect("restore");
        assert_eq!((conn, start.epoch), (2, 2));
        (f, start)
    }

    /// Every Start sent, by job.
    fn starts(&self, job: &str) -> usize {
        self.effects
            .iter()
            .filter(|e| matches!(e, Effect::Send { command, .. } if command.job == job && command.action.name() == "start"))
            .count()
    }

    fn refused(out: &[Effect], what: Refusal) -> usize {
        out.iter()
            .filter(|e| matches!(e, Effect::Refused { what: w, .. } if *w == what))
            .count()
    }
}

// ---- lifecycle, table-driven ----

/// Cancel in every live state: the job stays Cancelled whatever arrives afterwards, and no
/// Start is ever sent for it again.
#[test]
fn cancel_is_final_in_every_state() {
    type Setup = fn() -> (Fixture, Option<Command>);
    let cases: Vec<(&str, Setup)> = vec![
        ("pending", || {
            let mut f = Fixture::new("spread");
            f.submit("a", 1.0);
            (f, None)
        }),
        ("starting", || {
            let mut f = Fixture::new("spread");
            f.register(1, "w1", 2.0);
            let out = f.submit("a", 1.0);
            let start = Fixture::sent(&out, "a", "start").map(|s| s.1);
            (f, start)
        }),
        ("running", || (Fixture::running(), None)),
        ("saving", || {
            let (f, save) = Fixture::saving();
            (f, Some(save))
        }),
        ("restoring", || {
            let (f, start) = Fixture::restoring();
            (f, Some(start))
        }),
        ("lost", || {
            let mut f = Fixture::running();
            f.only_beating(2, 5);
            assert_eq!(f.state("a"), JobState::Lost);
            (f, None)
        }),
    ];
    for (name, setup) in cases {
        let (mut f, in_flight) = setup();
        let starts_before = f.starts("a");
        let out = f.step(Input::Cancel {
            id: "a".into(),
            by: String::new(),
        });
        assert!(
            matches!(out.last(), Some(Effect::Reply(Ok(_)))),
            "{name}: {out:?}"
        );
        assert_eq!(f.state("a"), JobState::Cancelled, "{name}");
        // Everything that could follow: the in-flight command's success, a save result, the
        // restore's Started, progress, exits, reconnects with the container, ticks.
        if let Some(c) = &in_flight {
            let conn = if c.action.name() == "save" { 1 } else { 2 };
            let detail = if c.action.name() == "save" {
                Fixture::saved()
            } else {
                Fixture::started(conn)
            };
            f.ok(conn, c, detail);
        }
        let epoch = f.epoch("a");
        f.progress(1, "a", epoch, 50);
        f.progress(2, "a", epoch, 50);
        f.exited(1, "a", epoch, 0, true);
        for _ in 0..30 {
            f.heartbeat(1);
            f.heartbeat(2);
            f.advance(1.0);
        }
        assert_eq!(f.state("a"), JobState::Cancelled, "{name}: left Cancelled");
        assert_eq!(
            f.starts("a"),
            starts_before,
            "{name}: a Start after the cancel"
        );
        // A second cancel is answered as the first, and does nothing.
        let out = f.step(Input::Cancel {
            id: "a".into(),
            by: String::new(),
        });
        assert!(
            matches!(&out[..], [Effect::Reply(Ok(Reply::Job(id)))] if id.as_str() == "a"),
            "{name}: {out:?}"
        );
    }
}

/// The outcome a step's migration event gives its move, if it has one: a move that began
/// must end in one (a new user saw `started` with nothing after it once a move was cancelled).
fn move_outcome(out: &[Effect]) -> Option<&str> {
    out.iter().find_map(|e| match e {
        Effect::Event(ev) if ev.kind == EventKind::Migration => {
            ev.attributes.get("outcome").map(String::as_str)
        }
        _ => None,
    })
}

/// A worker a move is saving toward is not forgotten until the save ends: forgotten, it left a
/// job moving to a worker the records did not hold, and the next start refused the store.
#[test]
fn a_moves_target_is_not_forgotten_while_the_move_saves() {
    let (mut f, save) = Fixture::saving();
    f.step(Input::Disconnected {
        conn: 2,
        reason: "agent killed".into(),
    });
    for _ in 0..30 {
        f.heartbeat(1);
        f.advance(1.0);
    }
    assert!(
        matches!(f.core.worker("w2").unwrap().state, WorkerPhase::Lost { .. }),
        "w2 lost"
    );
    let out = f.step(Input::Forget {
        worker: "w2".into(),
    });
    assert!(
        matches!(out.last(), Some(Effect::Reply(Err(RequestError::FailedPrecondition(m))))
            if m.contains("target of a move that is saving: a")),
        "{out:?}"
    );
    // Saved, the job goes elsewhere (w1 drains: it waits) and w2 can be forgotten.
    f.ok(1, &save, Fixture::saved());
    let out = f.step(Input::Forget {
        worker: "w2".into(),
    });
    assert!(matches!(out.last(), Some(Effect::Reply(Ok(_)))), "{out:?}");
}

/// A move holds its room on the target from its first step: a job submitted while the move
/// saves is not placed in that room (it was, and overbooked the target: the sixth new user's
/// walk), and gets it once the move is given up.
#[test]
fn a_move_holds_its_room_on_the_target_while_it_saves() {
    let (mut f, _save) = Fixture::saving();
    // w2 has 2 cores and `a` (1 core) is on its way there; w1 drains.
    let out = f.submit("b", 1.5);
    assert!(Fixture::sent(&out, "b", "start").is_none(), "{out:?}");
    assert_eq!(f.state("b"), JobState::Pending);
    let w2 = &f.core.view().snapshots().1[1];
    assert_eq!((w2.cpu_requested, w2.running), (1.0, 1), "{w2:?}");
    // Given up (cancelled while saving), the move frees the room for `b`.
    let out = f.step(Input::Cancel {
        id: "a".into(),
        by: String::new(),
    });
    let (conn, _) = Fixture::sent(&out, "b", "start").expect("b placed once the room is free");
    assert_eq!(conn, 2);
}

/// A cancelled job's container keeps its room until it is seen to stop, as a terminating pod
/// does: a waiting job was placed in it at once and ran beside it for up to the stop's
/// deadline (a new user's walk).
#[test]
fn a_cancelled_jobs_room_is_taken_only_once_its_container_stopped() {
    let mut f = Fixture::new("spread");
    f.register(1, "w1", 1.0);
    f.run_all(&["a"], 1.0);
    f.submit("b", 1.0);
    assert_eq!(f.state("b"), JobState::Pending);
    let out = f.step(Input::Cancel {
        id: "a".into(),
        by: String::new(),
    });
    let (_, stop) = Fixture::sent(&out, "a", "stop").expect("told to stop");
    assert!(Fixture::sent(&out, "b", "start").is_none(), "{out:?}");
    let out = f.advance(1.0);
    assert!(Fixture::sent(&out, "b", "start").is_none(), "{out:?}");
    assert_eq!(f.state("b"), JobState::Pending);
    // Its agent answers once Docker has stopped the container: the room is free.
    let out = f.ok(1, &stop, ResultDetail::None);
    assert!(Fixture::sent(&out, "b", "start").is_some(), "{out:?}");
}

/// A job cancelled while its Start is under way: the agent finds no container to stop, but
/// one may come. Its room is held until the Start's outcome settles it: a second Stop
/// carried out, or the Start failed (the review found the room given away at the error, and
/// two containers on a worker of one core).
#[test]
fn a_job_cancelled_while_starting_holds_its_room_until_its_start_settles() {
    for start_succeeds in [true, false] {
        let mut f = Fixture::new("spread");
        f.register(1, "w1", 1.0);
        let out = f.submit("a", 1.0);
        let (_, start) = Fixture::sent(&out, "a", "start").expect("a placed");
        f.submit("b", 1.0);
        let out = f.step(Input::Cancel {
            id: "a".into(),
            by: String::new(),
        });
        let (_, stop) = Fixture::sent(&out, "a", "stop").expect("told to stop");
        let out = f.fail(1, &stop, "no container for job a");
        assert!(Fixture::sent(&out, "b", "start").is_none(), "{out:?}");
        if start_succeeds {
            let out = f.ok(1, &start, Fixture::started(1));
            let (_, again) = Fixture::sent(&out, "a", "stop").expect("its container stopped");
            assert!(Fixture::sent(&out, "b", "start").is_none(), "{out:?}");
            let out = f.ok(1, &again, ResultDetail::None);
            assert!(Fixture::sent(&out, "b", "start").is_some(), "{out:?}");
        } else {
            let out = f.fail(1, &start, "image not found");
            assert!(Fixture::sent(&out, "b", "start").is_some(), "{out:?}");
        }
    }
}

/// Under the value policies a job a move is bringing to a worker counts there (its room is
/// held), and cannot be a victim there.
#[test]
fn the_value_allocator_sees_a_job_on_its_way_pinned() {
    let mut f = Fixture::with(policy::by_name("value", &value_settings()).unwrap());
    f.register(1, "w1", 1.0);
    f.start("a", value_job(100.0, 100.0, 1000.0, 2000.0));
    f.register(2, "w2", 1.0);
    let out = f.step(Input::Drain {
        worker: "w1".into(),
    });
    assert!(Fixture::sent(&out, "a", "save").is_some(), "{out:?}");
    let nodes = policy::value::node_states(f.core.view(), &Default::default());
    let on = |n: usize| -> Vec<(String, bool)> {
        (nodes[n].containers.iter())
            .map(|c| (c.job.id.clone(), c.pinned))
            .collect()
    };
    // Saving on w1 and on its way to w2: on both, and a victim on neither.
    assert_eq!(on(0), [("a".to_string(), true)]);
    assert_eq!(on(1), [("a".to_string(), true)], "on its way to w2");
}

#[test]
fn cancel_while_saving_stops_the_source_and_never_restores() {
    let (mut f, save) = Fixture::saving();
    let out = f.step(Input::Cancel {
        id: "a".into(),
        by: String::new(),
    });
    let (conn, stop) = Fixture::sent(&out, "a", "stop").expect("source told to stop");
    assert_eq!((conn, stop.epoch), (1, 1));
    assert_eq!(move_outcome(&out), Some("abandoned"), "{out:?}");
    let out = f.ok(1, &save, Fixture::saved());
    assert!(Fixture::sent(&out, "a", "start").is_none(), "{out:?}");
    assert_eq!(f.state("a"), JobState::Cancelled);
}

#[test]
fn cancel_while_restoring_stops_the_new_incarnation() {
    let (mut f, start) = Fixture::restoring();
    let out = f.step(Input::Cancel {
        id: "a".into(),
        by: String::new(),
    });
    let stops: Vec<(ConnId, u64)> = out
        .iter()
        .filter_map(|e| match e {
            Effect::Send { conn, command, .. } if command.action.name() == "stop" => {
                Some((*conn, command.epoch))
            }
            _ => None,
        })
        .collect();
    assert!(stops.contains(&(2, 2)), "target told to stop: {stops:?}");
    assert_eq!(move_outcome(&out), Some("abandoned"), "{out:?}");
    // The restore's Started arrives late: still cancelled, and a reconnect of w2 reporting the
    // container gets it stopped.
    f.ok(2, &start, Fixture::started(2));
    assert_eq!(f.state("a"), JobState::Cancelled);
    let out = f.reregister(3, "w2", 2.0, &[("a", 2, 0)]);
    assert_eq!(Fixture::sent(&out, "a", "stop").map(|s| s.0), Some(3));
}

/// The user's second bug: a draining worker whose agent dies is declared lost, and its job
/// restarts from the checkpoint elsewhere after the grace period.
#[test]
fn a_worker_whose_heartbeats_are_late_but_that_keeps_talking_is_not_lost() {
    // Under load a heartbeat can wait behind progress on the same stream: any message shows
    // the worker is alive; silence of every kind still loses it.
    let mut f = Fixture::running();
    let e = f.epoch("a");
    for step in 1..=6 {
        f.heartbeat(2);
        f.progress(1, "a", e, step);
        f.advance(1.0);
    }
    assert_eq!(f.core.worker("w1").unwrap().state, WorkerPhase::Ready);
    assert_eq!(f.state("a"), JobState::Running);
    f.only_beating(2, 4);
    assert!(matches!(
        f.core.worker("w1").unwrap().state,
        WorkerPhase::Lost { .. }
    ));
}

#[test]
fn draining_worker_that_goes_silent_is_lost_and_its_job_recovered() {
    let mut f = Fixture::running();
    // w2 has no room: the drain waits.
    f.submit("b", 2.0);
    assert_eq!(
        f.core.job("b").unwrap().worker().map(WorkerId::as_str),
        Some("w2")
    );
    f.step(Input::Drain {
        worker: "w1".into(),
    });
    assert_eq!(f.state("a"), JobState::Running);
    assert!(f.core.job("a").unwrap().reason.contains("draining"));
    // w1's agent is killed: no more heartbeats, stream gone.
    f.step(Input::Disconnected {
        conn: 1,
        reason: "killed".into(),
    });
    f.only_beating(2, 4);
    assert_eq!(
        f.core.worker("w1").unwrap().state,
        WorkerPhase::Lost {
            since: 4.0,
            draining: true
        }
    );
    assert_eq!(f.state("a"), JobState::Lost);
    // b finishes: room on w2, but a is only recovered after the grace period.
    let eb = f.epoch("b");
    f.exited(2, "b", eb, 0, false);
    assert_eq!(f.state("a"), JobState::Lost);
    f.only_beating(2, 10);
    assert_eq!(f.state("a"), JobState::Starting);
    let job = f.core.job("a").unwrap();
    assert_eq!(
        (job.worker().map(WorkerId::as_str), job.epoch),
        (Some("w2"), 2)
    );
    // w1 comes back: still draining, and its stale container of `a` is stopped.
    let out = f.reregister(5, "w1", 2.0, &[("a", 1, 3)]);
    assert_eq!(f.core.worker("w1").unwrap().state, WorkerPhase::Draining);
    let (conn, stop) = Fixture::sent(&out, "a", "stop").expect("stale incarnation stopped");
    assert_eq!((conn, stop.epoch), (5, 1));
}

/// A job of a lost worker waits to start again saying from where and what is lost, and
/// shows the step it starts again from: said to restart "from its checkpoint" though it had
/// none, it was listed at the lost copy's step until its new copy set it back to 0 (a new
/// user's walk).
#[test]
fn a_lost_workers_jobs_say_where_they_start_again_and_what_is_lost() {
    let mut f = Fixture::new("spread");
    f.register(1, "w1", 4.0);
    f.run_all(&["a", "b"], 1.0);
    f.progress(1, "a", 1, 250);
    f.checkpointed(1, "b", 1, 100);
    f.progress(1, "b", 1, 180);
    f.step(Input::Disconnected {
        conn: 1,
        reason: "agent killed".into(),
    });
    for _ in 0..90 {
        f.advance(1.0);
    }
    let (a, b) = (f.core.job("a").unwrap(), f.core.job("b").unwrap());
    assert_eq!(
        (a.state(), b.state()),
        (JobState::Pending, JobState::Pending)
    );
    assert_eq!((a.step, b.step), (0, 100), "where each starts again");
    // What its last state event says (its reason is the wait's since).
    let pending = |job: &str| {
        (f.effects.iter().rev())
            .find_map(|e| match e {
                Effect::Event(ev)
                    if ev.job.as_deref() == Some(job) && ev.to == Some(JobState::Pending) =>
                {
                    Some(ev.reason.clone())
                }
                _ => None,
            })
            .expect("a state event to pending")
    };
    let (a, b) = (pending("a"), pending("b"));
    // Its agent, cut off, may have checkpointed it since (`--fence-after`): said so.
    assert!(
        a.ends_with(
            "restarting from its newest checkpoint: none is known here, but an agent cut off \
             from the manager saves one before it stops its jobs; up to 250 steps lost"
        ),
        "{a}"
    );
    assert!(
        b.ends_with(
            "restarting from its newest checkpoint: step 100 is known here, but an agent cut \
             off from the manager saves one before it stops its jobs; up to 80 steps lost"
        ),
        "{b}"
    );
}

#[test]
fn a_drain_resumes_when_capacity_appears() {
    let mut f = Fixture::running();
    f.submit("b", 2.0);
    f.step(Input::Drain {
        worker: "w1".into(),
    });
    assert_eq!(f.state("a"), JobState::Running, "no room yet");
    let eb = f.epoch("b");
    let out = f.exited(2, "b", eb, 0, false);
    let (conn, _) = Fixture::sent(&out, "a", "save").expect("drain resumed");
    assert_eq!(conn, 1);
    assert_eq!(f.state("a"), JobState::Migrating);
}

#[test]
fn a_drained_worker_that_comes_back_from_lost_drains_again() {
    let mut f = Fixture::running();
    f.submit("b", 2.0);
    f.step(Input::Drain {
        worker: "w1".into(),
    });
    f.only_beating(2, 4);
    assert_eq!(f.state("a"), JobState::Lost);
    let eb = f.epoch("b");
    f.exited(2, "b", eb, 0, false);
    // Heartbeats resume on the same stream before the grace period: the job was never gone,
    // and the drain goes on.
    let out = f.msg(
        1,
        AgentMessage::Heartbeat(Heartbeat {
            jobs: vec![JobStatus {
                job: "a".into(),
                epoch: 1,
                category: None,
                growth_efficiency: None,
                cpu_limit: None,
                cpu_usage: 1.0,
            }],
            ..Heartbeat::default()
        }),
    );
    assert_eq!(f.core.worker("w1").unwrap().state, WorkerPhase::Draining);
    assert!(Fixture::sent(&out, "a", "save").is_some(), "{out:?}");
}

/// Kubernetes' uncordon: an undrained worker takes jobs again, keeps the job the drain could
/// not move yet (which no longer says it waits), and room freed elsewhere moves nothing.
#[test]
fn an_undrained_worker_takes_jobs_again_and_keeps_its_jobs() {
    let mut f = Fixture::running();
    f.submit("b", 2.0);
    f.step(Input::Drain {
        worker: "w1".into(),
    });
    assert!(f.core.job("a").unwrap().reason.contains("draining"));
    let out = f.submit("c", 1.0);
    assert!(Fixture::sent(&out, "c", "start").is_none(), "{out:?}");
    assert_eq!(f.state("c"), JobState::Pending);
    let out = f.step(Input::Undrain {
        worker: "w1".into(),
    });
    assert_eq!(f.core.worker("w1").unwrap().state, WorkerPhase::Ready);
    assert!(
        out.iter().any(|e| matches!(e, Effect::Event(e)
            if e.reason == "undrained by user" && e.worker_state == Some(WorkerState::Ready))),
        "{out:?}"
    );
    let (conn, _) = Fixture::sent(&out, "c", "start").expect("c placed on the undrained worker");
    assert_eq!(conn, 1);
    assert_eq!(f.core.job("a").unwrap().reason, "running on w1");
    // b ends: room on w2, and `a` stays where it is.
    let eb = f.epoch("b");
    let out = f.exited(2, "b", eb, 0, false);
    assert!(Fixture::sent(&out, "a", "save").is_none(), "{out:?}");
    assert_eq!(f.state("a"), JobState::Running);
    // Undraining a ready worker is no change and says nothing.
    let out = f.step(Input::Undrain {
        worker: "w1".into(),
    });
    assert!(
        !out.iter().any(|e| matches!(e, Effect::Event(_))),
        "{out:?}"
    );
    assert!(matches!(out.last(), Some(Effect::Reply(Ok(_)))), "{out:?}");
}

/// `kubectl delete node`: a lost worker is forgotten once the jobs lost with it restarted
/// elsewhere; a ready one, one still holding jobs, or an unknown one is not. The workers after
/// it move down a place, which SpeCon (knowing workers by place) follows, and an agent that
/// registers under its id later is a new worker.
#[test]
fn a_lost_worker_is_forgotten_once_its_jobs_left_it() {
    let mut f = Fixture::new("specon");
    for (conn, w) in [(1, "w0"), (2, "w1"), (3, "w2")] {
        f.register(conn, w, 2.0);
    }
    let conn_a = f.start("a", spec(1.0));
    assert_eq!(conn_a, 1, "spread's first choice");
    let conn_b = f.start("b", spec(1.0));
    let forget = |f: &mut Fixture| {
        let out = f.step(Input::Forget {
            worker: "w0".into(),
        });
        out.last().cloned()
    };
    let refused = |r: Option<Effect>, words: &str| match r {
        Some(Effect::Reply(Err(RequestError::FailedPrecondition(m)))) => {
            assert!(m.contains(words), "{m}")
        }
        other => panic!("expected a refusal saying `{words}`, got {other:?}"),
    };
    refused(
        forget(&mut f),
        "worker w0 is ready: only a lost worker is forgotten",
    );
    f.step(Input::Disconnected {
        conn: 1,
        reason: "host died".into(),
    });
    for _ in 0..4 {
        f.heartbeat_of(conn_b, "b", 1, 1.0);
        f.heartbeat(6 - conn_b);
        f.advance(1.0);
    }
    assert_eq!(f.state("a"), JobState::Lost);
    refused(forget(&mut f), "still holds 1 job(s), lost with it: a");
    // The grace passes: `a` restarts elsewhere, and w0 is empty.
    let mut restarted = None;
    for _ in 0..10 {
        f.heartbeat_of(conn_b, "b", 1, 1.0);
        f.heartbeat(6 - conn_b);
        let out = f.advance(1.0);
        restarted = restarted.or(Fixture::sent(&out, "a", "start"));
    }
    let (conn, start) = restarted.expect("a restarted on w1 or w2");
    f.ok(conn, &start, Fixture::started(2));
    let out = f.step(Input::Forget {
        worker: "w0".into(),
    });
    assert!(matches!(out.last(), Some(Effect::Reply(Ok(Reply::Worker(w)))) if **w == *"w0"));
    assert!(
        out.iter().any(|e| matches!(e, Effect::Event(e)
            if e.reason == "forgotten by user" && e.worker.as_deref() == Some("w0"))),
        "{out:?}"
    );
    assert!(f.core.worker("w0").is_none());
    assert!(
        !f.store.workers.contains_key("w0"),
        "its record left the store"
    );
    assert_eq!(f.core.workers().len(), 2);
    // SpeCon at the new places: a move asked for from w2 (now place 1) is decided on the
    // shifted view (debug builds check SpeCon's incremental state against a full sync).
    f.heartbeat_in(
        conn_b,
        &["b"],
        converge_policy::cluster::Category::CONVERGED,
    );
    f.msg(
        conn_b,
        AgentMessage::MigrationRequest {
            job: "b".into(),
            epoch: 1,
            reason: "converged".into(),
        },
    );
    // Unknown now, as any name no worker has.
    let out = f.step(Input::Forget {
        worker: "w0".into(),
    });
    assert!(matches!(
        out.last(),
        Some(Effect::Reply(Err(RequestError::WorkerNotFound(w)))) if **w == *"w0"
    ));
    // Its agent comes back: a new worker, ready.
    f.reregister(7, "w0", 2.0, &[]);
    assert_eq!(f.core.worker("w0").unwrap().state, WorkerPhase::Ready);
    assert!(f.store.workers.contains_key("w0"));
}

/// A job restarted after its worker was lost, with no checkpoint, shows its new incarnation's
/// step from its first line, even when its Start's answer came first (the walk saw the old
/// copy's step kept for 15 s).
#[test]
fn a_restarted_job_shows_its_new_incarnations_step() {
    let mut f = Fixture::running();
    f.progress(1, "a", 1, 100);
    assert_eq!(f.core.job("a").unwrap().step, 100);
    let conn = f.lose_w1();
    assert_eq!(f.state("a"), JobState::Running);
    f.progress(conn, "a", 2, 5);
    assert_eq!(f.core.job("a").unwrap().step, 5, "from 0, as it restarted");
    f.progress(conn, "a", 2, 9);
    assert_eq!(f.core.job("a").unwrap().step, 9);
}

/// An incarnation superseded while its worker was lost is killed when that worker comes back,
/// not stopped gracefully: the trainer checkpoints on SIGTERM, into the directory the newer
/// incarnation restores from (the walk's find: a later restart resumed from the old copy's
/// state). A job the user cancels is still stopped gracefully.
#[test]
fn a_superseded_incarnation_is_discarded_and_a_cancelled_one_stopped() {
    let mut f = Fixture::running();
    f.lose_w1();
    // w1's agent returns, its container of epoch 1 still running.
    let out = f.reregister(5, "w1", 2.0, &[("a", 1, 100)]);
    let (conn, stop) = Fixture::sent(&out, "a", "stop").expect("the old copy stopped");
    assert_eq!((conn, stop.epoch), (5, 1));
    assert!(
        matches!(&stop.action, Action::Stop { discard: true, .. }),
        "{stop:?}"
    );
    // Said where users look (a walk: two copies ran for 28 s, and only the agent's log said).
    let stray = Fixture::event(&out, EventKind::Stray).expect("a stray event");
    assert_eq!((stray.epoch, stray.worker.as_deref()), (1, Some("w1")));
    assert!(
        stray
            .reason
            .starts_with("incarnation 1 still ran on w1 beside incarnation 2 on w2"),
        "{}",
        stray.reason
    );
    let out = f.step(Input::Cancel {
        id: "a".into(),
        by: String::new(),
    });
    let (_, stop) = Fixture::sent(&out, "a", "stop").expect("the live copy stopped");
    assert_eq!(stop.epoch, 2);
    assert!(
        matches!(&stop.action, Action::Stop { discard: false, .. }),
        "{stop:?}"
    );
    assert_eq!(f.core.job("a").unwrap().reason, "cancelled by user");
}

/// An exit read with a registration and then again as its message leaves the worker's split
/// alone the second time: the split begun anew had every other job's use read from scratch (a
/// review).
#[test]
fn an_exit_read_again_leaves_the_split_alone() {
    let mut f = Fixture::new("spread");
    f.register(1, "w1", 2.0);
    for id in ["a", "b"] {
        f.start(id, spec(1.0));
    }
    f.step(Input::Disconnected {
        conn: 1,
        reason: "cut".into(),
    });
    let done = ContainerExited {
        job: "b".into(),
        epoch: 1,
        done: true,
        ..ContainerExited::default()
    };
    let listed = ContainerReport {
        job: "b".into(),
        epoch: 1,
        container_id: "b-1".into(),
        running: false,
        paused: false,
        last_step: None,
        exit: Some(done),
    };
    f.now += 1.0;
    f.reregister_listing(2, "w1", 2.0, vec![listed, f_running("a")]);
    assert_eq!(f.state("b"), JobState::Completed);
    let split = f.core.worker("w1").unwrap().shared_since;
    f.now += 1.0;
    f.exited(2, "b", 1, 0, false);
    assert_eq!(f.core.worker("w1").unwrap().shared_since, split);
}

/// [`Fixture::running`], then w1's stream breaks and the user cancels `a`.
fn cancelled_while_cut() -> Fixture {
    let mut f = Fixture::running();
    f.step(Input::Disconnected {
        conn: 1,
        reason: "cut".into(),
    });
    f.step(Input::Cancel {
        id: "a".into(),
        by: String::new(),
    });
    f
}

/// `job`'s incarnation 1, listed running.
fn f_running(job: &str) -> ContainerReport {
    ContainerReport {
        job: job.into(),
        epoch: 1,
        container_id: format!("{job}-1"),
        running: true,
        paused: false,
        last_step: None,
        exit: None,
    }
}

/// A container found running where a Stop already went down a live stream is stopping, not a
/// stray: a stop in flight across a reconnection was said and counted as one (a review). A job
/// cancelled while its worker was unreachable, whose agent stopped it meanwhile (fenced), says
/// that it had stopped.
#[test]
fn a_stop_in_flight_is_no_stray_and_a_fenced_cancel_says_it_had_stopped() {
    let mut f = Fixture::running();
    f.step(Input::Cancel {
        id: "a".into(),
        by: String::new(),
    });
    f.step(Input::Disconnected {
        conn: 1,
        reason: "cut".into(),
    });
    let out = f.reregister(5, "w1", 2.0, &[("a", 1, 120)]);
    assert!(
        Fixture::sent(&out, "a", "stop").is_some(),
        "sent again: {out:?}"
    );
    assert!(Fixture::event(&out, EventKind::Stray).is_none(), "{out:?}");

    let mut f = cancelled_while_cut();
    let fenced = ContainerReport {
        running: false,
        ..f_running("a")
    };
    let out = f.reregister_listing(5, "w1", 2.0, vec![fenced]);
    assert!(Fixture::event(&out, EventKind::Stray).is_none(), "{out:?}");
    assert_eq!(
        f.core.job("a").unwrap().reason,
        "cancelled by user; its container on w1 had stopped when w1 came back"
    );
}

/// A job cancelled while its worker's stream is down says that its container stops when the
/// worker is back (a walk: shown cancelled while its container ran on for 35 s), and the
/// container, found running when it is, is stopped and said.
#[test]
fn a_job_cancelled_on_an_unreachable_worker_says_its_stop_waits() {
    let mut f = cancelled_while_cut();
    let reason = &f.core.job("a").unwrap().reason;
    assert_eq!(
        reason,
        "cancelled by user; its container on w1 stops when w1 is back"
    );
    let out = f.reregister(5, "w1", 2.0, &[("a", 1, 120)]);
    assert!(Fixture::sent(&out, "a", "stop").is_some(), "{out:?}");
    // It no longer waits (a walk read the reason after the stop).
    assert_eq!(
        f.core.job("a").unwrap().reason,
        "cancelled by user; its container on w1 was told to stop when w1 came back"
    );
    let stray = Fixture::event(&out, EventKind::Stray).expect("a stray event");
    assert!(
        stray
            .reason
            .starts_with("its container on w1 ran on after it was cancelled"),
        "{}",
        stray.reason
    );
}

/// A lost worker's job that had not started anywhere else (no other worker had room) when its
/// worker came back is re-adopted there with the steps it made, not killed and started from
/// the beginning. Not when its stop reached the worker (a stalled agent whose stream stayed
/// open is stopping it), nor once the user cancelled it.
#[test]
fn a_lost_workers_job_not_yet_restarted_is_readopted_when_the_worker_returns() {
    // `silent`: the agent's stream ends (no stop can reach it) or stays open (the stop is
    // sent down it). `cancel`: the user cancels the job while it waits.
    for (silent, cancel, readopted) in [
        (true, false, true),
        (false, false, false),
        (true, true, false),
    ] {
        let case = format!("stream ended: {silent}, cancelled: {cancel}");
        let mut f = Fixture::new("spread");
        f.register(1, "w1", 2.0);
        let out = f.submit("a", 1.0);
        let (_, start) = Fixture::sent(&out, "a", "start").expect("started");
        f.ok(1, &start, Fixture::started(1));
        f.progress(1, "a", 1, 100);
        if silent {
            f.step(Input::Disconnected {
                conn: 1,
                reason: "network cut".into(),
            });
        }
        for _ in 0..14 {
            f.advance(1.0);
        }
        assert_eq!(f.state("a"), JobState::Pending, "{case}");
        // To restart from the beginning: it has no checkpoint.
        assert_eq!(f.core.job("a").unwrap().step, 0, "{case}");
        if cancel {
            f.step(Input::Cancel {
                id: "a".into(),
                by: String::new(),
            });
        }
        // w1 comes back, its container of epoch 1 still running, at step 150.
        let out = f.reregister(5, "w1", 2.0, &[("a", 1, 150)]);
        let stopped = Fixture::sent(&out, "a", "stop");
        let job = f.core.job("a").unwrap();
        if readopted {
            assert!(stopped.is_none(), "{case}: {stopped:?}");
            assert_eq!(f.state("a"), JobState::Running, "{case}");
            assert_eq!((job.epoch, job.step), (1, 150), "{case}");
            assert!(
                job.reason.contains("no steps lost"),
                "{case}: {}",
                job.reason
            );
            assert!(f.core.worker("w1").unwrap().stops_owed.is_empty(), "{case}");
            // Running, it is placed nowhere else: one Start in all.
            f.advance(1.0);
            assert_eq!(f.starts("a"), 1, "{case}");
        } else {
            let (conn, stop) = stopped.expect("the old copy is stopped");
            assert_eq!((conn, stop.epoch), (5, 1), "{case}");
            assert!(
                matches!(&stop.action, Action::Stop { discard: true, .. }),
                "{case}: {stop:?}"
            );
            assert_ne!(f.state("a"), JobState::Running, "{case}");
        }
    }
}

/// A worker lost while its stream stayed open (its agent stalled, its connection alive) is
/// forgotten with that stream closed, so that the agent, should it wake, registers again.
#[test]
fn forgetting_a_worker_whose_stream_is_open_closes_it() {
    let mut f = Fixture::running();
    // w1 falls silent without its stream ending; a's restart elsewhere empties it.
    for _ in 0..14 {
        f.heartbeat(2);
        f.advance(1.0);
    }
    assert!(matches!(
        f.core.worker("w1").unwrap().state,
        WorkerPhase::Lost { .. }
    ));
    assert_eq!(f.core.worker("w1").unwrap().conn, Some(1));
    assert!(f.core.worker("w1").unwrap().jobs.is_empty());
    let out = f.step(Input::Forget {
        worker: "w1".into(),
    });
    assert!(
        out.iter()
            .any(|e| matches!(e, Effect::Close { conn: 1, worker, .. } if **worker == *"w1")),
        "{out:?}"
    );
    // Anything still said on it is refused, as on any stream no worker owns.
    let out = f.heartbeat(1);
    assert!(
        out.iter().any(|e| matches!(e, Effect::Refused { .. })),
        "{out:?}"
    );
}

/// A worker forgotten, and one registered under its id before SpeCon's next sync: the count
/// of workers is back where it was, yet the places moved twice; SpeCon's next sync must be
/// a full one (debug builds check each sync against a full one). The review's find.
#[test]
fn a_worker_forgotten_and_registered_again_before_a_sync_leaves_specon_in_step() {
    let mut f = Fixture::new("specon");
    f.register(2, "w1", 2.0);
    f.register(3, "w2", 2.0);
    let cb = f.start("b", spec(1.0));
    let cc = f.start("c", spec(1.0));
    assert_ne!(cb, cc);
    // w0, first in the order, cannot take a job of one core.
    f.register(1, "w0", 0.5);
    f.heartbeat_in(cb, &["b"], converge_policy::cluster::Category::CONVERGED);
    f.msg(
        cb,
        AgentMessage::MigrationRequest {
            job: "b".into(),
            epoch: 1,
            reason: "converged".into(),
        },
    );
    f.step(Input::Disconnected {
        conn: 1,
        reason: "host died".into(),
    });
    for _ in 0..10 {
        f.heartbeat_of(cb, "b", 1, 1.0);
        f.heartbeat_of(cc, "c", 1, 1.0);
        f.advance(1.0);
    }
    let out = f.step(Input::Forget {
        worker: "w0".into(),
    });
    assert!(matches!(out.last(), Some(Effect::Reply(Ok(_)))), "{out:?}");
    f.reregister(7, "w0", 0.5, &[]);
    // c's worker asks before any heartbeat since: SpeCon syncs here.
    f.msg(
        cc,
        AgentMessage::MigrationRequest {
            job: "c".into(),
            epoch: 1,
            reason: "converged".into(),
        },
    );
    assert_eq!(f.core.workers().len(), 3);
}

/// A move the drain began goes on after the undrain: its save is on its way, and the job
/// is restored from its checkpoint where the move was going.
#[test]
fn an_undrain_lets_the_move_a_drain_began_finish() {
    let (mut f, save) = Fixture::saving();
    f.step(Input::Undrain {
        worker: "w1".into(),
    });
    assert_eq!(f.core.worker("w1").unwrap().state, WorkerPhase::Ready);
    assert_eq!(f.state("a"), JobState::Migrating);
    let out = f.ok(1, &save, Fixture::saved());
    let (conn, start) = Fixture::sent(&out, "a", "start").expect("restore");
    assert_eq!((conn, start.epoch), (2, 2));
}

/// A drained worker undrained while it is lost comes back ready, not draining.
#[test]
fn a_worker_undrained_while_lost_comes_back_ready() {
    let mut f = Fixture::running();
    f.step(Input::Drain {
        worker: "w1".into(),
    });
    f.step(Input::Disconnected {
        conn: 1,
        reason: "killed".into(),
    });
    f.only_beating(2, 4);
    assert!(matches!(
        f.core.worker("w1").unwrap().state,
        WorkerPhase::Lost { draining: true, .. }
    ));
    f.step(Input::Undrain {
        worker: "w1".into(),
    });
    assert!(matches!(
        f.core.worker("w1").unwrap().state,
        WorkerPhase::Lost {
            draining: false,
            ..
        }
    ));
    f.reregister(5, "w1", 2.0, &[]);
    assert_eq!(f.core.worker("w1").unwrap().state, WorkerPhase::Ready);
}

/// Two agent processes with one `--worker-id`: the second is refused while the first is
/// connected and heard from, and the first keeps its stream (they took it from each other at
/// every reconnect). The same process on a new connection is taken, and so is a new process
/// once the first has been silent for two heartbeats (a restarted agent on a crashed host).
#[test]
fn a_second_agent_process_as_a_connected_worker_is_refused() {
    let mut f = Fixture::running();
    let second = |conn: ConnId, instance: &str| Input::Connected {
        conn,
        register: Register {
            worker: "w1".into(),
            cpu_capacity: 2.0,
            instance_id: instance.into(),
            ..Register::default()
        },
    };
    let out = f.step(second(9, "w1-other"));
    let rejected = out.iter().find_map(|e| match e {
        Effect::Rejected { conn, reason, .. } => Some((*conn, reason.clone())),
        _ => None,
    });
    let (conn, reason) = rejected.expect("the second agent is refused");
    assert_eq!(conn, 9);
    assert!(reason.contains("--worker-id"), "{reason}");
    assert_eq!(Fixture::refused(&out, Refusal::SecondAgent), 1);
    assert!(
        !out.iter().any(|e| matches!(e, Effect::Registered { .. })),
        "{out:?}"
    );
    // The first agent's stream is still the worker's; the refused one's is no one's.
    assert_eq!(f.core.worker("w1").unwrap().conn, Some(1));
    assert_eq!(f.core.worker("w1").unwrap().instance_id, "w1-a");
    assert_eq!(
        Fixture::refused(&f.progress(1, "a", 1, 5), Refusal::StaleStream),
        0
    );
    assert_eq!(
        Fixture::refused(&f.progress(9, "a", 1, 6), Refusal::StaleStream),
        1
    );
    // The same process, reconnecting on a new stream, is taken.
    let out = f.step(second(10, "w1-a"));
    assert!(
        out.iter()
            .any(|e| matches!(e, Effect::Registered { conn: 10, .. })),
        "{out:?}"
    );
    // The first goes silent: after two heartbeats, the second is taken.
    f.only_beating(2, 1);
    assert!(
        f.step(second(11, "w1-other"))
            .iter()
            .any(|e| matches!(e, Effect::Rejected { conn: 11, .. }))
    );
    f.only_beating(2, 2);
    let out = f.step(second(12, "w1-other"));
    assert!(
        out.iter()
            .any(|e| matches!(e, Effect::Registered { conn: 12, .. })),
        "{out:?}"
    );
    assert_eq!(f.core.worker("w1").unwrap().conn, Some(12));
}

/// A job whose Start's result was lost with its agent, and whose container ended before any
/// progress line: it ran, so it has a start (`top` says "never ran" only of jobs that did not).
#[test]
fn a_job_that_ended_while_starting_has_a_start() {
    let mut f = Fixture::new("spread");
    f.register(1, "w1", 2.0);
    let out = f.submit("a", 1.0);
    assert!(Fixture::sent(&out, "a", "start").is_some());
    assert_eq!(f.state("a"), JobState::Starting);
    f.advance(5.0);
    f.agent_restarted_after_its_exit("a", 100, true);
    let job = f.core.job("a").unwrap();
    assert_eq!(job.state(), JobState::Completed);
    assert_eq!(job.started_at.get(), Some(f.now));
}

/// A job that waited for room says why, and how long, in the event of its placement: `why`
/// shows it once the job has left the queue. One placed at once says nothing of waiting.
#[test]
fn a_placement_after_a_wait_says_why_the_job_waited() {
    let mut f = Fixture::running();
    f.submit("b", 2.0);
    let placed = |out: &[Effect], job: &str| {
        out.iter().find_map(|e| match e {
            Effect::Event(e) if e.kind == EventKind::JobPlaced && e.job.as_deref() == Some(job) => {
                Some(e.attributes.clone())
            }
            _ => None,
        })
    };
    f.submit("c", 2.0);
    assert_eq!(f.state("c"), JobState::Pending);
    let reason = f.core.job("c").unwrap().reason.clone();
    assert!(reason.contains("free"), "{reason}");
    // Time passes with no timer (whose liveness check would lose the silent workers).
    f.now += 7.0;
    let eb = f.epoch("b");
    let out = f.exited(2, "b", eb, 0, false);
    let attributes = placed(&out, "c").expect("c placed where b was");
    assert_eq!(attributes.get("waited"), Some(&format!("7s: {reason}")));
    let out = f.submit("d", 0.5);
    let attributes = placed(&out, "d").expect("d placed at once");
    assert_eq!(attributes.get("waited"), None);
}

#[test]
fn restore_failure_retries_on_the_source_then_elsewhere_then_fails() {
    let mut f = Fixture::running();
    f.register(3, "w3", 2.0);
    let (_, save) = {
        let out = f.step(Input::Drain {
            worker: "w1".into(),
        });
        Fixture::sent(&out, "a", "save").unwrap()
    };
    let out = f.ok(1, &save, Fixture::saved());
    let (conn, start) = Fixture::sent(&out, "a", "start").unwrap();
    assert_eq!((conn, start.epoch), (2, 2));
    // Fails on w2: the source is draining, so not the source: w3.
    let out = f.fail(2, &start, "no such image");
    let (conn, start) = Fixture::sent(&out, "a", "start").unwrap();
    assert_eq!((conn, start.epoch), (3, 3));
    assert_eq!(f.state("a"), JobState::Migrating);
    // Fails on w3: attempts left, w2 again.
    let out = f.fail(3, &start, "disk full");
    let (conn, start) = Fixture::sent(&out, "a", "start").unwrap();
    assert_eq!((conn, start.epoch), (2, 4));
    // Third failure: given up, checkpoint kept.
    f.fail(2, &start, "still broken");
    assert_eq!(f.state("a"), JobState::Failed);
    assert!(
        f.core
            .job("a")
            .unwrap()
            .reason
            .contains("checkpoint is kept")
    );
}

/// A drain that finds no room (a job it cannot move yet) changes no snapshot: a backlog
/// waiting for room is not asked again at each submission because of it (a review: the
/// worker hidden from each drain's placement was touched after it, and every submission
/// then asked about every waiting job again).
#[test]
fn a_stuck_drain_does_not_make_the_backlog_be_asked_again() {
    let (policy, asked, _answer) = Scripted::new(false);
    let mut f = Fixture::with(Box::new(policy));
    f.register(1, "w1", 4.0);
    f.start("r0", spec(1.0));
    let take = || std::mem::take(&mut *asked.lock().unwrap());
    take();
    f.step(Input::Drain {
        worker: "w1".into(),
    });
    assert_eq!(f.state("r0"), JobState::Running);
    let touches = f.core.index.touches();
    f.submit("j0", 1.0);
    assert_eq!(take(), vec![JobId::from("j0")]);
    for k in 1..5 {
        f.submit(&format!("j{k}"), 1.0);
        assert_eq!(take(), vec![JobId::from(format!("j{k}"))], "submission {k}");
    }
    assert_eq!(f.core.index.touches(), touches, "no snapshot changed");
}

/// A restore that failed on a worker tries the next best worker, under every policy that
/// moves jobs: the failed one was as good as when it was chosen, and (each policy asked as
/// before) chosen again, refused, the job waited as a new one while another worker had room.
#[test]
fn a_failed_restore_tries_the_next_best_worker_under_every_policy() {
    for name in ["spread", "specon", "converge", "las", "flowcon"] {
        let mut f = Fixture::new(name);
        f.register(1, "w1", 2.0);
        f.register(2, "w2", 2.0);
        for (job, conn) in [("a", 1), ("b", 2)] {
            let out = f.submit(job, 1.0);
            let (to, start) = Fixture::sent(&out, job, "start").expect("started");
            assert_eq!(to, conn, "{name}: {job} placed alone");
            f.ok(conn, &start, Fixture::started(1));
        }
        // An empty worker, first in id order: the drain's target, and after the failure as
        // good as w2 (one job each, a's room held there), and first.
        f.register(3, "w0", 2.0);
        let out = f.step(Input::Drain {
            worker: "w1".into(),
        });
        let (_, save) = Fixture::sent(&out, "a", "save").expect("drain saves");
        let out = f.ok(1, &save, Fixture::saved());
        let (conn, start) = Fixture::sent(&out, "a", "start").expect("restore");
        assert_eq!(conn, 3, "{name}: restored on the empty worker first");
        let out = f.fail(3, &start, "no such image");
        let next = Fixture::sent(&out, "a", "start").map(|(conn, _)| conn);
        assert_eq!(next, Some(2), "{name}: {}", f.core.job("a").unwrap().reason);
        assert_eq!(f.state("a"), JobState::Migrating, "{name}");
    }
}

impl Fixture {
    /// Moves `a` (on w1) to w2, not by a drain (w1 stays schedulable), up to its saved
    /// checkpoint: the restore's Start, sent to w2.
    fn a_saved_for_w2(&mut self) -> Command {
        assert!(
            self.core
                .begin_move("a", "w2", MoveReason::Rebalance, BTreeMap::new())
        );
        let out = std::mem::take(&mut self.core.out);
        let (_, save) = Fixture::sent(&out, "a", "save").unwrap();
        let out = self.ok(1, &save, Fixture::saved());
        Fixture::sent(&out, "a", "start").unwrap().1
    }
}

#[test]
fn restore_prefers_the_source_when_it_can_take_the_job() {
    let mut f = Fixture::running();
    let start = f.a_saved_for_w2();
    let out = f.fail(2, &start, "boom");
    assert_eq!(Fixture::sent(&out, "a", "start").map(|s| s.0), Some(1));
}

/// After a failed restore on the target and a failed retry on the source, the next try goes
/// to a third worker, not to the source again: it just failed there, and a job bounced between
/// the same two workers would spend its attempts on them.
#[test]
fn a_failed_retry_on_the_source_goes_elsewhere_not_to_the_source_again() {
    let mut f = Fixture::running();
    f.run_all(&["b"], 1.0);
    // Empty: the best of the workers other than the source.
    f.register(3, "w3", 2.0);
    let start = f.a_saved_for_w2();
    let out = f.fail(2, &start, "boom");
    let (conn, start) = Fixture::sent(&out, "a", "start").unwrap();
    assert_eq!(conn, 1, "the source first");
    let out = f.fail(1, &start, "boom again");
    assert_eq!(Fixture::sent(&out, "a", "start").map(|s| s.0), Some(3));
}

/// A failed restore goes back to the source only if the job still fits there: a job placed in
/// its room since has it, and a restore there would overbook the source.
#[test]
fn a_failed_restore_skips_a_source_that_filled_up_since() {
    let mut f = Fixture::running();
    let start = f.a_saved_for_w2();
    // All of w1 (w2 holds a's room): b takes the source's room.
    let out = f.submit("b", 2.0);
    assert_eq!(Fixture::sent(&out, "b", "start").map(|s| s.0), Some(1));
    f.register(3, "w3", 2.0);
    let out = f.fail(2, &start, "boom");
    assert_eq!(Fixture::sent(&out, "a", "start").map(|s| s.0), Some(3));
}

#[test]
fn a_failed_save_leaves_the_job_running_where_it_was() {
    let (mut f, save) = Fixture::saving();
    f.fail(1, &save, "container already gone");
    assert_eq!(f.state("a"), JobState::Running);
    assert_eq!(
        f.core.job("a").unwrap().worker().map(WorkerId::as_str),
        Some("w1")
    );
    assert_eq!(f.epoch("a"), 1);
}

/// A save that wrote nothing (0 bytes: an image that exits on SIGTERM without checkpointing)
/// or was killed keeps no later step: the move goes on, told to resume from the checkpoint the
/// job had, and the core does not believe the steps since are kept. A real save does.
#[test]
fn a_save_that_wrote_nothing_keeps_no_step() {
    let reasons = |f: &Fixture| -> Vec<String> {
        f.effects
            .iter()
            .filter_map(|e| match e {
                Effect::Event(e) if e.kind == EventKind::Migration => Some(e.reason.clone()),
                _ => None,
            })
            .collect()
    };
    for (bytes, killed, kept) in [(100, false, Some(10)), (0, false, None), (100, true, None)] {
        let (mut f, save) = Fixture::saving();
        let detail = ResultDetail::Saved {
            step: 10,
            checkpoint_bytes: bytes,
            save_ms: 5,
            killed,
        };
        let out = f.ok(1, &save, detail);
        assert!(
            Fixture::sent(&out, "a", "start").is_some(),
            "the move goes on"
        );
        let job = f.core.job("a").unwrap();
        assert_eq!(job.checkpoint_step, kept, "{bytes} bytes, killed: {killed}");
        let said = reasons(&f);
        let restoring = said.iter().find(|r| r.starts_with("restoring")).unwrap();
        match kept {
            Some(step) => assert!(restoring.contains(&format!("(step {step})")), "{said:?}"),
            None => {
                assert!(restoring.contains("(step 0)"), "{said:?}");
                assert!(
                    said.iter().any(|r| r.contains("resuming from the start")),
                    "{said:?}"
                );
            }
        }
        if bytes == 0 {
            assert!(
                said.iter().any(|r| r.contains("wrote no checkpoint")),
                "{said:?}"
            );
        }
    }
}

/// A move's save never takes the job's checkpoint back: a save reporting an older step than a
/// checkpoint already known keeps the newer one, and a restore told the older step would lose
/// the steps between.
#[test]
fn a_save_of_an_older_step_keeps_the_newer_checkpoint() {
    let (mut f, save) = Fixture::saving();
    f.checkpointed(1, "a", 1, 50);
    // Fixture::saved reports step 10.
    f.ok(1, &save, Fixture::saved());
    assert_eq!(f.core.job("a").unwrap().checkpoint_step, Some(50));
}

#[test]
fn duplicate_and_stale_results_change_nothing() {
    let (mut f, start) = Fixture::restoring();
    f.ok(2, &start, Fixture::started(2));
    assert_eq!(f.state("a"), JobState::Running);
    let before = f.core.job("a").unwrap().clone();
    // The same result again (a replayed answer).
    let out = f.ok(2, &start, Fixture::started(2));
    assert!(
        out.iter()
            .all(|e| !matches!(e, Effect::Event(_) | Effect::Send { .. })),
        "{out:?}"
    );
    // A result and an exit of the superseded incarnation (epoch 1) from the source.
    let stale = Command {
        id: "t-1".into(),
        job: "a".into(),
        epoch: 1,
        action: Action::Start { cpu_shares: 0 },
    };
    f.fail(1, &stale, "late failure");
    f.exited(1, "a", 1, 137, false);
    let after = f.core.job("a").unwrap();
    assert_eq!(after.state(), JobState::Running);
    assert_eq!(
        (after.epoch, after.worker()),
        (before.epoch, before.worker())
    );
}

#[test]
fn first_progress_after_a_restore_records_the_downtime() {
    let (mut f, start) = Fixture::restoring();
    f.now += 0.25;
    f.ok(2, &start, Fixture::started(2));
    assert_eq!(
        f.core.job("a").unwrap().migrations,
        0,
        "not before it trains"
    );
    f.now += 0.25;
    let out = f.progress(2, "a", 2, 11);
    let job = f.core.job("a").unwrap();
    assert_eq!(job.migrations, 1);
    assert_eq!(job.last_migration_downtime.get(), Some(0.5));
    let done = out.iter().any(|e| matches!(e, Effect::Event(ev) if ev.attributes.get("outcome").map(String::as_str) == Some("completed")));
    assert!(done, "{out:?}");
}

/// A job's optional times are stored as they were when they were `Option`s (a number or
/// null, [`OptF64`](super::lifecycle::OptF64)), so a store written before reads the same; a
/// record that lacks one reads it as none, as a missing `Option` did.
#[test]
fn a_stored_job_keeps_its_optional_times() {
    let (mut f, start) = Fixture::restoring();
    f.now += 0.5;
    f.ok(2, &start, Fixture::started(2));
    f.progress(2, "a", 2, 11);
    let job = f.core.job("a").unwrap();
    let text = serde_json::to_string(job).unwrap();
    let mut record: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(record["last_migration_downtime"], serde_json::json!(0.5));
    assert_eq!(record["finished_at"], serde_json::Value::Null);
    assert!(record["started_at"].is_number(), "{text}");
    let back: Job = serde_json::from_str(&text).unwrap();
    assert_eq!(serde_json::to_string(&back).unwrap(), text);
    record.as_object_mut().unwrap().remove("started_at");
    let back: Job = serde_json::from_value(record).unwrap();
    assert!(back.started_at.is_none());
}

/// A new incarnation's first line is where the job is: the step of the checkpoint it really
/// restored, lower than the old incarnation reached when the checkpoint is older (or 0 when
/// there was none). Keeping the old high-water mark would hide a restart from the start.
#[test]
fn the_step_after_a_move_is_where_the_new_incarnation_starts() {
    let mut f = Fixture::running();
    f.progress(1, "a", 1, 12);
    let out = f.step(Input::Drain {
        worker: "w1".into(),
    });
    let (_, save) = Fixture::sent(&out, "a", "save").expect("drain saves");
    // The checkpoint holds step 10 (saved before the line at 12 was sent, say).
    let out = f.ok(1, &save, Fixture::saved());
    let (_, start) = Fixture::sent(&out, "a", "start").expect("restore");
    assert_eq!(f.core.job("a").unwrap().step, 12);
    f.ok(2, &start, Fixture::started(2));
    let out = f.progress(2, "a", 2, 10);
    assert_eq!(f.core.job("a").unwrap().step, 10);
    let said: Vec<&str> = out
        .iter()
        .filter_map(|e| match e {
            Effect::Event(e) => e.attributes.get("step").map(String::as_str),
            _ => None,
        })
        .collect();
    assert_eq!(said, ["10"], "{out:?}");
    // Within the incarnation the step only goes up: a late line changes nothing.
    f.progress(2, "a", 2, 20);
    f.progress(2, "a", 2, 15);
    assert_eq!(f.core.job("a").unwrap().step, 20);
}

/// The first line of a new incarnation sets the step even where the job went back to Pending
/// without `restart` (an exit 0 without its last line): listing the old copy's higher step
/// would hide the steps it has to do again.
#[test]
fn the_first_line_after_an_exit_without_finishing_sets_the_step() {
    let mut f = Fixture::running();
    f.progress(1, "a", 1, 40);
    // Exited 0 at step 40 of 100, unasked, without its `done` line.
    let out = f.exited_0_without_done(1, "a");
    let (conn, start) = Fixture::sent(&out, "a", "start").expect("restarted");
    assert_eq!(start.epoch, 2);
    assert_eq!(f.core.job("a").unwrap().step, 40);
    f.ok(conn, &start, Fixture::started(conn));
    f.progress(conn, "a", 2, 10);
    assert_eq!(f.core.job("a").unwrap().step, 10);
}

// ---- NodeRestriction ----

#[test]
fn an_agent_may_not_speak_of_another_workers_job() {
    let mut f = Fixture::running();
    // w2 claims progress, an exit, a result and a migration request for a (on w1).
    let mut refused = 0;
    refused += Fixture::refused(&f.progress(2, "a", 1, 99), Refusal::ForeignJob);
    refused += Fixture::refused(&f.exited(2, "a", 1, 1, false), Refusal::ForeignJob);
    let fake = Command {
        id: "x".into(),
        job: "a".into(),
        epoch: 1,
        action: Action::Start { cpu_shares: 0 },
    };
    refused += Fixture::refused(&f.fail(2, &fake, "lies"), Refusal::ForeignJob);
    let out = f.msg(
        2,
        AgentMessage::MigrationRequest {
            job: "a".into(),
            epoch: 1,
            reason: "converged".into(),
        },
    );
    refused += Fixture::refused(&out, Refusal::ForeignJob);
    assert_eq!(refused, 4);
    let job = f.core.job("a").unwrap();
    assert_eq!(
        (job.state(), job.step, job.samples),
        (JobState::Running, 0, 0)
    );
    // Unknown jobs are refused too, and a replaced stream's messages.
    assert_eq!(
        Fixture::refused(&f.progress(1, "nope", 1, 1), Refusal::UnknownJob),
        1
    );
    f.register(7, "w1", 2.0);
    assert_eq!(
        Fixture::refused(&f.progress(1, "a", 1, 5), Refusal::StaleStream),
        1
    );
    assert_eq!(f.core.job("a").unwrap().step, 0);
}

// ---- every input kind ----

#[test]
fn finished_jobs_beyond_the_kept_number_are_archived_once_stored() {
    // keep_finished is 2 here: of four finished jobs the two that finished first leave memory,
    // their final records stay in the store, and a restarted core keeps the same two.
    let mut f = Fixture::new("spread");
    f.register(1, "w1", 8.0);
    for id in ["a", "b", "c", "d"] {
        let out = f.submit(id, 1.0);
        let (_, start) = Fixture::sent(&out, id, "start").expect("started");
        f.ok(1, &start, Fixture::started(1));
    }
    for id in ["a", "b", "c", "d"] {
        f.advance(1.0);
        let e = f.epoch(id);
        f.exited(1, id, e, 0, false);
        assert_eq!(f.state(id), JobState::Completed);
        // Its final record is written after the step: it cannot leave memory in that step.
        assert!(
            f.core.job(id).is_some(),
            "{id} archived before it was stored"
        );
        assert!(f.core.jobs().values().filter(|j| j.is_terminal()).count() <= 3);
    }
    f.advance(1.0);
    assert!(f.core.job("a").is_none() && f.core.job("b").is_none());
    assert!(f.core.job("c").is_some() && f.core.job("d").is_some());
    for id in ["a", "b"] {
        assert_eq!(
            f.state(id),
            JobState::Completed,
            "{id} answered from the store"
        );
    }
    f.restart("spread", 5.0);
    assert!(f.core.job("a").is_none() && f.core.job("b").is_none());
    assert_eq!(f.core.job("d").unwrap().state(), JobState::Completed);
}

#[test]
fn submit_validates_through_the_policy_and_places() {
    let mut f = Fixture::new("spread");
    let out = f.submit("a", 1.0);
    assert!(matches!(out.last(), Some(Effect::Reply(Ok(Reply::Job(id)))) if id == "a"));
    assert_eq!(f.state("a"), JobState::Pending);
    assert!(
        f.core.job("a").unwrap().reason.contains("no workers"),
        "{}",
        f.core.job("a").unwrap().reason
    );
    // A duplicate id is refused and creates nothing.
    let out = f.submit("a", 1.0);
    assert!(matches!(
        out.last(),
        Some(Effect::Reply(Err(RequestError::FailedPrecondition(_))))
    ));
    assert_eq!(f.core.jobs().len(), 1);
    // A worker registers: the pending job is placed on it.
    let out = f.register(1, "w1", 2.0);
    assert!(matches!(
        out.first(),
        Some(Effect::Registered { conn: 1, .. })
    ));
    assert_eq!(
        Fixture::sent(&out, "a", "start").map(|s| (s.0, s.1.epoch)),
        Some((1, 1))
    );
    assert_eq!(f.state("a"), JobState::Starting);
}

/// What a test and a policy it scripts both hold.
type Shared<T> = std::sync::Arc<std::sync::Mutex<T>>;

/// What [`Scripted`] answers, set by the test between steps.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Answer {
    /// A wait for room in words of its own each time.
    Room,
    /// A wait for room in the same words each time.
    RoomAsBefore,
    /// A wait the policy does not promise to repeat (its reason may read the time).
    Other,
}

/// A policy that answers what the test says and records which jobs it was asked about: for
/// the core's bookkeeping of whom to ask, which no real policy's answer shows. Jobs whose id
/// starts with `r` it places on the first worker. With `alike`, other jobs of the same size
/// wait alike, but for those whose id starts with `u`, which are of no kind.
struct Scripted {
    asked: Shared<Vec<JobId>>,
    answer: Shared<Answer>,
    alike: bool,
    /// Waits answered so far.
    answered: usize,
    /// How many times the core read a job's kind: once for each job a pass visits.
    visited: Shared<usize>,
}

impl Scripted {
    /// The policy, whom it was asked about, and what it answers.
    fn new(alike: bool) -> (Self, Shared<Vec<JobId>>, Shared<Answer>) {
        let asked = Shared::default();
        let answer = Shared::new(std::sync::Mutex::new(Answer::Room));
        let policy = Scripted {
            asked: asked.clone(),
            answer: answer.clone(),
            alike,
            answered: 0,
            visited: Shared::default(),
        };
        (policy, asked, answer)
    }
}

impl ClusterPolicy for Scripted {
    fn name(&self) -> &'static str {
        "scripted"
    }

    fn place(&mut self, _now: Time, job: &Job, view: ClusterView<'_>) -> Admission {
        self.asked.lock().unwrap().push(job.id.clone());
        match view.workers.keys().next() {
            Some(w) if job.id.starts_with('r') => Admission::Place {
                worker: w.clone(),
                cpu_shares: 0,
                victims: Vec::new(),
                reason: "as scripted".into(),
                attributes: BTreeMap::new(),
            },
            // Each answer in words of its own, so that a test can tell which one a job got.
            _ => {
                self.answered += 1;
                let answer = *self.answer.lock().unwrap();
                Admission::Wait {
                    reason: match answer {
                        Answer::RoomAsBefore => "as scripted, no room".into(),
                        _ => format!("as scripted, answer {}", self.answered),
                    },
                    for_room: answer != Answer::Other,
                }
            }
        }
    }

    fn wait_kind(&self, job: &Job) -> Option<WaitKind> {
        *self.visited.lock().unwrap() += 1;
        // Jobs it places wait unlike the others (once there is a worker, they are placed).
        match self.alike {
            false => None,
            true if job.id.starts_with('r') => Some(WaitKind::class(1)),
            true if job.id.starts_with('u') => None,
            true => WaitKind::request(&job.spec),
        }
    }

    fn place_move(&mut self, _now: Time, _job: &Job, _view: ClusterView<'_>) -> Option<WorkerId> {
        None
    }
}

#[test]
fn a_backlog_waiting_for_room_is_asked_again_only_when_a_workers_snapshot_changes() {
    let (policy, asked, answer) = Scripted::new(false);
    let mut f = Fixture::with(Box::new(policy));
    f.register(1, "w1", 4.0);
    f.start("r0", spec(1.0));
    // Whom the policy was asked about since the last call.
    let take = || std::mem::take(&mut *asked.lock().unwrap());
    let jobs = |ks: std::ops::RangeInclusive<usize>| -> Vec<JobId> {
        ks.map(|k| format!("j{k}").into()).collect()
    };
    assert_eq!(take(), vec![JobId::from("r0")]);
    // Ten submissions that wait for room: each asks about itself only (a pass over the whole
    // backlog at each one asked 55 times).
    for k in 0..10 {
        f.submit(&format!("j{k}"), 1.0);
        assert_eq!(take(), jobs(k..=k), "submission {k}");
    }
    // A wait that is not for room is asked again at the next submission, with the rest.
    *answer.lock().unwrap() = Answer::Other;
    f.submit("j10", 1.0);
    assert_eq!(take(), jobs(10..=10));
    f.submit("j11", 1.0);
    assert_eq!(take(), jobs(0..=11));
    *answer.lock().unwrap() = Answer::Room;
    f.submit("j12", 1.0);
    assert_eq!(take(), jobs(0..=12));
    f.submit("j13", 1.0);
    assert_eq!(take(), jobs(13..=13));
    // Time, and heartbeats that change nothing placement sees, leave the backlog alone.
    for _ in 0..5 {
        f.advance(1.0);
        f.heartbeat_of(1, "r0", 1, 0.7);
    }
    f.submit("j14", 1.0);
    assert_eq!(take(), jobs(14..=14));
    // A heartbeat that changes what r0 shows changes w1's snapshot: the next pass asks every
    // job again.
    f.msg(
        1,
        AgentMessage::Heartbeat(Heartbeat {
            jobs: vec![JobStatus {
                job: "r0".into(),
                epoch: 1,
                category: Some(converge_policy::Category::Watching),
                growth_efficiency: Some(0.5),
                cpu_limit: None,
                cpu_usage: 0.7,
            }],
            ..Heartbeat::default()
        }),
    );
    f.submit("j15", 1.0);
    assert_eq!(take(), jobs(0..=15));
    // So does a job that leaves a worker, and a worker that registers (in their own step).
    f.exited(1, "r0", 1, 0, false);
    assert_eq!(take(), jobs(0..=15));
    f.submit("j16", 1.0);
    assert_eq!(take(), jobs(16..=16));
    f.register(2, "w2", 4.0);
    assert_eq!(take(), jobs(0..=16));
}

/// Once a snapshot changed, a pass asks about one job of each kind that waits alike, and
/// gives the others its answer, until a placement changes a snapshot in the same pass.
#[test]
fn a_pass_asks_about_one_job_of_each_kind_that_waits_alike() {
    let (policy, asked, _) = Scripted::new(true);
    let mut f = Fixture::with(Box::new(policy));
    let take = || std::mem::take(&mut *asked.lock().unwrap());
    let ids = |ks: &[&str]| -> Vec<JobId> { ks.iter().map(|&k| k.into()).collect() };
    // No worker: all wait for room. `r1` is placed once there is a worker.
    for (id, cpus) in [
        ("a1", 1.0),
        ("b2", 2.0),
        ("c1", 1.0),
        ("d2", 2.0),
        ("r1", 1.0),
    ] {
        f.submit(id, cpus);
    }
    for (id, cpus) in [("e1", 1.0), ("f2", 2.0), ("g1", 1.0)] {
        f.submit(id, cpus);
    }
    assert_eq!(
        take(),
        ids(&["a1", "b2", "c1", "d2", "r1", "e1", "f2", "g1"])
    );
    // A worker registers: c1 and d2 are answered as a1 and b2 were; r1 is placed, which
    // changes the worker's snapshot, so the next of each size is asked again.
    f.register(1, "w1", 8.0);
    assert_eq!(take(), ids(&["a1", "b2", "r1", "e1", "f2"]));
    assert_eq!(f.state("r1"), JobState::Starting);
    for id in ["a1", "b2", "c1", "d2", "e1", "f2", "g1"] {
        assert_eq!((id, f.state(id)), (id, JobState::Pending));
    }
    // Each job shows the answer of the job it was answered as, or its own.
    let reason = |id: &str| f.core.job(id).unwrap().reason.clone();
    for (answered, asked) in [("c1", "a1"), ("d2", "b2"), ("g1", "e1")] {
        assert_eq!(reason(answered), reason(asked), "{answered} as {asked}");
    }
    for (after, before) in [("e1", "a1"), ("f2", "b2")] {
        assert_ne!(reason(after), reason(before), "{after} asked again");
    }
    // Another change: one question per size.
    f.register(2, "w2", 8.0);
    assert_eq!(take(), ids(&["a1", "b2"]));
}

/// A pass ends once every kind has had its answer and every job of each holds it already:
/// in a full cluster, a job that ends has the next one placed and one more asked, not every
/// waiting job visited to find it holds the answer it held.
#[test]
fn a_pass_ends_once_every_kind_has_an_answer_all_its_jobs_hold() {
    let mut c = Counted::new();
    // No worker: j0..j99 wait for room, and r1 among them (it is placed once there is one).
    let ids: Vec<String> = (0..100).map(|k| format!("j{k}")).collect();
    for id in &ids[..50] {
        c.f.submit(id, 1.0);
    }
    c.f.submit("r1", 1.0);
    for id in &ids[50..] {
        c.f.submit(id, 1.0);
    }
    // j0 is asked, j1..j32 answered as j0 (a run of 32 jobs of a kind that holds its answer,
    // and the rest of it skipped to the next job of another kind), r1 placed, which changes
    // w1's snapshot: j50 is asked, and its answer is the one every job of its kind holds. 35
    // visits, and r1's kind read once more as it leaves the queue; without the skip 53, and
    // a pass to the end makes 101.
    let (out, n, was_asked) = c.step(connected(1, "w1", 1.0, Register::default().calibration));
    assert_eq!(was_asked, ids_of(&["j0", "r1", "j50"]));
    assert_eq!(n, 36, "kinds read");
    let (conn, start) = Fixture::sent(&out, "r1", "start").expect("r1 placed");
    c.f.ok(conn, &start, Fixture::started(conn));
    // r1 ends: j0 is asked, and that is the pass (a pass to the end visits all 100).
    let exit = Input::Agent {
        conn,
        message: AgentMessage::Exited(ContainerExited {
            job: "r1".into(),
            epoch: start.epoch,
            exit_code: 0,
            done: true,
            ..ContainerExited::default()
        }),
    };
    let (_, n, was_asked) = c.step(exit);
    assert_eq!((was_asked, n), (ids_of(&["j0"]), 1));
    c.all_wait_for_room(ids.iter().map(String::as_str));
}

/// A pass skips a run of jobs whose kind holds its answer to the next job of another kind:
/// a backlog of one kind with another kind's job far back in it had every job before that
/// one visited at every pass.
#[test]
fn a_pass_skips_to_the_next_kind_far_back_in_the_queue() {
    let mut c = Counted::new();
    // No worker: a0..a499 (1 core) and then b0 (2 cores) wait for room.
    let ids: Vec<String> = (0..500).map(|k| format!("a{k}")).collect();
    for id in &ids {
        c.f.submit(id, 1.0);
    }
    c.f.submit("b0", 2.0);
    // A worker's snapshot changes: each kind is asked again. a0 is asked, a1..a32 answered as
    // a0, then the pass skips to b0, asked, and ends: 34 visits, where a pass that visits
    // every job before b0 makes 501.
    let (_, n, was_asked) = c.step(connected(1, "w1", 0.5, 1.0));
    assert_eq!((was_asked, n), (ids_of(&["a0", "b0"]), 34));
    c.all_wait_for_room(ids.iter().map(String::as_str).chain(["b0"]));
}

/// A skip never passes over a job of no kind: the policy promised nothing for it, so it is
/// asked at every pass.
#[test]
fn a_pass_never_skips_a_job_of_no_kind() {
    let mut c = Counted::new();
    for k in 0..100 {
        c.f.submit(&format!("a{k}"), 1.0);
    }
    c.f.submit("u0", 1.0);
    for k in 100..200 {
        c.f.submit(&format!("a{k}"), 1.0);
    }
    let (_, n, was_asked) = c.step(connected(1, "w1", 0.5, 1.0));
    // a0 asked, a run of 32 skipped to u0, asked, and the jobs after it skipped to the end.
    assert_eq!(was_asked, ids_of(&["a0", "u0"]));
    assert!(n < 100, "{n} kinds read");
    c.all_wait_for_room(["u0"]);
}

/// A pass that skips to the end of the queue records, as one that visits every job does,
/// that a kind it gave one answer holds it: a kind whose jobs each held a reason of their own,
/// in front of a run that was skipped, was otherwise visited whole at every pass.
#[test]
fn a_pass_that_skips_to_the_end_records_the_kinds_it_gave_one_answer() {
    let mut c = Counted::new();
    // a0..a99 wait, each for a reason of its own; b0..b99 (2 cores) for one.
    *c.answer.lock().unwrap() = Answer::Room;
    for k in 0..100 {
        c.f.submit(&format!("a{k}"), 1.0);
    }
    *c.answer.lock().unwrap() = Answer::RoomAsBefore;
    for k in 0..100 {
        c.f.submit(&format!("b{k}"), 2.0);
    }
    // a0 asked, a1..a99 given its answer; b0 asked, b1..b32 given its answer, and the rest
    // of b skipped: 133 kinds read.
    let (_, n, was_asked) = c.step(connected(1, "w1", 0.5, 1.0));
    assert_eq!((was_asked, n), (ids_of(&["a0", "b0"]), 133));
    // The a's now hold one answer: their run is skipped too.
    let (_, n, was_asked) = c.step(connected(2, "w2", 0.5, 1.0));
    assert_eq!((was_asked, n), (ids_of(&["a0", "b0"]), 34));
    let all = (0..100).flat_map(|k| [format!("a{k}"), format!("b{k}")]);
    c.all_wait_for_room(all.collect::<Vec<_>>().iter().map(String::as_str));
}

/// A fixture under [`Scripted`] with jobs of one size alike, stepped by hand to count what a
/// pass reads. Each wait is "as scripted, no room" until the test says otherwise (`answer`).
struct Counted {
    f: Fixture,
    visited: Shared<usize>,
    asked: Shared<Vec<JobId>>,
    answer: Shared<Answer>,
}

impl Counted {
    fn new() -> Self {
        let (policy, asked, answer) = Scripted::new(true);
        let visited = policy.visited.clone();
        *answer.lock().unwrap() = Answer::RoomAsBefore;
        let f = Fixture::with(Box::new(policy));
        Counted {
            f,
            visited,
            asked,
            answer,
        }
    }

    /// `input` stepped by hand (the fixture's own checks after a step read every job's kind
    /// too): what it put out, how many kinds the core read, whom the policy was asked about.
    fn step(&mut self, input: Input) -> (Vec<Effect>, usize, Vec<JobId>) {
        *self.visited.lock().unwrap() = 0;
        self.asked.lock().unwrap().clear();
        let out = self.f.core.step(self.f.now, input);
        let n = *self.visited.lock().unwrap();
        (out, n, std::mem::take(&mut *self.asked.lock().unwrap()))
    }

    /// Every job of `ids` waits, told there is no room, as a full pass would have told it:
    /// nothing was skipped that a full pass would have changed.
    fn all_wait_for_room<'a>(&self, ids: impl IntoIterator<Item = &'a str>) {
        for id in ids {
            let j = self.f.core.job(id).unwrap();
            assert_eq!(
                (id, j.state(), j.reason.as_str()),
                (id, JobState::Pending, "as scripted, no room")
            );
        }
        assert!(self.f.core.derived_state_is_fresh());
    }
}

fn ids_of(ks: &[&str]) -> Vec<JobId> {
    ks.iter().map(|&k| k.into()).collect()
}

/// A pass that visits every waiting job and gives every job of a kind one answer leaves the
/// kind known to hold it, though each job held another before: the next pass ends at its
/// first question.
#[test]
fn a_pass_that_gives_a_whole_kind_one_answer_lets_the_next_end_at_once() {
    let mut c = Counted::new();
    // Each job waits for an answer of its own.
    *c.answer.lock().unwrap() = Answer::Room;
    for k in 0..100 {
        c.f.submit(&format!("j{k}"), 1.0);
    }
    *c.answer.lock().unwrap() = Answer::RoomAsBefore;
    let (_, n, _) = c.step(connected(1, "w1", 1.0, Register::default().calibration));
    assert_eq!(n, 100, "every job visited to be given the new answer");
    let (_, n, was_asked) = c.step(connected(2, "w2", 1.0, Register::default().calibration));
    assert_eq!((was_asked, n), (ids_of(&["j0"]), 1));
    assert!(c.f.core.derived_state_is_fresh());
}

/// A pass that finds a backlog waiting for the reasons it waited for changes no record: the
/// store wrote every waiting job again at each pass, one row each, in a full cluster at
/// every job that ended.
#[test]
fn a_job_that_waits_as_before_is_not_stored_again() {
    let mut f = Fixture::new("spread");
    f.register(1, "w1", 1.0);
    f.start("r", spec(1.0));
    for id in ["a", "b", "c"] {
        f.submit(id, 1.0);
    }
    f.core.take_changes();
    // A change of r's category changes w1's snapshot: the next pass asks about a, b and c
    // again, which still wait, for the same reason.
    let before = f.core.job("a").unwrap().reason.clone();
    f.heartbeat_in(1, &["r"], converge_policy::Category::Completing);
    // Stepped by hand, to read what the step changed before the fixture's store takes it.
    let submit = Input::Submit {
        id: "d".into(),
        spec: spec(1.0),
    };
    f.core.step(f.now, submit);
    assert_eq!(f.core.job("a").unwrap().reason, before);
    let changed = f.core.take_changes().jobs;
    assert!(changed.contains("d"), "{changed:?}");
    for id in ["a", "b", "c"] {
        assert!(!changed.contains(id), "{id} stored again: {changed:?}");
    }
}

/// Policy settings under which the value policies can be built (the others ignore them).
fn value_settings() -> PolicyConfig {
    PolicyConfig {
        value: Some(converge_policy::value::ValueConfig::default()),
        ..PolicyConfig::default()
    }
}

/// The promise each policy makes when nothing has room for a job: it waits for room
/// ([`Admission::Wait`]'s `for_room`), which lets the core leave a backlog alone at each
/// submission. With no worker, and with a worker too small for the job.
#[test]
fn every_policy_says_a_job_nothing_has_room_for_waits_for_room() {
    let settings = value_settings();
    let valued = JobSpec {
        cpus: 2.0,
        ..value_job(100.0, 10.0, 200.0, 400.0)
    };
    for &name in policy::POLICIES {
        let mut core = Core::new(config(), policy::by_name(name, &settings).unwrap());
        let mut asked = policy::by_name(name, &settings).unwrap();
        for (id, spec) in [("plain", spec(2.0)), ("valued", valued.clone())] {
            core.step(
                0.0,
                Input::Submit {
                    id: id.into(),
                    spec,
                },
            );
        }
        let wait_for_room = |asked: &mut Box<dyn ClusterPolicy>, core: &Core, id: &str| {
            let answer = asked.place(0.0, core.job(id).unwrap(), core.view());
            assert!(
                matches!(answer, Admission::Wait { for_room: true, .. }),
                "{name} answered {answer:?} for {id}"
            );
        };
        for id in ["plain", "valued"] {
            wait_for_room(&mut asked, &core, id);
        }
        // A worker of one core, which neither job (two) fits. The value policies weigh a
        // valued job against what runs on a schedulable worker: it is not a wait for room.
        core.step(
            0.0,
            Input::Connected {
                conn: 1,
                register: Register {
                    worker: "w1".into(),
                    cpu_capacity: 1.0,
                    instance_id: "w1-a".into(),
                    ..Register::default()
                },
            },
        );
        wait_for_room(&mut asked, &core, "plain");
        if !name.starts_with("value") {
            wait_for_room(&mut asked, &core, "valued");
        }
    }
}

/// The other promise about waiting for room ([`ClusterPolicy::wait_kind`]): jobs a policy
/// says are of one kind get the same wait, reason and all, so that the core can ask about one of
/// them in a pass. Every policy, with no worker, with a drained one, and with one too small.
#[test]
fn jobs_a_policy_says_wait_alike_get_the_same_wait_for_room() {
    let settings = value_settings();
    let valued = |cpus| JobSpec {
        cpus,
        ..value_job(100.0, 10.0, 200.0, 400.0)
    };
    let jobs = [
        ("two", spec(2.0)),
        ("two-more", spec(2.0)),
        ("three", spec(3.0)),
        ("valued-two", valued(2.0)),
        ("valued-three", valued(3.0)),
    ];
    let worker = |id: &str, cpu_capacity| Input::Connected {
        conn: 1,
        register: Register {
            worker: id.into(),
            cpu_capacity,
            instance_id: format!("{id}-a"),
            ..Register::default()
        },
    };
    // No worker; a worker big enough for every job, drained; a worker too small for any.
    let clusters = [
        ("no worker", vec![]),
        (
            "a drained worker",
            vec![
                worker("w0", 8.0),
                Input::Drain {
                    worker: "w0".into(),
                },
            ],
        ),
        ("a worker too small", vec![worker("w1", 1.0)]),
    ];
    for &name in policy::POLICIES {
        let mut asked = policy::by_name(name, &settings).unwrap();
        for (cluster, inputs) in &clusters {
            let mut core = Core::new(config(), policy::by_name(name, &settings).unwrap());
            for input in inputs
                .iter()
                .cloned()
                .chain(jobs.iter().map(|(id, spec)| Input::Submit {
                    id: (*id).into(),
                    spec: spec.clone(),
                }))
            {
                core.step(0.0, input);
            }
            let kinds: BTreeMap<&str, Option<WaitKind>> = (jobs.iter())
                .map(|(id, _)| (*id, asked.wait_kind(core.job(id).unwrap())))
                .collect();
            let alike = |a: &str, b: &str| kinds[a].is_some() && kinds[a] == kinds[b];
            // Not a promise kept by saying nothing: jobs that ask for the same are alike, and
            // jobs that ask for different sizes are not (their reasons name the size).
            assert!(
                alike("two", "two-more"),
                "{name}: two jobs of one spec wait alike"
            );
            assert!(
                !alike("two", "three"),
                "{name}: jobs of two sizes wait alike"
            );
            let mut pairs = 0;
            for (a, _) in &jobs {
                let answer = asked.place(0.0, core.job(a).unwrap(), core.view());
                if !matches!(answer, Admission::Wait { for_room: true, .. }) {
                    continue;
                }
                for (b, _) in jobs.iter().filter(|(b, _)| b != a) {
                    if alike(a, b) {
                        pairs += 1;
                        let other = asked.place(0.0, core.job(b).unwrap(), core.view());
                        assert_eq!(other, answer, "{name}, {cluster}: {b} waits unlike {a}");
                    }
                }
            }
            assert!(
                pairs >= 2,
                "{name}, {cluster}: only {pairs} pairs of alike waits were compared"
            );
        }
    }
}

#[test]
fn value_policy_refuses_a_curve_without_runtime_naming_the_field() {
    let p = policy::by_name("value", &value_settings()).unwrap();
    let mut core = Core::new(config(), p);
    let out = core.step(
        0.0,
        Input::Submit {
            id: "v".into(),
            spec: JobSpec {
                cpus: 1.0,
                value_curve: Some(converge_policy::value::ValueCurve {
                    max_value: 10.0,
                    full_value_until_s: 10.0,
                    zero_value_at_s: 20.0,
                }),
                ..JobSpec::default()
            },
        },
    );
    assert!(
        matches!(
            &out[..],
            [Effect::Reply(Err(RequestError::Invalid {
                field: "spec.estimated_runtime_s",
                ..
            }))]
        ),
        "{out:?}"
    );
    assert!(
        core.jobs().is_empty(),
        "an invalid submission creates nothing"
    );
}

#[test]
fn drain_undrain_or_forget_of_an_unknown_worker_is_not_found() {
    let mut f = Fixture::new("spread");
    let worker = WorkerId::from("nope");
    for input in [
        Input::Drain {
            worker: worker.clone(),
        },
        Input::Undrain {
            worker: worker.clone(),
        },
        Input::Forget { worker },
    ] {
        let out = f.step(input);
        assert!(matches!(
            out.last(),
            Some(Effect::Reply(Err(RequestError::WorkerNotFound(w)))) if **w == *"nope"
        ));
    }
}

#[test]
fn the_policies_that_read_value_curves_say_so() {
    let settings = value_settings();
    for (name, reads) in [
        ("value", true),
        ("value-dwop", true),
        ("converge", true),
        ("las", false),
        ("spread", false),
        ("flowcon", false),
        ("specon", false),
    ] {
        let p = policy::by_name(name, &settings).unwrap();
        assert_eq!(p.reads_value_curves(), reads, "{name}");
    }
}

#[test]
fn cancel_of_an_unknown_job_is_not_found() {
    let mut f = Fixture::new("spread");
    let out = f.step(Input::Cancel {
        id: "nope".into(),
        by: String::new(),
    });
    assert!(matches!(
        out.last(),
        Some(Effect::Reply(Err(RequestError::JobNotFound(_))))
    ));
}

#[test]
fn a_start_lost_with_the_stream_is_resent_with_the_same_id() {
    let mut f = Fixture::new("spread");
    f.register(1, "w1", 2.0);
    let out = f.submit("a", 1.0);
    let (_, start) = Fixture::sent(&out, "a", "start").unwrap();
    f.step(Input::Disconnected {
        conn: 1,
        reason: "reset".into(),
    });
    assert!(f.core.worker("w1").unwrap().conn.is_none());
    let out = f.register(2, "w1", 2.0);
    let (conn, again) = Fixture::sent(&out, "a", "start").expect("re-sent");
    assert_eq!((conn, &again.id, again.epoch), (2, &start.id, 1));
}

#[test]
fn a_reregistering_agent_has_its_running_container_re_adopted() {
    let mut f = Fixture::running();
    f.only_beating(2, 4);
    assert_eq!(f.state("a"), JobState::Lost);
    f.reregister(9, "w1", 2.0, &[("a", 1, 42)]);
    let job = f.core.job("a").unwrap();
    assert_eq!(
        (job.state(), job.epoch, job.step),
        (JobState::Running, 1, 42)
    );
    assert_eq!(f.core.worker("w1").unwrap().state, WorkerPhase::Ready);
}

#[test]
fn a_restarted_core_keeps_its_jobs_readopts_them_and_waits_out_the_grace() {
    let (mut f, save) = Fixture::saving();
    f.submit("b", 2.0);
    f.submit("c", 2.0);
    let before: Vec<_> = ["a", "b", "c"].map(|j| (f.state(j), f.epoch(j))).into();
    f.restart("spread", 5.0);
    let after: Vec<_> = ["a", "b", "c"].map(|j| (f.state(j), f.epoch(j))).into();
    assert_eq!(before, after, "every job as it was, at its epoch");
    assert!(f.core.workers().values().all(|w| w.conn.is_none()));

    // w1 comes back still running the incarnation being saved: the same Save again (its
    // agent answers from its cache), never a second Start.
    let out = f.reregister(11, "w1", 2.0, &[("a", 1, 42)]);
    let (_, again) = Fixture::sent(&out, "a", "save").expect("save re-sent");
    assert_eq!(again.id, save.id);
    assert!(Fixture::sent(&out, "a", "start").is_none());

    // w2 stays silent: not lost within the grace period, lost after it.
    f.only_beating(11, 4);
    assert_eq!(
        f.core.worker("w2").unwrap().state.state(),
        WorkerState::Ready
    );
    f.only_beating(11, 5);
    assert_eq!(
        f.core.worker("w2").unwrap().state.state(),
        WorkerState::Lost
    );
    assert_eq!(
        f.core.worker("w1").unwrap().state.state(),
        WorkerState::Draining
    );
}

/// Killed during a drain's Save, the manager hears the source first: the save is done, and
/// the move waits for its target to register within the grace period instead of giving up
/// the move for a fresh placement (the flake of `durable_docker` (c)).
#[test]
fn a_move_saved_before_its_target_registers_again_restores_there() {
    let (mut f, _save) = Fixture::saving();
    f.restart("spread", 5.0);
    // w1 comes back without a's container: it saved and exited while the manager was down.
    let out = f.reregister(11, "w1", 2.0, &[]);
    assert_eq!(f.state("a"), JobState::Migrating, "{out:?}");
    assert!(
        Fixture::sent(&out, "a", "start").is_none(),
        "w2 has no stream yet"
    );
    let JobPhase::Migrating(m) = &f.core.job("a").unwrap().phase else {
        unreachable!()
    };
    assert!(matches!(m.phase, MovePhase::Restoring { .. }));
    assert_eq!(m.to.as_str(), "w2");
    // w2 registers: the restore's Start, and it is the job's one new incarnation.
    let out = f.reregister(12, "w2", 2.0, &[]);
    let (conn, start) = Fixture::sent(&out, "a", "start").expect("restore sent to w2");
    assert_eq!((conn, start.epoch), (12, 2));
    f.ok(12, &start, Fixture::started(12));
    f.progress(12, "a", 2, 40);
    let events: Vec<_> = f
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::Event(e) if e.kind == EventKind::Migration => Some(e.reason.as_str()),
            _ => None,
        })
        .collect();
    assert!(
        events.iter().any(|r| r.starts_with("resumed on w2")),
        "{events:?}"
    );
    assert_eq!(f.starts("a"), 2, "the first start and the restore");
}

/// Once the grace period is over, a saved move whose target has no stream does not wait
/// for it: the job waits for any worker, from its checkpoint.
#[test]
fn after_the_grace_a_saved_move_does_not_wait_for_a_silent_target() {
    let (mut f, save) = Fixture::saving();
    f.restart("spread", 2.0);
    let out = f.reregister(11, "w1", 2.0, &[("a", 1, 42)]);
    assert!(Fixture::sent(&out, "a", "save").is_some());
    f.heartbeat(11);
    f.advance(3.0);
    f.ok(11, &save, Fixture::saved());
    assert_eq!(f.state("a"), JobState::Pending);
}

#[test]
fn a_restart_with_a_shorter_progress_history_keeps_each_jobs_newest_points() {
    let mut f = Fixture::running();
    for step in 1..=6 {
        f.now += 1.0;
        f.progress(1, "a", 1, step * 10);
    }
    assert_eq!(f.core.job("a").unwrap().progress.len(), 6);
    let short = Config {
        progress_history: 2,
        ..config()
    };
    let p = policy::by_name("spread", &PolicyConfig::default()).unwrap();
    let core = Core::from_saved(short, p, f.store.saved(), f.now, 5.0).unwrap();
    let steps: Vec<u64> = core
        .job("a")
        .unwrap()
        .progress
        .iter()
        .map(|p| p.step)
        .collect();
    assert_eq!(
        steps,
        [50, 60],
        "trimmed at the restart, not as the job reports again"
    );
}

#[test]
fn progress_exit_and_heartbeat_update_the_job() {
    let mut f = Fixture::running();
    f.progress(1, "a", 1, 7);
    f.msg(
        1,
        AgentMessage::Progress(ProgressBatch {
            samples: vec![],
            malformed: vec![Malformed {
                job: "a".into(),
                epoch: 1,
                count: 2,
            }],
        }),
    );
    f.msg(
        1,
        AgentMessage::Heartbeat(Heartbeat {
            jobs: vec![JobStatus {
                job: "a".into(),
                epoch: 1,
                category: Some(converge_policy::Category::Watching),
                growth_efficiency: Some(0.5),
                cpu_limit: Some(0.25),
                cpu_usage: 0.4,
            }],
            alpha: Some(0.1),
            interval_s: Some(20.0),
        }),
    );
    let job = f.core.job("a").unwrap();
    assert_eq!(
        (job.step, job.total_steps, job.samples, job.malformed),
        (7, 100, 1, 2)
    );
    assert_eq!(job.view.cpu_limit, Some(0.25));
    assert_eq!(f.core.worker("w1").unwrap().alpha, Some(0.1));
    f.exited(1, "a", 1, 3, false);
    let job = f.core.job("a").unwrap();
    assert_eq!((job.state(), job.exit_code), (JobState::Failed, Some(3)));
    assert!(job.reason.contains("code 3"));
}

#[test]
fn a_self_fenced_exit_restarts_the_job_from_its_checkpoint() {
    let mut f = Fixture::running();
    let out = f.exited(1, "a", 1, 0, true);
    // Pending, then placed again at once (w1 and w2 both have room): a new incarnation.
    assert_eq!(f.state("a"), JobState::Starting);
    assert_eq!(
        Fixture::sent(&out, "a", "start").map(|s| s.1.epoch),
        Some(2)
    );
}

#[test]
fn a_converged_job_moves_by_specon_alg2_once() {
    let mut f = Fixture::new("specon");
    f.register(1, "w1", 4.0);
    f.register(2, "w2", 4.0);
    // Round-robin: a on w1, b on w2, c on w1.
    f.run_all(&["a", "b", "c"], 1.0);
    assert_eq!(
        f.core.job("c").unwrap().worker().map(WorkerId::as_str),
        Some("w1")
    );
    let request = AgentMessage::MigrationRequest {
        job: "a".into(),
        epoch: 1,
        reason: "converged".into(),
    };
    // Alg. 2: w1 holds a and c (score 4), w2 holds b (2): a moves to w2.
    let out = f.msg(1, request.clone());
    let (conn, _) = Fixture::sent(&out, "a", "save").expect("moved");
    assert_eq!(conn, 1);
    assert_eq!(f.state("a"), JobState::Migrating);
    // Decided once: a repeated request is not acted on.
    let out = f.msg(1, request);
    assert!(Fixture::sent(&out, "a", "save").is_none());
}

/// SpeCon's sync looks only at the jobs touched since the last one; test and debug builds
/// check each against a sync over every worker (`SpeConPolicy::sync` panics where they
/// differ: that check is what fails here). This walks it through each kind of touch between
/// two syncs (every sync here comes with a request): Alg. 2 choosing a worker with no room (it
/// set the job's worker there; the job stays), a job that ends with no heartbeat before the
/// next sync, and one with a heartbeat between, a move and its restore, a job being moved, a
/// worker that registers (shifting the indices SpeCon knows workers by), and lost jobs.
#[test]
fn specon_syncs_follow_every_change_between_them_as_a_full_sync_would() {
    let mut f = Fixture::new("specon");
    f.register(1, "w1", 8.0);
    f.register(2, "w2", 2.0);
    // Round-robin: a, c, e on w1; b, d on w2, which is then full.
    f.run_all(&["a", "b", "c", "d", "e"], 1.0);
    assert_eq!(
        f.core.job("e").unwrap().worker().map(WorkerId::as_str),
        Some("w1")
    );
    f.heartbeat(1);
    f.heartbeat(2);
    let request = |job: &str, epoch| AgentMessage::MigrationRequest {
        job: job.into(),
        epoch,
        reason: "converged".into(),
    };
    // w2 scores lower (two jobs against three) but has no room: a stays.
    let out = f.msg(1, request("a", 1));
    assert!(Fixture::sent(&out, "a", "save").is_none());
    assert!(
        Fixture::event(&out, EventKind::Migration).is_some_and(|e| e.reason.contains("no room")),
        "{out:?}"
    );
    // b ends; no heartbeat before the next request.
    f.exited(2, "b", 1, 0, false);
    assert_eq!(f.state("b"), JobState::Completed);
    // c asks: w2 has room now, and c moves there.
    let out = f.msg(1, request("c", 1));
    let (conn, save) = Fixture::sent(&out, "c", "save").expect("c moves");
    let out = f.ok(conn, &save, Fixture::saved());
    let (conn, start) = Fixture::sent(&out, "c", "start").expect("c restores");
    assert_eq!(conn, 2);
    f.ok(conn, &start, Fixture::started(conn));
    assert_eq!(f.state("c"), JobState::Running);
    // A worker that sorts first registers: every index shifts. e asks and goes to it.
    f.register(3, "w0", 4.0);
    let out = f.msg(1, request("e", 1));
    let (_, save) = Fixture::sent(&out, "e", "save").expect("e moves to the empty w0");
    // a ends and w1's heartbeat comes before the next sync, which finds e on its way (being
    // moved, it keeps its state). c was decided once: its request changes nothing else.
    f.exited(1, "a", 1, 0, false);
    f.heartbeat(1);
    f.msg(2, request("c", 2));
    assert_eq!(f.state("e"), JobState::Migrating);
    let out = f.ok(1, &save, Fixture::saved());
    let (conn, start) = Fixture::sent(&out, "e", "start").expect("e restores");
    assert_eq!(conn, 3);
    f.ok(conn, &start, Fixture::started(conn));
    // w2 falls silent: c and d are lost, and the next sync finds them so.
    for _ in 0..5 {
        f.heartbeat(1);
        f.heartbeat(3);
        f.advance(1.0);
    }
    assert_eq!(
        (f.state("c"), f.state("d")),
        (JobState::Lost, JobState::Lost)
    );
    f.msg(3, request("e", 2));
}

#[test]
fn specon_rebalances_on_its_timer() {
    let mut f = Fixture::new("specon");
    f.register(1, "w1", 8.0);
    f.run_all(&["a", "b", "c", "d"], 1.0);
    f.register(2, "w2", 8.0);
    // a and b report converged.
    f.heartbeat_in(1, &["a", "b"], converge_policy::Category::Completing);
    assert_eq!(
        f.core.next_due(),
        None,
        "the timer starts with the first tick"
    );
    let mut saves = 0;
    for _ in 0..40 {
        f.heartbeat(1);
        f.heartbeat(2);
        let out = f.advance(1.0);
        saves += out
            .iter()
            .filter(
                |e| matches!(e, Effect::Send { command, .. } if command.action.name() == "save"),
            )
            .count();
    }
    // 4 jobs on w1, 0 on w2: bf = 2; one converged job moves (4-1 vs 0+1 still leaves 3 vs
    // 1, the next moves too).
    assert!(saves >= 1, "rebalancing moved nothing");
}

// ---- the property ----

mod model {
    //! Modelled agents: each executes the commands it receives as a real agent would
    //! (fencing by epoch, save stops the container, stop stops it), fences itself when cut off
    //! for longer than its fence time, and reports what runs when it registers again.

    use std::collections::{BTreeMap, BTreeSet, VecDeque};

    use proptest::prelude::*;

    use super::super::*;
    use super::{config, spec};
    use crate::cluster::policy;

    const WORKERS: usize = 3;
    /// The CPUs a submitted job asks for (each worker has 2).
    const SIZES: [f64; 3] = [0.5, 1.0, 1.5];
    /// Each worker's memory.
    const MEMORY: u64 = 4 << 30;
    /// The shapes of a submitted job besides its CPUs ([`shaped`]): plain; asking for 3 GiB,
    /// so that two fit a worker's CPUs but not its memory; with a value curve, which the value
    /// policies place, preempt and drop by, and treat apart from plain jobs.
    const SHAPES: usize = 3;
    /// Shorter than the core's `recover_lost_after` (10 s): the agent's promise.
    const FENCE_AFTER: Time = 4.0;
    /// How long a restarted manager waits for agents before declaring any lost.
    const RESTART_GRACE: Time = 3.0;

    #[derive(Debug, Clone)]
    pub enum Op {
        /// A job asking for `SIZES[i]` CPUs, of shape `j` ([`SHAPES`]): requests differ, so
        /// a small job may fit where a large one waits for room.
        Submit(usize, usize),
        Cancel(usize),
        Drain(usize),
        Undrain(usize),
        /// The user forgets the worker (refused unless it is lost and empty).
        Forget(usize),
        Deliver(usize),
        Drop(usize),
        Finish(usize),
        Disconnect(usize),
        Reconnect(usize),
        Tick,
        /// The manager is killed and starts again from its store; with a worker, that
        /// worker's agent has just carried out a command whose answer dies with the manager.
        Restart(Option<usize>),
        /// The worker's agent asks for its first running job to be moved (SpeCon Alg. 1
        /// line 16; any policy must take it, and SpeCon acts on it).
        Request(usize),
        /// The worker's agent categorizes its first running job converged from its next
        /// heartbeat on (SpeCon's `t_c` is the first such report).
        Converge(usize),
    }

    pub fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            2 => (0..SIZES.len(), 0..SHAPES).prop_map(|(size, shape)| Op::Submit(size, shape)),
            1 => (0..6usize).prop_map(Op::Cancel),
            1 => (0..WORKERS).prop_map(Op::Drain),
            1 => (0..WORKERS).prop_map(Op::Undrain),
            1 => (0..WORKERS).prop_map(Op::Forget),
            8 => (0..WORKERS).prop_map(Op::Deliver),
            1 => (0..WORKERS).prop_map(Op::Drop),
            2 => (0..WORKERS).prop_map(Op::Finish),
            1 => (0..WORKERS).prop_map(Op::Disconnect),
            2 => (0..WORKERS).prop_map(Op::Reconnect),
            4 => Just(Op::Tick),
            1 => proptest::option::of(0..WORKERS).prop_map(Op::Restart),
            1 => (0..WORKERS).prop_map(Op::Request),
            1 => (0..WORKERS).prop_map(Op::Converge),
        ]
    }

    #[derive(Default)]
    struct Agent {
        conn: Option<ConnId>,
        cut_since: Option<Time>,
        inbox: VecDeque<Command>,
        /// job -> epoch of the container that runs.
        running: BTreeMap<JobId, u64>,
        newest: BTreeMap<JobId, u64>,
        outbox: Vec<AgentMessage>,
        /// Incarnations its Alg. 1 found converged (a later one starts afresh).
        converged: BTreeSet<(JobId, u64)>,
    }

    pub fn run(mut ops: Vec<Op>, policy_name: &str) -> Result<(), TestCaseError> {
        // Then the faults stop: every agent comes back on a new stream (a command dropped
        // from a live stream is only ever healed that way) and every command is delivered,
        // so that nothing may be left half-way (checked at the end).
        let random = ops.len();
        ops.extend((0..WORKERS).flat_map(|w| [Op::Disconnect(w), Op::Reconnect(w)]));
        for _ in 0..40 {
            for w in 0..WORKERS {
                ops.extend([Op::Deliver(w), Op::Deliver(w), Op::Deliver(w)]);
            }
            ops.push(Op::Tick);
        }
        // The last tick may have started something (a rebalancing move is due every 60 s):
        // what it sent is delivered, and what that answers, before anything is judged stuck.
        for _ in 0..10 {
            for w in 0..WORKERS {
                ops.extend([Op::Deliver(w), Op::Deliver(w), Op::Deliver(w)]);
            }
        }
        // The value policies read their settings; the others ignore them.
        let settings = super::value_settings();
        let mut core = Core::new(config(), policy::by_name(policy_name, &settings).unwrap());
        core.skip_after = 1;
        // A core that notes no changes (a manager without a store, the simulator), fed the
        // same inputs and archiving when `core` does: it must decide the same, step by step.
        // It also asks the policy about every pending job at every pass (`every_pass_full`),
        // where `core` skips those told to wait for room while no snapshot changed, gives jobs
        // that wait alike one answer, and skips runs of jobs whose kinds hold their answers
        // (here runs of one): no shortcut may change a decision.
        let untracked = || Config {
            record_changes: false,
            ..config()
        };
        let mut twin = Core::new(
            untracked(),
            policy::by_name(policy_name, &settings).unwrap(),
        );
        twin.every_pass_full = true;
        let mut agents: Vec<Agent> = (0..WORKERS).map(|_| Agent::default()).collect();
        let mut now = 0.0;
        let mut next_conn = 0;
        let mut jobs = 0usize;
        let mut cancelled: BTreeSet<JobId> = BTreeSet::new();
        let mut terminal: BTreeMap<JobId, JobState> = BTreeMap::new();
        let mut acknowledged: BTreeSet<JobId> = BTreeSet::new();
        let mut store = super::Shadow::default();
        let mut effects = Vec::new();
        for (w, agent) in agents.iter_mut().enumerate() {
            next_conn += 1;
            agent.conn = Some(next_conn);
            let input = Input::Connected {
                conn: next_conn,
                register: register(w, agent),
            };
            let twin_out = twin.step(now, input.clone());
            let out = core.step(now, input);
            prop_assert_eq!(
                &twin_out,
                &out,
                "a core that notes no changes and asks about every pending job decides otherwise"
            );
            effects.extend(out);
        }
        for (i, op) in ops.into_iter().enumerate() {
            if i == random + 2 * WORKERS {
                // Healing: reconnect even an agent whose drain emptied it.
                for a in agents.iter_mut() {
                    a.cut_since = None;
                }
            }
            let mut inputs = Vec::new();
            match op {
                Op::Submit(size, shape) => {
                    jobs += 1;
                    inputs.push(Input::Submit {
                        id: format!("j{jobs}").into(),
                        spec: shaped(SIZES[size], shape),
                    });
                }
                Op::Cancel(j) => inputs.push(Input::Cancel {
                    id: format!("j{}", j + 1).into(),
                    by: String::new(),
                }),
                Op::Drain(w) => inputs.push(Input::Drain {
                    worker: format!("w{w}").into(),
                }),
                Op::Undrain(w) => inputs.push(Input::Undrain {
                    worker: format!("w{w}").into(),
                }),
                Op::Forget(w) => inputs.push(Input::Forget {
                    worker: format!("w{w}").into(),
                }),
                Op::Deliver(w) => {
                    let a = &mut agents[w];
                    if let Some(c) = a.inbox.pop_front() {
                        execute(a, c);
                    }
                }
                Op::Drop(w) => {
                    agents[w].inbox.pop_front();
                }
                Op::Finish(w) => {
                    let a = &mut agents[w];
                    if let Some((job, epoch)) = a.running.pop_first() {
                        a.outbox.push(AgentMessage::Exited(ContainerExited {
                            job,
                            epoch,
                            exit_code: 0,
                            done: true,
                            ..ContainerExited::default()
                        }));
                    }
                }
                Op::Disconnect(w) => {
                    if let Some(conn) = agents[w].conn.take() {
                        agents[w].cut_since = Some(now);
                        agents[w].inbox.clear();
                        agents[w].outbox.clear();
                        inputs.push(Input::Disconnected {
                            conn,
                            reason: "cut".into(),
                        });
                    }
                }
                Op::Reconnect(w) => {
                    if agents[w].conn.is_none() {
                        next_conn += 1;
                        agents[w].conn = Some(next_conn);
                        agents[w].cut_since = None;
                        inputs.push(Input::Connected {
                            conn: next_conn,
                            register: register(w, &agents[w]),
                        });
                    }
                }
                Op::Restart(deliver) => {
                    if let Some(w) = deliver
                        && let Some(c) = agents[w].inbox.pop_front()
                    {
                        execute(&mut agents[w], c);
                    }
                    // Every stream dies with the manager, and what was on them.
                    for a in agents.iter_mut() {
                        if a.conn.take().is_some() {
                            a.cut_since = Some(now);
                        }
                        a.inbox.clear();
                        a.outbox.clear();
                    }
                    let restart = |config| {
                        Core::from_saved(
                            config,
                            policy::by_name(policy_name, &settings).unwrap(),
                            store.saved(),
                            now,
                            RESTART_GRACE,
                        )
                        .map_err(|e| TestCaseError::fail(e.to_string()))
                    };
                    core = restart(config())?;
                    core.skip_after = 1;
                    twin = restart(untracked())?;
                    twin.every_pass_full = true;
                    store.unsaved = Default::default();
                    for id in &acknowledged {
                        let archived = store.jobs.get(id).is_some_and(Job::is_terminal);
                        prop_assert!(core.job(id).is_some() || archived, "job {} forgotten", id);
                    }
                }
                Op::Request(w) => {
                    let a = &mut agents[w];
                    if let Some((job, &epoch)) = a.running.first_key_value() {
                        a.outbox.push(AgentMessage::MigrationRequest {
                            job: job.clone(),
                            epoch,
                            reason: "converged and shares its worker".into(),
                        });
                    }
                }
                Op::Converge(w) => {
                    let a = &mut agents[w];
                    if let Some((job, &epoch)) = a.running.first_key_value() {
                        a.converged.insert((job.clone(), epoch));
                    }
                }
                Op::Tick => {
                    now += 1.0;
                    for a in agents.iter_mut() {
                        // Self-fencing: cut off too long, the agent stops its containers.
                        if a.cut_since.is_some_and(|t| now - t >= FENCE_AFTER) {
                            a.running.clear();
                        }
                        if a.conn.is_some() {
                            let jobs =
                                a.running
                                    .iter()
                                    .map(|(j, e)| JobStatus {
                                        job: j.clone(),
                                        epoch: *e,
                                        category: a.converged.contains(&(j.clone(), *e)).then_some(
                                            converge_policy::cluster::Category::CONVERGED,
                                        ),
                                        growth_efficiency: None,
                                        cpu_limit: None,
                                        cpu_usage: 1.0,
                                    })
                                    .collect();
                            a.outbox.push(AgentMessage::Heartbeat(Heartbeat {
                                jobs,
                                ..Heartbeat::default()
                            }));
                        }
                    }
                    inputs.push(Input::Tick);
                }
            }
            // Agents' messages go out in order on their streams.
            for a in agents.iter_mut() {
                if let Some(conn) = a.conn {
                    for m in a.outbox.drain(..) {
                        inputs.push(Input::Agent { conn, message: m });
                    }
                }
            }
            for input in inputs {
                let cancel_of = match &input {
                    Input::Cancel { id, .. } => Some(id.clone()),
                    _ => None,
                };
                let submitted = match &input {
                    Input::Submit { id, .. } => Some(id.clone()),
                    _ => None,
                };
                let forgotten = match &input {
                    Input::Forget { worker } => Some(worker.clone()),
                    _ => None,
                };
                let twin_out = twin.step(now, input.clone());
                let out = core.step(now, input);
                store.after_step(&mut core, &out);
                if out.iter().any(Effect::is_observable) {
                    twin.archive();
                }
                prop_assert_eq!(
                    &twin_out,
                    &out,
                    "a core that notes no changes and asks about every pending job decides otherwise"
                );
                prop_assert_eq!(twin.take_changes(), saved::Changes::default());
                // What a waiting job shows its user is the answer of its last question.
                for (id, j) in core
                    .jobs()
                    .iter()
                    .filter(|(_, j)| j.state() == JobState::Pending)
                {
                    let twins = twin.job(id).map(|t| t.reason.as_str());
                    prop_assert_eq!(
                        twins,
                        Some(j.reason.as_str()),
                        "job {} waits for another reason",
                        id
                    );
                }
                prop_assert!(
                    core.derived_state_is_fresh(),
                    "a placement snapshot, a worker's job set, the Lost count or the valued count is out of date"
                );
                if let (Some(id), Some(Effect::Reply(Ok(_)))) = (submitted, out.last()) {
                    acknowledged.insert(id);
                }
                for e in &out {
                    if let Effect::Send { conn, command, .. } = e {
                        // A Start for a job the user cancelled is the bug we guard against.
                        prop_assert!(
                            !(command.action.name() == "start" && cancelled.contains(&command.job)),
                            "Start sent for cancelled job {}",
                            command.job
                        );
                        if let Some(a) = agents.iter_mut().find(|a| a.conn == Some(*conn)) {
                            a.inbox.push_back(command.clone());
                        }
                    }
                }
                if let (Some(id), Some(Effect::Reply(Ok(_)))) = (cancel_of, out.last()) {
                    cancelled.insert(id);
                }
                if let (Some(w), Some(Effect::Reply(Ok(_)))) = (forgotten, out.last()) {
                    prop_assert!(core.worker(&w).is_none(), "worker {} still listed", w);
                }
                effects.extend(out);
                // Nothing leaves a terminal state.
                for (id, j) in core.jobs().iter() {
                    if let Some(t) = terminal.get(id) {
                        prop_assert_eq!(*t, j.state(), "job {} left {:?}", id, t);
                    } else if j.is_terminal() {
                        terminal.insert(id.clone(), j.state());
                    }
                }
                for id in &cancelled {
                    // In memory, or archived with its final record in the store.
                    let j = core.job(id).or_else(|| store.jobs.get(id)).unwrap();
                    prop_assert_eq!(j.state(), JobState::Cancelled);
                }
                // Never two running incarnations of one job, anywhere.
                let mut seen: BTreeMap<&JobId, usize> = BTreeMap::new();
                for a in &agents {
                    for j in a.running.keys() {
                        *seen.entry(j).or_default() += 1;
                    }
                }
                for (j, n) in seen {
                    prop_assert!(n <= 1, "job {} runs {} times", j, n);
                }
            }
        }
        // Healed, nothing is stuck between two states.
        for (id, j) in core.jobs().iter() {
            prop_assert!(
                !matches!(
                    j.state(),
                    JobState::Starting | JobState::Migrating | JobState::Lost | JobState::Stopping
                ),
                "job {} stuck {:?} after every fault healed: {}",
                id,
                j.state(),
                j.reason
            );
        }
        Ok(())
    }

    /// A job of `cpus` and shape `shape` ([`SHAPES`]).
    fn shaped(cpus: f64, shape: usize) -> JobSpec {
        match shape {
            0 => spec(cpus),
            1 => JobSpec {
                memory_bytes: 3 << 30,
                ..spec(cpus)
            },
            _ => JobSpec {
                cpus,
                // Worth its most for 20 s of the model's time and nothing after 60: some
                // finish in time, some are dropped.
                ..super::value_job(10.0, 10.0, 20.0, 60.0)
            },
        }
    }

    fn register(w: usize, a: &Agent) -> Register {
        Register {
            worker: format!("w{w}").into(),
            cpu_capacity: 2.0,
            memory_bytes: MEMORY,
            containers: a
                .running
                .iter()
                .map(|(j, e)| ContainerReport {
                    job: j.clone(),
                    epoch: *e,
                    container_id: format!("{j}-{e}"),
                    running: true,
                    paused: false,
                    last_step: None,
                    exit: None,
                })
                .collect(),
            ..Register::default()
        }
    }

    /// What a real agent does with a command: fence by epoch, then act.
    fn execute(a: &mut Agent, c: Command) {
        let newest = a.newest.get(&c.job).copied().unwrap_or(0);
        let mut result = CommandResult {
            command: c.id.clone(),
            job: c.job.clone(),
            epoch: c.epoch,
            ok: true,
            error: String::new(),
            detail: ResultDetail::None,
        };
        if c.epoch < newest {
            result.ok = false;
            result.error = "stale epoch".into();
            a.outbox.push(AgentMessage::Result(result));
            return;
        }
        a.newest.insert(c.job.clone(), c.epoch);
        match c.action {
            Action::Start { .. } => {
                a.running.insert(c.job.clone(), c.epoch);
                result.detail = ResultDetail::Started {
                    container_id: format!("{}-{}", c.job, c.epoch),
                };
            }
            Action::Save { .. } => {
                if a.running.get(&c.job) == Some(&c.epoch) {
                    a.running.remove(&c.job);
                    result.detail = ResultDetail::Saved {
                        step: 1,
                        checkpoint_bytes: 1,
                        save_ms: 1,
                        killed: false,
                    };
                } else {
                    result.ok = false;
                    result.error = "no such container".into();
                }
            }
            Action::Stop { .. } => {
                if a.running.get(&c.job) == Some(&c.epoch) {
                    a.running.remove(&c.job);
                }
            }
            Action::SetLimits { .. } | Action::Pause | Action::Resume => {}
        }
        a.outbox.push(AgentMessage::Result(result));
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    /// Random interleavings of submissions, cancels, drains, lost and reordered commands,
    /// disconnects, reconnects, manager restarts from the store and time never yield two running incarnations of a job, a
    /// transition out of a terminal state, or a Start for a cancelled job.
    #[test]
    fn no_interleaving_breaks_the_lifecycle(ops in proptest::collection::vec(model::op(), 1..200)) {
        model::run(ops, "spread")?;
    }

    /// The same under Converge's own policy, which sends limits on every heartbeat.
    #[test]
    fn no_interleaving_breaks_the_lifecycle_under_converge(ops in proptest::collection::vec(model::op(), 1..200)) {
        model::run(ops, "converge")?;
    }

    /// The same under SpeCon, whose timer moves jobs on its own.
    #[test]
    fn no_interleaving_breaks_the_lifecycle_under_specon(ops in proptest::collection::vec(model::op(), 1..200)) {
        model::run(ops, "specon")?;
    }

    /// The same under each other policy that needs no value curve in its jobs' specs: each
    /// has its own way of placing, and of saying that a job waits for room.
    #[test]
    fn no_interleaving_breaks_the_lifecycle_under_the_other_policies(
        policy in proptest::sample::select(&["least-allocated", "round-robin", "flowcon", "flowcon-specon", "las"][..]),
        ops in proptest::collection::vec(model::op(), 1..200),
    ) {
        model::run(ops, policy)?;
    }

    /// The same under the value policies, which preempt and drop jobs by their value curves,
    /// with plain jobs among the valued ones.
    #[test]
    fn no_interleaving_breaks_the_lifecycle_under_the_value_policies(
        policy in proptest::sample::select(&["value", "value-dwop"][..]),
        ops in proptest::collection::vec(model::op(), 1..200),
    ) {
        model::run(ops, policy)?;
    }
}

// ---- value-based allocation through the core ----

mod value {
    //! The value policies driven through `Core::step`, with the numbers of the Docker test
    //! (integration-tests/tests/value_docker.rs).

    use super::*;
    use converge_policy::value::{
        PreemptAction, PreemptionConfig, ValueConfig, ValueCurve, VictimCriterion,
    };

    const T0: Time = 1000.0;

    fn fixture(lambda: f64) -> Fixture {
        fixture_with(lambda, PreemptAction::Pause)
    }

    /// [`fixture`] whose victims are dealt with by `action`.
    fn fixture_with(lambda: f64, action: PreemptAction) -> Fixture {
        let config = PolicyConfig {
            value: Some(ValueConfig::dwp(
                1,
                PreemptionConfig {
                    lambda,
                    criterion: VictimCriterion::MinimalRemainingValue,
                    action,
                },
            )),
            ..PolicyConfig::default()
        };
        let mut f = Fixture {
            core: Core::new(
                config_with_grace(),
                policy::by_name("value", &config).unwrap(),
            ),
            now: T0,
            effects: Vec::new(),
            store: Shadow::default(),
        };
        f.register(1, "w1", 1.0);
        f
    }

    fn config_with_grace() -> Config {
        super::config()
    }

    fn submit_value(
        f: &mut Fixture,
        id: &str,
        et: f64,
        (max, full, zero): (f64, f64, f64),
    ) -> Vec<Effect> {
        f.step(Input::Submit {
            id: id.into(),
            spec: JobSpec {
                cpus: 1.0,
                estimated_runtime_s: et,
                value_curve: Some(ValueCurve {
                    max_value: max,
                    full_value_until_s: full,
                    zero_value_at_s: zero,
                }),
                ..JobSpec::default()
            },
        })
    }

    /// L (ET 40 s, worth 10 until it falls to 0 at 100 s) placed on w1, then paused at 3 s
    /// for H (ET 120 s, worth 100), which starts: the numbers of the test below.
    fn l_paused_for_h() -> Fixture {
        let (mut f, out) = h_arrives_beside_l(PreemptAction::Pause);
        assert!(Fixture::sent(&out, "L", "pause").is_some(), "{out:?}");
        let (_, h) = Fixture::sent(&out, "H", "start").expect("H started");
        f.ok(1, &h, Fixture::started(1));
        f
    }

    /// Stopped for good (`--value-preempt stop`), a victim that had run ends Dropped, not
    /// Rejected: REJECTED is for a job refused at admission, which never ran.
    #[test]
    fn a_victim_stopped_for_good_is_dropped() {
        let (f, out) = h_arrives_beside_l(PreemptAction::Stop);
        assert!(Fixture::sent(&out, "L", "stop").is_some(), "{out:?}");
        assert!(Fixture::sent(&out, "H", "start").is_some(), "{out:?}");
        let l = f.core.job("L").unwrap();
        assert_eq!(l.state(), JobState::Dropped);
        assert!(l.reason.starts_with("preempted for job H"), "{}", l.reason);
    }

    /// L placed on w1 and started; at 3 s H arrives, worth enough for L to be its victim
    /// (dealt with by `action`): the fixture and H's arrival's effects.
    fn h_arrives_beside_l(action: PreemptAction) -> (Fixture, Vec<Effect>) {
        let mut f = fixture_with(0.9, action);
        let out = submit_value(&mut f, "L", 40.0, (10.0, 0.0, 100.0));
        let (_, start) = Fixture::sent(&out, "L", "start").expect("L placed");
        f.ok(1, &start, Fixture::started(1));
        f.now = T0 + 3.0;
        let out = submit_value(&mut f, "H", 120.0, (100.0, 0.0, 600.0));
        (f, out)
    }

    /// A job that ran, lost with its worker and turned away when placed again (it can no
    /// longer finish while worth anything) is dropped, not rejected: it ran.
    #[test]
    fn a_lost_job_turned_away_when_placed_again_is_dropped() {
        let mut f = fixture(0.5);
        f.register(2, "w2", 1.0);
        // 40 s of work, worth nothing from 53.5 s: once it has lost 14 s, it cannot make it.
        let out = submit_value(&mut f, "L", 40.0, (10.0, 0.0, 53.5));
        let (conn, start) = Fixture::sent(&out, "L", "start").expect("L placed");
        f.ok(conn, &start, Fixture::started(conn));
        f.step(Input::Disconnected {
            conn,
            reason: "cut".into(),
        });
        for _ in 0..60 {
            if f.core.job("L").unwrap().is_terminal() {
                break;
            }
            f.heartbeat(3 - conn);
            f.advance(1.0);
        }
        let l = f.core.job("L").unwrap();
        assert_eq!((l.state(), l.epoch), (JobState::Dropped, 1), "{}", l.reason);
        assert!(
            l.reason.starts_with("expected value 0 on every worker"),
            "{}",
            l.reason
        );
    }

    /// w1's stream breaks and stays broken past the lost-after: L is Lost.
    fn cut_w1_until_l_is_lost(f: &mut Fixture) {
        f.step(Input::Disconnected {
            conn: 1,
            reason: "cut".into(),
        });
        for _ in 0..5 {
            f.advance(1.0);
        }
        assert_eq!(f.state("L"), JobState::Lost);
    }

    /// The Pause sent to L in [`l_paused_for_h`].
    fn l_pause(f: &Fixture) -> Command {
        (f.effects.iter())
            .find_map(|e| match e {
                Effect::Send { command, .. }
                    if command.job == "L" && command.action.name() == "pause" =>
                {
                    Some(command.clone())
                }
                _ => None,
            })
            .expect("L paused for H")
    }

    /// A failed Pause sent again after the worker came back, the job re-adopted running (its
    /// agent lists it not paused), leaves it running: read by the job's phase, it was taken
    /// for a failed Resume and paused a job that trained on (a review).
    #[test]
    fn a_failed_pause_answered_after_a_readoption_changes_nothing() {
        let mut f = l_paused_for_h();
        let pause = l_pause(&f);
        cut_w1_until_l_is_lost(&mut f);
        f.reregister_listing(
            2,
            "w1",
            1.0,
            vec![running_on_w1("H", false), running_on_w1("L", false)],
        );
        assert_eq!(f.state("L"), JobState::Running);
        f.fail(2, &pause, "OCI runtime pause failed: unable to freeze");
        let reason = &f.core.job("L").unwrap().reason;
        assert_eq!(f.state("L"), JobState::Running, "{reason}");
    }

    /// The answer to a Resume puts back only what a Resume set: a failed one that comes while
    /// the job is paused again (re-adopted paused, say) leaves it paused, not running.
    #[test]
    fn a_failed_resume_answered_while_paused_changes_nothing() {
        let mut f = l_paused_for_h();
        let resume = Command {
            id: "resume-1".into(),
            job: "L".into(),
            epoch: 1,
            action: Action::Resume,
        };
        (f.core.jobs.get_mut("L").unwrap()).freezing = Some(crate::cluster::lifecycle::Freezing {
            command: resume.id.clone(),
            pause: false,
        });
        f.fail(1, &resume, "cannot unpause");
        assert_eq!(f.state("L"), JobState::Paused);
        assert!(f.core.job("L").unwrap().freezing.is_none(), "answered");
    }

    /// A paused job has no ETA: it finishes once it is resumed, which nothing foresees (at the
    /// cores it had, it showed `eta 2s` for as long as it stayed frozen: a new user's walk).
    #[test]
    fn a_paused_job_has_no_eta() {
        let mut f = fixture(0.9);
        let out = submit_value(&mut f, "L", 40.0, (10.0, 0.0, 100.0));
        let (_, start) = Fixture::sent(&out, "L", "start").expect("L placed");
        f.ok(1, &start, Fixture::started(1));
        for s in 1..=3u32 {
            f.now = T0 + f64::from(s);
            f.heartbeat_uses(1, &[("L", 1.0)]);
            f.progress_of(1, "L", 1, 50 * u64::from(s), 1000);
        }
        assert!(f.core.eta("L", f.now).is_some(), "running, it has one");
        let out = submit_value(&mut f, "H", 120.0, (100.0, 0.0, 600.0));
        assert!(Fixture::sent(&out, "L", "pause").is_some(), "{out:?}");
        assert_eq!(f.core.eta("L", f.now), None);
    }

    /// A paused victim on a worker drained and undrained while the job it was paused for
    /// runs on stays paused and says why, not "running on w1" (a review).
    #[test]
    fn an_undrained_paused_victim_says_it_is_paused() {
        let mut f = l_paused_for_h();
        let before = f.core.job("L").unwrap().reason.clone();
        f.step(Input::Drain {
            worker: "w1".into(),
        });
        f.step(Input::Undrain {
            worker: "w1".into(),
        });
        assert_eq!(f.state("L"), JobState::Paused);
        assert_eq!(f.core.job("L").unwrap().reason, before);
    }

    /// `job`'s first incarnation, still there (paused or not), as w1's agent lists it.
    fn running_on_w1(job: &str, paused: bool) -> ContainerReport {
        ContainerReport {
            job: job.into(),
            epoch: 1,
            container_id: format!("{job}-1"),
            running: true,
            paused,
            last_step: Some(10),
            exit: None,
        }
    }

    /// w1's agent fenced both jobs while the manager was away (checkpointed and stopped,
    /// asked for by no manager) and registers again, listing them exited with their exits,
    /// whose messages follow. Both exits are read with the registration: read one by one
    /// after it, H's freed the worker, and the value policy resumed L (its container already
    /// gone), then paused it again for H's new copy, before L's exit was read (a walk).
    #[test]
    fn a_fenced_workers_exits_are_read_with_its_registration() {
        let mut f = l_paused_for_h();
        f.step(Input::Disconnected {
            conn: 1,
            reason: "cut".into(),
        });
        f.advance(1.0);
        let fenced = |job: &str| ContainerExited {
            job: job.into(),
            epoch: 1,
            last_step: Some(10),
            requested: true,
            ..ContainerExited::default()
        };
        let listed = |job: &str| ContainerReport {
            running: false,
            exit: Some(fenced(job)),
            ..running_on_w1(job, false)
        };
        let mut out = f.reregister_listing(2, "w1", 1.0, vec![listed("H"), listed("L")]);
        let l_left = (out.iter()).any(|e| {
            matches!(e, Effect::Event(ev) if ev.job.as_deref() == Some("L")
                && ev.from == Some(JobState::Paused) && ev.to == Some(JobState::Pending))
        });
        assert!(l_left, "L's exit read at registration: {out:?}");
        // The messages that follow change nothing: the jobs have moved on, and w1's split is
        // not begun anew (every other job's use would be read from scratch: a review).
        let before = (f.state("H"), f.state("L"), f.epoch("H"), f.epoch("L"));
        let split = f.core.worker("w1").unwrap().shared_since;
        f.now += 1.0;
        let later = [f.exited(2, "H", 1, 0, true), f.exited(2, "L", 1, 0, true)].concat();
        assert!(
            !later.iter().any(|e| matches!(e, Effect::Event(_))),
            "{later:?}"
        );
        out.extend(later);
        assert!(Fixture::sent(&out, "L", "resume").is_none(), "{out:?}");
        assert_eq!(
            (f.state("H"), f.state("L"), f.epoch("H"), f.epoch("L")),
            before
        );
        assert_eq!(f.core.worker("w1").unwrap().shared_since, split);
    }

    /// A paused victim re-adopted on a worker whose other jobs left while it was away is
    /// resumed there: no departure would come to offer it the room (a review: it stayed
    /// paused on an empty worker until its value ran out).
    #[test]
    fn a_readopted_paused_victim_on_a_worker_with_room_is_resumed() {
        let mut f = l_paused_for_h();
        cut_w1_until_l_is_lost(&mut f);
        f.step(Input::Cancel {
            id: "H".into(),
            by: String::new(),
        });
        let mut out = f.reregister_listing(
            2,
            "w1",
            1.0,
            vec![running_on_w1("H", false), running_on_w1("L", true)],
        );
        // H's container stops as it was told.
        out.extend(f.exited(2, "H", 1, 143, true));
        for _ in 0..10 {
            out.extend(f.advance(1.0));
            out.extend(f.heartbeat(2));
        }
        assert!(Fixture::sent(&out, "L", "resume").is_some(), "{out:?}");
        assert_eq!(f.state("L"), JobState::Running);
    }

    /// A Pause that fails (Docker's freezer did, on a new user's walk) leaves the job running,
    /// and says so; a Resume that fails leaves it paused. Both were said done, with only a
    /// warning in the log: a job shown paused trained on for 80 s.
    #[test]
    fn a_failed_pause_or_resume_leaves_the_job_as_its_container_is() {
        let mut f = l_paused_for_h();
        assert_eq!(f.state("L"), JobState::Paused);
        let pause = l_pause(&f);
        f.fail(1, &pause, "OCI runtime pause failed: unable to freeze");
        assert_eq!(f.state("L"), JobState::Running);
        let reason = &f.core.job("L").unwrap().reason;
        assert!(
            reason.starts_with("could not pause on w1: OCI runtime"),
            "{reason}"
        );

        let mut f = l_paused_for_h();
        f.now = T0 + 5.0;
        let out = f.exited(1, "H", 1, 0, false);
        let (_, resume) = Fixture::sent(&out, "L", "resume").expect("L resumed");
        assert_eq!(f.state("L"), JobState::Running);
        f.fail(1, &resume, "cannot unpause");
        assert_eq!(f.state("L"), JobState::Paused);
        let reason = &f.core.job("L").unwrap().reason;
        assert!(reason.starts_with("could not resume on w1"), "{reason}");
        // The answer to a Pause that went well changes nothing.
        let mut f = l_paused_for_h();
        let pause = l_pause(&f);
        f.ok(1, &pause, ResultDetail::None);
        assert_eq!(f.state("L"), JobState::Paused);
    }

    /// A paused victim whose worker drained while the job it was paused for ended is offered
    /// the room when the worker is undrained (a new user's walk: it stayed paused on an idle
    /// worker until its value ran out), and one on a worker whose stream broke as that job
    /// was cancelled, when the worker registers again.
    #[test]
    fn a_paused_victim_is_offered_the_room_it_missed() {
        let mut f = l_paused_for_h();
        f.step(Input::Drain {
            worker: "w1".into(),
        });
        f.now = T0 + 5.0;
        let out = f.exited(1, "H", 1, 0, false);
        assert!(Fixture::sent(&out, "L", "resume").is_none(), "{out:?}");
        assert_eq!(f.state("L"), JobState::Paused);
        let out = f.step(Input::Undrain {
            worker: "w1".into(),
        });
        assert!(Fixture::sent(&out, "L", "resume").is_some(), "{out:?}");
        assert_eq!(f.state("L"), JobState::Running);

        let mut f = l_paused_for_h();
        f.step(Input::Disconnected {
            conn: 1,
            reason: "cut".into(),
        });
        let out = f.step(Input::Cancel {
            id: "H".into(),
            by: String::new(),
        });
        assert!(Fixture::sent(&out, "L", "resume").is_none(), "{out:?}");
        let mut out = f.reregister_listing(
            2,
            "w1",
            1.0,
            vec![running_on_w1("H", false), running_on_w1("L", true)],
        );
        out.extend(f.exited(2, "H", 1, 143, true));
        assert!(Fixture::sent(&out, "L", "resume").is_some(), "{out:?}");
        assert_eq!(f.state("L"), JobState::Running);
    }

    /// A paused victim on a draining worker is resumed to be saved and moved: a frozen
    /// container cannot save, and the drain waited for it for ever (a new user's walk).
    #[test]
    fn a_drain_resumes_a_paused_victim_to_move_it() {
        let mut f = l_paused_for_h();
        f.register(2, "w2", 4.0);
        let out = f.step(Input::Drain {
            worker: "w1".into(),
        });
        let l: Vec<&str> = (out.iter())
            .filter_map(|e| match e {
                Effect::Send {
                    conn: 1, command, ..
                } if command.job == "L" => Some(command.action.name()),
                _ => None,
            })
            .collect();
        assert_eq!(l, ["resume", "save"], "{out:?}");
        assert!(
            matches!(f.core.job("L").unwrap().phase, JobPhase::Migrating(_)),
            "{:?}",
            f.core.job("L").unwrap().phase
        );
    }

    /// A Pause or Resume lost with its stream is sent again when the agent registers with
    /// the container in the other state: a job said to run stayed frozen (a review).
    #[test]
    fn a_lost_resume_is_sent_again_at_registration() {
        let mut f = l_paused_for_h();
        f.now = T0 + 5.0;
        let out = f.exited(1, "H", 1, 0, false);
        assert!(Fixture::sent(&out, "L", "resume").is_some(), "{out:?}");
        assert_eq!(f.state("L"), JobState::Running);
        // The stream ends before the resume is delivered; the agent lists L still paused.
        f.step(Input::Disconnected {
            conn: 1,
            reason: "cut".into(),
        });
        f.advance(1.0);
        let out = f.reregister_listing(2, "w1", 1.0, vec![running_on_w1("L", true)]);
        assert_eq!(
            Fixture::sent(&out, "L", "resume").map(|(conn, _)| conn),
            Some(2)
        );
        assert_eq!(f.state("L"), JobState::Running);
    }

    /// A paused victim whose worker was lost, and which comes back frozen, is adopted again
    /// as paused, within the grace or after (re-adopted while it waits to restart): taken
    /// for running, its job was said to run while its container stayed frozen (a review).
    #[test]
    fn a_paused_victim_comes_back_paused() {
        for wait in [5, 14] {
            let mut f = l_paused_for_h();
            f.step(Input::Disconnected {
                conn: 1,
                reason: "cut".into(),
            });
            for _ in 0..wait {
                f.advance(1.0);
            }
            f.reregister_listing(
                2,
                "w1",
                1.0,
                vec![running_on_w1("H", false), running_on_w1("L", true)],
            );
            assert_eq!(f.state("L"), JobState::Paused, "after {wait} s");
            assert_eq!(f.state("H"), JobState::Running, "after {wait} s");
            let said = (f.effects.iter().rev()).find_map(|e| match e {
                Effect::Event(ev) if ev.reason.starts_with("re-registered") => {
                    Some(ev.reason.clone())
                }
                _ => None,
            });
            assert_eq!(
                said.as_deref(),
                Some("re-registered with 2 containers, 1 running, 1 paused (agent restarted)")
            );
        }
    }

    /// L (ET 40 s, worth 10 falling to 0 at 100 s) has run 3 s of its 40 when H (ET 120 s, worth
    /// 100 falling to 0 at 600 s) arrives on the one 1-CPU worker (the numbers of the Docker
    /// tests' `low_value_spec` and `high_value_spec`). With λ = 0.9 the worker is
    /// overloaded (β = 0.6), and pausing L gives H the whole CPU: DwP pauses L, starts H with
    /// its share, and resumes L when H is gone.
    #[test]
    fn a_high_value_arrival_pauses_the_low_value_job_which_resumes_after() {
        let mut f = fixture(0.9);
        let out = submit_value(&mut f, "L", 40.0, (10.0, 0.0, 100.0));
        let (_, start) = Fixture::sent(&out, "L", "start").expect("L placed");
        f.ok(1, &start, Fixture::started(1));
        f.now = T0 + 3.0;
        f.msg(
            1,
            AgentMessage::Progress(ProgressBatch {
                samples: vec![ProgressSample {
                    job: "L".into(),
                    epoch: 1,
                    unix_ms: (f.now * 1000.0) as i64,
                    step: 150,
                    total_steps: Some(1000),
                    value: None,
                    checkpointed: false,
                }],
                malformed: vec![],
            }),
        );
        let out = submit_value(&mut f, "H", 120.0, (100.0, 0.0, 600.0));
        assert!(Fixture::sent(&out, "L", "pause").is_some(), "{out:?}");
        let l = f.core.job("L").unwrap();
        assert_eq!(l.state(), JobState::Paused);
        assert!(l.reason.starts_with("preempted for job H"), "{}", l.reason);
        let (_, h_start) = Fixture::sent(&out, "H", "start").expect("H started");
        let Action::Start { cpu_shares } = h_start.action else {
            unreachable!()
        };
        assert!(cpu_shares > 0);
        let placed = out.iter().find_map(|e| match e {
            Effect::Event(ev) if ev.kind == EventKind::JobPlaced => Some(ev.clone()),
            _ => None,
        });
        let placed = placed.expect("a placement event");
        assert_eq!(placed.attributes["cpu_shares"], cpu_shares.to_string());
        // A Start sent again after a reconnect carries the same share.
        // (The agent reports the paused L, not H, whose Start it never got.)
        let out = f.reregister(2, "w1", 1.0, &[("L", 1, 150)]);
        assert_eq!(f.state("L"), JobState::Paused);
        let (_, again) = Fixture::sent(&out, "H", "start").expect("re-sent");
        assert_eq!(again.action, Action::Start { cpu_shares });
        f.ok(2, &again, Fixture::started(2));
        // H is done 5 s later: L resumes, with a share.
        f.now = T0 + 8.0;
        let out = f.exited(2, "H", 1, 0, false);
        assert!(Fixture::sent(&out, "L", "resume").is_some(), "{out:?}");
        assert!(Fixture::sent(&out, "L", "set_limits").is_some());
        assert_eq!(f.state("L"), JobState::Running);
    }

    /// The same arrival while L still starts: L cannot be paused yet, so it is no victim (it
    /// was picked, its pause refused, and H started with a share sized for L's absence).
    /// H is weighed beside L as it is: on the one worker, with no victim, and L not paused.
    #[test]
    fn a_job_still_starting_is_no_victim() {
        let mut f = fixture(0.9);
        let out = submit_value(&mut f, "L", 40.0, (10.0, 0.0, 100.0));
        assert!(Fixture::sent(&out, "L", "start").is_some(), "L placed");
        f.now = T0 + 3.0;
        let out = submit_value(&mut f, "H", 120.0, (100.0, 0.0, 600.0));
        assert!(Fixture::sent(&out, "L", "pause").is_none(), "{out:?}");
        assert!(
            !out.iter().any(|e| matches!(e, Effect::Refused { .. })),
            "a refused transition: {out:?}"
        );
        assert_eq!(f.state("L"), JobState::Starting);
    }

    #[test]
    fn a_job_worth_nothing_anywhere_is_rejected_and_never_started() {
        let mut f = fixture(0.5);
        // ET 60 s but worthless after 5 s.
        let out = submit_value(&mut f, "Z", 60.0, (100.0, 0.0, 5.0));
        assert!(Fixture::sent(&out, "Z", "start").is_none());
        let z = f.core.job("Z").unwrap();
        assert_eq!((z.state(), z.epoch), (JobState::Rejected, 0));
        assert!(
            z.reason.starts_with("expected value 0 on every worker"),
            "{}",
            z.reason
        );
        assert_eq!(z.finished_at.get(), Some(T0));
    }

    #[test]
    fn a_job_whose_value_reached_zero_is_dropped_on_a_tick() {
        let mut f = fixture(0.5);
        let out = submit_value(&mut f, "D", 20.0, (10.0, 0.0, 40.0));
        let (_, start) = Fixture::sent(&out, "D", "start").unwrap();
        f.ok(1, &start, Fixture::started(1));
        // It never progresses; at 41 s its value is zero.
        f.only_beating(1, 41);
        let d = f.core.job("D").unwrap();
        // Dropped, not Rejected: it was admitted and ran.
        assert_eq!(d.state(), JobState::Dropped);
        assert!(d.reason.contains("zero"), "{}", d.reason);
        assert!(
            f.effects.iter().any(|e| matches!(e, Effect::Send { command, .. } if command.job == "D" && command.action.name() == "stop")),
            "its container is stopped"
        );
    }

    #[test]
    fn jobs_without_a_curve_are_placed_by_spread_with_default_shares() {
        let mut f = fixture(0.5);
        let out = f.submit("plain", 1.0);
        let (_, start) = Fixture::sent(&out, "plain", "start").unwrap();
        assert_eq!(start.action, Action::Start { cpu_shares: 0 });
    }
}

// ---- converge and las: limits from the manager ----

/// The CFS weight last sent for `job`, if any.
fn shares_sent(f: &Fixture, job: &str) -> Option<u32> {
    f.effects.iter().rev().find_map(|e| match e {
        Effect::Send { command, .. } if command.job == job => match command.action {
            Action::SetLimits { cpu_shares, .. } if cpu_shares > 0 => Some(cpu_shares),
            _ => None,
        },
        _ => None,
    })
}

/// Under `converge` the job a worker serves first keeps its weight until another's work left
/// is 10% below its own, not at the first second it is below (two alike jobs swapped at
/// every heartbeat on the testbed). Here b alone uses the core, a idles: b's declared work
/// left falls a core-second a second from 100, a's stays at 99.
#[test]
fn converge_keeps_the_first_job_first_until_another_is_clearly_shorter() {
    let mut f = Fixture::new("converge");
    f.register(1, "w1", 1.0);
    for (id, work) in [("a", 99.0), ("b", 100.0)] {
        let spec = JobSpec {
            cpus: 0.5,
            estimated_runtime_s: work,
            ..JobSpec::default()
        };
        f.start(id, spec);
    }
    let first = |f: &Fixture| match (shares_sent(f, "a"), shares_sent(f, "b")) {
        (Some(a), Some(b)) if a > b => "a",
        (Some(a), Some(b)) if b > a => "b",
        other => panic!("no order: {other:?}"),
    };
    f.heartbeat_uses(1, &[("a", 0.0), ("b", 1.0)]);
    assert_eq!(first(&f), "a");
    for s in 1..=20 {
        f.now += 1.0;
        f.heartbeat_uses(1, &[("a", 0.0), ("b", 1.0)]);
        // b's 100 - s is 10% below a's 99 from s = 11 on.
        let expected = if s < 11 { "a" } else { "b" };
        assert_eq!(first(&f), expected, "after {s} s");
    }
}

/// Under `las` too the job served first keeps its place until another has had 10% less
/// service: the job served first gains service fastest, and two jobs of about equal service
/// swapped the first place every few seconds (a new user's walk). Here b runs alone for 10 s,
/// then a runs while b idles.
#[test]
fn las_keeps_the_first_job_first_until_another_has_had_clearly_less() {
    let mut f = Fixture::new("las");
    f.register(1, "w1", 1.0);
    for id in ["a", "b"] {
        f.start(
            id,
            JobSpec {
                cpus: 0.5,
                ..JobSpec::default()
            },
        );
    }
    let first = |f: &Fixture| match (shares_sent(f, "a"), shares_sent(f, "b")) {
        (Some(a), Some(b)) if a > b => "a",
        (Some(a), Some(b)) if b > a => "b",
        other => panic!("no order: {other:?}"),
    };
    for _ in 0..10 {
        f.now += 1.0;
        f.heartbeat_uses(1, &[("a", 0.0), ("b", 1.0)]);
    }
    assert_eq!(first(&f), "a", "a has had none");
    for s in 1..=20 {
        f.now += 1.0;
        f.heartbeat_uses(1, &[("a", 1.0), ("b", 0.0)]);
        // A heartbeat counts the use since the one before: a has had s - 1 core-s, and b's 10
        // are 10% below that from s = 13 on (at 12, 10 against 11 is 9% below).
        let expected = if s < 13 { "a" } else { "b" };
        assert_eq!(first(&f), expected, "after {s} s");
    }
}

/// Lines of an earlier incarnation, flushed by a lost worker's agent after the job restarted
/// elsewhere, are no points of the current run (its throughput read them as its own), but
/// their checkpoint counts.
#[test]
fn an_earlier_incarnations_late_lines_are_no_points_of_the_current_run() {
    let mut f = Fixture::running();
    f.progress(1, "a", 1, 100);
    let conn = f.lose_w1();
    f.progress(conn, "a", 2, 10);
    f.reregister(5, "w1", 2.0, &[]);
    let before = f.core.job("a").unwrap().progress.iter().count();
    f.checkpointed(5, "a", 1, 150);
    f.progress(5, "a", 1, 160);
    let job = f.core.job("a").unwrap();
    assert_eq!(job.progress.iter().count(), before, "no point added");
    assert!(job.progress.iter().all(|p| p.epoch == 2 || p.step <= 100));
    assert_eq!(job.checkpoint_step, Some(150));
}

/// Two jobs share a one-core worker: `near` is at step 800 of 1000 and has had most of the CPU
/// so far, `far` at step 0. Under `converge` the job with the least predicted work left (near)
/// gets the weight for what the guard leaves; under `las` the one with the least service so
/// far (far) does. No quota is set: what the favoured job cannot use goes to the other.
#[test]
fn converge_gives_the_shortest_predicted_job_the_cpu_and_las_the_least_served() {
    use crate::cluster::policy::priority::{BETA, LADDER};
    for (policy, favoured, other) in [("converge", "near", "far"), ("las", "far", "near")] {
        let mut f = Fixture::new(policy);
        f.register(1, "w1", 1.0);
        for id in ["near", "far"] {
            f.start(id, spec(0.5));
        }
        // `warm`: near uses 0.9 of the core and far 0.1, whatever their weights (the history
        // before); then each uses its weight's part of the core. Each second both advance 10
        // steps.
        let heartbeat = |f: &mut Fixture, warm: bool| {
            let (a, b) = (shares_sent(f, "near"), shares_sent(f, "far"));
            let use_of = |mine: Option<u32>, default: f64| match (mine, a.zip(b)) {
                (Some(m), Some((a, b))) if !warm => f64::from(m) / f64::from(a + b),
                _ => default,
            };
            f.heartbeat_uses(1, &[("near", use_of(a, 0.9)), ("far", use_of(b, 0.1))])
        };
        for _ in 0..=20 {
            heartbeat(&mut f, true);
            f.now += 1.0;
        }
        for i in 1..=10u64 {
            f.now += 1.0;
            f.progress_of(1, "near", 1, 800 + 10 * i, 1000);
            f.progress_of(1, "far", 1, 10 * i, 1000);
            heartbeat(&mut f, false);
        }
        // Each has the guard, 1/(β·n) of the core; of the rest the favoured job has the first
        // rank's part of the ladder, the other what remains.
        let guard = 1.0 / (BETA * 2.0);
        let rest = 1.0 - 2.0 * guard;
        let weight = |cores: f64| (1024.0 * cores / 0.5).round() as u32;
        assert_eq!(
            shares_sent(&f, favoured),
            Some(weight(guard + rest * (1.0 - 1.0 / LADDER))),
            "{policy}: {favoured} favoured"
        );
        assert_eq!(
            shares_sent(&f, other),
            Some(weight(guard + rest / LADDER)),
            "{policy}: {other} second"
        );
        // No quota: the weights are all that is set.
        assert!(f.core.job(favoured).unwrap().assigned_cpus.is_none());
        let sent = f.effects.iter().filter(|e| matches!(e, Effect::Send { command, .. } if command.action.name() == "set_limits")).count();
        assert!(
            sent <= 8,
            "{policy}: weights re-sent on every heartbeat ({sent})"
        );
        // Every weight sent is recorded with its reason (what `why` shows): the favoured job's
        // last one says it is first of two, with the numbers behind it.
        let limits: Vec<&Event> = f
            .effects
            .iter()
            .filter_map(|e| match e {
                Effect::Event(ev) if ev.kind == EventKind::Limits => Some(ev),
                _ => None,
            })
            .collect();
        assert_eq!(limits.len(), sent, "{policy}: one event per weight sent");
        let last = limits
            .iter()
            .rev()
            .find(|e| e.job.as_deref() == Some(favoured))
            .expect("the favoured job's weight is recorded");
        assert!(
            last.reason.starts_with(&format!("{policy}, least "))
                && last.reason.contains("rank 1 of 2 on w1")
                && last.reason.contains(" core-s "),
            "{policy}: {}",
            last.reason
        );
        assert_eq!(
            last.attributes["cpu_shares"],
            shares_sent(&f, favoured).unwrap().to_string()
        );
        assert!(
            last.attributes.contains_key("key_core_s"),
            "{:?}",
            last.attributes
        );
        assert_eq!(last.worker.as_deref(), Some("w1"));
        if policy == "converge" {
            // The ETA runs the worker forward under this split: `far` is held at its rank's
            // part only until `near` ends, then has the whole core. At the part it has now it
            // would be forecast far later.
            let (c_near, c_far) = (guard + rest * (1.0 - 1.0 / LADDER), guard + rest / LADDER);
            let work = |id: &str| {
                let view = f.core.view();
                view.estimate(f.core.job(id).unwrap()).unwrap().work
            };
            let t1 = work("near") / c_near;
            let want_far = t1 + (work("far") - c_far * t1);
            let (near, far) = (
                f.core.eta("near", f.now).unwrap(),
                f.core.eta("far", f.now).unwrap(),
            );
            assert!(
                (near.remaining_s - t1).abs() < 1e-6 * t1,
                "{near:?}, want {t1}"
            );
            assert!(
                (far.remaining_s - want_far).abs() < 1e-6 * want_far,
                "{far:?}, want {want_far}"
            );
            assert!(far.remaining_s < 0.5 * work("far") / c_far, "{far:?}");
            assert_eq!(far.finish_at, f.now + far.remaining_s);
        }
    }
}

/// Under `converge` a job's value curve is in the same loop: a job that could only finish after
/// its value reaches zero is rejected at admission, saying when it would finish; one already
/// placed is given up when its value reaches zero.
#[test]
fn converge_rejects_a_job_worthless_by_its_finish_and_drops_one_whose_value_ran_out() {
    let mut f = Fixture::new("converge");
    f.register(1, "w1", 1.0);
    // 100 s of work on one core, worthless from 50 s: rejected, nothing started.
    let reason = f.rejected("late", value_job(100.0, 10.0, 0.0, 50.0));
    assert!(
        reason.contains("finish 100 s after submission")
            && reason.contains("worth 0.0 of its value 10.0"),
        "{reason}"
    );
    // 10 s of work worth something until 60 s: placed; still running at 60 s, it is given up.
    let submitted = f.now;
    f.start("ok", value_job(10.0, 10.0, 0.0, 60.0));
    // Its agent never reports its CPU use, so what it has left is not known to shrink: it is
    // not given up early on its user's estimate (10 s, which would put its soonest finish past
    // 60 s from 50 s on), but once 60 s have passed since its submission, not before.
    let at = f
        .stopped_within(1, "ok", None, 70)
        .expect("a stop once the value ran out")
        - submitted;
    assert!((60.0..62.0).contains(&at), "stopped at {at} s");
    let reason = &f.core.job("ok").unwrap().reason;
    assert!(reason.contains("value curve reached zero"), "{reason}");
}

/// A restarted manager still weighs the value curves of the jobs it read back from the store:
/// `converge` looks for jobs to give up only while the core counts live jobs with a value
/// curve, and a count kept only at submission would be nothing after a restart.
#[test]
fn converge_gives_up_a_valued_job_it_read_back_after_a_restart() {
    let mut f = Fixture::new("converge");
    f.register(1, "w1", 1.0);
    let submitted = f.now;
    f.start("ok", value_job(10.0, 10.0, 0.0, 60.0));
    f.advance(1.0);
    f.restart("converge", 5.0);
    f.reregister(1, "w1", 1.0, &[("ok", 1, 0)]);
    let at = f
        .stopped_within(1, "ok", None, 70)
        .expect("a stop once the value ran out, after the restart")
        - submitted;
    assert!((60.0..62.0).contains(&at), "stopped at {at} s");
}

/// `converge` on `workers` workers of 1, 2 and 4 cores (more than an event lists every score
/// of), and a fixed sequence of uniform numbers in [0, 1) from `seed` (a linear congruential
/// generator) for what the test draws next. Speeds: alike workers (equal crowding at equal job
/// counts), the fastest (4 cores at 1.5: w05, w17) and others drawn below that.
fn varied_cluster(seed: u64, workers: usize) -> (Fixture, impl FnMut() -> f64) {
    assert!(workers > crate::cluster::policy::SCORES_SHOWN);
    let mut state = seed;
    let mut uniform = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut f = Fixture::new("converge");
    for i in 0..workers {
        let cores = [1.0, 2.0, 4.0][i % 3];
        let speed = match i % 4 {
            0 => 1.0,
            1 => 1.5,
            _ => 0.5 + uniform(),
        };
        f.register_at(i as ConnId + 1, &format!("w{i:02}"), cores, speed);
    }
    (f, uniform)
}

/// A job with a value curve is weighed on every worker, not only the least crowded: where its
/// value is the same everywhere, the least added to the sum of completion times decides, over
/// more workers than an event lists. Here the fast w05 holds five one-second jobs: more
/// crowded than the 23 idle workers, yet a 100 s job adds less there ((5 + 100) / 6 s against
/// 100 / 4 s). A job without a curve goes where the crowding rule sends it, an idle worker.
#[test]
fn converge_weighs_a_valued_job_on_every_worker_beyond_those_an_event_lists() {
    let mut f = Fixture::new("converge");
    // w05 first, alone, so that the small jobs all land on it.
    f.register_at(6, "w05", 4.0, 1.5);
    for k in 0..5 {
        let id = format!("tiny{k}");
        let out = f.step(Input::Submit {
            id: id.as_str().into(),
            spec: plain_job(1.0),
        });
        let (conn, start) = Fixture::sent(&out, &id, "start").expect("placed");
        f.ok(conn, &start, Fixture::started(conn));
    }
    const WORKERS: usize = 24;
    const { assert!(WORKERS > crate::cluster::policy::SCORES_SHOWN) };
    for i in (0..WORKERS).filter(|&i| i != 5) {
        f.register_at(i as ConnId + 1, &format!("w{i:02}"), 4.0, 1.0);
    }
    // Full value for days: worth the same wherever it runs, and it delays no valued job.
    let out = f.step(Input::Submit {
        id: "valued".into(),
        spec: value_job(100.0, 10.0, 1e6, 2e6),
    });
    assert!(Fixture::sent(&out, "valued", "start").is_some(), "{out:?}");
    let placed = Fixture::event(&out, EventKind::JobPlaced).expect("placed");
    assert_eq!(placed.worker.as_deref(), Some("w05"), "{}", placed.reason);
    assert!(
        placed.reason.contains("most value net"),
        "{}",
        placed.reason
    );
    let out = f.step(Input::Submit {
        id: "plain".into(),
        spec: plain_job(100.0),
    });
    assert!(Fixture::sent(&out, "plain", "start").is_some(), "{out:?}");
    let placed = Fixture::event(&out, EventKind::JobPlaced).expect("placed");
    assert_ne!(placed.worker.as_deref(), Some("w05"), "{}", placed.reason);
}

/// `converge` moves a job at most once (a move costs a save and a restore): a job it moved to
/// a slow worker stays there when its fast old worker empties, though moving it back would
/// now save more than the move costs.
#[test]
fn converge_moves_a_job_once_at_most() {
    let mut f = Fixture::new("converge");
    // w1 alone at first, so that it takes all four jobs; then the slow w2, empty.
    f.register_at(1, "w1", 1.0, 2.0);
    for id in ["a", "b", "c", "d"] {
        let out = f.step(Input::Submit {
            id: id.into(),
            spec: plain_job(100.0),
        });
        let (conn, start) = Fixture::sent(&out, id, "start").expect("placed");
        f.ok(conn, &start, Fixture::started(conn));
    }
    f.register_at(2, "w2", 1.0, 1.0);
    let moves = |f: &mut Fixture| -> Option<(JobId, Command)> {
        for _ in 0..40 {
            f.heartbeat(1);
            f.heartbeat(2);
            let out = f.advance(1.0);
            let save = out.iter().find_map(|e| match e {
                Effect::Send { command, .. } if command.action.name() == "save" => {
                    Some((command.job.clone(), command.clone()))
                }
                _ => None,
            });
            if save.is_some() {
                return save;
            }
        }
        None
    };
    let (moved, save) = moves(&mut f).expect("a job moves to the empty w2");
    let out = f.ok(1, &save, Fixture::saved());
    let (conn, start) = Fixture::sent(&out, &moved, "start").expect("restoring");
    assert_eq!(conn, 2);
    f.ok(conn, &start, Fixture::started(conn));
    // The others end: w1, twice as fast, is empty, and the moved job alone on w2 would
    // finish sooner there.
    for id in ["a", "b", "c", "d"].into_iter().filter(|id| **id != *moved) {
        f.exited(1, id, 1, 0, false);
    }
    assert_eq!(
        moves(&mut f).map(|m| m.0),
        None,
        "{moved} moved a second time"
    );
}

/// `converge` works the marginal out only on the least crowded workers: over more workers than
/// an event lists every score of, each placement must still be the one its rule names when
/// every worker is weighed (the fewest jobs per reference core, [`SAME_CROWD`] apart counting
/// as the same; then the least added to the sum of completion times; then the less crowded;
/// then worker order), worked out here from the view alone.
///
/// [`SAME_CROWD`]: crate::cluster::policy::priority::SAME_CROWD
#[test]
fn converge_places_where_its_rule_says_with_every_worker_weighed() {
    use crate::cluster::policy::priority::SAME_CROWD;
    let (mut f, mut uniform) = varied_cluster(7, 24);
    for k in 0..150 {
        let id = format!("j{k:03}");
        let spec = plain_job(1.0 + (99.0 * uniform()).round());
        let want = {
            let view = f.core.view();
            let x = spec.estimated_runtime_s;
            let speed = |w: &Worker| w.cpu_capacity * w.calibration.max(1e-6);
            let weighed: Vec<(f64, f64, &WorkerId)> = view
                .workers
                .values()
                .map(|w| {
                    let works = w.jobs.iter().map(|id| {
                        view.remaining_work(view.jobs.get(id).unwrap())
                            .expect("a declared work")
                    });
                    let (mut ahead, mut behind) = (0.0, 0usize);
                    for y in works {
                        if y <= x {
                            ahead += y;
                        } else {
                            behind += 1;
                        }
                    }
                    let crowd = (w.jobs.len() + 1) as f64 / speed(w);
                    ((ahead + x + behind as f64 * x) / speed(w), crowd, &w.id)
                })
                .collect();
            let least = weighed.iter().map(|w| w.1).fold(f64::INFINITY, f64::min);
            weighed
                .iter()
                .filter(|w| w.1 <= least * (1.0 + SAME_CROWD) + 1e-9)
                .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)))
                .map(|w| w.2.clone())
                .unwrap()
        };
        let out = f.step(Input::Submit {
            id: id.as_str().into(),
            spec,
        });
        let (conn, start) = Fixture::sent(&out, &id, "start").expect("placed");
        assert_eq!(
            f.core.job(&id).unwrap().worker(),
            Some(&want),
            "job {k}: {}",
            f.core.job(&id).unwrap().reason
        );
        f.ok(conn, &start, Fixture::started(conn));
    }
}

/// `converge`'s rebalancing finds the targets a source may send to once per source and passes
/// over jobs whose move could not gain enough: over more workers than an event lists, each
/// move it makes must still be the one its rule names when every job is weighed against every
/// worker (the most saved from the sum of completion times net of the move's cost, onto a
/// worker no more crowded than the source; among equal gains the least work at risk; first in
/// worker and job order; a job moved before is not moved again), worked out here from the
/// view alone, for three moves in turn.
#[test]
fn converge_rebalances_as_its_rule_says_with_every_move_weighed() {
    use crate::cluster::policy::priority::{SAME_CROWD, SAME_SPEED};
    // Eight scenarios in which passing over jobs too eagerly shows: passing over every job
    // whose bound is within 5 s above the best found (as if the bound were 5 s lower) makes
    // each of them fail (found among seeds 1 to 40; seed 3 replaced seed 10, which no longer
    // failed so once a target faster within `SAME_SPEED` counted as no faster).
    for seed in [3u64, 15, 16, 33, 34, 35, 36, 37] {
        let workers = 24;
        let (mut f, mut uniform) = varied_cluster(seed, workers);
        let mut placed = Vec::new();
        for k in 0..150 {
            let id = format!("j{k:03}");
            let out = f.step(Input::Submit {
                id: id.as_str().into(),
                spec: plain_job(1.0 + (99.0 * uniform()).round()),
            });
            let (conn, start) = Fixture::sent(&out, &id, "start").expect("placed");
            f.ok(conn, &start, Fixture::started(conn));
            placed.push((id, conn));
        }
        // Half of them end, unevenly across the workers, and every job of the last few
        // workers and of a fastest one (w05): something to even out, and empty workers to even
        // it out onto; onto the empty fastest, a move gains exactly its bound.
        for (id, conn) in &placed {
            if *conn > workers as ConnId - 4 || *conn == 6 || uniform() < 0.5 {
                f.exited(*conn, id, 1, 0, false);
            }
        }
        // Up to three moves in turn, each completed before the next: a job moved once is not
        // moved again.
        let mut moved: Vec<JobId> = Vec::new();
        for _ in 0..120 {
            for conn in 1..=workers as ConnId {
                f.heartbeat(conn);
            }
            let want = {
                let view = f.core.view();
                let cost = view.longest_downtime().unwrap_or(5.0);
                let speed = |w: &Worker| w.cpu_capacity * w.calibration.max(1e-6);
                let works = |w: &Worker| -> Vec<f64> {
                    (w.jobs.iter())
                        .map(|id| view.remaining_work(view.jobs.get(id).unwrap()).unwrap())
                        .collect()
                };
                let marginal = |w: &Worker, works: &[f64], x: f64, skip: Option<usize>| {
                    let (mut ahead, mut behind) = (0.0, 0usize);
                    for (k, &y) in works.iter().enumerate() {
                        if Some(k) == skip {
                            continue;
                        } else if y <= x {
                            ahead += y;
                        } else {
                            behind += 1;
                        }
                    }
                    (ahead + x + behind as f64 * x) / speed(w)
                };
                let per_core = |w: &Worker, extra: usize| (w.jobs.len() + extra) as f64 / speed(w);
                let lists: BTreeMap<&WorkerId, Vec<f64>> =
                    view.workers.values().map(|w| (&w.id, works(w))).collect();
                let mut best: Option<(f64, f64, JobId, WorkerId)> = None;
                for src in view.workers.values() {
                    let here_works = &lists[&src.id];
                    for (k, id) in src.jobs.iter().enumerate() {
                        let j = view.jobs.get(id).unwrap();
                        if !matches!(j.phase, JobPhase::Running { .. }) || moved.contains(id) {
                            continue;
                        }
                        let x = here_works[k];
                        let here = marginal(src, here_works, x, Some(k));
                        let risk = view.work_at_risk(j);
                        // Every job here (a tenth of a core) fits on every worker.
                        for dst in view.workers.values() {
                            if dst.id == src.id
                                || per_core(dst, 1) > per_core(src, 0) * (1.0 + SAME_CROWD) + 1e-9
                            {
                                continue;
                            }
                            // A target calibrated faster within the band is weighed at the
                            // source's calibration.
                            let (from, to) = (src.calibration, dst.calibration);
                            let alike = to > from && to <= from * (1.0 + SAME_SPEED);
                            let there = marginal(dst, &lists[&dst.id], x, None)
                                * if alike { to / from } else { 1.0 };
                            let gain = here - there - cost;
                            if gain > 0.0
                                && best.as_ref().is_none_or(|(g, r, ..)| {
                                    gain > g + 1e-9 || (gain > g - 1e-9 && risk < *r)
                                })
                            {
                                best = Some((gain, risk, id.clone(), dst.id.clone()));
                            }
                        }
                    }
                }
                best.map(|(_, _, job, to)| (job, to))
            };
            let out = f.advance(1.0);
            let moving: Vec<(JobId, WorkerId)> = (f.core.jobs().values())
                .filter_map(|j| match &j.phase {
                    JobPhase::Migrating(m) => Some((j.id.clone(), m.to.clone())),
                    _ => None,
                })
                .collect();
            if !moving.is_empty() {
                assert_eq!(moving.len(), 1, "seed {seed}: one move per rebalancing");
                assert_eq!(
                    Some(&moving[0]),
                    want.as_ref(),
                    "seed {seed}, move {}",
                    moved.len()
                );
                let (job, _) = &moving[0];
                moved.push(job.clone());
                if moved.len() == 3 {
                    break;
                }
                // Saved, restored and running on its new worker before the next one.
                let (conn, save) = Fixture::sent(&out, job, "save").expect("saving");
                let out = f.ok(conn, &save, Fixture::saved());
                let (conn, start) = Fixture::sent(&out, job, "start").expect("restoring");
                f.ok(conn, &start, Fixture::started(conn));
                // Its first line 5 s later: the move's downtime, what the next moves cost.
                f.now += 5.0;
                f.progress(conn, job, start.epoch, 10);
                assert_eq!(f.state(job), JobState::Running, "seed {seed}");
            }
        }
        assert_eq!(
            moved.len(),
            3,
            "seed {seed}: fewer moves made than compared"
        );
    }
}

/// A job with a value curve and `work` seconds of declared work, worth `max` until `full` s
/// after submission and nothing from `zero` s.
fn value_job(work: f64, max: f64, full: f64, zero: f64) -> JobSpec {
    JobSpec {
        cpus: 0.1,
        estimated_runtime_s: work,
        value_curve: Some(converge_policy::value::ValueCurve {
            max_value: max,
            full_value_until_s: full,
            zero_value_at_s: zero,
        }),
        ..JobSpec::default()
    }
}

/// A job without a value curve and `work` seconds of declared work.
fn plain_job(work: f64) -> JobSpec {
    JobSpec {
        cpus: 0.1,
        estimated_runtime_s: work,
        ..JobSpec::default()
    }
}

impl Fixture {
    /// Heartbeats from `conn` a second apart, each saying `job` (its first incarnation) used
    /// `cpu` cores (or saying nothing of it), until it is sent a Stop, at most `seconds` times:
    /// when it was (`None` if never).
    fn stopped_within(
        &mut self,
        conn: ConnId,
        job: &str,
        cpu: Option<f64>,
        seconds: usize,
    ) -> Option<Time> {
        for _ in 0..seconds {
            match cpu {
                Some(cpu) => self.heartbeat_of(conn, job, 1, cpu),
                None => self.heartbeat(conn),
            };
            let out = self.advance(1.0);
            if Fixture::sent(&out, job, "stop").is_some() {
                return Some(self.now);
            }
        }
        None
    }
}

/// Under the value policy a drain moves a value job where the allocator says, whatever its
/// `cpus`, as the job was placed: judged by spread's room for them it waited on the draining
/// worker for ever, while new value jobs kept landing beside the others (a new user's walk).
#[test]
fn a_drain_under_the_value_policy_moves_value_jobs_whatever_their_cpus() {
    let mut f = Fixture::with(policy::by_name("value", &value_settings()).unwrap());
    for (conn, id) in [(1, "w1"), (2, "w2"), (3, "w3")] {
        f.register(conn, id, 1.0);
    }
    let whole_core = JobSpec {
        cpus: 1.0,
        ..value_job(100.0, 100.0, 1000.0, 2000.0)
    };
    let on = f.start("a", whole_core.clone());
    let mut others: Vec<ConnId> = ["b", "c"]
        .into_iter()
        .map(|id| f.start(id, whole_core.clone()))
        .collect();
    others.sort_unstable();
    let mut all = vec![on];
    all.extend(&others);
    all.sort_unstable();
    assert_eq!(
        all,
        [1, 2, 3],
        "the allocator spreads three jobs over three workers"
    );
    let out = f.step(Input::Drain {
        worker: format!("w{on}").into(),
    });
    let (_, save) = Fixture::sent(&out, "a", "save").expect("a drained job is moved");
    assert_eq!(f.state("a"), JobState::Migrating);
    let out = f.ok(on, &save, Fixture::saved());
    let (first, restore) = Fixture::sent(&out, "a", "start").expect("restored elsewhere");
    assert!(
        others.contains(&first),
        "to a full worker, by value: {first}"
    );
    // That restore fails: the other full worker, not the one that failed (chosen again, it
    // was refused and the job waited as a new one).
    let out = f.fail(first, &restore, "image not found");
    let (second, _) = Fixture::sent(&out, "a", "start").expect("restored again");
    assert!(others.contains(&second) && second != first, "{second}");
}

/// A value job a drain moves is given a CPU share for the jobs it meets where it goes. Placed
/// alone it got the smallest share (every share is worth the same to a job alone), and kept
/// beside another it was all but starved (a new user's walk: 15 s to start).
#[test]
fn a_value_job_moved_by_a_drain_gets_a_share_for_where_it_goes() {
    let mut f = Fixture::with(policy::by_name("value", &value_settings()).unwrap());
    f.register(1, "w1", 1.0);
    f.register(2, "w2", 1.0);
    let shares = |out: &[Effect], job: &str| match Fixture::sent(out, job, "start") {
        Some((
            conn,
            Command {
                action: Action::Start { cpu_shares },
                ..
            },
        )) => (conn, cpu_shares),
        other => panic!("{job} not started: {other:?}"),
    };
    // a is worth its all only if done within 150 s; b has slack to spare.
    let out = f.step(Input::Submit {
        id: "a".into(),
        spec: value_job(100.0, 100.0, 150.0, 300.0),
    });
    assert_eq!(
        shares(&out, "a"),
        (1, 1),
        "a alone on w1, at the smallest share"
    );
    let (_, start) = Fixture::sent(&out, "a", "start").unwrap();
    f.ok(1, &start, Fixture::started(1));
    let out = f.step(Input::Submit {
        id: "b".into(),
        spec: value_job(100.0, 100.0, 1000.0, 2000.0),
    });
    assert_eq!(shares(&out, "b"), (2, 1), "b alone on w2");
    let (_, start) = Fixture::sent(&out, "b", "start").unwrap();
    f.ok(2, &start, Fixture::started(2));
    let out = f.step(Input::Drain {
        worker: "w1".into(),
    });
    let (_, save) = Fixture::sent(&out, "a", "save").expect("a drained job is moved");
    let out = f.ok(1, &save, Fixture::saved());
    // Beside b at a share of 1, a would get half of w2 and end at 200 s, past its full
    // value; with a larger share it ends sooner, and b (with slack) loses nothing.
    let (conn, restored) = shares(&out, "a");
    assert_eq!(conn, 2);
    assert!(restored > 1, "restored at a share of {restored}");
    // Said in its restore's event, as a placement's share is.
    let said = (f.effects.iter().rev()).find_map(|e| match e {
        Effect::Event(ev)
            if ev.kind == EventKind::Migration && ev.reason.starts_with("restoring") =>
        {
            ev.attributes.get("cpu_shares").cloned()
        }
        _ => None,
    });
    assert_eq!(said, Some(restored.to_string()));
}

/// Under `value`, two 1-core workers each running one value job alone, at a share of 1: `a`
/// on w1, worth its all only if done within 150 s; `b` on w2, with slack to spare.
fn value_jobs_a_and_b_alone() -> Fixture {
    let mut f = Fixture::with(policy::by_name("value", &value_settings()).unwrap());
    f.register(1, "w1", 1.0);
    f.register(2, "w2", 1.0);
    for (id, curve, conn) in [("a", (150.0, 300.0), 1), ("b", (1000.0, 2000.0), 2)] {
        let out = f.step(Input::Submit {
            id: id.into(),
            spec: value_job(100.0, 100.0, curve.0, curve.1),
        });
        let (_, start) = Fixture::sent(&out, id, "start").unwrap();
        f.ok(conn, &start, Fixture::started(conn));
    }
    f
}

/// While a drained value job's save runs, the allocator counts it on its target at the share
/// chosen for there, as it will run: a value job placed there meanwhile is sized as it is
/// just after the save (a review: it was sized against the job's old share of 1).
#[test]
fn a_job_placed_beside_a_move_sees_its_share_for_there() {
    let run = |save_first: bool| {
        let mut f = value_jobs_a_and_b_alone();
        let out = f.step(Input::Drain {
            worker: "w1".into(),
        });
        let (_, save) = Fixture::sent(&out, "a", "save").expect("a drained job is moved");
        if save_first {
            f.ok(1, &save, Fixture::saved());
        }
        let out = f.step(Input::Submit {
            id: "c".into(),
            spec: value_job(100.0, 100.0, 250.0, 500.0),
        });
        match Fixture::sent(&out, "c", "start") {
            Some((
                conn,
                Command {
                    action: Action::Start { cpu_shares },
                    ..
                },
            )) => {
                format!("c on conn {conn} at {cpu_shares}")
            }
            other => format!("c: {other:?} {:?}", f.state("c")),
        }
    };
    let (during, after) = (run(false), run(true));
    assert_eq!(
        during, after,
        "c placed while a's save runs vs just after it ended"
    );
}

/// The share chosen for a value job's move becomes its share only with the restore: a drain
/// whose save failed leaves the job running on its source at the share it had (a review:
/// taken at the answer, the policy believed the target's share, in its model of the worker
/// and in the ETA, while the container ran at the old one).
#[test]
fn a_failed_drain_save_leaves_the_value_jobs_share_as_it_runs() {
    let mut f = value_jobs_a_and_b_alone();
    assert_eq!(f.core.policy.start_shares("a"), 1);
    let out = f.step(Input::Drain {
        worker: "w1".into(),
    });
    let (_, save) = Fixture::sent(&out, "a", "save").expect("a drained job is moved");
    f.fail(1, &save, "checkpoint volume full");
    assert_eq!(f.state("a"), JobState::Running);
    f.step(Input::Undrain {
        worker: "w1".into(),
    });
    assert_eq!(f.state("a"), JobState::Running);
    assert_eq!(
        f.core.policy.start_shares("a"),
        1,
        "the share a's container runs with"
    );
}

/// `converge` admits a job with a value curve only for more value than it costs the jobs it
/// would delay (shortest first, a shorter job delays the longer ones by its work), and gives a
/// placed job up as soon as it can no longer finish before its value runs out, not when it has
/// already run out: the CPU it would spend until then goes to jobs it can still earn for.
#[test]
fn converge_weighs_what_a_job_earns_against_what_it_costs_the_jobs_it_delays() {
    let mut f = Fixture::new("converge");
    f.register(1, "w1", 1.0);
    // 100 s of work, worth 100 if done by 100 s and nothing from 120 s: placed.
    f.start("long", value_job(100.0, 100.0, 100.0, 120.0));
    // 50 s of work worth 10: it would go first and push `long` from 100 s to 150 s, past
    // its zero: 10 earned for 100 lost. Turned away, saying so.
    let reason = f.rejected("small", value_job(50.0, 10.0, 1000.0, 2000.0));
    assert!(
        reason.contains("worth 10.0 of its value 10.0")
            && reason.contains("would lose 100.0 of theirs"),
        "{reason}"
    );
    // A job without a value curve is not weighed so, and goes first: `long` can now finish
    // 150 s after its submission at best, and is given up at once, long before 120 s.
    f.start("plain", plain_job(50.0));
    let at = f
        .stopped_within(1, "long", Some(0.5), 10)
        .expect("given up early");
    assert!(at < 120.0, "given up at {at} s");
    let reason = &f.core.job("long").unwrap().reason;
    assert!(
        reason.contains("cannot finish before its value curve reaches zero (120 s"),
        "{reason}"
    );
}

/// `converge` gives a waiting job with a value curve up once even starting it now, alone on the
/// fastest worker, would finish it past its zero, not when its value has run out: a walk saw a
/// queued job wait out its value while its own ETA was minutes past its zero.
#[test]
fn converge_gives_a_waiting_value_job_up_once_it_could_not_make_it() {
    let mut f = Fixture::new("converge");
    f.register(1, "w1", 1.0);
    f.start("big", spec(1.0));
    // No room for its half core.
    submit_late(&mut f);
    assert_eq!(f.state("late"), JobState::Pending);
    let mut dropped_at = None;
    for _ in 0..80 {
        f.heartbeat(1);
        f.advance(1.0);
        if f.state("late") == JobState::Dropped {
            dropped_at = Some(f.now);
            break;
        }
    }
    // Started at 30 s it would end at 80 s at the soonest.
    let at = dropped_at.expect("given up");
    assert!((30.0..32.0).contains(&at), "given up at {at} s");
    let reason = &f.core.job("late").unwrap().reason;
    assert!(reason.contains("were it started now"), "{reason}");
}

/// Submits `late`: half a core, 50 s of work, worth 10 until 60 s and nothing from 80 s.
fn submit_late(f: &mut Fixture) {
    f.step(Input::Submit {
        id: "late".into(),
        spec: JobSpec {
            cpus: 0.5,
            ..value_job(50.0, 10.0, 60.0, 80.0)
        },
    });
}

/// A waiting value job is judged against the fastest ready worker, connected or not: a drop
/// is final, and the fastest worker's stream blinking for a second dropped a job that could
/// still make it there (a review).
#[test]
fn converge_keeps_a_waiting_value_job_its_fastest_worker_could_still_finish() {
    let mut f = Fixture::new("converge");
    f.register(1, "w1", 4.0);
    f.register(2, "w2", 1.0);
    f.start("big", spec(4.0));
    f.start("small", spec(1.0));
    // On w1, 12.5 s of its 50; on w2, 50 s.
    submit_late(&mut f);
    for _ in 0..40 {
        f.heartbeat(1);
        f.heartbeat(2);
        f.advance(1.0);
    }
    f.step(Input::Disconnected {
        conn: 1,
        reason: "blink".into(),
    });
    f.heartbeat(2);
    f.advance(1.0);
    assert_eq!(
        f.state("late"),
        JobState::Pending,
        "{}",
        f.core.job("late").unwrap().reason
    );
}

/// `converge` weighs a value job's worth only at its first placement: a job that already ran
/// and must start again (its worker lost) is placed, not turned away with the work it did.
#[test]
fn converge_does_not_turn_away_a_value_job_placed_again() {
    let mut f = Fixture::new("converge");
    f.register(1, "w1", 1.0);
    // 100 s of work, worth 100 if done by 100 s and nothing from 120 s.
    f.start("long", value_job(100.0, 100.0, 100.0, 120.0));
    f.register(2, "w2", 1.0);
    // Alone on w2: it costs no one anything.
    assert_eq!(f.start("small", value_job(50.0, 10.0, 1000.0, 2000.0)), 2);
    // Its worker reports it: what it had of its work is known.
    f.heartbeat_of(2, "small", 1, 1.0);
    // w2 is lost: small must go to w1, where, new, it would be turned away (it would push
    // `long` past its zero).
    let restarted = f.lose(2, 1, "small");
    assert_eq!(restarted.map(|(conn, _)| conn), Some(1));
    assert_ne!(f.state("small"), JobState::Rejected);
}

/// `converge` places on the workers with the fewest jobs per core, and only among those by
/// what the job adds to the sum of completion times: a big worker full of nearly finished jobs
/// looks fastest by the sum (it would run the job after 40 s of work at four cores), but the
/// job would share it with four others, and an empty small worker has a core for it alone.
#[test]
fn converge_places_on_the_fewest_jobs_per_core_before_the_sum_of_completion_times() {
    let mut f = Fixture::new("converge");
    f.register(1, "big", 4.0);
    for k in 0..4 {
        assert_eq!(f.start(&format!("short-{k}"), plain_job(10.0)), 1);
    }
    f.register(2, "small", 1.0);
    let out = f.step(Input::Submit {
        id: "new".into(),
        spec: plain_job(100.0),
    });
    let (conn, _) = Fixture::sent(&out, "new", "start").expect("placed");
    let placed = Fixture::event(&out, EventKind::JobPlaced).expect("a placement event");
    let reason = placed.reason.clone();
    assert_eq!(conn, 2, "{reason}");
    assert!(
        reason.contains("placed on small")
            && reason.contains("fewest jobs per reference core (1.00 with it)"),
        "{reason}"
    );
    // The sum of completion times alone would have chosen `big`: (40 + 100) / 4 = 35 s there
    // against 100 s on `small`, as the scores it lists say.
    let scores = placed.attributes.get("scores").cloned().expect("scores");
    assert!(
        scores.contains("big=35") && scores.contains("small=100"),
        "{scores}"
    );
}

/// A slow core counts for what it does: an empty worker of 2 cores at 0.6 speed (1.2
/// reference cores) is more crowded with one job than a worker of 8 cores holding four.
#[test]
fn converge_counts_a_slow_workers_cores_at_their_speed() {
    let mut f = Fixture::new("converge");
    f.register(1, "big", 8.0);
    for k in 0..4 {
        assert_eq!(f.start(&format!("long-{k}"), plain_job(1000.0)), 1);
    }
    f.register_at(2, "slow", 2.0, 0.6);
    let out = f.step(Input::Submit {
        id: "new".into(),
        spec: plain_job(100.0),
    });
    let placed = Fixture::event(&out, EventKind::JobPlaced).expect("a placement event");
    // By cores alone `slow` holds 0.50 jobs per core with it and `big` 0.62.
    assert!(
        placed.reason.contains("placed on big")
            && placed
                .reason
                .contains("fewest jobs per reference core (0.62 with it)"),
        "{}",
        placed.reason
    );
}

/// A placement that counted the job's work as a typical job's, nothing telling its own, says
/// so: a walk read `(1.1 s)` as a measured delay.
#[test]
fn converge_says_when_a_placement_counted_a_jobs_work_as_a_typical_ones() {
    let mut f = Fixture::new("converge");
    f.register(1, "w1", 1.0);
    for (id, spec, guessed) in [
        ("unknown", spec(0.1), true),
        ("declared", plain_job(30.0), false),
    ] {
        let out = f.step(Input::Submit {
            id: id.into(),
            spec,
        });
        let placed = Fixture::event(&out, EventKind::JobPlaced).expect("a placement event");
        assert_eq!(
            placed.reason.contains("not yet known"),
            guessed,
            "{id}: {}",
            placed.reason
        );
    }
}

/// Workers whose speeds differ by a few percent (the calibration benchmark's noise) are
/// equally crowded: the sum of completion times decides between them, not the benchmark.
#[test]
fn converge_leaves_alike_workers_to_the_sum_of_completion_times() {
    let mut f = Fixture::new("converge");
    f.register_at(1, "fast", 1.0, 1.03);
    f.register_at(2, "slow", 1.0, 1.0);
    // A long job on the faster worker, a short one on the other.
    assert_eq!(f.start("long", plain_job(1000.0)), 1);
    assert_eq!(f.start("short", plain_job(10.0)), 2);
    let out = f.step(Input::Submit {
        id: "new".into(),
        spec: plain_job(100.0),
    });
    let placed = Fixture::event(&out, EventKind::JobPlaced).expect("a placement event");
    // Behind the short job it adds 10 + 100 s; ahead of the long one 100 + 100 s.
    assert!(
        placed.reason.contains("placed on slow"),
        "{}",
        placed.reason
    );
}

/// Rebalancing moves no job for a gain within the calibration benchmark's noise: a job alone on
/// a worker measured a tenth slower than its empty twin (a walk's testbed on one host: 0.298
/// against 0.327) stays; measured a third slower, it moves. Cores are no measurement: onto an
/// empty worker of one core more at the same calibration, it moves.
#[test]
fn converge_moves_no_job_for_a_speed_within_the_benchmarks_noise() {
    // (cores, calibration) of the source, of the empty target, the jobs on the source, and
    // whether one moves.
    for ((cores, calibration), (twin_cores, twin), jobs, moves) in [
        ((1.0, 0.298), (1.0, 0.327), 1, false),
        ((1.0, 0.298), (1.0, 0.40), 1, true),
        ((7.0, 1.0), (8.0, 1.0), 1, true),
        // Crowding still moves a job between twins, weighed at the source's calibration.
        ((1.0, 0.298), (1.0, 0.327), 2, true),
    ] {
        let mut f = Fixture::new("converge");
        f.register_at(1, "slow", cores, calibration);
        for k in 0..jobs {
            assert_eq!(f.start(&format!("long{k}"), plain_job(1000.0)), 1);
        }
        f.register_at(2, "twin", twin_cores, twin);
        let mut why = None;
        // Three rebalancing rounds (every 30 s).
        for _ in 0..100 {
            f.heartbeat(1);
            f.heartbeat(2);
            let out = f.advance(1.0);
            why = why.or_else(|| {
                Fixture::event(&out, EventKind::Migration).map(|e| e.attributes["why"].clone())
            });
        }
        assert_eq!(why.is_some(), moves, "twin measured at {twin}");
        let alike = twin > calibration && twin <= calibration * 1.15;
        assert_eq!(
            why.as_deref()
                .is_some_and(|w| w.contains("at slow's calibration")),
            moves && alike,
            "{why:?}"
        );
    }
}

/// Among workers, a job with a value curve goes where it earns most net of what it costs the
/// jobs it delays, not where it adds least to the sum of completion times.
#[test]
fn converge_places_a_value_job_where_it_costs_the_others_least_value() {
    let mut f = Fixture::new("converge");
    f.register(1, "w1", 2.0);
    // 100 s of work, worth 100 if done by 60 s and nothing from 70 s: on w1 (2 cores), done
    // at 50 s.
    f.start("tight", value_job(100.0, 100.0, 60.0, 70.0));
    f.register(2, "w2", 2.0);
    // 200 s of work without a curve: w2, where nothing is ahead of it.
    assert_eq!(f.start("plain", plain_job(200.0)), 2);
    // 50 s of work worth 10. By completion times the two workers tie (it goes first on either
    // and delays one job by 25 s), and the first would be w1; there it would push `tight`
    // from 50 s to 75 s, past its zero. On w2 it costs no value.
    let out = f.step(Input::Submit {
        id: "new".into(),
        spec: value_job(50.0, 10.0, 1000.0, 2000.0),
    });
    let (conn, _) = Fixture::sent(&out, "new", "start").expect("placed");
    assert_eq!(conn, 2);
    let placed = Fixture::event(&out, EventKind::JobPlaced).expect("a placement event");
    let reason = placed.reason.clone();
    assert!(
        reason.contains("placed on w2") && reason.contains("would lose 0.0 of theirs"),
        "{reason}"
    );
}

/// Rebalancing makes no move that costs value: moving a job that would lower the sum of
/// completion times, but would go ahead of a job with a value curve on the target and push it
/// past its zero, is not made.
#[test]
fn converge_makes_no_move_that_costs_a_value_job_its_value() {
    let mut f = Fixture::new("converge");
    f.register(1, "w1", 1.0);
    for id in ["a", "b", "c"] {
        f.start(id, plain_job(45.0));
    }
    f.register(2, "w2", 1.0);
    // 100 s of work, worth 100 until 110 s and nothing from 130 s: alone on w2, done at 100 s.
    assert_eq!(f.start("v", value_job(100.0, 100.0, 110.0, 130.0)), 2);
    // a, b and c share w1 (a quarter core each); v has w2. Moving the last of w1's jobs to w2
    // would save it waiting behind the other two, and push v from 100 s to past 130 s.
    let status = |job: &str, cpu_usage: f64| JobStatus {
        job: job.into(),
        epoch: 1,
        category: None,
        growth_efficiency: None,
        cpu_limit: None,
        cpu_usage,
    };
    for _ in 0..40 {
        let jobs = ["a", "b", "c"].iter().map(|j| status(j, 0.25)).collect();
        f.msg(
            1,
            AgentMessage::Heartbeat(Heartbeat {
                jobs,
                ..Heartbeat::default()
            }),
        );
        f.heartbeat_of(2, "v", 1, 1.0);
        let out = f.advance(1.0);
        for id in ["a", "b", "c", "v"] {
            assert!(
                Fixture::sent(&out, id, "save").is_none(),
                "{id} moved at {} s",
                f.now
            );
        }
    }
    assert_eq!(f.state("v"), JobState::Running);
}

// ---- stop at convergence, ETAs ----

#[test]
fn a_job_that_stops_improving_is_checkpointed_and_completes_with_why() {
    let mut f = Fixture::new("spread");
    f.register(1, "w1", 2.0);
    f.step(Input::Submit {
        id: "a".into(),
        spec: JobSpec {
            cpus: 1.0,
            stop: Some(converge_policy::estimate::StopRule {
                min_improvement: 0.01,
                window_steps: 100,
            }),
            ..JobSpec::default()
        },
    });
    let (_, start) = Fixture::sent(&f.effects.clone(), "a", "start").unwrap();
    f.ok(1, &start, Fixture::started(1));
    // A loss that halves every 100 steps, then flattens at step 400.
    let loss = |k: u64| {
        if k <= 400 {
            1.0 / 2f64.powi((k / 100) as i32)
        } else {
            0.0625 * (1.0 - 0.00005 * (k - 400) as f64)
        }
    };
    let mut saved = None;
    for k in (0..=1000).step_by(50) {
        // A line a second: lines closer than that move the step but are not kept as points.
        f.now += 1.0;
        let out = f.msg(
            1,
            AgentMessage::Progress(ProgressBatch {
                samples: vec![ProgressSample {
                    job: "a".into(),
                    epoch: 1,
                    unix_ms: (f.now * 1000.0) as i64,
                    step: k,
                    total_steps: Some(1_000_000),
                    value: Some(loss(k)),
                    checkpointed: false,
                }],
                malformed: vec![],
            }),
        );
        if let Some((_, save)) = Fixture::sent(&out, "a", "save") {
            saved = Some((k, save));
            break;
        }
    }
    let (k, save) = saved.expect("the rule fired");
    assert_eq!(
        k, 500,
        "first step whose last 100 steps improved less than 1%"
    );
    assert_eq!(f.state("a"), JobState::Stopping);
    f.ok(1, &save, Fixture::saved());
    let job = f.core.job("a").unwrap();
    assert_eq!(job.state(), JobState::Completed);
    assert!(
        job.reason.starts_with("converged at step 500"),
        "{}",
        job.reason
    );
    assert!(job.reason.contains("checkpoint kept"), "{}", job.reason);
}

/// A job with a stop rule keeps every progress line as a point, however close: thinned to a
/// point a second, its rule would read a wider window than asked and stop it later.
#[test]
fn a_job_with_a_stop_rule_keeps_every_line_so_its_rule_fires_on_time() {
    let mut f = Fixture::new("spread");
    f.register(1, "w1", 2.0);
    let conn = f.start(
        "a",
        JobSpec {
            cpus: 1.0,
            stop: Some(converge_policy::estimate::StopRule {
                min_improvement: 0.01,
                window_steps: 5,
            }),
            ..JobSpec::default()
        },
    );
    // A flat metric, a line every 0.1 s.
    let saved = (0..=20).find(|&k| {
        f.now += 0.1;
        let out = f.progress(conn, "a", 1, k);
        Fixture::sent(&out, "a", "save").is_some()
    });
    assert_eq!(saved, Some(5));
}

/// The estimate kept from a job's points is read again once a new point arrives: never one
/// point behind.
#[test]
fn a_jobs_kept_estimate_follows_its_newest_point() {
    let mut f = Fixture::running();
    let mut last: Option<f64> = None;
    for i in 1..=20u64 {
        f.now += 1.0;
        f.heartbeat_of(1, "a", 1, 0.5);
        f.progress_of(1, "a", 1, 10 * i, 1000);
        let job = f.core.job("a").unwrap();
        let view = f.core.view();
        let kept = view.estimate(job);
        // Read twice: the second comes from the memo.
        assert_eq!(view.estimate(job), kept);
        let mut fresh = job.clone();
        fresh.points_estimate = crate::cluster::lifecycle::Memo::default();
        assert_eq!(kept, view.estimate(&fresh), "after point {i}");
        if let (Some(before), Some(now)) = (last, kept.map(|e| e.work)) {
            assert!(
                now < before,
                "work left fell with every step: {before} -> {now}"
            );
        }
        last = kept.map(|e| e.work).or(last);
    }
    assert!(last.is_some(), "the points gave an estimate");
}

/// A pending job no worker could hold even empty (accepted before any worker joined, bigger
/// than every one that did) has no ETA, and holds no place in the queue of those that do: a
/// new user was shown "55s left" for a job that would wait forever.
#[test]
fn a_pending_job_no_worker_can_hold_has_no_eta() {
    let mut f = Fixture::new("spread");
    let timed = |cpus| JobSpec {
        cpus,
        estimated_runtime_s: 10.0,
        ..JobSpec::default()
    };
    f.step(Input::Submit {
        id: "big".into(),
        spec: timed(3.0),
    });
    f.register(1, "w1", 1.0);
    f.start("a", timed(1.0));
    f.step(Input::Submit {
        id: "small".into(),
        spec: timed(1.0),
    });
    assert_eq!(f.state("big"), JobState::Pending);
    // First in the queue of what can start: at a's end, 10 s from now.
    let small = f
        .core
        .eta("small", f.now)
        .expect("small starts when a ends");
    assert_eq!(small.start_at, Some(f.now + 10.0));
    assert!(f.core.eta("big", f.now).is_none());
}

/// A 1-core job of 10 s, as its estimate says.
fn ten_seconds() -> JobSpec {
    JobSpec {
        cpus: 1.0,
        estimated_runtime_s: 10.0,
        ..JobSpec::default()
    }
}

/// Under `spread`, a 1-core worker running `a` ([`ten_seconds`]), and `queued` submitted
/// after it, alike.
fn ten_seconds_queued_behind_a(queued: &[&str]) -> Fixture {
    let mut f = Fixture::new("spread");
    f.register(1, "w1", 1.0);
    f.start("a", ten_seconds());
    for id in queued {
        f.step(Input::Submit {
            id: (*id).into(),
            spec: ten_seconds(),
        });
    }
    f
}

/// Every queued job has an ETA: each starts at the soonest end not yet taken, a running job's
/// or a queued one's before it (only running jobs' ends counted, and the third and fourth of a
/// queue behind one running job had none: a walk).
#[test]
fn each_queued_job_starts_when_the_one_before_it_ends() {
    let f = ten_seconds_queued_behind_a(&["b", "c", "d"]);
    let mut etas = f.core.etas(f.now);
    for (k, id) in ["b", "c", "d"].into_iter().enumerate() {
        let eta = etas.eta(id).unwrap_or_else(|| panic!("{id} has an ETA"));
        let start = f.now + 10.0 * (k + 1) as f64;
        assert_eq!(eta.start_at, Some(start), "{id}");
        assert_eq!(eta.finish_at, start + 10.0, "{id}");
    }
    // A job of unknown size at the head of the queue takes a's end and gives none back: the
    // job behind it has no end to start at.
    let mut f = ten_seconds_queued_behind_a(&[]);
    f.submit("unknown", 1.0);
    f.step(Input::Submit {
        id: "b".into(),
        spec: ten_seconds(),
    });
    let mut etas = f.core.etas(f.now);
    assert!(etas.eta("unknown").is_none());
    assert!(etas.eta("b").is_none());
}

/// A job its user declared a runtime for, with nothing measured of its own yet, is forecast by
/// that declaration and says so, running or queued, though finished jobs of another size are
/// known: a running job's ETA was the declaration's while its basis said "attained-service",
/// and a queued one's was the finished jobs'.
#[test]
fn a_declared_runtime_comes_before_other_jobs_sizes_and_is_said() {
    use converge_policy::estimate::{Basis, DECLARED_CONFIDENCE};
    let mut f = Fixture::new("spread");
    f.register(1, "w1", 1.0);
    f.start("old", spec(1.0));
    for _ in 0..50 {
        f.heartbeat_uses(1, &[("old", 1.0)]);
        f.advance(1.0);
    }
    f.exited(1, "old", 1, 0, false);
    assert_eq!(f.state("old"), JobState::Completed);
    f.start("a", ten_seconds());
    f.step(Input::Submit {
        id: "b".into(),
        spec: ten_seconds(),
    });
    let mut etas = f.core.etas(f.now);
    let a = etas.eta("a").expect("a has an ETA");
    assert_eq!(
        (a.basis, a.confidence),
        (Basis::Declared, DECLARED_CONFIDENCE)
    );
    assert!((a.remaining_s - 10.0).abs() < 1e-9, "{a:?}");
    let b = etas.eta("b").expect("b has an ETA");
    assert_eq!(b.basis, Basis::Declared);
    assert_eq!(b.start_at, Some(a.finish_at));
    assert!((b.finish_at - (a.finish_at + 10.0)).abs() < 1e-9, "{b:?}");
}

/// A restarted manager, before its agents come back: the pending job's ETA still counts the
/// worker it waits for (it had none until the agent registered again).
#[test]
fn a_pending_job_has_an_eta_while_a_restarted_manager_waits_for_its_workers() {
    let mut f = ten_seconds_queued_behind_a(&["b"]);
    let before = f.core.eta("b", f.now).expect("b starts when a ends");
    f.restart("spread", 30.0);
    assert_eq!(f.core.worker("w1").unwrap().conn, None);
    let after = f.core.eta("b", f.now).expect("the worker is waited for");
    assert_eq!(after.start_at, before.start_at);
    // Once the grace period is over without it, the worker is no longer counted on.
    f.advance(31.0);
    assert!(f.core.eta("b", f.now).is_none());
}

/// A job fits a worker only in both cores and memory, and any worker will do: one big in cores
/// and small in memory, and one the other way round, between them hold jobs neither of the
/// biggest alone would ([`forecast::Etas`]'s sizes of workers).
#[test]
fn a_pending_jobs_eta_counts_every_worker_size_that_could_hold_it() {
    let mut f = Fixture::new("spread");
    let gib = 1u64 << 30;
    let timed = |cpus, memory_bytes| JobSpec {
        cpus,
        memory_bytes,
        estimated_runtime_s: 10.0,
        ..JobSpec::default()
    };
    for (conn, w, cpus, memory_bytes) in [
        (1, "w1", 4.0, gib),
        (2, "w2", 1.0, 8 * gib),
        (3, "w3", 1.0, gib / 2),
    ] {
        f.step(Input::Connected {
            conn,
            register: Register {
                worker: w.into(),
                cpu_capacity: cpus,
                memory_bytes,
                calibration: 1.0,
                instance_id: format!("{w}-a"),
                ..Register::default()
            },
        });
    }
    // Each worker runs a job of its size, which ends in 10 s...
    for (id, cpus, memory) in [("a1", 4.0, gib), ("a2", 1.0, 8 * gib), ("a3", 1.0, gib / 2)] {
        f.start(id, timed(cpus, memory));
    }
    // (The core takes what the manager's validation would refuse now: as if accepted before.)
    for (id, cpus, memory) in [
        ("mem", 1.0, 4 * gib),
        ("never", 2.0, 4 * gib),
        ("cpu", 3.0, gib / 2),
    ] {
        f.step(Input::Submit {
            id: id.into(),
            spec: timed(cpus, memory),
        });
        assert_eq!(f.state(id), JobState::Pending);
    }
    let start = |id: &str| f.core.eta(id, f.now).and_then(|e| e.start_at);
    // ... so the pending jobs that some worker could hold start at those ends, in order; the
    // one none could is left out.
    assert!(start("mem").is_some(), "w2 could hold it");
    assert!(start("cpu").is_some(), "w1 could hold it");
    assert_eq!(start("never"), None);
}

#[test]
fn a_running_job_has_an_eta_from_its_steps_and_is_measured_against_its_finish() {
    let mut f = Fixture::running();
    let hb = |f: &mut Fixture| f.heartbeat_of(1, "a", 1, 0.5);
    hb(&mut f);
    // 10 steps per second at half a core: 20 steps per core-second; 1000 steps in all.
    let mut completed = Vec::new();
    for i in 1..=100u64 {
        f.now += 1.0;
        hb(&mut f);
        f.progress_of(1, "a", 1, 10 * i, 1000);
        if i == 50 {
            let eta = f.core.eta("a", f.now).expect("an ETA half-way");
            assert_eq!(eta.basis, converge_policy::estimate::Basis::Steps);
            assert!((eta.remaining_s - 50.0).abs() < 1.5, "{eta:?}");
        }
    }
    let job = f.core.job("a").unwrap();
    assert!(
        job.predicted_at.iter().all(|p| p.is_some()),
        "{:?}",
        job.predicted_at
    );
    completed.extend(f.exited(1, "a", 1, 0, false));
    let done = completed
        .iter()
        .find_map(|e| match e {
            Effect::Event(ev) if ev.to == Some(JobState::Completed) => Some(ev.clone()),
            _ => None,
        })
        .unwrap();
    let err: f64 = done.attributes["eta_error_50"].parse().unwrap();
    assert!(err < 0.05, "the half-way prediction was off by {err}");
}

/// An ETA's confidence is the share of the job's steps done, though the core keeps only its
/// newest points: a long job a quarter through read 5% when the points' span was the evidence.
#[test]
fn a_long_jobs_eta_is_as_confident_as_its_share_done() {
    let mut f = Fixture::running();
    let hb = |f: &mut Fixture| f.heartbeat_of(1, "a", 1, 0.5);
    hb(&mut f);
    for i in 1..=100u64 {
        f.now += 1.0;
        hb(&mut f);
        f.progress_of(1, "a", 1, 10 * i, 4000);
    }
    let eta = f.core.eta("a", f.now).expect("an ETA");
    assert!((eta.confidence - 0.25).abs() < 1e-9, "{eta:?}");
}

/// Two jobs under `converge` on one core, ten seconds in: 100 steps a core-second each, short
/// 1000 steps in all, long 10,000. converge's split of one core between two jobs gives the
/// second 0.17 cores (a floor of 1/16 and an eighth of the rest), and long uses all of it.
fn short_ahead_of_long() -> Fixture {
    let mut f = Fixture::new("converge");
    f.register(1, "w1", 1.0);
    for id in ["short", "long"] {
        f.start(id, spec(0.5));
    }
    for i in 1..=10u64 {
        f.heartbeat_uses(1, &[("short", 0.83), ("long", 0.17)]);
        f.progress_of(1, "short", 1, 83 * i, 1000);
        f.progress_of(1, "long", 1, 17 * i, 10_000);
        f.now += 1.0;
    }
    f
}

/// A job held back by one ahead of it (here `converge` gives the short one nearly all of the
/// core) is forecast at the whole core once that one ends, not at the little it used while
/// held back: a new user saw an ETA of 24 s jump to 2 minutes as a neighbour ended, because
/// that use was read as all it could use. Once it has run a whole report interval on its own,
/// its use is read again.
#[test]
fn a_job_promoted_when_the_one_ahead_ends_is_forecast_at_its_new_share() {
    let mut f = short_ahead_of_long();
    f.progress_of(1, "short", 1, 1000, 1000);
    f.exited(1, "short", 1, 0, false);
    assert_eq!(f.state("short"), JobState::Completed);
    // 9,830 steps left at 100 a core-second: about 100 s on the whole core, 580 at 0.17.
    let eta = f.core.eta("long", f.now).expect("an ETA");
    assert!(
        eta.remaining_s < 150.0,
        "held at the use of its old share: {eta:?}"
    );
    // Its next report still averages over the time short ran; the one after is its own.
    f.now += 1.0;
    f.heartbeat_uses(1, &[("long", 0.5)]);
    let eta = f.core.eta("long", f.now).expect("an ETA");
    assert!(eta.remaining_s < 150.0, "{eta:?}");
    // Running on its own a whole interval at a third of a core, by its own parallelism:
    // that use is all it can use.
    f.now += 1.0;
    f.heartbeat_uses(1, &[("long", 0.3)]);
    let eta = f.core.eta("long", f.now).expect("an ETA");
    assert!(eta.remaining_s > 250.0, "its own cap not read: {eta:?}");
}

/// A neighbour told to stop runs on until its container exits (a save, SIGTERM's grace): the
/// others' uses reported meanwhile are of the split it still had a part of, and are not read
/// against the one without it until a whole report after its exit.
#[test]
fn a_neighbour_leaves_the_split_when_its_container_exits_not_when_it_is_told_to_stop() {
    let mut f = short_ahead_of_long();
    f.step(Input::Cancel {
        id: "short".into(),
        by: String::new(),
    });
    // short saves and stops for a second and a half, its share still taken.
    f.now += 1.0;
    f.heartbeat_uses(1, &[("short", 0.83), ("long", 0.17)]);
    f.now += 0.5;
    f.exited(1, "short", 1, 143, true);
    f.now += 0.5;
    f.heartbeat_uses(1, &[("long", 0.17)]);
    let eta = f.core.eta("long", f.now).expect("an ETA");
    assert!(
        eta.remaining_s < 150.0,
        "held at the use of its old share: {eta:?}"
    );
}

/// A job that prints a hundred lines a second (the trainer's default: one every 10 steps)
/// keeps a point a second: its history spans the heartbeats that give the points' CPU time,
/// and its ETA is read off its steps. Kept at every line, the history spanned a third of a
/// second with no CPU time between its ends, and the ETA fell back to a guess.
#[test]
fn a_job_that_reports_many_lines_a_second_keeps_a_point_a_second() {
    let mut f = Fixture::running();
    for second in 0..40u64 {
        f.heartbeat_of(1, "a", 1, 1.0);
        for i in 1..=100 {
            f.now += 0.01;
            f.progress_of(1, "a", 1, second * 100 + i, 100_000);
        }
    }
    let job = f.core.job("a").unwrap();
    assert!(job.progress.len() <= 41, "{} points", job.progress.len());
    let eta = f.core.eta("a", f.now).expect("an ETA");
    assert_eq!(
        eta.basis,
        converge_policy::estimate::Basis::Steps,
        "{eta:?}"
    );
    // 96,000 steps left at 100 steps a core-second, on a core: 960 s.
    assert!((eta.remaining_s - 960.0).abs() < 100.0, "{eta:?}");
}

/// A job whose Start is answered after its worker's drain began is moved as the others are:
/// the drain passed over it while it was starting, and nothing else asked again (a CLI test
/// waited for the move in vain when the drain came first).
#[test]
fn a_job_that_starts_running_on_a_draining_worker_is_moved() {
    let mut f = Fixture::new("spread");
    f.register(1, "w1", 2.0);
    let out = f.submit("a", 1.0);
    let (conn, start) = Fixture::sent(&out, "a", "start").unwrap();
    assert_eq!(conn, 1);
    f.register(2, "w2", 2.0);
    let out = f.step(Input::Drain {
        worker: "w1".into(),
    });
    assert!(
        Fixture::sent(&out, "a", "save").is_none(),
        "a starting job is not saved"
    );
    let out = f.ok(1, &start, Fixture::started(1));
    assert_eq!(
        Fixture::sent(&out, "a", "save").map(|s| s.0),
        Some(1),
        "running on a draining worker, it is moved"
    );
}

/// By the progress contract, exit 0 without the final `done` line before the last step is a
/// checkpoint on SIGTERM (say, one its restarted agent did not ask for): restart it, do not
/// call it completed. A job that never printed progress and exits 0 has completed.
#[test]
fn exit_0_before_the_last_step_without_done_is_a_checkpoint_not_a_completion() {
    let mut f = Fixture::running();
    f.progress_of(1, "a", 1, 40, 1000);
    let out = f.exited_0_without_done(1, "a");
    assert_ne!(f.state("a"), JobState::Completed);
    assert_eq!(
        Fixture::sent(&out, "a", "start").map(|s| s.1.epoch),
        Some(2)
    );
    // No progress at all: its exit 0 is its completion.
    let out = f.submit("quiet", 1.0);
    let (conn, start) = Fixture::sent(&out, "quiet", "start").unwrap();
    f.ok(conn, &start, Fixture::started(conn));
    f.msg(
        conn,
        AgentMessage::Exited(ContainerExited {
            job: "quiet".into(),
            epoch: 1,
            exit_code: 0,
            ..ContainerExited::default()
        }),
    );
    assert_eq!(f.state("quiet"), JobState::Completed);
}

/// Under `converge`, a worker that will drain far later than another gives one job to it, and
/// among equally useful moves the one that loses least since its last checkpoint (here the
/// job that has just checkpointed), saying so.
#[test]
fn converge_evens_out_predicted_finishes_moving_the_job_with_least_work_at_risk() {
    let mut f = Fixture::started_on_w1("converge", &["a", "b"]);
    let hb = |f: &mut Fixture, conn: ConnId, jobs: &[&str]| {
        let jobs = jobs
            .iter()
            .map(|j| JobStatus {
                job: (*j).into(),
                epoch: 1,
                category: None,
                growth_efficiency: None,
                cpu_limit: None,
                cpu_usage: 0.5,
            })
            .collect();
        f.msg(
            conn,
            AgentMessage::Heartbeat(Heartbeat {
                jobs,
                ..Heartbeat::default()
            }),
        )
    };
    hb(&mut f, 1, &["a", "b"]);
    for i in 1..=10u64 {
        f.now += 1.0;
        hb(&mut f, 1, &["a", "b"]);
        f.progress_of(1, "a", 1, 10 * i, 1000);
        f.progress_of(1, "b", 1, 10 * i, 1000);
    }
    // b has just checkpointed; a never has.
    f.checkpointed(1, "b", 1, 100);
    f.register(2, "w2", 1.0);
    let mut save = None;
    for _ in 0..40 {
        hb(&mut f, 1, &["a", "b"]);
        f.heartbeat(2);
        let out = f.advance(1.0);
        if let Some(s) = Fixture::sent(&out, "b", "save").or(Fixture::sent(&out, "a", "save")) {
            save = Some((s, out));
            break;
        }
    }
    let ((conn, cmd), out) = save.expect("a move within the rebalancing interval");
    assert_eq!(
        (conn, cmd.job.as_str()),
        (1, "b"),
        "the job with nothing at risk moves"
    );
    let why = Fixture::event(&out, EventKind::Migration)
        .and_then(|ev| ev.attributes.get("why").cloned())
        .expect("the move says why");
    assert!(why.contains("since its last checkpoint"), "{why}");
    assert_eq!(f.core.job("b").unwrap().state(), JobState::Migrating);
}

/// A move never leaves its destination with more jobs per core than its source had: the
/// marginal alone would move a job from a crowded small worker onto a big worker of short
/// jobs, more crowded still.
#[test]
fn converge_moves_no_job_onto_a_worker_more_crowded_per_core_than_its_own() {
    let mut f = Fixture::new("converge");
    f.register(1, "big", 4.0);
    for k in 0..8 {
        assert_eq!(f.start(&format!("short-{k}"), plain_job(10.0)), 1);
    }
    f.register(2, "small", 1.0);
    for id in ["a", "b"] {
        assert_eq!(
            f.start(id, plain_job(500.0)),
            2,
            "fewest jobs per core: small"
        );
    }
    // By the marginal, `a` adds (500 + 500) / 1 = 1000 s on `small` (behind `b`) and
    // (80 + 500) / 4 = 145 s on `big` (behind the short jobs): a move would gain far more
    // than it costs. But `big` would hold 9 jobs on 4 cores, more than `small`'s 2 on 1.
    for _ in 0..90 {
        f.heartbeat(1);
        f.heartbeat(2);
        let out = f.advance(1.0);
        assert!(
            Fixture::sent(&out, "a", "save").is_none()
                && Fixture::sent(&out, "b", "save").is_none(),
            "a move onto the more crowded worker"
        );
        assert!(Fixture::event(&out, EventKind::Migration).is_none());
    }
    // Once `big` is less crowded than `small` would be, the move is made.
    for k in 0..6 {
        f.exited(1, &format!("short-{k}"), 1, 0, false);
    }
    let mut moved = false;
    for _ in 0..90 {
        f.heartbeat(1);
        f.heartbeat(2);
        let out = f.advance(1.0);
        if Fixture::sent(&out, "a", "save").is_some() || Fixture::sent(&out, "b", "save").is_some()
        {
            moved = true;
            break;
        }
    }
    assert!(
        moved,
        "with 3 jobs on 4 cores after it, big takes one of small's"
    );
}

/// `converge` over more workers than an event lists places from the core's order by crowding
/// (`PriorityPolicy::place_in_band`), scoring only the least crowded workers: its answer (the
/// worker, the reason, the scores its event lists) must be its scan's over every worker.
/// Workers of unequal sizes and speeds register out of id order, jobs of unequal declared
/// works arrive, some finish, one worker drains: the crowding order moves every way.
#[test]
fn converge_read_off_the_crowding_order_places_as_its_scan_does() {
    let mut f = Fixture::new("converge");
    let n = 3 * policy::SCORES_SHOWN;
    f.register_shuffled(n, &[1.0, 1.5]);
    places_from_the_crowding_order_as_the_scan(&mut f, n);
}

/// As [`converge_read_off_the_crowding_order_places_as_its_scan_does`], over groups of alike
/// empty workers larger than an event lists: the order by crowding gives only the first of
/// each group (`PlacementIndex::by_crowd`), and the answers must still be the scan's.
#[test]
fn converge_passing_over_alike_empty_workers_places_as_its_scan_does() {
    let mut f = Fixture::new("converge");
    let n = 5 * policy::SCORES_SHOWN;
    // Groups of 24 and 48 alike workers, more than an event lists, and one of 8, fewer;
    // registered out of id order.
    for k in 0..n {
        let w = (k * 7) % n;
        let (cpus, speed) = match w % 10 {
            0 => (2.0, 1.5),
            1..=3 => (8.0, 1.0),
            _ => (4.0, 1.0),
        };
        f.register_at(w as u64 + 1, &format!("w{w:02}"), cpus, speed);
    }
    let view = f.core.view();
    let given = view.index.by_crowd(policy::SCORES_SHOWN).unwrap().count();
    assert_eq!(
        given,
        8 + 2 * policy::SCORES_SHOWN,
        "every worker is empty: the group of eight whole, and the first {} of each other group",
        policy::SCORES_SHOWN
    );
    places_from_the_crowding_order_as_the_scan(&mut f, n);
}

/// Jobs of unequal sizes and declared works arrive at `f`'s `n` workers, some finish, one
/// worker drains; after each arrival, where a few live jobs would go is asked of `converge`'s
/// placement from the order by crowding and of its scan of every worker, which must agree.
fn places_from_the_crowding_order_as_the_scan(f: &mut Fixture, n: usize) {
    use policy::priority::PriorityPolicy;
    let mut next = lcg(12345);
    let policy = PriorityPolicy::converge(60.0);
    let mut banded = 0;
    for j in 0..8 * n {
        if j == 2 * n {
            f.step(Input::Drain {
                worker: "w05".into(),
            });
        }
        let id = format!("j{j}");
        let out = f.step(Input::Submit {
            id: id.as_str().into(),
            spec: JobSpec {
                cpus: [0.0, 0.5, 1.0, 2.0][next() as usize % 4],
                estimated_runtime_s: [0.0, 60.0, 600.0, 3600.0][next() as usize % 4],
                ..JobSpec::default()
            },
        });
        if let Some((conn, start)) = Fixture::sent(&out, &id, "start") {
            f.ok(conn, &start, Fixture::started(conn));
            if j % 3 == 0 {
                f.exited(conn, &id, 1, 0, false);
            }
        }
        // Where each of a few live jobs would go now (as if it had to move), both ways.
        let view = f.core.view();
        let live: Vec<&Job> = view.jobs.values().filter(|j| !j.is_terminal()).collect();
        for job in live.iter().step_by(live.len() / 4 + 1) {
            let band = policy.place_in_band(job, view);
            banded += usize::from(band.is_some());
            if let Some(band) = band {
                assert_eq!(band, policy.place_scanning(f.now, job, view), "{}", job.id);
            }
        }
    }
    assert!(
        banded > 8 * n,
        "only {banded} placements from the order: the test exercised too little"
    );
}

/// FlowCon over more workers than an event lists is answered from its placer's own index
/// (`Placing::indexed`, `FlowConIndex`), not by scoring every worker: the worker, and the
/// scores the event lists, must be what Alg. 4's scan of every worker gives. Workers report
/// their jobs' categories and growth efficiencies in heartbeats, from a few values 10⁻¹³
/// apart so that scores tie within Alg. 4's 10⁻¹² and the ties chain; workers have unequal
/// sizes (some full for some jobs) and speeds (ties go to power), one drains, and jobs finish.
#[test]
fn flowcon_read_off_its_index_places_as_scoring_every_worker_does() {
    use converge_policy::cluster::{Category, JobRequest};
    use converge_policy::flowcon::FlowConPlacer;
    use policy::placing::Placing;
    let mut f = Fixture::new("flowcon");
    let n = 3 * policy::SCORES_SHOWN;
    f.register_shuffled(n, &[1.0, 2.0]);
    // What each worker's agent reports of its jobs: (job, category, G).
    let mut reports: BTreeMap<ConnId, Vec<(String, Category, f64)>> = BTreeMap::new();
    let mut next = lcg(12345);
    let (mut from_index, mut all_completing) = (0, 0);
    for j in 0..8 * n {
        let cpus = [0.0, 0.5, 1.0, 2.0][next() as usize % 4];
        if j == 2 * n {
            f.step(Input::Drain {
                worker: "w05".into(),
            });
        }
        let need = JobRequest {
            cpus,
            memory_bytes: 0,
        };
        let expected = f.scanned(&mut FlowConPlacer, &need);
        let view = f.core.view();
        let (ids, snaps) = view.snapshots();
        if let Some((w, _)) = &expected {
            let s = FlowConPlacer::score(&snaps[view.index.position(w).unwrap()]);
            all_completing += usize::from(s.nl + s.wl == 0);
        }
        // The core answers from FlowCon's index, not by its scan, whenever something fits.
        let mut placing = Placing::new(Box::new(FlowConPlacer), WorkerMode::FlowCon);
        let indexed = (placing.quick(&need, view)).map(|(shown, _)| ids[shown[0]].clone());
        assert_eq!(
            indexed,
            expected.as_ref().map(|(w, _)| w.clone()),
            "job j{j}: the index's choice"
        );
        from_index += usize::from(indexed.is_some());
        let id = format!("j{j}");
        let out = f.submit_placed(&id, cpus, expected);
        let Some((conn, start)) = Fixture::sent(&out, &id, "start") else {
            continue;
        };
        f.ok(conn, &start, Fixture::started(conn));
        let jobs = reports.entry(conn).or_default();
        if j % 4 == 0 {
            // Every fourth job ends at once, unreported.
            f.exited(conn, &id, 1, 0, false);
        } else {
            let category =
                [Category::New, Category::Watching, Category::Completing][next() as usize % 3];
            let g = [0.01, 0.02, 0.03][next() as usize % 3] + (next() % 3) as f64 * 3e-13;
            jobs.push((id, category, g));
        }
        // The worker's agent reports every job it runs, with one of them moved on a list.
        if let Some(k) = (!jobs.is_empty()).then(|| next() as usize % jobs.len()) {
            jobs[k].1 =
                [Category::New, Category::Watching, Category::Completing][next() as usize % 3];
        }
        let heartbeat = Heartbeat {
            jobs: (jobs.iter())
                .map(|(job, category, g)| JobStatus {
                    job: job.as_str().into(),
                    epoch: 1,
                    category: Some(*category),
                    growth_efficiency: Some(*g),
                    cpu_limit: None,
                    cpu_usage: 0.5,
                })
                .collect(),
            ..Heartbeat::default()
        };
        f.msg(conn, AgentMessage::Heartbeat(heartbeat));
    }
    assert!(
        from_index > 4 * n && all_completing > 0 && all_completing < from_index,
        "{from_index} placements from the index, {all_completing} on all-completing workers: \
         the test exercised too little"
    );
}

/// Spread over more workers than an event lists is answered from the index's order by
/// running jobs (`Placing::ranked`), not by comparing every worker: the worker, and the scores
/// the event lists, must be what comparing every worker gives. Workers register out of id
/// order (the order is rebuilt when one goes in before others), with unequal sizes so that
/// some are full for some jobs, one drains, and jobs finish, so the order moves both ways.
#[test]
fn spread_read_off_the_order_by_running_jobs_places_as_comparing_every_worker_does() {
    use converge_policy::baseline::Spread;
    use converge_policy::cluster::JobRequest;
    use policy::placing::Placing;
    let mut f = Fixture::new("spread");
    let n = 3 * policy::SCORES_SHOWN;
    f.register_shuffled(n, &[1.0]);
    let mut next = lcg(12345);
    let mut placed = 0;
    for j in 0..8 * n {
        let cpus = [0.0, 0.5, 1.0, 2.0][next() as usize % 4];
        if j == 2 * n {
            f.step(Input::Drain {
                worker: "w05".into(),
            });
        }
        let need = JobRequest {
            cpus,
            memory_bytes: 0,
        };
        let expected = f.scanned(&mut Spread, &need);
        let ids = f.core.view().index.ids();
        // The core answers from the order, not by Spread's scan, whenever something fits.
        let ranked = Placing::new(Box::new(Spread), WorkerMode::Free).ranked(&need, f.core.view());
        assert_eq!(
            ranked.map(|shown| ids[shown[0]].clone()),
            expected.as_ref().map(|(w, _)| w.clone()),
            "job j{j}: the order's first fitting worker"
        );
        let id = format!("j{j}");
        let out = f.submit_placed(&id, cpus, expected);
        if let Some((conn, start)) = Fixture::sent(&out, &id, "start") {
            placed += 1;
            f.ok(conn, &start, Fixture::started(conn));
            // Every third job ends at once: its worker's count goes down again.
            if j % 3 == 0 {
                f.exited(conn, &id, 1, 0, false);
            }
        }
    }
    assert!(
        placed > n,
        "only {placed} jobs placed: the test exercised too little"
    );
}

/// w1 ran epoch 1 of `a`; the job now restores on w2 (epoch 2). w1's agent answers the
/// restore's Start (a command it was never sent, whose id is easy to guess) under its own old
/// epoch: the result must be refused and counted, not make `a` Running on w1.
#[test]
fn a_result_from_a_past_incarnation_for_the_current_command_is_refused() {
    let (mut f, start) = Fixture::restoring();
    assert_eq!(start.epoch, 2);
    // Straight to the core: the fixture's own check after the step (every current
    // incarnation is among the job's incarnations) would stop the test first.
    let out = f.core.step(
        f.now,
        Input::Agent {
            conn: 1,
            message: AgentMessage::Result(CommandResult {
                command: start.id.clone(),
                job: "a".into(),
                epoch: 1,
                ok: true,
                error: String::new(),
                detail: Fixture::started(1),
            }),
        },
    );
    let job = f.core.job("a").unwrap();
    assert_eq!(
        (job.state(), job.worker().map(WorkerId::as_str)),
        (JobState::Migrating, Some("w2")),
        "w1's answer to w2's Start was applied: {out:?}"
    );
    assert_eq!(Fixture::refused(&out, Refusal::ForeignJob), 1, "{out:?}");
}

/// Never two incarnations: `a` ran on w1 (epoch 1), moved to w2 (epoch 2) and is now being
/// saved on w2 for w3. w1's agent answers w2's Save as done under its old epoch: no restore may be
/// started while w2's incarnation has not been saved.
#[test]
fn a_save_answered_by_a_past_incarnations_worker_starts_no_second_incarnation() {
    let mut f = Fixture::running();
    f.register(3, "w3", 2.0);
    let start = f.a_saved_for_w2();
    f.ok(2, &start, Fixture::started(2));
    assert_eq!(
        (f.state("a"), f.epoch("a")),
        (JobState::Running, 2),
        "runs on w2"
    );
    // A second move, w2 -> w3: w2 is told to save epoch 2.
    assert!(
        f.core
            .begin_move("a", "w3", MoveReason::Rebalance, BTreeMap::new())
    );
    let out = std::mem::take(&mut f.core.out);
    let (conn, save2) = Fixture::sent(&out, "a", "save").unwrap();
    assert_eq!((conn, save2.epoch), (2, 2));
    // w1 claims that save, speaking of its own epoch 1.
    let out = f.msg(
        1,
        AgentMessage::Result(CommandResult {
            command: save2.id.clone(),
            job: "a".into(),
            epoch: 1,
            ok: true,
            error: String::new(),
            detail: Fixture::saved(),
        }),
    );
    assert!(
        Fixture::sent(&out, "a", "start").is_none(),
        "a restore was started while w2's incarnation still runs unsaved: {out:?}"
    );
    assert_eq!(
        f.core.job("a").unwrap().worker().map(WorkerId::as_str),
        Some("w2")
    );
}

/// A failed move leaves the job restartable, never stuck: the source's agent restarts while
/// `a` is being saved; the container saved and exited (0, no `done` line) meanwhile, so the
/// Save's result died with the old agent. The new agent registers listing the exited
/// container and reports its exit (as `NodeCore::adopted` does for `Found::Exited`). The move
/// must go on (restore on w2 or wait as Pending), not stay Migrating/Saving forever.
#[test]
fn a_save_whose_container_exited_while_its_agent_restarted_goes_on_from_the_checkpoint() {
    let (mut f, _save) = Fixture::saving();
    f.agent_restarted_after_its_exit("a", 10, false);
    for _ in 0..120 {
        f.heartbeat(5);
        f.heartbeat(2);
        f.advance(1.0);
    }
    let job = f.core.job("a").unwrap();
    assert!(
        matches!(
            &job.phase,
            JobPhase::Migrating(Move {
                phase: MovePhase::Restoring { .. },
                to,
                ..
            }) if to == "w2"
        ),
        "not restoring on w2 two minutes after its container exited: {:?} ({})",
        job.phase,
        job.reason
    );
}

/// The same for a stop at convergence: the agent restarts after the container saved and
/// exited, the Save's result is lost with it; the job must not stay Stopping forever.
#[test]
fn a_stop_at_convergence_whose_container_exited_while_its_agent_restarted_completes() {
    let mut f = Fixture::new("spread");
    f.register(1, "w1", 2.0);
    f.step(Input::Submit {
        id: "a".into(),
        spec: JobSpec {
            cpus: 1.0,
            stop: Some(converge_policy::estimate::StopRule {
                min_improvement: 0.01,
                window_steps: 100,
            }),
            ..JobSpec::default()
        },
    });
    let (_, start) = Fixture::sent(&f.effects.clone(), "a", "start").unwrap();
    f.ok(1, &start, Fixture::started(1));
    // Flat loss: the rule fires once a window of history is there.
    for k in (0..=200).step_by(50) {
        f.now += 1.0;
        f.msg(
            1,
            AgentMessage::Progress(ProgressBatch {
                samples: vec![ProgressSample {
                    job: "a".into(),
                    epoch: 1,
                    unix_ms: (f.now * 1000.0) as i64,
                    step: k,
                    total_steps: Some(1_000_000),
                    value: Some(1.0),
                    checkpointed: false,
                }],
                malformed: vec![],
            }),
        );
    }
    assert_eq!(f.state("a"), JobState::Stopping);
    f.agent_restarted_after_its_exit("a", 200, false);
    f.only_beating(5, 120);
    let job = f.core.job("a").unwrap();
    assert_eq!(
        job.state(),
        JobState::Completed,
        "not completed two minutes after its container exited ({})",
        job.reason
    );
}

/// A job cancelled while the Stop cannot reach its container (its agent cut off: no stream,
/// or a stream that broke with the Stop unread) is stopped when the agent comes back, even
/// once enough other jobs finished for it to be archived out of memory (`keep_finished`, 2
/// here): otherwise the container of a job every API calls Cancelled would run on,
/// unaccounted for. Once the agent no longer reports the container, nothing is owed.
#[test]
fn a_job_cancelled_while_its_agent_was_away_is_stopped_when_it_returns_even_if_archived() {
    for stream_gone_first in [true, false] {
        let mut f = Fixture::running();
        let disconnect = Input::Disconnected {
            conn: 1,
            reason: "network blip".into(),
        };
        if stream_gone_first {
            f.step(disconnect.clone());
        }
        f.step(Input::Cancel {
            id: "a".into(),
            by: String::new(),
        });
        if !stream_gone_first {
            // The Stop went out on a stream that broke before the agent read it.
            f.step(disconnect);
        }
        assert_eq!(f.state("a"), JobState::Cancelled);
        // Two more jobs finish on w2: `a` is the oldest of three finished, so it is archived.
        for id in ["b", "c"] {
            let out = f.submit(id, 1.0);
            let (conn, start) = Fixture::sent(&out, id, "start").expect("placed");
            assert_eq!(conn, 2);
            f.ok(conn, &start, Fixture::started(conn));
            f.exited(conn, id, start.epoch, 0, false);
            assert_eq!(f.state(id), JobState::Completed);
        }
        assert!(f.core.job("a").is_none(), "a was archived");
        // w1's agent comes back within its fence time and reports a's container running.
        let out = f.reregister(3, "w1", 2.0, &[("a", 1, 5)]);
        let (conn, stop) = Fixture::sent(&out, "a", "stop")
            .unwrap_or_else(|| panic!("the cancelled job's container was left running: {out:?}"));
        assert_eq!((conn, stop.epoch), (3, 1), "{stream_gone_first}");
        // It exits: nothing is owed any more, and the worker's record says so.
        f.exited(3, "a", 1, 143, false);
        assert!(
            f.core.worker("w1").unwrap().stops_owed.is_empty(),
            "{stream_gone_first}"
        );
    }
}

/// A job cancelled while its Start is under way: the agent finds no container to stop yet
/// (the Stop is answered with an error) and then starts one. Its Started result must get it
/// stopped, not ignored as a finished job's.
#[test]
fn a_job_cancelled_while_starting_has_its_container_stopped_once_started() {
    let mut f = Fixture::new("spread");
    f.register(1, "w1", 2.0);
    let out = f.submit("a", 1.0);
    let (_, start) = Fixture::sent(&out, "a", "start").expect("placed");
    let out = f.step(Input::Cancel {
        id: "a".into(),
        by: String::new(),
    });
    let (_, early) = Fixture::sent(&out, "a", "stop").expect("told to stop at once");
    f.msg(
        1,
        AgentMessage::Result(CommandResult {
            command: early.id.clone(),
            job: "a".into(),
            epoch: early.epoch,
            ok: false,
            error: "no running container of job a (epoch 1) on worker w1".into(),
            detail: ResultDetail::None,
        }),
    );
    let out = f.ok(1, &start, Fixture::started(1));
    let (conn, stop) = Fixture::sent(&out, "a", "stop")
        .unwrap_or_else(|| panic!("the container started after the cancel runs on: {out:?}"));
    assert_eq!((conn, stop.epoch), (1, start.epoch));
    assert_eq!(f.state("a"), JobState::Cancelled);
    // Owed until answered.
    assert_eq!(f.core.worker("w1").unwrap().stops_owed.len(), 1);
    f.ok(1, &stop, ResultDetail::None);
    assert!(f.core.worker("w1").unwrap().stops_owed.is_empty());
}

/// Stops answered with errors (no container: the job was cancelled while starting, and its
/// Start failed) are owed no longer: a worker whose agent stays connected does not collect
/// them.
#[test]
fn an_answered_stop_is_owed_no_longer_even_when_it_found_no_container() {
    let mut f = Fixture::new("spread");
    f.register(1, "w1", 2.0);
    for k in 0..5 {
        let id = format!("j{k}");
        let out = f.submit(&id, 1.0);
        let (_, start) = Fixture::sent(&out, &id, "start").expect("placed");
        let out = f.step(Input::Cancel {
            id: id.as_str().into(),
            by: String::new(),
        });
        let (_, stop) = Fixture::sent(&out, &id, "stop").expect("told to stop");
        assert_eq!(f.core.worker("w1").unwrap().stops_owed.len(), 1);
        f.fail(1, &stop, "no running container of the job on worker w1");
        f.fail(1, &start, "image not found");
        assert_eq!(f.state(&id), JobState::Cancelled);
    }
    let owed = &f.core.worker("w1").unwrap().stops_owed;
    assert!(owed.is_empty(), "{owed:?}");
}

/// A job that printed its last step and exited 0 while being saved, its agent restarting
/// meanwhile, is complete: the new agent's report of the exit says so, and it is not
/// restored.
#[test]
fn a_job_that_finished_while_being_saved_is_not_restored_after_its_agent_restarted() {
    let (mut f, _save) = Fixture::saving();
    f.agent_restarted_after_its_exit("a", 100, true);
    let job = f.core.job("a").unwrap();
    assert_eq!(
        (job.state(), f.starts("a")),
        (JobState::Completed, 1),
        "{:?} ({})",
        job.phase,
        job.reason
    );
}

/// A container that dies on its own before the drain's Save reaches it (its agent the same,
/// its stream unbroken): the exit, asked for by no one, moves the job on to its restore, and
/// the Save's error that follows (no container) changes nothing. Before, the error read as
/// "the save failed, it runs on", for a job with nothing running.
#[test]
fn a_container_that_died_before_its_save_arrived_is_restored_not_taken_to_run_on() {
    let (mut f, save) = Fixture::saving();
    f.exited(1, "a", 1, 137, false);
    let job = f.core.job("a").unwrap();
    assert!(
        matches!(&job.phase, JobPhase::Migrating(Move { phase: MovePhase::Restoring { .. }, to, .. }) if to == "w2"),
        "{:?} ({})",
        job.phase,
        job.reason
    );
    f.fail(
        1,
        &save,
        "no running container of job a (epoch 1) on worker w1",
    );
    assert_eq!(
        f.core.job("a").unwrap().worker().map(WorkerId::as_str),
        Some("w2")
    );
}

/// An agent sends again, on its next stream, every result, exit and migration request its
/// manager had not acknowledged (`messenger::agent`), and some of them the core has already
/// taken: they are late duplicates. A move's Saved result, its source's exit and its restore's
/// Started result, each taken twice, the second time after a reconnect, and the source's
/// migration request for the incarnation that moved: nothing is refused, no second restore or
/// move is sent, and the job runs where it was restored; a finished job's repeated exit leaves
/// it completed. (A repeated request for the incarnation that runs is decided once by SpeCon:
/// `a_converged_job_moves_by_specon_alg2_once`.)
#[test]
fn results_and_exits_sent_again_after_a_reconnect_are_taken_as_duplicates() {
    let (mut f, start) = Fixture::restoring();
    let (_, save) = Fixture::sent(&f.effects, "a", "save").expect("the move's save");
    f.exited(1, "a", 1, 0, true);
    f.ok(2, &start, Fixture::started(2));
    assert_eq!((f.state("a"), f.epoch("a")), (JobState::Running, 2));
    let starts = f.starts("a");
    // w1 and w2 reconnect, and send again what they had not seen acknowledged.
    let mut out = f.reregister(3, "w1", 2.0, &[]);
    out.extend(f.ok(3, &save, Fixture::saved()));
    out.extend(f.exited(3, "a", 1, 0, true));
    out.extend(f.msg(
        3,
        AgentMessage::MigrationRequest {
            job: "a".into(),
            epoch: 1,
            reason: "converged".into(),
        },
    ));
    out.extend(f.reregister(4, "w2", 2.0, &[("a", 2, 0)]));
    out.extend(f.ok(4, &start, Fixture::started(2)));
    let refused = out
        .iter()
        .filter(|e| matches!(e, Effect::Refused { .. }))
        .count();
    assert_eq!(refused, 0, "a duplicate was refused: {out:?}");
    assert_eq!(
        f.starts("a"),
        starts,
        "a duplicate started it again: {out:?}"
    );
    assert_eq!(
        (f.state("a"), f.epoch("a")),
        (JobState::Running, 2),
        "{out:?}"
    );
    // It finishes; its exit comes twice.
    f.exited(4, "a", 2, 0, false);
    assert_eq!(f.state("a"), JobState::Completed);
    let out = f.exited(4, "a", 2, 0, false);
    assert_eq!(f.state("a"), JobState::Completed, "{out:?}");
    assert_eq!(f.starts("a"), starts);
}

/// A job that failed at once: its Started result and its exit went out on one stream, and
/// neither was acknowledged when it broke. The agent sends both again after its next Register,
/// in the order written. The repeated Started result found the job Failed and was taken for
/// one of a job cancelled while starting: a Stop went out for an incarnation whose exit the
/// core already had.
#[test]
fn a_started_result_sent_again_for_a_job_that_ended_since_sends_no_stop() {
    let mut f = Fixture::new("spread");
    f.register(1, "w1", 2.0);
    let out = f.submit("a", 1.0);
    let (conn, start) = Fixture::sent(&out, "a", "start").expect("placed");
    assert_eq!(conn, 1);
    f.ok(1, &start, Fixture::started(1));
    f.exited(1, "a", 1, 1, false);
    assert_eq!(f.state("a"), JobState::Failed);
    // The stream breaks; w1 registers again (its container listed, exited: not yet
    // acknowledged) and sends again what was not acknowledged.
    let mut out = f.step(Input::Disconnected {
        conn: 1,
        reason: "stream broke".into(),
    });
    out.extend(f.step(Input::Connected {
        conn: 3,
        register: Register {
            worker: "w1".into(),
            cpu_capacity: 2.0,
            instance_id: "w1-a".into(),
            containers: vec![ContainerReport {
                job: "a".into(),
                epoch: 1,
                container_id: "a-1".into(),
                running: false,
                paused: false,
                last_step: None,
                exit: None,
            }],
            ..Register::default()
        },
    }));
    out.extend(f.ok(3, &start, Fixture::started(1)));
    out.extend(f.exited(3, "a", 1, 1, false));
    assert_eq!(f.state("a"), JobState::Failed);
    assert!(
        Fixture::sent(&out, "a", "stop").is_none(),
        "a repeated Started result of a job that had already ended sent a Stop: {out:?}"
    );
}

/// A drain that finds no room for a job elsewhere says so, in its reason and once in its
/// events (`why`), and the job runs on (a walk: a drain moved nothing and said nothing).
#[test]
fn a_drain_that_cannot_move_a_job_says_so_once() {
    let mut f = Fixture::new("spread");
    f.register(1, "w1", 1.0);
    f.register(2, "w2", 1.0);
    for id in ["a", "b", "c", "d"] {
        let out = f.submit(id, 0.5);
        let (conn, start) = Fixture::sent(&out, id, "start").unwrap();
        f.ok(conn, &start, Fixture::started(conn));
    }
    let on_w2: Vec<&str> = ["a", "b", "c", "d"]
        .into_iter()
        .filter(|id| f.core.job(id).unwrap().worker().is_some_and(|w| w == "w2"))
        .collect();
    assert_eq!(on_w2.len(), 2);
    let mut out = f.step(Input::Drain {
        worker: "w2".into(),
    });
    // Submissions that wait make the core settle (and so go over the drain) again.
    for k in 0..3 {
        out.extend(f.submit(&format!("x{k}"), 0.5));
        out.extend(f.heartbeat(1));
        out.extend(f.heartbeat(2));
        out.extend(f.advance(1.0));
    }
    for id in on_w2 {
        let j = f.core.job(id).unwrap();
        assert_eq!(j.state(), JobState::Running);
        assert_eq!(j.reason, "w2 is draining; waiting for a worker with room");
        let said: Vec<&Event> = (out.iter())
            .filter_map(|e| match e {
                Effect::Event(e) if e.kind == EventKind::Migration => Some(e),
                _ => None,
            })
            .filter(|e| e.job.as_deref() == Some(id))
            .collect();
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(
            said[0].reason.starts_with("not moved off w2, which drains"),
            "{}",
            said[0].reason
        );
        // Counted and shown as a move declined, not as one under way.
        assert_eq!(
            said[0].attributes.get("outcome").map(String::as_str),
            Some("declined")
        );
    }
}

/// A lost job has no ETA: whether it still runs is not known (it kept the ETA it had for as
/// long as its worker was away: a walk).
#[test]
fn a_lost_job_has_no_eta() {
    let mut f = Fixture::running();
    for s in 1..=3u64 {
        f.now += 1.0;
        f.heartbeat_uses(1, &[("a", 1.0)]);
        f.progress_of(1, "a", 1, 50 * s, 1000);
    }
    assert!(f.core.eta("a", f.now).is_some(), "running, it has one");
    f.step(Input::Disconnected {
        conn: 1,
        reason: "cut".into(),
    });
    for _ in 0..5 {
        f.heartbeat(2);
        f.advance(1.0);
    }
    assert_eq!(f.state("a"), JobState::Lost);
    assert_eq!(f.core.eta("a", f.now), None);
}

/// A job's ETA holds when one report shows every job using less than its part, as on a host
/// busy with other work: read off that report alone, each was taken for one that can use no
/// more, and the forecast ran it at that use to its end (a walk: a waiting job's ETA flipped
/// between 7 and 63 min from one sample to the next, five seconds apart).
#[test]
fn an_eta_holds_through_a_dip_in_use() {
    let mut f = Fixture::new("converge");
    f.register(1, "w1", 1.0);
    let jobs = ["a", "b", "c"];
    for id in jobs {
        let out = f.submit(id, 0.3);
        let (_, start) = Fixture::sent(&out, id, "start").unwrap();
        f.ok(1, &start, Fixture::started(1));
    }
    let mut steps = [0u64; 3];
    // One second: each job makes 100 steps a core-second at `load` of the part its weight
    // gives it, and reports that use.
    let second = |f: &mut Fixture, steps: &mut [u64; 3], load: f64| {
        let weights = jobs.map(|j| f64::from(shares_sent(f, j).unwrap_or(1024)));
        let total: f64 = weights.iter().sum();
        f.now += 1.0;
        let mut uses = Vec::new();
        for (k, j) in jobs.into_iter().enumerate() {
            let used = load * weights[k] / total;
            steps[k] += (used * 100.0) as u64;
            f.progress_of(1, j, 1, steps[k], 30_000);
            uses.push((j, used));
        }
        f.heartbeat_uses(1, &uses);
    };
    for _ in 0..30 {
        second(&mut f, &mut steps, 1.0);
    }
    let left = |f: &Fixture, j: &str| f.core.eta(j, f.now).unwrap().finish_at - f.now;
    let before = jobs.map(|j| left(&f, j));
    second(&mut f, &mut steps, 0.5);
    for (k, j) in jobs.into_iter().enumerate() {
        let ratio = left(&f, j) / before[k];
        assert!((0.9..1.1).contains(&ratio), "{j}: {ratio:.2} of before");
    }
}

/// A job held back behind a shorter one on a busy host uses less than the little its weight
/// gives it; that use is not all it can use, as it showed when it ran ahead. Where a job had
/// left the worker since (here a job that failed at once), the forecast read only the reports
/// since, and the held use was read as its cap: its ETA ran it at that use to its end (a walk:
/// 13 to 29 minutes for a job that ended 1 to 10 minutes later, each time a shorter job was
/// placed ahead of it as another ended, and after a manager's restart).
#[test]
fn a_held_back_job_on_a_busy_host_is_forecast_at_what_it_showed_it_can_use() {
    let mut f = Fixture::new("converge");
    f.register(1, "w1", 1.0);
    f.start("long", spec(0.3));
    // Alone: 95 steps a second at 0.95 cores (100 a core-second).
    let mut long = 0;
    for _ in 0..10 {
        f.now += 1.0;
        long += 95;
        f.progress_of(1, "long", 1, long, 20_000);
        f.heartbeat_uses(1, &[("long", 0.95)]);
    }
    // A shorter job placed ahead of it, and one that fails at once; on a host busy with
    // other work, both running jobs get half their parts.
    f.start("short", spec(0.3));
    f.start("blip", spec(0.3));
    f.exited(1, "blip", 1, 1, false);
    let mut short = 0;
    busy_seconds(&mut f, 1, 10, (&mut short, &mut long));
    long_is_forecast_at_the_whole_core_once_short_ends(&f, long);
    // And across a manager's restart, whose first reports read afresh.
    f.restart("converge", 30.0);
    f.reregister(2, "w1", 1.0, &[("short", 1, short), ("long", 1, long)]);
    busy_seconds(&mut f, 2, 5, (&mut short, &mut long));
    long_is_forecast_at_the_whole_core_once_short_ends(&f, long);
}

/// `seconds` of `short` (2,000 steps) ahead of `long` (20,000) on a host busy with other work,
/// reported on stream `conn`: each gets half its part of the core (0.45 and 0.08), at 100
/// steps a core-second.
fn busy_seconds(f: &mut Fixture, conn: ConnId, seconds: u32, (short, long): (&mut u64, &mut u64)) {
    for _ in 0..seconds {
        f.now += 1.0;
        *short += 45;
        *long += 8;
        f.progress_of(conn, "short", 1, *short, 2_000);
        f.progress_of(conn, "long", 1, *long, 20_000);
        f.heartbeat_uses(conn, &[("short", 0.45), ("long", 0.08)]);
    }
}

/// `long`'s use, 0.08 cores, reads as its cap by its part alone; its ETA is nonetheless at
/// the whole core once `short` ends: well under twice its work left (at 0.08 cores, 12 times
/// it).
fn long_is_forecast_at_the_whole_core_once_short_ends(f: &Fixture, long: u64) {
    let long_shares = f64::from(shares_sent(f, "long").expect("a weight for long"));
    let short_shares = f64::from(shares_sent(f, "short").expect("a weight for short"));
    let part = long_shares / (long_shares + short_shares);
    assert!(
        (0.1..0.2).contains(&part) && 0.08 < 0.8 * part,
        "the use reads as a cap by the part alone: {part}"
    );
    let left = (20_000 - long) as f64 / 100.0;
    let eta = f.core.eta("long", f.now).expect("an ETA");
    assert!(eta.remaining_s < 2.0 * left, "{eta:?} for {left} core-s");
}

/// A job's ETA holds across a manager's restart: the lines and heartbeats after it counted the
/// steps made while the manager was down against the service of before (the service is
/// counted at heartbeats; a point took it as of the line's arrival), and the ETA swung to a
/// quarter, then four times, of what it was (a walk: 57 min, 2 h, 4 min within 30 s).
#[test]
fn an_eta_holds_across_a_manager_restart() {
    let mut f = Fixture::started_on_w1("converge", &["a", "b"]);
    // Each second both report their steps (100 a core-second, at the parts their weights
    // give them) and a heartbeat their use.
    let mut steps = [0u64, 0u64];
    fn second(f: &mut Fixture, conn: ConnId, steps: &mut [u64; 2]) {
        let weight = |job| f64::from(shares_sent(f, job).unwrap_or(1024));
        let (wa, wb) = (weight("a"), weight("b"));
        let (ua, ub) = (wa / (wa + wb), wb / (wa + wb));
        f.now += 1.0;
        steps[0] += (ua * 100.0) as u64;
        steps[1] += (ub * 100.0) as u64;
        f.progress_of(conn, "a", 1, steps[0], 200_000);
        f.progress_of(conn, "b", 1, steps[1], 200_000);
        f.heartbeat_uses(conn, &[("a", ua), ("b", ub)]);
    }
    for _ in 0..60 {
        second(&mut f, 1, &mut steps);
    }
    let left = |f: &Fixture, j: &str| f.core.eta(j, f.now).unwrap().finish_at - f.now;
    let before = [left(&f, "a"), left(&f, "b")];
    // The manager is down for 20 s while the jobs go on at the parts they had.
    f.now += 20.0;
    steps[0] += 20 * 83;
    steps[1] += 20 * 17;
    f.restart("converge", 30.0);
    f.reregister(2, "w1", 1.0, &[("a", 1, steps[0]), ("b", 1, steps[1])]);
    for s in 1..=30 {
        second(&mut f, 2, &mut steps);
        for (k, job) in ["a", "b"].into_iter().enumerate() {
            // Down by the time gone by, give or take a few percent.
            let ratio = left(&f, job) / (before[k] - 20.0 - s as f64);
            assert!(
                (0.95..1.05).contains(&ratio),
                "{job}, {s} s after: {ratio:.2} of before"
            );
        }
    }
}
