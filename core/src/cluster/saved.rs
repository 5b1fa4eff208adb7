//! What a durable manager keeps of the core, and how a core is rebuilt from it.
//!
//! The store keeps the core's own records — every [`Job`] and [`Worker`] as the core holds
//! them, and the [`Counters`] that make ids and order unique — not a second model of the state.
//! After each step the shell asks [`Core::take_changes`] which records the step touched and
//! writes those; a restarted manager reads them back into [`Core::from_saved`]. What is not kept:
//! the streams (a new process has none; agents register again and `Core::reconcile` brings
//! each worker in line) and the policy's own memory (it starts empty and learns again from
//! the reports, as it does for a job that migrates).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::*;

/// Which records a step (or several) changed.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Changes {
    /// Jobs whose record changed.
    pub jobs: BTreeSet<JobId>,
    /// Workers whose record changed.
    pub workers: BTreeSet<WorkerId>,
    /// Workers forgotten ([`Input::Forget`]): their records go. A worker registered again
    /// under the same id after that is also in `workers`, to write after the deletion.
    pub forgotten: BTreeSet<WorkerId>,
    /// A job completed: the finished sizes ([`Counters::history`]) changed.
    pub history: bool,
    /// Jobs whose record changed only in what agents report again anyway (progress points,
    /// steps, CPU used, the worker's view): a shell may write these later than `jobs` (a
    /// crash then loses a few seconds of reports, never a decision). Every running job changes
    /// so every second; writing them all at once was most of a large manager's work.
    pub soft: BTreeSet<JobId>,
}

impl Changes {
    /// Notes that job `id`'s record changed.
    pub(super) fn job(&mut self, id: &JobId) {
        if !self.jobs.contains(id) {
            self.jobs.insert(id.clone());
        }
    }

    /// Notes that job `id`'s record changed only in what agents report again anyway.
    pub(super) fn soft(&mut self, id: &JobId) {
        if !self.jobs.contains(id) && !self.soft.contains(id) {
            self.soft.insert(id.clone());
        }
    }

    /// Notes that worker `id`'s record changed.
    pub(super) fn worker(&mut self, id: &WorkerId) {
        if !self.workers.contains(id) {
            self.workers.insert(id.clone());
        }
    }

    /// Notes that worker `id` was forgotten.
    pub(super) fn forgotten(&mut self, id: &WorkerId) {
        self.workers.remove(id);
        self.forgotten.insert(id.clone());
    }

    /// Adds what `other` changed.
    pub fn merge(&mut self, other: Changes) {
        self.jobs.extend(other.jobs);
        for id in &other.forgotten {
            self.workers.remove(id);
        }
        self.workers.extend(other.workers);
        self.forgotten.extend(other.forgotten);
        self.history |= other.history;
        self.soft.extend(other.soft);
    }
}

/// The core's counters: the next submission number and command number, and the sizes of the
/// jobs that finished (what estimates of unknown jobs rest on).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Counters {
    /// The next job's submission number.
    pub next_seq: u64,
    /// The last command number used.
    pub next_command: u64,
    /// Finished jobs' sizes.
    pub history: converge_policy::estimate::ServiceHistory,
}

/// Everything a core is rebuilt from.
#[derive(Debug, Clone, Default)]
pub struct Saved {
    /// Every live job, and the finished ones a restart keeps in memory (a store may leave
    /// older finished jobs on disk: see `archived_downtime`).
    pub jobs: Vec<Job>,
    /// Every worker.
    pub workers: Vec<Worker>,
    /// The counters.
    pub counters: Counters,
    /// The longest migration downtime of the finished jobs left out of `jobs` (a store loads
    /// only the newest [`super::Config::keep_finished`] finished jobs: the rest stay archived,
    /// and this is what the core's running maximum needs of them).
    pub archived_downtime: Option<f64>,
}

/// Why saved records cannot make a core.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RestoreError {
    /// Two jobs with one submission number, or one id twice.
    #[error("saved job {0} is there twice or shares its submission number with another")]
    Duplicate(JobId),
    /// A job's incarnation is on a worker the records do not have.
    #[error("saved job {job} is on worker {worker}, which is not saved")]
    UnknownWorker {
        /// The job.
        job: JobId,
        /// Its worker.
        worker: WorkerId,
    },
    /// A counter is behind what the records use.
    #[error(
        "saved counters are behind the saved jobs (next submission {next_seq}, job {job} has {seq})"
    )]
    Counters {
        /// The counter.
        next_seq: u64,
        /// The job.
        job: JobId,
        /// Its number.
        seq: u64,
    },
}

impl Core {
    /// The records touched since the last call (the shell stores them); none when the core
    /// keeps no notes ([`Config::record_changes`]).
    pub fn take_changes(&mut self) -> Changes {
        self.changes
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// The counters as they are now.
    pub fn counters(&self) -> Counters {
        Counters {
            next_seq: self.next_seq,
            next_command: self.next_command,
            history: self.history.clone(),
        }
    }

    /// A core rebuilt from `saved` at `now`, deciding with `policy` (finished jobs beyond
    /// [`Config::keep_finished`] stay archived). No worker has a stream
    /// yet; none is declared lost before `now + grace`, so that agents have time to register
    /// again (as Nomad gives clients after a leader change). The indices (pending queue, jobs
    /// per worker) are rebuilt from the jobs' phases, not trusted from the records.
    pub fn from_saved(
        config: Config,
        policy: Box<dyn ClusterPolicy>,
        saved: Saved,
        now: Time,
        grace: Time,
    ) -> Result<Core, RestoreError> {
        let mut core = Core::new(config, policy);
        core.now = now;
        core.grace_until = now + grace;
        for mut w in saved.workers {
            w.conn = None;
            w.jobs.clear();
            w.inbound.clear();
            // Silence while this manager was down says nothing about the worker.
            w.last_seen = w.last_seen.max(now);
            w.last_heard = now;
            core.workers.insert(w);
        }
        let Counters {
            next_seq,
            next_command,
            history,
        } = saved.counters;
        for mut j in saved.jobs {
            j.progress.keep_newest(core.config.progress_history);
            if j.seq >= next_seq {
                return Err(RestoreError::Counters {
                    next_seq,
                    job: j.id,
                    seq: j.seq,
                });
            }
            // The worker of its incarnation, and the one a move is bringing it to.
            let here = j.worker().map(|w| (w, false));
            for (w, inbound) in here
                .into_iter()
                .chain(j.phase.inbound_to().map(|w| (w, true)))
            {
                let Some(worker) = core.workers.get_mut(w) else {
                    return Err(RestoreError::UnknownWorker {
                        job: j.id.clone(),
                        worker: w.clone(),
                    });
                };
                let set = if inbound {
                    &mut worker.inbound
                } else {
                    &mut worker.jobs
                };
                set.insert(j.id.clone());
            }
            if j.state() == JobState::Pending {
                if core.pending.insert(j.seq, j.id.clone()).is_some() {
                    return Err(RestoreError::Duplicate(j.id));
                }
                core.kinds
                    .joined(core.policy.wait_kind(&j), j.seq, &j.reason);
            }
            core.lost += usize::from(matches!(j.phase, JobPhase::Lost { .. }));
            core.valued += usize::from(!j.is_terminal() && j.spec.value_curve.is_some());
            let id = j.id.clone();
            if core.jobs.insert(j).is_some() {
                return Err(RestoreError::Duplicate(id));
            }
        }
        core.next_seq = next_seq;
        core.next_command = next_command;
        core.history = history;
        core.archived_downtime = saved.archived_downtime;
        core.dirty = true;
        // Finished jobs in the order they finished; all but the newest are archived again.
        let mut finished: Vec<(&Job, Time)> = core
            .jobs
            .values()
            .filter(|j| j.is_terminal())
            .map(|j| (j, j.finished_at.get().unwrap_or(Time::NEG_INFINITY)))
            .collect();
        finished.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.seq.cmp(&b.0.seq)));
        core.finished = finished.into_iter().map(|(j, _)| j.id.clone()).collect();
        // Everything here came from the store.
        core.archive();
        core.index.refresh(&core.workers, &core.jobs);
        Ok(core)
    }
}
