//! A handler schedules delayed records under ids it chooses, replaces them
//! and cancels them through `emit` (WIT 0.1.2): what the import accepts and
//! refuses under the route's grants, and the records it puts on the delay
//! relay's inbox (docs/headers.md: key = id, `hopper-id`, and
//! `hopper-replace` or `hopper-cancel`).

use hopper::events::Event;
use hopper::hop;
use hopper::metrics::series;
use hopper::plugin::{Emitted, Verdict};
use hopper::types::EmitKind;
use hopper_tests::*;
use rdkafka::Message;
use serde_json::json;

fn script(steps: serde_json::Value, verdict: &str) -> String {
    json!({"steps": steps, "verdict": verdict}).to_string()
}

fn schedule(id: &str, topic: &str, delay_ms: u64, replace: bool) -> serde_json::Value {
    json!({"schedule": {"id": id, "topic": topic, "payload": format!("due {id}"),
                        "delay_ms": delay_ms, "replace": replace}})
}

/// The `acting` fixture on a route that may emit to `timeouts` and cancel
/// `timeout-*`, with a delay relay of `max_delay = 1h`.
fn granted() -> InProcess {
    InProcess::with_config(
        RouteTable::new(&plugin("acting"))
            .emit_topics(&["timeouts"])
            .cancel_ids(&["timeout-*"]),
        ConfigBuilder::new().delay(DelayTable::default().max_delay("1h")),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_replaces_and_cancels_are_queued_in_order_with_their_ids_as_keys() {
    let acting = granted();
    let steps = json!([
        {"schedule": {"id": "timeout-o-1", "topic": "timeouts", "payload": "o-1",
                      "headers": {"x-order": "o-1"}, "delay_ms": 5000}},
        schedule("timeout-o-1", "timeouts", 9000, true),
        {"cancel": "timeout-o-2"},
    ]);
    let before = now_ms();
    let handled = acting
        .handler
        .run(acting.delivery("m-1", &script(steps, "ok")))
        .await;
    let after = now_ms();
    assert_eq!(handled.verdict, Verdict::Ok);
    let [first, replace, cancel]: [Emitted; 3] = handled.emitted.try_into().unwrap();

    assert_eq!(first.kind, EmitKind::Schedule { replace: false });
    assert_eq!(first.id, "timeout-o-1", "the handler's id, not m-1/emit/0");
    assert_eq!(first.key.as_deref(), Some(&b"timeout-o-1"[..]));
    assert_eq!(first.topic, "timeouts");
    assert_eq!(first.payload.as_deref(), Some(&b"o-1"[..]));
    assert_eq!(first.headers, vec![("x-order".into(), b"o-1".to_vec())]);
    let at = first.deliver_at.unwrap();
    assert!((before + 5000..=after + 5000).contains(&at), "{at}");

    assert_eq!(replace.kind, EmitKind::Schedule { replace: true });
    assert_eq!(replace.key.as_deref(), Some(&b"timeout-o-1"[..]));
    assert!(replace.deliver_at.unwrap() >= before + 9000);

    assert_eq!(cancel.kind, EmitKind::Cancel);
    assert_eq!(cancel.id, "timeout-o-2");
    assert_eq!(cancel.key.as_deref(), Some(&b"timeout-o-2"[..]));
    assert_eq!(cancel.topic, "hopper.delay", "a cancel goes to the inbox");
    assert_eq!(cancel.payload, None);
    assert_eq!(cancel.deliver_at, None);
    assert!(cancel.headers.is_empty());

    // Like any emit, nothing is kept from a call that is not `ok`.
    let steps =
        json!([schedule("timeout-o-3", "timeouts", 5000, false), {"cancel": "timeout-o-3"}]);
    let handled = acting
        .handler
        .run(acting.delivery("m-2", &script(steps, "retry")))
        .await;
    assert!(matches!(handled.verdict, Verdict::Retryable { .. }));
    assert!(handled.emitted.is_empty());
}

/// The hostile cases: every refusal is the import's error, names what is
/// wrong, is counted, and leaves the call going; nothing refused is queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_and_cancels_outside_the_grants_or_limits_are_refused_by_name() {
    let acting = granted();
    // 300 bytes of two-byte characters: any cut in a log line falls on a
    // character boundary or panics.
    let long = "é".repeat(150);
    let long_prefixed = format!("timeout-{}", "x".repeat(292));
    let steps = json!([
        schedule("timeout-o-1", "elsewhere", 5000, false),
        {"cancel": "order-o-1"},
        schedule("order-o-1", "timeouts", 5000, true),
        {"cancel": long},
        {"cancel": long_prefixed},
        schedule(&long, "timeouts", 5000, false),
        {"cancel": ""},
        {"schedule": {"id": "timeout-o-1", "topic": "timeouts", "delay_ms": 5000,
                      "headers": {"Hopper-Target": "orders.retry.5s"}}},
        schedule("timeout-o-1", "timeouts", 2 * 3_600_000, false),
        schedule("order-o-1", "timeouts", 5000, false),
    ]);
    // A call a step: a reason is cut to 1 KiB, and these lines are longer.
    let mut reasons = Vec::new();
    for (i, step) in steps.as_array().unwrap().iter().enumerate() {
        let Verdict::Fatal { reason } = acting
            .handler
            .call(acting.delivery(&format!("m-1-{i}"), &script(json!([step]), "fatal")))
            .await
        else {
            panic!("the script says fatal");
        };
        reasons.push(reason);
    }
    let lines: Vec<&str> = reasons.iter().map(String::as_str).collect();
    assert_eq!(
        lines,
        vec![
            "schedule timeout-o-1 -> error ScheduleError::TopicNotGranted(\"elsewhere\")",
            "cancel order-o-1 -> error ScheduleError::IdNotGranted(\"order-o-1\")",
            "schedule order-o-1 -> error ScheduleError::IdNotGranted(\"order-o-1\")",
            &format!(
                "cancel {long} -> error ScheduleError::Invalid(\"an id must be 1 to 256 bytes, not 300\")"
            ),
            &format!(
                "cancel {long_prefixed} -> error ScheduleError::Invalid(\"an id must be 1 to 256 bytes, not 300\")"
            ),
            &format!(
                "schedule {long} -> error ScheduleError::Invalid(\"an id must be 1 to 256 bytes, not 300\")"
            ),
            "cancel  -> error ScheduleError::Invalid(\"an id must be 1 to 256 bytes, not 0\")",
            "schedule timeout-o-1 -> error ScheduleError::Invalid(\"header `Hopper-Target` starts with `hopper-`, which is hopper's own\")",
            "schedule timeout-o-1 -> error ScheduleError::Invalid(\"a delay of 7200000 ms is longer than the delay relay's max_delay of 1h\")",
            // A plain schedule needs only the topic: the id grant is for
            // cancelling and replacing.
            "schedule order-o-1 -> ok",
        ]
    );
    assert_eq!(
        acting.count(&series::EmittedRecords {
            route: "inproc",
            result: "refused"
        }),
        9
    );

    // Schedules and cancels count against the same limits as `publish`.
    let limited = InProcess::with_config(
        RouteTable::new(&plugin("acting"))
            .emit_topics(&["timeouts"])
            .cancel_ids(&["*"])
            .emit_limits(4, 40),
        ConfigBuilder::new().delay(DelayTable::default()),
    );
    let steps = json!([
        {"emit": {"topic": "timeouts", "payload": "x"}},
        // 2 × 12 bytes of id, 11 of payload: 36 of the 40.
        {"schedule": {"id": "any-id-at-12", "topic": "timeouts", "payload": "x".repeat(11), "delay_ms": 1}},
        {"cancel": "abc"},
        {"cancel": "ab"},
        {"cancel": "a"},
    ]);
    let Verdict::Fatal { reason } = limited
        .handler
        .call(limited.delivery("m-2", &script(steps, "fatal")))
        .await
    else {
        panic!("the script says fatal");
    };
    let lines: Vec<&str> = reason.split(" | ").collect();
    assert_eq!(
        lines,
        vec![
            "emit timeouts -> m-2/emit/0",
            "schedule any-id-at-12 -> ok",
            "cancel abc -> error ScheduleError::TooLarge(40)",
            "cancel ab -> ok",
            "cancel a -> error ScheduleError::TooManyRecords(4)",
        ]
    );

    // No relay: a schedule has nowhere to go, and a route cannot be granted
    // cancels without one (the config refuses `cancel_ids` then).
    let no_relay = InProcess::new(RouteTable::new(&plugin("acting")).emit_topics(&["timeouts"]));
    let steps =
        json!([schedule("timeout-o-1", "timeouts", 5000, false), {"cancel": "timeout-o-1"}]);
    let Verdict::Fatal { reason } = no_relay
        .handler
        .call(no_relay.delivery("m-3", &script(steps, "fatal")))
        .await
    else {
        panic!("the script says fatal");
    };
    assert_eq!(
        reason,
        "schedule timeout-o-1 -> error ScheduleError::NoDelayRelay | cancel timeout-o-1 -> error ScheduleError::IdNotGranted(\"timeout-o-1\")"
    );
}

/// Against the broker: the records a handler's schedule, replace and cancel
/// put on the relay's inbox carry the contract's headers with key = id,
/// records of one id land on one partition, and a schedule reaches its
/// target under its id, no earlier than its time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handlers_schedule_and_cancel_reach_the_inbox_with_the_contracts_headers_and_key() {
    init_tracing();
    let name = rand_name("route");
    let target = rand_name("timeouts");
    let inbox = rand_name("delay");
    let config = ConfigBuilder::new()
        .partitions(4)
        .route(
            RouteTable::named(&name, &plugin("acting"))
                .emit_topics(&[&target])
                .cancel_ids(&["timeout-*"]),
        )
        .delay(DelayTable::named(&inbox).tiers(&["1s"]))
        .write();
    let hopper = config.start().await;
    let mut events = hopper.events();
    let (kept, cancelled) = (rand_name("timeout-kept"), rand_name("timeout-gone"));
    let steps = json!([
        {"schedule": {"id": kept, "topic": target, "payload": "o-1",
                      "headers": {"x-order": "o-1"}, "delay_ms": 1500, "replace": true}},
        schedule(&cancelled, &target, 60_000, false),
        {"cancel": cancelled},
    ]);
    let before = now_ms();
    produce(
        &producer(),
        &format!("{name}.in"),
        None,
        &script(steps, "ok"),
        &[("hopper-id", "m-1")],
    )
    .await;

    let on_inbox = consume(&inbox, 3, PATIENCE).await;
    let find = |id: &str, header: &str| {
        on_inbox
            .iter()
            .find(|r| {
                let (h, _) = header_map(r);
                h.get("hopper-id").map(String::as_str) == Some(id) && h.contains_key(header)
            })
            .unwrap_or_else(|| panic!("no record of {id} with {header} on the inbox"))
    };
    let schedule = find(&kept, "hopper-target");
    assert_eq!(schedule.key(), Some(kept.as_bytes()));
    assert_eq!(schedule.payload(), Some(&b"o-1"[..]));
    let (h, counts) = header_map(schedule);
    assert_eq!(h["hopper-target"], target);
    assert_eq!(h["hopper-replace"], "true");
    assert_eq!(h["x-order"], "o-1");
    assert_eq!(h["hopper-route"], name);
    let at: i64 = h["hopper-deliver-at"].parse().unwrap();
    assert!(at >= before + 1500, "{at}");
    assert!(!h.contains_key("hopper-cancel") && !h.contains_key("hopper-delay"));
    assert!(counts.values().all(|n| *n == 1), "{counts:?}");

    let cancel = find(&cancelled, "hopper-cancel");
    assert_eq!(cancel.key(), Some(cancelled.as_bytes()));
    assert_eq!(cancel.payload(), None);
    let (h, counts) = header_map(cancel);
    assert_eq!(h["hopper-cancel"], "true");
    for absent in [
        "hopper-target",
        "hopper-deliver-at",
        "hopper-delay",
        "hopper-replace",
    ] {
        assert!(!h.contains_key(absent), "{absent} on a cancel: {h:?}");
    }
    assert!(counts.values().all(|n| *n == 1), "{counts:?}");
    let scheduled = find(&cancelled, "hopper-target");
    assert_eq!(
        scheduled.partition(),
        cancel.partition(),
        "one id, one partition"
    );
    assert!(
        scheduled.offset() < cancel.offset(),
        "the cancel after its schedule, as emitted"
    );

    // The events say which import produced what.
    let mut kinds = Vec::new();
    while kinds.len() < 3 {
        kinds.push(
            wait_for_event(&mut events, "the next emitted record", |e| match e {
                Event::Hop(hop::Outcome::Emit(hop::Emit { id, kind, .. })) => {
                    Some((id.clone(), *kind))
                }
                _ => None,
            })
            .await,
        );
    }
    kinds.sort_by_key(|(_, kind)| kind.as_str());
    assert_eq!(
        kinds,
        vec![
            (cancelled.clone(), EmitKind::Cancel),
            (kept.clone(), EmitKind::Schedule { replace: true }),
            (cancelled.clone(), EmitKind::Schedule { replace: false }),
        ]
    );

    let delivered = consume(&target, 1, PATIENCE).await;
    assert_eq!(delivered[0].key(), Some(kept.as_bytes()));
    assert_eq!(header_map(&delivered[0]).0["hopper-id"], kept);
    let arrived = delivered[0].timestamp().to_millis().unwrap();
    assert!(arrived >= at, "delivered {} ms early", at - arrived);
    hopper.stop().await;
}

/// Issue 20: a handler schedules a delayed record, and a later call — the
/// payment that makes an order's timeout pointless — cancels it through
/// emit. The target never receives it, watched until its deliver-at plus
/// 5 s; a schedule made the same way and not cancelled, due after it,
/// arrives, so the watch would have seen the cancelled one had it come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_cancelled_by_a_later_call_never_reaches_its_target() {
    init_tracing();
    let name = rand_name("route");
    let target = rand_name("timeouts");
    let inbox = rand_name("delay");
    let config = ConfigBuilder::new()
        .route(
            RouteTable::named(&name, &plugin("acting"))
                .emit_topics(&[&target])
                .cancel_ids(&["timeout-*"]),
        )
        .delay(DelayTable::named(&inbox).tiers(&["1s"]))
        .write();
    let hopper = config.start().await;
    let (gone, kept) = (rand_name("timeout-gone"), rand_name("timeout-kept"));
    let producer = producer();
    // One key, so the three calls run in this order; each is a call of its
    // own, as the order-created and the payment handlers' are.
    for (message, step) in [
        ("created-1", schedule(&gone, &target, 2000, false)),
        ("paid-1", json!({"cancel": gone})),
        ("created-2", schedule(&kept, &target, 2000, false)),
    ] {
        produce(
            &producer,
            &format!("{name}.in"),
            Some("orders"),
            &script(json!([step]), "ok"),
            &[("hopper-id", message)],
        )
        .await;
    }
    let scheduled = consume_until(&inbox, PATIENCE, |r| {
        let (h, _) = header_map(r);
        h.get("hopper-id") == Some(&gone) && h.contains_key("hopper-deliver-at")
    })
    .await;
    let due: i64 = header_map(&scheduled).0["hopper-deliver-at"]
        .parse()
        .unwrap();

    let delivered = consume(&target, 1, PATIENCE).await;
    assert_eq!(
        delivered[0].key(),
        Some(kept.as_bytes()),
        "the uncancelled one"
    );
    let watch_until = due + 5_000;
    let wait = std::time::Duration::from_millis((watch_until - now_ms()).max(0) as u64);
    let consumer = reader(&target);
    let deadline = tokio::time::Instant::now() + wait;
    let mut seen = Vec::new();
    while let Ok(Ok(m)) = tokio::time::timeout_at(deadline, consumer.recv()).await {
        seen.push(header_map(&m.detach()).0["hopper-id"].clone());
    }
    assert!(now_ms() >= watch_until);
    assert_eq!(seen, vec![kept], "only the uncancelled schedule arrives");
    hopper.stop().await;
}
