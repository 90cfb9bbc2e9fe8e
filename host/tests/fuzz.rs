//! Every function of a header value, fed hostile headers: none may panic
//! (this crate's tests build with overflow checks on), and each keeps the
//! bound its callers rely on.
//!
//! A plain `cargo test` runs a few thousand cases per target;
//! `cargo xtask fuzz` runs a million (`PROPTEST_CASES=1000000`). The
//! targets of a guest's text (a reason cut and redacted, a log line
//! escaped) need the library's private parts, and live in `fuzz` modules of
//! `config/secrets.rs` and `trace/logs.rs`; `cargo xtask fuzz` runs them too.

use hopper::config::{ConfigFile, Route};
use hopper::delay::{
    CEILING_ROOM, CancelTable, Intent, Step, cancelled_id, entry_key_partition, parse_instant,
    parse_intent, parse_schedule, step,
};
use hopper::dlq::{self, DlqRecord, DlqSummary, Plan};
use hopper::events::Telemetry;
use hopper::headers::{self, Envelope, Hop, Incoming, Reason};
use hopper::hold::{MAX_CLOCK_SKEW, due_from};
use hopper::plugin::Verdict;
use hopper::retry::{Decision, decide};
use hopper::traceparent;
use hopper::types::{CancelKind, InboxPosition};
use proptest::prelude::*;
use proptest::test_runner::Config;
use rdkafka::Timestamp;
use rdkafka::message::{Header, OwnedHeaders, OwnedMessage};
use std::sync::OnceLock;
use std::time::Duration;

/// `PROPTEST_CASES` when set, else enough to run in seconds.
fn config() -> Config {
    let mut config = Config::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = 3_000;
    }
    config.failure_persistence = None;
    config
}

/// Every header hopper reads, and one it does not.
const NAMES: [&str; 24] = [
    traceparent::TRACEPARENT,
    traceparent::TRACESTATE,
    "TraceParent",
    headers::ID,
    headers::ATTEMPT,
    headers::ROUTE,
    headers::ORIGIN_TOPIC,
    headers::ORIGIN_PARTITION,
    headers::ORIGIN_OFFSET,
    headers::ORIGIN_TIMESTAMP,
    headers::FIRST_FAILURE_AT,
    headers::LAST_FAILURE_AT,
    headers::LAST_ERROR,
    headers::REASON,
    headers::HANDLER,
    headers::HANDLER_VERSION,
    headers::TRAIL,
    headers::DUE_AT,
    headers::TARGET,
    headers::DELIVER_AT,
    headers::DELAY,
    headers::REPLAY_COUNT,
    headers::REPLAYED_FROM,
    "x-trace",
];

/// Values at and past every edge a header number has.
const EDGES: [&str; 24] = [
    "",
    " ",
    "0",
    "-0",
    "+1",
    "-1",
    "4294967295",
    "4294967296",
    "2147483647",
    "-2147483648",
    "9223372036854775807",
    "-9223372036854775808",
    "9223372036854775808",
    "18446744073709551615",
    "99999999999999999999999999",
    "1970-01-01T00:00:00Z",
    "9999-12-31T23:59:59Z",
    "0000-01-01T00:00:00Z",
    "+18446744073709551615,+1",
    "+9223372036854775807,+9223372036854775807,retry.5s",
    "584542046y",
    "18446744073709551615s",
    "5s",
    "orders",
];

fn text(max: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(any::<char>(), 0..max).prop_map(|c| c.into_iter().collect())
}

fn value() -> impl Strategy<Value = Option<Vec<u8>>> {
    prop_oneof![
        1 => Just(None),
        4 => prop::sample::select(EDGES.to_vec()).prop_map(|v| Some(v.as_bytes().to_vec())),
        3 => any::<i64>().prop_map(|n| Some(n.to_string().into_bytes())),
        2 => any::<u64>().prop_map(|n| Some(n.to_string().into_bytes())),
        2 => any::<u32>().prop_map(|n| Some(n.to_string().into_bytes())),
        2 => prop::collection::vec(any::<u8>(), 0..24).prop_map(Some),
        2 => text(24).prop_map(|t| Some(t.into_bytes())),
        2 => traceparent_like().prop_map(Some),
        2 => prop::collection::vec(
            prop_oneof![
                any::<u64>().prop_map(|n| format!("+{n}")),
                prop::sample::select(vec!["retry.5s", "dlq", "replay", "+", "+x"])
                    .prop_map(str::to_string),
            ],
            0..16,
        )
        .prop_map(|hops| Some(hops.join(",").into_bytes())),
    ]
}

/// A valid `traceparent`, then bytes replaced, the value cut or extended:
/// every edge of the strict reading (length, version, separators, case,
/// all-zero ids).
fn traceparent_like() -> impl Strategy<Value = Vec<u8>> {
    const VALID: &[u8] = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const ZERO: &[u8] = b"00-00000000000000000000000000000000-0000000000000000-00";
    let bytes = prop_oneof![
        3 => prop::sample::select(b"0123456789abcdefABCDEF-fg \xff".to_vec()),
        1 => any::<u8>(),
    ];
    (
        prop::sample::select(vec![VALID, ZERO]),
        prop::collection::vec((0usize..60, bytes), 0..4),
        prop::option::of(0usize..70),
        prop::collection::vec(any::<u8>(), 0..3),
    )
        .prop_map(|(base, edits, cut, tail)| {
            let mut value = base.to_vec();
            for (at, byte) in edits {
                if let Some(b) = value.get_mut(at) {
                    *b = byte;
                }
            }
            if let Some(cut) = cut {
                value.truncate(cut);
            }
            value.extend(tail);
            value
        })
}

/// The headers of an inbox record that may be a cancel or a replace: the
/// flags with their edge spellings, an id, and the scheduling headers a
/// cancel must not carry.
fn cancel_headers() -> impl Strategy<Value = Vec<(String, Option<Vec<u8>>)>> {
    let names = vec![
        headers::CANCEL,
        headers::REPLACE,
        headers::ID,
        headers::TARGET,
        headers::DELIVER_AT,
        headers::DELAY,
    ];
    let flags = vec![
        "true", "false", "", "TRUE", "True", "1", "yes", " true", "o-1",
    ];
    prop::collection::vec(
        (
            prop::sample::select(names).prop_map(str::to_string),
            prop_oneof![
                3 => prop::sample::select(flags).prop_map(|v| Some(v.as_bytes().to_vec())),
                1 => value(),
                1 => prop::collection::vec(any::<u8>(), 250..300).prop_map(Some),
            ],
        ),
        0..6,
    )
}

/// A key: the ids the flags above use, any bytes, or none.
fn key() -> impl Strategy<Value = Option<Vec<u8>>> {
    prop_oneof![
        1 => Just(None),
        3 => prop::sample::select(vec!["o-1", "true", "", "0:o-1"]).prop_map(|k| Some(k.as_bytes().to_vec())),
        2 => prop::collection::vec(any::<u8>(), 0..24).prop_map(Some),
    ]
}

/// A cancellation-topic record: a key `<partition>:<id>` or not, a value
/// `<partition>:<offset>` or not (or a tombstone), a kind header, and a
/// record time (0: now).
type CancelEntry = (Option<Vec<u8>>, Option<Vec<u8>>, Option<Vec<u8>>, i64);

fn cancel_entry() -> impl Strategy<Value = CancelEntry> {
    let id = prop::sample::select(vec!["a", "b", "inv-42", "x:y", ""]);
    let key = prop_oneof![
        4 => (0i32..3, id.clone()).prop_map(|(p, id)| Some(format!("{p}:{id}").into_bytes())),
        1 => prop::sample::select(vec!["a", "-1:a", "2147483648:a", "01:a", ":a"]).prop_map(|k| Some(k.as_bytes().to_vec())),
        1 => prop::collection::vec(any::<u8>(), 0..12).prop_map(Some),
        1 => Just(None),
    ];
    let value = prop_oneof![
        4 => (0i32..3, 0i64..20).prop_map(|(p, o)| Some(format!("{p}:{o}").into_bytes())),
        1 => prop::sample::select(EDGES.to_vec()).prop_map(|v| Some(v.as_bytes().to_vec())),
        1 => prop::sample::select(vec!["0:-1", "-1:5", "0:9223372036854775807", "2147483647:0", "0:", ":0"]).prop_map(|v| Some(v.as_bytes().to_vec())),
        1 => Just(None),
    ];
    let kind = prop_oneof![
        4 => prop::sample::select(vec!["cancel", "replace"]).prop_map(|k| Some(k.as_bytes().to_vec())),
        1 => prop::collection::vec(any::<u8>(), 0..8).prop_map(Some),
        1 => Just(None),
    ];
    // Record times around now, so entries are kept, and far from it.
    let time = prop_oneof![
        4 => Just(0i64),
        1 => any::<i64>(),
    ];
    (key, value, kind, time)
}

fn headers() -> impl Strategy<Value = Vec<(String, Option<Vec<u8>>)>> {
    prop::collection::vec(
        (
            prop_oneof![
                9 => prop::sample::select(NAMES.to_vec()).prop_map(str::to_string),
                1 => text(12),
            ],
            value(),
        ),
        0..14,
    )
}

fn owned(pairs: &[(String, Option<Vec<u8>>)]) -> OwnedHeaders {
    let mut out = OwnedHeaders::new();
    for (key, value) in pairs {
        out = out.insert(Header {
            key: key.as_str(),
            value: value.as_deref(),
        });
    }
    out
}

fn message(pairs: &[(String, Option<Vec<u8>>)], offset: i64, timestamp: i64) -> OwnedMessage {
    OwnedMessage::new(
        Some(b"payload".to_vec()),
        Some(b"key".to_vec()),
        "orders".to_string(),
        Timestamp::CreateTime(timestamp),
        0,
        offset,
        Some(owned(pairs)),
    )
}

/// Routes with a short ladder, the default one, and one attempt only.
fn routes() -> &'static [Route] {
    static ROUTES: OnceLock<Vec<Route>> = OnceLock::new();
    ROUTES.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap().keep();
        std::fs::write(dir.join("h.wasm"), b"").unwrap();
        let file = ConfigFile::parse(
            "[[route]]\nname = \"a\"\ntopics = [\"a\"]\nhandler = \"h.wasm\"\nretry = [\"1s\", \"30s\"]\nmax_attempts = 4\n\
             [[route]]\nname = \"b\"\ntopics = [\"b\"]\nhandler = \"h.wasm\"\n\
             [[route]]\nname = \"c\"\ntopics = [\"c\"]\nhandler = \"h.wasm\"\nmax_attempts = 1\n",
        )
        .unwrap();
        file.resolve(&dir).unwrap().routes
    })
}

fn verdict() -> impl Strategy<Value = Verdict> {
    prop_oneof![
        Just(Verdict::Ok),
        (text(8), prop::option::of(any::<u64>())).prop_map(|(reason, ms)| Verdict::Retryable {
            reason,
            retry_after: ms.map(Duration::from_millis),
        }),
        (
            text(8),
            prop::option::of((any::<u64>(), 0u32..1_000_000_000))
        )
            .prop_map(|(reason, at)| Verdict::Retryable {
                reason,
                retry_after: at.map(|(s, n)| Duration::new(s, n)),
            }),
        text(8).prop_map(|reason| Verdict::Fatal { reason }),
        (prop::sample::select(Reason::ALL.to_vec()), text(8))
            .prop_map(|(class, error)| Verdict::Failed { class, error }),
    ]
}

/// Plans both next hops of an envelope read from a record, as a route does.
fn plan_hops(message: &OwnedMessage, envelope: &Envelope, route: &Route, verdict: &Verdict) {
    let attempt = envelope
        .attempts_made
        .checked_add(1)
        .expect("an envelope read from a record has a next attempt");
    match decide(route, attempt, verdict) {
        Decision::Commit => {}
        Decision::Retry { delay, .. } => {
            let entry = Decision::retry_trail_entry(delay);
            let out = headers::next_hop_headers(
                rdkafka::message::Message::headers(message),
                envelope,
                &Hop {
                    route: &route.name,
                    attempts_made: attempt,
                    reason: Some(Reason::Retryable),
                    error: Some("e"),
                    failed_at: Some(1),
                    handler: Some(("h", "v")),
                    trail_entry: &entry,
                    due_at: Some(2),
                    keep: &[],
                },
            );
            let trail = header_text(&out, headers::TRAIL);
            assert!(
                trail.split(',').count() <= headers::MAX_TRAIL_HOPS,
                "{trail}"
            );
            one_traceparent(&out, envelope);
        }
        Decision::DeadLetter { reason, error } => {
            let hop = dlq::plan(
                message,
                Plan {
                    topic: &route.dlq,
                    route: &route.name,
                    envelope,
                    attempts_made: attempt,
                    reason,
                    error: &error,
                    handler: None,
                    keep: &[headers::TARGET],
                },
            );
            one_traceparent(&hop.record.headers, envelope);
        }
    }
}

/// A hop record carries exactly one `traceparent` in any spelling: this
/// hop's, in the envelope's trace.
fn one_traceparent(out: &OwnedHeaders, envelope: &Envelope) {
    use rdkafka::message::Headers;
    let values: Vec<_> = out
        .iter()
        .filter(|h| h.key.eq_ignore_ascii_case(traceparent::TRACEPARENT))
        .collect();
    assert_eq!(values.len(), 1, "{:?}", values.len());
    let written =
        traceparent::parse_traceparent(values[0].value.unwrap()).expect("a valid traceparent");
    assert_eq!(written.trace_id, envelope.trace.trace_id);
    assert_eq!(written.span_id, envelope.trace.span_id);
}

fn header_text(h: &OwnedHeaders, name: &str) -> String {
    use rdkafka::message::Headers;
    h.iter()
        .filter(|h| h.key == name)
        .last()
        .and_then(|h| h.value)
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .unwrap_or_default()
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn input_envelopes(pairs in headers(), offset in any::<i64>(), ts in any::<i64>(), verdict in verdict(), r in 0usize..3) {
        let message = message(&pairs, offset, ts);
        let h = owned(&pairs);
        let incoming = Incoming { topic: "orders", partition: 0, offset, timestamp: Some(ts), headers: Some(&h) };
        if let Ok(envelope) = Envelope::from_input(&incoming) {
            prop_assert_eq!(envelope.attempts_made, 0);
            plan_hops(&message, &envelope, &routes()[r], &verdict);
        }
    }

    #[test]
    fn tier_envelopes(pairs in headers(), verdict in verdict(), r in 0usize..3) {
        let message = message(&pairs, 7, 1);
        let h = owned(&pairs);
        let incoming = Incoming { topic: "a.retry.1s", partition: 0, offset: 7, timestamp: Some(1), headers: Some(&h) };
        match Envelope::from_tier(&incoming) {
            Ok(envelope) => plan_hops(&message, &envelope, &routes()[r], &verdict),
            Err(e) => prop_assert!(e.to_string().starts_with("header hopper-"), "{}", e),
        }
    }

    #[test]
    fn tier_envelopes_with_every_field(attempt in value(), trail in value(), verdict in verdict(), r in 0usize..3) {
        let mut pairs: Vec<(String, Option<Vec<u8>>)> = [
            (headers::ID, "m-1"), (headers::ORIGIN_TOPIC, "orders"),
            (headers::ORIGIN_PARTITION, "0"), (headers::ORIGIN_OFFSET, "9"),
        ].iter().map(|(k, v)| (k.to_string(), Some(v.as_bytes().to_vec()))).collect();
        pairs.push((headers::ATTEMPT.to_string(), attempt));
        pairs.push((headers::TRAIL.to_string(), trail));
        let message = message(&pairs, 7, 1);
        let h = owned(&pairs);
        let incoming = Incoming { topic: "a.retry.1s", partition: 0, offset: 7, timestamp: Some(1), headers: Some(&h) };
        if let Ok(envelope) = Envelope::from_tier(&incoming) {
            prop_assert!(envelope.attempts_made < u32::MAX);
            plan_hops(&message, &envelope, &routes()[r], &verdict);
        }
    }

    /// Malformed trace context starts a new trace; nothing panics, and what
    /// hopper writes is always a valid `traceparent`.
    #[test]
    fn traceparents(value in prop_oneof![traceparent_like(), prop::collection::vec(any::<u8>(), 0..80)]) {
        let parsed = traceparent::parse_traceparent(&value);
        if let Some(parent) = parsed {
            prop_assert_eq!(value.len() >= traceparent::TRACEPARENT_LEN, true);
            prop_assert!(value[..55].iter().all(|b| !b.is_ascii_uppercase()));
            prop_assert_ne!(&value[..2], b"ff");
            prop_assert_ne!(parent.trace_id.0, [0; 16]);
            prop_assert_ne!(parent.span_id.0, [0; 8]);
        }
        let h = OwnedHeaders::new().insert(Header { key: traceparent::TRACEPARENT, value: Some(&value) });
        let hop = traceparent::Context::continue_from(Some(&h));
        prop_assert_eq!(hop.continued(), parsed.is_some());
        if let Some(parent) = parsed {
            prop_assert_eq!(hop.trace_id, parent.trace_id);
        }
        let written = traceparent::parse_traceparent(&hop.traceparent());
        prop_assert_eq!(written.map(|w| (w.trace_id, w.span_id)), Some((hop.trace_id, hop.span_id)));
    }

    #[test]
    fn schedules(pairs in headers(), reference in any::<i64>(), now in any::<i64>(), max_ms in any::<u64>()) {
        let h = owned(&pairs);
        let max_delay = Duration::from_millis(max_ms);
        if let Ok(s) = parse_schedule(Some(&h), "d".into(), reference, now, max_delay) {
            prop_assert!(s.deliver_at >= 0);
            let remaining = s.deliver_at.checked_sub(now);
            prop_assert!(remaining.is_some());
            prop_assert!(remaining.unwrap() as i128 <= max_ms as i128);
            let tiers = [Duration::from_secs(1), Duration::from_secs(30), Duration::from_secs(86_400)];
            if let Step::Tier(t) = step(remaining.unwrap(), &tiers) {
                prop_assert!((t.as_millis() as i64) < remaining.unwrap());
            }
        }
    }

    /// What an inbox record asks for, and the id a cancel or replace names,
    /// from any headers and any key: an id accepted is 1 to 256 bytes and is
    /// the key, byte for byte.
    #[test]
    fn cancel_records(pairs in cancel_headers(), key in key()) {
        let h = owned(&pairs);
        let kind = match parse_intent(Some(&h)) {
            Ok(Intent::Cancel) => Some(CancelKind::Cancel),
            Ok(Intent::Schedule { replace: true }) => Some(CancelKind::Replace),
            Ok(Intent::Schedule { replace: false }) => None,
            Err(e) => {
                prop_assert!(e.error.contains("hopper-"), "{}", e.error);
                None
            }
        };
        if let Some(kind) = kind
            && let Ok(id) = cancelled_id(Some(&h), key.as_deref(), kind)
        {
            prop_assert_eq!(Some(id.as_bytes()), key.as_deref());
            prop_assert!(!id.is_empty() && id.len() <= headers::MAX_ID_BYTES);
        }
    }

    /// Any records of the cancellation topic applied to a bounded table:
    /// it never holds more than its ceiling, and a schedule is covered only
    /// by an entry of its own partition read after it; sweeps at any time.
    #[test]
    fn cancel_entries(
        records in prop::collection::vec(cancel_entry(), 0..40),
        probes in prop::collection::vec((0i32..3, 0i64..20, prop::sample::select(vec!["a", "b", "inv-42", "x:y"])), 0..10),
        sweep_at in any::<i64>(),
    ) {
        let max = 2;
        let table = CancelTable::new("c", Duration::from_secs(60), Telemetry::new()).bounded(max);
        let now = hopper::clock::now_ms();
        for (n, (key, value, kind, time)) in records.into_iter().enumerate() {
            let mut h = OwnedHeaders::new();
            if let Some(kind) = &kind {
                h = h.insert(Header { key: headers::CANCEL_KIND, value: Some(kind) });
            }
            let time = if time == 0 { now } else { time };
            let record = OwnedMessage::new(
                value, key, "c".into(), Timestamp::CreateTime(time), 0, n as i64, Some(h),
            );
            table.apply(&record);
            prop_assert!(table.len() <= max + CEILING_ROOM);
        }
        for (partition, offset, id) in probes {
            let at = InboxPosition { partition, offset };
            let views = table.get(id.as_bytes());
            let covered = table.covering(id, at).is_some();
            let expected = views.iter().any(|v| v.partition == partition && offset < v.offset);
            prop_assert_eq!(covered, expected, "{} at {:?}: {:?}", id, at, views);
            for view in views {
                let key = format!("{}:{id}", view.partition);
                prop_assert_eq!(entry_key_partition(key.as_bytes()), Some((view.partition, id.as_bytes())));
            }
        }
        table.sweep(sweep_at);
        prop_assert!(table.len() <= max + CEILING_ROOM);
    }

    #[test]
    fn instants(text in prop_oneof![prop::sample::select(EDGES.to_vec()).prop_map(str::to_string), text(32), any::<i64>().prop_map(|n| n.to_string())]) {
        if let Ok(ms) = parse_instant(&text) {
            prop_assert!(ms >= 0);
        }
    }

    #[test]
    fn due_times(header in value(), ts in prop::option::of(any::<i64>()), wait_ms in any::<u64>(), now in any::<i64>()) {
        let header = header.as_deref().and_then(|v| std::str::from_utf8(v).ok());
        let wait = Duration::from_millis(wait_ms);
        let due = due_from(header, ts, wait, now);
        let latest = now
            .saturating_add(i64::try_from(wait_ms).unwrap_or(i64::MAX))
            .saturating_add(MAX_CLOCK_SKEW.as_millis() as i64);
        prop_assert!(due <= latest, "due {} past {}", due, latest);
    }

    #[test]
    fn decisions(attempt in any::<u32>(), verdict in verdict(), r in 0usize..3) {
        let route = &routes()[r];
        if let Decision::Retry { topic, delay, .. } = decide(route, attempt, &verdict) {
            prop_assert!(attempt < route.max_attempts);
            prop_assert_eq!(topic, route.tier_topic(delay));
        }
    }

    #[test]
    fn trails(trail in prop::collection::vec(prop_oneof![
        any::<u64>().prop_map(|n| format!("+{n}")),
        text(6),
    ], 0..40)) {
        let out = headers::trail_text(&trail, "dlq");
        let expected = folded_trail(&trail, "dlq");
        prop_assert!(expected.len() <= headers::MAX_TRAIL_HOPS);
        prop_assert_eq!(expected.last().map(String::as_str), Some("dlq"));
        prop_assert_eq!(out, expected.join(","));
    }

    #[test]
    fn dead_letter_records(
        pairs in headers(), attempts in any::<u32>(), replays in any::<u32>(),
        partition in any::<i32>(), offset in any::<i64>(), ts in prop::option::of(any::<i64>()),
        first in prop::option::of(any::<i64>()), error in text(2_000),
    ) {
        let message = message(&pairs, offset, ts.unwrap_or(-1));
        let envelope = Envelope {
            id: "m".into(),
            attempts_made: attempts,
            origin: headers::Origin { topic: "o".into(), partition, offset, timestamp: ts },
            first_failure_at: first,
            trail: vec!["+18446744073709551615".into(), "+1".into()],
            replays,
            trace: traceparent::Context::continue_from(rdkafka::message::Message::headers(&message)),
        };
        let hop = dlq::plan(&message, Plan {
            topic: "orders.dlq", route: "orders", envelope: &envelope, attempts_made: attempts,
            reason: Reason::InvalidEnvelope, error: &error, handler: None, keep: &[headers::DELIVER_AT],
        });
        prop_assert!(header_text(&hop.record.headers, headers::LAST_ERROR).len() <= headers::MAX_ERROR_BYTES);
        // Read back as an operator sees it.
        let written = OwnedMessage::new(None, None, "orders.dlq".into(), Timestamp::CreateTime(1), 0, 0, Some(hop.record.headers));
        DlqRecord::of(&written, u32::MAX);
        DlqSummary::of(&message, 0);
        let _ = dlq::record::envelope_of(&message);
    }
}

/// The trail `headers::trail_text` writes, entry by entry, built the plain
/// way: every `+N` summed, the hop appended, the oldest hops folded into the
/// count until the trail fits.
fn folded_trail(trail: &[String], hop: &str) -> Vec<String> {
    let mut folded: u64 = 0;
    let mut hops = Vec::new();
    for entry in trail {
        match entry.strip_prefix('+').and_then(|n| n.parse::<u64>().ok()) {
            Some(n) => folded = folded.saturating_add(n),
            None => hops.push(entry.clone()),
        }
    }
    hops.push(hop.to_string());
    let keep = headers::MAX_TRAIL_HOPS - 1;
    if hops.len() > keep {
        let excess = hops.len() - keep;
        folded = folded.saturating_add(excess as u64);
        hops.drain(..excess);
    }
    let mut out = Vec::new();
    if folded > 0 {
        out.push(format!("+{folded}"));
    }
    out.extend(hops);
    out
}
