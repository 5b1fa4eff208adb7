//! Each job is one trace: the shell turns the core's events and commands into spans.
//!
//! The job's submission span is the root; its context is kept here until the job ends, and
//! every later span of the job (placement, each move with its save and restore steps, every
//! command sent) is parented to it, whatever the actor happens to be handling. Every command
//! carries its `send_command` span's context, so the agents' spans join the same trace.

use std::collections::HashMap;

use converge_core::cluster::types::{Event, EventKind, JobId};
use converge_messenger::pb;
use opentelemetry::trace::TraceContextExt;
use tracing::{Span, field, info_span};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// A move's span and the span of its current step (save, then restore).
struct MoveSpans {
    span: Span,
    step: Span,
}

/// The spans of every live job.
#[derive(Default)]
pub struct JobTraces {
    roots: HashMap<JobId, opentelemetry::Context>,
    moves: HashMap<JobId, MoveSpans>,
    /// Spans opened by the effects of the step being carried out (a placement), so that the
    /// commands that follow hang below them.
    current: HashMap<JobId, Span>,
}

impl JobTraces {
    /// Job `id`'s root is `span` (its submission). Kept only when spans are exported: without
    /// an exporter the context holds no span to parent anything to, and a map entry per live
    /// job (~100 bytes: heaptrack at 100,000 jobs, `docs/performance.md`) would buy nothing.
    pub fn submitted(&mut self, id: &str, span: &Span) {
        let root = span.context();
        if root.has_active_span() {
            self.roots.insert(id.into(), root);
        }
    }

    /// `span`, made with `parent: None` and not entered yet, parented to job `id`'s root.
    pub fn job_span(&self, id: &str, span: Span) -> Span {
        if let Some(root) = self.roots.get(id) {
            let _ = span.set_parent(root.clone());
        }
        span
    }

    /// What an event means for the spans.
    pub fn on_event(&mut self, e: &Event) {
        let Some(job) = e.job.clone() else {
            return;
        };
        match e.kind {
            EventKind::JobPlaced => {
                let span = self.job_span(
                    &job,
                    info_span!(
                        parent: None,
                        "placement",
                        job = %job,
                        policy = e.attributes.get("policy").map(String::as_str).unwrap_or_default(),
                        worker = e.worker.as_deref().unwrap_or_default(),
                        scores = e.attributes.get("scores").map(String::as_str).unwrap_or_default(),
                        reason = %e.reason,
                    ),
                );
                self.current.insert(job, span);
            }
            EventKind::Migration => match e.attributes.get("outcome").map(String::as_str) {
                Some("started") => {
                    let attr = |k: &str| e.attributes.get(k).cloned().unwrap_or_default();
                    let span = self.job_span(
                        &job,
                        info_span!(
                            parent: None,
                            "migration",
                            job = %job,
                            from = %attr("from"),
                            to = %attr("to"),
                            reason = %attr("reason"),
                            outcome = field::Empty,
                            downtime_ms = field::Empty
                        ),
                    );
                    // What decided the move (a drain, a rebalancing round) is in another
                    // trace: link it.
                    let decided_by = Span::current().context();
                    span.add_link(decided_by.span().span_context().clone());
                    let step = info_span!(parent: &span, "migration.save", job = %job, worker = %attr("from"));
                    self.current.insert(job.clone(), step.clone());
                    self.moves.insert(job, MoveSpans { span, step });
                }
                Some(outcome @ ("completed" | "failed" | "aborted" | "abandoned")) => {
                    if let Some(m) = self.moves.remove(&job) {
                        m.span.record("outcome", outcome);
                        if let Some(d) = e.attributes.get("downtime_ms") {
                            m.span.record("downtime_ms", d.as_str());
                        }
                    }
                }
                _ => {}
            },
            EventKind::JobState if e.to.is_some_and(|s| s.is_terminal()) => {
                self.moves.remove(&job);
                self.roots.remove(&job);
                self.current.remove(&job);
            }
            _ => {}
        }
    }

    /// The `send_command` span of `cmd` to `worker`: below the step's span of the job, the
    /// restore step of its move, or its root.
    pub fn command_span(&mut self, cmd: &pb::Command, worker: &str) -> Span {
        let action = cmd.action.as_ref().map_or("none", |a| a.name());
        let job = cmd.job_id.as_str();
        if action == "start"
            && let Some(m) = self.moves.get_mut(job)
        {
            m.step = info_span!(parent: &m.span, "migration.restore", job = %job, worker = %worker);
            self.current.insert(job.into(), m.step.clone());
        }
        let parent = self
            .current
            .get(job)
            .or_else(|| self.moves.get(job).map(|m| &m.step))
            .cloned();
        let span = info_span!(
            parent: None,
            "send_command",
            action,
            job = %job,
            epoch = cmd.epoch,
            %worker,
            command = %cmd.command_id
        );
        match parent {
            Some(p) => {
                let _ = span.set_parent(p.context());
                span
            }
            None => self.job_span(job, span),
        }
    }

    /// The step's effects are carried out.
    pub fn end_step(&mut self) {
        self.current.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::TracerProvider as _;
    use tracing_subscriber::layer::SubscriberExt;

    fn submit(traces: &mut JobTraces) {
        let span = info_span!(parent: None, "submit_job");
        traces.submitted("a", &span);
    }

    #[test]
    fn a_job_root_is_kept_only_when_spans_are_exported() {
        let mut traces = JobTraces::default();
        tracing::subscriber::with_default(tracing_subscriber::registry(), || submit(&mut traces));
        assert!(
            traces.roots.is_empty(),
            "nothing to parent to without an exporter"
        );

        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let exporting = tracing_subscriber::registry().with(
            converge_messenger::telemetry::otel_layer(provider.tracer("converge")),
        );
        tracing::subscriber::with_default(exporting, || submit(&mut traces));
        assert!(traces.roots.contains_key("a"));
    }
}
