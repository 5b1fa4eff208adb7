//! The store on SQLite: one file, `converge.db`, in the state directory.
//!
//! - WAL journal with `synchronous = NORMAL`: a commit is durable once the call returns against
//!   a crash of the manager (kill -9 included: the WAL is in the kernel's page cache); an
//!   operating-system crash or power loss may lose the newest commits, never corrupt the file.
//! - `locking_mode = EXCLUSIVE`: the first manager holds the file until it exits, so a second
//!   one pointed at the same directory is refused instead of writing beside it.
//! - `application_id` marks the file as Converge's; `user_version` is the schema version,
//!   migrated forward at open ([`MIGRATIONS`]) and refused when newer than this build.

use std::path::{Path, PathBuf};
use std::time::Duration;

use converge_core::cluster::saved::Saved;
use rusqlite::config::DbConfig;
use rusqlite::{Connection, OptionalExtension, params};
use std::sync::Arc;
use tracing::info;

use crate::{
    BackupCopy, Batch, Error, JobQuery, PendingBackup, RETAINED_EVENTS, Recovered, Result, Store,
    StoredEvent, StoredJob,
};

/// The database file's name in the state directory.
pub const FILE_NAME: &str = "converge.db";

/// How a copy written by [`Store::backup`] is named in the state directory, before a suffix
/// that makes it unique.
const BACKUP_PREFIX: &str = "converge.db.backup-";

/// `PRAGMA application_id` of a Converge store ("CNVG").
const APPLICATION_ID: i64 = 0x434E_5647;

/// Each migration takes the schema from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[
    // 0 -> 1: the first schema.
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
     CREATE TABLE jobs (id TEXT PRIMARY KEY, seq INTEGER NOT NULL, state TEXT NOT NULL,
                        record TEXT NOT NULL);
     CREATE TABLE specs (id TEXT PRIMARY KEY, spec BLOB NOT NULL);
     CREATE TABLE workers (id TEXT PRIMARY KEY, record TEXT NOT NULL);
     CREATE TABLE events (seq INTEGER PRIMARY KEY, job TEXT, event BLOB NOT NULL);",
    // 1 -> 2: a job's finish time as a column, indexed with its state, so that a restart
    // finds the newest finished jobs through the index instead of parsing every record (at
    // 100,000 archived jobs, every one of them). Records written before are backfilled.
    "ALTER TABLE jobs ADD COLUMN finished_at REAL;
     UPDATE jobs SET finished_at = json_extract(record, '$.finished_at');
     CREATE INDEX jobs_finished ON jobs (state, finished_at);",
];

/// Indexes that change no record and that an older build keeps up to date without knowing them
/// (SQLite maintains every index on a table), made at every open when missing rather than
/// by a migration, which would make an older build refuse the store (no way back).
const INDEXES: &str =
    // Jobs by submission number: a page of a list (`JobQuery::after_seq`, `limit`) reads its
    // own rows, not every job sorted again.
    "CREATE INDEX IF NOT EXISTS jobs_seq ON jobs (seq);";

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Events inserted between two deletions of the oldest.
const PRUNE_EVERY: u64 = 10_000;

/// The size the WAL file is cut back to when the log restarts (`journal_size_limit`): twice
/// what it reaches between two of SQLite's automatic checkpoints (1,000 pages of 4 KiB, and
/// the commit that crosses them), so that it is cut only after a log grew while a backup's copy
/// was written, when checkpoints are held. SQLite reuses a log file rather than shrink it, so
/// without the limit the file kept that size.
const WAL_KEPT_BYTES: i64 = 8 << 20;

/// The SQLite store (module doc).
pub struct Sqlite {
    conn: Connection,
    path: PathBuf,
    unpruned: u64,
    /// The database file, open for the store's life, for [`Store::backup`] to copy from;
    /// one clone in each backup whose copy is being written (while any is out, nothing is
    /// checkpointed into the file). Declared after `conn`, so closed after it: SQLite's locks
    /// are POSIX locks, which belong to the process and the file, and closing any descriptor
    /// of the file drops them all (SQLite's "How To Corrupt", 2.2). A copy that opened the
    /// file afresh and closed it let another manager write beside this one.
    file: Arc<std::fs::File>,
    /// The `wal_autocheckpoint` to go back to once no copy is being written; `None` while
    /// checkpoints run as usual.
    checkpoints_held: Option<i64>,
}

impl Drop for Sqlite {
    fn drop(&mut self) {
        // Closing the last connection checkpoints the WAL into the file, under a copy still
        // being read from it. Left in the WAL, the newest commits are checkpointed by the next
        // open instead, as after a crash.
        if Arc::strong_count(&self.file) > 1 {
            let _ = self
                .conn
                .set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true);
        }
    }
}

impl Sqlite {
    /// Opens (creating when absent) the store in `dir`. Refuses a file that is not a
    /// Converge store, is damaged, or has a newer schema, and one another manager holds.
    pub fn open(dir: &Path) -> Result<Self> {
        if dir.is_file() {
            // The store's file itself, most likely: "File exists" said nothing of that.
            return Err(Error::DirIsFile {
                dir: dir.to_path_buf(),
            });
        }
        // Only its owner may enter a directory the store makes: the records hold every job's
        // environment, secrets included. (One the operator made is left as it is.)
        let mut made = std::fs::DirBuilder::new();
        made.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut made, 0o700);
        made.create(dir).map_err(|source| Error::Dir {
            dir: dir.to_path_buf(),
            source,
        })?;
        let path = dir.join(FILE_NAME);
        let unreadable = |why: String| Error::Unreadable {
            path: path.clone(),
            why,
        };
        let sql = |e: rusqlite::Error| match e.sqlite_error_code() {
            // Not a store to restore or move away: one that is in use.
            Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
                Error::Held { path: path.clone() }
            }
            _ => unreadable(sqlite_why(&e)),
        };
        let existed = path.exists();
        let conn = Connection::open(&path).map_err(sql)?;
        // A manager that was just killed may still be releasing the file.
        conn.busy_timeout(Duration::from_secs(2)).map_err(sql)?;
        // Exclusive locking before the first read, so that an existing store's WAL index is
        // kept in this process's memory (no `-shm` file, which needs shared memory between
        // processes that some filesystems lack). It writes nothing to the file.
        conn.pragma_update(None, "locking_mode", "EXCLUSIVE")
            .map_err(sql)?;
        // Read-only checks next: the pragmas below write (WAL mode is kept in the file's
        // header), and a file that is refused must be left as it was found.
        let check: String = conn
            .query_row("PRAGMA quick_check", [], |r| r.get(0))
            .map_err(sql)?;
        if check != "ok" {
            return Err(unreadable(format!("integrity check failed: {check}")));
        }
        let app: i64 = conn
            .query_row("PRAGMA application_id", [], |r| r.get(0))
            .map_err(sql)?;
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(sql)?;
        let tables: i64 = conn
            .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
            .map_err(sql)?;
        if tables > 0 && app != APPLICATION_ID {
            return Err(unreadable(format!(
                "it is an SQLite database of another application (application_id {app:#x})"
            )));
        }
        let mode: String = conn
            .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))
            .map_err(sql)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(unreadable(format!("journal mode {mode}, not WAL")));
        }
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(sql)?;
        conn.pragma_update(None, "journal_size_limit", WAL_KEPT_BYTES)
            .map_err(sql)?;
        if version > SCHEMA_VERSION {
            return Err(Error::Newer {
                path,
                found: version,
                supported: SCHEMA_VERSION,
            });
        }
        // Only now that the file is this process's: closing a descriptor of a file another
        // connection of this process holds would drop that one's locks.
        let file = std::fs::File::open(&path).map_err(|e| unreadable(e.to_string()))?;
        let mut store = Sqlite {
            conn,
            path,
            unpruned: 0,
            file: Arc::new(file),
            checkpoints_held: None,
        };
        store.migrate(version)?;
        // Only now that the file is this process's: a manager refused above must not remove
        // a copy that the running one is sending.
        remove_stale_backups(dir);
        info!(path = %store.path.display(), existed, schema = SCHEMA_VERSION, "state store open");
        Ok(store)
    }

    /// Lets checkpoints run again once the last copy [`Store::backup`] began is written (or
    /// dropped unwritten). Until then the WAL grows by what is committed meanwhile.
    fn resume_checkpoints(&mut self) -> Result<()> {
        if let Some(every) = self.checkpoints_held
            && Arc::strong_count(&self.file) == 1
        {
            self.conn
                .pragma_update(None, "wal_autocheckpoint", every)
                .map_err(self.sql())?;
            self.checkpoints_held = None;
        }
        Ok(())
    }

    /// Brings the schema from `from` to [`SCHEMA_VERSION`], and makes the [`INDEXES`] missing,
    /// in one transaction (a crash mid-way leaves the old version, which the next start
    /// migrates again).
    fn migrate(&mut self, from: i64) -> Result<()> {
        let path = self.path.clone();
        let sql = move |source| Error::Sql {
            path: path.clone(),
            source,
        };
        // Taking the write lock now also makes a second manager fail here, at start.
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(|e| Error::Unreadable {
                path: self.path.clone(),
                why: sqlite_why(&e),
            })?;
        if from == 0 {
            // A new store: its schema is written whole, which is no migration of anything.
            info!(schema = SCHEMA_VERSION, "creating the state store");
        }
        for (i, m) in MIGRATIONS.iter().enumerate().skip(from as usize) {
            if from > 0 {
                info!(from = i, to = i + 1, "migrating the state store");
            }
            tx.execute_batch(m).map_err(&sql)?;
        }
        tx.execute_batch(INDEXES).map_err(&sql)?;
        tx.pragma_update(None, "application_id", APPLICATION_ID)
            .map_err(&sql)?;
        tx.pragma_update(None, "user_version", SCHEMA_VERSION)
            .map_err(&sql)?;
        tx.commit().map_err(&sql)
    }

    fn sql(&self) -> impl Fn(rusqlite::Error) -> Error + '_ {
        |source| Error::Sql {
            path: self.path.clone(),
            source,
        }
    }

    /// Every `(id, record)` row `sql` selects, decoded; a record that cannot be read is named
    /// (`what` and its id).
    fn records<T: serde::de::DeserializeOwned>(
        &self,
        sql: &str,
        params: impl rusqlite::Params,
        what: &str,
    ) -> Result<Vec<T>> {
        let mut q = self.conn.prepare(sql).map_err(self.sql())?;
        let rows = q
            .query_map(params, |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
            })
            .map_err(self.sql())?;
        let mut out = Vec::new();
        for row in rows {
            let (id, record) = row.map_err(self.sql())?;
            out.push(
                serde_json::from_str(&record)
                    .map_err(|e| self.record_error(format!("{what} {id}"), e))?,
            );
        }
        Ok(out)
    }

    fn record_error(&self, what: String, e: serde_json::Error) -> Error {
        Error::Record {
            path: self.path.clone(),
            what,
            why: e.to_string(),
        }
    }
}

/// SQLite's words for what is wrong with a file, made plain for the few that users meet.
fn sqlite_why(e: &rusqlite::Error) -> String {
    use rusqlite::ErrorCode as C;
    match e.sqlite_error_code() {
        Some(C::NotADatabase) => {
            "it is not an SQLite database (wrong file, or its header is damaged)".into()
        }
        Some(C::DatabaseCorrupt) => format!("it is damaged or truncated ({e})"),
        Some(C::CannotOpen | C::PermissionDenied | C::ReadOnly) => {
            format!("it cannot be opened for writing ({e})")
        }
        _ => e.to_string(),
    }
}

impl Store for Sqlite {
    fn events(
        &mut self,
        from_seq: u64,
        before_seq: u64,
        job: Option<&str>,
        limit: usize,
    ) -> Result<Vec<StoredEvent>> {
        let mut q = self
            .conn
            .prepare_cached(
                "SELECT seq, job, event FROM events
                 WHERE seq >= ?1 AND seq < ?2 AND (?3 IS NULL OR job = ?3)
                 ORDER BY seq DESC LIMIT ?4",
            )
            .map_err(self.sql())?;
        let rows = q
            .query_map(
                params![from_seq as i64, before_seq as i64, job, limit as i64],
                |r| {
                    Ok(StoredEvent {
                        seq: r.get::<_, i64>(0)? as u64,
                        job: r.get(1)?,
                        bytes: r.get(2)?,
                    })
                },
            )
            .map_err(self.sql())?;
        let mut out = Vec::new();
        for row in rows {
            out.push(row.map_err(self.sql())?);
        }
        out.reverse();
        Ok(out)
    }

    fn jobs(&mut self, query: JobQuery<'_>) -> Result<Vec<StoredJob>> {
        let JobQuery {
            id,
            state,
            after_seq,
            limit,
        } = query;
        // Two statements, each a plan SQLite's index can serve: `?1 IS NULL OR j.id = ?1` read
        // every row for one job, and `?3 IS NULL OR j.seq > ?3` walked the index from its start
        // for every page (13.7 ms a page deep in 200,000 jobs, 0.3 ms from its place).
        let sql = if id.is_some() {
            "SELECT j.id, j.record, s.spec FROM jobs j LEFT JOIN specs s ON s.id = j.id
             WHERE j.id = ?1 AND (?2 IS NULL OR j.state = ?2) AND j.seq > ?3 LIMIT ?4"
        } else {
            // A negative LIMIT is none, in SQLite.
            "SELECT j.id, j.record, s.spec FROM jobs j LEFT JOIN specs s ON s.id = j.id
             WHERE (?1 IS NULL) AND (?2 IS NULL OR j.state = ?2) AND j.seq > ?3
             ORDER BY j.seq LIMIT ?4"
        };
        let mut q = self.conn.prepare_cached(sql).map_err(self.sql())?;
        // Submission numbers start at 0: after -1 is every job.
        let after = after_seq.map_or(-1, |s| i64::try_from(s).unwrap_or(i64::MAX));
        let limit = limit.map_or(-1, |n| i64::try_from(n).unwrap_or(i64::MAX));
        let rows = q
            .query_map(params![id, state, after, limit], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, Option<Vec<u8>>>(2)?,
                ))
            })
            .map_err(self.sql())?;
        let mut out = Vec::new();
        for row in rows {
            let (id, record, spec) = row.map_err(self.sql())?;
            let job = serde_json::from_str(&record)
                .map_err(|e| self.record_error(format!("job {id}"), e))?;
            out.push(StoredJob { job, spec });
        }
        Ok(out)
    }

    fn load(&mut self, newest_events: usize, newest_finished: usize) -> Result<Recovered> {
        // Finished jobs beyond the newest few would be archived again as soon as the core is
        // rebuilt: they stay on disk, so that a restart reads what it keeps, not the whole
        // history. "Newest" is the core's order (`Core::from_saved`): finish time, then
        // submission; a job with no finish time is the oldest.
        let terminal = terminal_labels();
        let mut saved = Saved {
            jobs: self.records(
                &format!(
                    "SELECT id, record FROM jobs
                     WHERE state NOT IN ({terminal}) OR id IN (
                         SELECT id FROM jobs WHERE state IN ({terminal})
                         ORDER BY finished_at DESC NULLS LAST, seq DESC
                         LIMIT ?1)
                     ORDER BY seq"
                ),
                [i64::try_from(newest_finished).unwrap_or(i64::MAX)],
                "job",
            )?,
            workers: self.records("SELECT id, record FROM workers ORDER BY id", [], "worker")?,
            ..Saved::default()
        };
        // What the core's running maximum needs of the jobs left on disk (taking the loaded
        // ones in too changes nothing: it is a maximum). A damaged record of a job left on disk
        // (a disk error, a hand edit) does not stop the restart: the live jobs are all loaded
        // above, and a request that needs the damaged one is answered with an error naming it.
        // It is counted here, where every finished record is read anyway, and said at once.
        let damaged: i64;
        (saved.archived_downtime, damaged) = self
            .conn
            .query_row(
                &format!(
                    "SELECT max(CASE WHEN json_valid(record)
                                THEN json_extract(record, '$.last_migration_downtime') END),
                            count(*) FILTER (WHERE NOT json_valid(record))
                     FROM jobs WHERE state IN ({terminal})"
                ),
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .map_err(self.sql())?;
        if damaged > 0 {
            tracing::warn!(
                path = %self.path.display(),
                damaged,
                "finished job records in the state store cannot be read: requests that need \
                 them fail, naming each; restore the file from a backup to get them back"
            );
        }
        let meta = |key: &str| -> Result<Option<String>> {
            self.conn
                .query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
                .optional()
                .map_err(self.sql())
        };
        if let Some(c) = meta("counters")? {
            let (next_seq, next_command): (u64, u64) =
                serde_json::from_str(&c).map_err(|e| self.record_error("counters".into(), e))?;
            saved.counters.next_seq = next_seq;
            saved.counters.next_command = next_command;
        }
        if let Some(h) = meta("history")? {
            saved.counters.history = serde_json::from_str(&h)
                .map_err(|e| self.record_error("finished sizes".into(), e))?;
        }
        // Named at the first open (a store from before names had none: named now).
        let event_log = match meta("event_log")? {
            Some(name) => name,
            None => {
                let name = uuid::Uuid::new_v4().to_string();
                self.conn
                    .execute(
                        "INSERT INTO meta (key, value) VALUES ('event_log', ?1)",
                        [name.as_str()],
                    )
                    .map_err(self.sql())?;
                name
            }
        };
        let mut specs = Vec::new();
        {
            // Only the loaded jobs' specs: the archived ones are read when asked for.
            let mut q = self
                .conn
                .prepare("SELECT spec FROM specs WHERE id = ?1")
                .map_err(self.sql())?;
            for j in &saved.jobs {
                if let Some(spec) = q
                    .query_row([j.id.as_str()], |r| r.get::<_, Vec<u8>>(0))
                    .optional()
                    .map_err(self.sql())?
                {
                    specs.push((j.id.to_string(), spec));
                }
            }
        }
        let last: Option<i64> = self
            .conn
            .query_row("SELECT max(seq) FROM events", [], |r| r.get(0))
            .map_err(self.sql())?;
        let next_event_seq = last.map_or(1, |s| s as u64 + 1);
        let mut events = Vec::new();
        {
            let from = next_event_seq.saturating_sub(newest_events as u64) as i64;
            let mut q = self
                .conn
                .prepare("SELECT seq, job, event FROM events WHERE seq >= ?1 ORDER BY seq")
                .map_err(self.sql())?;
            let rows = q
                .query_map([from], |r| {
                    Ok(StoredEvent {
                        seq: r.get::<_, i64>(0)? as u64,
                        job: r.get(1)?,
                        bytes: r.get(2)?,
                    })
                })
                .map_err(self.sql())?;
            for row in rows {
                events.push(row.map_err(self.sql())?);
            }
        }
        let mut q = self
            .conn
            .prepare("SELECT state, count(*) FROM jobs GROUP BY state ORDER BY state")
            .map_err(self.sql())?;
        let job_states = q
            .query_map([], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64))
            })
            .map_err(self.sql())?
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(self.sql())?;
        drop(q);
        Ok(Recovered {
            saved,
            specs,
            events,
            next_event_seq,
            event_log,
            job_states,
        })
    }

    fn commit(&mut self, batch: &Batch<'_>) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        self.resume_checkpoints()?;
        let path = self.path.clone();
        let sql = |source| Error::Sql {
            path: path.clone(),
            source,
        };
        let json = |what: &str, e: serde_json::Error| Error::Record {
            path: path.clone(),
            what: what.to_string(),
            why: e.to_string(),
        };
        let tx = self.conn.transaction().map_err(sql)?;
        {
            let mut put = tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO jobs (id, seq, state, record, finished_at)
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                )
                .map_err(sql)?;
            for j in &batch.jobs {
                let record = serde_json::to_string(j).map_err(|e| json(&j.id, e))?;
                put.execute(params![
                    j.id.as_str(),
                    j.seq as i64,
                    j.state().label(),
                    record,
                    j.finished_at.get()
                ])
                .map_err(sql)?;
            }
            let mut delete = tx
                .prepare_cached("DELETE FROM workers WHERE id = ?1")
                .map_err(sql)?;
            for id in &batch.forgotten_workers {
                delete.execute(params![id]).map_err(sql)?;
            }
            let mut put = tx
                .prepare_cached("INSERT OR REPLACE INTO workers (id, record) VALUES (?1, ?2)")
                .map_err(sql)?;
            for w in &batch.workers {
                let record = serde_json::to_string(w).map_err(|e| json(&w.id, e))?;
                put.execute(params![w.id.as_str(), record]).map_err(sql)?;
            }
            let mut put = tx
                .prepare_cached("INSERT OR IGNORE INTO specs (id, spec) VALUES (?1, ?2)")
                .map_err(sql)?;
            for (id, spec) in &batch.specs {
                put.execute(params![id, spec]).map_err(sql)?;
            }
            let mut put = tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO events (seq, job, event) VALUES (?1, ?2, ?3)",
                )
                .map_err(sql)?;
            for e in batch.events {
                put.execute(params![e.seq as i64, e.job, e.bytes])
                    .map_err(sql)?;
            }
            let mut meta = tx
                .prepare_cached("INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)")
                .map_err(sql)?;
            if let Some(c) = batch.counters {
                meta.execute(params![
                    "counters",
                    serde_json::to_string(&(c.next_seq, c.next_command))
                        .map_err(|e| json("counters", e))?
                ])
                .map_err(sql)?;
                if batch.history_changed {
                    meta.execute(params![
                        "history",
                        serde_json::to_string(&c.history).map_err(|e| json("history", e))?
                    ])
                    .map_err(sql)?;
                }
            }
        }
        self.unpruned += batch.events.len() as u64;
        if self.unpruned >= PRUNE_EVERY
            && let Some(last) = batch.events.last()
        {
            self.unpruned = 0;
            let before = last.seq.saturating_sub(RETAINED_EVENTS) as i64;
            tx.execute("DELETE FROM events WHERE seq <= ?1", [before])
                .map_err(sql)?;
        }
        tx.commit().map_err(sql)
    }

    fn location(&self) -> String {
        self.path.display().to_string()
    }

    /// In WAL mode commits go to the WAL, and only a checkpoint writes the database file.
    /// So the file is checkpointed whole here, checkpoints are held, and the file, now
    /// exactly what the last commit left, is copied by another thread while this one goes on
    /// committing into the WAL. Checkpoints resume at the first commit after the last copy
    /// is written ([`Sqlite::resume_checkpoints`]). Before, `VACUUM INTO` held the writer
    /// for the whole copy, 0.3 to 0.4 s at 100,000 stored jobs (`docs/performance.md`, "A
    /// backup while it runs").
    fn backup(&mut self) -> Result<PendingBackup> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // The name is new: this process's counter, and `open` removed other processes' copies.
        let to = BackupCopy(
            self.path
                .with_file_name(format!("{BACKUP_PREFIX}{}-{n}", std::process::id())),
        );
        if Arc::strong_count(&self.file) > 1 {
            // The file is held for a copy begun earlier and lacks the newest commits; the
            // snapshot this connection reads has them. VACUUM INTO writes it whole, holding
            // the writer meanwhile (the manager asks for one backup at a time, so as not to).
            self.conn
                .execute("VACUUM INTO ?1", [to.path().to_string_lossy()])
                .map_err(self.sql())?;
            return Ok(PendingBackup::new(move || {
                rename_event_log(to.path())?;
                Ok(to)
            }));
        }
        if self.checkpoints_held.is_none() {
            let every: i64 = self
                .conn
                .query_row("PRAGMA wal_autocheckpoint", [], |r| r.get(0))
                .map_err(self.sql())?;
            self.conn
                .pragma_update(None, "wal_autocheckpoint", 0)
                .map_err(self.sql())?;
            self.checkpoints_held = Some(every);
        }
        // No reader but this connection (the lock is exclusive): every frame is copied back
        // and the file is cut to the database's size. A checkpoint kept from finishing says
        // so as busy (its frame counts read 0 once the log is truncated); then the file lacks
        // commits, and is refused rather than sent.
        let busy: i64 = self
            .conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))
            .map_err(self.sql())?;
        if busy != 0 {
            return Err(Error::Checkpoint {
                path: self.path.clone(),
            });
        }
        let from = Arc::clone(&self.file);
        Ok(PendingBackup::new(move || {
            // From the store's own descriptor, never one opened here (`Sqlite::file`). The
            // file header says WAL mode and no WAL goes with it: SQLite opens the copy as a
            // whole database.
            let copied = copy_whole(&from, to.path());
            drop(from);
            copied.map_err(|source| Error::Copy {
                path: to.path().to_path_buf(),
                source,
            })?;
            rename_event_log(to.path())?;
            Ok(to)
        }))
    }

    fn prune_finished(&mut self, before: f64, limit: usize) -> Result<Vec<String>> {
        // A commit like `commit`'s: once a copy is written, it checkpoints again.
        self.resume_checkpoints()?;
        let path = self.path.clone();
        let sql = |source| Error::Sql {
            path: path.clone(),
            source,
        };
        let tx = self.conn.transaction().map_err(sql)?;
        // Through the index on (state, finished_at): a pass that finds nothing reads nothing.
        // No order: every job it finds is past its time, and a later pass takes the rest. A
        // finished job with no finish time is the oldest, as `load` orders it.
        let found: Vec<(String, String)> = {
            let mut q = tx
                .prepare_cached(&format!(
                    "SELECT id, state FROM jobs WHERE state IN ({})
                     AND (finished_at < ?1 OR finished_at IS NULL) LIMIT ?2",
                    terminal_labels()
                ))
                .map_err(sql)?;
            q.query_map(
                params![before, i64::try_from(limit).unwrap_or(i64::MAX)],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .map_err(sql)?
            .collect::<rusqlite::Result<_>>()
            .map_err(sql)?
        };
        {
            let mut job = tx
                .prepare_cached("DELETE FROM jobs WHERE id = ?1")
                .map_err(sql)?;
            let mut spec = tx
                .prepare_cached("DELETE FROM specs WHERE id = ?1")
                .map_err(sql)?;
            for (id, _) in &found {
                job.execute([id]).map_err(sql)?;
                spec.execute([id]).map_err(sql)?;
            }
        }
        tx.commit().map_err(sql)?;
        Ok(found.into_iter().map(|(_, state)| state).collect())
    }
}

/// `'completed', 'failed', ...`: the labels of the terminal states, for SQL.
fn terminal_labels() -> String {
    use converge_core::cluster::types::JobState as S;
    // Every state, checked by a match with no wildcard: a new state is a compile error here
    // until it is listed (else a new terminal state would be loaded as live forever).
    const ALL: [S; 12] = [
        S::Pending,
        S::Starting,
        S::Running,
        S::Migrating,
        S::Lost,
        S::Paused,
        S::Stopping,
        S::Completed,
        S::Failed,
        S::Cancelled,
        S::Rejected,
        S::Dropped,
    ];
    let _listed = |s: S| match s {
        S::Pending
        | S::Starting
        | S::Running
        | S::Migrating
        | S::Lost
        | S::Paused
        | S::Stopping
        | S::Completed
        | S::Failed
        | S::Cancelled
        | S::Rejected
        | S::Dropped => (),
    };
    ALL.iter()
        .filter(|s| s.is_terminal())
        .map(|s| format!("'{}'", s.label()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Gives the store copied to `path` an event log of its own name. A manager restored from a
/// backup numbers its events on from the backup's last: under the live store's name, a
/// watcher that had seen further took them for events it had shown, and skipped them.
fn rename_event_log(path: &Path) -> Result<()> {
    let sql = |e: rusqlite::Error| Error::Unreadable {
        path: path.to_path_buf(),
        why: sqlite_why(&e),
    };
    let conn = Connection::open(path).map_err(sql)?;
    conn.execute(
        "INSERT OR REPLACE INTO meta (key, value) VALUES ('event_log', ?1)",
        [uuid::Uuid::new_v4().to_string()],
    )
    .map_err(sql)?;
    // Closed, the last connection folds its log back into the file and removes it: the copy
    // is one file again.
    conn.close().map_err(|(_, e)| sql(e))
}

/// Copies all of `from` into a new file `to`, by offset: `from`'s own position is shared
/// with every clone of it.
fn copy_whole(from: &std::fs::File, to: &Path) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::FileExt;
    let mut out = std::fs::File::create_new(to)?;
    let mut buf = vec![0; 1 << 20];
    let mut at = 0;
    loop {
        let n = from.read_at(&mut buf, at)?;
        if n == 0 {
            return out.flush();
        }
        out.write_all(&buf[..n])?;
        at += n as u64;
    }
}

/// Removes the copies [`Store::backup`] wrote into `dir` and that nobody removed (their manager
/// stopped while sending one). Only names of that form are touched.
fn remove_stale_backups(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().starts_with(BACKUP_PREFIX) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}
