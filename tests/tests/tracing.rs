//! Trace context against a real broker (docs/tracing.md): every record
//! hopper writes, on every topic, carries exactly one `traceparent`, in the
//! trace of the record it came from, through retry tiers, the DLQ, a replay
//! and the delay relay; a record without one (or with a malformed one)
//! starts a trace of its own. With `[tracing]`, the spans reach a real
//! OTLP/HTTP receiver (decoded with `opentelemetry-proto`), chained in hop
//! order; with the endpoint down, messages flow and spans are dropped and
//! counted.

use hopper::metrics::series;
use hopper::traceparent::{self, Traceparent};
use hopper_tests::*;
use rdkafka::Message;
use rdkafka::message::{Headers, OwnedMessage};
use serde_json::{Value, json};
use std::collections::HashSet;
use std::time::Duration;

/// The producer's context: trace `4bf9…4736`, its own span `00f0…02b7`.
const PRODUCER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

/// The one `traceparent` of a record hopper wrote, read; fails on none, on
/// two (in any spelling) and on an invalid one.
fn the_traceparent(m: &OwnedMessage) -> Traceparent {
    let values: Vec<&[u8]> = m
        .headers()
        .map(|h| {
            h.iter()
                .filter(|h| h.key.eq_ignore_ascii_case(traceparent::TRACEPARENT))
                .map(|h| h.value.unwrap_or_default())
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(
        values.len(),
        1,
        "{}:{}:{} has {} traceparent headers",
        m.topic(),
        m.partition(),
        m.offset(),
        values.len()
    );
    traceparent::parse_traceparent(values[0]).unwrap_or_else(|| {
        panic!(
            "invalid traceparent `{}`",
            String::from_utf8_lossy(values[0])
        )
    })
}

fn id_of(m: &OwnedMessage) -> String {
    header_map(m)
        .0
        .get("hopper-id")
        .cloned()
        .unwrap_or_default()
}

/// A replay of a filter's selection through the admin API, a run: its
/// status once done.
async fn replay(addr: std::net::SocketAddr, body: Value) -> Value {
    let status = replay_run(addr, Some(TOKEN), &body).await;
    assert_eq!(status["state"], "done", "{status}");
    status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_dead_lettered_and_replayed_message_keeps_one_trace_on_every_record() {
    init_tracing();
    let route = ConfigBuilder::new()
        .route(
            RouteTable::new(&plugin("scripted"))
                .retry(&["1s"])
                .max_attempts(3),
        )
        .admin(AdminTable::loopback().token(TOKEN))
        .test_route();
    let tier = format!("{}.retry.1s", route.name);
    let journal = format!("{}.replays", route.dlq);
    let hopper = route.start().await;
    let producer = producer();
    // `traced` continues the producer's trace (with vendor state, and a
    // second spelling hopper must not copy); `fresh` has none, and
    // `malformed` an unusable one: each of those starts a trace.
    produce(
        &producer,
        &route.input,
        Some("traced"),
        "retry",
        &[
            ("hopper-id", "traced"),
            ("traceparent", PRODUCER),
            ("tracestate", "vendor=1"),
        ],
    )
    .await;
    produce(
        &producer,
        &route.input,
        Some("fresh"),
        "retry",
        &[("hopper-id", "fresh")],
    )
    .await;
    produce(
        &producer,
        &route.input,
        Some("malformed"),
        "retry",
        &[
            ("hopper-id", "malformed"),
            (
                "traceparent",
                "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
            ("tracestate", "stale=1"),
        ],
    )
    .await;
    // Three attempts each: two retries, then the DLQ.
    consume(&route.dlq, 3, PATIENCE).await;
    let report = replay(hopper.admin_addr().unwrap(), json!({ "filter": {} })).await;
    assert_eq!(report["replayed"], 3, "{report}");
    // Replayed, each is retried twice and dead-lettered again.
    let input = consume(&route.input, 6, PATIENCE).await;
    let retries = consume(&tier, 12, PATIENCE).await;
    let dead = consume(&route.dlq, 6, PATIENCE).await;
    let journal = consume(&journal, 3, PATIENCE).await;
    hopper.stop().await;

    // Everything hopper wrote: the tiers, the DLQ, the replays and their
    // journal entries.
    let replays: Vec<&OwnedMessage> = input
        .iter()
        .filter(|m| header_map(m).0.contains_key("hopper-replay-count"))
        .collect();
    let written: Vec<&OwnedMessage> = retries
        .iter()
        .chain(&dead)
        .chain(replays.iter().copied())
        .collect();
    assert_eq!(written.len(), 12 + 6 + 3);
    let mut spans = HashSet::new();
    let mut traces = std::collections::HashMap::new();
    for m in &written {
        let tp = the_traceparent(m);
        assert!(spans.insert(tp.span_id), "each hop has a span of its own");
        let trace = traces.entry(id_of(m)).or_insert(tp.trace_id);
        assert_eq!(
            *trace,
            tp.trace_id,
            "{} changed trace on {}",
            id_of(m),
            m.topic()
        );
    }
    assert_eq!(traces.len(), 3, "{traces:?}");
    assert_eq!(
        traces["traced"].to_string(),
        TRACE,
        "the producer's trace continues"
    );
    let new: HashSet<_> = [traces["fresh"], traces["malformed"]].into();
    assert_eq!(
        new.len(),
        2,
        "each record without a usable context starts its own trace"
    );
    assert!(!new.iter().any(|t| t.to_string() == TRACE));
    for m in &written {
        let (h, counts) = header_map(m);
        // The producer's span is a link, never a second header.
        assert!(
            !m.headers().unwrap().iter().any(|h| h
                .value
                .is_some_and(|v| v.windows(16).any(|w| w == b"00f067aa0ba902b7"))),
            "the producer's span is not carried on"
        );
        match id_of(m).as_str() {
            "traced" => {
                assert_eq!(h["tracestate"], "vendor=1");
                assert_eq!(counts["tracestate"], 1);
            }
            other => assert!(
                !h.contains_key("tracestate"),
                "{other}: a new trace drops the old vendor state"
            ),
        }
    }
    // A journal entry is in the trace of the record it replayed.
    for m in &journal {
        let tp = the_traceparent(m);
        assert_eq!(tp.trace_id, traces[&id_of(m)]);
    }
    // The producer's own record is untouched, and would have failed the
    // checks above on its span: the check sees what it looks for.
    let original = input.iter().find(|m| id_of(m) == "traced").unwrap();
    assert_eq!(
        the_traceparent(original).span_id.to_string(),
        "00f067aa0ba902b7"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_message_keeps_its_trace_through_the_tiers_to_its_target() {
    init_tracing();
    let inbox = rand_name("delay");
    let config = ConfigBuilder::new()
        .delay(DelayTable::named(&inbox).tiers(&["1s"]).max_delay("1h"))
        .write();
    let tier = config.config().delay.unwrap().tiers[0].1.clone();
    let target = rand_name("target");
    create_topics(&[&target]).await;
    let hopper = config.start().await;
    let producer = producer();
    produce(
        &producer,
        &inbox,
        Some("d1"),
        "later",
        &[
            ("hopper-id", "d1"),
            ("hopper-target", &target),
            ("hopper-delay", "2500ms"),
            ("traceparent", PRODUCER),
        ],
    )
    .await;
    let forwarded = consume(&target, 1, PATIENCE).await;
    let tiers = consume(&tier, 1, PATIENCE).await;
    hopper.stop().await;
    let (hop, out) = (the_traceparent(&tiers[0]), the_traceparent(&forwarded[0]));
    assert_eq!(hop.trace_id.to_string(), TRACE);
    assert_eq!(out.trace_id.to_string(), TRACE);
    assert_ne!(hop.span_id, out.span_id, "the forward is a hop of its own");
    assert_ne!(out.span_id.to_string(), "00f067aa0ba902b7");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_a_handler_emits_continue_the_calls_trace() {
    init_tracing();
    let closed = rand_name("closed");
    let route = RouteTable::new(&plugin("acting"))
        .emit_topics(&[&closed])
        .test_route();
    let hopper = route.start().await;
    // The guest sets a traceparent of its own on one of them: hopper's
    // replaces it, so the record still has exactly one.
    let forged = "00-11111111111111111111111111111111-2222222222222222-01";
    let steps = json!([
        {"emit": {"topic": closed, "payload": "a", "headers": {"traceparent": forged}}},
        {"emit": {"topic": closed, "payload": "b"}},
    ]);
    produce(
        &producer(),
        &route.input,
        None,
        &json!({"steps": steps, "verdict": "ok"}).to_string(),
        &[("traceparent", PRODUCER)],
    )
    .await;
    let emitted = consume(&closed, 2, PATIENCE).await;
    hopper.stop().await;
    let (a, b) = (the_traceparent(&emitted[0]), the_traceparent(&emitted[1]));
    assert_eq!(a.trace_id.to_string(), TRACE);
    assert_eq!(b.trace_id.to_string(), TRACE);
    assert_eq!(a.span_id, b.span_id, "both are written by the one call");
    assert_ne!(a.span_id.to_string(), "00f067aa0ba902b7");
}

mod otlp {
    //! A loopback OTLP/HTTP traces receiver: decodes each
    //! `ExportTraceServiceRequest` and keeps its spans.

    use bytes::Bytes;
    use hopper_tests::http_server::Loopback;
    use http_body_util::{BodyExt, Full};
    use hyper::server::conn::http1;
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    use opentelemetry_proto::tonic::collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
    };
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    pub use opentelemetry_proto::tonic::trace::v1::Span;
    use prost::Message;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    pub struct Receiver {
        pub addr: std::net::SocketAddr,
        spans: Arc<Mutex<Vec<(String, Span)>>>,
        /// Bumped on every request, so a test waits for spans, not time.
        arrived: tokio::sync::watch::Receiver<u64>,
        _server: Loopback,
    }

    impl Receiver {
        pub fn start() -> Receiver {
            let spans: Arc<Mutex<Vec<(String, Span)>>> = Arc::default();
            let (bump, arrived) = tokio::sync::watch::channel(0u64);
            let (kept, bump) = (spans.clone(), Arc::new(bump));
            let server = Loopback::start("otlp-receiver", 1, move |stream| {
                let (kept, bump) = (kept.clone(), bump.clone());
                async move {
                    let service =
                        service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                            let (kept, bump) = (kept.clone(), bump.clone());
                            async move {
                                assert_eq!(request.uri().path(), "/v1/traces");
                                let body = request.into_body().collect().await?.to_bytes();
                                let export = ExportTraceServiceRequest::decode(body)
                                    .expect("an ExportTraceServiceRequest");
                                {
                                    let mut kept = kept.lock().unwrap();
                                    for resource in export.resource_spans {
                                        let service = resource
                                            .resource
                                            .iter()
                                            .flat_map(|r| &r.attributes)
                                            .find(|a| a.key == "service.name")
                                            .and_then(|a| text(a.value.as_ref()?.value.as_ref()?))
                                            .unwrap_or_default();
                                        for scope in resource.scope_spans {
                                            for span in scope.spans {
                                                kept.push((service.clone(), span));
                                            }
                                        }
                                    }
                                }
                                bump.send_modify(|n| *n += 1);
                                let answer = ExportTraceServiceResponse::default().encode_to_vec();
                                Ok::<_, hyper::Error>(
                                    hyper::Response::builder()
                                        .header("content-type", "application/x-protobuf")
                                        .body(Full::new(Bytes::from(answer)))
                                        .unwrap(),
                                )
                            }
                        });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                }
            });
            Receiver {
                addr: server.addr,
                spans,
                arrived,
                _server: server,
            }
        }

        /// The spans received so far once `enough` accepts them; panics
        /// after `timeout`.
        pub async fn until(
            &self,
            timeout: Duration,
            enough: impl Fn(&[Span]) -> bool,
        ) -> Vec<Span> {
            let mut arrived = self.arrived.clone();
            let deadline = tokio::time::Instant::now() + timeout;
            loop {
                let spans: Vec<Span> = self
                    .spans
                    .lock()
                    .unwrap()
                    .iter()
                    .map(|(_, s)| s.clone())
                    .collect();
                if enough(&spans) {
                    return spans;
                }
                if tokio::time::timeout_at(deadline, arrived.changed())
                    .await
                    .is_err()
                {
                    panic!(
                        "the receiver never had enough spans; it has {}",
                        spans.len()
                    );
                }
            }
        }

        /// `service.name` of every span received.
        pub fn services(&self) -> Vec<String> {
            self.spans
                .lock()
                .unwrap()
                .iter()
                .map(|(s, _)| s.clone())
                .collect()
        }
    }

    fn text(value: &Value) -> Option<String> {
        match value {
            Value::StringValue(s) => Some(s.clone()),
            _ => None,
        }
    }

    /// A span attribute as text (strings) or as a number (ints).
    pub fn attr(span: &Span, key: &str) -> Option<String> {
        let value = span
            .attributes
            .iter()
            .find(|a| a.key == key)?
            .value
            .as_ref()?
            .value
            .as_ref()?;
        match value {
            Value::StringValue(s) => Some(s.clone()),
            Value::IntValue(n) => Some(n.to_string()),
            Value::BoolValue(b) => Some(b.to_string()),
            Value::DoubleValue(d) => Some(d.to_string()),
            _ => None,
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A `[tracing]` table exporting every trace to `receiver`.
fn traced(config: ConfigBuilder, receiver: &otlp::Receiver) -> ConfigBuilder {
    config
        .key(
            "tracing",
            "endpoint",
            quoted(format!("http://{}/v1/traces", receiver.addr)),
        )
        .key("tracing", "service_name", quoted("orders-hopper"))
        .key("tracing", "sampling", "1.0")
        .key(
            "tracing",
            "resource",
            "{ \"deployment.environment\" = \"test\" }",
        )
        .key(
            "tracing",
            "ui",
            quoted("https://jaeger.example/trace/{trace_id}"),
        )
}

/// The spans of trace `trace` from the one whose parent is `root`, child
/// after child: the chain of hops. Fails on a fork.
fn chain(spans: &[otlp::Span], trace: &str, root: &str) -> Vec<otlp::Span> {
    let mine: Vec<&otlp::Span> = spans.iter().filter(|s| hex(&s.trace_id) == trace).collect();
    let mut out = Vec::new();
    let mut parent = root.to_string();
    loop {
        let children: Vec<&&otlp::Span> = mine
            .iter()
            .filter(|s| hex(&s.parent_span_id) == parent)
            .collect();
        match children.as_slice() {
            [] => return out,
            [only] => {
                parent = hex(&only.span_id);
                out.push((**only).clone());
            }
            many => panic!(
                "span {parent} has {} children: {:?}",
                many.len(),
                many.iter().map(|s| &s.name).collect::<Vec<_>>()
            ),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_spans_of_a_retried_dead_lettered_and_replayed_message_chain_in_hop_order() {
    init_tracing();
    let receiver = otlp::Receiver::start();
    let route = traced(ConfigBuilder::new(), &receiver)
        .route(
            RouteTable::new(&plugin("scripted"))
                .retry(&["1s"])
                .max_attempts(3),
        )
        .admin(AdminTable::loopback().token(TOKEN))
        .test_route();
    let tier = format!("{}.retry.1s", route.name);
    let hopper = route.start().await;
    let version = hopper.handler_version(&route.name).unwrap();
    let group = route.config().routes[0].group.clone();
    produce(
        &producer(),
        &route.input,
        Some("traced"),
        "retry",
        &[("hopper-id", "traced"), ("traceparent", PRODUCER)],
    )
    .await;
    consume(&route.dlq, 1, PATIENCE).await;
    let report = replay(hopper.admin_addr().unwrap(), json!({ "filter": {} })).await;
    assert_eq!(report["replayed"], 1, "{report}");
    let dead = consume(&route.dlq, 2, PATIENCE).await;
    // Operators see the trace: the API (and so the console) links it, and
    // `hopper dlq show` prints it.
    let at = format!(
        "{}:{}:{}",
        dead[0].topic(),
        dead[0].partition(),
        dead[0].offset()
    );
    let path = format!(
        "/api/dlq/{}/{}/{}",
        dead[0].topic(),
        dead[0].partition(),
        dead[0].offset()
    );
    let shown = get_json_as(hopper.admin_addr().unwrap(), &path, Some(TOKEN)).await;
    assert_eq!(shown["trace_id"], TRACE, "{shown}");
    let link = format!("https://jaeger.example/trace/{TRACE}");
    assert_eq!(shown["trace_url"], link.as_str(), "{shown}");
    let cli = std::process::Command::new(hopper_bin())
        .args(["dlq", "show", &at, "--config"])
        .arg(&route.config_path)
        .env_remove("HOPPER_LOG_FORMAT")
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&cli.stdout);
    assert!(
        cli.status.success(),
        "{}",
        String::from_utf8_lossy(&cli.stderr)
    );
    let trace_row = printed
        .lines()
        .find(|l| l.starts_with("trace "))
        .unwrap_or_default();
    assert!(trace_row.contains(TRACE), "{printed}");
    assert!(
        printed.lines().any(|l| l == format!("trace link: {link}")),
        "{printed}"
    );
    // Two passes of three calls and three sends, and the replay between.
    let spans = receiver
        .until(PATIENCE, |spans| {
            spans.iter().filter(|s| hex(&s.trace_id) == TRACE).count() >= 13
        })
        .await;
    hopper.stop().await;
    let hops = chain(&spans, TRACE, "00f067aa0ba902b7");
    let names: Vec<&str> = hops.iter().map(|s| s.name.as_str()).collect();
    let (input, dlq) = (
        format!("process {}", route.input),
        format!("send {}", route.dlq),
    );
    let (tier_in, tier_out) = (format!("process {tier}"), format!("send {tier}"));
    let replay_send = format!("send {}", route.input);
    let pass = [
        input.as_str(),
        &tier_out,
        &tier_in,
        &tier_out,
        &tier_in,
        &dlq,
    ];
    let expected: Vec<&str> = pass
        .iter()
        .copied()
        .chain([replay_send.as_str()])
        .chain(pass)
        .collect();
    assert_eq!(names, expected, "one trace, parented in hop order");
    // The calls say what happened.
    let calls: Vec<&otlp::Span> = hops
        .iter()
        .filter(|s| s.name.starts_with("process"))
        .collect();
    for (i, call) in calls.iter().enumerate() {
        let attempt = (i % 3 + 1).to_string();
        assert_eq!(
            otlp::attr(call, "hopper.attempt").as_deref(),
            Some(attempt.as_str())
        );
        assert_eq!(otlp::attr(call, "hopper.route"), Some(route.name.clone()));
        assert_eq!(
            otlp::attr(call, "hopper.verdict").as_deref(),
            Some("retryable")
        );
        assert_eq!(
            otlp::attr(call, "hopper.reason").as_deref(),
            Some("RETRYABLE")
        );
        assert_eq!(
            otlp::attr(call, "hopper.handler.version"),
            Some(version.clone())
        );
        assert_eq!(
            otlp::attr(call, "messaging.system").as_deref(),
            Some("kafka")
        );
        assert_eq!(
            otlp::attr(call, "messaging.consumer.group.name"),
            Some(group.clone())
        );
        assert_eq!(
            otlp::attr(call, "messaging.message.id").as_deref(),
            Some("traced")
        );
        // Linked to the span that wrote the record it read.
        assert_eq!(call.links.len(), 1);
        assert_eq!(hex(&call.links[0].span_id), hex(&call.parent_span_id));
    }
    assert_eq!(
        otlp::attr(&hops[5], "hopper.reason").as_deref(),
        Some("RETRIES_EXHAUSTED")
    );
    // The replay is linked to the dead-letter record's span.
    let replayed = &hops[6];
    assert_eq!(
        otlp::attr(replayed, "hopper.hop").as_deref(),
        Some("replay")
    );
    assert_eq!(hex(&replayed.links[0].span_id), hex(&hops[5].span_id));
    assert!(
        otlp::attr(replayed, "hopper.replayed_from")
            .unwrap()
            .starts_with(&route.dlq)
    );
    // The records carry the send spans' ids.
    let written: HashSet<String> = dead
        .iter()
        .map(|m| the_traceparent(m).span_id.to_string())
        .collect();
    assert_eq!(
        written,
        [hex(&hops[5].span_id), hex(&hops[12].span_id)].into()
    );
    let services: HashSet<String> = receiver.services().into_iter().collect();
    assert_eq!(services, ["orders-hopper".to_string()].into());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_messages_forward_span_records_its_lateness() {
    init_tracing();
    let receiver = otlp::Receiver::start();
    let inbox = rand_name("delay");
    let config = traced(ConfigBuilder::new(), &receiver)
        .delay(DelayTable::named(&inbox).tiers(&["1s"]).max_delay("1h"))
        .write();
    let tier = config.config().delay.unwrap().tiers[0].1.clone();
    let target = rand_name("target");
    create_topics(&[&target]).await;
    let hopper = config.start().await;
    let deliver_at = now_ms() + 3_000;
    produce(
        &producer(),
        &inbox,
        Some("d1"),
        "later",
        &[
            ("hopper-id", "d1"),
            ("hopper-target", &target),
            ("hopper-deliver-at", &deliver_at.to_string()),
            ("traceparent", PRODUCER),
        ],
    )
    .await;
    let forwarded = consume(&target, 1, PATIENCE).await;
    let forward_name = format!("send {target}");
    let spans = receiver
        .until(PATIENCE, |spans| {
            spans.iter().any(|s| s.name == forward_name)
        })
        .await;
    hopper.stop().await;
    let hops = chain(&spans, TRACE, "00f067aa0ba902b7");
    let names: Vec<&str> = hops.iter().map(|s| s.name.as_str()).collect();
    // The inbox read, its hop to the tier (and any hop on down the same
    // tier), then the forward.
    let (tier_in, tier_out) = (format!("process {tier}"), format!("send {tier}"));
    assert_eq!(
        names[..2],
        [format!("process {inbox}"), tier_out.clone()],
        "{names:?}"
    );
    assert_eq!(names.last(), Some(&forward_name.as_str()), "{names:?}");
    assert!(
        names[2..names.len() - 1]
            .iter()
            .all(|n| *n == tier_in || *n == tier_out),
        "{names:?}"
    );
    let forward = hops.last().unwrap();
    let lateness: i64 = otlp::attr(forward, "hopper.lateness_ms")
        .unwrap()
        .parse()
        .unwrap();
    assert!((0..5_000).contains(&lateness), "{lateness}");
    assert_eq!(
        otlp::attr(forward, "hopper.deliver_at"),
        Some(deliver_at.to_string())
    );
    // The span starts at the deliver-at and lasts the lateness.
    let start_ms = (forward.start_time_unix_nano / 1_000_000) as i64;
    assert_eq!(start_ms, deliver_at);
    assert_eq!(
        the_traceparent(&forwarded[0]).span_id.to_string(),
        hex(&forward.span_id)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_endpoint_down_messages_flow_and_spans_are_dropped_and_counted() {
    init_tracing();
    // A port that was free a moment ago: nothing listens there.
    let down = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let route = ConfigBuilder::new()
        .route(RouteTable::new(&plugin("scripted")))
        .key(
            "tracing",
            "endpoint",
            quoted(format!("http://{down}/v1/traces")),
        )
        .key("tracing", "queue", 64)
        .test_route();
    let hopper = route.start().await;
    let producer = producer();
    const MESSAGES: usize = 200;
    for i in 0..MESSAGES {
        produce(&producer, &route.input, Some(&format!("k{i}")), "ok", &[]).await;
    }
    let group = route.config().routes[0].group.clone();
    until_committed_on(&group, &route.input, MESSAGES as i64).await;
    let dropped = || count(hopper.telemetry(), &series::DroppedSpans);
    // Every message was handled; the spans of their calls were dropped, and
    // counted, once their export failed (the first batch goes half a second
    // after its first span, and fails at once: nothing listens).
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    while dropped() == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no span was counted as dropped"
        );
        tick.tick().await;
    }
    assert!(dropped() <= 2 * MESSAGES as u64);
    hopper.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_a_handler_calls_receives_the_calls_traceparent() {
    init_tracing();
    let receiver = otlp::Receiver::start();
    let service = hopper_tests::http_server::TestServer::start();
    let route = traced(ConfigBuilder::new(), &receiver)
        .route(RouteTable::new(&plugin("acting")).allowed_hosts(&[service.origin()]))
        .test_route();
    let hopper = route.start().await;
    let mut events = hopper.events();
    // One request through `wasi:http`, one through `fetch`.
    let steps = json!([{"get": service.url("/hello")}, {"fetch": {"url": service.url("/hello")}}]);
    produce(
        &producer(),
        &route.input,
        None,
        &json!({"steps": steps, "verdict": "ok"}).to_string(),
        &[("hopper-id", "h1"), ("traceparent", PRODUCER)],
    )
    .await;
    wait_for_event(&mut events, "the call of `h1`", |e| match e {
        hopper::events::Event::Handled(h) if h.id == "h1" => Some(()),
        _ => None,
    })
    .await;
    let call_name = format!("process {}", route.input);
    let spans = receiver
        .until(PATIENCE, |spans| spans.iter().any(|s| s.name == call_name))
        .await;
    hopper.stop().await;
    let call = spans.iter().find(|s| s.name == call_name).unwrap();
    // Both requests, whichever API sent them, carry one traceparent: the
    // message's trace, the call's span as the parent, so the service's own
    // spans join the trace.
    let seen = service.traceparents();
    assert_eq!(seen.len(), 2, "{seen:?}");
    for value in &seen {
        let tp = traceparent::parse_traceparent(value.as_bytes()).expect("a valid traceparent");
        assert_eq!(tp.trace_id.to_string(), TRACE);
        assert_eq!(tp.span_id.to_string(), hex(&call.span_id));
    }
}
