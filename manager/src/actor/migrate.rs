//! Moving a job between workers by checkpoint save/restore (SpeCon's speculative migration,
//! its rebalancing, a user's drain, and the recovery of a job whose worker was lost).
//!
//! One protocol serves all four (issue 6):
//! 1. `Save(job, epoch)` to the source; the job is `Migrating`. The agent sends SIGTERM, waits
//!    for the exit (killing the container past the deadline), and answers `Saved`.
//! 2. Only then — never before `Saved` — the epoch is bumped and `Start(job, epoch + 1)` goes to
//!    the target with the same checkpoint directory: the new incarnation resumes from the
//!    checkpoint. Agents refuse commands with stale epochs, so the old incarnation can never
//!    be started again.
//! 3. The first progress line of the new epoch ends the migration; its downtime (save sent →
//!    first progress on the target) is recorded and announced.
//!
//! Failure paths lose nothing: a failed save leaves the job running where it was; a failed
//! restore is retried on the source, then on another worker; the checkpoint directory is the
//! job's for its whole life, so nothing deletes it before a successor runs.

use std::collections::HashMap;

use converge_messenger::pb::{
    self, CommandResult, ContainerExited, Event, EventKind, JobState, MigrationRequest,
    WorkerState, command::Action,
};
use converge_policy::cluster::{Category, JobRequest};
use converge_policy::specon::{
    RebalanceCandidate, Weights, rebalance_plan, select_host, worker_score,
};
use opentelemetry::trace::TraceContextExt;
use tokio::time::Instant;
use tracing::{Span, debug, field, info, info_span, warn};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::{Actor, command, start_command};
use crate::error::{Error, Result};
use crate::metrics::Round;
use crate::state::{Migration, MovePhase, MoveReason};

/// Restores tried (source first, then elsewhere) before a job is declared failed.
const MAX_RESTORE_ATTEMPTS: u32 = 3;

impl Actor {
    /// SpeCon Alg. 1 line 16 arrived from an agent: run Alg. 2 for the job
    /// (specon-speculative-migration.txt:227-256).
    pub(super) fn on_migration_request(&mut self, worker: &str, m: MigrationRequest) {
        if !self.config.migration {
            debug!(%worker, job = %m.job_id, "migration request ignored: the policy does not migrate");
            return;
        }
        let Some(job) = self.cluster.jobs.get(&m.job_id) else {
            return;
        };
        // Alg. 2 lines 9/15/20: a job is migrated (or deliberately kept) at most once.
        if job.epoch != m.epoch
            || job.worker_id.as_deref() != Some(worker)
            || job.state != JobState::Running
            || job.migration_decided
            || job.migration.is_some()
        {
            debug!(job = %m.job_id, "migration request ignored (stale, not running, or already decided)");
            return;
        }
        let id = m.job_id.clone();
        let span = self.job_span(
            &id,
            info_span!(
                parent: None,
                "migration_request",
                job = %id,
                %worker,
                request = %m.reason,
                scores = field::Empty,
                decision = field::Empty
            ),
        );
        let _entered = span.enter();
        let (ids, scores, resource) = self.specon_scores(&id);
        let Some(cur) = ids.iter().position(|w| w == worker) else {
            return;
        };
        if let Some(j) = self.cluster.jobs.get_mut(&id) {
            j.migration_decided = true;
        }
        let mut attributes: HashMap<String, String> = ids
            .iter()
            .zip(&scores)
            .map(|(w, s)| {
                (
                    format!("score.{w}"),
                    s.map_or_else(|| "ineligible".into(), |s| s.to_string()),
                )
            })
            .collect();
        attributes.insert("request".into(), m.reason.clone());
        let mut shown: Vec<_> = attributes
            .iter()
            .filter(|(k, _)| k.starts_with("score."))
            .collect();
        shown.sort();
        span.record(
            "scores",
            shown
                .iter()
                .map(|(k, v)| format!("{}={v}", &k["score.".len()..]))
                .collect::<Vec<_>>()
                .join(" "),
        );
        let began = Instant::now();
        let selected = select_host(cur, &scores, &resource);
        self.metrics
            .round("specon", Round::MigrationSelect, began.elapsed());
        match selected {
            Some(t) if t != cur => {
                let to = ids[t].clone();
                span.record("decision", format!("move to {to}"));
                self.begin_migration(&id, &to, MoveReason::Speculative, attributes);
            }
            other => {
                let why = if other.is_some() {
                    format!("kept on {worker}: it has the minimum score (SpeCon Alg. 2 lines 8-10)")
                } else {
                    format!("kept on {worker}: no other worker can take it")
                };
                span.record("decision", "keep");
                self.metrics
                    .migration(MoveReason::Speculative.as_str(), "declined");
                info!(job = %id, %why, "migration declined");
                self.events.emit(Event {
                    kind: EventKind::Migration as i32,
                    job_id: id.clone(),
                    worker_id: worker.to_string(),
                    epoch: m.epoch,
                    reason: why,
                    attributes,
                    ..Default::default()
                });
            }
        }
    }

    /// Alg. 2 line 3 for every worker, from the categories workers last reported (a job not yet
    /// reported counts as progressing), with the workers that cannot take `job_id` ineligible.
    /// Also returns `R(w, t)`: CPU in use as a fraction of each worker's capacity.
    fn specon_scores(&self, job_id: &str) -> (Vec<String>, Vec<Option<f64>>, Vec<f64>) {
        let job = &self.cluster.jobs[job_id];
        let request = JobRequest {
            cpus: job.spec.cpus,
            memory_bytes: job.spec.memory_bytes,
        };
        let (ids, snaps) = self.snapshots();
        let weights = Weights::default();
        let mut scores = Vec::with_capacity(ids.len());
        let mut resource = Vec::with_capacity(ids.len());
        for (id, s) in ids.iter().zip(&snaps) {
            let (pc, wc, cc) = (
                s.count(Category::New) + s.running.saturating_sub(s.jobs.len()),
                s.count(Category::Watching),
                s.count(Category::Completing),
            );
            let current = job.worker_id.as_deref() == Some(id.as_str());
            let eligible = s.schedulable && (current || s.fits(&request));
            scores.push(eligible.then(|| worker_score(pc, wc, cc, &weights)));
            let used: f64 = self.cluster.jobs_on(id).map(|j| j.cpu_usage).sum();
            resource.push(if s.cpu_capacity > 0.0 {
                used / s.cpu_capacity
            } else {
                0.0
            });
        }
        (ids, scores, resource)
    }

    /// SpeCon Alg. 3 (specon-speculative-migration.txt:290-332), on its timer.
    pub(super) fn rebalance(&mut self, now: Instant) {
        let (ids, snaps) = self.snapshots();
        if ids.len() < 2 {
            return;
        }
        let counts: Vec<usize> = snaps.iter().map(|s| s.running).collect();
        let schedulable: Vec<bool> = snaps.iter().map(|s| s.schedulable).collect();
        let candidates: Vec<RebalanceCandidate> = self
            .cluster
            .jobs
            .values()
            .filter(|j| j.state == JobState::Running && !j.rebalanced && j.migration.is_none())
            .filter_map(|j| {
                let since = j.converged_since?;
                let worker = ids.iter().position(|w| Some(w) == j.worker_id.as_ref())?;
                Some(RebalanceCandidate {
                    job_id: j.id.clone(),
                    worker,
                    converged_for: now.duration_since(since).as_secs_f64(),
                })
            })
            .collect();
        if candidates.is_empty() {
            return;
        }
        // A round with candidates is a trace of its own; the moves it starts are in their
        // jobs' traces, linked back to it.
        let span = info_span!(
            parent: None,
            "rebalance",
            candidates = candidates.len(),
            balance_factor = field::Empty,
            moves = field::Empty
        );
        let _entered = span.enter();
        let began = Instant::now();
        let (moves, bf) = rebalance_plan(&counts, &schedulable, &candidates);
        self.metrics
            .round("specon", Round::Rebalance, began.elapsed());
        span.record("balance_factor", bf);
        span.record("moves", moves.len());
        for (job, _from, to) in moves {
            let target = &snaps[to];
            let j = &self.cluster.jobs[&job];
            let request = JobRequest {
                cpus: j.spec.cpus,
                memory_bytes: j.spec.memory_bytes,
            };
            // Reservations still hold: Alg. 3 counts jobs, not cores.
            if !target.fits(&request) {
                continue;
            }
            if let Some(j) = self.cluster.jobs.get_mut(&job) {
                j.rebalanced = true;
            }
            let attributes = HashMap::from([("balance_factor".to_string(), bf.to_string())]);
            self.begin_migration(&job, &ids[to], MoveReason::Rebalance, attributes);
        }
    }

    /// `DrainWorker`: no new placements on the worker; its running jobs move elsewhere.
    pub(super) fn drain(&mut self, worker_id: &str) -> Result<pb::Worker> {
        let span = info_span!(parent: None, "drain", worker = %worker_id);
        let _entered = span.enter();
        let Some(w) = self.cluster.workers.get_mut(worker_id) else {
            return Err(Error::invalid(
                "worker_id",
                format!("no worker `{worker_id}` is registered"),
            ));
        };
        if w.state != WorkerState::Draining {
            w.state = WorkerState::Draining;
            self.events.emit(Event {
                kind: EventKind::WorkerState as i32,
                worker_id: worker_id.to_string(),
                worker_state: WorkerState::Draining as i32,
                reason: "drained by user".into(),
                ..Default::default()
            });
        }
        let jobs: Vec<(String, f64, u64)> = self
            .cluster
            .jobs_on(worker_id)
            .filter(|j| j.state == JobState::Running && j.migration.is_none())
            .map(|j| (j.id.clone(), j.spec.cpus, j.spec.memory_bytes))
            .collect();
        for (id, cpus, memory_bytes) in jobs {
            // Where the placement policy would put it now (the drained worker is unschedulable).
            let (ids, snaps) = self.snapshots();
            let target = self
                .placer
                .place(&JobRequest { cpus, memory_bytes }, &snaps)
                .index()
                .map(|i| ids[i].clone());
            match target {
                Some(to) => self.begin_migration(&id, &to, MoveReason::Drain, HashMap::new()),
                None => {
                    warn!(job = %id, %worker_id, "no worker can take the job; it stays while the worker drains")
                }
            }
        }
        let policy = self.placer.name();
        Ok(self
            .cluster
            .worker_pb(&self.cluster.workers[worker_id], policy))
    }

    /// Step 1: the job is `Migrating` and its source is told to save.
    fn begin_migration(
        &mut self,
        id: &str,
        to: &str,
        reason: MoveReason,
        mut attributes: HashMap<String, String>,
    ) {
        let Some(from) = self.cluster.jobs.get(id).and_then(|j| j.worker_id.clone()) else {
            return;
        };
        let span = self.job_span(
            id,
            info_span!(
                parent: None,
                "migration",
                job = %id,
                %from,
                %to,
                reason = reason.as_str(),
                outcome = field::Empty,
                downtime_ms = field::Empty
            ),
        );
        // What decided the move (a rebalancing round, a drain) is in another trace: link it.
        let decided_by = Span::current().context();
        span.add_link(decided_by.span().span_context().clone());
        self.metrics.migration(reason.as_str(), "started");
        let step = info_span!(parent: &span, "migration.save", job = %id, worker = %from);
        let _entered = step.enter();
        let j = self.cluster.jobs.get_mut(id).expect("checked above");
        let save = command(
            j,
            Action::Save(pb::Save {
                deadline_ms: self.config.save_deadline.as_millis() as u32,
            }),
        );
        j.migration = Some(Migration {
            from: from.clone(),
            to: to.to_string(),
            reason,
            phase: MovePhase::Saving {
                command_id: save.command_id.clone(),
            },
            started: Instant::now(),
            restore_attempts: 0,
            span,
        });
        let epoch = j.epoch;
        info!(job = %id, %from, %to, reason = reason.as_str(), "migration started");
        attributes.insert("reason".into(), reason.as_str().into());
        attributes.insert("from".into(), from.clone());
        attributes.insert("to".into(), to.to_string());
        self.events.emit(Event {
            kind: EventKind::Migration as i32,
            job_id: id.to_string(),
            worker_id: from.clone(),
            epoch,
            reason: format!("migrating {from} -> {to} ({}): saving", reason.as_str()),
            attributes,
            ..Default::default()
        });
        self.set_state(
            id,
            JobState::Migrating,
            &format!("moving {from} -> {to} ({})", reason.as_str()),
        );
        self.send(&from, save);
    }

    /// Results of the Save and of the restoring Start. Returns true when it consumed `r`.
    pub(super) fn on_migration_result(&mut self, worker: &str, r: &CommandResult) -> bool {
        let Some(j) = self.cluster.jobs.get(&r.job_id) else {
            return false;
        };
        let Some(m) = j.migration.clone() else {
            return false;
        };
        let id = r.job_id.clone();
        let _in_move = m.span.enter();
        match &m.phase {
            MovePhase::Saving { command_id } if *command_id == r.command_id => {
                if !r.ok {
                    // Nothing was saved; the container was not stopped by us: it runs on.
                    warn!(job = %id, error = %r.error, "save failed; the job stays where it is");
                    m.span.record("outcome", "aborted");
                    self.metrics.migration(m.reason.as_str(), "aborted");
                    if let Some(j) = self.cluster.jobs.get_mut(&id) {
                        j.migration = None;
                    }
                    self.migration_event(
                        &id,
                        worker,
                        format!("aborted: save failed: {}", r.error),
                        HashMap::new(),
                    );
                    self.set_state(
                        &id,
                        JobState::Running,
                        &format!("migration aborted; still on {worker}"),
                    );
                    return true;
                }
                let saved = match &r.detail {
                    Some(pb::command_result::Detail::Saved(s)) => s.clone(),
                    _ => pb::Saved::default(),
                };
                let attributes = HashMap::from([
                    ("step".to_string(), saved.step.to_string()),
                    (
                        "checkpoint_bytes".to_string(),
                        saved.checkpoint_bytes.to_string(),
                    ),
                    ("save_ms".to_string(), saved.save_ms.to_string()),
                    ("killed".to_string(), saved.killed.to_string()),
                ]);
                let how = if saved.killed {
                    "killed after ignoring SIGTERM; resuming from its last periodic checkpoint"
                        .to_string()
                } else {
                    format!(
                        "saved at step {} ({} bytes) in {} ms",
                        saved.step, saved.checkpoint_bytes, saved.save_ms
                    )
                };
                info!(job = %id, step = saved.step, bytes = saved.checkpoint_bytes, save_ms = saved.save_ms, killed = saved.killed, "saved");
                self.migration_event(&id, worker, how, attributes);
                self.restore(&id, &m.to);
                true
            }
            MovePhase::Restoring
                if r.epoch == j.epoch && j.worker_id.as_deref() == Some(worker) =>
            {
                match (r.ok, &r.detail) {
                    (true, Some(pb::command_result::Detail::Started(s))) => {
                        let container = s.container_id.clone();
                        if let Some(j) = self.cluster.jobs.get_mut(&id) {
                            j.container_id = container;
                        }
                        self.set_state(&id, JobState::Running, &format!("restored on {worker}"));
                    }
                    (true, _) => {}
                    (false, _) => {
                        warn!(job = %id, %worker, error = %r.error, "restore failed");
                        self.migration_event(
                            &id,
                            worker,
                            format!("restore on {worker} failed: {}", r.error),
                            HashMap::new(),
                        );
                        self.retry_restore(&id, worker);
                    }
                }
                true
            }
            _ => false,
        }
    }

    /// Step 2: a new incarnation on `to`, from the checkpoint. Only ever called after `Saved`
    /// (or after the old incarnation's worker was lost), never while the old one may run.
    fn restore(&mut self, id: &str, to: &str) {
        let Some(j) = self.cluster.jobs.get_mut(id) else {
            return;
        };
        let step = match &j.migration {
            Some(m) => info_span!(
                parent: &m.span,
                "migration.restore",
                job = %id,
                worker = %to,
                attempt = m.restore_attempts + 1
            ),
            // A lost job restarting elsewhere has no move span: the placement span is current.
            None => Span::none(),
        };
        let _entered = step.enter();
        j.epoch += 1;
        j.worker_id = Some(to.to_string());
        j.container_id.clear();
        j.converged_since = None;
        let cmd = start_command(j);
        j.start_command_id = cmd.command_id.clone();
        if let Some(m) = j.migration.as_mut() {
            m.to = to.to_string();
            m.phase = MovePhase::Restoring;
            m.restore_attempts += 1;
        }
        self.send(to, cmd);
    }

    /// A restore failed: try the source first (it ran there a moment ago), then any worker the
    /// placement policy picks, up to [`MAX_RESTORE_ATTEMPTS`].
    fn retry_restore(&mut self, id: &str, failed_on: &str) {
        let Some(m) = self.cluster.jobs[id].migration.clone() else {
            return;
        };
        if m.restore_attempts >= MAX_RESTORE_ATTEMPTS {
            m.span.record("outcome", "failed");
            self.metrics.migration(m.reason.as_str(), "failed");
            if let Some(j) = self.cluster.jobs.get_mut(id) {
                j.migration = None;
            }
            self.finish(
                id,
                JobState::Failed,
                &format!("restore failed {MAX_RESTORE_ATTEMPTS} times; its checkpoint is kept"),
            );
            return;
        }
        let source_ok = m.from != failed_on
            && self
                .cluster
                .workers
                .get(&m.from)
                .is_some_and(|w| w.link.is_some() && w.state != WorkerState::Lost);
        let next = if source_ok {
            Some(m.from.clone())
        } else {
            let spec = &self.cluster.jobs[id].spec;
            let request = JobRequest {
                cpus: spec.cpus,
                memory_bytes: spec.memory_bytes,
            };
            let (ids, snaps) = self.snapshots();
            self.placer
                .place(&request, &snaps)
                .index()
                .map(|i| ids[i].clone())
        };
        match next {
            Some(to) => self.restore(id, &to),
            None => {
                m.span.record("outcome", "failed");
                self.metrics.migration(m.reason.as_str(), "failed");
                if let Some(j) = self.cluster.jobs.get_mut(id) {
                    j.migration = None;
                    j.worker_id = None;
                }
                // Pending again: it starts from its checkpoint when a worker has room.
                self.set_state(
                    id,
                    JobState::Pending,
                    "restore failed; waiting for a worker (its checkpoint is kept)",
                );
                self.schedule();
            }
        }
    }

    /// Step 3: the first progress line of the new incarnation.
    pub(super) fn migration_resumed(&mut self, id: &str) {
        let Some(j) = self.cluster.jobs.get_mut(id) else {
            return;
        };
        let Some(m) = j.migration.take() else {
            return;
        };
        let elapsed = m.started.elapsed();
        let downtime = elapsed.as_millis() as u64;
        m.span.record("outcome", "completed");
        m.span.record("downtime_ms", downtime);
        let _in_move = m.span.enter();
        self.metrics.migration(m.reason.as_str(), "completed");
        self.metrics.migration_downtime(m.reason.as_str(), elapsed);
        j.migrations += 1;
        j.last_migration_downtime_ms = Some(downtime);
        let (worker, step) = (m.to.clone(), j.step);
        info!(job = %id, from = %m.from, to = %m.to, downtime_ms = downtime, "migration done");
        let attributes = HashMap::from([
            ("downtime_ms".to_string(), downtime.to_string()),
            ("from".to_string(), m.from.clone()),
            ("to".to_string(), m.to.clone()),
            ("reason".to_string(), m.reason.as_str().to_string()),
            ("step".to_string(), step.to_string()),
        ]);
        self.migration_event(
            id,
            &worker,
            format!("resumed on {worker} at step {step}; downtime {downtime} ms"),
            attributes,
        );
        if self.cluster.jobs[id].state == JobState::Migrating {
            self.set_state(id, JobState::Running, &format!("restored on {worker}"));
        }
    }

    /// The source container exited while a save was under way. Returns true when handled.
    pub(super) fn on_migration_exit(&mut self, e: &ContainerExited) -> bool {
        let j = &self.cluster.jobs[&e.job_id];
        let saving = matches!(
            j.migration.as_ref().map(|m| &m.phase),
            Some(MovePhase::Saving { .. })
        );
        if !saving {
            return false;
        }
        if e.exit_code == 0 && e.done {
            // It finished its last step as we asked it to save: nothing left to move.
            if let Some(m) = &j.migration {
                m.span.record("outcome", "aborted");
                self.metrics.migration(m.reason.as_str(), "aborted");
            }
            let id = e.job_id.clone();
            if let Some(j) = self.cluster.jobs.get_mut(&id) {
                j.migration = None;
                j.exit_code = Some(0);
            }
            self.finish(&id, JobState::Completed, "completed while being saved");
            return true;
        }
        // Otherwise the Saved result (which waits for this exit) drives the next step.
        true
    }

    /// Jobs Lost for longer than the grace period restart elsewhere from their checkpoints.
    /// The lost worker, if it comes back, is told to stop the superseded incarnation.
    pub(super) fn recover_lost(&mut self, now: Instant) {
        let grace = self.config.recover_lost_after;
        let lost: Vec<String> = self
            .cluster
            .jobs
            .values()
            .filter(|j| j.state == JobState::Lost)
            .filter(|j| j.lost_since.is_some_and(|t| now.duration_since(t) >= grace))
            .map(|j| j.id.clone())
            .collect();
        for id in lost {
            let old = self.cluster.jobs[&id].worker_id.clone().unwrap_or_default();
            if let Some(j) = self.cluster.jobs.get_mut(&id) {
                j.worker_id = None;
                j.lost_since = None;
            }
            info!(job = %id, %old, "restarting a lost job elsewhere from its checkpoint");
            self.set_state(
                &id,
                JobState::Pending,
                &format!(
                    "worker {old} lost for {}s; restarting from its checkpoint",
                    grace.as_secs()
                ),
            );
        }
        self.schedule();
    }

    fn migration_event(
        &mut self,
        id: &str,
        worker: &str,
        reason: String,
        attributes: HashMap<String, String>,
    ) {
        let epoch = self.cluster.jobs.get(id).map_or(0, |j| j.epoch);
        self.events.emit(Event {
            kind: EventKind::Migration as i32,
            job_id: id.to_string(),
            worker_id: worker.to_string(),
            epoch,
            reason,
            attributes,
            ..Default::default()
        });
    }
}
