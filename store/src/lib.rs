//! `converge-store`: the manager's durable state.
//!
//! The manager's decision core (`converge_core::cluster::Core`) reports after each step which
//! of its records changed; the manager writes those records here in one transaction before any
//! effect of the step leaves the process (`converge_manager::actor`), and a restarted manager
//! reads them back into `Core::from_saved`. The records are the core's own types, so there is
//! no second model of the state to keep in line.
//!
//! Start at [`Store`], the interface a backend implements (a replicated one, such as etcd for a
//! standby manager, would be a second implementation), then [`Sqlite`], the one there is: an
//! embedded SQLite database (compiled in through `rusqlite`'s `bundled` feature) in WAL mode.
//! SQLite rather than `redb`: a file every operator can open and check with the `sqlite3`
//! tool (`PRAGMA integrity_check`; while the manager runs it holds the file, and
//! `convergectl backup` copies it), row-level upserts for records that change often, and two
//! decades of recovery from torn writes.
//!
//! What is kept: every job (spec as the decisions see it, phase with its worker, epoch, move
//! and command in flight, reasons, the last [`converge_core::cluster::progress::STORED_PROGRESS`]
//! progress points), every worker with its drain state, the counters that keep submission
//! order and command ids unique, the full job specs the Start commands carry, and the event
//! log with its sequence numbers (the newest [`RETAINED_EVENTS`]). Finished jobs stay until the
//! manager prunes them ([`Store::prune_finished`]).

mod sqlite;

use converge_core::cluster::lifecycle::{Job, Worker};
use converge_core::cluster::saved::{Counters, Saved};
use std::path::PathBuf;

pub use sqlite::{FILE_NAME, SCHEMA_VERSION, Sqlite};

/// Events kept in the store; older ones are deleted as new ones come (a watcher asking for
/// them starts at the oldest kept).
pub const RETAINED_EVENTS: u64 = 1_000_000;

/// One numbered event, encoded by the shell (the store does not read it).
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    /// Its sequence number.
    pub seq: u64,
    /// The job it is about, if any.
    pub job: Option<String>,
    /// The encoded event.
    pub bytes: Vec<u8>,
}

/// What one step (or several) changed, written in one transaction.
#[derive(Debug, Default)]
pub struct Batch<'a> {
    /// Jobs whose record changed.
    pub jobs: Vec<&'a Job>,
    /// Workers whose record changed.
    pub workers: Vec<&'a Worker>,
    /// Workers forgotten: their records are deleted, before `workers` are written (a worker
    /// registered again under a forgotten id is in both).
    pub forgotten_workers: Vec<&'a str>,
    /// The core's counters now.
    pub counters: Option<&'a Counters>,
    /// Whether the finished sizes in the counters changed (they are written only then).
    pub history_changed: bool,
    /// Full specs of jobs submitted since the last batch, encoded by the shell.
    pub specs: Vec<(&'a str, &'a [u8])>,
    /// Events numbered since the last batch.
    pub events: &'a [StoredEvent],
}

impl Batch<'_> {
    /// Whether there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
            && self.workers.is_empty()
            && self.forgotten_workers.is_empty()
            && self.counters.is_none()
            && self.specs.is_empty()
            && self.events.is_empty()
    }
}

/// What a store held when it was opened.
#[derive(Debug, Default)]
pub struct Recovered {
    /// The core's records.
    pub saved: Saved,
    /// Full job specs, encoded by the shell.
    pub specs: Vec<(String, Vec<u8>)>,
    /// The newest events, oldest first.
    pub events: Vec<StoredEvent>,
    /// The number the next event gets.
    pub next_event_seq: u64,
    /// The event log's name, made when the store was first opened (a random UUID): a
    /// watcher that finds another name after a reconnect knows the numbering started again
    /// (a manager restarted without this store, or on another).
    pub event_log: String,
    /// How many stored jobs are in each state (by [`JobState::label`]), loaded or left on
    /// disk: what the manager's gauge of jobs per state starts from.
    ///
    /// [`JobState::label`]: converge_core::cluster::types::JobState::label
    pub job_states: Vec<(String, u64)>,
}

impl Recovered {
    /// Whether the store was empty (a first start). Judged by what was ever written, not by
    /// what was loaded: a store whose jobs all finished and were left on disk loads none of
    /// them, but its counters and event numbers must go on.
    pub fn is_empty(&self) -> bool {
        self.saved.jobs.is_empty()
            && self.saved.workers.is_empty()
            && self.events.is_empty()
            && self.next_event_seq <= 1
            && self.saved.counters.next_seq == 0
            && self.saved.counters.next_command == 0
    }
}

/// A backend for the manager's state.
pub trait Store: Send {
    /// What a starting manager needs (read once): every worker, every live job and the
    /// `newest_finished` jobs that finished last (the rest stay archived, answered by
    /// [`Store::jobs`]), with their specs; the newest `newest_events` events.
    fn load(&mut self, newest_events: usize, newest_finished: usize) -> Result<Recovered>;

    /// Writes `batch` atomically: after it returns, a crash loses none of it.
    fn commit(&mut self, batch: &Batch<'_>) -> Result<()>;

    /// Where it is, for logs and errors.
    fn location(&self) -> String;

    /// Stored jobs, by submission order, with their full specs, as `query` says. How the
    /// manager answers for jobs its core archived.
    fn jobs(&mut self, query: JobQuery<'_>) -> Result<Vec<StoredJob>>;

    /// The newest `limit` stored events numbered from `from_seq` up to (not including)
    /// `before_seq`, of job `job` only when given, oldest first: a watcher's replay of what
    /// the manager no longer holds in memory.
    fn events(
        &mut self,
        from_seq: u64,
        before_seq: u64,
        job: Option<&str>,
        limit: usize,
    ) -> Result<Vec<StoredEvent>>;

    /// Deletes at most `limit` finished jobs, with their specs, that finished before `before`
    /// (the core's time: seconds since the Unix epoch); returns how many went. How the
    /// manager's `--finished-retention` keeps the file from growing with the history; `limit`
    /// bounds how long one call holds the writer.
    /// Returns the state (its label) of each job removed.
    fn prune_finished(&mut self, before: f64, limit: usize) -> Result<Vec<String>>;

    /// Begins a consistent copy of the whole store (what the last commit left) in a new file
    /// beside it: how a running manager is backed up, since it holds its file exclusively.
    /// What this call does holds the writer; the bulk of the copy is
    /// [`PendingBackup::write`], for another thread, while the writer goes on committing. The
    /// file goes when the [`BackupCopy`] is dropped; one left by a manager that stopped
    /// meanwhile is removed when the store is next opened.
    fn backup(&mut self) -> Result<PendingBackup>;
}

/// A backup [`Store::backup`] began: the part of the copy that runs off the writer's thread.
/// Dropped unwritten, it writes nothing and holds nothing.
#[must_use = "a backup is written by `write`"]
pub struct PendingBackup(Box<dyn FnOnce() -> Result<BackupCopy> + Send>);

impl PendingBackup {
    /// A backup whose copy `write` makes; for backends.
    pub fn new(write: impl FnOnce() -> Result<BackupCopy> + Send + 'static) -> Self {
        Self(Box::new(write))
    }

    /// Writes the copy; blocking (the whole store is read), so not on an async runtime's
    /// threads.
    pub fn write(self) -> Result<BackupCopy> {
        (self.0)()
    }
}

impl std::fmt::Debug for PendingBackup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PendingBackup")
    }
}

/// A copy written by [`Store::backup`], removed when dropped: whoever holds it last (the reader,
/// or an answer that never reached its caller) leaves nothing behind. An open file of it stays
/// readable to its end after the removal.
#[derive(Debug)]
pub struct BackupCopy(PathBuf);

impl BackupCopy {
    /// Where the copy is.
    pub fn path(&self) -> &std::path::Path {
        &self.0
    }

    /// Keeps the file: it is no longer removed on drop.
    pub fn keep(mut self) -> PathBuf {
        std::mem::take(&mut self.0)
    }
}

impl Drop for BackupCopy {
    fn drop(&mut self) {
        // Empty once kept.
        if !self.0.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

/// Which stored jobs [`Store::jobs`] reads; the default is every one.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct JobQuery<'a> {
    /// Job `id` only.
    pub id: Option<&'a str>,
    /// Only those in this state (a [`converge_core::cluster::types::JobState::label`]).
    pub state: Option<&'a str>,
    /// Only those submitted after the job of this submission number (`Job::seq`): where a
    /// page of a list left off.
    pub after_seq: Option<u64>,
    /// At most this many.
    pub limit: Option<usize>,
}

impl<'a> JobQuery<'a> {
    /// Job `id` alone.
    pub fn job(id: &'a str) -> Self {
        JobQuery {
            id: Some(id),
            ..JobQuery::default()
        }
    }
}

/// A job as stored: the core's record and the full spec it was submitted with.
#[derive(Debug, Clone)]
pub struct StoredJob {
    /// The core's record.
    pub job: Job,
    /// The spec's protobuf bytes, as submitted.
    pub spec: Option<Vec<u8>>,
}

/// What went wrong with the store. Each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The state directory cannot be made or opened.
    #[error(
        "cannot use the state directory {dir}: {source}; make it writable or pass another --state-dir"
    )]
    Dir {
        /// The directory.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The state directory given is a file (the store's own, as a rule).
    #[error(
        "the state directory {dir} is a file: pass the directory that holds it (the store is the file converge.db in --state-dir)"
    )]
    DirIsFile {
        /// The path given.
        dir: PathBuf,
    },
    /// The file is not a readable Converge store (not SQLite, truncated, damaged, another
    /// application's database).
    #[error(
        "the state store {path} cannot be used: {why}. The manager will not start on a store it cannot read \
         (it would forget every job): restore the file from a backup, or move it away to start with an empty cluster"
    )]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// Another process holds the file: a manager on the same state directory.
    #[error(
        "the state store {path} cannot be used: another manager holds it (one manager per state directory): stop that manager, or give this one another --state-dir"
    )]
    Held {
        /// The file.
        path: PathBuf,
    },
    /// The store was written by a newer manager.
    #[error(
        "the state store {path} has schema version {found}, newer than this manager reads ({supported}): \
         run the newer manager that wrote it, or move the file away to start with an empty cluster"
    )]
    Newer {
        /// The file.
        path: PathBuf,
        /// Its version.
        found: i64,
        /// What this build reads.
        supported: i64,
    },
    /// A record cannot be decoded.
    #[error(
        "the state store {path} holds a {what} record that cannot be read ({why}): restore the file from a \
         backup, or move it away to start with an empty cluster"
    )]
    Record {
        /// The file.
        path: PathBuf,
        /// Which record.
        what: String,
        /// Why.
        why: String,
    },
    /// A backup could not begin: the WAL could not be checkpointed into the file whole, so the
    /// file lacks commits.
    #[error(
        "the state store {path} could not be checkpointed whole for a backup (something else reads it); nothing was copied: retry the backup"
    )]
    Checkpoint {
        /// The file.
        path: PathBuf,
    },
    /// A backup's copy could not be written.
    #[error("the backup copy {path} could not be written: {source}")]
    Copy {
        /// The copy.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A read or write failed while running.
    #[error("the state store {path} failed: {source}")]
    Sql {
        /// The file.
        path: PathBuf,
        /// SQLite's error.
        source: rusqlite::Error,
    },
}

/// The crate's result.
pub type Result<T> = std::result::Result<T, Error>;
