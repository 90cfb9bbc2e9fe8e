//! A route's park topic written by someone other than hopper: records
//! produced straight to it with a plain producer (a forged head, waiting
//! message, release, head deletion; records of made-up lanes; a topic past
//! the table's ceiling) are refused and counted, and the keys they aim at
//! keep their order and lose nothing. Against the test broker.
//!
//! Every message's payload makes the `scripted` fixture GET `/<key>/<seq>`
//! on a loopback [`KeyRecorder`], which records each call in arrival order
//! and answers 503 (retryable) where the test says.

use hopper_tests::key_recorder::{Call, KeyRecorder};
use hopper_tests::*;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::Value;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

/// A route around `scripted` calling `recorder`, with ordered retries.
fn ordered(recorder: &KeyRecorder, tier: &str) -> RouteTable {
    RouteTable::new(&plugin("scripted"))
        .allowed_hosts(&[recorder.origin()])
        .retry(&[tier])
        .max_attempts(20)
        .timeout("10s")
        .key("retry_order", quoted("key"))
}

struct Setup {
    name: String,
    input: String,
    park: String,
    dlq: String,
    config: TestConfig,
}

impl Setup {
    /// `route`, its input of one partition and its park topic created
    /// here (one partition, compacted by hopper's rules or not: what is
    /// read is the same), the admin server on loopback.
    async fn new(route: RouteTable) -> Setup {
        let name = route.name().to_string();
        let input = route.input().to_string();
        let park = format!("{name}.parked");
        let dlq = route.dlq();
        create_topics_with(&[&input, &park], 1).await;
        let config = ConfigBuilder::new()
            .route(route)
            // A port of its own, which `hopper status` finds in the config.
            .admin(
                AdminTable::listen(format!("127.0.0.1:{}", secured::free_port()))
                    .token(TOKEN)
                    .metrics(),
            )
            .write();
        Setup {
            name,
            input,
            park,
            dlq,
            config,
        }
    }

    async fn start(&self) -> (hopper::Hopper, SocketAddr) {
        let hopper = self.config.start().await;
        let addr = hopper.admin_addr().expect("the admin server runs");
        (hopper, addr)
    }

    fn cli(&self, args: &[&str]) -> String {
        let config = self.config.path.to_str().unwrap();
        let mut all = args.to_vec();
        all.extend(["--config", config, "--route", &self.name]);
        hopper_cli(&all)
    }
}

/// Messages `seqs` of `key`, each with id `key/seq`, GETting `/key/seq`.
async fn produce_key(
    producer: &FutureProducer,
    topic: &str,
    recorder: &KeyRecorder,
    key: &str,
    seqs: std::ops::Range<u64>,
) {
    for seq in seqs {
        let id = format!("{key}/{seq}");
        let command = recorder.command(key, seq);
        let record = FutureRecord::<str, str>::to(topic)
            .key(key)
            .payload(&command)
            .headers(OwnedHeaders::new().insert(Header {
                key: "hopper-id",
                value: Some(id.as_str()),
            }));
        producer
            .send(record, Duration::from_secs(30))
            .await
            .map_err(|(e, _)| e)
            .expect("produce");
    }
}

/// A park-topic record key as hopper writes one (kind, input topic,
/// partition and the sha256 of the message key, then `rest`), with the
/// message key its `hopper-park-key` header holds.
fn park_key(kind: char, topic: &str, partition: i32, key: &[u8], rest: Option<&str>) -> Forged {
    let mut out = format!("{kind}\0{topic}\0{partition}\0{}", sha256_hex(key));
    if let Some(rest) = rest {
        out.push('\0');
        out.push_str(rest);
    }
    Forged {
        record_key: out.into_bytes(),
        key_header: key.to_vec(),
    }
}

/// A forged record's key, and the message key its `hopper-park-key`
/// header claims.
struct Forged {
    record_key: Vec<u8>,
    key_header: Vec<u8>,
}

/// Writes a record straight to the park topic, as anyone allowed to write
/// it may: `value` none is a tombstone.
async fn forge(producer: &FutureProducer, park: &str, key: Forged, value: Option<Vec<u8>>) {
    let mut record = FutureRecord::<[u8], [u8]>::to(park)
        .partition(0)
        .key(&key.record_key)
        .headers(
            OwnedHeaders::new()
                .insert(Header {
                    key: "hopper-park-by",
                    value: Some("forger"),
                })
                .insert(Header {
                    key: "hopper-park-key",
                    value: Some(&key.key_header),
                }),
        );
    if let Some(value) = &value {
        record = record.payload(value);
    }
    producer
        .send(record, Duration::from_secs(30))
        .await
        .map_err(|(e, _)| e)
        .expect("forge");
}

fn head_value(head: &str, seq: i64, since: i64) -> Option<Vec<u8>> {
    Some(
        serde_json::to_vec(&serde_json::json!({"head": head, "seq": seq, "since": since})).unwrap(),
    )
}

fn waiting_value(payload: &[u8]) -> Option<Vec<u8>> {
    let mut value = vec![1];
    value.extend_from_slice(payload);
    Some(value)
}

fn release_value(at: i64) -> Option<Vec<u8>> {
    Some(serde_json::to_vec(&serde_json::json!({"cause": "resolved", "at": at})).unwrap())
}

/// The scrape at `addr`: sample values by `name{k=v,...}`, labels sorted.
async fn scrape(addr: SocketAddr) -> HashMap<String, f64> {
    let (status, body) = http(addr, "GET", "/metrics", None, None).await;
    assert_eq!(status, 200, "{body}");
    let lines = body.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("valid Prometheus text");
    scrape
        .samples
        .into_iter()
        .filter_map(|s| {
            let mut labels: Vec<String> =
                s.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            labels.sort();
            let value = match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                _ => return None,
            };
            Some((format!("{}{{{}}}", s.metric, labels.join(",")), value))
        })
        .collect()
}

/// `hopper_parked_refused_total` of `route` by reason.
fn refused(samples: &HashMap<String, f64>, route: &str, reason: &str) -> f64 {
    samples
        .get(&format!(
            "hopper_parked_refused_total{{reason={reason},route={route}}}"
        ))
        .copied()
        .unwrap_or(-1.0)
}

/// Scrapes until `done` holds, within [`PATIENCE`].
async fn scrape_until(
    addr: SocketAddr,
    what: &str,
    mut done: impl FnMut(&HashMap<String, f64>) -> bool,
) -> HashMap<String, f64> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let samples = scrape(addr).await;
        if done(&samples) {
            return samples;
        }
        assert!(
            Instant::now() < deadline,
            "waited {PATIENCE:?} for {what}, in vain: {:?}",
            samples
                .iter()
                .filter(|(k, _)| k.contains("parked"))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `GET /api/parked?route=ROUTE` until `done` accepts it.
async fn parked_list_until(
    addr: SocketAddr,
    route: &str,
    what: &str,
    mut done: impl FnMut(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let listing = get_json_as(addr, &format!("/api/parked?route={route}"), Some(TOKEN)).await;
        if done(&listing) {
            return listing;
        }
        assert!(
            Instant::now() < deadline,
            "waited {PATIENCE:?} for {what}, in vain: {listing}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn keys_of(listing: &Value) -> Vec<String> {
    listing["keys"]
        .as_array()
        .unwrap_or_else(|| panic!("no keys in {listing}"))
        .iter()
        .map(|k| k["key"].as_str().unwrap_or_default().to_string())
        .collect()
}

fn seqs(calls: &[Call]) -> Vec<(u64, u16)> {
    calls.iter().map(|c| (c.seq, c.status)).collect()
}

fn assert_in_order(recorder: &KeyRecorder) {
    let breaks = recorder.order_breaks();
    assert!(
        breaks.is_empty(),
        "calls broke their key's order: {breaks:#?}"
    );
}

/// `hopper ARGS` to the end, within a minute: stdout, after checking it
/// succeeded.
fn hopper_cli(args: &[&str]) -> String {
    let runtime = tempfile::tempdir().unwrap();
    hopper_cli_in(runtime.path(), args)
}

/// [`hopper_cli`], with `runtime` as hopper's runtime directory (where
/// `hopper status` finds the admin server's session token).
fn hopper_cli_in(runtime: &std::path::Path, args: &[&str]) -> String {
    let mut child = Command::new(hopper_bin())
        .args(args)
        .env("HOPPER_RUNTIME_DIR", runtime)
        .env_remove("HOPPER_BROKERS")
        .env_remove("HOPPER_LOG_FORMAT")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("hopper runs");
    let until = Instant::now() + PATIENCE;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > until {
            let _ = child.kill();
            panic!("hopper {args:?} did not end within a minute");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "hopper {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Records in the park topic before hopper starts, none of which this
/// route could have written, and a forged head of a real key: the table
/// refuses and counts the first, the victim keys lose nothing and keep
/// their order, and the forged head only parks its key, which an operator
/// sees in a safe listing and releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_records_at_start_are_refused_and_counted_and_the_victims_lose_nothing() {
    init_tracing();
    let recorder = KeyRecorder::start();
    let s = Setup::new(ordered(&recorder, "1s")).await;
    let producer = producer();
    // The victim's messages at offsets 0..10, the second victim's at
    // 10..15, in the input before anything reads it.
    recorder.fail("victim", 3, 1);
    produce_key(&producer, &s.input, &recorder, "victim", 0..10).await;
    produce_key(&producer, &s.input, &recorder, "victim2", 0..5).await;
    let now = now_ms();
    let input = s.input.as_str();
    let v = b"victim".as_slice();
    let year_10000 = 253_402_300_800_000_i64;
    let forged: Vec<(Forged, Option<Vec<u8>>)> = vec![
        // Lanes the route does not have.
        (
            park_key('h', "made-up", 0, v, None),
            head_value("x", 0, now),
        ),
        (park_key('h', input, 5, v, None), head_value("x", 0, now)),
        (
            park_key('p', "made-up", 0, v, Some("1")),
            waiting_value(b"forged"),
        ),
        // A head at offset 0 with a message waiting at i64::MAX: every
        // later message of the key used to pass for parked already.
        (
            park_key('h', input, 0, v, None),
            head_value("victim/0", 0, now),
        ),
        (
            park_key('p', input, 0, v, Some(&i64::MAX.to_string())),
            waiting_value(b"forged"),
        ),
        // A waiting message with no head.
        (
            park_key('p', input, 0, b"orphan", Some("2")),
            waiting_value(b"forged"),
        ),
        // Dates that cannot be, one past year 9999, with escapes in its id.
        (
            park_key('h', input, 0, b"future", None),
            head_value("\x1b]0;pwned\x07", 1, year_10000),
        ),
        (
            park_key('r', input, 0, b"later", Some("m1")),
            release_value(i64::MAX),
        ),
        // Not a record at all.
        (
            Forged {
                record_key: b"zz".to_vec(),
                key_header: b"victim".to_vec(),
            },
            Some(b"?".to_vec()),
        ),
        // The victim's head, claiming by its key header a key its digest
        // does not name.
        (
            Forged {
                key_header: b"victim".to_vec(),
                ..park_key('h', input, 0, b"victim2", None)
            },
            head_value("victim2/0", 0, now),
        ),
        // A head of the second victim that no message of it is: it parks
        // the key, and nothing else.
        (
            park_key('h', input, 0, b"victim2", None),
            head_value("\x1b[31mforged\x1b[0m", 0, now),
        ),
    ];
    for (key, value) in forged {
        forge(&producer, &s.park, key, value).await;
    }
    let (hopper, addr) = s.start().await;

    recorder
        .wait_for("the victim's ten messages", PATIENCE, |r| {
            (0..10).all(|seq| r.has_ok("victim", seq))
        })
        .await;
    let samples = scrape_until(addr, "the refusals counted", |m| {
        refused(m, &s.name, "unknown-lane") == 3.0 && refused(m, &s.name, "no-head") == 1.0
    })
    .await;
    assert_eq!(refused(&samples, &s.name, "bad-offset"), 1.0);
    assert_eq!(refused(&samples, &s.name, "bad-time"), 2.0);
    assert_eq!(refused(&samples, &s.name, "unreadable"), 2.0);
    assert_eq!(refused(&samples, &s.name, "over-ceiling"), 0.0);

    // The forged head of victim2 parks it, as a head does; the listing says
    // so without acting on its escapes.
    let listing = parked_list_until(addr, &s.name, "victim2 parked with its 5 messages", |l| {
        l["keys"][0]["parked"] == 5
    })
    .await;
    assert_eq!(keys_of(&listing), ["victim2"], "{listing}");
    assert_eq!(recorder.calls_to("victim2", 0), 0);
    let table = s.cli(&["parked", "list"]);
    assert!(!table.contains('\x1b'), "{table:?}");
    assert!(table.contains("\\u{1b}[31mforged"), "{table}");
    // `hopper status` reads with the session token `hopper run` writes to
    // its runtime directory; this hopper runs in the test's process, so the
    // test writes it there, as `hopper run` would.
    let runtime = tempfile::tempdir().unwrap();
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        let token = hopper.admin_session_token().expect("a session token");
        let file = runtime
            .path()
            .join(format!("admin-{}-{}.token", addr.ip(), addr.port()));
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(file)
            .unwrap();
        std::io::Write::write_all(&mut file, format!("{token}\n").as_bytes()).unwrap();
    }
    let status = hopper_cli_in(
        runtime.path(),
        &["status", "--config", s.config.path.to_str().unwrap()],
    );
    assert!(status.contains("PARKED KEYS"), "{status}");
    assert!(status.contains("key \"victim2\""), "{status}");
    assert!(!status.contains('\x1b'), "{status:?}");
    let released = s.cli(&[
        "parked",
        "release",
        "--topic",
        input,
        "--partition",
        "0",
        "--key",
        "victim2",
    ]);
    assert!(!released.contains('\x1b'), "{released:?}");
    recorder
        .wait_for(
            "the second victim's messages, once released",
            PATIENCE,
            |r| (0..5).all(|seq| r.has_ok("victim2", seq)),
        )
        .await;
    assert_eq!(
        seqs(&recorder.calls_of("victim")),
        [
            (0, 200),
            (1, 200),
            (2, 200),
            (3, 503),
            (3, 200),
            (4, 200),
            (5, 200),
            (6, 200),
            (7, 200),
            (8, 200),
            (9, 200)
        ]
    );
    assert_eq!(
        seqs(&recorder.calls_of("victim2")),
        [(0, 200), (1, 200), (2, 200), (3, 200), (4, 200)]
    );
    assert_in_order(&recorder);
    hopper.stop().await;
}

/// While a key is parked behind its head in a tier, records written
/// straight to the park topic that would free it early (its head deleted,
/// a release dated in the future) are refused: its messages wait for the
/// head's own resolution.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_head_deletion_or_future_release_does_not_free_a_parked_key_early() {
    init_tracing();
    let recorder = KeyRecorder::start();
    let s = Setup::new(ordered(&recorder, "2s")).await;
    let (hopper, addr) = s.start().await;
    let producer = producer();
    recorder.fail("victim", 0, 3);
    produce_key(&producer, &s.input, &recorder, "victim", 0..1).await;
    recorder
        .wait_for("the head's first 503", PATIENCE, |r| {
            r.calls_to("victim", 0) == 1
        })
        .await;
    produce_key(&producer, &s.input, &recorder, "victim", 1..4).await;
    parked_list_until(addr, &s.name, "3 messages waiting", |l| {
        l["keys"][0]["parked"] == 3
    })
    .await;
    let lane = |kind, rest| park_key(kind, &s.input, 0, b"victim", rest);
    forge(&producer, &s.park, lane('h', None), None).await;
    forge(
        &producer,
        &s.park,
        lane('r', Some("victim/0")),
        release_value(now_ms() + 86_400_000),
    )
    .await;
    scrape_until(addr, "the two refusals", |m| {
        refused(m, &s.name, "no-head") == 1.0 && refused(m, &s.name, "bad-time") == 1.0
    })
    .await;
    recorder
        .wait_for("the victim's messages", PATIENCE, |r| {
            (0..4).all(|seq| r.has_ok("victim", seq))
        })
        .await;
    assert_eq!(
        seqs(&recorder.calls_of("victim")),
        [
            (0, 503),
            (0, 503),
            (0, 503),
            (0, 200),
            (1, 200),
            (2, 200),
            (3, 200)
        ]
    );
    hopper.stop().await;
}

/// A message of another key carrying the victim's head id, retried once,
/// resolves and releases only its own key: the victim's head is known by
/// its lane, id and offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_carrying_another_keys_head_id_releases_only_its_own_key() {
    init_tracing();
    let recorder = KeyRecorder::start();
    let s = Setup::new(ordered(&recorder, "2s")).await;
    let (hopper, _addr) = s.start().await;
    let producer = producer();
    recorder.fail("victim", 0, 3);
    produce_key(&producer, &s.input, &recorder, "victim", 0..1).await;
    recorder
        .wait_for("the head's first 503", PATIENCE, |r| {
            r.calls_to("victim", 0) == 1
        })
        .await;
    produce_key(&producer, &s.input, &recorder, "victim", 1..3).await;
    // Key `attacker`, with the victim head's id, fails once.
    recorder.fail("attacker", 0, 1);
    let command = recorder.command("attacker", 0);
    let record = FutureRecord::<str, str>::to(&s.input)
        .key("attacker")
        .payload(&command)
        .headers(OwnedHeaders::new().insert(Header {
            key: "hopper-id",
            value: Some("victim/0"),
        }));
    producer
        .send(record, Duration::from_secs(30))
        .await
        .map_err(|(e, _)| e)
        .unwrap();
    produce_key(&producer, &s.input, &recorder, "attacker", 1..2).await;
    recorder
        .wait_for("both keys' messages", PATIENCE, |r| {
            (0..3).all(|seq| r.has_ok("victim", seq)) && (0..2).all(|seq| r.has_ok("attacker", seq))
        })
        .await;
    assert_eq!(
        seqs(&recorder.calls_of("victim")),
        [(0, 503), (0, 503), (0, 503), (0, 200), (1, 200), (2, 200)]
    );
    assert_eq!(
        seqs(&recorder.calls_of("attacker")),
        [(0, 503), (0, 200), (1, 200)]
    );
    hopper.stop().await;
}

/// A park topic holding more than twice `max_parked_mib` (waiting messages
/// of a made-up topic, and of a forged head of a real key) is loaded
/// within the ceiling; the forged key holds the route at its bound until
/// an operator purges it, straight against the brokers; then the route's
/// messages are handled, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_park_topic_past_the_ceiling_is_loaded_within_it_and_a_purge_frees_the_route() {
    init_tracing();
    let recorder = KeyRecorder::start();
    let s = Setup::new(ordered(&recorder, "1s").key("max_parked_mib", 1)).await;
    let producer = producer();
    produce_key(&producer, &s.input, &recorder, "victim", 0..15).await;
    let input = s.input.as_str();
    let big = vec![b'x'; 200_000];
    // 2 MB under a made-up topic: it used to fill the table for ever.
    for seq in 0..10 {
        forge(
            &producer,
            &s.park,
            park_key('p', "made-up", 0, b"k", Some(&seq.to_string())),
            waiting_value(&big),
        )
        .await;
    }
    // A forged head of a real key, and 2.6 MB behind it.
    forge(
        &producer,
        &s.park,
        park_key('h', input, 0, b"forged", None),
        head_value("forged/0", 0, now_ms()),
    )
    .await;
    for seq in 1..14 {
        forge(
            &producer,
            &s.park,
            park_key('p', input, 0, b"forged", Some(&seq.to_string())),
            waiting_value(&big),
        )
        .await;
    }
    let (hopper, addr) = s.start().await;
    let samples = scrape_until(addr, "the refusals", |m| {
        refused(m, &s.name, "unknown-lane") == 10.0
    })
    .await;
    let over = refused(&samples, &s.name, "over-ceiling");
    assert!(over >= 1.0, "{over}");
    let held = samples[&format!("hopper_parked_messages{{route={}}}", s.name)];
    assert_eq!(held, 13.0 - over, "what the table kept");
    assert!(held * 200_000.0 <= 2.0 * 1024.0 * 1024.0, "{held} kept");

    let out = s.cli(&[
        "parked",
        "purge",
        "--topic",
        input,
        "--partition",
        "0",
        "--key",
        "forged",
    ]);
    assert!(
        out.contains("deleted 1 head, 13 waiting message(s) and 0 release(s)"),
        "{out}"
    );
    recorder
        .wait_for("the victim's messages", PATIENCE, |r| {
            (0..15).all(|seq| r.has_ok("victim", seq))
        })
        .await;
    assert_in_order(&recorder);
    scrape_until(addr, "nothing waiting", |m| {
        m.get(&format!("hopper_parked_messages{{route={}}}", s.name)) == Some(&0.0)
    })
    .await;
    assert_eq!(
        recorder.calls_to("forged", 0),
        0,
        "no forged message handled"
    );
    hopper.stop().await;
}

/// A message with a 500 KB key, retried once, parks its key as any other
/// does: a park-topic record names the key by its digest and holds it once
/// (it used to hold it twice, in hex in the record's key, which the broker
/// refused). Its next message waits behind it and is handled after the
/// retry's 200, and the process stops at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_500_kb_key_parks_and_keeps_its_order() {
    init_tracing();
    let recorder = KeyRecorder::start();
    let s = Setup::new(ordered(&recorder, "1s")).await;
    let (hopper, addr) = s.start().await;
    let producer = producer();
    let key = vec![b'k'; 500_000];
    recorder.fail("big", 0, 1);
    for seq in 0..2 {
        let command = recorder.command("big", seq);
        let id = format!("big/{seq}");
        let record = FutureRecord::<[u8], str>::to(&s.input)
            .key(key.as_slice())
            .payload(&command)
            .headers(OwnedHeaders::new().insert(Header {
                key: "hopper-id",
                value: Some(id.as_str()),
            }));
        producer
            .send(record, Duration::from_secs(30))
            .await
            .map_err(|(e, _)| e)
            .expect("produce");
    }
    recorder
        .wait_for("the big key's second message", PATIENCE, |r| {
            r.has_ok("big", 1)
        })
        .await;
    assert_eq!(
        seqs(&recorder.calls_of("big")),
        [(0, 503), (0, 200), (1, 200)]
    );
    let samples = scrape(addr).await;
    let parked_total = samples
        .iter()
        .find(|(name, _)| name.starts_with("hopper_parked_total{"))
        .map(|(_, value)| *value);
    assert_eq!(parked_total, Some(1.0), "the second message waited");
    let stopping = Instant::now();
    hopper.stop().await;
    assert!(
        stopping.elapsed() < Duration::from_secs(20),
        "{:?}",
        stopping.elapsed()
    );
}

/// One key cannot take the whole of `max_parked_mib`: past its share
/// (`max_parked_key_mib`) its newest messages go to the DLQ as
/// `KEY_PARK_FULL`, while what it parked before waits, in order, and other
/// keys go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_past_its_share_of_the_park_dead_letters_its_newest_messages_as_key_park_full() {
    init_tracing();
    let recorder = KeyRecorder::start();
    let route = ordered(&recorder, "1h")
        .max_attempts(2)
        .key("max_parked_mib", 8)
        .key("max_parked_key_mib", 1);
    let s = Setup::new(route).await;
    let (hopper, _addr) = s.start().await;
    let producer = producer();
    recorder.fail("hog", 0, 1);
    produce_key(&producer, &s.input, &recorder, "hog", 0..1).await;
    recorder
        .wait_for("the head's 503", PATIENCE, |r| r.calls_to("hog", 0) == 1)
        .await;
    // 15 messages of 100 KB behind it: 10 fit in 1 MiB.
    let pad = vec![b'p'; 100_000];
    for seq in 1..16 {
        let id = format!("hog/{seq}");
        let command = recorder.command("hog", seq);
        let record = FutureRecord::<str, str>::to(&s.input)
            .key("hog")
            .payload(&command)
            .headers(
                OwnedHeaders::new()
                    .insert(Header {
                        key: "hopper-id",
                        value: Some(id.as_str()),
                    })
                    .insert(Header {
                        key: "x-pad",
                        value: Some(pad.as_slice()),
                    }),
            );
        producer
            .send(record, Duration::from_secs(30))
            .await
            .map_err(|(e, _)| e)
            .expect("produce");
    }
    produce_key(&producer, &s.input, &recorder, "calm", 0..3).await;
    let dead = consume(&s.dlq, 5, PATIENCE).await;
    let mut ids: Vec<(String, String)> = dead
        .iter()
        .map(|r| {
            let (h, _) = header_map(r);
            (h["hopper-id"].clone(), h["hopper-reason"].clone())
        })
        .collect();
    ids.sort();
    let expected: Vec<(String, String)> = (11..16)
        .map(|seq| (format!("hog/{seq}"), "KEY_PARK_FULL".to_string()))
        .collect();
    let mut expected = expected;
    expected.sort();
    assert_eq!(ids, expected);
    recorder
        .wait_for("the calm key", PATIENCE, |r| {
            (0..3).all(|seq| r.has_ok("calm", seq))
        })
        .await;
    s.cli(&[
        "parked",
        "release",
        "--topic",
        &s.input,
        "--partition",
        "0",
        "--key",
        "hog",
    ]);
    recorder
        .wait_for("the hog's parked messages", PATIENCE, |r| {
            (1..11).all(|seq| r.has_ok("hog", seq))
        })
        .await;
    let calls = seqs(&recorder.calls_of("hog"));
    let mut expected = vec![(0, 503)];
    expected.extend((1..11).map(|seq| (seq, 200)));
    assert_eq!(calls, expected);
    hopper.stop().await;
}
