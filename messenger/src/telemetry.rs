//! Telemetry both binaries share: logs, OpenTelemetry traces over OTLP/gRPC, and the Prometheus
//! `/metrics` endpoint (issue 8, `docs/observability.md`).
//!
//! - Logs: `tracing-subscriber` filtered by `RUST_LOG`, human-readable ([`LogFormat::Text`]) or
//!   one JSON object per line ([`LogFormat::Json`]) carrying the fields of every enclosing span,
//!   so a line logged inside a job's span carries the job id.
//! - Traces: when an OTLP endpoint is configured (`OTEL_EXPORTER_OTLP_ENDPOINT` or
//!   `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, the standard variables), spans of our crates are
//!   exported in batches; every other `OTEL_*` setting the OpenTelemetry SDK knows
//!   (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`, `OTEL_BSP_*`,
//!   `OTEL_EXPORTER_OTLP_TIMEOUT`, ...) applies as usual. No endpoint, no exporter: nothing is
//!   sent and nothing waits on a collector.
//! - Propagation between the manager and the agents is in [`crate::trace`].
//! - Metrics: each component owns a `prometheus_client` registry (never a global one, so a
//!   manager and agents in one test process keep separate counts); [`serve_metrics`] serves it.
//!
//! A process installs one global subscriber, once. One process running several components (a
//! test with a manager and an agent) still exports each component's spans under its own
//! `service.name`: [`SpanExport::service`] routes spans by the module they come from.

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchSpanProcessor, SdkTracerProvider, Span as SdkSpan, SpanData, SpanProcessor,
};
use tokio_util::sync::CancellationToken;
use tracing::Subscriber;
use tracing_subscriber::filter::{EnvFilter, FilterFn};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, Registry};

/// What can go wrong setting telemetry up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The OTLP exporter could not be built (e.g. an endpoint that is not a URI).
    #[error("cannot export traces: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    /// A global subscriber is already installed in this process.
    #[error("a tracing subscriber is already installed in this process: {0}")]
    AlreadyInstalled(#[from] tracing_subscriber::util::TryInitError),
}

/// How log lines look.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// For people: one line per event, span fields in front (`job{job=...}: ...`).
    #[default]
    Text,
    /// For log pipelines: one JSON object per line, with every enclosing span's fields.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => Err(format!(
                "`{other}` is not a log format: use `text` or `json`"
            )),
        }
    }
}

impl std::fmt::Display for LogFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Text => "text",
            Self::Json => "json",
        })
    }
}

/// Where spans go: an OTLP/gRPC endpoint and the service(s) they are reported as.
#[derive(Clone, Debug)]
pub struct SpanExport {
    /// `None`: the exporter reads `OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT` itself.
    endpoint: Option<String>,
    /// The default `service.name`, used unless `OTEL_SERVICE_NAME` (or `service.name` in
    /// `OTEL_RESOURCE_ATTRIBUTES`) says otherwise.
    default_service: String,
    /// Per-module services, for one process that runs several components.
    routes: Vec<Route>,
    /// How long a batch waits before it is sent (the SDK's default unless set).
    batch_delay: Option<Duration>,
}

#[derive(Clone, Debug)]
struct Route {
    service: String,
    targets: Vec<String>,
}

impl SpanExport {
    /// Export configured by the standard `OTEL_*` variables, or `None` when no endpoint is set
    /// (or `OTEL_SDK_DISABLED=true`, or `OTEL_TRACES_EXPORTER=none`). `service` is the
    /// `service.name` unless `OTEL_SERVICE_NAME` is set.
    pub fn from_env(service: &str) -> Option<Self> {
        let set = |k: &str| std::env::var(k).is_ok_and(|v| !v.trim().is_empty());
        let is =
            |k: &str, v: &str| std::env::var(k).is_ok_and(|x| x.trim().eq_ignore_ascii_case(v));
        if is("OTEL_SDK_DISABLED", "true") || is("OTEL_TRACES_EXPORTER", "none") {
            return None;
        }
        if !set("OTEL_EXPORTER_OTLP_ENDPOINT") && !set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
            return None;
        }
        Some(Self {
            endpoint: None,
            default_service: service.to_string(),
            routes: Vec::new(),
            batch_delay: None,
        })
    }

    /// Export to `endpoint` (e.g. `http://127.0.0.1:4317`) whatever the environment says.
    pub fn to_endpoint(endpoint: impl Into<String>, service: &str) -> Self {
        Self {
            endpoint: Some(endpoint.into()),
            default_service: service.to_string(),
            routes: Vec::new(),
            batch_delay: None,
        }
    }

    /// Reports spans whose `tracing` target starts with one of `targets` (module paths such
    /// as `converge_agent`) as `service`. Spans no route claims keep the default service.
    pub fn service(mut self, service: &str, targets: &[&str]) -> Self {
        self.routes.push(Route {
            service: service.to_string(),
            targets: targets.iter().map(|t| t.to_string()).collect(),
        });
        self
    }

    /// Sends batches after at most `delay` (tests use a short one).
    pub fn batch_delay(mut self, delay: Duration) -> Self {
        self.batch_delay = Some(delay);
        self
    }

    /// Builds the tracer provider. Needs a Tokio runtime: the gRPC channel lives on it.
    pub fn provider(&self) -> Result<SdkTracerProvider, TelemetryError> {
        let mut resource = Resource::builder();
        let named_by_env = Resource::builder()
            .build()
            .get(&opentelemetry::Key::new("service.name"))
            .is_some_and(|v| !v.as_str().starts_with("unknown_service"));
        if !named_by_env {
            resource = resource.with_service_name(self.default_service.clone());
        }
        let processor = |_: &str| -> Result<BatchSpanProcessor, TelemetryError> {
            let mut builder = opentelemetry_otlp::SpanExporter::builder().with_tonic();
            if let Some(e) = &self.endpoint {
                builder = builder.with_endpoint(e.clone());
            }
            let exporter = builder.build()?;
            let mut config = opentelemetry_sdk::trace::BatchConfigBuilder::default();
            if let Some(d) = self.batch_delay {
                config = config.with_scheduled_delay(d);
            }
            Ok(BatchSpanProcessor::builder(exporter)
                .with_batch_config(config.build())
                .build())
        };
        let mut provider = SdkTracerProvider::builder().with_resource(resource.build());
        if self.routes.is_empty() {
            provider = provider.with_span_processor(processor(&self.default_service)?);
        } else {
            let mut routes = Vec::with_capacity(self.routes.len() + 1);
            for r in &self.routes {
                routes.push((r.clone(), processor(&r.service)?));
            }
            provider = provider.with_span_processor(ServiceRouter {
                routes,
                fallback: processor(&self.default_service)?,
            });
        }
        Ok(provider.build())
    }
}

/// Routes each finished span to the processor of the service its target belongs to, each
/// processor exporting under its own `service.name`. Why not one provider per component: a
/// process has one global subscriber and `tracing-opentelemetry` one tracer per layer, and two
/// layers would fight over the same span's data.
#[derive(Debug)]
struct ServiceRouter {
    routes: Vec<(Route, BatchSpanProcessor)>,
    fallback: BatchSpanProcessor,
}

impl ServiceRouter {
    fn pick(&self, span: &SpanData) -> &BatchSpanProcessor {
        let target = span
            .attributes
            .iter()
            .find(|kv| kv.key.as_str() == "target")
            .map(|kv| kv.value.as_str());
        if let Some(target) = target {
            for (route, p) in &self.routes {
                if route.targets.iter().any(|t| target.starts_with(t.as_str())) {
                    return p;
                }
            }
        }
        &self.fallback
    }

    fn all(&self) -> impl Iterator<Item = &BatchSpanProcessor> {
        self.routes.iter().map(|(_, p)| p).chain([&self.fallback])
    }
}

impl SpanProcessor for ServiceRouter {
    fn on_start(&self, _span: &mut SdkSpan, _cx: &opentelemetry::Context) {}

    fn on_end(&self, span: SpanData) {
        self.pick(&span).on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.all().try_for_each(|p| p.force_flush())
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        // Every processor is shut down even when one fails; the first error is reported.
        let results: Vec<OTelSdkResult> = self
            .all()
            .map(|p| p.shutdown_with_timeout(timeout))
            .collect();
        results.into_iter().collect()
    }

    fn set_resource(&mut self, resource: &Resource) {
        for (route, p) in &mut self.routes {
            // The provider's attributes (SDK, OTEL_RESOURCE_ATTRIBUTES), then the route's name.
            let named = Resource::builder_empty()
                .with_attributes(
                    resource
                        .iter()
                        .map(|(k, v)| opentelemetry::KeyValue::new(k.clone(), v.clone())),
                )
                .with_service_name(route.service.clone())
                .build();
            p.set_resource(&named);
        }
        self.fallback.set_resource(resource);
    }
}

/// Log and trace settings for one process; [`Telemetry::init`] installs them.
#[derive(Clone, Debug)]
pub struct Telemetry {
    format: LogFormat,
    default_filter: String,
    export: Option<SpanExport>,
    test_writer: bool,
}

impl Telemetry {
    /// Logs in `format`, filtered by `RUST_LOG` (default `info`), no trace export.
    pub fn new(format: LogFormat) -> Self {
        Self {
            format,
            default_filter: "info".into(),
            export: None,
            test_writer: false,
        }
    }

    /// The log filter when `RUST_LOG` is unset (an `EnvFilter` directive).
    pub fn default_filter(mut self, directive: &str) -> Self {
        self.default_filter = directive.to_string();
        self
    }

    /// Exports spans as `export` says (`None`: no export).
    pub fn export(mut self, export: Option<SpanExport>) -> Self {
        self.export = export;
        self
    }

    /// Writes logs through the test harness's capture instead of stderr.
    pub fn test_writer(mut self) -> Self {
        self.test_writer = true;
        self
    }

    /// Installs the global subscriber. Keep the guard alive: dropping it (or
    /// [`TelemetryGuard::shutdown`]) sends the spans still buffered.
    pub fn init(self) -> Result<TelemetryGuard, TelemetryError> {
        let provider = self.export.as_ref().map(SpanExport::provider).transpose()?;
        let filter = EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| EnvFilter::new(&self.default_filter));
        let otel = provider.as_ref().map(|p| otel_layer(p.tracer("converge")));
        let ansi = !self.test_writer && std::io::IsTerminal::is_terminal(&std::io::stderr());
        let logs: Box<dyn Layer<Registry> + Send + Sync> = match (self.format, self.test_writer) {
            (LogFormat::Text, false) => tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(ansi)
                .boxed(),
            (LogFormat::Text, true) => tracing_subscriber::fmt::layer()
                .with_test_writer()
                .with_ansi(false)
                .boxed(),
            (LogFormat::Json, false) => json_layer().with_writer(std::io::stderr).boxed(),
            (LogFormat::Json, true) => json_layer().with_test_writer().boxed(),
        };
        // Each layer has its own filter: RUST_LOG=warn quiets the logs without emptying traces.
        tracing_subscriber::registry()
            .with(logs.with_filter(filter))
            .with(otel)
            .try_init()?;
        Ok(TelemetryGuard { provider })
    }
}

fn json_layer<S>() -> tracing_subscriber::fmt::Layer<
    S,
    tracing_subscriber::fmt::format::JsonFields,
    tracing_subscriber::fmt::format::Format<tracing_subscriber::fmt::format::Json>,
>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    // The span list carries every enclosing span's fields: the job id reaches every line
    // logged inside a job's work without each call site repeating it.
    tracing_subscriber::fmt::layer()
        .json()
        .with_current_span(true)
        .with_span_list(true)
}

/// The layer that turns our crates' spans (info and above) into OpenTelemetry spans. Spans of
/// libraries (h2, tonic, hyper) stay out of the traces whatever `RUST_LOG` says.
pub fn otel_layer<S>(
    tracer: opentelemetry_sdk::trace::SdkTracer,
) -> impl Layer<S> + Send + Sync + 'static
where
    S: Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
{
    tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(FilterFn::new(|meta| {
            meta.target().starts_with("converge") && *meta.level() <= tracing::Level::INFO
        }))
}

/// Keeps trace export alive; flushes and stops it when dropped or shut down.
#[must_use = "dropping the guard stops trace export"]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl TelemetryGuard {
    /// Whether spans are being exported.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Sends what is buffered now. Blocks until the collector answered (or timed out), so
    /// call it from a blocking context (`spawn_blocking`) inside a multi-thread runtime: the
    /// export runs on the runtime's I/O.
    pub fn force_flush(&self) {
        if let Some(p) = &self.provider
            && let Err(e) = p.force_flush()
        {
            eprintln!("converge: flushing traces failed: {e}");
        }
    }

    /// Flushes and stops export without blocking the async caller.
    pub async fn shutdown(mut self) {
        if let Some(p) = self.provider.take() {
            let _ = tokio::task::spawn_blocking(move || shutdown_provider(&p)).await;
        }
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take() {
            // Inside a multi-thread runtime, move off the worker so the export can use the
            // runtime's I/O; elsewhere block right here.
            match tokio::runtime::Handle::try_current() {
                Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                    tokio::task::block_in_place(|| shutdown_provider(&p))
                }
                _ => shutdown_provider(&p),
            }
        }
    }
}

fn shutdown_provider(p: &SdkTracerProvider) {
    if let Err(e) = p.shutdown() {
        // Logging is going away with the subscriber; stderr is what is left.
        eprintln!("converge: stopping trace export failed: {e}");
    }
}

/// A component's metrics registry, shared by the code that counts and the endpoint.
pub type MetricsRegistry = Arc<prometheus_client::registry::Registry>;

/// The content type of the OpenMetrics text format `prometheus_client` writes.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The content type of the classic Prometheus text format (0.0.4).
pub const PROMETHEUS_TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The registry as OpenMetrics text (what Prometheus asks for when it scrapes).
pub fn encode_metrics(registry: &prometheus_client::registry::Registry) -> String {
    let mut body = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut body, registry);
    body
}

/// The registry in the classic Prometheus text format, for clients that do not ask for
/// OpenMetrics (curl, `promtool check metrics`, older scrapers). The two differ only where a
/// counter is named: OpenMetrics names the family `x` and its sample `x_total`, the classic
/// format names both `x_total`; and the classic format has no `# UNIT` or `# EOF` lines.
pub fn encode_metrics_classic(registry: &prometheus_client::registry::Registry) -> String {
    let open = encode_metrics(registry);
    let counters: std::collections::HashSet<&str> = open
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(open.len() + 16 * counters.len());
    for line in open.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|p| {
            let rest = line.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{p}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

/// Serves `GET /metrics` from `registry` on `listener` until `shutdown` is cancelled:
/// OpenMetrics to clients that accept it (Prometheus does), the classic text format to others.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    registry: MetricsRegistry,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    use axum::http::HeaderMap;
    use axum::http::header::{ACCEPT, CONTENT_TYPE};
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move |headers: HeaderMap| {
            let registry = registry.clone();
            async move {
                let open = headers
                    .get_all(ACCEPT)
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .any(|v| v.contains("application/openmetrics-text"));
                if open {
                    (
                        [(CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)],
                        encode_metrics(&registry),
                    )
                } else {
                    (
                        [(CONTENT_TYPE, PROMETHEUS_TEXT_CONTENT_TYPE)],
                        encode_metrics_classic(&registry),
                    )
                }
            }
        }),
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_formats_parse_and_print_back() {
        for f in [LogFormat::Text, LogFormat::Json] {
            assert_eq!(f.to_string().parse::<LogFormat>(), Ok(f));
        }
        let err = "yaml".parse::<LogFormat>().unwrap_err();
        assert!(err.contains("text") && err.contains("json"), "{err}");
    }

    #[test]
    fn the_classic_format_names_counter_families_with_their_total_suffix() {
        use prometheus_client::metrics::{counter::Counter, gauge::Gauge};
        let mut r = prometheus_client::registry::Registry::default();
        let c = Counter::<u64>::default();
        c.inc();
        r.register("jobs_submitted", "Jobs accepted", c);
        r.register("jobs", "Jobs now", Gauge::<i64>::default());
        let open = encode_metrics(&r);
        assert!(open.contains("# TYPE jobs_submitted counter\n"), "{open}");
        assert!(open.ends_with("# EOF\n"), "{open}");
        let classic = encode_metrics_classic(&r);
        assert!(
            classic.contains("# HELP jobs_submitted_total Jobs accepted"),
            "{classic}"
        );
        assert!(
            classic.contains("# TYPE jobs_submitted_total counter\n"),
            "{classic}"
        );
        assert!(classic.contains("jobs_submitted_total 1\n"), "{classic}");
        assert!(classic.contains("# TYPE jobs gauge\n"), "{classic}");
        assert!(!classic.contains("# EOF"), "{classic}");
    }
}
