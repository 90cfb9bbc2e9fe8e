//! Scale-out: `hopper run` processes sharing one consumer group on a
//! 6-partition input, while the group changes under a stream of messages
//! with mixed outcomes. One member is killed with SIGKILL, one is stopped
//! cleanly, and a fourth joins; every message still reaches its one fate,
//! and a message whose retries moved between processes keeps its attempt
//! count and its place on the retry ladder.
//!
//! Each process runs its own copy of the `acting` handler, made distinct by
//! a custom section, so `hopper-handler-version` on a retry or dead-letter
//! record names the process that made that hop.

use hopper_tests::fleet::{
    HopperProcess, Ledger, Outgoing, Seen, acting_script, duplicates, wait_until,
};
use hopper_tests::*;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::Duration;

const MESSAGES: usize = 3_000;
/// Messages produced per second: the stream lasts about 20 s, long enough
/// for all three changes of the group to happen inside it.
const RATE: u32 = 150;
const PARTITIONS: i32 = 6;
/// How long a clean stop may take (the drain deadline is 30 s).
const STOP_DEADLINE: Duration = Duration::from_secs(45);
/// How long, after the stream ends, every message may take to reach its
/// fate: it covers a dead member's session timeout (10 s) and the ladder.
const SETTLE: Duration = Duration::from_secs(90);

/// What message `i` is told to do. Ids are `m<i>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// `ok`, emitting `m<i>` to the done topic.
    Ok,
    /// `fatal`: dead-lettered with `FATAL` on attempt 1.
    Fatal,
    /// `retryable` on every attempt: `<route>.retry.1s`, `<route>.retry.2s`,
    /// then dead-lettered with `RETRIES_EXHAUSTED` on attempt 3.
    Retry,
}

fn kind(i: usize) -> Kind {
    match i % 10 {
        0..=5 => Kind::Ok,
        6 | 7 => Kind::Fatal,
        _ => Kind::Retry,
    }
}

fn index(id: &str) -> Option<usize> {
    id.strip_prefix('m')?.parse().ok()
}

struct Topics {
    input: String,
    done: String,
    dlq: String,
    tier1: String,
    tier2: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_that_loses_a_member_to_kill_9_and_one_to_a_stop_and_gains_one_loses_nothing() {
    init_tracing();
    let name = rand_name("scale");
    let t = Topics {
        input: format!("{name}.in"),
        done: format!("{name}.done"),
        dlq: format!("{name}.dlq"),
        tier1: format!("{name}.retry.1s"),
        tier2: format!("{name}.retry.2s"),
    };
    create_topics_with(&[&t.input, &t.done, &t.dlq, &t.tier1, &t.tier2], PARTITIONS).await;

    // Four configs alike but for the handler file: the same route, so the
    // same group, topics and ladder.
    let dir = tempfile::tempdir().unwrap();
    let acting = std::fs::read(plugin("acting")).unwrap();
    let mut configs: Vec<PathBuf> = Vec::new();
    let mut process_of: HashMap<String, &str> = HashMap::new();
    let labels = ["p1", "p2", "p3", "p4"];
    for label in labels {
        let own = dir.path().join(label);
        std::fs::create_dir_all(&own).unwrap();
        let wasm = with_custom_section(&acting, "hopper-test-process", label.as_bytes());
        let handler = own.join("acting.wasm");
        std::fs::write(&handler, &wasm).unwrap();
        process_of.insert(sha256_hex(&wasm), label);
        let config = own.join("hopper.toml");
        let route = RouteTable::named(&name, &handler)
            .topics(&[&t.input])
            .emit_topics(&[&t.done])
            .retry(&["1s", "2s"])
            .max_attempts(3);
        let text = ConfigBuilder::new()
            .partitions(PARTITIONS)
            .route(route)
            .toml();
        std::fs::write(&config, text).unwrap();
        configs.push(config);
    }
    let ledger = Ledger::start(&[
        t.done.clone(),
        t.dlq.clone(),
        t.tier1.clone(),
        t.tier2.clone(),
    ]);
    let logs = dir.path();
    let mut procs: Vec<HopperProcess> = labels[..3]
        .iter()
        .zip(&configs)
        .map(|(label, config)| HopperProcess::spawn(label, config, logs))
        .collect();

    let producing = tokio::spawn({
        let input = t.input.clone();
        let done = t.done.clone();
        async move {
            fleet::produce_paced(MESSAGES, RATE, |i| {
                let id = format!("m{i}");
                let verdict = match kind(i) {
                    Kind::Ok => "ok",
                    Kind::Fatal => "fatal",
                    Kind::Retry => "retry",
                };
                Outgoing {
                    topic: input.clone(),
                    payload: acting_script(&id, verdict, &done),
                    headers: vec![("hopper-id", id.clone())],
                    key: id,
                }
            })
            .await
        }
    });

    // All three members own partitions once each has made a hop.
    let version_of = |label: &str| {
        process_of
            .iter()
            .find(|(_, l)| **l == label)
            .map(|(v, _)| v.clone())
            .unwrap()
    };
    // Hops (retry and dead-letter records) made by the process `v`.
    let hops_by =
        |v: &str| ledger.with(|r| r.iter().filter(|s| s.version.as_deref() == Some(v)).count());
    // The kill and the stop land on members that are busy.
    must_reach(
        "p1, p2 and p3 each make 20 hops",
        &mut procs,
        PATIENCE,
        || labels[..3].iter().all(|l| hops_by(&version_of(l)) >= 20),
    )
    .await;

    eprintln!("kill -9 p1 at {} records", ledger.len());
    procs[0].kill9();
    tokio::time::sleep(Duration::from_secs(3)).await;

    eprintln!("stopping p2 at {} records", ledger.len());
    let stopped = procs[1].stop(STOP_DEADLINE).await;
    let stopped = stopped.unwrap_or_else(|e| panic!("{e}\n{}", procs[1].log_tail(30)));
    assert!(
        stopped.success(),
        "p2 exits 0 on a clean stop, not {stopped}\n{}",
        procs[1].log_tail(30)
    );

    eprintln!("starting p4 at {} records", ledger.len());
    procs.push(HopperProcess::spawn("p4", &configs[3], logs));
    must_reach("p4 handles messages", &mut procs, PATIENCE, || {
        hops_by(&version_of("p4")) > 0
    })
    .await;
    producing.await.expect("every message produced");

    let expected = expected_fates();
    must_reach("every message reaches its fate", &mut procs, SETTLE, || {
        ledger.with(|r| fates(r, &t).len() >= expected.len())
    })
    .await;
    for p in procs.iter_mut().skip(2) {
        let status = p
            .stop(STOP_DEADLINE)
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", p.log_tail(30)));
        assert!(status.success(), "{} exits 0, not {status}", p.label);
    }
    // Every process has stopped, its hops acknowledged: once the ledger has
    // read every record now on its topics, late duplicates included, the
    // count is final.
    ledger.read_all(SETTLE).await;

    let records = ledger.with(|r| r.to_vec());
    let report = Report::new(&records, &t, &process_of);
    eprintln!("{report}");
    assert!(ledger.last_error().is_none(), "{:?}", ledger.last_error());
    assert!(
        report.unexpected.is_empty(),
        "records no message should produce: {:#?}",
        &report.unexpected[..report.unexpected.len().min(10)]
    );
    let fates = fates(&records, &t);
    let lost: Vec<&String> = expected
        .iter()
        .filter(|(id, _)| !fates.contains_key(*id))
        .map(|(id, _)| id)
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {MESSAGES} messages lost: {:?}",
        lost.len(),
        &lost[..lost.len().min(20)]
    );
    for (id, kind) in &expected {
        assert_eq!(fates[id], *kind, "{id} reached the wrong fate");
    }
    // The test proves something only if retries did move: a message whose
    // first retry hop was made by one process and its dead-lettering by
    // another, with the attempt count carried across.
    assert!(
        report.finished_elsewhere > 0,
        "no retried message changed process; the group changes missed the ladder"
    );
}

/// Every message's fate, by id: `m<i>/emit/0` on the done topic, or its
/// dead-letter record's reason.
fn fates(records: &[Seen], t: &Topics) -> HashMap<String, Kind> {
    let mut out = HashMap::new();
    for r in records {
        if r.topic == t.done {
            if let Some(id) = r.id.strip_suffix("/emit/0") {
                out.insert(id.to_string(), Kind::Ok);
            }
        } else if r.topic == t.dlq {
            match r.reason.as_deref() {
                Some("FATAL") => out.insert(r.id.clone(), Kind::Fatal),
                Some("RETRIES_EXHAUSTED") => out.insert(r.id.clone(), Kind::Retry),
                _ => None,
            };
        }
    }
    out
}

fn expected_fates() -> BTreeMap<String, Kind> {
    (0..MESSAGES).map(|i| (format!("m{i}"), kind(i))).collect()
}

/// What the ledger shows beyond the fates: records that break the
/// contract, duplicates, and the messages whose hops were made by more than
/// one process.
struct Report {
    unexpected: Vec<Seen>,
    duplicates: BTreeMap<&'static str, (usize, usize)>,
    /// Extra copies of retry and dead-letter hops, by the process that made
    /// the first copy.
    duplicated_after: BTreeMap<String, usize>,
    hops_by_process: BTreeMap<String, usize>,
    /// Retried messages whose hops were made by two or more processes.
    moved: usize,
    /// Retried messages dead-lettered by a process other than the one that
    /// made their first retry hop.
    finished_elsewhere: usize,
}

impl Report {
    fn new(records: &[Seen], t: &Topics, process_of: &HashMap<String, &str>) -> Report {
        let mut unexpected = Vec::new();
        let mut hops_by_process = BTreeMap::new();
        // Per retried message: the processes of its tier-1 hops, tier-2 hops
        // and dead-lettering.
        let mut ladder: HashMap<&str, [BTreeSet<&str>; 3]> = HashMap::new();
        for r in records {
            let i = index(r.id.strip_suffix("/emit/0").unwrap_or(&r.id));
            let Some(i) = i.filter(|i| *i < MESSAGES) else {
                unexpected.push(r.clone());
                continue;
            };
            let process = r
                .version
                .as_ref()
                .and_then(|v| process_of.get(v).copied())
                .unwrap_or("?");
            if r.topic != t.done {
                *hops_by_process.entry(process.to_string()).or_default() += 1;
            }
            let step = match (kind(i), r.topic.as_str()) {
                (Kind::Ok, topic) => (topic == t.done && r.id.ends_with("/emit/0")).then_some(None),
                (Kind::Fatal, topic) => (topic == t.dlq
                    && r.reason.as_deref() == Some("FATAL")
                    && r.attempt == Some(1)
                    && r.trail.as_deref() == Some("dlq"))
                .then_some(None),
                (Kind::Retry, topic) if topic == t.tier1 => (r.attempt == Some(1)
                    && r.trail.as_deref() == Some("retry.1s"))
                .then_some(Some(0)),
                (Kind::Retry, topic) if topic == t.tier2 => (r.attempt == Some(2)
                    && r.trail.as_deref() == Some("retry.1s,retry.2s"))
                .then_some(Some(1)),
                (Kind::Retry, topic) => (topic == t.dlq
                    && r.reason.as_deref() == Some("RETRIES_EXHAUSTED")
                    && r.attempt == Some(3)
                    && r.trail.as_deref() == Some("retry.1s,retry.2s,dlq"))
                .then_some(Some(2)),
            };
            match step {
                None => unexpected.push(r.clone()),
                Some(Some(rung)) => {
                    ladder.entry(r.id.as_str()).or_default()[rung].insert(process);
                }
                Some(None) => {}
            }
        }
        let moved = ladder
            .values()
            .filter(|rungs| rungs.iter().flatten().collect::<BTreeSet<_>>().len() > 1)
            .count();
        let finished_elsewhere = ladder
            .values()
            .filter(|[first, _, last]| !first.is_empty() && last.iter().any(|p| !first.contains(p)))
            .count();
        let count = |topic: &str, pick: &dyn Fn(&Seen) -> bool| {
            let dups = duplicates(records.iter().filter(|r| r.topic == topic && pick(r)));
            (dups.len(), dups.values().sum::<usize>())
        };
        let mut dups = BTreeMap::new();
        dups.insert("ok (emitted record)", count(&t.done, &|_| true));
        dups.insert(
            "fatal (dead-lettered)",
            count(&t.dlq, &|r| r.reason.as_deref() == Some("FATAL")),
        );
        dups.insert("retry tier 1s", count(&t.tier1, &|_| true));
        dups.insert("retry tier 2s", count(&t.tier2, &|_| true));
        dups.insert(
            "retries exhausted (dead-lettered)",
            count(&t.dlq, &|r| {
                r.reason.as_deref() == Some("RETRIES_EXHAUSTED")
            }),
        );
        // Which process made the first copy of each duplicated hop.
        let mut first_by: HashMap<(&str, &str), &str> = HashMap::new();
        let mut duplicated_after = BTreeMap::new();
        for r in records.iter().filter(|r| r.topic != t.done) {
            let process = r
                .version
                .as_ref()
                .and_then(|v| process_of.get(v).copied())
                .unwrap_or("?");
            match first_by.get(&(r.topic.as_str(), r.id.as_str())) {
                Some(first) => {
                    *duplicated_after.entry(first.to_string()).or_default() += 1;
                }
                None => {
                    first_by.insert((r.topic.as_str(), r.id.as_str()), process);
                }
            }
        }
        Report {
            unexpected,
            duplicates: dups,
            duplicated_after,
            hops_by_process,
            moved,
            finished_elsewhere,
        }
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "scale-out: {MESSAGES} messages on {PARTITIONS} partitions"
        )?;
        writeln!(
            f,
            "  retry and dead-letter hops by process: {:?}",
            self.hops_by_process
        )?;
        writeln!(
            f,
            "  retried messages handled by more than one process: {}; dead-lettered by another than their first retry: {}",
            self.moved, self.finished_elsewhere
        )?;
        writeln!(f, "  duplicates (messages, extra copies):")?;
        for (what, (messages, copies)) in &self.duplicates {
            writeln!(f, "    {what}: {messages} messages, {copies} extra copies")?;
        }
        writeln!(
            f,
            "  extra copies of retry and dead-letter hops, by the process that made the first: {:?}",
            self.duplicated_after
        )?;
        write!(
            f,
            "  records breaking the contract: {}",
            self.unexpected.len()
        )
    }
}

/// [`wait_until`], failing when `done` does not hold within `patience`.
async fn must_reach(
    what: &str,
    procs: &mut [HopperProcess],
    patience: Duration,
    done: impl FnMut() -> bool,
) {
    assert!(
        wait_until(what, procs, patience, done).await,
        "not within {patience:?}: {what}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_on_two_partitions_are_all_ready_and_spread_the_route() {
    init_tracing();
    let input = rand_name("standby-in");
    let route = format!("standby-{}", &input[input.len() - 6..]);
    let logs = tempfile::tempdir().unwrap();
    let mut procs = Vec::new();
    let mut admins = Vec::new();
    for n in 0..3 {
        let admin = hopper_tests::secured::free_port();
        // One partition for the input and one for its one tier: a
        // subscription of two partitions for three processes.
        let config = ConfigBuilder::new()
            .partitions(1)
            .route(
                RouteTable::named(&route, &plugin("scripted"))
                    .topics(&[&input])
                    .retry(&["1s"]),
            )
            .admin(AdminTable::listen(format!("127.0.0.1:{admin}")))
            .write();
        procs.push((
            HopperProcess::spawn(&format!("standby-{n}"), &config.path, logs.path()),
            config,
        ));
        admins.push(std::net::SocketAddr::from(([127, 0, 0, 1], admin)));
    }
    let ready = |addr: std::net::SocketAddr| async move {
        let Ok(stream) = tokio::net::TcpStream::connect(addr).await else {
            return None;
        };
        drop(stream);
        let (status, body) = http(addr, "GET", "/ready", None, None).await;
        Some((
            status,
            serde_json::from_str::<serde_json::Value>(&body).unwrap(),
        ))
    };
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let states = loop {
        let mut all = Vec::new();
        for addr in &admins {
            all.push(ready(*addr).await);
        }
        let states: Vec<String> = all
            .iter()
            .flatten()
            .filter(|(status, _)| *status == 200)
            .map(|(_, body)| body["pipelines"][0]["status"].to_string())
            .collect();
        let consuming = states.iter().filter(|s| s.contains("consuming")).count();
        if states.len() == 3 && consuming == 2 {
            break states;
        }
        if tokio::time::Instant::now() > deadline {
            let tails: Vec<String> = procs.iter().map(|(p, _)| p.log_tail(20)).collect();
            panic!(
                "not all ready and spread: {all:?}\n{}",
                tails.join("\n---\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // The input and its tier are on two processes, one partition each; the
    // third is a ready standby.
    assert_eq!(
        states
            .iter()
            .filter(|s| s.contains("\"partitions\":1"))
            .count(),
        2,
        "{states:?}"
    );
    assert_eq!(
        states.iter().filter(|s| s.contains("standby")).count(),
        1,
        "{states:?}"
    );
    for (proc, _) in &mut procs {
        let status = proc.stop(STOP_DEADLINE).await;
        assert!(status.is_ok_and(|s| s.success()), "{}", proc.log_tail(20));
    }
}
