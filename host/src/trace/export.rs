//! Spans, and their export over OTLP/HTTP with protobuf (docs/tracing.md).
//!
//! Off by default: then a [`Tracer`] is `None` inside and every call on it
//! returns at its first branch, so no span is built and nothing is
//! allocated per message. On, a hop whose trace is sampled builds its spans
//! with the ids hopper already wrote into `traceparent` headers (so the
//! records and the spans agree), and hands each finished span to a bounded
//! queue. One task drains the queue in batches to the OTLP exporter. A full
//! queue, or a batch the endpoint did not take, drops spans and counts
//! them (`hopper_trace_spans_dropped_total`); messages never wait for it.

use crate::config::TracingConfig;
use crate::traceparent::{Context, SpanId, TraceId};
use opentelemetry::trace::{
    SpanContext, SpanKind, Status, TraceFlags, TraceState, {self as otel},
};
use opentelemetry::{InstrumentationScope, KeyValue, Value};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter as _, SpanLinks};
use prometheus_client::metrics::counter::Counter;
use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::mpsc;

/// Spans sent to the endpoint in one request, at most.
const MAX_BATCH: usize = 512;
/// How long a span may wait for its batch to fill.
const BATCH_DELAY: Duration = Duration::from_millis(500);
/// How long one export request may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// Builds and exports spans; cheap to clone. `Tracer::default()` is off.
#[derive(Clone, Default)]
pub struct Tracer(Option<Arc<Exporting>>);

struct Exporting {
    /// Spans of a trace id whose low 63 bits are below this are sampled.
    bound: u64,
    /// To the export task; bounded (`queue` spans).
    spans: mpsc::Sender<SpanData>,
    dropped: Counter,
    scope: InstrumentationScope,
}

/// Why span export could not start. Names the endpoint.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("tracing.endpoint is not set")]
    NoEndpoint,
    #[error("tracing.endpoint `{endpoint}`: {detail}")]
    Endpoint { endpoint: String, detail: String },
}

impl Tracer {
    /// The tracer of a `[tracing]` table: starts the export task on the
    /// current runtime. Spans it drops are counted on `dropped`.
    pub fn start(config: &TracingConfig, dropped: Counter) -> Result<Tracer, ExportError> {
        let endpoint = config.endpoint.clone().ok_or(ExportError::NoEndpoint)?;
        let client = Client::new();
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(endpoint.clone())
            .with_timeout(EXPORT_TIMEOUT)
            .with_http_client(client)
            .build()
            .map_err(|e| ExportError::Endpoint {
                endpoint: endpoint.clone(),
                detail: e.to_string(),
            })?;
        let mut attributes: Vec<KeyValue> = config
            .resource
            .iter()
            .map(|(k, v)| KeyValue::new(k.clone(), v.clone()))
            .collect();
        attributes.sort_by(|a, b| a.key.as_str().cmp(b.key.as_str()));
        let resource = opentelemetry_sdk::Resource::builder_empty()
            .with_service_name(config.service_name.clone())
            .with_attributes(attributes)
            .build();
        exporter.set_resource(&resource);
        let (tx, rx) = mpsc::channel(config.queue);
        tokio::spawn(export(exporter, rx, dropped.clone()));
        Ok(Tracer(Some(Arc::new(Exporting {
            bound: (config.sampling.clamp(0.0, 1.0) * (1u64 << 63) as f64) as u64,
            spans: tx,
            dropped,
            scope: InstrumentationScope::builder("hopper")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
        }))))
    }

    /// Whether spans are exported at all.
    pub fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// Decides whether a trace this hop starts is sampled, as
    /// OpenTelemetry's parent-based sampler does: a trace continued from a
    /// record keeps the decision its writer made (the `traceparent`'s
    /// sampled flag); a new root is sampled by `tracing.sampling` from its
    /// id, and gets the flag, so every hop after it, in any process, reads
    /// the same decision. With tracing off, a root is not sampled.
    pub fn decide(&self, trace: &mut Context) {
        if !trace.continued() && self.by_ratio(trace.trace_id) {
            trace.flags |= crate::traceparent::SAMPLED;
        }
    }

    /// Whether spans of `trace` are exported: tracing is on and the trace
    /// is sampled ([`Tracer::decide`]).
    pub fn samples(&self, trace: &Context) -> bool {
        self.is_on() && trace.sampled()
    }

    /// Whether a new root of id `trace_id` is sampled: a fixed function of
    /// the id's low 63 bits, like OpenTelemetry's `TraceIdRatioBased`.
    fn by_ratio(&self, trace_id: TraceId) -> bool {
        let Some(on) = &self.0 else { return false };
        let low = u64::from_be_bytes(trace_id.0[8..].try_into().expect("8 bytes"));
        (low >> 1) < on.bound
    }

    /// A span with these ids, started now, when tracing is on and the trace
    /// sampled; `None` otherwise, which costs one branch.
    pub fn span(
        &self,
        trace_id: TraceId,
        span_id: SpanId,
        parent: Option<SpanId>,
        name: impl Into<Cow<'static, str>>,
        kind: SpanKind,
    ) -> Option<Span> {
        let on = self.0.as_ref()?;
        let now = SystemTime::now();
        Some(Span {
            data: Box::new(SpanData {
                span_context: SpanContext::new(
                    otel::TraceId::from_bytes(trace_id.0),
                    otel::SpanId::from_bytes(span_id.0),
                    TraceFlags::SAMPLED,
                    false,
                    TraceState::NONE,
                ),
                parent_span_id: parent
                    .map_or(otel::SpanId::INVALID, |p| otel::SpanId::from_bytes(p.0)),
                parent_span_is_remote: true,
                span_kind: kind,
                name: name.into(),
                start_time: now,
                end_time: now,
                attributes: Vec::with_capacity(12),
                dropped_attributes_count: 0,
                events: SpanEvents::default(),
                links: SpanLinks::default(),
                status: Status::Unset,
                instrumentation_scope: on.scope.clone(),
            }),
            to: on.clone(),
        })
    }

    /// The span of a hop that writes records: its id is the one written
    /// into their `traceparent`, its parent `parent` (the call span) or,
    /// without one, the span that wrote the record read.
    pub fn hop_span(
        &self,
        trace: &Context,
        parent: Option<SpanId>,
        name: impl Into<Cow<'static, str>>,
        kind: SpanKind,
    ) -> Option<Span> {
        if !self.samples(trace) {
            return None;
        }
        self.span(
            trace.trace_id,
            trace.span_id,
            parent.or(trace.parent),
            name,
            kind,
        )
    }
}

/// A span being built; exported when ended.
pub struct Span {
    // Boxed: a span is held across a handler call, in a future every
    // message allocates.
    data: Box<SpanData>,
    to: Arc<Exporting>,
}

impl Span {
    pub fn id(&self) -> SpanId {
        SpanId(self.data.span_context.span_id().to_bytes())
    }

    pub fn set(&mut self, key: &'static str, value: impl Into<Value>) {
        self.data.attributes.push(KeyValue::new(key, value));
    }

    /// The messaging attributes of the record a hop read.
    pub fn read_from(&mut self, topic: &str, partition: i32, offset: i64, group: Option<&str>) {
        self.set("messaging.system", "kafka");
        self.set("messaging.source.name", topic.to_string());
        self.set("messaging.destination.name", topic.to_string());
        self.set("messaging.destination.partition.id", partition.to_string());
        self.set("messaging.kafka.offset", offset);
        if let Some(group) = group {
            self.set("messaging.consumer.group.name", group.to_string());
        }
    }

    /// A link to the span that wrote `trace`'s record (the producer's, for
    /// a record from outside), with `kind` saying which it is.
    pub fn link_parent(&mut self, trace: &Context, kind: &'static str) {
        let Some(parent) = trace.parent else { return };
        let context = SpanContext::new(
            otel::TraceId::from_bytes(trace.trace_id.0),
            otel::SpanId::from_bytes(parent.0),
            TraceFlags::new(trace.flags),
            true,
            TraceState::NONE,
        );
        self.data.links.links.push(otel::Link::new(
            context,
            vec![KeyValue::new("hopper.link", kind)],
            0,
        ));
    }

    pub fn error(&mut self, description: impl Into<Cow<'static, str>>) {
        self.data.status = Status::error(description);
    }

    pub fn set_start(&mut self, at: SystemTime) {
        self.data.start_time = at;
    }

    /// Ends the span now and queues it for export; counted as dropped when
    /// the queue is full.
    pub fn end(self) {
        self.end_at(SystemTime::now());
    }

    pub fn end_at(mut self, at: SystemTime) {
        self.data.end_time = at.max(self.data.start_time);
        if self.to.spans.try_send(*self.data).is_err() {
            self.to.dropped.inc();
        }
    }
}

/// The export task: sends batches of up to [`MAX_BATCH`] spans, each at
/// most [`BATCH_DELAY`] after its first span, one request at a time. A
/// batch the endpoint refuses or never answers is dropped and counted. Ends
/// when every [`Tracer`] is gone.
async fn export(
    exporter: opentelemetry_otlp::SpanExporter,
    mut spans: mpsc::Receiver<SpanData>,
    dropped: Counter,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut failures: u64 = 0;
    while let Some(first) = spans.recv().await {
        batch.push(first);
        let deadline = tokio::time::Instant::now() + BATCH_DELAY;
        while batch.len() < MAX_BATCH {
            match tokio::time::timeout_at(deadline, spans.recv()).await {
                Ok(Some(span)) => batch.push(span),
                Ok(None) | Err(_) => break,
            }
        }
        let count = batch.len() as u64;
        if let Err(e) = exporter.export(std::mem::take(&mut batch)).await {
            dropped.inc_by(count);
            failures += 1;
            // The first failure, then one in a hundred: an endpoint that is
            // down must not flood the log.
            if failures % 100 == 1 {
                tracing::warn!(spans = count, failures, error = %e, "Span export failed; spans dropped.");
            }
        }
    }
}

/// The exporter's HTTP client: hopper's hyper client, run on the tokio
/// runtime that started the tracer.
#[derive(Debug, Clone)]
struct Client {
    inner: hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        http_body_util::Full<bytes::Bytes>,
    >,
}

impl Client {
    fn new() -> Client {
        let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
        connector.set_connect_timeout(Some(EXPORT_TIMEOUT));
        connector.set_nodelay(true);
        Client {
            inner:
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .pool_max_idle_per_host(1)
                    .build(connector),
        }
    }
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for Client {
    async fn send_bytes(
        &self,
        request: http::Request<bytes::Bytes>,
    ) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        use http_body_util::BodyExt;
        let (parts, body) = request.into_parts();
        let request = http::Request::from_parts(parts, http_body_util::Full::new(body));
        let response = tokio::time::timeout(EXPORT_TIMEOUT, async {
            let response = self.inner.request(request).await?;
            let (parts, body) = response.into_parts();
            let body = body.collect().await?.to_bytes();
            Ok::<_, opentelemetry_http::HttpError>(http::Response::from_parts(parts, body))
        })
        .await
        .map_err(|_| "the OTLP endpoint did not answer in time")??;
        if !response.status().is_success() {
            return Err(format!("the OTLP endpoint answered {}", response.status()).into());
        }
        Ok(response)
    }
}

/// The relay's forward of a delayed message, reported when the target
/// acknowledged it: from its deliver-at (or the forward, when early) to
/// now, with the lateness.
pub fn forwarded(tracer: &Tracer, trace: &Context, target: &str, deliver_at_ms: i64) {
    let Some(mut span) = tracer.hop_span(
        trace,
        None,
        format!("send {target}"),
        opentelemetry::trace::SpanKind::Producer,
    ) else {
        return;
    };
    let now = std::time::SystemTime::now();
    let now_ms = crate::clock::now_ms();
    let due = std::time::UNIX_EPOCH
        + std::time::Duration::from_millis(u64::try_from(deliver_at_ms).unwrap_or(0));
    span.set_start(due.min(now));
    span.set("messaging.system", "kafka");
    span.set("messaging.operation.type", "send");
    span.set("messaging.destination.name", target.to_string());
    span.set("hopper.route", crate::config::RELAY_ROUTE);
    span.set("hopper.hop", "forward");
    span.set("hopper.deliver_at", deliver_at_ms);
    span.set("hopper.lateness_ms", now_ms.saturating_sub(deliver_at_ms));
    span.link_parent(trace, "message");
    span.end_at(now);
}

/// A replay of a dead-letter record to `to`: a child of the span that
/// wrote the dead-letter record, linked to it.
pub fn replayed(tracer: &Tracer, trace: &Context, to: &str, from: &str, replays: u32) {
    let Some(mut span) = tracer.hop_span(
        trace,
        None,
        format!("send {to}"),
        opentelemetry::trace::SpanKind::Producer,
    ) else {
        return;
    };
    span.set("messaging.system", "kafka");
    span.set("messaging.operation.type", "send");
    span.set("messaging.destination.name", to.to_string());
    span.set("hopper.hop", "replay");
    span.set("hopper.replayed_from", from.to_string());
    span.set("hopper.replay_count", i64::from(replays));
    span.link_parent(trace, "dead_letter");
    span.end();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::traceparent::Traceparent;

    fn tracer(sampling: f64) -> (Tracer, Counter) {
        let config = TracingConfig {
            endpoint: Some("http://127.0.0.1:9/v1/traces".into()),
            service_name: "hopper".into(),
            sampling,
            resource: Default::default(),
            queue: 4,
            ui: None,
        };
        let dropped = Counter::default();
        (Tracer::start(&config, dropped.clone()).unwrap(), dropped)
    }

    /// New roots, decided by `tracer`.
    fn roots(tracer: &Tracer, n: usize) -> Vec<Context> {
        (0..n)
            .map(|_| {
                let mut root = Context::root();
                tracer.decide(&mut root);
                root
            })
            .collect()
    }

    #[tokio::test]
    async fn a_new_root_is_sampled_by_ratio_of_its_id_and_says_so_downstream() {
        let off = Tracer::default();
        assert!(
            roots(&off, 100)
                .iter()
                .all(|r| !off.samples(r) && !r.sampled())
        );
        let (all, _) = tracer(1.0);
        let (none, _) = tracer(0.0);
        let (tenth, _) = tracer(0.1);
        assert!(roots(&all, 10_000).iter().all(|r| all.samples(r)));
        assert!(!roots(&none, 10_000).iter().any(|r| none.samples(r)));
        let tenths = roots(&tenth, 10_000);
        let sampled: Vec<&Context> = tenths.iter().filter(|r| tenth.samples(r)).collect();
        assert!((800..1200).contains(&sampled.len()), "{}", sampled.len());
        // The decision travels in the flag: the next hop, in any process,
        // whatever its own ratio, reads it from the record.
        for root in &tenths {
            let next = Context::child_of(Traceparent {
                trace_id: root.trace_id,
                span_id: root.span_id,
                flags: root.flags,
            });
            assert_eq!(all.samples(&next), tenth.samples(root));
            assert_eq!(none.samples(&next), tenth.samples(root));
        }
    }

    /// Regression: sampling read only the trace id, so a producer sending
    /// ids whose low bits are small, with the sampled flag off, had every
    /// hop of its messages exported under any `sampling`.
    #[tokio::test]
    async fn a_remote_parents_decision_is_kept_whatever_the_ratio() {
        let (all, _) = tracer(1.0);
        let (none, _) = tracer(0.0);
        let mut low = [0u8; 16];
        low[0] = 0xff;
        let crafted = Traceparent {
            trace_id: TraceId(low),
            span_id: SpanId::random(),
            flags: 0,
        };
        let mut unsampled = Context::child_of(crafted);
        all.decide(&mut unsampled);
        assert!(!all.samples(&unsampled), "a parent that did not sample");
        assert!(
            all.hop_span(&unsampled, None, "send t", SpanKind::Producer)
                .is_none()
        );
        let mut sampled = Context::child_of(Traceparent {
            trace_id: TraceId(low),
            span_id: SpanId::random(),
            flags: 1,
        });
        none.decide(&mut sampled);
        assert!(none.samples(&sampled), "a parent that sampled");
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_drops_and_counts() {
        let (tracer, dropped) = tracer(1.0);
        let mut trace = Context::root();
        tracer.decide(&mut trace);
        // The export task has not run (time is paused, nothing yielded):
        // four spans fill the queue, the rest are dropped.
        for _ in 0..10 {
            tracer
                .hop_span(&trace, None, "send t", SpanKind::Producer)
                .expect("sampled")
                .end();
        }
        assert_eq!(dropped.get(), 6);
    }
}
