//! W3C trace context (`traceparent`) as it travels in every [`crate::pb::Command`].
//!
//! The manager puts the context of the span that sends a command into it ([`inject`]); the
//! agent makes its span for the command a child of that context ([`extract`]), so one job's
//! spans in both services form one trace. The string is opaque to the protocol; a malformed
//! value from the wire is dropped rather than propagated. With no trace export configured
//! there is no span context, the string is empty, and the agent's spans start traces of their
//! own.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

const TRACEPARENT: &str = "traceparent";

/// The current `tracing` span's context as a `traceparent`, or `""` when it has none (no
/// trace export, or no span).
pub fn inject() -> String {
    inject_context(&tracing::Span::current().context())
}

/// `cx` as a `traceparent`, or `""` when it holds no valid span.
pub fn inject_context(cx: &opentelemetry::Context) -> String {
    if !cx.span().span_context().is_valid() {
        return String::new();
    }
    let mut carrier = HashMap::new();
    // A propagator of our own rather than the global one: nothing here depends on what else
    // the process installed.
    TraceContextPropagator::new().inject_context(cx, &mut carrier);
    carrier.remove(TRACEPARENT).unwrap_or_default()
}

/// The remote context in `traceparent`, for [`OpenTelemetrySpanExt::set_parent`]. Empty or
/// malformed input gives an empty context, which makes the span a root.
pub fn extract(traceparent: &str) -> opentelemetry::Context {
    if !is_valid_traceparent(traceparent) {
        return opentelemetry::Context::new();
    }
    let carrier = HashMap::from([(TRACEPARENT.to_string(), traceparent.to_string())]);
    TraceContextPropagator::new().extract(&carrier)
}

/// Makes `span` a child of the remote span in `traceparent` (a root when it is empty or
/// malformed). Call it before the span is first entered: a started span keeps its parent.
pub fn set_remote_parent(span: &tracing::Span, traceparent: &str) {
    // The only failures are a span that is disabled or already started: nothing to link then.
    let _ = span.set_parent(extract(traceparent));
}

/// True when `s` looks like a W3C `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`).
pub fn is_valid_traceparent(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    matches!(parts.as_slice(), [v, t, p, f]
        if v.len() == 2 && t.len() == 32 && p.len() == 16 && f.len() == 2
            && parts.iter().all(|x| x.bytes().all(|b| b.is_ascii_hexdigit()))
            && *t != "00000000000000000000000000000000"
            && *p != "0000000000000000")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_shape_is_checked() {
        assert!(is_valid_traceparent(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        ));
        assert!(!is_valid_traceparent(""));
        assert!(!is_valid_traceparent(
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01"
        ));
        assert!(!is_valid_traceparent("00-xyz-00f067aa0ba902b7-01"));
    }

    #[test]
    fn a_traceparent_survives_extract_and_inject() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let cx = extract(tp);
        assert!(cx.span().span_context().is_remote());
        assert_eq!(inject_context(&cx), tp);
    }

    #[test]
    fn no_context_injects_nothing_and_garbage_extracts_nothing() {
        assert_eq!(inject_context(&opentelemetry::Context::new()), "");
        assert_eq!(inject(), "", "no span, no subscriber: nothing to send");
        assert!(!extract("garbage").span().span_context().is_valid());
        assert!(!extract("").span().span_context().is_valid());
    }
}
