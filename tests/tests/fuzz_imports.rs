//! Every host import, fed whatever a guest can pass it: no value may panic
//! the host. The `imports` fixture passes each generated value unchanged to
//! one import and then returns `ok`, so any other verdict is the host's
//! doing: a panic in a host function becomes a HANDLER_TRAP verdict
//! (`plugin/handler.rs`), which these targets would report.
//!
//! A plain `cargo test` runs 3,000 cases per import; `cargo xtask fuzz`
//! runs a million (`PROPTEST_CASES=1000000`).

use hopper::headers::Reason;
use hopper::plugin::{Answer, Delivery, Handler, Runtime, Verdict};
use hopper_tests::{ConfigBuilder, DelayTable, RouteTable, cache_dir, plugin};
use proptest::prelude::*;
use proptest::test_runner::Config;
use serde_json::{Value, json};
use std::sync::OnceLock;

/// `PROPTEST_CASES` when set, else enough to run in seconds.
fn config() -> Config {
    let mut config = Config::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = 3_000;
    }
    config.failure_persistence = None;
    config
}

/// The topic the route grants for emits.
const GRANTED: &str = "fuzz.granted";
/// The prefix of the ids the route grants for cancels and replaces.
const CANCELLABLE: &str = "fuzz-";

/// One runtime and one handler for every case: a route that grants an emit
/// topic, cancels of the ids starting `fuzz-`, the delay relay, a secret, config values and one loopback origin
/// where nothing listens.
fn fixture() -> &'static (tokio::runtime::Runtime, Handler) {
    static FIXTURE: OnceLock<(tokio::runtime::Runtime, Handler)> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let tokio = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap().keep();
        let secret = dir.join("token");
        std::fs::write(&secret, "s3cr+t/=\nline two\n").unwrap();
        let nowhere = nowhere();
        // A route that may call, emit, schedule and cancel, beside a relay.
        let route = ConfigBuilder::new()
            .without_kafka()
            .route(
                RouteTable::named("direct", &plugin("imports"))
                    .timeout("5s")
                    .memory_mib(64)
                    .allowed_hosts(&[format!("http://{nowhere}")])
                    .emit_topics(&[GRANTED])
                    .cancel_ids(&[format!("{CANCELLABLE}*")])
                    .config("k", "v")
                    .config("é", "ü")
                    .secret("token", format!("file:{}", secret.display())),
            )
            .delay(DelayTable::default())
            .write()
            .load()
            .routes
            .remove(0);
        let handler = tokio.block_on(async {
            Runtime::new(64 << 20)
                .unwrap()
                .with_cache(cache_dir())
                .unwrap()
                .load(&plugin("imports"), &route)
                .unwrap()
        });
        (tokio, handler)
    })
}

/// A loopback address where nothing listens, the one origin the route
/// grants: the same for every case.
fn nowhere() -> std::net::SocketAddr {
    static NOWHERE: OnceLock<std::net::SocketAddr> = OnceLock::new();
    *NOWHERE.get_or_init(|| {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    })
}

/// Runs one call and returns its verdict.
fn call(call: Value) -> Verdict {
    run(call).verdict
}

/// Runs one call.
fn run(call: Value) -> Answer {
    let (tokio, handler) = fixture();
    let delivery = Delivery {
        id: "fuzz-1".into(),
        topic: "direct.in".into(),
        partition: 0,
        offset: 0,
        key: None,
        payload: Some(call.to_string().into_bytes()),
        headers: Vec::new(),
        timestamp: None,
        attempt: 1,
        route: "direct".into(),
    };
    tokio.block_on(handler.run(delivery))
}

/// Any string, with the edges a host function might cut wrongly more often
/// than chance would give them: multi-byte characters at byte 7 (the width
/// of `hopper-`), hopper's prefix, NULs, and long ones.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        40 => any::<String>(),
        10 => "[a-z]{0,8}[é€😀][a-z]{0,8}",
        10 => "(?i:hopper-)[a-z]{0,4}",
        10 => Just("abcdefé".to_string()),
        10 => "\\PC{0,3}\\x00\\PC{0,3}",
        1 => proptest::collection::vec(any::<char>(), 0..70_000)
            .prop_map(|c| c.into_iter().collect()),
    ]
}

/// Any bytes, as the fixture reads them: lowercase hex.
fn bytes() -> impl Strategy<Value = String> {
    prop_oneof![
        40 => proptest::collection::vec(any::<u8>(), 0..64),
        1 => proptest::collection::vec(any::<u8>(), 0..70_000),
    ]
    .prop_map(hex::encode)
}

/// An id for a schedule or a cancel: any string, one the route grants,
/// one just past the longest id (257 bytes), and none at all.
fn ids() -> impl Strategy<Value = String> {
    prop_oneof![
        10 => text(),
        10 => text().prop_map(|t| format!("{CANCELLABLE}{t}")),
        2 => "[a-z]{251,252}".prop_map(|t| format!("{CANCELLABLE}{t}")),
        1 => Just(String::new()),
    ]
}

fn headers() -> impl Strategy<Value = Vec<(String, String)>> {
    proptest::collection::vec((text(), bytes()), 0..6)
}

fn ok(verdict: Verdict, what: &str) -> Result<(), TestCaseError> {
    prop_assert_eq!(verdict, Verdict::Ok, "{}", what);
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn log_takes_any_level_and_message(level in any::<u8>(), message in text()) {
        ok(call(json!({"log": {"level": level, "message": message}})), "log")?;
    }

    #[test]
    fn config_takes_any_key(key in text()) {
        ok(call(json!({"config_get": key})), "config.get")?;
        ok(call(json!({"config_entries": null})), "config.entries")?;
    }

    #[test]
    fn secrets_take_any_name(name in prop_oneof![text(), Just("token".to_string())]) {
        ok(call(json!({"secret": name})), "secrets.get")?;
    }

    #[test]
    fn emit_takes_any_record(
        topic in prop_oneof![text(), Just(GRANTED.to_string())],
        key in proptest::option::of(bytes()),
        payload in proptest::option::of(bytes()),
        headers in headers(),
        delay_ms in proptest::option::of(prop_oneof![any::<u64>(), Just(u64::MAX), 0..10_000u64]),
    ) {
        ok(call(json!({"emit": {
            "topic": topic, "key": key, "payload": payload,
            "headers": headers, "delay_ms": delay_ms,
        }})), "emit.publish")?;
    }

    #[test]
    fn schedule_takes_any_record(
        id in ids(),
        topic in prop_oneof![text(), Just(GRANTED.to_string())],
        payload in proptest::option::of(bytes()),
        headers in headers(),
        delay_ms in prop_oneof![any::<u64>(), Just(u64::MAX), 0..10_000u64],
        replace in any::<bool>(),
    ) {
        ok(call(json!({"schedule": {
            "id": id, "topic": topic, "payload": payload,
            "headers": headers, "delay_ms": delay_ms, "replace": replace,
        }})), "emit.schedule")?;
    }

    #[test]
    fn cancel_takes_any_id(id in ids()) {
        ok(call(json!({"cancel": id})), "emit.cancel")?;
    }

    #[test]
    fn http_takes_any_request(
        method in prop_oneof![Just("GET".to_string()), text()],
        scheme in prop_oneof![Just("http".to_string()), Just("https".to_string()), text()],
        authority in prop_oneof![
            text(),
            Just("169.254.169.254".to_string()),
            Just("[fd00:ec2::254]:80".to_string()),
            "[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}(:[0-9]{1,6})?",
        ],
        path in prop_oneof![Just("/".to_string()), text()],
        headers in headers(),
        body in bytes(),
    ) {
        ok(call(json!({"http": {
            "method": method, "scheme": scheme, "authority": authority,
            "path": path, "headers": headers, "body": body,
        }})), "wasi:http outgoing-handler.handle")?;
    }

    #[test]
    fn fetch_takes_any_request(
        method in prop_oneof![Just("GET".to_string()), text()],
        url in prop_oneof![
            text(),
            Just(format!("http://{}/x", nowhere())),
            Just("http://169.254.169.254/latest/meta-data/".to_string()),
            "(https?|ftp|)://[^/]{0,12}(/\\PC{0,12})?",
        ],
        headers in proptest::collection::vec((text(), text()), 0..4),
        body in prop_oneof![Just(None), bytes().prop_map(Some)],
    ) {
        ok(call(json!({"fetch": {
            "method": method, "url": url, "headers": headers, "body": body,
        }})), "http.fetch")?;
    }

    #[test]
    fn stdout_and_stderr_take_any_bytes(out in bytes(), err in bytes()) {
        ok(call(json!({"stdout": out})), "stdout")?;
        ok(call(json!({"stderr": err})), "stderr")?;
    }
}

/// Regression: emit compared a header name with `hopper-` by slicing it at
/// byte 7, and a name whose seventh byte falls inside a character panicked
/// the host, which stopped every route. Such a name is simply not hopper's.
#[test]
fn an_emit_header_cut_inside_a_character_is_accepted() {
    for name in ["abcdefé", "hoppeŕ-x", "€€€"] {
        let handled = run(
            json!({"emit": {"topic": GRANTED, "key": null, "payload": "01",
            "headers": [[name, "02"]], "delay_ms": null}}),
        );
        assert_eq!(handled.verdict, Verdict::Ok, "{name}");
        assert_eq!(handled.emitted.len(), 1, "{name}");
        assert_eq!(
            handled.emitted[0].headers,
            vec![(name.to_string(), vec![2])]
        );
    }
}

/// The other side of the rule: a name that is hopper's, in any case, is
/// refused, and nothing of the record is produced.
#[test]
fn an_emit_header_in_hoppers_namespace_is_refused() {
    let handled = run(
        json!({"emit": {"topic": GRANTED, "key": null, "payload": "01",
        "headers": [["HOPPER-id", "02"]], "delay_ms": null}}),
    );
    assert_eq!(handled.verdict, Verdict::Ok);
    assert!(handled.emitted.is_empty());
}

/// A `string` is UTF-8 by the component model's rules, and a guest that
/// breaks them (here with a cancel's id) is refused by the canonical ABI
/// before any host code runs: the call traps, nothing it emitted is kept,
/// and the next call on the same handler is served as usual.
#[test]
fn a_cancel_id_that_is_not_utf8_traps_the_call_and_nothing_else() {
    // The same route takes the same bytes when they are UTF-8.
    let valid = run(json!({"cancel_raw": hex::encode("fuzz-1")}));
    assert_eq!(valid.verdict, Verdict::Ok);
    assert_eq!(valid.emitted.len(), 1);
    assert_eq!(valid.emitted[0].id, "fuzz-1");

    // A lone continuation byte, a truncated sequence, an overlong `/`, a
    // surrogate, and 300 bytes of 0xff.
    let long = "ff".repeat(300);
    for raw in [
        "66757a7a2d80",
        "66757a7a2dc3",
        "c0af",
        "eda080",
        long.as_str(),
    ] {
        let handled = run(json!({"cancel_raw": raw}));
        match &handled.verdict {
            Verdict::Failed { class, error } => {
                assert_eq!(*class, Reason::HandlerTrap, "{raw}: {error}");
                assert!(error.to_lowercase().contains("utf-8"), "{raw}: {error}");
            }
            other => panic!("{raw}: {other:?}"),
        }
        assert!(handled.emitted.is_empty(), "{raw}");
        assert_eq!(
            call(json!({"cancel": "fuzz-2"})),
            Verdict::Ok,
            "after {raw}"
        );
    }
}
