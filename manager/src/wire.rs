//! Conversions between the wire (`converge_messenger::pb`) and the decision core's plain data
//! (`converge_core::cluster::types`). The only place that knows both.

use std::collections::HashMap;

use converge_core::cluster::lifecycle::{Job, Worker};
use converge_core::cluster::types as core;
use converge_messenger::pb::{self, agent_message::Kind as AgentKind, command::Action};
use converge_policy::cluster::Category;

/// What the core needs of a validated wire spec.
pub fn job_spec(spec: &pb::JobSpec) -> core::JobSpec {
    core::JobSpec {
        name: spec.name.clone(),
        cpus: spec.cpus,
        memory_bytes: spec.memory_bytes,
        value_curve: spec
            .value_curve
            .as_ref()
            .map(|v| converge_policy::value::ValueCurve {
                max_value: v.max_value,
                full_value_until_s: v.full_value_until_s,
                zero_value_at_s: v.zero_value_at_s,
            }),
        estimated_runtime_s: spec.estimated_runtime_s,
        maximize: spec.direction() == pb::Direction::Maximize,
        stop: spec
            .stop_rule
            .as_ref()
            .map(|r| converge_policy::estimate::StopRule {
                min_improvement: r.min_improvement,
                window_steps: r.window_steps,
            }),
    }
}

/// A number from an agent that is not finite (NaN, ±∞) is taken as 0: nothing the decisions
/// could use, and a stored record must stay readable (JSON has no NaN).
fn finite(v: f64) -> f64 {
    if v.is_finite() { v } else { 0.0 }
}

/// Bytes of a failed container's stderr kept in its reason (the agent sends at most this).
const MAX_STDERR_TAIL: usize = 2048;

/// `text` cut to its last `max` bytes (on a character boundary): the manager bounds what an
/// agent sends rather than trusting it.
fn bounded(text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text[start..].to_string()
}

/// An agent's registration.
pub fn register(r: pb::Register) -> core::Register {
    core::Register {
        worker: r.worker_id.into(),
        cpu_capacity: finite(r.cpu_capacity),
        memory_bytes: r.memory_bytes,
        calibration: finite(r.calibration),
        labels: r.labels.into_iter().collect(),
        instance_id: r.instance_id,
        containers: r
            .containers
            .into_iter()
            .map(|c| core::ContainerReport {
                running: c.state() != pb::ContainerState::Exited,
                paused: c.state() == pb::ContainerState::Paused,
                job: c.job_id.into(),
                epoch: c.epoch,
                container_id: c.container_id,
                last_step: c.last_step,
                exit: c.exit.map(exited),
            })
            .collect(),
    }
}

/// A container's exit, on its own or in a registration's list.
fn exited(e: pb::ContainerExited) -> core::ContainerExited {
    core::ContainerExited {
        job: e.job_id.into(),
        epoch: e.epoch,
        exit_code: e.exit_code,
        oom_killed: e.oom_killed,
        done: e.done,
        last_step: e.last_step,
        requested: e.requested,
        stderr_tail: bounded(e.stderr_tail, MAX_STDERR_TAIL),
    }
}

/// An agent's message, or `None` for the kinds the core does not consume (a second Register,
/// usage batches).
pub fn agent_message(kind: AgentKind) -> Option<core::AgentMessage> {
    Some(match kind {
        // Log chunks answer a reader, not the core (`actor::logs`).
        AgentKind::Register(_) | AgentKind::Usage(_) | AgentKind::Logs(_) => return None,
        AgentKind::Heartbeat(hb) => core::AgentMessage::Heartbeat(core::Heartbeat {
            jobs: hb
                .jobs
                .into_iter()
                .map(|s| core::JobStatus {
                    category: category(s.category()),
                    job: s.job_id.into(),
                    epoch: s.epoch,
                    growth_efficiency: s.growth_efficiency.filter(|v| v.is_finite()),
                    cpu_limit: s.cpu_limit.filter(|v| v.is_finite()),
                    cpu_usage: finite(s.cpu_usage).max(0.0),
                })
                .collect(),
            alpha: hb.alpha.filter(|v| v.is_finite()),
            interval_s: hb.interval_s.filter(|v| v.is_finite()),
        }),
        AgentKind::Progress(b) => core::AgentMessage::Progress(core::ProgressBatch {
            samples: b
                .samples
                .into_iter()
                .map(|s| core::ProgressSample {
                    checkpointed: s.checkpoint() != pb::CheckpointEvent::None,
                    job: s.job_id.into(),
                    epoch: s.epoch,
                    unix_ms: s.unix_ms,
                    step: s.step,
                    total_steps: s.total_steps,
                    // The agent's contract never reports a non-finite metric; an agent that
                    // did would otherwise poison the estimates (and NaN is how the core packs
                    // "no value").
                    value: s.value.filter(|v| v.is_finite()),
                })
                .collect(),
            malformed: b
                .malformed
                .into_iter()
                .map(|m| core::Malformed {
                    job: m.job_id.into(),
                    epoch: m.epoch,
                    count: m.count,
                })
                .collect(),
        }),
        AgentKind::Result(r) => core::AgentMessage::Result(core::CommandResult {
            detail: match r.detail {
                Some(pb::command_result::Detail::Started(s)) => core::ResultDetail::Started {
                    container_id: s.container_id,
                },
                Some(pb::command_result::Detail::Saved(s)) => core::ResultDetail::Saved {
                    step: s.step,
                    checkpoint_bytes: s.checkpoint_bytes,
                    save_ms: s.save_ms,
                    killed: s.killed,
                },
                _ => core::ResultDetail::None,
            },
            command: r.command_id.into(),
            job: r.job_id.into(),
            epoch: r.epoch,
            ok: r.ok,
            error: r.error,
        }),
        AgentKind::Exited(e) => core::AgentMessage::Exited(exited(e)),
        AgentKind::MigrationRequest(m) => core::AgentMessage::MigrationRequest {
            job: m.job_id.into(),
            epoch: m.epoch,
            reason: m.reason,
        },
    })
}

fn category(c: pb::Category) -> Option<Category> {
    match c {
        pb::Category::Unspecified => None,
        pb::Category::New => Some(Category::New),
        pb::Category::Watching => Some(Category::Watching),
        pb::Category::Completing => Some(Category::Completing),
    }
}

fn category_pb(c: Option<Category>) -> pb::Category {
    match c {
        None => pb::Category::Unspecified,
        Some(Category::New) => pb::Category::New,
        Some(Category::Watching) => pb::Category::Watching,
        Some(Category::Completing) => pb::Category::Completing,
    }
}

/// A core command on the wire; a Start carries the job's full spec, kept by the shell.
pub fn command(c: core::Command, spec: Option<&pb::JobSpec>) -> pb::Command {
    let action = match c.action {
        core::Action::Start { cpu_shares } => Action::Start(pb::Start {
            spec: spec.cloned(),
            // The checkpoint directory is the job's for its whole life: every incarnation
            // resumes from the same one.
            checkpoint_dir: c.job.to_string(),
            // Elastic limits come from the worker's own rounds (FlowCon) or none at all.
            cpus: 0.0,
            cpu_shares,
        }),
        core::Action::SetLimits { cpus, cpu_shares } => {
            Action::SetLimits(pb::SetLimits { cpus, cpu_shares })
        }
        core::Action::Save { deadline_ms } => Action::Save(pb::Save { deadline_ms }),
        core::Action::Pause => Action::Pause(pb::Pause {}),
        core::Action::Resume => Action::Resume(pb::Resume {}),
        core::Action::Stop { reason, discard } => Action::Stop(pb::Stop {
            reason,
            remove: true,
            discard,
        }),
    };
    pb::Command {
        command_id: c.id.to_string(),
        job_id: c.job.to_string(),
        epoch: c.epoch,
        traceparent: String::new(),
        action: Some(action),
    }
}

/// The answer to a registration.
pub fn registered(r: core::Registered, manager_id: &str) -> pb::Registered {
    pb::Registered {
        manager_id: manager_id.to_string(),
        policy: r.policy.to_string(),
        heartbeat_interval_ms: (r.heartbeat_interval * 1000.0).round() as u64,
        migration: r.migration,
        worker_mode: match r.mode {
            core::WorkerMode::Free => pb::WorkerMode::Free,
            core::WorkerMode::FlowCon => pb::WorkerMode::Flowcon,
        } as i32,
        // The actor answers every heartbeat once what came before it is stored (`actor`).
        acknowledges: true,
    }
}

/// A job state on the wire.
pub fn job_state(s: core::JobState) -> pb::JobState {
    use core::JobState as S;
    match s {
        S::Pending => pb::JobState::Pending,
        S::Starting => pb::JobState::Starting,
        S::Running => pb::JobState::Running,
        S::Migrating => pb::JobState::Migrating,
        S::Lost => pb::JobState::Lost,
        S::Paused => pb::JobState::Paused,
        S::Stopping => pb::JobState::Stopping,
        S::Completed => pb::JobState::Completed,
        S::Failed => pb::JobState::Failed,
        S::Cancelled => pb::JobState::Cancelled,
        S::Rejected => pb::JobState::Rejected,
        S::Dropped => pb::JobState::Dropped,
    }
}

/// A wire job state as the core's (None for Unspecified).
pub fn job_state_from_pb(s: pb::JobState) -> Option<core::JobState> {
    use core::JobState as S;
    Some(match s {
        pb::JobState::Unspecified => return None,
        pb::JobState::Pending => S::Pending,
        pb::JobState::Starting => S::Starting,
        pb::JobState::Running => S::Running,
        pb::JobState::Migrating => S::Migrating,
        pb::JobState::Lost => S::Lost,
        pb::JobState::Paused => S::Paused,
        pb::JobState::Completed => S::Completed,
        pb::JobState::Failed => S::Failed,
        pb::JobState::Cancelled => S::Cancelled,
        pb::JobState::Rejected => S::Rejected,
        pb::JobState::Dropped => S::Dropped,
        pb::JobState::Stopping => S::Stopping,
    })
}

/// A worker state on the wire.
pub fn worker_state(s: core::WorkerState) -> pb::WorkerState {
    match s {
        core::WorkerState::Ready => pb::WorkerState::Ready,
        core::WorkerState::Draining => pb::WorkerState::Draining,
        core::WorkerState::Lost => pb::WorkerState::Lost,
    }
}

/// An event on the wire (numbered and timed by the event log).
pub fn event(e: core::Event) -> pb::Event {
    pb::Event {
        seq: 0,
        unix_ms: 0,
        kind: match e.kind {
            core::EventKind::JobState => pb::EventKind::JobState,
            core::EventKind::JobPlaced => pb::EventKind::JobPlaced,
            core::EventKind::Migration => pb::EventKind::Migration,
            core::EventKind::WorkerState => pb::EventKind::WorkerState,
            core::EventKind::Limits => pb::EventKind::Limits,
            core::EventKind::Stray => pb::EventKind::Stray,
        } as i32,
        job_id: e.job.unwrap_or_default().to_string(),
        worker_id: e.worker.unwrap_or_default().to_string(),
        epoch: e.epoch,
        from_state: e.from.map_or(pb::JobState::Unspecified, job_state) as i32,
        to_state: e.to.map_or(pb::JobState::Unspecified, job_state) as i32,
        worker_state: e
            .worker_state
            .map_or(pb::WorkerState::Unspecified, worker_state) as i32,
        reason: e.reason,
        attributes: e.attributes.into_iter().collect(),
    }
}

fn ms(t: Option<core::Time>) -> i64 {
    t.map_or(0, |t| (t * 1000.0).round() as i64)
}

/// An ETA on the wire.
pub fn eta(e: converge_core::cluster::Eta) -> pb::Eta {
    pb::Eta {
        remaining_s: e.remaining_s,
        finish_unix_ms: ms(Some(e.finish_at)),
        start_unix_ms: ms(e.start_at),
        basis: e.basis.as_str().to_string(),
        confidence: e.confidence,
    }
}

/// A job on the wire.
pub fn job(
    j: &Job,
    spec: Option<&pb::JobSpec>,
    policy: &str,
    include_progress: bool,
    eta: Option<converge_core::cluster::Eta>,
) -> pb::Job {
    pb::Job {
        id: j.id.to_string(),
        spec: spec.cloned(),
        state: job_state(j.state()) as i32,
        reason: j.reason.clone(),
        worker_id: j.shown_worker().cloned().unwrap_or_default().to_string(),
        epoch: j.epoch,
        container_id: j.container_id.clone(),
        submitted_unix_ms: ms(Some(j.submitted_at)),
        started_unix_ms: ms(j.started_at.get()),
        finished_unix_ms: ms(j.finished_at.get()),
        step: j.step,
        total_steps: j.total_steps,
        metric_value: j.metric_value.get(),
        samples: j.samples,
        malformed_lines: j.malformed,
        category: category_pb(j.view.category) as i32,
        growth_efficiency: j.view.growth_efficiency,
        cpu_limit: j.view.cpu_limit,
        migrations: j.migrations,
        exit_code: j.exit_code,
        progress: if include_progress {
            j.progress
                .iter()
                .map(|p| pb::ProgressPoint {
                    unix_ms: p.unix_ms,
                    step: p.step,
                    value: p.value,
                    epoch: p.epoch,
                })
                .collect()
        } else {
            Vec::new()
        },
        policy: policy.to_string(),
        last_migration_downtime_ms: j
            .last_migration_downtime
            .get()
            .map(|d| (d * 1000.0).round() as u64),
        cpu_usage: j.view.cpu_usage,
        eta: eta.map(self::eta),
    }
}

/// A worker on the wire.
pub fn worker(
    w: &Worker,
    jobs: &converge_core::cluster::lifecycle::Jobs,
    policy: &str,
) -> pb::Worker {
    pb::Worker {
        id: w.id.to_string(),
        state: worker_state(w.state.state()) as i32,
        cpu_capacity: w.cpu_capacity,
        memory_bytes: w.memory_bytes,
        calibration: w.calibration,
        labels: w.labels.clone().into_iter().collect::<HashMap<_, _>>(),
        // What placement counts (jobs on their way here, containers still stopping), so that
        // a waiting job's "largest free" and this agree.
        cpu_requested: converge_core::cluster::policy::snapshot(w, jobs).cpu_requested,
        job_ids: w.jobs.iter().map(|j| j.to_string()).collect(),
        stopping_job_ids: w.stopping().map(|o| o.job.to_string()).collect(),
        last_heartbeat_unix_ms: ms(Some(w.last_seen)),
        policy: policy.to_string(),
        alpha: w.alpha,
        interval_s: w.interval_s,
    }
}
