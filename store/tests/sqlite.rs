//! The SQLite store against real files: what a core wrote comes back as the same core, and a
//! file that is not a readable store of this version is refused with what to do.

use converge_core::cluster::policy::{PolicyConfig, by_name};
use converge_core::cluster::saved::Saved;
use converge_core::cluster::types::*;
use converge_core::cluster::{Config, Core, Effect, Input};
use converge_store::{
    Batch, Error, FILE_NAME, JobQuery, PendingBackup, SCHEMA_VERSION, Sqlite, Store, StoredEvent,
};

fn core() -> Core {
    Core::new(
        Config {
            id_prefix: "m1".into(),
            ..Config::default()
        },
        by_name("spread", &PolicyConfig::default()).unwrap(),
    )
}

/// `core` takes `input` at `now`, and what the step changed is written as the manager writes
/// it (soft changes too, as a manager that stops writes them all).
fn step_stored(store: &mut Sqlite, core: &mut Core, now: f64, input: Input) -> Vec<Effect> {
    let out = core.step(now, input);
    let changes = core.take_changes();
    let counters = core.counters();
    let batch = Batch {
        jobs: changes
            .jobs
            .iter()
            .chain(&changes.soft)
            .filter_map(|j| core.job(j))
            .collect(),
        workers: changes
            .workers
            .iter()
            .filter_map(|w| core.worker(w))
            .collect(),
        forgotten_workers: changes.forgotten.iter().map(|w| w.as_ref()).collect(),
        counters: Some(&counters),
        history_changed: changes.history,
        ..Batch::default()
    };
    store.commit(&batch).unwrap();
    out
}

/// A submission with nothing but an id.
fn submit(id: &str) -> Input {
    Input::Submit {
        id: id.into(),
        spec: JobSpec::default(),
    }
}

/// Three workers, three jobs: one running with progress, one being moved by a drain, one
/// pending; the records of every step written as the manager writes them.
fn busy_core(store: &mut Sqlite) -> Core {
    let mut core = core();
    let mut now = 100.0;
    let mut step = |core: &mut Core, input: Input| {
        now += 1.0;
        step_stored(store, core, now, input)
    };
    for (conn, w) in [(1, "w1"), (2, "w2")] {
        step(
            &mut core,
            Input::Connected {
                conn,
                register: Register {
                    worker: w.into(),
                    cpu_capacity: 1.0,
                    ..Register::default()
                },
            },
        );
    }
    let mut starts = Vec::new();
    for id in ["a", "b", "c"] {
        let out = step(
            &mut core,
            Input::Submit {
                id: id.into(),
                spec: JobSpec {
                    // c fits nowhere: it stays pending.
                    cpus: if id == "c" { 2.0 } else { 1.0 },
                    ..JobSpec::default()
                },
            },
        );
        starts.extend(out.into_iter().filter_map(|e| match e {
            Effect::Send { conn, command, .. } => Some((conn, command)),
            _ => None,
        }));
    }
    for (conn, c) in &starts {
        step(
            &mut core,
            Input::Agent {
                conn: *conn,
                message: AgentMessage::Result(CommandResult {
                    command: c.id.clone(),
                    job: c.job.clone(),
                    epoch: c.epoch,
                    ok: true,
                    error: String::new(),
                    detail: ResultDetail::Started {
                        container_id: format!("ctr-{}", c.job),
                    },
                }),
            },
        );
        step(
            &mut core,
            Input::Agent {
                conn: *conn,
                message: AgentMessage::Progress(ProgressBatch {
                    samples: (1..=40)
                        .map(|s| ProgressSample {
                            job: c.job.clone(),
                            epoch: c.epoch,
                            unix_ms: 1_000 * s,
                            step: s as u64,
                            total_steps: Some(1000),
                            value: Some(1.0 / s as f64),
                            checkpointed: s % 10 == 0,
                        })
                        .collect(),
                    malformed: vec![],
                }),
            },
        );
    }
    step(
        &mut core,
        Input::Drain {
            worker: "w1".into(),
        },
    );
    // Room appears: w1's job starts to move there.
    step(
        &mut core,
        Input::Connected {
            conn: 3,
            register: Register {
                worker: "w3".into(),
                cpu_capacity: 1.0,
                ..Register::default()
            },
        },
    );
    core
}

fn debug_jobs(saved: &Saved) -> Vec<String> {
    saved.jobs.iter().map(|j| format!("{j:?}")).collect()
}

#[test]
fn what_a_core_wrote_comes_back_as_the_same_core() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Sqlite::open(dir.path()).unwrap();
    let before = busy_core(&mut store);
    let states: Vec<_> = before.jobs().values().map(|j| j.state()).collect();
    assert!(states.contains(&JobState::Migrating), "{states:?}");
    assert!(states.contains(&JobState::Pending), "{states:?}");
    drop(store);

    let mut store = Sqlite::open(dir.path()).unwrap();
    let got = store.load(10, usize::MAX).unwrap();
    let after = Core::from_saved(
        Config::default(),
        by_name("spread", &PolicyConfig::default()).unwrap(),
        got.saved.clone(),
        1_000.0,
        10.0,
    )
    .unwrap();
    assert_eq!(after.counters(), before.counters());
    for (id, j) in before.jobs().iter() {
        let a = after.job(id).expect("every job comes back");
        assert_eq!(
            (a.state(), a.epoch, a.worker(), a.step, &a.reason, &a.phase),
            (j.state(), j.epoch, j.worker(), j.step, &j.reason, &j.phase),
            "job {id}"
        );
        // The history is kept down to its newest points.
        let kept = converge_core::cluster::progress::STORED_PROGRESS;
        assert_eq!(a.progress.len(), kept.min(j.progress.len()));
        assert_eq!(a.progress.back(), j.progress.back());
        assert_eq!(a.checkpoint_step, j.checkpoint_step);
    }
    for (id, w) in before.workers().iter() {
        let a = after.worker(id).expect("every worker comes back");
        assert_eq!(
            (a.state, &a.jobs, a.conn),
            (w.state, &w.jobs, None),
            "worker {id}"
        );
    }
    // Loading twice gives the same records.
    let again = store.load(10, usize::MAX).unwrap();
    assert_eq!(debug_jobs(&again.saved), debug_jobs(&got.saved));
}

#[test]
fn a_forgotten_worker_leaves_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Sqlite::open(dir.path()).unwrap();
    let mut core = core();
    for (conn, w) in [(1, "w1"), (2, "w2")] {
        let register = Register {
            worker: w.into(),
            cpu_capacity: 1.0,
            ..Register::default()
        };
        step_stored(
            &mut store,
            &mut core,
            1.0,
            Input::Connected { conn, register },
        );
    }
    // w1's agent is gone long enough to be lost (w2's too; it is kept).
    let gone = Input::Disconnected {
        conn: 1,
        reason: "host died".into(),
    };
    step_stored(&mut store, &mut core, 2.0, gone);
    step_stored(&mut store, &mut core, 100.0, Input::Tick);
    let forget = Input::Forget {
        worker: "w1".into(),
    };
    let out = step_stored(&mut store, &mut core, 101.0, forget);
    assert!(matches!(out.last(), Some(Effect::Reply(Ok(_)))), "{out:?}");
    drop(store);
    let got = Sqlite::open(dir.path()).unwrap().load(10, 10).unwrap();
    let ids: Vec<&str> = got.saved.workers.iter().map(|w| w.id.as_ref()).collect();
    assert_eq!(ids, ["w2"]);
}

#[test]
fn events_keep_their_numbers_and_specs_are_written_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Sqlite::open(dir.path()).unwrap();
    // A restart reads the specs of the jobs it loads: job a is one.
    step_stored(&mut store, &mut core(), 1.0, submit("a"));
    let events: Vec<StoredEvent> = (1..=25)
        .map(|seq| StoredEvent {
            seq,
            job: (seq % 2 == 0).then(|| "a".to_string()),
            bytes: vec![seq as u8; 3],
        })
        .collect();
    store
        .commit(&Batch {
            specs: vec![("a", b"first")],
            events: &events[..20],
            ..Batch::default()
        })
        .unwrap();
    store
        .commit(&Batch {
            specs: vec![("a", b"second")],
            events: &events[20..],
            ..Batch::default()
        })
        .unwrap();
    drop(store);
    let got = Sqlite::open(dir.path())
        .unwrap()
        .load(10, usize::MAX)
        .unwrap();
    assert_eq!(got.next_event_seq, 26);
    assert_eq!(got.events, events[15..].to_vec(), "the newest 10, in order");
    assert_eq!(got.specs, vec![("a".to_string(), b"first".to_vec())]);
}

fn refusal(dir: &std::path::Path) -> String {
    match Sqlite::open(dir) {
        Ok(_) => panic!("a bad store was opened"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_file_that_is_not_a_database_is_refused_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(FILE_NAME), vec![0x5a; 8192]).unwrap();
    let why = refusal(dir.path());
    assert!(why.contains("not an SQLite database"), "{why}");
    assert!(why.contains("restore the file from a backup"), "{why}");
    assert!(
        why.contains(&dir.path().join(FILE_NAME).display().to_string()),
        "{why}"
    );
}

#[test]
fn a_truncated_store_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut store = Sqlite::open(dir.path()).unwrap();
        busy_core(&mut store);
    }
    // Fold the WAL into the main file (as a clean shutdown does), then cut it.
    let path = dir.path().join(FILE_NAME);
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);").unwrap();
    }
    let len = std::fs::metadata(&path).unwrap().len();
    assert!(len > 4096 * 4, "a store of several pages ({len} bytes)");
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(len / 2 + 100).unwrap();
    drop(f);
    let why = refusal(dir.path());
    assert!(
        why.contains("damaged or truncated") || why.contains("integrity check failed"),
        "{why}"
    );
}

#[test]
fn a_store_of_a_newer_schema_is_refused_and_names_both_versions() {
    let dir = tempfile::tempdir().unwrap();
    drop(Sqlite::open(dir.path()).unwrap());
    {
        let c = rusqlite::Connection::open(dir.path().join(FILE_NAME)).unwrap();
        c.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
    }
    let err = Sqlite::open(dir.path()).err().expect("refused");
    assert!(
        matches!(err, Error::Newer { found, supported, .. } if found == SCHEMA_VERSION + 1 && supported == SCHEMA_VERSION)
    );
    assert!(err.to_string().contains("run the newer manager"), "{err}");
}

/// Refused, and left as it was: the checks come before the pragmas that would have turned
/// the file (in SQLite's default rollback-journal mode) into WAL mode for good.
#[test]
fn another_applications_database_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(FILE_NAME);
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.execute_batch("CREATE TABLE notes (t TEXT); INSERT INTO notes VALUES ('mine');")
            .unwrap();
    }
    let before = std::fs::read(&path).unwrap();
    let why = refusal(dir.path());
    assert!(why.contains("another application"), "{why}");
    let mode: String = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    let after = std::fs::read(&path).unwrap();
    assert_eq!(
        (mode.as_str(), before == after),
        ("delete", true),
        "the refused file was changed (header bytes 18-19, the journal mode: {:?} -> {:?})",
        &before[18..20],
        &after[18..20]
    );
}

#[test]
fn a_second_manager_on_the_same_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _first = Sqlite::open(dir.path()).unwrap();
    let why = refusal(dir.path());
    assert!(why.contains("another manager holds it"), "{why}");
    // What to do about it: not the advice for a damaged file (restore it, move it away).
    assert!(why.contains("stop that manager"), "{why}");
    assert!(!why.contains("restore"), "{why}");
}

/// `--state-dir` given the store's file rather than its directory is named as such (it said
/// "File exists").
#[test]
fn a_state_dir_that_is_the_stores_file_is_refused_with_what_to_pass() {
    let dir = tempfile::tempdir().unwrap();
    drop(Sqlite::open(dir.path()).unwrap());
    let why = refusal(&dir.path().join(FILE_NAME));
    assert!(
        why.contains("is a file: pass the directory that holds it"),
        "{why}"
    );
}

/// The jobs of [`four_finished_one_pending`].
const FIRST_FIVE: [&str; 5] = ["j0", "j1", "j2", "j3", "j4"];

/// Jobs j0..j4 submitted at 1..5 into `store`; j0..j3 finish (cancelled) at 10, 11, 12, 13 in
/// that order, j4 stays pending (no worker). The core, and the ids.
fn four_finished_one_pending(store: &mut Sqlite) -> (Core, [&'static str; 5]) {
    let mut core = core();
    let ids = FIRST_FIVE;
    for (i, id) in ids.iter().enumerate() {
        step_stored(store, &mut core, 1.0 + i as f64, submit(id));
    }
    for (i, id) in ids[..4].iter().enumerate() {
        let cancel = Input::Cancel {
            id: id.into(),
            by: String::new(),
        };
        step_stored(store, &mut core, 10.0 + i as f64, cancel);
    }
    (core, ids)
}

#[test]
fn a_restart_reads_the_live_jobs_and_only_the_newest_finished_ones() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Sqlite::open(dir.path()).unwrap();
    let (mut core, ids) = four_finished_one_pending(&mut store);
    // The oldest finished job had the longest move: it must still count after a restart.
    let mut moved = [
        core.job("j0").unwrap().clone(),
        core.job("j3").unwrap().clone(),
    ];
    moved[0].last_migration_downtime = 7.5.into();
    moved[1].last_migration_downtime = 1.0.into();
    store
        .commit(&Batch {
            jobs: moved.iter().collect(),
            specs: ids.iter().map(|id| (*id, id.as_bytes())).collect(),
            ..Batch::default()
        })
        .unwrap();
    drop(store);

    let got = Sqlite::open(dir.path()).unwrap().load(10, 2).unwrap();
    let loaded: Vec<&str> = got.saved.jobs.iter().map(|j| j.id.as_str()).collect();
    assert_eq!(
        loaded,
        ["j2", "j3", "j4"],
        "the live job and the two that finished last"
    );
    assert_eq!(got.saved.archived_downtime, Some(7.5));
    let specs: Vec<&str> = got.specs.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(specs, ["j2", "j3", "j4"], "only the loaded jobs' specs");
    // The archived ones are still answered for.
    let mut store = Sqlite::open(dir.path()).unwrap();
    assert_eq!(store.jobs(JobQuery::job("j0")).unwrap().len(), 1);
    // A page at a time, by submission number (each job's `seq`): after one, at most so many,
    // in a state.
    let seq = |id: &str| core.job(id).unwrap().seq;
    let page = |store: &mut Sqlite, q: JobQuery| -> Vec<String> {
        (store.jobs(q).unwrap().into_iter())
            .map(|s| s.job.id.to_string())
            .collect()
    };
    let after_j0 = JobQuery {
        after_seq: Some(seq("j0")),
        limit: Some(2),
        ..JobQuery::default()
    };
    assert_eq!(page(&mut store, after_j0), ["j1", "j2"]);
    let cancelled_after_j2 = JobQuery {
        state: Some("cancelled"),
        after_seq: Some(seq("j2")),
        ..JobQuery::default()
    };
    assert_eq!(page(&mut store, cancelled_after_j2), ["j3"]);

    // Every job finished, none kept in memory, no workers, no events loaded: still not a new
    // cluster (its submission numbers must go on).
    step_stored(
        &mut store,
        &mut core,
        20.0,
        Input::Cancel {
            id: "j4".into(),
            by: String::new(),
        },
    );
    let got = store.load(0, 0).unwrap();
    assert!(got.saved.jobs.is_empty() && got.saved.workers.is_empty() && got.events.is_empty());
    assert!(!got.is_empty(), "a store with history is not a first start");
}

#[test]
fn pruning_deletes_only_jobs_finished_before_the_cutoff_with_their_specs() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Sqlite::open(dir.path()).unwrap();
    let (_core, ids) = four_finished_one_pending(&mut store);
    store
        .commit(&Batch {
            specs: ids.iter().map(|id| (*id, id.as_bytes())).collect(),
            ..Batch::default()
        })
        .unwrap();
    let stored = |store: &mut Sqlite| -> Vec<String> {
        let jobs = store.jobs(JobQuery::default()).unwrap();
        jobs.into_iter().map(|j| j.job.id.to_string()).collect()
    };

    // A limit of one takes one of the two due; the next pass the other; then none is due.
    assert_eq!(store.prune_finished(12.0, 1).unwrap().len(), 1);
    assert_eq!(stored(&mut store).len(), 4);
    assert_eq!(store.prune_finished(12.0, 1).unwrap().len(), 1);
    assert_eq!(store.prune_finished(12.0, 100).unwrap().len(), 0);
    assert_eq!(stored(&mut store), ["j2", "j3", "j4"]);

    // A cutoff later than every finish leaves the live job, however old.
    assert_eq!(store.prune_finished(1e9, 100).unwrap().len(), 2);
    let left = store.jobs(JobQuery::default()).unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].job.id, "j4");
    assert_eq!(left[0].spec.as_deref(), Some(&b"j4"[..]));
    // The pruned jobs' specs went with them, and a restart does not bring anything back.
    drop(store);
    let got = Sqlite::open(dir.path()).unwrap().load(10, 100).unwrap();
    let specs: Vec<&str> = got.specs.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(specs, ["j4"]);
    let conn = rusqlite::Connection::open(dir.path().join(FILE_NAME)).unwrap();
    let spec_rows: i64 = conn
        .query_row("SELECT count(*) FROM specs", [], |r| r.get(0))
        .unwrap();
    assert_eq!(spec_rows, 1, "no spec is left of a pruned job");
}

#[test]
fn a_store_of_the_first_schema_is_migrated_and_reads_as_before() {
    let dir = tempfile::tempdir().unwrap();
    // Jobs as a core records them: j0..j2 finish in that order, j3 stays pending.
    let mut core = core();
    let ids = ["j0", "j1", "j2", "j3"];
    for (i, id) in ids.iter().enumerate() {
        core.step(1.0 + i as f64, submit(id));
    }
    for (i, id) in ids[..3].iter().enumerate() {
        core.step(
            10.0 + i as f64,
            Input::Cancel {
                id: id.into(),
                by: String::new(),
            },
        );
    }
    // A file as the first release wrote it: schema 1, exactly (this text must not change
    // with the schema; it is what is on users' disks).
    {
        let c = rusqlite::Connection::open(dir.path().join(FILE_NAME)).unwrap();
        c.execute_batch(
            "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
             CREATE TABLE jobs (id TEXT PRIMARY KEY, seq INTEGER NOT NULL, state TEXT NOT NULL,
                                record TEXT NOT NULL);
             CREATE TABLE specs (id TEXT PRIMARY KEY, spec BLOB NOT NULL);
             CREATE TABLE workers (id TEXT PRIMARY KEY, record TEXT NOT NULL);
             CREATE TABLE events (seq INTEGER PRIMARY KEY, job TEXT, event BLOB NOT NULL);
             PRAGMA application_id = 1129207367;
             PRAGMA user_version = 1;",
        )
        .unwrap();
        for id in ids {
            let j = core.job(id).unwrap();
            c.execute(
                "INSERT INTO jobs (id, seq, state, record) VALUES (?1, ?2, ?3, ?4)",
                rusqlite::params![
                    j.id.as_str(),
                    j.seq as i64,
                    j.state().label(),
                    serde_json::to_string(j).unwrap()
                ],
            )
            .unwrap();
        }
    }
    const { assert!(SCHEMA_VERSION >= 2, "this test is for the migration to 2") };

    let mut store = Sqlite::open(dir.path()).unwrap();
    let got = store.load(10, 2).unwrap();
    let loaded: Vec<&str> = got.saved.jobs.iter().map(|j| j.id.as_str()).collect();
    assert_eq!(
        loaded,
        ["j1", "j2", "j3"],
        "the live job and the two that finished last"
    );
    assert_eq!(
        store.jobs(JobQuery::job("j0")).unwrap().len(),
        1,
        "the oldest is archived"
    );
    drop(store);

    // Migrated: the current version, the finish times backfilled from the records, and the
    // index the restart's query uses.
    let c = rusqlite::Connection::open(dir.path().join(FILE_NAME)).unwrap();
    let version: i64 = c
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, SCHEMA_VERSION);
    let finished: Vec<(String, Option<f64>)> = c
        .prepare("SELECT id, finished_at FROM jobs ORDER BY seq")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    for (id, at) in &finished {
        assert_eq!(*at, core.job(id).unwrap().finished_at.get(), "{id}");
    }
    assert!(finished[0].1.is_some() && finished[3].1.is_none());
    let plan: String = c
        .query_row(
            "EXPLAIN QUERY PLAN SELECT id FROM jobs WHERE state IN ('cancelled')
             ORDER BY finished_at DESC NULLS LAST LIMIT 2",
            [],
            |r| r.get(3),
        )
        .unwrap();
    assert!(plan.contains("jobs_finished"), "{plan}");
}

/// A store reopened keeps its WAL index in the manager's memory, as when it was created: no
/// `-shm` file beside it (shared memory between processes, which some filesystems a state
/// directory may sit on lack). The read-only checks at open come after exclusive locking.
#[test]
fn a_reopened_store_keeps_no_shared_memory_file() {
    let dir = tempfile::tempdir().unwrap();
    drop(Sqlite::open(dir.path()).unwrap());
    let _again = Sqlite::open(dir.path()).unwrap();
    let files: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!files.iter().any(|f| f.ends_with("-shm")), "{files:?}");
}

/// The event log's name is made at the first open and kept by a reopen; a backup's copy and
/// another store have names of their own (a manager restored from a backup numbers on from
/// its last event: a watcher must not take them for events it has shown).
#[test]
fn the_event_log_keeps_its_name_and_another_store_has_another() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Sqlite::open(dir.path()).unwrap();
    let name = store.load(10, 10).unwrap().event_log;
    assert_eq!(name.len(), 36, "a UUID: {name}");
    let copy = store.backup().unwrap().write().unwrap();
    let beside = |suffix: &str| {
        let mut p = copy.path().as_os_str().to_owned();
        p.push(suffix);
        std::path::PathBuf::from(p).exists()
    };
    assert!(!beside("-wal") && !beside("-shm"), "the copy is one file");
    let restored = tempfile::tempdir().unwrap();
    std::fs::rename(copy.keep(), restored.path().join(FILE_NAME)).unwrap();
    drop(store);
    let again = Sqlite::open(dir.path()).unwrap().load(10, 10).unwrap();
    assert_eq!(again.event_log, name);
    assert!(again.is_empty(), "naming the log is not history");
    let from_backup = Sqlite::open(restored.path()).unwrap().load(10, 10).unwrap();
    assert_ne!(from_backup.event_log, name);
    assert_eq!(from_backup.event_log.len(), 36);
    let other = tempfile::tempdir().unwrap();
    let other = Sqlite::open(other.path()).unwrap().load(10, 10).unwrap();
    assert_ne!(other.event_log, name);
}

/// A backup of a store in use (its manager holds the file exclusively, so no other process can
/// read it) is a store of its own: opened from another directory while the first stays open,
/// it loads the same jobs, workers and counters.
#[test]
fn a_backup_taken_while_the_store_is_held_opens_as_the_same_store() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Sqlite::open(dir.path()).unwrap();
    four_finished_one_pending(&mut store);
    let copy = store.backup().unwrap().write().unwrap();
    assert_eq!(
        copy.path().parent(),
        Some(dir.path()),
        "beside the store: {copy:?}"
    );
    let restored = tempfile::tempdir().unwrap();
    std::fs::rename(copy.keep(), restored.path().join(FILE_NAME)).unwrap();
    let mut from_backup = Sqlite::open(restored.path()).unwrap();
    let (a, b) = (
        store.load(100, 100).unwrap(),
        from_backup.load(100, 100).unwrap(),
    );
    assert_eq!(debug_jobs(&a.saved).len(), 5);
    assert_eq!(debug_jobs(&a.saved), debug_jobs(&b.saved));
    assert_eq!(
        (a.saved.counters.next_seq, a.next_event_seq, a.specs.len()),
        (b.saved.counters.next_seq, b.next_event_seq, b.specs.len())
    );
    assert_eq!(a.events.len(), b.events.len());
}

/// A copy nobody removed (its manager stopped while sending it) is removed by the next manager
/// to open the store, and not by one the running manager keeps out.
#[test]
fn a_backup_left_behind_is_removed_by_the_next_manager_only() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Sqlite::open(dir.path()).unwrap();
    // Kept, as by a manager killed while it sent the copy.
    let copy = store.backup().unwrap().write().unwrap().keep();
    let why = refusal(dir.path());
    assert!(why.contains("another manager holds it"), "{why}");
    assert!(
        copy.exists(),
        "a refused manager removed the running one's copy"
    );
    drop(store);
    let _next = Sqlite::open(dir.path()).unwrap();
    assert!(!copy.exists(), "the copy outlived its manager: {copy:?}");
}

/// `n` events of 4 KiB from `from` on, committed 100 to a transaction: 1,000 of them are more
/// than the WAL's 1,000 pages after which SQLite checkpoints into the database file.
fn commit_events(store: &mut Sqlite, from: u64, n: u64) {
    let events: Vec<StoredEvent> = (from..from + n)
        .map(|seq| StoredEvent {
            seq,
            job: None,
            bytes: vec![seq as u8; 4096],
        })
        .collect();
    for chunk in events.chunks(100) {
        let batch = Batch {
            events: chunk,
            ..Batch::default()
        };
        store.commit(&batch).unwrap();
    }
}

/// The ids of the jobs and the number of events in a backup copy, opened as a store of its own.
fn in_copy(copy: converge_store::BackupCopy) -> (Vec<String>, usize) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::rename(copy.keep(), dir.path().join(FILE_NAME)).unwrap();
    let got = Sqlite::open(dir.path())
        .unwrap()
        .load(usize::MAX, usize::MAX)
        .unwrap();
    let ids = got.saved.jobs.iter().map(|j| j.id.to_string()).collect();
    (ids, got.events.len())
}

/// A store holding j0..j4 ([`four_finished_one_pending`]), a backup begun, and then job
/// `late` submitted: what the copy must not hold.
fn a_backup_begun_before_a_late_job() -> (tempfile::TempDir, Sqlite, PendingBackup) {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Sqlite::open(dir.path()).unwrap();
    let (mut core, _) = four_finished_one_pending(&mut store);
    let pending = store.backup().unwrap();
    step_stored(&mut store, &mut core, 20.0, submit("late"));
    (dir, store, pending)
}

/// The copy is written off the writer's thread, from the database file, while the writer goes
/// on: it holds what the last commit before `backup` left and nothing committed after, even
/// when more is committed meanwhile than the WAL holds before SQLite checkpoints into the file.
/// Once the copy is written, the next commits checkpoint into the file again, and the WAL,
/// grown meanwhile, is cut back.
#[test]
fn a_backup_is_what_the_last_commit_left_while_the_writer_goes_on() {
    let (dir, mut store, pending) = a_backup_begun_before_a_late_job();
    // About 12 MB: more than the WAL holds before SQLite checkpoints, and than the store lets
    // it keep.
    commit_events(&mut store, 1, 2_500);
    let wal = dir.path().join(format!("{FILE_NAME}-wal"));
    let grown = std::fs::metadata(&wal).unwrap().len();
    let copy = pending.write().unwrap();
    assert_eq!(
        in_copy(copy),
        (FIRST_FIVE.map(String::from).to_vec(), 0),
        "the copy as the backup began"
    );
    let now = store.load(usize::MAX, usize::MAX).unwrap();
    assert_eq!((now.saved.jobs.len(), now.events.len()), (6, 2_500));

    let file = dir.path().join(FILE_NAME);
    let size = std::fs::metadata(&file).unwrap().len();
    commit_events(&mut store, 2_501, 1_500);
    assert!(
        std::fs::metadata(&file).unwrap().len() > size,
        "nothing was checkpointed into the file after the copy was written"
    );
    let now = std::fs::metadata(&wal).unwrap().len();
    assert!(
        now < grown,
        "the WAL kept the {grown} bytes it grew to during the copy (now {now})"
    );
}

/// Pruning finished jobs commits too: once a copy is written, it checkpoints into the file
/// what was committed meanwhile, as any commit does, rather than leave checkpoints held until
/// the next batch.
#[test]
fn a_prune_after_a_copy_is_written_checkpoints_again() {
    let (dir, mut store, pending) = a_backup_begun_before_a_late_job();
    commit_events(&mut store, 1, 1_500);
    drop(pending.write().unwrap());
    let file = dir.path().join(FILE_NAME);
    let size = std::fs::metadata(&file).unwrap().len();
    assert_eq!(
        store.prune_finished(100.0, 10).unwrap().len(),
        4,
        "the four cancelled"
    );
    assert!(
        std::fs::metadata(&file).unwrap().len() > size,
        "the prune checkpointed nothing into the file"
    );
}

/// A backup begun while another's copy is still being written holds what the second began
/// with; the first still holds what it began with.
#[test]
fn a_second_backup_while_the_first_is_written_has_the_newest_commits() {
    let (_dir, mut store, first) = a_backup_begun_before_a_late_job();
    let second = store.backup().unwrap().write().unwrap();
    let (jobs, _) = in_copy(first.write().unwrap());
    assert_eq!(jobs, FIRST_FIVE);
    let (jobs, _) = in_copy(second);
    assert_eq!(jobs, ["j0", "j1", "j2", "j3", "j4", "late"]);
}

/// A manager that stops while a copy is being written (closing its store would checkpoint
/// into the file being read) leaves the copy whole, and the next open has every commit.
#[test]
fn a_store_closed_while_a_copy_is_written_leaves_both_whole() {
    let (dir, mut store, pending) = a_backup_begun_before_a_late_job();
    commit_events(&mut store, 1, 200);
    drop(store);
    let (jobs, events) = in_copy(pending.write().unwrap());
    assert_eq!((jobs, events), (FIRST_FIVE.map(String::from).to_vec(), 0));
    let again = Sqlite::open(dir.path())
        .unwrap()
        .load(usize::MAX, usize::MAX)
        .unwrap();
    assert_eq!((again.saved.jobs.len(), again.events.len()), (6, 200));
}

/// Set for [`another_process_opens_the_store`], run as a child process: the directory whose
/// store it opens.
const CHILD_DIR: &str = "CONVERGE_STORE_TEST_CHILD_DIR";

/// Not a test of its own: the other process of
/// `a_backup_leaves_the_store_locked_against_another_process`, which runs this binary again
/// with only this test. Says whether it could open the store.
#[test]
#[ignore = "run as a child process by another test"]
fn another_process_opens_the_store() {
    if let Ok(dir) = std::env::var(CHILD_DIR) {
        match Sqlite::open(std::path::Path::new(&dir)) {
            Ok(_) => println!("CHILD: opened"),
            Err(e) => println!("CHILD: refused: {e}"),
        }
    }
}

/// SQLite's locks belong to the process: closing any descriptor of the file drops them all, so
/// a copy that opened the file afresh let another process (a second manager, an operator's
/// `sqlite3`) write beside the manager, and corrupt the store. After a backup the store is
/// still refused to another process, as before it. (Within one process SQLite answers from
/// its own table of locks, which is why this needs another process.)
#[test]
fn a_backup_leaves_the_store_locked_against_another_process() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Sqlite::open(dir.path()).unwrap();
    four_finished_one_pending(&mut store);
    let other_opens = || {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "another_process_opens_the_store",
                "--ignored",
                "--nocapture",
            ])
            .env(CHILD_DIR, dir.path())
            .output()
            .expect("this test binary runs again");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        match text.lines().find(|l| l.starts_with("CHILD: ")) {
            Some(line) => line.to_owned(),
            None => panic!("the child said nothing of the store: {text}"),
        }
    };
    let before = other_opens();
    assert!(before.contains("another manager holds it"), "{before}");
    drop(store.backup().unwrap().write().unwrap());
    let after = other_opens();
    assert!(
        after.contains("another manager holds it"),
        "after a backup: {after}"
    );
}
