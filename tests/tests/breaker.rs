//! A route's circuit breaker against a real broker: the `fetch` fixture
//! calls a loopback service that answers 503 for a while. With the breaker,
//! the route stops taking messages out of its retry tiers while the service
//! is down, probes it after each cool-down, and once it is back every
//! message is handled `ok` with attempts to spare. Without it, the same
//! outage spends every attempt and dead-letters every message.

use hopper::breaker::BreakerState;
use hopper::events::{self, Event};
use hopper::hop;
use hopper::metrics::Format;
use hopper::metrics::series;
use hopper::types::VerdictKind;
use hopper_tests::http_server::TestServer;
use hopper_tests::*;
use rdkafka::consumer::{BaseConsumer, Consumer};
use std::collections::HashMap;
use std::time::Duration;

/// Messages each test sends.
const MESSAGES: usize = 20;

/// A route around `fetch` calling `server`'s `/flaky`, with a 1s and a 2s
/// tier and three attempts, and what `more` adds, in `config`.
fn fetch_route(
    server: &TestServer,
    more: impl FnOnce(RouteTable) -> RouteTable,
    config: ConfigBuilder,
) -> TestRoute {
    let route = RouteTable::new(&plugin("fetch"))
        .allowed_hosts(&[server.origin()])
        .retry(&["1s", "2s"])
        .max_attempts(3)
        .config("url", server.url("/flaky"));
    config.route(more(route)).test_route()
}

async fn send_messages(route: &TestRoute) {
    let producer = producer();
    for i in 0..MESSAGES {
        let id = format!("m{i}");
        produce(
            &producer,
            &route.input,
            Some(&id),
            "{}",
            &[("hopper-id", &id)],
        )
        .await;
    }
}

/// Records on `topic`, from its partitions' high watermarks.
fn records_on(topic: &str) -> i64 {
    let consumer: BaseConsumer = client_config().create().unwrap();
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap();
    metadata.topics()[0]
        .partitions()
        .iter()
        .map(|p| {
            let (low, high) = consumer
                .fetch_watermarks(topic, p.id(), Duration::from_secs(10))
                .unwrap();
            high - low
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_breaker_keeps_messages_in_their_tier_until_the_service_is_back() {
    init_tracing();
    let server = TestServer::start();
    server.set_down(true);
    let route = fetch_route(
        &server,
        |r| {
            r.breaker("retryable_rate", 0.5)
                .breaker("min_calls", 5)
                .breaker("window", 10)
                .breaker("cool_down", quoted("3s"))
                .breaker("max_cool_down", quoted("3s"))
                .breaker("probes", 1)
        },
        ConfigBuilder::new().admin(AdminTable::loopback()),
    );
    let hopper = route.start().await;
    let health = hopper.telemetry().health().clone();
    assert_eq!(health.breaker(&route.name), Some(BreakerState::Closed));
    let mut events = hopper.events();
    send_messages(&route).await;
    let is_tier = |topic: &str| topic.starts_with(&format!("{}.retry.", route.name));

    // Five retryable verdicts of five calls open it.
    let mut before = Vec::new();
    wait_for_event(
        &mut events,
        "the breaker to open after 5 retryable calls of 5",
        |e| {
            before.push(e.clone());
            match e {
                Event::BreakerOpened(events::BreakerOpened {
                    retryable: 5,
                    calls: 5,
                    reopened: false,
                    ..
                }) => Some(()),
                _ => None,
            }
        },
    )
    .await;
    let until_ms = match health.breaker(&route.name) {
        Some(BreakerState::Open {
            until_ms,
            cool_down_ms: 3_000,
        }) => until_ms,
        other => panic!("expected open for 3s, got {other:?}"),
    };
    let scrape = hopper.telemetry().metrics().encode(Format::Prometheus);
    let gauge = format!("hopper_breaker_state{{route=\"{}\"}} 1", route.name);
    assert!(scrape.contains(&gauge), "{gauge} missing from:\n{scrape}");
    let admin = hopper.admin_addr().expect("the admin server runs");
    let routes = get_json_as(admin, "/api/routes", hopper.admin_session_token()).await;
    assert_eq!(routes[0]["breaker"]["state"], "open", "{routes}");
    assert_eq!(routes[0]["status"]["state"], "consuming", "still ready");

    // Open: nothing is taken out of a tier, nothing is dead-lettered, until
    // the cool-down ends. The input is not paused: the messages still on it
    // are handled and wait in the first tier.
    let mut open = Vec::new();
    wait_for_event(&mut events, "the breaker to turn half-open", |e| {
        open.push(e.clone());
        matches!(e, Event::BreakerHalfOpen(events::BreakerHalfOpen { .. })).then_some(())
    })
    .await;
    assert!(now_ms() >= until_ms, "half-open before the cool-down ended");
    // The tiers are paused at the broker, not only guarded: no tier message
    // even reaches the route to be sent back.
    let deferred = open
        .iter()
        .filter(|e| matches!(e, Event::Hop(hop::Outcome::Deferral(hop::Deferral { .. }))))
        .count();
    assert_eq!(deferred, 0, "tier messages fetched while open");
    for event in &open {
        match event {
            Event::Handled(events::Handled { topic, id, .. }) if is_tier(topic) => {
                panic!("{id} was handled from {topic} while the breaker was open")
            }
            Event::Hop(hop::Outcome::DeadLetter(hop::DeadLetter { id, reason, .. })) => {
                panic!("{id} was dead-lettered ({reason}) while the breaker was open")
            }
            _ => {}
        }
    }

    // The probe still gets 503: open again, for another cool-down. Then the
    // service comes back.
    let mut probing = Vec::new();
    wait_for_event(&mut events, "the breaker to open again", |e| {
        probing.push(e.clone());
        match e {
            Event::BreakerOpened(events::BreakerOpened { reopened: true, .. }) => Some(()),
            _ => None,
        }
    })
    .await;
    assert!(
        probing.iter().any(|e| matches!(
            e,
            Event::BreakerProbed(events::BreakerProbed {
                verdict: VerdictKind::Retryable,
                ..
            })
        )),
        "{probing:?}"
    );
    let calls_while_down = server.requests();
    server.set_down(false);

    // The next probe passes, the breaker closes, and every message is
    // handled `ok`.
    let mut ok: HashMap<String, u32> = HashMap::new();
    let mut closed = false;
    let mut after = Vec::new();
    while !(closed && ok.len() == MESSAGES) {
        let event = wait_for_event(&mut events, "the next event", |e| Some(e.clone())).await;
        match &event {
            Event::Handled(events::Handled {
                id,
                verdict: VerdictKind::Ok,
                attempt,
                ..
            }) => _ = ok.insert(id.clone(), *attempt),
            Event::BreakerClosed(events::BreakerClosed { .. }) => closed = true,
            _ => {}
        }
        after.push(event);
    }
    for event in &after {
        if let Event::Hop(hop::Outcome::DeadLetter(hop::DeadLetter { id, reason, .. })) = event {
            panic!("{id} was dead-lettered ({reason})");
        }
    }
    // Each message was tried once from the input while the service was
    // down; the probe that found it still down was tried once more. The
    // messages that reached the breaker while it was open kept their
    // attempts.
    assert_eq!(calls_while_down, MESSAGES as u64 + 1);
    let mut attempts: Vec<u32> = ok.values().copied().collect();
    attempts.sort();
    assert_eq!(attempts.iter().filter(|a| **a == 3).count(), 1, "{ok:?}");
    assert!(attempts.iter().all(|a| *a <= 3), "{ok:?}");
    assert_eq!(records_on(&route.dlq), 0, "nothing was dead-lettered");

    let (t, name) = (hopper.telemetry(), route.name.as_str());
    assert_eq!(count(t, &series::BreakerOpenings { route: name }), 2);
    assert_eq!(count(t, &series::BreakerProbes { route: name }), 2);
    assert_eq!(count(t, &series::BreakerClosings { route: name }), 1);
    assert_eq!(health.breaker(&route.name), Some(BreakerState::Closed));
    let deferred = count(t, &series::BreakerDeferrals { route: name });
    eprintln!(
        "breaker on: {calls_while_down} calls while the service was down, \
         0 of {MESSAGES} dead-lettered, {deferred} sent back to their tier unhandled"
    );
    hopper.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_breaker_the_same_outage_dead_letters_every_message() {
    init_tracing();
    let server = TestServer::start();
    server.set_down(true);
    let route = fetch_route(&server, |r| r, ConfigBuilder::new());
    let hopper = route.start().await;
    assert_eq!(hopper.telemetry().health().breaker(&route.name), None);
    send_messages(&route).await;

    let dead = consume(&route.dlq, MESSAGES, PATIENCE).await;
    for record in &dead {
        let (h, _) = header_map(record);
        assert_eq!(h["hopper-reason"], "RETRIES_EXHAUSTED");
        assert_eq!(h["hopper-attempt"], "3");
    }
    let calls = server.requests();
    assert_eq!(calls, 3 * MESSAGES as u64, "every attempt was spent");
    eprintln!(
        "breaker off: {calls} calls while the service was down, {MESSAGES} of {MESSAGES} dead-lettered"
    );
    hopper.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_pause_input_new_messages_wait_on_the_input_while_the_breaker_is_open() {
    init_tracing();
    let server = TestServer::start();
    server.set_down(true);
    let route = fetch_route(
        &server,
        |r| {
            r.breaker("min_calls", 5)
                .breaker("window", 5)
                .breaker("cool_down", quoted("3s"))
                .breaker("pause_input", true)
        },
        ConfigBuilder::new(),
    );
    let hopper = route.start().await;
    let mut events = hopper.events();
    let producer = producer();
    for i in 0..5 {
        let id = format!("early{i}");
        produce(
            &producer,
            &route.input,
            Some(&id),
            "{}",
            &[("hopper-id", &id)],
        )
        .await;
    }
    wait_for_event(&mut events, "the breaker to open", |e| {
        matches!(e, Event::BreakerOpened(events::BreakerOpened { .. })).then_some(())
    })
    .await;
    // The input is paused at the broker once this is reported: what arrives
    // now waits.
    let input = route.input.clone();
    wait_for_event(&mut events, "the input to be suspended", |e| match e {
        Event::PartitionsSuspended(events::PartitionsSuspended { partitions, .. })
            if partitions.iter().any(|tp| tp.topic == input) =>
        {
            Some(())
        }
        _ => None,
    })
    .await;
    for i in 0..5 {
        let id = format!("late{i}");
        produce(
            &producer,
            &route.input,
            Some(&id),
            "{}",
            &[("hopper-id", &id)],
        )
        .await;
    }
    server.set_down(false);
    let mut open = Vec::new();
    wait_for_event(&mut events, "the breaker to turn half-open", |e| {
        open.push(e.clone());
        matches!(e, Event::BreakerHalfOpen(events::BreakerHalfOpen { .. })).then_some(())
    })
    .await;
    for event in &open {
        if let Event::Handled(events::Handled { id, topic, .. }) = event {
            panic!("{id} was handled from {topic} while the breaker was open");
        }
    }
    assert_eq!(server.requests(), 5, "only the calls that opened it");

    // The probe passes (the service is back), and everything flows: the
    // late messages from the input, the early ones from the tier.
    let mut ok = std::collections::HashSet::new();
    while ok.len() < 10 {
        let id = wait_for_event(&mut events, "the next ok call", |e| match e {
            Event::Handled(events::Handled {
                id,
                verdict: VerdictKind::Ok,
                ..
            }) => Some(id.clone()),
            _ => None,
        })
        .await;
        ok.insert(id);
    }
    assert_eq!(records_on(&route.dlq), 0);
    hopper.stop().await;
}
