//! The agent's Prometheus metrics (`/metrics` with `--metrics-listen`;
//! `docs/observability.md` says what each means).
//!
//! One registry per agent, never a global one: agents and a manager in one test process keep
//! their counts apart. The handles are cheap clones of shared counters, handed to the parts
//! that count (executor, log followers, the messenger session).

use std::sync::Arc;
use std::time::Duration;

use converge_messenger::agent::SessionMetrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimitLabel {
    source: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CommandLabel {
    action: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RoundLabel {
    round: &'static str,
}

/// The agent's counters and histograms, and the registry that shows them.
#[derive(Clone, Debug)]
pub struct AgentMetrics {
    registry: Arc<Registry>,
    session: SessionMetrics,
    progress_lines: Family<ResultLabel, Counter>,
    limits: Family<LimitLabel, Counter>,
    commands: Family<CommandLabel, Counter>,
    rounds: Family<RoundLabel, Histogram>,
}

impl Default for AgentMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl AgentMetrics {
    /// Fresh metrics in a registry of their own (names start with `converge_agent_`).
    pub fn new() -> Self {
        let mut root = Registry::default();
        let r = root.sub_registry_with_prefix("converge_agent");
        let session = SessionMetrics::default();
        session.register(r);
        let progress_lines = Family::<ResultLabel, Counter>::default();
        for result in ["parsed", "malformed"] {
            let _ = progress_lines.get_or_create(&ResultLabel { result });
        }
        r.register(
            "progress_lines",
            "Progress lines read from job containers: result=parsed (a sample) or malformed \
             (counted and reported, never fatal)",
            progress_lines.clone(),
        );
        // Every series at 0 from the start, whatever the worker's policy: a series that appears
        // only at its first count breaks `rate()` and an alert on its absence.
        let limits = Family::default();
        for source in ["flowcon", "command"] {
            for outcome in ["ok", "error"] {
                let _ = limits.get_or_create(&LimitLabel { source, outcome });
            }
        }
        r.register(
            "limits_applied",
            "CPU limit updates sent to Docker, by source (flowcon round, set_limits command) \
             and outcome (ok, error)",
            limits.clone(),
        );
        let commands = Family::default();
        r.register(
            "commands",
            "Commands from the manager, by action and outcome (ok, failed, stale, replayed)",
            commands.clone(),
        );
        // 10 µs .. ~40 s: a round is microseconds of policy plus the Docker updates it makes.
        let rounds = Family::<RoundLabel, Histogram>::new_with_constructor(
            (|| Histogram::new(exponential_buckets(1e-5, 4.0, 12))) as fn() -> Histogram,
        );
        for round in ["flowcon", "specon"] {
            let _ = rounds.get_or_create(&RoundLabel { round });
        }
        r.register(
            "policy_round_seconds",
            "Worker policy rounds, decision and limit updates included, by round (flowcon, \
             specon)",
            rounds.clone(),
        );
        Self {
            registry: Arc::new(root),
            session,
            progress_lines,
            limits,
            commands,
            rounds,
        }
    }

    /// The registry, for the `/metrics` endpoint.
    pub fn registry(&self) -> Arc<Registry> {
        self.registry.clone()
    }

    /// What the messenger session counts (messages sent, registrations, disconnects).
    pub fn session(&self) -> SessionMetrics {
        self.session.clone()
    }

    pub(crate) fn progress_line(&self, parsed: bool) {
        let result = if parsed { "parsed" } else { "malformed" };
        self.progress_lines
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    pub(crate) fn limit_applied(&self, source: &'static str, ok: bool) {
        let outcome = if ok { "ok" } else { "error" };
        self.limits
            .get_or_create(&LimitLabel { source, outcome })
            .inc();
    }

    pub(crate) fn command(&self, action: &'static str, outcome: &'static str) {
        self.commands
            .get_or_create(&CommandLabel { action, outcome })
            .inc();
    }

    /// Times a worker policy round (`flowcon`, `specon`). Also the hook for new rounds.
    pub fn round(&self, round: &'static str, took: Duration) {
        self.rounds
            .get_or_create(&RoundLabel { round })
            .observe(took.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_series_an_agent_may_count_is_shown_at_0_from_the_start() {
        let m = AgentMetrics::new();
        let text = converge_messenger::telemetry::encode_metrics(&m.registry());
        for series in [
            r#"converge_agent_limits_applied_total{source="flowcon",outcome="ok"} 0"#,
            r#"converge_agent_limits_applied_total{source="command",outcome="error"} 0"#,
            r#"converge_agent_policy_round_seconds_count{round="specon"} 0"#,
            r#"converge_agent_progress_lines_total{result="malformed"} 0"#,
        ] {
            assert!(text.contains(series), "{series} missing from:\n{text}");
        }
    }
}
