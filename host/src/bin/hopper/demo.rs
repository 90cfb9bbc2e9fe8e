//! `hopper demo`: the order-timeout route on the embedded broker, with sample
//! orders that take every path, printed as they happen.

use crate::{ctrl_c, open_console, prepare};
use anyhow::Context as _;
use hopper::events::{self, Event};
use hopper::headers;
use hopper::hop;
use hopper::kafka::Cluster;
use hopper::types::EmitKind;
use hopper::{Hopper, Options};
use order_service::{Order, OrderService, Status};
use rdkafka::Message;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Headers;
use rdkafka::producer::FutureRecord;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The demo as it travels inside the binary: its config and the handler
/// components the config names, side by side (host/demo/ in the source,
/// built from plugins/order-timeout and plugins/order-events by `cargo
/// xtask demo-components`; the test suite checks they match their source).
/// `hopper demo` unpacks them into a private temporary directory, so it
/// runs the same in any directory, with nothing but the binary.
const BUNDLE: [(&str, &[u8]); 4] = [
    ("demo.toml", include_bytes!("../../../demo/demo.toml")),
    (
        "order_timeout.wasm",
        include_bytes!("../../../demo/order_timeout.wasm"),
    ),
    (
        "order_timeout_v2.wasm",
        include_bytes!("../../../demo/order_timeout_v2.wasm"),
    ),
    (
        "order_events.wasm",
        include_bytes!("../../../demo/order_events.wasm"),
    ),
];

/// Writes [`BUNDLE`] into `dir` and returns the path of its config.
fn unpack(dir: &Path) -> anyhow::Result<PathBuf> {
    for (name, bytes) in BUNDLE {
        let path = dir.join(name);
        std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(dir.join(BUNDLE[0].0))
}

/// How far from its deliver-at a record was released or dropped: relay
/// lines read "4 ms after", or "12 ms before" when the relay acted first.
fn from_deliver_at(deliver_at: i64) -> String {
    let late = hopper::clock::now_ms() - deliver_at;
    if late < 0 {
        format!("{} ms before", -late)
    } else {
        format!("{late} ms after")
    }
}

/// Sample orders: (order id, payload, what should happen). The payload is
/// an order's timeout; what happens depends on what the order service says.
const ORDERS: [(&str, &str, &str); 7] = [
    (
        "o-1001",
        r#"{"order_id":"o-1001"}"#,
        "pending: closed on the first attempt",
    ),
    (
        "o-1002",
        r#"{"order_id":"o-1002"}"#,
        "already paid: nothing to close",
    ),
    (
        "o-1003",
        r#"{"order_id":"o-1003"}"#,
        "service flaky (503 twice): two retries, then closed",
    ),
    (
        "o-1004",
        r#"{"order_id":"o-1004"}"#,
        "refunded, unknown to v1: FATAL, straight to the DLQ",
    ),
    (
        "o-1005",
        r#"{"order_id":"o-1005"}"#,
        "service down for it (503): RETRIES_EXHAUSTED in the DLQ",
    ),
    (
        "o-1006",
        "this is not json",
        "poison message: FATAL, straight to the DLQ",
    ),
    (
        "o-1009",
        r#"{"order_id":"o-1009"}"#,
        "unknown to the service (404): FATAL, straight to the DLQ",
    ),
];

/// An order sent through the delay relay.
const DELAYED: (&str, &str, &str) = (
    "o-1007",
    r#"{"order_id":"o-1007"}"#,
    "payment window of 4s, then closed by its delayed timeout",
);

/// An order sent after the hot reload: v1 dead-letters `refunded` as an
/// unknown status, v2 handles it.
const REFUNDED: (&str, &str, &str) = (
    "o-1008",
    r#"{"order_id":"o-1008"}"#,
    "refunded, after the reload: v2 handles what v1 dead-lettered (o-1004)",
);

/// An order paid within its payment window. Its events go to the
/// order-events route: `created` makes its handler schedule the order's
/// timeout, `timeout-o-1010`, through emit; once that is scheduled the demo
/// sends `paid`, and the handler cancels the timeout through emit. The
/// delay relay drops it at its deliver-at, and the order-timeout route
/// never hears of the order.
const PAID: (&str, &str) = (
    "o-1010",
    "paid within its 4s payment window: its timeout is cancelled and never fires",
);
/// The payment window of [`PAID`].
const PAID_WINDOW_MS: u64 = 4000;
/// How the summary reads when [`PAID`]'s timeout was cancelled.
const NEVER_FIRED: &str = "timeout cancelled, never fired";

/// What the order service knows: every sample order but o-1006 (not an
/// order) and o-1009 (unknown).
fn service_orders() -> Vec<Order> {
    vec![
        Order::new("o-1001", Status::Pending),
        Order::new("o-1002", Status::Paid),
        Order::new("o-1003", Status::Pending).flaky(2),
        Order::new("o-1004", Status::Refunded),
        Order::new("o-1005", Status::Pending).down(),
        Order::new("o-1007", Status::Pending),
        Order::new("o-1008", Status::Refunded),
        Order::new("o-1010", Status::Paid),
    ]
}

/// Where the demo's hot reload is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reload {
    /// Not built: `cargo xtask build-plugins` builds order_timeout_v2.wasm.
    Unavailable,
    /// To do once the first orders settle.
    Pending,
    /// v2 written; waiting for hopper to swap it in.
    Waiting,
    Done,
}

/// How long the demo waits for every sample to settle.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(90);

pub async fn run(
    config: Option<PathBuf>,
    linger: bool,
    handler: Option<PathBuf>,
    cache_dir: Option<PathBuf>,
) -> anyhow::Result<()> {
    // The demo's own config and handlers, unless a config file is given.
    let bundle = tempfile::tempdir().context("making a temporary directory for the demo")?;
    let config = match config {
        Some(config) => config,
        None => unpack(bundle.path())?,
    };
    let (mut settings, _broker) =
        prepare(&config, None, true).with_context(|| format!("loading {}", config.display()))?;
    // The hot reload step swaps in order-timeout v2, so it only runs with
    // the demo's own handler.
    let custom_handler = handler.is_some();
    if let (Some(handler), Some(route)) = (handler, settings.routes.first_mut()) {
        route.handler = handler;
    }
    // Serve a copy of the handler, so the hot reload below can replace it
    // without touching the built file.
    let live_dir = tempfile::tempdir()?;
    let first = settings
        .routes
        .first_mut()
        .context("the demo config has no route")?;
    let built = first.handler.clone();
    let v2 = built.with_file_name("order_timeout_v2.wasm");
    first.handler = live_dir
        .path()
        .join(built.file_name().context("handler has no file name")?);
    std::fs::copy(&built, &first.handler)
        .with_context(|| format!("copying {}", built.display()))?;
    // The order service the handler calls. It listens on a free loopback
    // port, which the route's config value points the handler at; the
    // route grants `http://127.0.0.1:*` (host/demo/demo.toml).
    let service = OrderService::start(service_orders())
        .await
        .context("starting the order service")?;
    first.config.insert("order-service".into(), service.url());
    let route = first.clone();
    // The order-events route, when the config has one and a delay relay to
    // schedule through (host/demo/demo.toml).
    let order_events = settings
        .routes
        .iter()
        .find(|r| r.name == "order-events" && !r.grants.cancel_ids.is_empty())
        .filter(|_| settings.delay.is_some())
        .map(|r| r.topics[0].clone());
    let cluster = Cluster::of(&settings.kafka)?;
    let delay = settings.delay.clone();
    let configured = settings.admin.as_ref().is_some_and(|a| a.token.is_some());
    let hopper = Hopper::start(
        settings,
        Options {
            cache_dir,
            ..Options::default()
        },
    )
    .await?;
    let mut events = hopper.events();
    // The console, when the config runs an admin server (the demo's own
    // does, on a loopback port): its address with this session's read
    // token, and the token written for `hopper status` until the demo ends.
    let console = open_console(&hopper, configured);
    let started = Instant::now();
    let stamp = move || format!("[{:>6.2}s]", started.elapsed().as_secs_f64());

    println!("{}", describe(&route));
    println!(
        "Order service listening on {} (try `curl {}/orders`); closed orders are announced on {}.",
        service.url(),
        service.url(),
        route
            .config
            .get("closed-topic")
            .map_or("orders.closed", String::as_str)
    );

    if let Some(console) = &console {
        let until = if linger {
            "until Ctrl-C"
        } else {
            "while the demo runs; --linger keeps it open after"
        };
        println!(
            "Console: {} (routes, handlers, dead letters; {until}).",
            console.url
        );
        if let Err(e) = &console.token_file {
            println!("  The session token could not be written for `hopper status`: {e:#}");
        }
    }

    let producer = cluster.producer()?;
    let input = route.topics[0].clone();
    let input = &input;
    for (id, payload, expect) in ORDERS {
        let record = FutureRecord::to(input).key(id).payload(payload).headers(
            rdkafka::message::OwnedHeaders::new().insert(rdkafka::message::Header {
                key: headers::ID,
                value: Some(id),
            }),
        );
        producer
            .send(record, Duration::from_secs(10))
            .await
            .map_err(|(e, _)| e)
            .with_context(|| format!("producing sample order {id}"))?;
        println!("{} sent {id} to {input}: {expect}", stamp());
    }

    // An order whose payment window is 4 seconds: its timeout message goes
    // through the delay relay and reaches the route when the window closes.
    if let Some(relay) = &delay {
        let delayed = hopper::delay::DelayedMessage {
            target: input.clone(),
            delay: Some(Duration::from_secs(4)),
            id: Some(DELAYED.0.to_string()),
            key: Some(DELAYED.0.as_bytes().to_vec()),
            payload: Some(DELAYED.1.as_bytes().to_vec()),
            ..Default::default()
        };
        delayed.send(&producer, &relay.inbox).await?;
        println!(
            "{} sent {} to {} for {input} in 4s: {}",
            stamp(),
            DELAYED.0,
            relay.inbox,
            DELAYED.2
        );
    }

    // An order paid before its timeout: `created` schedules the timeout
    // through the order-events handler; `paid` follows once it is
    // scheduled (below).
    let paid_timeout = format!("timeout-{}", PAID.0);
    if let Some(topic) = &order_events {
        let created = format!(
            r#"{{"event":"created","order_id":"{}","timeout_ms":{PAID_WINDOW_MS}}}"#,
            PAID.0
        );
        send_event(&producer, topic, PAID.0, "created", &created).await?;
        println!("{} sent {} created to {topic}: {}", stamp(), PAID.0, PAID.1);
    }

    // Watch the dead-letter topic the way any consumer would.
    let dlq: StreamConsumer = cluster
        .consumer_config(&format!("hopper-demo-dlq-{}", std::process::id()))
        .create()?;
    dlq.subscribe(&[route.dlq.as_str()])?;

    let mut settled: BTreeMap<String, String> = BTreeMap::new();
    let deadline = tokio::time::sleep(SETTLE_TIMEOUT);
    tokio::pin!(deadline);
    // After the last order settles, keep printing DLQ records a moment longer.
    let mut tail: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
    let mut expected =
        ORDERS.len() + usize::from(delay.is_some()) + usize::from(order_events.is_some());
    let mut paid_sent = false;
    let mut reload = if v2.is_file() && !custom_handler {
        Reload::Pending
    } else {
        Reload::Unavailable
    };
    loop {
        if settled.len() == expected && tail.is_none() {
            match reload {
                Reload::Pending => {
                    println!(
                        "{} deploying order-timeout v2, which knows refunded orders: writing {}",
                        stamp(),
                        route.handler.display()
                    );
                    let tmp = route.handler.with_extension("wasm.tmp");
                    std::fs::copy(&v2, &tmp)
                        .with_context(|| format!("copying {}", v2.display()))?;
                    std::fs::rename(&tmp, &route.handler)?;
                    reload = Reload::Waiting;
                }
                Reload::Waiting => {}
                Reload::Done | Reload::Unavailable => {
                    tail = Some(Box::pin(tokio::time::sleep(Duration::from_millis(1500))));
                }
            }
        }
        tokio::select! {
            _ = &mut deadline => {
                println!("{} gave up waiting after {SETTLE_TIMEOUT:?}", stamp());
                break;
            }
            _ = async { match tail.as_mut() { Some(t) => t.await, None => std::future::pending().await } } => break,
            _ = ctrl_c() => break,
            event = events.recv() => match event {
                Ok(Event::Handled(events::Handled { route: by, id, attempt, verdict, .. })) => {
                    println!("{} {id} attempt {attempt}: handler said {verdict}", stamp());
                    if by != route.name {
                        // The order-events route: what it did shows in its emits.
                    } else if id == paid_timeout {
                        settled.insert(PAID.0.into(), format!("timeout fired: handler said {verdict}"));
                    } else if verdict == "ok" {
                        settled.insert(id, "ok".into());
                    }
                }
                Ok(Event::Hop(hop::Outcome::Retry(hop::Retry { id, topic, delay, .. }))) => {
                    println!("{} {id} → {topic} (due in {})", stamp(), humantime::format_duration(delay));
                }
                Ok(Event::Hop(hop::Outcome::DeadLetter(hop::DeadLetter { id, reason, .. }))) => {
                    settled.insert(id.clone(), format!("dead-lettered ({reason})"));
                }
                Ok(Event::Hop(hop::Outcome::Forward(hop::Forward { id, target, deliver_at, .. }))) => {
                    println!("{} {id} released by the delay relay to {target}, {} its deliver-at", stamp(), from_deliver_at(deliver_at));
                }
                Ok(Event::ScheduleCancelled(events::ScheduleCancelled { id, target, deliver_at, kind, .. })) => {
                    println!("{} {id} dropped by the delay relay {} its deliver-at: a {kind} covers it, so it never reaches {target}", stamp(), from_deliver_at(deliver_at));
                    if id == paid_timeout {
                        settled.insert(PAID.0.into(), NEVER_FIRED.into());
                    }
                }
                Ok(Event::CancelTooLate(events::CancelTooLate { id, .. })) => {
                    println!("{} {id}: the cancel came too late, it was delivered already", stamp());
                }
                Ok(Event::HandlerReloaded(events::HandlerReloaded { handler, old_version, new_version, took, .. })) => {
                    println!("{} handler {handler} reloaded in {took:.0?}: {} → {}", stamp(), &old_version[..12], &new_version[..12]);
                    if reload == Reload::Waiting {
                        reload = Reload::Done;
                        expected += 1;
                        let (id, payload, expect) = REFUNDED;
                        let record = FutureRecord::to(input).key(id).payload(payload).headers(
                            rdkafka::message::OwnedHeaders::new().insert(rdkafka::message::Header {
                                key: headers::ID,
                                value: Some(id),
                            }),
                        );
                        producer.send(record, Duration::from_secs(10)).await.map_err(|(e, _)| e)?;
                        println!("{} sent {id} to {input}: {expect}", stamp());
                    }
                }
                Ok(Event::HttpRequest(events::HttpRequest { id, method, url, status, error, took, .. })) => {
                    let answer = match (status, error) {
                        (Some(status), _) => status.to_string(),
                        (None, Some(error)) => format!("no answer: {error}"),
                        (None, None) => "no answer".into(),
                    };
                    println!("{} {id} handler → {method} {url}: {answer} ({took:.1?})", stamp());
                }
                Ok(Event::HttpDenied(events::HttpDenied { id, method, url, reason, .. })) => {
                    println!("{} {id} handler → {method} {url}: denied ({reason})", stamp());
                }
                Ok(Event::Hop(hop::Outcome::Emit(hop::Emit { id, topic, deliver_at, kind, .. }))) => match kind {
                    EmitKind::Publish => println!("{} {id} emitted to {topic}", stamp()),
                    EmitKind::Schedule { .. } => {
                        let due = deliver_at.map_or(0, |at| at - hopper::clock::now_ms());
                        println!("{} {id} scheduled by the handler for {topic}, due in {due} ms", stamp());
                        if let (Some(topic), false) = (&order_events, paid_sent) && id == paid_timeout {
                            let paid = format!(r#"{{"event":"paid","order_id":"{}"}}"#, PAID.0);
                            send_event(&producer, topic, PAID.0, "paid", &paid).await?;
                            paid_sent = true;
                            println!("{} sent {} paid to {topic}: the handler cancels {id}", stamp(), PAID.0);
                        }
                    }
                    EmitKind::Cancel => println!("{} {id}: cancel sent by the handler to the delay relay ({topic})", stamp()),
                },
                Ok(Event::EmitsDiscarded(events::EmitsDiscarded { id, count, verdict, .. })) => {
                    println!("{} {id}: {count} emitted record(s) discarded, the verdict is {verdict}", stamp());
                }
                Ok(Event::HandlerReloadFailed(events::HandlerReloadFailed { error, .. })) => {
                    println!("{} handler reload failed, the old version keeps serving: {error}", stamp());
                }
                _ => {}
            },
            record = dlq.recv() => {
                if let Ok(record) = record {
                    let mut context = Vec::new();
                    if let Some(h) = record.headers() {
                        for header in h.iter() {
                            if header.key.starts_with(headers::PREFIX) {
                                let value = String::from_utf8_lossy(header.value.unwrap_or_default());
                                context.push(format!("{}={}", header.key, value));
                            }
                        }
                    }
                    println!("{} DLQ record at {}[{}]@{}:\n           {}", stamp(), record.topic(), record.partition(), record.offset(), context.join("\n           "));
                }
            }
        }
    }

    println!("\nSummary:");
    let delayed = delay.as_ref().map(|_| DELAYED);
    let refunded = (reload == Reload::Done).then_some(REFUNDED);
    let paid = order_events.as_ref().map(|_| (PAID.0, "", PAID.1));
    for (id, _, expect) in ORDERS
        .into_iter()
        .chain(delayed)
        .chain(refunded)
        .chain(paid)
    {
        let got = settled.get(id).map(String::as_str).unwrap_or("not settled");
        println!("  {id}: {got:<32} expected: {expect}");
    }
    let statuses: Vec<String> = service_orders()
        .iter()
        .map(|o| format!("{} {:?}", o.id, service.status(&o.id).unwrap_or(o.status)).to_lowercase())
        .collect();
    println!(
        "Order service: {} requests answered; {}.",
        service.served().len(),
        statuses.join(", ")
    );
    if linger {
        println!("Still running; press Ctrl-C to stop.");
        ctrl_c().await;
    }
    hopper.stop().await;
    Ok(())
}

/// A route in one line: where its messages come from and go.
pub(crate) fn describe(route: &hopper::config::Route) -> String {
    format!(
        "Route `{}`: {} → handler {} → retry tiers {} → DLQ {} (max {} attempts).",
        route.name,
        route.topics.join(","),
        route.handler.display(),
        route
            .tiers()
            .iter()
            .map(|(_, t)| t.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        route.dlq,
        route.max_attempts
    )
}

/// Sends one order event, keyed by the order so its events keep their
/// order, with the id `<order>-<event>`.
async fn send_event(
    producer: &rdkafka::producer::FutureProducer,
    topic: &str,
    order: &str,
    event: &str,
    payload: &str,
) -> anyhow::Result<()> {
    let id = format!("{order}-{event}");
    let record = FutureRecord::to(topic).key(order).payload(payload).headers(
        rdkafka::message::OwnedHeaders::new().insert(rdkafka::message::Header {
            key: headers::ID,
            value: Some(&id),
        }),
    );
    producer
        .send(record, Duration::from_secs(10))
        .await
        .map_err(|(e, _)| e)
        .with_context(|| format!("producing order event {id}"))?;
    Ok(())
}
