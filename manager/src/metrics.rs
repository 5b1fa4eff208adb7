//! The manager's Prometheus metrics (`/metrics`, `docs/observability.md` says what each means).
//!
//! One [`Registry`] per manager, never a global one: a test process running a manager next to
//! agents keeps their counts apart. The actor is the only writer; the endpoint only encodes.

use std::sync::Arc;
use std::time::Duration;

use converge_messenger::pb::JobState;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Every job state, so each one is shown (at 0) before any job reaches it.
const STATES: [JobState; 12] = [
    JobState::Pending,
    JobState::Starting,
    JobState::Running,
    JobState::Migrating,
    JobState::Paused,
    JobState::Completed,
    JobState::Failed,
    JobState::Cancelled,
    JobState::Lost,
    JobState::Rejected,
    JobState::Dropped,
    JobState::Stopping,
];

/// A move's ends, as its events' `outcome` says (`docs/observability.md`).
pub const MIGRATION_OUTCOMES: [&str; 6] = [
    "started",
    "completed",
    "aborted",
    "failed",
    "declined",
    "abandoned",
];

/// Commands the manager sends, by their action's name (the core's `Action::name`s), and
/// `logs`: a job's output read through its agent.
const ACTIONS: [&str; 7] = [
    "start",
    "set_limits",
    "save",
    "pause",
    "resume",
    "stop",
    "logs",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AtLabel {
    at: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabel {
    policy: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RejectionLabel {
    policy: &'static str,
    stage: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MigrationLabel {
    reason: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabel {
    action: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RoundLabel {
    policy: &'static str,
    round: &'static str,
}

/// A policy decision the manager times.
#[derive(Clone, Copy, Debug)]
pub enum Round {
    /// One placement decision (`Placer::place`).
    Placement,
    /// SpeCon Alg. 2 host selection for a migration request.
    MigrationSelect,
    /// SpeCon Alg. 3, one rebalancing round.
    Rebalance,
}

impl Round {
    fn name(self) -> &'static str {
        match self {
            Round::Placement => "placement",
            Round::MigrationSelect => "migration_select",
            Round::Rebalance => "rebalance",
        }
    }
}

/// The manager's counters, gauges and histograms, and the registry that shows them.
#[derive(Clone, Debug)]
pub struct ManagerMetrics {
    registry: Arc<Registry>,
    jobs: Family<StateLabel, Gauge>,
    submitted: Counter,
    placements: Family<PolicyLabel, Counter>,
    rejections: Family<RejectionLabel, Counter>,
    migrations: Family<MigrationLabel, Counter>,
    downtime: Family<ReasonLabel, Histogram>,
    eta_error: Family<AtLabel, Histogram>,
    registrations: Family<KindLabel, Counter>,
    disconnects: Counter,
    strays: Counter,
    received: Family<KindLabel, Counter>,
    commands: Family<ActionLabel, Counter>,
    rounds: Family<RoundLabel, Histogram>,
    refused: Family<KindLabel, Counter>,
    tasks: Gauge,
    archived: Counter,
    pruned: Counter,
    store_commit: Histogram,
}

impl Default for ManagerMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ManagerMetrics {
    /// Fresh metrics in a registry of their own (names start with `converge_manager_`).
    pub fn new() -> Self {
        let mut root = Registry::default();
        let r = root.sub_registry_with_prefix("converge_manager");
        let jobs = Family::<StateLabel, Gauge>::default();
        for s in STATES {
            let _ = jobs.get_or_create(&StateLabel { state: s.label() });
        }
        r.register("jobs", "Jobs in each state now", jobs.clone());
        let submitted = Counter::default();
        r.register(
            "jobs_submitted",
            "Jobs accepted by SubmitJob",
            submitted.clone(),
        );
        let placements = Family::default();
        r.register(
            "placements",
            "Incarnations placed on a worker (first starts and restarts), by placement policy",
            placements.clone(),
        );
        let rejections = Family::default();
        r.register(
            "rejections",
            "Jobs refused: stage=validation (SubmitJob refused the spec), policy (the job became \
             Rejected)",
            rejections.clone(),
        );
        let migrations = Family::default();
        r.register(
            "migrations",
            "Migration decisions and their ends, by reason (speculative, rebalance, drain) and \
             outcome (started, completed, aborted, failed, declined, abandoned)",
            migrations.clone(),
        );
        // 50 ms .. ~100 s: checkpoint save + restore of a training job.
        let downtime = Family::<ReasonLabel, Histogram>::new_with_constructor(
            (|| Histogram::new(exponential_buckets(0.05, 2.0, 12))) as fn() -> Histogram,
        );
        r.register(
            "migration_downtime_seconds",
            "Save sent to first progress on the target, of completed migrations",
            downtime.clone(),
        );
        let eta_error = Family::<AtLabel, Histogram>::new_with_constructor(
            (|| Histogram::new(exponential_buckets(0.01, 2.0, 10))) as fn() -> Histogram,
        );
        r.register(
            "eta_error_ratio",
            "How far a completed job's predicted finish, made when it passed 25, 50 or 75% of its \
             steps (label at), was from its real finish, as a fraction of its run",
            eta_error.clone(),
        );
        let registrations = Family::default();
        r.register(
            "agent_registrations",
            "Agent streams registered: kind=first (a worker new to this manager) or reconnect",
            registrations.clone(),
        );
        let disconnects = Counter::default();
        r.register(
            "agent_disconnects",
            "Agent streams that ended",
            disconnects.clone(),
        );
        let strays = Counter::default();
        r.register(
            "stray_containers_stopped",
            "Containers found running where their job no longer runs, stopped when their worker \
             registered: an incarnation superseded while its worker was lost (two copies ran), \
             or a job that ended meanwhile",
            strays.clone(),
        );
        let received = Family::default();
        r.register(
            "messages_received",
            "Messages from agents, by kind",
            received.clone(),
        );
        let commands = Family::default();
        r.register(
            "commands_sent",
            "Commands sent to agents, by action",
            commands.clone(),
        );
        // 1 µs .. ~4 s: a placement over thousands of workers should stay well under 1 ms.
        let rounds = Family::<RoundLabel, Histogram>::new_with_constructor(
            (|| Histogram::new(exponential_buckets(1e-6, 4.0, 12))) as fn() -> Histogram,
        );
        r.register(
            "policy_round_seconds",
            "Time the policy took to decide, by policy and round (placement, migration_select, \
             rebalance)",
            rounds.clone(),
        );
        let refused = Family::<KindLabel, Counter>::default();
        r.register(
            "refused",
            "Inputs refused by the decision core: agent messages about jobs their worker never ran \
             or answering a command sent to another incarnation (foreign_job), about unknown jobs, on replaced streams, disallowed transitions, \
             and a second agent process registering as a connected worker (second_agent)",
            refused.clone(),
        );
        let tasks = Gauge::default();
        r.register(
            "tasks",
            "Tokio tasks alive in the manager (one per agent stream and per call in flight, \
             plus a fixed few): flat under a steady load, or something leaks",
            tasks.clone(),
        );
        let archived = Counter::default();
        r.register(
            "jobs_archived",
            "Finished jobs dropped from memory beyond --keep-finished (the store answers for them)",
            archived.clone(),
        );
        let pruned = Counter::default();
        r.register(
            "jobs_pruned",
            "Finished jobs deleted from the state store past --finished-retention",
            pruned.clone(),
        );
        // 20 us .. ~0.3 s: a WAL commit of a few pages, up to a batch of thousands of records.
        let store_commit = Histogram::new(exponential_buckets(2e-5, 2.0, 14));
        r.register(
            "store_commit_seconds",
            "Writes to the state store, each one transaction (what answers and commands wait \
             for); count is the number of commits",
            store_commit.clone(),
        );
        Self {
            registry: Arc::new(root),
            jobs,
            submitted,
            placements,
            rejections,
            migrations,
            downtime,
            eta_error,
            registrations,
            disconnects,
            strays,
            received,
            commands,
            rounds,
            refused,
            tasks,
            archived,
            pruned,
            store_commit,
        }
    }

    /// Shows every series a manager running `policy` may count, at 0: a series that appears
    /// only at its first count breaks `rate()` and an alert on its absence.
    pub(crate) fn seed(&self, policy: &'static str) {
        let _ = self.placements.get_or_create(&PolicyLabel { policy });
        for stage in ["validation", "policy"] {
            let _ = self
                .rejections
                .get_or_create(&RejectionLabel { policy, stage });
        }
        for reason in converge_core::cluster::types::MoveReason::ALL {
            let _ = self.downtime.get_or_create(&ReasonLabel {
                reason: reason.as_str(),
            });
            for outcome in MIGRATION_OUTCOMES {
                let reason = reason.as_str();
                let _ = self
                    .migrations
                    .get_or_create(&MigrationLabel { reason, outcome });
            }
        }
        for action in ACTIONS {
            let _ = self.commands.get_or_create(&ActionLabel { action });
        }
        for kind in converge_core::cluster::Refusal::ALL {
            let _ = self.refused.get_or_create(&KindLabel {
                kind: kind.as_str(),
            });
        }
    }

    /// The registry, for the `/metrics` endpoint.
    pub fn registry(&self) -> Arc<Registry> {
        self.registry.clone()
    }

    /// A submission accepted (its job's state gauge follows its `submitted` event, as every
    /// other change of state does: counting it here too showed every job pending forever).
    pub(crate) fn job_submitted(&self) {
        self.submitted.inc();
    }

    /// The gauge of jobs in `state` starts at `count` (a restarted manager's stored jobs):
    /// the changes counted from then on move it from there, not from 0.
    /// A stored job in `state` (a label) was pruned: one fewer in its state's gauge.
    pub(crate) fn job_pruned(&self, state: &str) {
        if let Some(g) = self.stored_state(state) {
            g.dec();
        }
    }

    /// The gauge of jobs in `state` starts at `count` (a restarted manager's stored jobs):
    /// the changes counted from then on move it from there, not from 0.
    pub(crate) fn jobs_now(&self, state: &str, count: u64) {
        if let Some(g) = self.stored_state(state) {
            g.set(i64::try_from(count).unwrap_or(i64::MAX));
        }
    }

    /// The gauge of the state a stored job's label (`running`) names; none for a label no
    /// state has.
    fn stored_state(&self, state: &str) -> Option<Gauge> {
        let s = STATES.iter().find(|s| s.label() == state)?;
        Some(
            self.jobs
                .get_or_create(&StateLabel { state: s.label() })
                .clone(),
        )
    }

    pub(crate) fn job_state(&self, from: Option<JobState>, to: JobState) {
        if let Some(from) = from {
            self.jobs
                .get_or_create(&StateLabel {
                    state: from.label(),
                })
                .dec();
        }
        self.jobs
            .get_or_create(&StateLabel { state: to.label() })
            .inc();
    }

    pub(crate) fn stray(&self) {
        self.strays.inc();
    }

    pub(crate) fn placed(&self, policy: &'static str) {
        self.placements.get_or_create(&PolicyLabel { policy }).inc();
    }

    pub(crate) fn rejected(&self, policy: &'static str, stage: &'static str) {
        self.rejections
            .get_or_create(&RejectionLabel { policy, stage })
            .inc();
    }

    pub(crate) fn migration(&self, reason: &'static str, outcome: &'static str) {
        self.migrations
            .get_or_create(&MigrationLabel { reason, outcome })
            .inc();
    }

    pub(crate) fn migration_downtime(&self, reason: &'static str, downtime: Duration) {
        self.downtime
            .get_or_create(&ReasonLabel { reason })
            .observe(downtime.as_secs_f64());
    }

    pub(crate) fn eta_error(&self, at: &'static str, error: f64) {
        self.eta_error.get_or_create(&AtLabel { at }).observe(error);
    }

    pub(crate) fn registered(&self, reconnect: bool) {
        let kind = if reconnect { "reconnect" } else { "first" };
        self.registrations.get_or_create(&KindLabel { kind }).inc();
    }

    pub(crate) fn disconnected(&self) {
        self.disconnects.inc();
    }

    pub(crate) fn archived(&self, jobs: usize) {
        self.archived.inc_by(jobs as u64);
    }

    pub(crate) fn pruned(&self, jobs: usize) {
        self.pruned.inc_by(jobs as u64);
    }

    pub(crate) fn store_commit(&self, took: Duration) {
        self.store_commit.observe(took.as_secs_f64());
    }

    pub(crate) fn tasks(&self, alive: usize) {
        self.tasks.set(alive as i64);
    }

    pub(crate) fn received(&self, kind: &'static str) {
        self.received.get_or_create(&KindLabel { kind }).inc();
    }

    pub(crate) fn refused(&self, kind: &'static str) {
        self.refused.get_or_create(&KindLabel { kind }).inc();
    }

    pub(crate) fn command_sent(&self, action: &'static str) {
        self.commands.get_or_create(&ActionLabel { action }).inc();
    }

    pub(crate) fn round(&self, policy: &'static str, round: Round, took: Duration) {
        self.rounds
            .get_or_create(&RoundLabel {
                policy,
                round: round.name(),
            })
            .observe(took.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_series_a_manager_may_count_is_shown_at_0_from_the_start() {
        let m = ManagerMetrics::new();
        m.seed("converge");
        let text = converge_messenger::telemetry::encode_metrics(&m.registry());
        for series in [
            r#"converge_manager_placements_total{policy="converge"} 0"#,
            r#"converge_manager_rejections_total{policy="converge",stage="policy"} 0"#,
            r#"converge_manager_migrations_total{reason="drain",outcome="abandoned"} 0"#,
            r#"converge_manager_commands_sent_total{action="set_limits"} 0"#,
            r#"converge_manager_refused_total{kind="second_agent"} 0"#,
            r#"converge_manager_migration_downtime_seconds_count{reason="rebalance"} 0"#,
        ] {
            assert!(text.contains(series), "{series} missing from:\n{text}");
        }
    }

    #[test]
    fn every_job_state_is_shown_before_any_job_exists() {
        let m = ManagerMetrics::new();
        let text = converge_messenger::telemetry::encode_metrics(&m.registry());
        assert!(
            text.contains(r#"converge_manager_jobs{state="completed"} 0"#),
            "{text}"
        );
        m.job_submitted();
        m.job_state(None, JobState::Pending);
        m.job_state(Some(JobState::Pending), JobState::Starting);
        let text = converge_messenger::telemetry::encode_metrics(&m.registry());
        assert!(
            text.contains(r#"converge_manager_jobs{state="pending"} 0"#),
            "{text}"
        );
        assert!(
            text.contains(r#"converge_manager_jobs{state="starting"} 1"#),
            "{text}"
        );
        assert!(
            text.contains("converge_manager_jobs_submitted_total 1"),
            "{text}"
        );
    }
}
